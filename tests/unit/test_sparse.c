/* test_sparse.c — SparseLoCo's sparse delta codec (common/sparse.h): cfg checks, k per chunk,
 * stream sizes, a hand-worked chunk (selection, quantizer statistics, a half-to-even tie,
 * lookup table, bit packing, residual), ties to the lower index, all-zero chunks, random
 * fragments over every value_bits and several chunk sizes (short last chunks, tensors shorter
 * than a chunk, chunk 2 and 3) checked for top-k, residual e <- e - s bit for bit and
 * decode == s, non-finite input refused with nothing changed, every corrupt stream refused,
 * and the same stream whatever the thread count. Bit exactness against an independent
 * implementation is tests/oracle/sparse_oracle.py, which uses the modes below.
 * Modes:
 *   encode DENSITY CHUNK BITS TLENS_CSV   raw fp32 accumulator on stdin -> the stream, then the
 *                                         residual e, on stdout (exit 2 with the error on
 *                                         stderr if refused);
 *   --bench N CHUNK                       encode throughput on N floats (not a test). */
#include "common/errors.h"
#include "common/sparse.h"
#include "test.h"

#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* xorshift64*: reproducible test data. */
static uint64_t rng = 88172645463325252ull;
static uint32_t rand_u32(void) {
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  return (uint32_t)((rng * 2685821657736338717ull) >> 32);
}

/* Gaussian-ish values with heavy tails, exact zeros and repeated magnitudes (ties). */
static float rand_val(void) {
  uint32_t u = rand_u32();
  if ((u & 31) == 0) return 0.0f;
  if ((u & 31) == 1) return (u & 32) ? 0.5f : -0.5f;
  float m = (float)((u >> 8) & 0xffff) / 65536.0f + (float)((rand_u32() >> 8) & 0xffff) / 65536.0f - 1.0f;
  if ((u & 0xff) == 7) m *= 1000.0f;
  return m * 1e-3f;
}

/* Bits p..p+w-1 of a stream, LSB-first (the test's own reader). */
static uint32_t get_bits(const unsigned char *s, size_t p, unsigned w) {
  uint32_t v = 0;
  for (unsigned j = 0; j < w; j++) v |= (uint32_t)(s[(p + j) / 8] >> ((p + j) % 8) & 1u) << j;
  return v;
}

static void set_bits(unsigned char *s, size_t p, unsigned w, uint32_t v) {
  for (unsigned j = 0; j < w; j++) {
    unsigned char m = (unsigned char)(1u << ((p + j) % 8));
    s[(p + j) / 8] = (unsigned char)((v >> j & 1u) ? s[(p + j) / 8] | m : s[(p + j) / 8] & ~m);
  }
}

static unsigned ibits(uint32_t chunk) {
  unsigned ib = 0;
  while (((uint64_t)1 << ib) < chunk) ib++;
  return ib;
}

static size_t rec_bytes(const dpc_sparse_cfg *cfg, uint32_t len) {
  size_t k = dpc_sparse_chunk_k(cfg, len);
  return 4 * ((size_t)1 << cfg->value_bits) + (k * ibits(cfg->chunk) + 7) / 8 + (k * cfg->value_bits + 7) / 8;
}

