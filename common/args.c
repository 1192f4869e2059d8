/* args.c — the table-driven command-line parser (common/args.h). */
#include "common/args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int in_range(const dpc_arg *a, double x) { return !(a->lo < a->hi) || (x >= a->lo && x <= a->hi); }

static void range_msg(const char *prog, const dpc_arg *a, const char *v, const char *what) {
  if (a->lo < a->hi)
    fprintf(stderr, "%s: --%s %s: expected %s in [%.17g, %.17g]\n", prog, a->name, v, what, a->lo, a->hi);
  else fprintf(stderr, "%s: --%s expects %s, got '%s'\n", prog, a->name, what, v);
}

/* Store value v into a's destination; prints the message and returns -1 when it does not fit. */
static int set_value(const char *prog, const dpc_arg *a, const char *v) {
  char *end = NULL;
  errno = 0;
  switch (a->kind) {
  case DPC_ARG_STR: *(const char **)a->dst = v; return 0;
  case DPC_ARG_INT:
  case DPC_ARG_LONG:
  case DPC_ARG_U32: {
    long long x = strtoll(v, &end, 10);
    double lo = a->kind == DPC_ARG_INT ? INT_MIN : a->kind == DPC_ARG_LONG ? (double)LONG_MIN : 0;
    double hi = a->kind == DPC_ARG_INT ? INT_MAX : a->kind == DPC_ARG_LONG ? (double)LONG_MAX : UINT32_MAX;
    if (errno || !*v || *end || (double)x < lo || (double)x > hi || !in_range(a, (double)x)) break;
    if (a->kind == DPC_ARG_INT) *(int *)a->dst = (int)x;
    else if (a->kind == DPC_ARG_LONG) *(long *)a->dst = (long)x;
    else *(uint32_t *)a->dst = (uint32_t)x;
    return 0;
  }
  case DPC_ARG_FLOAT:
  case DPC_ARG_DOUBLE: {
    double x = strtod(v, &end);
    if (errno || !*v || *end || !isfinite(x) || !in_range(a, x)) break;
    if (a->kind == DPC_ARG_FLOAT) {
      if (!isfinite((float)x)) break;
      *(float *)a->dst = (float)x;
    } else *(double *)a->dst = x;
    return 0;
  }
  case DPC_ARG_FN:
    if (a->fn(v, a->dst) == 0) return 0;
    fprintf(stderr, "%s: --%s %s: expected %s\n", prog, a->name, v, a->expects ? a->expects : "a valid value");
    return -1;
  case DPC_ARG_FLAG: break;
  }
  range_msg(prog, a, v, a->kind == DPC_ARG_FLOAT || a->kind == DPC_ARG_DOUBLE ? "a finite number" : "an integer");
  return -1;
}

static dpc_arg *lookup(dpc_arg *args, const char *a, size_t nlen) {
  for (dpc_arg *q = args; q->name; q++) {
    if (strlen(q->name) == nlen && strncmp(q->name, a + 2, nlen) == 0 && a[0] == '-' && a[1] == '-') return q;
    if (q->alias && strlen(q->alias) == nlen + 2 && strncmp(q->alias, a, nlen + 2) == 0) return q;
  }
  return NULL;
}

const dpc_arg *dpc_args_find(const dpc_arg *args, const char *name) {
  for (const dpc_arg *q = args; q->name; q++)
    if (strcmp(q->name, name) == 0) return q;
  return NULL;
}

int dpc_args_parse(const char *prog, int argc, char **argv, dpc_arg *args, char **pos, int *npos) {
  int np = 0;
  for (dpc_arg *q = args; q->name; q++) q->seen = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      while (++i < argc) {
        if (!pos) {
          fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[i]);
          return -1;
        }
        pos[np++] = argv[i];
      }
      break;
    }
    /* The flag's name ends at '=' (the value follows) or at the end. */
    const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    size_t nlen = eq ? (size_t)(eq - a - 2) : strlen(a) >= 2 ? strlen(a) - 2 : 0;
    dpc_arg *o = a[0] == '-' ? lookup(args, a, nlen) : NULL;
    if (!o && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) return 1;
    if (!o && (strncmp(a, "--", 2) != 0 || a[2] == '\0')) {
      if (!pos) {
        fprintf(stderr, "%s: unexpected argument '%s' (see '%s --help')\n", prog, a, prog);
        return -1;
      }
      pos[np++] = argv[i];
      continue;
    }
    if (!o) {
      fprintf(stderr, "%s: unknown flag '%s' (see '%s --help')\n", prog, a, prog);
      return -1;
    }
    o->seen++;
    if (o->kind == DPC_ARG_FLAG) {
      if (eq) {
        fprintf(stderr, "%s: --%s takes no value\n", prog, o->name);
        return -1;
      }
      *(int *)o->dst = 1;
      continue;
    }
    const char *val = eq ? eq + 1 : NULL;
    if (!val) {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s: --%s needs a value\n", prog, o->name);
        return -1;
      }
      val = argv[++i];
    }
    if (set_value(prog, o, val) < 0) return -1;
  }
  for (dpc_arg *q = args; q->name; q++) {
    if (q->required && !q->seen) {
      fprintf(stderr, "%s: missing required flag --%s\n", prog, q->name);
      return -1;
    }
  }
  if (npos) *npos = np;
  return 0;
}
