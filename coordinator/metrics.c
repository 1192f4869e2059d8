/* metrics.c — the coordinator's Prometheus endpoint: a tiny HTTP/1.0 server on libuv TCP
 * (--metrics-listen HOST:PORT) answering "GET /metrics" with the text exposition format and
 * 404 to anything else; one response per connection, then close. Requests are bounded
 * (8 KiB, must start with a request line) and read on the loop thread like everything else.
 *
 * Series: dipaco_rounds_total, dipaco_outer_steps_total, dipaco_deltas_rejected_total,
 * dipaco_lease_revocations_total{reason} (heartbeat, ttl, deadline, grace, disconnect),
 * dipaco_round_wait_seconds (histogram: first to last merged delta of each closed sync round),
 * dipaco_bytes_in_total,
 * dipaco_bytes_out_total, dipaco_outer_step_seconds (last) and _sum, dipaco_round_overhead_seconds
 * (last; _sum, _count: last merged delta -> every slot holds the new version), dipaco_workers{state},
 * dipaco_active_leases, dipaco_jobs{state}, dipaco_fragment_version{job,fragment},
 * dipaco_loss{job,path} (latest reported loss; NaN until known), dipaco_job_loss{job} (mean
 * loss of the last closed round); diloco-async jobs: dipaco_async_staleness{job} (staleness of
 * the last applied delta), dipaco_async_staleness_max{job}, dipaco_async_staleness_sum{job},
 * dipaco_async_deltas_applied_total{job}, dipaco_async_deltas_dropped_total{job} (too stale)
 * — counted since the coordinator started; the durable per-delta record is the ledger. */
#include "coordinator/metrics.h"

#include "common/errors.h"
#include "common/log.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQ_MAX 8192

#define CONN_TIMEOUT_MS 5000

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

/* Process counters: rounds, outer steps, bytes, outer step time. */
static void fmt_counters(coord *c, sbuf *b) {
  sb_printf(b, "# HELP dipaco_rounds_total Outer rounds closed (sync; one per fragment round).\n"
               "# TYPE dipaco_rounds_total counter\ndipaco_rounds_total %llu\n",
            (unsigned long long)c->rounds_total);
  sb_printf(b, "# TYPE dipaco_outer_steps_total counter\ndipaco_outer_steps_total %llu\n",
            (unsigned long long)c->outer_steps);
  sb_printf(b, "# HELP dipaco_deltas_rejected_total PushDelta streams refused as malformed or corrupt (nothing "
               "stored).\n# TYPE dipaco_deltas_rejected_total counter\ndipaco_deltas_rejected_total %llu\n",
            (unsigned long long)c->deltas_rejected);
  static const char *const why[REVOKE_N] = {"heartbeat", "ttl", "deadline", "grace", "disconnect"};
  sb_printf(b, "# HELP dipaco_lease_revocations_total Active leases taken from their workers: heartbeat (missed "
               "--dead-after-heartbeats heartbeats), ttl (not renewed within --lease-ttl-ms), deadline (round closed "
               "at round_timeout_s without it), grace (quorum round closed at quorum_grace_s without it), disconnect "
               "(the worker's connection closed: no Watch within --reconnect-grace-ms).\n"
               "# TYPE dipaco_lease_revocations_total counter\n");
  for (int i = 0; i < REVOKE_N; i++)
    sb_printf(b, "dipaco_lease_revocations_total{reason=\"%s\"} %llu\n", why[i], (unsigned long long)c->revocations[i]);
  static const double bounds[COORD_ROUND_WAIT_BUCKETS] = COORD_ROUND_WAIT_BOUNDS;
  sb_printf(b, "# HELP dipaco_round_wait_seconds Per closed sync round: time from its first to its last merged "
               "delta.\n# TYPE dipaco_round_wait_seconds histogram\n");
  for (int i = 0; i < COORD_ROUND_WAIT_BUCKETS; i++)
    sb_printf(b, "dipaco_round_wait_seconds_bucket{le=\"%g\"} %llu\n", bounds[i],
              (unsigned long long)c->round_wait_count[i]);
  sb_printf(b, "dipaco_round_wait_seconds_bucket{le=\"+Inf\"} %llu\ndipaco_round_wait_seconds_sum %.6f\n"
               "dipaco_round_wait_seconds_count %llu\n",
            (unsigned long long)c->round_wait_count[COORD_ROUND_WAIT_BUCKETS], c->round_wait_sum,
            (unsigned long long)c->round_wait_count[COORD_ROUND_WAIT_BUCKETS]);
  sb_printf(b, "# HELP dipaco_bytes_in_total Tensor bytes received (deltas, uploads).\n"
               "# TYPE dipaco_bytes_in_total counter\ndipaco_bytes_in_total %llu\n",
            (unsigned long long)c->bytes_in);
  sb_printf(b, "# HELP dipaco_bytes_out_total Tensor bytes sent (parameters, exports).\n"
               "# TYPE dipaco_bytes_out_total counter\ndipaco_bytes_out_total %llu\n",
            (unsigned long long)c->bytes_out);
  sb_printf(b, "# HELP dipaco_outer_step_seconds Duration of the last outer step.\n"
               "# TYPE dipaco_outer_step_seconds gauge\ndipaco_outer_step_seconds %.6f\n"
               "# TYPE dipaco_outer_step_seconds_sum counter\ndipaco_outer_step_seconds_sum %.6f\n",
            c->outer_seconds_last, c->outer_seconds_sum);
  sb_printf(b, "# HELP dipaco_round_overhead_seconds Per sync round: its last merged delta to every slot of the next "
               "round holding the new parameters (last value; _sum and _count over the rounds).\n"
               "# TYPE dipaco_round_overhead_seconds gauge\ndipaco_round_overhead_seconds %.6f\n"
               "# TYPE dipaco_round_overhead_seconds_sum counter\ndipaco_round_overhead_seconds_sum %.6f\n"
               "# TYPE dipaco_round_overhead_seconds_count counter\ndipaco_round_overhead_seconds_count %llu\n",
            c->round_overhead_last, c->round_overhead_sum, (unsigned long long)c->round_overhead_count);
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
    sb_printf(b, "# HELP dipaco_workers Registered workers by state.\n# TYPE dipaco_workers gauge\n"
                 "dipaco_workers{state=\"active\"} %d\ndipaco_workers{state=\"draining\"} %d\n"
                 "dipaco_workers{state=\"gone\"} %d\n",
              cnt[0], cnt[1], cnt[2]);
  }
  store_lease *ls;
  int nl;
  if (store_list_active_leases(c->st, 0, &ls, &nl) == 0) {
    free(ls);
    sb_printf(b, "# TYPE dipaco_active_leases gauge\ndipaco_active_leases %d\n", nl);
  }
}