/* encode mode: stdin raw fp32, stdout stream then residual. */
static int encode_stdin(int argc, char **argv) {
  if (argc != 6) return fprintf(stderr, "usage: test_sparse encode DENSITY CHUNK BITS TLENS_CSV\n"), 2;
  dpc_sparse_cfg cfg = {strtod(argv[2], NULL), (uint32_t)strtoul(argv[3], NULL, 10), (uint32_t)strtoul(argv[4], NULL, 10)};
  uint64_t tlen[256];
  int nt = 0;
  for (char *p = argv[5]; *p && nt < 256; nt++) {
    tlen[nt] = strtoull(p, &p, 10);
    if (*p == ',') p++;
  }
  size_t cap = 1 << 16, n = 0, got;
  float *x = malloc(cap * sizeof *x);
  while (x && (got = fread(x + n, sizeof *x, cap - n, stdin)) > 0)
    if ((n += got) == cap) x = realloc(x, (cap *= 2) * sizeof *x);
  size_t bytes = 0;
  uint64_t kept = 0, want = 0;
  for (int t = 0; t < nt; t++) want += tlen[t];
  unsigned char *enc = NULL;
  int rc = x ? dpc_sparse_bytes(&cfg, tlen, nt, &bytes, &kept) : DPC_ENOMEM;
  if (rc == 0 && want != n) rc = dpc_err(DPC_EINVAL, "%zu floats on stdin, tensors hold %llu", n, (unsigned long long)want);
  if (rc == 0 && !(enc = malloc(bytes + 1))) rc = DPC_ENOMEM;
  if (rc == 0) rc = dpc_sparse_encode(&cfg, tlen, nt, x, enc);
  if (rc == 0) rc = dpc_sparse_check(&cfg, tlen, nt, enc, bytes);
  if (rc == 0 && (fwrite(enc, 1, bytes, stdout) != bytes || fwrite(x, sizeof *x, n, stdout) != n)) rc = DPC_EIO;
  if (rc < 0) fprintf(stderr, "%s: %s\n", dpc_strerror(rc), dpc_errmsg());
  free(x), free(enc);
  return rc < 0 ? 2 : 0;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --bench: encode floats per second on one thread and on all, best of 5; density 0.02, 2 bits. */
static int bench(long n, uint32_t chunk) {
  dpc_sparse_cfg cfg = {0.02, chunk, 2};
  uint64_t tlen[1] = {(uint64_t)n};
  size_t bytes;
  if (dpc_sparse_bytes(&cfg, tlen, 1, &bytes, NULL) < 0) return fprintf(stderr, "%s\n", dpc_errmsg()), 2;
  float *x = malloc((size_t)n * sizeof *x), *e = malloc((size_t)n * sizeof *e);
  unsigned char *enc = malloc(bytes);
  if (!x || !e || !enc) return 2;
  for (long i = 0; i < n; i++) x[i] = rand_val();
  int threads[2] = {1, omp_get_max_threads()};
  for (int r = 0; r < 2; r++) {
    omp_set_num_threads(threads[r]);
    double best = 1e9, dt = 0;
    for (int it = 0; it < 5; it++) {
      memcpy(e, x, (size_t)n * sizeof *e);
      double t0 = now_s();
      if (dpc_sparse_encode(&cfg, tlen, 1, e, enc) < 0) return fprintf(stderr, "%s\n", dpc_errmsg()), 2;
      dt = now_s() - t0;
      best = dt < best ? dt : best;
    }
    printf("%ld floats, chunk %u, density 0.02, 2 bits, %d thread(s): encode %.1f ms, %.3g floats/s (%zu bytes)\n", n,
           chunk, threads[r], 1e3 * best, (double)n / best, bytes);
  }
  free(x), free(e), free(enc);
  return 0;
}

static void cfg_and_sizes(void) {
  dpc_sparse_cfg c = {0.02, 4096, 2};
  CHECK_EQ_INT(dpc_sparse_cfg_check(&c), 0);
  const dpc_sparse_cfg bad[] = {{0.0, 4096, 2}, {-0.5, 4096, 2}, {1.0000001, 4096, 2}, {NAN, 4096, 2}, {0.1, 1, 2},
                                {0.1, 65537, 2}, {0.1, 4096, 0}, {0.1, 4096, 9}};
  const char *field[] = {"density", "density", "density", "density", "chunk", "chunk", "value_bits", "value_bits"};
  for (int i = 0; i < 8; i++) {
    CHECK_EQ_INT(dpc_sparse_cfg_check(&bad[i]), DPC_EINVAL);
    CHECK(strstr(dpc_errmsg(), field[i]) != NULL);
  }
  CHECK_EQ_INT(dpc_sparse_cfg_check(NULL), DPC_EINVAL);
  dpc_sparse_cfg edge[] = {{1.0, 2, 1}, {1e-300, 65536, 8}};
  CHECK_EQ_INT(dpc_sparse_cfg_check(&edge[0]), 0);
  CHECK_EQ_INT(dpc_sparse_cfg_check(&edge[1]), 0);

  /* k = ceil(density * len) in double, at least 1, at most len; 0 for len 0. */
  CHECK_EQ_INT(dpc_sparse_chunk_k(&c, 4096), 82); /* 81.92 */
  CHECK_EQ_INT(dpc_sparse_chunk_k(&c, 0), 0);
  CHECK_EQ_INT(dpc_sparse_chunk_k(&c, 1), 1);
  CHECK_EQ_INT(dpc_sparse_chunk_k(&c, 50), 1);  /* exactly 1.0 */
  CHECK_EQ_INT(dpc_sparse_chunk_k(&c, 51), 2);  /* 1.02 */
  CHECK_EQ_INT(dpc_sparse_chunk_k(&edge[1], 65536), 1);
  CHECK_EQ_INT(dpc_sparse_chunk_k(&edge[0], 2), 2);
  dpc_sparse_cfg h = {0.5, 8, 2};
  CHECK_EQ_INT(dpc_sparse_chunk_k(&h, 3), 2);
  CHECK_EQ_INT(dpc_sparse_chunk_k(&h, 8), 4);
  /* The product is rounded in double before the ceiling: 0.07 * 100 is 7.000000000000001. */
  dpc_sparse_cfg t = {0.07, 128, 2};
  CHECK_EQ_INT(dpc_sparse_chunk_k(&t, 100), 8);
  dpc_sparse_cfg t2 = {0.1, 64, 2};
  CHECK_EQ_INT(dpc_sparse_chunk_k(&t2, 30), 3);
  CHECK_EQ_INT(dpc_sparse_chunk_k(&t2, 10), 1);

  /* Sizes: a 4096 chunk at density 0.02 and 2 bits is 16 + 123 + 21 bytes. */
  size_t bytes = 0;
  uint64_t kept = 0;
  uint64_t one[1] = {4096};
  CHECK_EQ_INT(dpc_sparse_bytes(&c, one, 1, &bytes, &kept), 0);
  CHECK_EQ_INT(bytes, 160);
  CHECK_EQ_INT(kept, 82);
  uint64_t two[2] = {4096 * 3 + 100, 10};
  CHECK_EQ_INT(dpc_sparse_bytes(&c, two, 2, &bytes, &kept), 0);
  /* 100 -> k 2: 16 + 3 + 1; 10 -> k 1: 16 + 2 + 1. */
  CHECK_EQ_INT(bytes, 3 * 160 + 20 + 19);
  CHECK_EQ_INT(kept, 3 * 82 + 2 + 1);
  dpc_sparse_cfg half = {0.5, 4096, 2};
  uint64_t tl[2] = {4096, 10};
  CHECK_EQ_INT(dpc_sparse_bytes(&half, tl, 2, &bytes, &kept), 0);
  CHECK_EQ_INT(bytes, (16 + 3072 + 512) + (16 + 8 + 2));
  CHECK_EQ_INT(kept, 2048 + 5);
  dpc_sparse_cfg c2 = {1.0, 2, 8};
  uint64_t t3[3] = {1, 2, 5}; /* chunk 2: 1 index bit; 8-bit codes; records of 1 and 2 values */
  CHECK_EQ_INT(dpc_sparse_bytes(&c2, t3, 3, &bytes, &kept), 0);
  CHECK_EQ_INT(bytes, (1024 + 1 + 1) + (1024 + 1 + 2) + 2 * (1024 + 1 + 2) + (1024 + 1 + 1));
  CHECK_EQ_INT(kept, 8);
  CHECK_EQ_INT(dpc_sparse_bytes(&c2, t3, 3, &bytes, NULL), 0);
  dpc_sparse_cfg c3 = {1.0, 3, 1};
  uint64_t t4[1] = {3}; /* chunk 3: 2 index bits */
  CHECK_EQ_INT(dpc_sparse_bytes(&c3, t4, 1, &bytes, &kept), 0);
  CHECK_EQ_INT(bytes, 8 + 1 + 1);
  dpc_sparse_cfg c64 = {1.0, 65536, 1};
  uint64_t t5[1] = {65536}; /* 16 index bits */
  CHECK_EQ_INT(dpc_sparse_bytes(&c64, t5, 1, &bytes, &kept), 0);
  CHECK_EQ_INT(bytes, 8 + 2 * 65536 + 65536 / 8);
  /* Refused: no tensors, an empty tensor, a bad cfg, a size that overflows. */
  CHECK_EQ_INT(dpc_sparse_bytes(&c, one, 0, &bytes, &kept), DPC_EINVAL);
  uint64_t z[2] = {5, 0};
  CHECK_EQ_INT(dpc_sparse_bytes(&c, z, 2, &bytes, &kept), DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "tensor 1") != NULL);
  CHECK_EQ_INT(dpc_sparse_bytes(&bad[4], one, 1, &bytes, &kept), DPC_EINVAL);
  CHECK_EQ_INT(dpc_sparse_bytes(&c, NULL, 1, &bytes, &kept), DPC_EINVAL);
  uint64_t huge[2] = {UINT64_MAX, UINT64_MAX / 2};
  CHECK_EQ_INT(dpc_sparse_bytes(&c2, huge, 1, &bytes, &kept), DPC_ERANGE);
  CHECK_EQ_INT(dpc_sparse_bytes(&c, huge, 2, &bytes, &kept), DPC_ERANGE);
}

