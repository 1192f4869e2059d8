/* stop.c — the worker's stop control and its clock, sleep and backoff helpers (stop.h). */
#include "worker/stop.h"
#include "common/errors.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

struct worker_ctl {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  atomic_int stop;
};

int worker_ctl_create(worker_ctl **out) {
  worker_ctl *c = calloc(1, sizeof *c);
  if (!c) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  *out = c;
  return 0;
}

void worker_ctl_free(worker_ctl *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

void worker_stop(worker_ctl *c) {
  pthread_mutex_lock(&c->mu);
  atomic_store(&c->stop, 1);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int worker_stopping(worker_ctl *c) { return atomic_load(&c->stop); }

int worker_stop_requested(void *ud) { return worker_stopping(ud); }

void worker_deadline(struct timespec *ts, int64_t ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

void worker_sleep_ns(int64_t ns) {
  struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int worker_sleep(worker_ctl *c, int64_t ms) {
  struct timespec ts;
  worker_deadline(&ts, ms);
  pthread_mutex_lock(&c->mu);
  while (!atomic_load(&c->stop))
    if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != 0) break;
  pthread_mutex_unlock(&c->mu);
  return atomic_load(&c->stop);
}

int64_t worker_backoff_ms(int n, unsigned *seed) {
  int64_t ms = BACKOFF_MIN_MS;
  for (int i = 0; i < n && ms < BACKOFF_MAX_MS; i++) ms *= 2;
  if (ms > BACKOFF_MAX_MS) ms = BACKOFF_MAX_MS;
  return ms / 2 + (int64_t)(rand_r(seed) % (unsigned)(ms / 2 + 1));
}
