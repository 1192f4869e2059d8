/* watch.c — `dipacoctl job watch ID`: a live view of one job until it ends (commands.h).
 *
 * Every --poll-ms it reads GetJob (round, tokens, bytes, loss), GetMetrics "loss" (the round
 * means, path -1, of the last WATCH_TREND rounds) and ListWorkers for the job, and shows the
 * round out of the total, the loss with its trend, tokens/s and rounds/s over the last
 * WATCH_WINDOW_S seconds, the bytes in and out, the time left at that rate (ETA) and the
 * workers by state. On a terminal (stdout a tty) it redraws one screen in place, the trend
 * as a sparkline; otherwise it prints one plain line whenever the round, the state or the
 * loss changes, fit for logs and pipes. Exit status as `job wait`: 0 DONE, 1 FAILED or
 * CANCELLED (or an error), 3 --timeout. An unreachable coordinator is waited for. */
#include "coordinator/ctl/commands.h"
#include "coordinator/ctl/ctl.h"
#include "coordinator/ctl/view.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WATCH_TREND 40      /* round means in the trend */
#define WATCH_WINDOW_S 30.0 /* rates over the samples of the last this many seconds */
#define WATCH_SAMPLES 256

typedef struct {
  double t;
  uint64_t round, tokens;
} sample;

typedef struct {
  sample s[WATCH_SAMPLES];
  int n;
} history;

static void hist_add(history *h, double t, uint64_t round, uint64_t tokens) {
  if (h->n == WATCH_SAMPLES) {
    memmove(h->s, h->s + 1, (WATCH_SAMPLES - 1) * sizeof h->s[0]);
    h->n--;
  }
  h->s[h->n++] = (sample){t, round, tokens};
}

/* Rates over the window: tokens/s and rounds/s (NaN until two samples span some time). */
static void hist_rates(const history *h, double *tps, double *rps) {
  *tps = *rps = NAN;
  if (h->n < 2) return;
  const sample *last = &h->s[h->n - 1], *first = &h->s[0];
  for (int i = 0; i < h->n - 1; i++)
    if (last->t - h->s[i].t <= WATCH_WINDOW_S) {
      first = &h->s[i];
      break;
    }
  double dt = last->t - first->t;
  if (dt <= 0) return;
  *tps = (double)(last->tokens - first->tokens) / dt;
  *rps = (double)(last->round - first->round) / dt;
}

static void fmt_bytes(double b, char *buf, size_t cap) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void fmt_secs(double s, char *buf, size_t cap) {
  if (!isfinite(s) || s < 0) snprintf(buf, cap, "?");
  else if (s < 120) snprintf(buf, cap, "%.0fs", s);
  else if (s < 7200) snprintf(buf, cap, "%.0fm%02.0fs", floor(s / 60), fmod(s, 60));
  else snprintf(buf, cap, "%.0fh%02.0fm", floor(s / 3600), fmod(s / 60, 60));
}

/* The loss trend as a sparkline of Unicode blocks (terminal) into buf. */
static void sparkline(const double *v, int n, char *buf, size_t cap) {
  static const char *const blocks[8] = {"\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588"};
  double lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; i++) lo = fmin(lo, v[i]), hi = fmax(hi, v[i]);
  size_t off = 0;
  buf[0] = 0;
  for (int i = 0; i < n && off + 4 < cap; i++) {
    int k = hi > lo ? (int)((v[i] - lo) / (hi - lo) * 7.999) : 3;
    off += (size_t)snprintf(buf + off, cap - off, "%s", blocks[k < 0 ? 0 : k > 7 ? 7 : k]);
  }
}

