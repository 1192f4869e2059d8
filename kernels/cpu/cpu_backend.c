/* cpu_backend.c — the CPU compute backend (gpt_cpu_ops): GPT-2 forward, backward and AdamW on
 * the canonical flat layout, after llm.c's train_gpt2.c. The Llama family's passes live in
 * cpu_llama.c (same state, products and optimizer; cpu_shared.h), Muon's step in cpu_muon.c.
 *
 * Threading: one runtime does the parallel work. Products run single-threaded in cpu_gemm
 * (dipaco's AVX-512 kernel, or OpenBLAS kept single-threaded), each thread in its own
 * workspace, and every large product is split along its larger output dimension into blocks,
 * one cpu_gemm call each (see plan_split: enough rows or columns per block that packing the
 * other operand stays cheap); attention runs one (batch, head) pair per task. Work items are
 * fixed by the thread count and the shapes alone and every reduction runs in a fixed order,
 * so a fixed thread count gives bit-identical results whatever the (dynamic) assignment of
 * items to threads. Memory: parameters, gradients, AdamW moments and activations are each one
 * allocation made at create; no call allocates afterwards.
 *
 * Passes over memory: zero_grad only marks the gradients as zero; the next backward then
 * writes each gradient with its first contribution instead of adding to it. The optimizer
 * makes two passes: the global norm, then clip and AdamW together.
 *
 * Activations are packed for the actual (B, T) of the last forward (N = B*T rows), inside
 * buffers sized for (maxB, maxT). Backward turns the logits buffer into dlogits in place, so
 * logits are readable only until backward. */
#include "common/errors.h"
#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_llama.h"
#include "kernels/cpu/cpu_shared.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/gpt.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The Debian/OpenBLAS cblas.h declares this; other cblas headers may not. */
void openblas_set_num_threads(int num_threads);

/* GPT-2's tensors of one layer, in layout order. */
enum { LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB, NLAYER_T };

static void layer_ptrs(const gpt_layout *lay, float *base, int l, float *w[NLAYER_T]) {
  const gpt_tensor *t = &lay->tensors[4 + NLAYER_T * l];
  for (int i = 0; i < NLAYER_T; i++) w[i] = base + t[i].offset;
}

static void cpu_destroy(gpt_model *m) {
  cpu_impl *c = m->impl;
  if (!c) return;
  free(c->params);
  free(c->grads);
  free(c->adam_m);
  free(c->adam_v);
  free(c->acts);
  free(c->inputs);
  free(c->targets);
  free(c->segs);
  free(c->seg_sumsq);
  free(c->gemm_ws);
  free(c->muon_ws);
  cpu_llama_destroy(c);
  free(c);
  m->impl = NULL;
}

