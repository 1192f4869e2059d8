/* jobspec.c — job spec JSON parsing, validation, canonical output and the module / path /
 * fragment structure (see jobspec.h for the format and the defaults). */
#include "coordinator/jobspec.h"
#include "common/codec.h"
#include "common/sparse.h"
#include "common/errors.h"
#include "common/fsutil.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SPEC_BYTES (1 << 20)
#define MAX_SEED 9007199254740992.0 /* 2^53: exactly representable in JSON numbers */

/* ---- reading helpers: every error names the field path ---------------------------------- */

static const char *fpath(char *buf, size_t cap, const char *prefix, const char *key) {
  if (prefix && prefix[0]) snprintf(buf, cap, "%s.%s", prefix, key);
  else snprintf(buf, cap, "%s", key);
  return buf;
}

/* Reject keys not in `allowed` (NULL-terminated) and duplicated keys. */
static int check_keys(const cJSON *obj, const char *prefix, const char *const *allowed) {
  char p[160];
  for (const cJSON *c = obj->child; c; c = c->next) {
    int ok = 0;
    for (int i = 0; allowed[i]; i++)
      if (c->string && strcmp(c->string, allowed[i]) == 0) ok = 1;
    if (!ok) return dpc_err(DPC_EINVAL, "unknown field \"%s\"", fpath(p, sizeof p, prefix, c->string ? c->string : "?"));
    for (const cJSON *d = c->next; d; d = d->next)
      if (d->string && strcmp(d->string, c->string) == 0)
        return dpc_err(DPC_EINVAL, "duplicate field \"%s\"", fpath(p, sizeof p, prefix, c->string));
  }
  return 0;
}

static const cJSON *get_field(const cJSON *obj, const char *key) {
  for (const cJSON *c = obj->child; c; c = c->next)
    if (c->string && strcmp(c->string, key) == 0) return c;
  return NULL;
}

/* 1 if found (value in *out), 0 if absent and not required, negative on error. */
static int get_number(const cJSON *obj, const char *prefix, const char *key, int required, double *out) {
  char p[160];
  const cJSON *v = get_field(obj, key);
  if (!v) return required ? dpc_err(DPC_EINVAL, "missing field \"%s\"", fpath(p, sizeof p, prefix, key)) : 0;
  if (!cJSON_IsNumber(v)) return dpc_err(DPC_EINVAL, "field \"%s\": expected a number", fpath(p, sizeof p, prefix, key));
  if (!isfinite(v->valuedouble))
    return dpc_err(DPC_EINVAL, "field \"%s\": not a finite number", fpath(p, sizeof p, prefix, key));
  *out = v->valuedouble;
  return 1;
}

/* Integers are checked for integrality and for fitting an int here; ranges in validate(). */
static int get_int(const cJSON *obj, const char *prefix, const char *key, int required, int *out) {
  char p[160];
  double d;
  int rc = get_number(obj, prefix, key, required, &d);
  if (rc <= 0) return rc;
  if (floor(d) != d) return dpc_err(DPC_EINVAL, "field \"%s\" = %g: expected an integer", fpath(p, sizeof p, prefix, key), d);
  if (d < INT_MIN || d > INT_MAX)
    return dpc_err(DPC_EINVAL, "field \"%s\" = %g out of range", fpath(p, sizeof p, prefix, key), d);
  *out = (int)d;
  return 1;
}

static int get_bool(const cJSON *obj, const char *prefix, const char *key, int *out) {
  char p[160];
  const cJSON *v = get_field(obj, key);
  if (!v) return 0;
  if (!cJSON_IsBool(v)) return dpc_err(DPC_EINVAL, "field \"%s\": expected true or false", fpath(p, sizeof p, prefix, key));
  *out = cJSON_IsTrue(v);
  return 1;
}

static int get_string(const cJSON *obj, const char *prefix, const char *key, int required, char *out, size_t cap) {
  char p[160];
  const cJSON *v = get_field(obj, key);
  if (!v) return required ? dpc_err(DPC_EINVAL, "missing field \"%s\"", fpath(p, sizeof p, prefix, key)) : 0;
  if (!cJSON_IsString(v) || !v->valuestring)
    return dpc_err(DPC_EINVAL, "field \"%s\": expected a string", fpath(p, sizeof p, prefix, key));
  if (strlen(v->valuestring) >= cap)
    return dpc_err(DPC_EINVAL, "field \"%s\": longer than %zu characters", fpath(p, sizeof p, prefix, key), cap - 1);
  strcpy(out, v->valuestring);
  return 1;
}

/* A string field that must be one of names[0..n); the index goes to *out. */
static int get_enum(const cJSON *obj, const char *prefix, const char *key, int required,
                    const char *const *names, int n, int *out) {
  char p[160], s[64];
  int rc = get_string(obj, prefix, key, required, s, sizeof s);
  if (rc <= 0) {
    if (rc == DPC_EINVAL && strstr(dpc_errmsg(), "longer than"))
      return dpc_err(DPC_EINVAL, "field \"%s\": unknown value", fpath(p, sizeof p, prefix, key));
    return rc;
  }
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = i;
      return 1;
    }
  char opts[256] = "";
  for (int i = 0; i < n; i++) {
    strncat(opts, i ? ", " : "", sizeof opts - strlen(opts) - 1);
    strncat(opts, names[i], sizeof opts - strlen(opts) - 1);
  }
  return dpc_err(DPC_EINVAL, "field \"%s\" = \"%s\": expected one of %s", fpath(p, sizeof p, prefix, key), s, opts);
}

static const cJSON *get_object(const cJSON *obj, const char *prefix, const char *key, int required, int *rc) {
  char p[160];
  const cJSON *v = get_field(obj, key);
  *rc = 0;
  if (!v) {
    if (required) *rc = dpc_err(DPC_EINVAL, "missing field \"%s\"", fpath(p, sizeof p, prefix, key));
    return NULL;
  }
  if (!cJSON_IsObject(v)) {
    *rc = dpc_err(DPC_EINVAL, "field \"%s\": expected an object", fpath(p, sizeof p, prefix, key));
    return NULL;
  }
  return v;
}

static const char *const ALGO_NAMES[] = {"diloco", "diloco-async", "dipaco"};
static const char *const STATE_NAMES[] = {"keep", "reset", "checkpoint"};
static const char *const ASYNC_NAMES[] = {"delayed-nesterov", "nesterov", "sgd"};
static const char *const WEIGHT_NAMES[] = {"uniform", "tokens"};

const char *jobspec_algorithm_name(jobspec_algorithm a) {
  return (unsigned)a < 3 ? ALGO_NAMES[a] : "?";
}
const char *jobspec_inner_state_name(jobspec_inner_state s) {
  return (unsigned)s < 3 ? STATE_NAMES[s] : "?";
}

#define JS_TRY(x)           \
  do {                      \
    int _rc = (x);          \
    if (_rc < 0) return _rc; \
  } while (0)

static int parse_data_list(const cJSON *data, const char *key, int required, char (*out)[JOBSPEC_PATH_MAX], int *n) {
  char p[160];
  fpath(p, sizeof p, "data", key);
  const cJSON *v = get_field(data, key);
  *n = 0;
  if (!v) return required ? dpc_err(DPC_EINVAL, "missing field \"%s\"", p) : 0;
  if (!cJSON_IsArray(v)) return dpc_err(DPC_EINVAL, "field \"%s\": expected an array of paths", p);
  int i = 0;
  for (const cJSON *e = v->child; e; e = e->next, i++) {
    if (i >= JOBSPEC_MAX_DATA) return dpc_err(DPC_EINVAL, "field \"%s\": more than %d entries", p, JOBSPEC_MAX_DATA);
    if (!cJSON_IsString(e) || !e->valuestring) return dpc_err(DPC_EINVAL, "field \"%s[%d]\": expected a string", p, i);
    if (strlen(e->valuestring) >= JOBSPEC_PATH_MAX)
      return dpc_err(DPC_EINVAL, "field \"%s[%d]\": longer than %d characters", p, i, JOBSPEC_PATH_MAX - 1);
    strcpy(out[i], e->valuestring);
  }
  *n = i;
  return 0;
}

