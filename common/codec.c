/* codec.c — the wire codecs of common/codec.h: fp32 and bf16, and the sizing and header
 * checks every codec shares. */
#include "common/codec.h"
#include "common/errors.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const names[DPC_CODEC_COUNT] = {"fp32", "bf16", "int8", "fp8", "e3m0"};

const char *dpc_codec_name(int codec) { return codec >= 0 && codec < DPC_CODEC_COUNT ? names[codec] : "?"; }

int dpc_codec_parse(const char *name, dpc_codec *out) {
  for (int i = 0; i < DPC_CODEC_COUNT; i++) {
    if (name && strcmp(name, names[i]) == 0) {
      *out = (dpc_codec)i;
      return 0;
    }
  }
  return dpc_err(DPC_EINVAL, "codec \"%s\": expected fp32, bf16, int8, fp8 or e3m0", name ? name : "(null)");
}

int dpc_codec_supported(int codec) { return codec == DPC_CODEC_FP32 || codec == DPC_CODEC_BF16; }

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

/* int8, fp8 and e3m0 are sized and checked here, but encoded and decoded only once Streaming
 * DiLoCo (issue #14) brings them. */
static int not_built(int codec) {
  return dpc_err(DPC_EUNSUPPORTED, "codec %s: its encoder is not built yet (int8, fp8 and e3m0 arrive with "
                 "Streaming DiLoCo, issue #14)", names[codec]);
}

int dpc_codec_is_block(int codec) { return codec >= DPC_CODEC_INT8 && codec < DPC_CODEC_COUNT; }
#define is_block_codec dpc_codec_is_block

int dpc_codec_bytes(int codec, uint64_t n, uint32_t block_floats, size_t *bytes) {
  unsigned bits = code_bits(codec);
  if (!bits) return dpc_err(DPC_EINVAL, "codec %d is not a dipaco.v1.Codec", codec);
  uint64_t total;
  if (!is_block_codec(codec)) {
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

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* fp32 → bf16, round to nearest, ties to even (finite input only). */
static uint16_t to_bf16(float f) {
  uint32_t u = f32_bits(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static void put_le32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16), p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int dpc_codec_encode(int codec, const float *x, size_t n, uint32_t block_floats, unsigned char *out) {
  size_t bytes;
  int rc = dpc_codec_bytes(codec, n, block_floats, &bytes);
  if (rc < 0) return rc;
  if (!dpc_codec_supported(codec)) return not_built(codec);
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return dpc_err(DPC_ENUMERIC, "value %zu is %g: refused before encoding", i, (double)x[i]);
  if (codec == DPC_CODEC_FP32) {
    for (size_t i = 0; i < n; i++) put_le32(out + 4 * i, f32_bits(x[i]));
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    uint16_t h = to_bf16(x[i]);
    if ((h & 0x7f80u) == 0x7f80u) return dpc_err(DPC_ENUMERIC, "value %zu (%g) overflows bf16", i, (double)x[i]);
    out[2 * i] = (unsigned char)h, out[2 * i + 1] = (unsigned char)(h >> 8);
  }
  return 0;
}

int dpc_codec_decode(int codec, const unsigned char *in, size_t bytes, size_t n, uint32_t block_floats, float *y) {
  size_t want;
  int rc = dpc_codec_bytes(codec, n, block_floats, &want);
  if (rc < 0) return rc;
  if (!dpc_codec_supported(codec)) return not_built(codec);
  if (bytes != want)
    return dpc_err(DPC_EFORMAT, "%zu bytes of %s: %zu floats take %zu", bytes, names[codec], n, want);
  for (size_t i = 0; i < n; i++) {
    y[i] = codec == DPC_CODEC_FP32 ? bits_f32(get_le32(in + 4 * i))
                                   : bits_f32((uint32_t)(in[2 * i] | in[2 * i + 1] << 8) << 16);
    if (!isfinite(y[i])) return dpc_err(DPC_ENUMERIC, "decoded value %zu is not finite", i);
  }
  return 0;
}
