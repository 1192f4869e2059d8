/* lease.h — one granted lease, start to end: check it into a plan and fit the trainer and
 * its AdamW state (plan), pull the path's fragments (pull), run the inner steps (train), push
 * the inner state and the deltas and release it (push), or, when it cannot be completed,
 * give it up the way the protocol asks (finish): see worker.c's protocol notes. A heartbeat
 * thread (heartbeat.h) runs from the plan to the end.
 *
 * Ownership: a lease_runner borrows opts, ctl, wc and seed from the loop and owns `slots`
 * (free with slot_cache_free, stream_keep_free, sl_cache_free and rp_cache_free). Thread-safety: lease_run runs on the loop's thread; no other
 * call may use wc meanwhile except the lease's own heartbeat thread. */
#ifndef DPC_WORKER_LEASE_H
#define DPC_WORKER_LEASE_H

#include "proto/dipaco.pb-c.h"
#include "worker/client.h"
#include "worker/opts.h"
#include "worker/replay.h"
#include "worker/slot.h"
#include "worker/sparseloco.h"
#include "worker/stop.h"
#include "worker/stream.h"

/* What one lease needs from the loop, and what it carries to the next lease. */
typedef struct {
  const struct worker_opts *o;
  worker_ctl *ctl;
  wclient *wc;
  unsigned *seed;      /* backoff jitter */
  slot_cache slots;    /* trainer and AdamW states kept between leases */
  stream_keep stream;  /* Streaming DiLoCo: the local parameters of the last streaming slot */
  sl_cache sparse;     /* SparseLoCo: error-feedback buffers and the fragment versions theta holds */
  rp_cache replay;     /* replay pulls: the fragment versions (and momenta) theta holds, own deltas */
  float sps;           /* steps/s EWMA, carried from lease to lease */
  int local_failures;  /* leases in a row that failed here: lengthens the pause after one */
} lease_runner;

/* lease_run's result: flags for the loop. */
enum {
  LEASE_PUSHED = 1,     /* the lease was completed (a job is being worked on) */
  LEASE_REREGISTER = 2, /* the coordinator forgot the session, or cannot be reached: register again */
  LEASE_DRAIN = 4       /* the coordinator said COMMAND_DRAIN: exit after this lease */
};

/* Run lease L to its end (completed, released, or dropped); every failure is handled here
 * (logged, released, paused after). Returns LEASE_* flags. */
int lease_run(lease_runner *r, const Dipaco__V1__Lease *L);

#endif
