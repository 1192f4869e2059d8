/* jobspec_json.c — a jobspec's canonical JSON: compact, every field in the field table's order
 * (jobspec_fields.h), every default written out. The coordinator stores this text and compares
 * specs by it, so its bytes are part of the durable state (docs/design.md §6.6). */
#include "coordinator/jobspec_fields.h"
#include "common/codec.h"
#include "common/errors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int given(const jobspec *js, const jobspec_field *f) {
  int v;
  memcpy(&v, (const char *)js + f->count_off, sizeof v);
  return v != 0;
}

static void write_section(cJSON *o, const char *sect, const void *base, const jobspec *js);

/* 1 if the int-sized field at `at` holds f's default (JF_OMIT_DEFAULT fields are enums). */
static int is_default(const jobspec_field *f, const void *at) {
  int v;
  memcpy(&v, at, sizeof v);
  return v == (int)f->def;
}

static void write_paths(cJSON *o, const char *key, const char (*list)[JOBSPEC_PATH_MAX], int n) {
  cJSON *a = cJSON_AddArrayToObject(o, key);
  for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(list[i]));
}

static void write_path_lists(cJSON *o, const char *key, const jobspec *js) {
  cJSON *ps = cJSON_AddArrayToObject(o, key);
  for (int p = 0; ps && p < js->n_data_paths; p++) {
    cJSON *l = cJSON_CreateArray();
    for (int i = js->path_first[p]; l && i < js->path_first[p + 1]; i++)
      cJSON_AddItemToArray(l, cJSON_CreateString(js->path_glob[i]));
    if (l) cJSON_AddItemToArray(ps, l);
  }
}

/* The levels; an unresolved default level (end -1) is left out, and so is then the list. */
static void write_levels(cJSON *o, const char *key, const jobspec *js) {
  char sect[32];
  snprintf(sect, sizeof sect, "%s[]", key);
  cJSON *lv = cJSON_AddArrayToObject(o, key);
  for (int l = 0; lv && l < js->n_levels; l++) {
    if (js->levels[l].layer_end < 0) break;
    cJSON *e = cJSON_CreateObject();
    if (!e) break;
    write_section(e, sect, &js->levels[l], js);
    cJSON_AddItemToArray(lv, e);
  }
  if (lv && cJSON_GetArraySize(lv) == 0) cJSON_DeleteItemFromObject(o, key);
}

/* The fields of section `sect` (stored at base) into o. */
static void write_section(cJSON *o, const char *sect, const void *base, const jobspec *js) {
  char p[96];
  for (int i = 0; i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    if (!jf_in(f, sect)) continue;
    if ((f->flags & JF_PRESENCE) && !given(js, f)) continue;
    if ((f->flags & (JF_SHAPE | JF_SHAPE_OPT)) && !js->has_shape) continue;
    if (!jf_applies(f, js)) continue;
    const void *at = jf_at(f, base);
    if ((f->flags & JF_OMIT_DEFAULT) && is_default(f, at)) continue;
    double d;
    switch (f->type) {
    case JF_OBJECT: {
      cJSON *c = cJSON_AddObjectToObject(o, f->key);
      if (c) write_section(c, jf_path(p, sizeof p, sect, f->key), js, js);
      break;
    }
    case JF_LEVELS: write_levels(o, f->key, js); break;
    case JF_STRING:
      if (!((f->flags & JF_OMIT_EMPTY) && !((const char *)at)[0])) cJSON_AddStringToObject(o, f->key, at);
      break;
    case JF_INT: add_num(o, f->key, jf_get_int(f, base)); break;
    case JF_NUMBER:
      memcpy(&d, at, sizeof d);
      add_num(o, f->key, d);
      break;
    case JF_BOOL: cJSON_AddBoolToObject(o, f->key, jf_get_int(f, base)); break;
    case JF_ENUM: {
      int v = jf_get_int(f, base);
      cJSON_AddStringToObject(o, f->key, v >= 0 && v < f->n_names ? f->names[v] : "?");
      break;
    }
    case JF_CODEC: cJSON_AddStringToObject(o, f->key, dpc_codec_name(jf_get_int(f, base))); break;
    case JF_SEED: {
      uint64_t u;
      memcpy(&u, at, sizeof u);
      add_num(o, f->key, (double)u);
      break;
    }
    case JF_PATHS:
      /* data.train gives way to data.paths (f->excl) when the spec has per-path lists */
      if (!(f->excl && js->n_data_paths > 0))
        write_paths(o, f->key, at, *(const int *)((const char *)base + f->count_off));
      break;
    case JF_PATH_LISTS:
      if (js->n_data_paths > 0) write_path_lists(o, f->key, js);
      break;
    case JF_SPAN: {
      int ly[2];
      memcpy(ly, at, sizeof ly);
      cJSON_AddItemToObject(o, f->key, cJSON_CreateIntArray(ly, 2));
      break;
    }
    }
  }
}

int jobspec_to_json(const jobspec *js, char **out) {
  *out = NULL;
  cJSON *r = cJSON_CreateObject();
  if (!r) return dpc_err(DPC_ENOMEM, "jobspec_to_json: out of memory");
  write_section(r, "", js, js);
  char *s = cJSON_PrintUnformatted(r);
  cJSON_Delete(r);
  if (!s) return dpc_err(DPC_ENOMEM, "jobspec_to_json: out of memory");
  /* cJSON allocates with malloc by default; hand over a plain malloc'd copy regardless. */
  *out = strdup(s);
  cJSON_free(s);
  return *out ? 0 : dpc_err(DPC_ENOMEM, "jobspec_to_json: out of memory");
}