/* A chunk worked by hand: 5 of 8 kept, mu -7, sigma 4, scale 6 at 2 bits; -4 lands on the
 * tie 2.5 and goes to code 2 (half to even). */
static void hand_chunk(void) {
  dpc_sparse_cfg cfg = {0.625, 8, 2};
  uint64_t tl[1] = {8};
  float e[8] = {-9.0f, 0.0f, -12.0f, -2.0f, 0.0f, -4.0f, -8.0f, 0.5f};
  size_t bytes;
  CHECK_EQ_INT(dpc_sparse_bytes(&cfg, tl, 1, &bytes, NULL), 0);
  CHECK_EQ_INT(bytes, 16 + 2 + 2);
  unsigned char s[21];
  memset(s, 0xa5, sizeof s);
  CHECK_EQ_INT(dpc_sparse_encode(&cfg, tl, 1, e, s), 0);
  CHECK_EQ_INT(s[20], 0xa5);
  const float table[4] = {0.0f, -12.0f, -7.0f, -2.0f};
  for (int c = 0; c < 4; c++) CHECK_EQ_INT(s[4 * c] | s[4 * c + 1] << 8 | s[4 * c + 2] << 16 | (uint32_t)s[4 * c + 3] << 24, fbits(table[c]));
  const uint32_t idx[5] = {0, 2, 3, 5, 6}, code[5] = {2, 1, 3, 2, 2};
  for (int j = 0; j < 5; j++) {
    CHECK_EQ_INT(get_bits(s + 16, 3 * (size_t)j, 3), idx[j]);
    CHECK_EQ_INT(get_bits(s + 18, 2 * (size_t)j, 2), code[j]);
  }
  CHECK_EQ_INT(s[17] >> 7, 0);  /* 15 index bits: one pad bit */
  CHECK_EQ_INT(s[19] >> 2, 0);  /* 10 code bits: six pad bits */
  const float resid[8] = {-2.0f, 0.0f, 0.0f, 0.0f, 0.0f, 3.0f, -1.0f, 0.5f};
  CHECK(memcmp(e, resid, sizeof e) == 0);
  float y[8];
  CHECK_EQ_INT(dpc_sparse_decode(&cfg, tl, 1, s, bytes, y), 0);
  const float want[8] = {-7.0f, 0.0f, -12.0f, -2.0f, 0.0f, -7.0f, -7.0f, 0.0f};
  CHECK(memcmp(y, want, sizeof y) == 0);

  /* Hand example 2 at 2 bits: {-4, -1, 1, 4}: mu 0, sigma sqrt(34/3), codes 1 2 2 3. */
  dpc_sparse_cfg c4 = {1.0, 4, 2};
  uint64_t t4[1] = {4};
  float e4[4] = {-4.0f, -1.0f, 1.0f, 4.0f};
  unsigned char s4[16 + 1 + 1];
  CHECK_EQ_INT(dpc_sparse_encode(&c4, t4, 1, e4, s4), 0);
  CHECK_EQ_INT(s4[16], 0 | 1 << 2 | 2 << 4 | 3 << 6); /* indices 0 1 2 3, 2 bits each */
  CHECK_EQ_INT(s4[17], 1 | 2 << 2 | 2 << 4 | 3 << 6);
  CHECK(e4[0] == 0.0f && e4[1] == -1.0f && e4[2] == 1.0f && e4[3] == 0.0f);
  /* k = 1: sigma 0, scale 1, code nb / 2 holding the value itself. */
  dpc_sparse_cfg c1 = {0.1, 8, 3};
  uint64_t t1[1] = {8};
  float e1[8] = {0, 0, 0, 0, 0.25f, -0.25f, 0, 0};
  unsigned char s1[32 + 1 + 1];
  CHECK_EQ_INT(dpc_sparse_encode(&c1, t1, 1, e1, s1), 0);
  CHECK_EQ_INT(s1[32], 4); /* the tie |0.25| = |-0.25|: the lower index 4 */
  CHECK_EQ_INT(s1[33], 4); /* code nb / 2 */
  CHECK_EQ_INT(s1[16] | s1[17] << 8 | s1[18] << 16 | (uint32_t)s1[19] << 24, fbits(0.25f));
  CHECK(e1[4] == 0.0f && e1[5] == -0.25f);
}

