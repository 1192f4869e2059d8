/* cuda_kernels.cu — the CUDA backend's elementwise, row-wise and reduction kernels (the matrix
 * products go through cuBLAS in cuda_backend.cu). Each kernel mirrors its CPU twin in
 * kernels/cpu/cpu_kernels.c; see cuda_kernels.h for the contracts. Row kernels give one warp
 * per row (LayerNorm, softmax) or one block per row (cross-entropy over V); column sums go
 * through per-chunk partials reduced in chunk order, so nothing depends on scheduling. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

extern "C" {
#include "common/errors.h"
#include "kernels/cuda/cuda_kernels.h"
}

#define ST(s) ((cudaStream_t)(s))
#define GELU_BETA 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_KAPPA 0.044715f
#define WARPS_PER_BLOCK 8
#define COL_TILE 32      /* columns per colsum block */
#define COL_ROWT 8       /* row threads per colsum block */
#define COL_CHUNK 256    /* rows per colsum partial */

static int launched(const char *what, int line) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return dpc_err(DPC_EBACKEND, "cuda: launching %s (cuda_kernels.cu:%d) failed: %s", what, line,
                   cudaGetErrorString(e));
  return 0;
}
#define LAUNCHED(what) launched(what, __LINE__)

static unsigned blocks_for(size_t n, unsigned threads) { return (unsigned)((n + threads - 1) / threads); }

/* ---- reductions ------------------------------------------------------------------------ */

template <typename F> __device__ __forceinline__ F warp_sum(F v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum (or max) over the block; every thread gets the result. The leading barrier lets a
 * block call it several times in a row. */
template <typename F, bool MAX> __device__ F block_reduce(F v) {
  __shared__ F sh[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (MAX) v = warp_max(v);
  else v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : (MAX ? (F)-INFINITY : (F)0);
  if (MAX) v = warp_max(v);
  else v = warp_sum(v);
  return v;
}

/* ---- embeddings ------------------------------------------------------------------------ */

__global__ void encoder_fwd_k(float *out, const int *inp, const float *wte, const float *wpe, int T, int C,
                              size_t total) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= total) return;
  const size_t n = i / C;
  const int c = (int)(i % C), t = (int)(n % T);
  out[i] = wte[(size_t)inp[n] * C + c] + wpe[(size_t)t * C + c];
}

extern "C" int cudak_encoder_fwd(float *out, const int *inp, const float *wte, const float *wpe, int N, int T, int C,
                                 cudak_stream st) {
  const size_t total = (size_t)N * C;
  encoder_fwd_k<<<blocks_for(total, 256), 256, 0, ST(st)>>>(out, inp, wte, wpe, T, C, total);
  return LAUNCHED("encoder_fwd");
}

__global__ void wpe_bwd_k(float *dwpe, const float *dout, int B, int T, int C) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)T * C) return;
  float s = 0.0f;
  for (int b = 0; b < B; b++) s += dout[(size_t)b * T * C + i];
  dwpe[i] += s;
}

extern "C" int cudak_wpe_bwd(float *dwpe, const float *dout, int B, int T, int C, cudak_stream st) {
  wpe_bwd_k<<<blocks_for((size_t)T * C, 256), 256, 0, ST(st)>>>(dwpe, dout, B, T, C);
  return LAUNCHED("wpe_bwd");
}

/* grid (U, column blocks): thread = one column of one distinct token. */
__global__ void wte_bwd_k(float *dwte, const float *dout, const int *uniq, const int *start, const int *pos, int C) {
  const int u = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int j = start[u]; j < start[u + 1]; j++) s += dout[(size_t)pos[j] * C + c];
  dwte[(size_t)uniq[u] * C + c] += s;
}

extern "C" int cudak_wte_bwd(float *dwte, const float *dout, const int *uniq, const int *start, const int *pos, int U,
                             int C, cudak_stream st) {
  if (U <= 0) return 0;
  dim3 grid((unsigned)U, blocks_for((size_t)C, 128));
  wte_bwd_k<<<grid, 128, 0, ST(st)>>>(dwte, dout, uniq, start, pos, C);
  return LAUNCHED("wte_bwd");
}

