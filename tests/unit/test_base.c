/* test_base.c — error table, canonical layout and learning-rate schedule. */
#include "common/errors.h"
#include "kernels/gpt.h"
#include "tests/unit/test.h"

#include <string.h>

int main(void) {
  CHECK(strcmp(dpc_strerror(DPC_EFORMAT), "malformed file or message") == 0);
  CHECK(strcmp(dpc_strerror(12345), "unknown error") == 0);
  CHECK_EQ_INT(dpc_err(DPC_EIO, "x %d", 7), DPC_EIO);
  CHECK(strcmp(dpc_errmsg(), "x 7") == 0);
  /* Wrapping the previous detail: the message reads whole, not garbled. */
  dpc_err(DPC_EINVAL, "n_embd %d must be divisible by n_head %d", 8, 3);
  CHECK_EQ_INT(dpc_err(DPC_EIO, "loading the model: %s", dpc_errmsg()), DPC_EIO);
  CHECK(strcmp(dpc_errmsg(), "loading the model: n_embd 8 must be divisible by n_head 3") == 0);

  static gpt_layout lay;
  gpt_config bad = {.n_layer = 2, .n_head = 3, .n_embd = 8, .n_positions = 16, .vocab_size = 32};
  CHECK_EQ_INT(gpt_layout_build(&bad, &lay), DPC_EINVAL); /* 8 % 3 != 0 */
  CHECK(strstr(dpc_errmsg(), "divisible") != NULL);

  gpt_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 8, .n_positions = 16, .vocab_size = 32};
  CHECK_EQ_INT(gpt_layout_build(&cfg, &lay), 0);
  const size_t C = 8, V = 32, T = 16, L = 2;
  const size_t per_layer = 12 * C * C + 13 * C;
  CHECK_EQ_INT(lay.n_params, V * C + T * C + 2 * C + L * per_layer);
  CHECK_EQ_INT(lay.n_tensors, 4 + 12 * 2);
  CHECK_EQ_INT(lay.stem_end, V * C + T * C + 2 * C);
  CHECK_EQ_INT(lay.layer_off[1] - lay.layer_off[0], per_layer);
  CHECK_EQ_INT(lay.layer_off[2], lay.n_params);
  int k = gpt_layout_find(&lay, "transformer.h.1.attn.c_attn.weight");
  CHECK(k >= 0);
  CHECK_EQ_INT(lay.tensors[k].shape[0], C);
  CHECK_EQ_INT(lay.tensors[k].shape[1], 3 * C);
  CHECK_EQ_INT(lay.tensors[k].decay, 1);
  CHECK_EQ_INT(gpt_layout_find(&lay, "h.9.ln_1.weight"), -1);

  /* Initialisation: LN weights 1, biases 0, residual projections with the smaller std. */
  float *p = calloc(lay.n_params, sizeof *p);
  gpt_init_params(&lay, p, 42);
  const gpt_tensor *ln = &lay.tensors[gpt_layout_find(&lay, "h.0.ln_1.weight")];
  CHECK(p[ln->offset] == 1.0f && p[ln->offset + C - 1] == 1.0f);
  const gpt_tensor *b = &lay.tensors[gpt_layout_find(&lay, "h.0.mlp.c_fc.bias")];
  CHECK(p[b->offset] == 0.0f);
  const gpt_tensor *w = &lay.tensors[gpt_layout_find(&lay, "wte.weight")];
  double ss = 0;
  for (size_t i = 0; i < w->numel; i++) ss += (double)p[w->offset + i] * p[w->offset + i];
  CHECK_NEAR(sqrt(ss / w->numel), 0.02, 0.004);
  free(p);

  /* Schedule: warmup is linear from lr/warmup, cosine ends at lr_min_frac * lr. */
  CHECK_NEAR(gpt_lr_at(1.0f, 4, 14, 0.1f, 0), 0.25, 1e-7);
  CHECK_NEAR(gpt_lr_at(1.0f, 4, 14, 0.1f, 3), 1.0, 1e-7);
  CHECK_NEAR(gpt_lr_at(1.0f, 4, 14, 0.1f, 4), 1.0, 1e-7);
  CHECK_NEAR(gpt_lr_at(1.0f, 4, 14, 0.1f, 9), 0.55, 1e-6);
  CHECK_NEAR(gpt_lr_at(1.0f, 4, 14, 0.1f, 14), 0.1, 1e-6);
  CHECK_NEAR(gpt_lr_at(1.0f, 4, 14, 0.1f, 100), 0.1, 1e-6);
  CHECK_NEAR(gpt_lr_at(3e-4f, 0, 10, 1.0f, 5), 3e-4, 1e-10);
  TEST_DONE();
}
