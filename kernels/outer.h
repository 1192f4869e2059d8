/* outer.h — the outer optimizer of docs/design.md §3 over flat fp32 arrays.
 *
 * Sync (DiLoCo/DiPaCo): outer_average reduces the round's deltas in the caller's fixed order
 * (path, then replica) into Δ̄, then outer_nesterov_step applies torch.optim.SGD(momentum=μ,
 * nesterov) with Δ̄ as the gradient. Async: outer_dn_apply is the delayed-Nesterov rule of Liu
 * et al. 2024 (Algorithm 3); the plain-async baselines are outer_nesterov_step or
 * outer_sgd_step applied to every arriving delta. Streaming DiLoCo (arXiv 2501.18512): a replica
 * folds a new global fragment into its local copy with outer_merge.
 *
 * Determinism: every output element depends only on the same element of the inputs, computed
 * with a fixed sequence of operations, so results are bit-identical for any thread count and
 * any chunking. Storage is fp32; outer_average accumulates in fp64. The element-wise update
 * order of operations copies PyTorch's _single_tensor_sgd (buf.mul_(μ).add_(g);
 * d = g.add(buf, alpha=μ); p.add_(d, alpha=−η)).
 *
 * Ownership: the caller owns every array; nothing is allocated or kept. Arrays passed to one
 * call must not overlap except where a parameter is documented as in/out. Thread-safety: the
 * functions are reentrant; large arrays are split across OpenMP threads inside a call. */
#ifndef DPC_OUTER_H
#define DPC_OUTER_H

#include <stddef.h>
#include <stdint.h>

/* avg[j] = Σ_i c_i·deltas[i][j] with c_i = w_i / Σ_k w_k, for j < len, summed for i = 0..n-1
 * in that order (fp64 coefficients and accumulation, one rounding to fp32). weights may be
 * NULL for uniform weights.
 * DPC_EINVAL if n < 1, a weight is negative or non-finite, or Σ w_i is not positive;
 * DPC_ENUMERIC (naming an index) if the result is not finite in fp32 (a non-finite or huge
 * input) — then avg is unspecified and must not be applied. */
int outer_average(const float *const *deltas, const double *weights, int n, size_t len, float *avg);

/* One torch.optim.SGD step with momentum mu and gradient avg, in place on theta[len] and the
 * momentum buffer u[len] (zero-initialised for a fresh fragment, which matches torch's
 * "buf = grad" on the first step exactly):
 *   u ← μ·u + Δ̄;  θ ← θ − η·(Δ̄ + μ·u)  (nesterov != 0)
 *   u ← μ·u + Δ̄;  θ ← θ − η·u          (nesterov == 0)
 * With mu == 0 the momentum buffer is still updated (it then equals Δ̄). */
void outer_nesterov_step(float *theta, float *u, const float *avg, size_t len, float lr, float mu,
                         int nesterov);

/* The momentum of outer step t (0-based) of `total` under the momentum schedule (docs/design.md
 * §3): a linear warm-up over the first `warmup` steps, factor (t + 1) / warmup, and a linear
 * decay over the last `decay` steps, factor (total − 1 − t) / decay, so the last step has none;
 * the smaller factor wins where the two overlap, and 0 for either means none. Computed in
 * double and rounded once, as (float)(mu · k / n), so a Python simulation gets the same float. */
float outer_momentum_at(float mu, long t, long total, long warmup, long decay);

/* The schedule a job gets by default over `rounds` steps (tests/bench/outer_study.sh chose it):
 * warm-up ceil(rounds / 10), decay ceil(rounds / 5); none for rounds < 1. Inline so the job
 * spec code (coordinator/jobspec.c) shares it without linking the kernels. */
static inline void outer_default_schedule(long rounds, long *warmup, long *decay) {
  *warmup = rounds > 0 ? (rounds + 9) / 10 : 0;
  *decay = rounds > 0 ? (rounds + 4) / 5 : 0;
}

/* Plain SGD: θ ← θ − η·g. The async "sgd" baseline. */
void outer_sgd_step(float *theta, const float *g, size_t len, float lr);

/* Delayed-Nesterov state of one fragment. The caller owns buf[len] and m[len] (persisted as
 * blobs between applications) and the counters (persisted in the store). */
typedef struct {
  float *buf;   /* (len) Δbuf: sum of the deltas since the last momentum update */
  float *m;     /* (len) momentum */
  size_t len;
  int64_t t;    /* deltas applied so far */
  int N;        /* buffer length, >= 1 (DESIGN default: the number of slots) */
  double c;     /* eager momentum fraction in [0, 1/N] (default 0) */
} outer_dn_state;

/* Check and fill a state over caller-owned arrays; zero buf and m when fresh != 0. DPC_EINVAL
 * for N < 1, c outside [0, 1/N], t < 0 or NULL arrays. */
int outer_dn_init(outer_dn_state *s, float *buf, float *m, size_t len, int N, double c, int64_t t,
                  int fresh);

/* Apply one arriving delta g[len] to theta[len] (docs/design.md §3, async):
 *   Δbuf += g
 *   if (t+1) mod N == 0: m ← β·m + Δbuf/N; θ ← θ − ε·((1 − c·N + c)·β·m + g/N); Δbuf ← 0
 *   else:                θ ← θ − ε·(c·β·m + g/N)
 *   t += 1
 * with ε = lr and β = mu. Returns 1 when this application updated the momentum, 0 when it
 * only buffered, DPC_EINVAL for a state that fails outer_dn_init's checks. With N == 1 and
 * c == 0 this is bit-identical to outer_nesterov_step(nesterov=1). */
int outer_dn_apply(outer_dn_state *s, float *theta, const float *g, float lr, float mu);

/* Streaming merge of a new global fragment into a replica's local copy (docs/design.md §3,
 * Streaming): local ← α·local + (1 − α)·global, in place, as the fp32 operations
 * t = local·α; local = t + b·global with b = fl32(1 − α) (formed in double). This is PyTorch's
 * local.mul_(α).add_(global, alpha=1 − α) up to one rounding: torch's vectorised add fuses
 * b·global + t into an FMA where the CPU has one, so the two agree within one rounding, not bit for
 * bit. α = 0 makes local a bit-exact copy of global (F = 1, τ = 0, α = 0 is plain DiLoCo) and
 * α = 1 leaves it unchanged. DPC_EINVAL for α outside [0, 1] or NULL arrays. */
int outer_merge(float *local, const float *global, size_t len, float alpha);

#endif
