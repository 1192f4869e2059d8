/* storeput.c — PUTs of delta and inner-state objects through presigned S3 URLs (see storeput.h). */
#include "worker/storeput.h"

#include "common/checksum.h"
#include "common/errors.h"
#include "worker/storeget.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>


static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

void storeput_make_kind(storeput_object *o, uint32_t kind, const float *p, uint64_t n, const void *extra,
                        uint32_t n_extra) {
  memset(o, 0, sizeof *o);
  o->payload = p;
  o->n_extra = n_extra <= sizeof o->extra ? n_extra & ~3u : 0;
  if (o->n_extra) memcpy(o->extra, extra, o->n_extra);
  o->n = n + o->n_extra / 4;
  put_u32(o->header, STORE_BLOB_MAGIC);
  put_u32(o->header + 4, 1);
  put_u32(o->header + 8, kind);
  put_u32(o->header + 12, 0);
  put_u64(o->header + 16, o->n);
  o->crc = dpc_crc32c(dpc_crc32c(0, p, n * sizeof(float)), o->extra, o->n_extra);
  put_u32(o->trailer, o->crc);
  put_u32(o->trailer + 4, dpc_crc32c(0, o->header, sizeof o->header));
}

void storeput_make(storeput_object *o, const float *delta, uint64_t n) {
  storeput_make_kind(o, STORE_KIND_DELTA, delta, n, NULL, 0);
}

uint64_t storeput_bytes(const storeput_object *o) { return sizeof o->header + o->n * sizeof(float) + sizeof o->trailer; }

typedef struct {
  const storeput_object *o;
  uint64_t at, end; /* the bytes [at, end) of the object are still to send */
} source;

/* curl's read callback: the header, the payload, its extra bytes and the trailer in turn. */
static size_t on_read(char *dst, size_t sz, size_t nm, void *ud) {
  source *s = ud;
  const uint64_t hb = sizeof s->o->header, xb = s->o->n_extra, pb = s->o->n * sizeof(float) - xb, total = s->end;
  size_t cap = sz * nm, out = 0;
  while (out < cap && s->at < total) {
    const unsigned char *src;
    uint64_t left;
    if (s->at < hb) src = s->o->header + s->at, left = hb - s->at;
    else if (s->at < hb + pb) src = (const unsigned char *)s->o->payload + (s->at - hb), left = hb + pb - s->at;
    else if (s->at < hb + pb + xb) src = s->o->extra + (s->at - hb - pb), left = hb + pb + xb - s->at;
    else src = s->o->trailer + (s->at - hb - pb - xb), left = storeput_bytes(s->o) - s->at;
    if (left > total - s->at) left = total - s->at;
    size_t n = left < cap - out ? (size_t)left : cap - out;
    memcpy(dst + out, src, n);
    out += n;
    s->at += n;
  }
  return out;
}

/* curl's write callback: the answer's body (an S3 error document), kept short for messages. */
static size_t on_body(char *p, size_t sz, size_t nm, void *ud) {
  char *b = ud;
  size_t have = strlen(b), n = sz * nm;
  if (have + 1 < 512) snprintf(b + have, 512 - have, "%.*s", (int)n, p);
  return n;
}

/* The bytes [off, off + len) of the object in one PUT whose Content-MD5 is md5. */
static int put_range(const char *url, const storeput_object *o, uint64_t off, uint64_t len, const unsigned char md5[16],
                     int timeout_ms) {
  char where[512], err[CURL_ERROR_SIZE] = "", body[512] = "", md5h[64];
  CURL *e = storehttp_open(url, timeout_ms, err, where, sizeof where);
  if (!e) return dpc_err(DPC_ENOMEM, "store PUT %s: curl_easy_init failed", where);
  unsigned char b64[32];
  EVP_EncodeBlock(b64, md5, 16);
  snprintf(md5h, sizeof md5h, "Content-MD5: %s", (const char *)b64);
  struct curl_slist *h = curl_slist_append(NULL, md5h);
  struct curl_slist *h2 = h ? curl_slist_append(h, "Expect:") : NULL; /* no 100-continue round trip */
  if (!h2) {
    curl_slist_free_all(h);
    curl_easy_cleanup(e);
    return dpc_err(DPC_ENOMEM, "store PUT %s: out of memory", where);
  }
  source src = {.o = o, .at = off, .end = off + len};
  curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)len);
  curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
  curl_easy_setopt(e, CURLOPT_READDATA, &src);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h2);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, body);
  CURLcode cc = curl_easy_perform(e);
  long st = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
  curl_easy_cleanup(e);
  curl_slist_free_all(h2);
  if (cc != CURLE_OK) return storehttp_fail(cc, err, "PUT", where);
  if (st / 100 == 2) return 0;
  int code = st == 403 ? DPC_EPERM : st / 100 == 5 ? DPC_EUNAVAILABLE
             : strstr(body, "BadDigest") || strstr(body, "InvalidDigest") ? DPC_ECHECKSUM : DPC_EIO;
  const char *c0 = strstr(body, "<Code>"), *c1 = c0 ? strstr(c0, "</Code>") : NULL;
  return dpc_err(code, "store PUT %s: HTTP %ld%s%.*s%s", where, st, c1 ? " " : "", c1 ? (int)(c1 - c0 - 6) : 0,
                 c1 ? c0 + 6 : "", st == 403 ? " (the URL expired or was altered)" : "");
}

