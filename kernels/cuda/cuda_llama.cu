/* cuda_llama.cu — the CUDA twins of the Llama-class leaf kernels (contracts in cuda_llama.h,
 * CPU twins in kernels/cpu/llama_kernels.c, math in docs/design.md §3.12). Kept plain on
 * purpose: one warp per row for RMSNorm, one thread per output element elsewhere, each summing
 * in the CPU twin's order where the twin has one, so the pair differs only by rounding (fused
 * multiply-adds, warp-tree sums) and every result is deterministic. Attention reads q, k and v
 * in place through row strides, which is how grouped-query heads share a KV head without a
 * copy; the softmax and its backward are cuda_kernels.cu's, shared with GPT-2. */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>

extern "C" {
#include "common/errors.h"
#include "kernels/cuda/cuda_llama.h"
}

#define ST(s) ((cudaStream_t)(s))
#define THREADS 256
#define WARPS_PER_BLOCK 8 /* rows per RMSNorm block: one warp each */
#define DW_TILE 32        /* columns per dw partial block */
#define DW_ROWT 8         /* row threads per dw partial block */
#define DW_CHUNK 256      /* rows per dw partial */

static int launched(const char *what, int line) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return dpc_err(DPC_EBACKEND, "cuda: launching %s (cuda_llama.cu:%d) failed: %s", what, line,
                   cudaGetErrorString(e));
  return 0;
}
#define LAUNCHED(what) launched(what, __LINE__)
#define TRY(call)              \
  do {                         \
    const int rc_ = (call);    \
    if (rc_ != 0) return rc_;  \
  } while (0)

/* Blocks of `threads` covering n items; 0 when n does not fit a grid's x dimension (2^31 - 1
 * blocks), which the launchers report instead of launching a truncated grid. */
static unsigned blocks_for(size_t n, unsigned threads) {
  const size_t b = (n + threads - 1) / threads;
  return b > (size_t)INT_MAX ? 0u : (unsigned)b;
}

static int too_big(const char *what, size_t n) {
  return dpc_err(DPC_EINVAL, "cuda: %s over %zu elements needs more than 2^31 - 1 blocks", what, n);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* ---- RMSNorm ---------------------------------------------------------------------------- */

/* The row index depends only on the warp, so a warp returns whole and the full-mask shuffles
 * below always have all 32 lanes. Lane l owns columns l, l + 32, ...: it reads x[i] before it
 * writes out[i], so out may alias x. */
__global__ void rmsnorm_fwd_k(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps) {
  const int row = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *xr = x + (size_t)row * C;
  float ss = 0.0f;
  for (int i = lane; i < C; i += 32) ss += xr[i] * xr[i];
  const float rs = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
  float *o = out + (size_t)row * C;
  for (int i = lane; i < C; i += 32) o[i] = w[i] * (xr[i] * rs);
  if (lane == 0) rstd[row] = rs;
}

extern "C" int cudak_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps,
                                 cudak_stream st) {
  if (N <= 0 || C <= 0) return 0;
  rmsnorm_fwd_k<<<blocks_for((size_t)N, WARPS_PER_BLOCK), 32 * WARPS_PER_BLOCK, 0, ST(st)>>>(out, rstd, x, w, N, C,
                                                                                              eps);
  return LAUNCHED("rmsnorm_fwd");
}

__global__ void rmsnorm_bwd_dx_k(float *dx, const float *dout, const float *x, const float *w, const float *rstd,
                                 int N, int C, int acc) {
  const int row = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *xr = x + (size_t)row * C, *dr = dout + (size_t)row * C;
  const float rs = rstd[row];
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s += w[i] * dr[i] * (xr[i] * rs);
  const float m = warp_sum(s) / (float)C;
  float *dxr = dx + (size_t)row * C;
  for (int i = lane; i < C; i += 32) {
    const float xhat = xr[i] * rs;
    const float d = rs * (w[i] * dr[i] - xhat * m);
    dxr[i] = acc ? dxr[i] + d : d;
  }
}

