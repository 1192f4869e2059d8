/* heartbeat.c — the heartbeat thread of a lease, its command handling, the trainer's step
 * callback and the idle heartbeat (heartbeat.h). */
#include "worker/heartbeat.h"
#include "common/errors.h"
#include "common/log.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The coordinator's heartbeat_interval_ms, when it is sane. */
static int interval_ok(uint32_t ms) { return ms >= 50 && ms <= 60000; }

void hb_init(heartbeat *hb, wclient *wc, worker_ctl *ctl, const Dipaco__V1__Lease *L, float sps, int progress,
             double slowdown, double min_step_ms, double finish_s) {
  memset(hb, 0, sizeof *hb);
  hb->wc = wc;
  hb->ctl = ctl;
  hb->lease_id = L->lease_id;
  hb->step = L->first_step;
  hb->loss = NAN;
  hb->progress = progress;
  hb->job = L->job_id;
  hb->round = L->round;
  hb->path = L->slot ? L->slot->path : 0;
  hb->replica = L->slot ? L->slot->replica : 0;
  hb->first_step = (long)L->first_step;
  hb->end_step = (long)(L->first_step + L->inner_steps);
  hb->sps = sps;
  hb->slowdown = slowdown;
  hb->min_step_ms = min_step_ms;
  hb->finish_s = L->streaming ? 0 : finish_s;
  atomic_store(&hb->interval_ms, wc->heartbeat_ms);
}

static void handle_command(heartbeat *hb, int cmd) {
  switch (cmd) {
  case DIPACO__V1__COMMAND__COMMAND_STOP: {
    int none = AB_NONE; /* a lease already known lost stays lost (no Release for it) */
    if (atomic_compare_exchange_strong(&hb->abort, &none, AB_STOP))
      DPC_INFO("lease %" PRIu64 ": coordinator says STOP", hb->lease_id);
    break;
  }
  case DIPACO__V1__COMMAND__COMMAND_DRAIN:
    if (!atomic_exchange(&hb->drain, 1)) DPC_INFO("coordinator says DRAIN: finishing this lease, then exiting");
    break;
  case DIPACO__V1__COMMAND__COMMAND_REREGISTER:
    atomic_store(&hb->abort, AB_REREG);
    break;
  default:
    break;
  }
}

/* A heartbeat that failed: what it means for the lease, given the last one that got through. */
static void handle_failure(heartbeat *hb, int rc, int code, int64_t last_ok) {
  enum wc_class cl = wc_classify(rc, code);
  uint32_t ttl = hb->wc->lease_ttl_ms ? hb->wc->lease_ttl_ms : 15000;
  if (cl == WC_REREGISTER) {
    atomic_store(&hb->abort, AB_REREG);
  } else if (cl == WC_LEASE_GONE || cl == WC_FATAL) {
    DPC_WARN("lease %" PRIu64 ": heartbeat refused (%s): dropping the lease", hb->lease_id, dpc_errmsg());
    atomic_store(&hb->abort, AB_LOST);
  } else if (dpc_mono_ms() - last_ok > (int64_t)ttl && atomic_load(&hb->abort) == AB_NONE) {
    DPC_WARN("lease %" PRIu64 ": no heartbeat got through for %u ms (%s): the lease has expired", hb->lease_id, ttl,
             dpc_errmsg());
    atomic_store(&hb->abort, AB_LOST);
  } else {
    DPC_DEBUG("lease %" PRIu64 ": heartbeat failed (%s); retrying", hb->lease_id, dpc_errmsg());
  }
}

