/* main.c — dipaco-coordinator: flags and start-up. It parses the flags, takes the state
 * directory (lock, tokens, store, blob store, jobs), wires the layers together (coord.h's
 * callbacks and the method tables, each entry's ud = the coord), serves, runs the loop
 * (loop.c) until the graceful shutdown after SIGTERM/SIGINT, and closes everything.
 *
 * usage: dipaco-coordinator --listen ADDR --state-dir DIR [--metrics-listen ADDR]
 *          [--lease-ttl-ms N] [--heartbeat-ms N] [--dead-after-heartbeats N] [--reconnect-grace-ms N]
 *          [--worker-retention-s N]
 *          [--log-level L] [--log-json] [--blob-store s3://… (see usage) [--no-delta-puts] [--s3-put-part-mb N] [--blob-cache-mb N]]
 *          [--tls-cert FILE --tls-key FILE [--tls-ca FILE]]
 *          [--join-token-file FILE] [--admin-token-file FILE] [--insecure-no-auth]
 *
 * Tokens (common/auth.h): unless given, the join and admin tokens are STATE/join.token and
 * STATE/admin.token, created (0600, 32 random bytes in hex) at the first start and read at
 * every later one. Only their SHA-256 stays in memory (coord.keys); svc_worker.c checks
 * the join token on Register, svc.c the admin token on every Admin call. --insecure-no-auth
 * turns both checks off (session tokens of workers stay). */
#include "coordinator/admin_fleet.h"
#include "coordinator/admin_jobs.h"
#include "coordinator/admin_upload.h"
#include "coordinator/coord.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/membudget.h"
#include "coordinator/metrics.h"
#include "coordinator/pcache.h"
#include "coordinator/rounds.h"
#include "coordinator/svc.h"
#include "coordinator/svc_inner.h"
#include "coordinator/svc_put.h"
#include "coordinator/svc_pull.h"
#include "coordinator/svc_push.h"
#include "coordinator/svc_worker.h"
#include "coordinator/selfcheck.h"
#include "coordinator/testhook.h"

#include "common/args.h"
#include "common/auth.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/rpc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

/* Workers retry a dead coordinator with backoff capped at 5 s (worker/stop.c): after a
 * restart their leases and liveness get this long, plus one TTL, before anything is taken
 * from them. */
#define RESTART_GRACE_MS 10000
/* Failed self-connects in a row before the process exits (selfcheck.h). */
#define SELFCHECK_FAILS 3

typedef struct opts {
  const char *listen, *state_dir, *metrics_addr, *join_file, *admin_file;
  const char *blob_store, *s3_endpoint, *s3_region, *s3_creds, *s3_ca;
  struct rpc_tls tls;
  int json, ttl, hb, dead_hb, reconnect_ms, no_auth, use_tls, retention_s;
  int handshake_ms, idle_ms, self_check_ms, memory_budget_mb, no_delta_puts, blob_cache_mb, put_part_mb;
  enum dpc_log_level level;
} opts;

