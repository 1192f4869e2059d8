/* storeget.c — ranged GETs of presigned S3 URLs (see storeget.h). */
#include "worker/storeget.h"

#include "common/checksum.h"
#include "common/errors.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  storeget_fn fn; /* where the bytes go */
  void *ud;
  uint64_t cap, got;
  int over, rc; /* more than cap arrived; fn's refusal */
} sink;

typedef struct {
  unsigned char *dst;
} copy_to;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char ca_file[4096]; /* set once before any request (storehttp_set_ca_file) */
static void init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static size_t on_data(char *p, size_t sz, size_t nm, void *ud) {
  sink *s = ud;
  size_t n = sz * nm;
  if (s->got + n > s->cap) {
    s->over = 1;
    return 0;
  }
  if ((s->rc = s->fn(s->ud, s->got, p, n)) < 0) return 0;
  s->got += n;
  return n;
}

static int copy_out(void *ud, uint64_t at, const void *p, size_t n) {
  memcpy(((copy_to *)ud)->dst + at, p, n);
  return 0;
}

/* The host and path of url, without its signed query, for messages. */
static void redact(const char *url, char *out, size_t cap) {
  const char *q = strchr(url, '?');
  snprintf(out, cap, "%.*s", (int)(q ? (size_t)(q - url) : strlen(url)), url);
}

int storehttp_set_ca_file(const char *path) {
  ca_file[0] = 0;
  if (!path || !path[0]) return 0;
  if (strlen(path) >= sizeof ca_file) return dpc_err(DPC_EINVAL, "--s3-ca-file: the path is too long");
  if (access(path, R_OK) < 0) return dpc_err(DPC_EINVAL, "--s3-ca-file %s: %s", path, strerror(errno));
  snprintf(ca_file, sizeof ca_file, "%s", path);
  return 0;
}

int storehttp_fail(int cc, const char *err, const char *method, const char *where) {
  if (cc == CURLE_PEER_FAILED_VERIFICATION)
    return dpc_err(DPC_EUNAVAILABLE, "store %s %s: the store's certificate is not trusted (%s): give its CA with "
                   "--s3-ca-file", method, where, err[0] ? err : curl_easy_strerror((CURLcode)cc));
  return dpc_err(DPC_EUNAVAILABLE, "store %s %s: %s%s%s", method, where, curl_easy_strerror((CURLcode)cc),
                 err[0] ? ": " : "", err);
}

void *storehttp_open(const char *url, int timeout_ms, char *err, char *where, size_t wcap) {
  pthread_once(&once, init_once);
  redact(url, where, wcap);
  CURL *e = curl_easy_init();
  if (!e) return NULL;
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  /* A stall limit, not a total one: a large object over a slow link may take minutes and is
   * still healthy while bytes move. */
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)(timeout_ms < 1000 ? 1 : timeout_ms / 1000));
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_ms < 10000 ? timeout_ms : 10000));
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, err);
  if (ca_file[0]) curl_easy_setopt(e, CURLOPT_CAINFO, ca_file);
  return e;
}

int storeget_range(const char *url, uint64_t off, void *dst, size_t n, int timeout_ms) {
  copy_to c = {.dst = dst};
  return storeget_stream(url, off, n, copy_out, &c, timeout_ms);
}

