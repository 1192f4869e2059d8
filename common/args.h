/* args.h — the strict command-line parser every dipaco program uses (the daemons' mains and
 * dipacoctl's commands): a program describes its flags in a table, and the parser fills the
 * destinations, checks ranges and required flags, and names the bad flag or value in its
 * message, so no main() is a long chain of strcmp.
 *
 * Accepted forms: `--name VALUE`, `--name=VALUE`, `--flag`; `--` ends the flags (what follows
 * is positional). A table entry's `alias` (e.g. "-h") is a second spelling. Every message goes
 * to stderr and starts with the program's name as given (e.g. "dipacoctl train").
 * Thread-safety: none needed (called from main before threads start). */
#ifndef DPC_ARGS_H
#define DPC_ARGS_H

#include <stdint.h>

typedef enum {
  DPC_ARG_FLAG,   /* int*: set to 1, takes no value */
  DPC_ARG_STR,    /* const char**: points into argv */
  DPC_ARG_INT,    /* int* */
  DPC_ARG_LONG,   /* long* */
  DPC_ARG_U32,    /* uint32_t* */
  DPC_ARG_FLOAT,  /* float*, finite */
  DPC_ARG_DOUBLE, /* double*, finite */
  DPC_ARG_FN      /* custom: fn(value, dst) returns 0 or -1 having printed nothing; the parser
                     then prints "--name VALUE: expected <expects>" */
} dpc_arg_kind;

typedef struct dpc_arg {
  const char *name;  /* without the leading "--" */
  dpc_arg_kind kind;
  void *dst;
  int required;
  /* Numbers: accepted range [lo, hi] when lo < hi (both 0 = any value of the type). */
  double lo, hi;
  int (*fn)(const char *value, void *dst);
  const char *expects; /* DPC_ARG_FN: what a valid value looks like ("cpu or cuda") */
  const char *alias;   /* another spelling with its dashes ("-h"), or NULL */
  int seen;            /* set by dpc_args_parse: how many times the flag was given */
} dpc_arg;

/* The table ends with an entry whose name is NULL. "--help" (and "-h") need no entry: the
 * parser returns 1 for them unless the table defines them itself. */
#define DPC_ARGS_END {0}

/* Parse argv[0..argc) against `args`. Non-flag arguments are collected into pos[] (capacity
 * argc; the strings stay argv's) and counted in *npos; pos may be NULL, and then a positional
 * argument is a usage error. Returns 0 on success, 1 if --help was asked (print usage, exit 0),
 * -1 on a usage error (message printed: an unknown flag, a missing value, a value out of
 * range, a missing required flag). */
int dpc_args_parse(const char *prog, int argc, char **argv, dpc_arg *args, char **pos, int *npos);

/* The entry for `name`, or NULL: for "was it given" checks (entry->seen). */
const dpc_arg *dpc_args_find(const dpc_arg *args, const char *name);

#endif
