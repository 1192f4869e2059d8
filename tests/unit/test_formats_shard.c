/* test_formats_shard.c — llm.c token shards (round trip, hostile files) and the dataset batch
 * order of docs/design.md §3 checked by hand across shard boundaries. */
#include "common/dataset.h"
#include "common/errors.h"
#include "common/shard.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static char dir[] = "/tmp/dpc_shard_XXXXXX";

static void write_raw(const char *path, const int32_t *hdr, const uint16_t *tok, size_t ntok, size_t extra) {
  FILE *f = fopen(path, "wb");
  fwrite(hdr, 4, 256, f);
  fwrite(tok, 2, ntok, f);
  for (size_t i = 0; i < extra; i++) fputc(0, f);
  fclose(f);
}

static int expect_fail(const char *path, int code, const char *what) {
  shard *s = NULL;
  int rc = shard_open(path, &s);
  int ok = rc == code && !s && strstr(dpc_errmsg(), path) && strstr(dpc_errmsg(), what);
  if (!ok) fprintf(stderr, "  %s: rc %d, detail \"%s\"\n", what, rc, dpc_errmsg());
  shard_close(s);
  return ok;
}

int main(void) {
  CHECK(mkdtemp(dir) != NULL);
  char p[3][256];
  for (int i = 0; i < 3; i++) snprintf(p[i], sizeof p[i], "%s/s%d.bin", dir, i);

  /* Round trip, and the exact llm.c byte layout. */
  uint16_t tok[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 65535};
  CHECK_EQ_INT(shard_write(p[0], tok, 10), 0);
  FILE *f = fopen(p[0], "rb");
  int32_t hdr[256];
  CHECK(fread(hdr, 4, 256, f) == 256);
  fseek(f, 0, SEEK_END);
  CHECK_EQ_INT(ftell(f), 1024 + 20);
  fclose(f);
  CHECK(hdr[0] == 20240520 && hdr[1] == 1 && hdr[2] == 10 && hdr[3] == 0 && hdr[255] == 0);
  shard *s;
  CHECK_EQ_INT(shard_open(p[0], &s), 0);
  CHECK_EQ_INT(shard_num_tokens(s), 10);
  CHECK(memcmp(shard_tokens(s), tok, sizeof tok) == 0);
  CHECK(strcmp(shard_path(s), p[0]) == 0);
  shard_close(s);
  CHECK_EQ_INT(shard_write(p[1], NULL, 0), 0); /* empty shard is valid */
  CHECK_EQ_INT(shard_open(p[1], &s), 0);
  CHECK_EQ_INT(shard_num_tokens(s), 0);
  shard_close(s);

  /* Hostile shards. */
  memset(hdr, 0, sizeof hdr);
  hdr[0] = 20240520;
  hdr[1] = 1;
  hdr[2] = 10;
  write_raw(p[2], hdr, tok, 9, 0);
  CHECK(expect_fail(p[2], DPC_EFORMAT, "truncated"));
  write_raw(p[2], hdr, tok, 10, 1);
  CHECK(expect_fail(p[2], DPC_EFORMAT, "trailing bytes"));
  hdr[0] = 20240521;
  write_raw(p[2], hdr, tok, 10, 0);
  CHECK(expect_fail(p[2], DPC_EFORMAT, "wrong magic"));
  hdr[0] = 20240520;
  hdr[1] = 2;
  write_raw(p[2], hdr, tok, 10, 0);
  CHECK(expect_fail(p[2], DPC_EFORMAT, "version"));
  hdr[1] = 1;
  hdr[2] = -5;
  write_raw(p[2], hdr, tok, 10, 0);
  CHECK(expect_fail(p[2], DPC_EFORMAT, "negative"));
  f = fopen(p[2], "wb");
  fwrite(hdr, 1, 100, f);
  fclose(f);
  CHECK(expect_fail(p[2], DPC_EFORMAT, "truncated"));
  snprintf(p[2], sizeof p[2], "%s/none.bin", dir);
  CHECK(expect_fail(p[2], DPC_ENOENT, "No such file"));

  /* Dataset: shards of 7, 0 and 13 tokens -> a stream 100..119 (N = 20). */
  uint16_t a[7], c[13];
  for (int i = 0; i < 7; i++) a[i] = (uint16_t)(100 + i);
  for (int i = 0; i < 13; i++) c[i] = (uint16_t)(107 + i);
  CHECK_EQ_INT(shard_write(p[0], a, 7), 0);
  CHECK_EQ_INT(shard_write(p[1], NULL, 0), 0);
  snprintf(p[2], sizeof p[2], "%s/s2.bin", dir);
  CHECK_EQ_INT(shard_write(p[2], c, 13), 0);
  const char *paths[3] = {p[0], p[1], p[2]};
  dataset *ds;
  CHECK_EQ_INT(dataset_open(paths, 3, &ds), 0);
  CHECK_EQ_INT(dataset_num_tokens(ds), 20);
  /* B=2, T=3: nb = floor(19 / 6) = 3 batches at offsets 0, 6, 12. */
  CHECK_EQ_INT(dataset_num_batches(ds, 2, 3), 3);
  int in[6], tg[6];
  /* Replica 1 of 2, batch 0 -> (0*2+1) mod 3 = 1 -> o = 6: crosses the 7-token boundary. */
  CHECK_EQ_INT(dataset_batch(ds, 2, 3, 0, 1, 2, in, tg), 0);
  int want_in[6] = {106, 107, 108, 109, 110, 111}, want_tg[6] = {107, 108, 109, 110, 111, 112};
  CHECK(memcmp(in, want_in, sizeof in) == 0 && memcmp(tg, want_tg, sizeof tg) == 0);
  /* Batch 1 of replica 1 of 2 -> (1*2+1) mod 3 = 0 -> o = 0 (wraps around). */
  CHECK_EQ_INT(dataset_batch(ds, 2, 3, 1, 1, 2, in, tg), 0);
  CHECK(in[0] == 100 && in[5] == 105 && tg[0] == 101 && tg[5] == 106);
  /* Last batch: o = 12, targets end at token 18 (index 18 < N - 1 = 19). */
  CHECK_EQ_INT(dataset_batch(ds, 2, 3, 2, 0, 1, in, tg), 0);
  CHECK(in[0] == 112 && in[3] == 115 && tg[5] == 118);
  /* Huge batch index: (b*R + r) mod nb without overflow. b = 2^62, R = 3, r = 2 ->
   * (2^62*3 + 2) mod 3 = 2. */
  CHECK_EQ_INT(dataset_batch(ds, 2, 3, 1l << 62, 2, 3, in, tg), 0);
  CHECK(in[0] == 112);
  /* Bad arguments and a dataset too small. */
  CHECK_EQ_INT(dataset_batch(ds, 2, 3, 0, 2, 2, in, tg), DPC_EINVAL);
  CHECK_EQ_INT(dataset_batch(ds, 2, 3, -1, 0, 1, in, tg), DPC_EINVAL);
  CHECK_EQ_INT(dataset_batch(ds, 0, 3, 0, 0, 1, in, tg), DPC_EINVAL);
  CHECK_EQ_INT(dataset_num_batches(ds, 4, 5), 0);
  CHECK_EQ_INT(dataset_batch(ds, 4, 5, 0, 0, 1, in, tg), DPC_ERANGE);
  CHECK(strstr(dpc_errmsg(), "need at least 21 tokens") != NULL);
  CHECK_EQ_INT(dataset_num_batches(ds, 1, 19), 1); /* exactly N = B*T + 1 */
  int mx;
  CHECK_EQ_INT(dataset_max_token(ds, &mx), 0);
  CHECK_EQ_INT(mx, 119);
  CHECK_EQ_INT(dataset_check_vocab(ds, 120), 0);
  CHECK_EQ_INT(dataset_check_vocab(ds, 119), DPC_ERANGE);
  CHECK(strstr(dpc_errmsg(), p[2]) && strstr(dpc_errmsg(), "position 12"));
  int buf[20];
  CHECK_EQ_INT(dataset_read(ds, 0, 20, buf), 0);
  CHECK(buf[0] == 100 && buf[19] == 119);
  CHECK_EQ_INT(dataset_read(ds, 15, 6, buf), DPC_ERANGE);
  dataset_close(ds);

  /* A bad shard in the list names that shard. */
  FILE *bad = fopen(p[1], "wb");
  fputs("not a shard", bad);
  fclose(bad);
  CHECK_EQ_INT(dataset_open(paths, 3, &ds), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), p[1]) != NULL);

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  TEST_DONE();
}
