/* test_formats_modeldir.c — model directory save/load round trip, determinism, HF variants
 * (transformer. prefix, attention buffers, tied lm_head, BF16) and every way a directory
 * can disagree with its config.json. */
#include "common/errors.h"
#include "common/fsutil.h"
#include "kernels/modeldir.h"
#include "common/safetensors.h"
#include "kernels/gpt.h"
#include "tests/unit/test.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char root[] = "/tmp/dpc_modeldir_XXXXXX";
static gpt_layout lay;
static float *params;

enum { PREFIX = 1, BUFFERS = 2, LM_HEAD = 4, LM_HEAD_BAD = 8, BF16 = 16, DUP = 32 };

/* Write <dir>/model.safetensors from lay/params the way other tools might: options above,
 * tensor `skip` left out, tensor `transpose` stored with swapped dims, tensor `as_int` as I32. */
static int write_st(const char *dir, int flags, int skip, int transpose, int as_int) {
  static st_write_tensor ts[GPT_MAX_TENSORS + 8];
  static char names[GPT_MAX_TENSORS + 8][GPT_NAME_MAX + 16];
  static uint16_t bf[1 << 16];
  static float bad_head[1 << 14];
  int n = 0;
  size_t bfo = 0;
  for (int k = lay.n_tensors - 1; k >= 0; k--) { /* reverse order: loading is by name */
    if (k == skip) continue;
    const gpt_tensor *g = &lay.tensors[k];
    snprintf(names[n], sizeof names[n], "%s%s", flags & PREFIX ? "transformer." : "", g->name);
    st_write_tensor *t = &ts[n++];
    t->name = names[n - 1];
    t->dtype = k == as_int ? ST_I32 : ST_F32;
    t->ndim = g->ndim;
    t->shape[0] = k == transpose ? g->shape[1] : g->shape[0];
    t->shape[1] = k == transpose ? g->shape[0] : g->shape[1];
    t->data = params + g->offset;
    if (flags & BF16) {
      for (size_t i = 0; i < g->numel; i++) bf[bfo + i] = st_f32_to_bf16(params[g->offset + i]);
      t->dtype = ST_BF16;
      t->data = bf + bfo;
      bfo += g->numel;
    }
  }
  if (flags & DUP) {
    ts[n] = ts[n - 1];
    snprintf(names[n], sizeof names[n], "transformer.%s", ts[n - 1].name);
    ts[n].name = names[n];
    n++;
  }
  static float mask[16 * 16];
  if (flags & BUFFERS)
    for (int l = 0; l < lay.cfg.n_layer; l++) {
      snprintf(names[n], sizeof names[n], "%sh.%d.attn.bias", flags & PREFIX ? "transformer." : "", l);
      ts[n] = (st_write_tensor){names[n], ST_F32, 4, {1, 1, 16, 16}, mask};
      n++;
      snprintf(names[n], sizeof names[n], "h.%d.attn.masked_bias", l);
      ts[n] = (st_write_tensor){names[n], ST_F32, 0, {0}, mask};
      n++;
    }
  if (flags & (LM_HEAD | LM_HEAD_BAD)) {
    const gpt_tensor *w = &lay.tensors[0];
    const float *src = params + w->offset;
    if (flags & LM_HEAD_BAD) {
      memcpy(bad_head, src, w->numel * sizeof *src);
      bad_head[w->numel - 1] += 1.0f;
      src = bad_head;
    }
    ts[n++] = (st_write_tensor){"lm_head.weight", ST_F32, 2, {w->shape[0], w->shape[1]}, src};
  }
  char path[300];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  const char *meta[] = {"format", "pt"};
  return st_write(path, ts, n, meta, 1);
}

static int write_config(const char *dir, const char *json) {
  char path[300];
  snprintf(path, sizeof path, "%s/config.json", dir);
  return dpc_write_file_atomic(path, json, strlen(json));
}

static const char *cfg_json = "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16, "
                              "\"vocab_size\": 32, \"model_type\": \"gpt2\", \"n_ctx\": 16, \"n_inner\": null, "
                              "\"activation_function\": \"gelu_new\", \"layer_norm_epsilon\": 1e-05}";

