/* stop.h — the worker's stop control (worker_ctl) and the clock, sleep and backoff helpers
 * every part of the lease loop waits with: a sleep that a stop request cuts short, one that
 * it does not (a push of finished work goes on while stopping), and jittered exponential
 * backoff for retries.
 *
 * Ownership: worker_ctl_create allocates, worker_ctl_free frees. Thread-safety: worker_stop
 * and worker_stopping may be called from any thread; worker_sleep may run on several threads
 * at once (all of them wake on stop). */
#ifndef DPC_WORKER_STOP_H
#define DPC_WORKER_STOP_H

#include "common/clock.h"

#include <stdint.h>
#include <time.h>

/* Stop control shared between worker_run and whoever asks it to stop. */
typedef struct worker_ctl worker_ctl;
int worker_ctl_create(worker_ctl **out);
void worker_ctl_free(worker_ctl *c);
/* Ask the worker to stop: it releases a lease in progress (RELEASE_PREEMPTED), pushes
 * nothing and returns 0 from worker_run as soon as it can. Async-signal-unsafe (mutex):
 * call it from a signal thread, not a handler. */
void worker_stop(worker_ctl *c);
int worker_stopping(worker_ctl *c);

/* worker_stopping(ud) with a void * argument: the stop poll of wc_lease. */
int worker_stop_requested(void *ud);

/* *ts = CLOCK_MONOTONIC now + ms, for pthread_cond_timedwait on a CLOCK_MONOTONIC condvar. */
void worker_deadline(struct timespec *ts, int64_t ms);

/* Sleep ms, waking early on stop; returns 1 if stopping. */
int worker_sleep(worker_ctl *c, int64_t ms);

/* Sleep ns nanoseconds, not woken by stop (a retry that must go on while stopping; the
 * --slowdown pause after a step). */
void worker_sleep_ns(int64_t ns);

/* Jittered exponential backoff: the n-th consecutive failure waits about 100·2^n ms, capped
 * at 5 s, uniformly jittered in [½, 1] of that. */
int64_t worker_backoff_ms(int n, unsigned *seed);

#endif
