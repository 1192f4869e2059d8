/* cpu_llama.c — the CPU backend's Llama-class forward and backward (docs/design.md §3.12):
 * RMSNorm, RoPE (rotate-half, optional llama3 scaling), grouped-query causal attention and
 * SwiGLU, on the canonical layout of kernels/gpt.h, as Hugging Face's LlamaForCausalLM computes
 * them in fp32. The optimizer, parameter access and loss are cpu_backend.c's.
 *
 * Same discipline as the GPT-2 path: every product goes through cpu_mm / cpu_thread_gemm
 * (cpu_shared.h); q/k/v and gate/up are stored back to back in the layout, so each pair is
 * one product [N, C] x [QKV, C]^T and [N, C] x [2I, C]^T. Row-wise work (norms, rotation,
 * SwiGLU) uses the leaf kernels of llama_kernels.h, split in fixed row items. Attention runs
 * one (sequence, query head) per task, forward and backward; in the backward each query head
 * keeps its own dk and dv, and the rep heads of a KV head are summed after, in ascending order.
 * Every reduction has a fixed order, so a fixed thread count gives bit-identical results. All buffers are
 * allocated at create (RoPE tables included); no pass allocates. */
#include "common/errors.h"
#include "kernels/cpu/cpu_llama.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/llama_kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* The Debian/OpenBLAS cblas.h declares this; other cblas headers may not. */
void openblas_set_num_threads(int num_threads);

struct cpu_llama {
  float *block;          /* the one allocation the pointers below live in */
  float *encoded;        /* (N, C) embedding rows */
  float *ln1, *rstd1;    /* (L, N, C), (L, N) input_layernorm output and 1/rms */
  float *qkv;            /* (L, N, QKV) q | k | v after the biases, q and k rotated */
  float *att;            /* (L, B, NH, T, T) softmax probabilities */
  float *atty;           /* (L, N, C) attention output before o_proj */
  float *res2;           /* (L, N, C) residual after attention */
  float *ln2, *rstd2;    /* (L, N, C), (L, N) post_attention_layernorm */
  float *gu;             /* (L, N, 2I) gate | up before SwiGLU */
  float *hm;             /* (L, N, I) silu(gate) * up */
  float *res3;           /* (L, N, C) the layer's output */
  float *lnf, *rstdf;    /* (N, C), (N) model.norm */
  float *logits, *losses, *lse;
  float *dres, *dtmp;    /* (N, C) residual gradient; dlnf / dln2 / datty / dln1 in turn */
  float *dqkv, *dgu, *dh; /* (N, QKV), (N, 2I), (N, I) */
  float *dkv_part;       /* (2, N, NH*D) each query head's dk and dv, summed per KV head after */
  float *att_scratch;    /* (nt, maxT, maxT) dscores per thread */
  float *norm_part;      /* (nt * CHUNKS_PER_THREAD, C) RMSNorm gain gradient partials */
  float *cos_t, *sin_t;  /* (maxT, D/2) RoPE tables */
};

/* The shape numbers the passes use, read once from the config. */
typedef struct {
  int L, C, NH, NKV, D, I, V, QKV, tied, bias;
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
  d.bias = cfg->attention_bias;
  return d;
}

void cpu_llama_destroy(cpu_impl *c) {
  if (!c->ll) return;
  free(c->ll->block);
  free(c->ll);
  c->ll = NULL;
}