static int cpu_create(gpt_model *m) {
  const gpt_config *cfg = &m->lay.cfg;
  const size_t L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head, V = cfg->vocab_size;
  const size_t B = m->maxB, T = m->maxT, N = B * T, P = m->lay.n_params;
  if (N > (size_t)INT32_MAX / 8)
    return dpc_err(DPC_EINVAL, "cpu backend: B*T = %zu rows is too many (at most %d)", N, INT32_MAX / 8);
  cpu_impl *c = calloc(1, sizeof *c);
  if (!c) return dpc_err(DPC_ENOMEM, "cpu backend: out of memory for the model state");
  m->impl = c;
  int nt = m->opts.threads > 0 ? m->opts.threads : omp_get_num_procs();
  c->nt = nt < 1 ? 1 : nt > 1024 ? 1024 : nt;
  c->maxN = N;
  const int llama = cfg->arch == GPT_ARCH_LLAMA; /* cpu_llama_create allocates its own */

  /* GPT-2's activation buffers, in the order of the pointers below; sizes are checked in double
   * first so that absurd shapes fail cleanly instead of wrapping. */
  const double dL = L, dC = C, dN = (double)N, dT = T, dnt = c->nt;
  const double dsizes[] = {dN * dC,     dL * dN * dC,     dL * dN, dL * dN, 3 * dL * dN * dC, dL * B * NH * dT * dT,
                           dL * dN * dC, dL * dN * dC,    dL * dN * dC, dL * dN, dL * dN, 4 * dL * dN * dC,
                           4 * dL * dN * dC, dL * dN * dC, dN * dC, dN, dN, dN * V, dN, dN, dN * dC, dN * dC,
                           3 * dN * dC, 4 * dN * dC, dnt * dT * dT, dnt * CHUNKS_PER_THREAD * 2 * dC};
  float **ptrs[] = {&c->encoded, &c->ln1,      &c->ln1_mean, &c->ln1_rstd, &c->qkv,    &c->att,
                    &c->atty,    &c->res2,     &c->ln2,      &c->ln2_mean, &c->ln2_rstd, &c->fch,
                    &c->fch_gelu, &c->res3,    &c->lnf,      &c->lnf_mean, &c->lnf_rstd, &c->logits,
                    &c->losses,  &c->lse,      &c->dres,     &c->dtmp,     &c->dqkv,   &c->dfch,
                    &c->att_scratch, &c->ln_part};
  const int nbuf = (int)(sizeof dsizes / sizeof dsizes[0]);
  _Static_assert(sizeof dsizes / sizeof dsizes[0] == sizeof ptrs / sizeof ptrs[0], "one size per buffer");
  double need = 0.0;
  for (int i = 0; i < nbuf; i++) need += dsizes[i] + 16;
  if (!llama && need * sizeof(float) > (double)SIZE_MAX / 4) {
    cpu_destroy(m);
    return dpc_err(DPC_ENOMEM, "cpu backend: activations for B=%zu T=%zu need %.3g floats; lower B or T", B, T,
                   need);
  }
  size_t sizes[sizeof dsizes / sizeof dsizes[0]];
  size_t total = 0;
  for (int i = 0; i < nbuf && !llama; i++) {
    sizes[i] = ((size_t)dsizes[i] + 15) & ~(size_t)15; /* 64-byte aligned starts */
    total += sizes[i];
  }

  c->params = cpu_alloc_floats(P);
  c->grads = cpu_alloc_floats(P);
  c->adam_m = cpu_alloc_floats(P);
  c->adam_v = cpu_alloc_floats(P);
  c->acts = llama ? NULL : cpu_alloc_floats(total);
  c->inputs = calloc(N, sizeof(int));
  c->targets = calloc(N, sizeof(int));
  size_t nseg = 0;
  for (int k = 0; k < m->lay.n_tensors; k++) nseg += (m->lay.tensors[k].numel + OPT_SEG - 1) / OPT_SEG;
  c->segs = calloc(nseg, sizeof *c->segs);
  c->seg_sumsq = calloc(nseg, sizeof *c->seg_sumsq);
  c->gemm = cpu_gemm_pick();
  c->gemm_ws = cpu_alloc_floats((size_t)c->nt * cpu_gemm_ws_floats());
  if (!c->params || !c->grads || !c->adam_m || !c->adam_v || (!llama && !c->acts) || !c->inputs || !c->targets ||
      !c->segs || !c->seg_sumsq || !c->gemm_ws || nseg > INT32_MAX) {
    cpu_destroy(m);
    return dpc_err(DPC_ENOMEM, "cpu backend: cannot allocate %zu parameters and %zu activation floats "
                   "(B=%zu T=%zu); lower B or T", P, total, B, T);
  }
  float *p = c->acts;
  for (int i = 0; i < nbuf && !llama; i++) {
    *ptrs[i] = p;
    p += sizes[i];
  }
  for (int k = 0; k < m->lay.n_tensors; k++) {
    const gpt_tensor *t = &m->lay.tensors[k];
    for (size_t o = 0; o < t->numel; o += OPT_SEG) {
      cpu_seg *s = &c->segs[c->nseg++];
      s->off = t->offset + o;
      s->n = t->numel - o < OPT_SEG ? t->numel - o : OPT_SEG;
      s->decay = t->decay;
      s->muon = t->muon;
    }
  }
  c->state = ST_NONE;
  if (llama) {
    int rc = cpu_llama_create(m, c);
    if (rc) cpu_destroy(m);
    return rc;
  }
  return 0;
}

