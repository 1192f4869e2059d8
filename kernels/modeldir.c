/* modeldir.c — model directory (safetensors + HF config.json) load and save, for GPT-2 and the
 * Llama family (whose config.json side is modeldir_hf.c). docs/design.md §6.3. */
#include "kernels/modeldir.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/safetensors.h"
#include "kernels/modeldir_hf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *join(const char *dir, const char *file) {
  size_t n = strlen(dir) + strlen(file) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, file);
  return p;
}

static int get_int(const char *path, const cJSON *root, const char *key, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v) return dpc_err(DPC_EFORMAT, "%s: missing key \"%s\"", path, key);
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 2147483647.0)
    return dpc_err(DPC_EFORMAT, "%s: \"%s\" must be an integer", path, key);
  *out = (int)v->valuedouble;
  return 0;
}

static int check_config(const char *path, const cJSON *root, gpt_config *cfg) {
  if (!cJSON_IsObject(root)) return dpc_err(DPC_EFORMAT, "%s: not a JSON object", path);
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  if (cJSON_IsString(mt) && (strcmp(mt->valuestring, "llama") == 0 || strcmp(mt->valuestring, "qwen2") == 0))
    return modeldir_hf_read_config(path, root, cfg);
  if (mt && !(cJSON_IsString(mt) && strcmp(mt->valuestring, "gpt2") == 0))
    return dpc_err(DPC_EUNSUPPORTED, "%s: model_type %s%s%s is not supported (\"gpt2\", \"llama\" or \"qwen2\")", path,
                   cJSON_IsString(mt) ? "\"" : "", cJSON_IsString(mt) ? mt->valuestring : "(not a string)",
                   cJSON_IsString(mt) ? "\"" : "");
  memset(cfg, 0, sizeof *cfg);
  int rc;
  if ((rc = get_int(path, root, "n_layer", &cfg->n_layer)) || (rc = get_int(path, root, "n_head", &cfg->n_head)) ||
      (rc = get_int(path, root, "n_embd", &cfg->n_embd)) ||
      (rc = get_int(path, root, "n_positions", &cfg->n_positions)) ||
      (rc = get_int(path, root, "vocab_size", &cfg->vocab_size)))
    return rc;
  const cJSON *v;
  v = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
  if (v && !(cJSON_IsString(v) && (strcmp(v->valuestring, "gelu_new") == 0 ||
                                   strcmp(v->valuestring, "gelu_pytorch_tanh") == 0)))
    return dpc_err(DPC_EUNSUPPORTED, "%s: activation_function must be \"gelu_new\" (GELU, tanh approximation)", path);
  v = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
  if (v && !(cJSON_IsNumber(v) && fabs(v->valuedouble - 1e-5) < 1e-12))
    return dpc_err(DPC_EUNSUPPORTED, "%s: layer_norm_epsilon must be 1e-05", path);
  v = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
  if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 4.0 * cfg->n_embd))
    return dpc_err(DPC_EUNSUPPORTED, "%s: n_inner must be null or 4*n_embd", path);
  v = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
  if (v && cJSON_IsFalse(v)) return dpc_err(DPC_EUNSUPPORTED, "%s: untied word embeddings are not supported", path);
  v = cJSON_GetObjectItemCaseSensitive(root, "scale_attn_weights");
  if (v && cJSON_IsFalse(v)) return dpc_err(DPC_EUNSUPPORTED, "%s: scale_attn_weights=false is not supported", path);
  v = cJSON_GetObjectItemCaseSensitive(root, "scale_attn_by_inverse_layer_idx");
  if (v && cJSON_IsTrue(v))
    return dpc_err(DPC_EUNSUPPORTED, "%s: scale_attn_by_inverse_layer_idx=true is not supported", path);
  if (gpt_config_validate(cfg)) {
    char why[256];
    snprintf(why, sizeof why, "%s", dpc_errmsg()); /* dpc_err reuses the detail buffer */
    return dpc_err(DPC_EINVAL, "%s: %s", path, why);
  }
  return 0;
}