int cpu_llama_create(gpt_model *m, cpu_impl *c) {
  const gpt_config *cfg = &m->lay.cfg;
  const llama_dims d = dims_of(cfg);
  const double L = d.L, C = d.C, N = (double)c->maxN, T = m->maxT, nt = c->nt, NH = d.NH;
  const double sizes[] = {N * C,     L * N * C, L * N,          L * N * d.QKV,  L * m->maxB * NH * T * T,
                          L * N * C, L * N * C, L * N * C,      L * N,          2 * L * N * d.I,
                          L * N * d.I, L * N * C, N * C,        N,              N * d.V,
                          N,         N,         N * C,          N * C,          N * d.QKV,
                          2 * N * d.I, N * d.I, nt * T * T,     nt * CHUNKS_PER_THREAD * C, T * (d.D / 2),
                          T * (d.D / 2), d.NKV < d.NH ? 2 * N * C : 0};
  cpu_llama *ll = calloc(1, sizeof *ll);
  if (!ll) return dpc_err(DPC_ENOMEM, "cpu backend: out of memory for the Llama activations");
  c->ll = ll;
  float **ptrs[] = {&ll->encoded, &ll->ln1,  &ll->rstd1,  &ll->qkv,  &ll->att,    &ll->atty, &ll->res2,
                    &ll->ln2,     &ll->rstd2, &ll->gu,    &ll->hm,   &ll->res3,   &ll->lnf,  &ll->rstdf,
                    &ll->logits,  &ll->losses, &ll->lse,  &ll->dres, &ll->dtmp,   &ll->dqkv, &ll->dgu,
                    &ll->dh,      &ll->att_scratch, &ll->norm_part, &ll->cos_t, &ll->sin_t, &ll->dkv_part};
  enum { NBUF = sizeof sizes / sizeof sizes[0] };
  _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof ptrs / sizeof ptrs[0], "one size per buffer");
  double need = 0.0;
  for (int i = 0; i < NBUF; i++) need += sizes[i] + 16;
  if (need * sizeof(float) > (double)SIZE_MAX / 4)
    return dpc_err(DPC_ENOMEM, "cpu backend: Llama activations for B=%d T=%d need %.3g floats; lower B or T",
                   m->maxB, m->maxT, need);
  size_t total = 0, sz[NBUF];
  for (int i = 0; i < NBUF; i++) {
    sz[i] = ((size_t)sizes[i] + 15) & ~(size_t)15; /* 64-byte aligned starts */
    total += sz[i];
  }
  double *inv_freq = malloc((size_t)(d.D / 2) * sizeof *inv_freq);
  ll->block = cpu_alloc_floats(total);
  if (!ll->block || !inv_freq) {
    free(inv_freq);
    return dpc_err(DPC_ENOMEM, "cpu backend: cannot allocate %zu Llama activation floats (B=%d T=%d); lower B or T",
                   total, m->maxB, m->maxT);
  }
  float *p = ll->block;
  for (int i = 0; i < NBUF; i++) {
    *ptrs[i] = p;
    p += sz[i];
  }
  const llamak_rope rope = {cfg->rope_scaling == GPT_ROPE_LLAMA3 ? LLAMAK_ROPE_LLAMA3 : LLAMAK_ROPE_DEFAULT,
                            cfg->rope_theta, cfg->rope_factor, cfg->rope_low_freq_factor, cfg->rope_high_freq_factor,
                            (double)cfg->rope_original_max_position_embeddings};
  int bad = llamak_rope_inv_freq(inv_freq, d.D, &rope);
  if (!bad) llamak_rope_table(ll->cos_t, ll->sin_t, inv_freq, m->maxT, d.D);
  free(inv_freq);
  if (bad) return dpc_err(DPC_EINVAL, "cpu backend: rotary parameters rejected (head_dim %d, rope_theta %g)", d.D,
                          cfg->rope_theta);
  c->logits = ll->logits;
  c->losses = ll->losses;
  c->lse = ll->lse;
  c->lnf = ll->lnf;
  return 0;
}

/* ---- row-wise passes --------------------------------------------------------------------- */

static void rms_fwd(const cpu_impl *c, float *out, float *rstd, const float *x, const float *w, int N, int C,
                    float eps) {
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++) llamak_rmsnorm_fwd(out + (size_t)n * C, rstd + n, x + (size_t)n * C, w, C, eps);
}

/* dx += RMSNorm backward (dx = with !dx_acc); dw gets partial sums over fixed row chunks reduced
 * in chunk order (deterministic under the dynamic schedule); with fresh dw is overwritten. */