static int cpu_set_params(gpt_model *m, const float *src, size_t off, size_t n) {
  cpu_impl *c = m->impl;
  memcpy(c->params + off, src, n * sizeof(float));
  return 0;
}

static int cpu_get_params(gpt_model *m, float *dst, size_t off, size_t n) {
  cpu_impl *c = m->impl;
  memcpy(dst, c->params + off, n * sizeof(float));
  return 0;
}

static int cpu_get_grads(gpt_model *m, float *dst, size_t off, size_t n) {
  cpu_impl *c = m->impl;
  if (c->grads_zero) memset(dst, 0, n * sizeof(float));
  else memcpy(dst, c->grads + off, n * sizeof(float));
  return 0;
}

/* out[N,OC] = inp[N,IC] @ W[IC,OC] + bias (+ res[N,OC]); with act, out keeps the pre-activation
 * and act = GELU(out). Split as plan_split says; the epilogue runs on each block right after
 * its product, while the block is in cache. */
static void linear_fwd(const cpu_impl *c, float *out, const float *inp, const float *W, const float *bias,
                       const float *res, float *act, int N, int IC, int OC) {
  const int nt = c->nt;
  const mm_split sp = nt == 1 ? (mm_split){1, N, 1} : cpu_plan_split(nt, N, OC);
  const int dim = sp.by_rows ? N : OC;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int i = 0; i < sp.nch; i++) {
    const int lo = i * sp.ch, hi = lo + sp.ch < dim ? lo + sp.ch : dim;
    const int r0 = sp.by_rows ? lo : 0, r1 = sp.by_rows ? hi : N; /* rows of the block */
    const int c0 = sp.by_rows ? 0 : lo, c1 = sp.by_rows ? OC : hi; /* and its columns */
    cpu_thread_gemm(c, 0, 0, r1 - r0, c1 - c0, IC, 1.0f, inp + (size_t)r0 * IC, IC, W + c0, OC, 0.0f,
         out + (size_t)r0 * OC + c0, OC);
    for (int r = r0; r < r1; r++) {
      float *o = out + (size_t)r * OC + c0;
      if (act) cpuk_bias_gelu_row(o, act + (size_t)r * OC + c0, bias + c0, c1 - c0);
      else cpuk_add_bias_row(o, bias + c0, res ? res + (size_t)r * OC + c0 : NULL, c1 - c0);
    }
  }
}

/* dinp[N,IC] = dout @ W^T; dW[IC,OC] += inp^T @ dout; db[OC] += column sums of dout (with
 * fresh, dW and db are overwritten instead: their first write after zero_grad). */
static void linear_bwd(const cpu_impl *c, float *dinp, float *dW, float *db, const float *dout, const float *inp,
                       const float *W, int N, int IC, int OC, int fresh) {
  cpu_mm(c, 0, 1, N, IC, OC, dout, OC, W, OC, 0.0f, dinp, IC);
  cpu_mm(c, 1, 0, IC, OC, N, inp, IC, dout, OC, fresh ? 0.0f : 1.0f, dW, OC);
  const int nt = c->nt, ch = cpu_split_chunk(OC, nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < nt; i++) {
    int lo = i * ch, hi = lo + ch < OC ? lo + ch : OC;
    if (lo >= hi) continue;
    if (fresh) memcpy(db + lo, dout + lo, (size_t)(hi - lo) * sizeof(float));
    for (int r = fresh ? 1 : 0; r < N; r++) cpuk_acc(db + lo, dout + (size_t)r * OC + lo, (size_t)(hi - lo));
  }
}

/* ---- LayerNorm, attention, GELU --------------------------------------------------------- */

static void layernorm_fwd(const cpu_impl *c, float *out, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int N, int C) {
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++)
    cpuk_layernorm_row(out + (size_t)n * C, mean + n, rstd + n, x + (size_t)n * C, w, b, C);
}

/* dx += LayerNorm backward (dx = with !dx_acc); dw, db += partial sums over fixed row chunks,
 * reduced in chunk order (deterministic under the dynamic schedule); with fresh, dw and db are
 * overwritten instead. */