static void usage(FILE *f) {
  fprintf(f, "usage: dipaco-coordinator --listen ADDR --state-dir DIR [--metrics-listen ADDR]\n"
             "         [--lease-ttl-ms N (default 15000)] [--heartbeat-ms N (default 2000)]\n"
             "         [--dead-after-heartbeats N (default 3: a lease whose worker sent no heartbeat for\n"
             "          max(N x --heartbeat-ms, 1 s) is revoked and its slot given to another worker)]\n"
             "         [--reconnect-grace-ms N (default 1000: a worker whose connection closed loses its leases\n"
             "          after N ms unless it is back; 0 = only missed heartbeats revoke)]\n"
             "         [--worker-retention-s N (default 86400: delete workers silent that long, holding no lease)]\n"
             "         [--handshake-timeout-ms N (default 10000)] [--idle-timeout-ms N (default 300000)]\n"
             "         [--memory-budget-mb N (default: the cgroup's memory.max, else 80%% of RAM)]\n"
             "         [--self-check-ms N (default 5000; exit 70 after 3 failed self-connects in a row; 0 = off)]\n"
             "         [--log-level debug|info|warn|error] [--log-json]\n"
             "         [--tls-cert FILE --tls-key FILE [--tls-ca FILE (require client certificates)]]\n"
             "         [--join-token-file FILE] [--admin-token-file FILE] (default STATE/join.token,\n"
             "          STATE/admin.token, created 0600 at first start) [--insecure-no-auth]\n"
             "         [--blob-store s3://BUCKET[/PREFIX] --s3-endpoint http[s]://HOST[:PORT] [--s3-region R]\n"
             "          [--s3-credentials FILE (mode 0600; default AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)]\n"
             "          [--s3-ca-file FILE] [--no-delta-puts (workers stream their deltas and inner state to the\n"
             "          coordinator instead of putting them in the store)] [--s3-put-part-mb N (an object above N MiB\n"
             "          is put in parts of N MiB; 5..5120, default 1024)] [--blob-cache-mb N (memory for verified\n"
             "          parameters, momenta and deltas, read again without a GET; default a quarter of the\n"
             "          memory budget, taken from it; 0 = off)]] (default: blobs under STATE/blobs)\n");
}

static int parse_level(const char *v, void *dst) { return dpc_log_parse_level(v, dst) < 0 ? -1 : 0; }

/* A listen address: "unix:PATH", or HOST:PORT with PORT a number in [0, 65535] (0: any free
 * port). gRPC would take "127.0.0.1:99999" and bind a random port; nobody could reach it. */
static const char *bad_listen(const char *flag, const char *addr, char *msg, size_t cap) {
  if (strncmp(addr, "unix:", 5) == 0) return NULL;
  const char *colon = strrchr(addr, ':');
  const char *p = colon ? colon + 1 : "";
  long port = 0;
  int digits = 0;
  for (; *p >= '0' && *p <= '9' && port <= 65535; p++, digits++) port = port * 10 + (*p - '0');
  if (!colon || colon == addr || digits == 0 || *p || port > 65535) {
    snprintf(msg, cap, "%s %s: give HOST:PORT with PORT in 0..65535 (0 = any free port), or unix:PATH", flag, addr);
    return msg;
  }
  return NULL;
}

/* The first contradiction or bad value among the parsed flags (msg[cap] may hold it), or NULL. */
static const char *flags_problem(const opts *o, char *msg, size_t cap) {
  if (strlen(o->state_dir) > 900) return "--state-dir is too long";
  const char *bad = bad_listen("--listen", o->listen, msg, cap);
  if (!bad && o->metrics_addr) bad = bad_listen("--metrics-listen", o->metrics_addr, msg, cap);
  if (bad) return bad;
  if (o->hb >= o->ttl) {
    snprintf(msg, cap, "--heartbeat-ms %d must be below --lease-ttl-ms %d (every lease would expire between two "
             "heartbeats)", o->hb, o->ttl);
    return msg;
  }
  const int64_t gone_after = o->ttl > 3 * o->hb ? o->ttl : 3 * o->hb;
  if ((int64_t)o->retention_s * 1000 <= gone_after) {
    snprintf(msg, cap, "--worker-retention-s %d must exceed the time after which a silent worker is gone (%lld ms: "
             "max(--lease-ttl-ms, 3 x --heartbeat-ms))", o->retention_s, (long long)gone_after);
    return msg;
  }
  if (o->use_tls && (!o->tls.cert_file || !o->tls.key_file))
    return "TLS needs both --tls-cert and --tls-key (--tls-ca adds client certificates)";
  if (o->no_auth && (o->join_file || o->admin_file))
    return "--insecure-no-auth contradicts --join-token-file/--admin-token-file";
  if (o->blob_store && strncmp(o->blob_store, "s3://", 5))
    return "--blob-store: give s3://BUCKET[/PREFIX] (without it, blobs live under STATE/blobs)";
  if (o->blob_store && !o->s3_endpoint) return "--blob-store s3://… needs --s3-endpoint http[s]://HOST[:PORT]";
  if (!o->blob_store && (o->s3_endpoint || o->s3_region || o->s3_creds || o->s3_ca || o->no_delta_puts ||
                         o->blob_cache_mb >= 0 || o->put_part_mb))
    return "--s3-endpoint, --s3-region, --s3-credentials, --s3-ca-file, --no-delta-puts, --s3-put-part-mb and "
           "--blob-cache-mb need --blob-store s3://BUCKET[/PREFIX]";
  return NULL;
}