static void rms_bwd(const cpu_impl *c, float *dx, float *dw, const float *dout, const float *x, const float *w,
                    const float *rstd, int N, int C, int dx_acc, int fresh) {
  float *part = c->ll->norm_part;
  const int nch0 = c->nt * CHUNKS_PER_THREAD, ch = (N + nch0 - 1) / nch0, nch = (N + ch - 1) / ch;
#pragma omp parallel num_threads(c->nt)
  {
#pragma omp for schedule(dynamic, 1)
    for (int k = 0; k < nch; k++) {
      float *pw = part + (size_t)k * C;
      memset(pw, 0, (size_t)C * sizeof(float));
      const int hi = (k + 1) * ch < N ? (k + 1) * ch : N;
      for (int n = k * ch; n < hi; n++)
        llamak_rmsnorm_bwd(dx + (size_t)n * C, pw, dout + (size_t)n * C, x + (size_t)n * C, w, rstd[n], C, dx_acc);
    }
#pragma omp for schedule(static)
    for (int i = 0; i < C; i++) {
      float s = 0.0f;
      for (int k = 0; k < nch; k++) s += part[(size_t)k * C + i];
      dw[i] = fresh ? s : dw[i] + s;
    }
  }
}

/* Rotate q and k of every row in place (forward), or their gradients (backward); row n is
 * position n % T of its sequence. */
static void rope_rows(const cpu_impl *c, const llama_dims *d, float *qkv, int N, int T, int backward) {
  const int H = d->D / 2;
  const cpu_llama *ll = c->ll;
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++) {
    float *q = qkv + (size_t)n * d->QKV, *k = q + (size_t)d->NH * d->D;
    const float *cs = ll->cos_t + (size_t)(n % T) * H, *sn = ll->sin_t + (size_t)(n % T) * H;
    if (backward) {
      llamak_rope_bwd(q, d->QKV, cs, sn, 1, d->NH, d->D);
      llamak_rope_bwd(k, d->QKV, cs, sn, 1, d->NKV, d->D);
    } else {
      llamak_rope_fwd(q, d->QKV, cs, sn, 1, d->NH, d->D);
      llamak_rope_fwd(k, d->QKV, cs, sn, 1, d->NKV, d->D);
    }
  }
}

/* out[N, OC] += res (rows), or += bias (columns); either may be NULL. */
static void add_rows(const cpu_impl *c, float *out, const float *res, const float *bias, int N, int OC) {
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++) {
    if (bias) cpuk_add_bias_row(out + (size_t)n * OC, bias, NULL, OC);
    if (res) cpuk_acc(out + (size_t)n * OC, res + (size_t)n * OC, (size_t)OC);
  }
}

/* db[OC] (+)= column sums of dout[N, OC], column blocks per thread, rows in order. */
static void bias_bwd(const cpu_impl *c, float *db, const float *dout, int N, int OC, int fresh) {
  const int nt = c->nt, ch = cpu_split_chunk(OC, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < nt; i++) {
    int lo = i * ch, hi = lo + ch < OC ? lo + ch : OC;
    if (lo >= hi) continue;
    if (fresh) memcpy(db + lo, dout + lo, (size_t)(hi - lo) * sizeof(float));
    for (int r = fresh ? 1 : 0; r < N; r++) cpuk_acc(db + lo, dout + (size_t)r * OC + lo, (size_t)(hi - lo));
  }
}

/* ---- attention --------------------------------------------------------------------------- */

/* Causal grouped-query attention of qkv (N, QKV) into out (N, NH*D), probabilities in att
 * (B, NH, T, T); query head h reads KV head h / (NH/NKV), one task per (sequence, query head)
 * through cpu_attn_head_fwd, as GPT-2's attention. */
static void attn_fwd(const cpu_impl *c, const llama_dims *d, float *out, float *att, const float *qkv, int B,
                     int T) {
  const int D = d->D, QKV = d->QKV, C = d->NH * D, NH = d->NH;
  const float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 1)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH, j = llamak_kv_head(h, NH, d->NKV);
    const float *base = qkv + (size_t)b * T * QKV;
    const float *q = base + (size_t)h * D, *k = base + C + (size_t)j * D, *v = k + (size_t)d->NKV * D;
    float *A = att + (size_t)bh * T * T, *o = out + (size_t)b * T * C + (size_t)h * D;
    cpu_attn_head_fwd(c, o, C, A, q, k, v, QKV, T, D, scale);
  }
}

/* Backward of attn_fwd: dout (N, NH*D) -> dqkv (N, QKV), every element written. One task per
 * (sequence, query head), so B*NH tasks share the threads even with few KV heads. Each head
 * writes its dq, and its dk and dv into dqkv directly when it has its KV head to itself (rep 1),
 * else into ll->dkv_part, summed per KV head afterwards in ascending query head order. */
