/* jobspec_fields.c — the job spec's field table: every field once, with its JSON path, type,
 * default, range and meaning (jobspec_fields.h says who reads it), and the rules of single
 * fields that a range cannot say. The table's order is the canonical JSON's key order, which
 * stored specs are compared by: add new fields, never reorder old ones. After a change,
 * `cmake --build BUILD --target jobspec-doc` rewrites docs/jobspec.md (the test jobspec_doc
 * fails until it is committed). */
#include "coordinator/jobspec_fields.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/sparse.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(jobspec_algorithm) == sizeof(int) && sizeof(jobspec_inner_state) == sizeof(int) &&
                   sizeof(jobspec_inner_optimizer) == sizeof(int) &&
                   sizeof(jobspec_async_rule) == sizeof(int) && sizeof(jobspec_weighting) == sizeof(int),
               "JF_ENUM fields are read and written as int");

const char *const jobspec_algo_names[] = {"diloco", "diloco-async", "dipaco"};
static const char *const STATE_NAMES[] = {"keep", "reset", "checkpoint"};
static const char *const RULE_NAMES[] = {"delayed-nesterov", "nesterov", "sgd"};
static const char *const WEIGHT_NAMES[] = {"uniform", "tokens"};
static const char *const ARCH_NAMES[] = {"gpt2", "llama"};         /* gpt_arch */
static const char *const ROPE_NAMES[] = {"none", "llama3"};        /* gpt_rope_scaling */
static const char *const OPTIMIZER_NAMES[] = {"adamw", "muon"};    /* jobspec_inner_optimizer */
static const char *const ADJUST_NAMES[] = {"original", "match_rms_adamw"}; /* GPT_MUON_ADJUST_* */

const char *jobspec_algorithm_name(jobspec_algorithm a) { return (unsigned)a < 3 ? jobspec_algo_names[a] : "?"; }
const char *jobspec_inner_state_name(jobspec_inner_state s) { return (unsigned)s < 3 ? STATE_NAMES[s] : "?"; }
const char *jobspec_inner_optimizer_name(jobspec_inner_optimizer o) {
  return (unsigned)o < 2 ? OPTIMIZER_NAMES[o] : "?";
}
double jobspec_muon_weight_decay(const jobspec *js) {
  return js->inner.muon.has_weight_decay ? js->inner.muon.weight_decay : js->inner.weight_decay;
}

int jf_has_ctl(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f) return 1;
  return 0;
}

/* ---- rules of single fields ------------------------------------------------------------ */

static int check_name(const jobspec *js) {
  const char *s = js->name;
  size_t n = strlen(s);
  if (n == 0) return dpc_err(DPC_EINVAL, "field \"name\" is empty");
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return dpc_err(DPC_EINVAL, "field \"name\" = \"%s\": use only letters, digits, '.', '_' and '-'", s);
  }
  return 0;
}

static int check_init(const jobspec *js) {
  if (js->init_dir[0] && jf_has_ctl(js->init_dir))
    return dpc_err(DPC_EINVAL, "field \"model.init\": contains control characters");
  if (!js->init_dir[0] && !js->has_shape) return dpc_err(DPC_EINVAL, "field \"model\": needs \"init\" or the shape fields");
  return 0;
}

/* Quantized pulls would round every replica's delta base: not offered until measured. */
static int check_pull_codec(const jobspec *js) {
  if (js->streaming.pull_codec != DPC_CODEC_FP32)
    return dpc_err(DPC_EINVAL, "field \"streaming.pull_codec\": parameters travel as fp32 only (got %s)",
                   dpc_codec_name(js->streaming.pull_codec));
  return 0;
}

static int check_grace(const jobspec *js) {
  if (js->algorithm == JOB_ALGO_DILOCO_ASYNC)
    return dpc_err(DPC_EINVAL, "field \"quorum_grace_s\": a diloco-async job applies every delta as it comes and "
                   "has no rounds to close; remove it (or use algorithm \"diloco\" with \"quorum\")");
  if (!isfinite(js->quorum_grace_s) || js->quorum_grace_s < 0)
    return dpc_err(DPC_EINVAL, "field \"quorum_grace_s\" = %g: must be >= 0 (seconds a round waits for the rest of "
                   "its deltas once the quorum is in)", js->quorum_grace_s);
  return 0;
}

/* When the Llama keys of model apply (jobspec_field.when). */
static int is_llama(const jobspec *js) {
  return js->model.arch == GPT_ARCH_LLAMA;
}

/* When inner.muon applies. */
static int is_muon(const jobspec *js) { return js->inner.optimizer == INNER_OPT_MUON; }
static int is_sync(const jobspec *js) { return js->algorithm != JOB_ALGO_DILOCO_ASYNC; }

