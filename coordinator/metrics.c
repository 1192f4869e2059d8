/* metrics.c — the coordinator's HTTP listener (--metrics-listen HOST:PORT): a tiny HTTP/1.0
 * server on libuv TCP answering "GET /metrics" with the Prometheus text exposition format,
 * "GET /" and "GET /api/status" with the status page (statuspage.c), and 404 to anything
 * else; one response per connection, then close. Requests are bounded (8 KiB, must start
 * with a request line) and read on the loop thread like everything else.
 *
 * Every family has HELP and TYPE (promtool check metrics is clean). Series:
 *  - counters: dipaco_rounds_total, dipaco_outer_steps_total, dipaco_deltas_rejected_total,
 *    dipaco_lease_revocations_total{reason} (heartbeat, ttl, deadline, grace, disconnect),
 *    dipaco_bytes_in_total, dipaco_bytes_out_total, dipaco_pulls_total{kind},
 *    dipaco_pull_bytes_total{kind}, dipaco_blob_store_bytes_total{direction},
 *    dipaco_blob_cache_hit_bytes_total, dipaco_blob_cache_reuses_total;
 *  - histograms (coord.hist): dipaco_outer_step_seconds, dipaco_push_seconds,
 *    dipaco_pull_seconds, dipaco_lease_wait_seconds, dipaco_round_wait_seconds,
 *    dipaco_round_overhead_seconds,
 *    dipaco_delta_staleness;
 *  - gauges: dipaco_workers{state}, dipaco_active_leases, dipaco_jobs{state},
 *    dipaco_jobs_unlabeled, dipaco_blob_cache_bytes{state};
 *  - per job {job_id} (not "job": Prometheus puts its own job label on every target) — live
 *    jobs only (created, running, paused), the newest METRICS_MAX_JOBS, and per path /
 *    fragment the first METRICS_MAX_LABELS, so the label sets stay bounded:
 *    dipaco_job_info{job_id,name,algorithm} (1), dipaco_job_rounds, dipaco_job_rounds_target,
 *    dipaco_fragment_version{job_id,fragment}, dipaco_loss{job_id,path} (latest reported loss),
 *    dipaco_job_loss (mean loss of the last closed round); diloco-async jobs:
 *    dipaco_async_staleness (last applied delta), dipaco_async_staleness_max,
 *    dipaco_async_staleness_versions_total, dipaco_async_deltas_applied_total,
 *    dipaco_async_deltas_dropped_total
 *  — counted since the coordinator started; the durable per-delta record is the ledger. */
#include "coordinator/metrics.h"
#include "coordinator/s3.h"

#include "common/errors.h"
#include "common/log.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/statuspage.h"
#include "coordinator/blobwatch.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQ_MAX 8192

#define CONN_TIMEOUT_MS 5000

/* Per-job series exist for at most this many live jobs, and per-path/per-fragment series for
 * the first METRICS_MAX_LABELS paths/fragments of each: a bounded label set. */
#define METRICS_MAX_JOBS 16
#define METRICS_MAX_JOBS_S "16"
#define METRICS_MAX_LABELS 64

typedef struct {
  uv_tcp_t tcp;
  uv_timer_t timer; /* closes connections that do not finish a request in time */
  int open_handles;
  coord *c;
  char req[REQ_MAX];
  size_t n;
  int answered;
  uv_write_t wr;
  char *resp;
} conn;

typedef struct {
  char *s;
  size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
    char *s = realloc(b->s, cap);
    if (!s) return;
    b->s = s;
    b->cap = cap;
  }
}

/* "# HELP" and "# TYPE" lines of a metric family. */
static void head(sbuf *b, const char *name, const char *type, const char *help) {
  sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A histogram family without labels: cumulative buckets, +Inf, _sum, _count. */
static void fmt_hist(sbuf *b, const coord_hist *h, int which, const char *name, const char *help) {
  int n;
  const double *bounds = coord_hist_bounds(which, &n);
  head(b, name, "histogram", help);
  for (int i = 0; i < n; i++)
    sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)h->count[i]);
  sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->count[n], name,
            h->sum, name, (unsigned long long)h->count[n]);
}

