/* s3_sigv4.c — AWS Signature Version 4 (header and query signing) for S3; see s3_sigv4.h. */
#include "coordinator/s3_sigv4.h"

#include "common/errors.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIG_MAX_PARAMS 32

/* A bounded string builder: appends stop (and ok drops to 0) once cap would be passed. */
typedef struct {
  char *p;
  size_t n, cap;
  int ok;
} sb;

static void sb_put(sb *b, const char *s, size_t n) {
  if (!b->ok || b->n + n + 1 > b->cap) {
    b->ok = 0;
    return;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_str(sb *b, const char *s) { sb_put(b, s, strlen(s)); }

static void hex(const unsigned char *d, size_t n, char *out) {
  static const char h[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = h[d[i] >> 4];
    out[2 * i + 1] = h[d[i] & 15];
  }
  out[2 * n] = 0;
}

void s3_sha256_hex(const void *d, size_t n, char out[65]) {
  unsigned char md[32];
  unsigned int len = 0;
  EVP_Digest(d, n, md, &len, EVP_sha256(), NULL);
  hex(md, 32, out);
}

/* HMAC-SHA256 (RFC 2104) over the library's SHA-256. Not OpenSSL's HMAC(): it sets a mark in
 * the calling thread's error queue, which a thread-pool thread then never frees (valgrind:
 * definitely lost). */
static void hmac(const unsigned char *key, size_t klen, const char *msg, unsigned char out[32]) {
  enum { BLOCK = 64 };
  size_t mlen = strlen(msg);
  unsigned char pad[BLOCK + 32], inner[32], hkey[32], *in = malloc(BLOCK + mlen);
  unsigned int n = 0;
  if (!in) { /* fail closed: a signature nobody accepts */
    memset(out, 0, 32);
    return;
  }
  if (klen > BLOCK) { /* a long key is replaced by its hash */
    EVP_Digest(key, klen, hkey, &n, EVP_sha256(), NULL);
    key = hkey;
    klen = 32;
  }
  memset(in, 0x36, BLOCK);
  for (size_t i = 0; i < klen; i++) in[i] ^= key[i];
  memcpy(in + BLOCK, msg, mlen);
  EVP_Digest(in, BLOCK + mlen, inner, &n, EVP_sha256(), NULL);
  memset(pad, 0x5c, BLOCK);
  for (size_t i = 0; i < klen; i++) pad[i] ^= key[i];
  memcpy(pad + BLOCK, inner, 32);
  EVP_Digest(pad, sizeof pad, out, &n, EVP_sha256(), NULL);
  free(in);
}

int s3_uri_encode(const char *in, int keep_slash, char *out, size_t cap) {
  static const char h[] = "0123456789ABCDEF";
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
    int keep = isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~' || (keep_slash && *p == '/');
    if (o + (keep ? 1 : 3) + 1 > cap) return dpc_err(DPC_EINVAL, "S3: a name or value is too long to encode");
    if (keep) {
      out[o++] = (char)*p;
    } else {
      out[o++] = '%';
      out[o++] = h[*p >> 4];
      out[o++] = h[*p & 15];
    }
  }
  out[o] = 0;
  return 0;
}

void s3_amz_date(time_t t, char out[17]) {
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

typedef struct {
  char k[512], v[S3_TOKEN_MAX * 3 + 1];
} enc_kv;

static int kv_cmp(const void *a, const void *b) {
  const enc_kv *x = a, *y = b;
  int c = strcmp(x->k, y->k);
  return c ? c : strcmp(x->v, y->v);
}

/* The canonical query string of q[0..n) into b (encoded, sorted, "k=v" joined by '&'). */
static int canonical_query(sb *b, const s3_kv *q, int n) {
  if (n > SIG_MAX_PARAMS) return dpc_err(DPC_EINVAL, "S3: more than %d query parameters", SIG_MAX_PARAMS);
  enc_kv *e = n ? calloc((size_t)n, sizeof *e) : NULL;
  if (n && !e) return DPC_ENOMEM;
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    rc = s3_uri_encode(q[i].name, 0, e[i].k, sizeof e[i].k);
    if (!rc) rc = s3_uri_encode(q[i].value ? q[i].value : "", 0, e[i].v, sizeof e[i].v);
  }
  if (!rc && n) qsort(e, (size_t)n, sizeof *e, kv_cmp);
  for (int i = 0; i < n && !rc; i++) {
    if (i) sb_str(b, "&");
    sb_str(b, e[i].k);
    sb_str(b, "=");
    sb_str(b, e[i].v);
  }
  free(e);
  return rc;
}

typedef struct {
  char name[128];
  const char *value;
} hdr;

static int hdr_cmp(const void *a, const void *b) { return strcmp(((const hdr *)a)->name, ((const hdr *)b)->name); }

/* Canonical headers ("name:value\n" each, sorted, values trimmed with inner runs of spaces
 * collapsed) into ch and the signed-header list ("a;b;c") into sh; *amz_date gets x-amz-date's. */
static int canonical_headers(const s3_kv *h, int n, sb *ch, sb *sh, const char **amz_date) {
  if (n > SIG_MAX_PARAMS) return dpc_err(DPC_EINVAL, "S3: more than %d signed headers", SIG_MAX_PARAMS);
  hdr l[SIG_MAX_PARAMS];
  *amz_date = NULL;
  for (int i = 0; i < n; i++) {
    size_t len = strlen(h[i].name);
    if (!h[i].value || len == 0 || len >= sizeof l[i].name)
      return dpc_err(DPC_EINVAL, "S3: header %d has no name or value", i);
    for (size_t k = 0; k <= len; k++) l[i].name[k] = (char)tolower((unsigned char)h[i].name[k]);
    l[i].value = h[i].value;
    if (!strcmp(l[i].name, "x-amz-date")) *amz_date = h[i].value;
  }
  qsort(l, (size_t)n, sizeof *l, hdr_cmp);
  for (int i = 0; i < n; i++) {
    sb_str(ch, l[i].name);
    sb_str(ch, ":");
    const char *v = l[i].value;
    while (*v == ' ' || *v == '\t') v++;
    size_t end = strlen(v);
    while (end > 0 && (v[end - 1] == ' ' || v[end - 1] == '\t')) end--;
    for (size_t k = 0; k < end; k++)
      if (!(v[k] == ' ' && k > 0 && v[k - 1] == ' ')) sb_put(ch, v + k, 1);
    sb_str(ch, "\n");
    if (i) sb_str(sh, ";");
    sb_str(sh, l[i].name);
  }
  return ch->ok && sh->ok ? 0 : dpc_err(DPC_EINVAL, "S3: signed headers too long");
}

/* Signature (hex, out[65]) of the canonical request built from the parts, at amz_date, and the
 * credential scope (date/region/s3/aws4_request) into scope[cap]. */
static int sign(const s3_creds *cr, const char *region, const char *method, const char *path, const char *cq,
                const char *ch, const char *sh, const char *payload_hash, const char *amz_date, char out[65],
                char *scope, size_t scope_cap) {
  char epath[3 * 1024 + 1];
  if (strlen(amz_date) != 16) return dpc_err(DPC_EINVAL, "S3: x-amz-date \"%s\" is not YYYYMMDDTHHMMSSZ", amz_date);
  int rc = s3_uri_encode(path, 1, epath, sizeof epath);
  if (rc) return rc;
  size_t creq_cap = strlen(method) + strlen(epath) + strlen(cq) + strlen(ch) + strlen(sh) + strlen(payload_hash) + 16;
  char *creq = malloc(creq_cap);
  if (!creq) return DPC_ENOMEM;
  snprintf(creq, creq_cap, "%s\n%s\n%s\n%s\n%s\n%s", method, epath, cq, ch, sh, payload_hash);
  char creq_hash[65], date[9];
  s3_sha256_hex(creq, strlen(creq), creq_hash);
  free(creq);
  memcpy(date, amz_date, 8);
  date[8] = 0;
  if ((size_t)snprintf(scope, scope_cap, "%s/%s/s3/aws4_request", date, region) >= scope_cap)
    return dpc_err(DPC_EINVAL, "S3: region \"%s\" is too long", region);
  char sts[512];
  snprintf(sts, sizeof sts, "AWS4-HMAC-SHA256\n%s\n%s\n%s", amz_date, scope, creq_hash);
  unsigned char k[32], k2[32];
  char kdate[S3_KEY_MAX + 8];
  snprintf(kdate, sizeof kdate, "AWS4%s", cr->secret_key);
  hmac((const unsigned char *)kdate, strlen(kdate), date, k);
  hmac(k, 32, region, k2);
  hmac(k2, 32, "s3", k);
  hmac(k, 32, "aws4_request", k2);
  hmac(k2, 32, sts, k);
  hex(k, 32, out);
  return 0;
}

int s3_sigv4_authorization(const s3_creds *cr, const char *region, const char *method, const char *path,
                           const s3_kv *query, int nq, const s3_kv *headers, int nh, const char *payload_hash,
                           char *out, size_t cap) {
  char cqb[8192], chb[8192], shb[1024], scope[160], sig[65];
  sb cq = {cqb, 0, sizeof cqb, 1}, ch = {chb, 0, sizeof chb, 1}, sh = {shb, 0, sizeof shb, 1};
  cqb[0] = chb[0] = shb[0] = 0;
  const char *amz_date;
  int rc = canonical_query(&cq, query, nq);
  if (!rc && !cq.ok) rc = dpc_err(DPC_EINVAL, "S3: query too long");
  if (!rc) rc = canonical_headers(headers, nh, &ch, &sh, &amz_date);
  if (!rc && !amz_date) rc = dpc_err(DPC_EINVAL, "S3: a signed request needs an x-amz-date header");
  if (!rc) rc = sign(cr, region, method, path, cqb, chb, shb, payload_hash, amz_date, sig, scope, sizeof scope);
  if (rc) return rc;
  if ((size_t)snprintf(out, cap, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s", cr->access_key,
                       scope, shb, sig) >= cap)
    return dpc_err(DPC_EINVAL, "S3: Authorization header too long");
  return 0;
}

int s3_sigv4_presign(const s3_creds *cr, const char *region, const char *method, const char *base, const char *host,
                     const char *path, const s3_kv *query, int nq, const s3_kv *headers, int nh, time_t now,
                     int expires_s, char *out, size_t cap) {
  if (expires_s < 1 || expires_s > 604800)
    return dpc_err(DPC_EINVAL, "S3: a presigned URL lives 1 s .. 7 days, not %d s", expires_s);
  if (nq + 6 > SIG_MAX_PARAMS || nh + 1 > SIG_MAX_PARAMS)
    return dpc_err(DPC_EINVAL, "S3: too many parameters to presign");
  s3_kv q[SIG_MAX_PARAMS], h[SIG_MAX_PARAMS];
  char amz_date[17], cred[S3_KEY_MAX + 160], exp[16], date[9];
  s3_amz_date(now, amz_date);
  memcpy(date, amz_date, 8);
  date[8] = 0;
  snprintf(cred, sizeof cred, "%s/%s/%s/s3/aws4_request", cr->access_key, date, region);
  snprintf(exp, sizeof exp, "%d", expires_s);
  h[0] = (s3_kv){"host", host};
  for (int i = 0; i < nh; i++) h[1 + i] = headers[i];
  char chb[8192], shb[1024];
  sb ch = {chb, 0, sizeof chb, 1}, sh = {shb, 0, sizeof shb, 1};
  chb[0] = shb[0] = 0;
  const char *unused;
  int rc = canonical_headers(h, nh + 1, &ch, &sh, &unused);
  if (rc) return rc;
  int n = 0;
  for (int i = 0; i < nq; i++) q[n++] = query[i];
  q[n++] = (s3_kv){"X-Amz-Algorithm", "AWS4-HMAC-SHA256"};
  q[n++] = (s3_kv){"X-Amz-Credential", cred};
  q[n++] = (s3_kv){"X-Amz-Date", amz_date};
  q[n++] = (s3_kv){"X-Amz-Expires", exp};
  if (cr->session_token[0]) q[n++] = (s3_kv){"X-Amz-Security-Token", cr->session_token};
  q[n++] = (s3_kv){"X-Amz-SignedHeaders", shb};
  char *cqb = malloc(S3_URL_MAX), scope[160], sig[65], epath[3 * 1024 + 1];
  if (!cqb) return DPC_ENOMEM;
  sb cq = {cqb, 0, S3_URL_MAX, 1};
  cqb[0] = 0;
  rc = canonical_query(&cq, q, n);
  if (!rc && !cq.ok) rc = dpc_err(DPC_EINVAL, "S3: presigned query too long");
  if (!rc) rc = sign(cr, region, method, path, cqb, chb, shb, "UNSIGNED-PAYLOAD", amz_date, sig, scope, sizeof scope);
  if (!rc) rc = s3_uri_encode(path, 1, epath, sizeof epath);
  if (!rc && (size_t)snprintf(out, cap, "%s%s?%s&X-Amz-Signature=%s", base, epath, cqb, sig) >= cap)
    rc = dpc_err(DPC_EINVAL, "S3: presigned URL longer than %zu bytes", cap);
  free(cqb);
  return rc;
}
