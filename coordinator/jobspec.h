/* jobspec.h — the job spec: parse and validate the user's JSON, hold it as a struct, write it
 * back in one canonical form (the one stored in the database), and derive the module /
 * path / fragment structure from it and the canonical GPT layout (kernels/gpt.h).
 *
 * The fields — JSON path, type, default, range, meaning — are declared once, in the field
 * table of coordinator/jobspec_fields.c; docs/jobspec.md is generated from it. Unknown fields
 * are rejected at every level, naming the field path. The LR schedule's total_steps is
 * rounds × inner_steps.
 *
 * Module structure. Levels cut the model into consecutive pieces: level 0 always holds the
 * stem (wte, wpe, ln_f — which the canonical layout puts first) plus layers [0, e0), and level
 * l > 0 holds layers [e_{l-1}, e_l), so every module is ONE contiguous float range. Level l has
 * K_l alternative modules; a path picks one per level, P = Π K_l paths. Plain DiLoCo is the
 * default single level with K = 1: one module holding the whole model, one path. DiPaCo uses
 * e.g. [{"stem":true,"layers":[0,0],"modules":1}, {"layers":[0,L],"modules":4}].
 * Numbering: module ids run level by level (level 0's modules first); path p picks, at level l,
 * module index (p / Π_{l'>l} K_l') mod K_l (the last level varies fastest). Without streaming,
 * a module is one fragment and fragment id = module id.
 *
 * Model shape with "init": jobspec_parse keeps the directory and marks the shape unknown
 * (has_shape = 0); checks that need the shape (seq_len <= n_positions, levels covering the
 * layers) run in jobspec_resolve_init, which reads DIR/config.json. A canonical spec of a
 * resolved "init" model carries both "init" and the shape fields; they must then agree.
 *
 * Ownership: a jobspec is a plain value (fixed arrays, no pointers); copy it freely.
 * Thread-safety: all functions are reentrant. */
#ifndef DPC_JOBSPEC_H
#define DPC_JOBSPEC_H

#include "kernels/gpt.h"

#include <stddef.h>
#include <stdint.h>

#define JOBSPEC_NAME_MAX 64
#define JOBSPEC_PATH_MAX 256
#define JOBSPEC_MAX_DATA 32
#define JOBSPEC_MAX_DATA_PATHS 64  /* paths with their own data (data.paths lists) */
#define JOBSPEC_MAX_PATH_GLOBS 128 /* entries over all data.paths lists */
#define JOBSPEC_MAX_LEVELS 16
#define JOBSPEC_MAX_K 256        /* modules per level */
#define JOBSPEC_MAX_MODULES 1024 /* over all levels */
#define JOBSPEC_MAX_PATHS 65536
#define JOBSPEC_MAX_REPLICAS 4096
#define JOBSPEC_MAX_SLOTS 65536  /* paths × replicas */

typedef enum { JOB_ALGO_DILOCO = 0, JOB_ALGO_DILOCO_ASYNC = 1, JOB_ALGO_DIPACO = 2 } jobspec_algorithm;
typedef enum { INNER_STATE_KEEP = 0, INNER_STATE_RESET = 1, INNER_STATE_CHECKPOINT = 2 } jobspec_inner_state;
typedef enum { OUTER_ASYNC_DN = 0, OUTER_ASYNC_NESTEROV = 1, OUTER_ASYNC_SGD = 2 } jobspec_async_rule;
typedef enum { WEIGHTING_UNIFORM = 0, WEIGHTING_TOKENS = 1 } jobspec_weighting;

/* The parsed spec. What each member means, its default and its range: its entry in the field
 * table (jobspec_fields.c, rendered as docs/jobspec.md), which names the JSON path. Only the
 * storage is described here. */
typedef struct {
  int stem;        /* 1 for level 0 (holds the stem), 0 otherwise */
  int layer_begin; /* transformer layers [layer_begin, layer_end); layer_end -1 in the default */
  int layer_end;   /* level of a model whose "init" shape is not resolved yet */
  int n_modules;   /* K_l */
} jobspec_level;

typedef enum { INNER_OPT_ADAMW = 0, INNER_OPT_MUON = 1 } jobspec_inner_optimizer;

typedef struct {
  double lr, momentum, weight_decay;
  int nesterov, ns_steps;
  int adjust_lr;          /* GPT_MUON_ADJUST_* */
  int has_weight_decay;   /* 0: weight_decay is inner.weight_decay (jobspec_muon_weight_decay) */
} jobspec_muon;

typedef struct {
  double lr, lr_min_frac, weight_decay, beta1, beta2, eps, grad_clip;
  int warmup;
  jobspec_inner_state state;
  jobspec_inner_optimizer optimizer;
  jobspec_muon muon;      /* used with optimizer INNER_OPT_MUON only */
} jobspec_inner;

typedef struct {
  double lr, momentum;
  int nesterov;
  jobspec_async_rule async_rule; /* "rule" */
  int buffer;                    /* "delay_buffer" */
  double c;
  double delta_norm_screen;
  int momentum_warmup, momentum_decay; /* rounds of the momentum schedule (0: none) */
  int has_momentum_warmup, has_momentum_decay; /* given (or derived at job create: jobspec_parse) */
} jobspec_outer;