/* The round means (GetMetrics "loss", path -1) of the last WATCH_TREND rounds into v; count. */
static int loss_trend(actx *a, uint64_t id, uint64_t round, double *v) {
  Dipaco__V1__GetMetricsRequest req = DIPACO__V1__GET_METRICS_REQUEST__INIT;
  char *names[1] = {"loss"};
  req.job_id = id;
  req.n_names = 1;
  req.names = names;
  req.since_round = round > WATCH_TREND ? round - WATCH_TREND : 0;
  req.limit = 100000;
  Dipaco__V1__GetMetricsResponse *r = NULL;
  if (conn_call(a, ADMIN "GetMetrics", &req.base, &dipaco__v1__get_metrics_response__descriptor,
                (ProtobufCMessage **)&r, 0))
    return 0;
  int n = 0;
  for (size_t i = 0; i < r->n_points && n < WATCH_TREND; i++)
    if (r->points[i]->path < 0 && isfinite(r->points[i]->value)) v[n++] = r->points[i]->value;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return n;
}

/* Workers of the job by state: [0] training, [1] idle, [2] draining, [3] gone. */
static void worker_counts(actx *a, uint64_t id, int cnt[4]) {
  memset(cnt, 0, 4 * sizeof cnt[0]);
  Dipaco__V1__ListWorkersResponse **pages = NULL;
  int np = 0;
  if (conn_list_workers(a, 0, id, &pages, &np)) return;
  for (int p = 0; p < np; p++)
    for (size_t i = 0; i < pages[p]->n_workers; i++) {
      int s = pages[p]->workers[i]->state;
      cnt[s == DIPACO__V1__WORKER_STATE__WORKER_TRAINING  ? 0
          : s == DIPACO__V1__WORKER_STATE__WORKER_DRAINING ? 2
          : s == DIPACO__V1__WORKER_STATE__WORKER_GONE     ? 3
                                                           : 1]++;
    }
  conn_free_workers(pages, np);
}

