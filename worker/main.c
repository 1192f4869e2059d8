/* main.c — dipaco-worker: flags (a common/args.h table), logging, credentials, signals; the
 * lease loop is worker/worker.c (map in worker.h).
 *
 * Signals: SIGTERM/SIGINT are blocked before gRPC starts any thread, which inherits the mask. Some
 * threads exist before main() (OpenBLAS starts its pool in a constructor) and keep them
 * unblocked, so the signals also get a handler, which only writes the signal number to a
 * pipe; a signal thread reads the pipe. The first signal asks the worker to stop (a lease in
 * training is finished and pushed if it should be done within --drain-finish-s, else released,
 * RELEASE_DRAINING, or its partial delta pushed) and starts the grace period (--grace-s); a second
 * signal, or the end of the grace period, exits at once with status 1.
 *
 * --health-listen serves only grpc.health.v1.Health/Check (the rpc layer's, answered on its
 * pump thread): the process and its gRPC core are alive, for liveness probes. */
#include "common/args.h"
#include "common/auth.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/rpc.h"
#include "worker/client.h"
#include "worker/storeget.h"
#include "worker/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: dipaco-worker --coordinator HOST:PORT --data-dir DIR [options]\n"
    "\n"
    "Registers with a dipaco coordinator, leases training slots, trains and pushes deltas.\n"
    "\n"
    "  --coordinator HOST:PORT  coordinator address (required)\n"
    "  --data-dir DIR           root of the job's data paths (required)\n"
    "  --backend cpu|cuda       compute backend (default cpu)\n"
    "  --threads N              CPU threads, 0 = all cores (default 0)\n"
    "  --device N               CUDA device ordinal (default 0)\n"
    "  --precision P            CUDA matrix products: fp32 (exact, default), tf32 or bf16\n"
    "  --name NAME              name shown by the coordinator (default: host name)\n"
    "  --labels K=V,...         free-form labels for scheduling and display\n"
    "  --exit-when-done         exit 0 when no work is left once a job was seen running\n"
    "  --max-chunk-bytes N      largest chunk payload sent or asked for (default 4193280)\n"
    "  --poll-ms N              Lease long-poll wait (default 5000)\n"
    "  --grace-s N              after SIGTERM, exit within N seconds (default 30)\n"
    "  --drain-finish-s S       after SIGTERM, finish the lease in training if its remaining inner\n"
    "                           steps should take at most S s at the measured speed, push it,\n"
    "                           then exit (default: 10 or half of --grace-s, the smaller; 0: stop\n"
    "                           after the current step)\n"
    "  --slowdown X             X >= 1: each inner step takes X times as long (sleeps (X-1) times\n"
    "                           the measured step time; simulates a slower machine; default 1)\n"
    "  --min-step-ms N          each inner step takes at least N ms (sleeps the rest; a device of\n"
    "                           a fixed speed, independent of the load on this machine; default 0)\n"
    "  --token-file FILE        the cluster's join token (the coordinator's STATE/join.token;\n"
    "                           default $DIPACO_JOIN_TOKEN), presented to Register\n"
    "  --tls-ca FILE            use TLS; verify the coordinator's certificate against this CA\n"
    "  --tls-cert FILE --tls-key FILE  client certificate and key (mutual TLS)\n"
    "  --s3-ca-file FILE        verify an https object store's certificate (the presigned URLs of\n"
    "                           leases on an S3 store) against this CA bundle (default: the system's)\n"
    "  --health-listen HOST:PORT  serve grpc.health.v1.Health/Check there (SERVING while the\n"
    "                           worker runs), e.g. for a Kubernetes gRPC liveness probe; or unix:PATH\n"
    "  --log-level L            debug, info, warn or error (default info)\n"
    "  --log-json               JSON log lines (default: when stderr is not a terminal)\n"
    "  --help                   this text\n";

static int parse_backend(const char *v, void *dst) { return gpt_backend_parse(v, dst) ? -1 : 0; }
static int parse_precision(const char *v, void *dst) { return gpt_precision_parse(v, dst) ? -1 : 0; }
static int parse_level(const char *v, void *dst) { return dpc_log_parse_level(v, dst) ? -1 : 0; }

/* What main() reads from the command line besides the worker's own settings. */
struct cli {
  struct worker_opts o;
  int log_json; /* -1: when stderr is not a terminal */
  int grace_s;
  const char *token_file;
  const char *health_listen;
  const char *s3_ca_file;
  struct rpc_tls tls;
  enum dpc_log_level level;
};

/* Parse argv into *c. 0: go on; otherwise the exit status (0 after --help, 2 on a usage error,
 * the message printed). */
