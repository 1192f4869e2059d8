/* ctl.h — dipacoctl, the admin and offline CLI: the commands main.c dispatches to, and the
 * pieces every command shares (ctl.c). Each command returns the process exit status (0 ok,
 * 1 runtime failure, 2 usage error; `job wait` adds 3 for a timeout).
 *
 * Map of coordinator/ctl/:
 *   main.c        global flags (--coordinator, connection flags before the command), dispatch
 *   ctl.c         usage text, ctl_args (common/args.h with the command's name), the clock
 *   offline tools (no coordinator, no gRPC):
 *     data.c      data prepare
 *     train.c     init, train, eval
 *     generate.c  generate
 *     route.c     route fit, route assign (DiPaCo routers and per-path shards)
 *     dipaco_eval.c  eval --dipaco (routed evaluation of a DiPaCo model directory),
 *                 route fit --discriminative (re-routing by each path's loss), and the
 *                 DiPaCo directory generate --dipaco samples from
 *   admin commands (gRPC client of dipaco.v1.Admin; built with DIPACO_DISTRIBUTED):
 *     admin.c     ctl_admin: the command table, the admin flags, dispatch
 *     commands.h  the admin commands' entry points (jobs.c, watch.c, plot.c, export.c, fleet.c)
 *     conn.c/.h   address, token, TLS, timeouts; the call, paging and error helpers
 *     view.c/.h   names, times, losses and jobs as text and JSON
 *     jobs.c      job create/list/show/pause/resume/cancel/wait/ledger
 *     watch.c     job watch (live view: a redrawn screen on a terminal, else plain lines)
 *     plot.c      job plot (loss per path against inner steps and bytes, as SVG)
 *     export.c    job export
 *     fleet.c     workers, paths, modules, status
 *     admin_stub.c  the ctl_admin of a build without gRPC: says what is missing
 * The offline and admin halves never call each other; what both use is ctl.c. Besides it,
 * the offline tools call dipaco_dir.c (the DiPaCo commands), and the admin commands call
 * conn.c, view.c and the core library's job specs (coordinator/jobspec.h).
 * Thread-safety: none needed (a single-threaded command-line program). */
#ifndef DPC_CTL_H
#define DPC_CTL_H

#include "common/args.h"
#include "common/clock.h"
#include "common/errors.h"

#include <stdio.h>

/* Print "dipacoctl CMD: <the last error's message>" on stderr. */
#define CTL_FAIL(cmd) fprintf(stderr, "dipacoctl %s: %s\n", cmd, dpc_errmsg())

/* The full usage text (every command), as `dipacoctl --help` prints it. */
void ctl_usage(FILE *f);

/* Parse a command's argv[0..argc) against `args` (common/args.h), naming the program
 * "dipacoctl CMD" in messages. Returns 0 when the command goes on: the positional arguments
 * are then in *pos (the caller frees the array, not the strings) and *npos. With pos NULL a
 * positional argument is a usage error. Otherwise returns 1 and sets *status to the exit
 * status the command returns at once: 0 after printing the usage for --help, 2 after a usage
 * error (message printed), 1 when out of memory. */
int ctl_args(const char *cmd, int argc, char **argv, dpc_arg *args, char ***pos, int *npos, int *status);

/* Offline tools. */
int ctl_data_prepare(int argc, char **argv);
int ctl_init(int argc, char **argv);
int ctl_train(int argc, char **argv);
int ctl_eval(int argc, char **argv);
int ctl_generate(int argc, char **argv);
int ctl_route(int argc, char **argv); /* argv[0] is "fit" or "assign" */
int ctl_eval_dipaco(int argc, char **argv); /* `eval` with --dipaco DIR */
int ctl_route_discriminative(int argc, char **argv); /* `route fit` with --discriminative */

/* Admin commands over gRPC (argv[0] is the command word: "job", "workers", ...). A build
 * without gRPC supplies a ctl_admin that explains what is missing (admin_stub.c). */
int ctl_admin(const char *coordinator, int argc, char **argv);

#endif
