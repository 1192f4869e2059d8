/* cuda_kernels.h — the CUDA backend's kernels behind a C interface: each launcher queues one
 * kernel on a stream and returns 0 or DPC_EBACKEND (with the kernel's name and the CUDA error)
 * if the launch failed. Every kernel has a CPU twin in kernels/cpu/cpu_kernels.c and the same
 * arithmetic (up to expf/tanhf ulps and summation order); tests/unit/test_cuda_kernels.c
 * compares each pair. Pointers are device pointers unless a name says host; shapes use
 * llm.c's letters (N = B*T rows, C channels, OC output channels, BH = B*NH heads).
 *
 * Reductions are deterministic: a fixed assignment of elements to threads and a fixed
 * combining order, no atomics, so a given device and shape give bit-identical results run to
 * run. The small device helpers at the end let C tests allocate and copy without the CUDA
 * headers. Thread-safety: launchers are safe from any thread; streams are the caller's. */
#ifndef DPC_CUDA_KERNELS_H
#define DPC_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *cudak_stream; /* a cudaStream_t; NULL is the legacy default stream */

/* One AdamW / grad-norm work item: a piece of one tensor of the flat layout. */
typedef struct {
  unsigned long long off; /* in floats */
  int n;                  /* floats, <= CUDAK_SEG */
  int decay;              /* 1: weight decay applies */
} cudak_seg;
#define CUDAK_SEG 16384

/* out[n, :] = wte[inp[n], :] + wpe[n % T, :]. */
int cudak_encoder_fwd(float *out, const int *inp, const float *wte, const float *wpe, int N, int T, int C,
                      cudak_stream st);
/* dwpe[t, :] += sum_b dout[b*T + t, :]. */
int cudak_wpe_bwd(float *dwpe, const float *dout, int B, int T, int C, cudak_stream st);
/* dwte[uniq[u], :] += sum over j in [start[u], start[u+1]) of dout[pos[j], :], for u < U: the
 * positions of each distinct token are summed in a fixed order (no atomics). */
int cudak_wte_bwd(float *dwte, const float *dout, const int *uniq, const int *start, const int *pos, int U, int C,
                  cudak_stream st);

/* LayerNorm (eps 1e-5) of N rows; stores each row's mean and rstd. */
int cudak_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b, int N,
                        int C, cudak_stream st);
/* dx += LayerNorm backward of N rows (dw, db untouched; see cudak_colsum). */
int cudak_layernorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w, const float *mean,
                           const float *rstd, int N, int C, cudak_stream st);
/* Column sums over N rows, added into dst0 (and dst1): with x == NULL, dst0 += sum_n dout[n,:]
 * (a bias gradient; dst1 unused); with x, the LayerNorm weight and bias gradients
 * dst0 += sum_n dout * xhat, dst1 += sum_n dout, where xhat = (x - mean) * rstd. part is
 * scratch of cudak_colsum_scratch(N, C) floats. */
size_t cudak_colsum_scratch(int N, int C);
int cudak_colsum(float *dst0, float *dst1, float *part, const float *dout, const float *x, const float *mean,
                 const float *rstd, int N, int C, cudak_stream st);

/* out = res + (out + bias) per row (res may be NULL: out += bias), N rows of OC. */
int cudak_bias_add(float *out, const float *bias, const float *res, int N, int OC, cudak_stream st);
/* pre += bias; act = gelu_tanh(pre). */
int cudak_bias_gelu(float *pre, float *act, const float *bias, int N, int OC, cudak_stream st);
/* d *= gelu_tanh'(pre), n floats. */
int cudak_gelu_bwd(float *d, const float *pre, size_t n, cudak_stream st);

/* qkv (B, T, 3C) -> q, k, v each (B, NH, T, hs); with bwd, the reverse: dqkv from dq, dk, dv. */
int cudak_qkv_permute(float *q, float *k, float *v, const float *qkv, int B, int T, int NH, int hs, cudak_stream st);
int cudak_qkv_unpermute(float *dqkv, const float *dq, const float *dk, const float *dv, int B, int T, int NH, int hs,
                        cudak_stream st);