/* Fill o from argv; 0 = go on, else *exit_code is what main returns (0 after --help). */
static int parse_flags(int argc, char **argv, opts *o, int *exit_code) {
  *o = (opts){.json = -1, .ttl = 15000, .hb = 2000, .dead_hb = 3, .reconnect_ms = 1000, .retention_s = 86400,
              .handshake_ms = RPC_HANDSHAKE_TIMEOUT_DEFAULT_MS,
              .idle_ms = RPC_IDLE_TIMEOUT_DEFAULT_MS, .self_check_ms = 5000, .level = DPC_LOG_INFO,
              .blob_cache_mb = -1};
  dpc_arg args[] = {
      {.name = "listen", .kind = DPC_ARG_STR, .dst = &o->listen, .required = 1},
      {.name = "state-dir", .kind = DPC_ARG_STR, .dst = &o->state_dir, .required = 1},
      {.name = "metrics-listen", .kind = DPC_ARG_STR, .dst = &o->metrics_addr},
      {.name = "lease-ttl-ms", .kind = DPC_ARG_INT, .dst = &o->ttl, .lo = 100, .hi = 86400000},
      {.name = "heartbeat-ms", .kind = DPC_ARG_INT, .dst = &o->hb, .lo = 10, .hi = 3600000},
      {.name = "dead-after-heartbeats", .kind = DPC_ARG_INT, .dst = &o->dead_hb, .lo = 2, .hi = 1000},
      {.name = "reconnect-grace-ms", .kind = DPC_ARG_INT, .dst = &o->reconnect_ms, .lo = 0, .hi = 600000},
      {.name = "worker-retention-s", .kind = DPC_ARG_INT, .dst = &o->retention_s, .lo = 1, .hi = 315360000},
      {.name = "handshake-timeout-ms", .kind = DPC_ARG_INT, .dst = &o->handshake_ms, .lo = 100, .hi = 600000},
      {.name = "idle-timeout-ms", .kind = DPC_ARG_INT, .dst = &o->idle_ms, .lo = 1000, .hi = 86400000},
      {.name = "memory-budget-mb", .kind = DPC_ARG_INT, .dst = &o->memory_budget_mb, .lo = 1, .hi = 2147483647},
      {.name = "self-check-ms", .kind = DPC_ARG_INT, .dst = &o->self_check_ms, .lo = 0, .hi = 600000},
      {.name = "log-level", .kind = DPC_ARG_FN, .dst = &o->level, .fn = parse_level,
       .expects = "debug, info, warn or error"},
      {.name = "log-json", .kind = DPC_ARG_FLAG, .dst = &o->json},
      {.name = "tls-cert", .kind = DPC_ARG_STR, .dst = &o->tls.cert_file},
      {.name = "tls-key", .kind = DPC_ARG_STR, .dst = &o->tls.key_file},
      {.name = "tls-ca", .kind = DPC_ARG_STR, .dst = &o->tls.ca_file},
      {.name = "join-token-file", .kind = DPC_ARG_STR, .dst = &o->join_file},
      {.name = "admin-token-file", .kind = DPC_ARG_STR, .dst = &o->admin_file},
      {.name = "insecure-no-auth", .kind = DPC_ARG_FLAG, .dst = &o->no_auth},
      {.name = "blob-store", .kind = DPC_ARG_STR, .dst = &o->blob_store},
      {.name = "s3-endpoint", .kind = DPC_ARG_STR, .dst = &o->s3_endpoint},
      {.name = "s3-region", .kind = DPC_ARG_STR, .dst = &o->s3_region},
      {.name = "s3-credentials", .kind = DPC_ARG_STR, .dst = &o->s3_creds},
      {.name = "s3-ca-file", .kind = DPC_ARG_STR, .dst = &o->s3_ca},
      {.name = "no-delta-puts", .kind = DPC_ARG_FLAG, .dst = &o->no_delta_puts},
      {.name = "blob-cache-mb", .kind = DPC_ARG_INT, .dst = &o->blob_cache_mb, .lo = 0, .hi = 2147483647},
      /* S3's parts: at least 5 MiB (but the last), at most 5 GiB */
      {.name = "s3-put-part-mb", .kind = DPC_ARG_INT, .dst = &o->put_part_mb, .lo = 5, .hi = 5120},
      DPC_ARGS_END};
  int rc = dpc_args_parse("dipaco-coordinator", argc - 1, argv + 1, args, NULL, NULL);
  *exit_code = rc > 0 ? 0 : 2;
  if (rc != 0) {
    usage(rc > 0 ? stdout : stderr);
    return -1;
  }
  o->use_tls = o->tls.cert_file || o->tls.key_file || o->tls.ca_file;
  char msg[512];
  const char *bad = flags_problem(o, msg, sizeof msg);
  if (bad) {
    fprintf(stderr, "dipaco-coordinator: %s\n", bad);
    return -1;
  }
  return 0;
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
  if (rc == 0) rc = svc_token_hash(tok, hash);
  memset(tok, 0, sizeof tok);
  return rc;
}