/* The momentum schedule: ramps within the job's rounds, over a momentum to ramp. */
static int check_momentum_ramp(const jobspec *js, int n, const char *key) {
  if (n > js->rounds)
    return dpc_err(DPC_EINVAL, "field \"outer.%s\" = %d exceeds rounds = %d", key, n, js->rounds);
  if (n > 0 && js->outer.momentum == 0.0)
    return dpc_err(DPC_EINVAL, "field \"outer.%s\" = %d: outer.momentum is 0, there is no momentum to schedule", key,
                   n);
  return 0;
}
static int check_momentum_warmup(const jobspec *js) {
  return check_momentum_ramp(js, js->outer.momentum_warmup, "momentum_warmup");
}
static int check_momentum_decay(const jobspec *js) {
  return check_momentum_ramp(js, js->outer.momentum_decay, "momentum_decay");
}

static int is_llama3(const jobspec *js) {
  return is_llama(js) && js->model.rope_scaling == GPT_ROPE_LLAMA3;
}

/* ---- the table ------------------------------------------------------------------------- */

#define AT(m) .off = offsetof(jobspec, m), .size = sizeof(((jobspec *)0)->m)
#define LV(m) .off = offsetof(jobspec_level, m), .size = sizeof(((jobspec_level *)0)->m)
#define CLOSED(a, b) .range = {1, (a), 0, (b), 0, JF_HI_CONST}
#define OPEN_CLOSED(a, b) .range = {1, (a), 1, (b), 0, JF_HI_CONST}
#define CLOSED_OPEN(a, b) .range = {1, (a), 0, (b), 1, JF_HI_CONST}
#define UPTO(a, ref) .range = {1, (a), 0, 0, 0, (ref)}
#define ENUM(n) .names = (n), .n_names = (int)(sizeof(n) / sizeof(n)[0])
#define DAYS_30 (30 * 86400.0)
#define MUON_ONLY .when = is_muon, .when_doc = "inner.optimizer \"muon\""
#define SYNC_ONLY .when = is_sync, .when_doc = "algorithm \"diloco\" or \"dipaco\""

