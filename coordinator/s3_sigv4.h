/* s3_sigv4.h — AWS Signature Version 4 for S3-compatible object stores: the Authorization header
 * of a request the coordinator sends itself, and presigned URLs (query signing) that let a worker
 * GET or PUT one object without holding credentials (docs/design.md §5).
 *
 * Written here rather than taken from libcurl: curl's CURLOPT_AWS_SIGV4 signs a request it sends,
 * but cannot produce a URL for someone else to send, and one signer for both keeps the canonical
 * request in one place. tests/unit/test_s3_sigv4.c checks it against AWS's published examples.
 *
 * Inputs are not encoded by the caller: paths and query values are percent-encoded here (RFC 3986
 * unreserved characters kept, '/' kept in paths), queries sorted, header names lower-cased and
 * values trimmed, as SigV4 requires. Pure functions of their arguments; thread-safe. */
#ifndef DPC_S3_SIGV4_H
#define DPC_S3_SIGV4_H

#include <stddef.h>
#include <time.h>

#define S3_KEY_MAX 256     /* access key id / secret key, bytes with the NUL */
#define S3_TOKEN_MAX 4096  /* session token */
#define S3_URL_MAX 8192

typedef struct {
  char access_key[S3_KEY_MAX];
  char secret_key[S3_KEY_MAX];
  char session_token[S3_TOKEN_MAX]; /* "" when none (X-Amz-Security-Token / x-amz-security-token) */
} s3_creds;

typedef struct {
  const char *name;  /* any case */
  const char *value; /* NULL: a query parameter without a value, signed as "name=" */
} s3_kv;

/* Hex SHA-256 of n bytes at d into out[65]. */
void s3_sha256_hex(const void *d, size_t n, char out[65]);

/* Percent-encode `in` (RFC 3986 unreserved kept; '/' kept when keep_slash) into out[cap];
 * DPC_EINVAL when it does not fit. */
int s3_uri_encode(const char *in, int keep_slash, char *out, size_t cap);

/* "YYYYMMDDTHHMMSSZ" of t (UTC) into out[17]. */
void s3_amz_date(time_t t, char out[17]);

/* The Authorization header value for a request: method, path (unencoded, from '/'), query
 * parameters, the headers to sign (they must include host, x-amz-date and, for S3,
 * x-amz-content-sha256; their x-amz-date gives the signing time), and the payload's hex SHA-256
 * or "UNSIGNED-PAYLOAD". DPC_EINVAL on a missing x-amz-date, an overlong input or a header
 * without a value. */
int s3_sigv4_authorization(const s3_creds *cr, const char *region, const char *method, const char *path,
                           const s3_kv *query, int nq, const s3_kv *headers, int nh, const char *payload_hash,
                           char *out, size_t cap);

/* A presigned URL: base (scheme://host[:port], no trailing '/'), host as the request will send it
 * (with the port when not the scheme's default), path (unencoded), extra query parameters (e.g.
 * partNumber, uploadId), extra headers the holder must send unchanged (e.g. content-md5; host is
 * always signed), signing time and validity in seconds (1 .. 604800). Payload UNSIGNED-PAYLOAD.
 * DPC_EINVAL on bad arguments or an overlong result. */
int s3_sigv4_presign(const s3_creds *cr, const char *region, const char *method, const char *base, const char *host,
                     const char *path, const s3_kv *query, int nq, const s3_kv *headers, int nh, time_t now,
                     int expires_s, char *out, size_t cap);

#endif