/* Ties go to the lower index; exact zeros keep the lowest indices with code nb / 2 and +0. */
static void ties_and_zeros(void) {
  dpc_sparse_cfg cfg = {0.25, 8, 2};
  uint64_t tl[1] = {8};
  float e[8] = {1.0f, -3.0f, 3.0f, 2.0f, -3.0f, 0.0f, 3.0f, 1.0f};
  unsigned char s[16 + 1 + 1];
  CHECK_EQ_INT(dpc_sparse_encode(&cfg, tl, 1, e, s), 0);
  CHECK_EQ_INT(get_bits(s + 16, 0, 3), 1);
  CHECK_EQ_INT(get_bits(s + 16, 3, 3), 2);
  CHECK(e[4] == -3.0f && e[6] == 3.0f);

  for (unsigned b = 1; b <= 8; b++) {
    dpc_sparse_cfg zc = {0.5, 8, b};
    float zero[8] = {0.0f, -0.0f, 0.0f, -0.0f, 0.0f, -0.0f, 0.0f, 0.0f}, z0[8];
    memcpy(z0, zero, sizeof z0);
    size_t bytes;
    dpc_sparse_bytes(&zc, tl, 1, &bytes, NULL);
    unsigned char zs[1024 + 2 + 4];
    memset(zs, 0xa5, sizeof zs);
    CHECK_EQ_INT(dpc_sparse_encode(&zc, tl, 1, zero, zs), 0);
    unsigned nb = 1u << b;
    int ok = 1;
    for (size_t i = 0; i < 4 * nb; i++) ok &= zs[i] == 0; /* table all +0 (mean of zeros is +0) */
    for (unsigned j = 0; j < 4; j++) {
      ok &= get_bits(zs + 4 * nb, 3 * j, 3) == j;                                   /* lowest indices */
      ok &= get_bits(zs + 4 * nb + 2, b * j, b) == nb / 2;           /* codes nb / 2 */
    }
    CHECK(ok);
    CHECK(memcmp(zero, z0, sizeof z0) == 0); /* -0 - +0 stays -0 */
    float y[8];
    CHECK_EQ_INT(dpc_sparse_decode(&zc, tl, 1, zs, bytes, y), 0);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(fbits(y[i]), 0);
  }
}