/* The join and admin tokens' hashes into c->keys (or a warning with --insecure-no-auth). */
static int load_tokens(coord *c, const opts *o) {
  if (o->no_auth) {
    DPC_WARN("--insecure-no-auth: any client may register workers and call Admin methods");
    return 0;
  }
  int rc = load_token(o->state_dir, "join.token", o->join_file, c->keys.join);
  if (rc == 0) rc = load_token(o->state_dir, "admin.token", o->admin_file, c->keys.admin);
  if (rc < 0) {
    DPC_ERROR("tokens: %s", dpc_errmsg());
    return rc;
  }
  c->keys.has_join = c->keys.has_admin = 1;
  return 0;
}

/* One coordinator per state directory: an exclusive lock held for the process lifetime, on
 * the directory itself — a lock file could be deleted from under a running coordinator and
 * let a second one in (whose start-up sweep would delete the first one's files in flight).
 * Returns the lock's descriptor, or -1, logged: held by another process, or the directory
 * cannot be opened or written (each said as such). */
static int lock_state_dir(const char *state_dir) {
  int lock_fd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock_fd < 0) {
    DPC_ERROR("cannot open the state directory %s: %s", state_dir, strerror(errno));
    return -1;
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) < 0) {
    if (errno == EWOULDBLOCK)
      DPC_ERROR("state directory %s is in use by another dipaco-coordinator; stop it first", state_dir);
    else
      DPC_ERROR("cannot lock the state directory %s: %s", state_dir, strerror(errno));
    close(lock_fd);
    return -1;
  }
  if (access(state_dir, W_OK) != 0) {
    DPC_ERROR("the state directory %s is not writable: %s", state_dir, strerror(errno));
    close(lock_fd);
    return -1;
  }
  return lock_fd;
}

