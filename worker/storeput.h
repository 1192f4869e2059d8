/* storeput.h — a worker's writes to the S3 object store that holds the coordinator's blobs:
 * its deltas (fp32, or a quantized job's streams as sent) and its slot's inner state, as blob files (docs/design.md §6.4), through the presigned PUT URLs of
 * PrepareDeltaPut (docs/design.md §4.4, §5.8), whole or in parts. The URL signs the object's Content-MD5, so the
 * store refuses any other bytes; the worker never holds store credentials. HTTP through
 * libcurl, MD5 through OpenSSL's libcrypto. Thread-safe (one curl handle per call). */
#ifndef DPC_WORKER_STOREPUT_H
#define DPC_WORKER_STOREPUT_H

#include <stddef.h>
#include <stdint.h>

/* A delta (or a slot's inner-state blob) as a blob object: the 24-byte header and 8-byte
 * trailer around the payload (the fp32 floats themselves, not copied, then up to two more
 * floats' bytes held here: an inner-state M blob's AdamW step), the payload's CRC-32C and
 * (storeput_digest) the whole object's MD5. */
typedef struct storeput_object {
  unsigned char header[24], trailer[8];
  const float *payload;
  uint64_t n;          /* floats, the extra ones included */
  unsigned char extra[8];
  uint32_t n_extra;    /* bytes of extra after the n - n_extra / 4 floats at payload */
  uint32_t crc;        /* CRC-32C of the payload (a caller may set it to what its commit names) */
  unsigned char md5[16];
} storeput_object;

/* Fill o for the n floats at delta (kept, not copied: it must outlive the PUT), all but its MD5. */
void storeput_make(storeput_object *o, const float *delta, uint64_t n);
/* The same for a blob of `kind` (worker/storeget.h STORE_KIND_*) whose n floats at p are
 * followed by n_extra (0, 4 or 8) bytes of extra, copied. */
void storeput_make_kind(storeput_object *o, uint32_t kind, const float *p, uint64_t n, const void *extra,
                        uint32_t n_extra);
/* The object's size in bytes. */
uint64_t storeput_bytes(const storeput_object *o);
/* PUT the object to url, failing once no byte moved for timeout_ms: 0, or DPC_EPERM (403: the
 * URL expired or was altered), DPC_ECHECKSUM (400 BadDigest: the bytes did not match their MD5),
 * DPC_EUNAVAILABLE (no connection, a timeout, 5xx), DPC_EIO (any other answer), with the
 * detail in dpc_errmsg(). */
int storeput_put(const char *url, const storeput_object *o, int timeout_ms);

/* An object larger than Lease.delta_put_part_bytes goes in parts of that size, the last one
 * shorter: storeput_parts says how many (0: one PUT); storeput_digest fills o->md5 and, when
 * there are parts, part_md5[parts], in one pass over the object; storeput_put_part PUTs part
 * `part` (0-based) to its presigned URL, failing as storeput_put does. */
int storeput_parts(const storeput_object *o, uint64_t part_bytes);
int storeput_digest(storeput_object *o, uint64_t part_bytes, unsigned char (*part_md5)[16]);
int storeput_put_part(const char *url, const storeput_object *o, uint64_t part_bytes, int part,
                      const unsigned char md5[16], int timeout_ms);

/* Every part (urls[k] and md5[k] for part k) over up to `streams` connections at once
 * (storehttp_fanout, worker/storeget.h), as object stores serve parallel parts faster than one
 * stream; the first failure, as storeput_put_part's, and no part started after it. */
int storeput_put_parts(char *const *urls, const storeput_object *o, uint64_t part_bytes, int parts,
                       const unsigned char (*md5)[16], int streams, int timeout_ms);

#endif