/* Process counters and histograms. */
static void fmt_counters(coord *c, sbuf *b) {
  head(b, "dipaco_rounds_total", "counter", "Outer rounds closed (sync; one per fragment round).");
  sb_printf(b, "dipaco_rounds_total %llu\n", (unsigned long long)c->rounds_total);
  head(b, "dipaco_outer_steps_total", "counter", "Outer steps applied (sync rounds and async deltas).");
  sb_printf(b, "dipaco_outer_steps_total %llu\n", (unsigned long long)c->outer_steps);
  head(b, "dipaco_deltas_rejected_total", "counter",
       "PushDelta streams refused as malformed or corrupt (nothing stored).");
  sb_printf(b, "dipaco_deltas_rejected_total %llu\n", (unsigned long long)c->deltas_rejected);
  static const char *const why[REVOKE_N] = {"heartbeat", "ttl", "deadline", "grace", "disconnect"};
  head(b, "dipaco_lease_revocations_total", "counter",
       "Active leases taken from their workers: heartbeat (missed --dead-after-heartbeats heartbeats), ttl (not "
       "renewed within --lease-ttl-ms), deadline (round closed at round_timeout_s without it), grace (quorum round "
       "closed at quorum_grace_s without it), disconnect (the worker's connection closed: no Watch within "
       "--reconnect-grace-ms).");
  for (int i = 0; i < REVOKE_N; i++)
    sb_printf(b, "dipaco_lease_revocations_total{reason=\"%s\"} %llu\n", why[i], (unsigned long long)c->revocations[i]);
  head(b, "dipaco_bytes_in_total", "counter", "Tensor bytes received (deltas, uploads).");
  sb_printf(b, "dipaco_bytes_in_total %llu\n", (unsigned long long)c->bytes_in);
  head(b, "dipaco_bytes_out_total", "counter", "Tensor bytes sent (parameters, exports).");
  sb_printf(b, "dipaco_bytes_out_total %llu\n", (unsigned long long)c->bytes_out);
  static const char *const kind[3] = {"full", "replay", "momentum"};
  head(b, "dipaco_pulls_total", "counter",
       "Pulls by workers under a lease, by kind: full (a fragment's parameters), replay (one round's deltas as "
       "sent, PAYLOAD_REPLAY_ROUND or PAYLOAD_SPARSE_ROUND) or momentum (a fragment's outer momentum).");
  for (int i = 0; i < 3; i++)
    sb_printf(b, "dipaco_pulls_total{kind=\"%s\"} %llu\n", kind[i], (unsigned long long)c->pulls[i]);
  head(b, "dipaco_pull_bytes_total", "counter", "Bytes of the pulls in dipaco_pulls_total, by kind.");
  for (int i = 0; i < 3; i++)
    sb_printf(b, "dipaco_pull_bytes_total{kind=\"%s\"} %llu\n", kind[i], (unsigned long long)c->pull_bytes[i]);
  fmt_hist(b, &c->hist[HIST_OUTER_STEP], HIST_OUTER_STEP, "dipaco_outer_step_seconds",
           "Duration of an outer step (a sync round's or an applied async delta's), on the thread pool.");
  fmt_hist(b, &c->hist[HIST_PUSH], HIST_PUSH, "dipaco_push_seconds",
           "PushDelta: from a fragment's first chunk to its durable record (receive, decode, fsync, commit).");
  fmt_hist(b, &c->hist[HIST_PULL], HIST_PULL, "dipaco_pull_seconds",
           "PullFragment by a worker: from the call to its last chunk sent.");
  fmt_hist(b, &c->hist[HIST_LEASE_WAIT], HIST_LEASE_WAIT, "dipaco_lease_wait_seconds",
           "Lease calls that got a lease: time until the grant (0 when at once; else parked in the long-poll).");
  fmt_hist(b, &c->hist[HIST_ROUND_WAIT], HIST_ROUND_WAIT, "dipaco_round_wait_seconds",
           "Per closed sync round: time from its first to its last merged delta.");
  fmt_hist(b, &c->hist[HIST_ROUND_OVERHEAD], HIST_ROUND_OVERHEAD, "dipaco_round_overhead_seconds",
           "Per sync round: its last merged delta to every slot of the next round holding the new parameters.");
  fmt_hist(b, &c->hist[HIST_STALENESS], HIST_STALENESS, "dipaco_delta_staleness",
           "Staleness (versions behind) of every applied delta: 0 in a sync round; async: current - base version.");
}