/* ---- LayerNorm -------------------------------------------------------------------------- */

__global__ void layernorm_fwd_k(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                                int N, int C) {
  const int row = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *xr = x + (size_t)row * C;
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s += xr[i];
  const float mu = warp_sum(s) / (float)C;
  float v = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float d = xr[i] - mu;
    v += d * d;
  }
  const float rs = 1.0f / sqrtf(warp_sum(v) / (float)C + 1e-5f);
  float *o = out + (size_t)row * C;
  for (int i = lane; i < C; i += 32) o[i] = (xr[i] - mu) * rs * w[i] + b[i];
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

extern "C" int cudak_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                                   const float *b, int N, int C, cudak_stream st) {
  layernorm_fwd_k<<<blocks_for((size_t)N, WARPS_PER_BLOCK), 32 * WARPS_PER_BLOCK, 0, ST(st)>>>(out, mean, rstd, x, w,
                                                                                                b, N, C);
  return LAUNCHED("layernorm_fwd");
}

__global__ void layernorm_bwd_dx_k(float *dx, const float *dout, const float *x, const float *w, const float *mean,
                                   const float *rstd, int N, int C) {
  const int row = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const float *xr = x + (size_t)row * C, *dr = dout + (size_t)row * C;
  const float mu = mean[row], rs = rstd[row];
  float a = 0.0f, bb = 0.0f;
  for (int i = lane; i < C; i += 32) {
    const float xhat = (xr[i] - mu) * rs, dn = w[i] * dr[i];
    a += dn;
    bb += dn * xhat;
  }
  const float dnorm_mean = warp_sum(a) / (float)C, dnorm_norm_mean = warp_sum(bb) / (float)C;
  float *dxr = dx + (size_t)row * C;
  for (int i = lane; i < C; i += 32) {
    const float xhat = (xr[i] - mu) * rs, dn = w[i] * dr[i];
    dxr[i] += (dn - dnorm_mean - xhat * dnorm_norm_mean) * rs;
  }
}

extern "C" int cudak_layernorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w, const float *mean,
                                      const float *rstd, int N, int C, cudak_stream st) {
  layernorm_bwd_dx_k<<<blocks_for((size_t)N, WARPS_PER_BLOCK), 32 * WARPS_PER_BLOCK, 0, ST(st)>>>(dx, dout, x, w,
                                                                                                   mean, rstd, N, C);
  return LAUNCHED("layernorm_bwd_dx");
}

/* grid (column tiles, row chunks), block (COL_TILE, COL_ROWT): partial sums of one chunk. */
__global__ void colsum_partial_k(float *part, const float *dout, const float *x, const float *mean, const float *rstd,
                                 int N, int C) {
  __shared__ float sh0[COL_ROWT][COL_TILE], sh1[COL_ROWT][COL_TILE];
  const int col = blockIdx.x * COL_TILE + threadIdx.x, r0 = blockIdx.y * COL_CHUNK;
  const int r1 = r0 + COL_CHUNK < N ? r0 + COL_CHUNK : N;
  float s0 = 0.0f, s1 = 0.0f;
  if (col < C) {
    for (int r = r0 + threadIdx.y; r < r1; r += COL_ROWT) {
      const float d = dout[(size_t)r * C + col];
      if (x) {
        s0 += d * ((x[(size_t)r * C + col] - mean[r]) * rstd[r]);
        s1 += d;
      } else {
        s0 += d;
      }
    }
  }
  sh0[threadIdx.y][threadIdx.x] = s0;
  sh1[threadIdx.y][threadIdx.x] = s1;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    float t0 = 0.0f, t1 = 0.0f;
    for (int y = 0; y < COL_ROWT; y++) {
      t0 += sh0[y][threadIdx.x];
      t1 += sh1[y][threadIdx.x];
    }
    part[(size_t)blockIdx.y * 2 * C + col] = t0;
    part[(size_t)blockIdx.y * 2 * C + C + col] = t1;
  }
}

