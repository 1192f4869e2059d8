/* test_jobspec.c — job spec parsing: valid specs and defaults, canonical round trip, every
 * kind of bad spec with its message, init-directory resolution, the module / path / fragment
 * structure against the canonical layout, and the field table (coordinator/jobspec_fields.c)
 * field by field: each range refused just outside, each default applied, each field written
 * in the canonical JSON and listed in docs/jobspec.md; and the Llama family's model fields (a
 * GPT-2 spec's canonical bytes unchanged by them). */
#include "common/codec.h"
#include "common/errors.h"
#include "coordinator/jobspec.h"
#include "coordinator/jobspec_doc.h"
#include "coordinator/jobspec_fields.h"
#include "tests/unit/test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MODEL "\"model\":{\"n_layer\":4,\"n_head\":2,\"n_embd\":8,\"n_positions\":16,\"vocab_size\":32}"
#define DATA "\"data\":{\"train\":[\"shards/train_*.bin\"]}"
#define CORE "\"algorithm\":\"diloco\",\"replicas\":2,\"inner_steps\":5,\"rounds\":3,\"batch\":4,\"seq_len\":8"
#define BASE "\"name\":\"t1\"," MODEL "," DATA "," CORE

static int parse(const char *s, jobspec *js) { return jobspec_parse(s, strlen(s), js); }

/* Parse `s`, expect failure with `code` and a message containing `want`. */
static void expect_bad(const char *s, int code, const char *want) {
  static jobspec js;
  dpc_errclear();
  int rc = parse(s, &js);
  CHECK_EQ_INT(rc, code);
  if (!strstr(dpc_errmsg(), want)) {
    test_failures++;
    fprintf(stderr, "spec %s\n  message \"%s\" lacks \"%s\"\n", s, dpc_errmsg(), want);
  }
  test_checks++;
}

/* The spec BASE with `"key": value` added to section sect (at the top level for ""). */
static void with_field(char *buf, size_t cap, const jobspec_field *f, const char *value) {
  if (strcmp(f->sect, "inner.muon") == 0) /* applies with the Muon optimizer only */
    snprintf(buf, cap, "{" BASE ",\"inner\":{\"optimizer\":\"muon\",\"muon\":{\"%s\":%s}}}", f->key, value);
  else if (f->sect[0]) snprintf(buf, cap, "{" BASE ",\"%s\":{\"%s\":%s}}", f->sect, f->key, value);
  else snprintf(buf, cap, "{" BASE ",\"%s\":%s}", f->key, value);
}

/* Every ranged field of the table, just below and just above its range, is refused naming
 * its path; its default (for each algorithm / sparse variant) is what the struct holds. */
static void test_field_table(void) {
  static jobspec js;
  static char spec[4096];
  const double H = 5, STEPS = 15; /* BASE: inner_steps 5, rounds 3 */
  for (int i = 0; i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    const jf_range *r = &f->range;
    if (!r->on || (f->flags & (JF_REQUIRED | JF_SHAPE | JF_SHAPE_OPT | JF_PARSE_RANGE)) || strcmp(f->sect, "levels[]") == 0) continue;
    if (f->type != JF_INT && f->type != JF_NUMBER) continue;
    double hi = r->hi_ref == JF_HI_STEPS ? STEPS : r->hi_ref == JF_HI_H ? H : r->hi_ref == JF_HI_H_MINUS_1 ? H - 1 : r->hi;
    double step = f->type == JF_INT ? 1 : 0.5;
    double outside[2] = {r->lo_open ? r->lo : r->lo - step, r->hi_open ? hi : hi + step};
    char path[96], want[128], val[64];
    snprintf(want, sizeof want, "field \"%s\"", jf_path(path, sizeof path, f->sect, f->key));
    for (int k = 0; k < 2; k++) {
      snprintf(val, sizeof val, "%.17g", outside[k]);
      with_field(spec, sizeof spec, f, val);
      expect_bad(spec, DPC_EINVAL, want);
    }
  }
  /* Defaults: plain, diloco-async, and with a "sparse" block (JF_ALT_DEFAULT). */
  static const char *const variants[] = {"{" BASE "}",
                                         "{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"diloco-async\",\"replicas\":2,"
                                         "\"inner_steps\":5,\"rounds\":3,\"batch\":4,\"seq_len\":8}",
                                         "{" BASE ",\"sparse\":{}}"};
  for (int v = 0; v < 3; v++) {
    CHECK_EQ_INT(parse(variants[v], &js), 0);
    for (int i = 0; i < jobspec_n_fields; i++) {
      const jobspec_field *f = &jobspec_fields[i];
      if ((f->flags & (JF_REQUIRED | JF_SHAPE)) || f->when || strcmp(f->sect, "levels[]") == 0) continue;
      double def = (f->flags & JF_ALT_DEFAULT) && v ? (v == 1 ? f->def_async : f->def_sparse) : f->def, got;
      if (v == 0 && strcmp(f->sect, "outer") == 0 && strcmp(f->key, "lr") == 0) def = 0.5; /* R = 2: derived */
      if (v == 0 && strcmp(f->sect, "outer") == 0 && strcmp(f->key, "momentum") == 0) def = 0.6;
      if (f->type == JF_NUMBER) memcpy(&got, jf_at(f, &js), sizeof got);
      else if (f->type == JF_INT || f->type == JF_BOOL || f->type == JF_ENUM || f->type == JF_CODEC) got = jf_get_int(f, &js);
      else continue;
      if (got != def) fprintf(stderr, "default of %s.%s: %g, expected %g\n", f->sect, f->key, got, def);
      CHECK(got == def);
    }
  }
  /* The outer defaults that jobspec.h once documented apart from their values (R = 2 derives
   * its own: test_outer_derived). */
  CHECK_EQ_INT(parse("{" BASE "}", &js), 0);
  CHECK(js.outer.lr == 0.5 && js.outer.momentum == 0.6 && js.outer.nesterov == 1);
  /* Every field is written in the canonical JSON (sparse and quorum_grace_s once given) and
   * listed in the generated docs/jobspec.md. */
  char *canon = NULL, *md = NULL;
  CHECK_EQ_INT(parse("{" BASE ",\"sparse\":{},\"quorum\":0.5,\"quorum_grace_s\":3,\"levels\":[{\"stem\":true,"
                     "\"layers\":[0,4]}]}", &js), 0);
  CHECK_EQ_INT(jobspec_to_json(&js, &canon), 0);
  CHECK_EQ_INT(jobspec_doc_markdown(&md), 0);
  for (int i = 0; canon && md && i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    char key[96], row[128], path[96];
    snprintf(key, sizeof key, "\"%s\":", f->key);
    snprintf(row, sizeof row, "| `%s` |", jf_path(path, sizeof path, f->sect, f->key));
    if (f->type != JF_PATH_LISTS && f->type != JF_STRING && !f->when && !(f->flags & JF_OMIT_DEFAULT))
      CHECK(strstr(canon, key) != NULL);
    CHECK(strstr(md, row) != NULL);
  }
  free(canon);
  free(md);
  /* The example spec the doc shows is a valid spec. */
  CHECK_EQ_INT(jobspec_parse(jobspec_doc_example, strlen(jobspec_doc_example), &js), 0);
}

#define LLAMA_SHAPE "\"n_layer\":2,\"n_head\":4,\"n_embd\":16,\"n_positions\":16,\"vocab_size\":32"
#define LLAMA_MODEL "\"model\":{" LLAMA_SHAPE ",\"arch\":\"llama\",\"n_kv_head\":2,\"intermediate_size\":48}"

/* The Llama keys of model: defaults, canonical form and round trip, the keys that apply only
 * with arch llama or llama3 scaling, a GPT-2 spec's canonical bytes as before them, and
 * model.init with a LlamaConfig config.json (in dir). */
