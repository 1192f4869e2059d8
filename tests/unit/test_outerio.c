/* test_outerio.c — the streamed outer steps (coordinator/outerio.h) against the whole-array
 * kernels (kernels/outer.h, themselves checked against PyTorch by coord_outer_oracle): the
 * sync step with fp32, SparseLoCo and quantized (kept as sent) deltas and the three async rules must give bit-identical
 * parameters and momentum for range sizes that do not divide the fragment; and a corrupt
 * delta, a delta other than the acknowledged one, a non-finite delta and a missing blob must
 * fail with the right code without writing a new blob. */
#include "common/errors.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "common/sparse.h"
#include "coordinator/blobs.h"
#include "coordinator/outerio.h"
#include "kernels/outer.h"
#include "tests/unit/test.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEN 10007
#define NDELTA 3

static uint32_t rng = 12345u;
static float frand(void) {
  rng = rng * 1664525u + 1013904223u;
  return (float)((rng >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static void fill(float *x, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = scale * frand();
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

static int exists(blob_store *bs, const char *name) {
  char path[4096];
  return blob_path(bs, name, path, sizeof path) == 0 && access(path, F_OK) == 0;
}

static void flip_byte(blob_store *bs, const char *name, long off) {
  char path[4096];
  CHECK_EQ_INT(blob_path(bs, name, path, sizeof path), 0);
  int fd = open(path, O_RDWR);
  unsigned char b = 0;
  CHECK(fd >= 0 && pread(fd, &b, 1, off) == 1);
  b ^= 0x20;
  CHECK(pwrite(fd, &b, 1, off) == 1);
  close(fd);
}

static void sync_case(blob_store *bs, size_t range) {
  float *theta = malloc(LEN * 4), *u = malloc(LEN * 4), *avg = malloc(LEN * 4), *d[NDELTA], *got = malloc(LEN * 4);
  fill(theta, LEN, 1.0f);
  fill(u, LEN, 0.01f);
  char names[NDELTA][BLOB_NAME_MAX];
  uint32_t crcs[NDELTA];
  double w[NDELTA] = {1, 2.5, 0.75};
  for (int i = 0; i < NDELTA; i++) {
    d[i] = malloc(LEN * 4);
    fill(d[i], LEN, 0.001f * (float)(i + 1));
    snprintf(names[i], sizeof names[i], "1/f0-v0-a%d.delta", i + 1);
    CHECK_EQ_INT(blob_write(bs, names[i], BLOB_DELTA, d[i], LEN, &crcs[i]), 0);
  }
  CHECK_EQ_INT(blob_write(bs, "1/f0-v0.params", BLOB_PARAMS, theta, LEN, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "1/f0-v0.momentum", BLOB_MOMENTUM, u, LEN, NULL), 0);
  CHECK_EQ_INT(outer_average((const float *const *)d, w, NDELTA, LEN, avg), 0);
  outer_nesterov_step(theta, u, avg, LEN, 0.7f, 0.9f, 1);

  outerio_sync a = {.bs = bs, .len = LEN, .range_floats = range, .param_blob = "1/f0-v0.params",
                    .momentum_blob = "1/f0-v0.momentum", .n = NDELTA, .delta_blobs = (const char (*)[BLOB_NAME_MAX])names,
                    .delta_crcs = crcs, .weights = w, .lr = 0.7f, .mu = 0.9f, .nesterov = 1,
                    .new_param = "1/f0-v1.params", .new_momentum = "1/f0-v1.momentum"};
  uint32_t pc = 0, mc = 0, rc2 = 0;
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), 0);
  CHECK_EQ_INT(blob_read(bs, "1/f0-v1.params", BLOB_PARAMS, got, LEN, &rc2), 0);
  CHECK(same_bits(got, theta, LEN));
  CHECK(rc2 == pc);
  CHECK_EQ_INT(blob_read(bs, "1/f0-v1.momentum", BLOB_MOMENTUM, got, LEN, &rc2), 0);
  CHECK(same_bits(got, u, LEN));
  CHECK(rc2 == mc);

  /* Round 0: no momentum blob means zeros. */
  a.momentum_blob = "";
  a.new_param = "1/f0-v9.params";
  a.new_momentum = "1/f0-v9.momentum";
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), 0);
  CHECK_EQ_INT(blob_read(bs, "1/f0-v9.momentum", BLOB_MOMENTUM, got, LEN, NULL), 0);
  CHECK(same_bits(got, avg, LEN)); /* u = 0.9 * 0 + avg */
  blob_delete(bs, "1/f0-v9.params");
  blob_delete(bs, "1/f0-v9.momentum");
  a.momentum_blob = "1/f0-v0.momentum";

  /* Failures publish nothing. */
  a.new_param = "1/f0-v2.params";
  a.new_momentum = "1/f0-v2.momentum";
  uint32_t good = crcs[1];
  crcs[1] ^= 1; /* not the acknowledged delta */
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), DPC_ECHECKSUM);
  CHECK(!exists(bs, "1/f0-v2.params") && !exists(bs, "1/f0-v2.momentum"));
  crcs[1] = good;
  flip_byte(bs, names[2], BLOB_HEADER_BYTES + 4 * 5000 + 1); /* a flipped payload bit */
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), DPC_ECHECKSUM);
  CHECK(!exists(bs, "1/f0-v2.params"));
  d[2][LEN - 3] = 0.0f / 0.0f; /* NaN, written with a valid checksum */
  CHECK_EQ_INT(blob_write(bs, names[2], BLOB_DELTA, d[2], LEN, &crcs[2]), 0);
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), DPC_ENUMERIC);
  CHECK(!exists(bs, "1/f0-v2.params"));
  snprintf(names[2], sizeof names[2], "1/f0-v0-a99.delta");
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), DPC_ENOENT);
  CHECK(!exists(bs, "1/f0-v2.params"));
  for (int i = 0; i < NDELTA; i++) free(d[i]);
  free(theta);
  free(u);
  free(avg);
  free(got);
}

