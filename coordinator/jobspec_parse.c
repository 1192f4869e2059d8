/* jobspec_parse.c — reading a job spec's JSON into a jobspec, driven by the field table
 * (jobspec_fields.h): which keys a section accepts, each field's type, what is required,
 * the defaults. Every error names the field path. Validation follows (jobspec_validate). */
#include "coordinator/jobspec_fields.h"
#include "common/codec.h"
#include "common/errors.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(offsetof(jobspec_level, layer_end) == offsetof(jobspec_level, layer_begin) + sizeof(int),
               "levels[].layers is read into two consecutive ints");

/* ---- reading helpers: every error names the field path ---------------------------------- */

static const cJSON *get_field(const cJSON *obj, const char *key) {
  for (const cJSON *c = obj->child; c; c = c->next)
    if (c->string && strcmp(c->string, key) == 0) return c;
  return NULL;
}

/* Reject keys that are not fields (or older names) of section `sect`, and duplicated keys. */
static int check_keys(const cJSON *obj, const char *prefix, const char *sect) {
  char p[160];
  for (const cJSON *c = obj->child; c; c = c->next) {
    int ok = 0;
    for (int i = 0; i < jobspec_n_fields && !ok; i++) {
      const jobspec_field *f = &jobspec_fields[i];
      ok = jf_in(f, sect) && c->string && (strcmp(c->string, f->key) == 0 || (f->alias && strcmp(c->string, f->alias) == 0));
    }
    if (!ok) return dpc_err(DPC_EINVAL, "unknown field \"%s\"", jf_path(p, sizeof p, prefix, c->string ? c->string : "?"));
    for (const cJSON *d = c->next; d; d = d->next)
      if (d->string && strcmp(d->string, c->string) == 0)
        return dpc_err(DPC_EINVAL, "duplicate field \"%s\"", jf_path(p, sizeof p, prefix, c->string));
  }
  return 0;
}

/* 1 if found (value in *out), 0 if absent and not required, negative on error. */
static int get_number(const cJSON *obj, const char *prefix, const char *key, int required, double *out) {
  char p[160];
  const cJSON *v = get_field(obj, key);
  if (!v) return required ? dpc_err(DPC_EINVAL, "missing field \"%s\"", jf_path(p, sizeof p, prefix, key)) : 0;
  if (!cJSON_IsNumber(v)) return dpc_err(DPC_EINVAL, "field \"%s\": expected a number", jf_path(p, sizeof p, prefix, key));
  if (!isfinite(v->valuedouble))
    return dpc_err(DPC_EINVAL, "field \"%s\": not a finite number", jf_path(p, sizeof p, prefix, key));
  *out = v->valuedouble;
  return 1;
}

/* Integers are checked for integrality and for fitting an int here; ranges in validation. */
static int get_int(const cJSON *obj, const char *prefix, const char *key, int required, int *out) {
  char p[160];
  double d;
  int rc = get_number(obj, prefix, key, required, &d);
  if (rc <= 0) return rc;
  if (floor(d) != d) return dpc_err(DPC_EINVAL, "field \"%s\" = %g: expected an integer", jf_path(p, sizeof p, prefix, key), d);
  if (d < INT_MIN || d > INT_MAX)
    return dpc_err(DPC_EINVAL, "field \"%s\" = %g out of range", jf_path(p, sizeof p, prefix, key), d);
  *out = (int)d;
  return 1;
}

static int get_bool(const cJSON *obj, const char *prefix, const char *key, int *out) {
  char p[160];
  const cJSON *v = get_field(obj, key);
  if (!v) return 0;
  if (!cJSON_IsBool(v)) return dpc_err(DPC_EINVAL, "field \"%s\": expected true or false", jf_path(p, sizeof p, prefix, key));
  *out = cJSON_IsTrue(v);
  return 1;
}

static int get_string(const cJSON *obj, const char *prefix, const char *key, int required, char *out, size_t cap) {
  char p[160];
  const cJSON *v = get_field(obj, key);
  if (!v) return required ? dpc_err(DPC_EINVAL, "missing field \"%s\"", jf_path(p, sizeof p, prefix, key)) : 0;
  if (!cJSON_IsString(v) || !v->valuestring)
    return dpc_err(DPC_EINVAL, "field \"%s\": expected a string", jf_path(p, sizeof p, prefix, key));
  if (strlen(v->valuestring) >= cap)
    return dpc_err(DPC_EINVAL, "field \"%s\": longer than %zu characters", jf_path(p, sizeof p, prefix, key), cap - 1);
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
      return dpc_err(DPC_EINVAL, "field \"%s\": unknown value", jf_path(p, sizeof p, prefix, key));
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
  return dpc_err(DPC_EINVAL, "field \"%s\" = \"%s\": expected one of %s", jf_path(p, sizeof p, prefix, key), s, opts);
}

