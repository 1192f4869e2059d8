/* loop.c — the coordinator's libuv glue: the loop that owns all state (gRPC completions via
 * uv_async, the housekeeping timer, signals), the count of thread-pool work in flight and the
 * graceful shutdown on SIGTERM/SIGINT: stop accepting work, let thread-pool work (delta
 * fsyncs, outer steps) finish, stop the gRPC server with a grace period. Also the bucket
 * bounds of the /metrics histograms and coord_observe (loop thread, like all coord state). */
#include "coordinator/loop.h"

#include "common/errors.h"
#include "common/log.h"
#include "common/rpc.h"

#include <pthread.h>
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#define SHUTDOWN_GRACE_MS 3000

static void close_handle(uv_handle_t *h) {
  if (h->loop && !uv_is_closing(h)) uv_close(h, NULL);
}

static void maybe_shutdown(coord *c) {
  if (!c->stopping || c->work_inflight > 0 || c->shut_started) return;
  c->shut_started = 1;
  if (c->srv) DPC_INFO("in-flight work done; stopping the gRPC server (grace %d ms)", SHUTDOWN_GRACE_MS);
  rpc_server_stop(c->srv, SHUTDOWN_GRACE_MS);
  c->srv = NULL;
  close_handle((uv_handle_t *)&c->async);
  close_handle((uv_handle_t *)&c->tick);
  close_handle((uv_handle_t *)&c->wake);
  close_handle((uv_handle_t *)&c->sigterm);
  close_handle((uv_handle_t *)&c->sigint);
  if (c->shutdown_cb) c->shutdown_cb(c);
}

int loop_queue_work(coord *c, uv_work_t *req, uv_work_cb work, uv_after_work_cb after) {
  int rc = uv_queue_work(c->loop, req, work, after);
  if (rc < 0) return dpc_err(DPC_EINTERNAL, "uv_queue_work: %s", uv_strerror(rc));
  c->work_inflight++;
  return 0;
}

/* Seconds: 1 ms to 30 min (transfers and steps); versions for the staleness. */
static const double DURATION_BOUNDS[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800};
static const double STALENESS_BOUNDS[] = {0, 1, 2, 4, 8, 16, 32, 64, 128, 256};
_Static_assert(sizeof DURATION_BOUNDS / sizeof(double) <= COORD_HIST_MAX_BUCKETS &&
                   sizeof STALENESS_BOUNDS / sizeof(double) <= COORD_HIST_MAX_BUCKETS,
               "coord_hist holds COORD_HIST_MAX_BUCKETS bounds");

const double *coord_hist_bounds(int h, int *n) {
  if (h == HIST_STALENESS) {
    *n = (int)(sizeof STALENESS_BOUNDS / sizeof STALENESS_BOUNDS[0]);
    return STALENESS_BOUNDS;
  }
  *n = (int)(sizeof DURATION_BOUNDS / sizeof DURATION_BOUNDS[0]);
  return DURATION_BOUNDS;
}

void coord_observe(coord *c, int h, double v) {
  if (h < 0 || h >= HIST_N || !(v >= 0)) return; /* NaN and negative durations are not observations */
  int n;
  const double *b = coord_hist_bounds(h, &n);
  coord_hist *x = &c->hist[h];
  for (int i = 0; i < n; i++)
    if (v <= b[i]) x->count[i]++;
  x->count[n]++;
  x->sum += v;
}

void loop_work_done(coord *c) {
  c->work_inflight--;
  maybe_shutdown(c);
}

static void on_async(uv_async_t *a) {
  coord *c = a->data;
  if (c->srv) rpc_server_dispatch(c->srv);
}

void loop_notify(void *ud) { uv_async_send(&((coord *)ud)->async); }

static void on_tick(uv_timer_t *t) {
  coord *c = t->data;
  if (c->tick_cb) c->tick_cb(c);
}

static void on_signal(uv_signal_t *s, int signum) {
  coord *c = s->data;
  if (c->stopping) return;
  DPC_INFO("%s received: shutting down (%d work item(s) in flight)", signum == SIGTERM ? "SIGTERM" : "SIGINT",
           c->work_inflight);
  c->stopping = 1;
  sd_notify(0, "STOPPING=1");
  if (c->srv) rpc_server_set_health(c->srv, "", 0);
  uv_timer_stop(&c->tick);
  if (c->wake.loop) uv_timer_stop(&c->wake);
  if (c->stop_cb) c->stop_cb(c);
  maybe_shutdown(c);
}

static void term_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGINT);
}

void loop_block_signals(void) {
  sigset_t set;
  term_signals(&set);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
}

void loop_init(coord *c) {
  c->loop = uv_default_loop();
  uv_async_init(c->loop, &c->async, on_async);
  c->async.data = c;
}

void loop_watch_signals(coord *c) {
  sigset_t set;
  term_signals(&set);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  uv_signal_init(c->loop, &c->sigterm);
  uv_signal_init(c->loop, &c->sigint);
  c->sigterm.data = c->sigint.data = c;
  uv_signal_start(&c->sigterm, on_signal, SIGTERM);
  uv_signal_start(&c->sigint, on_signal, SIGINT);
}

void loop_start_tick(coord *c, int tick_ms) {
  uv_timer_init(c->loop, &c->tick);
  c->tick.data = c;
  uv_timer_start(&c->tick, on_tick, (uint64_t)tick_ms, (uint64_t)tick_ms);
  uv_timer_init(c->loop, &c->wake);
  c->wake.data = c;
  c->wake_at = 0;
}

static void on_wake(uv_timer_t *t) {
  coord *c = t->data;
  c->wake_at = 0;
  if (c->wake_cb && !c->stopping) c->wake_cb(c);
}

void loop_wake_at(coord *c, int64_t at_ms) {
  if (c->stopping || !c->wake.loop || uv_is_closing((uv_handle_t *)&c->wake)) return;
  if (c->wake_at != 0 && c->wake_at <= at_ms) return; /* an earlier wake-up is armed */
  const int64_t now = dpc_wall_ms();
  c->wake_at = at_ms;
  uv_timer_start(&c->wake, on_wake, (uint64_t)(at_ms > now ? at_ms - now : 0), 0);
}

void loop_stop_now(coord *c) {
  c->stopping = 1;
  maybe_shutdown(c);
}

void loop_run(coord *c) { uv_run(c->loop, UV_RUN_DEFAULT); }

void loop_close(coord *c) { uv_loop_close(c->loop); }