const jobspec_field jobspec_fields[] = {
    {"", "name", .type = JF_STRING, .flags = JF_REQUIRED, AT(name), .check = check_name,
     .range_doc = "1 to 63 characters of A-Z a-z 0-9 . _ -", .doc = "the job's name"},

    {"", "model", .type = JF_OBJECT, .flags = JF_REQUIRED,
     .doc = "the model: a directory to start from (init), or a shape to initialize from seed"},
    {"model", "init", .type = JF_STRING, .flags = JF_OMIT_EMPTY, AT(init_dir), .check = check_init,
     .range_doc = "a path, no control characters",
     .doc = "a model directory (config.json and weights, relative to the spec file) that dipacoctl uploads as version "
            "0; the shape then comes from its config.json (a canonical spec carries both; they must agree)"},
    {"model", "n_layer", .type = JF_INT, .flags = JF_SHAPE, AT(model.n_layer), CLOSED(1, 256), .doc = "transformer layers L"},
    {"model", "n_head", .type = JF_INT, .flags = JF_SHAPE, AT(model.n_head), CLOSED(1, 1024), .doc = "attention heads"},
    {"model", "n_embd", .type = JF_INT, .flags = JF_SHAPE, AT(model.n_embd), CLOSED(1, 65536),
     .doc = "embedding width C, a multiple of n_head (and at most 4e10 parameters in all: gpt_config_validate)"},
    {"model", "n_positions", .type = JF_INT, .flags = JF_SHAPE, AT(model.n_positions), CLOSED(1, 1 << 20),
     .doc = "longest context the position table holds (>= seq_len)"},
    {"model", "vocab_size", .type = JF_INT, .flags = JF_SHAPE, AT(model.vocab_size), CLOSED(2, 1 << 24),
     .doc = "vocabulary size V"},
    /* The Llama family (kernels/gpt.h, docs/design.md §3.1): HF LlamaConfig's keys under
     * gpt_config's names. Left out of a GPT-2 model's canonical JSON, so GPT-2 specs keep their
     * bytes; the defaults are those of `dipacoctl init --arch llama`, so a shape and a seed give
     * the model that command writes. */
    {"model", "arch", .type = JF_ENUM, .flags = JF_SHAPE_OPT | JF_OMIT_DEFAULT, AT(model.arch), .def = GPT_ARCH_GPT2,
     ENUM(ARCH_NAMES), .doc = "the model family: GPT-2, or Llama-class (HF LlamaForCausalLM; Qwen2 with attention_bias)"},
    {"model", "n_kv_head", .type = JF_INT, .flags = JF_SHAPE, AT(model.n_kv_head), CLOSED(1, 1024), .when = is_llama,
     .when_doc = "model.arch \"llama\"", .doc = "key/value heads (num_key_value_heads; n_head a multiple of it)"},
    {"model", "intermediate_size", .type = JF_INT, .flags = JF_SHAPE, AT(model.intermediate_size), CLOSED(1, 1 << 20),
     .when = is_llama, .when_doc = "model.arch \"llama\"", .doc = "the MLP's inner width I"},
    {"model", "rms_norm_eps", .type = JF_NUMBER, .flags = JF_SHAPE_OPT, AT(model.rms_norm_eps), .def = 1e-5,
     OPEN_CLOSED(0, 1), .when = is_llama, .when_doc = "model.arch \"llama\"", .doc = "RMSNorm epsilon"},
    {"model", "rope_theta", .type = JF_NUMBER, .flags = JF_SHAPE_OPT, AT(model.rope_theta), .def = 10000.0,
     OPEN_CLOSED(0, 1e12), .when = is_llama, .when_doc = "model.arch \"llama\"", .doc = "RoPE base θ"},
    {"model", "tie_word_embeddings", .type = JF_BOOL, .flags = JF_SHAPE_OPT, AT(model.tie_word_embeddings), .def = 1,
     .when = is_llama, .when_doc = "model.arch \"llama\"",
     .doc = "the head is embed_tokens (no lm_head tensor); false adds lm_head.weight to the stem"},
    {"model", "attention_bias", .type = JF_BOOL, .flags = JF_SHAPE_OPT, AT(model.attention_bias), .def = 0,
     .when = is_llama, .when_doc = "model.arch \"llama\"", .doc = "q/k/v projections with biases (Qwen2)"},
    {"model", "rope_scaling", .type = JF_ENUM, .flags = JF_SHAPE_OPT, AT(model.rope_scaling), .def = GPT_ROPE_DEFAULT,
     ENUM(ROPE_NAMES), .when = is_llama, .when_doc = "model.arch \"llama\"",
     .doc = "RoPE frequency scaling: none, or Llama 3.1's (the rope_* fields below)"},
    {"model", "rope_factor", .type = JF_NUMBER, .flags = JF_SHAPE_OPT, AT(model.rope_factor), .def = 8.0,
     CLOSED(1, 1e6), .when = is_llama3, .when_doc = "rope_scaling \"llama3\"", .doc = "llama3 scaling: factor s"},
    {"model", "rope_low_freq_factor", .type = JF_NUMBER, .flags = JF_SHAPE_OPT, AT(model.rope_low_freq_factor),
     .def = 1.0, OPEN_CLOSED(0, 1e6), .when = is_llama3, .when_doc = "rope_scaling \"llama3\"",
     .doc = "llama3 scaling: low_freq_factor"},
    {"model", "rope_high_freq_factor", .type = JF_NUMBER, .flags = JF_SHAPE_OPT, AT(model.rope_high_freq_factor),
     .def = 4.0, OPEN_CLOSED(0, 1e6), .when = is_llama3, .when_doc = "rope_scaling \"llama3\"",
     .doc = "llama3 scaling: high_freq_factor (> low_freq_factor)"},
    {"model", "rope_original_max_position_embeddings", .type = JF_INT, .flags = JF_SHAPE_OPT,
     AT(model.rope_original_max_position_embeddings), .def = 8192, CLOSED(1, 1 << 24), .when = is_llama3,
     .when_doc = "rope_scaling \"llama3\"", .doc = "llama3 scaling: the context the model was trained with"},
    {"model", "seed", .type = JF_SEED, AT(seed), .def = 0, .doc = "seed of a shape-only model's initial weights"},

    {"", "data", .type = JF_OBJECT, .flags = JF_REQUIRED,
     .doc = "training and validation data, paths or globs relative to each worker's --data-dir"},
    {"data", "train", .type = JF_PATHS, .flags = JF_REQUIRED, AT(train), .count_off = offsetof(jobspec, n_train),
     .excl = "paths", .excl_why = "data.paths gives each path its own data",
     .doc = "token shards every path trains on (or data.paths instead)"},
    {"data", "paths", .type = JF_PATH_LISTS, AT(path_glob),
     .doc = "DiPaCo routed data: one list per path in path numbering; slot (p, r) reads only list p"},
    {"data", "val", .type = JF_PATHS, AT(val), .count_off = offsetof(jobspec, n_val), .doc = "validation shards"},

    {"", "algorithm", .type = JF_ENUM, .flags = JF_REQUIRED, AT(algorithm), ENUM(jobspec_algo_names),
     .doc = "sync DiLoCo, asynchronous DiLoCo (deltas applied as they come), or DiPaCo (paths over modules)"},
    {"", "replicas", .type = JF_INT, .flags = JF_REQUIRED, AT(replicas), CLOSED(1, JOBSPEC_MAX_REPLICAS),
     .doc = "R: replicas of each path (paths × replicas <= 65536 slots)"},
    {"", "inner_steps", .type = JF_INT, .flags = JF_REQUIRED, AT(inner_steps), CLOSED(1, 1000000),
     .doc = "H: inner steps per round"},
    {"", "rounds", .type = JF_INT, .flags = JF_REQUIRED, AT(rounds), CLOSED(1, 10000000),
     .doc = "N: outer rounds (rounds × inner_steps <= 2^31 - 1; async: N × H × R inner steps in all)"},
    {"", "batch", .type = JF_INT, .flags = JF_REQUIRED, AT(batch), CLOSED(1, 65536), .doc = "B: sequences per inner step"},
    {"", "seq_len", .type = JF_INT, .flags = JF_REQUIRED, AT(seq_len), CLOSED(1, 1 << 20),
     .doc = "T: tokens per sequence (<= model.n_positions)"},

    {"", "inner", .type = JF_OBJECT, .doc = "the inner optimizer: AdamW on a warmup + cosine LR schedule of rounds × "
                                            "inner_steps steps"},
    {"inner", "lr", .type = JF_NUMBER, AT(inner.lr), .def = 3e-4, OPEN_CLOSED(0, 10), .doc = "peak learning rate"},
    {"inner", "warmup", .type = JF_INT, AT(inner.warmup), .def = 0, UPTO(0, JF_HI_STEPS), .doc = "linear warmup steps"},
    {"inner", "lr_min_frac", .type = JF_NUMBER, AT(inner.lr_min_frac), .def = 0.1, CLOSED(0, 1),
     .doc = "the schedule's final learning rate, as a fraction of lr"},
    {"inner", "weight_decay", .type = JF_NUMBER, AT(inner.weight_decay), .def = 0.1, CLOSED(0, 10),
     .doc = "AdamW weight decay"},
    {"inner", "beta1", .type = JF_NUMBER, AT(inner.beta1), .def = 0.9, CLOSED_OPEN(0, 1), .doc = "AdamW beta1"},
    {"inner", "beta2", .type = JF_NUMBER, AT(inner.beta2), .def = 0.95, CLOSED_OPEN(0, 1), .doc = "AdamW beta2"},
    {"inner", "eps", .type = JF_NUMBER, AT(inner.eps), .def = 1e-8, OPEN_CLOSED(0, 1), .doc = "AdamW epsilon"},
    {"inner", "grad_clip", .type = JF_NUMBER, AT(inner.grad_clip), .def = 1.0, CLOSED(0, 1e6),
     .doc = "clip each step's gradients to this global L2 norm (0 = off)"},
    {"inner", "state", .type = JF_ENUM, AT(inner.state), .def = INNER_STATE_KEEP, ENUM(STATE_NAMES),
     .doc = "a slot's AdamW state across rounds: kept by its worker, fresh each round, or uploaded each round so any "
            "worker that takes the slot resumes it exactly"},
    /* MuLoCo (docs/design.md §3.2): Muon on the block matrices, AdamW (the fields above) on the
     * rest. Muon's momentum rides in the AdamW state, so every job kind carries it. Defaults:
     * torch.optim.Muon's, except lr 0.02 (its 1e-3 assumes match_rms_adamw-like scaling). */
    {"inner", "optimizer", .type = JF_ENUM, .flags = JF_OMIT_DEFAULT, AT(inner.optimizer), .def = INNER_OPT_ADAMW,
     ENUM(OPTIMIZER_NAMES), .doc = "AdamW for every tensor, or Muon for the transformer blocks' matrices and AdamW "
                                   "for the rest (MuLoCo)"},
    {"inner", "muon", MUON_ONLY, .type = JF_OBJECT,
     .doc = "Muon's hyperparameters (torch.optim.Muon; Newton-Schulz in fp32)"},
    {"inner.muon", "lr", MUON_ONLY, .type = JF_NUMBER, AT(inner.muon.lr), .def = 0.02, OPEN_CLOSED(0, 10),
     .doc = "Muon's peak learning rate; the schedule scales it as it scales inner.lr"},
    {"inner.muon", "momentum", MUON_ONLY, .type = JF_NUMBER, AT(inner.muon.momentum), .def = 0.95, CLOSED_OPEN(0, 1),
     .doc = "μ: buf <- lerp(buf, g, 1 - μ)"},
    {"inner.muon", "nesterov", MUON_ONLY, .type = JF_BOOL, AT(inner.muon.nesterov), .def = 1,
     .doc = "orthogonalise lerp(g, buf, μ) (else buf)"},
    {"inner.muon", "ns_steps", MUON_ONLY, .type = JF_INT, AT(inner.muon.ns_steps), .def = 5, CLOSED(1, 20),
     .doc = "Newton-Schulz iterations"},
    {"inner.muon", "weight_decay", MUON_ONLY, .type = JF_NUMBER, .flags = JF_PRESENCE, AT(inner.muon.weight_decay),
     .count_off = offsetof(jobspec, inner.muon.has_weight_decay), CLOSED(0, 10),
     .doc = "Muon's decoupled weight decay (absent: inner.weight_decay)"},
    {"inner.muon", "adjust_lr", MUON_ONLY, .type = JF_ENUM, AT(inner.muon.adjust_lr), .def = GPT_MUON_ADJUST_ORIGINAL,
     ENUM(ADJUST_NAMES), .doc = "the learning rate of an A x B matrix times sqrt(max(1, A/B)), or 0.2 sqrt(max(A, B)) "
                                "to match AdamW's update RMS"},

    /* Sync outer step (diloco, dipaco): Nesterov lr 0.6, momentum 0.7, from the DiLoCo quality
     * study (tests/bench/diloco_quality.sh): at small scale and tens of rounds, momentum 0.9
     * overshoots; with the momentum schedule below, derived from rounds, from the study across
     * corpora (tests/bench/outer_study.sh), which also found smaller steps better for diloco
     * with H < 20 at R <= 2 and for larger models (jobspec_outer_default, applied by jobspec_parse
     * where the spec leaves them out). diloco-async (delayed Nesterov, DyLU): lr 0.4, momentum 0.7, from the
     * heterogeneity study (tests/bench/async_heterogeneity.sh): the paper's 0.7 / 0.9 ended
     * 3-5% above sync there; stale deltas want a smaller step. With a "sparse" block
     * (SparseLoCo): plain SGD with lr 3 — the error-feedback buffer takes momentum's place, as
     * in the SparseLoCo paper; lr 3 was best in tests/bench/sparse.sh at H = 20 and 100. */
    {"", "outer", .type = JF_OBJECT, .doc = "the outer optimizer, applied to the averaged deltas"},
    {"outer", "lr", .type = JF_NUMBER, .flags = JF_ALT_DEFAULT, AT(outer.lr), .def = 0.6, .def_async = 0.4,
     .def_sparse = 3.0, OPEN_CLOSED(0, 10),
     .doc = "outer learning rate (absent, a diloco job with inner_steps < 20, no sparse block and no eager "
            "updates gets 0.5 with replicas <= 2 or a large model at replicas <= 4, 0.4 with both: docs/design.md §3.4)"},
    {"outer", "momentum", .type = JF_NUMBER, .flags = JF_ALT_DEFAULT, AT(outer.momentum), .def = 0.7, .def_async = 0.7,
     .def_sparse = 0.0, CLOSED_OPEN(0, 1),
     .doc = "outer momentum (absent, such a diloco job gets 0.6 with one of the two, 0.5 with both: "
            "docs/design.md §3.4)"},
    {"outer", "nesterov", .type = JF_BOOL, .flags = JF_ALT_DEFAULT, AT(outer.nesterov), .def = 1, .def_async = 1,
     .def_sparse = 0, .doc = "Nesterov momentum (else heavy ball)"},
    {"outer", "rule", .alias = "async", .type = JF_ENUM, AT(outer.async_rule), .def = OUTER_ASYNC_DN,
     ENUM(RULE_NAMES), .doc = "diloco-async: how each delta is applied"},
    {"outer", "delay_buffer", .alias = "buffer", .type = JF_INT, AT(outer.buffer), .def = 0,
     CLOSED(0, JOBSPEC_MAX_SLOTS), .doc = "delayed Nesterov: deltas buffered between momentum steps (0 = number of slots)"},
    {"outer", "c", .type = JF_NUMBER, AT(outer.c), .def = 0, CLOSED(0, 1),
     .doc = "delayed Nesterov: share of momentum applied on each buffered delta (<= 1 / delay_buffer)"},
    /* A factor below 2 would refuse honest deltas near the median. */
    {"outer", "delta_norm_screen", .type = JF_NUMBER, .flags = JF_ZERO_OFF, AT(outer.delta_norm_screen), .def = 0,
     CLOSED(2, 1e6),
     .doc = "refuse a delta whose L2 norm exceeds this times the median of the fragment's recent ones "
            "(coordinator/delta_screen.h)"},
    /* The momentum schedule (kernels/outer.c outer_momentum_at): sync steps only, where step t
     * of a fragment makes its version t + 1. A new spec that leaves them out gets them derived
     * from rounds (jobspec_derive_schedule) and written into its canonical JSON; a stored spec
     * without them (created before they existed) keeps no schedule (jobspec_parse_stored). */
    {"outer", "momentum_warmup", .type = JF_INT, .flags = JF_PRESENCE, AT(outer.momentum_warmup),
     .count_off = offsetof(jobspec, outer.has_momentum_warmup), .check = check_momentum_warmup,
     .range_doc = "[0, rounds]", CLOSED(0, 10000000), SYNC_ONLY,
     .doc = "momentum warm-up: step t (0-based) of the first N runs at momentum × (t + 1) / N (0 = none; absent: "
            "ceil(rounds / 10) for a sync job with outer momentum and without eager updates, else 0)"},
    {"outer", "momentum_decay", .type = JF_INT, .flags = JF_PRESENCE, AT(outer.momentum_decay),
     .count_off = offsetof(jobspec, outer.has_momentum_decay), .check = check_momentum_decay,
     .range_doc = "[0, rounds]", CLOSED(0, 10000000), SYNC_ONLY,
     .doc = "momentum decay: step t of the last N runs at momentum × (rounds − 1 − t) / N, the last step at 0 "
            "(0 = none; absent: ceil(rounds / 5) where the warm-up is derived)"},

    {"", "max_staleness", .type = JF_INT, AT(max_staleness), .def = 0, CLOSED(0, 1000000000),
     .doc = "diloco-async: drop deltas with staleness above this (0 = no limit)"},

    {"", "dylu", .type = JF_OBJECT, .doc = "diloco-async dynamic local updates: H_w = max(min_steps, floor(H · v_w / v_max))"},
    {"dylu", "enabled", .type = JF_BOOL, AT(dylu.enabled), .def = 0, .doc = "give slower workers fewer inner steps"},
    {"dylu", "min_steps", .type = JF_INT, AT(dylu.min_steps), .def = 1, UPTO(1, JF_HI_H),
     .doc = "the fewest inner steps a worker is given"},

    {"", "levels", .type = JF_LEVELS,
     .doc = "module structure: consecutive layer ranges with K alternative modules each; P = Π K paths (default: one "
            "level holding the whole model, one module)"},
    {"levels[]", "stem", .type = JF_BOOL, LV(stem), .def = 0,
     .doc = "holds the stem (wte, wpe, ln_f): true at level 0, false elsewhere"},
    {"levels[]", "layers", .type = JF_SPAN, .flags = JF_REQUIRED | JF_PARSE_RANGE, LV(layer_begin), CLOSED(0, 256),
     .doc = "the level's transformer layers [first, end): level 0 starts at 0, each next level where the last ended, "
            "the last ends at model.n_layer"},
    {"levels[]", "modules", .type = JF_INT, LV(n_modules), .def = 1, CLOSED(1, JOBSPEC_MAX_K),
     .doc = "K: alternative modules (algorithm dipaco only, at most 1024 modules and 65536 paths in all)"},

    {"", "versions", .type = JF_OBJECT, .doc = "which parameter versions the coordinator keeps"},
    /* keep_last >= 2: the version before the newest may still be streaming to a late worker. */
    {"versions", "keep_last", .type = JF_INT, AT(versions.keep_last), .def = 2, CLOSED(2, 10000),
     .doc = "the newest versions kept per fragment"},
    {"versions", "keep_every", .type = JF_INT, AT(versions.keep_every), .def = 0, CLOSED(0, 1000000000),
     .doc = "also keep every version that is a multiple of this, for export (0 = none)"},

    {"", "pulls", .type = JF_OBJECT, .doc = "how workers catch up on new versions (docs/design.md §4.3)"},
    {"pulls", "replay", .type = JF_BOOL, AT(pulls.replay), .def = 1,
     .doc = "sync jobs (streaming too, not eager): a worker holding an older version replays the rounds' "
            "deltas as sent (the coordinator keeps the last 8 rounds) instead of pulling the fragment whole, when "
            "that is fewer bytes; bit-identical (checked against the version's CRC-32C)"},

    {"", "streaming", .type = JF_OBJECT,
     .doc = "Streaming DiLoCo (on when fragments > 1, overlap_steps > 0, alpha != 0 or eager; algorithm diloco "
            "only: dipaco and diloco-async take the codec alone) and the delta codec"},
    {"streaming", "fragments", .type = JF_INT, AT(streaming.fragments), .def = 1, UPTO(1, JF_HI_H),
     .doc = "F sync groups: layer l syncs with group l mod F, the stem with group 0 (<= model.n_layer)"},
    {"streaming", "overlap_steps", .type = JF_INT, AT(streaming.overlap_steps), .def = 0, UPTO(0, JF_HI_H_MINUS_1),
     .doc = "τ: inner steps a fragment's sync overlaps with training"},
    {"streaming", "alpha", .type = JF_NUMBER, AT(streaming.alpha), .def = 0, CLOSED_OPEN(0, 1),
     .doc = "α: merge weight of the local parameters with the outer result"},
    {"streaming", "eager", .type = JF_BOOL, AT(streaming.eager), .def = 0,
     .doc = "eager outer updates (needs overlap_steps >= 1 and inner.state keep)"},
    {"streaming", "codec", .type = JF_CODEC, AT(streaming.codec), .def = DPC_CODEC_FP32,
     .doc = "wire codec of pushed deltas (also for plain sync and async jobs; fp32 with sparse)"},
    {"streaming", "block_floats", .type = JF_INT, AT(streaming.block_floats), .def = DPC_CODEC_BLOCK_DEFAULT,
     CLOSED(16, 1 << 20), .doc = "floats per scale block of the block codecs"},
    {"streaming", "pull_codec", .type = JF_CODEC, AT(streaming.pull_codec), .def = DPC_CODEC_FP32, .check = check_pull_codec,
     .range_doc = "fp32 only", .doc = "codec of pulled parameters"},

    {"", "sparse", .type = JF_OBJECT, .flags = JF_PRESENCE, .count_off = offsetof(jobspec, sparse.enabled),
     .doc = "SparseLoCo (common/sparse.h): push the chunked top-k of an error-feedback buffer; sync diloco or dipaco "
            "without Streaming DiLoCo; its presence turns it on"},
    {"sparse", "density", .type = JF_NUMBER, AT(sparse.density), .def = 0.02, OPEN_CLOSED(0, 1),
     .doc = "kept fraction of each chunk"},
    {"sparse", "chunk", .type = JF_INT, AT(sparse.chunk), .def = 4096, CLOSED(2, DPC_SPARSE_MAX_CHUNK),
     .doc = "values per chunk"},
    {"sparse", "value_bits", .type = JF_INT, AT(sparse.value_bits), .def = 2, CLOSED(1, 8), .doc = "bits per kept value"},
    /* 0.9 was best in tests/oracle/SPARSE.md. */
    {"sparse", "ef_beta", .type = JF_NUMBER, AT(sparse.ef_beta), .def = 0.9, CLOSED_OPEN(0, 1),
     .doc = "error-feedback decay: e <- ef_beta · e + Δ (0 = top-k without error feedback)"},

    {"", "quorum", .type = JF_NUMBER, AT(quorum), .def = 1.0, OPEN_CLOSED(0, 1),
     .doc = "fraction of a round's expected deltas needed to close it at the deadline"},
    {"", "round_timeout_s", .type = JF_NUMBER, AT(round_timeout_s), .def = 3600.0, CLOSED(0, DAYS_30),
     .doc = "a round's deadline in seconds (0 = none)"},
    {"", "quorum_grace_s", .type = JF_NUMBER, .flags = JF_PRESENCE, AT(quorum_grace_s),
     .count_off = offsetof(jobspec, has_quorum_grace), .check = check_grace, CLOSED(0, DAYS_30),
     .doc = "sync jobs: once ceil(quorum × expected) deltas are in, close the round when the rest are in or this many "
            "seconds later (unset, with quorum < 1: adaptive, coordinator/rounds.c); round_timeout_s stays the hard cap"},
    {"", "weighting", .type = JF_ENUM, AT(weighting), .def = WEIGHTING_UNIFORM, ENUM(WEIGHT_NAMES),
     .doc = "how deltas are averaged: equally, or by the tokens each was trained on"},
};
const int jobspec_n_fields = (int)(sizeof jobspec_fields / sizeof jobspec_fields[0]);

