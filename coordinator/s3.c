/* s3.c — the S3 client (see s3.h): SigV4-signed path-style requests over libcurl, retried with
 * jittered backoff, and the few XML answers S3 gives parsed by hand (keys, sizes, upload ids and
 * error codes are all this needs; no XML library is worth a dependency for them). */
#include "coordinator/s3.h"

#include "common/errors.h"
#include "common/log.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define S3_BODY_MAX (16u << 20) /* the most of an answer body kept (list pages are ~300 KB) */
#define S3_NAME_MAX 1024

struct s3_client {
  CURL *h;
  char base[512];   /* scheme://host[:port] */
  char host[300];   /* host[:port] as sent in Host */
  char bucket[64];
  char prefix[512]; /* "" or "p/" */
  char region[64];
  char ca_file[512];
  s3_creds cr;
  int timeout_ms, retries;
  int max_parts, page; /* s3_options */
  int https; /* the endpoint is https (payload_md5) */
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---- credentials --------------------------------------------------------------------------- */

static int copy_field(char *dst, size_t cap, const char *v, const char *what) {
  if (!v || !*v) return dpc_err(DPC_EINVAL, "S3 credentials: %s is empty", what);
  if (strlen(v) >= cap) return dpc_err(DPC_EINVAL, "S3 credentials: %s is too long", what);
  strcpy(dst, v);
  return 0;
}

int s3_creds_from_env(s3_creds *cr) {
  memset(cr, 0, sizeof *cr);
  const char *ak = getenv("AWS_ACCESS_KEY_ID"), *sk = getenv("AWS_SECRET_ACCESS_KEY"), *tok = getenv("AWS_SESSION_TOKEN");
  if (!ak || !sk)
    return dpc_err(DPC_EINVAL, "S3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or pass "
                               "--s3-credentials FILE");
  int rc = copy_field(cr->access_key, sizeof cr->access_key, ak, "AWS_ACCESS_KEY_ID");
  if (!rc) rc = copy_field(cr->secret_key, sizeof cr->secret_key, sk, "AWS_SECRET_ACCESS_KEY");
  if (!rc && tok && *tok) rc = copy_field(cr->session_token, sizeof cr->session_token, tok, "AWS_SESSION_TOKEN");
  return rc;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) s[--n] = 0;
  return s;
}

int s3_creds_load(s3_creds *cr, const char *path, const char *profile) {
  memset(cr, 0, sizeof *cr);
  if (!profile) profile = getenv("AWS_PROFILE") && *getenv("AWS_PROFILE") ? getenv("AWS_PROFILE") : "default";
  FILE *f = fopen(path, "r");
  if (!f) return dpc_err(DPC_EIO, "S3 credentials file %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return dpc_err(DPC_EINVAL, "S3 credentials file %s is not a regular file", path);
  }
  if (st.st_mode & 077) {
    fclose(f);
    return dpc_err(DPC_EPERM, "S3 credentials file %s is readable by others (mode %04o): chmod 600 it", path,
                   (unsigned)(st.st_mode & 07777));
  }
  char line[S3_TOKEN_MAX + 64], section[128] = "";
  int in = 0, rc = 0, lineno = 0;
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    char *s = trim(line);
    if (!*s || *s == '#' || *s == ';') continue;
    if (*s == '[') {
      char *e = strchr(s, ']');
      if (!e) rc = dpc_err(DPC_EFORMAT, "S3 credentials file %s line %d: unclosed [", path, lineno);
      else {
        *e = 0;
        snprintf(section, sizeof section, "%s", trim(s + 1));
        in = !strcmp(section, profile);
      }
      continue;
    }
    char *eq = strchr(s, '=');
    if (!eq) {
      rc = dpc_err(DPC_EFORMAT, "S3 credentials file %s line %d: expected key = value", path, lineno);
      break;
    }
    *eq = 0;
    char *k = trim(s), *v = trim(eq + 1);
    if (!in) continue;
    if (!strcmp(k, "aws_access_key_id")) rc = copy_field(cr->access_key, sizeof cr->access_key, v, k);
    else if (!strcmp(k, "aws_secret_access_key")) rc = copy_field(cr->secret_key, sizeof cr->secret_key, v, k);
    else if (!strcmp(k, "aws_session_token")) rc = copy_field(cr->session_token, sizeof cr->session_token, v, k);
  }
  fclose(f);
  if (!rc && (!cr->access_key[0] || !cr->secret_key[0]))
    rc = dpc_err(DPC_EINVAL, "S3 credentials file %s: profile [%s] lacks aws_access_key_id or aws_secret_access_key",
                 path, profile);
  return rc;
}

/* ---- open ---------------------------------------------------------------------------------- */