static void layernorm_bwd(const cpu_impl *c, float *dx, float *dw, float *db, const float *dout, const float *x,
                          const float *w, const float *mean, const float *rstd, int N, int C, int dx_acc, int fresh) {
  const int nch0 = c->nt * CHUNKS_PER_THREAD, ch = (N + nch0 - 1) / nch0, nch = (N + ch - 1) / ch;
#pragma omp parallel num_threads(c->nt)
  {
#pragma omp for schedule(dynamic, 1)
    for (int k = 0; k < nch; k++) {
      float *pw = c->ln_part + (size_t)k * 2 * C, *pb = pw + C;
      memset(pw, 0, 2 * (size_t)C * sizeof(float));
      const int hi = (k + 1) * ch < N ? (k + 1) * ch : N;
      for (int n = k * ch; n < hi; n++)
        cpuk_layernorm_bwd_row(dx + (size_t)n * C, pw, pb, dout + (size_t)n * C, x + (size_t)n * C, w, mean[n],
                               rstd[n], C, dx_acc);
    }
#pragma omp for schedule(static)
    for (int i = 0; i < C; i++) {
      float sw = 0.0f, sb = 0.0f;
      for (int k = 0; k < nch; k++) {
        sw += c->ln_part[(size_t)k * 2 * C + i];
        sb += c->ln_part[(size_t)k * 2 * C + C + i];
      }
      dw[i] = fresh ? sw : dw[i] + sw;
      db[i] = fresh ? sb : db[i] + sb;
    }
  }
}

/* Causal self-attention of qkv (N, 3C) into out (N, C), keeping the probabilities in att
 * (B, NH, T, T), one task per (sequence, head) through cpu_attn_head_fwd. */
static void attention_fwd(const cpu_impl *c, float *out, float *att, const float *qkv, int B, int T, int C,
                          int NH) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 1)
  for (int bh = 0; bh < B * NH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    float *A = att + (size_t)bh * T * T;
    float *o = out + (size_t)b * T * C + (size_t)h * hs;
    cpu_attn_head_fwd(c, o, C, A, q, k, v, C3, T, hs, scale);
  }
}

/* Backward of attention_fwd: dout (N, C) -> dqkv (N, 3C), every element written once. */
static void attention_bwd(const cpu_impl *c, float *dqkv, const float *dout, const float *att, const float *qkv,
                          int B, int T, int C, int NH, int maxT) {
  const int hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel num_threads(c->nt)
  {
    float *D = c->att_scratch + (size_t)omp_get_thread_num() * maxT * maxT; /* dscores (T, T) */
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
      const int b = bh / NH, h = bh % NH;
      const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * hs, *dk = dq + C, *dv = dq + 2 * C;
      const float *A = att + (size_t)bh * T * T;
      const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
      cpu_attn_head_bwd(c, dq, C3, dk, dv, C3, D, dO, C, A, q, k, v, C3, T, hs, scale);
    }
  }
}

/* ---- forward / backward ---------------------------------------------------------------- */

