/* cuda_llama_model.cu — the CUDA backend's Llama-class forward and backward (docs/design.md
 * §3.12): the same algorithm step for step as the CPU backend's kernels/cpu/cpu_llama.c, on the
 * canonical layout of kernels/gpt.h. The vtable, the token upload, the loss, the optimizer and
 * parameter access are cuda_backend.cu's (shared with GPT-2).
 *
 * Every product goes through cuda_gemm (cuBLAS in the model's fp32 / tf32 / bf16 precision, as
 * the GPT-2 path); q/k/v and gate/up are back to back in the layout, so each pair is one product.
 * Row-wise work (RMSNorm, RoPE, SwiGLU) and grouped-query attention are the leaf kernels of
 * cuda_llama.h, which read q, k and v in place through row strides: no permute and no launch of
 * this file's own. All buffers, the RoPE tables included, are made at create; no pass allocates.
 *
 * Products are row-major here: for out[N, OC] = in[N, IC] @ W^T with W an nn.Linear [OC, IC]
 * weight, cuBLAS computes the column-major out^T = op_T(W) @ in^T (m = OC, n = N, k = IC). */
#include <stdlib.h>

#include "kernels/cuda/cuda_shared.h"
extern "C" {
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cuda/cuda_llama.h"
}

struct cuda_llama {
  float *ln1, *rstd1;    /* (L, N, C), (L, N) input_layernorm output and 1/rms */
  float *qkv;            /* (L, N, QKV) q | k | v after the biases, q and k rotated */
  float *att;            /* (L, B, NH, T, T) softmax probabilities */
  float *atty;           /* (L, N, C) attention output before o_proj */
  float *res2;           /* (L, N, C) residual after attention */
  float *ln2, *rstd2;    /* (L, N, C), (L, N) post_attention_layernorm */
  float *gu;             /* (L, N, 2I) gate | up before SwiGLU */
  float *hm;             /* (L, N, I) silu(gate) * up */
  float *res3;           /* (L, N, C) the layer's output */
  float *rstdf;          /* (N) model.norm's 1/rms (its output is c->lnf) */
  float *dqkv, *dgu, *dh; /* (N, QKV), (N, 2I), (N, I) */
  float *norm_part;      /* RMSNorm gain gradient partials (cudak_rmsnorm_dw_scratch(N, C)) */
  float *cos_t, *sin_t;  /* (maxT, D/2) RoPE tables */
  float *zero_row;       /* (C) zeros, never written: the position row of the embedding gather */
};

/* The shape numbers the passes use, read once from the config. */
typedef struct {
  int L, C, NH, NKV, D, I, V, QKV, tied;
} llama_dims;

static llama_dims dims_of(const gpt_config *cfg) {
  llama_dims d;
  d.L = cfg->n_layer;
  d.C = cfg->n_embd;
  d.NH = cfg->n_head;
  d.NKV = cfg->n_kv_head;
  d.D = d.C / d.NH;
  d.I = cfg->intermediate_size;
  d.V = cfg->vocab_size;
  d.QKV = (d.NH + 2 * d.NKV) * d.D;
  d.tied = cfg->tie_word_embeddings;
  return d;
}

void cuda_llama_destroy(cuda_impl *c) {
  free(c->ll);
  c->ll = NULL;
}

int cuda_llama_plan(gpt_model *m, cuda_impl *c, double *sizes, float ***ptrs, int cap, double *n16) {
  const llama_dims d = dims_of(&m->lay.cfg);
  const double L = d.L, C = d.C, I = d.I, V = d.V, QKV = d.QKV, T = m->maxT, N = (double)m->maxB * m->maxT;
  const double BHTT = (double)m->maxB * d.NH * T * T, H = d.D / 2;
  struct cuda_llama *ll = (struct cuda_llama *)calloc(1, sizeof *ll);
  if (!ll) return dpc_err(DPC_ENOMEM, "cuda backend: out of host memory for the Llama state");
  c->ll = ll;
  const double s[] = {N * C,     L * N * C, L * N,     L * N * QKV, L * BHTT,  L * N * C,     L * N * C,
                      L * N * C, L * N,     2 * L * N * I, L * N * I, L * N * C, N * C,       N,
                      N * V,     N,         N,         N * C,       N * C,     BHTT,          N * QKV,
                      2 * N * I, N * I,     (double)cudak_colsum_scratch((int)N, d.QKV),
                      (double)cudak_rmsnorm_dw_scratch((int)N, d.C), 2, T * H, T * H, C};
  float **p[] = {&c->encoded, &ll->ln1,   &ll->rstd1, &ll->qkv,  &ll->att,   &ll->atty,      &ll->res2,
                 &ll->ln2,    &ll->rstd2, &ll->gu,    &ll->hm,   &ll->res3,  &c->lnf,        &ll->rstdf,
                 &c->logits,  &c->losses, &c->lse,    &c->dres,  &c->dtmp,   &c->datt,       &ll->dqkv,
                 &ll->dgu,    &ll->dh,    &c->part,
                 &ll->norm_part, &c->scal, &ll->cos_t, &ll->sin_t, &ll->zero_row};
  const int nbuf = (int)(sizeof s / sizeof s[0]);
  static_assert(sizeof s / sizeof s[0] == sizeof p / sizeof p[0], "one size per buffer");
  if (nbuf > cap) return dpc_err(DPC_EINTERNAL, "cuda backend: %d Llama buffers, room for %d", nbuf, cap);
  for (int i = 0; i < nbuf; i++) sizes[i] = s[i], ptrs[i] = p[i];
  /* The largest operand any product reads (bf16 copies): the embedding or head, dlogits (N, V),
   * gate|up and its gradient (N, 2I), the gate/up weight, q|k|v (N, QKV) and its weight. */
  const double ops[] = {V * C, N * V, 2 * N * I, 2 * I * C, N * QKV, QKV * C, N * C, C * C};
  *n16 = 0.0;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if (ops[i] > *n16) *n16 = ops[i];
  return nbuf;
}

