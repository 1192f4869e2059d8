/* main.c — dipaco-coordinator: flags, start-up (state directory, store, blob store, jobs),
 * the libuv loop that owns all state (gRPC completions via uv_async, housekeeping timer,
 * signals, metrics endpoint), systemd notification, and the graceful shutdown on SIGTERM/
 * SIGINT: stop accepting work, let thread-pool work (delta fsyncs, outer steps) finish, stop
 * the gRPC server with a grace period, close the store, exit 0.
 *
 * usage: dipaco-coordinator --listen ADDR --state-dir DIR [--metrics-listen ADDR]
 *          [--lease-ttl-ms N] [--heartbeat-ms N] [--log-level L] [--log-json]
 *          [--tls-cert FILE --tls-key FILE [--tls-ca FILE]]
 *          [--join-token-file FILE] [--admin-token-file FILE] [--insecure-no-auth]
 *
 * Tokens (common/auth.h): unless given, the join and admin tokens are STATE/join.token and
 * STATE/admin.token, created (0600, 32 random bytes in hex) at the first start and read at
 * every later one. Only their SHA-256 stays in memory (dpc_coord_keys); service.c checks the
 * join token on Register, admin.c the admin token on every Admin call. --insecure-no-auth
 * turns both checks off (session tokens of workers stay). */
#include "coordinator/coord.h"
#include "coordinator/testhook.h"

#include "common/auth.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#define SHUTDOWN_GRACE_MS 3000
/* Workers retry a dead coordinator with backoff capped at 5 s (worker/worker.c): after a
 * restart their leases and liveness get this long, plus one TTL, before anything is taken
 * from them. */
#define RESTART_GRACE_MS 10000

static void usage(FILE *f) {
  fprintf(f, "usage: dipaco-coordinator --listen ADDR --state-dir DIR [--metrics-listen ADDR]\n"
             "         [--lease-ttl-ms N (default 15000)] [--heartbeat-ms N (default 2000)]\n"
             "         [--log-level debug|info|warn|error] [--log-json]\n"
             "         [--tls-cert FILE --tls-key FILE [--tls-ca FILE (require client certificates)]]\n"
             "         [--join-token-file FILE] [--admin-token-file FILE] (default STATE/join.token,\n"
             "          STATE/admin.token, created 0600 at first start) [--insecure-no-auth]\n");
}

static void close_handle(uv_handle_t *h) {
  if (h->loop && !uv_is_closing(h)) uv_close(h, NULL);
}

static void maybe_shutdown(coord *c) {
  if (!c->stopping || c->work_inflight > 0 || c->shut_started) return;
  c->shut_started = 1;
  DPC_INFO("in-flight work done; stopping the gRPC server (grace %d ms)", SHUTDOWN_GRACE_MS);
  rpc_server_stop(c->srv, SHUTDOWN_GRACE_MS);
  c->srv = NULL;
  close_handle((uv_handle_t *)&c->async);
  close_handle((uv_handle_t *)&c->tick);
  close_handle((uv_handle_t *)&c->sigterm);
  close_handle((uv_handle_t *)&c->sigint);
  metrics_stop(c);
}

int coord_queue_work(coord *c, uv_work_t *req, uv_work_cb work, uv_after_work_cb after) {
  int rc = uv_queue_work(c->loop, req, work, after);
  if (rc < 0) return dpc_err(DPC_EINTERNAL, "uv_queue_work: %s", uv_strerror(rc));
  c->work_inflight++;
  return 0;
}

void coord_work_done(coord *c) {
  c->work_inflight--;
  maybe_shutdown(c);
}

static void on_async(uv_async_t *a) {
  coord *c = a->data;
  if (c->srv) rpc_server_dispatch(c->srv);
}

static void notify(void *ud) { uv_async_send(ud); }

static void on_tick(uv_timer_t *t) { sched_tick(t->data); }