/* Indices of chunk record rec (L values, k kept) read with the test's own bit reader. */
static void rec_indices(const dpc_sparse_cfg *cfg, const unsigned char *rec, uint32_t k, uint32_t *idx) {
  unsigned ib = ibits(cfg->chunk);
  for (uint32_t j = 0; j < k; j++) idx[j] = get_bits(rec + 4 * ((size_t)1 << cfg->value_bits), (size_t)j * ib, ib);
}

/* Random fragments: per chunk the kept set is the top k with ties low, e_after = e - y in fp32
 * everywhere (y = 0 off the kept set), the stream checks and decodes to s. */
static void random_fragments(void) {
  const uint32_t chunks[] = {2, 3, 7, 64, 1000, 4096};
  const double dens[] = {0.01, 0.1, 0.3, 0.5, 1.0};
  enum { MAXN = 20000 };
  static float e[MAXN], e0[MAXN], y[MAXN];
  static uint32_t idx[65536];
  long bad = 0, runs = 0;
  for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++)
    for (unsigned b = 1; b <= 8; b++) {
      dpc_sparse_cfg cfg = {dens[(ci + b) % 5], chunks[ci], b};
      uint64_t tl[4] = {chunks[ci] * 2 + 1, 1, chunks[ci] > 3 ? chunks[ci] / 2 : 2, 3 * chunks[ci]};
      int nt = 4;
      size_t n = 0, bytes;
      uint64_t kept;
      for (int t = 0; t < nt; t++) n += tl[t];
      if (n > MAXN) tl[3] = 5, n = tl[0] + tl[1] + tl[2] + tl[3];
      for (size_t i = 0; i < n; i++) e[i] = e0[i] = rand_val();
      CHECK_EQ_INT(dpc_sparse_bytes(&cfg, tl, nt, &bytes, &kept), 0);
      unsigned char *s = malloc(bytes + 1);
      s[bytes] = 0x5a;
      CHECK_EQ_INT(dpc_sparse_encode(&cfg, tl, nt, e, s), 0);
      CHECK_EQ_INT(s[bytes], 0x5a);
      CHECK_EQ_INT(dpc_sparse_check(&cfg, tl, nt, s, bytes), 0);
      CHECK_EQ_INT(dpc_sparse_decode(&cfg, tl, nt, s, bytes, y), 0);
      uint64_t nz = 0;
      for (size_t i = 0; i < n; i++) {
        nz += y[i] != 0.0f;
        if (fbits(e[i]) != fbits(e0[i] - y[i])) bad++;
      }
      CHECK(nz <= kept);
      /* Top-k per chunk from the stream's own indices. */
      const unsigned char *rec = s;
      size_t v0 = 0;
      for (int t = 0; t < nt; v0 += tl[t], t++)
        for (uint64_t c0 = 0; c0 < tl[t]; c0 += cfg.chunk) {
          uint32_t L = (uint32_t)(tl[t] - c0 < cfg.chunk ? tl[t] - c0 : cfg.chunk), k = dpc_sparse_chunk_k(&cfg, L);
          rec_indices(&cfg, rec, k, idx);
          const float *x = e0 + v0 + c0;
          static unsigned char keep[65536];
          memset(keep, 0, L);
          for (uint32_t j = 0; j < k; j++) {
            if (idx[j] >= L || (j && idx[j] <= idx[j - 1])) bad++;
            else keep[idx[j]] = 1;
          }
          /* every kept |x| >= every dropped |x|, and a dropped one equal to a kept one has a
           * higher index */
          for (uint32_t i = 0; i < L; i++)
            if (!keep[i])
              for (uint32_t j = 0; j < k; j++) {
                float a = fabsf(x[idx[j]]), d = fabsf(x[i]);
                if (a < d || (a == d && idx[j] > i)) bad++;
              }
          rec += rec_bytes(&cfg, L);
        }
      CHECK_EQ_INT(rec - s, bytes);
      if (bad) fprintf(stderr, "chunk %u bits %u density %g: %ld bad\n", cfg.chunk, b, cfg.density, bad), bad = 0, test_failures++;
      runs++;
      free(s);
    }
  CHECK(runs == 48);
}