extern "C" int cudak_rmsnorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w, const float *rstd,
                                    int N, int C, int acc, cudak_stream st) {
  if (N <= 0 || C <= 0) return 0;
  rmsnorm_bwd_dx_k<<<blocks_for((size_t)N, WARPS_PER_BLOCK), 32 * WARPS_PER_BLOCK, 0, ST(st)>>>(dx, dout, x, w, rstd,
                                                                                                 N, C, acc);
  return LAUNCHED("rmsnorm_bwd_dx");
}

/* grid (column tiles, row chunks), block (DW_TILE, DW_ROWT): thread (tx, ty) sums rows
 * r0 + ty, r0 + ty + DW_ROWT, ... of its chunk for column col; row thread 0 then adds the
 * DW_ROWT sums in ty order into part[chunk][col]. */
__global__ void rmsnorm_dw_partial_k(float *part, const float *dout, const float *x, const float *rstd, int N,
                                     int C) {
  __shared__ float sh[DW_ROWT][DW_TILE];
  const int col = blockIdx.x * DW_TILE + threadIdx.x, r0 = blockIdx.y * DW_CHUNK;
  const int r1 = r0 + DW_CHUNK < N ? r0 + DW_CHUNK : N;
  float s = 0.0f;
  if (col < C)
    for (int r = r0 + threadIdx.y; r < r1; r += DW_ROWT)
      s += dout[(size_t)r * C + col] * (x[(size_t)r * C + col] * rstd[r]);
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    float t = 0.0f;
    for (int y = 0; y < DW_ROWT; y++) t += sh[y][threadIdx.x];
    part[(size_t)blockIdx.y * C + col] = t;
  }
}

__global__ void rmsnorm_dw_reduce_k(float *dw, const float *part, int nchunk, int C) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= C) return;
  float t = 0.0f;
  for (int k = 0; k < nchunk; k++) t += part[(size_t)k * C + col];
  dw[col] += t;
}

extern "C" size_t cudak_rmsnorm_dw_scratch(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return (size_t)((N + DW_CHUNK - 1) / DW_CHUNK) * (size_t)C;
}

extern "C" int cudak_rmsnorm_dw(float *dw, float *part, const float *dout, const float *x, const float *rstd, int N,
                                int C, cudak_stream st) {
  if (N <= 0 || C <= 0) return 0;
  const int nchunk = (N + DW_CHUNK - 1) / DW_CHUNK;
  if (nchunk > 65535) /* gridDim.y's limit */
    return dpc_err(DPC_EINVAL, "cuda: rmsnorm_dw over %d rows exceeds %d", N, 65535 * DW_CHUNK);
  dim3 grid(blocks_for((size_t)C, DW_TILE), (unsigned)nchunk), block(DW_TILE, DW_ROWT);
  rmsnorm_dw_partial_k<<<grid, block, 0, ST(st)>>>(part, dout, x, rstd, N, C);
  int rc = LAUNCHED("rmsnorm_dw_partial");
  if (rc) return rc;
  rmsnorm_dw_reduce_k<<<blocks_for((size_t)C, 128), 128, 0, ST(st)>>>(dw, part, nchunk, C);
  return LAUNCHED("rmsnorm_dw_reduce");
}

/* ---- RoPE -------------------------------------------------------------------------------- */

/* Thread = one pair (row n, head h, i < D/2); sgn = +1 forward, -1 backward, applied to sin as
 * in llama_kernels.c's rope_rotate. */
__global__ void rope_k(float *x, int ldx, const float *cos_t, const float *sin_t, int T, int NH, int H, float sgn,
                       size_t total) {
  const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int i = (int)(idx % H);
  const size_t r = idx / H;
  const int h = (int)(r % NH);
  const size_t n = r / NH;
  const int t = (int)(n % T);
  const float c = cos_t[(size_t)t * H + i], s = sgn * sin_t[(size_t)t * H + i];
  float *a = x + n * (size_t)ldx + (size_t)h * (2 * H) + i, *b = a + H;
  const float ai = *a, bi = *b;
  *a = ai * c - bi * s;
  *b = bi * c + ai * s;
}