typedef struct {
  char name[JOBSPEC_NAME_MAX];
  char init_dir[JOBSPEC_PATH_MAX]; /* model.init; "" without one */
  int has_shape;                   /* 0 only for an unresolved "init" model */
  gpt_config model;                /* model.n_layer .. model.vocab_size */
  uint64_t seed;                   /* model.seed */
  int n_train, n_val;
  char train[JOBSPEC_MAX_DATA][JOBSPEC_PATH_MAX];
  char val[JOBSPEC_MAX_DATA][JOBSPEC_PATH_MAX];
  /* data.paths: 0, or the number of paths, which then read only their own list and
   * data.train is empty. Path p's entries are path_glob[path_first[p] .. path_first[p + 1]). */
  int n_data_paths;
  int path_first[JOBSPEC_MAX_DATA_PATHS + 1];
  char path_glob[JOBSPEC_MAX_PATH_GLOBS][JOBSPEC_PATH_MAX];
  jobspec_algorithm algorithm;
  int replicas;    /* R */
  int inner_steps; /* H */
  int rounds;      /* N */
  int max_staleness;
  struct {
    int enabled;
    int min_steps;
  } dylu;
  int batch;       /* B */
  int seq_len;     /* T */
  jobspec_inner inner;
  jobspec_outer outer;
  int n_levels;
  jobspec_level levels[JOBSPEC_MAX_LEVELS];
  struct {
    int keep_last, keep_every;
  } versions;
  struct {
    int replay; /* replay pulls (jobspec_replay_pull) */
  } pulls;
  /* Streaming DiLoCo (docs/design.md §3.7): streaming mode — per-layer fragments and continuous
   * training — is on when F > 1, τ > 0, α != 0 or eager (jobspec_streaming); F = 1, τ = 0,
   * α = 0 is plain DiLoCo (one fragment per module), whatever the codec. */
  struct {
    int fragments;      /* F */
    int overlap_steps;  /* τ */
    double alpha;       /* α */
    int eager;
    int codec;          /* dpc_codec of PushDelta */
    int block_floats;
    int pull_codec;     /* dpc_codec of PullFragment parameters */
  } streaming;
  /* SparseLoCo (common/sparse.h): on when the spec has a "sparse" block. */
  struct {
    int enabled;
    double density;
    int chunk;
    int value_bits;
    double ef_beta;
  } sparse;
  double quorum;
  double round_timeout_s;
  int has_quorum_grace;   /* quorum_grace_s was given */
  double quorum_grace_s;
  jobspec_weighting weighting;
} jobspec;

/* One module: a contiguous float range [offset, offset+len) of the canonical layout. */
typedef struct {
  int id;    /* global module id */
  int level;
  int index; /* 0..K_level-1 */
  size_t offset, len;
} jobspec_module;

/* One fragment: the synchronised unit, a contiguous tensor-aligned part of one module. With
 * streaming, a module's stem and each of its layers is a fragment of its own and `group`
 * says when it syncs (jobspec_streaming_offset); without, the module is one fragment of
 * group 0. */
typedef struct {
  int id;
  int module;
  size_t offset, len; /* floats, canonical layout */
  int group;          /* streaming sync group g in [0, F): the stem 0, layer l → l mod F */
} jobspec_fragment;

/* Parse and validate json[0..n) into *out (fully overwritten; defaults filled in). On error
 * returns DPC_EINVAL (or DPC_EFORMAT for text that is not JSON, DPC_ENOMEM) with a detail
 * naming the field path, e.g. `unknown field "inner.lrr"`. */
int jobspec_parse(const char *json, size_t n, jobspec *out);

/* jobspec_parse for a spec the coordinator stored (its canonical JSON): the derived defaults of
 * jobspec_derive_schedule are not applied, so a job created before the momentum schedule
 * existed keeps its constant momentum. Reading a job back, not creating one. */
int jobspec_parse_stored(const char *json, size_t n, jobspec *out);

/* The momentum schedule a new spec gets where it leaves it out (docs/design.md §3.4): a sync
 * job with outer momentum and without eager updates warms its momentum up over ceil(rounds / 10)
 * rounds and decays it over the last ceil(rounds / 5) (tests/bench/outer_study.sh chose it);
 * other jobs none. Marks both fields given, so the canonical JSON carries them. */
void jobspec_derive_schedule(jobspec *js);
/* 1 if the job's schedule is the one jobspec_derive_schedule gives (for job show). */
int jobspec_schedule_is_derived(const jobspec *js);

/* Re-run every check on a struct (what jobspec_parse runs after reading). */
int jobspec_validate(const jobspec *js);

/* For an "init" model: read <base>/<init_dir>/config.json (base may be NULL for the current
 * directory, init_dir may be absolute), fill the shape, set has_shape and re-validate. A
 * spec that already has a shape must agree with the file (DPC_ESHAPE otherwise). */