static void nonfinite(void) {
  dpc_sparse_cfg cfg = {0.1, 64, 2};
  uint64_t tl[2] = {100, 50};
  float e[150], e0[150];
  for (int i = 0; i < 150; i++) e[i] = rand_val();
  const float nf[3] = {NAN, INFINITY, -INFINITY};
  for (int k = 0; k < 3; k++) {
    e[123] = nf[k];
    memcpy(e0, e, sizeof e);
    unsigned char s[1024];
    memset(s, 0xa5, sizeof s);
    CHECK_EQ_INT(dpc_sparse_encode(&cfg, tl, 2, e, s), DPC_ENUMERIC);
    CHECK(strstr(dpc_errmsg(), "value 123 ") != NULL);
    CHECK(memcmp(e, e0, sizeof e) == 0);
    int untouched = 1;
    for (size_t i = 0; i < sizeof s; i++) untouched &= s[i] == 0xa5;
    CHECK(untouched);
  }
  e[123] = FLT_MAX, e[3] = -FLT_MAX; /* finite extremes encode */
  size_t bytes;
  dpc_sparse_bytes(&cfg, tl, 2, &bytes, NULL);
  unsigned char s[1024];
  CHECK_EQ_INT(dpc_sparse_encode(&cfg, tl, 2, e, s), 0);
  CHECK_EQ_INT(dpc_sparse_check(&cfg, tl, 2, s, bytes), 0);
}