extern "C" int cudak_rope(float *x, int ldx, const float *cos_t, const float *sin_t, int B, int T, int NH, int D,
                          int bwd, cudak_stream st) {
  if (D <= 0 || D % 2 != 0 || ldx < NH * D)
    return dpc_err(DPC_EINVAL, "cuda: rope needs an even head size and ldx >= NH*D (D %d, NH %d, ldx %d)", D, NH,
                   ldx);
  if (B <= 0 || T <= 0 || NH <= 0) return 0;
  const size_t total = (size_t)B * T * NH * (D / 2);
  const unsigned nb = blocks_for(total, THREADS);
  if (!nb) return too_big("rope", total);
  rope_k<<<nb, THREADS, 0, ST(st)>>>(x, ldx, cos_t, sin_t, T, NH, D / 2, bwd ? -1.0f : 1.0f, total);
  return LAUNCHED(bwd ? "rope_bwd" : "rope_fwd");
}

/* ---- SwiGLU ------------------------------------------------------------------------------ */

/* expf of a large -g is inf and 1/(1 + inf) is 0, so silu stays finite where the CPU twin
 * clamps instead (both give a value below 1e-35 in magnitude). */
__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void swiglu_fwd_k(float *h, int ldh, const float *gate, const float *up, int ldg, int ncol,
                             size_t total) {
  const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const size_t n = idx / ncol;
  const int i = (int)(idx % ncol);
  const size_t gi = n * (size_t)ldg + i;
  const float g = gate[gi], u = up[gi];
  h[n * (size_t)ldh + i] = (g * sigmoidf_(g)) * u;
}

__global__ void swiglu_bwd_k(float *dgate, float *dup, const float *dh, int ldh, const float *gate, const float *up,
                             int ldg, int ncol, size_t total) {
  const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const size_t n = idx / ncol;
  const int i = (int)(idx % ncol);
  const size_t gi = n * (size_t)ldg + i;
  const float g = gate[gi], u = up[gi], d = dh[n * (size_t)ldh + i];
  const float s = sigmoidf_(g);
  dgate[gi] = d * u * (s * (1.0f + g * (1.0f - s)));
  dup[gi] = d * (g * s);
}

static int swiglu_args(const char *what, int ldh, int ldg, int ncol) {
  if (ldh < ncol || ldg < ncol)
    return dpc_err(DPC_EINVAL, "cuda: %s needs ldh and ldg >= ncol (%d, %d, %d)", what, ldh, ldg, ncol);
  return 0;
}

extern "C" int cudak_swiglu_fwd(float *h, int ldh, const float *gate, const float *up, int ldg, int N, int ncol,
                                cudak_stream st) {
  if (N <= 0 || ncol <= 0) return 0;
  TRY(swiglu_args("swiglu_fwd", ldh, ldg, ncol));
  const size_t total = (size_t)N * ncol;
  const unsigned nb = blocks_for(total, THREADS);
  if (!nb) return too_big("swiglu_fwd", total);
  swiglu_fwd_k<<<nb, THREADS, 0, ST(st)>>>(h, ldh, gate, up, ldg, ncol, total);
  return LAUNCHED("swiglu_fwd");
}

extern "C" int cudak_swiglu_bwd(float *dgate, float *dup, const float *dh, int ldh, const float *gate,
                                const float *up, int ldg, int N, int ncol, cudak_stream st) {
  if (N <= 0 || ncol <= 0) return 0;
  TRY(swiglu_args("swiglu_bwd", ldh, ldg, ncol));
  const size_t total = (size_t)N * ncol;
  const unsigned nb = blocks_for(total, THREADS);
  if (!nb) return too_big("swiglu_bwd", total);
  swiglu_bwd_k<<<nb, THREADS, 0, ST(st)>>>(dgate, dup, dh, ldh, gate, up, ldg, ncol, total);
  return LAUNCHED("swiglu_bwd");
}

/* ---- grouped-query causal attention ------------------------------------------------------ */

