/* llama_kernels.c — the Llama-class leaf kernels of the CPU backend (llama_kernels.h): RMSNorm,
 * RoPE, SwiGLU and grouped-query causal attention, forward and backward, in fp32. The math is
 * docs/design.md §3.12; tests/unit/test_llama_kernels.c checks every output and gradient
 * against tests/oracle/llama_ops_oracle.py. Built with -O3 -fno-math-errno like cpu_kernels.c
 * (kernels/CMakeLists.txt), so the row loops vectorise in every target_clones copy. */
#include "kernels/cpu/llama_kernels.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_vmath.h"

#include <math.h>
#include <stddef.h>

#define LLAMAK_TWO_PI 6.283185307179586476925286766559

/* ---- RMSNorm -------------------------------------------------------------------------- */

CPU_HOT void llamak_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int C, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int i = 0; i < C; i++) ss += x[i] * x[i];
  const float rs = 1.0f / sqrtf(ss / (float)C + eps);
  /* rstd is stored before out is written: out may alias x, rstd may not. */
  *rstd = rs;
  for (int i = 0; i < C; i++) out[i] = w[i] * (x[i] * rs);
}

/* With y = w * x * r and r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / C, so
 * dx_j = r * (w_j dout_j - xhat_j * mean_i(w_i dout_i xhat_i)). */
CPU_HOT void llamak_rmsnorm_bwd(float *dx, float *dw_acc, const float *dout, const float *x, const float *w,
                                float rstd, int C, int dx_acc) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < C; i++) s += w[i] * dout[i] * (x[i] * rstd);
  const float m = s / (float)C;
  for (int i = 0; i < C; i++) {
    const float xhat = x[i] * rstd;
    dw_acc[i] += dout[i] * xhat;
    const float d = rstd * (w[i] * dout[i] - xhat * m);
    dx[i] = dx_acc ? dx[i] + d : d;
  }
}

/* ---- Rotary position embeddings ------------------------------------------------------- */

static int rope_params_ok(int D, const llamak_rope *r) {
  if (D <= 0 || D % 2 != 0 || !(r->theta > 0.0)) return 0;
  if (r->type == LLAMAK_ROPE_DEFAULT) return 1;
  if (r->type != LLAMAK_ROPE_LLAMA3) return 0;
  return r->factor >= 1.0 && r->low_freq_factor > 0.0 && r->high_freq_factor > r->low_freq_factor &&
         r->original_max_position_embeddings > 0.0;
}