/* One view of the job: the screen (tty) or one plain line. */
static void show(int tty, uint64_t id, const Dipaco__V1__JobSummary *s, const double *trend, int nt, double tps,
                 double rps, const int wc[4]) {
  char in[32], out[32], eta[32], loss[32], spark[WATCH_TREND * 4 + 1] = "";
  fmt_bytes((double)s->bytes_in, in, sizeof in);
  fmt_bytes((double)s->bytes_out, out, sizeof out);
  double left = s->rounds_total > s->round ? (double)(s->rounds_total - s->round) : 0;
  fmt_secs(left == 0 ? 0 : rps > 0 ? left / rps : NAN, eta, sizeof eta);
  view_fmt_loss(s->last_loss, loss, sizeof loss);
  double d = nt >= 2 ? trend[nt - 1] - trend[0] : NAN;
  if (tty) {
    sparkline(trend, nt, spark, sizeof spark);
    double pct = s->rounds_total ? 100.0 * (double)s->round / (double)s->rounds_total : 0;
    int fill = (int)(pct * 0.4 + 0.5);
    printf("\033[H\033[2J"); /* home, clear: redraw in place */
    printf("dipacoctl job watch %llu    (Ctrl-C to stop)\n\n", (unsigned long long)id);
    printf("job %llu %s  %s  %s\n", (unsigned long long)id, s->name, view_job_state_name(s->state),
           view_algorithm_name(s->algorithm));
    printf("round     %llu/%llu  [", (unsigned long long)s->round, (unsigned long long)s->rounds_total);
    for (int i = 0; i < 40; i++) fputs(i < fill ? "#" : ".", stdout);
    printf("] %.0f%%\n", pct);
    printf("loss      %s  %s", loss, spark);
    if (isfinite(d)) printf("  (%+.4f over %d rounds)", d, nt - 1);
    printf("\ntokens/s  %.0f    rounds/s %.3f    ETA %s\n", isfinite(tps) ? tps : 0, isfinite(rps) ? rps : 0, eta);
    printf("bytes     %s in, %s out\n", in, out);
    printf("workers   %d training, %d idle, %d draining, %d gone; %u active leases\n", wc[0], wc[1], wc[2], wc[3],
           s->active_leases);
  } else {
    printf("job %llu %s round %llu/%llu loss %s", (unsigned long long)id, view_job_state_name(s->state),
           (unsigned long long)s->round, (unsigned long long)s->rounds_total, loss);
    if (isfinite(d)) printf(" trend %+.4f/%d", d, nt - 1);
    printf(" tokens/s %.0f bytes_in %s bytes_out %s eta %s workers %d/%d\n", isfinite(tps) ? tps : 0, in, out, eta,
           wc[0], wc[0] + wc[1] + wc[2]);
  }
  fflush(stdout);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

int cmd_job_watch(actx *a, const admin_args *o, char **pos, int npos) {
  uint64_t id;
  if (conn_job_id_arg(a, pos, npos, &id)) return 2;
  if (o->timeout_s < 0) return conn_usage(a, "--timeout must be >= 0 seconds (0 = no limit)%s", "");
  if (o->poll_ms < 10 || o->poll_ms > 60000) return conn_usage(a, "--poll-ms must be in [10, 60000]%s", "");
  const int tty = isatty(STDOUT_FILENO);
  history *h = calloc(1, sizeof *h);
  if (!h) return conn_fail(a, NULL, DPC_ENOMEM);
  const double t0 = dpc_mono_s();
  int warned = 0, last_state = -1, status = -1;
  uint64_t last_round = UINT64_MAX;
  float last_loss = NAN;
  while (status < 0) {
    Dipaco__V1__JobRequest req = DIPACO__V1__JOB_REQUEST__INIT;
    req.job_id = id;
    req.reason = "";
    Dipaco__V1__Job *j = NULL;
    int rc = conn_call(a, ADMIN "GetJob", &req.base, &dipaco__v1__job__descriptor, (ProtobufCMessage **)&j, 0);
    if (rc) {
      int code = rpc_last_code();
      if (code != RPC_UNAVAILABLE && code != RPC_DEADLINE_EXCEEDED && code != RPC_CANCELLED) {
        status = conn_fail(a, ADMIN "GetJob", rc);
        break;
      }
      if (!warned) fprintf(stderr, "dipacoctl %s: coordinator unreachable (%s); still watching\n", a->cmd, dpc_errmsg());
      warned = 1;
    } else {
      warned = 0;
      const Dipaco__V1__JobSummary *s = view_job_summary(j);
      hist_add(h, dpc_mono_s(), s->round, s->tokens);
      int st = s->state;
      int ended = st == DIPACO__V1__JOB_STATE__JOB_DONE || st == DIPACO__V1__JOB_STATE__JOB_FAILED ||
                  st == DIPACO__V1__JOB_STATE__JOB_CANCELLED;
      int changed = st != last_state || s->round != last_round ||
                    (isfinite(s->last_loss) != isfinite(last_loss)) ||
                    (isfinite(s->last_loss) && s->last_loss != last_loss);
      if (tty || changed || ended) {
        double trend[WATCH_TREND], tps, rps;
        int nt = loss_trend(a, id, s->round, trend), wc[4];
        worker_counts(a, id, wc);
        hist_rates(h, &tps, &rps);
        show(tty, id, s, trend, nt, tps, rps, wc);
      }
      last_state = st;
      last_round = s->round;
      last_loss = s->last_loss;
      if (ended) {
        if (st != DIPACO__V1__JOB_STATE__JOB_DONE)
          fprintf(stderr, "dipacoctl %s: job %llu %s%s%s\n", a->cmd, (unsigned long long)id, view_job_state_name(st),
                  j->message && j->message[0] ? ": " : "", j->message ? j->message : "");
        status = st == DIPACO__V1__JOB_STATE__JOB_DONE ? 0 : 1;
      }
      protobuf_c_message_free_unpacked(&j->base, NULL);
    }
    if (status >= 0) break;
    double left = o->timeout_s > 0 ? (double)o->timeout_s - (dpc_mono_s() - t0) : 1e9;
    if (left <= 0) {
      fprintf(stderr, "dipacoctl %s: timed out after %g s watching job %llu\n", a->cmd, (double)o->timeout_s,
              (unsigned long long)id);
      status = 3;
      break;
    }
    sleep_ms(left * 1000 < o->poll_ms ? (int)(left * 1000) + 1 : o->poll_ms);
  }
  free(h);
  return status;
}