static void on_signal(uv_signal_t *s, int signum) {
  coord *c = s->data;
  if (c->stopping) return;
  DPC_INFO("%s received: shutting down (%d work item(s) in flight)", signum == SIGTERM ? "SIGTERM" : "SIGINT",
           c->work_inflight);
  c->stopping = 1;
  sd_notify(0, "STOPPING=1");
  if (c->srv) rpc_server_set_health(c->srv, "", 0);
  uv_timer_stop(&c->tick);
  coord_retry_parked(c, 1);
  maybe_shutdown(c);
}

/* The SHA-256 of the token in `given`, or in STATE/<name> (created when missing). */
static int load_token(const char *state_dir, const char *name, const char *given, unsigned char hash[DPC_TOKEN_HASH]) {
  char path[1100], tok[DPC_TOKEN_MAX + 1];
  int rc;
  if (given) {
    rc = dpc_token_read_file(given, tok, sizeof tok);
  } else {
    snprintf(path, sizeof path, "%s/%s", state_dir, name);
    rc = dpc_token_read_file(path, tok, sizeof tok);
    if (rc == DPC_ENOENT) {
      rc = dpc_token_create_file(path, tok, sizeof tok);
      if (rc == 0) DPC_INFO("created %s (0600): pass it to %s", path,
                            strcmp(name, "join.token") ? "dipacoctl --token-file" : "dipaco-worker --token-file");
    }
  }
  if (rc == 0) {
    unsigned int n = 0;
    if (!EVP_Digest(tok, strlen(tok), hash, &n, EVP_sha256(), NULL) || n != DPC_TOKEN_HASH)
      rc = dpc_err(DPC_EINTERNAL, "SHA-256 failed");
  }
  memset(tok, 0, sizeof tok);
  return rc;
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out) {
  char *end;
  long x = strtol(v, &end, 10);
  if (*end || end == v || x < lo || x > hi) {
    fprintf(stderr, "dipaco-coordinator: %s %s: expected an integer in [%d, %d]\n", flag, v, lo, hi);
    return -1;
  }
  *out = (int)x;
  return 0;
}