__global__ void colsum_reduce_k(float *dst0, float *dst1, const float *part, int nchunk, int C) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= C) return;
  float t0 = 0.0f, t1 = 0.0f;
  for (int k = 0; k < nchunk; k++) {
    t0 += part[(size_t)k * 2 * C + col];
    t1 += part[(size_t)k * 2 * C + C + col];
  }
  dst0[col] += t0;
  if (dst1) dst1[col] += t1;
}

extern "C" size_t cudak_colsum_scratch(int N, int C) {
  return (size_t)((N + COL_CHUNK - 1) / COL_CHUNK) * 2 * (size_t)C;
}

extern "C" int cudak_colsum(float *dst0, float *dst1, float *part, const float *dout, const float *x,
                            const float *mean, const float *rstd, int N, int C, cudak_stream st) {
  const int nchunk = (N + COL_CHUNK - 1) / COL_CHUNK;
  dim3 grid(blocks_for((size_t)C, COL_TILE), (unsigned)nchunk), block(COL_TILE, COL_ROWT);
  colsum_partial_k<<<grid, block, 0, ST(st)>>>(part, dout, x, mean, rstd, N, C);
  int rc = LAUNCHED("colsum_partial");
  if (rc) return rc;
  colsum_reduce_k<<<blocks_for((size_t)C, 128), 128, 0, ST(st)>>>(dst0, x ? dst1 : NULL, part, nchunk, C);
  return LAUNCHED("colsum_reduce");
}

/* ---- bias, GELU ------------------------------------------------------------------------ */

__global__ void bias_add_k(float *out, const float *bias, const float *res, size_t total, int OC) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= total) return;
  const float o = out[i] + bias[i % OC];
  out[i] = res ? res[i] + o : o;
}

extern "C" int cudak_bias_add(float *out, const float *bias, const float *res, int N, int OC, cudak_stream st) {
  const size_t total = (size_t)N * OC;
  bias_add_k<<<blocks_for(total, 256), 256, 0, ST(st)>>>(out, bias, res, total, OC);
  return LAUNCHED("bias_add");
}

__global__ void bias_gelu_k(float *pre, float *act, const float *bias, size_t total, int OC) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= total) return;
  const float x = pre[i] + bias[i % OC];
  pre[i] = x;
  const float u = GELU_BETA * (x + GELU_KAPPA * x * x * x);
  act[i] = 0.5f * x * (1.0f + tanhf(u));
}

extern "C" int cudak_bias_gelu(float *pre, float *act, const float *bias, int N, int OC, cudak_stream st) {
  const size_t total = (size_t)N * OC;
  bias_gelu_k<<<blocks_for(total, 256), 256, 0, ST(st)>>>(pre, act, bias, total, OC);
  return LAUNCHED("bias_gelu");
}

__global__ void gelu_bwd_k(float *d, const float *pre, size_t n) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = pre[i], x2 = x * x;
  const float th = tanhf(GELU_BETA * (x + GELU_KAPPA * x2 * x));
  const float left = 0.5f * (1.0f + th);
  const float right = 0.5f * x * (1.0f - th * th) * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2);
  d[i] *= left + right;
}

extern "C" int cudak_gelu_bwd(float *d, const float *pre, size_t n, cudak_stream st) {
  gelu_bwd_k<<<blocks_for(n, 256), 256, 0, ST(st)>>>(d, pre, n);
  return LAUNCHED("gelu_bwd");
}

/* ---- attention layout ------------------------------------------------------------------ */

/* Thread i indexes (b, h, t, d) of a (B, NH, T, hs) tensor; src is its (B, T, .) row element. */
__device__ __forceinline__ size_t head_row_index(size_t i, int T, int NH, int hs, int row_width) {
  const int d = (int)(i % hs);
  size_t r = i / hs;
  const int t = (int)(r % T);
  r /= T;
  const int h = (int)(r % NH);
  const size_t b = r / NH;
  return (b * T + t) * (size_t)row_width + (size_t)h * hs + d;
}

__global__ void qkv_permute_k(float *q, float *k, float *v, const float *qkv, int T, int NH, int hs, size_t total,
                              int bwd) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int C = NH * hs;
  const size_t s = head_row_index(i, T, NH, hs, 3 * C);
  float *dqkv = (float *)qkv;
  if (bwd) {
    dqkv[s] = q[i];
    dqkv[s + C] = k[i];
    dqkv[s + 2 * C] = v[i];
  } else {
    q[i] = qkv[s];
    k[i] = qkv[s + C];
    v[i] = qkv[s + 2 * C];
  }
}