static const cJSON *get_object(const cJSON *obj, const char *prefix, const char *key, int required, int *rc) {
  char p[160];
  const cJSON *v = get_field(obj, key);
  *rc = 0;
  if (!v) {
    if (required) *rc = dpc_err(DPC_EINVAL, "missing field \"%s\"", jf_path(p, sizeof p, prefix, key));
    return NULL;
  }
  if (!cJSON_IsObject(v)) {
    *rc = dpc_err(DPC_EINVAL, "field \"%s\": expected an object", jf_path(p, sizeof p, prefix, key));
    return NULL;
  }
  return v;
}

/* A codec by name into *out (a dpc_codec). */
static int get_codec(const cJSON *obj, const char *prefix, const char *key, int *out) {
  char p[160];
  const cJSON *f = get_field(obj, key);
  if (!f) return 0;
  if (!cJSON_IsString(f)) return dpc_err(DPC_EINVAL, "field \"%s\": expected a string", jf_path(p, sizeof p, prefix, key));
  dpc_codec c;
  if (dpc_codec_parse(f->valuestring, &c) < 0)
    return dpc_err(DPC_EINVAL, "field \"%s\": %s", jf_path(p, sizeof p, prefix, key), dpc_errmsg());
  *out = (int)c;
  return 0;
}

/* An integer in [0, 2^53] (exact in JSON) into a uint64_t. */
static int get_seed(const cJSON *obj, const char *prefix, const char *key, uint64_t *out) {
  char p[160];
  double seed = 0;
  int rc = get_number(obj, prefix, key, 0, &seed);
  if (rc <= 0) return rc;
  if (floor(seed) != seed || seed < 0 || seed > JOBSPEC_MAX_SEED)
    return dpc_err(DPC_EINVAL, "field \"%s\" = %g: expected an integer in [0, 2^53]", jf_path(p, sizeof p, prefix, key), seed);
  *out = (uint64_t)seed;
  return 1;
}

