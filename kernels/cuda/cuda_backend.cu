/* cuda_backend.cu — the CUDA compute backend (gpt_cuda_ops): GPT-2 forward, backward and
 * AdamW on one GPU, the same algorithm step for step as the CPU backend (cpu_backend.c), with
 * the matrix products in cuBLAS and the rest in cuda_kernels.cu. The Llama family's passes are
 * cuda_llama_model.cu's; the vtable, token upload, loss, dlogits and optimizer here serve
 * both, as does the cuBLAS product of cuda_shared.cu (the state is in cuda_shared.h).
 *
 * Precision: fp32 (default, CUDA-core SGEMM: the exact mode, within ~1e-5 of the CPU),
 * tf32 (tensor-core SGEMM with TF32 inputs) or bf16 (operands rounded to bfloat16, FP32
 * accumulation and FP32 master weights, activations, gradients and optimizer state). Every
 * kernel but the products runs in FP32 whatever the precision.
 *
 * Memory: parameters, gradients and the two AdamW moments are one device allocation and the
 * activations another, both made at create for (maxB, maxT); no call allocates afterwards.
 * cuBLAS works row-major here by computing the transposed (column-major) product: for
 * row-major C = A @ B it computes C^T = B^T @ A^T, which reads the same memory.
 *
 * Attention is the straightforward form: permute q, k, v to (B, NH, T, hs), one strided
 * batched GEMM for the scores, a causal softmax kept for backward, and a second GEMM; a fused
 * (flash) kernel is the next step for speed at long T. Every CUDA and cuBLAS failure is
 * reported with file, line, the failing call and CUDA's message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_shared.h"

enum { LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB, NLAYER_T };

static void layer_ptrs(const gpt_layout *lay, float *base, int l, float *w[NLAYER_T]) {
  const gpt_tensor *t = &lay->tensors[4 + NLAYER_T * l];
  for (int i = 0; i < NLAYER_T; i++) w[i] = base + t[i].offset;
}

static void cuda_destroy(gpt_model *m) {
  cuda_impl *c = (cuda_impl *)m->impl;
  if (!c) return;
  if (c->st) cudaStreamSynchronize(c->st);
  cudaFree(c->store);
  cudaFree(c->acts);
  cudaFree(c->seg_sumsq);
  cudaFree(c->dsum);
  cudaFree(c->segs);
  cudaFree(c->d_tok);
  cudaFree(c->a16);
  cudaFree(c->b16);
  if (c->blas) cublasDestroy(c->blas);
  if (c->st) cudaStreamDestroy(c->st);
  free(c->h_tok);
  free(c->h_cnt);
  cuda_llama_destroy(c);
  cuda_muon_destroy(c);
  free(c);
  m->impl = NULL;
}

/* Device, stream and cuBLAS handle, after the checks that need no allocation. */
static int device_setup(gpt_model *m, cuda_impl *c, cudaDeviceProp *pr) {
  const size_t B = m->maxB, N = B * m->maxT, NH = m->lay.cfg.n_head;
  if (m->opts.precision < PREC_FP32 || m->opts.precision > PREC_BF16)
    return dpc_err(DPC_EINVAL, "cuda backend: precision %d unknown (0 fp32, 1 tf32, 2 bf16)", m->opts.precision);
  if (N > (size_t)INT32_MAX / 8 || B * NH > 65535u * 1024u)
    return dpc_err(DPC_EINVAL, "cuda backend: B*T = %zu rows is too many", N);
  c->precision = m->opts.precision;
  int ndev = cudak_device_count();
  if (ndev == 0) return dpc_err(DPC_EUNSUPPORTED, "cuda backend: no CUDA device is visible (driver or GPU missing)");
  if (m->opts.device < 0 || m->opts.device >= ndev)
    return dpc_err(DPC_EINVAL, "cuda backend: device %d does not exist (%d visible)", m->opts.device, ndev);
  CUDA_TRY(cudaSetDevice(m->opts.device));
  CUDA_TRY(cudaGetDeviceProperties(pr, m->opts.device));
  if (c->precision != PREC_FP32 && pr->major < 8)
    return dpc_err(DPC_EUNSUPPORTED, "cuda backend: %s needs compute capability 8.0 or newer (%s is %d.%d); use fp32",
                   c->precision == PREC_BF16 ? "bf16" : "tf32", pr->name, pr->major, pr->minor);
  CUDA_TRY(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking));
  BLAS_TRY(cublasCreate(&c->blas));
  BLAS_TRY(cublasSetStream(c->blas, c->st));
  BLAS_TRY(cublasSetMathMode(c->blas, c->precision == PREC_TF32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  return 0;
}

enum { MAX_BUFS = 40 };

/* GPT-2's activation buffers (sizes in floats) and, for bf16, its largest product operand: wte,
 * dlogits (N, V), an (N, 4C) activation, a score block or c_fc's weight. */
static int gpt2_plan(gpt_model *m, cuda_impl *c, double *dsizes, float ***ptrs, double *n16) {
  const gpt_config *cfg = &m->lay.cfg;
  const double dL = cfg->n_layer, dC = cfg->n_embd, V = cfg->vocab_size, dT = m->maxT;
  const double dN = (double)m->maxB * m->maxT, dBH = (double)m->maxB * cfg->n_head;
  const double s[] = {dN * dC,     dL * dN * dC, dL * dN,      dL * dN,      3 * dL * dN * dC, dL * dBH * dT * dT,
                      dL * dN * dC, dL * dN * dC, dL * dN * dC, dL * dN,      dL * dN,          4 * dL * dN * dC,
                      4 * dL * dN * dC, dL * dN * dC, dN * dC,   dN,           dN,               dN * V,
                      dN,          dN,           dN * dC,      dN * dC,      3 * dN * dC,      4 * dN * dC,
                      3 * dN * dC, 3 * dN * dC,  dN * dC,      dBH * dT * dT,
                      (double)cudak_colsum_scratch((int)dN, (int)(4 * dC)), 2};
  float **p[] = {&c->encoded, &c->ln1,      &c->ln1_mean, &c->ln1_rstd, &c->qkv,   &c->att,
                 &c->atty,    &c->res2,     &c->ln2,      &c->ln2_mean, &c->ln2_rstd, &c->fch,
                 &c->fch_gelu, &c->res3,    &c->lnf,      &c->lnf_mean, &c->lnf_rstd, &c->logits,
                 &c->losses,  &c->lse,      &c->dres,     &c->dtmp,     &c->dqkv,  &c->dfch,
                 &c->qkvr,    &c->dqkvr,    &c->yr,       &c->datt,     &c->part,  &c->scal};
  const int nbuf = (int)(sizeof s / sizeof s[0]);
  static_assert(sizeof s / sizeof s[0] == sizeof p / sizeof p[0], "one size per buffer");
  static_assert(sizeof s / sizeof s[0] <= MAX_BUFS, "MAX_BUFS holds them");
  for (int i = 0; i < nbuf; i++) dsizes[i] = s[i], ptrs[i] = p[i];
  double n = dC * V;
  if (dN * V > n) n = dN * V;
  if (4 * dN * dC > n) n = 4 * dN * dC;
  if (dBH * dT * dT > n) n = dBH * dT * dT;
  if (4 * dC * dC > n) n = 4 * dC * dC;
  *n16 = n;
  return nbuf;
}

/* Parameters, gradients and moments (zeroed), the optimizer's work items, the token buffers
 * and the bf16 operand copies. */
static int alloc_state(gpt_model *m, cuda_impl *c) {
  const size_t N = (size_t)m->maxB * m->maxT, P = m->lay.n_params, V = m->lay.cfg.vocab_size;
  CUDA_TRY(cudaMalloc((void **)&c->store, 4 * P * sizeof(float)));
  CUDA_TRY(cudaMemsetAsync(c->store, 0, 4 * P * sizeof(float), c->st));
  c->params = c->store;
  c->grads = c->store + P;
  c->adam_m = c->store + 2 * P;
  c->adam_v = c->store + 3 * P;
  if (c->n16) {
    CUDA_TRY(cudaMalloc((void **)&c->a16, c->n16 * sizeof(uint16_t)));
    CUDA_TRY(cudaMalloc((void **)&c->b16, c->n16 * sizeof(uint16_t)));
  }
  CUDA_TRY(cudaMalloc((void **)&c->dsum, sizeof(double)));
  CUDA_TRY(cudaMalloc((void **)&c->d_tok, (5 * N + 1) * sizeof(int)));
  c->h_tok = (int *)malloc((5 * N + 1) * sizeof(int));
  c->h_cnt = (int *)malloc(V * sizeof(int));
  size_t nseg = 0;
  for (int k = 0; k < m->lay.n_tensors; k++) nseg += (m->lay.tensors[k].numel + CUDAK_SEG - 1) / CUDAK_SEG;
  cudak_seg *hsegs = (cudak_seg *)malloc(nseg * sizeof *hsegs);
  if (!c->h_tok || !c->h_cnt || !hsegs) {
    free(hsegs);
    return dpc_err(DPC_ENOMEM, "cuda backend: out of host memory");
  }
  int ns = 0;
  for (int k = 0; k < m->lay.n_tensors; k++) {
    const gpt_tensor *t = &m->lay.tensors[k];
    for (size_t o = 0; o < t->numel; o += CUDAK_SEG) {
      hsegs[ns].off = t->offset + o;
      hsegs[ns].n = (int)(t->numel - o < CUDAK_SEG ? t->numel - o : CUDAK_SEG);
      hsegs[ns].decay = t->decay;
      ns++;
    }
  }
  c->nseg = ns;
  cudaError_t e1 = cudaMalloc((void **)&c->segs, nseg * sizeof(cudak_seg));
  if (e1 == cudaSuccess) e1 = cudaMemcpy(c->segs, hsegs, nseg * sizeof(cudak_seg), cudaMemcpyHostToDevice);
  free(hsegs);
  CUDA_TRY(e1);
  CUDA_TRY(cudaMalloc((void **)&c->seg_sumsq, nseg * sizeof(double)));
  return 0;
}

static int cuda_create_impl(gpt_model *m, cuda_impl *c) {
  const size_t B = m->maxB, T = m->maxT, P = m->lay.n_params;
  const int llama = m->lay.cfg.arch == GPT_ARCH_LLAMA;
  cudaDeviceProp pr;
  TRY(device_setup(m, c, &pr));
  double dsizes[MAX_BUFS], n16 = 0.0;
  float **ptrs[MAX_BUFS];
  const int nbuf = llama ? cuda_llama_plan(m, c, dsizes, ptrs, MAX_BUFS, &n16) : gpt2_plan(m, c, dsizes, ptrs, &n16);
  if (nbuf < 0) return nbuf;
  if (c->precision == PREC_BF16) c->n16 = (size_t)n16;
  double need = 0.0;
  for (int i = 0; i < nbuf; i++) need += dsizes[i] + 64;
  size_t sizes[MAX_BUFS], total = 0;
  for (int i = 0; i < nbuf; i++) {
    sizes[i] = ((size_t)dsizes[i] + 63) & ~(size_t)63; /* 256-byte aligned starts */
    total += sizes[i];
  }
  size_t free_b = 0, total_b = 0;
  const double bytes = (need + 4.0 * P) * 4.0 + c->n16 * 4.0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && bytes > (double)free_b)
    return dpc_err(DPC_ENOMEM, "cuda backend: B=%zu T=%zu needs %.2f GiB of device memory, %.2f GiB is free on %s; "
                   "lower B or T", B, T, bytes / 1073741824.0, free_b / 1073741824.0, pr.name);
  /* Zeroing goes on our stream (non-blocking: it does not order against the legacy default
   * stream), and create waits for it below, before any copy can land. */
  TRY(alloc_state(m, c));
  CUDA_TRY(cudaMalloc((void **)&c->acts, total * sizeof(float)));
  CUDA_TRY(cudaMemsetAsync(c->acts, 0, total * sizeof(float), c->st));
  float *p = c->acts;
  for (int i = 0; i < nbuf; i++) {
    *ptrs[i] = p;
    p += sizes[i];
  }
  CUDA_TRY(cudaStreamSynchronize(c->st));
  if (llama) TRY(cuda_llama_init(m, c));
  c->state = ST_NONE;
  return 0;
}