static void test_llama(const char *dir) {
  static jobspec js, js2;
  static gpt_layout lay;
  char *j1 = NULL, *j2 = NULL;
  /* The canonical JSON of a GPT-2 spec, byte for byte as stored before the Llama fields (with
   * pulls, which every family has), read back as a stored spec (no derived schedule). */
  CHECK_EQ_INT(jobspec_parse_stored("{" BASE "}", strlen("{" BASE "}"), &js), 0);
  CHECK_EQ_INT(jobspec_to_json(&js, &j1), 0);
  CHECK(j1 && strcmp(j1, "{\"name\":\"t1\",\"model\":{\"n_layer\":4,\"n_head\":2,\"n_embd\":8,\"n_positions\":16,"
                   "\"vocab_size\":32,\"seed\":0},\"data\":{\"train\":[\"shards/train_*.bin\"],\"val\":[]},"
                   "\"algorithm\":\"diloco\",\"replicas\":2,\"inner_steps\":5,\"rounds\":3,\"batch\":4,\"seq_len\":8,"
                   "\"inner\":{\"lr\":0.0003,\"warmup\":0,\"lr_min_frac\":0.1,\"weight_decay\":0.1,\"beta1\":0.9,"
                   "\"beta2\":0.95,\"eps\":1e-08,\"grad_clip\":1,\"state\":\"keep\"},\"outer\":{\"lr\":0.6,"
                   "\"momentum\":0.7,\"nesterov\":true,\"rule\":\"delayed-nesterov\",\"delay_buffer\":0,\"c\":0,"
                   "\"delta_norm_screen\":0},\"max_staleness\":0,\"dylu\":{\"enabled\":false,\"min_steps\":1},"
                   "\"levels\":[{\"stem\":true,\"layers\":[0,4],\"modules\":1}],\"versions\":{\"keep_last\":2,"
                   "\"keep_every\":0},\"pulls\":{\"replay\":true},\"streaming\":{\"fragments\":1,\"overlap_steps\":0,"
                   "\"alpha\":0,\"eager\":false,"
                   "\"codec\":\"fp32\",\"block_floats\":256,\"pull_codec\":\"fp32\"},\"quorum\":1,"
                   "\"round_timeout_s\":3600,\"weighting\":\"uniform\"}") == 0);
  free(j1);
  j1 = NULL;
  CHECK_EQ_INT(parse("{\"name\":\"l1\"," LLAMA_MODEL "," DATA "," CORE "}", &js), 0);
  CHECK(js.model.arch == GPT_ARCH_LLAMA && js.model.n_kv_head == 2 && js.model.intermediate_size == 48);
  CHECK(js.model.tie_word_embeddings == 1 && js.model.attention_bias == 0 && js.model.rms_norm_eps == 1e-5);
  CHECK(js.model.rope_theta == 10000.0 && js.model.rope_scaling == GPT_ROPE_DEFAULT && js.model.rope_factor == 0);
  CHECK_EQ_INT(jobspec_layout(&js, &lay), 0);
  CHECK_EQ_INT(gpt_layout_find(&lay, "lm_head.weight"), -1); /* tied */
  CHECK_EQ_INT(jobspec_to_json(&js, &j1), 0);
  CHECK(j1 && strstr(j1, "\"vocab_size\":32,\"arch\":\"llama\",\"n_kv_head\":2,\"intermediate_size\":48,"
                         "\"rms_norm_eps\":1e-05,\"rope_theta\":10000,\"tie_word_embeddings\":true,"
                         "\"attention_bias\":false,\"rope_scaling\":\"none\",\"seed\":0}") != NULL);
  CHECK_EQ_INT(parse(j1, &js2), 0);
  CHECK(memcmp(&js.model, &js2.model, sizeof js.model) == 0);
  CHECK_EQ_INT(jobspec_to_json(&js2, &j2), 0);
  CHECK(j1 && j2 && strcmp(j1, j2) == 0);
  free(j1);
  free(j2);
  j1 = j2 = NULL;
  /* llama3 scaling: its four numbers appear (defaults of Llama 3.1) and round-trip. */
  CHECK_EQ_INT(parse("{\"name\":\"l3\",\"model\":{" LLAMA_SHAPE ",\"arch\":\"llama\",\"n_kv_head\":4,"
                     "\"intermediate_size\":32,\"tie_word_embeddings\":false,\"rope_scaling\":\"llama3\","
                     "\"rope_factor\":32}," DATA "," CORE "}", &js), 0);
  CHECK(js.model.rope_factor == 32 && js.model.rope_high_freq_factor == 4 && js.model.rope_original_max_position_embeddings == 8192);
  CHECK_EQ_INT(jobspec_layout(&js, &lay), 0);
  CHECK(gpt_layout_find(&lay, "lm_head.weight") >= 0);
  CHECK_EQ_INT(jobspec_to_json(&js, &j1), 0);
  CHECK(j1 && strstr(j1, "\"rope_factor\":32,\"rope_low_freq_factor\":1") != NULL);
  CHECK_EQ_INT(parse(j1, &js2), 0);
  CHECK(memcmp(&js.model, &js2.model, sizeof js.model) == 0);
  free(j1);
  j1 = NULL;
  /* Keys that do not apply, missing Llama shape keys, and gpt_config_validate's rules. */
  expect_bad("{\"name\":\"b\",\"model\":{" LLAMA_SHAPE ",\"n_kv_head\":2}," DATA "," CORE "}", DPC_EINVAL,
             "field \"model.n_kv_head\": only with model.arch \"llama\"");
  expect_bad("{\"name\":\"b\",\"model\":{" LLAMA_SHAPE ",\"arch\":\"llama\",\"n_kv_head\":2,\"intermediate_size\":8,"
             "\"rope_factor\":2}," DATA "," CORE "}", DPC_EINVAL, "field \"model.rope_factor\": only with rope_scaling");
  expect_bad("{\"name\":\"b\",\"model\":{" LLAMA_SHAPE ",\"arch\":\"llama\",\"intermediate_size\":8}," DATA "," CORE "}",
             DPC_EINVAL, "missing field \"model.n_kv_head\"");
  expect_bad("{\"name\":\"b\",\"model\":{" LLAMA_SHAPE ",\"arch\":\"llama\",\"n_kv_head\":3,\"intermediate_size\":8}," DATA
             "," CORE "}", DPC_EINVAL, "field \"model\"");
  expect_bad("{\"name\":\"b\",\"model\":{" LLAMA_SHAPE ",\"arch\":\"mamba\"}," DATA "," CORE "}", DPC_EINVAL,
             "field \"model.arch\" = \"mamba\"");
  /* model.init with a LlamaConfig: the shape and every Llama key come from it. */
  char sub[128], cfg[160];
  snprintf(sub, sizeof sub, "%s/llama", dir);
  CHECK(mkdir(sub, 0700) == 0);
  snprintf(cfg, sizeof cfg, "%s/config.json", sub);
  FILE *f = fopen(cfg, "w");
  CHECK(f != NULL);
  if (f) {
    fputs("{\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":16,"
          "\"intermediate_size\":48,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
          "\"vocab_size\":32,\"max_position_embeddings\":16,\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,"
          "\"tie_word_embeddings\":true,\"hidden_act\":\"silu\",\"rope_scaling\":null}", f);
    fclose(f);
  }
  CHECK_EQ_INT(parse("{\"name\":\"li\",\"model\":{\"init\":\"llama\"}," DATA "," CORE "}", &js), 0);
  CHECK_EQ_INT(jobspec_resolve_init(&js, dir), 0);
  CHECK(js.model.arch == GPT_ARCH_LLAMA && js.model.n_kv_head == 2 && js.model.tie_word_embeddings == 1);
  CHECK_EQ_INT(parse("{\"name\":\"l1\"," LLAMA_MODEL "," DATA "," CORE "}", &js2), 0);
  CHECK(memcmp(&js.model, &js2.model, sizeof js.model) == 0);
  CHECK_EQ_INT(jobspec_to_json(&js, &j1), 0);
  CHECK_EQ_INT(parse(j1, &js2), 0);
  CHECK_EQ_INT(jobspec_resolve_init(&js2, dir), 0); /* a canonical spec agrees with its config.json */
  free(j1);
  CHECK_EQ_INT(parse("{\"name\":\"li\",\"model\":{\"init\":\"llama\"," LLAMA_SHAPE ",\"arch\":\"llama\",\"n_kv_head\":2,"
                     "\"intermediate_size\":48,\"rope_theta\":500000}," DATA "," CORE "}", &js), 0);
  CHECK_EQ_INT(jobspec_resolve_init(&js, dir), DPC_ESHAPE);
  unlink(cfg);
  rmdir(sub);
}

/* inner.optimizer "muon": its block only with it, refused values name the field, defaults
 * (weight_decay from inner.weight_decay until given), and the canonical JSON round trip. */
/* The outer momentum schedule: derived from rounds for a new sync spec with momentum that
 * leaves it out (and written into its canonical JSON), none for a stored spec without it, for
 * async, eager or momentum-free jobs, or when the spec sets 0; refused out of range, naming the
 * field; job show's origin line. */