static void *hb_main(void *arg) {
  heartbeat *hb = arg;
  int64_t last_ok = dpc_mono_ms();
  pthread_mutex_lock(&hb->mu);
  for (;;) {
    struct timespec ts;
    worker_deadline(&ts, atomic_load(&hb->interval_ms));
    while (!hb->quit && !hb->poke)
      if (pthread_cond_timedwait(&hb->cv, &hb->mu, &ts) != 0) break;
    if (hb->quit) break;
    hb->poke = 0;
    Dipaco__V1__HeartbeatRequest req = DIPACO__V1__HEARTBEAT_REQUEST__INIT;
    req.lease_id = hb->lease_id;
    req.step = hb->step;
    req.steps_per_sec = hb->sps;
    req.loss = hb->loss;
    req.tokens = hb->tokens;
    pthread_mutex_unlock(&hb->mu);
    Dipaco__V1__HeartbeatResponse *r = NULL;
    int code, rc = wc_heartbeat(hb->wc, &req, &r, &code);
    if (rc == 0) {
      last_ok = dpc_mono_ms();
      if (interval_ok(r->heartbeat_interval_ms)) atomic_store(&hb->interval_ms, r->heartbeat_interval_ms);
      handle_command(hb, r->command);
      protobuf_c_message_free_unpacked(&r->base, NULL);
    } else {
      handle_failure(hb, rc, code, last_ok);
    }
    pthread_mutex_lock(&hb->mu);
  }
  pthread_mutex_unlock(&hb->mu);
  return NULL;
}

static int watch_quit(void *ud) { return atomic_load(&((heartbeat *)ud)->wquit); }

/* Keep one Watch call open until hb_stop: the coordinator answers it every hold period (then
 * the next one starts at once), or at once when the lease ended on its side (revoked, its
 * round closed without it): then the lease is lost and the trainer stops at its next step. A
 * failed one is retried after a short pause; a coordinator without Watch (UNIMPLEMENTED)
 * leaves liveness to the heartbeats. */
static void *watch_main(void *arg) {
  heartbeat *hb = arg;
  while (!atomic_load(&hb->wquit)) {
    int code = 0, ended = 0;
    int rc = wc_watch(hb->wc, hb->lease_id, &code, &ended, watch_quit, hb);
    if (atomic_load(&hb->wquit)) break;
    if (ended) {
      int none = AB_NONE;
      if (atomic_compare_exchange_strong(&hb->abort, &none, AB_LOST))
        DPC_INFO("lease %" PRIu64 ": the coordinator ended it (revoked, or its round closed without it): dropping "
                 "it", hb->lease_id);
      break;
    }
    if (rc && code == RPC_UNIMPLEMENTED) {
      DPC_DEBUG("lease %" PRIu64 ": the coordinator has no Watch call; liveness by heartbeats only", hb->lease_id);
      break;
    }
    if (rc) {
      DPC_DEBUG("lease %" PRIu64 ": Watch failed (%s); again in 200 ms", hb->lease_id, dpc_errmsg());
      for (int i = 0; i < 4 && !atomic_load(&hb->wquit); i++) worker_sleep_ns(50000000);
    }
  }
  return NULL;
}

int hb_start(heartbeat *hb) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&hb->mu, NULL);
  pthread_cond_init(&hb->cv, &ca);
  pthread_condattr_destroy(&ca);
  hb->quit = 0;
  hb->poke = 0;
  if (pthread_create(&hb->th, NULL, hb_main, hb) != 0) {
    pthread_mutex_destroy(&hb->mu);
    pthread_cond_destroy(&hb->cv);
    return dpc_err(DPC_EINTERNAL, "worker: cannot start the heartbeat thread");
  }
  hb->running = 1;
  atomic_store(&hb->wquit, 0);
  hb->wrunning = pthread_create(&hb->wth, NULL, watch_main, hb) == 0;
  if (!hb->wrunning) DPC_WARN("lease %" PRIu64 ": cannot start the Watch thread; liveness by heartbeats only", hb->lease_id);
  return 0;
}

void hb_poke(heartbeat *hb) {
  if (!hb->running) return;
  pthread_mutex_lock(&hb->mu);
  hb->poke = 1;
  pthread_cond_signal(&hb->cv);
  pthread_mutex_unlock(&hb->mu);
}

void hb_stop(heartbeat *hb) {
  if (!hb->running) return;
  if (hb->wrunning) {
    atomic_store(&hb->wquit, 1); /* its call is cancelled within 50 ms */
    pthread_join(hb->wth, NULL);
    hb->wrunning = 0;
  }
  pthread_mutex_lock(&hb->mu);
  hb->quit = 1;
  pthread_cond_signal(&hb->cv);
  pthread_mutex_unlock(&hb->mu);
  pthread_join(hb->th, NULL);
  pthread_mutex_destroy(&hb->mu);
  pthread_cond_destroy(&hb->cv);
  hb->running = 0;
}

int hb_abort(heartbeat *hb) { return atomic_load(&hb->abort); }

