/* test_llama_layout.c — the Llama family's canonical layout, config checks and initialisation
 * (kernels/gpt.h, docs/design.md §3.1 and §6.2): tensor order, HF names and shapes, the stem
 * and layer ranges, weight decay on exactly the 2-D tensors, gpt_config_validate naming each bad
 * field, init statistics (N(0, 0.02), residual projections N(0, 0.02/√(2L)), norms 1, biases 0),
 * and that GPT-2's layout is unchanged by the new fields. */
#include "common/errors.h"
#include "kernels/gpt.h"
#include "tests/unit/test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gpt_layout lay;

static gpt_config llama(int tied, int bias) {
  return (gpt_config){.n_layer = 3, .n_head = 4, .n_embd = 32, .n_positions = 16, .vocab_size = 50,
                      .arch = GPT_ARCH_LLAMA, .n_kv_head = 2, .intermediate_size = 40, .tie_word_embeddings = tied,
                      .attention_bias = bias, .rms_norm_eps = 1e-5, .rope_theta = 10000.0};
}

static void test_order(void) {
  gpt_config c = llama(0, 1);
  CHECK_EQ_INT(gpt_layout_build(&c, &lay), 0);
  static const char *const want[] = {
      "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
      "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_proj.bias",
      "model.layers.0.self_attn.v_proj.bias", "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"};
  for (int i = 0; i < (int)(sizeof want / sizeof *want); i++) CHECK(strcmp(lay.tensors[i].name, want[i]) == 0);
  CHECK_EQ_INT(lay.n_tensors, 3 + 3 * 12);
  const int D = 8, I = 40, C = 32, V = 50;
  int k = gpt_layout_find(&lay, "model.layers.2.self_attn.k_proj.weight");
  CHECK(k > 0 && lay.tensors[k].shape[0] == 2 * D && lay.tensors[k].shape[1] == C && lay.tensors[k].layer == 2);
  k = gpt_layout_find(&lay, "model.layers.1.mlp.down_proj.weight");
  CHECK(k > 0 && lay.tensors[k].shape[0] == C && lay.tensors[k].shape[1] == I);
  CHECK_EQ_INT(gpt_layout_find(&lay, "transformer.model.norm.weight"), -1);
  CHECK_EQ_INT(lay.stem_end, (size_t)2 * V * C + C);
  size_t per_layer = 2 * C + (size_t)(4 + 2 + 2) * D * C + (4 + 2 + 2) * D + 4 * D * C + 3 * (size_t)I * C;
  for (int l = 0; l < 3; l++) CHECK_EQ_INT(lay.layer_off[l + 1] - lay.layer_off[l], per_layer);
  CHECK_EQ_INT(lay.layer_off[3], lay.n_params);
  int bad = 0;
  for (int i = 0; i < lay.n_tensors; i++) {
    bad += lay.tensors[i].decay != (lay.tensors[i].ndim == 2);
    if (i + 1 < lay.n_tensors) bad += lay.tensors[i].offset + lay.tensors[i].numel != lay.tensors[i + 1].offset;
  }
  CHECK_EQ_INT(bad, 0);
  /* q/k/v and gate/up are back to back: the backend treats each group as one matrix. */
  int q = gpt_layout_find(&lay, "model.layers.0.self_attn.q_proj.weight");
  int g = gpt_layout_find(&lay, "model.layers.0.mlp.gate_proj.weight");
  CHECK_EQ_INT(lay.tensors[q + 2].offset + lay.tensors[q + 2].numel - lay.tensors[q].offset, (size_t)8 * D * C);
  CHECK_EQ_INT(lay.tensors[g + 1].offset - lay.tensors[g].offset, (size_t)I * C);
  c = llama(1, 0);
  CHECK_EQ_INT(gpt_layout_build(&c, &lay), 0);
  CHECK_EQ_INT(gpt_layout_find(&lay, "lm_head.weight"), -1);
  CHECK_EQ_INT(lay.stem_end, (size_t)V * C + C);
}

static void expect_invalid(gpt_config c, const char *field) {
  int rc = gpt_config_validate(&c);
  CHECK_EQ_INT(rc, DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), field) != NULL);
  fprintf(stderr, "  refused: %s\n", dpc_errmsg());
}

