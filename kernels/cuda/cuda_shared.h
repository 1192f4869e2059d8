/* cuda_shared.h — what the CUDA backend's two model files share (cuda_backend.cu with GPT-2,
 * the vtable and the optimizer; cuda_llama_model.cu with the Llama family; cuda_muon.cu with
 * Muon's step): the backend state, the error macros, the cuBLAS product (cuda_shared.cu) and
 * the Llama and Muon entry points, which only cuda_backend.cu calls. Internal to kernels/cuda; compiled as CUDA C++ only. */
#ifndef DPC_CUDA_SHARED_H
#define DPC_CUDA_SHARED_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "common/errors.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/gpt.h"
}

enum { ST_NONE, ST_LOGITS, ST_LOSS, ST_BACKWARD };
enum { PREC_FP32 = 0, PREC_TF32 = 1, PREC_BF16 = 2 };

typedef struct cuda_impl {
  int precision;
  cudaStream_t st;
  cublasHandle_t blas;
  float *store;       /* params | grads | adam_m | adam_v, n_params each */
  float *params, *grads, *adam_m, *adam_v;
  float *acts;        /* the one activation allocation the pointers below live in; the shapes
                       * are GPT-2's; for Llama only encoded, lnf, logits, losses, lse, dres,
                       * dtmp, datt (B, NH, T, T), part and scal are set, the rest is in ll */
  float *encoded;     /* (N, C) */
  float *ln1;         /* (L, N, C) */
  float *ln1_mean;    /* (L, N) */
  float *ln1_rstd;    /* (L, N) */
  float *qkv;         /* (L, N, 3C) */
  float *att;         /* (L, B, NH, T, T) softmax probabilities (zero above the diagonal) */
  float *atty;        /* (L, N, C) attention output before c_proj */
  float *res2;        /* (L, N, C) */
  float *ln2;         /* (L, N, C) */
  float *ln2_mean;    /* (L, N) */
  float *ln2_rstd;    /* (L, N) */
  float *fch;         /* (L, N, 4C) c_fc output before GELU */
  float *fch_gelu;    /* (L, N, 4C) */
  float *res3;        /* (L, N, C) */
  float *lnf;         /* (N, C) */
  float *lnf_mean;    /* (N) */
  float *lnf_rstd;    /* (N) */
  float *logits;      /* (N, V); dlogits after backward */
  float *losses;      /* (N) */
  float *lse;         /* (N) */
  float *dres;        /* (N, C) */
  float *dtmp;        /* (N, C) */
  float *dqkv;        /* (N, 3C) */
  float *dfch;        /* (N, 4C) */
  float *qkvr;        /* (3, B, NH, T, hs) q, k, v by head */
  float *dqkvr;       /* (3, B, NH, T, hs) dq, dk, dv by head */
  float *yr;          /* (B, NH, T, hs) attention output / its gradient, by head */
  float *datt;        /* (B, NH, T, T) dscores */
  float *part;        /* column-sum partials */
  float *scal;        /* (2) grad norm, clip coefficient */
  double *dsum;       /* (1) loss sum */
  double *seg_sumsq;  /* (nseg) */
  cudak_seg *segs;    /* (nseg) device copy of the optimizer work items */
  int nseg;
  uint16_t *a16, *b16; /* bf16 operand copies, n16 elements each (bf16 precision only) */
  size_t n16;
  int *d_tok;         /* inputs (N) | targets (N) | uniq (N) | start (N+1) | pos (N) */
  int *h_tok;         /* host staging of the same */
  int *h_cnt;         /* (V) counting-sort buckets for the wte gradient */
  int U;              /* distinct input tokens of the last forward */
  int B, T, state;
  struct cuda_llama *ll; /* the Llama family's buffers (cuda_llama_model.cu); NULL for GPT-2 */
  struct cuda_muon *mu;  /* Muon's scratch (cuda_muon.cu), from the first Muon step; NULL before */
} cuda_impl;

#define CUDA_TRY(call)                                                                                  \
  do {                                                                                                  \
    cudaError_t e_ = (call);                                                                            \
    if (e_ != cudaSuccess)                                                                              \
      return dpc_err(e_ == cudaErrorMemoryAllocation ? DPC_ENOMEM : DPC_EBACKEND, "cuda: %s:%d: %s: %s", \
                     __FILE__, __LINE__, #call, cudaGetErrorString(e_));                                \
  } while (0)

#define BLAS_TRY(call)                                                                                     \
  do {                                                                                                     \
    cublasStatus_t s_ = (call);                                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                                       \
      return dpc_err(DPC_EBACKEND, "cublas: %s:%d: %s: %s", __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
  } while (0)

#define TRY(call)              \
  do {                         \
    int rc_ = (call);          \
    if (rc_) return rc_;       \
  } while (0)

/* Column-major Cm = alpha op(A) op(B) + beta Cm over `batch` matrices (strides in elements),
 * cuBLAS's contract; in bf16 precision A and B are rounded to bfloat16 copies first, which
 * must fit c->n16 (DPC_EINTERNAL otherwise). */
int cuda_gemm(cuda_impl *c, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, long long sA,
              const float *B, int ldb, long long sB, float beta, float *Cm, int ldc, long long sC, int batch);

/* ---- Muon (cuda_muon.cu) ---- */

/* gpt_muon_step on the device (the vtable's muon_step); cuda_muon_destroy frees its scratch. */
int cuda_muon_step(gpt_model *m, const gpt_adamw_hparams *hp, const gpt_muon_hparams *mu, float lr, float muon_lr,
                   int t, float *grad_norm);
void cuda_muon_destroy(cuda_impl *c);

/* ---- the Llama family (cuda_llama_model.cu) ---- */

/* The activation buffers for maxB x maxT: sizes[i] floats for *ptrs[i], i < the count returned
 * (at most cap; the caller carves them out of c->acts, then calls cuda_llama_init). *n16 gets
 * the largest bf16 operand of any product. Allocates the host-side struct c->ll;
 * DPC_ENOMEM / DPC_EINTERNAL. */
int cuda_llama_plan(gpt_model *m, cuda_impl *c, double *sizes, float ***ptrs, int cap, double *n16);
/* Uploads the RoPE tables once (create time; nothing allocates per step). */
int cuda_llama_init(gpt_model *m, cuda_impl *c);
void cuda_llama_destroy(cuda_impl *c);
/* The passes after cuda_backend.cu's common part: forward from the uploaded tokens to the
 * logits of B x T; backward from the dlogits in c->logits down to the embedding gradient. */
int cuda_llama_forward(gpt_model *m, cuda_impl *c, int B, int T);
int cuda_llama_backward(gpt_model *m, cuda_impl *c);

#endif