static int parse_flags(int argc, char **argv, struct cli *c) {
  struct worker_opts *o = &c->o;
  dpc_arg args[] = {
      {.name = "coordinator", .kind = DPC_ARG_STR, .dst = &o->coordinator, .required = 1},
      {.name = "data-dir", .kind = DPC_ARG_STR, .dst = &o->data_dir, .required = 1},
      {.name = "backend", .kind = DPC_ARG_FN, .dst = &o->backend, .fn = parse_backend, .expects = "cpu or cuda"},
      {.name = "threads", .kind = DPC_ARG_INT, .dst = &o->threads, .lo = 0, .hi = 4096},
      {.name = "device", .kind = DPC_ARG_INT, .dst = &o->device, .lo = 0, .hi = 1024},
      {.name = "precision", .kind = DPC_ARG_FN, .dst = &o->precision, .fn = parse_precision,
       .expects = "fp32, tf32 or bf16"},
      {.name = "name", .kind = DPC_ARG_STR, .dst = &o->name},
      {.name = "labels", .kind = DPC_ARG_STR, .dst = &o->labels},
      {.name = "exit-when-done", .kind = DPC_ARG_FLAG, .dst = &o->exit_when_done},
      {.name = "max-chunk-bytes", .kind = DPC_ARG_U32, .dst = &o->max_chunk_bytes, .lo = 1024, .hi = 7 << 20},
      {.name = "poll-ms", .kind = DPC_ARG_U32, .dst = &o->poll_ms, .lo = 1, .hi = 600000},
      {.name = "slowdown", .kind = DPC_ARG_DOUBLE, .dst = &o->slowdown, .lo = 1, .hi = 1000},
      {.name = "min-step-ms", .kind = DPC_ARG_DOUBLE, .dst = &o->min_step_ms, .lo = 0, .hi = 3600000},
      {.name = "grace-s", .kind = DPC_ARG_INT, .dst = &c->grace_s, .lo = 1, .hi = 86400},
      {.name = "drain-finish-s", .kind = DPC_ARG_DOUBLE, .dst = &o->drain_finish_s, .lo = 0, .hi = 86400},
      {.name = "log-level", .kind = DPC_ARG_FN, .dst = &c->level, .fn = parse_level,
       .expects = "debug, info, warn or error"},
      {.name = "token-file", .kind = DPC_ARG_STR, .dst = &c->token_file},
      {.name = "tls-ca", .kind = DPC_ARG_STR, .dst = &c->tls.ca_file},
      {.name = "tls-cert", .kind = DPC_ARG_STR, .dst = &c->tls.cert_file},
      {.name = "tls-key", .kind = DPC_ARG_STR, .dst = &c->tls.key_file},
      {.name = "health-listen", .kind = DPC_ARG_STR, .dst = &c->health_listen},
      {.name = "s3-ca-file", .kind = DPC_ARG_STR, .dst = &c->s3_ca_file},
      {.name = "log-json", .kind = DPC_ARG_FLAG, .dst = &c->log_json},
      DPC_ARGS_END,
  };
  int r = dpc_args_parse("dipaco-worker", argc - 1, argv + 1, args, NULL, NULL);
  if (r == 1) {
    fputs(usage, stdout);
    return 0;
  }
  if (r < 0) return 2;
  if (o->drain_finish_s < 0) {
    o->drain_finish_s = c->grace_s / 2.0 < 10 ? c->grace_s / 2.0 : 10;
  } else if (o->drain_finish_s >= c->grace_s) {
    fprintf(stderr, "dipaco-worker: --drain-finish-s %g must be below --grace-s %d (the push and the release "
            "come after the steps, within the grace period)\n", o->drain_finish_s, c->grace_s);
    return 2;
  }
  if (storehttp_set_ca_file(c->s3_ca_file)) {
    fprintf(stderr, "dipaco-worker: %s\n", dpc_errmsg());
    return 2;
  }
  if (access(o->data_dir, R_OK | X_OK) != 0) {
    fprintf(stderr, "dipaco-worker: --data-dir %s: %s\n", o->data_dir, strerror(errno));
    return 2;
  }
  return -1;
}

/* Static so that the control block stays reachable (LeakSanitizer) while the signal thread
 * may still use it at exit. */
static struct sig_ctx {
  sigset_t set;
  worker_ctl *ctl;
  int grace_s;
  int pipe[2];
} g_sig = {.pipe = {-1, -1}};

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  ssize_t w = write(g_sig.pipe[1], &b, 1);
  (void)w;
  errno = saved;
}

static void *signal_main(void *arg) {
  struct sig_ctx *s = arg;
  unsigned char sig = 0;
  while (read(s->pipe[0], &sig, 1) != 1) {
  }
  DPC_INFO("received %s: stopping (grace period %d s)", sig == SIGTERM ? "SIGTERM" : "SIGINT", s->grace_s);
  worker_stop(s->ctl);
  struct pollfd pf = {.fd = s->pipe[0], .events = POLLIN};
  int64_t end_ms = (int64_t)time(NULL) * 1000 + (int64_t)s->grace_s * 1000;
  int r;
  do {
    int64_t left = end_ms - (int64_t)time(NULL) * 1000;
    r = poll(&pf, 1, left > 0 ? (int)left : 0);
  } while (r < 0 && errno == EINTR);
  if (r > 0) DPC_ERROR("second signal: exiting now");
  else DPC_ERROR("grace period of %d s over: exiting now", s->grace_s);
  _exit(1);
  return NULL;
}