/* ---- helpers --------------------------------------------------------------------------- */

int jf_applies(const jobspec_field *f, const jobspec *js) { return !f->when || f->when(js); }

void jf_zero_inapplicable(const char *sect, void *base, const jobspec *js) {
  for (int i = 0; i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    if (jf_in(f, sect) && !jf_applies(f, js)) memset(jf_at(f, base), 0, f->size);
  }
}

const char *jf_path(char *buf, size_t cap, const char *prefix, const char *key) {
  if (prefix && prefix[0]) snprintf(buf, cap, "%s.%s", prefix, key);
  else snprintf(buf, cap, "%s", key);
  return buf;
}

int jf_in(const jobspec_field *f, const char *sect) { return strcmp(f->sect, sect) == 0; }

int jf_get_int(const jobspec_field *f, const void *base) {
  int v;
  memcpy(&v, jf_at(f, base), sizeof v);
  return v;
}

void jf_set_int(const jobspec_field *f, void *base, int v) { memcpy(jf_at(f, base), &v, sizeof v); }

double jf_hi(const jobspec_field *f, const jobspec *js) {
  switch (f->range.hi_ref) {
  case JF_HI_STEPS: return (double)((long)js->rounds * js->inner_steps);
  case JF_HI_H: return js->inner_steps;
  case JF_HI_H_MINUS_1: return js->inner_steps - 1;
  default: return f->range.hi;
  }
}

