/* main.c — dipaco-worker: flags, logging, signals; the lease loop is worker/worker.c.
 *
 * Signals: SIGTERM/SIGINT are blocked before gRPC starts any thread (GRPC.md pitfall 7). Some
 * threads exist before main() (OpenBLAS starts its pool in a constructor) and keep them
 * unblocked, so the signals also get a handler, which only writes the signal number to a
 * pipe; a signal thread reads the pipe. The first signal asks the worker to stop (a lease in
 * progress is released, RELEASE_PREEMPTED) and starts the grace period (--grace-s); a second
 * signal, or the end of the grace period, exits at once with status 1. */
#include "common/auth.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/rpc.h"
#include "worker/client.h"
#include "worker/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
    "  --slowdown X             X >= 1: each inner step takes X times as long (sleeps (X-1) times\n"
    "                           the measured step time; simulates a slower machine; default 1)\n"
    "  --token-file FILE        the cluster's join token (the coordinator's STATE/join.token;\n"
    "                           default $DIPACO_JOIN_TOKEN), presented to Register\n"
    "  --tls-ca FILE            use TLS; verify the coordinator's certificate against this CA\n"
    "  --tls-cert FILE --tls-key FILE  client certificate and key (mutual TLS)\n"
    "  --log-level L            debug, info, warn or error (default info)\n"
    "  --log-json               JSON log lines (default: when stderr is not a terminal)\n"
    "  --help                   this text\n";

static long parse_num(const char *flag, const char *s, long lo, long hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    fprintf(stderr, "dipaco-worker: %s \"%s\": expected an integer in [%ld, %ld]\n", flag, s, lo, hi);
    exit(2);
  }
  return v;
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