/* The blob store the flags name: files under STATE/blobs, or objects on S3. */
static int open_blobs(coord *c, const opts *o) {
  if (!o->blob_store) return blob_store_open(c->state_dir, &c->bs);
  s3_options so = {.url = o->blob_store, .endpoint = o->s3_endpoint, .region = o->s3_region,
                   .creds_file = o->s3_creds, .ca_file = o->s3_ca, .max_parts = testhook_s3_max_parts(),
                   .copy_max = (uint64_t)testhook_s3_copy_max_mb() << 20};
  int rc = blob_store_open_s3(&so, &c->bs);
  if (rc) return rc;
  DPC_INFO("blobs are objects under %s at %s", o->blob_store, o->s3_endpoint);
  /* The cache's memory comes out of the jobs' budget (membudget.h), so that both fit. */
  uint64_t cache = o->blob_cache_mb >= 0 ? (uint64_t)o->blob_cache_mb << 20
                   : c->memory_budget_bytes ? c->memory_budget_bytes / 4 : (uint64_t)1 << 30;
  if (c->memory_budget_bytes && cache >= c->memory_budget_bytes) {
    DPC_ERROR("--blob-cache-mb %llu leaves nothing of the memory budget (%llu MiB) for jobs",
              (unsigned long long)(cache >> 20), (unsigned long long)(c->memory_budget_bytes >> 20));
    return DPC_EINVAL;
  }
  if ((rc = blob_store_set_cache(c->bs, cache))) return rc;
  if (c->memory_budget_bytes) c->memory_budget_bytes -= cache;
  DPC_INFO("blob cache: %llu MiB of memory for verified blobs (memory budget for jobs now %llu MiB)",
           (unsigned long long)(cache >> 20), (unsigned long long)(c->memory_budget_bytes >> 20));
  return 0;
}

/* Store, blob store (after removing what a crash left behind) and the jobs. */
static int open_state(coord *c, const opts *o) {
  int rc = store_open(c->state_dir, &c->st);
  if (rc == 0) rc = open_blobs(c, o);
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
  return rc;
}

static void close_state(coord *c) {
  pcache_clear(c);
  coord_jobs_free(c);
  coord_notes_free(c);
  put_free_all(c);
  lease_parked_free(c);
  if (c->st) store_close(c->st);
  if (c->bs) blob_store_close(c->bs);
}

/* Every tick: the rounds' housekeeping, then the delta objects no lease will commit. */
static void tick(coord *c) {
  rounds_tick(c);
  if (!c->stopping) put_sweep(c);
}

/* Lock the state directory, load the tokens, open the state: the lock's descriptor, or -1
 * (logged; everything opened is closed again). */
static int take_state(coord *c, const opts *o) {
  if (dpc_mkdir_p(o->state_dir) < 0) {
    DPC_ERROR("cannot open the state directory %s: %s", o->state_dir, dpc_errmsg());
    return -1;
  }
  int lock_fd = lock_state_dir(o->state_dir);
  if (lock_fd < 0) return -1;
  if (load_tokens(c, o) < 0) {
    close(lock_fd);
    return -1;
  }
  if (open_state(c, o) < 0) {
    DPC_ERROR("cannot open the coordinator's state (%s%s%s): %s", o->state_dir, o->blob_store ? ", blobs at " : "",
              o->blob_store ? o->blob_store : "", dpc_errmsg());
    close_state(c);
    close(lock_fd);
    return -1;
  }
  if (admin_uploads_init(c) < 0) {
    DPC_ERROR("cannot open the coordinator's state: %s", dpc_errmsg());
    close_state(c);
    close(lock_fd);
    return -1;
  }
  return lock_fd;
}

/* Start the gRPC server with every method (ud = c), the signal watchers, the metrics
 * endpoint and the tick. 0, or -1 (logged) after the loop wound down what was started. */
/* SIGTERM/SIGINT: the listener will stop accepting on purpose. */
static void on_stop(coord *c) {
  selfcheck_stop(c->selfcheck);
  c->selfcheck = NULL;
  lease_flush_parked(c);
  lease_answer_watches(c, 1);
}

/* Open files: a coordinator holds one descriptor per connection plus its spool files, so the
 * soft limit (often 1024) is raised to the hard one (LimitNOFILE= in the unit). */
static void raise_nofile(void) {
  struct rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &r) < 0) DPC_WARN("cannot raise the open-file limit: %s", strerror(errno));
  }
}

