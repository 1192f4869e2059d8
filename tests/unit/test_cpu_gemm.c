/* test_cpu_gemm.c — dipaco's own matrix product (kernels/cpu/cpu_gemm.c) against a double
 * precision reference: every transpose combination, alpha and beta (beta 0 must not read C),
 * shapes across the tile and block edges (M, N, K from 1 to past KC and NC), padded leading
 * dimensions (what lies outside the product must stay untouched), and the promise the backend
 * relies on: a row or column block of a product equals those rows or columns of the whole
 * product, bit for bit. Skips (exit 77, saying why) where the CPU has no AVX-512. */
#include "kernels/cpu/cpu_gemm.h"
#include "tests/unit/test.h"

#include <float.h>
#include <stdint.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 40) * (1.0 / 16777216.0)) - 0.5f;
}
static int irand(int lo, int hi) {
  (void)frand();
  return lo + (int)((rng >> 33) % (uint64_t)(hi - lo + 1));
}

static float *ws;

/* element (i, k) of op(A) and (k, j) of op(B) */
static float opa(const float *A, int lda, int ta, int i, int k) {
  return ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
}
static float opb(const float *B, int ldb, int tb, int k, int j) {
  return tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
}

/* One random case; returns the number of bad elements. */
static int one_case(int M, int N, int K, int ta, int tb, float alpha, float beta, int pad) {
  const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
  float *A = malloc(na * sizeof(float)), *B = malloc(nb * sizeof(float)), *C = malloc(nc * sizeof(float));
  float *C0 = malloc(nc * sizeof(float));
  for (size_t i = 0; i < na; i++) A[i] = frand();
  for (size_t i = 0; i < nb; i++) B[i] = frand();
  for (size_t i = 0; i < nc; i++) C0[i] = frand();
  memcpy(C, C0, nc * sizeof(float));
  if (beta == 0.0f) /* must not be read: NaN in the product's part of C */
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = NAN;
  cpu_gemm(1, ws, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  int bad = 0;
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < ldc; j++) {
      const float got = C[(size_t)i * ldc + j];
      if (j >= N) { /* padding: untouched */
        if (memcmp(&got, &C0[(size_t)i * ldc + j], sizeof got) != 0) bad++;
        continue;
      }
      double ref = 0.0, mag = 0.0;
      for (int k = 0; k < K; k++) {
        const double p = (double)opa(A, lda, ta, i, k) * opb(B, ldb, tb, k, j);
        ref += p;
        mag += fabs(p);
      }
      const double c0 = beta == 0.0f ? 0.0 : (double)beta * C0[(size_t)i * ldc + j];
      ref = alpha * ref + c0;
      const double tol = 4.0 * FLT_EPSILON * ((K + 2) * fabs(alpha) * mag + 2.0 * fabs(c0)) + 1e-30;
      if (!(fabs(got - ref) <= tol)) {
        if (bad < 3)
          fprintf(stderr, "M%d N%d K%d ta%d tb%d alpha %g beta %g pad %d: C[%d,%d] = %.9g, expected %.9g\n", M, N, K,
                  ta, tb, alpha, beta, pad, i, j, got, ref);
        bad++;
      }
    }
  }
  free(A);
  free(B);
  free(C);
  free(C0);
  return bad;
}