/* data.paths: [[glob, ...], ...], one list per path; the count is checked against the levels
 * in jobspec_validate. */
static int parse_data_paths(const cJSON *v, jobspec *js) {
  if (!cJSON_IsArray(v)) return dpc_err(DPC_EINVAL, "field \"data.paths\": expected an array of lists of paths");
  int p = 0, g = 0;
  for (const cJSON *l = v->child; l; l = l->next, p++) {
    if (p >= JOBSPEC_MAX_DATA_PATHS)
      return dpc_err(DPC_EINVAL, "field \"data.paths\": more than %d paths", JOBSPEC_MAX_DATA_PATHS);
    if (!cJSON_IsArray(l))
      return dpc_err(DPC_EINVAL, "field \"data.paths[%d]\": expected a list of paths (one list per path)", p);
    js->path_first[p] = g;
    int i = 0;
    for (const cJSON *e = l->child; e; e = e->next, i++, g++) {
      if (g >= JOBSPEC_MAX_PATH_GLOBS)
        return dpc_err(DPC_EINVAL, "field \"data.paths\": more than %d entries in all", JOBSPEC_MAX_PATH_GLOBS);
      if (!cJSON_IsString(e) || !e->valuestring)
        return dpc_err(DPC_EINVAL, "field \"data.paths[%d][%d]\": expected a string", p, i);
      if (strlen(e->valuestring) >= JOBSPEC_PATH_MAX)
        return dpc_err(DPC_EINVAL, "field \"data.paths[%d][%d]\": longer than %d characters", p, i,
                       JOBSPEC_PATH_MAX - 1);
      strcpy(js->path_glob[g], e->valuestring);
    }
  }
  js->path_first[p] = g;
  js->n_data_paths = p;
  if (p == 0) return dpc_err(DPC_EINVAL, "field \"data.paths\": needs one list per path, got none");
  return 0;
}

static int parse_levels(const cJSON *root, jobspec *js) {
  const cJSON *v = get_field(root, "levels");
  if (!v) {
    js->n_levels = 1;
    js->levels[0] = (jobspec_level){.stem = 1, .layer_begin = 0, .layer_end = js->has_shape ? js->model.n_layer : -1, .n_modules = 1};
    return 0;
  }
  if (!cJSON_IsArray(v)) return dpc_err(DPC_EINVAL, "field \"levels\": expected an array");
  static const char *const keys[] = {"stem", "layers", "modules", NULL};
  int i = 0;
  for (const cJSON *e = v->child; e; e = e->next, i++) {
    char p[64];
    snprintf(p, sizeof p, "levels[%d]", i);
    if (i >= JOBSPEC_MAX_LEVELS) return dpc_err(DPC_EINVAL, "field \"levels\": more than %d levels", JOBSPEC_MAX_LEVELS);
    if (!cJSON_IsObject(e)) return dpc_err(DPC_EINVAL, "field \"%s\": expected an object", p);
    JS_TRY(check_keys(e, p, keys));
    jobspec_level *lv = &js->levels[i];
    lv->stem = 0;
    lv->n_modules = 1;
    JS_TRY(get_bool(e, p, "stem", &lv->stem));
    JS_TRY(get_int(e, p, "modules", 0, &lv->n_modules));
    const cJSON *ly = get_field(e, "layers");
    if (!ly) return dpc_err(DPC_EINVAL, "missing field \"%s.layers\"", p);
    if (!cJSON_IsArray(ly) || cJSON_GetArraySize(ly) != 2 || !cJSON_IsNumber(ly->child) ||
        !cJSON_IsNumber(ly->child->next))
      return dpc_err(DPC_EINVAL, "field \"%s.layers\": expected [first, end] (two integers)", p);
    double a = ly->child->valuedouble, b = ly->child->next->valuedouble;
    if (floor(a) != a || floor(b) != b || a < 0 || b < 0 || a > 256 || b > 256)
      return dpc_err(DPC_EINVAL, "field \"%s.layers\": expected integers in [0, 256]", p);
    lv->layer_begin = (int)a;
    lv->layer_end = (int)b;
  }
  if (i == 0) return dpc_err(DPC_EINVAL, "field \"levels\": needs at least one level");
  js->n_levels = i;
  return 0;
}

static void set_defaults(jobspec *js) {
  memset(js, 0, sizeof *js);
  js->inner = (jobspec_inner){.lr = JOBSPEC_DEFAULT_INNER_LR,
                              .lr_min_frac = JOBSPEC_DEFAULT_LR_MIN_FRAC,
                              .weight_decay = JOBSPEC_DEFAULT_WEIGHT_DECAY,
                              .beta1 = JOBSPEC_DEFAULT_BETA1,
                              .beta2 = JOBSPEC_DEFAULT_BETA2,
                              .eps = JOBSPEC_DEFAULT_EPS,
                              .grad_clip = JOBSPEC_DEFAULT_GRAD_CLIP,
                              .warmup = JOBSPEC_DEFAULT_WARMUP,
                              .state = INNER_STATE_KEEP};
  js->outer = (jobspec_outer){.lr = JOBSPEC_DEFAULT_OUTER_LR,
                              .momentum = JOBSPEC_DEFAULT_OUTER_MOMENTUM,
                              .nesterov = 1,
                              .async_rule = OUTER_ASYNC_DN,
                              .buffer = 0,
                              .c = 0.0};
  js->max_staleness = 0;
  js->dylu.enabled = 0;
  js->dylu.min_steps = 1;
  js->versions.keep_last = 2;
  js->versions.keep_every = 0;
  js->streaming.fragments = 1;
  js->streaming.overlap_steps = 0;
  js->streaming.alpha = 0.0;
  js->streaming.eager = 0;
  js->streaming.codec = DPC_CODEC_FP32;
  js->streaming.block_floats = DPC_CODEC_BLOCK_DEFAULT;
  js->streaming.pull_codec = DPC_CODEC_FP32;
  js->sparse.density = JOBSPEC_DEFAULT_SPARSE_DENSITY;
  js->sparse.chunk = JOBSPEC_DEFAULT_SPARSE_CHUNK;
  js->sparse.value_bits = JOBSPEC_DEFAULT_SPARSE_VALUE_BITS;
  js->sparse.ef_beta = JOBSPEC_DEFAULT_SPARSE_EF_BETA;
  js->quorum = JOBSPEC_DEFAULT_QUORUM;
  js->round_timeout_s = JOBSPEC_DEFAULT_ROUND_TIMEOUT_S;
  js->weighting = WEIGHTING_UNIFORM;
}

