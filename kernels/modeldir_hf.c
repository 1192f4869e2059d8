/* modeldir_hf.c — Hugging Face LlamaConfig / Qwen2Config config.json to and from gpt_config,
 * and the shard list of model.safetensors.index.json (modeldir_hf.h, docs/design.md §6.3).
 *
 * Reading is strict: a key either maps onto gpt_config, or is checked to hold the one value
 * dipaco computes, or is on a short list of keys that do not change the model (token ids,
 * dtype, provenance); anything else is refused by name, since a key dipaco does not know may
 * change what the model computes. Optional keys take HF's defaults. */
#include "kernels/modeldir_hf.h"
#include "common/errors.h"
#include "common/fsutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INDEX (64u << 20)

/* Keys that never change what the model computes. */
static const char *const HARMLESS[] = {
    "architectures", "model_type",   "_name_or_path",  "transformers_version", "torch_dtype", "dtype",
    "bos_token_id",  "eos_token_id", "pad_token_id",   "initializer_range",    "use_cache",   "is_llama_config",
    "tokenizer_class", "max_window_layers", "output_attentions", "output_hidden_states", "return_dict",
    "transformers.js_config"};

/* Keys read or checked below. */
static const char *const KNOWN[] = {
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings",
    "attention_bias", "hidden_act", "head_dim", "mlp_bias", "attention_dropout", "pretraining_tp", "sliding_window",
    "use_sliding_window", "rope_interleaved", "layer_types"};

static int in_list(const char *key, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(key, list[i]) == 0) return 1;
  return 0;
}

/* *out = root[key] as an int; absent: def (or an error when def < 0, i.e. required). */
static int get_int(const char *path, const cJSON *root, const char *key, int def, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v || cJSON_IsNull(v)) {
    if (def < 0) return dpc_err(DPC_EFORMAT, "%s: missing key \"%s\"", path, key);
    *out = def;
    return 0;
  }
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 2147483647.0)
    return dpc_err(DPC_EFORMAT, "%s: \"%s\" must be an integer", path, key);
  *out = (int)v->valuedouble;
  return 0;
}

static int get_num(const char *path, const cJSON *obj, const char *key, double def, int required, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!v || cJSON_IsNull(v)) {
    if (required) return dpc_err(DPC_EFORMAT, "%s: missing key \"%s\"", path, key);
    *out = def;
    return 0;
  }
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return dpc_err(DPC_EFORMAT, "%s: \"%s\" must be a number", path, key);
  *out = v->valuedouble;
  return 0;
}

static int get_bool(const char *path, const cJSON *root, const char *key, int def, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!v || cJSON_IsNull(v)) {
    *out = def;
    return 0;
  }
  if (!cJSON_IsBool(v)) return dpc_err(DPC_EFORMAT, "%s: \"%s\" must be true or false", path, key);
  *out = cJSON_IsTrue(v);
  return 0;
}

/* rope_scaling: null, {"rope_type": "default"} or the four llama3 numbers. */
static int read_rope_scaling(const char *path, const cJSON *root, gpt_config *cfg) {
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  cfg->rope_scaling = GPT_ROPE_DEFAULT;
  if (!rs || cJSON_IsNull(rs)) return 0;
  if (!cJSON_IsObject(rs)) return dpc_err(DPC_EFORMAT, "%s: \"rope_scaling\" must be null or an object", path);
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
  if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type"); /* the older spelling */
  const char *type = cJSON_IsString(t) ? t->valuestring : "";
  if (strcmp(type, "default") == 0) return 0;
  if (strcmp(type, "llama3") != 0)
    return dpc_err(DPC_EUNSUPPORTED, "%s: rope_scaling of type \"%s\" is not supported (only \"llama3\" and none)",
                   path, type);
  for (const cJSON *e = rs->child; e; e = e->next)
    if (!in_list(e->string, (const char *const[]){"rope_type", "type", "factor", "low_freq_factor",
                                                    "high_freq_factor", "original_max_position_embeddings"}, 6))
      return dpc_err(DPC_EUNSUPPORTED, "%s: rope_scaling.%s is not supported", path, e->string);
  double orig = 0.0;
  int rc;
  cfg->rope_scaling = GPT_ROPE_LLAMA3;
  if ((rc = get_num(path, rs, "factor", 0, 1, &cfg->rope_factor)) ||
      (rc = get_num(path, rs, "low_freq_factor", 0, 1, &cfg->rope_low_freq_factor)) ||
      (rc = get_num(path, rs, "high_freq_factor", 0, 1, &cfg->rope_high_freq_factor)) ||
      (rc = get_num(path, rs, "original_max_position_embeddings", 0, 1, &orig)))
    return rc;
  if (orig != floor(orig) || orig < 1 || orig > 1 << 24)
    return dpc_err(DPC_EFORMAT, "%s: rope_scaling.original_max_position_embeddings must be a positive integer", path);
  cfg->rope_original_max_position_embeddings = (int)orig;
  return 0;
}

