/* storeget.h — a worker's reads from the S3 object store that holds the coordinator's blobs,
 * through the presigned URLs a lease carries (FragmentInfo.params_url, docs/design.md §4.4):
 * the worker never holds store credentials, and the parameters' bytes do not pass through the
 * coordinator. HTTP through libcurl. Thread-safe (one curl handle per call; storehttp_open is
 * shared with storeput.c). */
#ifndef DPC_WORKER_STOREGET_H
#define DPC_WORKER_STOREGET_H

#include <stddef.h>
#include <stdint.h>

/* Bytes [off, off + n) of the object at url into dst; the transfer fails once no byte has
 * arrived for timeout_ms (or the connection is not made within min(timeout_ms, 10 s)). 0, or a
 * negative DPC_E* code with the detail in dpc_errmsg(): DPC_EPERM (403: the URL expired or was
 * altered), DPC_ENOENT (404), DPC_EFORMAT (a short or long answer), DPC_EUNAVAILABLE (no
 * connection, a timeout, 5xx). */
int storeget_range(const char *url, uint64_t off, void *dst, size_t n, int timeout_ms);

/* storeget_range over up to `streams` connections at once (at most STOREHTTP_STREAMS_MAX), each
 * reading a piece of at least piece_min bytes (workers: STOREGET_PIECE_MIN), since object
 * stores serve parallel ranged GETs faster than one stream; fails as storeget_range does (the
 * first failed piece's error). */
#define STOREGET_PIECE_MIN ((size_t)64 << 20)
int storeget_parallel(const char *url, uint64_t off, void *dst, size_t n, int streams, size_t piece_min,
                      int timeout_ms);

/* Bytes [off, off + n) of the object at url, handed to fn as they arrive (at: their offset in
 * the range, in order), over one connection, for readers that consume the bytes as they come
 * (a checksum, a decode) instead of holding the whole range. A negative return from fn stops
 * the transfer and is returned as it is; the other errors are storeget_range's. */
typedef int (*storeget_fn)(void *ud, uint64_t at, const void *p, size_t n);
int storeget_stream(const char *url, uint64_t off, uint64_t n, storeget_fn fn, void *ud, int timeout_ms);

/* The coordinator's blob format (coordinator/blobs.h, docs/design.md §6.4) as workers read
 * and write it in the store: its magic, and the kinds they meet (a version's parameters and
 * momentum, a delta, a slot's inner state: M, V, and the third stream's, L for streaming or E
 * for SparseLoCo, a SparseLoCo delta's sparse stream and a quantized delta as sent). */
#define STORE_BLOB_MAGIC 0x42435044u
enum {
  STORE_KIND_PARAMS = 1, STORE_KIND_MOMENTUM = 2, STORE_KIND_DELTA = 3,
  STORE_KIND_INNER_M = 5, STORE_KIND_INNER_V = 6, STORE_KIND_INNER_L = 7, STORE_KIND_INNER_E = 8,
  STORE_KIND_SPARSE = 9, STORE_KIND_ENCODED = 10
};

/* A blob object of the coordinator's format (header, n floats, trailer; coordinator/blobs.h,
 * docs/design.md §6.4) at url, read whole over one connection: the header must say `kind`
 * and n floats and both trailer checksums must hold. Floats [0, n_dst) go to dst, the rest (at
 * most two: the AdamW step an inner-state M blob carries) to extra (may be NULL). `what` names
 * the object in messages. 0, or storeget_range's errors, DPC_EFORMAT for another header,
 * DPC_ECHECKSUM when a checksum does not hold. */
int storeget_blob(const char *url, const char *what, uint32_t kind, uint64_t n, float *dst, uint64_t n_dst, void *extra,
                  int timeout_ms);

/* The CA bundle that https URLs of the store are verified against (the worker's --s3-ca-file,
 * for a store whose certificate a private CA signed); NULL or unset: the system's. Call once,
 * before any request. 0, or DPC_EINVAL with the reason when path cannot be read. */
int storehttp_set_ca_file(const char *path);

/* A curl easy handle (as void *, so that callers need not include curl) for one request to
 * url, with what every store request here shares: no signals, the stall limit and connect
 * timeout above, err (CURL_ERROR_SIZE bytes) as its error buffer; where gets url without its
 * signed query, for messages. NULL when curl has no handle to give. */
void *storehttp_open(const char *url, int timeout_ms, char *err, char *where, size_t wcap);

/* The error of a request that failed in transport (cc, a CURLcode other than CURLE_OK; err its
 * error buffer), "store METHOD WHERE: …": DPC_EUNAVAILABLE, and an untrusted certificate named
 * as such with the flag that fixes it. */
int storehttp_fail(int cc, const char *err, const char *method, const char *where);

/* fn(ud, k) for k = 0 … n-1 over up to `streams` threads (this one among them; at most
 * STOREHTTP_STREAMS_MAX), each taking the next k: 0, or the first failure (with its message),
 * after which no further k is started. Parallel ranges and parts (storeget_parallel,
 * storeput_put_parts). */
#define STOREHTTP_STREAMS_MAX 16
int storehttp_fanout(int n, int streams, int (*fn)(void *ud, int k), void *ud);

#endif
