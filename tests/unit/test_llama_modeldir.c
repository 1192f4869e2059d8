/* test_llama_modeldir.c — Hugging Face Llama-family model directories in and out
 * (kernels/modeldir.h, docs/design.md §6.3). Writes directories the way HF tools do, with
 * names spelled out here from HF's LlamaForCausalLM (not taken from the layout under test):
 * a BF16 checkpoint sharded over two files with model.safetensors.index.json, untied, GQA,
 * llama3 RoPE scaling, a stored rotary_emb.inv_freq buffer and harmless extra keys; a tied
 * F16 single file (with and without a stored lm_head.weight); a Qwen2 config. Each import is
 * checked value by value, exported, and the export's tensor names, shapes and config.json keys
 * compared with HF's. Then bad inputs: every unsupported config key, a missing tensor, a wrong
 * shape, a missing shard, a differing tied head: each a clear error naming the key, file or
 * tensor, and an import-then-export that fails writes nothing. */
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/safetensors.h"
#include "kernels/gpt.h"
#include "kernels/modeldir.h"
#include "tests/unit/test.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { L = 2, C = 16, NH = 4, NKV = 2, D = C / NH, I = 24, V = 40, MAXT = 32 };
#define MAXT_S 64

static char root[] = "/tmp/dpc_llama_modeldir_XXXXXX";

typedef struct {
  char name[96];
  int ndim, shape[2];
  float *data;
} hf_tensor;

static hf_tensor tens[64];
static int ntens;
static uint64_t rng = 99;

/* Multiples of 1/256 in [-0.5, 0.5): exact in BF16 and F16, so every dtype must load the
 * very floats written. */
static float rnd(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((int)(rng >> 56) - 128) / 256.0f;
}

static void add(const char *name, int d0, int d1) {
  hf_tensor *t = &tens[ntens++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = d1 ? 2 : 1;
  t->shape[0] = d0;
  t->shape[1] = d1 ? d1 : 1;
  t->data = malloc((size_t)d0 * t->shape[1] * sizeof(float));
  for (int i = 0; i < d0 * t->shape[1]; i++) t->data[i] = rnd();
}

/* HF's LlamaForCausalLM state dict for the test shape (biases: Qwen2's q/k/v). */
static void make_model(int tied, int bias) {
  for (int i = 0; i < ntens; i++) free(tens[i].data);
  ntens = 0;
  char n[96];
  add("model.embed_tokens.weight", V, C);
  add("model.norm.weight", C, 0);
  if (!tied) add("lm_head.weight", V, C);
  for (int l = 0; l < L; l++) {
#define A(suffix, d0, d1) (snprintf(n, sizeof n, "model.layers.%d." suffix, l), add(n, d0, d1))
    A("input_layernorm.weight", C, 0);
    A("self_attn.q_proj.weight", NH * D, C);
    A("self_attn.k_proj.weight", NKV * D, C);
    A("self_attn.v_proj.weight", NKV * D, C);
    if (bias) {
      A("self_attn.q_proj.bias", NH * D, 0);
      A("self_attn.k_proj.bias", NKV * D, 0);
      A("self_attn.v_proj.bias", NKV * D, 0);
    }
    A("self_attn.o_proj.weight", C, NH * D);
    A("post_attention_layernorm.weight", C, 0);
    A("mlp.gate_proj.weight", I, C);
    A("mlp.up_proj.weight", I, C);
    A("mlp.down_proj.weight", C, I);
#undef A
  }
}

static const hf_tensor *find(const char *name) {
  for (int i = 0; i < ntens; i++)
    if (strcmp(tens[i].name, name) == 0) return &tens[i];
  return NULL;
}

/* x (a multiple of 1/256 in [-0.5, 0.5), exact in F16) as an F16 bit pattern. */
static uint16_t f16_of(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  if ((b & 0x7fffffff) == 0) return (uint16_t)((b >> 16) & 0x8000);
  uint32_t exp = (b >> 23) & 0xff, man = b & 0x7fffff;
  return (uint16_t)(((b >> 16) & 0x8000) | ((exp - 112) << 10) | (man >> 13));
}

/* Tensors [from, to) of tens (skipping `skip`, `wrong` stored transposed) into dir/file as dt;
 * with inv_freq, a layer's rotary buffer too. */
static int write_shard(const char *dir, const char *file, int from, int to, st_dtype dt, const char *skip,
                       const char *wrong, int inv_freq) {
  static st_write_tensor ts[64];
  static uint16_t buf[1 << 16];
  static float inv[D / 2];
  size_t used = 0;
  int n = 0;
  for (int i = to - 1; i >= from; i--) { /* reverse order: loading is by name */
    const hf_tensor *h = &tens[i];
    if (skip && strcmp(h->name, skip) == 0) continue;
    st_write_tensor *t = &ts[n++];
    int swap = wrong && strcmp(h->name, wrong) == 0;
    *t = (st_write_tensor){h->name, dt, h->ndim, {swap ? h->shape[1] : h->shape[0], swap ? h->shape[0] : h->shape[1]},
                           h->data};
    size_t numel = (size_t)h->shape[0] * h->shape[1];
    if (dt != ST_F32) {
      for (size_t e = 0; e < numel; e++)
        buf[used + e] = dt == ST_BF16 ? st_f32_to_bf16(h->data[e]) : f16_of(h->data[e]);
      t->data = buf + used;
      used += numel;
    }
  }
  if (inv_freq) ts[n++] = (st_write_tensor){"model.layers.0.self_attn.rotary_emb.inv_freq", ST_F32, 1, {D / 2}, inv};
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  const char *meta[] = {"format", "pt"};
  return st_write(path, ts, n, meta, 1);
}

static int write_text(const char *dir, const char *file, const char *text) {
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  return dpc_write_file_atomic(path, text, strlen(text));
}

static const char *CONFIG_LLAMA =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008], \"head_dim\": 4, \"hidden_act\": \"silu\","
    " \"hidden_size\": 16, \"initializer_range\": 0.02, \"intermediate_size\": 24, \"max_position_embeddings\": 32,"
    " \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 4, \"num_hidden_layers\": 2,"
    " \"num_key_value_heads\": 2, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0,"
    " \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8,"
    " \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": %s, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.45.0\", \"use_cache\": true, \"vocab_size\": 40%s}";

