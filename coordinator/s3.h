/* s3.h — the coordinator's client for an S3-compatible object store (AWS S3, Ceph RADOS Gateway,
 * Cloudflare R2, GCS in interoperability mode): objects under s3://BUCKET[/PREFIX] put, read in
 * ranges, checked, listed and deleted, multipart uploads for large ones, and presigned URLs that
 * let a worker move one object's bytes itself (docs/design.md §5, docs/operations.md).
 *
 * HTTP goes through libcurl; requests are signed with SigV4 (s3_sigv4.h), path-style
 * (ENDPOINT/BUCKET/KEY), payload UNSIGNED-PAYLOAD with a Content-MD5 on every PUT over http so
 * the store verifies the bytes it keeps (over https TLS does that already). Every request has a deadline; timeouts, connection failures, 429
 * and 5xx are retried with jittered exponential backoff (100 ms doubling to 5 s, at most
 * `retries` more tries); other answers fail at once with the store's error code and message.
 *
 * Errors: DPC_ENOENT (no such key), DPC_EUNAVAILABLE (store unreachable, timing out, or answering
 * 5xx/429 after the retries: an outage), DPC_EPERM (credentials refused), DPC_EINVAL (bad
 * arguments, no such bucket, not an S3 endpoint), DPC_ECHECKSUM (the store says the bytes did not
 * match their MD5), DPC_EIO (any other S3 error answer). dpc_errmsg() says which
 * request, which key and what the store answered.
 *
 * Ownership: s3_open allocates, s3_close frees. Thread-safety: one s3_client per thread (each
 * holds one curl handle); presigning needs no handle and is thread-safe. */
#ifndef DPC_S3_H
#define DPC_S3_H

#include "coordinator/s3_sigv4.h"

#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct {
  const char *url;         /* "s3://BUCKET[/PREFIX]" */
  const char *endpoint;    /* "http[s]://HOST[:PORT]" */
  const char *region;      /* NULL: "us-east-1" */
  const char *ca_file;     /* https: CA bundle; NULL: the system's */
  const char *creds_file;  /* AWS shared-credentials file (mode 0600); NULL: the environment */
  const char *profile;     /* NULL: AWS_PROFILE or "default" */
  int timeout_ms;          /* per request; 0: 30000 */
  int retries;             /* extra tries on transient failures; 0: 5; -1: none */
  int max_parts;           /* the store's limit on parts of one upload; 0: S3_MAX_PARTS (tests lower it) */
  uint64_t copy_max;       /* one CopyObject's limit in bytes; 0: S3_MAX_PART_BYTES (tests lower it) */
  int page;                /* keys or uploads asked for per listing page; 0: 1000, S3's default */
} s3_options;

/* S3's limits, which S3-compatible stores (R2, GCS, Ceph) share: parts of one multipart upload,
 * a part's size, an object's size. */
#define S3_MAX_PARTS 10000
#define S3_MAX_PART_BYTES ((uint64_t)5 << 30)
#define S3_MAX_OBJECT_BYTES ((uint64_t)5 << 40)

typedef struct s3_client s3_client;

/* Parse and check the options and credentials (no network yet). */
int s3_open(s3_client **out, const s3_options *o);
void s3_close(s3_client *c);

/* Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) from the
 * environment, or a shared-credentials file's profile. The file is refused unless only its owner
 * may read it (no group or other permission bits). */
int s3_creds_from_env(s3_creds *cr);
int s3_creds_load(s3_creds *cr, const char *path, const char *profile);

/* The bucket exists and the credentials may use it (HEAD bucket). */
int s3_check_bucket(s3_client *c);
/* Create the bucket (tests and first set-up; an existing bucket of ours is fine). */
int s3_create_bucket(s3_client *c);