/* y (B, NH, T, hs) <-> out (B, T, C): to_btc gathers heads back into rows, else the reverse. */
int cudak_heads(float *dst, const float *src, int B, int T, int NH, int hs, int to_btc, cudak_stream st);

/* Causal softmax in place on rows of T x T blocks (rows = BH * T): row t keeps softmax over
 * [0, t] and zeros (t, T). */
int cudak_causal_softmax(float *att, size_t rows, int T, cudak_stream st);
/* d[u] = scale * p[u] * (d[u] - sum_v p[v] d[v]) for u <= t, 0 after. */
int cudak_causal_softmax_bwd(float *d, const float *p, size_t rows, int T, float scale, cudak_stream st);

/* Cross-entropy of N rows of V logits: losses[n] = lse[n] - logits[n, targets[n]]. */
int cudak_xent_fwd(float *losses, float *lse, const float *logits, const int *targets, int N, int V,
                   cudak_stream st);
/* In place: logits -> (softmax - onehot(target)) * dloss. */
int cudak_xent_bwd(float *logits, const float *lse, const int *targets, int N, int V, float dloss, cudak_stream st);
/* *out = sum of x[0..n) in double (one block, fixed order). */
int cudak_sum(double *out, const float *x, int n, cudak_stream st);

/* seg_sumsq[s] = sum of g^2 over segment s (double). */
int cudak_sumsq_segs(double *seg_sumsq, const float *g, const cudak_seg *segs, int nseg, cudak_stream st);
/* scal[0] = sqrt(sum seg_sumsq) (the global norm), scal[1] = clip coefficient
 * (torch clip_grad_norm_: max_norm / (norm + 1e-6) when below 1; max_norm 0 disables). */
int cudak_norm_clip(float *scal, const double *seg_sumsq, int nseg, float max_norm, cudak_stream st);
/* One torch.optim.AdamW step over the segments, as cpuk_adamw (g scaled by *clip first and
 * written back when *clip != 1). */
int cudak_adamw(float *p, float *g, float *m, float *v, const cudak_seg *segs, int nseg, const float *clip,
                float decay_mul, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                float bc2_sqrt, float eps, float neg_step_size, cudak_stream st);

/* Muon's elementwise passes (kernels/cuda/cuda_muon.cu): cpuk_muon_momentum over the whole
 * rows x cols tensor, with the clip coefficient read from device memory (cudak_norm_clip's
 * scal[1]); X /= max(|X|_F, 1e-7) over n floats, the sum of squares in double in a fixed order
 * (twin: cpuk_sumsq and a division), with part a scratch of cudak_muon_norm_scratch(n)
 * doubles; cpuk_muon_update over the whole tensor. */
int cudak_muon_momentum(float *buf, float *g, float *X, int rows, int cols, int flip, const float *clip, float w_buf,
                        float w_nest, int nesterov, cudak_stream st);
size_t cudak_muon_norm_scratch(size_t n);
int cudak_muon_normalize(float *X, size_t n, double *part, cudak_stream st);
int cudak_muon_update(float *theta, const float *X, int rows, int cols, int flip, float decay_mul, float neg_lr,
                      cudak_stream st);

/* dst[i] = bf16(src[i]), round to nearest even; n floats. */
int cudak_to_bf16(uint16_t *dst, const float *src, size_t n, cudak_stream st);

/* Helpers for C callers (tests, benchmarks): device count (0 when no driver or device),
 * allocation, copies (synchronous) and a device-wide synchronize. All but count return 0 or
 * DPC_EBACKEND / DPC_ENOMEM with the CUDA error. */
int cudak_device_count(void);
int cudak_malloc(void **p, size_t bytes);
void cudak_free(void *p);
int cudak_h2d(void *dst, const void *src, size_t bytes);
int cudak_d2h(void *dst, const void *src, size_t bytes);
int cudak_sync(void);
/* The name of device `dev` and its compute capability, for reports. */
int cudak_device_info(int dev, char *name, size_t name_len, int *major, int *minor);

#ifdef __cplusplus
}
#endif
#endif
