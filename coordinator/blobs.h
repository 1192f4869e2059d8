/* blobs.h — the coordinator's blob store: float arrays (parameters, outer momentum, deltas,
 * async buffers, inner AdamW state) as checksummed files under STATE/blobs/, or as objects of
 * the same format on an S3-compatible store (blob_store_open_s3; blobs_s3.h).
 *
 * File format (little-endian), version 1:
 *   header  24 bytes: u32 magic 0x42435044 ("DPCB"), u32 version 1, u32 kind (blob_kind),
 *                     u32 reserved 0, u64 n (number of floats)
 *   payload 4·n bytes: the floats
 *   trailer  8 bytes: u32 crc32c(payload), u32 crc32c(header)
 * The payload CRC is the same value as the wire checksum of the array (dpc_crc32c over the
 * float bytes), so the store records it and the RPC layer can serve it without re-reading.
 *
 * Writes go through common/fsutil's atomic writer (temp name, fsync, rename, directory
 * fsync): a blob name either holds a complete, valid file or nothing. Reads validate size,
 * magic, version, kind, length and both checksums before returning any data.
 *
 * Names. A blob is addressed by a name relative to STATE/blobs/, derived with blob_name()
 * from a blob_id: "<job>/f<fragment>-v<version>.<kind>" and, when aux != 0,
 * "<job>/f<fragment>-v<version>-a<aux>.<kind>" (aux is the lease id of a delta, the slot of an
 * inner state). Names given to the read/delete functions are checked (no "..", no absolute
 * paths), since they come from the database.
 *
 * Ownership and threads: a blob_store is immutable after blob_store_open, so any number of
 * threads may use it at once on distinct names (the libuv thread pool writes blobs while the
 * loop thread reads others). Writing the same name from two threads at once is the caller's
 * bug (the last rename wins, both files are complete). */
#ifndef DPC_BLOBS_H
#define DPC_BLOBS_H

#include "coordinator/blobs_cache.h"
#include "coordinator/s3.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define BLOB_MAGIC 0x42435044u
#define BLOB_VERSION 1u
#define BLOB_HEADER_BYTES 24
#define BLOB_TRAILER_BYTES 8
#define BLOB_NAME_MAX 96
#define BLOB_MAX_FLOATS ((uint64_t)1 << 36) /* 256 GiB: far above any module */

typedef enum {
  BLOB_PARAMS = 1,   /* θ of a fragment version */
  BLOB_MOMENTUM = 2, /* outer momentum u (sync) or m (delayed Nesterov) */
  BLOB_DELTA = 3,    /* a received delta (version field = round, aux = lease) */
  BLOB_DN_BUF = 4,   /* delayed-Nesterov Δbuf */
  BLOB_INNER_M = 5,  /* AdamW first moment of a slot (aux = slot) */
  BLOB_INNER_V = 6,  /* AdamW second moment of a slot (aux = slot) */
  BLOB_INNER_L = 7,  /* streaming: a slot's local parameters (aux = slot) */
  BLOB_INNER_E = 8,  /* SparseLoCo: a slot's error-feedback buffer (aux = slot) */
  /* SparseLoCo: a received sparse delta (as BLOB_DELTA), the CODEC_SPARSE stream zero-padded to
   * whole floats (its exact length follows from the job's fragment layout). */
  BLOB_SPARSE = 9,
  /* A quantized delta's stream as sent (beside its decoded BLOB_DELTA; same id), zero-padded
   * to whole floats, kept for replay pulls (docs/design.md §4.3). */
  BLOB_ENCODED = 10,
} blob_kind;

typedef struct {
  int64_t job;
  int32_t fragment;
  int64_t version; /* fragment version; for deltas the round */
  int64_t aux;     /* 0, a lease id (deltas) or a slot id (inner state) */
  int64_t attempt; /* 0, or a push attempt (deltas): two pushes of one lease never share a file */
  blob_kind kind;
} blob_id;

typedef struct blob_store blob_store;

/* Open (creating if needed) STATE/blobs/. *out is freed with blob_store_close. */
int blob_store_open(const char *state_dir, blob_store **out);
/* Open a store whose blobs are objects under an S3 URL (coordinator/blobs_s3.h): the same
 * format, names and checks; writes are durable once the store acknowledged them. Fails with the
 * store's reason when the bucket is missing or the credentials are refused. */
int blob_store_open_s3(const s3_options *o, blob_store **out);
/* 1 for an S3 store. */
int blob_store_is_s3(const blob_store *bs);
/* An S3 store's objects, for what is kept there beside the blobs (uploads, admin_upload.c);
 * NULL for files. */