/* The shape of one call; rep = NH / NKV query heads per KV head. Strides in floats. */
struct gqa_shape {
  int B, T, NH, NKV, D, rep, ldq, ldkv, ldo;
};

/* Thread = one (b, h, t, u) of att [B, NH, T, T], idx in that order: for u <= t,
 * a[idx] = scale * (x_t . y_u) where x is the query-head block (q, or dout for the backward's
 * dp) and y the KV-head block (k, or v); 0 above the diagonal. x rows at ldx, y rows at ldkv. */
__global__ void gqa_scores_k(float *a, const float *x, int ldx, const float *y, gqa_shape s, float scale,
                             size_t total) {
  const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int u = (int)(idx % s.T);
  size_t r = idx / s.T;
  const int t = (int)(r % s.T);
  r /= s.T;
  const int h = (int)(r % s.NH);
  const size_t b = r / s.NH;
  if (u > t) {
    a[idx] = 0.0f;
    return;
  }
  const float *xt = x + (b * s.T + t) * (size_t)ldx + (size_t)h * s.D;
  const float *yu = y + (b * s.T + u) * (size_t)s.ldkv + (size_t)(h / s.rep) * s.D;
  float acc = 0.0f;
  for (int d = 0; d < s.D; d++) acc += xt[d] * yu[d];
  a[idx] = scale * acc;
}

/* Thread = one (b, t, h, d) of a query-head block (out, or dq), idx in that order:
 * o = sum_{u <= t} a[b, h, t, u] * y[b*T + u, h / rep, d], u ascending (llamak_attn_fwd's axpy
 * over u for out = P V; the backward's dq = dS K). */
__global__ void gqa_mix_k(float *o, int ldo, const float *a, const float *y, gqa_shape s, size_t total) {
  const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int d = (int)(idx % s.D);
  size_t r = idx / s.D;
  const int h = (int)(r % s.NH);
  r /= s.NH;
  const int t = (int)(r % s.T);
  const size_t b = r / s.T;
  const float *ar = a + ((b * s.NH + h) * s.T + t) * (size_t)s.T;
  const float *yb = y + b * s.T * (size_t)s.ldkv + (size_t)(h / s.rep) * s.D + d;
  float acc = 0.0f;
  for (int u = 0; u <= t; u++) acc += ar[u] * yb[(size_t)u * s.ldkv];
  o[(b * s.T + t) * (size_t)ldo + (size_t)h * s.D + d] = acc;
}

/* Thread = one (b, u, j, d) of the KV-head blocks, idx in that order: starting from the value
 * there, dk += ds[b, h, t, u] * q[b*T + t, h, d] and dv += p[b, h, t, u] * dout[b*T + t, h, d]
 * for the group's query heads h = j*rep .. j*rep + rep - 1 ascending, then t = u .. T-1
 * ascending: the CPU twin's order when it is called for h ascending. */
__global__ void gqa_dkv_k(float *dk, float *dv, const float *ds, const float *p, const float *q, const float *dout,
                          gqa_shape s, size_t total) {
  const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int d = (int)(idx % s.D);
  size_t r = idx / s.D;
  const int j = (int)(r % s.NKV);
  r /= s.NKV;
  const int u = (int)(r % s.T);
  const size_t b = r / s.T;
  const size_t kvi = (b * s.T + u) * (size_t)s.ldkv + (size_t)j * s.D + d;
  float ak = dk[kvi], av = dv[kvi];
  for (int h = j * s.rep; h < (j + 1) * s.rep; h++) {
    const size_t a0 = (b * s.NH + h) * (size_t)s.T * s.T + u; /* element (t, u) at a0 + t*T */
    const float *qh = q + b * s.T * (size_t)s.ldq + (size_t)h * s.D + d;
    const float *oh = dout + b * s.T * (size_t)s.ldo + (size_t)h * s.D + d;
    for (int t = u; t < s.T; t++) {
      ak += ds[a0 + (size_t)t * s.T] * qh[(size_t)t * s.ldq];
      av += p[a0 + (size_t)t * s.T] * oh[(size_t)t * s.ldo];
    }
  }
  dk[kvi] = ak;
  dv[kvi] = av;
}

