/* cpu_kernels.c — fused row kernels of the CPU backend: LayerNorm, bias+GELU, causal softmax,
 * cross-entropy, AdamW and Muon's elementwise passes. Loops are written so that GCC vectorises them (`omp simd` for the
 * reductions, a polynomial expf instead of the libm call); every reduction runs in a fixed
 * order, so results are deterministic. */
/* Built with -fno-math-errno (kernels/CMakeLists.txt), which, unlike a `#pragma GCC optimize`,
 * reaches every target_clones copy: so sqrtf in AdamW is a vector square root, not a call to
 * libm (its argument is never < 0). The adamw_simd test checks the AVX-512 clone's code. */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_vmath.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* tanh(u) = 1 - 2 / (1 + exp(2u)); saturates correctly at both ends through vexpf's clamp. */
static inline __attribute__((always_inline)) float vtanhf(float u) {
  return 1.0f - 2.0f / (1.0f + vexpf(2.0f * u));
}

#define GELU_BETA 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_KAPPA 0.044715f

CPU_HOT void cpuk_encode_row(float *out, const float *wte_row, const float *wpe_row, int C) {
  for (int i = 0; i < C; i++) out[i] = wte_row[i] + wpe_row[i];
}

CPU_HOT void cpuk_layernorm_row(float *out, float *mean, float *rstd, const float *x, const float *w,
                                const float *b, int C) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < C; i++) s += x[i];
  const float mu = s / (float)C;
  float v = 0.0f;
#pragma omp simd reduction(+ : v)
  for (int i = 0; i < C; i++) {
    float d = x[i] - mu;
    v += d * d;
  }
  const float rs = 1.0f / sqrtf(v / (float)C + 1e-5f);
  for (int i = 0; i < C; i++) out[i] = (x[i] - mu) * rs * w[i] + b[i];
  *mean = mu;
  *rstd = rs;
}

CPU_HOT void cpuk_layernorm_bwd_row(float *dx, float *dw_acc, float *db_acc, const float *dout,
                                    const float *x, const float *w, float mean, float rstd, int C, int dx_acc) {
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
  for (int i = 0; i < C; i++) {
    float xhat = (x[i] - mean) * rstd;
    float dn = w[i] * dout[i];
    dnorm_mean += dn;
    dnorm_norm_mean += dn * xhat;
  }
  dnorm_mean /= (float)C;
  dnorm_norm_mean /= (float)C;
  for (int i = 0; i < C; i++) {
    float xhat = (x[i] - mean) * rstd;
    float dn = w[i] * dout[i];
    dw_acc[i] += dout[i] * xhat;
    db_acc[i] += dout[i];
    float d = (dn - dnorm_mean - xhat * dnorm_norm_mean) * rstd;
    dx[i] = dx_acc ? dx[i] + d : d;
  }
}

CPU_HOT void cpuk_add_bias_row(float *out, const float *bias, const float *res, int n) {
  if (res) {
    for (int i = 0; i < n; i++) out[i] = res[i] + (out[i] + bias[i]);
  } else {
    for (int i = 0; i < n; i++) out[i] += bias[i];
  }
}

CPU_HOT void cpuk_bias_gelu_row(float *pre, float *act, const float *bias, int n) {
  for (int i = 0; i < n; i++) {
    float x = pre[i] + bias[i];
    pre[i] = x;
    float u = GELU_BETA * (x + GELU_KAPPA * x * x * x);
    act[i] = 0.5f * x * (1.0f + vtanhf(u));
  }
}

CPU_HOT void cpuk_gelu_bwd_row(float *d, const float *pre, int n) {
  for (int i = 0; i < n; i++) {
    float x = pre[i];
    float x2 = x * x;
    float th = vtanhf(GELU_BETA * (x + GELU_KAPPA * x2 * x));
    float left_d = 0.5f * (1.0f + th);
    float right_d = 0.5f * x * (1.0f - th * th) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2);
    d[i] *= left_d + right_d;
  }
}