static int serve(coord *c, const opts *o) {
  c->tick_cb = tick;
  c->wake_cb = rounds_check;
  c->stop_cb = on_stop;
  c->shutdown_cb = metrics_stop;
  /* gRPC's threads inherit this mask, so signals reach only the loop thread (unblocked
   * below after the server started). */
  loop_block_signals();
  loop_init(c);
  struct rpc_method methods[SVC_MAX_METHODS];
  int nm = svc_worker_methods(c, methods);
  nm += svc_pull_methods(c, methods + nm);
  nm += svc_push_methods(c, methods + nm);
  nm += svc_inner_methods(c, methods + nm);
  nm += svc_put_methods(c, methods + nm);
  c->delta_puts = !o->no_delta_puts;
  c->put_part_bytes = (uint64_t)(o->put_part_mb ? o->put_part_mb : 1024) << 20;
  nm += admin_upload_methods(c, methods + nm);
  nm += admin_jobs_methods(c, methods + nm);
  nm += admin_fleet_methods(c, methods + nm);
  struct rpc_server_config cfg = {.addr = o->listen, .notify = loop_notify, .notify_ud = c, .armed = 8,
                                  .tls = o->use_tls ? &o->tls : NULL, .handshake_timeout_ms = o->handshake_ms,
                                  .idle_timeout_ms = o->idle_ms};
  if (rpc_server_start(&cfg, methods, (size_t)nm, &c->srv) < 0) {
    DPC_ERROR("cannot serve gRPC on %s: %s", o->listen, dpc_errmsg());
    loop_stop_now(c);
    loop_run(c);
    return -1;
  }
  loop_watch_signals(c);
  if (selfcheck_start(o->listen, rpc_server_port(c->srv), o->self_check_ms, SELFCHECK_FAILS, &c->selfcheck) < 0)
    DPC_WARN("%s; running without the listener self-check", dpc_errmsg());
  if (o->metrics_addr && metrics_start(c, o->metrics_addr) < 0) {
    DPC_ERROR("%s", dpc_errmsg());
    loop_stop_now(c);
    loop_run(c);
    return -1;
  }
  int tick_ms = o->hb / 2 < 50 ? 50 : o->hb / 2 > 500 ? 500 : o->hb / 2;
  loop_start_tick(c, tick_ms);
  return 0;
}

/* On an S3 store: object `name` read whole by the sequential reader and checked (its crc into
 * *crc), the verified copy kept in the blob cache, so that the first outer step after a restart
 * reads θ, u and the buffer from memory instead of the store a second time. */
static int verify_object(coord *c, const char *name, blob_kind kind, size_t len, uint32_t *crc) {
  blob_reader *r;
  int rc = blob_reader_open(c->bs, name, kind, len, &r);
  if (rc) return rc;
  blob_reader_keep(r);
  for (size_t left = len * sizeof(float), k; rc == 0 && left > 0; left -= k) {
    const void *v;
    k = left < ((size_t)4 << 20) ? left : ((size_t)4 << 20);
    rc = blob_reader_view(r, k, &v);
  }
  if (rc) {
    blob_reader_abort(r);
    return rc;
  }
  return blob_reader_close(r, crc);
}

/* One blob a job needs at start-up: 0 when it reads whole with the checksum its row recorded,
 * else a DPC_E* code. Files are mapped: with keep (parameters) the verified mapping goes to the
 * parameter cache as version `version` of (job, fragment); otherwise it is released (its pages
 * stay in the page cache, not in the coordinator). Objects go to the blob cache instead (the
 * parameter cache keeps no version of an S3 store, pcache.h). */