static void config(char *buf, size_t n, int tied, const char *extra) {
  snprintf(buf, n, CONFIG_LLAMA, tied ? "true" : "false", extra ? extra : "");
}

/* Import dir, and on success export it to out: the pattern of a conversion tool. */
static int import_export(const char *dir, const char *out, gpt_config *cfg, float **params) {
  int rc = modeldir_load(dir, cfg, params);
  if (rc) return rc;
  return modeldir_save(out, cfg, *params);
}

static void check_values(const gpt_config *cfg, const float *params) {
  static gpt_layout lay;
  CHECK_EQ_INT(gpt_layout_build(cfg, &lay), 0);
  CHECK_EQ_INT(lay.n_tensors, ntens);
  int bad = 0;
  for (int i = 0; i < ntens; i++) {
    int k = gpt_layout_find(&lay, tens[i].name);
    CHECK(k >= 0);
    if (k < 0) continue;
    CHECK_EQ_INT(lay.tensors[k].shape[0], tens[i].shape[0]);
    for (size_t e = 0; e < lay.tensors[k].numel; e++)
      bad += params[lay.tensors[k].offset + e] != tens[i].data[e];
  }
  CHECK_EQ_INT(bad, 0);
}

/* The export's tensors are exactly HF's names and shapes, and its config.json has HF's keys. */
static void check_export(const char *out, const char *model_type, int tied) {
  char path[1100];
  snprintf(path, sizeof path, "%s/model.safetensors", out);
  st_file *st = NULL;
  CHECK_EQ_INT(st_open(path, &st), 0);
  if (!st) return;
  CHECK_EQ_INT(st_num_tensors(st), ntens);
  for (int i = 0; i < ntens; i++) {
    int j = st_find(st, tens[i].name);
    CHECK(j >= 0);
    if (j >= 0) {
      CHECK_EQ_INT(st_get(st, j)->shape[0], tens[i].shape[0]);
      CHECK_EQ_INT(st_get(st, j)->dtype, ST_F32);
    }
  }
  st_close(st);
  snprintf(path, sizeof path, "%s/config.json", out);
  void *buf;
  size_t n;
  CHECK_EQ_INT(dpc_read_file(path, 1 << 20, &buf, &n), 0);
  cJSON *j = cJSON_ParseWithLength(buf, n);
  free(buf);
  CHECK(j != NULL);
  const cJSON *mt = cJSON_GetObjectItem(j, "model_type"), *ar = cJSON_GetObjectItem(j, "architectures");
  CHECK(cJSON_IsString(mt) && strcmp(mt->valuestring, model_type) == 0);
  CHECK(cJSON_IsArray(ar) && cJSON_GetArraySize(ar) == 1);
  const char *want_arch = strcmp(model_type, "qwen2") == 0 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  CHECK(strcmp(cJSON_GetArrayItem(ar, 0)->valuestring, want_arch) == 0);
  static const char *const keys[] = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                     "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                                     "rope_theta", "rope_scaling", "tie_word_embeddings", "hidden_act", "torch_dtype"};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) CHECK(cJSON_GetObjectItem(j, keys[k]) != NULL);
  CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "tie_word_embeddings")) == tied);
  CHECK_EQ_INT(cJSON_GetObjectItem(j, "num_key_value_heads")->valueint, NKV);
  cJSON_Delete(j);
}

