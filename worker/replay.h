/* replay.h — replay pulls (docs/design.md §3.4, §4.4): a worker that holds version v of a
 * fragment (and, for a job with outer momentum, its outer momentum u at v) catches up on the
 * lease's base version by pulling the rounds' deltas as sent (PAYLOAD_REPLAY_ROUND) and running
 * the coordinator's own outer step on them (kernels/outer.h: outer_average, then
 * outer_nesterov_step, with the coordinator's weights, learning rate and momentum), instead of
 * pulling the fragment whole. The replay runs on scratch copies; theta's range is written only
 * once the result has the lease's CRC-32C of the version, so a failure leaves it as it was and
 * the fragment is pulled whole, with the reason logged.
 *
 * What the cache remembers between leases: which fragment versions theta holds (and u for
 * them), and the worker's own last deltas as the coordinator decoded them (the coordinator
 * leaves the caller's own stream out of the round it serves).
 *
 * Ownership: a rp_cache owns its buffers (rp_cache_free; a zeroed one is empty and valid).
 * Thread-safety: the lease loop's thread only. */
#ifndef DPC_WORKER_REPLAY_H
#define DPC_WORKER_REPLAY_H

#include "proto/dipaco.pb-c.h"
#include "worker/client.h"
#include "worker/plan.h"
#include "common/sparse.h"

#include <stddef.h>
#include <stdint.h>

/* A fragment version held in slot_cache.theta: [off, off + len) holds fragment_id at version,
 * u (len floats, NULL = not known) its outer momentum at that version. */
typedef struct {
  uint64_t fragment_id, version;
  size_t off, len;
  float *u;
} rp_held;

#define RP_HELD_MAX 1024

/* A delta this worker pushed, decoded as the coordinator decodes it: fragment_id's delta of
 * lease, which helps make `version`. */
typedef struct {
  uint64_t job, fragment_id, version, lease;
  float *dec;
  size_t len;
} rp_own;

typedef struct {
  uint64_t held_job;
  size_t held_n; /* the path's size when they were noted (a different size reallocates theta) */
  rp_held held[RP_HELD_MAX];
  int n_held;
  rp_own *own; /* [n_own] the last lease's pushed deltas */
  size_t n_own;
  /* Fragments of job whole_job whose rounds the coordinator found larger than the fragment
   * (RESOURCE_EXHAUSTED): pulled whole from then on, without their outer momentum. */
  uint64_t whole_job;
  uint64_t whole[RP_HELD_MAX];
  int n_whole;
} rp_cache;

void rp_cache_free(rp_cache *c);
/* Forget what theta holds (it is about to be overwritten by something else). */
void rp_forget_held(rp_cache *c);

/* A fragment's sparse layout, for rounds of CODEC_SPARSE streams (SparseLoCo with outer
 * momentum, whose rounds sparse pulls cannot replay): the lease's settings and the fragment's
 * tensor lengths (sparseloco.h: sl_fragment_layout). */
typedef struct {
  dpc_sparse_cfg cfg;
  const uint64_t *tlen;
  int nt;
} rp_sparse;

/* Forget what theta's range [off, off + len) held (a whole pull is about to overwrite it). */
void rp_forget_range(rp_cache *c, size_t off, size_t len);

/* 1 if lease L catches up by replay here (Lease.replay_pull, a dense delta codec, no streaming:
 * stream.c replays in its prefetcher with rp_replay_round). */
int rp_lease_replays(const Dipaco__V1__Lease *L);

/* Make fragment i of lease L at its base version in theta + p->abs_off[i] by replaying the
 * rounds since the version this worker holds: 1 when theta now holds it with the lease's
 * CRC-32C (*bytes: the bytes pulled), 0 when it must be pulled whole (the reason logged), or a
 * negative DPC_E* code (*code set) for a transfer to retry. */
int rp_try_pull(rp_cache *c, wclient *wc, const Dipaco__V1__Lease *L, const lease_plan *p, size_t i, float *theta,
                size_t *bytes, int *code);

/* theta + p->abs_off[i] now holds fragment i of L at its base version, pulled whole: a later
 * lease may replay from it (pulling the outer momentum at this version then, if the job has
 * one: rp_try_pull). */
void rp_note_pulled(rp_cache *c, const Dipaco__V1__Lease *L, const lease_plan *p, size_t i);

/* Replay the round that made version v of fragment f of lease L (len floats): th and u hold
 * its parameters and outer momentum at v − 1 and get them at v (also when it fails: the
 * caller's scratch). own (NULL = none) is this worker's delta of the round as the coordinator
 * decodes it, pushed on lease own_lease; budget the most bytes to take. 1 when done and the
 * result has the CRC-32C the coordinator sent (*crc; 0 when it no longer keeps the version:
 * unchecked), RP_NOT_YET when the coordinator has not made version v yet (ask again), 0 when
 * the fragment must be pulled whole (the reason logged), or a negative DPC_E* code (*code set)
 * for a transfer to retry, or RP_OVER_BUDGET when the round is more than budget bytes (then
 * pull whole). *bytes grows by the bytes pulled. */
#define RP_NOT_YET 2
#define RP_OVER_BUDGET 3
int rp_replay_round(wclient *wc, const Dipaco__V1__Lease *L, const Dipaco__V1__FragmentInfo *f, uint64_t v,
                    const float *own, uint64_t own_lease, uint64_t budget, float *th, float *u, size_t len,
                    const rp_sparse *sp, size_t *bytes, uint32_t *crc, int *code);

/* delta[len] encoded with lease L's codec and decoded back into out[len]: what the coordinator
 * averages of it. 0 or a DPC_E* code. */
int rp_decode_own(const Dipaco__V1__Lease *L, const float *delta, size_t len, float *out);

/* The push of lease L's deltas (delta[n_params], fragment i at p->abs_off[i]) was accepted:
 * keep each as the coordinator decodes it (encoded with the lease's codec, decoded back), for
 * the rounds it helps make. */
void rp_note_pushed(rp_cache *c, const Dipaco__V1__Lease *L, const lease_plan *p, const float *delta);

#endif