static void test_momentum_schedule(void) {
  static jobspec js;
  char *canon = NULL, origin[256];
  CHECK_EQ_INT(parse("{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"diloco\",\"replicas\":2,\"inner_steps\":5,"
                     "\"rounds\":60,\"batch\":4,\"seq_len\":8}", &js), 0);
  CHECK(js.outer.momentum_warmup == 6 && js.outer.momentum_decay == 12 && jobspec_schedule_is_derived(&js));
  CHECK_EQ_INT(jobspec_to_json(&js, &canon), 0);
  CHECK(canon && strstr(canon, "\"momentum_warmup\":6") && strstr(canon, "\"momentum_decay\":12"));
  static jobspec back;
  CHECK_EQ_INT(jobspec_parse_stored(canon, strlen(canon), &back), 0); /* the stored form keeps it */
  CHECK(back.outer.momentum_warmup == 6 && back.outer.momentum_decay == 12);
  free(canon);
  canon = NULL;
  CHECK_EQ_INT(jobspec_parse_stored("{" BASE "}", strlen("{" BASE "}"), &back), 0); /* stored before it existed */
  CHECK(back.outer.momentum_warmup == 0 && back.outer.momentum_decay == 0 && !jobspec_schedule_is_derived(&back));
  CHECK_EQ_INT(parse("{" BASE ",\"outer\":{\"momentum_warmup\":0,\"momentum_decay\":0}}", &js), 0);
  CHECK(js.outer.momentum_warmup == 0 && js.outer.momentum_decay == 0);
  CHECK_EQ_INT(jobspec_to_json(&js, &canon), 0); /* an explicit 0 stays in the canonical form */
  CHECK(canon && strstr(canon, "\"momentum_warmup\":0") && strstr(canon, "\"momentum_decay\":0"));
  free(canon);
  canon = NULL;
  CHECK_EQ_INT(parse("{" BASE ",\"outer\":{\"lr\":1,\"momentum\":0}}", &js), 0);
  CHECK(js.outer.momentum_warmup == 0 && js.outer.momentum_decay == 0);
  CHECK_EQ_INT(parse("{" BASE ",\"streaming\":{\"overlap_steps\":1,\"eager\":true}}", &js), 0);
  CHECK(js.outer.momentum_warmup == 0 && js.outer.momentum_decay == 0);
  CHECK_EQ_INT(parse("{" BASE ",\"sparse\":{}}", &js), 0); /* SparseLoCo: plain SGD by default */
  CHECK(js.outer.momentum_warmup == 0 && js.outer.momentum_decay == 0);
  CHECK_EQ_INT(parse("{" BASE "}", &js), 0);
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "the defaults for diloco") != NULL);
  CHECK_EQ_INT(parse("{" BASE ",\"outer\":{\"momentum_warmup\":1,\"momentum_decay\":3}}", &js), 0);
  CHECK(js.outer.momentum_warmup == 1 && js.outer.momentum_decay == 3 && !jobspec_schedule_is_derived(&js));
  CHECK_EQ_INT(jobspec_to_json(&js, &canon), 0);
  CHECK(canon && strstr(canon, "\"momentum_warmup\":1") && strstr(canon, "\"momentum_decay\":3"));
  free(canon);
  expect_bad("{" BASE ",\"outer\":{\"momentum_warmup\":4}}", DPC_EINVAL, "outer.momentum_warmup\" = 4 exceeds rounds");
  expect_bad("{" BASE ",\"outer\":{\"momentum_decay\":-1}}", DPC_EINVAL, "outer.momentum_decay");
  expect_bad("{" BASE ",\"outer\":{\"momentum\":0,\"momentum_decay\":2}}", DPC_EINVAL, "no momentum to schedule");
  expect_bad("{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"diloco-async\",\"replicas\":2,\"inner_steps\":5,"
             "\"rounds\":3,\"batch\":4,\"seq_len\":8,\"outer\":{\"momentum_warmup\":1}}",
             DPC_EINVAL, "outer.momentum_warmup\": only with algorithm \"diloco\" or \"dipaco\"");
  expect_bad("{" BASE ",\"outer\":{\"momentum_decay\":1},\"streaming\":{\"overlap_steps\":1,\"eager\":true}}",
             DPC_EINVAL, "leave outer.momentum_warmup and outer.momentum_decay at 0");
  CHECK_EQ_INT(parse("{" BASE ",\"outer\":{\"lr\":0.5}}", &js), 0);
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "set by the job spec: lr (the defaults for diloco") == NULL);
  CHECK_EQ_INT(parse("{" BASE ",\"outer\":{\"lr\":0.6}}", &js), 0);
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "set by the job spec: lr (the defaults for diloco") != NULL);
}

/* The outer lr and momentum a new spec leaves out depend on the job (jobspec_outer_default): a
 * plain diloco job at R <= 2 and H < 20 gets 0.5 / 0.6, written into its canonical JSON and kept
 * when stored; R >= 3, H >= 20, dipaco, async, SparseLoCo and eager streaming keep their kind's defaults; a
 * value the spec gives wins, the other is still derived; job show's origin says which. */
static void test_outer_derived(void) {
  static jobspec js, back;
  char *canon = NULL, origin[320];
#define SPEC_R(alg, r, extra)                                                                                      \
  "{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"" alg "\",\"replicas\":" #r                                \
  ",\"inner_steps\":5,\"rounds\":3,\"batch\":4,\"seq_len\":8" extra "}"
  CHECK_EQ_INT(parse(SPEC_R("diloco", 1, ""), &js), 0);
  CHECK(js.outer.lr == 0.5 && js.outer.momentum == 0.6 && js.outer.nesterov == 1 && jobspec_outer_derived(&js));
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "the defaults for diloco at R = 1, H = 5, 0.00349M parameters in its layers (derived from R, H < 20"));
  CHECK_EQ_INT(parse(SPEC_R("diloco", 2, ""), &js), 0);
  CHECK(js.outer.lr == 0.5 && js.outer.momentum == 0.6 && js.outer.momentum_warmup == 1 && js.outer.momentum_decay == 1);
  CHECK_EQ_INT(jobspec_to_json(&js, &canon), 0);
  CHECK(canon && strstr(canon, "\"lr\":0.5,") && strstr(canon, "\"momentum\":0.6,"));
  CHECK_EQ_INT(jobspec_parse_stored(canon, strlen(canon), &back), 0);
  CHECK(back.outer.lr == 0.5 && back.outer.momentum == 0.6);
  CHECK(strstr(jobspec_outer_origin(&back, origin, sizeof origin), "the defaults for diloco at R = 2"));
  free(canon);
  CHECK_EQ_INT(parse(SPEC_R("diloco", 3, ""), &js), 0);
  CHECK(js.outer.lr == 0.6 && js.outer.momentum == 0.7 && !jobspec_outer_derived(&js));
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "the defaults for diloco (docs/jobspec.md)"));
  CHECK_EQ_INT(parse(SPEC_R("diloco", 8, ""), &js), 0);
  CHECK(js.outer.lr == 0.6 && js.outer.momentum == 0.7);
  static const char h19[] = "{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"diloco\",\"replicas\":2,"
                            "\"inner_steps\":19,\"rounds\":3,\"batch\":4,\"seq_len\":8}";
  CHECK_EQ_INT(parse(h19, &js), 0); /* H < 20: derived */
  CHECK(js.outer.lr == 0.5 && js.outer.momentum == 0.6 && jobspec_outer_derived(&js));
  static const char h20[] = "{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"diloco\",\"replicas\":2,"
                            "\"inner_steps\":20,\"rounds\":3,\"batch\":4,\"seq_len\":8}";
  CHECK_EQ_INT(parse(h20, &js), 0); /* H >= 20: the table's */
  CHECK(js.outer.lr == 0.6 && js.outer.momentum == 0.7 && !jobspec_outer_derived(&js));
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "the defaults for diloco (docs/jobspec.md)"));
  CHECK_EQ_INT(parse(SPEC_R("dipaco", 2, ""), &js), 0);
  CHECK(js.outer.lr == 0.6 && js.outer.momentum == 0.7 && !jobspec_outer_derived(&js));
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "the defaults for dipaco (docs/jobspec.md)"));
  CHECK_EQ_INT(parse(SPEC_R("diloco-async", 2, ""), &js), 0);
  CHECK(js.outer.lr == 0.4 && js.outer.momentum == 0.7);
  CHECK_EQ_INT(parse(SPEC_R("diloco", 2, ",\"sparse\":{}"), &js), 0);
  CHECK(js.outer.lr == 3.0 && js.outer.momentum == 0.0 && js.outer.nesterov == 0);
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "the defaults for SparseLoCo"));
  CHECK_EQ_INT(parse(SPEC_R("diloco", 2, ",\"streaming\":{\"overlap_steps\":1,\"eager\":true}"), &js), 0);
  CHECK(js.outer.lr == 0.6 && js.outer.momentum == 0.7);
  CHECK_EQ_INT(parse(SPEC_R("diloco", 2, ",\"streaming\":{\"fragments\":2}"), &js), 0); /* streaming, not eager */
  CHECK(js.outer.lr == 0.5 && js.outer.momentum == 0.6);
  CHECK_EQ_INT(parse(SPEC_R("diloco", 2, ",\"outer\":{\"lr\":0.7}"), &js), 0);
  CHECK(js.outer.lr == 0.7 && js.outer.momentum == 0.6);
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin),
               "set by the job spec: lr (the defaults for diloco at R = 2, H = 5, 0.00349M parameters in its layers "
               "(derived from R, H < 20 and the model's size): lr 0.5, momentum 0.6"));
  CHECK_EQ_INT(parse(SPEC_R("diloco", 2, ",\"outer\":{\"momentum\":0}"), &js), 0);
  CHECK(js.outer.lr == 0.5 && js.outer.momentum == 0.0 && js.outer.momentum_warmup == 0);
  CHECK_EQ_INT(parse(SPEC_R("diloco", 2, ",\"outer\":{\"lr\":0.6,\"momentum\":0.7}"), &js), 0);
  CHECK(js.outer.lr == 0.6 && js.outer.momentum == 0.7);
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "set by the job spec: lr, momentum"));
  /* A large model (4 layers, C 192: 1.78M parameters in its layers) one notch more, up to R = 4. */
