/* cpu_gemm.c — dipaco's own float32 matrix product for the CPU backend (see cpu_gemm.h), after
 * the GotoBLAS/BLIS layering: for each block of NC columns and KC steps of K, the block of
 * op(B) is packed into NR-column panels (it stays in L2), each MR-row panel of op(A) is
 * packed (it stays in L1) and the register-tile kernel multiplies the two panels, keeping an
 * MR x NR tile of C in 24 AVX-512 registers over the KC steps. Transposed operands are packed
 * with 16 x 16 in-register transposes, so every layout reads memory in rows. Edge tiles use
 * masked loads and stores (narrower kernels for the last columns); rows past M are computed
 * in the zero padding of the A panel and not stored.
 *
 * Order of the sums: element (i, j) accumulates k = 0..K-1 in order within each KC block (one
 * FMA chain per element), and blocks are added to C in order; nothing depends on i or j, so
 * splitting a product into row or column blocks gives the same bits (cpu_gemm.h). */
#include "kernels/cpu/cpu_gemm.h"

#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GEMM_MR 8   /* rows of the register tile */
#define GEMM_NR 48  /* columns of the register tile: three 16-float vectors */
#define GEMM_KC 256 /* steps of K per packed block */
#define GEMM_NC 576 /* columns of op(B) per packed block (a multiple of GEMM_NR) */

size_t cpu_gemm_ws_floats(void) { return (size_t)GEMM_KC * GEMM_NC + (size_t)GEMM_KC * GEMM_MR; }

const char *cpu_gemm_name(int impl) { return impl ? "dipaco-avx512" : "openblas"; }

static void gemm_openblas(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                          const float *B, int ldb, float beta, float *C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
              B, ldb, beta, C, ldc);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,fma")))
#define AVX512_INLINE __attribute__((target("avx512f,fma"), always_inline)) static inline

int cpu_gemm_pick(void) {
  const char *e = getenv("DIPACO_CPU_GEMM");
  if (e && strcmp(e, "openblas") == 0) return 0;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") ? 1 : 0;
}

/* Transposes the 16 x 16 block in r (row i in r[i]) in place. */
AVX512_INLINE void tr16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) { /* 4 x 4 transposes inside each 128-bit lane */
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int i = 0; i < 4; i++) { /* then the 128-bit lanes */
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xdd);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xdd);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xdd);
  }
}

static inline __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

/* Packs `rows` (<= width) source rows of `kc` contiguous floats, row r at src + r * ld, into
 * dst as kc rows of `width` floats, transposed: dst[k * width + r] = src[r * ld + k]; rows
 * past `rows` are zero. width is 8 or 16 (one transpose) or 48 (three). */
AVX512_INLINE void pack_transposed(float *dst, int width, const float *src, long ld, int rows, int kc) {
  for (int g = 0; g * 16 < width; g++) {
    const int gr = rows - 16 * g; /* rows of this group of 16 */
    const int out = width < 16 ? width : 16;
    for (int k = 0; k < kc; k += 16) {
      const __mmask16 mk = lanes(kc - k);
      __m512 r[16];
      for (int i = 0; i < 16; i++)
        r[i] = i < gr ? _mm512_maskz_loadu_ps(mk, src + (long)(16 * g + i) * ld + k) : _mm512_setzero_ps();
      tr16(r);
      const int kn = kc - k < 16 ? kc - k : 16;
      for (int i = 0; i < kn; i++) _mm512_mask_storeu_ps(dst + (long)(k + i) * width + 16 * g, lanes(out), r[i]);
    }
  }
}

/* Packs kc rows of `cols` (<= width) contiguous floats, row k at src + k * ld, into dst as kc
 * rows of `width` floats: dst[k * width + j] = src[k * ld + j]; columns past `cols` are zero. */
AVX512_INLINE void pack_rows(float *dst, int width, const float *src, long ld, int cols, int kc) {
  for (int k = 0; k < kc; k++) {
    const float *s = src + (long)k * ld;
    for (int v = 0; v * 16 < width; v++) {
      const int n = width - 16 * v < 16 ? width - 16 * v : 16;
      const __m512 x = _mm512_maskz_loadu_ps(lanes(cols - 16 * v > 0 ? cols - 16 * v : 0), s + 16 * v);
      _mm512_mask_storeu_ps(dst + (long)k * width + 16 * v, lanes(n), x);
    }
  }
}

enum { EPI_STORE, EPI_ADD, EPI_SCALE };

/* The register tile: acc[MR][NV * 16] = sum over kc of a-panel (kc x MR) times b-panel
 * (kc x NR, the first NV vectors used); then, for rows < mr and the columns of mlast in the
 * last vector, C = alpha acc (EPI_STORE), fma(alpha, acc, C) (EPI_ADD) or
 * fma(alpha, acc, beta C) (EPI_SCALE). */
