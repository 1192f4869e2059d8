/* ctl.h — shared pieces of dipacoctl, the admin and offline CLI: a strict option parser (every
 * unknown flag is an error that names it) and the subcommand entry points. Each subcommand
 * returns the process exit status (0 ok, 1 runtime failure, 2 usage error). */
#ifndef DPC_CTL_H
#define DPC_CTL_H

#include <stddef.h>

typedef enum { CTL_FLAG, CTL_STR, CTL_INT, CTL_LONG, CTL_FLOAT } ctl_opt_kind;

typedef struct {
  const char *name; /* without the leading "--" */
  ctl_opt_kind kind;
  void *dst;        /* int* for FLAG/INT, long* for LONG, float* for FLOAT, const char** for STR */
  int required;
  int seen;         /* set by ctl_parse */
} ctl_opt;

/* Parse argv[0..argc) against opts (NULL-name terminated). Non-option arguments are collected
 * into *pos (caller frees the array, not the strings) and *npos. Prints a clear message naming
 * the command and the bad flag or value and returns 2 on a usage error; prints the usage and
 * returns -1 for --help (the command then exits 0). */
int ctl_parse(const char *cmd, int argc, char **argv, ctl_opt *opts, char ***pos, int *npos);

int ctl_data_prepare(int argc, char **argv);
int ctl_init(int argc, char **argv);
int ctl_train(int argc, char **argv);
int ctl_eval(int argc, char **argv);
int ctl_generate(int argc, char **argv);

/* Admin commands over gRPC; present when built with DIPACO_DISTRIBUTED. */
int ctl_admin(const char *coordinator, int argc, char **argv);

#endif