static void attn_bwd(const cpu_impl *c, const llama_dims *d, float *dqkv, const float *dout, const float *att,
                     const float *qkv, int B, int T, int maxT) {
  const int D = d->D, QKV = d->QKV, C = d->NH * D, NH = d->NH, NKV = d->NKV, rep = NH / NKV;
  const float scale = 1.0f / sqrtf((float)D);
  float *dkp = rep > 1 ? c->ll->dkv_part : NULL, *dvp = rep > 1 ? dkp + (size_t)B * T * C : NULL;
#pragma omp parallel num_threads(c->nt)
  {
    float *S = c->ll->att_scratch + (size_t)omp_get_thread_num() * maxT * maxT; /* dscores (T, T) */
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH, j = llamak_kv_head(h, NH, NKV);
      const float *base = qkv + (size_t)b * T * QKV;
      const float *q = base + (size_t)h * D, *k = base + C + (size_t)j * D, *v = k + (size_t)NKV * D;
      const float *A = att + (size_t)bh * T * T, *dO = dout + (size_t)b * T * C + (size_t)h * D;
      float *dq = dqkv + (size_t)b * T * QKV + (size_t)h * D;
      float *dk = dqkv + (size_t)b * T * QKV + C + (size_t)j * D, *dv = dk + (size_t)NKV * D;
      int ldk = QKV;
      if (rep > 1) {
        dk = dkp + (size_t)b * T * C + (size_t)h * D;
        dv = dvp + (size_t)b * T * C + (size_t)h * D;
        ldk = C;
      }
      cpu_attn_head_bwd(c, dq, QKV, dk, dv, ldk, S, dO, C, A, q, k, v, QKV, T, D, scale);
    }
    if (rep > 1) {
#pragma omp for schedule(dynamic, ROWS_PER_ITEM)
      for (int n = 0; n < B * T; n++) {
        float *dk = dqkv + (size_t)n * QKV + C, *dv = dk + (size_t)NKV * D;
        const float *pk = dkp + (size_t)n * C, *pv = dvp + (size_t)n * C;
        for (int jj = 0; jj < NKV; jj++) {
          float *ok = dk + (size_t)jj * D, *ov = dv + (size_t)jj * D;
          memcpy(ok, pk + (size_t)jj * rep * D, (size_t)D * sizeof(float));
          memcpy(ov, pv + (size_t)jj * rep * D, (size_t)D * sizeof(float));
          for (int h = jj * rep + 1; h < (jj + 1) * rep; h++) {
            cpuk_acc(ok, pk + (size_t)h * D, (size_t)D);
            cpuk_acc(ov, pv + (size_t)h * D, (size_t)D);
          }
        }
      }
    }
  }
}

/* ---- forward ----------------------------------------------------------------------------- */

/* One decoder layer: x (N, C) -> res3 of layer l. */
static void layer_fwd(gpt_model *m, const llama_dims *d, int l, const float *x, int B, int T) {
  cpu_impl *c = m->impl;
  cpu_llama *ll = c->ll;
  const int N = B * T, C = d->C, I = d->I, QKV = d->QKV;
  const size_t NC = (size_t)N * C;
  const float eps = (float)m->lay.cfg.rms_norm_eps;
  float *w[GPT_LL_N];
  gpt_llama_layer_ptrs(&m->lay, c->params, l, w);
  float *ln1 = ll->ln1 + l * NC, *qkv = ll->qkv + (size_t)l * N * QKV, *atty = ll->atty + l * NC;
  float *res2 = ll->res2 + l * NC, *ln2 = ll->ln2 + l * NC, *gu = ll->gu + (size_t)l * N * 2 * I;
  float *hm = ll->hm + (size_t)l * N * I, *res3 = ll->res3 + l * NC;
  float *att = ll->att + (size_t)l * B * d->NH * T * T;
  rms_fwd(c, ln1, ll->rstd1 + (size_t)l * N, x, w[GPT_LL_LN1], N, C, eps);
  cpu_mm(c, 0, 1, N, QKV, C, ln1, C, w[GPT_LL_QKV], C, 0.0f, qkv, QKV);
  if (w[GPT_LL_QKV_B]) add_rows(c, qkv, NULL, w[GPT_LL_QKV_B], N, QKV);
  rope_rows(c, d, qkv, N, T, 0);
  attn_fwd(c, d, atty, att, qkv, B, T);
  cpu_mm(c, 0, 1, N, C, C, atty, C, w[GPT_LL_O], C, 0.0f, res2, C);
  add_rows(c, res2, x, NULL, N, C);
  rms_fwd(c, ln2, ll->rstd2 + (size_t)l * N, res2, w[GPT_LL_LN2], N, C, eps);
  cpu_mm(c, 0, 1, N, 2 * I, C, ln2, C, w[GPT_LL_GU], C, 0.0f, gu, 2 * I);
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++)
    llamak_swiglu_fwd(hm + (size_t)n * I, gu + (size_t)n * 2 * I, gu + (size_t)n * 2 * I + I, I);
  cpu_mm(c, 0, 1, N, C, I, hm, I, w[GPT_LL_DOWN], I, 0.0f, res3, C);
  add_rows(c, res3, res2, NULL, N, C);
}