static int verify_blob(coord *c, const char *name, blob_kind kind, size_t len, uint32_t want, int keep, int64_t job,
                       int fragment, int64_t version) {
  const float *data = NULL;
  void *map = NULL;
  size_t map_len = 0;
  uint32_t crc = 0;
  int s3 = blob_store_is_s3(c->bs);
  int rc = s3 ? verify_object(c, name, kind, len, &crc) : blob_map(c->bs, name, kind, len, 1, &data, &map, &map_len, &crc);
  if (rc == DPC_ESHAPE) rc = dpc_err(DPC_EFORMAT, "blob %s does not hold the fragment's %zu floats: %s", name, len,
                                     dpc_errmsg());
  if (rc == 0 && crc != want) {
    if (s3) blob_store_uncache(c->bs, name); /* whole, but not what the row recorded */
    rc = dpc_err(DPC_ECHECKSUM, "blob %s has checksum 0x%08x, its row recorded 0x%08x", name, crc, want);
  }
  if (rc == 0 && keep && !s3) pcache_put_map(c, job, fragment, version, data, map, map_len, len, crc);
  else if (rc == 0) blob_unmap(map, map_len);
  return rc;
}

/* Fragment f's current blobs (parameters into the parameter cache, momentum, delayed-Nesterov
 * buffer) against the checksums its row recorded. */
static int verify_fragment(coord *c, int64_t job, int f, const store_fragment *fr) {
  int rc = verify_blob(c, fr->param_blob, BLOB_PARAMS, fr->len, fr->param_crc, 1, job, f, fr->version);
  if (rc == 0 && fr->momentum_blob[0])
    rc = verify_blob(c, fr->momentum_blob, BLOB_MOMENTUM, fr->len, fr->momentum_crc, 0, 0, 0, 0);
  if (rc == 0 && fr->dnbuf_blob[0]) rc = verify_blob(c, fr->dnbuf_blob, BLOB_DN_BUF, fr->len, fr->dnbuf_crc, 0, 0, 0, 0);
  return rc;
}

/* Start-up: every running or paused job's current parameters, momentum and delayed-Nesterov
 * buffer are read back and checked against their rows. A job with a
 * corrupt or missing blob is PAUSED with the reason instead of failing its pulls and outer
 * steps over and over; the parameter mappings go to the parameter cache (on an S3 store the
 * verified copies go to the blob cache), so the first pulls and outer step after a restart
 * cost nothing more. */
static void verify_jobs(coord *c) {
  double t0 = dpc_mono_s();
  size_t floats = 0;
  for (int ji = 0; ji < c->n_jobs; ji++) {
    coord_job *j = c->jobs[ji];
    if (j->state != JOB_RUNNING && j->state != JOB_PAUSED) continue;
    store_fragment *fr = NULL;
    int nf = 0, rc = store_list_fragments(c->st, j->id, &fr, &nf);
    for (int f = 0; f < nf && rc == 0; f++) {
      rc = verify_fragment(c, j->id, f, &fr[f]);
      if (rc < 0 && rc != DPC_ENOMEM) {
        /* A sync version whose blobs are corrupt or missing is made again from the version
         * before it and the deltas its round applied, when those are intact (rounds.c). */
        char first[512];
        snprintf(first, sizeof first, "%s", dpc_errmsg());
        DPC_WARN("job %lld: fragment %d version %lld: %s; making it again", (long long)j->id, f + 1,
                 (long long)fr[f].version, first);
        rc = rounds_recompute_version(c, j, f, &fr[f]);
        if (rc == 0) rc = verify_fragment(c, j->id, f, &fr[f]);
        else rc = dpc_err(rc, "%s; %s", first, dpc_errmsg());
      }
      floats += rc == 0 ? fr[f].len : 0;
      if (rc < 0) {
        char why[768];
        snprintf(why, sizeof why, "paused at start-up: fragment %d version %lld: %s (restore %s from a backup, "
                 "then job resume; or cancel the job)", f + 1, (long long)fr[f].version, dpc_errmsg(),
                 blob_store_is_s3(c->bs) ? "the state directory and the bucket's objects" : "the state directory");
        DPC_ERROR("job %lld: %s", (long long)j->id, why);
        if (j->state == JOB_RUNNING) coord_job_set_state(c, j, JOB_PAUSED, why);
      }
    }
    free(fr);
  }
  blobs_cache_stats cs;
  blob_store_cache_stats(c->bs, &cs);
  if (floats && blob_store_is_s3(c->bs))
    DPC_INFO("recovery: verified %zu floats of job state in %.2f s; %llu bytes of it kept in the blob cache", floats,
             dpc_mono_s() - t0, (unsigned long long)cs.resident);
  else if (floats)
    DPC_INFO("recovery: verified %zu floats of job state in %.2f s", floats, dpc_mono_s() - t0);
}

