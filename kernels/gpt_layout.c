/* gpt_layout.c — the canonical flat parameter layout (gpt.h): the config's bounds, the tensors
 * in wire order, lookups by name and by flat range. Backend-independent: gpt.c, every backend
 * and the coordinator call it, and it calls no backend. */
#include "kernels/gpt.h"
#include "common/errors.h"

#include <stdio.h>
#include <string.h>

const char *gpt_arch_name(int arch) { return arch == GPT_ARCH_LLAMA ? "llama" : "gpt2"; }

/* The Llama fields: grouped-query heads, the MLP width, RMSNorm's eps and RoPE (an even head
 * size; the llama3 bands need factor >= 1 and low < high, as llama_kernels.c does). */
static int validate_llama(const gpt_config *c) {
  if (c->n_kv_head < 1 || c->n_kv_head > c->n_head || c->n_head % c->n_kv_head != 0)
    return dpc_err(DPC_EINVAL, "num_key_value_heads %d must be in [1, %d] and divide num_attention_heads %d",
                   c->n_kv_head, c->n_head, c->n_head);
  if (c->intermediate_size < 1 || c->intermediate_size > 1 << 20)
    return dpc_err(DPC_EINVAL, "intermediate_size %d out of range [1, 1048576]", c->intermediate_size);
  if ((c->n_embd / c->n_head) % 2 != 0)
    return dpc_err(DPC_EINVAL, "head_dim %d (hidden_size / num_attention_heads) must be even for rotary embeddings",
                   c->n_embd / c->n_head);
  if (!(c->rms_norm_eps > 0.0 && c->rms_norm_eps < 1.0))
    return dpc_err(DPC_EINVAL, "rms_norm_eps %g must be in (0, 1)", c->rms_norm_eps);
  if (!(c->rope_theta > 0.0 && c->rope_theta < 1e300))
    return dpc_err(DPC_EINVAL, "rope_theta %g must be positive and finite", c->rope_theta);
  if ((c->tie_word_embeddings != 0 && c->tie_word_embeddings != 1) ||
      (c->attention_bias != 0 && c->attention_bias != 1))
    return dpc_err(DPC_EINVAL, "tie_word_embeddings and attention_bias must be 0 or 1");
  if (c->rope_scaling == GPT_ROPE_DEFAULT) return 0;
  if (c->rope_scaling != GPT_ROPE_LLAMA3) return dpc_err(DPC_EINVAL, "rope_scaling type %d unknown", c->rope_scaling);
  if (!(c->rope_factor >= 1.0 && c->rope_factor < 1e6))
    return dpc_err(DPC_EINVAL, "rope_scaling.factor %g must be in [1, 1e6)", c->rope_factor);
  if (!(c->rope_low_freq_factor > 0.0 && c->rope_high_freq_factor > c->rope_low_freq_factor &&
        c->rope_high_freq_factor < 1e6))
    return dpc_err(DPC_EINVAL, "rope_scaling needs 0 < low_freq_factor (%g) < high_freq_factor (%g)",
                   c->rope_low_freq_factor, c->rope_high_freq_factor);
  if (c->rope_original_max_position_embeddings < 1)
    return dpc_err(DPC_EINVAL, "rope_scaling.original_max_position_embeddings %d must be >= 1",
                   c->rope_original_max_position_embeddings);
  return 0;
}

int gpt_config_validate(const gpt_config *c) {
  if (c->arch != GPT_ARCH_GPT2 && c->arch != GPT_ARCH_LLAMA) return dpc_err(DPC_EINVAL, "unknown architecture %d", c->arch);
  if (c->n_layer < 1 || c->n_layer > 256)
    return dpc_err(DPC_EINVAL, "n_layer %d out of range [1, 256]", c->n_layer);
  if (c->n_head < 1 || c->n_head > 1024)
    return dpc_err(DPC_EINVAL, "n_head %d out of range [1, 1024]", c->n_head);
  if (c->n_embd < 1 || c->n_embd > 65536)
    return dpc_err(DPC_EINVAL, "n_embd %d out of range [1, 65536]", c->n_embd);
  if (c->n_embd % c->n_head != 0)
    return dpc_err(DPC_EINVAL, "n_embd %d is not divisible by n_head %d", c->n_embd, c->n_head);
  if (c->n_positions < 1 || c->n_positions > 1 << 20)
    return dpc_err(DPC_EINVAL, "n_positions %d out of range [1, 1048576]", c->n_positions);
  if (c->vocab_size < 2 || c->vocab_size > 1 << 24)
    return dpc_err(DPC_EINVAL, "vocab_size %d out of range [2, 16777216]", c->vocab_size);
  if (c->arch == GPT_ARCH_LLAMA) {
    int rc = validate_llama(c);
    if (rc) return rc;
  }
  /* The whole model must stay addressable with int tensor dims and sane memory. */
  double n = (double)c->vocab_size * c->n_embd + (double)c->n_positions * c->n_embd +
             12.0 * c->n_layer * (double)c->n_embd * c->n_embd;
  if (c->arch == GPT_ARCH_LLAMA)
    n = 2.0 * c->vocab_size * c->n_embd +
        c->n_layer * (double)c->n_embd * (4.0 * c->n_embd + 3.0 * c->intermediate_size);
  if (n > 4e10) return dpc_err(DPC_EINVAL, "model too large (%.3g parameters)", n);
  return 0;
}

