/* commands.h — the admin commands of dipacoctl, one entry point each, as admin.c's command
 * table calls them: jobs.c (job create/list/show/pause/resume/cancel/wait/ledger), watch.c
 * (job watch), plot.c (job plot), export.c (job export), fleet.c (workers, paths, modules,
 * status).
 *
 * Each takes the open connection (conn.h), the flag values and the positional arguments, and
 * returns the exit status: 0 ok, 1 runtime or server error, 2 usage error, 3 `job wait` timed
 * out. Output is a human table by default and one JSON document on stdout with --json; errors
 * go to stderr as "dipacoctl CMD: CODE: server message".
 * Thread-safety: none (one command, one thread). */
#ifndef DPC_CTL_COMMANDS_H
#define DPC_CTL_COMMANDS_H

#include "common/dataset.h"
#include "coordinator/ctl/conn.h"

/* The values of the command-specific flags; admin.c accepts each only where it applies. */
typedef struct {
  int paused;            /* --paused: job create */
  const char *data_dir;  /* --data-dir DIR: job create checks the data as a worker would see it;
                            paths counts each path's tokens */
  const char *state;     /* --state S: job list */
  const char *reason;    /* --reason TEXT: job pause|resume|cancel */
  float timeout_s;       /* --timeout S: job wait|watch (0 = no limit) */
  int poll_ms;           /* --poll-ms N: job wait|watch */
  int path;              /* --path P: job export (-1 = not given) */
  const char *out;       /* --out DIR: job export; --out FILE.svg: job plot */
  long version;          /* --version V: job export (0 = latest) */
  int all_paths;         /* --all-paths: job export (a DiPaCo model directory) */
  const char *router;    /* --router DIR: job export --all-paths copies it in */
  int all;               /* --all: workers */
  long job;              /* --job ID: workers */
} admin_args;

typedef int (*admin_cmd_fn)(actx *a, const admin_args *o, char **pos, int npos);

/* jobs.c */
/* Open the token stream of globs[0..n) resolved under data_dir as a worker with that
 * --data-dir would (every glob must match a file; `field` names them in errors). */
int ctl_open_data(const char *data_dir, const char *const *globs, int n, const char *field, dataset **out);
int cmd_job_create(actx *a, const admin_args *o, char **pos, int npos);
int cmd_job_list(actx *a, const admin_args *o, char **pos, int npos);
int cmd_job_show(actx *a, const admin_args *o, char **pos, int npos);
int cmd_job_pause(actx *a, const admin_args *o, char **pos, int npos);
int cmd_job_resume(actx *a, const admin_args *o, char **pos, int npos);
int cmd_job_cancel(actx *a, const admin_args *o, char **pos, int npos);
int cmd_job_wait(actx *a, const admin_args *o, char **pos, int npos);
int cmd_job_ledger(actx *a, const admin_args *o, char **pos, int npos);

/* watch.c: job watch; plot.c: job plot */
int cmd_job_watch(actx *a, const admin_args *o, char **pos, int npos);
int cmd_job_plot(actx *a, const admin_args *o, char **pos, int npos);

/* export.c. cmd_job_export_check runs before connecting: the flags export needs, and the malloc
 * tuning for a bulk transfer; it returns 0 or 2 (message printed). */
int cmd_job_export_check(const admin_args *o);
int cmd_job_export(actx *a, const admin_args *o, char **pos, int npos);

/* fleet.c */
int cmd_workers(actx *a, const admin_args *o, char **pos, int npos);
int cmd_paths(actx *a, const admin_args *o, char **pos, int npos);
int cmd_modules(actx *a, const admin_args *o, char **pos, int npos);
int cmd_status(actx *a, const admin_args *o, char **pos, int npos);

#endif