extern "C" int cudak_qkv_permute(float *q, float *k, float *v, const float *qkv, int B, int T, int NH, int hs,
                                 cudak_stream st) {
  const size_t total = (size_t)B * T * NH * hs;
  qkv_permute_k<<<blocks_for(total, 256), 256, 0, ST(st)>>>(q, k, v, qkv, T, NH, hs, total, 0);
  return LAUNCHED("qkv_permute");
}

extern "C" int cudak_qkv_unpermute(float *dqkv, const float *dq, const float *dk, const float *dv, int B, int T,
                                   int NH, int hs, cudak_stream st) {
  const size_t total = (size_t)B * T * NH * hs;
  qkv_permute_k<<<blocks_for(total, 256), 256, 0, ST(st)>>>((float *)dq, (float *)dk, (float *)dv, dqkv, T, NH, hs,
                                                            total, 1);
  return LAUNCHED("qkv_unpermute");
}

__global__ void heads_k(float *dst, const float *src, int T, int NH, int hs, size_t total, int to_btc) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= total) return;
  const size_t r = head_row_index(i, T, NH, hs, NH * hs);
  if (to_btc) dst[r] = src[i];
  else dst[i] = src[r];
}

extern "C" int cudak_heads(float *dst, const float *src, int B, int T, int NH, int hs, int to_btc, cudak_stream st) {
  const size_t total = (size_t)B * T * NH * hs;
  heads_k<<<blocks_for(total, 256), 256, 0, ST(st)>>>(dst, src, T, NH, hs, total, to_btc);
  return LAUNCHED("heads");
}

/* ---- causal softmax --------------------------------------------------------------------- */

__global__ void causal_softmax_k(float *att, size_t rows, int T) {
  const size_t row = blockIdx.x * (size_t)WARPS_PER_BLOCK + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int t = (int)(row % T);
  float *p = att + row * T;
  float mx = -INFINITY;
  for (int u = lane; u <= t; u += 32) mx = fmaxf(mx, p[u]);
  mx = warp_max(mx);
  float s = 0.0f;
  for (int u = lane; u <= t; u += 32) {
    const float e = expf(p[u] - mx);
    p[u] = e;
    s += e;
  }
  const float inv = 1.0f / warp_sum(s);
  for (int u = lane; u < T; u += 32) p[u] = u <= t ? p[u] * inv : 0.0f;
}

extern "C" int cudak_causal_softmax(float *att, size_t rows, int T, cudak_stream st) {
  causal_softmax_k<<<blocks_for(rows, WARPS_PER_BLOCK), 32 * WARPS_PER_BLOCK, 0, ST(st)>>>(att, rows, T);
  return LAUNCHED("causal_softmax");
}

__global__ void causal_softmax_bwd_k(float *d, const float *p, size_t rows, int T, float scale) {
  const size_t row = blockIdx.x * (size_t)WARPS_PER_BLOCK + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int t = (int)(row % T);
  float *dr = d + row * T;
  const float *pr = p + row * T;
  float s = 0.0f;
  for (int u = lane; u <= t; u += 32) s += pr[u] * dr[u];
  s = warp_sum(s);
  for (int u = lane; u < T; u += 32) dr[u] = u <= t ? scale * (pr[u] * (dr[u] - s)) : 0.0f;
}

extern "C" int cudak_causal_softmax_bwd(float *d, const float *p, size_t rows, int T, float scale, cudak_stream st) {
  causal_softmax_bwd_k<<<blocks_for(rows, WARPS_PER_BLOCK), 32 * WARPS_PER_BLOCK, 0, ST(st)>>>(d, p, rows, T, scale);
  return LAUNCHED("causal_softmax_bwd");
}

/* ---- cross-entropy ---------------------------------------------------------------------- */