/* Keys are relative to the prefix. */
int s3_put(s3_client *c, const char *key, const void *data, size_t len);
/* Bytes [off, off + len) of key into dst; DPC_EFORMAT if the object is shorter. */
int s3_get_range(s3_client *c, const char *key, uint64_t off, void *dst, size_t len);
/* Size and ETag (quotes stripped; may be NULL) of key. */
int s3_head(s3_client *c, const char *key, uint64_t *size, char *etag, size_t etag_cap);
/* Deleting a key that does not exist succeeds (S3 semantics). */
int s3_delete(s3_client *c, const char *key);
/* CopyObject: the store copies object `from` to `to` itself (no bytes pass through us); with
 * etag (unquoted), only while `from` still has it (DPC_ECHECKSUM otherwise: the condition goes
 * as S3's x-amz-copy-source-if-match and as x-amz-copy-if-match, the name Ceph's RADOS Gateway
 * reads; tests/unit/test_s3_store.c checks it is honoured). At most 5 GiB (S3's limit for one
 * copy; larger objects are copied in parts, s3_mpu_copy_part). */
int s3_copy(s3_client *c, const char *from, const char *to, const char *etag);

/* Every key under prefix p (relative; "" = all) with its size and when it was last written
 * (seconds since the epoch by the store's clock; 0 if the store did not say), via ListObjectsV2
 * pages; fn returning non-zero stops the walk and is returned. */
typedef int (*s3_list_fn)(void *ud, const char *key, uint64_t size, int64_t mtime_s);
int s3_list(s3_client *c, const char *p, s3_list_fn fn, void *ud);

/* The part size for a multipart upload of total bytes: want (≥ 5 MiB), or the smallest whole
 * MiB above it that keeps the parts within max_parts (0: S3_MAX_PARTS); 0 when total is beyond
 * S3's object limit or no part size within S3_MAX_PART_BYTES fits. */
uint64_t s3_part_bytes(uint64_t total, uint64_t want, int max_parts);
/* The client's max_parts (s3_options). */
int s3_max_parts(const s3_client *c);

/* Multipart upload: parts 1 .. max_parts (S3: 10000), each ≥ 5 MiB but the last. */
int s3_mpu_create(s3_client *c, const char *key, char *upload_id, size_t cap);
int s3_mpu_put_part(s3_client *c, const char *key, const char *upload_id, int part, const void *data, size_t len,
                    char *etag, size_t etag_cap);
int s3_mpu_complete(s3_client *c, const char *key, const char *upload_id, int nparts, char (*etags)[80]);
int s3_mpu_abort(s3_client *c, const char *key, const char *upload_id);
/* UploadPartCopy: part `part` of upload_id on `to` becomes bytes [off, off + len) of object
 * `from`, copied by the store (only while from's ETag is etag, when given, sent as s3_copy sends
 * it); the part's ETag (unquoted: the MD5 of those bytes, hex) into part_etag. A copy beyond one
 * CopyObject's 5 GiB goes this way (blobs_s3.c). */
int s3_mpu_copy_part(s3_client *c, const char *from, const char *to, const char *upload_id, int part, uint64_t off,
                     uint64_t len, const char *etag, char *part_etag, size_t cap);
/* Unfinished multipart uploads under the prefix, every page of ListMultipartUploads:
 * fn(ud, key, upload_id); fn returning non-zero stops the walk and is returned. */
typedef int (*s3_upload_fn)(void *ud, const char *key, const char *upload_id);
int s3_mpu_list(s3_client *c, s3_upload_fn fn, void *ud);

/* A presigned URL for method ("GET" or "PUT") on key, valid expires_s seconds from now. For PUT,
 * content_md5 (base64, or NULL) is signed: the holder must send it and the store checks the
 * bytes against it. */
int s3_presign(const s3_client *c, const char *method, const char *key, const char *content_md5, int expires_s,
               char *url, size_t cap);

/* A presigned UploadPart (PUT ?partNumber=part&uploadId=upload_id) of key, content_md5 signed as
 * for s3_presign: how a worker puts one part of an upload the coordinator created. */
int s3_presign_part(const s3_client *c, const char *key, const char *upload_id, int part, const char *content_md5,
                    int expires_s, char *url, size_t cap);

/* Payload bytes sent (PUT and POST bodies) and received (GET answers) by every request of this
 * process that succeeded, since it started: the blob store's traffic in /metrics. */
void s3_bytes(uint64_t *sent, uint64_t *received);

/* Base64 of the MD5 of data (Content-MD5) into out[25]; s3_md5_base64 of a digest. */
void s3_content_md5(const void *data, size_t len, char out[25]);
void s3_md5_base64(const unsigned char md5[16], char out[25]);

#endif
