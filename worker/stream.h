/* stream.h — one Streaming DiLoCo lease (docs/design.md §3): the slot
 * trains on from its own local parameters without pausing; after each inner step n (counted
 * from 1) every fragment whose sync step it is sends its delta (global − local, against the
 * global version it merged last) from a background push thread, and every fragment whose
 * sync was τ steps ago merges the new global version: local ← α·local + (1 − α)·global. A
 * fetch thread pulls that version from the sync on (waiting while the round closes), so the
 * merge blocks only if it has not arrived. With eager updates the sync also merges an
 * estimate of the next global at once (docs/design.md §3). A lease covers steps
 * (t·H, (t+1)·H]: one sync of every fragment. Merges due at the lease's last step are done at
 * the start of the next lease, so that a lease ends in a state another worker can resume
 * from: the local parameters (and AdamW moments) after step (t+1)·H, which inner.state
 * checkpoint uploads.
 *
 * Ownership: a stream_keep belongs to the lease runner and is freed with stream_keep_free (a
 * zeroed one is empty). Thread-safety: stream_run runs on the lease loop's thread; it starts
 * and joins its own push and fetch threads (the fetch thread writes only keep->stage, handed
 * over under the pusher's mutex). */
#ifndef DPC_WORKER_STREAM_H
#define DPC_WORKER_STREAM_H
#include "proto/dipaco.pb-c.h"
#include "worker/client.h"
#include "worker/heartbeat.h"
#include "worker/plan.h"
#include "worker/slot.h"
#include "worker/stop.h"
#include "worker/trainer.h"
#include <stddef.h>
#include <stdint.h>

/* What a worker keeps of a streaming slot between its leases (inner_state keep). */
typedef struct {
  int valid;
  uint64_t job, step; /* step: the slot's inner step the local parameters are at */
  uint32_t path, replica;
  size_t n_params, nf;
  uint64_t *frag_ids; /* (nf) the lease's fragments, in lease order */
  float *local;       /* (n_params) the slot's local parameters at `step` */
  float *global;      /* (n_params) fragment i's global parameters at version have_ver[i] */
  float *stage;       /* (n_params) prefetched global versions on their way to `global` */
  int64_t *have_ver;  /* (nf) −1: none */
  /* Eager updates (docs/design.md §3), per fragment i at its offset: */
  float *eager_prev;  /* (n_params) the slot's decoded delta of its previous sync (0 before the first) */
  float *eager_est;   /* (n_params) the eager estimate ĝ of the global version on its way */
  float *eager_base;  /* (n_params) the eager base E at version have_e[i] */
  float *scratch;     /* (n_params) */
  int64_t *have_e;    /* (nf) −1: none */
  int64_t *est_ver;   /* (nf) the version eager_est stands in for, −1: none */
  /* Replay pulls (Lease.replay_pull without eager, docs/design.md §4.4), per fragment i at its
   * offset: */
  float *u;           /* (n_params) the outer momentum at version have_u[i] (the global's) */
  float *ustage;      /* (n_params) the outer momentum of the version in stage (fetched[i]) */
  float *own;         /* (n_params) the slot's last delta as the coordinator decodes it */
  int64_t *have_u;    /* (nf) −1: none */
  int64_t *own_ver;   /* (nf) the version own helps make, −1: none */
  uint64_t *own_lease; /* (nf) the lease that pushed own */
} stream_keep;

void stream_keep_free(stream_keep *k);

/* What a streaming lease borrows from the lease loop. */
typedef struct {
  wclient *wc;
  worker_ctl *ctl;
  unsigned *seed;
  slot_cache *slots;
  stream_keep *keep;
  heartbeat *hb;
} stream_env;

/* Run streaming lease L (planned as p; the trainer and its AdamW state already fitted) to the
 * end of its steps with every delta acknowledged. 0 when done (st filled); otherwise a
 * negative DPC_E* code (or 0 with st->steps_done < H when stopped) with *cls saying how the
 * last call failed. */
int stream_run(stream_env *e, const Dipaco__V1__Lease *L, const lease_plan *p, trainer_stats *st, enum wc_class *cls);

/* The version a fragment with sync offset o has after its sync at step n (n a sync step):
 * the number of its sync steps in [1, n]. */
int64_t stream_version_after(uint64_t n, uint32_t o, uint32_t H);
/* 1 if step n (counted from 1) is a sync step of a fragment with offset o. */
int stream_sync_due(uint64_t n, uint32_t o, uint32_t H);

#endif