CPU_HOT void cpuk_causal_softmax_row(float *p, int t, int zero_end) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int u = 0; u <= t; u++) mx = p[u] > mx ? p[u] : mx;
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int u = 0; u <= t; u++) {
    float e = vexpf(p[u] - mx);
    p[u] = e;
    s += e;
  }
  const float inv = 1.0f / s;
  for (int u = 0; u <= t; u++) p[u] *= inv;
  for (int u = t + 1; u < zero_end; u++) p[u] = 0.0f;
}

CPU_HOT void cpuk_causal_softmax_bwd_row(float *d, const float *p, int t, int zero_end, float scale) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int u = 0; u <= t; u++) s += p[u] * d[u];
  for (int u = 0; u <= t; u++) d[u] = scale * (p[u] * (d[u] - s));
  for (int u = t + 1; u < zero_end; u++) d[u] = 0.0f;
}

CPU_HOT float cpuk_xent_row(const float *logits, int V, int target, float *lse) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < V; i++) s += vexpf(logits[i] - mx);
  const float l = mx + logf(s);
  *lse = l;
  return l - logits[target];
}

CPU_HOT void cpuk_xent_bwd_row(float *logits, int V, int target, float lse, float dloss) {
  for (int i = 0; i < V; i++) logits[i] = vexpf(logits[i] - lse) * dloss;
  logits[target] -= dloss;
}

CPU_HOT void cpuk_acc(float *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

CPU_HOT double cpuk_sumsq(const float *g, size_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (size_t i = 0; i < n; i++) s += (double)g[i] * (double)g[i];
  return s;
}

/* Mirrors torch 1.13 _single_tensor_adamw in float32 arithmetic: p *= decay_mul;
 * m = m*b1 + g*(1-b1); v = v*b2 + (1-b2)*g*g; denom = sqrt(v)/bc2_sqrt + eps;
 * p += neg_step_size * (m / denom). With `clipped`, g is first scaled by clip and written
 * back (what clip_grad_norm_ leaves in .grad), in the same pass. */
static inline __attribute__((always_inline)) void adamw_loop(float *p, float *g, float *m, float *v, size_t n,
                                                             const int clipped, float clip, float decay_mul,
                                                             float beta1, float one_minus_beta1, float beta2,
                                                             float one_minus_beta2, float bc2_sqrt, float eps,
                                                             float neg_step_size) {
  for (size_t i = 0; i < n; i++) {
    float gi = g[i];
    if (clipped) {
      gi *= clip;
      g[i] = gi;
    }
    float pi = p[i] * decay_mul;
    float mi = m[i] * beta1 + gi * one_minus_beta1;
    float vi = v[i] * beta2 + one_minus_beta2 * (gi * gi);
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] = pi + neg_step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

CPU_HOT void cpuk_adamw(float *p, float *g, float *m, float *v, size_t n, float clip, float decay_mul,
                        float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                        float bc2_sqrt, float eps, float neg_step_size) {
  if (clip != 1.0f)
    adamw_loop(p, g, m, v, n, 1, clip, decay_mul, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps,
               neg_step_size);
  else
    adamw_loop(p, g, m, v, n, 0, 1.0f, decay_mul, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps,
               neg_step_size);
}

static inline float lerpf(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

CPU_HOT void cpuk_muon_momentum(float *buf, float *g, float *X, int rows, int cols, int r0, int r1, int flip,
                                float clip, float w_buf, float w_nest, int nesterov) {
  for (int r = r0; r < r1; r++) {
    for (int j = 0; j < cols; j++) {
      const size_t i = (size_t)r * cols + j;
      float gi = g[i];
      if (clip != 1.0f) g[i] = gi = gi * clip;
      const float b = buf[i] = lerpf(buf[i], gi, w_buf);
      const float u = nesterov ? lerpf(gi, b, w_nest) : b;
      X[flip ? (size_t)j * rows + r : i] = u;
    }
  }
}

CPU_HOT void cpuk_muon_update(float *theta, const float *X, int rows, int cols, int r0, int r1, int flip,
                              float decay_mul, float neg_lr) {
  for (int r = r0; r < r1; r++) {
    for (int j = 0; j < cols; j++) {
      const size_t i = (size_t)r * cols + j;
      const float d = theta[i] * decay_mul;
      theta[i] = d + neg_lr * X[flip ? (size_t)j * rows + r : i];
    }
  }
}
