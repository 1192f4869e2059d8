/* gpt_layout.c — the canonical flat parameter layout (gpt.h): the config's bounds, the tensors
 * in wire order, lookups by name and by flat range. Backend-independent: gpt.c, every backend
 * and the coordinator call it, and it calls no backend. */
#include "kernels/gpt.h"
#include "common/errors.h"

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