static int cuda_create(gpt_model *m) {
  cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
  if (!c) return dpc_err(DPC_ENOMEM, "cuda backend: out of memory for the model state");
  m->impl = c;
  int rc = cuda_create_impl(m, c);
  if (rc) cuda_destroy(m);
  return rc;
}

static int copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t st) {
  CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, st));
  CUDA_TRY(cudaStreamSynchronize(st));
  return 0;
}

static int cuda_set_params(gpt_model *m, const float *src, size_t off, size_t n) {
  cuda_impl *c = (cuda_impl *)m->impl;
  return copy(c->params + off, src, n * sizeof(float), cudaMemcpyHostToDevice, c->st);
}

static int cuda_get_params(gpt_model *m, float *dst, size_t off, size_t n) {
  cuda_impl *c = (cuda_impl *)m->impl;
  return copy(dst, c->params + off, n * sizeof(float), cudaMemcpyDeviceToHost, c->st);
}

static int cuda_get_grads(gpt_model *m, float *dst, size_t off, size_t n) {
  cuda_impl *c = (cuda_impl *)m->impl;
  return copy(dst, c->grads + off, n * sizeof(float), cudaMemcpyDeviceToHost, c->st);
}

/* ---- matrix products ------------------------------------------------------------------- */

/* Row-major out[N, OC] = inp[N, IC] @ W[IC, OC] (Conv1D layout), then the bias epilogue:
 * out += bias (+ res), or with act: out keeps the pre-activation and act = GELU(out). */