int main(int argc, char **argv) {
  const char *listen = NULL, *state_dir = NULL, *metrics_addr = NULL, *level_s = "info";
  const char *join_file = NULL, *admin_file = NULL;
  struct rpc_tls tls = {0};
  int json = -1, ttl = 15000, hb = 2000, no_auth = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--log-json")) {
      json = 1;
      continue;
    } else if (!strcmp(a, "--insecure-no-auth")) {
      no_auth = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "dipaco-coordinator: %s needs a value (or is unknown)\n", a);
      usage(stderr);
      return 2;
    }
    if (!strcmp(a, "--listen")) listen = v;
    else if (!strcmp(a, "--state-dir")) state_dir = v;
    else if (!strcmp(a, "--metrics-listen")) metrics_addr = v;
    else if (!strcmp(a, "--log-level")) level_s = v;
    else if (!strcmp(a, "--tls-cert")) tls.cert_file = v;
    else if (!strcmp(a, "--tls-key")) tls.key_file = v;
    else if (!strcmp(a, "--tls-ca")) tls.ca_file = v;
    else if (!strcmp(a, "--join-token-file")) join_file = v;
    else if (!strcmp(a, "--admin-token-file")) admin_file = v;
    else if (!strcmp(a, "--lease-ttl-ms")) {
      if (parse_int(a, v, 100, 86400000, &ttl)) return 2;
    } else if (!strcmp(a, "--heartbeat-ms")) {
      if (parse_int(a, v, 10, 3600000, &hb)) return 2;
    } else {
      fprintf(stderr, "dipaco-coordinator: unknown flag %s\n", a);
      usage(stderr);
      return 2;
    }
    i++;
  }
  enum dpc_log_level level;
  if (dpc_log_parse_level(level_s, &level) < 0) {
    fprintf(stderr, "dipaco-coordinator: --log-level %s: expected debug, info, warn or error\n", level_s);
    return 2;
  }
  if (!listen || !state_dir) {
    fprintf(stderr, "dipaco-coordinator: --listen and --state-dir are required\n");
    usage(stderr);
    return 2;
  }
  if (strlen(state_dir) > 900) {
    fprintf(stderr, "dipaco-coordinator: --state-dir is too long\n");
    return 2;
  }
  int use_tls = tls.cert_file || tls.key_file || tls.ca_file;
  if (use_tls && (!tls.cert_file || !tls.key_file)) {
    fprintf(stderr, "dipaco-coordinator: TLS needs both --tls-cert and --tls-key "
                    "(--tls-ca adds client certificates)\n");
    return 2;
  }
  if (no_auth && (join_file || admin_file)) {
    fprintf(stderr, "dipaco-coordinator: --insecure-no-auth contradicts --join-token-file/--admin-token-file\n");
    return 2;
  }
  dpc_log_init("coordinator", json, level);
  if (testhook_init() < 0) {
    DPC_ERROR("%s", dpc_errmsg());
    return 2;
  }
  rpc_tune_malloc();

  static coord C;
  coord *c = &C;
  g_coord = c;
  snprintf(c->state_dir, sizeof c->state_dir, "%s", state_dir);
  c->lease_ttl_ms = ttl;
  c->heartbeat_ms = hb;
  int rc = dpc_mkdir_p(state_dir);
  /* One coordinator per state directory: an exclusive lock held for the process lifetime. */
  char lock_path[1100];
  snprintf(lock_path, sizeof lock_path, "%s/coordinator.lock", state_dir);
  int lock_fd = rc == 0 ? open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
  if (rc == 0 && (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) < 0)) {
    DPC_ERROR("state directory %s is in use by another dipaco-coordinator (lock %s); stop it first", state_dir,
              lock_path);
    if (lock_fd >= 0) close(lock_fd);
    return 1;
  }
  if (rc == 0 && !no_auth) {
    rc = load_token(state_dir, "join.token", join_file, dpc_coord_keys.join);
    if (rc == 0) rc = load_token(state_dir, "admin.token", admin_file, dpc_coord_keys.admin);
    if (rc < 0) {
      DPC_ERROR("tokens: %s", dpc_errmsg());
      close(lock_fd);
      return 1;
    }
    dpc_coord_keys.has_join = dpc_coord_keys.has_admin = 1;
  } else if (rc == 0) {
    DPC_WARN("--insecure-no-auth: any client may register workers and call Admin methods");
  }
  if (rc == 0) rc = store_open(state_dir, &c->st);
  if (rc == 0) rc = blob_store_open(state_dir, &c->bs);
  if (rc == 0) {
    /* A crash mid-write leaves a blob's temp file behind (never a half blob under its name),
     * and one between a blob's rename and its row's commit (or garbage collection's commit
     * and its unlinks) a file no row names: both go now, before anything is served. */
    char **keep = NULL;
    int nkeep = 0, temps = 0, orphans = 0;
    rc = store_blob_names(c->st, &keep, &nkeep);
    if (rc == 0) rc = blob_store_sweep(c->bs, keep, nkeep, &temps, &orphans);
    store_names_free(keep, nkeep);
    if (temps || orphans)
      DPC_INFO("recovery: removed %d unfinished blob temp file(s) and %d blob(s) no row references", temps, orphans);
  }
  if (rc == 0) rc = coord_jobs_load(c);
  if (rc < 0) {
    DPC_ERROR("cannot open the state directory %s: %s", state_dir, dpc_errmsg());
    if (c->st) store_close(c->st);
    if (c->bs) blob_store_close(c->bs);
    return 1;
  }
  admin_init_uploads(c);

  /* gRPC's threads inherit this mask, so signals reach only the loop thread (unblocked
   * below after the server started). */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  c->loop = uv_default_loop();
  uv_async_init(c->loop, &c->async, on_async);
  c->async.data = c;
  int nm = coord_service_n_methods + coord_admin_n_methods;
  struct rpc_method *methods = calloc((size_t)nm, sizeof *methods);
  if (!methods) return 1;
  memcpy(methods, coord_service_methods, (size_t)coord_service_n_methods * sizeof *methods);
  memcpy(methods + coord_service_n_methods, coord_admin_methods, (size_t)coord_admin_n_methods * sizeof *methods);
  struct rpc_server_config cfg = {.addr = listen, .notify = notify, .notify_ud = &c->async, .armed = 8,
                                  .tls = use_tls ? &tls : NULL};
  rc = rpc_server_start(&cfg, methods, (size_t)nm, &c->srv);
  free(methods);
  if (rc < 0) {
    DPC_ERROR("cannot serve gRPC on %s: %s", listen, dpc_errmsg());
    uv_close((uv_handle_t *)&c->async, NULL);
    uv_run(c->loop, UV_RUN_DEFAULT);
    store_close(c->st);
    blob_store_close(c->bs);
    return 1;
  }
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  uv_signal_init(c->loop, &c->sigterm);
  uv_signal_init(c->loop, &c->sigint);
  c->sigterm.data = c->sigint.data = c;
  uv_signal_start(&c->sigterm, on_signal, SIGTERM);
  uv_signal_start(&c->sigint, on_signal, SIGINT);
  if (metrics_addr && metrics_start(c, metrics_addr) < 0) {
    DPC_ERROR("%s", dpc_errmsg());
    c->stopping = 1;
    maybe_shutdown(c);
    uv_run(c->loop, UV_RUN_DEFAULT);
    store_close(c->st);
    blob_store_close(c->bs);
    return 1;
  }
  uv_timer_init(c->loop, &c->tick);
  c->tick.data = c;
  int tick_ms = hb / 2 < 50 ? 50 : hb / 2 > 500 ? 500 : hb / 2;
  uv_timer_start(&c->tick, on_tick, (uint64_t)tick_ms, (uint64_t)tick_ms);

  int running = 0;
  for (int i = 0; i < c->n_jobs; i++) running += c->jobs[i]->state == JOB_RUNNING;
  DPC_INFO("dipaco-coordinator listening on %s (port %d), state %s, %d job(s) (%d running), lease ttl %d ms, "
           "heartbeat %d ms, %s, %s", listen, rpc_server_port(c->srv), state_dir, c->n_jobs, running, ttl, hb,
           !use_tls ? "plain text (no TLS)" : tls.ca_file ? "mutual TLS" : "TLS",
           no_auth ? "NO token checks" : "join/admin tokens required");
  /* Restart recovery: leases whose deltas are all in are finished, and rounds whose deltas
   * are all in get their outer step now. The others get one TTL from now for their workers
   * to reconnect (they could not heartbeat while this process was down). */
  sched_recover_leases(c);
  c->started_ms = coord_now_ms();
  c->live_floor_ms = c->started_ms + RESTART_GRACE_MS;
  int graced = store_lease_grace(c->st, c->live_floor_ms + c->lease_ttl_ms);
  if (graced > 0)
    DPC_INFO("recovery: %d active lease(s) keep their slots for %d ms while workers reconnect", graced,
             RESTART_GRACE_MS + c->lease_ttl_ms);
  else if (graced < 0) DPC_WARN("recovery: cannot extend the active leases: %s", dpc_errmsg());
  sched_check_rounds(c);
  sd_notify(0, "READY=1");

  uv_run(c->loop, UV_RUN_DEFAULT);

  pcache_clear(c);
  for (int i = 0; i < c->n_jobs; i++) coord_job_free(c->jobs[i]);
  free(c->jobs);
  free(c->notes);
  store_close(c->st);
  blob_store_close(c->bs);
  uv_loop_close(c->loop);
  close(lock_fd);
  DPC_INFO("coordinator stopped cleanly");
  return 0;
}