/* Load must fail with `code` naming `what` (and the directory). */
static int expect_fail(const char *dir, int code, const char *what) {
  gpt_config c;
  float *p = (float *)1;
  int rc = modeldir_load(dir, &c, &p);
  int ok = rc == code && p == NULL && strstr(dpc_errmsg(), dir) && strstr(dpc_errmsg(), what);
  if (!ok) fprintf(stderr, "  %s: rc %d, detail \"%s\"\n", what, rc, dpc_errmsg());
  return ok;
}

static int load_equals(const char *dir, int exact_bf16) {
  gpt_config c;
  float *p;
  int rc = modeldir_load(dir, &c, &p);
  if (rc) {
    fprintf(stderr, "  load %s: %s\n", dir, dpc_errmsg());
    return 0;
  }
  int ok = memcmp(&c, &lay.cfg, sizeof c) == 0;
  for (size_t i = 0; ok && i < lay.n_params; i++) {
    float want = exact_bf16 ? st_bf16_to_f32(st_f32_to_bf16(params[i])) : params[i];
    if (memcmp(&p[i], &want, 4) != 0) ok = 0;
  }
  free(p);
  return ok;
}

static int same_file(const char *a, const char *b) {
  void *x, *y;
  size_t nx, ny;
  if (dpc_read_file(a, 1 << 24, &x, &nx) || dpc_read_file(b, 1 << 24, &y, &ny)) return 0;
  int eq = nx == ny && memcmp(x, y, nx) == 0;
  free(x);
  free(y);
  return eq;
}

