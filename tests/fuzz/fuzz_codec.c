/* fuzz_codec.c — libFuzzer target: the wire codecs' decoder and encoder (common/codec.c), the
 * coordinator's first contact with a worker's delta bytes. Input: byte 0 picks the codec
 * (mod 5), bytes 1-2 block_floats (little-endian; 0 is refused as it must be), byte 3 the
 * float count: odd = as many floats as the rest holds exactly as a stream (the usual case),
 * even = count >> 1 floats against the whole rest (mostly a wrong length). The rest is the
 * stream. Every buffer is exactly its size, so ASan sees any read or write outside it.
 * Oracles: a decode either fails with EFORMAT/ENUMERIC (EINVAL for block 0) or yields finite
 * values; the rest read as floats and encoded either is refused (non-finite input, int8 near
 * FLT_MAX) or gives a stream that decodes without error to values no larger than each block's
 * amax (up to the rounding of a subnormal scale), with the signs kept. */
#include "util.h"

#include "common/codec.h"
#include "common/errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  return 0;
}

/* The largest n whose stream fits in len bytes. */
static size_t floats_in(int codec, uint32_t bf, size_t len) {
  if (!dpc_codec_is_block(codec)) return len / (codec == DPC_CODEC_FP32 ? 4 : 2);
  size_t per = 4 + (codec == DPC_CODEC_E3M0 ? ((size_t)bf + 1) / 2 : bf);
  size_t n = len / per * bf, r = len % per;
  if (r > 4) {
    size_t k = codec == DPC_CODEC_E3M0 ? 2 * (r - 4) : r - 4;
    n += k < bf ? k : bf - 1;
  }
  return n;
}

static void decode(int codec, const uint8_t *in, size_t len, size_t n, uint32_t bf) {
  float *y = malloc(n ? n * sizeof *y : 1);
  int rc = dpc_codec_decode(codec, in, len, n, bf, y);
  if (rc == 0) {
    for (size_t i = 0; i < n; i++)
      if (!isfinite(y[i])) fz_fail("%s: decoded value %zu is not finite", dpc_codec_name(codec), i);
  } else if (rc != DPC_EFORMAT && rc != DPC_ENUMERIC && !(rc == DPC_EINVAL && bf == 0)) {
    fz_fail("%s: decode failed with %d (%s)", dpc_codec_name(codec), rc, dpc_errmsg());
  }
  free(y);
}

static void roundtrip(int codec, const uint8_t *raw, size_t n, uint32_t bf) {
  size_t bytes;
  if (dpc_codec_bytes(codec, n, bf, &bytes) != 0) return;
  float *x = malloc(n ? n * sizeof *x : 1), *y = malloc(n ? n * sizeof *y : 1);
  unsigned char *enc = malloc(bytes ? bytes : 1);
  if (n) memcpy(x, raw, n * sizeof *x);
  int rc = dpc_codec_encode(codec, x, n, bf, enc);
  if (rc == 0) {
    if (dpc_codec_decode(codec, enc, bytes, n, bf, y) != 0)
      fz_fail("%s: a stream the encoder wrote does not decode: %s", dpc_codec_name(codec), dpc_errmsg());
    uint32_t step = dpc_codec_is_block(codec) ? bf : 1;
    for (size_t i = 0; i < n; i += step) {
      size_t k = n - i < step ? n - i : step;
      float amax = 0.0f;
      for (size_t j = i; j < i + k; j++) amax = fmaxf(amax, fabsf(x[j]));
      /* A subnormal scale is rounded to a multiple of 2^-149: up to 448 * 2^-150 above amax. */
      float limit = amax * (1.0f + 0x1p-20f) + 224.0f * 0x1p-149f;
      for (size_t j = i; j < i + k; j++) {
        if (codec == DPC_CODEC_FP32 && memcmp(&x[j], &y[j], 4) != 0) fz_fail("fp32 value %zu changed", j);
        if (dpc_codec_is_block(codec) && fabsf(y[j]) > limit)
          fz_fail("%s: value %zu decodes to %g above its block's amax %g", dpc_codec_name(codec), j, (double)y[j],
                  (double)amax);
        if (y[j] != 0.0f && signbit(y[j]) != signbit(x[j])) fz_fail("%s: value %zu changed sign", dpc_codec_name(codec), j);
      }
    }
  } else if (rc != DPC_ENUMERIC) {
    fz_fail("%s: encode failed with %d (%s)", dpc_codec_name(codec), rc, dpc_errmsg());
  }
  free(x), free(y), free(enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  int codec = data[0] % DPC_CODEC_COUNT;
  uint32_t bf = (uint32_t)data[1] | (uint32_t)data[2] << 8;
  const uint8_t *in = data + 4;
  size_t len = size - 4;
  if (bf == 0 && dpc_codec_is_block(codec)) {
    decode(codec, in, len, data[3] >> 1, bf);
    return 0;
  }
  if (data[3] & 1) {
    size_t n = floats_in(codec, bf, len), bytes;
    if (dpc_codec_bytes(codec, n, bf, &bytes) != 0 || bytes > len) fz_fail("floats_in overshoots");
    /* The stream exactly, in a buffer of its own size. */
    uint8_t *exact = malloc(bytes ? bytes : 1);
    if (bytes) memcpy(exact, in, bytes);
    decode(codec, exact, bytes, n, bf);
    free(exact);
  } else {
    decode(codec, in, len, data[3] >> 1, bf);
  }
  roundtrip(codec, in, len / 4, bf ? bf : 1);
  return 0;
}