/* Workers by state and the active leases. */
static void fmt_fleet(coord *c, sbuf *b) {
  store_worker *ws;
  int nw;
  int64_t now = dpc_wall_ms();
  if (store_list_workers(c->st, &ws, &nw) == 0) {
    int cnt[3] = {0, 0, 0};
    for (int i = 0; i < nw; i++) {
      int s = ws[i].state == WORKER_GONE || !lease_worker_alive(c, &ws[i], now) ? 2 : ws[i].state == WORKER_DRAINING;
      cnt[s]++;
    }
    free(ws);
    head(b, "dipaco_workers", "gauge", "Registered workers by state.");
    sb_printf(b, "dipaco_workers{state=\"active\"} %d\ndipaco_workers{state=\"draining\"} %d\n"
                 "dipaco_workers{state=\"gone\"} %d\n",
              cnt[0], cnt[1], cnt[2]);
  }
  store_lease *ls;
  int nl;
  if (store_list_active_leases(c->st, 0, &ls, &nl) == 0) {
    free(ls);
    head(b, "dipaco_active_leases", "gauge", "Leases active now (slots being trained).");
    sb_printf(b, "dipaco_active_leases %d\n", nl);
  }
  head(b, "dipaco_blob_store_up", "gauge", "1 while the blob store answers; 0 during an S3 outage (leases and outer "
       "steps wait).");
  sb_printf(b, "dipaco_blob_store_up %d\n", !blobwatch_down(c, NULL, 0, NULL));
  head(b, "dipaco_blob_store_outages_total", "counter", "Outages of the blob store since the start.");
  sb_printf(b, "dipaco_blob_store_outages_total %lld\n", (long long)c->store_health.outages);
  uint64_t sent, received;
  s3_bytes(&sent, &received);
  head(b, "dipaco_blob_store_bytes_total", "counter", "Payload bytes the coordinator sent to and received from an "
       "S3 blob store (0 with the local store).");
  sb_printf(b, "dipaco_blob_store_bytes_total{direction=\"sent\"} %llu\n", (unsigned long long)sent);
  sb_printf(b, "dipaco_blob_store_bytes_total{direction=\"received\"} %llu\n", (unsigned long long)received);
  blobs_cache_stats cs;
  blob_store_cache_stats(c->bs, &cs);
  head(b, "dipaco_blob_cache_bytes", "gauge", "Payload bytes of verified blobs the coordinator keeps in memory "
       "(an S3 store's cache, --blob-cache-mb), by state.");
  sb_printf(b, "dipaco_blob_cache_bytes{state=\"resident\"} %llu\n", (unsigned long long)cs.resident);
  sb_printf(b, "dipaco_blob_cache_bytes{state=\"filling\"} %llu\n", (unsigned long long)cs.reserved);
  sb_printf(b, "dipaco_blob_cache_bytes{state=\"spare\"} %llu\n", (unsigned long long)cs.spare);
  sb_printf(b, "dipaco_blob_cache_bytes{state=\"limit\"} %llu\n", (unsigned long long)cs.cap);
  head(b, "dipaco_blob_cache_hit_bytes_total", "counter", "Payload bytes read from the blob cache instead of the store.");
  sb_printf(b, "dipaco_blob_cache_hit_bytes_total %llu\n", (unsigned long long)cs.hit_bytes);
  head(b, "dipaco_blob_cache_reuses_total", "counter", "Cache fills that took a freed payload buffer of their length "
       "instead of fresh memory.");
  sb_printf(b, "dipaco_blob_cache_reuses_total %llu\n", (unsigned long long)cs.reuses);
}

/* A label value: backslash, double quote and newline escaped (the exposition format). */
static void label_value(sbuf *b, const char *v) {
  for (; *v; v++) {
    if (*v == '\\') sb_printf(b, "\\\\");
    else if (*v == '"') sb_printf(b, "\\\"");
    else if (*v == '\n') sb_printf(b, "\\n");
    else sb_printf(b, "%c", *v);
  }
}

/* The jobs that get per-job series: live ones (created, running, paused), the newest
 * METRICS_MAX_JOBS of them, so that the label sets stay bounded however many jobs the store
 * holds; into out[], oldest first; returns how many, *left = the live jobs left out. */
