/* test_codec.c — the wire codecs (common/codec.h): bf16 rounding at exact ties and above,
 * fp32 round trips bit for bit (signed zero, subnormals), non-finite values refused before
 * encoding, stream sizes and header checks for every codec, unimplemented codecs refused.
 * With `--dump N SEED` it prints N random floats and their bf16 codes for the PyTorch oracle
 * (tests/oracle/codec_oracle.py). */
#include "common/codec.h"
#include "common/errors.h"
#include "test.h"

#include <stdint.h>
#include <string.h>

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

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--dump") == 0) return dump(atol(argv[2]), strtoull(argv[3], NULL, 10));

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
  CHECK_EQ_INT(dpc_codec_encode(DPC_CODEC_INT8, x, 8, 4, enc), DPC_EUNSUPPORTED);

  /* Header checks name the field. */
  const unsigned ALL = ~0u;
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_FP32, ALL, 10, 40, 0, 10), 0);
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_FP32, ALL, 10, 41, 0, 10), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "total 41") != NULL);
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_FP32, ALL, 9, 36, 0, 10), DPC_EFORMAT);
  CHECK(strstr(dpc_errmsg(), "num_floats 9") != NULL);
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_BF16, ALL, 10, 20, 0, 10), 0);
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_E3M0, ALL, 10, 13, 4, 10), DPC_EUNSUPPORTED);
  CHECK_EQ_INT(dpc_codec_check(9, ALL, 10, 40, 0, 10), DPC_EFORMAT);
  /* A supported codec outside the receiver's set is refused, naming what is accepted. */
  CHECK_EQ_INT(dpc_codec_check(DPC_CODEC_BF16, DPC_CODEC_BIT(DPC_CODEC_FP32), 10, 20, 0, 10), DPC_EUNSUPPORTED);
  CHECK(strstr(dpc_errmsg(), "bf16 is not accepted here (accepted: fp32)") != NULL);

  /* Names. */
  dpc_codec c;
  CHECK_EQ_INT(dpc_codec_parse("e3m0", &c), 0);
  CHECK_EQ_INT(c, DPC_CODEC_E3M0);
  CHECK_EQ_INT(dpc_codec_parse("fp16", &c), DPC_EINVAL);
  CHECK(strcmp(dpc_codec_name(DPC_CODEC_BF16), "bf16") == 0);
  CHECK(strcmp(dpc_codec_name(-1), "?") == 0);
  TEST_DONE();
}