typedef struct blob_s3 blob_s3;
blob_s3 *blob_store_s3(blob_store *bs);
/* Keep up to cap bytes of payloads in memory (blobs_cache.h): what the store's own writes and
 * the reads asked to keep (blob_reader_keep) verified, served again without a request; 0 turns
 * it off. An S3 store
 * only (files have the kernel's page cache): DPC_EUNSUPPORTED for files. */
int blob_store_set_cache(blob_store *bs, uint64_t cap);
/* The cache's counters (all 0 without a cache). */
void blob_store_cache_stats(blob_store *bs, blobs_cache_stats *out);
/* On an S3 store with a cache: blobs_cache_prewarm of `count` payload buffers of `floats`
 * (a job's θ, u and deltas per fragment); how many it made (0 without a cache). Slow: off the
 * loop thread. */
int blob_store_prewarm(blob_store *bs, size_t floats, int count);
/* Drop the memory copy of blob `name` (NULL or "": nothing), keeping the blob: an outer step
 * that made the next version no longer needs its inputs, so they should not hold the cache. */
void blob_store_uncache(blob_store *bs, const char *name);
void blob_store_close(blob_store *bs);
/* The absolute-or-relative directory path of the store ("STATE/blobs"). */
const char *blob_store_dir(const blob_store *bs);

/* Write the name of `id` into buf[cap]; DPC_EINVAL for negative ids or an unknown kind. */
int blob_name(const blob_id *id, char *buf, size_t cap);
/* Parse the kind from a name's extension; DPC_EINVAL if none. */
int blob_kind_of_name(const char *name, blob_kind *out);

/* Write data[0..n) durably as blob `name` of kind `kind` (replacing an existing one).
 * *crc_out (may be NULL) receives crc32c of the payload. */
int blob_write(blob_store *bs, const char *name, blob_kind kind, const float *data, size_t n, uint32_t *crc_out);

/* Streaming writer for arrays that arrive in chunks (PushDelta): the total n is known up
 * front; append exactly 4·n bytes, then commit (durable; returns the payload crc) or abort.
 * Commit and abort free the writer, commit even when it fails. */
typedef struct blob_writer blob_writer;
int blob_writer_open(blob_store *bs, const char *name, blob_kind kind, size_t n, blob_writer **out);
/* BLOB_WRITE_LATER: on an S3 store whose blob cache takes the payload, nothing is sent until
 * the commit, which sends it from the cache's copy (a sync outer step's momentum: its commit
 * runs after the version's); given a flag by blob_writer_hurry_flag, with one part in flight
 * until the flag is set (the store's bandwidth goes first to the parameters the workers are
 * reading; once someone waits for the blob, up to four). Otherwise, and on the local store,
 * the same as blob_writer_open. */
#define BLOB_WRITE_LATER 1
int blob_writer_open_ex(blob_store *bs, const char *name, blob_kind kind, size_t n, int flags, blob_writer **out);
/* Before the commit of a BLOB_WRITE_LATER writer (NULL: none); the flag must outlive the
 * commit. */
void blob_writer_hurry_flag(blob_writer *w, const atomic_int *hurry);
/* crc32c of the payload appended so far (what the commit will return once all is in). */
uint32_t blob_writer_crc(const blob_writer *w);
int blob_writer_append(blob_writer *w, const void *bytes, size_t nbytes);
int blob_writer_commit(blob_writer *w, uint32_t *crc_out);
/* Ask the kernel to start writing back the bytes appended so far (no waiting; see
 * dpc_afile_writeback), so that the commit's fsync overlaps the producer's work. */
void blob_writer_writeback(blob_writer *w);
void blob_writer_abort(blob_writer *w);

/* Read blob `name` into dst[n]: fails with DPC_ESHAPE unless the blob holds exactly n floats,
 * DPC_EFORMAT for a bad size/magic/version/kind, DPC_ECHECKSUM for a checksum mismatch,
 * DPC_ENOENT if missing. *crc_out (may be NULL) receives the payload crc. */
int blob_read(blob_store *bs, const char *name, blob_kind kind, float *dst, size_t n, uint32_t *crc_out);
/* Same, allocating: *out (caller frees) holds *n floats. */
int blob_read_alloc(blob_store *bs, const char *name, blob_kind kind, float **out, size_t *n, uint32_t *crc_out);

