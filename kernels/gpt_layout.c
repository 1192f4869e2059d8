/* gpt_layout.c — the canonical flat parameter layout, GPT-2 initialisation, the learning
 * rate schedule and AdamW's per-step scalars: the backend-independent parts of the model,
 * which gpt.c and every backend call (and which call no backend). */
#include "kernels/gpt.h"
#include "common/errors.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int gpt_config_validate(const gpt_config *c) {
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
  /* The whole model must stay addressable with int tensor dims and sane memory. */
  double n = (double)c->vocab_size * c->n_embd + (double)c->n_positions * c->n_embd +
             12.0 * c->n_layer * (double)c->n_embd * c->n_embd;
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
  lay->n_params += t->numel;
}

int gpt_layout_build(const gpt_config *cfg, gpt_layout *lay) {
  int rc = gpt_config_validate(cfg);
  if (rc) return rc;
  memset(lay, 0, sizeof *lay);
  lay->cfg = *cfg;
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
    T2("attn.c_attn.weight", C, 3 * C);
    T1("attn.c_attn.bias", 3 * C);
    T2("attn.c_proj.weight", C, C);
    T1("attn.c_proj.bias", C);
    T1("ln_2.weight", C);
    T1("ln_2.bias", C);
    T2("mlp.c_fc.weight", C, 4 * C);
    T1("mlp.c_fc.bias", 4 * C);
    T2("mlp.c_proj.weight", 4 * C, C);
    T1("mlp.c_proj.bias", C);
#undef T1
#undef T2
  }
  lay->layer_off[cfg->n_layer] = lay->n_params;
  return 0;
}

int gpt_layout_find(const gpt_layout *lay, const char *name) {
  if (strncmp(name, "transformer.", 12) == 0) name += 12;
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

/* splitmix64: a small, well-mixed generator; enough for initialisation. */
static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1), never 0 so that log() is finite. */
static double uniform01(uint64_t *s) { return ((splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

void gpt_init_params(const gpt_layout *lay, float *params, uint64_t seed) {
  uint64_t s = seed ^ 0xD1B54A32D192ED03ull;
  const double resid_std = 0.02 / sqrt(2.0 * lay->cfg.n_layer);
  for (int k = 0; k < lay->n_tensors; k++) {
    const gpt_tensor *t = &lay->tensors[k];
    float *p = params + t->offset;
    size_t len = strlen(t->name);
    int is_ln = strstr(t->name, "ln_") != NULL;
    int is_bias = len > 5 && strcmp(t->name + len - 5, ".bias") == 0;
    if (is_bias) {
      memset(p, 0, t->numel * sizeof *p);
    } else if (is_ln) {
      for (size_t i = 0; i < t->numel; i++) p[i] = 1.0f;
    } else {
      double std = strstr(t->name, "c_proj.weight") ? resid_std : 0.02;
      for (size_t i = 0; i < t->numel; i += 2) {
        /* Box-Muller: two normals per pair of uniforms. */
        double u1 = uniform01(&s), u2 = uniform01(&s);
        double r = sqrt(-2.0 * log(u1));
        p[i] = (float)(std * r * cos(2.0 * M_PI * u2));
        if (i + 1 < t->numel) p[i + 1] = (float)(std * r * sin(2.0 * M_PI * u2));
      }
    }
  }
}

float gpt_lr_at(float lr, int warmup, int total_steps, float lr_min_frac, long s) {
  if (s < warmup) return lr * (float)(s + 1) / (float)warmup;
  double p = total_steps > warmup ? (double)(s - warmup) / (double)(total_steps - warmup) : 1.0;
  if (p > 1.0) p = 1.0;
  double f = lr_min_frac;
  return (float)(lr * (f + (1.0 - f) * 0.5 * (1.0 + cos(M_PI * p))));
}

void gpt_adamw_scalars_at(const gpt_adamw_hparams *hp, float lr, int t, gpt_adamw_scalars *s) {
  const double lr_d = lr, b1 = hp->beta1, b2 = hp->beta2;
  s->decay_mul = (float)(1.0 - lr_d * (double)hp->weight_decay);
  s->one_minus_beta1 = (float)(1.0 - b1);
  s->one_minus_beta2 = (float)(1.0 - b2);
  s->neg_step_size = (float)(-(lr_d / (1.0 - pow(b1, t))));
  s->bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
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
