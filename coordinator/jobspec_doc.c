/* jobspec_doc.c — docs/jobspec.md rendered from the field table (jobspec_fields.h): every
 * field's path, type, default, range and meaning. tests/unit/jobspec_doc.c prints it; the
 * ctest jobspec_doc (tests/cmake/jobspec_doc.cmake) fails when the checked-in file differs. */
#include "coordinator/jobspec_doc.h"
#include "coordinator/jobspec_fields.h"
#include "common/codec.h"
#include "common/errors.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The page's head, around the example spec (jobspec_doc_example). */
static const char HEAD[] =
    "<!-- Generated from coordinator/jobspec_fields.c by `cmake --build BUILD --target jobspec-doc`; do not edit.\n"
    "     The test jobspec_doc fails when this file is stale. -->\n"
    "# Job spec reference\n"
    "\n"
    "A job is one JSON object, given to `dipacoctl job create SPEC.json`. The coordinator parses and\n"
    "validates it (coordinator/jobspec.h), fills in every default, and stores it in canonical form:\n"
    "compact, keys in the order of the table below, every default written out. Unknown and duplicated\n"
    "fields are refused at every level, and every error names the field's path.\n"
    "\n"
    "Paths in the table: `inner.lr` is the key `lr` of the object `inner`; `levels[].modules` is the\n"
    "key `modules` of each object of the list `levels`. A field marked required has no default.\n"
    "Ranges are inclusive where written `[a, b]` and exclude the bound where written `(` or `)`.\n"
    "Data paths are relative to each worker's `--data-dir`: no leading `/`, no `..` component, no\n"
    "component a glob could expand to `..`, no control characters.\n"
    "\n"
    "Minimal spec:\n"
    "\n"
    "```json\n";
static const char TAIL[] =
    "```\n"
    "\n"
    "Rules that tie fields together are listed in each field's meaning; the module, path and\n"
    "fragment numbering that `levels` and `streaming` give is described in coordinator/jobspec.h.\n"
    "\n"
    "| Field | Type | Default | Range | Meaning |\n"
    "|---|---|---|---|---|\n";

const char jobspec_doc_example[] =
    "{\"name\": \"run-1\",\n"
    " \"model\": {\"n_layer\": 4, \"n_head\": 4, \"n_embd\": 128, \"n_positions\": 256, \"vocab_size\": 50257},\n"
    " \"data\": {\"train\": [\"shards/train_*.bin\"], \"val\": [\"shards/val_000.bin\"]},\n"
    " \"algorithm\": \"diloco\", \"replicas\": 4, \"inner_steps\": 50, \"rounds\": 20, \"batch\": 8, \"seq_len\": 256}\n";

/* A growing string; on allocation failure it stays NULL and the caller reports ENOMEM. */
typedef struct {
  char *s;
  size_t n, cap;
  int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = 1;
      return;
    }
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->oom = 1;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
}

/* A number as the doc shows it: integers in full, others as %g. */
static const char *num(char *buf, size_t cap, double v) {
  if (v == floor(v) && fabs(v) < 1e15) snprintf(buf, cap, "%.0f", v);
  else snprintf(buf, cap, "%g", v);
  return buf;
}

static const char *hi_name(const jobspec_field *f, char *buf, size_t cap) {
  switch (f->range.hi_ref) {
  case JF_HI_STEPS: return "rounds × inner_steps";
  case JF_HI_H: return "inner_steps";
  case JF_HI_H_MINUS_1: return "inner_steps − 1";
  default: return num(buf, cap, f->range.hi);
  }
}

static void put_type(sbuf *b, const jobspec_field *f) {
  switch (f->type) {
  case JF_OBJECT: put(b, "object"); return;
  case JF_LEVELS: put(b, "list of objects"); return;
  case JF_STRING: put(b, "string"); return;
  case JF_INT:
  case JF_SEED: put(b, "integer"); return;
  case JF_NUMBER: put(b, "number"); return;
  case JF_BOOL: put(b, "boolean"); return;
  case JF_PATHS: put(b, "list of paths"); return;
  case JF_PATH_LISTS: put(b, "list of lists of paths"); return;
  case JF_SPAN: put(b, "[first, end]"); return;
  case JF_ENUM:
    for (int i = 0; i < f->n_names; i++) put(b, "%s`\"%s\"`", i ? ", " : "one of ", f->names[i]);
    return;
  case JF_CODEC:
    for (int i = 0; i < DPC_CODEC_COUNT; i++) put(b, "%s`\"%s\"`", i ? ", " : "one of ", dpc_codec_name(i));
    return;
  }
}

