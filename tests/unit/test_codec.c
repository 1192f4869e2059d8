/* test_codec.c — the wire codecs (common/codec.h): bf16 rounding at exact ties and above,
 * fp32 round trips bit for bit (signed zero, subnormals), non-finite values refused before
 * encoding, stream sizes and header checks for every codec; the block codecs (int8, fp8 e4m3,
 * e3m0): rounding at hand-picked ties, per-block error bounds on random data, exact zeros,
 * signs, each block's largest value, short last blocks, odd e3m0 counts, and every corrupt
 * stream refused (length, scale, codes, pad nibble).
 * Modes for the oracle (tests/oracle/codec_oracle.py):
 *   --dump N SEED          N random floats and their bf16 codes, one "xxxxxxxx hhhh" a line;
 *   --encode CODEC BLOCK   raw fp32 values on stdin -> the encoded stream, then the decoded fp32
 *                          values, on stdout (exit 2 with the error on stderr if refused);
 *   --bench N              encode/decode throughput of N floats per block codec (not a test). */
#include "common/codec.h"
#include "common/errors.h"
#include "test.h"

#include <float.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t bf16_of(float x) {
  unsigned char b[2];
  if (dpc_codec_encode(DPC_CODEC_BF16, &x, 1, 0, b) < 0) return 0xffff;
  return (uint16_t)(b[0] | b[1] << 8);
}

/* xorshift64*: reproducible floats over many binades, both signs, some subnormals. */
static uint64_t rng = 88172645463325252ull;
static float rand_float(void) {
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  uint32_t u = (uint32_t)((rng * 2685821657736338717ull) >> 32);
  uint32_t exp = 64 + (u >> 24) % 128; /* 2^-63 .. 2^64, far from overflow */
  if ((u & 0xff) == 7) exp = 0;        /* subnormal */
  return from_bits((u & 0x80000000u) | exp << 23 | (u & 0x7fffffu));
}

static int dump(long n, unsigned long long seed) {
  rng = seed ? seed : rng;
  for (long i = 0; i < n; i++) {
    float x = rand_float();
    uint32_t u;
    memcpy(&u, &x, 4);
    printf("%08x %04x\n", u, bf16_of(x));
  }
  return 0;
}