static void sparse_case(blob_store *bs) {
  uint64_t tlen[3] = {5000, 3, 5004};
  dpc_sparse_cfg cfg = {.density = 0.05, .chunk = 256, .value_bits = 2};
  size_t bytes = 0;
  CHECK_EQ_INT(dpc_sparse_bytes(&cfg, tlen, 3, &bytes, NULL), 0);
  float *theta = malloc(LEN * 4), *u = malloc(LEN * 4), *avg = malloc(LEN * 4), *got = malloc(LEN * 4);
  float *d[2], *e = malloc(LEN * 4);
  char names[2][BLOB_NAME_MAX];
  uint32_t crcs[2];
  fill(theta, LEN, 1.0f);
  fill(u, LEN, 0.01f);
  for (int i = 0; i < 2; i++) {
    unsigned char *enc = calloc(1, (bytes + 3) / 4 * 4);
    fill(e, LEN, 0.01f);
    CHECK_EQ_INT(dpc_sparse_encode(&cfg, tlen, 3, e, enc), 0);
    d[i] = malloc(LEN * 4);
    CHECK_EQ_INT(dpc_sparse_decode(&cfg, tlen, 3, enc, bytes, d[i]), 0);
    snprintf(names[i], sizeof names[i], "2/f0-v0-a%d.sparse", i + 1);
    CHECK_EQ_INT(blob_write(bs, names[i], BLOB_SPARSE, (const float *)(void *)enc, (bytes + 3) / 4, &crcs[i]), 0);
    free(enc);
  }
  CHECK_EQ_INT(blob_write(bs, "2/f0-v0.params", BLOB_PARAMS, theta, LEN, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "2/f0-v0.momentum", BLOB_MOMENTUM, u, LEN, NULL), 0);
  CHECK_EQ_INT(outer_average((const float *const *)d, NULL, 2, LEN, avg), 0);
  outer_nesterov_step(theta, u, avg, LEN, 1.0f, 0.0f, 0);
  for (size_t range = 300; range <= 1u << 20; range *= 60) {
    char np[BLOB_NAME_MAX], nm[BLOB_NAME_MAX];
    snprintf(np, sizeof np, "2/f0-v%zu.params", range);
    snprintf(nm, sizeof nm, "2/f0-v%zu.momentum", range);
    outerio_sync a = {.bs = bs, .len = LEN, .range_floats = range, .param_blob = "2/f0-v0.params",
                      .momentum_blob = "2/f0-v0.momentum", .n = 2, .delta_blobs = (const char (*)[BLOB_NAME_MAX])names,
                      .delta_crcs = crcs, .weights = NULL, .sp_cfg = &cfg, .sp_tlen = tlen, .sp_nt = 3, .lr = 1.0f,
                      .mu = 0.0f, .nesterov = 0, .new_param = np, .new_momentum = nm};
    uint32_t pc, mc;
    CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), 0);
    CHECK_EQ_INT(blob_read(bs, np, BLOB_PARAMS, got, LEN, NULL), 0);
    CHECK(same_bits(got, theta, LEN));
  }
  for (int i = 0; i < 2; i++) free(d[i]);
  free(e);
  free(theta);
  free(u);
  free(avg);
  free(got);
}