static int parse_model(const cJSON *root, jobspec *js) {
  int rc;
  const cJSON *m = get_object(root, "", "model", 1, &rc);
  if (!m) return rc;
  static const char *const keys[] = {"init", "n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "seed", NULL};
  JS_TRY(check_keys(m, "model", keys));
  JS_TRY(get_string(m, "model", "init", 0, js->init_dir, sizeof js->init_dir));
  const char *shape[] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
  int *dst[] = {&js->model.n_layer, &js->model.n_head, &js->model.n_embd, &js->model.n_positions, &js->model.vocab_size};
  int present = 0;
  for (int i = 0; i < 5; i++) present += get_field(m, shape[i]) != NULL;
  if (js->init_dir[0] && present == 0) {
    js->has_shape = 0;
  } else {
    for (int i = 0; i < 5; i++) JS_TRY(get_int(m, "model", shape[i], 1, dst[i]));
    js->has_shape = 1;
  }
  double seed = 0;
  JS_TRY(get_number(m, "model", "seed", 0, &seed));
  if (floor(seed) != seed || seed < 0 || seed > MAX_SEED)
    return dpc_err(DPC_EINVAL, "field \"model.seed\" = %g: expected an integer in [0, 2^53]", seed);
  js->seed = (uint64_t)seed;
  return 0;
}

static int parse_data(const cJSON *root, jobspec *js) {
  int rc;
  const cJSON *d = get_object(root, "", "data", 1, &rc);
  if (!d) return rc;
  static const char *const keys[] = {"train", "paths", "val", NULL};
  JS_TRY(check_keys(d, "data", keys));
  const cJSON *paths = get_field(d, "paths");
  if (paths && get_field(d, "train"))
    return dpc_err(DPC_EINVAL, "fields \"data.train\" and \"data.paths\": give one of them (data.paths gives "
                   "each path its own data)");
  if (paths) JS_TRY(parse_data_paths(paths, js));
  else JS_TRY(parse_data_list(d, "train", 1, js->train, &js->n_train));
  return parse_data_list(d, "val", 0, js->val, &js->n_val);
}

static int parse_inner(const cJSON *root, jobspec *js) {
  int rc;
  const cJSON *in = get_object(root, "", "inner", 0, &rc);
  if (!in) return rc;
  static const char *const keys[] = {"lr", "warmup", "lr_min_frac", "weight_decay", "beta1", "beta2",
                                     "eps", "grad_clip", "state", NULL};
  JS_TRY(check_keys(in, "inner", keys));
  JS_TRY(get_number(in, "inner", "lr", 0, &js->inner.lr));
  JS_TRY(get_int(in, "inner", "warmup", 0, &js->inner.warmup));
  JS_TRY(get_number(in, "inner", "lr_min_frac", 0, &js->inner.lr_min_frac));
  JS_TRY(get_number(in, "inner", "weight_decay", 0, &js->inner.weight_decay));
  JS_TRY(get_number(in, "inner", "beta1", 0, &js->inner.beta1));
  JS_TRY(get_number(in, "inner", "beta2", 0, &js->inner.beta2));
  JS_TRY(get_number(in, "inner", "eps", 0, &js->inner.eps));
  JS_TRY(get_number(in, "inner", "grad_clip", 0, &js->inner.grad_clip));
  int v = js->inner.state;
  JS_TRY(get_enum(in, "inner", "state", 0, STATE_NAMES, 3, &v));
  js->inner.state = (jobspec_inner_state)v;
  return 0;
}

static int parse_outer(const cJSON *root, jobspec *js) {
  int rc;
  const cJSON *o = get_object(root, "", "outer", 0, &rc);
  if (!o) return rc;
  /* "async" and "buffer" are the older names of "rule" and "delay_buffer" (accepted). */
  static const char *const keys[] = {"lr",  "momentum", "nesterov", "rule", "delay_buffer", "c", "async", "buffer",
                                     "delta_norm_screen", NULL};
  JS_TRY(check_keys(o, "outer", keys));
  if (get_field(o, "rule") && get_field(o, "async"))
    return dpc_err(DPC_EINVAL, "field \"outer.async\": an old name of \"outer.rule\"; give only one");
  if (get_field(o, "delay_buffer") && get_field(o, "buffer"))
    return dpc_err(DPC_EINVAL, "field \"outer.buffer\": an old name of \"outer.delay_buffer\"; give only one");
  JS_TRY(get_number(o, "outer", "lr", 0, &js->outer.lr));
  JS_TRY(get_number(o, "outer", "momentum", 0, &js->outer.momentum));
  JS_TRY(get_bool(o, "outer", "nesterov", &js->outer.nesterov));
  int v = js->outer.async_rule;
  JS_TRY(get_enum(o, "outer", "rule", 0, ASYNC_NAMES, 3, &v));
  JS_TRY(get_enum(o, "outer", "async", 0, ASYNC_NAMES, 3, &v));
  js->outer.async_rule = (jobspec_async_rule)v;
  JS_TRY(get_int(o, "outer", "delay_buffer", 0, &js->outer.buffer));
  JS_TRY(get_int(o, "outer", "buffer", 0, &js->outer.buffer));
  JS_TRY(get_number(o, "outer", "c", 0, &js->outer.c));
  return get_number(o, "outer", "delta_norm_screen", 0, &js->outer.delta_norm_screen);
}

/* "dylu" and "versions": small objects of optional fields. */
static int parse_dylu_versions(const cJSON *root, jobspec *js) {
  int rc;
  const cJSON *dy = get_object(root, "", "dylu", 0, &rc);
  if (rc) return rc;
  if (dy) {
    static const char *const keys[] = {"enabled", "min_steps", NULL};
    JS_TRY(check_keys(dy, "dylu", keys));
    JS_TRY(get_bool(dy, "dylu", "enabled", &js->dylu.enabled));
    JS_TRY(get_int(dy, "dylu", "min_steps", 0, &js->dylu.min_steps));
  }
  const cJSON *vs = get_object(root, "", "versions", 0, &rc);
  if (!vs) return rc;
  static const char *const keys[] = {"keep_last", "keep_every", NULL};
  JS_TRY(check_keys(vs, "versions", keys));
  JS_TRY(get_int(vs, "versions", "keep_last", 0, &js->versions.keep_last));
  return get_int(vs, "versions", "keep_every", 0, &js->versions.keep_every);
}

/* A codec name field of "streaming" into *out (a dpc_codec). */
static int get_codec(const cJSON *obj, const char *key, int *out) {
  const cJSON *f = get_field(obj, key);
  if (!f) return 0;
  if (!cJSON_IsString(f)) return dpc_err(DPC_EINVAL, "field \"streaming.%s\": expected a string", key);
  dpc_codec c;
  if (dpc_codec_parse(f->valuestring, &c) < 0) return dpc_err(DPC_EINVAL, "field \"streaming.%s\": %s", key, dpc_errmsg());
  *out = (int)c;
  return 0;
}

/* "sparse": SparseLoCo. Its presence also changes the outer rule's defaults (parse_outer may
 * override them): plain SGD, lr JOBSPEC_DEFAULT_SPARSE_OUTER_LR. */
static int parse_sparse(const cJSON *root, jobspec *js) {
  int rc;
  const cJSON *sp = get_object(root, "", "sparse", 0, &rc);
  if (!sp) return rc;
  static const char *const keys[] = {"density", "chunk", "value_bits", "ef_beta", NULL};
  JS_TRY(check_keys(sp, "sparse", keys));
  js->sparse.enabled = 1;
  js->outer.lr = JOBSPEC_DEFAULT_SPARSE_OUTER_LR;
  js->outer.momentum = 0.0;
  js->outer.nesterov = 0;
  JS_TRY(get_number(sp, "sparse", "density", 0, &js->sparse.density));
  JS_TRY(get_int(sp, "sparse", "chunk", 0, &js->sparse.chunk));
  JS_TRY(get_int(sp, "sparse", "value_bits", 0, &js->sparse.value_bits));
  return get_number(sp, "sparse", "ef_beta", 0, &js->sparse.ef_beta);
}

/* "streaming": Streaming DiLoCo and the delta codec. */
static int parse_streaming(const cJSON *root, jobspec *js) {
  int rc;
  const cJSON *st = get_object(root, "", "streaming", 0, &rc);
  if (!st) return rc;
  static const char *const keys[] = {"fragments", "overlap_steps", "alpha", "eager", "codec", "block_floats",
                                     "pull_codec", NULL};
  JS_TRY(check_keys(st, "streaming", keys));
  JS_TRY(get_int(st, "streaming", "fragments", 0, &js->streaming.fragments));
  JS_TRY(get_int(st, "streaming", "overlap_steps", 0, &js->streaming.overlap_steps));
  JS_TRY(get_number(st, "streaming", "alpha", 0, &js->streaming.alpha));
  JS_TRY(get_bool(st, "streaming", "eager", &js->streaming.eager));
  JS_TRY(get_codec(st, "codec", &js->streaming.codec));
  JS_TRY(get_int(st, "streaming", "block_floats", 0, &js->streaming.block_floats));
  return get_codec(st, "pull_codec", &js->streaming.pull_codec);
}

/* The top-level object, section by section, then the cross-field checks. */
static int parse_root(const cJSON *root, jobspec *js) {
  if (!cJSON_IsObject(root)) return dpc_err(DPC_EINVAL, "job spec: expected a JSON object at the top level");
  static const char *const top[] = {"name", "model", "data", "algorithm", "replicas", "inner_steps",
                                    "rounds", "batch", "seq_len", "inner", "outer", "levels",
                                    "quorum", "round_timeout_s", "quorum_grace_s", "weighting", "max_staleness", "dylu",
                                    "versions", "streaming", "sparse", NULL};
  JS_TRY(check_keys(root, "", top));
  JS_TRY(get_string(root, "", "name", 1, js->name, sizeof js->name));
  JS_TRY(parse_model(root, js));
  JS_TRY(parse_data(root, js));
  int v;
  JS_TRY(get_enum(root, "", "algorithm", 1, ALGO_NAMES, 3, &v));
  js->algorithm = (jobspec_algorithm)v;
  if (js->algorithm == JOB_ALGO_DILOCO_ASYNC) { /* the outer defaults differ (parse_outer may override) */
    js->outer.lr = JOBSPEC_DEFAULT_ASYNC_OUTER_LR;
    js->outer.momentum = JOBSPEC_DEFAULT_ASYNC_OUTER_MOMENTUM;
  }
  JS_TRY(get_int(root, "", "replicas", 1, &js->replicas));
  JS_TRY(get_int(root, "", "inner_steps", 1, &js->inner_steps));
  JS_TRY(get_int(root, "", "rounds", 1, &js->rounds));
  JS_TRY(get_int(root, "", "batch", 1, &js->batch));
  JS_TRY(get_int(root, "", "seq_len", 1, &js->seq_len));
  JS_TRY(parse_inner(root, js));
  JS_TRY(parse_sparse(root, js));
  JS_TRY(parse_outer(root, js));
  JS_TRY(get_int(root, "", "max_staleness", 0, &js->max_staleness));
  JS_TRY(parse_dylu_versions(root, js));
  JS_TRY(parse_streaming(root, js));
  JS_TRY(parse_levels(root, js));
  JS_TRY(get_number(root, "", "quorum", 0, &js->quorum));
  JS_TRY(get_number(root, "", "round_timeout_s", 0, &js->round_timeout_s));
  int grace = get_number(root, "", "quorum_grace_s", 0, &js->quorum_grace_s);
  if (grace < 0) return grace;
  js->has_quorum_grace = grace == 1;
  v = js->weighting;
  JS_TRY(get_enum(root, "", "weighting", 0, WEIGHT_NAMES, 2, &v));
  js->weighting = (jobspec_weighting)v;
  return jobspec_validate(js);
}

/* The bytes a spec may hold: UTF-8 without NUL, raw or escaped (a NUL would cut a string
 * short silently; other bytes would reach clients that require UTF-8, e.g. in GetJob). */
static int check_spec_bytes(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    if (c == 0) return dpc_err(DPC_EFORMAT, "job spec holds a NUL byte at byte %zu", i);
    if (c == '\\') {
      if (i + 5 < n && s[i + 1] == 'u' && s[i + 2] == '0' && s[i + 3] == '0' && s[i + 4] == '0' && s[i + 5] == '0')
        return dpc_err(DPC_EFORMAT, "job spec holds an escaped NUL (\\u0000) at byte %zu", i);
      i += 2; /* an escape: the next byte is not a backslash of its own */
      continue;
    }
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    int ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; k++) ok = (s[i + k] & 0xC0) == 0x80;
    if (ok && len == 2) ok = c >= 0xC2;                                        /* overlong */
    if (ok && len == 3) ok = !(c == 0xE0 && s[i + 1] < 0xA0) && !(c == 0xED && s[i + 1] >= 0xA0); /* overlong, surrogate */
    if (ok && len == 4) ok = !(c == 0xF0 && s[i + 1] < 0x90) && c <= 0xF4 && !(c == 0xF4 && s[i + 1] >= 0x90);
    if (!ok) return dpc_err(DPC_EFORMAT, "job spec is not valid UTF-8 at byte %zu", i);
    i += len;
  }
  return 0;
}