static int cpu_forward(gpt_model *m, const int *inputs, const int *targets, int B, int T, float *loss) {
  if (m->lay.cfg.arch == GPT_ARCH_LLAMA) return cpu_llama_forward(m, inputs, targets, B, T, loss);
  cpu_impl *c = m->impl;
  const gpt_config *cfg = &m->lay.cfg;
  const int L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head, V = cfg->vocab_size, nt = c->nt;
  const int N = B * T;
  openblas_set_num_threads(1);
  memcpy(c->inputs, inputs, (size_t)N * sizeof(int));
  if (targets) memcpy(c->targets, targets, (size_t)N * sizeof(int));
  c->B = B;
  c->T = T;
  c->state = ST_NONE;

  const float *wte = c->params, *wpe = wte + (size_t)V * C;
  const float *lnfw = wpe + (size_t)cfg->n_positions * C, *lnfb = lnfw + C;
  const size_t NC = (size_t)N * C;
#pragma omp parallel for num_threads(nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++)
    cpuk_encode_row(c->encoded + (size_t)n * C, wte + (size_t)c->inputs[n] * C, wpe + (size_t)(n % T) * C, C);

  const float *residual = c->encoded;
  for (int l = 0; l < L; l++) {
    float *w[NLAYER_T];
    layer_ptrs(&m->lay, c->params, l, w);
    float *ln1 = c->ln1 + l * NC, *qkv = c->qkv + 3 * l * NC, *atty = c->atty + l * NC, *res2 = c->res2 + l * NC;
    float *ln2 = c->ln2 + l * NC, *fch = c->fch + 4 * l * NC, *fchg = c->fch_gelu + 4 * l * NC;
    float *res3 = c->res3 + l * NC, *att = c->att + (size_t)l * B * NH * T * T;
    layernorm_fwd(c, ln1, c->ln1_mean + (size_t)l * N, c->ln1_rstd + (size_t)l * N, residual, w[LN1W], w[LN1B], N,
                  C);
    linear_fwd(c, qkv, ln1, w[QKVW], w[QKVB], NULL, NULL, N, C, 3 * C);
    attention_fwd(c, atty, att, qkv, B, T, C, NH);
    linear_fwd(c, res2, atty, w[APW], w[APB], residual, NULL, N, C, C);
    layernorm_fwd(c, ln2, c->ln2_mean + (size_t)l * N, c->ln2_rstd + (size_t)l * N, res2, w[LN2W], w[LN2B], N, C);
    linear_fwd(c, fch, ln2, w[FCW], w[FCB], NULL, fchg, N, C, 4 * C);
    linear_fwd(c, res3, fchg, w[FPW], w[FPB], res2, NULL, N, 4 * C, C);
    residual = res3;
  }
  layernorm_fwd(c, c->lnf, c->lnf_mean, c->lnf_rstd, residual, lnfw, lnfb, N, C);
  cpu_mm(c, 0, 1, N, V, C, c->lnf, C, wte, C, 0.0f, c->logits, V);

  if (!targets) {
    c->state = ST_LOGITS;
    return 0;
  }
  return cpu_xent_forward(c, N, V, loss);
}


static int cpu_logits(gpt_model *m, int b, int t, float *dst) {
  cpu_impl *c = m->impl;
  if (c->state != ST_LOGITS && c->state != ST_LOSS)
    return dpc_err(DPC_ESTATE, "logits: no forward since the last backward (run gpt_forward first)");
  if (b < 0 || b >= c->B || t < 0 || t >= c->T)
    return dpc_err(DPC_ERANGE, "logits: position (b=%d, t=%d) outside the last forward's B=%d T=%d", b, t, c->B, c->T);
  const int V = m->lay.cfg.vocab_size;
  memcpy(dst, c->logits + ((size_t)b * c->T + t) * V, (size_t)V * sizeof(float));
  return 0;
}

static int cpu_hidden(gpt_model *m, int b, int t, float *dst) {
  cpu_impl *c = m->impl;
  if (c->state != ST_LOGITS && c->state != ST_LOSS)
    return dpc_err(DPC_ESTATE, "hidden: no forward since the last backward (run gpt_forward first)");
  if (b < 0 || b >= c->B || t < 0 || t >= c->T)
    return dpc_err(DPC_ERANGE, "hidden: position (b=%d, t=%d) outside the last forward's B=%d T=%d", b, t, c->B, c->T);
  const int C = m->lay.cfg.n_embd;
  memcpy(dst, c->lnf + ((size_t)b * c->T + t) * C, (size_t)C * sizeof(float));
  return 0;
}

/* Marks the gradients zero; the memory is written by the next backward (or by
 * cpu_grads_materialise if something reads them first). */
static int cpu_zero_grad(gpt_model *m) {
  cpu_impl *c = m->impl;
  c->grads_zero = 1;
  return 0;
}