int modeldir_read_config(const char *dir, gpt_config *cfg) {
  char *path = join(dir, MODELDIR_CONFIG);
  if (!path) return dpc_err(DPC_ENOMEM, "out of memory");
  void *buf;
  size_t n;
  int rc = dpc_read_file(path, MODELDIR_MAX_CONFIG, &buf, &n);
  if (!rc) {
    cJSON *root = cJSON_ParseWithLength(buf, n);
    rc = root ? check_config(path, root, cfg) : dpc_err(DPC_EFORMAT, "%s: not valid JSON", path);
    cJSON_Delete(root);
    free(buf);
  }
  free(path);
  return rc;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t len = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && len < n; d++)
    len += (size_t)snprintf(buf + len, n - len, d ? ", %lld" : "%lld", (long long)shape[d]);
  if (len < n) snprintf(buf + len, n - len, "]");
}

/* Non-parameter tensors that HF GPT-2 checkpoints may carry. */
static int is_buffer(const char *name) {
  static const char *const suffixes[] = {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"};
  if (strncmp(name, "h.", 2) != 0 && strncmp(name, "model.layers.", 13) != 0) return 0;
  size_t n = strlen(name);
  for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
    size_t m = strlen(suffixes[i]);
    if (n > m && strcmp(name + n - m, suffixes[i]) == 0) return 1;
  }
  return 0;
}

/* lm_head.weight must be the tied wte: compare in chunks. */
static int check_lm_head(const char *path, st_file *st, int i, const gpt_layout *lay, const float *params) {
  const st_tensor *t = st_get(st, i);
  const gpt_tensor *wte = &lay->tensors[0];
  if (t->ndim != 2 || t->shape[0] != wte->shape[0] || t->shape[1] != wte->shape[1])
    return dpc_err(DPC_ESHAPE, "%s: lm_head.weight does not have the shape of %s", path, wte->name);
  float buf[4096];
  for (uint64_t done = 0; done < t->numel;) {
    uint64_t m = t->numel - done > 4096 ? 4096 : t->numel - done;
    int rc = st_read_f32(st, i, done, m, buf);
    if (rc) return rc;
    if (memcmp(buf, params + wte->offset + done, (size_t)m * sizeof *buf) != 0)
      return dpc_err(DPC_EUNSUPPORTED, "%s: lm_head.weight differs from %s, but config.json ties them", path,
                     wte->name);
    done += m;
  }
  return 0;
}

/* What loading a directory's files has found so far. */
typedef struct {
  const gpt_layout *lay;
  float *params;
  unsigned char *found; /* per layout tensor */
  char lm_head_file[4096]; /* a tied model's stored lm_head.weight, checked once all is read */
  int lm_head;
} load_state;

static int bad_shape(const char *path, const st_tensor *t, const gpt_tensor *g, const gpt_config *c) {
  int64_t want[2] = {g->shape[0], g->shape[1]};
  char have_s[128], want_s[64];
  shape_str(have_s, sizeof have_s, t->ndim, t->shape);
  shape_str(want_s, sizeof want_s, g->ndim, want);
  if (c->arch == GPT_ARCH_LLAMA)
    return dpc_err(DPC_ESHAPE,
                   "%s: tensor \"%s\" has shape %s but config.json (hidden_size=%d, intermediate_size=%d, "
                   "num_attention_heads=%d, num_key_value_heads=%d, vocab_size=%d) needs %s ([out, in] linear weights)",
                   path, t->name, have_s, c->n_embd, c->intermediate_size, c->n_head, c->n_kv_head, c->vocab_size,
                   want_s);
  return dpc_err(DPC_ESHAPE,
                 "%s: tensor \"%s\" has shape %s but config.json (n_embd=%d, vocab_size=%d, n_positions=%d) "
                 "needs %s (linear weights in Conv1D [in, out] layout)",
                 path, t->name, have_s, c->n_embd, c->vocab_size, c->n_positions, want_s);
}

/* One tensor i of st, found as layout tensor k. */
static int load_tensor(const char *path, st_file *st, int i, int k, load_state *ls) {
  const st_tensor *t = st_get(st, i);
  const gpt_tensor *g = &ls->lay->tensors[k];
  if (ls->found[k])
    return dpc_err(DPC_EFORMAT, "%s: tensor \"%s\" is stored twice (in two shards, or with and without the "
                   "transformer. prefix)", path, g->name);
  ls->found[k] = 1;
  if (t->ndim != g->ndim || t->shape[0] != g->shape[0] || (g->ndim == 2 && t->shape[1] != g->shape[1]))
    return bad_shape(path, t, g, &ls->lay->cfg);
  if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
    return dpc_err(DPC_EUNSUPPORTED, "%s: tensor \"%s\" has dtype %s; parameters must be F32, BF16 or F16", path,
                   t->name, st_dtype_name(t->dtype));
  float *dst = ls->params + g->offset;
  int rc = st_read_f32(st, i, 0, g->numel, dst);
  for (size_t e = 0; !rc && e < g->numel; e++)
    if (!isfinite(dst[e])) rc = dpc_err(DPC_ENUMERIC, "%s: tensor \"%s\" element %zu is not finite", path, t->name, e);
  return rc;
}