/* Per job: fragment versions, path and job losses. */
static void fmt_progress(coord *c, sbuf *b) {
  sb_printf(b, "# TYPE dipaco_fragment_version gauge\n");
  for (int i = 0; i < c->n_jobs; i++) {
    store_fragment *fr;
    int nf;
    if (store_list_fragments(c->st, c->jobs[i]->id, &fr, &nf) < 0) continue;
    for (int f = 0; f < nf; f++)
      sb_printf(b, "dipaco_fragment_version{job=\"%lld\",fragment=\"%d\"} %lld\n", (long long)c->jobs[i]->id,
                fr[f].fragment + 1, (long long)fr[f].version);
    free(fr);
  }
  sb_printf(b, "# HELP dipaco_loss Latest training loss reported on a path.\n# TYPE dipaco_loss gauge\n");
  for (int i = 0; i < c->n_jobs; i++)
    for (int p = 0; p < c->jobs[i]->n_paths; p++)
      if (isfinite(c->jobs[i]->path_loss[p]))
        sb_printf(b, "dipaco_loss{job=\"%lld\",path=\"%d\"} %.6g\n", (long long)c->jobs[i]->id, p,
                  c->jobs[i]->path_loss[p]);
  sb_printf(b, "# TYPE dipaco_job_loss gauge\n");
  for (int i = 0; i < c->n_jobs; i++)
    if (isfinite(c->jobs[i]->last_loss))
      sb_printf(b, "dipaco_job_loss{job=\"%lld\"} %.6g\n", (long long)c->jobs[i]->id, c->jobs[i]->last_loss);
}

/* Per diloco-async job: staleness and delta counters; then jobs by state. */
static void fmt_async_and_states(coord *c, sbuf *b) {
  sb_printf(b, "# HELP dipaco_async_staleness Staleness (current - base version) of the last applied async delta.\n"
               "# TYPE dipaco_async_staleness gauge\n# TYPE dipaco_async_staleness_max gauge\n"
               "# TYPE dipaco_async_staleness_sum counter\n# TYPE dipaco_async_deltas_applied_total counter\n"
               "# TYPE dipaco_async_deltas_dropped_total counter\n");
  for (int i = 0; i < c->n_jobs; i++) {
    const coord_job *j = c->jobs[i];
    if (j->spec.algorithm != JOB_ALGO_DILOCO_ASYNC) continue;
    long long id = (long long)j->id;
    sb_printf(b, "dipaco_async_staleness{job=\"%lld\"} %lld\ndipaco_async_staleness_max{job=\"%lld\"} %lld\n"
                 "dipaco_async_staleness_sum{job=\"%lld\"} %.0f\ndipaco_async_deltas_applied_total{job=\"%lld\"} %llu\n"
                 "dipaco_async_deltas_dropped_total{job=\"%lld\"} %llu\n",
              id, (long long)j->stale_last, id, (long long)j->stale_max, id, j->stale_sum, id,
              (unsigned long long)j->async_applied, id, (unsigned long long)j->async_dropped);
  }
  sb_printf(b, "# TYPE dipaco_jobs gauge\n");
  static const char *const names[] = {"created", "running", "paused", "finished", "canceled", "failed"};
  for (int s = 0; s < 6; s++) {
    int n = 0;
    for (int i = 0; i < c->n_jobs; i++) n += (int)c->jobs[i]->state == s;
    sb_printf(b, "dipaco_jobs{state=\"%s\"} %d\n", names[s], n);
  }
}

static void fmt_metrics(coord *c, sbuf *b) {
  fmt_counters(c, b);
  fmt_fleet(c, b);
  fmt_progress(c, b);
  fmt_async_and_states(c, b);
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
  sb_printf(&b, "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", code,
            code == 200 ? "OK" : code == 404 ? "Not Found" : "Bad Request", ctype, blen);
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
  if (strncmp(k->req, "GET /metrics ", 13) == 0 || strncmp(k->req, "GET /metrics?", 13) == 0) {
    sbuf b = {0};
    fmt_metrics(k->c, &b);
    respond(k, 200, "text/plain; version=0.0.4", b.s ? b.s : "", b.n);
    free(b.s);
  } else {
    respond(k, 404, "text/plain", "not found; try /metrics\n", 24);
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