static int exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0;
}

/* A bad directory: the import fails with `code`, its message names `what`, and nothing is
 * written. */
static void expect_bad(const char *dir, int code, const char *what, const char *what2) {
  char out[512];
  snprintf(out, sizeof out, "%s/never", root);
  gpt_config cfg;
  float *p = NULL;
  int rc = import_export(dir, out, &cfg, &p);
  const char *msg = dpc_errmsg();
  fprintf(stderr, "  expected error: %s\n", msg);
  CHECK_EQ_INT(rc, code);
  CHECK(strstr(msg, what) != NULL);
  if (what2) CHECK(strstr(msg, what2) != NULL);
  CHECK(p == NULL);
  CHECK(!exists(out));
}

/* The untied, sharded, BF16 directory of CONFIG_LLAMA (plus extra keys), in dir. */
static void write_sharded(const char *dir, const char *extra, const char *skip, const char *wrong) {
  char cfgtxt[4096];
  CHECK_EQ_INT(dpc_mkdir_p(dir), 0);
  config(cfgtxt, sizeof cfgtxt, 0, extra);
  CHECK_EQ_INT(write_text(dir, "config.json", cfgtxt), 0);
  const int half = ntens / 2;
  CHECK_EQ_INT(write_shard(dir, "model-00001-of-00002.safetensors", 0, half, ST_BF16, skip, wrong, 0), 0);
  CHECK_EQ_INT(write_shard(dir, "model-00002-of-00002.safetensors", half, ntens, ST_BF16, skip, wrong, 1), 0);
  char idx[16384];
  size_t n = (size_t)snprintf(idx, sizeof idx, "{\"metadata\": {\"total_size\": 1234}, \"weight_map\": {");
  for (int i = 0; i < ntens; i++)
    n += (size_t)snprintf(idx + n, sizeof idx - n, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "",
                          tens[i].name, i < half ? 1 : 2);
  snprintf(idx + n, sizeof idx - n, "}}");
  CHECK_EQ_INT(write_text(dir, "model.safetensors.index.json", idx), 0);
}