/* Every rule of decode, on a crafted stream: two tensors, chunk 8, the second tensor 13 values
 * (a short last chunk of 5 keeping 3), 2 bits. */
static void corrupt(void) {
  dpc_sparse_cfg cfg = {0.5, 8, 2};
  uint64_t tl[2] = {8, 13};
  float e[21];
  for (int i = 0; i < 21; i++) e[i] = (float)((i * 7) % 11) - 5.0f;
  size_t bytes;
  CHECK_EQ_INT(dpc_sparse_bytes(&cfg, tl, 2, &bytes, NULL), 0);
  /* records: 8 -> k 4: 16 + 2 + 1 (twice); 5 -> k 3: 16 + 2 + 1 */
  CHECK_EQ_INT(bytes, 3 * 19);
  unsigned char s[80], t[80];
  float y[21];
  CHECK_EQ_INT(dpc_sparse_encode(&cfg, tl, 2, e, s), 0);
  CHECK_EQ_INT(dpc_sparse_decode(&cfg, tl, 2, s, bytes, y), 0);
  const size_t r2 = 2 * 19; /* tensor 1 chunk 1: the short one */
#define RESET() memcpy(t, s, sizeof s)
#define REFUSED(code, text)                                                      \
  do {                                                                           \
    CHECK_EQ_INT(dpc_sparse_check(&cfg, tl, 2, t, bytes), code);                 \
    CHECK_EQ_INT(dpc_sparse_decode(&cfg, tl, 2, t, bytes, y), code);             \
    if (!strstr(dpc_errmsg(), text)) fprintf(stderr, "message: %s\n", dpc_errmsg()); \
    CHECK(strstr(dpc_errmsg(), text) != NULL);                                   \
  } while (0)
  RESET();
  CHECK_EQ_INT(dpc_sparse_check(&cfg, tl, 2, t, bytes - 1), DPC_EFORMAT);
  CHECK_EQ_INT(dpc_sparse_decode(&cfg, tl, 2, t, bytes + 1, y), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "58 bytes, expected 57") != NULL);
  /* Table: non-finite (ENUMERIC); non-zero or -0 for an unused code (EFORMAT). */
  unsigned used = 0;
  for (unsigned j = 0; j < 3; j++) used |= 1u << get_bits(s + r2 + 18, 2 * j, 2);
  unsigned unused = 0;
  while (used >> unused & 1u) unused++;
  CHECK(unused < 4);
  const uint32_t nanb = 0x7fc00000u, infb = 0xff800000u;
  RESET();
  memcpy(t + r2 + 4 * unused, &nanb, 4);
  REFUSED(DPC_ENUMERIC, "tensor 1 chunk 1: table[");
  RESET();
  memcpy(t + 4, &infb, 4);
  REFUSED(DPC_ENUMERIC, "tensor 0 chunk 0: table[1]");
  RESET();
  t[r2 + 4 * unused] = 1;
  REFUSED(DPC_EFORMAT, "tensor 1 chunk 1: table[");
  CHECK(strstr(dpc_errmsg(), "no index uses") != NULL);
  RESET();
  t[r2 + 4 * unused + 3] = 0x80; /* -0 */
  REFUSED(DPC_EFORMAT, "no index uses");
  /* Indices: repeated, decreasing, past the short chunk's 5 values; padding bits. */
  RESET();
  set_bits(t + r2 + 16, 3, 3, get_bits(t + r2 + 16, 0, 3));
  REFUSED(DPC_EFORMAT, "tensor 1 chunk 1: index");
  CHECK(strstr(dpc_errmsg(), "indices must increase") != NULL);
  RESET();
  set_bits(t + 19 + 16, 6, 3, 0); /* tensor 1 chunk 0, third index 0 */
  REFUSED(DPC_EFORMAT, "tensor 1 chunk 0: index 0 follows");
  RESET();
  set_bits(t + r2 + 16, 6, 3, 5);
  REFUSED(DPC_EFORMAT, "tensor 1 chunk 1: index 5");
  CHECK(strstr(dpc_errmsg(), "past the chunk's 5 values") != NULL);
  RESET();
  set_bits(t + r2 + 16, 6, 3, 7);
  REFUSED(DPC_EFORMAT, "index 7");
  RESET();
  set_bits(t + r2 + 16, 9, 1, 1); /* 9 index bits in 2 bytes */
  REFUSED(DPC_EFORMAT, "tensor 1 chunk 1: index padding");
  RESET();
  set_bits(t + 16, 15, 1, 1); /* tensor 0: 12 index bits, the top bit of byte 1 */
  REFUSED(DPC_EFORMAT, "tensor 0 chunk 0: index padding");
  RESET();
  set_bits(t + r2 + 18, 6, 1, 1); /* 6 code bits */
  REFUSED(DPC_EFORMAT, "tensor 1 chunk 1: code padding");
  /* The untouched stream still decodes; the same length with another layout is refused. */
  RESET();
  CHECK_EQ_INT(dpc_sparse_check(&cfg, tl, 2, t, bytes), 0);
  uint64_t other[2] = {13, 8};
  CHECK_EQ_INT(dpc_sparse_check(&cfg, other, 2, t, bytes), DPC_EFORMAT);
  CHECK_EQ_INT(dpc_sparse_decode(&cfg, tl, 2, t, bytes, NULL), DPC_EINVAL);
  /* A used -0 or a used subnormal is a valid value. */
  RESET();
  for (unsigned c = 0; c < 4; c++)
    if (used >> c & 1u) t[r2 + 4 * c] = 1, t[r2 + 4 * c + 1] = 0, t[r2 + 4 * c + 2] = 0, t[r2 + 4 * c + 3] = 0x80;
  CHECK_EQ_INT(dpc_sparse_decode(&cfg, tl, 2, t, bytes, y), 0);