int jobspec_parse(const char *json, size_t n, jobspec *out) {
  set_defaults(out);
  if (!json || n == 0) return dpc_err(DPC_EFORMAT, "job spec is empty");
  if (n > MAX_SPEC_BYTES) return dpc_err(DPC_EINVAL, "job spec is %zu bytes (limit %d)", n, MAX_SPEC_BYTES);
  int brc = check_spec_bytes((const unsigned char *)json, n);
  if (brc) return brc;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, n, &end, 0);
  if (!root) {
    long at = end ? (long)(end - json) : -1;
    return dpc_err(DPC_EFORMAT, "job spec is not valid JSON (near byte %ld)", at);
  }
  for (const char *p = end; p && p < json + n; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
      cJSON_Delete(root);
      return dpc_err(DPC_EFORMAT, "job spec: text after the JSON object at byte %ld", (long)(p - json));
    }
  int rc = parse_root(root, out);
  cJSON_Delete(root);
  return rc < 0 ? rc : 0;
}

/* ---- validation ------------------------------------------------------------------------ */

static int validate_streaming(const jobspec *js);
static int validate_sparse(const jobspec *js);

static int check_range_i(const char *field, long v, long lo, long hi) {
  if (v < lo || v > hi) return dpc_err(DPC_EINVAL, "field \"%s\" = %ld out of range [%ld, %ld]", field, v, lo, hi);
  return 0;
}

/* lo_open/hi_open: 1 excludes the bound. */
static int check_range_d(const char *field, double v, double lo, int lo_open, double hi, int hi_open) {
  int ok = isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok)
    return dpc_err(DPC_EINVAL, "field \"%s\" = %g out of range %c%g, %g%c", field, v, lo_open ? '(' : '[', lo, hi,
                   hi_open ? ')' : ']');
  return 0;
}

static int check_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0) return dpc_err(DPC_EINVAL, "field \"name\" is empty");
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return dpc_err(DPC_EINVAL, "field \"name\" = \"%s\": use only letters, digits, '.', '_' and '-'", s);
  }
  return 0;
}

static int has_ctl(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f) return 1;
  return 0;
}

/* A data path is resolved under the worker's --data-dir: relative, no "..", no control chars,
 * and no component a glob could expand to "..": a leading "." followed by "?", "*", "[" or
 * another "." (wildcards match a leading "." only after a literal one). The worker also checks
 * every match by its resolved path (symlinks). */
static int check_data_path(const char *field, int i, const char *s) {
  if (!s[0]) return dpc_err(DPC_EINVAL, "field \"%s[%d]\" is empty", field, i);
  if (s[0] == '/') return dpc_err(DPC_EINVAL, "field \"%s[%d]\" = \"%s\": must be relative to the worker's --data-dir", field, i, s);
  if (has_ctl(s)) return dpc_err(DPC_EINVAL, "field \"%s[%d]\": contains control characters", field, i);
  const char *p = s;
  while (*p) {
    const char *q = strchr(p, '/');
    size_t len = q ? (size_t)(q - p) : strlen(p);
    if (len == 2 && p[0] == '.' && p[1] == '.')
      return dpc_err(DPC_EINVAL, "field \"%s[%d]\" = \"%s\": \"..\" may not leave the data directory", field, i, s);
    if (len >= 2 && p[0] == '.' && strchr(".?*[", p[1]))
      return dpc_err(DPC_EINVAL, "field \"%s[%d]\" = \"%s\": the component \"%.*s\" could match \"..\" and leave the data "
                     "directory", field, i, s, (int)len, p);
    p += len;
    if (*p == '/') p++;
  }
  return 0;
}