static void test_sharded_bf16(void) {
  fprintf(stderr, "== untied, GQA, llama3 RoPE, BF16 in two shards\n");
  make_model(0, 0);
  char dir[512], out[512];
  snprintf(dir, sizeof dir, "%s/sharded", root);
  snprintf(out, sizeof out, "%s/sharded_out", root);
  write_sharded(dir, NULL, NULL, NULL);
  gpt_config cfg;
  float *p = NULL;
  CHECK_EQ_INT(import_export(dir, out, &cfg, &p), 0);
  if (!p) {
    fprintf(stderr, "import: %s\n", dpc_errmsg());
    return;
  }
  CHECK_EQ_INT(cfg.arch, GPT_ARCH_LLAMA);
  CHECK_EQ_INT(cfg.n_layer, L);
  CHECK_EQ_INT(cfg.n_kv_head, NKV);
  CHECK_EQ_INT(cfg.intermediate_size, I);
  CHECK_EQ_INT(cfg.tie_word_embeddings, 0);
  CHECK_EQ_INT(cfg.rope_scaling, GPT_ROPE_LLAMA3);
  CHECK_EQ_INT(cfg.rope_original_max_position_embeddings, 8);
  CHECK(cfg.rope_factor == 32.0 && cfg.rope_theta == 500000.0 && cfg.rms_norm_eps == 1e-5);
  check_values(&cfg, p);
  check_export(out, "llama", 0);
  /* The export reads back to the same config and the same floats. */
  gpt_config cfg2;
  float *p2 = NULL;
  CHECK_EQ_INT(modeldir_load(out, &cfg2, &p2), 0);
  CHECK(memcmp(&cfg, &cfg2, sizeof cfg) == 0);
  static gpt_layout lay;
  CHECK_EQ_INT(gpt_layout_build(&cfg, &lay), 0);
  CHECK(p2 && memcmp(p, p2, lay.n_params * sizeof *p) == 0);
  free(p);
  free(p2);
}

static void test_tied_f16(void) {
  fprintf(stderr, "== tied, F16, one file; a stored lm_head equal to the embeddings; Qwen2\n");
  make_model(1, 0);
  char dir[512], out[512], cfgtxt[4096];
  snprintf(dir, sizeof dir, "%s/tied", root);
  snprintf(out, sizeof out, "%s/tied_out", root);
  CHECK_EQ_INT(dpc_mkdir_p(dir), 0);
  config(cfgtxt, sizeof cfgtxt, 1, NULL);
  CHECK_EQ_INT(write_text(dir, "config.json", cfgtxt), 0);
  CHECK_EQ_INT(write_shard(dir, "model.safetensors", 0, ntens, ST_F16, NULL, NULL, 0), 0);
  gpt_config cfg;
  float *p = NULL;
  CHECK_EQ_INT(import_export(dir, out, &cfg, &p), 0);
  if (p) check_values(&cfg, p);
  check_export(out, "llama", 1);
  free(p);
  p = NULL;
  /* A stored lm_head.weight equal to the embeddings loads; one that differs is refused. */
  add("lm_head.weight", V, C);
  memcpy(tens[ntens - 1].data, find("model.embed_tokens.weight")->data, (size_t)V * C * sizeof(float));
  CHECK_EQ_INT(write_shard(dir, "model.safetensors", 0, ntens, ST_F16, NULL, NULL, 0), 0);
  CHECK_EQ_INT(modeldir_load(dir, &cfg, &p), 0);
  free(p);
  tens[ntens - 1].data[5] += 0.5f;
  CHECK_EQ_INT(write_shard(dir, "model.safetensors", 0, ntens, ST_F16, NULL, NULL, 0), 0);
  expect_bad(dir, DPC_EUNSUPPORTED, "lm_head.weight", "model.safetensors");

  /* Qwen2: q/k/v biases; the export says qwen2, since HF's Llama attention_bias would add
   * an o_proj bias. */
  make_model(1, 1);
  snprintf(dir, sizeof dir, "%s/qwen2", root);
  snprintf(out, sizeof out, "%s/qwen2_out", root);
  CHECK_EQ_INT(dpc_mkdir_p(dir), 0);
  CHECK_EQ_INT(write_text(dir, "config.json",
                          "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": 16,"
                          " \"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
                          " \"num_key_value_heads\": 2, \"vocab_size\": 40, \"max_position_embeddings\": 32,"
                          " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 32768,"
                          " \"use_sliding_window\": false, \"max_window_layers\": 21, \"tie_word_embeddings\": true,"
                          " \"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\", \"rope_scaling\": null,"
                          " \"layer_types\": [\"full_attention\", \"full_attention\"]}"),
               0);
  CHECK_EQ_INT(write_shard(dir, "model.safetensors", 0, ntens, ST_F32, NULL, NULL, 0), 0);
  CHECK_EQ_INT(import_export(dir, out, &cfg, &p), 0);
  CHECK_EQ_INT(cfg.attention_bias, 1);
  if (p) check_values(&cfg, p);
  check_export(out, "qwen2", 1);
  free(p);
}

