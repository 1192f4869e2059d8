/* outer.c — outer-optimizer kernels (docs/design.md §3): deterministic weighted delta average,
 * SGD/Nesterov steps, the async delayed-Nesterov rule and the streaming merge, one streaming
 * pass each. */
#include "kernels/outer.h"
#include "common/errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Below this many floats a call stays on the calling thread: thread start-up would cost more
 * than the pass itself. */
#define OUTER_PAR_MIN ((size_t)1 << 16)
/* outer_average works on blocks so the fp64 accumulator stays in L1 while the deltas stream. */
#define OUTER_BLOCK 2048

int outer_average(const float *const *deltas, const double *weights, int n, size_t len, float *avg) {
  if (n < 1) return dpc_err(DPC_EINVAL, "outer_average: need at least one delta (n = %d)", n);
  if (!deltas || !avg) return dpc_err(DPC_EINVAL, "outer_average: NULL array");
  double wsum = 0.0;
  for (int i = 0; i < n; i++) {
    double w = weights ? weights[i] : 1.0;
    if (!isfinite(w) || w < 0.0)
      return dpc_err(DPC_EINVAL, "outer_average: weight %d is %g (need a finite value >= 0)", i, w);
    if (!deltas[i]) return dpc_err(DPC_EINVAL, "outer_average: delta %d is NULL", i);
    wsum += w;
  }
  if (!(wsum > 0.0)) return dpc_err(DPC_EINVAL, "outer_average: weights sum to %g (need > 0)", wsum);

  /* Normalised weights c_i = w_i / Σw, formed once in fp64: each element is then
   * Σ_i c_i·Δ_i[j] accumulated in fp64 in the fixed order i = 0..n-1 and rounded once. */
  double *cw = malloc((size_t)n * sizeof *cw);
  if (!cw) return dpc_err(DPC_ENOMEM, "outer_average: out of memory");
  for (int i = 0; i < n; i++) cw[i] = (weights ? weights[i] : 1.0) / wsum;
  const size_t nblocks = (len + OUTER_BLOCK - 1) / OUTER_BLOCK;
  long long bad = -1; /* a block holding a non-finite result */
#pragma omp parallel for schedule(static) if (len >= OUTER_PAR_MIN) reduction(max : bad)
  for (size_t b = 0; b < nblocks; b++) {
    double acc[OUTER_BLOCK];
    const size_t lo = b * OUTER_BLOCK;
    const size_t m = len - lo < OUTER_BLOCK ? len - lo : OUTER_BLOCK;
    const float *d0 = deltas[0] + lo;
    const double c0 = cw[0];
    for (size_t j = 0; j < m; j++) acc[j] = c0 * (double)d0[j];
    for (int i = 1; i < n; i++) {
      const double c = cw[i];
      const float *d = deltas[i] + lo;
      for (size_t j = 0; j < m; j++) acc[j] += c * (double)d[j];
    }
    /* Non-finite check on the fp32 bits (exponent all ones), branch-free so it vectorises. */
    uint32_t inf = 0;
    float *o = avg + lo;
    for (size_t j = 0; j < m; j++) {
      const float v = (float)acc[j];
      uint32_t bits;
      memcpy(&bits, &v, 4);
      inf |= (~bits & 0x7f800000u) == 0;
      o[j] = v;
    }
    if (inf && (long long)b > bad) bad = (long long)b;
  }
  free(cw);
  if (bad >= 0) {
    /* Report the first offending element of some bad block (any is enough to refuse). */
    size_t lo = (size_t)bad * OUTER_BLOCK;
    for (size_t j = lo; j < len && j < lo + OUTER_BLOCK; j++)
      if (!isfinite(avg[j]))
        return dpc_err(DPC_ENUMERIC, "outer_average: non-finite value at index %zu", j);
    return dpc_err(DPC_ENUMERIC, "outer_average: non-finite value near index %zu", lo);
  }
  return 0;
}

void outer_nesterov_step(float *restrict theta, float *restrict u, const float *restrict avg,
                         size_t len, float lr, float mu, int nesterov) {
  const float neg_lr = -lr;
  if (nesterov) {
#pragma omp parallel for simd schedule(static) if (len >= OUTER_PAR_MIN)
    for (size_t j = 0; j < len; j++) {
      const float g = avg[j];
      const float b = mu * u[j] + g;
      u[j] = b;
      theta[j] = theta[j] + neg_lr * (g + mu * b);
    }
  } else {
#pragma omp parallel for simd schedule(static) if (len >= OUTER_PAR_MIN)
    for (size_t j = 0; j < len; j++) {
      const float b = mu * u[j] + avg[j];
      u[j] = b;
      theta[j] = theta[j] + neg_lr * b;
    }
  }
}