int cpu_llama_forward(gpt_model *m, const int *inputs, const int *targets, int B, int T, float *loss) {
  cpu_impl *c = m->impl;
  cpu_llama *ll = c->ll;
  const llama_dims d = dims_of(&m->lay.cfg);
  const int N = B * T, C = d.C, V = d.V;
  openblas_set_num_threads(1);
  memcpy(c->inputs, inputs, (size_t)N * sizeof(int));
  if (targets) memcpy(c->targets, targets, (size_t)N * sizeof(int));
  c->B = B;
  c->T = T;
  c->state = ST_NONE;
  const float *embed = c->params, *normw = embed + (size_t)V * C;
  const float *head = d.tied ? embed : normw + C;
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++)
    memcpy(ll->encoded + (size_t)n * C, embed + (size_t)c->inputs[n] * C, (size_t)C * sizeof(float));
  const float *x = ll->encoded;
  for (int l = 0; l < d.L; l++) {
    layer_fwd(m, &d, l, x, B, T);
    x = ll->res3 + (size_t)l * N * C;
  }
  rms_fwd(c, ll->lnf, ll->rstdf, x, normw, N, C, (float)m->lay.cfg.rms_norm_eps);
  cpu_mm(c, 0, 1, N, V, C, ll->lnf, C, head, C, 0.0f, ll->logits, V);
  if (!targets) {
    c->state = ST_LOGITS;
    return 0;
  }
  return cpu_xent_forward(c, N, V, loss);
}

/* ---- backward ---------------------------------------------------------------------------- */

/* One decoder layer's backward: ll->dres holds d(res3) on entry and d(x) on return. */
static void layer_bwd(gpt_model *m, const llama_dims *d, int l, const float *x, int fresh) {
  cpu_impl *c = m->impl;
  cpu_llama *ll = c->ll;
  const int B = c->B, T = c->T, N = B * T, C = d->C, I = d->I, QKV = d->QKV;
  const size_t NC = (size_t)N * C;
  const float beta = fresh ? 0.0f : 1.0f;
  float *w[GPT_LL_N], *dw[GPT_LL_N];
  gpt_llama_layer_ptrs(&m->lay, c->params, l, w);
  gpt_llama_layer_ptrs(&m->lay, c->grads, l, dw);
  const float *ln1 = ll->ln1 + l * NC, *qkv = ll->qkv + (size_t)l * N * QKV, *atty = ll->atty + l * NC;
  const float *res2 = ll->res2 + l * NC, *ln2 = ll->ln2 + l * NC, *gu = ll->gu + (size_t)l * N * 2 * I;
  const float *hm = ll->hm + (size_t)l * N * I, *att = ll->att + (size_t)l * B * d->NH * T * T;

  cpu_mm(c, 0, 0, N, I, C, ll->dres, C, w[GPT_LL_DOWN], I, 0.0f, ll->dh, I);
  cpu_mm(c, 1, 0, C, I, N, ll->dres, C, hm, I, beta, dw[GPT_LL_DOWN], I);
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++) {
    float *dg = ll->dgu + (size_t)n * 2 * I;
    const float *g = gu + (size_t)n * 2 * I;
    llamak_swiglu_bwd(dg, dg + I, ll->dh + (size_t)n * I, g, g + I, I);
  }
  cpu_mm(c, 0, 0, N, C, 2 * I, ll->dgu, 2 * I, w[GPT_LL_GU], C, 0.0f, ll->dtmp, C);
  cpu_mm(c, 1, 0, 2 * I, C, N, ll->dgu, 2 * I, ln2, C, beta, dw[GPT_LL_GU], C);
  rms_bwd(c, ll->dres, dw[GPT_LL_LN2], ll->dtmp, res2, w[GPT_LL_LN2], ll->rstd2 + (size_t)l * N, N, C, 1, fresh);

  cpu_mm(c, 0, 0, N, C, C, ll->dres, C, w[GPT_LL_O], C, 0.0f, ll->dtmp, C);
  cpu_mm(c, 1, 0, C, C, N, ll->dres, C, atty, C, beta, dw[GPT_LL_O], C);
  attn_bwd(c, d, ll->dqkv, ll->dtmp, att, qkv, B, T, m->maxT);
  rope_rows(c, d, ll->dqkv, N, T, 1);
  if (dw[GPT_LL_QKV_B]) bias_bwd(c, dw[GPT_LL_QKV_B], ll->dqkv, N, QKV, fresh);
  cpu_mm(c, 0, 0, N, C, QKV, ll->dqkv, QKV, w[GPT_LL_QKV], C, 0.0f, ll->dtmp, C);
  cpu_mm(c, 1, 0, QKV, C, N, ll->dqkv, QKV, ln1, C, beta, dw[GPT_LL_QKV], C);
  rms_bwd(c, ll->dres, dw[GPT_LL_LN1], ll->dtmp, x, w[GPT_LL_LN1], ll->rstd1 + (size_t)l * N, N, C, 1, fresh);
}

