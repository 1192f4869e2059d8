/* storeget.c — ranged GETs of presigned S3 URLs (see storeget.h). */
#include "worker/storeget.h"

#include "common/errors.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  unsigned char *dst;
  size_t cap, got;
  int over;
} sink;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static size_t on_data(char *p, size_t sz, size_t nm, void *ud) {
  sink *s = ud;
  size_t n = sz * nm;
  if (s->got + n > s->cap) {
    s->over = 1;
    return 0;
  }
  memcpy(s->dst + s->got, p, n);
  s->got += n;
  return n;
}

/* The host and path of url, without its signed query, for messages. */
static void redact(const char *url, char *out, size_t cap) {
  const char *q = strchr(url, '?');
  snprintf(out, cap, "%.*s", (int)(q ? (size_t)(q - url) : strlen(url)), url);
}

int storeget_range(const char *url, uint64_t off, void *dst, size_t n, int timeout_ms) {
  pthread_once(&once, init_once);
  char where[512], range[64], err[CURL_ERROR_SIZE] = "";
  redact(url, where, sizeof where);
  if (n == 0) return 0;
  CURL *e = curl_easy_init();
  if (!e) return dpc_err(DPC_ENOMEM, "store GET %s: curl_easy_init failed", where);
  sink s = {.dst = dst, .cap = n};
  snprintf(range, sizeof range, "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + n - 1));
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_RANGE, range);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_ms < 10000 ? timeout_ms : 10000));
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &s);
  curl_easy_setopt(e, CURLOPT_FAILONERROR, 1L); /* an error page is not our bytes */
  CURLcode cc = curl_easy_perform(e);
  long st = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
  curl_easy_cleanup(e);
  if (s.over) return dpc_err(DPC_EFORMAT, "store GET %s: more than the %zu bytes asked for", where, n);
  if (cc == CURLE_HTTP_RETURNED_ERROR || (cc == CURLE_OK && st / 100 != 2)) {
    int code = st == 403 ? DPC_EPERM : st == 404 ? DPC_ENOENT : st / 100 == 5 ? DPC_EUNAVAILABLE : DPC_EIO;
    return dpc_err(code, "store GET %s: HTTP %ld%s", where, st, st == 403 ? " (the URL expired or was altered)" : "");
  }
  if (cc != CURLE_OK)
    return dpc_err(DPC_EUNAVAILABLE, "store GET %s: %s%s%s", where, curl_easy_strerror(cc), err[0] ? ": " : "", err);
  if (st != 206 && !(st == 200 && off == 0))
    return dpc_err(DPC_EFORMAT, "store GET %s: HTTP %ld instead of the range asked for", where, st);
  if (s.got != n) return dpc_err(DPC_EFORMAT, "store GET %s: %zu of %zu bytes", where, s.got, n);
  return 0;
}