float outer_momentum_at(float mu, long t, long total, long warmup, long decay) {
  long k = 1, n = 1; /* the factor k / n, at most 1 */
  if (warmup > 0 && t < warmup) k = t + 1, n = warmup;
  if (decay > 0 && t >= total - decay) {
    const long kd = total - 1 - t > 0 ? total - 1 - t : 0;
    if (kd * n < k * decay) k = kd, n = decay; /* kd / decay < k / n */
  }
  if (k == n) return mu;
  return (float)((double)mu * (double)k / (double)n);
}

void outer_sgd_step(float *restrict theta, const float *restrict g, size_t len, float lr) {
  const float neg_lr = -lr;
#pragma omp parallel for simd schedule(static) if (len >= OUTER_PAR_MIN)
  for (size_t j = 0; j < len; j++) theta[j] = theta[j] + neg_lr * g[j];
}

static int dn_check(const outer_dn_state *s) {
  if (!s || !s->buf || !s->m) return dpc_err(DPC_EINVAL, "outer_dn: NULL state array");
  if (s->N < 1) return dpc_err(DPC_EINVAL, "outer_dn: buffer length N = %d (need >= 1)", s->N);
  if (!(s->c >= 0.0 && s->c <= 1.0 / s->N))
    return dpc_err(DPC_EINVAL, "outer_dn: c = %g outside [0, 1/N = %g]", s->c, 1.0 / s->N);
  if (s->t < 0) return dpc_err(DPC_EINVAL, "outer_dn: counter t = %lld is negative", (long long)s->t);
  return 0;
}

int outer_dn_init(outer_dn_state *s, float *buf, float *m, size_t len, int N, double c, int64_t t,
                  int fresh) {
  s->buf = buf;
  s->m = m;
  s->len = len;
  s->N = N;
  s->c = c;
  s->t = t;
  int rc = dn_check(s);
  if (rc) return rc;
  if (fresh) {
    memset(buf, 0, len * sizeof *buf);
    memset(m, 0, len * sizeof *m);
  }
  return 0;
}

int outer_dn_apply(outer_dn_state *s, float *restrict theta, const float *restrict g, float lr,
                   float mu) {
  int rc = dn_check(s);
  if (rc) return rc;
  float *restrict buf = s->buf;
  float *restrict m = s->m;
  const size_t len = s->len;
  const float Nf = (float)s->N;
  const float neg_lr = -lr;
  const int update = (s->t + 1) % s->N == 0;
  if (update) {
    /* Coefficients are formed in fp64 and rounded once, as a Python scalar is. */
    const float k = (float)((1.0 - s->c * s->N + s->c) * (double)mu);
#pragma omp parallel for simd schedule(static) if (len >= OUTER_PAR_MIN)
    for (size_t j = 0; j < len; j++) {
      const float gj = g[j];
      const float mj = mu * m[j] + (buf[j] + gj) / Nf;
      m[j] = mj;
      buf[j] = 0.0f;
      theta[j] = theta[j] + neg_lr * (k * mj + gj / Nf);
    }
  } else {
    const float k = (float)(s->c * (double)mu);
#pragma omp parallel for simd schedule(static) if (len >= OUTER_PAR_MIN)
    for (size_t j = 0; j < len; j++) {
      const float gj = g[j];
      buf[j] = buf[j] + gj;
      theta[j] = theta[j] + neg_lr * (k * m[j] + gj / Nf);
    }
  }
  s->t++;
  return update;
}

int outer_merge(float *restrict local, const float *restrict global, size_t len, float alpha) {
  if (!local || !global) return dpc_err(DPC_EINVAL, "outer_merge: NULL array");
  if (!(alpha >= 0.0f && alpha <= 1.0f)) return dpc_err(DPC_EINVAL, "outer_merge: alpha %g outside [0, 1]", (double)alpha);
  const float a = alpha, b = (float)(1.0 - (double)alpha);
#pragma omp parallel for simd schedule(static) if (len >= OUTER_PAR_MIN)
  for (size_t j = 0; j < len; j++) {
    const float l = local[j] * a;
    local[j] = l + b * global[j];
  }
  return 0;
}