/* The outer study (tests/bench/outer_study.sh, docs/benchmarks.md §12.3): with short rounds
 * (H = 10) the schedule on 0.6 / 0.7 fell behind the best rule at R = 2 (by up to 11.6% on the
 * medium model and 22.7% on the large one) and on the medium model at R = 4 (4.0%), where
 * smaller steps held: 0.5 / 0.6 on the small model at R = 2 and the medium one at R = 4, 0.4 /
 * 0.5 on the medium and large ones at R = 2. At H >= 20 and at R = 8 0.6 / 0.7 did best. H
 * between the studied 10 and 20 takes the smaller step, whose worst miss the study found
 * smaller. DiPaCo (modules averaging deltas of paths with different data), async, SparseLoCo and
 * eager streaming were not in the study and keep their kind's defaults. */
static const double NOTCH_LR[] = {0.6, 0.5, 0.4}, NOTCH_MU[] = {0.7, 0.6, 0.5};

/* Parameters in the transformer layers (the stem's embeddings left out), or 0 without a shape. */
static long layer_params(const jobspec *js) {
  if (!js->has_shape) return 0;
  gpt_layout *lay = malloc(sizeof *lay);
  long n = lay && jobspec_layout(js, lay) == 0 ? (long)(lay->layer_off[lay->cfg.n_layer] - lay->layer_off[0]) : 0;
  free(lay);
  return n;
}