/* Quantized deltas kept as sent (BLOB_ENCODED): decoded range by range, bit-identical to the
 * whole-array step over the decoded deltas for ranges on and off the codec's blocks; the row's
 * checksum is the decoded payload's; a flipped stream byte or another checksum is refused. */
static void encoded_case(blob_store *bs, int codec, uint32_t block, size_t range) {
  float *theta = malloc(LEN * 4), *u = malloc(LEN * 4), *avg = malloc(LEN * 4), *got = malloc(LEN * 4);
  float *d[2], *e = malloc(LEN * 4);
  char names[2][BLOB_NAME_MAX];
  uint32_t crcs[2];
  size_t bytes = 0;
  CHECK_EQ_INT(dpc_codec_bytes(codec, LEN, block, &bytes), 0);
  fill(theta, LEN, 1.0f);
  fill(u, LEN, 0.01f);
  for (int i = 0; i < 2; i++) {
    unsigned char *enc = calloc(1, (bytes + 3) / 4 * 4);
    fill(e, LEN, 0.01f * (float)(i + 1));
    CHECK_EQ_INT(dpc_codec_encode(codec, e, LEN, block, enc), 0);
    d[i] = malloc(LEN * 4);
    CHECK_EQ_INT(dpc_codec_decode(codec, enc, bytes, LEN, block, d[i]), 0);
    crcs[i] = dpc_crc32c(0, d[i], LEN * 4);
    snprintf(names[i], sizeof names[i], "3/f0-v0-a%d-t%d.encoded", i + 1, codec);
    CHECK_EQ_INT(blob_write(bs, names[i], BLOB_ENCODED, (const float *)(void *)enc, (bytes + 3) / 4, NULL), 0);
    free(enc);
  }
  CHECK_EQ_INT(blob_write(bs, "3/f0-v0.params", BLOB_PARAMS, theta, LEN, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "3/f0-v0.momentum", BLOB_MOMENTUM, u, LEN, NULL), 0);
  CHECK_EQ_INT(outer_average((const float *const *)d, NULL, 2, LEN, avg), 0);
  outer_nesterov_step(theta, u, avg, LEN, 0.7f, 0.9f, 1);
  outerio_sync a = {.bs = bs, .len = LEN, .range_floats = range, .param_blob = "3/f0-v0.params",
                    .momentum_blob = "3/f0-v0.momentum", .n = 2, .delta_blobs = (const char (*)[BLOB_NAME_MAX])names,
                    .delta_crcs = crcs, .codec = codec, .block_floats = block, .lr = 0.7f, .mu = 0.9f, .nesterov = 1,
                    .new_param = "3/f0-v1.params", .new_momentum = "3/f0-v1.momentum"};
  uint32_t pc, mc;
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), 0);
  CHECK_EQ_INT(blob_read(bs, "3/f0-v1.params", BLOB_PARAMS, got, LEN, NULL), 0);
  CHECK(same_bits(got, theta, LEN));
  CHECK_EQ_INT(blob_read(bs, "3/f0-v1.momentum", BLOB_MOMENTUM, got, LEN, NULL), 0);
  CHECK(same_bits(got, u, LEN));
  a.new_param = "3/f0-v2.params";
  a.new_momentum = "3/f0-v2.momentum";
  crcs[0] ^= 1; /* not the acknowledged delta */
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), DPC_ECHECKSUM);
  crcs[0] ^= 1;
  flip_byte(bs, names[1], BLOB_HEADER_BYTES + (long)bytes / 2);
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), DPC_ECHECKSUM);
  CHECK(!exists(bs, "3/f0-v2.params"));
  a.codec = DPC_CODEC_FP32; /* a job without a codec cannot read them */
  CHECK_EQ_INT(outerio_sync_step(&a, &pc, &mc), DPC_EFORMAT);
  for (int i = 0; i < 2; i++) {
    blob_delete(bs, names[i]);
    free(d[i]);
  }
  blob_delete(bs, "3/f0-v1.params");
  blob_delete(bs, "3/f0-v1.momentum");
  free(e);
  free(theta);
  free(u);
  free(avg);
  free(got);
}