int jobspec_validate(const jobspec *js) {
  JS_TRY(check_name(js->name));
  if (js->init_dir[0] && has_ctl(js->init_dir))
    return dpc_err(DPC_EINVAL, "field \"model.init\": contains control characters");
  if (!js->init_dir[0] && !js->has_shape) return dpc_err(DPC_EINVAL, "field \"model\": needs \"init\" or the shape fields");
  if (js->has_shape) {
    JS_TRY(check_range_i("model.n_layer", js->model.n_layer, 1, 256));
    JS_TRY(check_range_i("model.n_head", js->model.n_head, 1, 1024));
    JS_TRY(check_range_i("model.n_embd", js->model.n_embd, 1, 65536));
    JS_TRY(check_range_i("model.n_positions", js->model.n_positions, 1, 1 << 20));
    JS_TRY(check_range_i("model.vocab_size", js->model.vocab_size, 2, 1 << 24));
    if (gpt_config_validate(&js->model)) return dpc_err(DPC_EINVAL, "field \"model\": %s", dpc_errmsg());
  }
  if ((double)js->seed > MAX_SEED) return dpc_err(DPC_EINVAL, "field \"model.seed\" above 2^53");
  if (js->n_data_paths < 0 || js->n_data_paths > JOBSPEC_MAX_DATA_PATHS)
    return dpc_err(DPC_EINVAL, "field \"data.paths\": %d lists (at most %d)", js->n_data_paths, JOBSPEC_MAX_DATA_PATHS);
  if (js->n_data_paths > 0 && js->n_train > 0)
    return dpc_err(DPC_EINVAL, "fields \"data.train\" and \"data.paths\": give one of them");
  if (js->n_data_paths == 0 && js->n_train < 1) return dpc_err(DPC_EINVAL, "field \"data.train\": needs at least one path");
  for (int i = 0; i < js->n_train; i++) JS_TRY(check_data_path("data.train", i, js->train[i]));
  if (js->n_data_paths > 0 && js->path_first[0] != 0)
    return dpc_err(DPC_EINVAL, "field \"data.paths\": entries must start at 0");
  for (int p = 0; p < js->n_data_paths; p++) {
    int b = js->path_first[p], e = js->path_first[p + 1];
    if (e < b || e > JOBSPEC_MAX_PATH_GLOBS)
      return dpc_err(DPC_EINVAL, "field \"data.paths[%d]\": bad entry range [%d, %d)", p, b, e);
    if (e == b)
      return dpc_err(DPC_EINVAL, "field \"data.paths[%d]\": path %d has no data (an empty list; every path needs "
                     "at least one shard)", p, p);
    char f[48];
    snprintf(f, sizeof f, "data.paths[%d]", p);
    for (int i = b; i < e; i++) JS_TRY(check_data_path(f, i - b, js->path_glob[i]));
  }
  for (int i = 0; i < js->n_val; i++) JS_TRY(check_data_path("data.val", i, js->val[i]));
  if ((unsigned)js->algorithm > JOB_ALGO_DIPACO) return dpc_err(DPC_EINVAL, "field \"algorithm\": unknown value");
  JS_TRY(check_range_i("replicas", js->replicas, 1, JOBSPEC_MAX_REPLICAS));
  JS_TRY(check_range_i("inner_steps", js->inner_steps, 1, 1000000));
  JS_TRY(check_range_i("rounds", js->rounds, 1, 10000000));
  if ((long long)js->rounds * js->inner_steps > INT_MAX)
    return dpc_err(DPC_EINVAL, "rounds × inner_steps = %lld exceeds %d", (long long)js->rounds * js->inner_steps, INT_MAX);
  JS_TRY(check_range_i("batch", js->batch, 1, 65536));
  JS_TRY(check_range_i("seq_len", js->seq_len, 1, 1 << 20));
  if (js->has_shape && js->seq_len > js->model.n_positions)
    return dpc_err(DPC_EINVAL, "field \"seq_len\" = %d exceeds model.n_positions = %d", js->seq_len, js->model.n_positions);
  const jobspec_inner *in = &js->inner;
  JS_TRY(check_range_d("inner.lr", in->lr, 0, 1, 10, 0));
  JS_TRY(check_range_i("inner.warmup", in->warmup, 0, (long)js->rounds * js->inner_steps));
  JS_TRY(check_range_d("inner.lr_min_frac", in->lr_min_frac, 0, 0, 1, 0));
  JS_TRY(check_range_d("inner.weight_decay", in->weight_decay, 0, 0, 10, 0));
  JS_TRY(check_range_d("inner.beta1", in->beta1, 0, 0, 1, 1));
  JS_TRY(check_range_d("inner.beta2", in->beta2, 0, 0, 1, 1));
  JS_TRY(check_range_d("inner.eps", in->eps, 0, 1, 1, 0));
  JS_TRY(check_range_d("inner.grad_clip", in->grad_clip, 0, 0, 1e6, 0));
  if ((unsigned)in->state > INNER_STATE_CHECKPOINT) return dpc_err(DPC_EINVAL, "field \"inner.state\": unknown value");
  const jobspec_outer *o = &js->outer;
  JS_TRY(check_range_d("outer.lr", o->lr, 0, 1, 10, 0));
  JS_TRY(check_range_d("outer.momentum", o->momentum, 0, 0, 1, 1));
  if (o->nesterov != 0 && o->nesterov != 1) return dpc_err(DPC_EINVAL, "field \"outer.nesterov\": expected a boolean");
  if ((unsigned)o->async_rule > OUTER_ASYNC_SGD) return dpc_err(DPC_EINVAL, "field \"outer.rule\": unknown value");
  JS_TRY(check_range_i("outer.delay_buffer", o->buffer, 0, JOBSPEC_MAX_SLOTS));
  JS_TRY(check_range_d("outer.c", o->c, 0, 0, 1, 0));
  if (o->buffer > 0 && o->c > 1.0 / o->buffer)
    return dpc_err(DPC_EINVAL, "field \"outer.c\" = %g exceeds 1/outer.delay_buffer = %g", o->c, 1.0 / o->buffer);
  if (o->delta_norm_screen != 0) /* a factor below 2 would refuse honest deltas near the median */
    JS_TRY(check_range_d("outer.delta_norm_screen", o->delta_norm_screen, 2, 0, 1e6, 0));
  JS_TRY(check_range_i("max_staleness", js->max_staleness, 0, 1000000000));
  if (js->dylu.enabled != 0 && js->dylu.enabled != 1) return dpc_err(DPC_EINVAL, "field \"dylu.enabled\": expected a boolean");
  JS_TRY(check_range_i("dylu.min_steps", js->dylu.min_steps, 1, js->inner_steps));
  /* keep_last >= 2: the version before the newest may still be streaming to a late worker. */
  JS_TRY(check_range_i("versions.keep_last", js->versions.keep_last, 2, 10000));
  JS_TRY(check_range_i("versions.keep_every", js->versions.keep_every, 0, 1000000000));
  JS_TRY(check_range_d("quorum", js->quorum, 0, 1, 1, 0));
  JS_TRY(check_range_d("round_timeout_s", js->round_timeout_s, 0, 0, 30 * 86400.0, 0));
  if (js->has_quorum_grace) {
    if (js->algorithm == JOB_ALGO_DILOCO_ASYNC)
      return dpc_err(DPC_EINVAL, "field \"quorum_grace_s\": a diloco-async job applies every delta as it comes and "
                     "has no rounds to close; remove it (or use algorithm \"diloco\" with \"quorum\")");
    if (!isfinite(js->quorum_grace_s) || js->quorum_grace_s < 0)
      return dpc_err(DPC_EINVAL, "field \"quorum_grace_s\" = %g: must be >= 0 (seconds a round waits for the rest of "
                     "its deltas once the quorum is in)", js->quorum_grace_s);
    JS_TRY(check_range_d("quorum_grace_s", js->quorum_grace_s, 0, 0, 30 * 86400.0, 0));
  }
  if ((unsigned)js->weighting > WEIGHTING_TOKENS) return dpc_err(DPC_EINVAL, "field \"weighting\": unknown value");

  /* Levels: level 0 holds the stem; layer ranges are consecutive and cover [0, n_layer). */
  if (js->n_levels < 1 || js->n_levels > JOBSPEC_MAX_LEVELS)
    return dpc_err(DPC_EINVAL, "field \"levels\": %d levels (need 1..%d)", js->n_levels, JOBSPEC_MAX_LEVELS);
  long paths = 1, modules = 0;
  for (int l = 0; l < js->n_levels; l++) {
    const jobspec_level *lv = &js->levels[l];
    char f[48];
    snprintf(f, sizeof f, "levels[%d].modules", l);
    JS_TRY(check_range_i(f, lv->n_modules, 1, JOBSPEC_MAX_K));
    if (lv->stem != (l == 0))
      return dpc_err(DPC_EINVAL, "field \"levels[%d].stem\": %s", l,
                     l == 0 ? "level 0 must hold the stem (\"stem\": true)" : "only level 0 holds the stem");
    int want = l == 0 ? 0 : js->levels[l - 1].layer_end;
    if (l == 0 && lv->layer_end < 0) continue; /* default level of an unresolved "init" model */
    if (lv->layer_begin != want)
      return dpc_err(DPC_EINVAL, "field \"levels[%d].layers\": starts at layer %d, expected %d (levels must be consecutive)",
                     l, lv->layer_begin, want);
    if (lv->layer_end < lv->layer_begin || (l > 0 && lv->layer_end == lv->layer_begin))
      return dpc_err(DPC_EINVAL, "field \"levels[%d].layers\": [%d, %d) is empty or reversed", l, lv->layer_begin, lv->layer_end);
    paths *= lv->n_modules;
    modules += lv->n_modules;
    if (paths > JOBSPEC_MAX_PATHS) return dpc_err(DPC_EINVAL, "field \"levels\": more than %d paths", JOBSPEC_MAX_PATHS);
  }
  if (modules > JOBSPEC_MAX_MODULES) return dpc_err(DPC_EINVAL, "field \"levels\": more than %d modules", JOBSPEC_MAX_MODULES);
  if (js->has_shape && js->levels[js->n_levels - 1].layer_end != js->model.n_layer)
    return dpc_err(DPC_EINVAL, "field \"levels\": the last level ends at layer %d, expected model.n_layer = %d",
                   js->levels[js->n_levels - 1].layer_end, js->model.n_layer);
  if (js->algorithm != JOB_ALGO_DIPACO && paths != 1)
    return dpc_err(DPC_EINVAL, "field \"levels\": algorithm \"%s\" trains one path (every level needs \"modules\": 1)",
                   jobspec_algorithm_name(js->algorithm));
  if (js->n_data_paths > 0) {
    long np = 1;
    for (int l = 0; l < js->n_levels; l++) np *= js->levels[l].n_modules;
    if (np != js->n_data_paths)
      return dpc_err(DPC_EINVAL, "field \"data.paths\": %d list%s for %ld path%s (the levels give %ld paths; "
                     "give one list per path, in path numbering)", js->n_data_paths,
                     js->n_data_paths == 1 ? "" : "s", np, np == 1 ? "" : "s", np);
  }
  if (paths * js->replicas > JOBSPEC_MAX_SLOTS)
    return dpc_err(DPC_EINVAL, "paths × replicas = %ld exceeds %d", paths * js->replicas, JOBSPEC_MAX_SLOTS);
  JS_TRY(validate_streaming(js));
  return validate_sparse(js);
}

