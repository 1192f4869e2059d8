/* blobs_put.c — objects that workers read from and write into an S3 blob store themselves
 * (blobs.h "Workers' puts"; docs/design.md §5.8): presigned GET URLs; presigned PUT URLs that
 * sign each request's Content-MD5, so the store keeps only the bytes the worker announced; for
 * an object above one PUT's size, a multipart upload the coordinator starts and completes while
 * the worker puts its parts; the HEAD check of what landed, and the store's own copy of it to
 * the name it is committed under. The coordinator never handles these bytes on the way in. */
#include "coordinator/blobs.h"
#include "coordinator/blobs_s3.h"
#include "common/errors.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

int blob_url_ttl_s(uint64_t bytes) {
  const uint64_t most = 7 * 24 * 3600, t = BLOB_URL_TTL_S + bytes / BLOB_URL_MIN_RATE;
  return (int)(t < most ? t : most);
}

int blob_store_url(blob_store *bs, const char *name, uint64_t bytes, char *url, size_t cap) {
  blob_s3 *s;
  int rc = blob_store_s3_of(bs, name, "a URL", &s);
  return rc ? rc : blob_s3_presign(s, name, "GET", NULL, blob_url_ttl_s(bytes), url, cap);
}

int blob_store_put_url(blob_store *bs, const char *name, const unsigned char md5[16], uint64_t bytes, char *url,
                       size_t cap) {
  blob_s3 *s;
  int rc = blob_store_s3_of(bs, name, "a presigned PUT", &s);
  if (rc) return rc;
  char b64[25];
  s3_md5_base64(md5, b64);
  return blob_s3_presign(s, name, "PUT", b64, blob_url_ttl_s(bytes), url, cap);
}

int blob_store_upload_begin(blob_store *bs, const char *name, char *upload_id, size_t cap) {
  blob_s3 *s;
  int rc = blob_store_s3_of(bs, name, "a multipart upload", &s);
  return rc ? rc : blob_s3_upload_begin(s, name, upload_id, cap);
}

int blob_store_part_url(blob_store *bs, const char *name, const char *upload_id, int part, const unsigned char md5[16],
                        uint64_t bytes, char *url, size_t cap) {
  blob_s3 *s;
  int rc = blob_store_s3_of(bs, name, "a presigned part", &s);
  if (rc) return rc;
  char b64[25];
  s3_md5_base64(md5, b64);
  return blob_s3_presign_part(s, name, upload_id, part, b64, blob_url_ttl_s(bytes), url, cap);
}

static void hex(const unsigned char *d, int n, char *out) {
  for (int i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

int blob_store_upload_complete(blob_store *bs, const char *name, const char *upload_id, int n,
                               const unsigned char (*md5)[16]) {
  blob_s3 *s;
  int rc = blob_store_s3_of(bs, name, "a multipart upload", &s);
  if (rc) return rc;
  if (n < 1 || n > 10000) return dpc_err(DPC_EINVAL, "blob %s: %d parts (1..10000)", name, n);
  char(*etags)[80] = malloc((size_t)n * sizeof *etags);
  if (!etags) return dpc_err(DPC_ENOMEM, "blob %s: out of memory completing its upload", name);
  for (int i = 0; i < n; i++) hex(md5[i], 16, etags[i]); /* a part's ETag is its MD5 (S3, RGW, R2) */
  rc = blob_s3_upload_complete(s, name, upload_id, n, etags);
  free(etags);
  return rc;
}

int blob_store_upload_abort(blob_store *bs, const char *name, const char *upload_id) {
  blob_s3 *s;
  int rc = blob_store_s3_of(bs, name, "a multipart upload", &s);
  return rc ? rc : blob_s3_upload_abort(s, name, upload_id);
}

void blob_put_etag(const unsigned char (*md5)[16], int n, char etag[80]) {
  if (n <= 0) {
    hex(md5[0], 16, etag);
    return;
  }
  unsigned char d[16];
  unsigned int len = 0;
  EVP_MD_CTX *m = EVP_MD_CTX_new();
  int ok = m && EVP_DigestInit_ex(m, EVP_md5(), NULL) && EVP_DigestUpdate(m, md5, (size_t)n * 16) &&
           EVP_DigestFinal_ex(m, d, &len);
  EVP_MD_CTX_free(m);
  if (!ok) { /* matches no ETag, so the check fails rather than passes */
    snprintf(etag, 80, "(no MD5)");
    return;
  }
  hex(d, 16, etag);
  snprintf(etag + 32, 80 - 32, "-%d", n);
}

/* HEAD of a put object: `size` bytes, and the ETag want (NULL: the size only). */
static int check_put(blob_store *bs, const char *name, uint64_t size, const char *want) {
  blob_s3 *s;
  int rc = blob_store_s3_of(bs, name, "a put object", &s);
  if (rc) return rc;
  uint64_t got = 0;
  char etag[96] = "";
  if ((rc = blob_s3_head(s, name, &got, etag, sizeof etag)) < 0) return rc;
  if (got != size)
    return dpc_err(DPC_EFORMAT, "object %s holds %llu bytes, not the %llu prepared", name, (unsigned long long)got,
                   (unsigned long long)size);
  if (want && strcasecmp(etag, want) != 0)
    return dpc_err(DPC_ECHECKSUM, "object %s has ETag %s, not the %s its prepared MD5s give", name, etag, want);
  return 0;
}

int blob_store_settle_put(blob_store *bs, const char *name, uint64_t size, const unsigned char md5[16],
                          const char *upload_id, int parts, const unsigned char (*part_md5)[16], char etag[80]) {
  etag[0] = 0;
  if (md5 || parts) blob_put_etag(parts ? part_md5 : (const unsigned char(*)[16])md5, parts, etag);
  int crc = 0, rc = 0;
  char cerr[256] = "";
  if (parts && (crc = blob_store_upload_complete(bs, name, upload_id, parts, part_md5)) < 0) {
    snprintf(cerr, sizeof cerr, "%s", dpc_errmsg());
    if (crc == DPC_EUNAVAILABLE) rc = crc;
  }
  /* A repeated commit finds the upload completed already: the HEAD decides. */
  if (!rc) rc = check_put(bs, name, size, etag[0] ? etag : NULL);
  if (rc < 0 && crc < 0) rc = dpc_err(crc, "completing its upload: %s", cerr);
  return rc;
}

int blob_store_copy(blob_store *bs, const char *from, const char *to, const char *etag, uint64_t size,
                    uint64_t part_bytes, int parts, const unsigned char (*part_md5)[16]) {
  blob_s3 *s;
  int rc = blob_store_s3_of(bs, from, "a copy", &s);
  if (!rc) rc = blob_store_s3_of(bs, to, "a copy", &s);
  if (rc) return rc;
  char(*want)[80] = parts > 0 ? malloc((size_t)parts * sizeof *want) : NULL;
  if (parts > 0 && !want) return dpc_err(DPC_ENOMEM, "blob %s: out of memory copying it", from);
  for (int i = 0; i < parts && part_md5; i++) hex(part_md5[i], 16, want[i]);
  rc = blob_s3_copy(s, from, to, etag, size, part_bytes, parts, part_md5 ? (const char(*)[80])want : NULL);
  free(want);
  if (!rc) blob_store_known_add(bs, to);
  return rc;
}

void blob_store_delete_later(blob_store *bs, const char *name) {
  blob_s3 *s;
  if (blob_store_s3_of(bs, name, "a delete", &s) == 0) blob_s3_delete_later(s, name);
}