/* TLS settings and the join token (--token-file, else $DIPACO_JOIN_TOKEN) for every later
 * connection. 0, or 2 with the message printed. */
static int set_credentials(const struct cli *c) {
  const struct rpc_tls *tls = &c->tls;
  int use_tls = tls->ca_file || tls->cert_file || tls->key_file;
  if (use_tls && (!tls->ca_file || !tls->cert_file != !tls->key_file)) {
    fprintf(stderr, "dipaco-worker: TLS needs --tls-ca (and --tls-cert with --tls-key for mutual TLS)\n");
    return 2;
  }
  char join[DPC_TOKEN_MAX + 1] = "";
  const char *env_tok = getenv("DIPACO_JOIN_TOKEN");
  if (c->token_file && dpc_token_read_file(c->token_file, join, sizeof join)) {
    fprintf(stderr, "dipaco-worker: --token-file: %s\n", dpc_errmsg());
    return 2;
  } else if (!c->token_file && env_tok && *env_tok) {
    if (strlen(env_tok) > DPC_TOKEN_MAX) {
      fprintf(stderr, "dipaco-worker: $DIPACO_JOIN_TOKEN is longer than %d bytes\n", DPC_TOKEN_MAX);
      return 2;
    }
    snprintf(join, sizeof join, "%s", env_tok);
  }
  if (wc_set_credentials(use_tls ? tls : NULL, join[0] ? join : NULL)) {
    fprintf(stderr, "dipaco-worker: %s\n", dpc_errmsg());
    return 2;
  }
  int have_token = join[0] != 0;
  memset(join, 0, sizeof join);
  if (!have_token)
    DPC_WARN("no join token (--token-file or $DIPACO_JOIN_TOKEN): Register is refused unless the coordinator "
             "runs with --insecure-no-auth");
  return 0;
}

/* Block SIGTERM/SIGINT, install the pipe-writing handler and start the signal thread (see the
 * top of this file). Call before any thread exists, so that every thread (gRPC's, OpenMP's)
 * inherits the mask. 0, or 1 with the message printed. */
static int start_signal_thread(int grace_s) {
  struct sig_ctx *sc = &g_sig;
  sc->grace_s = grace_s;
  if (pipe2(sc->pipe, O_CLOEXEC) != 0) {
    fprintf(stderr, "dipaco-worker: pipe: %s\n", strerror(errno));
    return 1;
  }
  sigemptyset(&sc->set);
  sigaddset(&sc->set, SIGTERM);
  sigaddset(&sc->set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sc->set, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigfillset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  rpc_tune_malloc();
  if (worker_ctl_create(&sc->ctl)) {
    fprintf(stderr, "dipaco-worker: %s\n", dpc_errmsg());
    return 1;
  }
  pthread_t sth;
  if (pthread_create(&sth, NULL, signal_main, sc) != 0) {
    fprintf(stderr, "dipaco-worker: cannot start the signal thread\n");
    return 1;
  }
  pthread_detach(sth);
  return 0;
}

int main(int argc, char **argv) {
  struct cli c = {.o = {.backend = GPT_BACKEND_CPU, .drain_finish_s = -1}, .log_json = -1, .grace_s = 30, .level = DPC_LOG_INFO};
  int st = parse_flags(argc, argv, &c);
  if (st >= 0) return st;
  dpc_log_init("worker", c.log_json, c.level);
  if ((st = set_credentials(&c))) return st;
  c.o.progress = isatty(STDERR_FILENO) && c.log_json != 1;
  if ((st = start_signal_thread(c.grace_s))) return st;
  /* Started after the signal thread: gRPC's threads inherit the blocked SIGTERM/SIGINT. */
  struct rpc_server *health = NULL;
  if (c.health_listen) {
    struct rpc_server_config hc = {.addr = c.health_listen};
    if (rpc_server_start(&hc, NULL, 0, &health)) {
      fprintf(stderr, "dipaco-worker: --health-listen %s: %s\n", c.health_listen, dpc_errmsg());
      return 2;
    }
    DPC_INFO("health service (grpc.health.v1) on %s", c.health_listen);
  }
  const struct worker_opts *o = &c.o;
  DPC_INFO("dipaco-worker starting: coordinator %s, data %s, backend %s, threads %d", o->coordinator, o->data_dir,
           o->backend == GPT_BACKEND_CUDA ? "cuda" : "cpu", o->threads);
  int rc = worker_run(o, g_sig.ctl);
  rpc_server_stop(health, 0);
  if (rc) {
    DPC_ERROR("%s", dpc_errmsg()[0] ? dpc_errmsg() : dpc_strerror(rc));
    return 1;
  }
  /* The signal thread may still wait: exit() ends it; ctl stays allocated for it. */
  return 0;
}