/* Sequential reader for arrays too large to hold whole (the streamed outer step reads a range
 * of every input at a time): open validates the file's size, magic, version, kind, length (n
 * floats, else DPC_ESHAPE) and header checksum (sequential access advised); view reads the
 * next nbytes of the payload into the reader's buffer (grown to the largest view asked for)
 * and points at it, valid until the next view, close or abort; read reads them into dst; both
 * checksum them as they go (so a view's bytes are in the CPU cache when the caller uses them).
 * A reader holds no more of the file than its largest view.
 * close compares the payload checksum with the trailer once every byte was read (DPC_ESHAPE
 * if some were not, DPC_ECHECKSUM on a mismatch) and gives it in *crc_out (may be NULL).
 * Data handed out before close is unverified: callers must not let it escape (publish, commit)
 * until close succeeded. Close and abort free the reader (and invalidate views). */
typedef struct blob_reader blob_reader;
int blob_reader_open(blob_store *bs, const char *name, blob_kind kind, size_t n, blob_reader **out);
/* Right after open: keep a copy of what this reader reads in the store's cache, published when
 * close verified it, for the next reader of the same name (the commit's check of a put delta,
 * which the outer step reads again). Nothing without a cache, on a hit, or for a kind the
 * cache does not keep. */
void blob_reader_keep(blob_reader *r);
int blob_reader_view(blob_reader *r, size_t nbytes, const void **view);
int blob_reader_read(blob_reader *r, void *dst, size_t nbytes);
int blob_reader_close(blob_reader *r, uint32_t *crc_out);
void blob_reader_abort(blob_reader *r);

/* Map blob `name` (n floats of kind `kind`) read-only: *data points at its payload inside the
 * mapping, which blob_unmap(*map, *map_len) releases. Blob files are never changed in place
 * (written under a temporary name, renamed; deletion unlinks), so the mapping stays valid and
 * constant after the name is collected. With verify != 0 the header and payload checksums are
 * checked (touching every page) and *crc_out gets the payload crc; with verify == 0 (the
 * caller has just written the blob and knows its crc) only the header is checked. Thread-safe;
 * DPC_E* as blob_read. */
int blob_map(blob_store *bs, const char *name, blob_kind kind, size_t n, int verify, const float **data, void **map,
             size_t *map_len, uint32_t *crc_out);
void blob_unmap(void *map, size_t map_len);

/* 1 while the store can be used (always, for files); 0 while an S3 store is unreachable or
 * failing, with the last failure in reason[cap] and its start in *since_ms (may be NULL).
 * blob_store_probe asks a store that is down whether it is back (0 when it is), and then
 * deletes the objects of failed writes that may have landed anyway; blob_store_doubtful counts
 * those still to delete (always 0 for files, whose failed writes leave nothing). */
int blob_store_health(blob_store *bs, char *reason, size_t cap, int64_t *since_ms);
int blob_store_probe(blob_store *bs);
int blob_store_doubtful(blob_store *bs);

/* How long a presigned blob URL lives (blob_url_ttl_s): BLOB_URL_TTL_S, plus the time to move
 * `bytes` at BLOB_URL_MIN_RATE, where `bytes` is what its holder may move before its last
 * request with the URL starts (a store checks the expiry when a request begins, not while it
 * runs: a 28 GB delta put in parts four at a time over a slow link starts its last parts an
 * hour in); at most SigV4's 7 days. A worker whose URL expired anyway moves the bytes through
 * the coordinator. */
#define BLOB_URL_TTL_S 900
#define BLOB_URL_MIN_RATE ((uint64_t)1000000) /* bytes a second */
int blob_url_ttl_s(uint64_t bytes);
/* A presigned GET URL of blob `name` (an S3 store only; DPC_EUNSUPPORTED for files), living
 * blob_url_ttl_s(bytes). */
int blob_store_url(blob_store *bs, const char *name, uint64_t bytes, char *url, size_t cap);

/* Workers' puts (blobs_put.c; docs/design.md §5.8), S3 stores only (DPC_EUNSUPPORTED for files).
 * A presigned PUT URL of blob `name` that makes the store check the bytes against md5: a worker
 * writes its delta object itself. The URLs live blob_url_ttl_s(bytes). */
int blob_store_put_url(blob_store *bs, const char *name, const unsigned char md5[16], uint64_t bytes, char *url,
                       size_t cap);
/* An object too large for one PUT, put by the worker in parts: begin starts a multipart upload
 * (upload_id[cap]); part_url presigns part 1..n with its MD5; complete makes the object from
 * the n parts whose MD5s are given (a part's ETag is its MD5); abort drops the upload. */