static void test_validate(void) {
  gpt_config c = llama(1, 0);
  CHECK_EQ_INT(gpt_config_validate(&c), 0);
  c.n_kv_head = 3;
  expect_invalid(c, "num_key_value_heads");
  c = llama(1, 0);
  c.n_kv_head = 0;
  expect_invalid(c, "num_key_value_heads");
  c = llama(1, 0);
  c.intermediate_size = 0;
  expect_invalid(c, "intermediate_size");
  c = llama(1, 0);
  c.n_embd = 36; /* head_dim 9 */
  expect_invalid(c, "head_dim");
  c = llama(1, 0);
  c.rms_norm_eps = 0.0;
  expect_invalid(c, "rms_norm_eps");
  c = llama(1, 0);
  c.rope_theta = -1.0;
  expect_invalid(c, "rope_theta");
  c = llama(1, 0);
  c.rope_scaling = GPT_ROPE_LLAMA3;
  c.rope_factor = 8.0;
  c.rope_low_freq_factor = 4.0;
  c.rope_high_freq_factor = 1.0;
  c.rope_original_max_position_embeddings = 8192;
  expect_invalid(c, "low_freq_factor");
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  CHECK_EQ_INT(gpt_config_validate(&c), 0);
  c.rope_factor = 0.5;
  expect_invalid(c, "factor");
  c = llama(1, 0);
  c.arch = 7;
  expect_invalid(c, "architecture");
}

static void test_init(void) {
  gpt_config c = llama(0, 1);
  CHECK_EQ_INT(gpt_layout_build(&c, &lay), 0);
  float *p = malloc(lay.n_params * sizeof *p), *p2 = malloc(lay.n_params * sizeof *p2);
  gpt_init_params(&lay, p, 5);
  gpt_init_params(&lay, p2, 5);
  CHECK(memcmp(p, p2, lay.n_params * sizeof *p) == 0);
  double resid = 0.02 / sqrt(2.0 * 3);
  for (int k = 0; k < lay.n_tensors; k++) {
    const gpt_tensor *t = &lay.tensors[k];
    double s = 0.0, ss = 0.0;
    for (size_t i = 0; i < t->numel; i++) {
      s += p[t->offset + i];
      ss += (double)p[t->offset + i] * p[t->offset + i];
    }
    double mean = s / t->numel, sd = sqrt(ss / t->numel - mean * mean);
    if (strstr(t->name, ".bias")) {
      CHECK(s == 0.0 && ss == 0.0);
    } else if (t->ndim == 1) {
      CHECK(mean == 1.0 && sd < 1e-9);
    } else {
      double want = strstr(t->name, "o_proj") || strstr(t->name, "down_proj") ? resid : 0.02;
      if (!(fabs(sd - want) < 0.15 * want && fabs(mean) < 0.2 * want)) {
        test_failures++;
        fprintf(stderr, "FAIL init %s: mean %.4g sd %.4g, want sd %.4g\n", t->name, mean, sd, want);
      }
      test_checks++;
    }
  }
  free(p);
  free(p2);
}

static void test_gpt2_unchanged(void) {
  gpt_config c = {.n_layer = 2, .n_head = 2, .n_embd = 8, .n_positions = 16, .vocab_size = 32};
  CHECK_EQ_INT(gpt_layout_build(&c, &lay), 0);
  CHECK(strcmp(lay.tensors[0].name, "wte.weight") == 0 && strcmp(lay.tensors[4].name, "h.0.ln_1.weight") == 0);
  CHECK_EQ_INT(lay.n_tensors, 4 + 12 * 2);
  CHECK_EQ_INT(gpt_layout_find(&lay, "transformer.h.1.mlp.c_fc.bias"), gpt_layout_find(&lay, "h.1.mlp.c_fc.bias"));
  CHECK_EQ_INT(lay.n_params, (size_t)32 * 8 + 16 * 8 + 2 * 8 + 2 * (4 * 8 + 12 * 8 * 8 + 9 * 8));
  CHECK(strcmp(gpt_arch_name(c.arch), "gpt2") == 0);
}

/* gpt_llama_layer_ptrs, which both backends read the layout through, points each group at the
 * tensor of that name, in every tied/untied, bias/no-bias variant and every layer. */
static void test_layer_ptrs(void) {
  static const char *const names[GPT_LL_N] = {
      "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.o_proj.weight",
      "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.down_proj.weight"};
  for (int v = 0; v < 4; v++) {
    gpt_config c = llama(v & 1, v >> 1);
    CHECK_EQ_INT(gpt_layout_build(&c, &lay), 0);
    float *base = malloc(lay.n_params * sizeof *base);
    CHECK(base != NULL);
    if (!base) return;
    for (int l = 0; l < c.n_layer; l++) {
      float *w[GPT_LL_N];
      gpt_llama_layer_ptrs(&lay, base, l, w);
      for (int g = 0; g < GPT_LL_N; g++) {
        if (g == GPT_LL_QKV_B && !c.attention_bias) {
          CHECK(w[g] == NULL);
          continue;
        }
        char nm[GPT_NAME_MAX];
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, names[g]);
        int i = gpt_layout_find(&lay, nm);
        CHECK(i >= 0);
        if (i >= 0) CHECK(w[g] == base + lay.tensors[i].offset);
      }
    }
    free(base);
  }
}

int main(void) {
  test_order();
  test_layer_ptrs();
  test_validate();
  test_init();
  test_gpt2_unchanged();
  TEST_DONE();
}