__global__ void xent_fwd_k(float *losses, float *lse, const float *logits, const int *targets, int V) {
  const float *l = logits + (size_t)blockIdx.x * V;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, l[i]);
  mx = block_reduce<float, true>(mx);
  float s = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(l[i] - mx);
  s = block_reduce<float, false>(s);
  if (threadIdx.x == 0) {
    const float L = mx + logf(s);
    lse[blockIdx.x] = L;
    losses[blockIdx.x] = L - l[targets[blockIdx.x]];
  }
}

extern "C" int cudak_xent_fwd(float *losses, float *lse, const float *logits, const int *targets, int N, int V,
                              cudak_stream st) {
  xent_fwd_k<<<(unsigned)N, 512, 0, ST(st)>>>(losses, lse, logits, targets, V);
  return LAUNCHED("xent_fwd");
}

__global__ void xent_bwd_k(float *logits, const float *lse, const int *targets, int V, float dloss) {
  float *l = logits + (size_t)blockIdx.x * V;
  const float L = lse[blockIdx.x];
  const int tg = targets[blockIdx.x];
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float g = expf(l[i] - L) * dloss;
    l[i] = i == tg ? g - dloss : g;
  }
}

extern "C" int cudak_xent_bwd(float *logits, const float *lse, const int *targets, int N, int V, float dloss,
                              cudak_stream st) {
  xent_bwd_k<<<(unsigned)N, 512, 0, ST(st)>>>(logits, lse, targets, V, dloss);
  return LAUNCHED("xent_bwd");
}

__global__ void sum_k(double *out, const float *x, int n) {
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_reduce<double, false>(s);
  if (threadIdx.x == 0) *out = s;
}

extern "C" int cudak_sum(double *out, const float *x, int n, cudak_stream st) {
  sum_k<<<1, 1024, 0, ST(st)>>>(out, x, n);
  return LAUNCHED("sum");
}

/* ---- optimizer -------------------------------------------------------------------------- */

__global__ void sumsq_segs_k(double *seg_sumsq, const float *g, const cudak_seg *segs) {
  const cudak_seg sg = segs[blockIdx.x];
  const float *x = g + sg.off;
  double s = 0.0;
  for (int i = threadIdx.x; i < sg.n; i += blockDim.x) s += (double)x[i] * (double)x[i];
  s = block_reduce<double, false>(s);
  if (threadIdx.x == 0) seg_sumsq[blockIdx.x] = s;
}

extern "C" int cudak_sumsq_segs(double *seg_sumsq, const float *g, const cudak_seg *segs, int nseg, cudak_stream st) {
  sumsq_segs_k<<<(unsigned)nseg, 256, 0, ST(st)>>>(seg_sumsq, g, segs);
  return LAUNCHED("sumsq_segs");
}

__global__ void norm_clip_k(float *scal, const double *seg_sumsq, int nseg, float max_norm) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nseg; i += blockDim.x) s += seg_sumsq[i];
  s = block_reduce<double, false>(s);
  if (threadIdx.x == 0) {
    const float norm = (float)sqrt(s);
    float clip = 1.0f;
    if (max_norm > 0.0f) {
      const float coef = max_norm / (norm + 1e-6f);
      if (coef < 1.0f) clip = coef;
    }
    scal[0] = norm;
    scal[1] = clip;
  }
}

extern "C" int cudak_norm_clip(float *scal, const double *seg_sumsq, int nseg, float max_norm, cudak_stream st) {
  norm_clip_k<<<1, 1024, 0, ST(st)>>>(scal, seg_sumsq, nseg, max_norm);
  return LAUNCHED("norm_clip");
}

/* Same float operations, in the same order, as cpuk_adamw (torch 1.13 _single_tensor_adamw).
 * Contraction into FMAs is switched off so the two agree to the last bits on most elements. */