int llamak_rope_inv_freq(double *inv_freq, int D, const llamak_rope *r) {
  if (!rope_params_ok(D, r)) return -1;
  for (int i = 0; i < D / 2; i++) {
    double f = 1.0 / pow(r->theta, (double)(2 * i) / (double)D);
    if (r->type == LLAMAK_ROPE_LLAMA3) {
      /* Wavelengths shorter than old_len/high_freq_factor keep their frequency, longer than
       * old_len/low_freq_factor are divided by factor, and those between interpolate. */
      const double old_len = r->original_max_position_embeddings;
      const double low_wl = old_len / r->low_freq_factor, high_wl = old_len / r->high_freq_factor;
      const double wl = LLAMAK_TWO_PI / f;
      if (wl > low_wl) {
        f = f / r->factor;
      } else if (!(wl < high_wl)) {
        const double smooth = (old_len / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
        f = (1.0 - smooth) * f / r->factor + smooth * f;
      }
    }
    inv_freq[i] = f;
  }
  return 0;
}

void llamak_rope_table(float *cos_t, float *sin_t, const double *inv_freq, int T, int D) {
  const int H = D / 2;
  for (int t = 0; t < T; t++)
    for (int i = 0; i < H; i++) {
      const double a = (double)t * inv_freq[i];
      cos_t[(size_t)t * H + i] = (float)cos(a);
      sin_t[(size_t)t * H + i] = (float)sin(a);
    }
}

/* x * cos + rotate_half(x) * sin, with sin scaled by sgn (+1 forward, -1 backward). */
static inline __attribute__((always_inline)) void rope_rotate(float *x, int ldx, const float *cos_t,
                                                              const float *sin_t, int T, int NH, int D,
                                                              float sgn) {
  const int H = D / 2;
  for (int t = 0; t < T; t++) {
    const float *c = cos_t + (size_t)t * H, *s = sin_t + (size_t)t * H;
    for (int h = 0; h < NH; h++) {
      float *a = x + (size_t)t * ldx + (size_t)h * D, *b = a + H;
      for (int i = 0; i < H; i++) {
        const float ai = a[i], bi = b[i], si = sgn * s[i];
        a[i] = ai * c[i] - bi * si;
        b[i] = bi * c[i] + ai * si;
      }
    }
  }
}

CPU_HOT void llamak_rope_fwd(float *x, int ldx, const float *cos_t, const float *sin_t, int T, int NH, int D) {
  rope_rotate(x, ldx, cos_t, sin_t, T, NH, D, 1.0f);
}

CPU_HOT void llamak_rope_bwd(float *dx, int ldx, const float *cos_t, const float *sin_t, int T, int NH, int D) {
  rope_rotate(dx, ldx, cos_t, sin_t, T, NH, D, -1.0f);
}

/* ---- SwiGLU --------------------------------------------------------------------------- */

/* sigmoid through vexpf: its clamp keeps 1 + exp(-g) finite, so g = -100 gives ~6e-37, not NaN. */
static inline __attribute__((always_inline)) float vsigmoidf(float g) { return 1.0f / (1.0f + vexpf(-g)); }

CPU_HOT void llamak_swiglu_fwd(float *h, const float *gate, const float *up, int n) {
  for (int i = 0; i < n; i++) {
    const float g = gate[i], u = up[i];
    h[i] = (g * vsigmoidf(g)) * u;
  }
}

CPU_HOT void llamak_swiglu_bwd(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                               int n) {
  for (int i = 0; i < n; i++) {
    const float g = gate[i], u = up[i], d = dh[i];
    const float s = vsigmoidf(g);
    dgate[i] = d * u * (s * (1.0f + g * (1.0f - s)));
    dup[i] = d * (g * s);
  }
}

/* ---- Grouped-query causal attention --------------------------------------------------- */

static inline __attribute__((always_inline)) float dot(const float *a, const float *b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

/* y[0..n) += alpha * x[0..n). */
static inline __attribute__((always_inline)) void axpy(float *y, float alpha, const float *x, int n) {
  for (int i = 0; i < n; i++) y[i] += alpha * x[i];
}

/* Scores and softmax in the order of the GPT-2 path in cpu_backend.c (scale times the dot
 * product, then cpuk_causal_softmax_row), so both families share one softmax. */
CPU_HOT void llamak_attn_fwd(float *out, int ldo, float *att, const float *q, int ldq, const float *k,
                             const float *v, int ldkv, int T, int D) {
  const float scale = 1.0f / sqrtf((float)D);
  for (int t = 0; t < T; t++) {
    const float *qt = q + (size_t)t * ldq;
    float *p = att + (size_t)t * T, *o = out + (size_t)t * ldo;
    for (int u = 0; u <= t; u++) p[u] = scale * dot(qt, k + (size_t)u * ldkv, D);
    cpuk_causal_softmax_row(p, t, T);
    for (int i = 0; i < D; i++) o[i] = 0.0f;
    for (int u = 0; u <= t; u++) axpy(o, p[u], v + (size_t)u * ldkv, D);
  }
}

/* Query t: dp_u = dout_t . v_u, ds = scale * p * (dp - p . dp) (cpuk_causal_softmax_bwd_row),
 * dq_t = sum_u ds_u k_u, dk_u += ds_u q_t, dv_u += p_u dout_t; t ascending, u ascending. */
CPU_HOT void llamak_attn_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout, int ldo,
                             const float *att, const float *q, int ldq, const float *k, const float *v, int ldkv,
                             int T, int D) {
  const float scale = 1.0f / sqrtf((float)D);
  for (int t = 0; t < T; t++) {
    const float *p = att + (size_t)t * T, *dO = dout + (size_t)t * ldo, *qt = q + (size_t)t * ldq;
    float *dqt = dq + (size_t)t * ldq;
    for (int u = 0; u <= t; u++) scratch[u] = dot(dO, v + (size_t)u * ldkv, D);
    cpuk_causal_softmax_bwd_row(scratch, p, t, t + 1, scale);
    for (int i = 0; i < D; i++) dqt[i] = 0.0f;
    for (int u = 0; u <= t; u++) {
      axpy(dqt, scratch[u], k + (size_t)u * ldkv, D);
      axpy(dk + (size_t)u * ldkv, scratch[u], qt, D);
      axpy(dv + (size_t)u * ldkv, p[u], dO, D);
    }
  }
}