static int cpu_backward(gpt_model *m) {
  cpu_impl *c = m->impl;
  if (c->state != ST_LOSS)
    return dpc_err(DPC_ESTATE, "backward: needs a forward with targets first (and at most one backward per forward)");
  if (m->lay.cfg.arch == GPT_ARCH_LLAMA) return cpu_llama_backward(m);
  const gpt_config *cfg = &m->lay.cfg;
  const int L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head, V = cfg->vocab_size, nt = c->nt;
  const int B = c->B, T = c->T, N = B * T;
  const size_t NC = (size_t)N * C;
  openblas_set_num_threads(1);
  c->state = ST_BACKWARD;
  const int fresh = c->grads_zero; /* first writes overwrite the gradients */

  float *wte = c->params, *wpe = wte + (size_t)V * C, *lnfw = wpe + (size_t)cfg->n_positions * C;
  float *dwte = c->grads, *dwpe = dwte + (size_t)V * C, *dlnfw = dwpe + (size_t)cfg->n_positions * C;
  float *dlnfb = dlnfw + C;

  /* Mean cross-entropy: dlogits = (softmax - onehot) / N, in place. */
  const float dloss = 1.0f / (float)N;
#pragma omp parallel for num_threads(nt) schedule(dynamic, ROWS_PER_ITEM)
  for (int n = 0; n < N; n++) cpuk_xent_bwd_row(c->logits + (size_t)n * V, V, c->targets[n], c->lse[n], dloss);
  cpu_mm(c, 0, 0, N, C, V, c->logits, V, wte, C, 0.0f, c->dtmp, C);       /* dlnf */
  cpu_mm(c, 1, 0, V, C, N, c->logits, V, c->lnf, C, fresh ? 0.0f : 1.0f, dwte, C); /* dwte += dlogits^T lnf */
  const float *last = c->res3 + (size_t)(L - 1) * NC;
  layernorm_bwd(c, c->dres, dlnfw, dlnfb, c->dtmp, last, lnfw, c->lnf_mean, c->lnf_rstd, N, C, 0, fresh);

  for (int l = L - 1; l >= 0; l--) {
    float *w[NLAYER_T], *dw[NLAYER_T];
    layer_ptrs(&m->lay, c->params, l, w);
    layer_ptrs(&m->lay, c->grads, l, dw);
    const float *residual = l == 0 ? c->encoded : c->res3 + (size_t)(l - 1) * NC;
    const float *ln1 = c->ln1 + l * NC, *qkv = c->qkv + 3 * l * NC, *atty = c->atty + l * NC;
    const float *res2 = c->res2 + l * NC, *ln2 = c->ln2 + l * NC, *fch = c->fch + 4 * l * NC;
    const float *fchg = c->fch_gelu + 4 * l * NC, *att = c->att + (size_t)l * B * NH * T * T;

    linear_bwd(c, c->dfch, dw[FPW], dw[FPB], c->dres, fchg, w[FPW], N, 4 * C, C, fresh);
#pragma omp parallel for num_threads(nt) schedule(dynamic, ROWS_PER_ITEM)
    for (int n = 0; n < N; n++) cpuk_gelu_bwd_row(c->dfch + (size_t)n * 4 * C, fch + (size_t)n * 4 * C, 4 * C);
    linear_bwd(c, c->dtmp, dw[FCW], dw[FCB], c->dfch, ln2, w[FCW], N, C, 4 * C, fresh);
    layernorm_bwd(c, c->dres, dw[LN2W], dw[LN2B], c->dtmp, res2, w[LN2W], c->ln2_mean + (size_t)l * N,
                  c->ln2_rstd + (size_t)l * N, N, C, 1, fresh);
    linear_bwd(c, c->dtmp, dw[APW], dw[APB], c->dres, atty, w[APW], N, C, C, fresh);
    attention_bwd(c, c->dqkv, c->dtmp, att, qkv, B, T, C, NH, m->maxT);
    linear_bwd(c, c->dtmp, dw[QKVW], dw[QKVB], c->dqkv, ln1, w[QKVW], N, C, 3 * C, fresh);
    layernorm_bwd(c, c->dres, dw[LN1W], dw[LN1B], c->dtmp, residual, w[LN1W], c->ln1_mean + (size_t)l * N,
                  c->ln1_rstd + (size_t)l * N, N, C, 1, fresh);
  }

  /* Embeddings: wpe rows by position; wte by column blocks so repeated tokens never race (dwte
   * already holds its logits part). With fresh, wpe rows past T are zero. */
  const int ch = cpu_split_chunk(C, nt);
  if (fresh && T < cfg->n_positions)
    memset(dwpe + (size_t)T * C, 0, (size_t)(cfg->n_positions - T) * C * sizeof(float));
#pragma omp parallel num_threads(nt)
  {
#pragma omp for schedule(static) nowait
    for (int t = 0; t < T; t++) {
      if (fresh) memcpy(dwpe + (size_t)t * C, c->dres + (size_t)t * C, (size_t)C * sizeof(float));
      for (int b = fresh ? 1 : 0; b < B; b++) cpuk_acc(dwpe + (size_t)t * C, c->dres + ((size_t)b * T + t) * C, (size_t)C);
    }
#pragma omp for schedule(static)
    for (int i = 0; i < nt; i++) {
      int lo = i * ch, hi = lo + ch < C ? lo + ch : C;
      if (lo < hi)
        for (int n = 0; n < N; n++)
          cpuk_acc(dwte + (size_t)c->inputs[n] * C + lo, c->dres + (size_t)n * C + lo, (size_t)(hi - lo));
    }
  }
  c->grads_zero = 0;
  return 0;
}