/* ---- sparse ---------------------------------------------------------------------------- */

int jobspec_sparse_pull(const jobspec *js) { return js->sparse.enabled && js->outer.momentum == 0.0; }

static int validate_sparse(const jobspec *js) {
  if (js->sparse.enabled != 0 && js->sparse.enabled != 1) return dpc_err(DPC_EINVAL, "field \"sparse\": bad state");
  if (!js->sparse.enabled) return 0;
  JS_TRY(check_range_d("sparse.density", js->sparse.density, 0, 1, 1, 0));
  JS_TRY(check_range_i("sparse.chunk", js->sparse.chunk, 2, DPC_SPARSE_MAX_CHUNK));
  JS_TRY(check_range_i("sparse.value_bits", js->sparse.value_bits, 1, 8));
  JS_TRY(check_range_d("sparse.ef_beta", js->sparse.ef_beta, 0, 0, 1, 1));
  if (js->algorithm == JOB_ALGO_DILOCO_ASYNC)
    return dpc_err(DPC_EINVAL, "field \"sparse\": SparseLoCo runs with algorithm \"diloco\" or \"dipaco\" "
                   "(sync rounds), not \"diloco-async\"");
  if (jobspec_streaming(js))
    return dpc_err(DPC_EINVAL, "field \"sparse\": SparseLoCo does not combine with Streaming DiLoCo "
                   "(streaming.fragments 1, overlap_steps 0, alpha 0, eager false)");
  if (js->streaming.codec != DPC_CODEC_FP32)
    return dpc_err(DPC_EINVAL, "field \"streaming.codec\": a sparse job's deltas use the sparse codec; "
                   "leave streaming.codec at \"fp32\" (got \"%s\")", dpc_codec_name(js->streaming.codec));
  return 0;
}

/* ---- streaming ------------------------------------------------------------------------- */

int jobspec_streaming(const jobspec *js) {
  return js->streaming.fragments > 1 || js->streaming.overlap_steps > 0 || js->streaming.alpha != 0 ||
         js->streaming.eager;
}

int jobspec_streaming_offset(const jobspec *js, int group) {
  return (int)((long)group * js->inner_steps / (js->streaming.fragments > 0 ? js->streaming.fragments : 1));
}

static int validate_streaming(const jobspec *js) {
  if (js->streaming.codec < 0 || js->streaming.codec >= DPC_CODEC_COUNT)
    return dpc_err(DPC_EINVAL, "field \"streaming.codec\": unknown value");
  /* Quantized pulls would round every replica's delta base: not offered until measured. */
  if (js->streaming.pull_codec != DPC_CODEC_FP32)
    return dpc_err(DPC_EINVAL, "field \"streaming.pull_codec\": parameters travel as fp32 only (got %s)",
                   dpc_codec_name(js->streaming.pull_codec));
  JS_TRY(check_range_i("streaming.block_floats", js->streaming.block_floats, 16, 1 << 20));
  JS_TRY(check_range_i("streaming.fragments", js->streaming.fragments, 1, js->inner_steps));
  if (js->has_shape && js->streaming.fragments > js->model.n_layer)
    return dpc_err(DPC_EINVAL, "field \"streaming.fragments\" = %d exceeds model.n_layer = %d (each group needs a layer)",
                   js->streaming.fragments, js->model.n_layer);
  JS_TRY(check_range_i("streaming.overlap_steps", js->streaming.overlap_steps, 0, js->inner_steps - 1));
  JS_TRY(check_range_d("streaming.alpha", js->streaming.alpha, 0, 0, 1, 1));
  if (js->streaming.eager != 0 && js->streaming.eager != 1)
    return dpc_err(DPC_EINVAL, "field \"streaming.eager\": expected a boolean");
  if (js->streaming.eager && js->streaming.overlap_steps < 1)
    return dpc_err(DPC_EINVAL, "field \"streaming.eager\": eager updates need streaming.overlap_steps >= 1");
  if (js->streaming.eager && js->inner.state != INNER_STATE_KEEP)
    return dpc_err(DPC_EINVAL, "field \"streaming.eager\": eager updates need inner.state \"keep\" (the eager state, "
                   "the slot's previous delta, is not part of the checkpoint)");
  if (jobspec_streaming(js) && js->algorithm == JOB_ALGO_DIPACO)
    return dpc_err(DPC_EINVAL, "field \"streaming\": algorithm \"dipaco\" takes a delta codec only (fragments 1, "
                   "overlap_steps 0, alpha 0, eager false): Streaming DiLoCo over DiPaCo modules is not built");
  if (jobspec_streaming(js) && js->algorithm == JOB_ALGO_DILOCO_ASYNC)
    return dpc_err(DPC_EINVAL, "field \"streaming\": algorithm \"diloco-async\" takes a delta codec only "
                   "(fragments 1, overlap_steps 0, alpha 0, eager false)");
  return 0;
}