/* Every tensor of one safetensors file. */
static int load_file(const char *path, load_state *ls) {
  st_file *st;
  int rc = st_open(path, &st);
  if (rc) return rc;
  const gpt_config *c = &ls->lay->cfg;
  for (int i = 0; i < st_num_tensors(st) && !rc; i++) {
    const st_tensor *t = st_get(st, i);
    const char *name = c->arch == GPT_ARCH_GPT2 && strncmp(t->name, "transformer.", 12) == 0 ? t->name + 12 : t->name;
    int k = gpt_layout_find(ls->lay, name);
    if (k >= 0) {
      rc = load_tensor(path, st, i, k, ls);
    } else if (strcmp(t->name, "lm_head.weight") == 0) {
      if (ls->lm_head) rc = dpc_err(DPC_EFORMAT, "%s: tensor \"lm_head.weight\" is stored twice", path);
      snprintf(ls->lm_head_file, sizeof ls->lm_head_file, "%s", path);
      ls->lm_head = 1;
    } else if (!is_buffer(name)) {
      rc = dpc_err(DPC_EFORMAT,
                   "%s: tensor \"%.100s\" is not part of the %s model config.json describes (%d layers%s); "
                   "do config.json and the weights belong together?",
                   path, t->name, gpt_arch_name(c->arch), c->n_layer,
                   c->arch == GPT_ARCH_LLAMA && !c->attention_bias ? ", no attention biases" : "");
    }
  }
  st_close(st);
  return rc;
}

/* The tensors of `files` (full paths) into params; every layout tensor must be found (a missing
 * one is reported against `where`: the file, or the index naming the shards). */
static int load_weights(char *const *files, int nfiles, const char *where, const gpt_layout *lay, float *params) {
  load_state *ls = calloc(1, sizeof *ls);
  unsigned char *found = calloc((size_t)lay->n_tensors, 1);
  int rc = 0;
  if (!ls || !found) rc = dpc_err(DPC_ENOMEM, "%s: out of memory", files[0]);
  if (ls) *ls = (load_state){.lay = lay, .params = params, .found = found};
  for (int f = 0; f < nfiles && !rc; f++) rc = load_file(files[f], ls);
  for (int k = 0; k < lay->n_tensors && !rc; k++)
    if (!found[k]) {
      int missing = 0;
      for (int q = k; q < lay->n_tensors; q++) missing += !found[q];
      rc = dpc_err(DPC_ENOENT, "%s: tensor \"%s\" is missing (%d of the %d tensors config.json implies are missing)",
                   where, lay->tensors[k].name, missing, lay->n_tensors);
    }
  if (!rc && ls->lm_head) {
    st_file *st;
    if (!(rc = st_open(ls->lm_head_file, &st))) {
      rc = check_lm_head(ls->lm_head_file, st, st_find(st, "lm_head.weight"), lay, params);
      st_close(st);
    }
  }
  free(found);
  free(ls);
  return rc;
}

/* The weight files of dir: model.safetensors when present (as HF prefers it), else the shards
 * that model.safetensors.index.json names. Full paths into *files (free each and the array). */
static int weight_files(const char *dir, char ***files, int *n) {
  char *single = join(dir, MODELDIR_WEIGHTS);
  if (!single) return dpc_err(DPC_ENOMEM, "out of memory");
  char *idx = join(dir, MODELDIR_INDEX);
  int have_index = idx && access(idx, F_OK) == 0;
  free(idx);
  if (access(single, F_OK) == 0 || !have_index) {
    *files = malloc(sizeof **files);
    if (!*files) {
      free(single);
      return dpc_err(DPC_ENOMEM, "out of memory");
    }
    (*files)[0] = single;
    *n = 1;
    return 0;
  }
  free(single);
  int rc = modeldir_hf_shards(dir, files, n);
  for (int i = 0; i < *n && !rc; i++) {
    char *full = join(dir, (*files)[i]);
    if (!full) rc = dpc_err(DPC_ENOMEM, "out of memory");
    else {
      free((*files)[i]);
      (*files)[i] = full;
    }
  }
  return rc;
}