static int labeled_jobs(const coord *c, const coord_job **out, int *left) {
  int n = 0;
  *left = 0;
  for (int i = c->n_jobs - 1; i >= 0; i--) {
    const coord_job *j = c->jobs[i];
    if (j->state != JOB_CREATED && j->state != JOB_RUNNING && j->state != JOB_PAUSED) continue;
    if (n < METRICS_MAX_JOBS) out[n++] = j;
    else (*left)++;
  }
  for (int i = 0; i < n / 2; i++) {
    const coord_job *t = out[i];
    out[i] = out[n - 1 - i];
    out[n - 1 - i] = t;
  }
  return n;
}

/* Per live job: name, progress, fragment versions, path and job losses. */
static void fmt_progress(coord *c, sbuf *b, const coord_job *const *js, int nj, int left) {
  head(b, "dipaco_job_info", "gauge",
       "1 per job with per-job series: live jobs (created, running, paused), the newest " METRICS_MAX_JOBS_S ".");
  for (int i = 0; i < nj; i++) {
    sb_printf(b, "dipaco_job_info{job_id=\"%lld\",name=\"", (long long)js[i]->id);
    label_value(b, js[i]->spec.name);
    sb_printf(b, "\",algorithm=\"%s\"} 1\n", jobspec_algorithm_name(js[i]->spec.algorithm));
  }
  head(b, "dipaco_jobs_unlabeled", "gauge", "Live jobs left out of the per-job series (over the cap).");
  sb_printf(b, "dipaco_jobs_unlabeled %d\n", left);
  head(b, "dipaco_job_rounds", "gauge",
       "Rounds a job has completed: the lowest fragment version (async: deltas applied / slots).");
  sbuf ver = {0};
  for (int i = 0; i < nj; i++) {
    store_fragment *fr;
    int nf;
    if (store_list_fragments(c->st, js[i]->id, &fr, &nf) < 0) continue;
    int64_t mn = nf ? INT64_MAX : 0;
    for (int f = 0; f < nf; f++) {
      if (fr[f].version < mn) mn = fr[f].version;
      if (f < METRICS_MAX_LABELS)
        sb_printf(&ver, "dipaco_fragment_version{job_id=\"%lld\",fragment=\"%d\"} %lld\n", (long long)js[i]->id,
                  fr[f].fragment + 1, (long long)fr[f].version);
    }
    if (js[i]->spec.algorithm == JOB_ALGO_DILOCO_ASYNC && js[i]->n_slots > 0) mn /= js[i]->n_slots;
    sb_printf(b, "dipaco_job_rounds{job_id=\"%lld\"} %lld\n", (long long)js[i]->id, (long long)mn);
    free(fr);
  }
  head(b, "dipaco_job_rounds_target", "gauge", "Rounds a job's spec asks for.");
  for (int i = 0; i < nj; i++)
    sb_printf(b, "dipaco_job_rounds_target{job_id=\"%lld\"} %d\n", (long long)js[i]->id, js[i]->spec.rounds);
  head(b, "dipaco_fragment_version", "gauge", "Current parameter version of a job's fragment (first 64 per job).");
  if (ver.s) sb_printf(b, "%s", ver.s);
  free(ver.s);
  head(b, "dipaco_loss", "gauge", "Latest training loss reported on a path (first 64 paths per job; absent until known).");
  for (int i = 0; i < nj; i++)
    for (int p = 0; p < js[i]->n_paths && p < METRICS_MAX_LABELS; p++)
      if (isfinite(js[i]->path_loss[p]))
        sb_printf(b, "dipaco_loss{job_id=\"%lld\",path=\"%d\"} %.6g\n", (long long)js[i]->id, p, js[i]->path_loss[p]);
  head(b, "dipaco_job_loss", "gauge", "Mean training loss of a job's last closed round (absent until known).");
  for (int i = 0; i < nj; i++)
    if (isfinite(js[i]->last_loss))
      sb_printf(b, "dipaco_job_loss{job_id=\"%lld\"} %.6g\n", (long long)js[i]->id, js[i]->last_loss);
}

