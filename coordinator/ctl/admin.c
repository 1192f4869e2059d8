/* admin.c — ctl_admin, the entry of dipacoctl's admin commands (a gRPC client of
 * dipaco.v1.Admin and grpc.health.v1.Health): finds the command in the table, parses the
 * admin flags (every command takes the connection flags and --json; the others only where the
 * table lists them), opens the connection (conn.c) and runs the command (commands.h).
 * Exit status: 0 ok, 1 runtime or server error, 2 usage error, 3 `job wait` timed out. */
#include "coordinator/ctl/commands.h"
#include "coordinator/ctl/ctl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *word, *sub; /* "job" "show", or "workers" NULL */
  const char *flags;      /* the command-specific flags it takes, space-separated */
  int (*check)(const admin_args *o); /* before connecting, or NULL */
  admin_cmd_fn run;
} admin_cmd;

static const admin_cmd commands[] = {
    {"job", "create", "paused data-dir", NULL, cmd_job_create},
    {"job", "list", "state", NULL, cmd_job_list},
    {"job", "show", "", NULL, cmd_job_show},
    {"job", "pause", "reason", NULL, cmd_job_pause},
    {"job", "resume", "reason", NULL, cmd_job_resume},
    {"job", "cancel", "reason", NULL, cmd_job_cancel},
    {"job", "wait", "timeout poll-ms", NULL, cmd_job_wait},
    {"job", "watch", "timeout poll-ms", NULL, cmd_job_watch},
    {"job", "plot", "out", NULL, cmd_job_plot},
    {"job", "export", "path out version all-paths router", cmd_job_export_check, cmd_job_export},
    {"job", "ledger", "", NULL, cmd_job_ledger},
    {"workers", NULL, "all job", NULL, cmd_workers},
    {"paths", NULL, "data-dir", NULL, cmd_paths},
    {"modules", NULL, "", NULL, cmd_modules},
    {"status", NULL, "", NULL, cmd_status},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

/* "job SUB" or "WORD": the name messages use. */
static void command_name(const admin_cmd *c, char *buf, size_t cap) {
  if (c->sub) snprintf(buf, cap, "%s %s", c->word, c->sub);
  else snprintf(buf, cap, "%s", c->word);
}

/* Whether the space-separated list holds `name`. */
static int lists(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, " ");
    if (len == n && strncmp(p, name, n) == 0) return 1;
    p += len + (p[len] == ' ');
  }
  return 0;
}

static void print_job_subs(void) {
  for (size_t k = 0, first = 1; k < N_COMMANDS; k++)
    if (commands[k].sub) {
      fprintf(stderr, "%s%s", first ? "" : ", ", commands[k].sub);
      first = 0;
    }
}

/* The command argv names, or NULL after a usage message; *skip = how many words it has. */
static const admin_cmd *find_command(int argc, char **argv, int *skip) {
  const char *word = argv[0];
  int is_job = strcmp(word, "job") == 0;
  if (is_job && argc < 2) {
    fputs("dipacoctl job: missing subcommand (", stderr);
    print_job_subs();
    fputs(")\n", stderr);
    return NULL;
  }
  *skip = is_job ? 2 : 1;
  for (size_t k = 0; k < N_COMMANDS; k++) {
    const admin_cmd *c = &commands[k];
    if (strcmp(c->word, word) == 0 && (is_job ? strcmp(c->sub, argv[1]) == 0 : !c->sub)) return c;
  }
  if (is_job) {
    fprintf(stderr, "dipacoctl job: unknown subcommand '%s' (", argv[1]);
    print_job_subs();
    fputs(")\n", stderr);
  } else {
    fprintf(stderr, "dipacoctl: unknown command '%s' (run 'dipacoctl --help')\n", word);
  }
  return NULL;
}

/* Flags that belong to some commands only are refused elsewhere rather than ignored: returns 0,
 * or 2 after "--FLAG applies only to CMD|CMD". */
static int check_flag_scope(const admin_cmd *cmd, const char *name, const dpc_arg *args) {
  for (const dpc_arg *q = args; q->name; q++) {
    if (!q->seen || lists(cmd->flags, q->name)) continue;
    char only[256] = "";
    size_t off = 0;
    for (size_t k = 0; k < N_COMMANDS && off < sizeof only; k++) {
      if (!lists(commands[k].flags, q->name)) continue;
      char n[32];
      command_name(&commands[k], n, sizeof n);
      off += (size_t)snprintf(only + off, sizeof only - off, "%s%s", off ? "|" : "", n);
    }
    if (off == 0) continue; /* a flag every command takes */
    fprintf(stderr, "dipacoctl %s: --%s applies only to %s\n", name, q->name, only);
    return 2;
  }
  return 0;
}

int ctl_admin(const char *coordinator, int argc, char **argv) {
  int skip = 1, status;
  const admin_cmd *cmd = find_command(argc, argv, &skip);
  if (!cmd) return 2;
  actx a;
  memset(&a, 0, sizeof a);
  command_name(cmd, a.cmd, sizeof a.cmd);
  conn_flags cf = {0};
  admin_args o = {.path = -1, .poll_ms = 500};
  dpc_arg args[] = {{.name = "json", .kind = DPC_ARG_FLAG, .dst = &a.json},
                    {.name = "coordinator", .kind = DPC_ARG_STR, .dst = &cf.coordinator},
                    {.name = "token-file", .kind = DPC_ARG_STR, .dst = &cf.token_file},
                    {.name = "tls-ca", .kind = DPC_ARG_STR, .dst = &cf.tls.ca_file},
                    {.name = "tls-cert", .kind = DPC_ARG_STR, .dst = &cf.tls.cert_file},
                    {.name = "tls-key", .kind = DPC_ARG_STR, .dst = &cf.tls.key_file},
                    {.name = "paused", .kind = DPC_ARG_FLAG, .dst = &o.paused},
                    {.name = "data-dir", .kind = DPC_ARG_STR, .dst = &o.data_dir},
                    {.name = "state", .kind = DPC_ARG_STR, .dst = &o.state},
                    {.name = "reason", .kind = DPC_ARG_STR, .dst = &o.reason},
                    {.name = "timeout", .kind = DPC_ARG_FLOAT, .dst = &o.timeout_s},
                    {.name = "poll-ms", .kind = DPC_ARG_INT, .dst = &o.poll_ms},
                    {.name = "path", .kind = DPC_ARG_INT, .dst = &o.path},
                    {.name = "out", .kind = DPC_ARG_STR, .dst = &o.out},
                    {.name = "version", .kind = DPC_ARG_LONG, .dst = &o.version},
                    {.name = "all", .kind = DPC_ARG_FLAG, .dst = &o.all},
                    {.name = "all-paths", .kind = DPC_ARG_FLAG, .dst = &o.all_paths},
                    {.name = "router", .kind = DPC_ARG_STR, .dst = &o.router},
                    {.name = "job", .kind = DPC_ARG_LONG, .dst = &o.job},
                    DPC_ARGS_END};
  char **pos = NULL;
  int npos = 0;
  if (ctl_args(a.cmd, argc - skip, argv + skip, args, &pos, &npos, &status)) return status;
  if ((status = check_flag_scope(cmd, a.cmd, args)) || (cmd->check && (status = cmd->check(&o))) ||
      (status = conn_open(&a, coordinator, &cf))) {
    free(pos);
    return status;
  }
  status = cmd->run(&a, &o, pos, npos);
  fflush(stdout);
  conn_close(&a);
  free(pos);
  return status;
}