int cpu_llama_backward(gpt_model *m) {
  cpu_impl *c = m->impl;
  cpu_llama *ll = c->ll;
  const llama_dims d = dims_of(&m->lay.cfg);
  const int N = c->B * c->T, C = d.C, V = d.V, nt = c->nt;
  const size_t NC = (size_t)N * C;
  openblas_set_num_threads(1);
  c->state = ST_BACKWARD;
  const int fresh = c->grads_zero; /* first writes overwrite the gradients */
  const float *embed = c->params, *normw = embed + (size_t)V * C, *head = d.tied ? embed : normw + C;
  float *dembed = c->grads, *dnormw = dembed + (size_t)V * C, *dhead = d.tied ? dembed : dnormw + C;

  /* Mean cross-entropy: dlogits = (softmax - onehot) / N, in place. */
  const float dloss = 1.0f / (float)N;
#pragma omp parallel for num_threads(nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++) cpuk_xent_bwd_row(ll->logits + (size_t)n * V, V, c->targets[n], c->lse[n], dloss);
  cpu_mm(c, 0, 0, N, C, V, ll->logits, V, head, C, 0.0f, ll->dtmp, C);                  /* dlnf */
  cpu_mm(c, 1, 0, V, C, N, ll->logits, V, ll->lnf, C, fresh ? 0.0f : 1.0f, dhead, C); /* dhead += dlogits^T lnf */
  const float *last = ll->res3 + (size_t)(d.L - 1) * NC;
  rms_bwd(c, ll->dres, dnormw, ll->dtmp, last, normw, ll->rstdf, N, C, 0, fresh);
  for (int l = d.L - 1; l >= 0; l--)
    layer_bwd(m, &d, l, l == 0 ? ll->encoded : ll->res3 + (size_t)(l - 1) * NC, fresh);

  /* Embedding rows by column blocks so repeated tokens never race. Tied, dembed already holds
   * the head's part; untied and fresh, it starts from zero. */
  const int ch = cpu_split_chunk(C, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < nt; i++) {
    int lo = i * ch, hi = lo + ch < C ? lo + ch : C;
    if (lo >= hi) continue;
    if (fresh && !d.tied)
      for (int v = 0; v < V; v++) memset(dembed + (size_t)v * C + lo, 0, (size_t)(hi - lo) * sizeof(float));
    for (int n = 0; n < N; n++)
      cpuk_acc(dembed + (size_t)c->inputs[n] * C + lo, ll->dres + (size_t)n * C + lo, (size_t)(hi - lo));
  }
  c->grads_zero = 0;
  return 0;
}
