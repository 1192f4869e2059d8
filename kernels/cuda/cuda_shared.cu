/* cuda_shared.cu — the CUDA backend's matrix product (cuda_shared.h), used by both model files:
 * cuBLAS SGEMM in fp32 or tf32 (the handle's math mode), or with bf16 operand copies and FP32
 * accumulation. It sits below cuda_backend.cu and cuda_llama_model.cu so calls go one way. */
#include "kernels/cuda/cuda_shared.h"

/* Elements a column-major operand of op(X) (rows x cols after op) spans with leading
 * dimension ld, over `batch` matrices `stride` apart. */
static size_t extent(int trans, int rows, int cols, int ld, long long stride, int batch) {
  const size_t one = trans ? (size_t)(rows - 1) * ld + cols : (size_t)(cols - 1) * ld + rows;
  return (size_t)(batch - 1) * (size_t)stride + one;
}

/* cuda_shared.h's product. */
int cuda_gemm(cuda_impl *c, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, long long sA,
              const float *B, int ldb, long long sB, float beta, float *Cm, int ldc, long long sC, int batch) {
  const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (c->precision == PREC_BF16) {
    const size_t na = extent(ta, m, k, lda, sA, batch), nb = extent(tb, k, n, ldb, sB, batch);
    if (na > c->n16 || nb > c->n16)
      return dpc_err(DPC_EINTERNAL, "cuda backend: bf16 operand of %zu/%zu elements exceeds scratch %zu", na, nb,
                     c->n16);
    TRY(cudak_to_bf16(c->a16, A, na, c->st));
    TRY(cudak_to_bf16(c->b16, B, nb, c->st));
    BLAS_TRY(cublasGemmStridedBatchedEx(c->blas, oa, ob, m, n, k, &alpha, c->a16, CUDA_R_16BF, lda, sA, c->b16,
                                        CUDA_R_16BF, ldb, sB, &beta, Cm, CUDA_R_32F, ldc, sC, batch,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
  }
  if (batch == 1) BLAS_TRY(cublasSgemm(c->blas, oa, ob, m, n, k, &alpha, A, lda, B, ldb, &beta, Cm, ldc));
  else
    BLAS_TRY(cublasSgemmStridedBatched(c->blas, oa, ob, m, n, k, &alpha, A, lda, sA, B, ldb, sB, &beta, Cm, ldc, sC,
                                       batch));
  return 0;
}

