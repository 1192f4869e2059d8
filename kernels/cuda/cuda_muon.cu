/* cuda_muon.cu — the CUDA backend's MuLoCo inner step (gpt_muon_step, docs/design.md §3.2): the
 * CPU backend's kernels/cpu/cpu_muon.c on the device. The global clip (cudak_norm_clip), AdamW on
 * the work items of the tensors without the muon flag, then per Muon tensor: momentum into the
 * work matrix X (p x q, p <= q, the [out, in] matrix or its transpose), X /= max(|X|_F, 1e-7),
 * ns_steps Newton-Schulz iterations through cuda_gemm (fp32 or tf32 by the handle's math mode,
 * bf16 operands with the bf16 precision: PyTorch's own choice), and the decayed update.
 * Muon's momentum buffer lives in adam_m at the Muon tensors' positions, as on the CPU.
 *
 * cuBLAS is column-major: the row-major p x q buffer X is the column-major q x p matrix X^T, so
 * G = X X^T is op(A) = A^T with A = that buffer, and X' = a X + G2 X is, transposed,
 * a X^T + X^T G2^T. The scratch (X, X', G, G2) and the non-Muon work items are allocated at the
 * first Muon step, for the largest Muon matrix (with the normalisation's partial sums); no
 * step allocates after it. Host code only (the
 * kernels are cuda_kernels.cu's), so tests/unit/test_cuda_muon_wiring.cc compiles this file as
 * host C++ and runs it on the CPU against the CPU backend. */
#include "kernels/cuda/cuda_shared.h"

#include <math.h>
#include <stdlib.h>

struct cuda_muon {
  float *X, *Xn, *G, *G2; /* (p_max * q_max) twice, (p_max^2) twice */
  double *part;           /* cudak_muon_normalize's scratch for p_max * q_max floats */
  cudak_seg *segs;        /* the AdamW work items of the non-Muon tensors */
  int nseg;
};

void cuda_muon_destroy(cuda_impl *c) {
  if (!c->mu) return;
  cudaFree(c->mu->X);
  cudaFree(c->mu->segs);
  cudaFree(c->mu->part);
  free(c->mu);
  c->mu = NULL;
}

/* The scratch and the non-Muon work items, once. */
static int muon_alloc(gpt_model *m, cuda_impl *c) {
  if (c->mu) return 0;
  size_t pq = 0, pp = 0, nseg = 0;
  for (int k = 0; k < m->lay.n_tensors; k++) {
    const gpt_tensor *t = &m->lay.tensors[k];
    if (!t->muon) {
      nseg += (t->numel + CUDAK_SEG - 1) / CUDAK_SEG;
      continue;
    }
    const gpt_muon_shape s = gpt_muon_shape_of(&m->lay, t);
    if ((size_t)s.p * s.q > pq) pq = (size_t)s.p * s.q;
    if ((size_t)s.p * s.p > pp) pp = (size_t)s.p * s.p;
  }
  pq = (pq + 63) & ~(size_t)63;
  pp = (pp + 63) & ~(size_t)63;
  struct cuda_muon *mu = (struct cuda_muon *)calloc(1, sizeof *mu);
  cudak_seg *h = (cudak_seg *)malloc((nseg ? nseg : 1) * sizeof *h);
  if (!mu || !h) {
    free(mu);
    free(h);
    return dpc_err(DPC_ENOMEM, "cuda backend: out of host memory for Muon");
  }
  for (int k = 0; k < m->lay.n_tensors; k++) {
    const gpt_tensor *t = &m->lay.tensors[k];
    for (size_t o = 0; !t->muon && o < t->numel; o += CUDAK_SEG) {
      h[mu->nseg].off = t->offset + o;
      h[mu->nseg].n = (int)(t->numel - o < CUDAK_SEG ? t->numel - o : CUDAK_SEG);
      h[mu->nseg].decay = t->decay;
      mu->nseg++;
    }
  }
  cudaError_t e = cudaMalloc((void **)&mu->X, (2 * pq + 2 * pp) * sizeof(float));
  if (e == cudaSuccess) e = cudaMalloc((void **)&mu->segs, (nseg ? nseg : 1) * sizeof(cudak_seg));
  if (e == cudaSuccess) e = cudaMalloc((void **)&mu->part, cudak_muon_norm_scratch(pq) * sizeof(double));
  if (e == cudaSuccess && nseg) e = cudaMemcpy(mu->segs, h, nseg * sizeof(cudak_seg), cudaMemcpyHostToDevice);
  free(h);
  if (e != cudaSuccess) {
    cudaFree(mu->X);
    cudaFree(mu->segs);
    cudaFree(mu->part);
    free(mu);
    CUDA_TRY(e);
  }
  mu->Xn = mu->X + pq;
  mu->G = mu->Xn + pq;
  mu->G2 = mu->G + pp;
  c->mu = mu;
  return 0;
}