int main(void) {
  CHECK(mkdtemp(root) != NULL);
  gpt_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 8, .n_positions = 16, .vocab_size = 32};
  CHECK_EQ_INT(gpt_layout_build(&cfg, &lay), 0);
  params = malloc(lay.n_params * sizeof *params);
  gpt_init_params(&lay, params, 7);
  for (size_t i = 0; i < lay.n_params; i++) params[i] += 1e-3f * (float)(i % 17); /* non-zero biases */

  char d[300], d2[300], a[320], b[320];
  snprintf(d, sizeof d, "%s/out/nested/model", root);
  CHECK_EQ_INT(modeldir_save(d, &cfg, params), 0);
  CHECK(load_equals(d, 0));
  snprintf(d2, sizeof d2, "%s/again", root);
  CHECK_EQ_INT(modeldir_save(d2, &cfg, params), 0);
  snprintf(a, sizeof a, "%s/model.safetensors", d);
  snprintf(b, sizeof b, "%s/model.safetensors", d2);
  CHECK(same_file(a, b));
  snprintf(a, sizeof a, "%s/config.json", d);
  snprintf(b, sizeof b, "%s/config.json", d2);
  CHECK(same_file(a, b));
  gpt_config rc_cfg;
  CHECK_EQ_INT(modeldir_read_config(d, &rc_cfg), 0);
  CHECK(memcmp(&rc_cfg, &cfg, sizeof cfg) == 0);

  /* Variants other tools write. */
  snprintf(d, sizeof d, "%s/hf", root);
  CHECK_EQ_INT(dpc_mkdir_p(d), 0);
  CHECK_EQ_INT(write_config(d, cfg_json), 0);
  CHECK_EQ_INT(write_st(d, PREFIX | BUFFERS | LM_HEAD, -1, -1, -1), 0);
  CHECK(load_equals(d, 0));
  CHECK_EQ_INT(write_st(d, BF16, -1, -1, -1), 0);
  CHECK(load_equals(d, 1));

  /* Disagreements, each with its own code and a message naming file and tensor. */
  int k_fc = gpt_layout_find(&lay, "h.1.mlp.c_fc.bias");
  int k_attn = gpt_layout_find(&lay, "h.0.attn.c_attn.weight");
  CHECK_EQ_INT(write_st(d, 0, k_fc, -1, -1), 0);
  CHECK(expect_fail(d, DPC_ENOENT, "\"h.1.mlp.c_fc.bias\" is missing"));
  CHECK_EQ_INT(write_st(d, PREFIX, -1, k_attn, -1), 0);
  CHECK(expect_fail(d, DPC_ESHAPE, "\"transformer.h.0.attn.c_attn.weight\" has shape [24, 8]"));
  CHECK(strstr(dpc_errmsg(), "needs [8, 24]") != NULL);
  CHECK_EQ_INT(write_st(d, 0, -1, -1, 3), 0);
  CHECK(expect_fail(d, DPC_EUNSUPPORTED, "dtype I32"));
  CHECK_EQ_INT(write_st(d, LM_HEAD_BAD, -1, -1, -1), 0);
  CHECK(expect_fail(d, DPC_EUNSUPPORTED, "lm_head.weight differs"));
  CHECK_EQ_INT(write_st(d, DUP, -1, -1, -1), 0);
  CHECK(expect_fail(d, DPC_EFORMAT, "stored twice"));
  /* config.json claims a different shape than the weights have. */
  CHECK_EQ_INT(write_st(d, 0, -1, -1, -1), 0);
  CHECK_EQ_INT(write_config(d, "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 32, \"vocab_size\": 32}"), 0);
  CHECK(expect_fail(d, DPC_ESHAPE, "\"wpe.weight\" has shape [16, 8]"));
  CHECK(strstr(dpc_errmsg(), "needs [32, 8]") != NULL);
  CHECK_EQ_INT(write_config(d, "{\"n_layer\": 1, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16, \"vocab_size\": 32}"), 0);
  CHECK(expect_fail(d, DPC_EFORMAT, "\"h.1."));
  CHECK_EQ_INT(write_config(d, "{\"n_layer\": 3, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16, \"vocab_size\": 32}"), 0);
  CHECK(expect_fail(d, DPC_ENOENT, "\"h.2.ln_1.weight\" is missing"));
  /* Bad config.json. */
  CHECK_EQ_INT(write_config(d, "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"vocab_size\": 32}"), 0);
  CHECK(expect_fail(d, DPC_EFORMAT, "missing key \"n_positions\""));
  CHECK_EQ_INT(write_config(d, "{\"n_layer\": 2.5, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16, \"vocab_size\": 32}"), 0);
  CHECK(expect_fail(d, DPC_EFORMAT, "\"n_layer\" must be an integer"));
  CHECK_EQ_INT(write_config(d, "{\"n_layer\": 2, \"n_head\": 3, \"n_embd\": 8, \"n_positions\": 16, \"vocab_size\": 32}"), 0);
  CHECK(expect_fail(d, DPC_EINVAL, "divisible"));
  CHECK_EQ_INT(write_config(d, "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, \"n_positions\": 16, \"vocab_size\": 32, "
                               "\"activation_function\": \"relu\"}"), 0);
  CHECK(expect_fail(d, DPC_EUNSUPPORTED, "activation_function"));
  CHECK_EQ_INT(write_config(d, "{\"n_layer\": 2,"), 0);
  CHECK(expect_fail(d, DPC_EFORMAT, "not valid JSON"));
  /* A lying header in the weights (truncated data section). */
  CHECK_EQ_INT(write_config(d, cfg_json), 0);
  snprintf(a, sizeof a, "%s/model.safetensors", d);
  CHECK(truncate(a, 4000) == 0);
  CHECK(expect_fail(d, DPC_EFORMAT, "model.safetensors"));
  /* A NaN parameter. */
  params[lay.tensors[5].offset + 1] = NAN;
  CHECK_EQ_INT(write_st(d, 0, -1, -1, -1), 0);
  CHECK(expect_fail(d, DPC_ENUMERIC, "\"h.0.ln_1.bias\" element 1 is not finite"));
  CHECK(unlink(a) == 0);
  CHECK(expect_fail(d, DPC_ENOENT, "model.safetensors"));
  snprintf(d, sizeof d, "%s/absent", root);
  CHECK(expect_fail(d, DPC_ENOENT, "config.json"));

  free(params);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  CHECK(system(cmd) == 0);
  TEST_DONE();
}