/* The keys that must hold the one value dipaco computes. */
static int check_fixed(const char *path, const cJSON *root, int qwen2, const gpt_config *cfg) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
  if (v && !(cJSON_IsString(v) && strcmp(v->valuestring, "silu") == 0))
    return dpc_err(DPC_EUNSUPPORTED, "%s: hidden_act must be \"silu\" (SwiGLU)", path);
  int b = 0, rc;
  if ((rc = get_bool(path, root, "mlp_bias", 0, &b))) return rc;
  if (b) return dpc_err(DPC_EUNSUPPORTED, "%s: mlp_bias true is not supported", path);
  if ((rc = get_bool(path, root, "rope_interleaved", 0, &b))) return rc;
  if (b) return dpc_err(DPC_EUNSUPPORTED, "%s: rope_interleaved true is not supported (rotate-half only)", path);
  if ((rc = get_bool(path, root, "use_sliding_window", 0, &b))) return rc;
  if (b) return dpc_err(DPC_EUNSUPPORTED, "%s: use_sliding_window true is not supported", path);
  v = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
  if (!qwen2 && v && !cJSON_IsNull(v))
    return dpc_err(DPC_EUNSUPPORTED, "%s: sliding_window is not supported (must be null)", path);
  v = cJSON_GetObjectItemCaseSensitive(root, "layer_types"); /* newer configs: every layer's attention kind */
  if (v && !cJSON_IsNull(v)) {
    int all_full = cJSON_IsArray(v);
    for (const cJSON *e = cJSON_IsArray(v) ? v->child : NULL; e; e = e->next)
      all_full &= cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0;
    if (!all_full)
      return dpc_err(DPC_EUNSUPPORTED, "%s: layer_types must all be \"full_attention\" (no sliding windows)", path);
  }
  double x = 0.0;
  if ((rc = get_num(path, root, "attention_dropout", 0.0, 0, &x))) return rc;
  if (x != 0.0) return dpc_err(DPC_EUNSUPPORTED, "%s: attention_dropout %g is not supported (must be 0)", path, x);
  if ((rc = get_num(path, root, "pretraining_tp", 1.0, 0, &x))) return rc;
  if (x != 1.0) return dpc_err(DPC_EUNSUPPORTED, "%s: pretraining_tp %g is not supported (must be 1)", path, x);
  int hd = 0;
  if (cfg->n_head > 0 && (rc = get_int(path, root, "head_dim", cfg->n_embd / cfg->n_head, &hd))) return rc;
  if (cfg->n_head > 0 && (hd != cfg->n_embd / cfg->n_head || cfg->n_embd % cfg->n_head != 0))
    return dpc_err(DPC_EUNSUPPORTED, "%s: head_dim %d is not hidden_size / num_attention_heads (%d / %d), which "
                   "dipaco requires", path, hd, cfg->n_embd, cfg->n_head);
  return 0;
}

