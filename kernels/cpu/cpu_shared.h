/* cpu_shared.h — what the CPU backend's two model families share inside kernels/cpu: the
 * backend state (cpu_impl), the per-thread and split matrix products (cpu_shared.c) and the
 * constants of the work split. cpu_backend.c holds the vtable and GPT-2, cpu_muon.c Muon;
 * cpu_llama.c the Llama-class forward and backward (docs/design.md §3.12). Not part of the
 * kernels' API. */
#ifndef DPC_CPU_SHARED_H
#define DPC_CPU_SHARED_H

#include "kernels/gpt.h"

#include <stddef.h>

#define ATT_BLOCK 64     /* query/key block of the causal attention products */
#define OPT_SEG 16384    /* floats per optimizer work item */
/* Work items per thread for the LayerNorm backward, and at most for the large products: a
 * few, handed out dynamically, so a thread that loses its core to another process does not
 * hold the others at the barrier. Chunk bounds depend only on the thread count and the
 * shapes, and a chunk computes the same whichever thread runs it, so results stay
 * deterministic. */
#define CHUNKS_PER_THREAD 4
/* Products get 2: each block re-packs an operand, which costs more against cpu_gemm's kernel
 * than the finer balance gains (124M at 2 threads, steps alternating in one process: 1.3-3.4%
 * faster than 4 per thread; the small config 1.5-3.1%). */
#define PRODUCT_BLOCKS_PER_THREAD 2
/* A product block keeps at least this many rows (or columns) of the output: each block packs
 * the whole other operand, so thinner blocks spend their time packing (measured: a 256x768
 * by 768x3072 product in 32-row blocks ran at 126 GFLOP/s on 2 threads, against 180-188 in
 * one block per thread or in column blocks). */
#define MIN_BLOCK 256
#define ROWS_PER_ITEM 16 /* rows per dynamic work item of the row-wise kernels */

enum { ST_NONE, ST_LOGITS, ST_LOSS, ST_BACKWARD };

typedef struct {
  size_t off, n; /* a piece of one tensor, in floats */
  int decay;
  int muon;      /* the tensor is one of Muon's (gpt_tensor.muon) */
} cpu_seg;

typedef struct cpu_llama cpu_llama; /* cpu_llama.c's activations */

typedef struct {
  int nt;             /* threads */
  size_t maxN;        /* maxB * maxT */
  float *params;      /* (n_params) canonical layout */
  float *grads;       /* (n_params) */
  float *adam_m;      /* (n_params) */
  float *adam_v;      /* (n_params) */
  float *acts;        /* the one activation allocation the pointers below live in (GPT-2; for
                       * Llama NULL, and logits, losses, lse and lnf point into cpu_llama.c's) */
  float *encoded;     /* (N, C) */
  float *ln1;         /* (L, N, C) */
  float *ln1_mean;    /* (L, N) */
  float *ln1_rstd;    /* (L, N) */
  float *qkv;         /* (L, N, 3C) */
  float *att;         /* (L, B, NH, T, T) softmax probabilities, lower triangle */
  float *atty;        /* (L, N, C) attention output before c_proj */
  float *res2;        /* (L, N, C) residual after attention */
  float *ln2;         /* (L, N, C) */
  float *ln2_mean;    /* (L, N) */
  float *ln2_rstd;    /* (L, N) */
  float *fch;         /* (L, N, 4C) c_fc output before GELU */
  float *fch_gelu;    /* (L, N, 4C) */
  float *res3;        /* (L, N, C) residual after the MLP: the layer's output */
  float *lnf;         /* (N, C) */
  float *lnf_mean;    /* (N) */
  float *lnf_rstd;    /* (N) */
  float *logits;      /* (N, V); dlogits after backward */
  float *losses;      /* (N) */
  float *lse;         /* (N) log-sum-exp of each logits row */
  float *dres;        /* (N, C) gradient of the residual stream */
  float *dtmp;        /* (N, C) dlnf / dln2 / datty / dln1 in turn */
  float *dqkv;        /* (N, 3C) */
  float *dfch;        /* (N, 4C) */
  float *att_scratch; /* (nt, maxT, maxT) per-thread dscores */
  float *ln_part;     /* (nt * CHUNKS_PER_THREAD, 2C) LayerNorm weight/bias gradient partials */
  int *inputs;        /* (N) copy of the last forward's inputs */
  int *targets;       /* (N) */
  int B, T, state;
  int grads_zero;     /* zero_grad since the last backward: gradients read as zero, and the
                       * next backward overwrites instead of accumulating */
  cpu_seg *segs;      /* optimizer work items covering [0, n_params) */
  int nseg;
  double *seg_sumsq;  /* (nseg) */
  int gemm;           /* cpu_gemm implementation (cpu_gemm_pick at create) */
  float *gemm_ws;     /* (nt, cpu_gemm_ws_floats()) one product workspace per thread */
  cpu_llama *ll;      /* Llama activations (cpu_llama.c); NULL for GPT-2 */
  float *muon_ws;     /* Muon's Newton-Schulz scratch (cpu_muon.c), allocated at the first Muon
                       * step for the largest Muon matrix; NULL before */
} cpu_impl;