int blob_store_upload_begin(blob_store *bs, const char *name, char *upload_id, size_t cap);
int blob_store_part_url(blob_store *bs, const char *name, const char *upload_id, int part, const unsigned char md5[16],
                        uint64_t bytes, char *url, size_t cap);
int blob_store_upload_complete(blob_store *bs, const char *name, const char *upload_id, int n,
                               const unsigned char (*md5)[16]);
int blob_store_upload_abort(blob_store *bs, const char *name, const char *upload_id);
/* The ETag S3 gives an object put whole (n = 0: the hex MD5 of md5[0]) or completed from n
 * parts (the hex MD5 of the parts' MD5s, "-n"), into etag[80]. */
void blob_put_etag(const unsigned char (*md5)[16], int n, char etag[80]);
/* The object a worker put, made whole and checked: an object put in parts (parts > 0) has its
 * upload completed from the parts' MD5s first; then HEAD says it holds `size` bytes with the
 * ETag its MD5s give (md5 NULL and no parts: the size only), which goes to etag. DPC_ENOENT when
 * absent, DPC_EFORMAT for another size, DPC_ECHECKSUM for another ETag; a failed completion
 * is named when the HEAD fails too. */
int blob_store_settle_put(blob_store *bs, const char *name, uint64_t size, const unsigned char md5[16],
                          const char *upload_id, int parts, const unsigned char (*part_md5)[16], char etag[80]);
/* The store copies object `from` (size bytes) to `to` itself (no byte passes through the
 * coordinator), only while `from`'s ETag is etag when one is given (DPC_ECHECKSUM otherwise):
 * one CopyObject up to 5 GiB; beyond, part by part along the parts it was put in (parts of
 * part_bytes whose MD5s are part_md5, each copied part checked against its MD5). An inner-state
 * `to` is then known to exist (blob_exists). */
int blob_store_copy(blob_store *bs, const char *from, const char *to, const char *etag, uint64_t size,
                    uint64_t part_bytes, int parts, const unsigned char (*part_md5)[16]);
/* An S3 object whose delete failed (a written-once name nothing will write again): deleted
 * once a probe finds the store answering (the start-up sweep otherwise). */
void blob_store_delete_later(blob_store *bs, const char *name);
/* blobs_put.c's way into the store: `name` checked, the S3 half of bs into *out (what names the
 * operation for the error when bs keeps files). */
typedef struct blob_s3 blob_s3;
int blob_store_s3_of(blob_store *bs, const char *name, const char *what, blob_s3 **out);
/* An S3 store's set of inner-state names learns that `name` is there (other names, and files:
 * nothing): an object another path than a blob writer made (blob_store_copy). */
void blob_store_known_add(blob_store *bs, const char *name);

/* 1 if blob `name` exists (a file, or an object), else 0. On S3 an inner-state name is answered
 * without a request, from the names this coordinator wrote or its start-up sweep listed
 * (blobs_known.h); before a sweep completed, and for other names, by a HEAD. */
int blob_exists(blob_store *bs, const char *name);

/* Remove blob `name` (durably: the directory is fsync'd). A missing blob is success. */
int blob_delete(blob_store *bs, const char *name);

/* Remove blobs names[0..n) with one directory fsync per distinct directory instead of one
 * per blob (garbage collection of a round's deltas: R unlinks, not R fsyncs, on the loop
 * thread). Missing blobs are success; the first error is returned after trying them all. */
int blob_delete_many(blob_store *bs, char *const *names, int n);

/* Start-up recovery, only while no write is in flight (before the daemon serves):
 *  - temporary files of writes that never finished (a crash between creating a blob's temp
 *    file and renaming it; common/fsutil names them "<name>.tmp.<pid>.<n>") are removed
 *    under STATE/blobs/ and its job directories;
 *  - with keep (the names the database references; sorted here in place), parameter,
 *    momentum, delta and async-buffer blobs that no row names are removed: a crash between
 *    a blob's rename and its row's commit, or between garbage collection's commit and its
 *    unlinks, leaves such files. Only job directories that keep references are looked at
 *    (so a missing database never empties the store); inner AdamW state blobs, which the
 *    database does not track, are always left alone.
 * *temps and *orphans (may be NULL) get the counts removed. */
int blob_store_sweep(blob_store *bs, char **keep, int n_keep, int *temps, int *orphans);

/* Full path of blob `name` into buf[cap] (for tests and tools). */
int blob_path(const blob_store *bs, const char *name, char *buf, size_t cap);

#endif