int modeldir_hf_read_config(const char *path, const cJSON *root, gpt_config *cfg) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  const int qwen2 = cJSON_IsString(mt) && strcmp(mt->valuestring, "qwen2") == 0;
  for (const cJSON *e = root->child; e; e = e->next)
    if (!in_list(e->string, HARMLESS, sizeof HARMLESS / sizeof *HARMLESS) &&
        !in_list(e->string, KNOWN, sizeof KNOWN / sizeof *KNOWN))
      return dpc_err(DPC_EUNSUPPORTED, "%s: key \"%s\" is not supported (dipaco cannot tell whether it changes the "
                     "model; remove it if it does not)", path, e->string);
  memset(cfg, 0, sizeof *cfg);
  cfg->arch = GPT_ARCH_LLAMA;
  int rc;
  if ((rc = get_int(path, root, "num_hidden_layers", -1, &cfg->n_layer)) ||
      (rc = get_int(path, root, "num_attention_heads", -1, &cfg->n_head)) ||
      (rc = get_int(path, root, "hidden_size", -1, &cfg->n_embd)) ||
      (rc = get_int(path, root, "max_position_embeddings", -1, &cfg->n_positions)) ||
      (rc = get_int(path, root, "vocab_size", -1, &cfg->vocab_size)) ||
      (rc = get_int(path, root, "intermediate_size", -1, &cfg->intermediate_size)) ||
      (rc = get_int(path, root, "num_key_value_heads", cfg->n_head > 0 ? cfg->n_head : 1, &cfg->n_kv_head)) ||
      (rc = get_bool(path, root, "tie_word_embeddings", 0, &cfg->tie_word_embeddings)) ||
      (rc = get_num(path, root, "rms_norm_eps", 1e-6, 0, &cfg->rms_norm_eps)) ||
      (rc = get_num(path, root, "rope_theta", 10000.0, 0, &cfg->rope_theta)) ||
      (rc = read_rope_scaling(path, root, cfg)) || (rc = check_fixed(path, root, qwen2, cfg)))
    return rc;
  if (qwen2) {
    cfg->attention_bias = 1; /* Qwen2's q/k/v projections always have biases, o_proj none */
  } else {
    int bias = 0;
    if ((rc = get_bool(path, root, "attention_bias", 0, &bias))) return rc;
    if (bias)
      return dpc_err(DPC_EUNSUPPORTED, "%s: attention_bias true in a llama config also gives o_proj a bias, which "
                     "dipaco does not compute (q/k/v biases alone are model_type \"qwen2\")", path);
  }
  if (gpt_config_validate(cfg)) {
    char why[256];
    snprintf(why, sizeof why, "%s", dpc_errmsg());
    return dpc_err(DPC_EINVAL, "%s: %s", path, why);
  }
  return 0;
}