static int parse_url(s3_client *c, const char *url) {
  if (!url || strncmp(url, "s3://", 5))
    return dpc_err(DPC_EINVAL, "--blob-store \"%s\": expected s3://BUCKET[/PREFIX]", url ? url : "");
  const char *b = url + 5, *slash = strchr(b, '/');
  size_t bl = slash ? (size_t)(slash - b) : strlen(b);
  if (bl < 3 || bl > 63)
    return dpc_err(DPC_EINVAL, "--blob-store \"%s\": a bucket name has 3 to 63 characters", url);
  for (size_t i = 0; i < bl; i++) {
    char ch = b[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '.'))
      return dpc_err(DPC_EINVAL, "--blob-store \"%s\": bucket names use a-z, 0-9, '-' and '.'", url);
  }
  memcpy(c->bucket, b, bl);
  c->bucket[bl] = 0;
  const char *p = slash ? slash + 1 : "";
  size_t pl = strlen(p);
  while (pl > 0 && p[pl - 1] == '/') pl--;
  if (pl + 2 > sizeof c->prefix) return dpc_err(DPC_EINVAL, "--blob-store \"%s\": prefix too long", url);
  memcpy(c->prefix, p, pl);
  if (pl) c->prefix[pl++] = '/';
  c->prefix[pl] = 0;
  return 0;
}

static int parse_endpoint(s3_client *c, const char *ep) {
  if (!ep || (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8)))
    return dpc_err(DPC_EINVAL, "--s3-endpoint \"%s\": expected http://HOST[:PORT] or https://HOST[:PORT]",
                   ep ? ep : "");
  size_t n = strlen(ep);
  while (n > 0 && ep[n - 1] == '/') n--;
  const char *h = strstr(ep, "://") + 3;
  if (n >= sizeof c->base || memchr(h, '/', n - (size_t)(h - ep)) || h == ep + n)
    return dpc_err(DPC_EINVAL, "--s3-endpoint \"%s\": give the scheme, host and port only (path-style requests)", ep);
  memcpy(c->base, ep, n);
  c->base[n] = 0;
  snprintf(c->host, sizeof c->host, "%s", c->base + (h - ep));
  c->https = !strncmp(ep, "https://", 8);
  return 0;
}

int s3_open(s3_client **out, const s3_options *o) {
  pthread_once(&curl_once, curl_init_once);
  s3_client *c = calloc(1, sizeof *c);
  if (!c) return DPC_ENOMEM;
  int rc = parse_url(c, o->url);
  if (!rc) rc = parse_endpoint(c, o->endpoint);
  snprintf(c->region, sizeof c->region, "%s", o->region && *o->region ? o->region : "us-east-1");
  if (!rc && o->ca_file) {
    if (access(o->ca_file, R_OK) < 0) rc = dpc_err(DPC_EINVAL, "--s3-ca-file %s: %s", o->ca_file, strerror(errno));
    else snprintf(c->ca_file, sizeof c->ca_file, "%s", o->ca_file);
  }
  if (!rc) rc = o->creds_file ? s3_creds_load(&c->cr, o->creds_file, o->profile) : s3_creds_from_env(&c->cr);
  c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 30000;
  c->retries = o->retries > 0 ? o->retries : o->retries < 0 ? 0 : 5;
  c->max_parts = o->max_parts > 0 && o->max_parts < S3_MAX_PARTS ? o->max_parts : S3_MAX_PARTS;
  c->page = o->page > 0 && o->page < 1000 ? o->page : 1000;
  if (!rc && !(c->h = curl_easy_init())) rc = dpc_err(DPC_ENOMEM, "S3: curl_easy_init failed");
  if (rc) {
    s3_close(c);
    return rc;
  }
  *out = c;
  return 0;
}

void s3_close(s3_client *c) {
  if (!c) return;
  if (c->h) curl_easy_cleanup(c->h);
  memset(&c->cr, 0, sizeof c->cr);
  free(c);
}

/* ---- one request ---------------------------------------------------------------------------- */

/* Payload bytes of the requests that succeeded, process-wide (s3_bytes). */
static _Atomic uint64_t bytes_sent, bytes_received;

void s3_bytes(uint64_t *sent, uint64_t *received) {
  *sent = bytes_sent;
  *received = bytes_received;
}

typedef struct {
  const char *method;
  const char *key;         /* relative to the prefix; NULL: the bucket itself */
  const s3_kv *query;
  int nq;
  const void *body;        /* PUT/POST payload */
  size_t body_len;
  const char *content_md5; /* base64, signed and sent */
  const char *copy_source; /* CopyObject: "/BUCKET/KEY" (encoded), signed and sent */
  const char *copy_if_match; /* with copy_source: the source's ETag, quoted */
  const char *copy_range;  /* UploadPartCopy: "bytes=FIRST-LAST" of the source, signed and sent */
  uint64_t range_off;      /* with dst: a ranged GET of dst_len bytes */
  void *dst;
  size_t dst_len;
} s3_req;

typedef struct {
  long status;
  char *body; /* answers other than a ranged GET's payload, NUL-terminated */
  size_t body_len;
  unsigned char *dst;
  size_t dst_len, dst_got;
  int overflow;
  char etag[80];
  uint64_t content_length;
  int has_length;
} s3_resp;

typedef struct {
  const unsigned char *p;
  size_t left;
  const unsigned char *base; /* the whole body, for a rewind */
  size_t len;
} s3_src;

