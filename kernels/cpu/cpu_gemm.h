/* cpu_gemm.h — the CPU backend's single-threaded float32 matrix product: row-major
 * C = alpha op(A) op(B) + beta C, with op a transpose or not, as cblas_sgemm. On x86-64 CPUs
 * with AVX-512 it runs dipaco's own blocked product (packed operands, an 8 x 48 register-tile
 * kernel); elsewhere, or when DIPACO_CPU_GEMM=openblas, it calls OpenBLAS.
 *
 * Results are deterministic and do not depend on how the caller splits a product into blocks:
 * every element of C sums its K products in one fixed order (blocks of 256 along K, in
 * order) whatever its row and column, so a row or column block of a product equals the same
 * rows or columns of the whole product, bit for bit. The caller provides a workspace of
 * cpu_gemm_ws_floats() floats per concurrent call (64-byte aligned); no call allocates. */
#ifndef DPC_CPU_GEMM_H
#define DPC_CPU_GEMM_H

#include <stddef.h>

/* Which implementation cpu_gemm runs with impl = cpu_gemm_pick(): 1 for dipaco's own
 * (AVX-512 present and DIPACO_CPU_GEMM is not "openblas"), 0 for OpenBLAS. */
int cpu_gemm_pick(void);

/* "dipaco-avx512" or "openblas", for logs and benches. */
const char *cpu_gemm_name(int impl);

/* Floats of workspace one call needs. */
size_t cpu_gemm_ws_floats(void);

/* C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C (C is not read when beta == 0), row-major
 * with leading dimensions lda, ldb, ldc as in cblas_sgemm(CblasRowMajor, ...). */
void cpu_gemm(int impl, float *ws, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
              const float *B, int ldb, float beta, float *C, int ldc);

#endif