/* ---- init directory -------------------------------------------------------------------- */

int jobspec_resolve_init(jobspec *js, const char *base) {
  if (!js->init_dir[0]) return js->has_shape ? 0 : dpc_err(DPC_EINVAL, "field \"model\": no init directory and no shape");
  char path[JOBSPEC_PATH_MAX * 2 + 32];
  if (base && base[0] && js->init_dir[0] != '/')
    snprintf(path, sizeof path, "%s/%s/config.json", base, js->init_dir);
  else
    snprintf(path, sizeof path, "%s/config.json", js->init_dir);
  void *buf = NULL;
  size_t n = 0;
  int rc = dpc_read_file(path, 1 << 20, &buf, &n);
  if (rc) return dpc_err(rc, "model.init: cannot read %s: %s", path, dpc_errmsg());
  cJSON *root = cJSON_ParseWithLength(buf, n);
  free(buf);
  if (!root || !cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return dpc_err(DPC_EFORMAT, "%s: not a JSON object", path);
  }
  gpt_config c = {0};
  const char *names[] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
  int *dst[] = {&c.n_layer, &c.n_head, &c.n_embd, &c.n_positions, &c.vocab_size};
  for (int i = 0; i < 5; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, names[i]);
    if (!cJSON_IsNumber(v) || floor(v->valuedouble) != v->valuedouble || v->valuedouble < 1 || v->valuedouble > INT_MAX) {
      cJSON_Delete(root);
      return dpc_err(DPC_EFORMAT, "%s: field \"%s\" missing or not a positive integer", path, names[i]);
    }
    *dst[i] = (int)v->valuedouble;
  }
  cJSON_Delete(root);
  if (js->has_shape && memcmp(&c, &js->model, sizeof c) != 0)
    return dpc_err(DPC_ESHAPE, "%s: shape (L=%d NH=%d C=%d maxT=%d V=%d) differs from the spec's model", path, c.n_layer,
                   c.n_head, c.n_embd, c.n_positions, c.vocab_size);
  js->model = c;
  js->has_shape = 1;
  if (js->n_levels == 1 && js->levels[0].layer_end < 0) js->levels[0].layer_end = c.n_layer;
  return jobspec_validate(js);
}

/* ---- canonical JSON -------------------------------------------------------------------- */

/* A number that parses back bit-identical: cJSON prints 15 significant digits whenever that
 * is within its relative-epsilon test, which can be 1 ulp off (quorum 0.30000000000000004 came
 * back 0.3) and drops digits of integers over 10^15 (seed 2^53-1 came back 2^53-2), so a job
 * re-read from the database after a restart would train with other hyperparameters. Caught by
 * the round-trip oracle of tests/fuzz/fuzz_jobspec (inputs kept in tests/fuzz/regress/jobspec/). */
static void add_num(cJSON *o, const char *key, double v) {
  char buf[40];
  if (!isfinite(v)) {
    cJSON_AddNullToObject(o, key);
    return;
  }
  if (v == floor(v) && fabs(v) < 9007199254740992.0) {
    snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    for (int prec = 15; prec <= 17; prec++) {
      snprintf(buf, sizeof buf, "%.*g", prec, v);
      double back = strtod(buf, NULL);
      if (memcmp(&back, &v, sizeof v) == 0) break;
    }
  }
  cJSON_AddRawToObject(o, key, buf);
}

int jobspec_to_json(const jobspec *js, char **out) {
  *out = NULL;
  cJSON *r = cJSON_CreateObject();
  if (!r) return dpc_err(DPC_ENOMEM, "jobspec_to_json: out of memory");
  cJSON_AddStringToObject(r, "name", js->name);
  cJSON *m = cJSON_AddObjectToObject(r, "model");
  if (m) {
    if (js->init_dir[0]) cJSON_AddStringToObject(m, "init", js->init_dir);
    if (js->has_shape) {
      add_num(m, "n_layer", js->model.n_layer);
      add_num(m, "n_head", js->model.n_head);
      add_num(m, "n_embd", js->model.n_embd);
      add_num(m, "n_positions", js->model.n_positions);
      add_num(m, "vocab_size", js->model.vocab_size);
    }
    add_num(m, "seed", (double)js->seed);
  }
  cJSON *d = cJSON_AddObjectToObject(r, "data");
  if (d) {
    if (js->n_data_paths > 0) {
      cJSON *ps = cJSON_AddArrayToObject(d, "paths");
      for (int p = 0; ps && p < js->n_data_paths; p++) {
        cJSON *l = cJSON_CreateArray();
        for (int i = js->path_first[p]; l && i < js->path_first[p + 1]; i++)
          cJSON_AddItemToArray(l, cJSON_CreateString(js->path_glob[i]));
        if (l) cJSON_AddItemToArray(ps, l);
      }
    } else {
      cJSON *t = cJSON_AddArrayToObject(d, "train");
      for (int i = 0; t && i < js->n_train; i++) cJSON_AddItemToArray(t, cJSON_CreateString(js->train[i]));
    }
    cJSON *v = cJSON_AddArrayToObject(d, "val");
    for (int i = 0; v && i < js->n_val; i++) cJSON_AddItemToArray(v, cJSON_CreateString(js->val[i]));
  }
  cJSON_AddStringToObject(r, "algorithm", jobspec_algorithm_name(js->algorithm));
  add_num(r, "replicas", js->replicas);
  add_num(r, "inner_steps", js->inner_steps);
  add_num(r, "rounds", js->rounds);
  add_num(r, "batch", js->batch);
  add_num(r, "seq_len", js->seq_len);
  cJSON *in = cJSON_AddObjectToObject(r, "inner");
  if (in) {
    add_num(in, "lr", js->inner.lr);
    add_num(in, "warmup", js->inner.warmup);
    add_num(in, "lr_min_frac", js->inner.lr_min_frac);
    add_num(in, "weight_decay", js->inner.weight_decay);
    add_num(in, "beta1", js->inner.beta1);
    add_num(in, "beta2", js->inner.beta2);
    add_num(in, "eps", js->inner.eps);
    add_num(in, "grad_clip", js->inner.grad_clip);
    cJSON_AddStringToObject(in, "state", jobspec_inner_state_name(js->inner.state));
  }
  cJSON *o = cJSON_AddObjectToObject(r, "outer");
  if (o) {
    add_num(o, "lr", js->outer.lr);
    add_num(o, "momentum", js->outer.momentum);
    cJSON_AddBoolToObject(o, "nesterov", js->outer.nesterov);
    cJSON_AddStringToObject(o, "rule", ASYNC_NAMES[js->outer.async_rule]);
    add_num(o, "delay_buffer", js->outer.buffer);
    add_num(o, "c", js->outer.c);
    add_num(o, "delta_norm_screen", js->outer.delta_norm_screen);
  }
  add_num(r, "max_staleness", js->max_staleness);
  cJSON *dy = cJSON_AddObjectToObject(r, "dylu");
  if (dy) {
    cJSON_AddBoolToObject(dy, "enabled", js->dylu.enabled);
    add_num(dy, "min_steps", js->dylu.min_steps);
  }
  cJSON *lv = cJSON_AddArrayToObject(r, "levels");
  for (int l = 0; lv && l < js->n_levels; l++) {
    const jobspec_level *L = &js->levels[l];
    if (L->layer_end < 0) break; /* unresolved default level: leave it to the default */
    cJSON *e = cJSON_CreateObject();
    if (!e) break;
    cJSON_AddBoolToObject(e, "stem", L->stem);
    int ly[2] = {L->layer_begin, L->layer_end};
    cJSON_AddItemToObject(e, "layers", cJSON_CreateIntArray(ly, 2));
    add_num(e, "modules", L->n_modules);
    cJSON_AddItemToArray(lv, e);
  }
  if (lv && cJSON_GetArraySize(lv) == 0) cJSON_DeleteItemFromObject(r, "levels");
  cJSON *vs = cJSON_AddObjectToObject(r, "versions");
  if (vs) {
    add_num(vs, "keep_last", js->versions.keep_last);
    add_num(vs, "keep_every", js->versions.keep_every);
  }
  cJSON *st = cJSON_AddObjectToObject(r, "streaming");
  if (st) {
    add_num(st, "fragments", js->streaming.fragments);
    add_num(st, "overlap_steps", js->streaming.overlap_steps);
    add_num(st, "alpha", js->streaming.alpha);
    cJSON_AddBoolToObject(st, "eager", js->streaming.eager);
    cJSON_AddStringToObject(st, "codec", dpc_codec_name(js->streaming.codec));
    add_num(st, "block_floats", js->streaming.block_floats);
    cJSON_AddStringToObject(st, "pull_codec", dpc_codec_name(js->streaming.pull_codec));
  }
  if (js->sparse.enabled) {
    cJSON *sp = cJSON_AddObjectToObject(r, "sparse");
    if (sp) {
      add_num(sp, "density", js->sparse.density);
      add_num(sp, "chunk", js->sparse.chunk);
      add_num(sp, "value_bits", js->sparse.value_bits);
      add_num(sp, "ef_beta", js->sparse.ef_beta);
    }
  }
  add_num(r, "quorum", js->quorum);
  add_num(r, "round_timeout_s", js->round_timeout_s);
  if (js->has_quorum_grace) add_num(r, "quorum_grace_s", js->quorum_grace_s);
  cJSON_AddStringToObject(r, "weighting", WEIGHT_NAMES[js->weighting]);
  char *s = cJSON_PrintUnformatted(r);
  cJSON_Delete(r);
  if (!s) return dpc_err(DPC_ENOMEM, "jobspec_to_json: out of memory");
  /* cJSON allocates with malloc by default; hand over a plain malloc'd copy regardless. */
  *out = strdup(s);
  cJSON_free(s);
  return *out ? 0 : dpc_err(DPC_ENOMEM, "jobspec_to_json: out of memory");
}