int hb_drain(heartbeat *hb) { return atomic_load(&hb->drain); }

void hb_set_tokens(heartbeat *hb, uint64_t tokens) {
  pthread_mutex_lock(&hb->mu);
  hb->tokens = tokens;
  pthread_mutex_unlock(&hb->mu);
}

void hb_mark(heartbeat *hb) { hb->mark_ns = dpc_mono_ns(); }

/* The worker was asked to stop (SIGTERM) before global step `next`: finish the lease when its
 * remaining steps should take at most finish_s at the measured speed (a spot notice usually
 * leaves time for the rest of a round: nothing is lost, nobody has to take the slot over),
 * else stop now. Decided once per lease. */
static void finish_or_stop(heartbeat *hb, long next) {
  hb->stop_seen = 1;
  const long left = hb->end_step - next;
  const float sps = hb->sps; /* written only by this (the owner's) thread */
  if (left <= 0 || hb->finish_s <= 0 || !(sps > 0)) return;
  const double est = (double)left / (double)sps;
  if (est > hb->finish_s) {
    DPC_INFO("lease %" PRIu64 ": stopping: %ld inner steps left would take ~%.1f s, more than --drain-finish-s %g",
             hb->lease_id, left, est, hb->finish_s);
    return;
  }
  hb->finishing = 1;
  DPC_INFO("lease %" PRIu64 ": stopping after this lease: finishing its %ld inner steps left (~%.1f s, within "
           "--drain-finish-s %g), then pushing it", hb->lease_id, left, est, hb->finish_s);
}

int hb_on_step(void *ctx, long step, int h, float loss, float lr) {
  (void)lr;
  heartbeat *hb = ctx;
  if (hb->slowdown > 1.0 || hb->min_step_ms > 0) {
    /* The step took (now − mark): --slowdown makes it take slowdown times as long,
     * --min-step-ms at least min_step_ms. */
    const int64_t start = hb->mark_ns;
    int64_t extra = (int64_t)((hb->slowdown - 1.0) * (double)(dpc_mono_ns() - start));
    if (hb->slowdown > 1.0 && extra > 0) worker_sleep_ns(extra);
    int64_t rest = (int64_t)(hb->min_step_ms * 1e6) - (dpc_mono_ns() - start);
    if (hb->min_step_ms > 0 && rest > 0) worker_sleep_ns(rest);
    hb->mark_ns = dpc_mono_ns();
  }
  int64_t t = dpc_mono_ms();
  pthread_mutex_lock(&hb->mu);
  if (hb->last_step_ms && t > hb->last_step_ms) {
    float rate = 1000.0f / (float)(t - hb->last_step_ms);
    hb->sps = hb->sps > 0 ? 0.8f * hb->sps + 0.2f * rate : rate;
  }
  hb->last_step_ms = t;
  hb->step = (uint64_t)step + 1;
  hb->loss = loss;
  hb->tokens = (uint64_t)(h + 1) * hb->tok_per_step;
  pthread_mutex_unlock(&hb->mu);
  if (hb->progress && (t - hb->last_print_ms >= 100 || step + 1 == hb->end_step)) {
    hb->last_print_ms = t;
    fprintf(stderr, "\r\033[Kjob %" PRIu64 " round %" PRIu64 " slot (%u,%u) step %ld/%ld (%d) loss %.4f %.0f tok/s",
            hb->job, hb->round, hb->path, hb->replica, step + 1, hb->end_step, h + 1, loss,
            (double)hb->sps * (double)hb->tok_per_step);
  }
  if (worker_stopping(hb->ctl) && !hb->stop_seen) finish_or_stop(hb, step + 1);
  return (worker_stopping(hb->ctl) && !hb->finishing) || atomic_load(&hb->abort) != AB_NONE;
}

int hb_idle(wclient *wc, int *command, int *code) {
  Dipaco__V1__HeartbeatRequest req = DIPACO__V1__HEARTBEAT_REQUEST__INIT;
  req.loss = NAN;
  Dipaco__V1__HeartbeatResponse *r = NULL;
  int rc = wc_heartbeat(wc, &req, &r, code);
  if (rc) return rc;
  *command = r->command;
  if (interval_ok(r->heartbeat_interval_ms)) wc->heartbeat_ms = r->heartbeat_interval_ms;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return 0;
}
