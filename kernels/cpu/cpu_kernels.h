/* cpu_kernels.h — the CPU backend's single-threaded leaf kernels (one row, or one range of a
 * flat array, per call). The caller (cpu_backend.c) splits work across OpenMP threads and does
 * the matrix products with OpenBLAS; these loops do the fused elementwise and row-wise math.
 * Each kernel is compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time, so
 * the default build flags still get wide vectors. All functions are pure and thread-safe. */
#ifndef DPC_CPU_KERNELS_H
#define DPC_CPU_KERNELS_H

#include <stddef.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CPU_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_HOT
#endif

/* out[i] = wte[tok][i] + wpe[i] for one position. */
void cpuk_encode_row(float *out, const float *wte_row, const float *wpe_row, int C);

/* LayerNorm (eps 1e-5) of one row: out = (x - mean) * rstd * w + b; stores mean and rstd. */
void cpuk_layernorm_row(float *out, float *mean, float *rstd, const float *x, const float *w,
                        const float *b, int C);

/* LayerNorm backward of one row: dx += ... (dx = ... when dx_acc is 0); dw_acc += dout * xhat;
 * db_acc += dout. */
void cpuk_layernorm_bwd_row(float *dx, float *dw_acc, float *db_acc, const float *dout,
                            const float *x, const float *w, float mean, float rstd, int C, int dx_acc);

/* out = out + bias (+ res when res != NULL), n columns. */
void cpuk_add_bias_row(float *out, const float *bias, const float *res, int n);

/* pre = pre + bias; act = gelu_tanh(pre), n columns. */
void cpuk_bias_gelu_row(float *pre, float *act, const float *bias, int n);

/* d = d * gelu_tanh'(pre), n columns. */
void cpuk_gelu_bwd_row(float *d, const float *pre, int n);

/* Causal softmax of row t of a T x T score block: p[0..t] = softmax(p[0..t]) and
 * p[t+1..zero_end) = 0. */
void cpuk_causal_softmax_row(float *p, int t, int zero_end);

/* Softmax backward of row t: d[u] = scale * p[u] * (d[u] - sum_v p[v] d[v]) for u <= t, and
 * d[t+1..zero_end) = 0. */
void cpuk_causal_softmax_bwd_row(float *d, const float *p, int t, int zero_end, float scale);

/* Cross-entropy of one row of V logits against target; returns loss and stores the
 * log-sum-exp in *lse. */
float cpuk_xent_row(const float *logits, int V, int target, float *lse);

/* In place: logits -> (softmax(logits) - onehot(target)) * dloss, with the forward's lse. */
void cpuk_xent_bwd_row(float *logits, int V, int target, float lse, float dloss);

/* dst[i] += src[i]. */
void cpuk_acc(float *dst, const float *src, size_t n);

/* sum of g[i]^2 over n floats, in double. */
double cpuk_sumsq(const float *g, size_t n);

/* One torch.optim.AdamW step over n floats (see cpu_backend.c for the scalar derivation), in
 * one pass: g is first scaled by clip (and written back when clip != 1). */
void cpuk_adamw(float *p, float *g, float *m, float *v, size_t n, float clip, float decay_mul,
                float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                float bc2_sqrt, float eps, float neg_step_size);

/* Muon's momentum (kernels/cpu/cpu_muon.c, docs/design.md §3.2) over rows [r0, r1) of a
 * rows x cols tensor: g *= clip (written back when clip != 1), buf = lerp(buf, g, w_buf),
 * u = nesterov ? lerp(g, buf, w_nest) : buf, stored at X[r][j], or at X[j][r] (row length
 * rows) with flip. lerp is torch's: a + w (b - a) for w < 0.5, else b - (b - a)(1 - w). */
void cpuk_muon_momentum(float *buf, float *g, float *X, int rows, int cols, int r0, int r1, int flip, float clip,
                        float w_buf, float w_nest, int nesterov);
/* Muon's update over rows [r0, r1): theta = theta * decay_mul, then theta += neg_lr * O with O
 * X[r][j], or X[j][r] with flip (two roundings, as torch's mul_ then add_). */
void cpuk_muon_update(float *theta, const float *X, int rows, int cols, int r0, int r1, int flip, float decay_mul,
                      float neg_lr);

#endif
