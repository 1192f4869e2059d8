/* fuzz_sparse.c — libFuzzer target: SparseLoCo's sparse stream checker, decoder and encoder
 * (common/sparse.c), what the coordinator runs on a worker's sparse delta bytes. Input:
 * byte 0: value_bits = 1 + (b & 7), bit 3 the length mode; bytes 1-2: chunk = 2 + (u16 mod
 * 65535) (little-endian); byte 3: density = (b + 1) / 256; byte 4: nt = 1 + (b & 3); then nt
 * little-endian u16 tensor lengths, each plus 1; the rest is the stream. Length mode 1: the
 * first bytes of the rest, exactly as many as the layout needs (in a buffer of their own
 * size, so ASan sees any read past it), when the rest holds that many; otherwise, and in mode
 * 0, the whole rest (mostly a wrong length).
 * Oracles: check and decode agree and fail only with EFORMAT/ENUMERIC; a decoded fragment is
 * finite with at most `kept` non-zeros, and re-encoding it succeeds into a stream that checks.
 * The rest read as floats (one tensor) encodes or is refused with ENUMERIC only (non-finite);
 * its stream checks, and the residual is e - s in fp32 bit for bit. */
#include "util.h"

#include "common/errors.h"
#include "common/sparse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  return 0;
}

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* Encode e (n values, tensors tl) and check the oracles of a successful encode. */
static void encode_checked(const dpc_sparse_cfg *cfg, const uint64_t *tl, int nt, const float *x, size_t n, int must) {
  size_t bytes;
  uint64_t kept;
  if (dpc_sparse_bytes(cfg, tl, nt, &bytes, &kept) != 0) fz_fail("sizing failed after a good layout: %s", dpc_errmsg());
  float *e = malloc(n * sizeof *e), *y = malloc(n * sizeof *y);
  unsigned char *s = malloc(bytes);
  memcpy(e, x, n * sizeof *e);
  int rc = dpc_sparse_encode(cfg, tl, nt, e, s);
  if (rc == 0) {
    if (dpc_sparse_check(cfg, tl, nt, s, bytes) != 0) fz_fail("an encoded stream does not check: %s", dpc_errmsg());
    if (dpc_sparse_decode(cfg, tl, nt, s, bytes, y) != 0) fz_fail("an encoded stream does not decode: %s", dpc_errmsg());
    uint64_t nz = 0;
    for (size_t i = 0; i < n; i++) {
      nz += y[i] != 0.0f;
      if (fbits(e[i]) != fbits(x[i] - y[i])) fz_fail("residual %zu is not e - s", i);
    }
    if (nz > kept) fz_fail("%llu non-zeros decoded, %llu kept", (unsigned long long)nz, (unsigned long long)kept);
  } else if (must || rc != DPC_ENUMERIC) {
    fz_fail("encode failed with %d (%s)", rc, dpc_errmsg());
  }
  free(e), free(y), free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 5) return 0;
  dpc_sparse_cfg cfg = {(data[3] + 1) / 256.0, 2 + (uint32_t)(data[1] | data[2] << 8) % 65535u, 1 + (data[0] & 7u)};
  int exact = data[0] >> 3 & 1, nt = 1 + (data[4] & 3);
  if (size < 5 + 2 * (size_t)nt) return 0;
  uint64_t tl[4];
  size_t n = 0;
  for (int t = 0; t < nt; t++) n += tl[t] = 1 + (uint64_t)(data[5 + 2 * t] | data[6 + 2 * t] << 8);
  const uint8_t *in = data + 5 + 2 * nt;
  size_t len = size - 5 - 2 * (size_t)nt, bytes;
  uint64_t kept;
  if (dpc_sparse_bytes(&cfg, tl, nt, &bytes, &kept) != 0) fz_fail("sizing a valid layout failed: %s", dpc_errmsg());
  if (exact && len >= bytes) len = bytes;
  uint8_t *buf = malloc(len ? len : 1);
  if (len) memcpy(buf, in, len);
  float *y = malloc(n * sizeof *y);
  int rc = dpc_sparse_decode(&cfg, tl, nt, buf, len, y);
  int rc2 = dpc_sparse_check(&cfg, tl, nt, buf, len);
  if (rc != rc2) fz_fail("decode says %d, check says %d", rc, rc2);
  if (rc == 0) {
    uint64_t nz = 0;
    for (size_t i = 0; i < n; i++) {
      if (!isfinite(y[i])) fz_fail("decoded value %zu is not finite", i);
      nz += y[i] != 0.0f;
    }
    if (nz > kept) fz_fail("%llu non-zeros decoded, %llu kept", (unsigned long long)nz, (unsigned long long)kept);
    encode_checked(&cfg, tl, nt, y, n, 1);
  } else if (rc != DPC_EFORMAT && rc != DPC_ENUMERIC) {
    fz_fail("decode failed with %d (%s)", rc, dpc_errmsg());
  }
  free(buf), free(y);
  /* The rest as an accumulator of one tensor. */
  size_t m = (size - 5 - 2 * (size_t)nt) / 4;
  if (m) {
    float *x = malloc(m * sizeof *x);
    memcpy(x, in, m * sizeof *x);
    uint64_t one[1] = {m};
    encode_checked(&cfg, one, 1, x, m, 0);
    free(x);
  }
  return 0;
}