int cuda_llama_init(gpt_model *m, cuda_impl *c) {
  const gpt_config *cfg = &m->lay.cfg;
  const int D = cfg->n_embd / cfg->n_head, H = D / 2, T = m->maxT;
  const size_t nt = (size_t)T * H;
  const llamak_rope rope = {cfg->rope_scaling == GPT_ROPE_LLAMA3 ? LLAMAK_ROPE_LLAMA3 : LLAMAK_ROPE_DEFAULT,
                            cfg->rope_theta, cfg->rope_factor, cfg->rope_low_freq_factor, cfg->rope_high_freq_factor,
                            (double)cfg->rope_original_max_position_embeddings};
  double *inv_freq = (double *)malloc((size_t)H * sizeof *inv_freq);
  float *tab = (float *)malloc(2 * nt * sizeof(float));
  if (!inv_freq || !tab) {
    free(inv_freq);
    free(tab);
    return dpc_err(DPC_ENOMEM, "cuda backend: out of host memory for the RoPE tables");
  }
  /* The CPU backend's tables exactly (kernels/cpu/llama_kernels.c), computed once here. */
  const int bad = llamak_rope_inv_freq(inv_freq, D, &rope);
  if (!bad) llamak_rope_table(tab, tab + nt, inv_freq, T, D);
  cudaError_t e = cudaSuccess;
  if (!bad) e = cudaMemcpy(c->ll->cos_t, tab, nt * sizeof(float), cudaMemcpyHostToDevice);
  if (!bad && e == cudaSuccess) e = cudaMemcpy(c->ll->sin_t, tab + nt, nt * sizeof(float), cudaMemcpyHostToDevice);
  free(inv_freq);
  free(tab);
  if (bad)
    return dpc_err(DPC_EINVAL, "cuda backend: rotary parameters rejected (head_dim %d, rope_theta %g)", D,
                   cfg->rope_theta);
  CUDA_TRY(e);
  return 0;
}

/* out[N, OC] = in[N, IC] @ W[OC, IC]^T, plus res[N, OC] when given (copied in first and kept
 * by beta = 1). */
static int linear(cuda_impl *c, float *out, const float *in, const float *W, const float *res, int N, int IC,
                  int OC) {
  if (res) CUDA_TRY(cudaMemcpyAsync(out, res, (size_t)N * OC * sizeof(float), cudaMemcpyDeviceToDevice, c->st));
  return cuda_gemm(c, 1, 0, OC, N, IC, 1.0f, W, IC, 0, in, IC, 0, res ? 1.0f : 0.0f, out, OC, 0, 1);
}

/* dinp[N, IC] = dout[N, OC] @ W[OC, IC]; dW[OC, IC] += dout^T @ inp[N, IC]. */
static int linear_bwd(cuda_impl *c, float *dinp, float *dW, const float *dout, const float *inp, const float *W,
                      int N, int IC, int OC) {
  TRY(cuda_gemm(c, 0, 0, IC, N, OC, 1.0f, W, IC, 0, dout, OC, 0, 0.0f, dinp, IC, 0, 1));
  return cuda_gemm(c, 0, 1, IC, OC, N, 1.0f, inp, IC, 0, dout, OC, 0, 1.0f, dW, IC, 0, 1);
}