static size_t on_write(char *p, size_t sz, size_t n, void *ud) {
  s3_resp *r = ud;
  size_t len = sz * n;
  if (r->dst && r->status / 100 == 2) {
    if (r->dst_got + len > r->dst_len) {
      r->overflow = 1;
      return 0;
    }
    memcpy(r->dst + r->dst_got, p, len);
    r->dst_got += len;
    return len;
  }
  if (r->body_len + len > S3_BODY_MAX) return 0;
  char *nb = realloc(r->body, r->body_len + len + 1);
  if (!nb) return 0;
  memcpy(nb + r->body_len, p, len);
  r->body = nb;
  r->body_len += len;
  r->body[r->body_len] = 0;
  return len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud) {
  s3_resp *r = ud;
  size_t len = sz * n;
  if (len > 9 && !strncasecmp(p, "HTTP/", 5)) { /* a new response (after a 100 Continue) */
    r->status = strtol(p + 9, NULL, 10);
  } else if (len > 5 && !strncasecmp(p, "etag:", 5)) {
    const char *v = p + 5;
    size_t k = 0;
    for (; v < p + len && k + 1 < sizeof r->etag; v++)
      if (*v != '"' && *v != ' ' && *v != '\r' && *v != '\n') r->etag[k++] = *v;
    r->etag[k] = 0;
  } else if (len > 15 && !strncasecmp(p, "content-length:", 15)) {
    r->content_length = strtoull(p + 15, NULL, 10);
    r->has_length = 1;
  }
  return len;
}

/* curl rewinds the body when it sends a request again itself (a kept-alive connection the
 * server had closed); without this a PUT on such a connection failed with "necessary data
 * rewind wasn't possible". */
static int on_seek(void *ud, curl_off_t off, int origin) {
  s3_src *s = ud;
  if (origin != SEEK_SET || off < 0 || (uint64_t)off > s->len) return CURL_SEEKFUNC_CANTSEEK;
  s->p = s->base + off;
  s->left = s->len - (size_t)off;
  return CURL_SEEKFUNC_OK;
}

static size_t on_read(char *p, size_t sz, size_t n, void *ud) {
  s3_src *s = ud;
  size_t len = sz * n < s->left ? sz * n : s->left;
  memcpy(p, s->p, len);
  s->p += len;
  s->left -= len;
  return len;
}

/* The text of <tag>…</tag> after `from` in xml into out[cap] (entities decoded); NULL if absent,
 * else the position after the closing tag. */
static const char *xml_text(const char *xml, const char *tag, char *out, size_t cap) {
  char open[64], close[64];
  snprintf(open, sizeof open, "<%s>", tag);
  snprintf(close, sizeof close, "</%s>", tag);
  const char *a = xml ? strstr(xml, open) : NULL;
  if (!a) return NULL;
  a += strlen(open);
  const char *e = strstr(a, close);
  if (!e) return NULL;
  size_t k = 0;
  static const struct { const char *ent; char ch; } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'},
                                                              {"&quot;", '"'}, {"&apos;", '\''}};
  for (const char *s = a; s < e && k + 1 < cap;) {
    int hit = 0;
    for (size_t i = 0; i < sizeof ents / sizeof ents[0] && !hit; i++)
      if (!strncmp(s, ents[i].ent, strlen(ents[i].ent))) {
        out[k++] = ents[i].ch;
        s += strlen(ents[i].ent);
        hit = 1;
      }
    if (!hit) out[k++] = *s++;
  }
  out[k] = 0;
  return e + strlen(close);
}

/* A listing page says more follow (IsTruncated). */
static int truncated(const char *body) {
  char t[16] = "";
  xml_text(body, "IsTruncated", t, sizeof t);
  return !strcmp(t, "true");
}

/* The request's path: /BUCKET[/PREFIX KEY]. */
static int req_path(const s3_client *c, const char *key, char *out, size_t cap) {
  int n = key ? snprintf(out, cap, "/%s/%s%s", c->bucket, c->prefix, key) : snprintf(out, cap, "/%s", c->bucket);
  return n > 0 && (size_t)n < cap ? 0 : dpc_err(DPC_EINVAL, "S3: key \"%s\" is too long", key ? key : "");
}

/* A failure worth another try. A reply that is not HTTP at all (curl: "Received HTTP/0.9",
 * a weird server reply) comes from a connection cut or garbled mid-answer, as a dropped one
 * does; the endpoint's scheme was checked at open, so it is not a wrong protocol. */
static int transient(CURLcode cc, long status) {
  if (cc != CURLE_OK)
    return cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_COULDNT_CONNECT || cc == CURLE_RECV_ERROR ||
           cc == CURLE_SEND_ERROR || cc == CURLE_GOT_NOTHING || cc == CURLE_PARTIAL_FILE ||
           cc == CURLE_SEND_FAIL_REWIND || cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_UNSUPPORTED_PROTOCOL ||
           cc == CURLE_WEIRD_SERVER_REPLY;
  return status == 429 || (status >= 500 && status != 501); /* 501: the store lacks the operation */
}