int jobspec_resolve_init(jobspec *js, const char *base);

/* Canonical JSON (compact, fixed key order, every default written out). *out is malloc'd and
 * owned by the caller (free()). Parsing the output gives back an identical struct. */
int jobspec_to_json(const jobspec *js, char **out);

/* The training data of path `path`: a pointer to its first entry and the count (data.paths
 * list `path`, or data.train for every path when the spec has no data.paths). */
int jobspec_path_data(const jobspec *js, int path, const char (**first)[JOBSPEC_PATH_MAX]);

/* Schedule length for gpt_lr_at: rounds × inner_steps. */
long jobspec_total_steps(const jobspec *js);

/* Structure: counts are valid for a validated spec with a shape. */
int jobspec_n_modules(const jobspec *js);
int jobspec_n_paths(const jobspec *js);
int jobspec_n_slots(const jobspec *js); /* paths × replicas */

/* mods[0..n_levels) receives the module ids on path `path`; returns n_levels or DPC_ERANGE. */
int jobspec_path_modules(const jobspec *js, int path, int *mods);
/* 1 if path `path` goes through module `module`, else 0. */
int jobspec_path_has_module(const jobspec *js, int path, int module);

/* Build the canonical layout of the spec's model into *lay (the caller allocates it; it is
 * large, keep it off the stack). DPC_ESTATE for an unresolved "init" model. */
int jobspec_layout(const jobspec *js, gpt_layout *lay);

/* Fill out[0..cap) with the modules / fragments for layout `lay` (which must be the spec's
 * model); return how many there are (which may exceed cap: call with cap 0 to size), or a
 * negative DPC_E* code. */
int jobspec_modules(const jobspec *js, const gpt_layout *lay, jobspec_module *out, int cap);
int jobspec_fragments(const jobspec *js, const gpt_layout *lay, jobspec_fragment *out, int cap);

/* 1 if PullFragment can serve a SparseLoCo job's rounds as their sparse deltas
 * (PAYLOAD_SPARSE_ROUND): a sparse job whose outer rule has no momentum, so that a version's
 * parameters follow from the previous ones and the round's deltas alone. */
int jobspec_sparse_pull(const jobspec *js);
/* 1 if PullFragment serves the job's rounds as the deltas as sent (PAYLOAD_REPLAY_ROUND,
 * docs/design.md §4.3): pulls.replay on, a sync job (diloco or dipaco, streaming included)
 * without eager updates. */
int jobspec_replay_pull(const jobspec *js);

/* 1 if the spec runs Streaming DiLoCo (per-layer fragments, continuous training). */
int jobspec_streaming(const jobspec *js);
/* Sync offset o_g = floor(g·H/F) of group g: the group syncs after inner steps s (counted
 * from 1) with s >= max(1, o_g) and (s − o_g) mod H = 0. */
int jobspec_streaming_offset(const jobspec *js, int group);

const char *jobspec_algorithm_name(jobspec_algorithm a);
const char *jobspec_inner_state_name(jobspec_inner_state s);
/* "adamw" or "muon". */
const char *jobspec_inner_optimizer_name(jobspec_inner_optimizer o);
/* Muon's weight decay: inner.muon.weight_decay when given, else inner.weight_decay. */
double jobspec_muon_weight_decay(const jobspec *js);

/* The outer rule's defaults depend on the job (docs/design.md §3.4): a diloco job without a
 * "sparse" block or eager updates and with fewer than JOBSPEC_LONG_H inner steps a round takes
 * the step one notch smaller than the field table's 0.6 / 0.7 (0.5 / 0.6) with R <=
 * JOBSPEC_SMALL_R replicas, and one more (0.4 / 0.5) with a large model (at least
 * JOBSPEC_LARGE_PARAMS parameters in its transformer layers) and R <= JOBSPEC_LARGE_R.
 * jobspec_outer_derived gives the notches (0: the table's); jobspec_outer_default the lr,
 * momentum and nesterov a spec gets where it leaves them out (the other fields of *out are the
 * table's); jobspec_parse applies them to the fields its spec leaves out, and
 * jobspec_derive_outer again for the spec text json[0..n) once jobspec_resolve_init gave a spec
 * of an init directory its shape (dipacoctl), since the size counts. */
#define JOBSPEC_SMALL_R 2
#define JOBSPEC_LARGE_R 4
#define JOBSPEC_LONG_H 20
#define JOBSPEC_LARGE_PARAMS 250000L
int jobspec_outer_derived(const jobspec *js);
void jobspec_outer_default(const jobspec *js, jobspec_outer *out);
int jobspec_derive_outer(jobspec *js, const char *json, size_t n);

/* Where a job's outer rule (outer.lr, momentum, nesterov) comes from, for `job show`: the
 * defaults of its kind ("the defaults for diloco", or "for diloco at R = 2, H = 10 (derived
 * ...)"), or which values differ from them. Written into buf[cap]; returns buf. */
const char *jobspec_outer_origin(const jobspec *js, char *buf, size_t cap);

#endif
