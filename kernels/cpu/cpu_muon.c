/* cpu_muon.c — the CPU backend's MuLoCo inner step (gpt_muon_step, docs/design.md §3.2):
 * the global clip and AdamW of cpu_backend.c on the tensors without the muon flag, and
 * torch.optim.Muon on those with it. Muon's momentum buffer is kept in adam_m at the Muon
 * tensors' positions, so the optimizer-state calls carry it unchanged.
 *
 * The Newton-Schulz iteration runs in fp32 through the backend's split products (cpu_mm_alpha,
 * threaded and deterministic), on the orientation torch works on: the [out, in] matrix, or its
 * transpose when it is taller than wide, so the Gram matrix is the smaller square. The scratch
 * (the iterate twice and the two Gram-sized squares) is one allocation made at the first Muon
 * step, sized for the largest Muon matrix; no step allocates after it. */
#include "common/errors.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_shared.h"
#include "kernels/gpt.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define NORM_CHUNKS 64 /* fixed pieces of the Frobenius norm, summed in order (deterministic) */

/* Allocates the scratch at the first Muon step: 2 p*q + 2 p*p floats for the largest. */
static int muon_scratch(gpt_model *m, cpu_impl *c, size_t *pq_max, size_t *pp_max) {
  size_t pq = 0, pp = 0;
  for (int k = 0; k < m->lay.n_tensors; k++) {
    const gpt_tensor *t = &m->lay.tensors[k];
    if (!t->muon) continue;
    gpt_muon_shape s = gpt_muon_shape_of(&m->lay, t);
    if ((size_t)s.p * s.q > pq) pq = (size_t)s.p * s.q;
    if ((size_t)s.p * s.p > pp) pp = (size_t)s.p * s.p;
  }
  *pq_max = (pq + 15) & ~(size_t)15; /* 64-byte aligned starts */
  *pp_max = (pp + 15) & ~(size_t)15;
  if (c->muon_ws) return 0;
  c->muon_ws = cpu_alloc_floats(2 * *pq_max + 2 * *pp_max);
  if (!c->muon_ws) return dpc_err(DPC_ENOMEM, "muon: cannot allocate the Newton-Schulz scratch (%zu floats)",
                                  2 * *pq_max + 2 * *pp_max);
  return 0;
}

/* Momentum and the Nesterov blend of tensor t into X (work orientation): g is scaled by clip
 * (written back, as clip_grad_norm_ does), buf = lerp(buf, g, 1 - mu), U = lerp(g, buf, mu)
 * or buf. Returns the Frobenius norm of U. */
static double momentum_into(const cpu_impl *c, const gpt_tensor *t, const gpt_muon_shape *s, const gpt_muon_hparams *mu,
                            float clip, float *X) {
  float *g = c->grads + t->offset, *buf = c->adam_m + t->offset;
  const int rows = t->shape[0], cols = t->shape[1], ch = (rows + c->nt - 1) / c->nt;
  const float w_buf = (float)(1.0 - (double)mu->momentum), w_nest = mu->momentum;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int k = 0; k < c->nt; k++) {
    const int r0 = k * ch, r1 = r0 + ch < rows ? r0 + ch : rows;
    if (r0 < r1) cpuk_muon_momentum(buf, g, X, rows, cols, r0, r1, s->flip, clip, w_buf, w_nest, mu->nesterov);
  }
  const size_t n = (size_t)s->p * s->q;
  double part[NORM_CHUNKS];
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int k = 0; k < NORM_CHUNKS; k++) {
    const size_t lo = n * k / NORM_CHUNKS, hi = n * (k + 1) / NORM_CHUNKS;
    part[k] = hi > lo ? cpuk_sumsq(X + lo, hi - lo) : 0.0;
  }
  double sumsq = 0.0;
  for (int k = 0; k < NORM_CHUNKS; k++) sumsq += part[k];
  return sqrt(sumsq);
}

/* torch's _zeropower_via_newtonschulz on X (p x q) in place, with Xn, G, G2 scratch:
 * X /= max(|X|_F, 1e-7); ns_steps times G = X X^T, G2 = b G + c G G, X = a X + G2 X.
 * Returns the buffer that holds the result (X or Xn). */
static float *newton_schulz(const cpu_impl *c, float *X, float *Xn, float *G, float *G2, int p, int q, float norm,
                            int steps) {
  const float den = norm > 1e-7f ? norm : 1e-7f;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int r = 0; r < p; r++)
    for (int j = 0; j < q; j++) X[(size_t)r * q + j] /= den;
  for (int it = 0; it < steps; it++) {
    cpu_mm_alpha(c, 0, 1, p, p, q, 1.0f, X, q, X, q, 0.0f, G, p);
    memcpy(G2, G, (size_t)p * p * sizeof(float));
    cpu_mm_alpha(c, 0, 0, p, p, p, GPT_MUON_NS_C, G, p, G, p, GPT_MUON_NS_B, G2, p);
    memcpy(Xn, X, (size_t)p * q * sizeof(float));
    cpu_mm_alpha(c, 0, 0, p, q, p, 1.0f, G2, p, X, q, GPT_MUON_NS_A, Xn, q);
    float *tmp = X;
    X = Xn;
    Xn = tmp;
  }
  return X;
}

/* theta = theta * (1 - lr wd), then theta += -lr adjust O (O = X back in storage orientation). */
static void apply_update(const cpu_impl *c, const gpt_tensor *t, const gpt_muon_shape *s, const float *X,
                         float decay_mul, float neg_lr) {
  float *th = c->params + t->offset;
  const int rows = t->shape[0], cols = t->shape[1], ch = (rows + c->nt - 1) / c->nt;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int k = 0; k < c->nt; k++) {
    const int r0 = k * ch, r1 = r0 + ch < rows ? r0 + ch : rows;
    if (r0 < r1) cpuk_muon_update(th, X, rows, cols, r0, r1, s->flip, decay_mul, neg_lr);
  }
}

int cpu_muon_step(gpt_model *m, const gpt_adamw_hparams *hp, const gpt_muon_hparams *mu, float lr, float muon_lr,
                  int t, float *grad_norm) {
  cpu_impl *c = m->impl;
  size_t pq, pp;
  int rc = muon_scratch(m, c, &pq, &pp);
  if (rc) return rc;
  float clip;
  if ((rc = cpu_clip_grads(m, hp, grad_norm, &clip))) return rc;
  cpu_adamw_segs(m, hp, lr, t, clip, 1);
  float *X = c->muon_ws, *Xn = X + pq, *G = Xn + pq, *G2 = G + pp;
  /* As torch's Python floats: the decay factor and the adjusted rate in double, rounded once. */
  const float decay_mul = (float)(1.0 - (double)muon_lr * (double)mu->weight_decay);
  for (int k = 0; k < m->lay.n_tensors; k++) {
    const gpt_tensor *tn = &m->lay.tensors[k];
    if (!tn->muon) continue;
    const gpt_muon_shape s = gpt_muon_shape_of(&m->lay, tn);
    const float norm = (float)momentum_into(c, tn, &s, mu, clip, X);
    const float *O = newton_schulz(c, X, Xn, G, G2, s.p, s.q, norm, mu->ns_steps);
    const float neg_lr = (float)(-(double)muon_lr * gpt_muon_adjust(mu->adjust, s.A, s.B));
    apply_update(c, tn, &s, O, decay_mul, neg_lr);
  }
  return 0;
}