/* A list of at most JOBSPEC_MAX_DATA paths. */
static int get_paths(const cJSON *obj, const char *prefix, const char *key, int required, char (*out)[JOBSPEC_PATH_MAX],
                     int *n) {
  char p[160];
  jf_path(p, sizeof p, prefix, key);
  const cJSON *v = get_field(obj, key);
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
static int get_path_lists(const cJSON *v, jobspec *js) {
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

/* [first, end]: two integers within f's range, into two consecutive ints. */
static int get_span(const jobspec_field *f, const cJSON *obj, const char *prefix, int required, void *base) {
  char p[160];
  jf_path(p, sizeof p, prefix, f->key);
  const cJSON *ly = get_field(obj, f->key);
  if (!ly) return required ? dpc_err(DPC_EINVAL, "missing field \"%s\"", p) : 0;
  if (!cJSON_IsArray(ly) || cJSON_GetArraySize(ly) != 2 || !cJSON_IsNumber(ly->child) || !cJSON_IsNumber(ly->child->next))
    return dpc_err(DPC_EINVAL, "field \"%s\": expected [first, end] (two integers)", p);
  double a = ly->child->valuedouble, b = ly->child->next->valuedouble, lo = f->range.lo, hi = f->range.hi;
  if (floor(a) != a || floor(b) != b || a < lo || b < lo || a > hi || b > hi)
    return dpc_err(DPC_EINVAL, "field \"%s\": expected integers in [%g, %g]", p, lo, hi);
  int v[2] = {(int)a, (int)b};
  memcpy(jf_at(f, base), v, sizeof v);
  return 0;
}

/* ---- table-driven reading -------------------------------------------------------------- */

static int parse_section(const cJSON *obj, const char *prefix, const char *sect, void *base, jobspec *js);

/* "levels": absent gives one level {"stem": true, "layers": [0, n_layer], "modules": 1} (its
 * end stays -1 until an "init" model's shape is known). */
static int parse_levels(const jobspec_field *f, const cJSON *root, jobspec *js) {
  const cJSON *v = get_field(root, f->key);
  if (!v) {
    js->n_levels = 1;
    js->levels[0] = (jobspec_level){.stem = 1, .layer_begin = 0, .layer_end = js->has_shape ? js->model.n_layer : -1, .n_modules = 1};
    return 0;
  }
  if (!cJSON_IsArray(v)) return dpc_err(DPC_EINVAL, "field \"%s\": expected an array", f->key);
  char sect[32];
  snprintf(sect, sizeof sect, "%s[]", f->key);
  int i = 0;
  for (const cJSON *e = v->child; e; e = e->next, i++) {
    char p[64];
    snprintf(p, sizeof p, "%s[%d]", f->key, i);
    if (i >= JOBSPEC_MAX_LEVELS) return dpc_err(DPC_EINVAL, "field \"%s\": more than %d levels", f->key, JOBSPEC_MAX_LEVELS);
    if (!cJSON_IsObject(e)) return dpc_err(DPC_EINVAL, "field \"%s\": expected an object", p);
    jf_defaults(sect, &js->levels[i], 0);
    JS_TRY(parse_section(e, p, sect, &js->levels[i], js));
  }
  if (i == 0) return dpc_err(DPC_EINVAL, "field \"%s\": needs at least one level", f->key);
  js->n_levels = i;
  return 0;
}

/* One field of obj under JSON key `key` (its name or its older one) into base. */
static int parse_field(const jobspec_field *f, const cJSON *obj, const char *prefix, const char *key, int required,
                       void *base, jobspec *js) {
  char p[160];
  int rc = 0, v;
  switch (f->type) {
  case JF_OBJECT: {
    const cJSON *o = get_object(obj, prefix, key, required, &rc);
    if (!o) return rc;
    jf_path(p, sizeof p, prefix, key);
    if (f->flags & JF_PRESENCE) memcpy((char *)js + f->count_off, &(int){1}, sizeof(int));
    return parse_section(o, p, p, js, js);
  }
  case JF_LEVELS: return parse_levels(f, obj, js);
  case JF_STRING: return get_string(obj, prefix, key, required, jf_at(f, base), f->size);
  case JF_INT:
    rc = get_int(obj, prefix, key, required, jf_at(f, base));
    if (rc == 1 && (f->flags & JF_PRESENCE)) memcpy((char *)js + f->count_off, &(int){1}, sizeof(int));
    return rc;
  case JF_NUMBER:
    rc = get_number(obj, prefix, key, required, jf_at(f, base));
    if (rc == 1 && (f->flags & JF_PRESENCE)) memcpy((char *)js + f->count_off, &(int){1}, sizeof(int));
    return rc;
  case JF_BOOL: return get_bool(obj, prefix, key, jf_at(f, base));
  case JF_ENUM:
    v = jf_get_int(f, base);
    rc = get_enum(obj, prefix, key, required, f->names, f->n_names, &v);
    jf_set_int(f, base, v);
    return rc;
  case JF_CODEC: return get_codec(obj, prefix, key, jf_at(f, base));
  case JF_SEED: return get_seed(obj, prefix, key, jf_at(f, base));
  case JF_PATHS: return get_paths(obj, prefix, key, required, jf_at(f, base), (int *)((char *)base + f->count_off));
  case JF_PATH_LISTS: {
    const cJSON *l = get_field(obj, key);
    return l ? get_path_lists(l, js) : 0;
  }
  case JF_SPAN: return get_span(f, obj, prefix, required, base);
  }
  return 0;
}

/* Whether a model gives its shape: an "init" model may leave out all of the shape fields, and
 * otherwise every one is required. */
static int gives_shape(const cJSON *obj, const char *sect, const jobspec *js) {
  int present = 0;
  for (int i = 0; i < jobspec_n_fields; i++)
    if (jf_in(&jobspec_fields[i], sect) && (jobspec_fields[i].flags & (JF_SHAPE | JF_SHAPE_OPT)))
      present += get_field(obj, jobspec_fields[i].key) != NULL;
  return !(js->init_dir[0] && present == 0);
}

/* The fields of section `sect` from obj, in table order, after checking its keys. */
static int parse_section(const cJSON *obj, const char *prefix, const char *sect, void *base, jobspec *js) {
  char p[160], q[160];
  JS_TRY(check_keys(obj, prefix, sect));
  for (int i = 0; i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    if (!jf_in(f, sect)) continue;
    if (f->alias && get_field(obj, f->key) && get_field(obj, f->alias))
      return dpc_err(DPC_EINVAL, "field \"%s\": an old name of \"%s\"; give only one", jf_path(p, sizeof p, prefix, f->alias),
                     jf_path(q, sizeof q, prefix, f->key));
    if (f->excl && get_field(obj, f->key) && get_field(obj, f->excl))
      return dpc_err(DPC_EINVAL, "fields \"%s\" and \"%s\": give one of them (%s)", jf_path(p, sizeof p, prefix, f->key),
                     jf_path(q, sizeof q, prefix, f->excl), f->excl_why);
  }
  int shape = -1;
  for (int i = 0; i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    if (!jf_in(f, sect)) continue;
    if (f->flags & (JF_SHAPE | JF_SHAPE_OPT)) {
      if (shape < 0) shape = gives_shape(obj, sect, js);
      if (!shape) continue;
    } else if (shape == 1) {
      js->has_shape = 1; /* every shape field read */
      shape = 2;
    }
    if (!jf_applies(f, js)) {
      if (get_field(obj, f->key))
        return dpc_err(DPC_EINVAL, "field \"%s\": only with %s", jf_path(p, sizeof p, prefix, f->key), f->when_doc);
      continue;
    }
    int required = (f->flags & (JF_REQUIRED | JF_SHAPE)) && !(f->excl && get_field(obj, f->excl));
    JS_TRY(parse_field(f, obj, prefix, f->key, required, base, js));
    if (f->alias) JS_TRY(parse_field(f, obj, prefix, f->alias, 0, base, js));
  }
  jf_zero_inapplicable(sect, base, js);
  return 0;
}

/* The outer lr and momentum a new spec leaves out, where they depend on R
 * (jobspec_outer_default); the canonical JSON then carries them, so a stored job keeps them. */
static void derive_outer(const cJSON *root, jobspec *js) {
  const cJSON *o = get_field(root, "outer");
  jobspec_outer d;
  jobspec_outer_default(js, &d);
  if (!cJSON_IsObject(o) || !get_field(o, "lr")) js->outer.lr = d.lr;
  if (!cJSON_IsObject(o) || !get_field(o, "momentum")) js->outer.momentum = d.momentum;
}

int jobspec_derive_outer(jobspec *js, const char *json, size_t n) {
  cJSON *root = cJSON_ParseWithLength(json, n);
  if (!root) return dpc_err(DPC_EFORMAT, "job spec is not valid JSON");
  derive_outer(root, js);
  cJSON_Delete(root);
  return jobspec_validate(js);
}

/* The top-level object, field by field, then validation. The outer rule's defaults depend on
 * the algorithm and on a "sparse" block (JF_ALT_DEFAULT), so those two are looked at first;
 * values given in "outer" win over either. */
static int parse_root(const cJSON *root, jobspec *js, int derive) {
  if (!cJSON_IsObject(root)) return dpc_err(DPC_EINVAL, "job spec: expected a JSON object at the top level");
  const cJSON *a = get_field(root, "algorithm");
  if (cJSON_IsString(a) && a->valuestring && strcmp(a->valuestring, jobspec_algo_names[JOB_ALGO_DILOCO_ASYNC]) == 0)
    jf_defaults(NULL, js, 1);
  if (cJSON_IsObject(get_field(root, "sparse"))) jf_defaults(NULL, js, 2);
  JS_TRY(parse_section(root, "", "", js, js));
  if (derive) {
    derive_outer(root, js);
    jobspec_derive_schedule(js); /* after: the schedule applies where there is momentum */
  }
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

static int parse_spec(const char *json, size_t n, jobspec *out, int derive) {
  memset(out, 0, sizeof *out);
  jf_defaults(NULL, out, 0);
  if (!json || n == 0) return dpc_err(DPC_EFORMAT, "job spec is empty");
  if (n > JOBSPEC_MAX_SPEC_BYTES) return dpc_err(DPC_EINVAL, "job spec is %zu bytes (limit %d)", n, JOBSPEC_MAX_SPEC_BYTES);
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
  int rc = parse_root(root, out, derive);
  cJSON_Delete(root);
  return rc < 0 ? rc : 0;
}

int jobspec_parse(const char *json, size_t n, jobspec *out) { return parse_spec(json, n, out, 1); }
int jobspec_parse_stored(const char *json, size_t n, jobspec *out) { return parse_spec(json, n, out, 0); }
