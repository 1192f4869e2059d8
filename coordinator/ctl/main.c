/* main.c — dipacoctl's entry point: the global flags (--coordinator and the connection
 * flags, accepted before the command), and dispatch to an offline tool or the admin commands. */
#include "coordinator/ctl/ctl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Connection flags of the admin commands, accepted before the command too. */
static int is_conn_flag(const char *a) {
  return !strcmp(a, "--token-file") || !strcmp(a, "--tls-ca") || !strcmp(a, "--tls-cert") || !strcmp(a, "--tls-key");
}

/* The flags before the command. */
typedef struct {
  const char *coordinator;
  char *conn[8]; /* connection flags and their values, in order */
  int n_conn;
} globals;

/* Reads the global flags from argv[1..]; returns the index of the command word, or -1 after
 * --help (exit 0). */
static int global_flags(int argc, char **argv, globals *g) {
  int i = 1;
  while (i < argc && strncmp(argv[i], "--", 2) == 0) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      ctl_usage(stdout);
      return -1;
    } else if (strcmp(argv[i], "--coordinator") == 0 && i + 1 < argc) {
      g->coordinator = argv[i + 1];
      i += 2;
    } else if (strncmp(argv[i], "--coordinator=", 14) == 0) {
      g->coordinator = argv[i] + 14;
      i += 1;
    } else if (is_conn_flag(argv[i]) && i + 1 < argc && g->n_conn + 2 <= (int)(sizeof g->conn / sizeof g->conn[0])) {
      g->conn[g->n_conn++] = argv[i];
      g->conn[g->n_conn++] = argv[i + 1];
      i += 2;
    } else {
      break; /* global flags end; admin flags like --json are parsed by the command */
    }
  }
  return i;
}

/* An admin command, argv[0] being its word. Connection flags given before the command go
 * right after its words ("job SUB"), where the command parses them. */
static int admin(const globals *g, int argc, char **argv) {
  if (g->n_conn == 0) return ctl_admin(g->coordinator, argc, argv);
  int nw = strcmp(argv[0], "job") == 0 && argc >= 2 ? 2 : 1;
  char **av = calloc((size_t)(argc + g->n_conn + 1), sizeof *av);
  if (!av) return 1;
  memcpy(av, argv, (size_t)nw * sizeof *av);
  memcpy(av + nw, g->conn, (size_t)g->n_conn * sizeof *av);
  memcpy(av + nw + g->n_conn, argv + nw, (size_t)(argc - nw) * sizeof *av);
  int st = ctl_admin(g->coordinator, argc + g->n_conn, av);
  free(av);
  return st;
}

int main(int argc, char **argv) {
  globals g = {.coordinator = getenv("DIPACO_COORDINATOR")};
  int i = global_flags(argc, argv, &g);
  if (i < 0) return 0;
  if (i >= argc) {
    ctl_usage(stderr);
    return 2;
  }
  const char *cmd = argv[i];
  int rest = argc - i - 1;
  char **rargv = argv + i + 1;
  if (strcmp(cmd, "data") == 0) {
    if (rest >= 1 && strcmp(rargv[0], "prepare") == 0) return ctl_data_prepare(rest - 1, rargv + 1);
    fprintf(stderr, "dipacoctl data: unknown subcommand (use 'data prepare')\n");
    return 2;
  }
  if (strcmp(cmd, "route") == 0) return ctl_route(rest, rargv);
  if (strcmp(cmd, "eval") == 0)
    for (int k = 0; k < rest; k++)
      if (strcmp(rargv[k], "--dipaco") == 0 || strncmp(rargv[k], "--dipaco=", 9) == 0) return ctl_eval_dipaco(rest, rargv);
  static const struct {
    const char *name;
    int (*fn)(int, char **);
  } offline[] = {{"init", ctl_init}, {"train", ctl_train}, {"eval", ctl_eval}, {"generate", ctl_generate}};
  for (size_t k = 0; k < sizeof offline / sizeof offline[0]; k++)
    if (strcmp(cmd, offline[k].name) == 0) return offline[k].fn(rest, rargv);
  if (strcmp(cmd, "help") == 0) {
    ctl_usage(stdout);
    return 0;
  }
  return admin(&g, argc - i, argv + i);
}