/* One decoder layer: x (N, C) -> ll->res3 of layer l. */
static int layer_fwd(gpt_model *m, cuda_impl *c, const llama_dims *d, int l, const float *x, int B, int T) {
  struct cuda_llama *ll = c->ll;
  const int N = B * T, C = d->C, I = d->I, QKV = d->QKV, NH = d->NH, NKV = d->NKV, D = d->D;
  const size_t NC = (size_t)N * C;
  const float eps = (float)m->lay.cfg.rms_norm_eps;
  float *w[GPT_LL_N];
  gpt_llama_layer_ptrs(&m->lay, c->params, l, w);
  float *ln1 = ll->ln1 + l * NC, *qkv = ll->qkv + (size_t)l * N * QKV, *atty = ll->atty + l * NC;
  float *res2 = ll->res2 + l * NC, *ln2 = ll->ln2 + l * NC, *gu = ll->gu + (size_t)l * N * 2 * I;
  float *hm = ll->hm + (size_t)l * N * I, *res3 = ll->res3 + l * NC;
  float *att = ll->att + (size_t)l * B * NH * T * T;
  float *k = qkv + (size_t)NH * D, *v = k + (size_t)NKV * D; /* column slices of the fused rows */
  TRY(cudak_rmsnorm_fwd(ln1, ll->rstd1 + (size_t)l * N, x, w[GPT_LL_LN1], N, C, eps, c->st));
  TRY(linear(c, qkv, ln1, w[GPT_LL_QKV], NULL, N, C, QKV));
  if (w[GPT_LL_QKV_B]) TRY(cudak_bias_add(qkv, w[GPT_LL_QKV_B], NULL, N, QKV, c->st));
  TRY(cudak_rope(qkv, QKV, ll->cos_t, ll->sin_t, B, T, NH, D, 0, c->st));
  TRY(cudak_rope(k, QKV, ll->cos_t, ll->sin_t, B, T, NKV, D, 0, c->st));
  TRY(cudak_gqa_attn_fwd(atty, C, att, qkv, QKV, k, v, QKV, B, T, NH, NKV, D, c->st));
  TRY(linear(c, res2, atty, w[GPT_LL_O], x, N, C, C));
  TRY(cudak_rmsnorm_fwd(ln2, ll->rstd2 + (size_t)l * N, res2, w[GPT_LL_LN2], N, C, eps, c->st));
  TRY(linear(c, gu, ln2, w[GPT_LL_GU], NULL, N, C, 2 * I));
  TRY(cudak_swiglu_fwd(hm, I, gu, gu + I, 2 * I, N, I, c->st));
  return linear(c, res3, hm, w[GPT_LL_DOWN], res2, N, I, C);
}

int cuda_llama_forward(gpt_model *m, cuda_impl *c, int B, int T) {
  struct cuda_llama *ll = c->ll;
  const llama_dims d = dims_of(&m->lay.cfg);
  const int N = B * T, C = d.C, V = d.V;
  const float *embed = c->params, *normw = embed + (size_t)V * C;
  const float *head = d.tied ? embed : normw + C;
  /* The embedding rows through GPT-2's encoder with one all-zero position row (T = 1): adding
   * 0.0f keeps each row exact, as cpu_llama.c's copy. */
  TRY(cudak_encoder_fwd(c->encoded, c->d_tok, embed, ll->zero_row, N, 1, C, c->st));
  const float *x = c->encoded;
  for (int l = 0; l < d.L; l++) {
    TRY(layer_fwd(m, c, &d, l, x, B, T));
    x = ll->res3 + (size_t)l * N * C;
  }
  TRY(cudak_rmsnorm_fwd(c->lnf, ll->rstdf, x, normw, N, C, (float)m->lay.cfg.rms_norm_eps, c->st));
  return linear(c, c->logits, c->lnf, head, NULL, N, C, V);
}