AVX512_INLINE void tile(const int NV, int kc, const float *a, const float *b, float *c, long ldc, int mr,
                        __mmask16 mlast, float alpha, float beta, int epi) {
  __m512 acc[GEMM_MR][3];
  for (int i = 0; i < GEMM_MR; i++)
    for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();
  for (int k = 0; k < kc; k++) {
    __m512 bv[3];
    for (int v = 0; v < NV; v++) bv[v] = _mm512_load_ps(b + 16 * v);
    for (int i = 0; i < GEMM_MR; i++) {
      const __m512 ai = _mm512_set1_ps(a[i]);
      for (int v = 0; v < NV; v++) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
    a += GEMM_MR;
    b += GEMM_NR;
  }
  const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
  for (int i = 0; i < GEMM_MR; i++) {
    if (i >= mr) break;
    float *ci = c + (long)i * ldc;
    for (int v = 0; v < NV; v++) {
      const __mmask16 m = v == NV - 1 ? mlast : (__mmask16)0xFFFF;
      __m512 x;
      if (epi == EPI_STORE) x = _mm512_mul_ps(al, acc[i][v]);
      else if (epi == EPI_ADD) x = _mm512_fmadd_ps(al, acc[i][v], _mm512_maskz_loadu_ps(m, ci + 16 * v));
      else x = _mm512_fmadd_ps(al, acc[i][v], _mm512_mul_ps(be, _mm512_maskz_loadu_ps(m, ci + 16 * v)));
      _mm512_mask_storeu_ps(ci + 16 * v, m, x);
    }
  }
}

AVX512 __attribute__((noinline)) static void tile1(int kc, const float *a, const float *b, float *c, long ldc,
                                                    int mr, __mmask16 ml, float al, float be, int epi) {
  tile(1, kc, a, b, c, ldc, mr, ml, al, be, epi);
}
AVX512 __attribute__((noinline)) static void tile2(int kc, const float *a, const float *b, float *c, long ldc,
                                                    int mr, __mmask16 ml, float al, float be, int epi) {
  tile(2, kc, a, b, c, ldc, mr, ml, al, be, epi);
}
AVX512 __attribute__((noinline)) static void tile3(int kc, const float *a, const float *b, float *c, long ldc,
                                                    int mr, __mmask16 ml, float al, float be, int epi) {
  tile(3, kc, a, b, c, ldc, mr, ml, al, be, epi);
}

AVX512 static void gemm_avx512(float *ws, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                               int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  float *bpack = ws, *apack = ws + (size_t)GEMM_KC * GEMM_NC;
  for (int jc = 0; jc < N; jc += GEMM_NC) {
    const int nc = N - jc < GEMM_NC ? N - jc : GEMM_NC;
    for (int pc = 0; pc < K; pc += GEMM_KC) {
      const int kc = K - pc < GEMM_KC ? K - pc : GEMM_KC;
      const int epi = pc > 0 || beta == 1.0f ? EPI_ADD : beta == 0.0f ? EPI_STORE : EPI_SCALE;
      for (int jr = 0; jr < nc; jr += GEMM_NR) { /* op(B)[pc.., jc+jr..] -> panel kc x NR */
        const int nr = nc - jr < GEMM_NR ? nc - jr : GEMM_NR;
        float *dst = bpack + (size_t)jr * kc;
        if (tb) pack_transposed(dst, GEMM_NR, B + (long)(jc + jr) * ldb + pc, ldb, nr, kc);
        else pack_rows(dst, GEMM_NR, B + (long)pc * ldb + jc + jr, ldb, nr, kc);
      }
      for (int ic = 0; ic < M; ic += GEMM_MR) { /* op(A)[ic.., pc..] -> panel kc x MR */
        const int mr = M - ic < GEMM_MR ? M - ic : GEMM_MR;
        if (ta) pack_rows(apack, GEMM_MR, A + (long)pc * lda + ic, lda, mr, kc);
        else pack_transposed(apack, GEMM_MR, A + (long)ic * lda + pc, lda, mr, kc);
        for (int jr = 0; jr < nc; jr += GEMM_NR) {
          const int nr = nc - jr < GEMM_NR ? nc - jr : GEMM_NR;
          const float *bp = bpack + (size_t)jr * kc;
          float *c = C + (long)ic * ldc + jc + jr;
          if (nr > 32) tile3(kc, apack, bp, c, ldc, mr, lanes(nr - 32), alpha, beta, epi);
          else if (nr > 16) tile2(kc, apack, bp, c, ldc, mr, lanes(nr - 16), alpha, beta, epi);
          else tile1(kc, apack, bp, c, ldc, mr, lanes(nr), alpha, beta, epi);
        }
      }
    }
  }
}

void cpu_gemm(int impl, float *ws, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (!impl || K <= 0) {
    gemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  gemm_avx512(ws, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#else /* not x86-64 with GCC or Clang: OpenBLAS only */

int cpu_gemm_pick(void) { return 0; }

void cpu_gemm(int impl, float *ws, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc) {
  (void)impl;
  (void)ws;
  gemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#endif