/* The shortest %g spelling of x that reads back as x. */
static void fmt_double(char *buf, size_t n, double x) {
  for (int prec = 6; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", n - strlen(buf) - 1); /* a JSON float, as HF writes */
}

int modeldir_hf_config_json(const gpt_config *c, char *buf, size_t cap) {
  const int qwen2 = c->attention_bias;
  char eps[40], theta[40], rope[512] = "null";
  fmt_double(eps, sizeof eps, c->rms_norm_eps);
  fmt_double(theta, sizeof theta, c->rope_theta);
  if (c->rope_scaling == GPT_ROPE_LLAMA3) {
    char f[40], lo[40], hi[40];
    fmt_double(f, sizeof f, c->rope_factor);
    fmt_double(lo, sizeof lo, c->rope_low_freq_factor);
    fmt_double(hi, sizeof hi, c->rope_high_freq_factor);
    snprintf(rope, sizeof rope,
             "{\n    \"factor\": %s,\n    \"high_freq_factor\": %s,\n    \"low_freq_factor\": %s,\n"
             "    \"original_max_position_embeddings\": %d,\n    \"rope_type\": \"llama3\"\n  }",
             f, hi, lo, c->rope_original_max_position_embeddings);
  }
  char extra[256];
  if (qwen2)
    snprintf(extra, sizeof extra, "  \"max_window_layers\": %d,\n  \"sliding_window\": null,\n"
             "  \"use_sliding_window\": false,\n", c->n_layer);
  else
    snprintf(extra, sizeof extra, "  \"attention_bias\": false,\n  \"head_dim\": %d,\n  \"mlp_bias\": false,\n"
             "  \"pretraining_tp\": 1,\n", c->n_embd / c->n_head);
  int n = snprintf(buf, cap,
                   "{\n"
                   "  \"architectures\": [\"%s\"],\n"
                   "  \"attention_dropout\": 0.0,\n"
                   "%s"
                   "  \"hidden_act\": \"silu\",\n"
                   "  \"hidden_size\": %d,\n"
                   "  \"initializer_range\": 0.02,\n"
                   "  \"intermediate_size\": %d,\n"
                   "  \"max_position_embeddings\": %d,\n"
                   "  \"model_type\": \"%s\",\n"
                   "  \"num_attention_heads\": %d,\n"
                   "  \"num_hidden_layers\": %d,\n"
                   "  \"num_key_value_heads\": %d,\n"
                   "  \"rms_norm_eps\": %s,\n"
                   "  \"rope_scaling\": %s,\n"
                   "  \"rope_theta\": %s,\n"
                   "  \"tie_word_embeddings\": %s,\n"
                   "  \"torch_dtype\": \"float32\",\n"
                   "  \"use_cache\": true,\n"
                   "  \"vocab_size\": %d\n"
                   "}\n",
                   qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM", extra, c->n_embd, c->intermediate_size,
                   c->n_positions, qwen2 ? "qwen2" : "llama", c->n_head, c->n_layer, c->n_kv_head, eps, rope, theta,
                   c->tie_word_embeddings ? "true" : "false", c->vocab_size);
  if (n < 0 || (size_t)n >= cap) return dpc_err(DPC_EINVAL, "config.json does not fit in %zu bytes", cap);
  return n;
}

static void free_list(char **files, int n) {
  for (int i = 0; i < n; i++) free(files[i]);
  free(files);
}

int modeldir_hf_shards(const char *dir, char ***files, int *n) {
  *files = NULL;
  *n = 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, MODELDIR_INDEX);
  void *buf;
  size_t len;
  int rc = dpc_read_file(path, MAX_INDEX, &buf, &len);
  if (rc) return rc;
  cJSON *root = cJSON_ParseWithLength(buf, len);
  free(buf);
  const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
  if (!cJSON_IsObject(wm) || !wm->child) {
    cJSON_Delete(root);
    return dpc_err(DPC_EFORMAT, "%s: not JSON with a non-empty \"weight_map\" object", path);
  }
  char **list = NULL;
  int cnt = 0;
  for (const cJSON *e = wm->child; e && !rc; e = e->next) {
    const char *f = cJSON_IsString(e) ? e->valuestring : NULL;
    if (!f || !*f || strchr(f, '/') || strcmp(f, ".") == 0 || strcmp(f, "..") == 0) {
      rc = dpc_err(DPC_EFORMAT, "%s: weight_map[\"%.100s\"] must be a plain file name", path, e->string);
      break;
    }
    int seen = 0;
    for (int i = 0; i < cnt && !seen; i++) seen = strcmp(list[i], f) == 0;
    if (seen) continue;
    char **grown = realloc(list, (size_t)(cnt + 1) * sizeof *list);
    char *dup = grown ? strdup(f) : NULL;
    if (grown) list = grown;
    if (!dup) {
      rc = dpc_err(DPC_ENOMEM, "%s: out of memory", path);
      break;
    }
    list[cnt++] = dup;
  }
  cJSON_Delete(root);
  if (rc) {
    free_list(list, cnt);
    return rc;
  }
  *files = list;
  *n = cnt;
  return 0;
}