int modeldir_load(const char *dir, gpt_config *cfg, float **params) {
  *params = NULL;
  int rc = modeldir_read_config(dir, cfg);
  if (rc) return rc;
  gpt_layout *lay = malloc(sizeof *lay);
  char **files = NULL;
  int nfiles = 0;
  float *p = NULL;
  if (!lay) return dpc_err(DPC_ENOMEM, "out of memory");
  if ((rc = gpt_layout_build(cfg, lay)) || (rc = weight_files(dir, &files, &nfiles))) goto out;
  p = malloc(lay->n_params * sizeof *p);
  if (!p) {
    rc = dpc_err(DPC_ENOMEM, "%s: cannot allocate %zu parameters", dir, lay->n_params);
    goto out;
  }
  char *idx = join(dir, MODELDIR_INDEX);
  const int sharded = strcmp(files[0] + strlen(dir) + 1, MODELDIR_WEIGHTS) != 0;
  rc = idx ? load_weights(files, nfiles, sharded ? idx : files[0], lay, p) : dpc_err(DPC_ENOMEM, "out of memory");
  free(idx);
out:
  if (rc) free(p);
  else *params = p;
  for (int i = 0; i < nfiles; i++) free(files[i]);
  free(files);
  free(lay);
  return rc;
}

/* GPT-2's config.json (HF GPT2Config) into json[cap]; returns the length. */
static int gpt2_config_json(const gpt_config *cfg, char *json, size_t cap) {
  return snprintf(json, cap,
                   "{\n"
                   "  \"activation_function\": \"gelu_new\",\n"
                   "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
                   "  \"attn_pdrop\": 0.0,\n"
                   "  \"embd_pdrop\": 0.0,\n"
                   "  \"initializer_range\": 0.02,\n"
                   "  \"layer_norm_epsilon\": 1e-05,\n"
                   "  \"model_type\": \"gpt2\",\n"
                   "  \"n_ctx\": %d,\n"
                   "  \"n_embd\": %d,\n"
                   "  \"n_head\": %d,\n"
                   "  \"n_inner\": null,\n"
                   "  \"n_layer\": %d,\n"
                   "  \"n_positions\": %d,\n"
                   "  \"resid_pdrop\": 0.0,\n"
                   "  \"tie_word_embeddings\": true,\n"
                   "  \"torch_dtype\": \"float32\",\n"
                   "  \"vocab_size\": %d\n"
                   "}\n",
                   cfg->n_positions, cfg->n_embd, cfg->n_head, cfg->n_layer, cfg->n_positions, cfg->vocab_size);
}

int modeldir_save(const char *dir, const gpt_config *cfg, const float *params) {
  char json[2048];
  int n;
  gpt_layout *lay = malloc(sizeof *lay);
  st_write_tensor *ts = NULL;
  char *wpath = NULL, *cpath = NULL;
  int rc;
  if (!lay) return dpc_err(DPC_ENOMEM, "out of memory");
  if ((rc = gpt_layout_build(cfg, lay))) goto out;
  /* config.json first: a config that cannot be written leaves the directory untouched. */
  n = cfg->arch == GPT_ARCH_LLAMA ? modeldir_hf_config_json(cfg, json, sizeof json)
                                  : gpt2_config_json(cfg, json, sizeof json);
  if (n < 0) {
    rc = n;
    goto out;
  }
  if ((rc = dpc_mkdir_p(dir))) goto out;
  ts = calloc((size_t)lay->n_tensors, sizeof *ts);
  wpath = join(dir, MODELDIR_WEIGHTS);
  cpath = join(dir, MODELDIR_CONFIG);
  if (!ts || !wpath || !cpath) {
    rc = dpc_err(DPC_ENOMEM, "out of memory");
    goto out;
  }
  for (int k = 0; k < lay->n_tensors; k++) {
    const gpt_tensor *g = &lay->tensors[k];
    ts[k].name = g->name;
    ts[k].dtype = ST_F32;
    ts[k].ndim = g->ndim;
    ts[k].shape[0] = g->shape[0];
    ts[k].shape[1] = g->shape[1];
    ts[k].data = params + g->offset;
  }
  static const char *const meta[] = {"format", "pt"}; /* transformers requires format=pt */
  if ((rc = st_write(wpath, ts, lay->n_tensors, meta, 1))) goto out;
  rc = dpc_write_file_atomic(cpath, json, (size_t)n);
out:
  free(lay);
  free(ts);
  free(wpath);
  free(cpath);
  return rc;
}