int storeget_stream(const char *url, uint64_t off, uint64_t n, storeget_fn fn, void *ud, int timeout_ms) {
  char where[512], range[64], err[CURL_ERROR_SIZE] = "";
  CURL *e = storehttp_open(url, timeout_ms, err, where, sizeof where);
  if (!e) return dpc_err(DPC_ENOMEM, "store GET %s: curl_easy_init failed", where);
  if (n == 0) {
    curl_easy_cleanup(e);
    return 0;
  }
  sink s = {.fn = fn, .ud = ud, .cap = n};
  snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + n - 1));
  curl_easy_setopt(e, CURLOPT_RANGE, range);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &s);
  curl_easy_setopt(e, CURLOPT_FAILONERROR, 1L); /* an error page is not our bytes */
  CURLcode cc = curl_easy_perform(e);
  long st = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
  curl_easy_cleanup(e);
  if (s.rc < 0) return s.rc;
  if (s.over) return dpc_err(DPC_EFORMAT, "store GET %s: more than the %llu bytes asked for", where, (unsigned long long)n);
  if (cc == CURLE_HTTP_RETURNED_ERROR || (cc == CURLE_OK && st / 100 != 2)) {
    int code = st == 403 ? DPC_EPERM : st == 404 ? DPC_ENOENT : st / 100 == 5 ? DPC_EUNAVAILABLE : DPC_EIO;
    return dpc_err(code, "store GET %s: HTTP %ld%s", where, st, st == 403 ? " (the URL expired or was altered)" : "");
  }
  if (cc != CURLE_OK) return storehttp_fail(cc, err, "GET", where);
  if (st != 206 && !(st == 200 && off == 0))
    return dpc_err(DPC_EFORMAT, "store GET %s: HTTP %ld instead of the range asked for", where, st);
  if (s.got != n)
    return dpc_err(DPC_EFORMAT, "store GET %s: %llu of %llu bytes", where, (unsigned long long)s.got, (unsigned long long)n);
  return 0;
}

/* storehttp_fanout: the jobs shared among the streams, each taking the next one not yet taken;
 * after the first failure no stream takes another. */
typedef struct {
  int (*fn)(void *ud, int k);
  void *ud;
  int n, next, rc;
  pthread_mutex_t mu;
  char msg[1024];
} fanout;

static void *fanout_main(void *arg) {
  fanout *f = arg;
  for (;;) {
    pthread_mutex_lock(&f->mu);
    int k = f->rc ? f->n : f->next++;
    pthread_mutex_unlock(&f->mu);
    if (k >= f->n) return NULL;
    int rc = f->fn(f->ud, k);
    if (rc) {
      pthread_mutex_lock(&f->mu);
      if (!f->rc) {
        f->rc = rc;
        snprintf(f->msg, sizeof f->msg, "%s", dpc_errmsg());
      }
      pthread_mutex_unlock(&f->mu);
    }
  }
}

int storehttp_fanout(int n, int streams, int (*fn)(void *ud, int k), void *ud) {
  fanout f = {.fn = fn, .ud = ud, .n = n};
  pthread_mutex_init(&f.mu, NULL);
  pthread_t th[STOREHTTP_STREAMS_MAX];
  int started = 0;
  if (streams > n) streams = n;
  if (streams > STOREHTTP_STREAMS_MAX) streams = STOREHTTP_STREAMS_MAX;
  for (int i = 1; i < streams; i++) /* this thread is the first stream */
    if (pthread_create(&th[started], NULL, fanout_main, &f) == 0) started++;
  fanout_main(&f);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&f.mu);
  return f.rc ? dpc_err(f.rc, "%s", f.msg) : 0;
}

/* storeget_parallel: the range cut in pieces of `each` bytes, one GET each. */
typedef struct {
  const char *url;
  uint64_t off;
  unsigned char *dst;
  size_t n, each;
  int timeout_ms;
} pieces;

static int get_piece(void *ud, int k) {
  const pieces *p = ud;
  size_t at = (size_t)k * p->each, len = at >= p->n ? 0 : p->n - at < p->each ? p->n - at : p->each;
  return storeget_range(p->url, p->off + at, p->dst + at, len, p->timeout_ms);
}

int storeget_parallel(const char *url, uint64_t off, void *dst, size_t n, int streams, size_t piece_min,
                      int timeout_ms) {
  if (piece_min < 4096) piece_min = 4096;
  if ((uint64_t)streams > n / piece_min) streams = (int)(n / piece_min);
  if (streams > STOREHTTP_STREAMS_MAX) streams = STOREHTTP_STREAMS_MAX;
  if (streams <= 1) return storeget_range(url, off, dst, n, timeout_ms);
  pieces p = {.url = url, .off = off, .dst = dst, .n = n, .each = (n / (size_t)streams + 4095) & ~(size_t)4095,
              .timeout_ms = timeout_ms};
  return storehttp_fanout(streams, streams, get_piece, &p);
}

