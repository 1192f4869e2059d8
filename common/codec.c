/* codec.c — the wire codecs of common/codec.h: fp32, bf16 and the block codecs int8, fp8 e4m3
 * and e3m0 (math in docs/design.md §3), and the sizing and header checks every
 * codec shares. All arithmetic is fp32 without contraction; the inner loops have no per-value
 * branches (selects, clamps and table lookups only), so they vectorize and run at memory
 * speed when the coordinator decodes a large delta. */
#include "common/codec.h"
#include "common/bytes.h"
#include "common/errors.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const names[DPC_CODEC_COUNT] = {"fp32", "bf16", "int8", "fp8", "e3m0"};

const char *dpc_codec_name(int codec) {
  if (codec == DPC_CODEC_SPARSE) return "sparse";
  return codec >= 0 && codec < DPC_CODEC_COUNT ? names[codec] : "?";
}

int dpc_codec_parse(const char *name, dpc_codec *out) {
  for (int i = 0; i < DPC_CODEC_COUNT; i++) {
    if (name && strcmp(name, names[i]) == 0) {
      *out = (dpc_codec)i;
      return 0;
    }
  }
  return dpc_err(DPC_EINVAL, "codec \"%s\": expected fp32, bf16, int8, fp8 or e3m0", name ? name : "(null)");
}

int dpc_codec_supported(int codec) { return codec >= 0 && codec < DPC_CODEC_COUNT; }

int dpc_codec_is_block(int codec) { return codec >= DPC_CODEC_INT8 && codec < DPC_CODEC_COUNT; }

/* Bits per code of each codec. */
static unsigned code_bits(int codec) {
  switch (codec) {
  case DPC_CODEC_FP32: return 32;
  case DPC_CODEC_BF16: return 16;
  case DPC_CODEC_INT8:
  case DPC_CODEC_FP8_E4M3: return 8;
  case DPC_CODEC_E3M0: return 4;
  default: return 0;
  }
}

int dpc_codec_bytes(int codec, uint64_t n, uint32_t block_floats, size_t *bytes) {
  unsigned bits = code_bits(codec);
  if (!bits) return dpc_err(DPC_EINVAL, "codec %d is not a dipaco.v1.Codec", codec);
  uint64_t total;
  if (!dpc_codec_is_block(codec)) {
    if (n > UINT64_MAX / (bits / 8)) return dpc_err(DPC_ERANGE, "%llu floats overflow a stream", (unsigned long long)n);
    total = n * (bits / 8);
  } else {
    if (!block_floats) return dpc_err(DPC_EINVAL, "codec %s needs block_floats > 0", names[codec]);
    /* Each block: a 4-byte scale, then its codes (4-bit codes two per byte, rounded up). */
    uint64_t full = n / block_floats, rest = n % block_floats;
    uint64_t per_block = 4 + ((uint64_t)block_floats * bits + 7) / 8;
    if (full > (UINT64_MAX - 4 - rest) / per_block) return dpc_err(DPC_ERANGE, "stream size overflows");
    total = full * per_block + (rest ? 4 + (rest * bits + 7) / 8 : 0);
  }
  if (total > SIZE_MAX) return dpc_err(DPC_ERANGE, "%llu-byte stream does not fit in memory", (unsigned long long)total);
  *bytes = (size_t)total;
  return 0;
}

int dpc_codec_check(int codec, unsigned accept, uint64_t num_floats, uint64_t total, uint32_t block_floats,
                    uint64_t want_floats) {
  if (codec < 0 || codec >= DPC_CODEC_COUNT) return dpc_err(DPC_EFORMAT, "codec %d is not a dipaco.v1.Codec", codec);
  if (!dpc_codec_supported(codec) || !(accept & DPC_CODEC_BIT(codec))) {
    char list[64] = "";
    for (int i = 0; i < DPC_CODEC_COUNT; i++)
      if (dpc_codec_supported(i) && (accept & DPC_CODEC_BIT(i)))
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? ", " : "", names[i]);
    return dpc_err(DPC_EUNSUPPORTED, "codec %s is not accepted here (accepted: %s)", names[codec], *list ? list : "none");
  }
  if (num_floats != want_floats)
    return dpc_err(DPC_EFORMAT, "num_floats %llu: expected %llu", (unsigned long long)num_floats,
                   (unsigned long long)want_floats);
  size_t want = 0;
  int rc = dpc_codec_bytes(codec, num_floats, block_floats, &want);
  if (rc < 0) return rc;
  if (total != want)
    return dpc_err(DPC_EFORMAT, "total %llu bytes: %llu %s floats take %zu", (unsigned long long)total,
                   (unsigned long long)num_floats, names[codec], want);
  return 0;
}

