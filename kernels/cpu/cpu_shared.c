/* cpu_shared.c — what the CPU backend's two model families share (cpu_shared.h): the
 * per-thread and split matrix products, aligned allocation, the cross-entropy forward, one
 * causal attention head, forward and backward, and the optimizer's gradient clip and AdamW
 * pass (which Muon's step in cpu_muon.c shares too).
 * cpu_backend.c (GPT-2, the vtable), cpu_llama.c (the Llama family) and cpu_muon.c call it; it
 * calls none of them. */
#include "kernels/cpu/cpu_shared.h"
#include "common/errors.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* C = alpha op(A) op(B) + beta C on the calling thread, in its own workspace. */
void cpu_thread_gemm(const cpu_impl *c, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc) {
  float *ws = c->gemm_ws + (size_t)omp_get_thread_num() * cpu_gemm_ws_floats();
  cpu_gemm(c->gemm, ws, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void *cpu_alloc_floats(size_t n) {
  void *p = NULL;
  if (n == 0) n = 1;
  if (n > SIZE_MAX / sizeof(float) || posix_memalign(&p, 64, n * sizeof(float)) != 0) return NULL;
  memset(p, 0, n * sizeof(float));
  return p;
}

int cpu_split_chunk(int n, int parts) {
  int ch = (n + parts - 1) / parts;
  return (ch + 15) & ~15; /* whole micro-kernel panels per chunk */
}

mm_split cpu_plan_split(int nt, int M, int N) {
  mm_split s;
  s.by_rows = M >= N;
  const int dim = s.by_rows ? M : N;
  int per = PRODUCT_BLOCKS_PER_THREAD;
  while (per > 1 && dim / (nt * per) < MIN_BLOCK) per /= 2;
  s.ch = cpu_split_chunk(dim, nt * per);
  s.nch = (dim + s.ch - 1) / s.ch;
  return s;
}

/* Cm[M,N] = alpha op(A) op(B) + beta * Cm, row-major, split as cpu_plan_split says. */
void cpu_mm_alpha(const cpu_impl *c, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, float *Cm, int ldc) {
  const int nt = c->nt;
  if (nt == 1 || (double)M * N * K < 262144.0) {
    cpu_thread_gemm(c, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
    return;
  }
  const mm_split sp = cpu_plan_split(nt, M, N);
  const int dim = sp.by_rows ? M : N;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int i = 0; i < sp.nch; i++) {
    const int lo = i * sp.ch, hi = lo + sp.ch < dim ? lo + sp.ch : dim;
    if (sp.by_rows) {
      const float *a = ta ? A + lo : A + (size_t)lo * lda;
      cpu_thread_gemm(c, ta, tb, hi - lo, N, K, alpha, a, lda, B, ldb, beta, Cm + (size_t)lo * ldc, ldc);
    } else {
      const float *b = tb ? B + (size_t)lo * ldb : B + lo;
      cpu_thread_gemm(c, ta, tb, M, hi - lo, K, alpha, A, lda, b, ldb, beta, Cm + lo, ldc);
    }
  }
}

void cpu_mm(const cpu_impl *c, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
            int ldb, float beta, float *Cm, int ldc) {
  cpu_mm_alpha(c, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, Cm, ldc);
}

int cpu_xent_forward(cpu_impl *c, int N, int V, float *loss) {
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++)
    c->losses[n] = cpuk_xent_row(c->logits + (size_t)n * V, V, c->targets[n], &c->lse[n]);
  double sum = 0.0;
  for (int n = 0; n < N; n++) sum += c->losses[n];
  *loss = (float)(sum / N);
  c->state = ST_LOSS;
  if (!isfinite(*loss)) return dpc_err(DPC_ENUMERIC, "forward: loss is %f (diverged; lower the learning rate)", *loss);
  return 0;
}

void cpu_attn_head_fwd(const cpu_impl *c, float *o, int ldo, float *A, const float *q, const float *k,
                       const float *v, int ldqkv, int T, int D, float scale) {
  for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
    const int i1 = i0 + ATT_BLOCK < T ? i0 + ATT_BLOCK : T, bm = i1 - i0;
    cpu_thread_gemm(c, 0, 1, bm, i1, D, scale, q + (size_t)i0 * ldqkv, ldqkv, k, ldqkv, 0.0f, A + (size_t)i0 * T, T);
    for (int t = i0; t < i1; t++) cpuk_causal_softmax_row(A + (size_t)t * T, t, i1);
    cpu_thread_gemm(c, 0, 0, bm, D, i1, 1.0f, A + (size_t)i0 * T, T, v, ldqkv, 0.0f, o + (size_t)i0 * ldo, ldo);
  }
}