int jobspec_outer_derived(const jobspec *js) {
  if (js->algorithm != JOB_ALGO_DILOCO || js->sparse.enabled || js->streaming.eager || js->inner_steps >= JOBSPEC_LONG_H)
    return 0;
  return (js->replicas <= JOBSPEC_SMALL_R) + (js->replicas <= JOBSPEC_LARGE_R && layer_params(js) >= JOBSPEC_LARGE_PARAMS);
}

void jobspec_outer_default(const jobspec *js, jobspec_outer *out) {
  const int alt = js->algorithm == JOB_ALGO_DILOCO_ASYNC ? 1 : js->sparse.enabled ? 2 : 0;
  jobspec *d = calloc(1, sizeof *d);
  if (!d) { /* the plain defaults, without the table */
    memset(out, 0, sizeof *out);
    out->lr = 0.6, out->momentum = 0.7, out->nesterov = 1;
    return;
  }
  jf_defaults(NULL, d, 0);
  if (alt) jf_defaults(NULL, d, alt);
  *out = d->outer;
  free(d);
  int notch = jobspec_outer_derived(js);
  if (notch) out->lr = NOTCH_LR[notch], out->momentum = NOTCH_MU[notch];
}

const char *jobspec_outer_origin(const jobspec *js, char *buf, size_t cap) {
  const int alt = js->algorithm == JOB_ALGO_DILOCO_ASYNC ? 1 : js->sparse.enabled ? 2 : 0;
  char kind[160];
  if (jobspec_outer_derived(js))
    snprintf(kind, sizeof kind, "diloco at R = %d, H = %d, %.3gM parameters in its layers (derived from R, H < %d and "
             "the model's size)", js->replicas, js->inner_steps, (double)layer_params(js) / 1e6, JOBSPEC_LONG_H);
  else
    snprintf(kind, sizeof kind, "%s", alt == 1 ? "diloco-async" : alt == 2 ? "SparseLoCo" : jobspec_algorithm_name(js->algorithm));
  jobspec_outer e;
  jobspec_outer_default(js, &e);
  const jobspec_outer *o = &js->outer;
  char set[64] = "";
  if (o->lr != e.lr) strcat(set, ", lr");
  if (o->momentum != e.momentum) strcat(set, ", momentum");
  if (o->nesterov != e.nesterov) strcat(set, ", nesterov");
  if (!set[0]) snprintf(buf, cap, "the defaults for %s (docs/jobspec.md)", kind);
  else
    snprintf(buf, cap, "set by the job spec: %s (the defaults for %s: lr %.9g, momentum %.9g, nesterov %s)", set + 2,
             kind, e.lr, e.momentum, e.nesterov ? "true" : "false");
  return buf;
}

void jf_defaults(const char *sect, void *base, int alt) {
  for (int i = 0; i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    if ((sect ? !jf_in(f, sect) : jf_in(f, "levels[]")) || (f->flags & JF_REQUIRED) || (alt && !(f->flags & JF_ALT_DEFAULT))) continue;
    double d = alt == 1 ? f->def_async : alt == 2 ? f->def_sparse : f->def;
    switch (f->type) {
    case JF_INT:
    case JF_BOOL:
    case JF_ENUM:
    case JF_CODEC: jf_set_int(f, base, (int)d); break;
    case JF_NUMBER: memcpy(jf_at(f, base), &d, sizeof d); break;
    case JF_SEED: {
      uint64_t u = (uint64_t)d;
      memcpy(jf_at(f, base), &u, sizeof u);
      break;
    }
    default: break; /* strings and lists start empty; sections have no value */
    }
  }
}