static int linear_fwd(cuda_impl *c, float *out, const float *inp, const float *W, const float *bias, const float *res,
                      float *act, int N, int IC, int OC) {
  TRY(cuda_gemm(c, 0, 0, OC, N, IC, 1.0f, W, OC, 0, inp, IC, 0, 0.0f, out, OC, 0, 1));
  return act ? cudak_bias_gelu(out, act, bias, N, OC, c->st) : cudak_bias_add(out, bias, res, N, OC, c->st);
}

/* dinp[N, IC] = dout @ W^T; dW[IC, OC] += inp^T @ dout; db[OC] += column sums of dout. */
static int linear_bwd(cuda_impl *c, float *dinp, float *dW, float *db, const float *dout, const float *inp,
                      const float *W, int N, int IC, int OC) {
  TRY(cuda_gemm(c, 1, 0, IC, N, OC, 1.0f, W, OC, 0, dout, OC, 0, 0.0f, dinp, IC, 0, 1));
  TRY(cuda_gemm(c, 0, 1, OC, IC, N, 1.0f, dout, OC, 0, inp, IC, 0, 1.0f, dW, OC, 0, 1));
  return cudak_colsum(db, NULL, c->part, dout, NULL, NULL, NULL, N, OC, c->st);
}

static int layernorm_bwd(cuda_impl *c, float *dx, float *dw, float *db, const float *dout, const float *x,
                         const float *w, const float *mean, const float *rstd, int N, int C) {
  TRY(cudak_layernorm_bwd_dx(dx, dout, x, w, mean, rstd, N, C, c->st));
  return cudak_colsum(dw, db, c->part, dout, x, mean, rstd, N, C, c->st);
}