int storeput_put(const char *url, const storeput_object *o, int timeout_ms) {
  return put_range(url, o, 0, storeput_bytes(o), o->md5, timeout_ms);
}

int storeput_parts(const storeput_object *o, uint64_t part_bytes) {
  uint64_t b = storeput_bytes(o);
  return part_bytes && b > part_bytes ? (int)((b + part_bytes - 1) / part_bytes) : 0;
}

int storeput_digest(storeput_object *o, uint64_t part_bytes, unsigned char (*part_md5)[16]) {
  const uint64_t total = storeput_bytes(o);
  const int parts = storeput_parts(o, part_bytes);
  EVP_MD_CTX *whole = EVP_MD_CTX_new(), *part = parts ? EVP_MD_CTX_new() : NULL;
  unsigned int dl = 0;
  int ok = whole && (!parts || part) && EVP_DigestInit_ex(whole, EVP_md5(), NULL);
  char buf[1 << 16];
  for (int i = 0; ok && i < (parts ? parts : 1); i++) { /* one read pass feeds both digests */
    uint64_t off = parts ? (uint64_t)i * part_bytes : 0, len = parts && total - off > part_bytes ? part_bytes : total - off;
    source s = {.o = o, .at = off, .end = off + len};
    ok = !parts || EVP_DigestInit_ex(part, EVP_md5(), NULL);
    size_t n;
    while (ok && (n = on_read(buf, 1, sizeof buf, &s)) > 0)
      ok = EVP_DigestUpdate(whole, buf, n) && (!parts || EVP_DigestUpdate(part, buf, n));
    if (ok && parts) ok = EVP_DigestFinal_ex(part, part_md5[i], &dl);
  }
  ok = ok && EVP_DigestFinal_ex(whole, o->md5, &dl);
  EVP_MD_CTX_free(whole);
  EVP_MD_CTX_free(part);
  return ok ? 0 : dpc_err(DPC_ENOMEM, "worker: MD5 of an object failed");
}

int storeput_put_part(const char *url, const storeput_object *o, uint64_t part_bytes, int part,
                      const unsigned char md5[16], int timeout_ms) {
  const uint64_t total = storeput_bytes(o), off = (uint64_t)part * part_bytes;
  if (part < 0 || off >= total) return dpc_err(DPC_EINVAL, "worker: part %d is past the object's end", part);
  return put_range(url, o, off, total - off < part_bytes ? total - off : part_bytes, md5, timeout_ms);
}

/* storeput_put_parts: what each part's PUT needs. */
typedef struct {
  char *const *urls;
  const storeput_object *o;
  uint64_t part_bytes;
  const unsigned char (*md5)[16];
  int timeout_ms;
} parts_job;

static int put_part(void *ud, int k) {
  const parts_job *j = ud;
  return storeput_put_part(j->urls[k], j->o, j->part_bytes, k, j->md5[k], j->timeout_ms);
}

int storeput_put_parts(char *const *urls, const storeput_object *o, uint64_t part_bytes, int parts,
                       const unsigned char (*md5)[16], int streams, int timeout_ms) {
  parts_job j = {.urls = urls, .o = o, .part_bytes = part_bytes, .md5 = md5, .timeout_ms = timeout_ms};
  return storehttp_fanout(parts, streams, put_part, &j);
}