static void test_bad(void) {
  fprintf(stderr, "== bad inputs\n");
  make_model(0, 0);
  char dir[512];
  snprintf(dir, sizeof dir, "%s/bad", root);
  static const struct {
    const char *extra, *key;
  } keys[] = {
      {", \"sliding_window\": 4096", "sliding_window"},
      {", \"mlp_bias\": true", "mlp_bias"},
      {", \"attention_bias\": true", "attention_bias"},
      {", \"quantization_config\": {}", "quantization_config"},
      {", \"attention_dropout\": 0.1", "attention_dropout"},
      {", \"rope_interleaved\": true", "rope_interleaved"},
      {", \"layer_types\": [\"full_attention\", \"sliding_attention\"]", "layer_types"},
  };
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    write_sharded(dir, keys[i].extra, NULL, NULL);
    /* A later duplicate key wins in neither parser: write the config without the original. */
    char cfgtxt[4096];
    config(cfgtxt, sizeof cfgtxt, 0, keys[i].extra);
    if (strcmp(keys[i].key, "attention_bias") == 0 || strcmp(keys[i].key, "mlp_bias") == 0 ||
        strcmp(keys[i].key, "attention_dropout") == 0) {
      char *dup = strstr(cfgtxt, keys[i].key); /* drop the first (valid) occurrence */
      char *comma = strchr(dup, ',');
      memmove(dup - 1, comma + 1, strlen(comma + 1) + 1);
    }
    CHECK_EQ_INT(write_text(dir, "config.json", cfgtxt), 0);
    expect_bad(dir, DPC_EUNSUPPORTED, keys[i].key, "config.json");
  }
  /* Values of known keys that the model cannot compute. */
  static const struct {
    const char *from, *to, *key;
  } vals[] = {
      {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act"},
      {"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"", "rope_scaling"},
      {"\"head_dim\": 4", "\"head_dim\": 8", "head_dim"},
      {"\"model_type\": \"llama\"", "\"model_type\": \"mistral\"", "model_type"},
  };
  for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
    write_sharded(dir, NULL, NULL, NULL);
    char cfgtxt[4096], fixed[4096];
    config(cfgtxt, sizeof cfgtxt, 0, NULL);
    char *at = strstr(cfgtxt, vals[i].from);
    CHECK(at != NULL);
    if (!at) continue;
    snprintf(fixed, sizeof fixed, "%.*s%s%s", (int)(at - cfgtxt), cfgtxt, vals[i].to, at + strlen(vals[i].from));
    CHECK_EQ_INT(write_text(dir, "config.json", fixed), 0);
    expect_bad(dir, DPC_EUNSUPPORTED, vals[i].key, "config.json");
  }
  /* Weights that disagree with config.json: named by file and tensor. */
  write_sharded(dir, NULL, "model.layers.1.mlp.up_proj.weight", NULL);
  expect_bad(dir, DPC_ENOENT, "model.layers.1.mlp.up_proj.weight", "model.safetensors.index.json");
  write_sharded(dir, NULL, NULL, "model.layers.0.self_attn.k_proj.weight");
  expect_bad(dir, DPC_ESHAPE, "model.layers.0.self_attn.k_proj.weight", "model-00001-of-00002.safetensors");
  write_sharded(dir, NULL, NULL, NULL);
  char shard[600];
  snprintf(shard, sizeof shard, "%s/model-00002-of-00002.safetensors", dir);
  CHECK_EQ_INT(unlink(shard), 0);
  expect_bad(dir, DPC_ENOENT, "model-00002-of-00002.safetensors", NULL);
}

static void rm_rf(const char *p) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", p);
}

int main(void) {
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  test_sharded_bf16();
  test_tied_f16();
  test_bad();
  for (int i = 0; i < ntens; i++) free(tens[i].data);
  rm_rf(root);
  TEST_DONE();
}
