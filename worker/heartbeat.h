/* heartbeat.h — the heartbeat of a lease in progress: a thread that sends HeartbeatRequest
 * (lease, global step reached, steps/s EWMA, loss, tokens) every heartbeat interval while the
 * lease's owner pulls, trains and pushes, and turns the coordinator's answers into what the
 * owner should do: COMMAND_STOP (stop the lease), COMMAND_DRAIN (finish it, then exit),
 * COMMAND_REREGISTER, a refused heartbeat or none getting through for lease_ttl_ms (the lease
 * is lost). Also the trainer's step callback, which feeds it progress (and draws the
 * progress line and the --slowdown pause), and the idle heartbeat sent between leases.
 *
 * Ownership: the owner holds the heartbeat (usually on its stack); hb_init fills it, hb_start
 * starts the thread, hb_stop joins it (and may be followed by hb_start again). The wclient
 * and worker_ctl are borrowed. Thread-safety: between hb_start and hb_stop the owner writes
 * the shared fields only through the functions below; the rest of the struct is the
 * thread's (or the owner's before hb_start / after hb_stop). */
#ifndef DPC_WORKER_HEARTBEAT_H
#define DPC_WORKER_HEARTBEAT_H

#include "proto/dipaco.pb-c.h"
#include "worker/client.h"
#include "worker/stop.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* Why the owner must abandon the lease (hb_abort). */
enum { AB_NONE = 0, AB_STOP, AB_LOST, AB_REREG };

typedef struct {
  wclient *wc;
  worker_ctl *ctl;
  pthread_t th;
  int running;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  int quit, poke; /* poke: send one heartbeat now (hb_poke) */
  /* Progress, under mu: shared between the owner thread (trainer callback) and the heartbeat
   * thread. */
  uint64_t lease_id;
  uint64_t step, tokens;
  float loss, sps;
  uint64_t tok_per_step; /* B·T */
  int64_t last_step_ms, last_print_ms;
  atomic_int abort;
  atomic_int drain;
  atomic_uint interval_ms;
  /* display */
  int progress;
  uint64_t job, round;
  uint32_t path, replica;
  long first_step, end_step;
  /* --slowdown / --min-step-ms: end of the previous step's sleep (CLOCK_MONOTONIC ns) */
  double slowdown, min_step_ms;
  int64_t mark_ns;
  /* After SIGTERM: finish the lease when its remaining steps should take at most finish_s
   * (--drain-finish-s; 0 for streaming leases). Owner thread only: stop_seen, finishing. */
  double finish_s;
  int stop_seen, finishing;
  /* The Watch thread: keeps one Watch call open while the lease runs, so that the coordinator
   * sees at once when this process or its connection is gone (svc_worker.c). */
  pthread_t wth;
  int wrunning;
  atomic_int wquit;
} heartbeat;

/* Fill hb for lease L (not started): step = L's first step, steps/s carried over from the
 * previous lease, progress line and --slowdown as given. */
void hb_init(heartbeat *hb, wclient *wc, worker_ctl *ctl, const Dipaco__V1__Lease *L, float sps, int progress,
             double slowdown, double min_step_ms, double finish_s);
/* Start the heartbeat thread and the Watch thread. */
int hb_start(heartbeat *hb);
/* Send a heartbeat now (the lease's last step and loss, before its push) instead of at the
 * next interval; no-op when the thread is not running. */
void hb_poke(heartbeat *hb);
/* Stop and join both threads (no-op when they are not running). */
void hb_stop(heartbeat *hb);

/* AB_* : whether the lease must be abandoned, and why. */
int hb_abort(heartbeat *hb);
/* Whether the coordinator asked the worker to drain. */
int hb_drain(heartbeat *hb);
/* Tokens trained in this lease, for the next heartbeat. */
void hb_set_tokens(heartbeat *hb, uint64_t tokens);
/* Training starts now (the --slowdown clock). */
void hb_mark(heartbeat *hb);

/* trainer_step_cb with ctx = the heartbeat: records progress, draws the progress line, sleeps
 * for --slowdown; non-zero (stop the round) on a stop request or an abort. */
int hb_on_step(void *ctx, long step, int h, float loss, float lr);

/* Between leases: one HeartbeatRequest with lease_id 0. On success *command receives the
 * coordinator's command and the client adopts its heartbeat interval. */
int hb_idle(wclient *wc, int *command, int *code);

#endif