/* The product in row blocks and in column blocks, split at `cut`, equals the whole one. */
static int split_case(int M, int N, int K, int ta, int tb, float beta, int cut_r, int cut_c) {
  const int lda = ta ? M : K, ldb = tb ? K : N;
  const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
  float *A = malloc(na * sizeof(float)), *B = malloc(nb * sizeof(float));
  float *C0 = malloc(nc * sizeof(float)), *W = malloc(nc * sizeof(float)), *R = malloc(nc * sizeof(float)),
        *Cc = malloc(nc * sizeof(float));
  for (size_t i = 0; i < na; i++) A[i] = frand();
  for (size_t i = 0; i < nb; i++) B[i] = frand();
  for (size_t i = 0; i < nc; i++) C0[i] = frand();
  memcpy(W, C0, nc * sizeof(float));
  memcpy(R, C0, nc * sizeof(float));
  memcpy(Cc, C0, nc * sizeof(float));
  cpu_gemm(1, ws, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, W, N);
  /* rows [0, cut_r) and [cut_r, M) */
  cpu_gemm(1, ws, ta, tb, cut_r, N, K, 1.0f, A, lda, B, ldb, beta, R, N);
  cpu_gemm(1, ws, ta, tb, M - cut_r, N, K, 1.0f, ta ? A + cut_r : A + (size_t)cut_r * lda, lda, B, ldb, beta,
           R + (size_t)cut_r * N, N);
  /* columns [0, cut_c) and [cut_c, N) */
  cpu_gemm(1, ws, ta, tb, M, cut_c, K, 1.0f, A, lda, B, ldb, beta, Cc, N);
  cpu_gemm(1, ws, ta, tb, M, N - cut_c, K, 1.0f, A, lda, tb ? B + (size_t)cut_c * ldb : B + cut_c, ldb, beta,
           Cc + cut_c, N);
  const int ok = memcmp(W, R, nc * sizeof(float)) == 0 && memcmp(W, Cc, nc * sizeof(float)) == 0;
  if (!ok)
    fprintf(stderr, "split M%d N%d K%d ta%d tb%d beta %g at row %d / column %d: blocks differ from the whole\n", M, N,
            K, ta, tb, beta, cut_r, cut_c);
  free(A);
  free(B);
  free(C0);
  free(W);
  free(R);
  free(Cc);
  return ok;
}

int main(void) {
  if (!__builtin_cpu_supports("avx512f")) {
    printf("SKIP: this CPU has no AVX-512, so cpu_gemm runs OpenBLAS and dipaco's kernel cannot run here\n");
    return 77;
  }
  ws = aligned_alloc(64, ((cpu_gemm_ws_floats() * sizeof(float) + 63) / 64) * 64);
  CHECK(ws != NULL);
  /* Edges of the 8 x 48 tile, the 16-wide transposes, KC = 256 and NC = 576. */
  static const int dims[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 47, 48, 49, 95, 97};
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int d = 0; d < (int)(sizeof dims / sizeof dims[0]); d++) {
        const int M = dims[d], N = dims[(d * 7 + 3) % 15], K = dims[(d * 11 + 5) % 15];
        CHECK_EQ_INT(one_case(M, N, K, ta, tb, 1.0f, 0.0f, 0), 0);
        CHECK_EQ_INT(one_case(N, K, M, ta, tb, 1.0f, 1.0f, 3), 0);
      }
  for (int c = 0; c < 120; c++) {
    const int ta = c & 1, tb = (c >> 1) & 1;
    const int M = irand(1, 70), N = irand(1, c % 10 == 0 ? 1300 : 130), K = irand(1, c % 7 == 0 ? 700 : 90);
    const float alpha = c % 3 == 0 ? 0.37f : 1.0f;
    const float beta = c % 4 == 1 ? 1.0f : c % 4 == 2 ? -0.5f : 0.0f;
    CHECK_EQ_INT(one_case(M, N, K, ta, tb, alpha, beta, c % 5 == 0 ? 5 : 0), 0);
  }
  /* Splits as the backend makes them (16-aligned) and at odd places. */
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      CHECK(split_case(64, 96, 300, ta, tb, 0.0f, 32, 48));
      CHECK(split_case(61, 700, 520, ta, tb, 1.0f, 13, 577));
      CHECK(split_case(100, 50, 17, ta, tb, 0.0f, 99, 1));
    }
  /* K = 0 leaves beta * C, as BLAS does. */
  float a1 = 1.0f, b1 = 1.0f, c1 = 3.0f;
  cpu_gemm(1, ws, 0, 0, 1, 1, 0, 1.0f, &a1, 1, &b1, 1, 0.5f, &c1, 1);
  CHECK_NEAR(c1, 1.5f, 0.0);
  free(ws);
  TEST_DONE();
}