/* Per live diloco-async job: staleness and delta counters; then jobs by state. */
static void fmt_async_and_states(coord *c, sbuf *b, const coord_job *const *js, int nj) {
  head(b, "dipaco_async_staleness", "gauge", "Staleness (current - base version) of the last applied async delta.");
  for (int i = 0; i < nj; i++)
    if (js[i]->spec.algorithm == JOB_ALGO_DILOCO_ASYNC)
      sb_printf(b, "dipaco_async_staleness{job_id=\"%lld\"} %lld\n", (long long)js[i]->id, (long long)js[i]->stale_last);
  head(b, "dipaco_async_staleness_max", "gauge", "Largest staleness of an applied async delta since the start.");
  for (int i = 0; i < nj; i++)
    if (js[i]->spec.algorithm == JOB_ALGO_DILOCO_ASYNC)
      sb_printf(b, "dipaco_async_staleness_max{job_id=\"%lld\"} %lld\n", (long long)js[i]->id, (long long)js[i]->stale_max);
  head(b, "dipaco_async_staleness_versions_total", "counter",
       "Sum of the staleness of the applied async deltas (divide by dipaco_async_deltas_applied_total for the mean).");
  for (int i = 0; i < nj; i++)
    if (js[i]->spec.algorithm == JOB_ALGO_DILOCO_ASYNC)
      sb_printf(b, "dipaco_async_staleness_versions_total{job_id=\"%lld\"} %.0f\n", (long long)js[i]->id,
                js[i]->stale_sum);
  head(b, "dipaco_async_deltas_applied_total", "counter", "Async deltas applied since the coordinator started.");
  for (int i = 0; i < nj; i++)
    if (js[i]->spec.algorithm == JOB_ALGO_DILOCO_ASYNC)
      sb_printf(b, "dipaco_async_deltas_applied_total{job_id=\"%lld\"} %llu\n", (long long)js[i]->id,
                (unsigned long long)js[i]->async_applied);
  head(b, "dipaco_async_deltas_dropped_total", "counter",
       "Async deltas dropped as too stale (max_staleness) since the coordinator started.");
  for (int i = 0; i < nj; i++)
    if (js[i]->spec.algorithm == JOB_ALGO_DILOCO_ASYNC)
      sb_printf(b, "dipaco_async_deltas_dropped_total{job_id=\"%lld\"} %llu\n", (long long)js[i]->id,
                (unsigned long long)js[i]->async_dropped);
  head(b, "dipaco_jobs", "gauge", "Jobs in the store by state.");
  static const char *const names[] = {"created", "running", "paused", "finished", "canceled", "failed"};
  for (int s = 0; s < 6; s++) {
    int n = 0;
    for (int i = 0; i < c->n_jobs; i++) n += (int)c->jobs[i]->state == s;
    sb_printf(b, "dipaco_jobs{state=\"%s\"} %d\n", names[s], n);
  }
}

static void fmt_metrics(coord *c, sbuf *b) {
  const coord_job *js[METRICS_MAX_JOBS];
  int left;
  int nj = labeled_jobs(c, js, &left);
  fmt_counters(c, b);
  fmt_fleet(c, b);
  fmt_progress(c, b, js, nj, left);
  fmt_async_and_states(c, b, js, nj);
}

static void on_closed(uv_handle_t *h) {
  conn *k = h->data;
  if (--k->open_handles > 0) return;
  free(k->resp);
  free(k);
}

static void conn_close(conn *k) {
  if (!uv_is_closing((uv_handle_t *)&k->timer)) uv_close((uv_handle_t *)&k->timer, on_closed);
  if (!uv_is_closing((uv_handle_t *)&k->tcp)) uv_close((uv_handle_t *)&k->tcp, on_closed);
}

static void on_timeout(uv_timer_t *t) { conn_close(t->data); }

static void on_written(uv_write_t *w, int status) {
  (void)status;
  conn *k = w->data;
  conn_close(k);
}

static void respond(conn *k, int code, const char *ctype, const char *body, size_t blen) {
  k->answered = 1;
  uv_read_stop((uv_stream_t *)&k->tcp);
  sbuf b = {0};
  /* The page is read-only and self-contained: no script runs, nothing loads from elsewhere. */
  sb_printf(&b, "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n"
               "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
               "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n\r\n",
            code,
            code == 200   ? "OK"
            : code == 404 ? "Not Found"
            : code == 500 ? "Internal Server Error"
                          : "Bad Request",
            ctype, blen);
  if (!b.s) {
    conn_close(k);
    return;
  }
  char *all = realloc(b.s, b.n + blen + 1);
  if (!all) {
    free(b.s);
    conn_close(k);
    return;
  }
  memcpy(all + b.n, body, blen);
  k->resp = all;
  uv_buf_t buf = uv_buf_init(all, (unsigned)(b.n + blen));
  k->wr.data = k;
  if (uv_write(&k->wr, (uv_stream_t *)&k->tcp, &buf, 1, on_written) < 0) conn_close(k);
}

