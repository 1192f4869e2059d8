/* test_tokenizer_tool.c — command-line driver of common/tokenizer for the oracle test and
 * for measuring speed.
 *
 *   test_tokenizer_tool encode GPT2_DIR DOCS
 *       DOCS holds documents as "<byte count>\n<bytes>" one after another; prints one line
 *       per document with its GPT-2 ids separated by spaces, and fails unless decode gives
 *       each document back. GPT2_DIR may instead be a tokenizer.json (a path ending in .json).
 *   test_tokenizer_tool bench GPT2_DIR MAX_BYTES FILE...
 *       concatenates the files (up to MAX_BYTES bytes), encodes the whole text once, prints
 *       MB/s and tokens, and fails unless decode gives the text back. Fails when
 *       GPT2_DIR has no encoder.json or no FILE exists. */
#include "common/errors.h"
#include "common/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap);
  for (;;) {
    if (n == cap) b = realloc(b, cap *= 2);
    size_t got = fread(b + n, 1, cap - n, f);
    if (!got) break;
    n += got;
  }
  fclose(f);
  *len = n;
  return b;
}

/* GPT2_DIR may also be a Hugging Face tokenizer.json (a path ending in .json). */
static int open_gpt2(const char *dir, dpc_tokenizer **t) {
  size_t n = strlen(dir);
  int rc = n > 5 && strcmp(dir + n - 5, ".json") == 0 ? tok_open_hf(dir, t) : tok_open_gpt2(dir, t);
  if (rc) fprintf(stderr, "tokenizer %s: %s: %s\n", dir, dpc_strerror(rc), dpc_errmsg());
  return rc;
}

static int cmd_encode(const char *dir, const char *docs) {
  dpc_tokenizer *t = NULL;
  if (open_gpt2(dir, &t)) return 1;
  size_t len = 0, pos = 0;
  char *buf = slurp(docs, &len);
  if (!buf) {
    fprintf(stderr, "%s: cannot read\n", docs);
    tok_free(t);
    return 1;
  }
  int status = 0;
  while (pos < len) {
    char *nl = memchr(buf + pos, '\n', len - pos);
    char *end = NULL;
    unsigned long long n = strtoull(buf + pos, &end, 10);
    if (!nl || end != nl || n > len - (size_t)(nl + 1 - buf)) {
      fprintf(stderr, "%s: bad document header at byte %zu\n", docs, pos);
      status = 1;
      break;
    }
    pos = (size_t)(nl + 1 - buf);
    int *ids = NULL;
    size_t k = 0;
    int rc = tok_encode(t, buf + pos, (size_t)n, &ids, &k);
    if (rc) {
      fprintf(stderr, "tok_encode: %s\n", dpc_errmsg());
      status = 1;
      break;
    }
    for (size_t i = 0; i < k; i++) printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
    char *back = NULL;
    size_t blen = 0;
    if (tok_decode(t, ids, k, &back, &blen) || blen != (size_t)n || memcmp(back, buf + pos, blen) != 0) {
      fprintf(stderr, "decode(encode(document at byte %zu)) differs from the document\n", pos);
      status = 1;
    }
    free(back);
    free(ids);
    pos += (size_t)n;
  }
  free(buf);
  tok_free(t);
  return status;
}

static int cmd_bench(const char *dir, size_t max_bytes, char **files, int n_files) {
  struct stat st;
  char path[4096];
  size_t dl = strlen(dir);
  snprintf(path, sizeof path, dl > 5 && strcmp(dir + dl - 5, ".json") == 0 ? "%s" : "%s/encoder.json", dir);
  if (stat(path, &st) != 0) {
    fprintf(stderr, "FAIL: %s not found; run deploy/fetch_assets.sh tests/.cache (tests/run.sh does)\n", path);
    return 1;
  }
  size_t len = 0, cap = 1 << 20;
  char *text = malloc(cap);
  for (int i = 0; i < n_files && len < max_bytes; i++) {
    size_t n = 0;
    char *b = slurp(files[i], &n);
    if (!b) continue;
    if (n > max_bytes - len) n = max_bytes - len;
    while (len + n > cap) text = realloc(text, cap *= 2);
    memcpy(text + len, b, n);
    len += n;
    free(b);
  }
  if (len == 0) {
    fprintf(stderr, "FAIL: no corpus files readable (run deploy/fetch_assets.sh tests/.cache)\n");
    free(text);
    return 1;
  }
  dpc_tokenizer *t = NULL;
  double t0 = now();
  if (open_gpt2(dir, &t)) return 1;
  double t1 = now();
  int *ids = NULL;
  size_t k = 0;
  int rc = tok_encode(t, text, len, &ids, &k);
  double t2 = now();
  char *back = NULL;
  size_t bl = 0;
  if (!rc) rc = tok_decode(t, ids, k, &back, &bl);
  double t3 = now();
  int ok = rc == 0 && bl == len && memcmp(back, text, len) == 0;
  printf("load %.3f s; encode %.2f MB in %.3f s = %.1f MB/s, %zu tokens (%.2f bytes/token); "
         "decode %.1f MB/s; round trip %s\n",
         t1 - t0, (double)len / 1e6, t2 - t1, (double)len / 1e6 / (t2 - t1), k,
         k ? (double)len / (double)k : 0.0, (double)len / 1e6 / (t3 - t2), ok ? "ok" : "FAILED");
  if (rc) fprintf(stderr, "%s: %s\n", dpc_strerror(rc), dpc_errmsg());
  free(ids);
  free(back);
  free(text);
  tok_free(t);
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "encode") == 0) return cmd_encode(argv[2], argv[3]);
  if (argc >= 5 && strcmp(argv[1], "bench") == 0)
    return cmd_bench(argv[2], (size_t)strtoull(argv[3], NULL, 10), argv + 4, argc - 4);
  fprintf(stderr, "usage: %s encode GPT2_DIR DOCS | bench GPT2_DIR MAX_BYTES FILE...\n", argv[0]);
  return 2;
}
