/* cuda_llama.h — the CUDA twins of the Llama-class leaf kernels (kernels/cpu/llama_kernels.h,
 * docs/design.md §3.12) behind a C interface, batched over B sequences: RMSNorm, RoPE, SwiGLU
 * and grouped-query causal attention, forward and backward, in fp32. Like cuda_kernels.h, each
 * launcher queues its kernels on a stream and returns 0 or DPC_EBACKEND (the kernel's name and
 * the CUDA error) when a launch failed, DPC_EINVAL for shapes it cannot take; pointers are device
 * pointers. tests/unit/test_cuda_llama.c compares every one with its CPU twin.
 *
 * Layout: activations are row-major with one row per position, the B sequences one after the
 * other (N = B*T rows, row n is position n % T of sequence n / T). q is [N, NH, D], k and v are
 * [N, NKV, D], each row `ld` floats after the previous one, so q, k and v may be three buffers
 * (ld = NH*D, NKV*D) or column slices of one fused projection output [N, (NH + 2*NKV)*D]
 * (ld = (NH + 2*NKV)*D): the layout the CPU twins take per sequence, with no permute. The
 * attention probabilities are [B, NH, T, T], GPT-2's layout (cuda_backend.cu).
 *
 * Determinism: every output element has one owning thread that sums in a fixed order, and the
 * RMSNorm weight gradient goes through per-chunk partials added in chunk order; no atomics, so a
 * given device and shape give bit-identical results run to run. Thread-safety: launchers are
 * safe from any thread; streams are the caller's. */
#ifndef DPC_CUDA_LLAMA_H
#define DPC_CUDA_LLAMA_H

#include "kernels/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- RMSNorm over N rows of C ---------------------------------------------------------- */

/* out[n] = w * (x[n] * rstd[n]), rstd[n] = 1/sqrt(mean(x[n]^2) + eps) (llamak_rmsnorm_fwd per
 * row). out may alias x. */
int cudak_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps,
                      cudak_stream st);
/* dx = (or, with acc, dx +=) the RMSNorm input gradient of each row (llamak_rmsnorm_bwd); the
 * weight gradient is cudak_rmsnorm_dw. dx must not alias x or dout. */
int cudak_rmsnorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w, const float *rstd, int N,
                         int C, int acc, cudak_stream st);
/* dw += sum_n dout[n] * x[n] * rstd[n], summed per chunk of rows into part (scratch of
 * cudak_rmsnorm_dw_scratch(N, C) floats), then the chunks in order. */
size_t cudak_rmsnorm_dw_scratch(int N, int C);
int cudak_rmsnorm_dw(float *dw, float *part, const float *dout, const float *x, const float *rstd, int N, int C,
                     cudak_stream st);

/* ---- RoPE ------------------------------------------------------------------------------ */

/* In place on x [B*T, NH, D] (row stride ldx >= NH*D): the rotate-half rotation of
 * llamak_rope_fwd, or with bwd its inverse (llamak_rope_bwd). cos_t, sin_t [T, D/2] are the
 * tables of llamak_rope_table uploaded as they are (row n uses table row n % T; sequences that
 * start at position p0 pass cos_t + p0*(D/2)). D must be even. */
int cudak_rope(float *x, int ldx, const float *cos_t, const float *sin_t, int B, int T, int NH, int D, int bwd,
               cudak_stream st);

/* ----- SwiGLU over N rows of ncol ------------------------------------------------------- */

/* h[n, i] = silu(gate[n, i]) * up[n, i]; gate and up rows at + n*ldg (ldg = ncol for separate
 * buffers, 2*ncol for the halves of a fused gate/up output), h rows at + n*ldh. h may alias gate
 * or up when the strides agree. */
int cudak_swiglu_fwd(float *h, int ldh, const float *gate, const float *up, int ldg, int N, int ncol, cudak_stream st);
/* llamak_swiglu_bwd per row: dgate, dup in the layout of gate, up (stride ldg), dh at ldh. dgate
 * may alias gate or dh and dup may alias up (each thread reads its element before writing). */
int cudak_swiglu_bwd(float *dgate, float *dup, const float *dh, int ldh, const float *gate, const float *up, int ldg,
                     int N, int ncol, cudak_stream st);

/* ---- Grouped-query causal attention ---------------------------------------------------- */

/* Query head h of sequence b reads KV head h / (NH/NKV) (llamak_kv_head). att [B, NH, T, T]
 * receives the probabilities (zeros above the diagonal), out [B*T, NH, D] (row stride ldo)
 * the attention output: llamak_attn_fwd for every (b, h). NH must be a multiple of NKV. */
int cudak_gqa_attn_fwd(float *out, int ldo, float *att, const float *q, int ldq, const float *k, const float *v,
                       int ldkv, int B, int T, int NH, int NKV, int D, cudak_stream st);
/* Backward with the forward's att: dq (layout of q, stride ldq) is overwritten; dk, dv (layout
 * of k, v, stride ldkv) are ACCUMULATED, each element summing the rep query heads of its group
 * in ascending h, then t ascending, after the value already there (llamak_attn_bwd called for
 * h ascending): zero them first for a plain gradient. datt is scratch [B, NH, T, T]. */
int cudak_gqa_attn_bwd(float *dq, float *dk, float *dv, float *datt, const float *dout, int ldo, const float *att,
                       const float *q, int ldq, const float *k, const float *v, int ldkv, int B, int T, int NH,
                       int NKV, int D, cudak_stream st);

#ifdef __cplusplus
}
#endif
#endif