/* fp32 → bf16, round to nearest, ties to even (finite input only). */
static uint16_t to_bf16(float f) {
  uint32_t u = dpc_f32_bits(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Magnitude of a finite float as its bit pattern: for non-negative finite floats the unsigned
 * order of the patterns is the order of the values, and an integer max vectorizes. */
static uint32_t mag_bits(float f) { return dpc_f32_bits(f) & 0x7fffffffu; }

/* amax of x[0..n) (finite input). */
static float block_amax(const float *x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u = mag_bits(x[i]);
    m = u > m ? u : m;
  }
  return dpc_bits_f32(m);
}

/* Largest |code value| of each block codec: a decoded value is at most this times the scale. */
static float code_max(int codec) {
  return codec == DPC_CODEC_INT8 ? 127.0f : codec == DPC_CODEC_FP8_E4M3 ? 448.0f : 1.0f;
}

/* The float 1.5 * 2^23: adding and subtracting it rounds |q| <= 2^22 to an integer, half to even,
 * in the current (default, nearest-even) rounding mode without a libm call. */
#define RNE_MAGIC 12582912.0f

static void int8_block(const float *x, size_t k, float scale, unsigned char *c) {
  if (scale == 0.0f) {
    memset(c, 0, k);
    return;
  }
  /* |x / scale| stays below 400 even for a subnormal scale, so the rounding is exact and the
   * conversion defined; clamping the integer keeps every float operation unconditional (a
   * select on a float compare keeps GCC from vectorizing under -ftrapping-math). */
  for (size_t i = 0; i < k; i++) {
    int v = (int)((x[i] / scale + RNE_MAGIC) - RNE_MAGIC);
    c[i] = (unsigned char)(v < -127 ? -127 : v > 127 ? 127 : v);
  }
}

/* Nearest e4m3fn code of y (ties to even mantissa, saturating at 448, never -0). */
static unsigned char e4m3_code(float y) {
  uint32_t u = dpc_f32_bits(y), a = u & 0x7fffffffu;
  /* |y| < 2^-6 (subnormal codes m * 2^-9): the ulp of 2^14 is 2^-9, so adding 2^14 rounds |y| to
   * a multiple of 2^-9, nearest even, and leaves m (0..8; 8 is the code of 2^-6) in the low bits. */
  uint32_t sub = dpc_f32_bits(dpc_bits_f32(a) + 16384.0f) - 0x46800000u;
  /* Normal: rebias the exponent 127 -> 7 and round 23 -> 3 mantissa bits to nearest even; a
   * carry moves into the exponent as it should. */
  uint32_t nrm = (a - (120u << 23) + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
  uint32_t is_sub = 0u - (a < 0x3c800000u); /* a mask, not a ?:, so that both stay branch-free */
  uint32_t c = (sub & is_sub) | (nrm & ~is_sub);
  c = c > 0x7eu ? 0x7eu : c;
  return (unsigned char)(c | ((u >> 24) & 0x80u & (0u - (c != 0))));
}

static void fp8_block(const float *x, size_t k, float scale, unsigned char *c) {
  if (scale == 0.0f) {
    memset(c, 0, k);
    return;
  }
  for (size_t i = 0; i < k; i++) c[i] = e4m3_code(x[i] / scale);
}

/* e3m0 code of x given the block's scale (> 0): the level of y = |x| / scale, nearest in linear
 * distance, a midpoint going to the larger level, counted as the midpoints at or below y
 * (2^-7, 1.5 * 2^-6, ..., 1.5 * 2^-1), compared as bit patterns (y >= 0). */
static unsigned e3m0_code(float x, float scale) {
  uint32_t u = dpc_f32_bits(x), a = dpc_f32_bits(dpc_bits_f32(u & 0x7fffffffu) / scale);
  unsigned e = (a >= 0x3c000000u) + (a >= 0x3cc00000u) + (a >= 0x3d400000u) + (a >= 0x3dc00000u) +
               (a >= 0x3e400000u) + (a >= 0x3ec00000u) + (a >= 0x3f400000u);
  return e | ((u >> 28) & 8u & (0u - (e != 0)));
}

static void e3m0_block(const float *x, size_t k, float scale, unsigned char *c) {
  if (scale == 0.0f) {
    memset(c, 0, (k + 1) / 2);
    return;
  }
  for (size_t j = 0; j < k / 2; j++) c[j] = (unsigned char)(e3m0_code(x[2 * j], scale) | e3m0_code(x[2 * j + 1], scale) << 4);
  if (k % 2) c[k / 2] = (unsigned char)e3m0_code(x[k - 1], scale); /* odd count: the high nibble pads with 0 */
}

static size_t code_bytes(int codec, size_t k) { return codec == DPC_CODEC_E3M0 ? (k + 1) / 2 : k; }

int dpc_codec_encode(int codec, const float *x, size_t n, uint32_t block_floats, unsigned char *out) {
  size_t bytes;
  int rc = dpc_codec_bytes(codec, n, block_floats, &bytes);
  if (rc < 0) return rc;
  uint32_t top = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u = mag_bits(x[i]);
    top = u > top ? u : top;
  }
  if (top >= 0x7f800000u) {
    size_t i = 0;
    while (isfinite(x[i])) i++;
    return dpc_err(DPC_ENUMERIC, "value %zu is %g: refused before encoding", i, (double)x[i]);
  }
  if (codec == DPC_CODEC_FP32) {
    for (size_t i = 0; i < n; i++) dpc_put_le32(out + 4 * i, dpc_f32_bits(x[i]));
    return 0;
  }
  if (codec == DPC_CODEC_BF16) {
    for (size_t i = 0; i < n; i++) {
      uint16_t h = to_bf16(x[i]);
      if ((h & 0x7f80u) == 0x7f80u) return dpc_err(DPC_ENUMERIC, "value %zu (%g) overflows bf16", i, (double)x[i]);
      out[2 * i] = (unsigned char)h, out[2 * i + 1] = (unsigned char)(h >> 8);
    }
    return 0;
  }
  /* A block whose largest code times its scale overflows could not be decoded; scales grow
   * with amax, so checking the largest |x| covers every block. */
  float amax = dpc_bits_f32(top), cmax = code_max(codec);
  if (!isfinite(cmax * (amax / cmax))) {
    size_t i = 0;
    while (mag_bits(x[i]) != top) i++;
    return dpc_err(DPC_ENUMERIC, "value %zu (%g) is too large for %s: its block would decode to infinity", i,
                   (double)x[i], names[codec]);
  }
  for (size_t i = 0; i < n; i += block_floats) {
    size_t k = n - i < block_floats ? n - i : block_floats;
    float scale = block_amax(x + i, k) / cmax; /* e3m0: cmax 1, scale = amax */
    dpc_put_le32(out, dpc_f32_bits(scale));
    if (codec == DPC_CODEC_INT8) int8_block(x + i, k, scale, out + 4);
    else if (codec == DPC_CODEC_FP8_E4M3) fp8_block(x + i, k, scale, out + 4);
    else e3m0_block(x + i, k, scale, out + 4);
    out += 4 + code_bytes(codec, k);
  }
  return 0;
}

/* Decoded value of every fp8 code before scaling (NaN for 0x7f and 0xff). */
static void e4m3_table(float t[256]) {
  for (unsigned c = 0; c < 256; c++) {
    unsigned e = c >> 3 & 15u, m = c & 7u;
    float v = e ? ldexpf((float)(8 + m), (int)e - 10) : ldexpf((float)m, -9);
    if ((c & 0x7fu) == 0x7fu) v = NAN;
    t[c] = c & 0x80u ? -v : v;
  }
}

/* Decoded values of an e3m0 byte (low nibble, high nibble) before scaling. */
static void e3m0_table(float t[256][2]) {
  float m[16];
  for (unsigned c = 0; c < 16; c++) m[c] = (c & 8u ? -1.0f : 1.0f) * ((c & 7u) ? ldexpf(1.0f, (int)(c & 7u) - 7) : 0.0f);
  for (unsigned b = 0; b < 256; b++) t[b][0] = m[b & 15u], t[b][1] = m[b >> 4];
}

/* Decode one block's k codes c with a checked scale s into y; 0, or the index within the block
 * of a code no encoder writes (int8 -128, fp8 NaN), or k for an e3m0 pad nibble that is not 0. */
static size_t decode_block(int codec, const unsigned char *c, size_t k, float s, const float *t8,
                           const float (*t4)[2], float *y) {
  unsigned bad = 0;
  if (codec == DPC_CODEC_INT8) {
    for (size_t i = 0; i < k; i++) {
      bad |= c[i] == 0x80u;
      y[i] = (float)(signed char)c[i] * s;
    }
  } else if (codec == DPC_CODEC_FP8_E4M3) {
    for (size_t i = 0; i < k; i++) {
      bad |= (c[i] & 0x7fu) == 0x7fu;
      y[i] = t8[c[i]] * s;
    }
  } else {
    for (size_t j = 0; j < k / 2; j++) y[2 * j] = t4[c[j]][0] * s, y[2 * j + 1] = t4[c[j]][1] * s;
    if (k % 2) {
      y[k - 1] = t4[c[k / 2]][0] * s;
      if (c[k / 2] >> 4) return k;
    }
    return 0;
  }
  if (!bad) return 0;
  size_t i = 0;
  while (codec == DPC_CODEC_INT8 ? c[i] != 0x80u : (c[i] & 0x7fu) != 0x7fu) i++;
  return i + 1;
}

static int decode_blocks(int codec, const unsigned char *in, size_t n, uint32_t block_floats, float *y) {
  float t8[256], t4[256][2];
  if (codec == DPC_CODEC_FP8_E4M3) e4m3_table(t8);
  if (codec == DPC_CODEC_E3M0) e3m0_table(t4);
  float cmax = code_max(codec);
  for (size_t i = 0, b = 0; i < n; i += block_floats, b++) {
    size_t k = n - i < block_floats ? n - i : block_floats;
    float s = dpc_bits_f32(dpc_get_le32(in));
    if (!isfinite(s)) return dpc_err(DPC_ENUMERIC, "%s block %zu (values %zu..): scale is %g", names[codec], b, i, (double)s);
    if (s < 0.0f)
      return dpc_err(DPC_EFORMAT, "%s block %zu (values %zu..): scale %g is negative", names[codec], b, i, (double)s);
    size_t at = decode_block(codec, in + 4, k, s, t8, (const float(*)[2])t4, y + i);
    if (at == k && codec == DPC_CODEC_E3M0)
      return dpc_err(DPC_EFORMAT, "e3m0 block %zu: the pad nibble after value %zu is not 0", b, i + k - 1);
    if (at)
      return dpc_err(DPC_EFORMAT, "%s block %zu: value %zu has code 0x%02x, which no encoder writes%s", names[codec], b,
                     i + at - 1, in[4 + at - 1], codec == DPC_CODEC_INT8 ? " (-128)" : " (NaN)");
    /* Only a scale near FLT_MAX can overflow a valid code. */
    if (!isfinite(cmax * s))
      for (size_t j = i; j < i + k; j++)
        if (!isfinite(y[j]))
          return dpc_err(DPC_ENUMERIC, "%s block %zu: decoded value %zu is not finite (scale %g)", names[codec], b, j,
                         (double)s);
    in += 4 + code_bytes(codec, k);
  }
  return 0;
}

int dpc_codec_decode(int codec, const unsigned char *in, size_t bytes, size_t n, uint32_t block_floats, float *y) {
  size_t want;
  int rc = dpc_codec_bytes(codec, n, block_floats, &want);
  if (rc < 0) return rc;
  if (bytes != want)
    return dpc_err(DPC_EFORMAT, "%zu bytes of %s: %zu floats take %zu", bytes, names[codec], n, want);
  if (dpc_codec_is_block(codec)) return decode_blocks(codec, in, n, block_floats, y);
  for (size_t i = 0; i < n; i++) {
    y[i] = codec == DPC_CODEC_FP32 ? dpc_bits_f32(dpc_get_le32(in + 4 * i))
                                   : dpc_bits_f32((uint32_t)(in[2 * i] | in[2 * i + 1] << 8) << 16);
    if (!isfinite(y[i])) return dpc_err(DPC_ENUMERIC, "decoded value %zu is not finite", i);
  }
  return 0;
}
