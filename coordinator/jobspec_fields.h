/* jobspec_fields.h — the job spec's field table and what the jobspec*.c files share. Not for
 * use outside them (and the tests); the public contract is jobspec.h.
 *
 * Every field of the job spec is declared once, as one entry of jobspec_fields[]
 * (jobspec_fields.c): its JSON path, type, default, range and one-line meaning. From that one
 * table
 *   jobspec_parse.c     reads the JSON (known keys, types, required fields, defaults),
 *   jobspec_validate.c  validates the struct (types and ranges, then the rules that tie several
 *                       fields together, written by hand after the table pass),
 *   jobspec_json.c      writes the canonical JSON (the table's order is the key order),
 *   jobspec_doc.c       renders docs/jobspec.md (the test jobspec_doc fails when it is stale),
 * as store_internal.h's column lists do for the store's rows. A new field is one entry in the
 * table plus its member in jobspec.h's struct.
 *
 * Calls go one way: jobspec_parse.c calls jobspec_validate.c; both, jobspec_json.c and
 * jobspec_doc.c read the table (jobspec_fields.c); jobspec_validate.c also asks jobspec.c
 * (the module / path / fragment structure), which reads no table. */
#ifndef DPC_JOBSPEC_FIELDS_H
#define DPC_JOBSPEC_FIELDS_H

#include "coordinator/jobspec.h"

#include <stddef.h>

#define JOBSPEC_MAX_SPEC_BYTES (1 << 20)
#define JOBSPEC_MAX_SEED 9007199254740992.0 /* 2^53: exactly representable in JSON numbers */

typedef enum {
  JF_OBJECT,     /* a section: the fields whose sect is this field's path follow it */
  JF_LEVELS,     /* "levels": a list of objects, each read with the "levels[]" fields */
  JF_STRING,     /* char[size], NUL-terminated */
  JF_INT,        /* int, integral in JSON */
  JF_NUMBER,     /* double, finite */
  JF_BOOL,       /* int 0 / 1, true / false in JSON */
  JF_ENUM,       /* an enum (int-sized), by name: names[0..n_names) */
  JF_CODEC,      /* int dpc_codec, by dpc_codec_name */
  JF_SEED,       /* uint64_t, an integer in [0, 2^53] */
  JF_PATHS,      /* char[JOBSPEC_MAX_DATA][JOBSPEC_PATH_MAX]; count at count_off */
  JF_PATH_LISTS, /* data.paths: n_data_paths, path_first, path_glob */
  JF_SPAN,       /* [first, end]: two consecutive ints */
} jf_type;

/* Flags of a field. */
enum {
  JF_REQUIRED = 1 << 0,   /* no default: the JSON must give it */
  JF_SHAPE = 1 << 1,      /* an int of jobspec.model: required unless "init" is given without any
                             shape field; model.init's config.json gives it then */
  JF_PRESENCE = 1 << 2,   /* optional with a "given" flag (int at count_off): the JSON omits it
                             while unset, and validation skips it */
  JF_ALT_DEFAULT = 1 << 3, /* default def_async for diloco-async, def_sparse with a "sparse" block */
  JF_ZERO_OFF = 1 << 4,   /* 0 turns it off; the range applies to other values */
  JF_OMIT_EMPTY = 1 << 5, /* a string the canonical JSON leaves out while empty */
  JF_PARSE_RANGE = 1 << 6, /* the range is checked on reading only (JF_SPAN) */
  JF_SHAPE_OPT = 1 << 7,  /* part of jobspec.model like JF_SHAPE (read, written and compared with
                             config.json only with the shape), but optional with its default */
  JF_OMIT_DEFAULT = 1 << 8, /* the canonical JSON leaves it out while it holds its default (so
                               specs written before the field existed keep their bytes) */
};

/* The upper bound of an integer range that depends on other fields. */
typedef enum { JF_HI_CONST, JF_HI_STEPS, JF_HI_H, JF_HI_H_MINUS_1 } jf_hi_ref;

typedef struct {
  int on;
  double lo;
  int lo_open; /* 1 excludes lo */
  double hi;
  int hi_open;
  jf_hi_ref hi_ref; /* JF_HI_STEPS: rounds × inner_steps; JF_HI_H: inner_steps; JF_HI_H_MINUS_1 */
} jf_range;

typedef struct jobspec_field {
  const char *sect;  /* the containing section's path: "" (top level), "inner", "levels[]" */
  const char *key;   /* the JSON key */
  const char *alias; /* an older key accepted on input (never written), or NULL */
  jf_type type;
  unsigned flags;
  size_t off, size;  /* in jobspec, or in jobspec_level for sect "levels[]" */
  size_t count_off;  /* JF_PATHS: its int count; JF_PRESENCE: the int "given" flag (in jobspec) */
  const char *excl;  /* a sibling key that replaces this one: never both; a required field is
                        then required only without the sibling */
  const char *excl_why; /* why, for the message that refuses both */
  double def, def_async, def_sparse;
  jf_range range;
  const char *const *names; /* JF_ENUM */
  int n_names;
  int (*check)(const jobspec *js); /* a rule of its own, run before the range check */
  /* NULL, or when the field applies: otherwise it is refused on input, left out of the
   * canonical JSON, skipped by validation and held as zero (e.g. the Llama keys of model,
   * which apply only with model.arch "llama"). Fields it reads come earlier in the table. */
  int (*when)(const jobspec *js);
  const char *when_doc;            /* when it applies, for messages and the docs */
  const char *range_doc;           /* the docs' range for a field checked by `check` */
  const char *doc;                 /* one line: what it means */
} jobspec_field;

extern const jobspec_field jobspec_fields[];
extern const int jobspec_n_fields;

extern const char *const jobspec_algo_names[];

/* "sect.key" (or "key" at the top level) into buf. */
const char *jf_path(char *buf, size_t cap, const char *prefix, const char *key);
/* 1 if f is a child of section path `sect` (a JF_OBJECT's or JF_LEVELS' path + "[]"). */
int jf_in(const jobspec_field *f, const char *sect);
/* The field's storage in the struct at base (a jobspec, or a jobspec_level). */
static inline void *jf_at(const jobspec_field *f, const void *base) { return (char *)base + f->off; }
int jf_get_int(const jobspec_field *f, const void *base);
void jf_set_int(const jobspec_field *f, void *base, int v);
/* The inclusive-or-open upper bound of f's range for spec js. */
double jf_hi(const jobspec_field *f, const jobspec *js);
/* Write the default of every field of section `sect` into base (sect NULL: every field of a
 * jobspec; alt: 0 plain, 1 diloco-async, 2 with a "sparse" block: only JF_ALT_DEFAULT fields
 * then). */
void jf_defaults(const char *sect, void *base, int alt);

int jf_has_ctl(const char *s); /* 1 if s holds a control character */
/* 1 if f applies to js (f->when); 0 for a field that is then held as zero. */
int jf_applies(const jobspec_field *f, const jobspec *js);
/* Zero every field of section `sect` (at base) that does not apply to js. */
void jf_zero_inapplicable(const char *sect, void *base, const jobspec *js);

#define JS_TRY(x)            \
  do {                       \
    int _rc = (x);           \
    if (_rc < 0) return _rc; \
  } while (0)

#endif