__global__ void adamw_k(float *p, float *g, float *m, float *v, const cudak_seg *segs, const float *clipp,
                        float decay_mul, float beta1, float omb1, float beta2, float omb2, float bc2_sqrt, float eps,
                        float neg_step) {
  const cudak_seg sg = segs[blockIdx.x];
  const float clip = *clipp, dm = sg.decay ? decay_mul : 1.0f;
  for (int j = threadIdx.x; j < sg.n; j += blockDim.x) {
    const size_t i = sg.off + j;
    float gi = g[i];
    if (clip != 1.0f) {
      gi = __fmul_rn(gi, clip);
      g[i] = gi;
    }
    const float pi = __fmul_rn(p[i], dm);
    const float mi = __fadd_rn(__fmul_rn(m[i], beta1), __fmul_rn(gi, omb1));
    const float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(omb2, __fmul_rn(gi, gi)));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    p[i] = __fadd_rn(pi, __fmul_rn(neg_step, __fdiv_rn(mi, denom)));
    m[i] = mi;
    v[i] = vi;
  }
}

extern "C" int cudak_adamw(float *p, float *g, float *m, float *v, const cudak_seg *segs, int nseg, const float *clip,
                           float decay_mul, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
                           float bc2_sqrt, float eps, float neg_step_size, cudak_stream st) {
  adamw_k<<<(unsigned)nseg, 256, 0, ST(st)>>>(p, g, m, v, segs, clip, decay_mul, beta1, one_minus_beta1, beta2,
                                              one_minus_beta2, bc2_sqrt, eps, neg_step_size);
  return LAUNCHED("adamw");
}

/* ---- Muon (kernels/cuda/cuda_muon.cu) ---------------------------------------------------- */

__device__ __forceinline__ float lerp_rn(float a, float b, float w) {
  return w < 0.5f ? __fadd_rn(a, __fmul_rn(w, __fsub_rn(b, a))) : __fsub_rn(b, __fmul_rn(__fsub_rn(b, a), __fsub_rn(1.0f, w)));
}

/* As cpuk_muon_momentum, one element per thread, no FMA contraction. */
__global__ void muon_momentum_k(float *buf, float *g, float *X, int rows, int cols, int flip, const float *clipp,
                                float w_buf, float w_nest, int nesterov) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * cols) return;
  const int r = (int)(i / cols), j = (int)(i % cols);
  const float clip = *clipp;
  float gi = g[i];
  if (clip != 1.0f) {
    gi = __fmul_rn(gi, clip);
    g[i] = gi;
  }
  const float b = lerp_rn(buf[i], gi, w_buf);
  buf[i] = b;
  X[flip ? (size_t)j * rows + r : i] = nesterov ? lerp_rn(gi, b, w_nest) : b;
}

extern "C" int cudak_muon_momentum(float *buf, float *g, float *X, int rows, int cols, int flip, const float *clip,
                                   float w_buf, float w_nest, int nesterov, cudak_stream st) {
  const size_t n = (size_t)rows * cols;
  muon_momentum_k<<<blocks_for(n, 256), 256, 0, ST(st)>>>(buf, g, X, rows, cols, flip, clip, w_buf, w_nest, nesterov);
  return LAUNCHED("muon_momentum");
}

/* X /= max(|X|_F, 1e-7): sums of squares in double per chunk of MUON_CHUNK floats, those
 * reduced in a fixed order by one block (the divisor lands in part[nch]), then a grid-wide
 * division: no atomics, so the result is the same run to run. */
#define MUON_CHUNK 16384
__global__ void muon_sumsq_k(double *part, const float *X, size_t n) {
  const size_t lo = (size_t)blockIdx.x * MUON_CHUNK, hi = lo + MUON_CHUNK < n ? lo + MUON_CHUNK : n;
  double s = 0.0;
  for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += (double)X[i] * (double)X[i];
  s = block_reduce<double, false>(s);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void muon_den_k(double *part, int nch) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nch; i += blockDim.x) s += part[i];
  s = block_reduce<double, false>(s);
  if (threadIdx.x == 0) {
    const float norm = (float)sqrt(s);
    part[nch] = norm > 1e-7f ? norm : 1e-7f;
  }
}

__global__ void muon_div_k(float *X, size_t n, const double *den) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) X[i] = __fdiv_rn(X[i], (float)*den);
}

extern "C" size_t cudak_muon_norm_scratch(size_t n) { return (n + MUON_CHUNK - 1) / MUON_CHUNK + 1; }

