/* jobspec_validate.c — job spec validation: the field table's per-field checks (types, ranges,
 * each field's own rule), then the rules that tie several fields together; and model.init,
 * whose config.json gives an "init" model its shape. jobspec_fields.h maps the jobspec*.c
 * files. */
#include "coordinator/jobspec_fields.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "kernels/modeldir.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- per-field checks ------------------------------------------------------------------ */

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

/* A data path is resolved under the worker's --data-dir: relative, no "..", no control chars,
 * and no component a glob could expand to "..": a leading "." followed by "?", "*", "[" or
 * another "." (wildcards match a leading "." only after a literal one). The worker also checks
 * every match by its resolved path (symlinks). */
static int check_data_path(const char *field, int i, const char *s) {
  if (!s[0]) return dpc_err(DPC_EINVAL, "field \"%s[%d]\" is empty", field, i);
  if (s[0] == '/') return dpc_err(DPC_EINVAL, "field \"%s[%d]\" = \"%s\": must be relative to the worker's --data-dir", field, i, s);
  if (jf_has_ctl(s)) return dpc_err(DPC_EINVAL, "field \"%s[%d]\": contains control characters", field, i);
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

/* data.paths: the lists' bounds, each path's list non-empty, every entry a safe path. */
static int check_path_lists(const jobspec *js) {
  if (js->n_data_paths < 0 || js->n_data_paths > JOBSPEC_MAX_DATA_PATHS)
    return dpc_err(DPC_EINVAL, "field \"data.paths\": %d lists (at most %d)", js->n_data_paths, JOBSPEC_MAX_DATA_PATHS);
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
  return 0;
}

/* A list of paths; data.train (f->excl) is required unless data.paths replaces it. */
static int check_paths(const jobspec *js, const jobspec_field *f, const void *base, const char *path) {
  int n = *(const int *)((const char *)base + f->count_off);
  if (f->excl && js->n_data_paths > 0 && n > 0)
    return dpc_err(DPC_EINVAL, "fields \"%s\" and \"%s.%s\": give one of them", path, f->sect, f->excl);
  if ((f->flags & JF_REQUIRED) && !(f->excl && js->n_data_paths > 0) && n < 1)
    return dpc_err(DPC_EINVAL, "field \"%s\": needs at least one path", path);
  const char(*list)[JOBSPEC_PATH_MAX] = jf_at(f, base);
  for (int i = 0; i < n; i++) JS_TRY(check_data_path(path, i, list[i]));
  return 0;
}

static int validate_section(const jobspec *js, const char *sect, const void *base, const char *prefix);

/* A field that does not apply must hold zero, so that configs compare with memcmp. */
static int all_zero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

/* The type and range of one field at base; `path` names it in messages. */
static int check_field(const jobspec *js, const jobspec_field *f, const void *base, const char *path) {
  const jf_range *r = &f->range;
  double d;
  int v;
  switch (f->type) {
  case JF_OBJECT: return validate_section(js, path, js, path);
  case JF_INT:
    return r->on ? check_range_i(path, jf_get_int(f, base), (long)r->lo, (long)jf_hi(f, js)) : 0;
  case JF_NUMBER:
    memcpy(&d, jf_at(f, base), sizeof d);
    if ((f->flags & JF_ZERO_OFF) && d == 0) return 0;
    return r->on ? check_range_d(path, d, r->lo, r->lo_open, jf_hi(f, js), r->hi_open) : 0;
  case JF_BOOL:
    v = jf_get_int(f, base);
    return v != 0 && v != 1 ? dpc_err(DPC_EINVAL, "field \"%s\": expected a boolean", path) : 0;
  case JF_ENUM:
    return (unsigned)jf_get_int(f, base) >= (unsigned)f->n_names ? dpc_err(DPC_EINVAL, "field \"%s\": unknown value", path) : 0;
  case JF_CODEC:
    v = jf_get_int(f, base);
    return v < 0 || v >= DPC_CODEC_COUNT ? dpc_err(DPC_EINVAL, "field \"%s\": unknown value", path) : 0;
  case JF_SEED: {
    uint64_t u;
    memcpy(&u, jf_at(f, base), sizeof u);
    return (double)u > JOBSPEC_MAX_SEED ? dpc_err(DPC_EINVAL, "field \"%s\" above 2^53", path) : 0;
  }
  case JF_PATHS: return check_paths(js, f, base, path);
  case JF_PATH_LISTS: return check_path_lists(js);
  case JF_LEVELS: /* after the table pass, with the rules of the levels (validate_levels) */
  case JF_STRING: /* length: on reading; content: f->check */
  case JF_SPAN:   /* range: on reading (JF_PARSE_RANGE) */
    return 0;
  }
  return 0;
}

/* The fields of section `sect` (stored at base; `prefix` names the section in messages), in
 * table order; a field's own rule (f->check) runs before its type and range check. */
static int validate_section(const jobspec *js, const char *sect, const void *base, const char *prefix) {
  char p[96];
  for (int i = 0; i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    if (!jf_in(f, sect) || ((f->flags & (JF_SHAPE | JF_SHAPE_OPT)) && !js->has_shape)) continue;
    if (!jf_applies(f, js)) {
      if (!all_zero(jf_at(f, base), f->size))
        return dpc_err(DPC_EINVAL, "field \"%s\": only with %s", jf_path(p, sizeof p, prefix, f->key), f->when_doc);
      continue;
    }
    jf_path(p, sizeof p, prefix, f->key);
    if (f->flags & JF_PRESENCE) {
      int given;
      memcpy(&given, (const char *)js + f->count_off, sizeof given);
      if (given != 0 && given != 1) return dpc_err(DPC_EINVAL, "field \"%s\": bad state", p);
      if (!given) continue;
    }
    if (f->check) JS_TRY(f->check(js));
    JS_TRY(check_field(js, f, base, p));
  }
  return 0;
}

/* ---- rules across fields --------------------------------------------------------------- */

/* Levels: level 0 holds the stem; layer ranges are consecutive and cover [0, n_layer). */
static int validate_levels(const jobspec *js) {
  if (js->n_levels < 1 || js->n_levels > JOBSPEC_MAX_LEVELS)
    return dpc_err(DPC_EINVAL, "field \"levels\": %d levels (need 1..%d)", js->n_levels, JOBSPEC_MAX_LEVELS);
  long paths = 1, modules = 0;
  for (int l = 0; l < js->n_levels; l++) {
    const jobspec_level *lv = &js->levels[l];
    char f[48];
    snprintf(f, sizeof f, "levels[%d]", l);
    JS_TRY(validate_section(js, "levels[]", lv, f));
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
  return 0;
}

static int validate_streaming(const jobspec *js) {
  if (js->has_shape && js->streaming.fragments > js->model.n_layer)
    return dpc_err(DPC_EINVAL, "field \"streaming.fragments\" = %d exceeds model.n_layer = %d (each group needs a layer)",
                   js->streaming.fragments, js->model.n_layer);
  if (js->streaming.eager && js->streaming.overlap_steps < 1)
    return dpc_err(DPC_EINVAL, "field \"streaming.eager\": eager updates need streaming.overlap_steps >= 1");
  if (js->streaming.eager && (js->outer.momentum_warmup || js->outer.momentum_decay))
    return dpc_err(DPC_EINVAL, "field \"streaming.eager\": eager updates estimate the next step with a fixed outer "
                   "momentum; leave outer.momentum_warmup and outer.momentum_decay at 0");
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

static int validate_sparse(const jobspec *js) {
  if (!js->sparse.enabled) return 0;
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

/* The table pass first (each field's own type, range and rule, in table order), then the
 * rules across fields. */
int jobspec_validate(const jobspec *js) {
  JS_TRY(validate_section(js, "", js, ""));
  if (js->has_shape && gpt_config_validate(&js->model)) return dpc_err(DPC_EINVAL, "field \"model\": %s", dpc_errmsg());
  if ((long long)js->rounds * js->inner_steps > INT_MAX)
    return dpc_err(DPC_EINVAL, "rounds × inner_steps = %lld exceeds %d", (long long)js->rounds * js->inner_steps, INT_MAX);
  if (js->has_shape && js->seq_len > js->model.n_positions)
    return dpc_err(DPC_EINVAL, "field \"seq_len\" = %d exceeds model.n_positions = %d", js->seq_len, js->model.n_positions);
  const jobspec_outer *o = &js->outer;
  if (o->buffer > 0 && o->c > 1.0 / o->buffer)
    return dpc_err(DPC_EINVAL, "field \"outer.c\" = %g exceeds 1/outer.delay_buffer = %g", o->c, 1.0 / o->buffer);
  JS_TRY(validate_levels(js));
  JS_TRY(validate_streaming(js));
  return validate_sparse(js);
}

/* ---- init directory -------------------------------------------------------------------- */

/* A GPT-2 config.json: the five shape fields of the table (JF_SHAPE without a `when`), each an
 * int of gpt_config under its own name. */
static int read_gpt2_shape(const char *path, const cJSON *root, gpt_config *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    if (!(f->flags & JF_SHAPE) || f->when) continue;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, f->key);
    if (!cJSON_IsNumber(v) || floor(v->valuedouble) != v->valuedouble || v->valuedouble < 1 || v->valuedouble > INT_MAX)
      return dpc_err(DPC_EFORMAT, "%s: field \"%s\" missing or not a positive integer", path, f->key);
    int x = (int)v->valuedouble;
    memcpy((char *)c + (f->off - offsetof(jobspec, model)), &x, sizeof x);
  }
  return 0;
}

int jobspec_resolve_init(jobspec *js, const char *base) {
  if (!js->init_dir[0]) return js->has_shape ? 0 : dpc_err(DPC_EINVAL, "field \"model\": no init directory and no shape");
  char dir[JOBSPEC_PATH_MAX * 2 + 8], path[JOBSPEC_PATH_MAX * 2 + 32];
  if (base && base[0] && js->init_dir[0] != '/') snprintf(dir, sizeof dir, "%s/%s", base, js->init_dir);
  else snprintf(dir, sizeof dir, "%s", js->init_dir);
  snprintf(path, sizeof path, "%s/config.json", dir);
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
  /* A Llama-family config (model_type llama or qwen2) is read as model directories read it,
   * every key it cannot compute refused (kernels/modeldir.h); GPT-2's by the table. */
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  const int llama = cJSON_IsString(mt) && (strcmp(mt->valuestring, "llama") == 0 || strcmp(mt->valuestring, "qwen2") == 0);
  gpt_config c;
  rc = llama ? modeldir_read_config(dir, &c) : read_gpt2_shape(path, root, &c);
  cJSON_Delete(root);
  if (rc) return rc;
  if (js->has_shape && memcmp(&c, &js->model, sizeof c) != 0)
    return dpc_err(DPC_ESHAPE, "%s: shape (%s L=%d NH=%d C=%d maxT=%d V=%d%s) differs from the spec's model", path,
                   gpt_arch_name(c.arch), c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size,
                   c.arch == GPT_ARCH_LLAMA ? ", or a Llama key" : "");
  js->model = c;
  js->has_shape = 1;
  if (js->n_levels == 1 && js->levels[0].layer_end < 0) js->levels[0].layer_end = c.n_layer;
  return jobspec_validate(js);
}