/* ---- structure ------------------------------------------------------------------------- */

int jobspec_path_data(const jobspec *js, int path, const char (**first)[JOBSPEC_PATH_MAX]) {
  if (js->n_data_paths == 0) {
    *first = js->train;
    return js->n_train;
  }
  if (path < 0 || path >= js->n_data_paths) return dpc_err(DPC_ERANGE, "path %d: the spec has %d data.paths lists", path, js->n_data_paths);
  *first = &js->path_glob[js->path_first[path]];
  return js->path_first[path + 1] - js->path_first[path];
}

long jobspec_total_steps(const jobspec *js) { return (long)js->rounds * js->inner_steps; }

int jobspec_n_modules(const jobspec *js) {
  int n = 0;
  for (int l = 0; l < js->n_levels; l++) n += js->levels[l].n_modules;
  return n;
}

int jobspec_n_paths(const jobspec *js) {
  int p = 1;
  for (int l = 0; l < js->n_levels; l++) p *= js->levels[l].n_modules;
  return p;
}

int jobspec_n_slots(const jobspec *js) { return jobspec_n_paths(js) * js->replicas; }

int jobspec_path_modules(const jobspec *js, int path, int *mods) {
  int P = jobspec_n_paths(js);
  if (path < 0 || path >= P) return dpc_err(DPC_ERANGE, "path %d out of range [0, %d)", path, P);
  int first[JOBSPEC_MAX_LEVELS], acc = 0;
  for (int l = 0; l < js->n_levels; l++) {
    first[l] = acc;
    acc += js->levels[l].n_modules;
  }
  int rest = path;
  for (int l = js->n_levels - 1; l >= 0; l--) {
    int K = js->levels[l].n_modules;
    mods[l] = first[l] + rest % K;
    rest /= K;
  }
  return js->n_levels;
}

int jobspec_path_has_module(const jobspec *js, int path, int module) {
  int mods[JOBSPEC_MAX_LEVELS];
  int n = jobspec_path_modules(js, path, mods);
  for (int l = 0; l < n; l++)
    if (mods[l] == module) return 1;
  return 0;
}

int jobspec_layout(const jobspec *js, gpt_layout *lay) {
  if (!js->has_shape) return dpc_err(DPC_ESTATE, "job \"%s\": model shape unknown until model.init is resolved", js->name);
  return gpt_layout_build(&js->model, lay);
}

static int check_lay(const jobspec *js, const gpt_layout *lay) {
  if (!js->has_shape) return dpc_err(DPC_ESTATE, "job \"%s\": model shape unknown until model.init is resolved", js->name);
  if (memcmp(&lay->cfg, &js->model, sizeof lay->cfg) != 0)
    return dpc_err(DPC_ESHAPE, "job \"%s\": layout is for a different model", js->name);
  if (js->levels[js->n_levels - 1].layer_end != lay->cfg.n_layer)
    return dpc_err(DPC_ESHAPE, "job \"%s\": levels do not cover the model's %d layers", js->name, lay->cfg.n_layer);
  return 0;
}

int jobspec_modules(const jobspec *js, const gpt_layout *lay, jobspec_module *out, int cap) {
  JS_TRY(check_lay(js, lay));
  int n = 0;
  for (int l = 0; l < js->n_levels; l++) {
    const jobspec_level *L = &js->levels[l];
    size_t lo = L->stem ? 0 : lay->layer_off[L->layer_begin];
    size_t hi = lay->layer_off[L->layer_end];
    for (int k = 0; k < L->n_modules; k++, n++)
      if (n < cap) out[n] = (jobspec_module){.id = n, .level = l, .index = k, .offset = lo, .len = hi - lo};
  }
  return n;
}

int jobspec_fragments(const jobspec *js, const gpt_layout *lay, jobspec_fragment *out, int cap) {
  JS_TRY(check_lay(js, lay));
  /* Without streaming a module is one fragment, with the module's id. With streaming, module
   * by module: its stem (level 0: group 0), then each of its layers l (group l mod F). */
  const int streaming = jobspec_streaming(js), F = js->streaming.fragments;
  int n = 0, m = 0;
  for (int l = 0; l < js->n_levels; l++) {
    const jobspec_level *L = &js->levels[l];
    size_t lo = L->stem ? 0 : lay->layer_off[L->layer_begin];
    size_t hi = lay->layer_off[L->layer_end];
    for (int k = 0; k < L->n_modules; k++, m++) {
      if (!streaming) {
        if (n < cap) out[n] = (jobspec_fragment){.id = n, .module = m, .offset = lo, .len = hi - lo};
        n++;
        continue;
      }
      if (L->stem) {
        if (n < cap) out[n] = (jobspec_fragment){.id = n, .module = m, .offset = 0, .len = lay->stem_end};
        n++;
      }
      for (int y = L->layer_begin; y < L->layer_end; y++, n++)
        if (n < cap)
          out[n] = (jobspec_fragment){.id = n, .module = m, .offset = lay->layer_off[y],
                                      .len = lay->layer_off[y + 1] - lay->layer_off[y], .group = y % F};
    }
  }
  return n;
}
