/* cpu_vmath.h — vectorisable float math shared by the CPU leaf kernels (cpu_kernels.c,
 * llama_kernels.c): a libm call inside a loop keeps GCC from vectorising it, this does not. */
#ifndef DPC_CPU_VMATH_H
#define DPC_CPU_VMATH_H

#include <stdint.h>
#include <string.h>

/* expf for vector loops: Cephes range reduction and degree-6 polynomial (about 1 ulp on the
 * clamped range [-87, 88]; exp(-87) ~ 1.6e-38 stands in for underflow). */
static inline __attribute__((always_inline)) float vexpf(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float t = x * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: round to nearest */
  float n = t - 12582912.0f;
  int32_t ni;
  memcpy(&ni, &t, sizeof ni);
  ni -= 0x4B400000;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t bits = (ni + 127) << 23;
  float s;
  memcpy(&s, &bits, sizeof s);
  return p * s;
}

#endif