/* ---- optimizer ------------------------------------------------------------------------- */

static int cpu_adamw_step(gpt_model *m, const gpt_adamw_hparams *hp, float lr, int t, float *grad_norm) {
  float clip;
  int rc = cpu_clip_grads(m, hp, grad_norm, &clip);
  if (rc) return rc;
  cpu_adamw_segs(m, hp, lr, t, clip, 0);
  return 0;
}

static int cpu_get_opt_state(gpt_model *m, float *m_dst, float *v_dst) {
  cpu_impl *c = m->impl;
  if (m_dst) memcpy(m_dst, c->adam_m, m->lay.n_params * sizeof(float));
  if (v_dst) memcpy(v_dst, c->adam_v, m->lay.n_params * sizeof(float));
  return 0;
}

static int cpu_set_opt_state(gpt_model *m, const float *m_src, const float *v_src) {
  cpu_impl *c = m->impl;
  if (m_src) memcpy(c->adam_m, m_src, m->lay.n_params * sizeof(float));
  if (v_src) memcpy(c->adam_v, v_src, m->lay.n_params * sizeof(float));
  return 0;
}

static int cpu_reset_opt_state(gpt_model *m) {
  cpu_impl *c = m->impl;
  memset(c->adam_m, 0, m->lay.n_params * sizeof(float));
  memset(c->adam_v, 0, m->lay.n_params * sizeof(float));
  return 0;
}

/* The first "model name" of /proc/cpuinfo, the thread count and which matrix product runs
 * (cpu_gemm_name); physical memory. */
static int cpu_describe(gpt_model *m, char *name, size_t len, uint64_t *mem_bytes) {
  cpu_impl *c = m->impl;
  char model[160] = "CPU";
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[512];
    while (fgets(line, sizeof line, f)) {
      char *colon = strchr(line, ':');
      if (strncmp(line, "model name", 10) != 0 || !colon) continue;
      colon++;
      while (*colon == ' ' || *colon == '\t') colon++;
      colon[strcspn(colon, "\n")] = 0;
      if (*colon) snprintf(model, sizeof model, "%s", colon);
      break;
    }
    fclose(f);
  }
  snprintf(name, len, "%s (%d threads, %s products)", model, c->nt, cpu_gemm_name(c->gemm));
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  if (mem_bytes && pages > 0 && psz > 0) *mem_bytes = (uint64_t)pages * (uint64_t)psz;
  return 0;
}

const gpt_backend_ops gpt_cpu_ops = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .set_params = cpu_set_params,
    .get_params = cpu_get_params,
    .get_grads = cpu_get_grads,
    .forward = cpu_forward,
    .logits = cpu_logits,
    .zero_grad = cpu_zero_grad,
    .backward = cpu_backward,
    .adamw_step = cpu_adamw_step,
    .get_opt_state = cpu_get_opt_state,
    .set_opt_state = cpu_set_opt_state,
    .reset_opt_state = cpu_reset_opt_state,
    .describe = cpu_describe,
    .hidden = cpu_hidden,
    .muon_step = cpu_muon_step,
};