/* ---- a blob object read whole ---- */

static uint32_t get_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* storeget_blob's router: the header, the first n_dst floats, the rest, the trailer. */
typedef struct {
  const char *what;
  uint32_t kind;
  uint64_t n, n_dst;
  unsigned char hdr[24], trailer[8];
  unsigned char *dst, *extra;
  uint32_t crc; /* of the payload so far */
} blob_sink;

static int blob_byte_span(blob_sink *b, uint64_t at, const unsigned char *p, size_t n) {
  const uint64_t pay = 24 + 4 * b->n;
  if (at < 24) {
    size_t k = n < 24 - at ? n : (size_t)(24 - at);
    memcpy(b->hdr + at, p, k);
    if (at + k < 24) return (int)k;
    uint64_t got_n = 0;
    for (int i = 7; i >= 0; i--) got_n = got_n << 8 | b->hdr[16 + i];
    if (get_u32(b->hdr) != STORE_BLOB_MAGIC || get_u32(b->hdr + 4) != 1 || get_u32(b->hdr + 8) != b->kind ||
        get_u32(b->hdr + 12) != 0 || got_n != b->n)
      return dpc_err(DPC_EFORMAT, "%s: not a blob of kind %u holding %llu floats (magic %08x, kind %u, %llu floats)",
                     b->what, b->kind, (unsigned long long)b->n, get_u32(b->hdr), get_u32(b->hdr + 8),
                     (unsigned long long)got_n);
    return (int)k;
  }
  if (at < pay) {
    size_t k = n < pay - at ? n : (size_t)(pay - at);
    const uint64_t off = at - 24, split = 4 * b->n_dst;
    b->crc = dpc_crc32c(b->crc, p, k);
    if (off < split) {
      size_t d = k < split - off ? k : (size_t)(split - off);
      memcpy(b->dst + off, p, d);
      if (d < k) memcpy(b->extra, p + d, k - d);
    } else {
      memcpy(b->extra + (off - split), p, k);
    }
    return (int)k;
  }
  size_t k = n < pay + 8 - at ? n : (size_t)(pay + 8 - at);
  memcpy(b->trailer + (at - pay), p, k);
  return (int)k;
}

static int blob_bytes(void *ud, uint64_t at, const void *p, size_t n) {
  blob_sink *b = ud;
  const unsigned char *q = p;
  while (n > 0) { /* a piece may straddle the header, the payload and the trailer */
    int k = blob_byte_span(b, at, q, n);
    if (k < 0) return k;
    at += (uint64_t)k;
    q += k;
    n -= (size_t)k;
  }
  return 0;
}

int storeget_blob(const char *url, const char *what, uint32_t kind, uint64_t n, float *dst, uint64_t n_dst, void *extra,
                  int timeout_ms) {
  if (n_dst > n || n - n_dst > 2) return dpc_err(DPC_EINVAL, "%s: %llu of %llu floats asked for", what,
                                                 (unsigned long long)n_dst, (unsigned long long)n);
  blob_sink b = {.what = what, .kind = kind, .n = n, .n_dst = n_dst, .dst = (unsigned char *)dst};
  unsigned char spare[8];
  b.extra = extra ? extra : spare;
  int rc = storeget_stream(url, 0, 24 + 4 * n + 8, blob_bytes, &b, timeout_ms);
  if (rc) return rc;
  if (get_u32(b.trailer) != b.crc || get_u32(b.trailer + 4) != dpc_crc32c(0, b.hdr, sizeof b.hdr))
    return dpc_err(DPC_ECHECKSUM, "%s: its checksums do not hold (payload %08x, trailer %08x)", what, b.crc,
                   get_u32(b.trailer));
  return 0;
}