void cpu_attn_head_bwd(const cpu_impl *c, float *dq, int lddq, float *dk, float *dv, int lddkv, float *S,
                       const float *dO, int ldo, const float *A, const float *q, const float *k, const float *v,
                       int ldqkv, int T, int D, float scale) {
  for (int i0 = 0; i0 < T; i0 += ATT_BLOCK) {
    const int i1 = i0 + ATT_BLOCK < T ? i0 + ATT_BLOCK : T, bm = i1 - i0;
    cpu_thread_gemm(c, 0, 1, bm, i1, D, 1.0f, dO + (size_t)i0 * ldo, ldo, v, ldqkv, 0.0f, S + (size_t)i0 * T, T);
    for (int t = i0; t < i1; t++) cpuk_causal_softmax_bwd_row(S + (size_t)t * T, A + (size_t)t * T, t, i1, scale);
    cpu_thread_gemm(c, 0, 0, bm, D, i1, 1.0f, S + (size_t)i0 * T, T, k, ldqkv, 0.0f, dq + (size_t)i0 * lddq, lddq);
  }
  /* Key block [j0, j1) receives from queries [j0, T) only. */
  for (int j0 = 0; j0 < T; j0 += ATT_BLOCK) {
    const int j1 = j0 + ATT_BLOCK < T ? j0 + ATT_BLOCK : T, bn = j1 - j0;
    cpu_thread_gemm(c, 1, 0, bn, D, T - j0, 1.0f, A + (size_t)j0 * T + j0, T, dO + (size_t)j0 * ldo, ldo, 0.0f,
                    dv + (size_t)j0 * lddkv, lddkv);
    cpu_thread_gemm(c, 1, 0, bn, D, T - j0, 1.0f, S + (size_t)j0 * T + j0, T, q + (size_t)j0 * ldqkv, ldqkv, 0.0f,
                    dk + (size_t)j0 * lddkv, lddkv);
  }
}

/* ---- optimizer ------------------------------------------------------------------------- */

void cpu_grads_materialise(cpu_impl *c) {
  if (!c->grads_zero) return;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int s = 0; s < c->nseg; s++) memset(c->grads + c->segs[s].off, 0, c->segs[s].n * sizeof(float));
  c->grads_zero = 0;
}

int cpu_clip_grads(gpt_model *m, const gpt_adamw_hparams *hp, float *grad_norm, float *clip_out) {
  cpu_impl *c = m->impl;
  const int nt = c->nt;
  cpu_grads_materialise(c); /* a step without a backward since zero_grad: zero gradients */
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4)
  for (int s = 0; s < c->nseg; s++) c->seg_sumsq[s] = cpuk_sumsq(c->grads + c->segs[s].off, c->segs[s].n);
  double sumsq = 0.0;
  for (int s = 0; s < c->nseg; s++) sumsq += c->seg_sumsq[s];
  const float norm = (float)sqrt(sumsq);
  if (grad_norm) *grad_norm = norm;
  if (!isfinite(norm)) return dpc_err(DPC_ENUMERIC, "adamw: gradient norm is %f (diverged; lower the learning rate)", norm);

  /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (total + 1e-6), applied when < 1. */
  float clip = 1.0f;
  if (hp->grad_clip > 0.0f) {
    float coef = hp->grad_clip / (norm + 1e-6f);
    if (coef < 1.0f) clip = coef;
  }
  *clip_out = clip;
  return 0;
}

void cpu_adamw_segs(gpt_model *m, const gpt_adamw_hparams *hp, float lr, int t, float clip, int skip_muon) {
  cpu_impl *c = m->impl;
  gpt_adamw_scalars k;
  gpt_adamw_scalars_at(hp, lr, t, &k);
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 4)
  for (int s = 0; s < c->nseg; s++) {
    const cpu_seg *g = &c->segs[s];
    if (skip_muon && g->muon) continue;
    cpuk_adamw(c->params + g->off, c->grads + g->off, c->adam_m + g->off, c->adam_v + g->off, g->n, clip,
               g->decay ? k.decay_mul : 1.0f, hp->beta1, k.one_minus_beta1, hp->beta2, k.one_minus_beta2, k.bc2_sqrt,
               hp->eps, k.neg_step_size);
  }
}
