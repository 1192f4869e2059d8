/* blobs_s3.h — the blob store's bytes on an S3-compatible object store (blobs.h keeps the
 * format, names and checks; this module moves bytes): one object per blob under
 * s3://BUCKET/PREFIX/NAME, written with a single PUT or, above one part, a multipart upload
 * streamed part by part (up to four parts in flight), and read in ranges.
 *
 * Commit point: an object exists only once its PUT or CompleteMultipartUpload succeeded, and a
 * blob counts only once a database row names it (as with files), so a crash leaves at most an
 * unrecorded object or an unfinished upload, which blob_store_sweep removes at start-up. A
 * write whose last request failed may still have made its object; the running coordinator
 * deletes those itself when their name is never rewritten (a delta's, stamped with its
 * attempt; blob_s3_doubtful), and the start-up sweep the others.
 *
 * Threads: a blob_s3 is shared; each call takes an S3 client (one curl handle each) from a
 * mutex-guarded pool and gives it back, so the loop thread and the thread pool use the store
 * at once. A writer holds one client from open to commit or abort. */
#ifndef DPC_BLOBS_S3_H
#define DPC_BLOBS_S3_H

#include "coordinator/s3.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Multipart part size (S3's minimum is 5 MiB); larger for an object that would otherwise need more
 * parts than the store allows (s3_part_bytes). */
#define BLOB_S3_PART_BYTES ((size_t)16 << 20)

typedef struct blob_s3 blob_s3;
typedef struct blob_s3_writer blob_s3_writer;

/* Open the store and check that the bucket exists and the credentials may list it. */
int blob_s3_open(const s3_options *o, blob_s3 **out);
void blob_s3_close(blob_s3 *s);
/* "s3://BUCKET/PREFIX/" as given, for messages. */
const char *blob_s3_url(const blob_s3 *s);
/* The most parts the store takes to one multipart upload (s3_options.max_parts). */
int blob_s3_max_parts(const blob_s3 *s);
/* The largest object blob_s3_copy copies: any, until the store refused a part copy; then one
 * CopyObject's limit (5 GiB). */
uint64_t blob_s3_copy_limit(blob_s3 *s);

/* A writer of exactly `total` bytes under name; once = 1 for a name never rewritten (a failed
 * write's object is then deleted as soon as the store answers; blob_s3_doubtful). */
int blob_s3_writer_open(blob_s3 *s, const char *name, uint64_t total, int once, blob_s3_writer **out);
int blob_s3_writer_append(blob_s3_writer *w, const void *p, size_t n);
/* Before the first append, with hurry not NULL: one part in flight instead of up to four, so
 * that the writer takes a small share of the store beside the requests others wait for (a
 * sync step's momentum, sent after its version's commit while the workers read the new
 * parameters), until *hurry (set from any thread, read at each part) turns non-zero: then up
 * to four. */
void blob_s3_writer_background(blob_s3_writer *w, const atomic_int *hurry);
/* Upload what is left and make the object visible; frees the writer either way. */
int blob_s3_writer_commit(blob_s3_writer *w);
void blob_s3_writer_abort(blob_s3_writer *w);

/* Object size (DPC_ENOENT when absent); with its ETag (quotes stripped) into etag[cap];
 * bytes [off, off + n) into dst. */
int blob_s3_size(blob_s3 *s, const char *name, uint64_t *size);
int blob_s3_head(blob_s3 *s, const char *name, uint64_t *size, char *etag, size_t cap);
int blob_s3_read(blob_s3 *s, const char *name, uint64_t off, void *dst, size_t n);
/* A read-ahead: bytes [off, off + n) of `name` fetched on a thread of its own, so a streamed
 * reader (the outer step reads θ, u and every delta range by range) keeps one request in
 * flight per blob instead of waiting on each in turn. take joins it and, when it covers exactly
 * [off, off + n), copies it into dst and returns 1 (or its error); otherwise 0 (read it
 * yourself). take and free both release it. */
typedef struct blob_s3_ahead blob_s3_ahead;
int blob_s3_ahead_start(blob_s3 *s, const char *name, uint64_t off, size_t n, blob_s3_ahead **out);
int blob_s3_ahead_take(blob_s3_ahead *a, uint64_t off, size_t n, void *dst);
void blob_s3_ahead_free(blob_s3_ahead *a);
/* Delete (absent is success). */
int blob_s3_delete(blob_s3 *s, const char *name);
/* An object whose delete failed, deleted by the next probe that finds the store answering. */
void blob_s3_delete_later(blob_s3 *s, const char *name);
/* The store copies `from` (size bytes) to `to`, only while from's ETag is etag (when given):
 * up to one CopyObject's limit (S3: 5 GiB; s3_options.copy_max) in one (s3_copy), beyond it in
 * an upload of copied parts aligned with the parts of part_bytes the object was put in, each
 * part's ETag checked against part_etags[i] (its MD5, hex; NULL: not checked), so that an object
 * rewritten during the copy never lands under `to` (DPC_ECHECKSUM). */
int blob_s3_copy(blob_s3 *s, const char *from, const char *to, const char *etag, uint64_t size, uint64_t part_bytes,
                 int parts, const char (*part_etags)[80]);
/* Every object name under the prefix whose name starts with `under` ("" = all), with its size
 * and when it was written. */
int blob_s3_list(blob_s3 *s, const char *under, s3_list_fn fn, void *ud);
/* 1 while the store answers; 0 after a request found it unreachable or failing (5xx) past its
 * retries, until one succeeds again: reason[cap] gets the last failure, *since_ms (wall clock)
 * when it started (either may be NULL). */
int blob_s3_health(blob_s3 *s, char *reason, size_t cap, int64_t *since_ms);
/* A presigned URL for method ("GET" or "PUT") on object `name`, valid expires_s seconds; a PUT's
 * content_md5 (base64, or NULL) is signed, so the store takes only those bytes. */
int blob_s3_presign(blob_s3 *s, const char *name, const char *method, const char *content_md5, int expires_s, char *url,
                    size_t cap);
/* A multipart upload whose parts a worker puts through presigned URLs (svc_put.c): begin names
 * it (upload_id[cap]), presign_part signs part 1..10000 with its Content-MD5 (base64), complete
 * makes the object from the parts (etags: each part's, quotes stripped), abort drops it. */
int blob_s3_upload_begin(blob_s3 *s, const char *name, char *upload_id, size_t cap);
int blob_s3_presign_part(blob_s3 *s, const char *name, const char *upload_id, int part, const char *content_md5,
                         int expires_s, char *url, size_t cap);
int blob_s3_upload_complete(blob_s3 *s, const char *name, const char *upload_id, int nparts, char (*etags)[80]);
int blob_s3_upload_abort(blob_s3 *s, const char *name, const char *upload_id);
/* One cheap request (a one-key listing) to find out whether a store that is down is back; when
 * it answers, the doubtful writes are deleted. */
int blob_s3_probe(blob_s3 *s);
/* How many writes failed at their last request and may have left an object behind: each is
 * deleted by the next probe that finds the store up (a failed write's caller records no row). */
int blob_s3_doubtful(blob_s3 *s);
/* Abort every unfinished multipart upload under the prefix (start-up); *n gets how many. */
int blob_s3_abort_uploads(blob_s3 *s, int *n);

#endif