/* Newton-Schulz on the p x q row-major X (normalised); the result is in *X on return. */
static int newton_schulz(cuda_impl *c, float **X, float **Xn, float *G, float *G2, int p, int q, int steps) {
  for (int it = 0; it < steps; it++) {
    TRY(cuda_gemm(c, 1, 0, p, p, q, 1.0f, *X, q, 0, *X, q, 0, 0.0f, G, p, 0, 1)); /* G = X X^T */
    CUDA_TRY(cudaMemcpyAsync(G2, G, (size_t)p * p * sizeof(float), cudaMemcpyDeviceToDevice, c->st));
    TRY(cuda_gemm(c, 0, 0, p, p, p, GPT_MUON_NS_C, G, p, 0, G, p, 0, GPT_MUON_NS_B, G2, p, 0, 1));
    CUDA_TRY(cudaMemcpyAsync(*Xn, *X, (size_t)p * q * sizeof(float), cudaMemcpyDeviceToDevice, c->st));
    TRY(cuda_gemm(c, 0, 1, q, p, p, 1.0f, *X, q, 0, G2, p, 0, GPT_MUON_NS_A, *Xn, q, 0, 1)); /* (a X + G2 X)^T */
    float *tmp = *X;
    *X = *Xn;
    *Xn = tmp;
  }
  return 0;
}

int cuda_muon_step(gpt_model *m, const gpt_adamw_hparams *hp, const gpt_muon_hparams *mu, float lr, float muon_lr,
                   int t, float *grad_norm) {
  cuda_impl *c = (cuda_impl *)m->impl;
  TRY(muon_alloc(m, c));
  struct cuda_muon *w = c->mu;
  TRY(cudak_sumsq_segs(c->seg_sumsq, c->grads, c->segs, c->nseg, c->st));
  TRY(cudak_norm_clip(c->scal, c->seg_sumsq, c->nseg, hp->grad_clip, c->st));
  float norm = 0.0f;
  CUDA_TRY(cudaMemcpyAsync(&norm, c->scal, sizeof norm, cudaMemcpyDeviceToHost, c->st));
  CUDA_TRY(cudaStreamSynchronize(c->st));
  if (grad_norm) *grad_norm = norm;
  if (!isfinite(norm)) return dpc_err(DPC_ENUMERIC, "muon: gradient norm is %f (diverged; lower the learning rate)", norm);
  gpt_adamw_scalars k;
  gpt_adamw_scalars_at(hp, lr, t, &k);
  if (w->nseg)
    TRY(cudak_adamw(c->params, c->grads, c->adam_m, c->adam_v, w->segs, w->nseg, c->scal + 1, k.decay_mul, hp->beta1,
                    k.one_minus_beta1, hp->beta2, k.one_minus_beta2, k.bc2_sqrt, hp->eps, k.neg_step_size, c->st));
  const float decay_mul = (float)(1.0 - (double)muon_lr * (double)mu->weight_decay);
  const float w_buf = (float)(1.0 - (double)mu->momentum), w_nest = mu->momentum;
  for (int i = 0; i < m->lay.n_tensors; i++) {
    const gpt_tensor *tn = &m->lay.tensors[i];
    if (!tn->muon) continue;
    const gpt_muon_shape s = gpt_muon_shape_of(&m->lay, tn);
    const int rows = tn->shape[0], cols = tn->shape[1];
    float *X = w->X, *Xn = w->Xn;
    TRY(cudak_muon_momentum(c->adam_m + tn->offset, c->grads + tn->offset, X, rows, cols, s.flip, c->scal + 1, w_buf,
                            w_nest, mu->nesterov, c->st));
    TRY(cudak_muon_normalize(X, (size_t)s.p * s.q, w->part, c->st));
    TRY(newton_schulz(c, &X, &Xn, w->G, w->G2, s.p, s.q, mu->ns_steps));
    const float neg_lr = (float)(-(double)muon_lr * gpt_muon_adjust(mu->adjust, s.A, s.B));
    TRY(cudak_muon_update(c->params + tn->offset, X, rows, cols, s.flip, decay_mul, neg_lr, c->st));
  }
  return 0;
}