/* Causal self-attention of qkv (N, 3C) into out (N, C); att (B, NH, T, T) keeps the
 * probabilities. Each product is the column-major transpose of the row-major one in its
 * comment: S^T = K Q^T, Y^T = V^T P^T. */
static int attention_fwd(cuda_impl *c, float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
  const int hs = C / NH, BH = B * NH;
  const long long sH = (long long)T * hs, sA = (long long)T * T;
  const size_t NC = (size_t)B * T * C;
  float *q = c->qkvr, *k = q + NC, *v = k + NC;
  TRY(cudak_qkv_permute(q, k, v, qkv, B, T, NH, hs, c->st));
  TRY(cuda_gemm(c, 1, 0, T, T, hs, 1.0f / sqrtf((float)hs), k, hs, sH, q, hs, sH, 0.0f, att, T, sA, BH));
  TRY(cudak_causal_softmax(att, (size_t)BH * T, T, c->st));
  TRY(cuda_gemm(c, 0, 0, hs, T, T, 1.0f, v, hs, sH, att, T, sA, 0.0f, c->yr, hs, sH, BH));
  return cudak_heads(out, c->yr, B, T, NH, hs, 1, c->st);
}

/* Backward of attention_fwd: dout (N, C) -> dqkv (N, 3C). */
static int attention_bwd(cuda_impl *c, float *dqkv, const float *dout, const float *att, const float *qkv, int B,
                         int T, int C, int NH) {
  const int hs = C / NH, BH = B * NH;
  const long long sH = (long long)T * hs, sA = (long long)T * T;
  const size_t NC = (size_t)B * T * C;
  float *q = c->qkvr, *k = q + NC, *v = k + NC;
  float *dq = c->dqkvr, *dk = dq + NC, *dv = dk + NC, *dy = c->yr;
  TRY(cudak_qkv_permute(q, k, v, qkv, B, T, NH, hs, c->st));
  TRY(cudak_heads(dy, dout, B, T, NH, hs, 0, c->st));
  TRY(cuda_gemm(c, 1, 0, T, T, hs, 1.0f, v, hs, sH, dy, hs, sH, 0.0f, c->datt, T, sA, BH));   /* dP = dY V^T */
  TRY(cuda_gemm(c, 0, 1, hs, T, T, 1.0f, dy, hs, sH, att, T, sA, 0.0f, dv, hs, sH, BH));      /* dV = P^T dY */
  TRY(cudak_causal_softmax_bwd(c->datt, att, (size_t)BH * T, T, 1.0f / sqrtf((float)hs), c->st));
  TRY(cuda_gemm(c, 0, 0, hs, T, T, 1.0f, k, hs, sH, c->datt, T, sA, 0.0f, dq, hs, sH, BH));  /* dQ = dS K */
  TRY(cuda_gemm(c, 0, 1, hs, T, T, 1.0f, q, hs, sH, c->datt, T, sA, 0.0f, dk, hs, sH, BH));  /* dK = dS^T Q */
  return cudak_qkv_unpermute(dqkv, dq, dk, dv, B, T, NH, hs, c->st);
}