/* One attempt: sign, send, receive into r. Returns the curl code. */
static CURLcode attempt(s3_client *c, const s3_req *q, const char *path, s3_resp *r, char *errbuf) {
  char amz_date[17], auth[1024], line[1200], epath[3 * 1024 + 1], url[S3_URL_MAX], qs[4096] = "";
  s3_amz_date(time(NULL), amz_date);
  s3_kv h[10];
  int nh = 0;
  h[nh++] = (s3_kv){"host", c->host};
  h[nh++] = (s3_kv){"x-amz-content-sha256", "UNSIGNED-PAYLOAD"};
  h[nh++] = (s3_kv){"x-amz-date", amz_date};
  if (q->content_md5) h[nh++] = (s3_kv){"content-md5", q->content_md5};
  if (c->cr.session_token[0]) h[nh++] = (s3_kv){"x-amz-security-token", c->cr.session_token};
  if (q->copy_source) h[nh++] = (s3_kv){"x-amz-copy-source", q->copy_source};
  if (q->copy_if_match) { /* S3's header, and the name Ceph's RADOS Gateway reads */
    h[nh++] = (s3_kv){"x-amz-copy-source-if-match", q->copy_if_match};
    h[nh++] = (s3_kv){"x-amz-copy-if-match", q->copy_if_match};
  }
  if (q->copy_range) h[nh++] = (s3_kv){"x-amz-copy-source-range", q->copy_range};
  if (s3_sigv4_authorization(&c->cr, c->region, q->method, path, q->query, q->nq, h, nh, "UNSIGNED-PAYLOAD", auth,
                             sizeof auth) < 0 ||
      s3_uri_encode(path, 1, epath, sizeof epath) < 0)
    return CURLE_BAD_FUNCTION_ARGUMENT;
  for (int i = 0; i < q->nq; i++) { /* the signer sorts; the URL may carry any order */
    char k[256], v[1024];
    if (s3_uri_encode(q->query[i].name, 0, k, sizeof k) < 0 ||
        s3_uri_encode(q->query[i].value ? q->query[i].value : "", 0, v, sizeof v) < 0)
      return CURLE_BAD_FUNCTION_ARGUMENT;
    size_t at = strlen(qs);
    snprintf(qs + at, sizeof qs - at, "%s%s=%s", i ? "&" : "?", k, v);
  }
  snprintf(url, sizeof url, "%s%s%s", c->base, epath, qs);
  struct curl_slist *hl = NULL;
  for (int i = 0; i < nh; i++) {
    snprintf(line, sizeof line, "%s: %s", h[i].name, h[i].value);
    hl = curl_slist_append(hl, line);
  }
  snprintf(line, sizeof line, "Authorization: %s", auth);
  hl = curl_slist_append(hl, line);
  hl = curl_slist_append(hl, "Expect:"); /* no 100-continue round trip */
  char range[64];
  if (q->dst) {
    snprintf(range, sizeof range, "Range: bytes=%llu-%llu", (unsigned long long)q->range_off,
             (unsigned long long)(q->range_off + q->dst_len - 1));
    if (q->dst_len) hl = curl_slist_append(hl, range);
  }
  CURL *e = c->h;
  curl_easy_reset(e);
  s3_src src = {q->body, q->body_len, q->body, q->body_len};
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, hl);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)c->timeout_ms);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(c->timeout_ms < 10000 ? c->timeout_ms : 10000));
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
  if (c->ca_file[0]) curl_easy_setopt(e, CURLOPT_CAINFO, c->ca_file);
  if (!strcmp(q->method, "HEAD")) {
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  } else if (!strcmp(q->method, "PUT") || !strcmp(q->method, "POST")) {
    curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(e, CURLOPT_READDATA, &src);
    curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, on_seek);
    curl_easy_setopt(e, CURLOPT_SEEKDATA, &src);
    curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)q->body_len);
    if (!strcmp(q->method, "POST")) curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (strcmp(q->method, "GET")) {
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, q->method);
  }
  CURLcode cc = curl_easy_perform(e);
  long st = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
  if (st) r->status = st;
  curl_slist_free_all(hl);
  return cc;
}