static void add_tensor(gpt_layout *lay, const char *name, int ndim, int d0, int d1, int layer) {
  gpt_tensor *t = &lay->tensors[lay->n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = ndim == 2 ? d1 : 1;
  t->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
  t->offset = lay->n_params;
  t->decay = ndim == 2;
  t->layer = layer;
  t->muon = 0;
  lay->n_params += t->numel;
}

/* Marks the tensor just added as one of Muon's (a block matrix). */
static void mark_muon(gpt_layout *lay) { lay->tensors[lay->n_tensors - 1].muon = 1; }

/* Llama: the stem, then per layer the tensors of gpt.h's order (q/k/v weights, then their
 * biases, back to back; gate/up back to back). */
static void build_llama(const gpt_config *cfg, gpt_layout *lay) {
  const int C = cfg->n_embd, V = cfg->vocab_size, D = C / cfg->n_head, I = cfg->intermediate_size;
  const int QD = cfg->n_head * D, KD = cfg->n_kv_head * D;
  add_tensor(lay, "model.embed_tokens.weight", 2, V, C, -1);
  add_tensor(lay, "model.norm.weight", 1, C, 0, -1);
  if (!cfg->tie_word_embeddings) add_tensor(lay, "lm_head.weight", 2, V, C, -1);
  lay->stem_end = lay->n_params;
  char nm[GPT_NAME_MAX];
  for (int l = 0; l < cfg->n_layer; l++) {
    lay->layer_off[l] = lay->n_params;
#define T1(suffix, d0) (snprintf(nm, sizeof nm, "model.layers.%d." suffix, l), add_tensor(lay, nm, 1, d0, 0, l))
#define T2(suffix, d0, d1) (snprintf(nm, sizeof nm, "model.layers.%d." suffix, l), add_tensor(lay, nm, 2, d0, d1, l))
    T1("input_layernorm.weight", C);
    T2("self_attn.q_proj.weight", QD, C), mark_muon(lay);
    T2("self_attn.k_proj.weight", KD, C), mark_muon(lay);
    T2("self_attn.v_proj.weight", KD, C), mark_muon(lay);
    if (cfg->attention_bias) {
      T1("self_attn.q_proj.bias", QD);
      T1("self_attn.k_proj.bias", KD);
      T1("self_attn.v_proj.bias", KD);
    }
    T2("self_attn.o_proj.weight", C, QD), mark_muon(lay);
    T1("post_attention_layernorm.weight", C);
    T2("mlp.gate_proj.weight", I, C), mark_muon(lay);
    T2("mlp.up_proj.weight", I, C), mark_muon(lay);
    T2("mlp.down_proj.weight", C, I), mark_muon(lay);
#undef T1
#undef T2
  }
  lay->layer_off[cfg->n_layer] = lay->n_params;
}

int gpt_layout_build(const gpt_config *cfg, gpt_layout *lay) {
  int rc = gpt_config_validate(cfg);
  if (rc) return rc;
  memset(lay, 0, sizeof *lay);
  lay->cfg = *cfg;
  if (cfg->arch == GPT_ARCH_LLAMA) {
    build_llama(cfg, lay);
    return 0;
  }
  const int C = cfg->n_embd, V = cfg->vocab_size, maxT = cfg->n_positions;
  add_tensor(lay, "wte.weight", 2, V, C, -1);
  add_tensor(lay, "wpe.weight", 2, maxT, C, -1);
  add_tensor(lay, "ln_f.weight", 1, C, 0, -1);
  add_tensor(lay, "ln_f.bias", 1, C, 0, -1);
  lay->stem_end = lay->n_params;
  char nm[GPT_NAME_MAX];
  for (int l = 0; l < cfg->n_layer; l++) {
    lay->layer_off[l] = lay->n_params;
#define T1(suffix, d0) (snprintf(nm, sizeof nm, "h.%d." suffix, l), add_tensor(lay, nm, 1, d0, 0, l))
#define T2(suffix, d0, d1) (snprintf(nm, sizeof nm, "h.%d." suffix, l), add_tensor(lay, nm, 2, d0, d1, l))
    T1("ln_1.weight", C);
    T1("ln_1.bias", C);
    T2("attn.c_attn.weight", C, 3 * C), mark_muon(lay);
    T1("attn.c_attn.bias", 3 * C);
    T2("attn.c_proj.weight", C, C), mark_muon(lay);
    T1("attn.c_proj.bias", C);
    T1("ln_2.weight", C);
    T1("ln_2.bias", C);
    T2("mlp.c_fc.weight", C, 4 * C), mark_muon(lay);
    T1("mlp.c_fc.bias", 4 * C);
    T2("mlp.c_proj.weight", 4 * C, C), mark_muon(lay);
    T1("mlp.c_proj.bias", C);
#undef T1
#undef T2
  }
  lay->layer_off[cfg->n_layer] = lay->n_params;
  return 0;
}

void gpt_llama_layer_ptrs(const gpt_layout *lay, float *base, int l, float *w[GPT_LL_N]) {
  const gpt_config *cfg = &lay->cfg;
  const int stem = cfg->tie_word_embeddings ? 2 : 3, per = cfg->attention_bias ? 12 : 9;
  const gpt_tensor *t = &lay->tensors[stem + per * l]; /* build_llama's order */
  int k = 4;                                           /* after input_layernorm, q, k, v */
  w[GPT_LL_LN1] = base + t[0].offset;
  w[GPT_LL_QKV] = base + t[1].offset;
  w[GPT_LL_QKV_B] = NULL;
  if (cfg->attention_bias) {
    w[GPT_LL_QKV_B] = base + t[k].offset;
    k += 3;
  }
  w[GPT_LL_O] = base + t[k].offset;
  w[GPT_LL_LN2] = base + t[k + 1].offset;
  w[GPT_LL_GU] = base + t[k + 2].offset;
  w[GPT_LL_DOWN] = base + t[k + 4].offset;
}

int gpt_layout_find(const gpt_layout *lay, const char *name) {
  if (lay->cfg.arch == GPT_ARCH_GPT2 && strncmp(name, "transformer.", 12) == 0) name += 12;
  for (int i = 0; i < lay->n_tensors; i++)
    if (strcmp(lay->tensors[i].name, name) == 0) return i;
  return -1;
}

int gpt_layout_decays(const gpt_layout *lay, size_t i) {
  for (int k = 0; k < lay->n_tensors; k++) {
    const gpt_tensor *t = &lay->tensors[k];
    if (i >= t->offset && i < t->offset + t->numel) return t->decay;
  }
  return 0;
}

gpt_muon_shape gpt_muon_shape_of(const gpt_layout *lay, const gpt_tensor *t) {
  gpt_muon_shape s;
  const int conv1d = lay->cfg.arch == GPT_ARCH_GPT2; /* stored [in, out] */
  s.A = conv1d ? t->shape[1] : t->shape[0];
  s.B = conv1d ? t->shape[0] : t->shape[1];
  s.flip = conv1d != (s.A > s.B);
  s.p = s.A > s.B ? s.B : s.A;
  s.q = s.A > s.B ? s.A : s.B;
  return s;
}

int gpt_layout_range_tensors(const gpt_layout *lay, size_t off, size_t len, uint64_t *tlen, int cap) {
  int n = 0;
  size_t at = off, end = off + len;
  if (len == 0 || end < off || end > lay->n_params)
    return dpc_err(DPC_EINVAL, "range [%zu, %zu) is empty or outside the model's %zu parameters", off, end,
                   lay->n_params);
  for (int i = 0; i < lay->n_tensors && at < end; i++) {
    const gpt_tensor *t = &lay->tensors[i];
    if (t->offset + t->numel <= at) continue;
    if (t->offset != at || t->offset + t->numel > end)
      return dpc_err(DPC_EINVAL, "range [%zu, %zu) does not fall on tensor boundaries (tensor %s is [%zu, %zu))", off,
                     end, t->name, t->offset, t->offset + t->numel);
    if (n < cap) tlen[n] = t->numel;
    n++;
    at += t->numel;
  }
  if (at != end) return dpc_err(DPC_EINVAL, "range [%zu, %zu) runs past the last tensor", off, end);
  return n;
}