int main(int argc, char **argv) {
  struct worker_opts o;
  memset(&o, 0, sizeof o);
  o.backend = GPT_BACKEND_CPU;
  int log_json = -1, grace_s = 30;
  const char *token_file = NULL;
  struct rpc_tls tls = {0};
  enum dpc_log_level level = DPC_LOG_INFO;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDS_VALUE                                                                   \
  do {                                                                                \
    if (!v) {                                                                         \
      fprintf(stderr, "dipaco-worker: %s needs a value (see --help)\n", a);           \
      return 2;                                                                       \
    }                                                                                 \
    i++;                                                                              \
  } while (0)
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (!strcmp(a, "--coordinator")) {
      NEEDS_VALUE;
      o.coordinator = v;
    } else if (!strcmp(a, "--data-dir")) {
      NEEDS_VALUE;
      o.data_dir = v;
    } else if (!strcmp(a, "--backend")) {
      NEEDS_VALUE;
      if (gpt_backend_parse(v, &o.backend)) {
        fprintf(stderr, "dipaco-worker: --backend \"%s\": use cpu or cuda\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--threads")) {
      NEEDS_VALUE;
      o.threads = (int)parse_num(a, v, 0, 4096);
    } else if (!strcmp(a, "--device")) {
      NEEDS_VALUE;
      o.device = (int)parse_num(a, v, 0, 1024);
    } else if (!strcmp(a, "--precision")) {
      NEEDS_VALUE;
      if (gpt_precision_parse(v, &o.precision)) {
        fprintf(stderr, "dipaco-worker: --precision \"%s\": use fp32, tf32 or bf16\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--name")) {
      NEEDS_VALUE;
      o.name = v;
    } else if (!strcmp(a, "--labels")) {
      NEEDS_VALUE;
      o.labels = v;
    } else if (!strcmp(a, "--exit-when-done")) {
      o.exit_when_done = 1;
    } else if (!strcmp(a, "--max-chunk-bytes")) {
      NEEDS_VALUE;
      o.max_chunk_bytes = (uint32_t)parse_num(a, v, 1024, 7 << 20);
    } else if (!strcmp(a, "--poll-ms")) {
      NEEDS_VALUE;
      o.poll_ms = (uint32_t)parse_num(a, v, 1, 600000);
    } else if (!strcmp(a, "--slowdown")) {
      NEEDS_VALUE;
      char *end;
      errno = 0;
      o.slowdown = strtod(v, &end);
      if (errno || end == v || *end || !(o.slowdown >= 1.0 && o.slowdown <= 1000.0)) {
        fprintf(stderr, "dipaco-worker: --slowdown \"%s\": expected a number in [1, 1000]\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--grace-s")) {
      NEEDS_VALUE;
      grace_s = (int)parse_num(a, v, 1, 86400);
    } else if (!strcmp(a, "--log-level")) {
      NEEDS_VALUE;
      if (dpc_log_parse_level(v, &level)) {
        fprintf(stderr, "dipaco-worker: --log-level: %s\n", dpc_errmsg());
        return 2;
      }
    } else if (!strcmp(a, "--token-file")) {
      NEEDS_VALUE;
      token_file = v;
    } else if (!strcmp(a, "--tls-ca")) {
      NEEDS_VALUE;
      tls.ca_file = v;
    } else if (!strcmp(a, "--tls-cert")) {
      NEEDS_VALUE;
      tls.cert_file = v;
    } else if (!strcmp(a, "--tls-key")) {
      NEEDS_VALUE;
      tls.key_file = v;
    } else if (!strcmp(a, "--log-json")) {
      log_json = 1;
    } else {
      fprintf(stderr, "dipaco-worker: unknown flag \"%s\" (see --help)\n", a);
      return 2;
    }
#undef NEEDS_VALUE
  }
  if (!o.coordinator || !o.data_dir) {
    fprintf(stderr, "dipaco-worker: --coordinator and --data-dir are required (see --help)\n");
    return 2;
  }
  if (access(o.data_dir, R_OK | X_OK) != 0) {
    fprintf(stderr, "dipaco-worker: --data-dir %s: %s\n", o.data_dir, strerror(errno));
    return 2;
  }
  dpc_log_init("worker", log_json, level);
  int use_tls = tls.ca_file || tls.cert_file || tls.key_file;
  if (use_tls && (!tls.ca_file || !tls.cert_file != !tls.key_file)) {
    fprintf(stderr, "dipaco-worker: TLS needs --tls-ca (and --tls-cert with --tls-key for mutual TLS)\n");
    return 2;
  }
  char join[DPC_TOKEN_MAX + 1] = "";
  const char *env_tok = getenv("DIPACO_JOIN_TOKEN");
  if (token_file && dpc_token_read_file(token_file, join, sizeof join)) {
    fprintf(stderr, "dipaco-worker: --token-file: %s\n", dpc_errmsg());
    return 2;
  } else if (!token_file && env_tok && *env_tok) {
    if (strlen(env_tok) > DPC_TOKEN_MAX) {
      fprintf(stderr, "dipaco-worker: $DIPACO_JOIN_TOKEN is longer than %d bytes\n", DPC_TOKEN_MAX);
      return 2;
    }
    snprintf(join, sizeof join, "%s", env_tok);
  }
  if (wc_set_credentials(use_tls ? &tls : NULL, join[0] ? join : NULL)) {
    fprintf(stderr, "dipaco-worker: %s\n", dpc_errmsg());
    return 2;
  }
  int have_token = join[0] != 0;
  memset(join, 0, sizeof join);
  if (!have_token)
    DPC_WARN("no join token (--token-file or $DIPACO_JOIN_TOKEN): Register is refused unless the coordinator "
             "runs with --insecure-no-auth");
  o.progress = isatty(STDERR_FILENO) && log_json != 1;

  /* Before any thread exists, so that every thread (gRPC's, OpenMP's) inherits the mask. */
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
  DPC_INFO("dipaco-worker starting: coordinator %s, data %s, backend %s, threads %d", o.coordinator, o.data_dir,
           o.backend == GPT_BACKEND_CUDA ? "cuda" : "cpu", o.threads);
  int rc = worker_run(&o, sc->ctl);
  if (rc) {
    DPC_ERROR("%s", dpc_errmsg()[0] ? dpc_errmsg() : dpc_strerror(rc));
    return 1;
  }
  /* The signal thread may still wait: exit() ends it; ctl stays allocated for it. */
  return 0;
}