#undef RESET
#undef REFUSED
}

/* The stream and the residual do not depend on the thread count. */
static void threads(void) {
  enum { N = 300000 };
  static float x[N], e1[N], e4[N];
  for (size_t i = 0; i < N; i++) x[i] = rand_val();
  dpc_sparse_cfg cfg = {0.02, 1024, 3};
  uint64_t tl[3] = {100000, 77, N - 100077};
  size_t bytes;
  CHECK_EQ_INT(dpc_sparse_bytes(&cfg, tl, 3, &bytes, NULL), 0);
  unsigned char *s1 = malloc(bytes), *s4 = malloc(bytes);
  memcpy(e1, x, sizeof x), memcpy(e4, x, sizeof x);
  int save = omp_get_max_threads();
  omp_set_num_threads(1);
  CHECK_EQ_INT(dpc_sparse_encode(&cfg, tl, 3, e1, s1), 0);
  omp_set_num_threads(4);
  CHECK_EQ_INT(dpc_sparse_encode(&cfg, tl, 3, e4, s4), 0);
  omp_set_num_threads(save);
  CHECK(memcmp(s1, s4, bytes) == 0);
  CHECK(memcmp(e1, e4, sizeof e1) == 0);
  free(s1), free(s4);
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "encode") == 0) return encode_stdin(argc, argv);
  if (argc == 4 && strcmp(argv[1], "--bench") == 0) return bench(atol(argv[2]), (uint32_t)strtoul(argv[3], NULL, 10));
  cfg_and_sizes();
  hand_chunk();
  ties_and_zeros();
  random_fragments();
  nonfinite();
  corrupt();
  threads();
  TEST_DONE();
}
