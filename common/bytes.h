/* bytes.h — the little-endian and float-bit helpers the wire codecs share (codec.c, sparse.c):
 * an fp32 as its bit pattern and back, and 32-bit little-endian loads and stores. Header-only
 * (static inline); no state. */
#ifndef DPC_BYTES_H
#define DPC_BYTES_H

#include <stdint.h>
#include <string.h>

static inline uint32_t dpc_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float dpc_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline void dpc_put_le32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16), p[3] = (unsigned char)(v >> 24);
}

static inline uint32_t dpc_get_le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