#define BIG "\"model\":{\"n_layer\":4,\"n_head\":4,\"n_embd\":192,\"n_positions\":16,\"vocab_size\":32}"
#define SPEC_BIG(r, h) "{\"name\":\"t1\"," BIG "," DATA ",\"algorithm\":\"diloco\",\"replicas\":" #r ",\"inner_steps\":" #h \
                       ",\"rounds\":3,\"batch\":4,\"seq_len\":8}"
  CHECK_EQ_INT(parse(SPEC_BIG(2, 10), &js), 0);
  CHECK(js.outer.lr == 0.4 && js.outer.momentum == 0.5 && jobspec_outer_derived(&js) == 2);
  CHECK(strstr(jobspec_outer_origin(&js, origin, sizeof origin), "R = 2, H = 10, 1.78M parameters in its layers"));
  CHECK_EQ_INT(parse(SPEC_BIG(4, 10), &js), 0);
  CHECK(js.outer.lr == 0.5 && js.outer.momentum == 0.6 && jobspec_outer_derived(&js) == 1);
  CHECK_EQ_INT(parse(SPEC_BIG(8, 10), &js), 0);
  CHECK(js.outer.lr == 0.6 && js.outer.momentum == 0.7 && jobspec_outer_derived(&js) == 0);
  CHECK_EQ_INT(parse(SPEC_BIG(2, 20), &js), 0);
  CHECK(js.outer.lr == 0.6 && js.outer.momentum == 0.7);
  CHECK_EQ_INT(jobspec_to_json(&js, &canon), 0); /* a stored large job keeps what it was given */
  CHECK_EQ_INT(jobspec_parse_stored(canon, strlen(canon), &back), 0);
  CHECK(back.outer.lr == 0.6 && back.outer.momentum == 0.7);
  free(canon);
  canon = NULL;
  CHECK_EQ_INT(parse(SPEC_BIG(2, 10) , &js), 0);
  CHECK_EQ_INT(jobspec_to_json(&js, &canon), 0); /* its canonical form parses back to the same step */
  CHECK_EQ_INT(parse(canon, &back), 0);
  CHECK(back.outer.lr == 0.4 && back.outer.momentum == 0.5);
  free(canon);
#undef SPEC_BIG
#undef BIG
#undef SPEC_R
}

static void test_muon(void) {
  static jobspec js, js2;
  char *canon = NULL;
  CHECK_EQ_INT(parse("{" BASE "}", &js), 0);
  CHECK(js.inner.optimizer == INNER_OPT_ADAMW);
  CHECK_EQ_INT(jobspec_to_json(&js, &canon), 0);
  CHECK(canon && !strstr(canon, "optimizer") && !strstr(canon, "muon")); /* adamw specs keep their bytes */
  free(canon);
  expect_bad("{" BASE ",\"inner\":{\"muon\":{\"lr\":0.01}}}", DPC_EINVAL, "only with inner.optimizer \"muon\"");
  expect_bad("{" BASE ",\"inner\":{\"optimizer\":\"sgd\"}}", DPC_EINVAL, "inner.optimizer");
  expect_bad("{" BASE ",\"inner\":{\"optimizer\":\"muon\",\"muon\":{\"adjust_lr\":\"rms\"}}}", DPC_EINVAL,
             "inner.muon.adjust_lr");
  expect_bad("{" BASE ",\"inner\":{\"optimizer\":\"muon\",\"muon\":{\"lr\":0}}}", DPC_EINVAL, "inner.muon.lr");
  expect_bad("{" BASE ",\"inner\":{\"optimizer\":\"muon\",\"muon\":{\"momentum\":1}}}", DPC_EINVAL,
             "inner.muon.momentum");
  expect_bad("{" BASE ",\"inner\":{\"optimizer\":\"muon\",\"muon\":{\"ns_steps\":21}}}", DPC_EINVAL,
             "inner.muon.ns_steps");
  expect_bad("{" BASE ",\"inner\":{\"optimizer\":\"muon\",\"muon\":{\"weight_decay\":-1}}}", DPC_EINVAL,
             "inner.muon.weight_decay");
  CHECK_EQ_INT(parse("{" BASE ",\"inner\":{\"optimizer\":\"muon\",\"weight_decay\":0.2}}", &js), 0);
  CHECK(js.inner.optimizer == INNER_OPT_MUON && js.inner.muon.lr == 0.02 && js.inner.muon.momentum == 0.95 &&
        js.inner.muon.nesterov == 1 && js.inner.muon.ns_steps == 5 && js.inner.muon.adjust_lr == GPT_MUON_ADJUST_ORIGINAL);
  CHECK(!js.inner.muon.has_weight_decay && jobspec_muon_weight_decay(&js) == 0.2);
  CHECK_EQ_INT(parse("{" BASE ",\"inner\":{\"optimizer\":\"muon\",\"muon\":{\"lr\":0.05,\"nesterov\":false,"
                     "\"weight_decay\":0,\"adjust_lr\":\"match_rms_adamw\"}}}", &js), 0);
  CHECK(js.inner.muon.lr == 0.05 && js.inner.muon.nesterov == 0 && js.inner.muon.has_weight_decay &&
        jobspec_muon_weight_decay(&js) == 0.0 && js.inner.muon.adjust_lr == GPT_MUON_ADJUST_MATCH_RMS_ADAMW);
  CHECK_EQ_INT(jobspec_to_json(&js, &canon), 0);
  CHECK(canon && strstr(canon, "\"optimizer\":\"muon\"") && strstr(canon, "\"adjust_lr\":\"match_rms_adamw\""));
  CHECK_EQ_INT(canon ? parse(canon, &js2) : -1, 0);
  CHECK(js2.inner.muon.lr == 0.05 && js2.inner.muon.has_weight_decay && js2.inner.muon.nesterov == 0 &&
        js2.inner.muon.adjust_lr == GPT_MUON_ADJUST_MATCH_RMS_ADAMW && js2.inner.optimizer == INNER_OPT_MUON);
  free(canon);
}