/* Send q with retries; on success (2xx) *r holds the answer (the caller frees r->body). */
static int request(s3_client *c, const s3_req *q, s3_resp *r) {
  char path[S3_NAME_MAX + 600];
  int rc = req_path(c, q->key, path, sizeof path);
  if (rc) return rc;
  unsigned delay_ms = 100;
  for (int try = 0;; try++) {
    char errbuf[CURL_ERROR_SIZE] = "";
    memset(r, 0, sizeof *r);
    r->dst = q->dst;
    r->dst_len = q->dst_len;
    CURLcode cc = attempt(c, q, path, r, errbuf);
    if (cc == CURLE_OK && r->status / 100 == 2) {
      bytes_sent += q->body_len;
      bytes_received += q->dst ? r->dst_got : r->body_len;
      return 0;
    }
    int again = transient(cc, r->status) && try < c->retries;
    char code[64] = "", msg[256] = "";
    xml_text(r->body, "Code", code, sizeof code);
    xml_text(r->body, "Message", msg, sizeof msg);
    if (!again) {
      const char *what = q->key ? q->key : "(bucket)";
      if (cc == CURLE_PEER_FAILED_VERIFICATION) /* a setting to fix, not an outage to wait out */
        rc = dpc_err(DPC_EINVAL, "S3 %s at %s: the store's certificate is not trusted (%s): give its CA with "
                     "--s3-ca-file", q->method, c->base, errbuf[0] ? errbuf : curl_easy_strerror(cc));
      else if (cc != CURLE_OK && cc != CURLE_WRITE_ERROR)
        rc = dpc_err(cc == CURLE_BAD_FUNCTION_ARGUMENT ? DPC_EINVAL : DPC_EUNAVAILABLE,
                     "S3 %s %s/%s%s at %s: %s%s%s (after %d tries)", q->method, c->bucket, c->prefix, what, c->base,
                     curl_easy_strerror(cc), errbuf[0] ? ": " : "", errbuf, try + 1);
      else if (r->overflow)
        rc = dpc_err(DPC_EFORMAT, "S3 GET %s%s: the store sent more than the %zu bytes asked for", c->prefix, what,
                     q->dst_len);
      else if (r->status == 404 && !strcmp(code, "NoSuchBucket"))
        rc = dpc_err(DPC_EINVAL, "S3: bucket \"%s\" does not exist at %s", c->bucket, c->base);
      else if (r->status == 404 && (code[0] || !strcmp(q->method, "HEAD")))
        rc = dpc_err(DPC_ENOENT, "S3 %s %s/%s%s: no such key", q->method, c->bucket, c->prefix, what);
      else if (r->status == 403 || r->status == 401)
        rc = dpc_err(DPC_EPERM, "S3 %s %s/%s%s: access denied (%s%s%s): check the credentials and their rights",
                     q->method, c->bucket, c->prefix, what, code[0] ? code : "HTTP 403", msg[0] ? ": " : "", msg);
      else if (!strcmp(code, "BadDigest") || !strcmp(code, "InvalidDigest"))
        rc = dpc_err(DPC_ECHECKSUM, "S3 PUT %s%s: the store refused the bytes: %s", c->prefix, what, code);
      else if (!code[0] && r->status / 100 != 5 && r->status != 429)
        rc = dpc_err(DPC_EINVAL, "S3 %s %s at %s: HTTP %ld without an S3 error: is %s an S3 endpoint?", q->method,
                     what, c->base, r->status, c->base);
      else
        rc = dpc_err(r->status == 501 ? DPC_EUNSUPPORTED : r->status / 100 == 5 || r->status == 429 ? DPC_EUNAVAILABLE
                                                                                                   : DPC_EIO,
                     "S3 %s %s/%s%s: HTTP %ld %s%s%s (after %d tries)", q->method, c->bucket, c->prefix, what,
                     r->status, code, msg[0] ? ": " : "", msg, try + 1);
      free(r->body);
      r->body = NULL;
      return rc;
    }
    free(r->body);
    r->body = NULL;
    unsigned jitter = (unsigned)rand() % (delay_ms / 2 + 1); /* spread the retries of many clients */
    DPC_DEBUG("S3 %s %s: %s; retry %d in %u ms", q->method, q->key ? q->key : "(bucket)",
              cc != CURLE_OK ? curl_easy_strerror(cc) : "server busy", try + 1, delay_ms / 2 + jitter);
    usleep((useconds_t)(delay_ms / 2 + jitter) * 1000u);
    delay_ms = delay_ms * 2 > 5000 ? 5000 : delay_ms * 2;
  }
}

/* ---- operations ----------------------------------------------------------------------------- */

void s3_content_md5(const void *data, size_t len, char out[25]) {
  unsigned char md[16];
  unsigned int n = 0;
  EVP_Digest(data, len, md, &n, EVP_md5(), NULL);
  s3_md5_base64(md, out);
}

void s3_md5_base64(const unsigned char md5[16], char out[25]) { EVP_EncodeBlock((unsigned char *)out, md5, 16); }

int s3_check_bucket(s3_client *c) {
  const s3_kv q[] = {{"list-type", "2"}, {"max-keys", "1"}};
  s3_req rq = {.method = "GET", .query = q, .nq = 2};
  s3_resp r;
  int rc = request(c, &rq, &r);
  if (rc == DPC_ENOENT) return dpc_err(DPC_EINVAL, "S3: bucket \"%s\" does not exist at %s", c->bucket, c->base);
  if (!rc && (!r.body || !strstr(r.body, "<ListBucketResult")))
    rc = dpc_err(DPC_EINVAL, "S3: %s answered a bucket listing without <ListBucketResult>: is it an S3 endpoint?",
                 c->base);
  free(r.body);
  return rc;
}

int s3_create_bucket(s3_client *c) {
  s3_req rq = {.method = "PUT"};
  s3_resp r;
  int rc = request(c, &rq, &r);
  free(r.body);
  if (rc == DPC_EIO && strstr(dpc_errmsg(), "BucketAlreadyOwnedByYou")) return 0;
  return rc;
}

/* The Content-MD5 a payload PUT sends (into out): over http the store checks the bytes with
 * it; over https TLS already authenticates every byte, so NULL and no MD5 pass (0.7 CPU-s per
 * 474 MiB). */
static const char *payload_md5(const s3_client *c, const void *data, size_t len, char out[25]) {
  if (c->https) return NULL;
  s3_content_md5(data, len, out);
  return out;
}

int s3_put(s3_client *c, const char *key, const void *data, size_t len) {
  char md5[25];
  s3_req rq = {.method = "PUT", .key = key, .body = data, .body_len = len,
               .content_md5 = payload_md5(c, data, len, md5)};
  s3_resp r;
  int rc = request(c, &rq, &r);
  free(r.body);
  return rc;
}