/* Turns a pending zero_grad into zeros in memory. */
void cpu_grads_materialise(cpu_impl *c);
/* The optimizer's two halves (cpu_shared.c), shared with Muon's step: the global gradient
 * norm into *grad_norm and clip_grad_norm_'s factor into *clip (DPC_ENUMERIC when the norm is
 * not finite); then AdamW on every segment, or with skip_muon on all but Muon's. */
int cpu_clip_grads(gpt_model *m, const gpt_adamw_hparams *hp, float *grad_norm, float *clip);
void cpu_adamw_segs(gpt_model *m, const gpt_adamw_hparams *hp, float lr, int t, float clip, int skip_muon);
/* The MuLoCo inner step of gpt_muon_step (cpu_muon.c). */
int cpu_muon_step(gpt_model *m, const gpt_adamw_hparams *hp, const gpt_muon_hparams *mu, float lr, float muon_lr,
                  int t, float *grad_norm);
/* C = alpha op(A) op(B) + beta C on the calling thread, in its own workspace. */
void cpu_thread_gemm(const cpu_impl *c, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc);
/* Cm[M,N] = op(A) op(B) + beta * Cm, row-major, split across the threads (deterministic);
 * cpu_mm_alpha scales the product by alpha. */
void cpu_mm_alpha(const cpu_impl *c, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *Cm, int ldc);
void cpu_mm(const cpu_impl *c, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
            int ldb, float beta, float *Cm, int ldc);
/* 64-byte aligned, zeroed floats (NULL when out of memory). */
void *cpu_alloc_floats(size_t n);
/* ceil(n / parts) rounded up to whole micro-kernel panels. */
int cpu_split_chunk(int n, int parts);
/* How a product with an M x N output is shared out: along the larger output dimension (a row
 * block packs the whole right operand, a column block the whole left one, so this packs the
 * least), in PRODUCT_BLOCKS_PER_THREAD or 1 blocks per thread: the most that keep MIN_BLOCK rows
 * or columns each. Depends on nt and the shape only. */
typedef struct {
  int by_rows, ch, nch;
} mm_split;
mm_split cpu_plan_split(int nt, int M, int N);
/* Cross-entropy of the N rows of c->logits against c->targets into c->losses and c->lse;
 * *loss gets the mean. DPC_ENUMERIC when it is not finite. */
int cpu_xent_forward(cpu_impl *c, int N, int V, float *loss);
/* One causal attention head of one sequence on the calling thread, in query blocks of
 * ATT_BLOCK: block [i0, i1) only needs keys [0, i1), which skips most of the masked upper
 * triangle. q, k and v are (T, D) with row stride ldqkv (slices of a fused projection row; a
 * grouped-query head reads its KV head's k and v); the probabilities go to A (T, T) and the
 * output to o (T, D), row stride ldo. Both model families run their heads through it. */
void cpu_attn_head_fwd(const cpu_impl *c, float *o, int ldo, float *A, const float *q, const float *k,
                       const float *v, int ldqkv, int T, int D, float scale);
/* Its backward from dO (T, D), row stride ldo: dq (row stride lddq), dk and dv (row stride
 * lddkv) written, not accumulated; S is a (T, T) scratch for the score gradients. */
void cpu_attn_head_bwd(const cpu_impl *c, float *dq, int lddq, float *dk, float *dv, int lddkv, float *S,
                       const float *dO, int ldo, const float *A, const float *q, const float *k, const float *v,
                       int ldqkv, int T, int D, float scale);


#endif