static void async_case(blob_store *bs, outerio_rule rule, size_t range) {
  float *theta = malloc(LEN * 4), *m = malloc(LEN * 4), *buf = malloc(LEN * 4), *g = malloc(LEN * 4);
  float *got = malloc(LEN * 4);
  fill(theta, LEN, 1.0f);
  fill(m, LEN, 0.01f);
  fill(buf, LEN, 0.001f);
  fill(g, LEN, 0.001f);
  uint32_t gcrc;
  CHECK_EQ_INT(blob_write(bs, "3/f0-v4.params", BLOB_PARAMS, theta, LEN, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "3/f0-v4.momentum", BLOB_MOMENTUM, m, LEN, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "3/f0-v4.dnbuf", BLOB_DN_BUF, buf, LEN, NULL), 0);
  CHECK_EQ_INT(blob_write(bs, "3/f0-v4-a7.delta", BLOB_DELTA, g, LEN, &gcrc), 0);
  int64_t t = 7; /* (t + 1) mod N == 0 with N = 4: this application updates the momentum */
  if (rule == OUTERIO_DN) {
    outer_dn_state s;
    CHECK_EQ_INT(outer_dn_init(&s, buf, m, LEN, 4, 0.1, t, 0), 0);
    CHECK_EQ_INT(outer_dn_apply(&s, theta, g, 0.7f, 0.9f), 1);
  } else if (rule == OUTERIO_NESTEROV) {
    outer_nesterov_step(theta, m, g, LEN, 0.7f, 0.9f, 1);
  } else {
    outer_sgd_step(theta, g, LEN, 0.7f);
  }
  outerio_async a = {.bs = bs, .len = LEN, .range_floats = range, .rule = rule, .param_blob = "3/f0-v4.params",
                     .momentum_blob = "3/f0-v4.momentum", .dnbuf_blob = "3/f0-v4.dnbuf", .delta_blob = "3/f0-v4-a7.delta",
                     .delta_crc = gcrc, .N = 4, .c = 0.1, .dn_t = t, .lr = 0.7f, .mu = 0.9f,
                     .new_param = "3/f0-v5.params", .new_momentum = "3/f0-v5.momentum", .new_dnbuf = "3/f0-v5.dnbuf"};
  uint32_t pc, mc, bc;
  int64_t t_after = -1;
  CHECK_EQ_INT(outerio_async_step(&a, &pc, &mc, &bc, &t_after), 0);
  CHECK_EQ_INT(blob_read(bs, "3/f0-v5.params", BLOB_PARAMS, got, LEN, NULL), 0);
  CHECK(same_bits(got, theta, LEN));
  if (rule != OUTERIO_SGD) {
    CHECK_EQ_INT(blob_read(bs, "3/f0-v5.momentum", BLOB_MOMENTUM, got, LEN, NULL), 0);
    CHECK(same_bits(got, m, LEN));
  } else {
    CHECK(!exists(bs, "3/f0-v5.momentum"));
  }
  if (rule == OUTERIO_DN) {
    CHECK_EQ_INT(t_after, t + 1);
    CHECK_EQ_INT(blob_read(bs, "3/f0-v5.dnbuf", BLOB_DN_BUF, got, LEN, NULL), 0);
    CHECK(same_bits(got, buf, LEN));
  }
  blob_delete(bs, "3/f0-v5.params");
  blob_delete(bs, "3/f0-v5.momentum");
  blob_delete(bs, "3/f0-v5.dnbuf");
  a.delta_crc ^= 4; /* not the acknowledged delta */
  CHECK_EQ_INT(outerio_async_step(&a, &pc, &mc, &bc, &t_after), DPC_ECHECKSUM);
  CHECK(!exists(bs, "3/f0-v5.params"));
  free(theta);
  free(m);
  free(buf);
  free(g);
  free(got);
}

int main(void) {
  char dir[] = "/tmp/dpc_outerio_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  blob_store *bs;
  CHECK_EQ_INT(blob_store_open(dir, &bs), 0);
  sync_case(bs, 1000);  /* 11 ranges, the last one short */
  sync_case(bs, 1 << 20); /* one range */
  sparse_case(bs);
  encoded_case(bs, DPC_CODEC_INT8, 256, 1000); /* ranges of 768 floats, the last block short */
  encoded_case(bs, DPC_CODEC_E3M0, 99, 1000);  /* odd blocks: each pads its last nibble */
  encoded_case(bs, DPC_CODEC_FP8_E4M3, 4096, 1000); /* ranges of one block, wider than asked */
  encoded_case(bs, DPC_CODEC_BF16, 0, 333);    /* no blocks: 2 bytes a float, odd ranges */
  encoded_case(bs, DPC_CODEC_E3M0, 256, 1 << 20); /* one range */
  for (int r = 0; r < 3; r++) async_case(bs, (outerio_rule)r, 997);
  blob_store_close(bs);
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  TEST_DONE();
}
