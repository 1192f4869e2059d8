/* slot.h — what a worker keeps between leases: the trainer it built for the last job shape
 * (reused while the next lease asks for the same model, data and settings), the buffers of
 * the path's parameters and deltas, and the AdamW moments of the slots (job, path, replica)
 * it trained, so that inner_state KEEP resumes them. Also the inner.state checkpoint
 * transfers, which move a slot's moments to and from the coordinator.
 *
 * Which slot's moments the trainer holds: have_slot with cur_path / cur_replica of key.job.
 * Moments of other slots wait in states[] (least recently used evicted, with a warning).
 *
 * Ownership: a slot_cache owns its trainer, key, buffers and states; slot_cache_free frees
 * them (a zeroed slot_cache is empty and valid). slot_state pointers handed out stay owned
 * by the cache. Thread-safety: driven by the lease loop's thread only. */
#ifndef DPC_WORKER_SLOT_H
#define DPC_WORKER_SLOT_H

#include "kernels/gpt.h"
#include "proto/dipaco.pb-c.h"
#include "worker/client.h"
#include "worker/opts.h"
#include "worker/plan.h"
#include "worker/stop.h"
#include "worker/trainer.h"

#include <stddef.h>
#include <stdint.h>

#define SLOT_STATES_MAX 16

/* What a trainer was built for: a lease that matches reuses it. */
typedef struct {
  uint64_t job;
  gpt_config cfg;
  trainer_opts opts;
  char **paths;
  int n_paths;
} trainer_key;

typedef struct {
  int used;
  uint64_t job;
  uint32_t path, replica;
  float *m, *v; /* (n_params) AdamW moments */
  size_t n;
  long adam_step;
  int64_t last_used;
} slot_state;

typedef struct {
  trainer *tr;
  trainer_key key;
  int have_slot; /* the trainer's moments belong to cur_path/cur_replica of key.job */
  uint32_t cur_path, cur_replica;
  slot_state states[SLOT_STATES_MAX];
  slot_state pending; /* moments trained by an abandoned lease whose push may have landed */
  float *theta, *delta; /* (n_params) */
  size_t n_params;
} slot_cache;

void slot_cache_free(slot_cache *c);

/* The stored state of (job, path, replica), or NULL. */
slot_state *slot_find(slot_cache *c, uint64_t job, uint32_t path, uint32_t replica);
/* A state entry for (job, path, replica) sized n, evicting the least recently used one;
 * NULL when out of memory. */
slot_state *slot_get(slot_cache *c, uint64_t job, uint32_t path, uint32_t replica, size_t n);
void slot_drop(slot_state *s);
/* Drop the stored state of (job, path, replica), if any. */
void slot_forget(slot_cache *c, uint64_t job, uint32_t path, uint32_t replica);

/* Make the trainer fit lease L (resolving its data under o->data_dir; a different key stashes
 * the current moments and builds a new trainer with o's backend) and size theta / delta. */
int slot_fit_trainer(slot_cache *c, const struct worker_opts *o, const Dipaco__V1__Lease *L, const lease_plan *p);

/* Give the trainer the AdamW state lease L starts from, without the network: RESET starts
 * fresh; otherwise (KEEP, or CHECKPOINT without a checkpoint) the slot's stored moments,
 * else fresh ones with a warning. */
int slot_select_state(slot_cache *c, const Dipaco__V1__Lease *L);

/* inner.state checkpoint: the slot's AdamW state of the round before L, whoever trained it,
 * pulled from the coordinator (a few retries on transient failures, cut short by a stop)
 * into the trainer; for a streaming lease also its local parameters into local[n_params], for a
 * SparseLoCo lease its error-feedback buffer (NULL otherwise). */
int slot_resume_checkpoint(slot_cache *c, wclient *wc, worker_ctl *ctl, unsigned *seed, const Dipaco__V1__Lease *L,
                           const lease_plan *p, float *local);

/* inner.state checkpoint: upload the trainer's AdamW state for every fragment of L, and for a
 * streaming lease the trainer's parameters (the slot's local ones), for a SparseLoCo lease
 * its new error-feedback buffer ef[n_params] (NULL otherwise) (one attempt; *code as in
 * client.h). */
int slot_push_inner(slot_cache *c, wclient *wc, const Dipaco__V1__Lease *L, const lease_plan *p, const float *ef,
                    int *code);

/* Before training: a copy of the trainer's moments (in the state entry of L's slot), so an
 * abandoned lease can put them back. *snap is set (to the entry, owned by the cache) also
 * when copying the moments fails, so that slot_restore cleans it up. */
int slot_snapshot(slot_cache *c, const Dipaco__V1__Lease *L, slot_state **snap);
/* The lease was abandoned: put the snapshot's moments back in the trainer (or, failing that,
 * say it holds no slot's) and free the snapshot. */
void slot_restore(slot_cache *c, slot_state *snap);
/* Before slot_restore, when lease L trained its round and its push may have landed although no
 * answer came back (the coordinator went away mid-push): keep a copy of the trained moments.
 * The next lease of the slot resumes them instead of the restored ones if it starts where
 * they end (the coordinator merged the delta and moved the slot on), and drops them if it
 * starts where the restored ones do. */
int slot_keep_trained(slot_cache *c, const Dipaco__V1__Lease *L);

#endif