/* 1 if the request line is "GET path" (with or without a query string). */
static int is_get(const char *req, const char *path) {
  size_t n = strlen(path);
  return strncmp(req, "GET ", 4) == 0 && strncmp(req + 4, path, n) == 0 && (req[4 + n] == ' ' || req[4 + n] == '?');
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn *k = h->data;
  *buf = uv_buf_init(k->req + k->n, (unsigned)(REQ_MAX - 1 - k->n));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  conn *k = s->data;
  if (k->answered) return;
  if (nread < 0) {
    conn_close(k);
    return;
  }
  k->n += (size_t)nread;
  k->req[k->n] = 0;
  if (!strstr(k->req, "\r\n\r\n") && !strstr(k->req, "\n\n")) {
    if (k->n >= REQ_MAX - 1) respond(k, 400, "text/plain", "request too large\n", 18);
    return;
  }
  if (is_get(k->req, "/metrics")) {
    sbuf b = {0};
    fmt_metrics(k->c, &b);
    respond(k, 200, "text/plain; version=0.0.4", b.s ? b.s : "", b.n);
    free(b.s);
  } else if (is_get(k->req, "/") || is_get(k->req, "/index.html") || is_get(k->req, "/api/status")) {
    const int json = is_get(k->req, "/api/status");
    char *body = NULL;
    size_t n = 0;
    if ((json ? statuspage_json(k->c, &body, &n) : statuspage_html(k->c, &body, &n)) < 0)
      respond(k, 500, "text/plain", "out of memory\n", 14);
    else
      respond(k, 200, json ? "application/json" : "text/html; charset=utf-8", body, n);
    free(body);
  } else {
    respond(k, 404, "text/plain", "not found; try /, /api/status or /metrics\n", 42);
  }
}

static void on_connection(uv_stream_t *server, int status) {
  coord *c = server->data;
  if (status < 0) return;
  conn *k = calloc(1, sizeof *k);
  if (!k) return;
  k->c = c;
  uv_tcp_init(c->loop, &k->tcp);
  uv_timer_init(c->loop, &k->timer);
  k->open_handles = 2;
  k->tcp.data = k->timer.data = k;
  uv_timer_start(&k->timer, on_timeout, CONN_TIMEOUT_MS, 0);
  if (uv_accept(server, (uv_stream_t *)&k->tcp) < 0 || uv_read_start((uv_stream_t *)&k->tcp, on_alloc, on_read) < 0)
    conn_close(k);
}

int metrics_start(coord *c, const char *addr) {
  char host[256];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host)
    return dpc_err(DPC_EINVAL, "--metrics-listen %s: expected HOST:PORT", addr);
  const char *h0 = addr, *h1 = colon;
  if (*h0 == '[' && h1[-1] == ']') h0++, h1--; /* [::1]:9090 */
  memcpy(host, h0, (size_t)(h1 - h0));
  host[h1 - h0] = 0;
  int port = atoi(colon + 1);
  if (port < 0 || port > 65535) return dpc_err(DPC_EINVAL, "--metrics-listen %s: bad port", addr);
  struct sockaddr_storage sa;
  if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
      uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0)
    return dpc_err(DPC_EINVAL, "--metrics-listen %s: not an IP address", addr);
  uv_tcp_init(c->loop, &c->metrics);
  c->metrics.data = c;
  c->metrics_on = 1;
  int rc = uv_tcp_bind(&c->metrics, (const struct sockaddr *)&sa, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&c->metrics, 64, on_connection);
  if (rc < 0) return dpc_err(DPC_EIO, "--metrics-listen %s: %s", addr, uv_strerror(rc));
  struct sockaddr_storage got;
  int len = sizeof got;
  if (uv_tcp_getsockname(&c->metrics, (struct sockaddr *)&got, &len) == 0)
    DPC_INFO("metrics on http://%s:%d/metrics", host, ntohs(((struct sockaddr_in *)&got)->sin_port));
  return 0;
}

void metrics_stop(coord *c) {
  if (c->metrics_on && !uv_is_closing((uv_handle_t *)&c->metrics)) uv_close((uv_handle_t *)&c->metrics, NULL);
}