int main(void) {
  static jobspec js, js2;
  static gpt_layout lay;

  /* Data globs that could expand to ".." are refused at job create; a hidden
   * directory is fine. */
  expect_bad("{\"name\":\"t1\"," MODEL ",\"data\":{\"train\":[\"a/.?/x.bin\"]}," CORE "}", DPC_EINVAL,
             "could match \"..\"");
  expect_bad("{\"name\":\"t1\"," MODEL ",\"data\":{\"train\":[\".*/etc/passwd\"]}," CORE "}", DPC_EINVAL,
             "the component \".*\"");
  CHECK_EQ_INT(parse("{\"name\":\"t1\"," MODEL ",\"data\":{\"train\":[\".cache/x*.bin\"]}," CORE "}", &js), 0);
  /* Loose bytes are refused: text after the object, NUL raw or escaped, bad UTF-8. */
  expect_bad("{" BASE "} x", DPC_EFORMAT, "text after the JSON object");
  expect_bad("{" BASE ",\"name\":\"a\\u0000b\"}", DPC_EFORMAT, "escaped NUL");
  {
    static const char raw[] = "{\"name\":\"a\0b\"}";
    CHECK_EQ_INT(jobspec_parse(raw, sizeof raw - 1, &js), DPC_EFORMAT);
    CHECK(strstr(dpc_errmsg(), "NUL byte") != NULL);
  }
  expect_bad("{\"name\":\"caf\xe9\"}", DPC_EFORMAT, "not valid UTF-8");
  expect_bad("{\"name\":\"\xc0\xaf\"}", DPC_EFORMAT, "not valid UTF-8");
  /* Valid UTF-8 and an escaped backslash before "u0000" pass the byte check (the name's own
   * rule refuses them next), and trailing whitespace is fine. */
  expect_bad("{\"name\":\"caf\xc3\xa9 \\\\u0000\"," MODEL "," DATA "," CORE "}  \n", DPC_EINVAL,
             "use only letters");
  CHECK_EQ_INT(parse("{" BASE "}  \n", &js), 0);

  /* A minimal valid spec gets the documented defaults. */
  CHECK_EQ_INT(parse("{" BASE "}", &js), 0);
  CHECK(strcmp(js.name, "t1") == 0);
  CHECK_EQ_INT(js.has_shape, 1);
  CHECK_EQ_INT(js.model.n_layer, 4);
  CHECK_EQ_INT(js.algorithm, JOB_ALGO_DILOCO);
  CHECK_EQ_INT(js.replicas, 2);
  CHECK_EQ_INT(js.n_train, 1);
  CHECK(strcmp(js.train[0], "shards/train_*.bin") == 0);
  CHECK_EQ_INT(js.n_val, 0);
  CHECK(js.inner.lr == 3e-4 && js.inner.lr_min_frac == 0.1 && js.inner.weight_decay == 0.1);
  CHECK(js.inner.beta1 == 0.9 && js.inner.beta2 == 0.95 && js.inner.eps == 1e-8 && js.inner.grad_clip == 1.0);
  CHECK_EQ_INT(js.inner.warmup, 0);
  CHECK_EQ_INT(js.inner.state, INNER_STATE_KEEP);
  CHECK(js.outer.lr == 0.5 && js.outer.momentum == 0.6 && js.outer.nesterov == 1 && js.outer.delta_norm_screen == 0);
  /* diloco-async has its own outer defaults (lr 0.4, momentum 0.7); given values win over either. */
  CHECK_EQ_INT(parse("{\"name\":\"a\"," MODEL "," DATA ",\"algorithm\":\"diloco-async\",\"replicas\":2,"
                     "\"inner_steps\":5,\"rounds\":3,\"batch\":4,\"seq_len\":8}", &js2), 0);
  CHECK(js2.outer.lr == 0.4 && js2.outer.momentum == 0.7);
  CHECK_EQ_INT(parse("{\"name\":\"a\"," MODEL "," DATA ",\"algorithm\":\"diloco-async\",\"replicas\":2,"
                     "\"inner_steps\":5,\"rounds\":3,\"batch\":4,\"seq_len\":8,\"outer\":{\"lr\":0.5}}", &js2), 0);
  CHECK(js2.outer.lr == 0.5 && js2.outer.momentum == 0.7);
  CHECK(js.quorum == 1.0 && js.round_timeout_s == 3600.0);
  CHECK_EQ_INT(js.versions.keep_last, 2);
  CHECK_EQ_INT(js.versions.keep_every, 0);
  CHECK_EQ_INT(js.weighting, WEIGHTING_UNIFORM);
  CHECK_EQ_INT(jobspec_total_steps(&js), 15);
  CHECK_EQ_INT(js.n_levels, 1);
  CHECK_EQ_INT(js.levels[0].layer_end, 4);
  CHECK_EQ_INT(jobspec_n_paths(&js), 1);
  CHECK_EQ_INT(jobspec_n_slots(&js), 2);

  /* Plain DiLoCo: one module = one fragment = the whole model. */
  CHECK_EQ_INT(jobspec_layout(&js, &lay), 0);
  jobspec_fragment fr[8];
  jobspec_module mo[8];
  CHECK_EQ_INT(jobspec_fragments(&js, &lay, fr, 8), 1);
  CHECK_EQ_INT(fr[0].offset, 0);
  CHECK_EQ_INT(fr[0].len, lay.n_params);
  CHECK_EQ_INT(jobspec_modules(&js, &lay, mo, 0), 1); /* sizing call */

  /* Every field given; canonical JSON round-trips to the same canonical JSON. */
  const char *full =
      "{\"name\":\"full-run_2\",\"model\":{\"n_layer\":4,\"n_head\":2,\"n_embd\":8,\"n_positions\":16,"
      "\"vocab_size\":32,\"seed\":1234},\"data\":{\"train\":[\"a.bin\",\"dir/b_*.bin\"],\"val\":[\"v.bin\"]},"
      "\"algorithm\":\"dipaco\",\"replicas\":3,\"inner_steps\":10,\"rounds\":7,\"batch\":2,\"seq_len\":16,"
      "\"inner\":{\"lr\":0.001,\"warmup\":5,\"lr_min_frac\":1,\"weight_decay\":0,\"beta1\":0.8,\"beta2\":0.99,"
      "\"eps\":1e-6,\"grad_clip\":0,\"state\":\"checkpoint\"},"
      "\"outer\":{\"lr\":0.5,\"momentum\":0.8,\"nesterov\":false,\"rule\":\"sgd\",\"delay_buffer\":4,\"c\":0.25,"
      "\"delta_norm_screen\":8},"
      "\"max_staleness\":3,\"dylu\":{\"enabled\":true,\"min_steps\":4},"
      "\"levels\":[{\"stem\":true,\"layers\":[0,0],\"modules\":1},{\"layers\":[0,2],\"modules\":2},"
      "{\"layers\":[2,4],\"modules\":3}],"
      "\"quorum\":0.5,\"round_timeout_s\":60,\"quorum_grace_s\":2.5,\"weighting\":\"tokens\","
      "\"versions\":{\"keep_last\":3,\"keep_every\":10}}";
  CHECK_EQ_INT(parse(full, &js), 0);
  CHECK_EQ_INT(js.seed, 1234);
  CHECK_EQ_INT(js.n_val, 1);
  CHECK_EQ_INT(js.inner.state, INNER_STATE_CHECKPOINT);
  CHECK_EQ_INT(js.outer.nesterov, 0);
  CHECK_EQ_INT(js.outer.async_rule, OUTER_ASYNC_SGD);
  CHECK_EQ_INT(js.outer.buffer, 4);
  CHECK_EQ_INT(js.max_staleness, 3);
  CHECK_EQ_INT(js.dylu.enabled, 1);
  CHECK_EQ_INT(js.dylu.min_steps, 4);
  CHECK_EQ_INT(js.weighting, WEIGHTING_TOKENS);
  char *j1 = NULL, *j2 = NULL;
  CHECK_EQ_INT(jobspec_to_json(&js, &j1), 0);
  CHECK_EQ_INT(parse(j1, &js2), 0);
  CHECK_EQ_INT(jobspec_to_json(&js2, &j2), 0);
  CHECK(j1 && j2 && strcmp(j1, j2) == 0);
  CHECK(js2.inner.lr == 0.001 && js2.inner.eps == 1e-6 && js2.outer.c == 0.25 && js2.quorum == 0.5);
  CHECK(js2.outer.delta_norm_screen == 8);
  CHECK(js2.has_quorum_grace && js2.quorum_grace_s == 2.5 && strstr(j1, "\"quorum_grace_s\":2.5"));
  CHECK(js2.versions.keep_last == 3 && js2.versions.keep_every == 10);
  free(j1);
  free(j2);

  /* DiPaCo structure: levels {stem}, {layers 0-1, K=2}, {layers 2-3, K=3} → 6 modules, 6 paths. */
  CHECK_EQ_INT(jobspec_n_modules(&js), 6);
  CHECK_EQ_INT(jobspec_n_paths(&js), 6);
  CHECK_EQ_INT(jobspec_n_slots(&js), 18);
  CHECK_EQ_INT(jobspec_layout(&js, &lay), 0);
  CHECK_EQ_INT(jobspec_modules(&js, &lay, mo, 8), 6);
  CHECK_EQ_INT(mo[0].offset, 0);
  CHECK_EQ_INT(mo[0].len, lay.stem_end);
  CHECK_EQ_INT(mo[1].offset, lay.layer_off[0]);
  CHECK_EQ_INT(mo[1].len, lay.layer_off[2] - lay.layer_off[0]);
  CHECK_EQ_INT(mo[2].offset, mo[1].offset);
  CHECK_EQ_INT(mo[2].level, 1);
  CHECK_EQ_INT(mo[2].index, 1);
  CHECK_EQ_INT(mo[5].offset, lay.layer_off[2]);
  CHECK_EQ_INT(mo[5].offset + mo[5].len, lay.n_params);
  CHECK_EQ_INT(jobspec_fragments(&js, &lay, fr, 8), 6);
  CHECK_EQ_INT(fr[4].module, 4);
  CHECK_EQ_INT(fr[4].offset, mo[4].offset);
  int mods[JOBSPEC_MAX_LEVELS];
  /* Path p = (k1, k2) with the last level fastest: p = k1·3 + k2. */
  CHECK_EQ_INT(jobspec_path_modules(&js, 5, mods), 3);
  CHECK(mods[0] == 0 && mods[1] == 2 && mods[2] == 5);
  CHECK_EQ_INT(jobspec_path_modules(&js, 1, mods), 3);
  CHECK(mods[0] == 0 && mods[1] == 1 && mods[2] == 4);
  CHECK_EQ_INT(jobspec_path_has_module(&js, 3, 2), 1);
  CHECK_EQ_INT(jobspec_path_has_module(&js, 3, 1), 0);
  CHECK_EQ_INT(jobspec_path_modules(&js, 6, mods), DPC_ERANGE);
  int per_module[6] = {0};
  for (int p = 0; p < 6; p++)
    for (int m = 0; m < 6; m++) per_module[m] += jobspec_path_has_module(&js, p, m);
  CHECK(per_module[0] == 6 && per_module[1] == 3 && per_module[2] == 3 && per_module[3] == 2 && per_module[5] == 2);

  /* Bad specs, one per kind of mistake. */
  expect_bad("", DPC_EFORMAT, "empty");
  expect_bad("{\"name\":", DPC_EFORMAT, "not valid JSON");
  expect_bad("[1,2]", DPC_EINVAL, "JSON object");
  expect_bad("{" BASE ",\"inner\":{\"lrr\":0.1}}", DPC_EINVAL, "unknown field \"inner.lrr\"");
  expect_bad("{" BASE ",\"extra\":1}", DPC_EINVAL, "unknown field \"extra\"");
  expect_bad("{" BASE ",\"versions\":{\"keep_last\":1}}", DPC_EINVAL, "versions.keep_last");
  expect_bad("{" BASE ",\"versions\":{\"keep_every\":-1}}", DPC_EINVAL, "versions.keep_every");
  expect_bad("{" BASE ",\"versions\":{\"every\":5}}", DPC_EINVAL, "unknown field \"versions.every\"");
  expect_bad("{" BASE ",\"outer\":{\"lr\":0.7,\"lr\":0.5}}", DPC_EINVAL, "duplicate field \"outer.lr\"");
  expect_bad("{\"name\":\"t1\",\"model\":{\"n_layer\":4,\"n_head\":2,\"n_embd\":8,\"n_positions\":16,\"vocab_size\":32,"
             "\"dropout\":0.1}," DATA "," CORE "}",
             DPC_EINVAL, "unknown field \"model.dropout\"");
  expect_bad("{\"name\":\"t1\"," MODEL ",\"data\":{\"train\":[\"a\"],\"test\":[]}," CORE "}", DPC_EINVAL,
             "unknown field \"data.test\"");
  expect_bad("{" BASE ",\"levels\":[{\"stem\":true,\"layers\":[0,4],\"modules\":1,\"k\":2}]}", DPC_EINVAL,
             "unknown field \"levels[0].k\"");
  expect_bad("{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"diloco\",\"replicas\":2,\"inner_steps\":5,"
             "\"batch\":4,\"seq_len\":8}",
             DPC_EINVAL, "missing field \"rounds\"");
  expect_bad("{\"name\":\"t1\"," DATA "," CORE "}", DPC_EINVAL, "missing field \"model\"");
  expect_bad("{\"name\":\"t1\",\"model\":{\"n_layer\":4}," DATA "," CORE "}", DPC_EINVAL, "missing field \"model.n_head\"");
  expect_bad("{" BASE ",\"inner\":{\"lr\":\"fast\"}}", DPC_EINVAL, "field \"inner.lr\": expected a number");
  expect_bad("{" BASE ",\"outer\":{\"nesterov\":1}}", DPC_EINVAL, "field \"outer.nesterov\": expected true or false");
  expect_bad("{\"name\":7," MODEL "," DATA "," CORE "}", DPC_EINVAL, "field \"name\": expected a string");
  expect_bad("{\"name\":\"t 1\"," MODEL "," DATA "," CORE "}", DPC_EINVAL, "field \"name\"");
  expect_bad("{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"diloco\",\"replicas\":2.5,\"inner_steps\":5,"
             "\"rounds\":3,\"batch\":4,\"seq_len\":8}",
             DPC_EINVAL, "field \"replicas\" = 2.5: expected an integer");
  expect_bad("{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"diloco\",\"replicas\":0,\"inner_steps\":5,"
             "\"rounds\":3,\"batch\":4,\"seq_len\":8}",
             DPC_EINVAL, "field \"replicas\" = 0 out of range");
  expect_bad("{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"diloco\",\"replicas\":2,\"inner_steps\":5,"
             "\"rounds\":3,\"batch\":4,\"seq_len\":32}",
             DPC_EINVAL, "field \"seq_len\" = 32 exceeds model.n_positions = 16");
  expect_bad("{\"name\":\"t1\"," MODEL "," DATA ",\"algorithm\":\"streaming\",\"replicas\":2,\"inner_steps\":5,"
             "\"rounds\":3,\"batch\":4,\"seq_len\":8}",
             DPC_EINVAL, "field \"algorithm\" = \"streaming\": expected one of diloco, diloco-async, dipaco");
  expect_bad("{" BASE ",\"inner\":{\"state\":\"save\"}}", DPC_EINVAL, "field \"inner.state\" = \"save\"");
  expect_bad("{" BASE ",\"inner\":{\"beta2\":1.0}}", DPC_EINVAL, "field \"inner.beta2\" = 1 out of range [0, 1)");
  expect_bad("{" BASE ",\"inner\":{\"lr\":0}}", DPC_EINVAL, "field \"inner.lr\" = 0 out of range (0, 10]");
  expect_bad("{" BASE ",\"inner\":{\"warmup\":100}}", DPC_EINVAL, "field \"inner.warmup\" = 100 out of range [0, 15]");
  expect_bad("{" BASE ",\"outer\":{\"momentum\":-0.1}}", DPC_EINVAL, "field \"outer.momentum\"");
  expect_bad("{" BASE ",\"outer\":{\"delay_buffer\":4,\"c\":0.5}}", DPC_EINVAL,
             "field \"outer.c\" = 0.5 exceeds 1/outer.delay_buffer");
  expect_bad("{" BASE ",\"outer\":{\"rule\":\"sgd\",\"async\":\"sgd\"}}", DPC_EINVAL, "old name of \"outer.rule\"");
  expect_bad("{" BASE ",\"outer\":{\"rule\":\"adam\"}}", DPC_EINVAL, "outer.rule");
  expect_bad("{" BASE ",\"dylu\":{\"enabled\":true,\"min_steps\":0}}", DPC_EINVAL, "dylu.min_steps");
  expect_bad("{" BASE ",\"dylu\":{\"on\":true}}", DPC_EINVAL, "dylu.on");
  expect_bad("{" BASE ",\"max_staleness\":-1}", DPC_EINVAL, "max_staleness");
  expect_bad("{" BASE ",\"outer\":{\"delta_norm_screen\":1.5}}", DPC_EINVAL,
             "field \"outer.delta_norm_screen\" = 1.5 out of range [2, 1e+06]");
  expect_bad("{" BASE ",\"outer\":{\"delta_norm_screen\":-3}}", DPC_EINVAL, "outer.delta_norm_screen");
  expect_bad("{" BASE ",\"outer\":{\"delta_norm_screen\":1e9}}", DPC_EINVAL, "outer.delta_norm_screen");
  {
    /* The older names "async"/"buffer" are still accepted. */
    jobspec old;
    CHECK_EQ_INT(parse("{" BASE ",\"outer\":{\"async\":\"nesterov\",\"buffer\":2}}", &old), 0);
    CHECK_EQ_INT(old.outer.async_rule, OUTER_ASYNC_NESTEROV);
    CHECK_EQ_INT(old.outer.buffer, 2);
    CHECK_EQ_INT(old.dylu.enabled, 0);
    CHECK_EQ_INT(old.max_staleness, 0);
  }
  expect_bad("{" BASE ",\"quorum\":0}", DPC_EINVAL, "field \"quorum\" = 0 out of range (0, 1]");
  expect_bad("{" BASE ",\"quorum\":1.5}", DPC_EINVAL, "field \"quorum\" = 1.5 out of range (0, 1]");
  /* quorum_grace_s: optional, >= 0, sync jobs only; written back only when given. */
  expect_bad("{" BASE ",\"quorum\":0.5,\"quorum_grace_s\":-1}", DPC_EINVAL,
             "field \"quorum_grace_s\" = -1: must be >= 0");
  expect_bad("{" BASE ",\"quorum_grace_s\":\"2\"}", DPC_EINVAL, "field \"quorum_grace_s\": expected a number");
  expect_bad("{" BASE ",\"quorum_grace_s\":1e12}", DPC_EINVAL, "field \"quorum_grace_s\" = 1e+12 out of range");
  expect_bad("{\"name\":\"a\"," MODEL "," DATA ",\"algorithm\":\"diloco-async\",\"replicas\":2,\"inner_steps\":4,"
             "\"rounds\":2,\"batch\":1,\"seq_len\":8,\"quorum_grace_s\":1}",
             DPC_EINVAL, "field \"quorum_grace_s\": a diloco-async job applies every delta as it comes");
  {
    jobspec g;
    char *jg = NULL;
    CHECK_EQ_INT(parse("{" BASE "}", &g), 0);
    CHECK(!g.has_quorum_grace);
    CHECK_EQ_INT(jobspec_to_json(&g, &jg), 0);
    CHECK(jg && !strstr(jg, "quorum_grace_s"));
    free(jg);
    CHECK_EQ_INT(parse("{" BASE ",\"quorum\":0.5,\"quorum_grace_s\":0}", &g), 0);
    CHECK(g.has_quorum_grace && g.quorum_grace_s == 0);
  }
  expect_bad("{" BASE ",\"weighting\":\"loss\"}", DPC_EINVAL, "field \"weighting\" = \"loss\"");
  expect_bad("{\"name\":\"t1\"," MODEL ",\"data\":{\"train\":[]}," CORE "}", DPC_EINVAL, "field \"data.train\": needs at least one");
  expect_bad("{\"name\":\"t1\"," MODEL ",\"data\":{\"train\":[\"/etc/passwd\"]}," CORE "}", DPC_EINVAL,
             "field \"data.train[0]\" = \"/etc/passwd\": must be relative");
  expect_bad("{\"name\":\"t1\"," MODEL ",\"data\":{\"train\":[\"a\",\"x/../../y\"]}," CORE "}", DPC_EINVAL,
             "field \"data.train[1]\"");
  expect_bad("{\"name\":\"t1\"," MODEL ",\"data\":{\"train\":\"a.bin\"}," CORE "}", DPC_EINVAL,
             "field \"data.train\": expected an array");
  expect_bad("{\"name\":\"t1\",\"model\":{\"n_layer\":4,\"n_head\":3,\"n_embd\":8,\"n_positions\":16,\"vocab_size\":32},"
             DATA "," CORE "}",
             DPC_EINVAL, "divisible");
  expect_bad("{\"name\":\"t1\",\"model\":{\"n_layer\":4,\"n_head\":2,\"n_embd\":8,\"n_positions\":16,\"vocab_size\":32,"
             "\"seed\":-1}," DATA "," CORE "}",
             DPC_EINVAL, "field \"model.seed\"");
  expect_bad("{" BASE ",\"levels\":[{\"stem\":true,\"layers\":[0,2],\"modules\":1},{\"layers\":[3,4],\"modules\":1}]}",
             DPC_EINVAL, "field \"levels[1].layers\": starts at layer 3, expected 2");
  expect_bad("{" BASE ",\"levels\":[{\"stem\":true,\"layers\":[0,3],\"modules\":1}]}", DPC_EINVAL,
             "the last level ends at layer 3, expected model.n_layer = 4");
  expect_bad("{" BASE ",\"levels\":[{\"layers\":[0,4],\"modules\":1}]}", DPC_EINVAL, "field \"levels[0].stem\"");
  expect_bad("{" BASE ",\"levels\":[{\"stem\":true,\"layers\":[0,4],\"modules\":2}]}", DPC_EINVAL,
             "algorithm \"diloco\" trains one path");
  expect_bad("{" BASE ",\"levels\":[{\"stem\":true,\"layers\":[0,4],\"modules\":0}]}", DPC_EINVAL,
             "field \"levels[0].modules\" = 0 out of range");
  expect_bad("{" BASE ",\"levels\":[]}", DPC_EINVAL, "needs at least one level");
  expect_bad("{\"name\":\"t1\",\"model\":[]," DATA "," CORE "}", DPC_EINVAL, "field \"model\": expected an object");

  /* data.paths: one list per path, in path numbering; round trip; bad lists. */
#define DP_CORE "\"algorithm\":\"dipaco\",\"replicas\":2,\"inner_steps\":5,\"rounds\":3,\"batch\":4,\"seq_len\":8"
#define DP_LEVELS ",\"levels\":[{\"stem\":true,\"layers\":[0,2],\"modules\":2},{\"layers\":[2,4],\"modules\":2}]"
  {
    const char *ok = "{\"name\":\"dp\"," MODEL ",\"data\":{\"paths\":[[\"r/path_0/*.bin\"],[\"r/path_1/*.bin\",\"x.bin\"],"
                     "[\"r/path_2/*.bin\"],[\"r/path_3/*.bin\"]]}," DP_CORE DP_LEVELS "}";
    CHECK_EQ_INT(parse(ok, &js), 0);
    CHECK_EQ_INT(js.n_data_paths, 4);
    CHECK_EQ_INT(js.n_train, 0);
    const char(*d)[JOBSPEC_PATH_MAX] = NULL;
    CHECK_EQ_INT(jobspec_path_data(&js, 1, &d), 2);
    CHECK(d && strcmp(d[0], "r/path_1/*.bin") == 0 && strcmp(d[1], "x.bin") == 0);
    CHECK_EQ_INT(jobspec_path_data(&js, 3, &d), 1);
    CHECK(d && strcmp(d[0], "r/path_3/*.bin") == 0);
    CHECK_EQ_INT(jobspec_path_data(&js, 4, &d), DPC_ERANGE);
    char *jp = NULL;
    CHECK_EQ_INT(jobspec_to_json(&js, &jp), 0);
    CHECK(jp && strstr(jp, "\"paths\":[[\"r/path_0/*.bin\"],[\"r/path_1/*.bin\",\"x.bin\"]") && !strstr(jp, "\"train\""));
    CHECK_EQ_INT(parse(jp, &js2), 0);
    CHECK(memcmp(&js, &js2, sizeof js) == 0);
    free(jp);
    /* data.train: every path reads it. */
    CHECK_EQ_INT(parse("{" BASE "}", &js), 0);
    CHECK_EQ_INT(jobspec_path_data(&js, 0, &d), 1);
  }
  expect_bad("{\"name\":\"dp\"," MODEL ",\"data\":{\"paths\":[[\"a\"],[\"b\"],[\"c\"]]}," DP_CORE DP_LEVELS "}",
             DPC_EINVAL, "field \"data.paths\": 3 lists for 4 paths");
  expect_bad("{\"name\":\"dp\"," MODEL ",\"data\":{\"paths\":[[\"a\"],[],[\"c\"],[\"d\"]]}," DP_CORE DP_LEVELS "}",
             DPC_EINVAL, "field \"data.paths[1]\": path 1 has no data");
  expect_bad("{\"name\":\"dp\"," MODEL ",\"data\":{\"paths\":[[\"a\"],[\"b\"],[\"/c\"],[\"d\"]]}," DP_CORE DP_LEVELS "}",
             DPC_EINVAL, "field \"data.paths[2][0]\" = \"/c\": must be relative");
  expect_bad("{\"name\":\"dp\"," MODEL ",\"data\":{\"paths\":[\"a\",\"b\",\"c\",\"d\"]}," DP_CORE DP_LEVELS "}",
             DPC_EINVAL, "field \"data.paths[0]\": expected a list of paths");
  expect_bad("{\"name\":\"dp\"," MODEL ",\"data\":{\"paths\":[]}," DP_CORE DP_LEVELS "}", DPC_EINVAL,
             "field \"data.paths\": needs one list per path");
  expect_bad("{\"name\":\"dp\"," MODEL ",\"data\":{\"train\":[\"a\"],\"paths\":[[\"a\"]]}," CORE "}", DPC_EINVAL,
             "give one of them");

  /* "init": shape unknown until resolved; then checks run against config.json. */
  char dir[] = "/tmp/dpc_jobspec_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char sub[128], cfg[160];
  snprintf(sub, sizeof sub, "%s/base", dir);
  CHECK(mkdir(sub, 0700) == 0);
  snprintf(cfg, sizeof cfg, "%s/config.json", sub);
  FILE *f = fopen(cfg, "w");
  CHECK(f != NULL);
  if (f) {
    fputs("{\"n_layer\":2,\"n_head\":2,\"n_embd\":8,\"n_positions\":8,\"vocab_size\":32,\"model_type\":\"gpt2\"}", f);
    fclose(f);
  }
  CHECK_EQ_INT(parse("{\"name\":\"ft\",\"model\":{\"init\":\"base\"}," DATA "," CORE "}", &js), 0);
  CHECK_EQ_INT(js.has_shape, 0);
  CHECK_EQ_INT(jobspec_layout(&js, &lay), DPC_ESTATE);
  CHECK_EQ_INT(jobspec_resolve_init(&js, dir), 0);
  CHECK_EQ_INT(js.has_shape, 1);
  CHECK_EQ_INT(js.model.n_layer, 2);
  CHECK_EQ_INT(js.levels[0].layer_end, 2);
  CHECK_EQ_INT(jobspec_to_json(&js, &j1), 0);
  CHECK(j1 && strstr(j1, "\"init\":\"base\"") && strstr(j1, "\"n_layer\":2"));
  CHECK_EQ_INT(parse(j1, &js2), 0);
  CHECK_EQ_INT(js2.has_shape, 1);
  free(j1);
  /* A large init model: the outer step derived from R alone until the shape is known, then from
   * its size too (jobspec_derive_outer on the spec text); a value the text gives stays. */
  snprintf(sub, sizeof sub, "%s/big", dir);
  CHECK(mkdir(sub, 0700) == 0);
  snprintf(cfg, sizeof cfg, "%s/config.json", sub);
  if ((f = fopen(cfg, "w"))) {
    fputs("{\"n_layer\":4,\"n_head\":4,\"n_embd\":192,\"n_positions\":8,\"vocab_size\":32,\"model_type\":\"gpt2\"}", f);
    fclose(f);
  }
  static const char big[] = "{\"name\":\"ft\",\"model\":{\"init\":\"big\"}," DATA "," CORE "}";
  CHECK_EQ_INT(parse(big, &js), 0);
  CHECK(js.outer.lr == 0.5 && js.outer.momentum == 0.6);
  CHECK_EQ_INT(jobspec_resolve_init(&js, dir), 0);
  CHECK_EQ_INT(jobspec_derive_outer(&js, big, strlen(big)), 0);
  CHECK(js.outer.lr == 0.4 && js.outer.momentum == 0.5);
  static const char big_lr[] = "{\"name\":\"ft\",\"model\":{\"init\":\"big\"}," DATA "," CORE ",\"outer\":{\"lr\":0.7}}";
  CHECK_EQ_INT(parse(big_lr, &js), 0);
  CHECK_EQ_INT(jobspec_resolve_init(&js, dir), 0);
  CHECK_EQ_INT(jobspec_derive_outer(&js, big_lr, strlen(big_lr)), 0);
  CHECK(js.outer.lr == 0.7 && js.outer.momentum == 0.5);
  unlink(cfg);
  rmdir(sub);
  snprintf(sub, sizeof sub, "%s/base", dir);
  snprintf(cfg, sizeof cfg, "%s/config.json", sub);
  /* seq_len 16 > the init model's n_positions 8: caught at resolve time. */
  CHECK_EQ_INT(parse("{\"name\":\"ft\",\"model\":{\"init\":\"base\"}," DATA ",\"algorithm\":\"diloco\",\"replicas\":2,"
                     "\"inner_steps\":5,\"rounds\":3,\"batch\":4,\"seq_len\":16}",
                     &js),
               0);
  CHECK_EQ_INT(jobspec_resolve_init(&js, dir), DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "seq_len") != NULL);
  CHECK_EQ_INT(parse("{\"name\":\"ft\",\"model\":{\"init\":\"missing\"}," DATA "," CORE "}", &js), 0);
  CHECK_EQ_INT(jobspec_resolve_init(&js, dir), DPC_ENOENT);
  CHECK(strstr(dpc_errmsg(), "missing/config.json") != NULL);
  /* Streaming: the block, its checks, and per-layer fragments with strided sync groups
   * (layer l with group l mod F, the stem with group 0). */
  {
    CHECK_EQ_INT(parse("{" BASE ",\"streaming\":{\"fragments\":2,\"overlap_steps\":1,\"alpha\":0.5,"
                       "\"codec\":\"e3m0\",\"block_floats\":64}}", &js), 0);
    CHECK(jobspec_streaming(&js) && js.streaming.codec == DPC_CODEC_E3M0 && js.streaming.block_floats == 64);
    CHECK_EQ_INT(jobspec_streaming_offset(&js, 0), 0);
    CHECK_EQ_INT(jobspec_streaming_offset(&js, 1), 2); /* floor(1·5/2) */
    char *sj = NULL, *sj2 = NULL;
    CHECK_EQ_INT(jobspec_to_json(&js, &sj), 0);
    CHECK_EQ_INT(parse(sj, &js2), 0);
    CHECK_EQ_INT(jobspec_to_json(&js2, &sj2), 0);
    CHECK(sj && sj2 && strcmp(sj, sj2) == 0 && strstr(sj, "\"codec\":\"e3m0\""));
    free(sj);
    free(sj2);
    CHECK_EQ_INT(jobspec_layout(&js, &lay), 0);
    jobspec_fragment fr[8];
    CHECK_EQ_INT(jobspec_fragments(&js, &lay, fr, 8), 5); /* stem + 4 layers */
    CHECK(fr[0].offset == 0 && fr[0].len == lay.stem_end && fr[0].group == 0);
    for (int l = 0; l < 4; l++)
      CHECK(fr[l + 1].offset == lay.layer_off[l] && fr[l + 1].group == l % 2 && fr[l + 1].module == 0);
    /* A codec alone keeps plain DiLoCo's one fragment. */
    CHECK_EQ_INT(parse("{" BASE ",\"streaming\":{\"codec\":\"int8\"}}", &js), 0);
    CHECK(!jobspec_streaming(&js) && jobspec_fragments(&js, &lay, fr, 8) == 1);
    CHECK_EQ_INT(parse("{\"name\":\"a\"," MODEL "," DATA ",\"algorithm\":\"diloco-async\",\"replicas\":2,"
                       "\"inner_steps\":5,\"rounds\":3,\"batch\":4,\"seq_len\":8,\"streaming\":{\"codec\":\"fp8\"}}",
                       &js), 0);
    expect_bad("{\"name\":\"a\"," MODEL "," DATA ",\"algorithm\":\"diloco-async\",\"replicas\":2,\"inner_steps\":5,"
               "\"rounds\":3,\"batch\":4,\"seq_len\":8,\"streaming\":{\"fragments\":2}}", DPC_EINVAL,
               "takes a delta codec only");
    expect_bad("{\"name\":\"d\"," MODEL "," DATA ",\"algorithm\":\"dipaco\",\"replicas\":2,\"inner_steps\":5,"
               "\"rounds\":3,\"batch\":4,\"seq_len\":8,\"streaming\":{\"fragments\":2}}", DPC_EINVAL,
               "over DiPaCo modules is not built");
    expect_bad("{" BASE ",\"streaming\":{\"fragments\":6}}", DPC_EINVAL, "streaming.fragments");
    expect_bad("{" BASE ",\"streaming\":{\"fragments\":5}}", DPC_EINVAL, "exceeds model.n_layer");
    expect_bad("{" BASE ",\"streaming\":{\"overlap_steps\":5}}", DPC_EINVAL, "streaming.overlap_steps");
    expect_bad("{" BASE ",\"streaming\":{\"alpha\":1}}", DPC_EINVAL, "streaming.alpha");
    expect_bad("{" BASE ",\"streaming\":{\"eager\":true}}", DPC_EINVAL, "overlap_steps >= 1");
    expect_bad("{" BASE ",\"inner\":{\"state\":\"checkpoint\"},\"streaming\":{\"eager\":true,\"overlap_steps\":1}}",
               DPC_EINVAL, "inner.state \"keep\"");
    expect_bad("{" BASE ",\"streaming\":{\"codec\":\"fp4\"}}", DPC_EINVAL, "expected fp32, bf16, int8, fp8 or e3m0");
    expect_bad("{" BASE ",\"streaming\":{\"pull_codec\":\"bf16\"}}", DPC_EINVAL, "fp32 only");
    expect_bad("{" BASE ",\"streaming\":{\"block_floats\":8}}", DPC_EINVAL, "streaming.block_floats");
    expect_bad("{" BASE ",\"streaming\":{\"fragment\":2}}", DPC_EINVAL, "streaming.fragment");
  }
  /* SparseLoCo: the block, its defaults (and the outer rule's: plain SGD, lr 2, unless given),
   * canonical JSON, and every check. */
  {
    CHECK_EQ_INT(parse("{" BASE ",\"sparse\":{\"density\":0.03}}", &js), 0);
    CHECK(js.sparse.enabled && js.sparse.density == 0.03 && js.sparse.chunk == 4096 && js.sparse.value_bits == 2 &&
          js.sparse.ef_beta == 0.9);
    CHECK(js.outer.lr == 3.0 && js.outer.momentum == 0.0 && !js.outer.nesterov && jobspec_sparse_pull(&js));
    char *sj = NULL, *sj2 = NULL;
    CHECK_EQ_INT(jobspec_to_json(&js, &sj), 0);
    CHECK_EQ_INT(parse(sj, &js2), 0);
    CHECK_EQ_INT(jobspec_to_json(&js2, &sj2), 0);
    CHECK(sj && sj2 && strcmp(sj, sj2) == 0 && strstr(sj, "\"sparse\":{\"density\":0.03,\"chunk\":4096"));
    free(sj);
    free(sj2);
    /* Without the block: no "sparse" in the canonical JSON, DiLoCo's outer defaults. */
    CHECK_EQ_INT(parse("{" BASE "}", &js), 0);
    CHECK(!js.sparse.enabled && js.outer.momentum != 0.0 && !jobspec_sparse_pull(&js));
    CHECK_EQ_INT(jobspec_to_json(&js, &sj), 0);
    CHECK(sj && !strstr(sj, "sparse"));
    free(sj);
    /* An explicit outer rule wins; with momentum the pulls are whole fragments. */
    CHECK_EQ_INT(parse("{" BASE ",\"outer\":{\"lr\":0.7,\"momentum\":0.9},\"sparse\":{\"ef_beta\":0}}", &js), 0);
    CHECK(js.outer.lr == 0.7 && js.outer.momentum == 0.9 && js.sparse.ef_beta == 0.0 && !jobspec_sparse_pull(&js));
    CHECK_EQ_INT(parse("{\"name\":\"d\"," MODEL "," DATA ",\"algorithm\":\"dipaco\",\"replicas\":2,\"inner_steps\":5,"
                       "\"rounds\":3,\"batch\":4,\"seq_len\":8,\"sparse\":{}}", &js), 0);
    CHECK(js.sparse.enabled);
    expect_bad("{" BASE ",\"sparse\":{\"density\":0}}", DPC_EINVAL, "sparse.density");
    expect_bad("{" BASE ",\"sparse\":{\"density\":1.5}}", DPC_EINVAL, "sparse.density");
    expect_bad("{" BASE ",\"sparse\":{\"chunk\":1}}", DPC_EINVAL, "sparse.chunk");
    expect_bad("{" BASE ",\"sparse\":{\"chunk\":65537}}", DPC_EINVAL, "sparse.chunk");
    expect_bad("{" BASE ",\"sparse\":{\"value_bits\":0}}", DPC_EINVAL, "sparse.value_bits");
    expect_bad("{" BASE ",\"sparse\":{\"value_bits\":9}}", DPC_EINVAL, "sparse.value_bits");
    expect_bad("{" BASE ",\"sparse\":{\"ef_beta\":1}}", DPC_EINVAL, "sparse.ef_beta");
    expect_bad("{" BASE ",\"sparse\":{\"ef_beta\":-0.1}}", DPC_EINVAL, "sparse.ef_beta");
    expect_bad("{" BASE ",\"sparse\":{\"topk\":3}}", DPC_EINVAL, "sparse.topk");
    expect_bad("{" BASE ",\"sparse\":3}", DPC_EINVAL, "sparse");
    expect_bad("{" BASE ",\"sparse\":{},\"streaming\":{\"fragments\":2}}", DPC_EINVAL, "Streaming DiLoCo");
    expect_bad("{" BASE ",\"sparse\":{},\"streaming\":{\"codec\":\"e3m0\"}}", DPC_EINVAL, "streaming.codec");
    expect_bad("{\"name\":\"a\"," MODEL "," DATA ",\"algorithm\":\"diloco-async\",\"replicas\":2,\"inner_steps\":5,"
               "\"rounds\":3,\"batch\":4,\"seq_len\":8,\"sparse\":{}}", DPC_EINVAL, "not \"diloco-async\"");
  }
  unlink(cfg);
  rmdir(sub);
  test_llama(dir);
  rmdir(dir);
  test_field_table();
  test_muon();
  test_momentum_schedule();
  test_outer_derived();
  TEST_DONE();
}