/* ---- forward / backward ---------------------------------------------------------------- */

/* Upload inputs and targets, and for the wte gradient the positions of each distinct input
 * token in increasing order (a counting sort on the host; O(N + V)). */
static int upload_tokens(gpt_model *m, cuda_impl *c, const int *inputs, const int *targets, int N) {
  const int V = m->lay.cfg.vocab_size;
  int *in = c->h_tok, *tg = in + N, *uniq = tg + N, *start = uniq + N, *pos = start + N + 1;
  memcpy(in, inputs, (size_t)N * sizeof(int));
  if (targets) memcpy(tg, targets, (size_t)N * sizeof(int));
  else memset(tg, 0, (size_t)N * sizeof(int));
  memset(c->h_cnt, 0, (size_t)V * sizeof(int));
  for (int n = 0; n < N; n++) c->h_cnt[in[n]]++;
  int U = 0, at = 0;
  for (int v = 0; v < V; v++) {
    if (!c->h_cnt[v]) continue;
    uniq[U] = v;
    start[U++] = at;
    at += c->h_cnt[v];
    c->h_cnt[v] = start[U - 1]; /* becomes the fill cursor */
  }
  start[U] = at;
  for (int n = 0; n < N; n++) pos[c->h_cnt[in[n]]++] = n;
  c->U = U;
  int *d = c->d_tok;
  CUDA_TRY(cudaMemcpyAsync(d, in, 2 * (size_t)N * sizeof(int), cudaMemcpyHostToDevice, c->st));
  CUDA_TRY(cudaMemcpyAsync(d + 2 * N, uniq, (size_t)U * sizeof(int), cudaMemcpyHostToDevice, c->st));
  CUDA_TRY(cudaMemcpyAsync(d + 3 * N, start, (size_t)(U + 1) * sizeof(int), cudaMemcpyHostToDevice, c->st));
  CUDA_TRY(cudaMemcpyAsync(d + 4 * N + 1, pos, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, c->st));
  /* The host staging buffer is reused by the next forward: wait for the copies. */
  CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

/* GPT-2 from the uploaded tokens to the logits. */
static int gpt2_forward(gpt_model *m, cuda_impl *c, int B, int T) {
  const gpt_config *cfg = &m->lay.cfg;
  const int L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head, V = cfg->vocab_size, N = B * T;
  const size_t NC = (size_t)N * C;
  const int *d_in = c->d_tok;
  const float *wte = c->params, *wpe = wte + (size_t)V * C;
  const float *lnfw = wpe + (size_t)cfg->n_positions * C, *lnfb = lnfw + C;
  TRY(cudak_encoder_fwd(c->encoded, d_in, wte, wpe, N, T, C, c->st));
  const float *residual = c->encoded;
  for (int l = 0; l < L; l++) {
    float *w[NLAYER_T];
    layer_ptrs(&m->lay, c->params, l, w);
    float *ln1 = c->ln1 + l * NC, *qkv = c->qkv + 3 * l * NC, *atty = c->atty + l * NC, *res2 = c->res2 + l * NC;
    float *ln2 = c->ln2 + l * NC, *fch = c->fch + 4 * l * NC, *fchg = c->fch_gelu + 4 * l * NC;
    float *res3 = c->res3 + l * NC, *att = c->att + (size_t)l * B * NH * T * T;
    TRY(cudak_layernorm_fwd(ln1, c->ln1_mean + (size_t)l * N, c->ln1_rstd + (size_t)l * N, residual, w[LN1W],
                            w[LN1B], N, C, c->st));
    TRY(linear_fwd(c, qkv, ln1, w[QKVW], w[QKVB], NULL, NULL, N, C, 3 * C));
    TRY(attention_fwd(c, atty, att, qkv, B, T, C, NH));
    TRY(linear_fwd(c, res2, atty, w[APW], w[APB], residual, NULL, N, C, C));
    TRY(cudak_layernorm_fwd(ln2, c->ln2_mean + (size_t)l * N, c->ln2_rstd + (size_t)l * N, res2, w[LN2W], w[LN2B],
                            N, C, c->st));
    TRY(linear_fwd(c, fch, ln2, w[FCW], w[FCB], NULL, fchg, N, C, 4 * C));
    TRY(linear_fwd(c, res3, fchg, w[FPW], w[FPB], res2, NULL, N, 4 * C, C));
    residual = res3;
  }
  TRY(cudak_layernorm_fwd(c->lnf, c->lnf_mean, c->lnf_rstd, residual, lnfw, lnfb, N, C, c->st));
  return cuda_gemm(c, 1, 0, V, N, C, 1.0f, wte, C, 0, c->lnf, C, 0, 0.0f, c->logits, V, 0, 1); /* lnf wte^T */
}

static int cuda_forward(gpt_model *m, const int *inputs, const int *targets, int B, int T, float *loss) {
  cuda_impl *c = (cuda_impl *)m->impl;
  const int V = m->lay.cfg.vocab_size, N = B * T;
  c->state = ST_NONE;
  c->B = B;
  c->T = T;
  TRY(upload_tokens(m, c, inputs, targets, N));
  if (m->lay.cfg.arch == GPT_ARCH_LLAMA) TRY(cuda_llama_forward(m, c, B, T));
  else TRY(gpt2_forward(m, c, B, T));
  if (!targets) {
    CUDA_TRY(cudaStreamSynchronize(c->st));
    c->state = ST_LOGITS;
    return 0;
  }
  TRY(cudak_xent_fwd(c->losses, c->lse, c->logits, c->d_tok + N, N, V, c->st));
  TRY(cudak_sum(c->dsum, c->losses, N, c->st));
  double sum = 0.0;
  TRY(copy(&sum, c->dsum, sizeof sum, cudaMemcpyDeviceToHost, c->st));
  *loss = (float)(sum / N);
  c->state = ST_LOSS;
  if (!isfinite(*loss)) return dpc_err(DPC_ENUMERIC, "forward: loss is %f (diverged; lower the learning rate)", *loss);
  return 0;
}

static int cuda_logits(gpt_model *m, int b, int t, float *dst) {
  cuda_impl *c = (cuda_impl *)m->impl;
  if (c->state != ST_LOGITS && c->state != ST_LOSS)
    return dpc_err(DPC_ESTATE, "logits: no forward since the last backward (run gpt_forward first)");
  if (b < 0 || b >= c->B || t < 0 || t >= c->T)
    return dpc_err(DPC_ERANGE, "logits: position (b=%d, t=%d) outside the last forward's B=%d T=%d", b, t, c->B, c->T);
  const int V = m->lay.cfg.vocab_size;
  return copy(dst, c->logits + ((size_t)b * c->T + t) * V, (size_t)V * sizeof(float), cudaMemcpyDeviceToHost, c->st);
}

static int cuda_hidden(gpt_model *m, int b, int t, float *dst) {
  cuda_impl *c = (cuda_impl *)m->impl;
  if (c->state != ST_LOGITS && c->state != ST_LOSS)
    return dpc_err(DPC_ESTATE, "hidden: no forward since the last backward (run gpt_forward first)");
  if (b < 0 || b >= c->B || t < 0 || t >= c->T)
    return dpc_err(DPC_ERANGE, "hidden: position (b=%d, t=%d) outside the last forward's B=%d T=%d", b, t, c->B, c->T);
  const int C = m->lay.cfg.n_embd;
  return copy(dst, c->lnf + ((size_t)b * c->T + t) * C, (size_t)C * sizeof(float), cudaMemcpyDeviceToHost, c->st);
}

static int cuda_zero_grad(gpt_model *m) {
  cuda_impl *c = (cuda_impl *)m->impl;
  CUDA_TRY(cudaMemsetAsync(c->grads, 0, m->lay.n_params * sizeof(float), c->st));
  return 0;
}

/* GPT-2 from the dlogits in c->logits down to the embedding gradients. */
static int gpt2_backward(gpt_model *m, cuda_impl *c) {
  const gpt_config *cfg = &m->lay.cfg;
  const int L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head, V = cfg->vocab_size;
  const int B = c->B, T = c->T, N = B * T;
  const size_t NC = (size_t)N * C;
  const int *d_uniq = c->d_tok + 2 * N, *d_start = c->d_tok + 3 * N, *d_pos = c->d_tok + 4 * N + 1;
  float *wte = c->params, *wpe = wte + (size_t)V * C, *lnfw = wpe + (size_t)cfg->n_positions * C;
  float *dwte = c->grads, *dwpe = dwte + (size_t)V * C, *dlnfw = dwpe + (size_t)cfg->n_positions * C;
  float *dlnfb = dlnfw + C;

  TRY(cuda_gemm(c, 0, 0, C, N, V, 1.0f, wte, C, 0, c->logits, V, 0, 0.0f, c->dtmp, C, 0, 1));  /* dlnf = dlogits wte */
  TRY(cuda_gemm(c, 0, 1, C, V, N, 1.0f, c->lnf, C, 0, c->logits, V, 0, 1.0f, dwte, C, 0, 1));  /* dwte += dlogits^T lnf */
  CUDA_TRY(cudaMemsetAsync(c->dres, 0, NC * sizeof(float), c->st));
  const float *last = c->res3 + (size_t)(L - 1) * NC;
  TRY(layernorm_bwd(c, c->dres, dlnfw, dlnfb, c->dtmp, last, lnfw, c->lnf_mean, c->lnf_rstd, N, C));

  for (int l = L - 1; l >= 0; l--) {
    float *w[NLAYER_T], *dw[NLAYER_T];
    layer_ptrs(&m->lay, c->params, l, w);
    layer_ptrs(&m->lay, c->grads, l, dw);
    const float *residual = l == 0 ? c->encoded : c->res3 + (size_t)(l - 1) * NC;
    const float *ln1 = c->ln1 + l * NC, *qkv = c->qkv + 3 * l * NC, *atty = c->atty + l * NC;
    const float *res2 = c->res2 + l * NC, *ln2 = c->ln2 + l * NC, *fch = c->fch + 4 * l * NC;
    const float *fchg = c->fch_gelu + 4 * l * NC, *att = c->att + (size_t)l * B * NH * T * T;
    TRY(linear_bwd(c, c->dfch, dw[FPW], dw[FPB], c->dres, fchg, w[FPW], N, 4 * C, C));
    TRY(cudak_gelu_bwd(c->dfch, fch, 4 * NC, c->st));
    TRY(linear_bwd(c, c->dtmp, dw[FCW], dw[FCB], c->dfch, ln2, w[FCW], N, C, 4 * C));
    TRY(layernorm_bwd(c, c->dres, dw[LN2W], dw[LN2B], c->dtmp, res2, w[LN2W], c->ln2_mean + (size_t)l * N,
                      c->ln2_rstd + (size_t)l * N, N, C));
    TRY(linear_bwd(c, c->dtmp, dw[APW], dw[APB], c->dres, atty, w[APW], N, C, C));
    TRY(attention_bwd(c, c->dqkv, c->dtmp, att, qkv, B, T, C, NH));
    TRY(linear_bwd(c, c->dtmp, dw[QKVW], dw[QKVB], c->dqkv, ln1, w[QKVW], N, C, 3 * C));
    TRY(layernorm_bwd(c, c->dres, dw[LN1W], dw[LN1B], c->dtmp, residual, w[LN1W], c->ln1_mean + (size_t)l * N,
                      c->ln1_rstd + (size_t)l * N, N, C));
  }
  TRY(cudak_wpe_bwd(dwpe, c->dres, B, T, C, c->st));
  return cudak_wte_bwd(dwte, c->dres, d_uniq, d_start, d_pos, c->U, C, c->st);
}

static int cuda_backward(gpt_model *m) {
  cuda_impl *c = (cuda_impl *)m->impl;
  if (c->state != ST_LOSS)
    return dpc_err(DPC_ESTATE, "backward: needs a forward with targets first (and at most one backward per forward)");
  const int V = m->lay.cfg.vocab_size, N = c->B * c->T;
  c->state = ST_BACKWARD;
  TRY(cudak_xent_bwd(c->logits, c->lse, c->d_tok + N, N, V, 1.0f / (float)N, c->st)); /* dlogits, in place */
  return m->lay.cfg.arch == GPT_ARCH_LLAMA ? cuda_llama_backward(m, c) : gpt2_backward(m, c);
}

/* ---- optimizer ------------------------------------------------------------------------- */

static int cuda_adamw_step(gpt_model *m, const gpt_adamw_hparams *hp, float lr, int t, float *grad_norm) {
  cuda_impl *c = (cuda_impl *)m->impl;
  TRY(cudak_sumsq_segs(c->seg_sumsq, c->grads, c->segs, c->nseg, c->st));
  TRY(cudak_norm_clip(c->scal, c->seg_sumsq, c->nseg, hp->grad_clip, c->st));
  float norm = 0.0f;
  TRY(copy(&norm, c->scal, sizeof norm, cudaMemcpyDeviceToHost, c->st));
  if (grad_norm) *grad_norm = norm;
  if (!isfinite(norm)) return dpc_err(DPC_ENUMERIC, "adamw: gradient norm is %f (diverged; lower the learning rate)", norm);
  gpt_adamw_scalars k;
  gpt_adamw_scalars_at(hp, lr, t, &k);
  return cudak_adamw(c->params, c->grads, c->adam_m, c->adam_v, c->segs, c->nseg, c->scal + 1, k.decay_mul,
                     hp->beta1, k.one_minus_beta1, hp->beta2, k.one_minus_beta2, k.bc2_sqrt, hp->eps,
                     k.neg_step_size, c->st);
}

static int cuda_get_opt_state(gpt_model *m, float *m_dst, float *v_dst) {
  cuda_impl *c = (cuda_impl *)m->impl;
  const size_t bytes = m->lay.n_params * sizeof(float);
  if (m_dst) TRY(copy(m_dst, c->adam_m, bytes, cudaMemcpyDeviceToHost, c->st));
  if (v_dst) TRY(copy(v_dst, c->adam_v, bytes, cudaMemcpyDeviceToHost, c->st));
  return 0;
}

static int cuda_set_opt_state(gpt_model *m, const float *m_src, const float *v_src) {
  cuda_impl *c = (cuda_impl *)m->impl;
  const size_t bytes = m->lay.n_params * sizeof(float);
  if (m_src) TRY(copy(c->adam_m, m_src, bytes, cudaMemcpyHostToDevice, c->st));
  if (v_src) TRY(copy(c->adam_v, v_src, bytes, cudaMemcpyHostToDevice, c->st));
  return 0;
}

static int cuda_reset_opt_state(gpt_model *m) {
  cuda_impl *c = (cuda_impl *)m->impl;
  CUDA_TRY(cudaMemsetAsync(c->adam_m, 0, 2 * m->lay.n_params * sizeof(float), c->st));
  CUDA_TRY(cudaStreamSynchronize(c->st));
  return 0;
}

static int cuda_describe(gpt_model *m, char *name, size_t len, uint64_t *mem_bytes) {
  cudaDeviceProp pr;
  CUDA_TRY(cudaGetDeviceProperties(&pr, m->opts.device));
  static const char *const prec[] = {"fp32", "tf32", "bf16"};
  snprintf(name, len, "%s (sm_%d%d, %s)", pr.name, pr.major, pr.minor, prec[((cuda_impl *)m->impl)->precision]);
  if (mem_bytes) *mem_bytes = pr.totalGlobalMem;
  return 0;
}

extern "C" const gpt_backend_ops gpt_cuda_ops = {
    "cuda",          cuda_create,    cuda_destroy,  cuda_set_params,   cuda_get_params,
    cuda_get_grads,  cuda_forward,   cuda_logits,   cuda_zero_grad,    cuda_backward,
    cuda_adamw_step, cuda_get_opt_state, cuda_set_opt_state, cuda_reset_opt_state, cuda_describe,
    cuda_hidden,
    cuda_muon_step,
};