/* Checks the shape and fills s; 1 when there is nothing to compute, <0 on a bad shape. */
static int gqa_setup(gqa_shape *s, const char *what, int B, int T, int NH, int NKV, int D, int ldq, int ldkv,
                     int ldo) {
  if (NKV <= 0 || NH <= 0 || NH % NKV != 0 || D <= 0 || ldq < NH * D || ldo < NH * D || ldkv < NKV * D)
    return dpc_err(DPC_EINVAL,
                   "cuda: %s needs NH a positive multiple of NKV, D > 0 and row strides of at least the heads "
                   "(NH %d, NKV %d, D %d, ldq %d, ldkv %d, ldo %d)",
                   what, NH, NKV, D, ldq, ldkv, ldo);
  if (B <= 0 || T <= 0) return 1;
  *s = gqa_shape{B, T, NH, NKV, D, NH / NKV, ldq, ldkv, ldo};
  /* The three grids: att [B, NH, T, T], the query-head and the KV-head blocks. */
  const size_t n[3] = {(size_t)B * NH * T * T, (size_t)B * T * NH * D, (size_t)B * T * NKV * D};
  for (int i = 0; i < 3; i++)
    if (!blocks_for(n[i], THREADS)) return too_big(what, n[i]);
  return 0;
}

extern "C" int cudak_gqa_attn_fwd(float *out, int ldo, float *att, const float *q, int ldq, const float *k,
                                  const float *v, int ldkv, int B, int T, int NH, int NKV, int D, cudak_stream st) {
  gqa_shape s;
  const int rc = gqa_setup(&s, "gqa_attn_fwd", B, T, NH, NKV, D, ldq, ldkv, ldo);
  if (rc) return rc < 0 ? rc : 0;
  const size_t natt = (size_t)B * NH * T * T, nq = (size_t)B * T * NH * D;
  gqa_scores_k<<<blocks_for(natt, THREADS), THREADS, 0, ST(st)>>>(att, q, ldq, k, s, 1.0f / sqrtf((float)D), natt);
  TRY(LAUNCHED("gqa_scores"));
  TRY(cudak_causal_softmax(att, (size_t)B * NH * T, T, st));
  gqa_mix_k<<<blocks_for(nq, THREADS), THREADS, 0, ST(st)>>>(out, ldo, att, v, s, nq);
  return LAUNCHED("gqa_out");
}

extern "C" int cudak_gqa_attn_bwd(float *dq, float *dk, float *dv, float *datt, const float *dout, int ldo,
                                  const float *att, const float *q, int ldq, const float *k, const float *v,
                                  int ldkv, int B, int T, int NH, int NKV, int D, cudak_stream st) {
  gqa_shape s;
  const int rc = gqa_setup(&s, "gqa_attn_bwd", B, T, NH, NKV, D, ldq, ldkv, ldo);
  if (rc) return rc < 0 ? rc : 0;
  const size_t natt = (size_t)B * NH * T * T, nq = (size_t)B * T * NH * D, nkv = (size_t)B * T * NKV * D;
  /* dp = dout . v, then ds = scale * p * (dp - p . dp) in place (cpuk_causal_softmax_bwd_row). */
  gqa_scores_k<<<blocks_for(natt, THREADS), THREADS, 0, ST(st)>>>(datt, dout, ldo, v, s, 1.0f, natt);
  TRY(LAUNCHED("gqa_dp"));
  TRY(cudak_causal_softmax_bwd(datt, att, (size_t)B * NH * T, T, 1.0f / sqrtf((float)D), st));
  gqa_mix_k<<<blocks_for(nq, THREADS), THREADS, 0, ST(st)>>>(dq, ldq, datt, k, s, nq);
  TRY(LAUNCHED("gqa_dq"));
  gqa_dkv_k<<<blocks_for(nkv, THREADS), THREADS, 0, ST(st)>>>(dk, dv, datt, att, q, dout, s, nkv);
  return LAUNCHED("gqa_dkv");
}
