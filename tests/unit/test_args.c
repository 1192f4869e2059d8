/* test_args.c — the table-driven command-line parser (common/args.h): both value forms,
 * flags, aliases, positionals, ranges, custom values, required flags, and that every usage
 * error is refused (-1) rather than half-applied silently. */
#include "common/args.h"
#include "test.h"

#include <string.h>

static int parse_mode(const char *v, void *dst) {
  if (strcmp(v, "fast") && strcmp(v, "slow")) return -1;
  *(const char **)dst = v;
  return 0;
}

/* Parse a NULL-terminated literal argv against a fresh table; returns the parser's result. */
typedef struct {
  const char *listen, *mode;
  int verbose, n;
  long big;
  uint32_t chunk;
  float lr;
  double slow;
  char *pos[8];
  int npos;
} opts;

static int run(opts *o, int with_pos, const char **av) {
  int ac = 0;
  while (av[ac]) ac++;
  memset(o, 0, sizeof *o);
  o->n = 7;
  dpc_arg t[] = {
      {.name = "listen", .kind = DPC_ARG_STR, .dst = &o->listen, .required = 1},
      {.name = "verbose", .kind = DPC_ARG_FLAG, .dst = &o->verbose, .alias = "-v"},
      {.name = "n", .kind = DPC_ARG_INT, .dst = &o->n, .lo = 1, .hi = 10},
      {.name = "big", .kind = DPC_ARG_LONG, .dst = &o->big},
      {.name = "chunk", .kind = DPC_ARG_U32, .dst = &o->chunk},
      {.name = "lr", .kind = DPC_ARG_FLOAT, .dst = &o->lr},
      {.name = "slowdown", .kind = DPC_ARG_DOUBLE, .dst = &o->slow, .lo = 1, .hi = 100},
      {.name = "mode", .kind = DPC_ARG_FN, .dst = &o->mode, .fn = parse_mode, .expects = "fast or slow"},
      DPC_ARGS_END};
  return dpc_args_parse("prog", ac, (char **)av, t, with_pos ? o->pos : NULL, with_pos ? &o->npos : NULL);
}

int main(void) {
  opts o;
  CHECK_EQ_INT(run(&o, 1, (const char *[]){"--listen", "a:1", "x", "--n=3", "-v", "--big", "-5", "--chunk", "4096",
                                            "--lr", "0.5", "--slowdown=2.5", "--mode", "slow", "--", "--n", NULL}),
               0);
  CHECK(o.listen && strcmp(o.listen, "a:1") == 0);
  CHECK_EQ_INT(o.n, 3);
  CHECK_EQ_INT(o.verbose, 1);
  CHECK_EQ_INT(o.big, -5);
  CHECK_EQ_INT(o.chunk, 4096);
  CHECK_NEAR(o.lr, 0.5, 0);
  CHECK_NEAR(o.slow, 2.5, 0);
  CHECK(o.mode && strcmp(o.mode, "slow") == 0);
  CHECK_EQ_INT(o.npos, 2); /* "x" and, after "--", the literal "--n" */
  CHECK(o.npos == 2 && strcmp(o.pos[0], "x") == 0 && strcmp(o.pos[1], "--n") == 0);

  /* Defaults stay when a flag is absent. */
  CHECK_EQ_INT(run(&o, 0, (const char *[]){"--listen", "a", NULL}), 0);
  CHECK_EQ_INT(o.n, 7);

  /* --help and -h ask for the usage. */
  CHECK_EQ_INT(run(&o, 0, (const char *[]){"--help", NULL}), 1);
  CHECK_EQ_INT(run(&o, 0, (const char *[]){"-h", NULL}), 1);

  /* Usage errors. */
  const char **bad[] = {
      (const char *[]){NULL},                                           /* required --listen missing */
      (const char *[]){"--listen", "a", "--bogus", NULL},               /* unknown flag */
      (const char *[]){"--listen", NULL},                               /* value missing */
      (const char *[]){"--listen", "a", "--verbose=1", NULL},           /* flag with a value */
      (const char *[]){"--listen", "a", "--n", "11", NULL},             /* out of [1, 10] */
      (const char *[]){"--listen", "a", "--n", "3x", NULL},             /* not an integer */
      (const char *[]){"--listen", "a", "--big", "", NULL},             /* empty */
      (const char *[]){"--listen", "a", "--chunk", "4294967296", NULL}, /* over uint32 */
      (const char *[]){"--listen", "a", "--chunk", "-1", NULL},         /* negative uint32 */
      (const char *[]){"--listen", "a", "--lr", "nan", NULL},           /* not finite */
      (const char *[]){"--listen", "a", "--lr", "1e39", NULL},          /* over float */
      (const char *[]){"--listen", "a", "--slowdown", "0.5", NULL},     /* under the range */
      (const char *[]){"--listen", "a", "--mode", "medium", NULL},      /* custom value refused */
      (const char *[]){"--listen", "a", "stray", NULL},                 /* positional not allowed */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = run(&o, 0, bad[i]);
    if (rc != -1) fprintf(stderr, "bad case %zu accepted (rc %d)\n", i, rc);
    CHECK_EQ_INT(rc, -1);
  }
  TEST_DONE();
}
