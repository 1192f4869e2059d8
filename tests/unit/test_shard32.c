/* test_shard32.c — token shards of both widths (common/shard.c, docs/design.md §6.1): writers
 * keep 16-bit shards bit-identical to shard_write when the vocabulary fits and write version 2
 * (uint32 tokens) when it does not; ids outside the vocabulary are refused before anything is
 * written; hostile version 2 headers are refused; the dataset reads both widths and names the
 * shard and position of a token >= the model's vocabulary. */
#include "common/dataset.h"
#include "common/errors.h"
#include "common/shard.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/dpc_shard32_XXXXXX";

static long file_bytes(const char *p, unsigned char *buf, size_t cap) {
  FILE *f = fopen(p, "rb");
  if (!f) return -1;
  size_t n = fread(buf, 1, cap, f);
  fclose(f);
  return (long)n;
}

static int fails_with(const char *p, int code, const char *what) {
  shard *s = NULL;
  int rc = shard_open(p, &s);
  int ok = rc == code && !s && strstr(dpc_errmsg(), p) && strstr(dpc_errmsg(), what);
  if (!ok) fprintf(stderr, "  %s: rc %d, \"%s\"\n", what, rc, dpc_errmsg());
  shard_close(s);
  return ok;
}

int main(void) {
  CHECK(mkdtemp(dir) != NULL);
  char p16[256], q16[256], p32[256], bad[256];
  snprintf(p16, sizeof p16, "%s/a16.bin", dir);
  snprintf(q16, sizeof q16, "%s/b16.bin", dir);
  snprintf(p32, sizeof p32, "%s/a32.bin", dir);
  snprintf(bad, sizeof bad, "%s/bad.bin", dir);
  static unsigned char x[1 << 16], y[1 << 16];

  /* A vocabulary that fits 16 bits: the same bytes as shard_write. */
  int ids[6] = {0, 1, 50256, 7, 65535, 3};
  uint16_t u16[6] = {0, 1, 50256, 7, 65535, 3};
  CHECK_EQ_INT(shard_write_ids(p16, ids, 6, 65536), 0);
  CHECK_EQ_INT(shard_write(q16, u16, 6), 0);
  long nx = file_bytes(p16, x, sizeof x), ny = file_bytes(q16, y, sizeof y);
  CHECK(nx == 1024 + 12 && nx == ny && memcmp(x, y, (size_t)nx) == 0);

  /* Llama 3's vocabulary: version 2, 4-byte tokens. */
  int big[5] = {128000, 9906, 4435, 128255, 0};
  CHECK_EQ_INT(shard_write_ids(p32, big, 5, 128256), 0);
  nx = file_bytes(p32, x, sizeof x);
  CHECK_EQ_INT(nx, 1024 + 20);
  int32_t hdr[256];
  memcpy(hdr, x, sizeof hdr);
  CHECK(hdr[0] == 20240520 && hdr[1] == 2 && hdr[2] == 5 && hdr[3] == 4 && hdr[4] == 0 && hdr[255] == 0);
  shard *s = NULL;
  CHECK_EQ_INT(shard_open(p32, &s), 0);
  CHECK_EQ_INT(shard_token_bytes(s), 4);
  CHECK(shard_tokens(s) == NULL && shard_tokens32(s) != NULL);
  CHECK(shard_tokens32(s)[3] == 128255u);
  shard_close(s);

  /* An id outside the vocabulary: refused, naming the shard and position; nothing written. */
  int oob[3] = {1, 128256, 2};
  char p_oob[256];
  snprintf(p_oob, sizeof p_oob, "%s/oob.bin", dir);
  CHECK_EQ_INT(shard_write_ids(p_oob, oob, 3, 128256), DPC_ERANGE);
  CHECK(strstr(dpc_errmsg(), p_oob) && strstr(dpc_errmsg(), "position 1"));
  CHECK(access(p_oob, F_OK) != 0);
  int neg[1] = {-1};
  CHECK_EQ_INT(shard_write_ids(p_oob, neg, 1, 50257), DPC_ERANGE);
  CHECK(access(p_oob, F_OK) != 0);

  /* Hostile version 2 headers. */
  memcpy(y, x, (size_t)nx);
  ((int32_t *)y)[3] = 2;
  FILE *f = fopen(bad, "wb");
  fwrite(y, 1, (size_t)nx, f);
  fclose(f);
  CHECK(fails_with(bad, DPC_EFORMAT, "bytes per token"));
  ((int32_t *)y)[3] = 4;
  ((int32_t *)y)[1] = 3;
  f = fopen(bad, "wb");
  fwrite(y, 1, (size_t)nx, f);
  fclose(f);
  CHECK(fails_with(bad, DPC_EFORMAT, "unsupported version 3"));
  ((int32_t *)y)[1] = 2;
  f = fopen(bad, "wb");
  fwrite(y, 1, (size_t)nx - 2, f); /* a 16-bit-sized body under a 32-bit header */
  fclose(f);
  CHECK(fails_with(bad, DPC_EFORMAT, "truncated"));

  /* The dataset over a 16-bit and a 32-bit shard: one stream, checked against the vocabulary. */
  const char *paths[2] = {p16, p32};
  dataset *ds = NULL;
  CHECK_EQ_INT(dataset_open(paths, 2, &ds), 0);
  CHECK_EQ_INT(dataset_num_tokens(ds), 11);
  int got[11];
  CHECK_EQ_INT(dataset_read(ds, 0, 11, got), 0);
  int want[11] = {0, 1, 50256, 7, 65535, 3, 128000, 9906, 4435, 128255, 0};
  CHECK(memcmp(got, want, sizeof want) == 0);
  int mx = 0;
  CHECK_EQ_INT(dataset_max_token(ds, &mx), 0);
  CHECK_EQ_INT(mx, 128255);
  CHECK_EQ_INT(dataset_check_vocab(ds, 128256), 0);
  CHECK_EQ_INT(dataset_check_vocab(ds, 128000), DPC_ERANGE);
  CHECK(strstr(dpc_errmsg(), p32) && strstr(dpc_errmsg(), "token 128000 at position 0"));
  dataset_close(ds);

  /* A 32-bit token no vocabulary has (2^32 - 1): refused by the check, clamped by the reader. */
  ((uint32_t *)(x + 1024))[2] = 0xFFFFFFFFu;
  f = fopen(bad, "wb");
  fwrite(x, 1, (size_t)nx, f);
  fclose(f);
  const char *one[1] = {bad};
  CHECK_EQ_INT(dataset_open(one, 1, &ds), 0);
  CHECK_EQ_INT(dataset_check_vocab(ds, 128256), DPC_ERANGE);
  CHECK(strstr(dpc_errmsg(), "4294967295 at position 2"));
  CHECK_EQ_INT(dataset_max_token(ds, &mx), 0);
  CHECK_EQ_INT(mx, INT32_MAX);
  dataset_close(ds);

  unlink(p16);
  unlink(q16);
  unlink(p32);
  unlink(bad);
  rmdir(dir);
  TEST_DONE();
}