extern "C" int cudak_muon_normalize(float *X, size_t n, double *part, cudak_stream st) {
  const int nch = (int)((n + MUON_CHUNK - 1) / MUON_CHUNK);
  muon_sumsq_k<<<(unsigned)nch, 256, 0, ST(st)>>>(part, X, n);
  int rc = LAUNCHED("muon_sumsq");
  if (rc) return rc;
  muon_den_k<<<1, 1024, 0, ST(st)>>>(part, nch);
  if ((rc = LAUNCHED("muon_den"))) return rc;
  muon_div_k<<<blocks_for(n, 256), 256, 0, ST(st)>>>(X, n, part + nch);
  return LAUNCHED("muon_div");
}

/* As cpuk_muon_update. */
__global__ void muon_update_k(float *theta, const float *X, int rows, int cols, int flip, float decay_mul,
                              float neg_lr) {
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * cols) return;
  const int r = (int)(i / cols), j = (int)(i % cols);
  const float d = __fmul_rn(theta[i], decay_mul);
  theta[i] = __fadd_rn(d, __fmul_rn(neg_lr, X[flip ? (size_t)j * rows + r : i]));
}

extern "C" int cudak_muon_update(float *theta, const float *X, int rows, int cols, int flip, float decay_mul,
                                 float neg_lr, cudak_stream st) {
  const size_t n = (size_t)rows * cols;
  muon_update_k<<<blocks_for(n, 256), 256, 0, ST(st)>>>(theta, X, rows, cols, flip, decay_mul, neg_lr);
  return LAUNCHED("muon_update");
}

__global__ void to_bf16_k(__nv_bfloat16 *dst, const float *src, size_t n) {
  const size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 4;
  if (i + 4 <= n && ((uintptr_t)(src + i) & 15) == 0) {
    const float4 f = *(const float4 *)(src + i);
    __nv_bfloat162 a = __floats2bfloat162_rn(f.x, f.y), b = __floats2bfloat162_rn(f.z, f.w);
    dst[i] = a.x;
    dst[i + 1] = a.y;
    dst[i + 2] = b.x;
    dst[i + 3] = b.y;
  } else {
    for (size_t j = i; j < i + 4 && j < n; j++) dst[j] = __float2bfloat16_rn(src[j]);
  }
}

extern "C" int cudak_to_bf16(uint16_t *dst, const float *src, size_t n, cudak_stream st) {
  if (n == 0) return 0;
  to_bf16_k<<<blocks_for((n + 3) / 4, 256), 256, 0, ST(st)>>>((__nv_bfloat16 *)dst, src, n);
  return LAUNCHED("to_bf16");
}

/* ---- helpers for C callers ------------------------------------------------------------- */

static int cuda_fail(const char *what, cudaError_t e) {
  return dpc_err(e == cudaErrorMemoryAllocation ? DPC_ENOMEM : DPC_EBACKEND, "cuda: %s failed: %s", what,
                 cudaGetErrorString(e));
}

extern "C" int cudak_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

extern "C" int cudak_malloc(void **p, size_t bytes) {
  cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
  return e == cudaSuccess ? 0 : cuda_fail("cudaMalloc", e);
}

extern "C" void cudak_free(void *p) {
  if (p) cudaFree(p);
}

extern "C" int cudak_h2d(void *dst, const void *src, size_t bytes) {
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  return e == cudaSuccess ? 0 : cuda_fail("cudaMemcpy host to device", e);
}

extern "C" int cudak_d2h(void *dst, const void *src, size_t bytes) {
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? 0 : cuda_fail("cudaMemcpy device to host", e);
}

extern "C" int cudak_sync(void) {
  cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? 0 : cuda_fail("cudaDeviceSynchronize", e);
}

extern "C" int cudak_device_info(int dev, char *name, size_t name_len, int *major, int *minor) {
  cudaDeviceProp pr;
  cudaError_t e = cudaGetDeviceProperties(&pr, dev);
  if (e != cudaSuccess) return cuda_fail("cudaGetDeviceProperties", e);
  if (name && name_len) {
    size_t i = 0;
    for (; i + 1 < name_len && pr.name[i]; i++) name[i] = pr.name[i];
    name[i] = 0;
  }
  if (major) *major = pr.major;
  if (minor) *minor = pr.minor;
  return 0;
}