/* One default value of f as JSON text. */
static void put_value(sbuf *b, const jobspec_field *f, double d) {
  char nb[32];
  switch (f->type) {
  case JF_BOOL: put(b, "%s", d != 0 ? "true" : "false"); return;
  case JF_ENUM: put(b, "\"%s\"", f->names[(int)d]); return;
  case JF_CODEC: put(b, "\"%s\"", dpc_codec_name((int)d)); return;
  default: put(b, "%s", num(nb, sizeof nb, d)); return;
  }
}

static void put_default(sbuf *b, const jobspec_field *f) {
  if (f->flags & JF_REQUIRED) {
    put(b, f->excl ? "required (or %s.%s)" : "required", f->sect, f->excl);
    return;
  }
  if (f->flags & JF_SHAPE) {
    put(b, "required (or from model.init)");
    return;
  }
  if (f->flags & JF_PRESENCE) {
    put(b, "absent");
    return;
  }
  switch (f->type) {
  case JF_OBJECT: put(b, "`{}`"); return;
  case JF_LEVELS: put(b, "one level, the whole model"); return;
  case JF_STRING: put(b, "none"); return;
  case JF_PATHS: put(b, "`[]`"); return;
  case JF_PATH_LISTS: put(b, "none"); return;
  default: break;
  }
  put(b, "`");
  put_value(b, f, f->def);
  put(b, "`");
  if (!(f->flags & JF_ALT_DEFAULT)) return;
  if (f->def_async != f->def) {
    put(b, "; diloco-async: `");
    put_value(b, f, f->def_async);
    put(b, "`");
  }
  if (f->def_sparse != f->def) {
    put(b, "; with sparse: `");
    put_value(b, f, f->def_sparse);
    put(b, "`");
  }
}

static void put_range(sbuf *b, const jobspec_field *f) {
  char lo[32], hi[32];
  const jf_range *r = &f->range;
  if (f->range_doc) {
    put(b, "%s", f->range_doc);
  } else if (r->on) {
    if (f->flags & JF_ZERO_OFF) put(b, "0 (off) or ");
    put(b, "%c%s, %s%c", r->lo_open ? '(' : '[', num(lo, sizeof lo, r->lo), hi_name(f, hi, sizeof hi), r->hi_open ? ')' : ']');
  } else if (f->type == JF_SEED) {
    put(b, "[0, 2^53]");
  } else if (f->type == JF_PATHS) {
    put(b, "at most %d entries", JOBSPEC_MAX_DATA);
  } else if (f->type == JF_PATH_LISTS) {
    put(b, "one list per path, at most %d lists and %d entries in all", JOBSPEC_MAX_DATA_PATHS, JOBSPEC_MAX_PATH_GLOBS);
  } else if (f->type == JF_LEVELS) {
    put(b, "1 to %d levels", JOBSPEC_MAX_LEVELS);
  }
}

int jobspec_doc_markdown(char **out) {
  sbuf b = {0};
  char p[96];
  *out = NULL;
  put(&b, "%s%s%s", HEAD, jobspec_doc_example, TAIL);
  for (int i = 0; i < jobspec_n_fields; i++) {
    const jobspec_field *f = &jobspec_fields[i];
    put(&b, "| `%s` | ", jf_path(p, sizeof p, f->sect, f->key));
    put_type(&b, f);
    put(&b, " | ");
    put_default(&b, f);
    put(&b, " | ");
    put_range(&b, f);
    put(&b, " | %s", f->doc);
    if (f->when_doc) put(&b, "; only with %s", f->when_doc);
    if (f->flags & JF_OMIT_DEFAULT) put(&b, " (the canonical form leaves out the default)");
    if (f->alias) put(&b, " (older name: `%s`)", f->alias);
    put(&b, " |\n");
  }
  if (b.oom) {
    free(b.s);
    return dpc_err(DPC_ENOMEM, "jobspec_doc_markdown: out of memory");
  }
  *out = b.s;
  return 0;
}