/* --encode: stdin is raw fp32; stdout gets the stream, then the decoded values. */
static int encode_stdin(const char *name, uint32_t block) {
  dpc_codec codec;
  if (dpc_codec_parse(name, &codec) < 0) return fprintf(stderr, "%s\n", dpc_errmsg()), 2;
  size_t cap = 1 << 16, n = 0, got;
  float *x = malloc(cap * sizeof *x);
  while (x && (got = fread(x + n, sizeof *x, cap - n, stdin)) > 0)
    if ((n += got) == cap) x = realloc(x, (cap *= 2) * sizeof *x);
  size_t bytes = 0;
  unsigned char *enc = NULL;
  float *y = NULL;
  int rc = x ? dpc_codec_bytes(codec, n, block, &bytes) : DPC_ENOMEM;
  if (rc == 0) enc = malloc(bytes + 1), y = malloc((n + 1) * sizeof *y);
  if (rc == 0 && (!enc || !y)) rc = DPC_ENOMEM;
  if (rc == 0) rc = dpc_codec_encode(codec, x, n, block, enc);
  if (rc == 0) rc = dpc_codec_decode(codec, enc, bytes, n, block, y);
  if (rc == 0 && (fwrite(enc, 1, bytes, stdout) != bytes || fwrite(y, sizeof *y, n, stdout) != n)) rc = DPC_EIO;
  if (rc < 0) fprintf(stderr, "%s: %s\n", dpc_strerror(rc), dpc_errmsg());
  free(x), free(enc), free(y);
  return rc < 0 ? 2 : 0;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --bench: MB/s of fp32 input (encode) and fp32 output (decode), best of 3. */
static int bench(long n) {
  float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
  unsigned char *enc = malloc((size_t)n * 4);
  if (!x || !y || !enc) return 2;
  for (long i = 0; i < n; i++) x[i] = ldexpf(rand_float(), -(int)((i >> 8) % 60)) * 0x1p-40f;
  for (int c = DPC_CODEC_FP32; c < DPC_CODEC_COUNT; c++) {
    size_t bytes;
    dpc_codec_bytes(c, (uint64_t)n, DPC_CODEC_BLOCK_DEFAULT, &bytes);
    double te = 1e9, td = 1e9;
    for (int r = 0; r < 3; r++) {
      double t0 = now_s();
      if (dpc_codec_encode(c, x, (size_t)n, DPC_CODEC_BLOCK_DEFAULT, enc) < 0) return fprintf(stderr, "%s\n", dpc_errmsg()), 2;
      double t1 = now_s();
      if (dpc_codec_decode(c, enc, bytes, (size_t)n, DPC_CODEC_BLOCK_DEFAULT, y) < 0) return fprintf(stderr, "%s\n", dpc_errmsg()), 2;
      double t2 = now_s();
      te = t1 - t0 < te ? t1 - t0 : te, td = t2 - t1 < td ? t2 - t1 : td;
    }
    printf("%-4s %ld floats, %zu bytes: encode %.0f MB/s, decode %.0f MB/s (of fp32)\n", dpc_codec_name(c), n, bytes,
           4e-6 * (double)n / te, 4e-6 * (double)n / td);
  }
  free(x), free(y), free(enc);
  return 0;
}

/* Values that look like a delta: blocks of very different magnitudes, values inside a block
 * spread over a few binades, some exact zeros. */
static float rand_delta(size_t i) {
  float u = rand_float();
  uint32_t b;
  memcpy(&b, &u, 4);
  if ((b & 0x3f) == 5) return 0.0f;
  float m = from_bits(0x3f800000u | (b & 0x7fffffu)) - 1.0f; /* [0, 1) */
  int block_exp = (int)((i / 256 * 2654435761u) % 80) - 60;   /* one magnitude per 256 values */
  return ((b >> 31) ? -m : m) * ldexpf(1.0f, block_exp - (int)(b >> 23 & 7));
}

static float ulp_of(float a) { return nextafterf(a, INFINITY) - a; }

/* Per-block checks of a decoded block codec stream against its input: the bounds of
 * common/codec.h, +0 for zeros, signs kept, each block's largest |x| decoding to +-amax
 * (int8, fp8: within 1 ulp, the scale being amax / 127 or / 448 rounded; e3m0: exactly).
 * Counts the values outside the bounds (0 expected) and, in *near, the blocks whose largest
 * value is within 1 ulp but not exact. */
static long check_bounds(int codec, const float *x, const float *y, const unsigned char *enc, size_t n, uint32_t bf,
                         long *near) {
  long bad = 0;
  for (size_t i = 0; i < n; i += bf) {
    size_t k = n - i < bf ? n - i : bf;
    uint32_t sb = (uint32_t)enc[0] | (uint32_t)enc[1] << 8 | (uint32_t)enc[2] << 16 | (uint32_t)enc[3] << 24;
    float s = from_bits(sb), amax = 0.0f;
    size_t top = i;
    for (size_t j = i; j < i + k; j++)
      if (fabsf(x[j]) > amax) amax = fabsf(x[j]), top = j;
    if (amax > 0.0f) {
      float want = codec == DPC_CODEC_INT8 ? amax / 127.0f : codec == DPC_CODEC_FP8_E4M3 ? amax / 448.0f : amax;
      if (s != want) bad++;
      if (codec == DPC_CODEC_E3M0 ? fabsf(y[top]) != amax : fabsf(fabsf(y[top]) - amax) > ulp_of(amax)) bad++;
      if (near && fabsf(y[top]) != amax) ++*near;
      if ((y[top] < 0) != (x[top] < 0)) bad++;
    } else if (sb != 0) {
      bad++;
    }
    for (size_t j = i; j < i + k; j++) {
      double ax = fabs((double)x[j]), err = fabs((double)x[j] - (double)y[j]), bound;
      if (codec == DPC_CODEC_INT8) {
        bound = 0.5 * s + 0x1p-22 * amax;
      } else if (codec == DPC_CODEC_FP8_E4M3) {
        bound = ax >= 0x1p-6 * (double)s ? (0x1p-4 + 0x1p-20) * ax : 0x1p-10 * (double)s + 0x1p-22 * ax;
      } else {
        /* y must be +-2^(e-7) * s or 0, and x within the half gap to the next level on its side. */
        double t = s > 0 ? fabs((double)y[j]) / s : 0.0, u = s > 0 ? ax / s : 0.0;
        int e = t == 0.0 ? 0 : (int)lround(log2(t)) + 7;
        if (t != 0.0 && (e < 1 || e > 7 || t != ldexp(1.0, e - 7))) bad++;
        double lo = e == 0 ? 0.0 : e == 1 ? 0x1p-7 : 0.75 * ldexp(1.0, e - 7);
        double hi = e == 0 ? 0x1p-7 : e == 7 ? 1.0 : 1.5 * ldexp(1.0, e - 7);
        double slack = 0x1p-22 * u;
        if (u < lo - slack || (e < 7 ? u > hi + slack : u > hi)) bad++;
        bound = ax; /* covered above */
      }
      if (err > bound) bad++;
      if (y[j] == 0.0f && signbit(y[j])) bad++;    /* never -0 */
      if (y[j] != 0.0f && (y[j] < 0) != (x[j] < 0)) bad++; /* sign kept */
      if (x[j] == 0.0f && y[j] != 0.0f) bad++;
    }
    enc += 4 + (codec == DPC_CODEC_E3M0 ? (k + 1) / 2 : k);
  }
  return bad;
}

/* Encode one block of probes whose amax makes the scale exactly 1 and return code i. */
static unsigned probe(int codec, float amax, float v) {
  float x[2] = {amax, v};
  unsigned char b[8];
  if (dpc_codec_encode(codec, x, 2, 2, b) < 0) return 0xfff;
  return codec == DPC_CODEC_E3M0 ? b[4] >> 4 : b[5];
}

static void put_scale(unsigned char *p, float s) {
  uint32_t u;
  memcpy(&u, &s, 4);
  p[0] = (unsigned char)u, p[1] = (unsigned char)(u >> 8), p[2] = (unsigned char)(u >> 16), p[3] = (unsigned char)(u >> 24);
}

static void block_codecs(void) {
  /* int8, scale 127 / 127 = 1: codes are x rounded half to even, never -128. */
  CHECK_EQ_INT(probe(DPC_CODEC_INT8, 127.0f, 2.5f), 2);
  CHECK_EQ_INT(probe(DPC_CODEC_INT8, 127.0f, 3.5f), 4);
  CHECK_EQ_INT(probe(DPC_CODEC_INT8, 127.0f, -2.5f), 0xfe);
  CHECK_EQ_INT(probe(DPC_CODEC_INT8, 127.0f, 126.5f), 126);
  CHECK_EQ_INT(probe(DPC_CODEC_INT8, 127.0f, -0.5f), 0);
  CHECK_EQ_INT(probe(DPC_CODEC_INT8, -127.0f, -127.0f), 0x81);
  CHECK_EQ_INT(probe(DPC_CODEC_INT8, 127.0f, -0.0f), 0);
  /* fp8 e4m3fn, scale 448 / 448 = 1: ties to even mantissa, subnormals, no -0. */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 448.0f), 0x7e);
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 1.0f), 0x38);
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 1.0625f), 0x38); /* tie 1 | 1.125: even 1 */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 1.1875f), 0x3a); /* tie 1.125 | 1.25: even 1.25 */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 1.9375f), 0x40); /* tie 1.875 | 2: carry into the exponent */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, -1.0f), 0xb8);
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 0x1p-9f), 0x01);
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 0x1p-10f), 0x00);  /* tie 0 | 2^-9: even 0 */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 0x3p-10f), 0x02);  /* tie 1 | 2 * 2^-9: even 2 */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 0xfp-10f), 0x08);  /* tie 7 | 8 * 2^-9 = 2^-6 */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 0x1.1p-6f), 0x08); /* tie 2^-6 | 1.125 * 2^-6: even */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 0x1.3p-6f), 0x0a); /* tie 1.125 | 1.25 (* 2^-6): even */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, -0x1p-11f), 0x00); /* rounds to 0: no sign */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 432.0f), 0x7e);    /* tie 416 | 448: even 448 */
  CHECK_EQ_INT(probe(DPC_CODEC_FP8_E4M3, 448.0f, 431.0f), 0x7d);
  /* e3m0, scale 1: nearest level, a midpoint to the larger one. */
  CHECK_EQ_INT(probe(DPC_CODEC_E3M0, 1.0f, 0.75f), 7);
  CHECK_EQ_INT(probe(DPC_CODEC_E3M0, 1.0f, nextafterf(0.75f, 0.0f)), 6);
  CHECK_EQ_INT(probe(DPC_CODEC_E3M0, 1.0f, 0x1p-7f), 1);
  CHECK_EQ_INT(probe(DPC_CODEC_E3M0, 1.0f, nextafterf(0x1p-7f, 0.0f)), 0);
  CHECK_EQ_INT(probe(DPC_CODEC_E3M0, 1.0f, 0x1.8p-6f), 2);
  CHECK_EQ_INT(probe(DPC_CODEC_E3M0, 1.0f, -0.3f), 0xd); /* -0.25 */
  CHECK_EQ_INT(probe(DPC_CODEC_E3M0, 1.0f, -0x1p-9f), 0); /* rounds to 0: no sign */
  {
    float x[3] = {1.0f, -0.5f, 0.25f};
    unsigned char b[6];
    CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_E3M0, x, 3, 4, b), 0);
    CHECK_EQ_INT(b[4], 0xe7); /* low nibble first: 1.0 then -0.5 */
    CHECK_EQ_INT(b[5], 0x05); /* odd count: the high nibble pads with 0 */
  }

  /* Random deltas: several block sizes, a short last block, odd counts. */
  enum { N = 256 * 24 + 37 };
  static float x[N], y[N];
  static unsigned char enc[5 * N + 1];
  for (size_t i = 0; i < N; i++) x[i] = rand_delta(i);
  for (size_t i = 512; i < 768; i++) x[i] = 0.0f; /* a block of zeros */
  x[800] = -0.0f;
  const uint32_t blocks[] = {DPC_CODEC_BLOCK_DEFAULT, 1, 7, 64, 1000};
  for (int c = DPC_CODEC_INT8; c < DPC_CODEC_COUNT; c++) {
    long near = 0;
    for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) {
      for (size_t n = N - 1; n <= N; n++) {
        size_t bytes = 0;
        CHECK_EQ_INT(dpc_codec_bytes(c, n, blocks[b], &bytes), 0);
        memset(enc, 0xa5, sizeof enc);
        CHECK_EQ_INT(dpc_codec_encode(c, x, n, blocks[b], enc), 0);
        CHECK_EQ_INT(enc[bytes], 0xa5); /* nothing written past the stream */
        CHECK_EQ_INT(dpc_codec_decode(c, enc, bytes, n, blocks[b], y), 0);
        long bad = check_bounds(c, x, y, enc, n, blocks[b], &near);
        if (bad) fprintf(stderr, "%s block %u n %zu: %ld values outside the bounds\n", dpc_codec_name(c), blocks[b], n, bad);
        CHECK_EQ_INT(bad, 0);
      }
    }
    fprintf(stderr, "%s: %ld blocks' largest value decodes 1 ulp off amax\n", dpc_codec_name(c), near);
    /* The block of zeros: scale 0, codes 0, +0 out; -0 in decodes to +0 too. */
    CHECK_EQ_INT(dpc_codec_encode(c, x, N, 256, enc), 0);
    size_t zb = 2 * (4 + (c == DPC_CODEC_E3M0 ? 128 : 256));
    int zeros = 1;
    for (size_t j = zb; j < zb + 4 + (c == DPC_CODEC_E3M0 ? 128 : 256); j++) zeros &= enc[j] == 0;
    CHECK(zeros);
    size_t bytes = 0;
    dpc_codec_bytes(c, N, 256, &bytes);
    CHECK_EQ_INT(dpc_codec_decode(c, enc, bytes, N, 256, y), 0);
    uint32_t yb;
    memcpy(&yb, &y[800], 4);
    CHECK_EQ_INT(yb, 0);
    memcpy(&yb, &y[600], 4);
    CHECK_EQ_INT(yb, 0);
    /* A stream is exactly its size: one byte more or less is refused. */
    CHECK_EQ_INT(dpc_codec_decode(c, enc, bytes - 1, N, 256, y), DPC_EFORMAT);
    CHECK_EQ_INT(dpc_codec_decode(c, enc, bytes + 1, N, 256, y), DPC_EFORMAT);
    /* Corrupt scales of block 1: non-finite, negative. */
    unsigned char *s1 = enc + 4 + (c == DPC_CODEC_E3M0 ? 128 : 256);
    const float scales[] = {NAN, INFINITY, -INFINITY, -1.0f};
    for (int k = 0; k < 4; k++) {
      unsigned char save[4];
      memcpy(save, s1, 4);
      put_scale(s1, scales[k]);
      CHECK_EQ_INT(dpc_codec_decode(c, enc, bytes, N, 256, y), k < 3 ? DPC_ENUMERIC : DPC_EFORMAT);
      CHECK(strstr(dpc_errmsg(), "block 1 ") != NULL);
      memcpy(s1, save, 4);
    }
    /* A finite scale so large that a valid code overflows. */
    put_scale(enc, FLT_MAX);
    enc[4] = c == DPC_CODEC_INT8 ? 0x7f : c == DPC_CODEC_FP8_E4M3 ? 0x7e : 0x07;
    CHECK_EQ_INT(dpc_codec_decode(c, enc, bytes, N, 256, y), c == DPC_CODEC_E3M0 ? 0 : DPC_ENUMERIC);
    if (c != DPC_CODEC_E3M0) CHECK(strstr(dpc_errmsg(), "decoded value 0 ") != NULL);
    /* An input whose block cannot be decoded is refused; fp8 and e3m0 manage FLT_MAX. */
    float big[3] = {1.0f, -FLT_MAX, 2.0f};
    CHECK_EQ_INT(dpc_codec_encode(c, big, 3, 256, enc), c == DPC_CODEC_INT8 ? DPC_ENUMERIC : 0);
    if (c != DPC_CODEC_INT8) {
      CHECK_EQ_INT(dpc_codec_decode(c, enc, c == DPC_CODEC_E3M0 ? 6 : 7, 3, 256, y), 0);
      CHECK(y[1] == -FLT_MAX);
    }
    /* Non-finite input: refused naming the index, nothing written. */
    x[300] = NAN;
    memset(enc, 0xa5, 64);
    CHECK_EQ_INT(dpc_codec_encode(c, x, N, 256, enc), DPC_ENUMERIC);
    CHECK(strstr(dpc_errmsg(), "value 300 ") != NULL);
    CHECK_EQ_INT(enc[0], 0xa5);
    x[300] = -INFINITY;
    CHECK_EQ_INT(dpc_codec_encode(c, x, N, 256, enc), DPC_ENUMERIC);
    x[300] = 1.0f;
  }

  /* Codes no encoder writes. */
  {
    float v[300];
    for (int i = 0; i < 300; i++) v[i] = (float)(i - 150);
    unsigned char b[4 * 300];
    size_t bytes;
    dpc_codec_bytes(DPC_CODEC_INT8, 300, 256, &bytes);
    CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_INT8, v, 300, 256, b), 0);
    b[4 + 256 + 4 + 5] = 0x80;
    CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_INT8, b, bytes, 300, 256, y), DPC_EFORMAT);
    CHECK(strstr(dpc_errmsg(), "block 1: value 261 has code 0x80") != NULL);
    dpc_codec_bytes(DPC_CODEC_FP8_E4M3, 300, 256, &bytes);
    CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_FP8_E4M3, v, 300, 256, b), 0);
    b[4 + 7] = 0x7f;
    CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_FP8_E4M3, b, bytes, 300, 256, y), DPC_EFORMAT);
    CHECK(strstr(dpc_errmsg(), "block 0: value 7 has code 0x7f") != NULL);
    b[4 + 7] = 0xff;
    CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_FP8_E4M3, b, bytes, 300, 256, y), DPC_EFORMAT);
    b[4 + 7] = 0x80; /* -0: decodes to -0 * scale (never written, but a valid e4m3fn value) */
    CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_FP8_E4M3, b, bytes, 300, 256, y), 0);
    /* e3m0, odd count: a non-zero pad nibble is refused. */
    dpc_codec_bytes(DPC_CODEC_E3M0, 5, 4, &bytes);
    CHECK_EQ_INT(bytes, (4 + 2) + (4 + 1));
    CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_E3M0, v, 5, 4, b), 0);
    CHECK_EQ_INT(b[10] >> 4, 0);
    CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_E3M0, b, bytes, 5, 4, y), 0);
    CHECK(y[4] == -146.0f); /* the last block's only value is its amax */
    b[10] |= 0x10;
    CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_E3M0, b, bytes, 5, 4, y), DPC_EFORMAT);
    CHECK(strstr(dpc_errmsg(), "pad nibble after value 4") != NULL);
  }

  /* Sizes at the default block: int8/fp8 1.016x of a byte a float, e3m0 132 bytes per 256. */
  size_t b32, b8, b4;
  dpc_codec_bytes(DPC_CODEC_FP32, 1 << 20, 0, &b32);
  dpc_codec_bytes(DPC_CODEC_INT8, 1 << 20, DPC_CODEC_BLOCK_DEFAULT, &b8);
  dpc_codec_bytes(DPC_CODEC_E3M0, 1 << 20, DPC_CODEC_BLOCK_DEFAULT, &b4);
  CHECK_EQ_INT(b8, (1 << 20) / 256 * 260);
  CHECK_EQ_INT(b4, (1 << 20) / 256 * 132);
  CHECK(5 * b4 <= b32);
  CHECK(dpc_codec_is_block(DPC_CODEC_E3M0) && !dpc_codec_is_block(DPC_CODEC_BF16));
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--dump") == 0) return dump(atol(argv[2]), strtoull(argv[3], NULL, 10));
  if (argc == 4 && strcmp(argv[1], "--encode") == 0) return encode_stdin(argv[2], (uint32_t)strtoul(argv[3], NULL, 10));
  if (argc == 3 && strcmp(argv[1], "--bench") == 0) return bench(atol(argv[2]));

  /* bf16: exact values, ties to even, just above a tie, negatives. */
  CHECK_EQ_INT(bf16_of(1.0f), 0x3f80);
  CHECK_EQ_INT(bf16_of(from_bits(0x3f808000u)), 0x3f80); /* tie, 0x3f80 even: stays */
  CHECK_EQ_INT(bf16_of(from_bits(0x3f818000u)), 0x3f82); /* tie, 0x3f81 odd: up */
  CHECK_EQ_INT(bf16_of(from_bits(0x3f808001u)), 0x3f81); /* above the tie: up */
  CHECK_EQ_INT(bf16_of(-2.0f), 0xc000);
  CHECK_EQ_INT(bf16_of(-0.0f), 0x8000);
  float big = from_bits(0x7f7fffffu); /* largest fp32 rounds past the largest bf16 */
  unsigned char b4[8];
  CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_BF16, &big, 1, 0, b4), DPC_ENUMERIC);

  /* Non-finite input is refused for every implemented codec, naming the index. */
  float bad[3] = {1.0f, NAN, 2.0f};
  unsigned char buf[64];
  CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_FP32, bad, 3, 0, buf), DPC_ENUMERIC);
  CHECK(strstr(dpc_errmsg(), "value 1") != NULL);
  bad[1] = INFINITY;
  CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_BF16, bad, 3, 0, buf), DPC_ENUMERIC);

  /* fp32 round trip is bit-exact, including -0 and subnormals; bf16 keeps 8 bits of mantissa. */
  enum { N = 4096 };
  static float x[N], y[N];
  static unsigned char enc[4 * N];
  for (int i = 0; i < N; i++) x[i] = rand_float();
  x[0] = -0.0f, x[1] = from_bits(1); /* the smallest subnormal */
  size_t bytes = 0;
  CHECK_EQ_INT(dpc_codec_bytes(DPC_CODEC_FP32, N, 0, &bytes), 0);
  CHECK_EQ_INT(bytes, 4 * N);
  CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_FP32, x, N, 0, enc), 0);
  uint32_t x2;
  memcpy(&x2, &x[2], 4);
  CHECK_EQ_INT(enc[4 * 2], x2 & 0xff); /* little-endian on the wire */
  CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_FP32, enc, bytes, N, 0, y), 0);
  CHECK(memcmp(x, y, sizeof x) == 0);
  CHECK_EQ_INT(dpc_codec_bytes(DPC_CODEC_BF16, N, 0, &bytes), 0);
  CHECK_EQ_INT(bytes, 2 * N);
  CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_BF16, x, N, 0, enc), 0);
  CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_BF16, enc, bytes, N, 0, y), 0);
  int within = 1;
  for (int i = 0; i < N; i++)
    if (fabsf(y[i] - x[i]) > ldexpf(fabsf(x[i]), -8) + 1e-38f) within = 0; /* half an ulp of bf16 */
  CHECK(within);
  /* Wrong-length payloads are refused. */
  CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_BF16, enc, bytes - 2, N, 0, y), DPC_EFORMAT);
  enc[0] = 0x80, enc[1] = 0x7f; /* +inf in bf16 */
  CHECK_EQ_INT(dpc_codec_decode(DPC_CODEC_BF16, enc, bytes, N, 0, y), DPC_ENUMERIC);

  /* Block codecs: [4-byte scale][codes] per block, the last block short. */
  CHECK_EQ_INT(dpc_codec_bytes(DPC_CODEC_INT8, 10, 4, &bytes), 0);
  CHECK_EQ_INT(bytes, 2 * (4 + 4) + (4 + 2));
  CHECK_EQ_INT(dpc_codec_bytes(DPC_CODEC_E3M0, 5, 4, &bytes), 0);
  CHECK_EQ_INT(bytes, (4 + 2) + (4 + 1));
  CHECK_EQ_INT(dpc_codec_bytes(DPC_CODEC_FP8_E4M3, 0, 4, &bytes), 0);
  CHECK_EQ_INT(bytes, 0);
  CHECK_EQ_INT(dpc_codec_bytes(DPC_CODEC_INT8, 10, 0, &bytes), DPC_EINVAL);
  CHECK_EQ_INT(dpc_codec_bytes(7, 10, 0, &bytes), DPC_EINVAL);
  CHECK_EQ_INT(dpc_codec_bytes(DPC_CODEC_FP32, UINT64_MAX / 2, 0, &bytes), DPC_ERANGE);

  /* Header checks name the field. */
  const unsigned ALL = ~0u;
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_FP32, ALL, 10, 40, 0, 10), 0);
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_FP32, ALL, 10, 41, 0, 10), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "total 41") != NULL);
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_FP32, ALL, 9, 36, 0, 10), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "num_floats 9") != NULL);
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_BF16, ALL, 10, 20, 0, 10), 0);
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_E3M0, ALL, 10, 17, 4, 10), 0);
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_E3M0, ALL, 10, 13, 4, 10), DPC_EFORMAT);
  CHECK_EQ_INT(dpc_codec_check(9, ALL, 10, 40, 0, 10), DPC_EFORMAT);
  /* A supported codec outside the receiver's set is refused, naming what is accepted. */
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_BF16, DPC_CODEC_BIT(DPC_CODEC_FP32), 10, 20, 0, 10), DPC_EUNSUPPORTED);
  CHECK(strstr(dpc_errmsg(), "bf16 is not accepted here (accepted: fp32)") != NULL);

  block_codecs();

  /* Names. */
  dpc_codec c;
  CHECK_EQ_INT(dpc_codec_parse("e3m0", &c), 0);
  CHECK_EQ_INT(c, DPC_CODEC_E3M0);
  CHECK_EQ_INT(dpc_codec_parse("fp16", &c), DPC_EINVAL);
  CHECK(strcmp(dpc_codec_name(DPC_CODEC_BF16), "bf16") == 0);
  CHECK(strcmp(dpc_codec_name(-1), "?") == 0);
  TEST_DONE();
}