/* Restart recovery: leases whose deltas are all in are finished, and rounds whose deltas
 * are all in get their outer step now. The others get one TTL from now for their workers
 * to reconnect (they could not heartbeat while this process was down). */
static void recover(coord *c) {
  verify_jobs(c);
  for (int i = 0; i < c->n_jobs; i++)
    if (c->jobs[i]->state == JOB_RUNNING) coord_job_prewarm(c, c->jobs[i]);
  lease_recover(c);
  c->started_ms = dpc_wall_ms();
  c->push_seq = c->started_ms * 1000; /* above every earlier run's attempts (≤ 1000 pushes per ms) */
  c->live_floor_ms = c->started_ms + RESTART_GRACE_MS;
  int graced = store_lease_grace(c->st, c->live_floor_ms + c->lease_ttl_ms);
  if (graced > 0)
    DPC_INFO("recovery: %d active lease(s) keep their slots for %lld ms while workers reconnect", graced,
             (long long)RESTART_GRACE_MS + (c->dead_after_ms < c->lease_ttl_ms ? c->dead_after_ms : c->lease_ttl_ms));
  else if (graced < 0) DPC_WARN("recovery: cannot extend the active leases: %s", dpc_errmsg());
  rounds_check(c);
}

static void run(coord *c, const opts *o) {
  int running = 0;
  for (int i = 0; i < c->n_jobs; i++) running += c->jobs[i]->state == JOB_RUNNING;
  DPC_INFO("dipaco-coordinator listening on %s (port %d), state %s, %d job(s) (%d running), lease ttl %d ms, "
           "heartbeat %d ms (revoked after %lld ms without), %s, %s", o->listen, rpc_server_port(c->srv), o->state_dir,
           c->n_jobs, running, o->ttl, o->hb, (long long)c->dead_after_ms,
           !o->use_tls ? "plain text (no TLS)" : o->tls.ca_file ? "mutual TLS" : "TLS",
           o->no_auth ? "NO token checks" : "join/admin tokens required");
  recover(c);
  sd_notify(0, "READY=1");
  loop_run(c);
}

int main(int argc, char **argv) {
  opts o;
  int code;
  if (parse_flags(argc, argv, &o, &code) < 0) return code;
  dpc_log_init("coordinator", o.json, o.level);
  if (testhook_init() < 0) {
    DPC_ERROR("%s", dpc_errmsg());
    return 2;
  }
  rpc_tune_malloc();
  raise_nofile();

  static coord C;
  coord *c = &C;
  snprintf(c->state_dir, sizeof c->state_dir, "%s", o.state_dir);
  c->lease_ttl_ms = o.ttl;
  c->heartbeat_ms = o.hb;
  c->dead_after_ms = lease_dead_after_ms(o.dead_hb, o.hb);
  c->reconnect_grace_ms = o.reconnect_ms;
  c->worker_retention_ms = (int64_t)o.retention_s * 1000;
  const char *budget_src = "--memory-budget-mb";
  c->memory_budget_bytes = o.memory_budget_mb ? (uint64_t)o.memory_budget_mb << 20 : membudget_default(&budget_src);
  DPC_INFO("memory budget for jobs: %llu MiB (%s)", (unsigned long long)(c->memory_budget_bytes >> 20), budget_src);
  int lock_fd = take_state(c, &o);
  if (lock_fd < 0) return 1;
  if (serve(c, &o) < 0) {
    close_state(c);
    close(lock_fd);
    return 1;
  }
  run(c, &o);
  close_state(c);
  loop_close(c);
  close(lock_fd);
  DPC_INFO("coordinator stopped cleanly");
  return 0;
}