int s3_get_range(s3_client *c, const char *key, uint64_t off, void *dst, size_t len) {
  if (len == 0) return 0;
  s3_req rq = {.method = "GET", .key = key, .range_off = off, .dst = dst, .dst_len = len};
  s3_resp r;
  int rc = request(c, &rq, &r);
  free(r.body);
  if (!rc && r.dst_got != len)
    rc = dpc_err(DPC_EFORMAT, "S3 GET %s%s bytes %llu..: got %zu of %zu bytes (the object is shorter)", c->prefix, key,
                 (unsigned long long)off, r.dst_got, len);
  return rc;
}

int s3_head(s3_client *c, const char *key, uint64_t *size, char *etag, size_t etag_cap) {
  s3_req rq = {.method = "HEAD", .key = key};
  s3_resp r;
  int rc = request(c, &rq, &r);
  free(r.body);
  if (rc) return rc;
  if (!r.has_length) return dpc_err(DPC_EFORMAT, "S3 HEAD %s%s: no Content-Length", c->prefix, key);
  if (size) *size = r.content_length;
  if (etag && etag_cap) snprintf(etag, etag_cap, "%s", r.etag);
  return 0;
}

/* A copy's x-amz-copy-source ("/BUCKET/PREFIX/KEY", encoded) into esrc and its ETag condition
 * (quoted; "" without one) into match. */
static int copy_headers(const s3_client *c, const char *from, const char *etag, char *esrc, size_t cap,
                        char match[96]) {
  char src[S3_NAME_MAX + 600];
  int rc = req_path(c, from, src, sizeof src);
  if (!rc && s3_uri_encode(src, 1, esrc, cap) < 0) rc = dpc_err(DPC_EINVAL, "S3: key \"%s\" is too long", from);
  snprintf(match, 96, etag ? "\"%s\"" : "", etag ? etag : "");
  return rc;
}

/* A copy's answer: S3 may answer 200 and put the failure in the body; 412 is the ETag
 * condition failing. */
static int copy_outcome(const s3_client *c, int rc, const s3_resp *r, const char *from, const char *to,
                        const char *etag) {
  char code[64] = "";
  if (!rc && r->body && strstr(r->body, "<Error>") && xml_text(r->body, "Code", code, sizeof code))
    rc = dpc_err(DPC_EIO, "S3 copying %s%s to %s%s: %s", c->prefix, from, c->prefix, to, code);
  if (rc == DPC_EIO && r->status == 412)
    rc = dpc_err(DPC_ECHECKSUM, "S3 copying %s%s: its ETag is no longer \"%s\" (the object was overwritten)", c->prefix,
                 from, etag ? etag : "");
  return rc;
}

int s3_copy(s3_client *c, const char *from, const char *to, const char *etag) {
  char esrc[3 * (S3_NAME_MAX + 600) + 1], match[96];
  int rc = copy_headers(c, from, etag, esrc, sizeof esrc, match);
  if (rc) return rc;
  s3_req rq = {.method = "PUT", .key = to, .copy_source = esrc, .copy_if_match = etag ? match : NULL};
  s3_resp r;
  rc = copy_outcome(c, request(c, &rq, &r), &r, from, to, etag);
  free(r.body);
  return rc;
}