/* One decoder layer's backward: c->dres holds d(res3) on entry and d(x) on return. */
static int layer_bwd(gpt_model *m, cuda_impl *c, const llama_dims *d, int l, const float *x) {
  struct cuda_llama *ll = c->ll;
  const int B = c->B, T = c->T, N = B * T, C = d->C, I = d->I, QKV = d->QKV, NH = d->NH, NKV = d->NKV, D = d->D;
  const size_t NC = (size_t)N * C;
  float *w[GPT_LL_N], *dw[GPT_LL_N];
  gpt_llama_layer_ptrs(&m->lay, c->params, l, w);
  gpt_llama_layer_ptrs(&m->lay, c->grads, l, dw);
  const float *ln1 = ll->ln1 + l * NC, *qkv = ll->qkv + (size_t)l * N * QKV, *atty = ll->atty + l * NC;
  const float *res2 = ll->res2 + l * NC, *ln2 = ll->ln2 + l * NC, *gu = ll->gu + (size_t)l * N * 2 * I;
  const float *hm = ll->hm + (size_t)l * N * I, *att = ll->att + (size_t)l * B * NH * T * T;
  const float *k = qkv + (size_t)NH * D, *v = k + (size_t)NKV * D;
  float *dk = ll->dqkv + (size_t)NH * D, *dv = dk + (size_t)NKV * D;

  TRY(linear_bwd(c, ll->dh, dw[GPT_LL_DOWN], c->dres, hm, w[GPT_LL_DOWN], N, I, C));
  TRY(cudak_swiglu_bwd(ll->dgu, ll->dgu + I, ll->dh, I, gu, gu + I, 2 * I, N, I, c->st));
  TRY(linear_bwd(c, c->dtmp, dw[GPT_LL_GU], ll->dgu, ln2, w[GPT_LL_GU], N, C, 2 * I));
  TRY(cudak_rmsnorm_bwd_dx(c->dres, c->dtmp, res2, w[GPT_LL_LN2], ll->rstd2 + (size_t)l * N, N, C, 1, c->st));
  TRY(cudak_rmsnorm_dw(dw[GPT_LL_LN2], ll->norm_part, c->dtmp, res2, ll->rstd2 + (size_t)l * N, N, C, c->st));

  TRY(linear_bwd(c, c->dtmp, dw[GPT_LL_O], c->dres, atty, w[GPT_LL_O], N, C, C));
  /* dq is overwritten, dk and dv accumulate (cuda_llama.h): start them from zero. */
  CUDA_TRY(cudaMemsetAsync(ll->dqkv, 0, (size_t)N * QKV * sizeof(float), c->st));
  TRY(cudak_gqa_attn_bwd(ll->dqkv, dk, dv, c->datt, c->dtmp, C, att, qkv, QKV, k, v, QKV, B, T, NH, NKV, D, c->st));
  TRY(cudak_rope(ll->dqkv, QKV, ll->cos_t, ll->sin_t, B, T, NH, D, 1, c->st));
  TRY(cudak_rope(dk, QKV, ll->cos_t, ll->sin_t, B, T, NKV, D, 1, c->st));
  if (dw[GPT_LL_QKV_B]) TRY(cudak_colsum(dw[GPT_LL_QKV_B], NULL, c->part, ll->dqkv, NULL, NULL, NULL, N, QKV, c->st));
  TRY(linear_bwd(c, c->dtmp, dw[GPT_LL_QKV], ll->dqkv, ln1, w[GPT_LL_QKV], N, C, QKV));
  TRY(cudak_rmsnorm_bwd_dx(c->dres, c->dtmp, x, w[GPT_LL_LN1], ll->rstd1 + (size_t)l * N, N, C, 1, c->st));
  return cudak_rmsnorm_dw(dw[GPT_LL_LN1], ll->norm_part, c->dtmp, x, ll->rstd1 + (size_t)l * N, N, C, c->st);
}

int cuda_llama_backward(gpt_model *m, cuda_impl *c) {
  struct cuda_llama *ll = c->ll;
  const llama_dims d = dims_of(&m->lay.cfg);
  const int N = c->B * c->T, C = d.C, V = d.V;
  const size_t NC = (size_t)N * C;
  const int *d_uniq = c->d_tok + 2 * N, *d_start = c->d_tok + 3 * N, *d_pos = c->d_tok + 4 * N + 1;
  const float *embed = c->params, *normw = embed + (size_t)V * C, *head = d.tied ? embed : normw + C;
  float *dembed = c->grads, *dnormw = dembed + (size_t)V * C, *dhead = d.tied ? dembed : dnormw + C;
  /* c->logits holds dlogits (cuda_backend.cu). dlnf = dlogits @ head; dhead += dlogits^T lnf. */
  TRY(linear_bwd(c, c->dtmp, dhead, c->logits, c->lnf, head, N, C, V));
  const float *last = ll->res3 + (size_t)(d.L - 1) * NC;
  TRY(cudak_rmsnorm_bwd_dx(c->dres, c->dtmp, last, normw, ll->rstdf, N, C, 0, c->st));
  TRY(cudak_rmsnorm_dw(dnormw, ll->norm_part, c->dtmp, last, ll->rstdf, N, C, c->st));
  for (int l = d.L - 1; l >= 0; l--) TRY(layer_bwd(m, c, &d, l, l == 0 ? c->encoded : ll->res3 + (size_t)(l - 1) * NC));
  /* Tied, dembed already holds the head's part; the rows of each distinct token are summed
   * in a fixed order on top. */
  return cudak_wte_bwd(dembed, c->dres, d_uniq, d_start, d_pos, c->U, C, c->st);
}