int s3_mpu_copy_part(s3_client *c, const char *from, const char *to, const char *upload_id, int part, uint64_t off,
                     uint64_t len, const char *etag, char *part_etag, size_t cap) {
  if (part < 1 || part > c->max_parts) return dpc_err(DPC_EINVAL, "S3: part number %d outside 1..%d", part, c->max_parts);
  if (len == 0 || len > S3_MAX_PART_BYTES)
    return dpc_err(DPC_EINVAL, "S3: a copied part of %llu bytes (parts hold 1 byte to 5 GiB)", (unsigned long long)len);
  char esrc[3 * (S3_NAME_MAX + 600) + 1], match[96], pn[16], range[64], got[96] = "";
  int rc = copy_headers(c, from, etag, esrc, sizeof esrc, match);
  if (rc) return rc;
  snprintf(pn, sizeof pn, "%d", part);
  snprintf(range, sizeof range, "bytes=%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
  const s3_kv q[] = {{"partNumber", pn}, {"uploadId", upload_id}};
  s3_req rq = {.method = "PUT", .key = to, .query = q, .nq = 2, .copy_source = esrc,
               .copy_if_match = etag ? match : NULL, .copy_range = range};
  s3_resp r;
  rc = copy_outcome(c, request(c, &rq, &r), &r, from, to, etag);
  /* <CopyPartResult><ETag>"…"</ETag> (xml_text decodes &quot;) */
  if (!rc && !xml_text(r.body, "ETag", got, sizeof got))
    rc = dpc_err(DPC_EFORMAT, "S3 copying part %d of %s%s: no ETag in the answer", part, c->prefix, to);
  free(r.body);
  if (rc) return rc;
  size_t k = 0;
  for (const char *g = got; *g && k + 1 < cap; g++)
    if (*g != '"') part_etag[k++] = *g;
  part_etag[k] = 0;
  return 0;
}

int s3_delete(s3_client *c, const char *key) {
  s3_req rq = {.method = "DELETE", .key = key};
  s3_resp r;
  int rc = request(c, &rq, &r);
  free(r.body);
  return rc == DPC_ENOENT ? 0 : rc;
}

/* Each <tag> entry of a listing page whose Key is under the prefix: fn(ud, the key relative to
 * the prefix, the entry's <field>, the whole entry); entries without either are not ours to
 * judge and are passed over. fn's non-zero answer stops the walk and is returned. */
typedef int (*entry_fn)(void *ud, const char *key, const char *val, const char *entry);
static int each_entry(const s3_client *c, const char *body, const char *tag, const char *field, entry_fn fn,
                      void *ud) {
  const char *at = body ? body : "";
  const size_t skip = strlen(c->prefix);
  char block[4096], key[S3_NAME_MAX + 512], val[512];
  int rc = 0;
  while (!rc && (at = xml_text(at, tag, block, sizeof block)) != NULL)
    if (xml_text(block, "Key", key, sizeof key) && xml_text(block, field, val, sizeof val) &&
        !strncmp(key, c->prefix, skip))
      rc = fn(ud, key + skip, val, block);
  return rc;
}

/* An S3 timestamp ("2026-11-29T01:17:26.000Z", UTC) in seconds since the epoch; 0 when absent or
 * malformed (a store that leaves it out makes everything look old, never new). */
static int64_t s3_time(const char *entry) {
  char t[64];
  struct tm tm = {0};
  if (!xml_text(entry, "LastModified", t, sizeof t) ||
      sscanf(t, "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  time_t v = timegm(&tm);
  return v < 0 ? 0 : (int64_t)v;
}

/* s3_list's callback behind each_entry: the Size field as a number, LastModified as seconds. */
struct sized {
  s3_list_fn fn;
  void *ud;
};
static int on_sized(void *ud, const char *key, const char *size, const char *entry) {
  const struct sized *s = ud;
  return s->fn(s->ud, key, strtoull(size, NULL, 10), s3_time(entry));
}

/* s3_mpu_list's callback behind each_entry. */
struct uploads {
  s3_upload_fn fn;
  void *ud;
};
static int on_upload(void *ud, const char *key, const char *upload_id, const char *entry) {
  (void)entry;
  const struct uploads *u = ud;
  return u->fn(u->ud, key, upload_id);
}

int s3_list(s3_client *c, const char *p, s3_list_fn fn, void *ud) {
  char full[S3_NAME_MAX + 512], token[1024] = "", page[16];
  snprintf(full, sizeof full, "%s%s", c->prefix, p ? p : "");
  snprintf(page, sizeof page, "%d", c->page);
  for (;;) {
    s3_kv q[4] = {{"list-type", "2"}, {"max-keys", page}, {"prefix", full}, {"continuation-token", token}};
    s3_req rq = {.method = "GET", .query = q, .nq = token[0] ? 4 : 3};
    s3_resp r;
    int rc = request(c, &rq, &r);
    if (rc) return rc;
    struct sized sz = {fn, ud};
    rc = each_entry(c, r.body, "Contents", "Size", on_sized, &sz);
    int more = truncated(r.body);
    char prev[sizeof token];
    memcpy(prev, token, sizeof prev);
    if (!rc && more && (!xml_text(r.body, "NextContinuationToken", token, sizeof token) || !strcmp(token, prev)))
      rc = dpc_err(DPC_EFORMAT, "S3 listing of %s: a truncated page without a new NextContinuationToken", full);
    free(r.body);
    if (rc || !more) return rc;
  }
}

uint64_t s3_part_bytes(uint64_t total, uint64_t want, int max_parts) {
  if (max_parts <= 0 || max_parts > S3_MAX_PARTS) max_parts = S3_MAX_PARTS;
  if (total > S3_MAX_OBJECT_BYTES) return 0;
  const uint64_t mib = (uint64_t)1 << 20, need = (total + (uint64_t)max_parts - 1) / (uint64_t)max_parts;
  if (need <= want) return want;
  uint64_t p = (need + mib - 1) / mib * mib;
  return p <= S3_MAX_PART_BYTES ? p : 0;
}

int s3_max_parts(const s3_client *c) { return c->max_parts; }

int s3_mpu_create(s3_client *c, const char *key, char *upload_id, size_t cap) {
  const s3_kv q[] = {{"uploads", NULL}};
  s3_req rq = {.method = "POST", .key = key, .query = q, .nq = 1};
  s3_resp r;
  int rc = request(c, &rq, &r);
  if (!rc && !xml_text(r.body, "UploadId", upload_id, cap))
    rc = dpc_err(DPC_EFORMAT, "S3 multipart upload of %s%s: no UploadId in the answer", c->prefix, key);
  free(r.body);
  return rc;
}

int s3_mpu_put_part(s3_client *c, const char *key, const char *upload_id, int part, const void *data, size_t len,
                    char *etag, size_t etag_cap) {
  if (part < 1 || part > c->max_parts) return dpc_err(DPC_EINVAL, "S3: part number %d outside 1..%d", part, c->max_parts);
  char pn[16], md5[25];
  snprintf(pn, sizeof pn, "%d", part);
  const s3_kv q[] = {{"partNumber", pn}, {"uploadId", upload_id}};
  s3_req rq = {.method = "PUT", .key = key, .query = q, .nq = 2, .body = data, .body_len = len,
               .content_md5 = payload_md5(c, data, len, md5)};
  s3_resp r;
  int rc = request(c, &rq, &r);
  free(r.body);
  if (!rc && !r.etag[0]) rc = dpc_err(DPC_EFORMAT, "S3 part %d of %s%s: no ETag in the answer", part, c->prefix, key);
  if (!rc) snprintf(etag, etag_cap, "%s", r.etag);
  return rc;
}

int s3_mpu_complete(s3_client *c, const char *key, const char *upload_id, int nparts, char (*etags)[80]) {
  size_t cap = 128 + (size_t)nparts * 160;
  char *xml = malloc(cap);
  if (!xml) return DPC_ENOMEM;
  size_t n = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
  for (int i = 0; i < nparts; i++)
    n += (size_t)snprintf(xml + n, cap - n, "<Part><PartNumber>%d</PartNumber><ETag>\"%s\"</ETag></Part>", i + 1,
                          etags[i]);
  n += (size_t)snprintf(xml + n, cap - n, "</CompleteMultipartUpload>");
  const s3_kv q[] = {{"uploadId", upload_id}};
  s3_req rq = {.method = "POST", .key = key, .query = q, .nq = 1, .body = xml, .body_len = n};
  s3_resp r;
  int rc = request(c, &rq, &r);
  char code[64] = "";
  /* S3 may answer 200 and put the failure in the body. */
  if (!rc && r.body && strstr(r.body, "<Error>") && xml_text(r.body, "Code", code, sizeof code))
    rc = dpc_err(DPC_EIO, "S3 completing the upload of %s%s: %s", c->prefix, key, code);
  free(r.body);
  free(xml);
  return rc;
}

int s3_mpu_abort(s3_client *c, const char *key, const char *upload_id) {
  const s3_kv q[] = {{"uploadId", upload_id}};
  s3_req rq = {.method = "DELETE", .key = key, .query = q, .nq = 1};
  s3_resp r;
  int rc = request(c, &rq, &r);
  free(r.body);
  return rc == DPC_ENOENT ? 0 : rc;
}

int s3_mpu_list(s3_client *c, s3_upload_fn fn, void *ud) {
  char kmark[S3_NAME_MAX + 512] = "", umark[512] = "", page[16];
  snprintf(page, sizeof page, "%d", c->page);
  for (;;) {
    /* The markers resume after the last upload of the page before; the sweep's aborts of
     * uploads already listed do not move them. */
    s3_kv q[5] = {{"uploads", NULL}, {"max-uploads", page}, {"prefix", c->prefix}, {"key-marker", kmark},
                  {"upload-id-marker", umark}};
    s3_req rq = {.method = "GET", .query = q, .nq = kmark[0] ? 5 : 3};
    s3_resp r;
    int rc = request(c, &rq, &r);
    if (rc) return rc;
    struct uploads up = {fn, ud};
    rc = each_entry(c, r.body, "Upload", "UploadId", on_upload, &up);
    int more = truncated(r.body);
    char pk[sizeof kmark], pu[sizeof umark];
    memcpy(pk, kmark, sizeof pk);
    memcpy(pu, umark, sizeof pu);
    if (!rc && more &&
        (!xml_text(r.body, "NextKeyMarker", kmark, sizeof kmark) || !kmark[0] ||
         !xml_text(r.body, "NextUploadIdMarker", umark, sizeof umark) || (!strcmp(kmark, pk) && !strcmp(umark, pu))))
      rc = dpc_err(DPC_EFORMAT, "S3 listing of uploads under %s: a truncated page without new next markers",
                   c->prefix[0] ? c->prefix : "the bucket");
    free(r.body);
    if (rc || !more) return rc;
  }
}

int s3_presign_part(const s3_client *c, const char *key, const char *upload_id, int part, const char *content_md5,
                    int expires_s, char *url, size_t cap) {
  if (part < 1 || part > c->max_parts) return dpc_err(DPC_EINVAL, "S3: part number %d outside 1..%d", part, c->max_parts);
  char path[S3_NAME_MAX + 600], pn[16];
  int rc = req_path(c, key, path, sizeof path);
  if (rc) return rc;
  snprintf(pn, sizeof pn, "%d", part);
  const s3_kv q[] = {{"partNumber", pn}, {"uploadId", upload_id}};
  const s3_kv h[] = {{"content-md5", content_md5}};
  return s3_sigv4_presign(&c->cr, c->region, "PUT", c->base, c->host, path, q, 2, h, content_md5 ? 1 : 0, time(NULL),
                          expires_s, url, cap);
}

int s3_presign(const s3_client *c, const char *method, const char *key, const char *content_md5, int expires_s,
               char *url, size_t cap) {
  char path[S3_NAME_MAX + 600];
  int rc = req_path(c, key, path, sizeof path);
  if (rc) return rc;
  const s3_kv h[] = {{"content-md5", content_md5}};
  return s3_sigv4_presign(&c->cr, c->region, method, c->base, c->host, path, NULL, 0, h, content_md5 ? 1 : 0,
                          time(NULL), expires_s, url, cap);
}
