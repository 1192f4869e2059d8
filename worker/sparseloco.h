/* sparseloco.h — the worker's side of SparseLoCo (docs/design.md §3, common/sparse.h): each
 * slot's error-feedback buffer e kept between leases, the push (e <- beta·e + Δ, chunked top-k
 * with value_bits values, e <- e − s), and sparse pulls: a worker that holds version v of a
 * fragment replays the outer steps v+1 .. base from the rounds' sparse deltas instead of
 * pulling the fragment, and checks the result against the lease's CRC-32C (a full pull if it
 * differs or the rounds are no longer kept).
 *
 * Ownership: a sl_cache owns its buffers (sl_cache_free; a zeroed one is empty and valid); a
 * sl_push owns its encoded streams and new buffer (sl_push_free). Thread-safety: the lease
 * loop's thread only. */
#ifndef DPC_WORKER_SPARSELOCO_H
#define DPC_WORKER_SPARSELOCO_H

#include "common/sparse.h"
#include "proto/dipaco.pb-c.h"
#include "worker/client.h"
#include "worker/plan.h"
#include "worker/slot.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int used;
  uint64_t job;
  uint32_t path, replica;
  float *e; /* (n) the slot's error-feedback buffer over the path's parameters */
  size_t n;
  int64_t last_used;
} sl_ef;

/* A fragment version held in slot_cache.theta: [off, off + len) holds fragment_id at version. */
typedef struct {
  uint64_t fragment_id, version;
  size_t off, len;
} sl_held;

#define SL_HELD_MAX 1024

/* A delta this worker pushed (and so need not pull back): fragment_id's stream of lease, which
 * helps make `version`. */
typedef struct {
  uint64_t job, fragment_id, version, lease;
  unsigned char *enc;
  size_t bytes;
} sl_own;

typedef struct {
  sl_ef efs[SLOT_STATES_MAX];
  sl_own *own; /* [n_own] the last lease's pushed streams */
  size_t n_own;
  float *pulled; /* (n) an error-feedback buffer pulled with the inner-state checkpoint */
  size_t n_pulled;
  uint64_t pulled_job, pulled_lease;
  uint64_t held_job;
  sl_held held[SL_HELD_MAX];
  int n_held;
} sl_cache;

void sl_cache_free(sl_cache *c);

/* The buffer slot_resume_checkpoint pulls the slot's error feedback into (n floats, zeroed), for
 * lease L; NULL when out of memory. */
float *sl_pull_target(sl_cache *c, const Dipaco__V1__Lease *L, size_t n);

/* A lease's encoded deltas and the slot's new error-feedback buffer. */
typedef struct {
  unsigned char **enc; /* [n_fragments] CODEC_SPARSE streams */
  size_t *bytes;       /* [n_fragments] */
  float *e;            /* (n_params) the new buffer (the path's fragments) */
  size_t n_frag, n;
  uint64_t kept;       /* entries sent */
} sl_push;

/* Encode lease L's deltas (delta[n_params], fragment i at p->abs_off[i]) from the slot's buffer
 * (pulled with the checkpoint, kept from its last lease here, or zeros; inner.state reset:
 * always zeros) into *out. Nothing in the cache changes until sl_commit. */
int sl_encode(sl_cache *c, const Dipaco__V1__Lease *L, const lease_plan *p, const float *delta, sl_push *out);
/* The push was accepted: the slot keeps out->e (unless inner.state reset), and the worker its
 * streams (the next sparse pull leaves them out). */
void sl_commit(sl_cache *c, const Dipaco__V1__Lease *L, sl_push *out);
void sl_push_free(sl_push *out);

/* Pull fragment i of lease L into theta + p->abs_off[i] from the sparse rounds since the version
 * this worker holds, when the lease allows it (sparse_pull) and the rounds are kept: returns 1
 * when theta now holds the fragment at its base version with the lease's CRC-32C (*bytes: the
 * bytes pulled), 0 when a full pull is needed, or a negative DPC_E* code (*code set) for a
 * transfer to retry. */
int sl_try_pull(sl_cache *c, wclient *wc, const Dipaco__V1__Lease *L, const lease_plan *p, size_t i, float *theta,
                size_t *bytes, int *code);
/* theta + p->abs_off[i] now holds fragment i of L at its base version (any way it was pulled). */
void sl_note_pulled(sl_cache *c, const Dipaco__V1__Lease *L, const lease_plan *p, size_t i);
/* Forget what theta holds (it is about to be overwritten by something else). */
void sl_forget_held(sl_cache *c);

/* Fragment i of lease L as the sparse codec reads it: the lease's settings into *cfg and the
 * fragment's tensor lengths into tlen[cap]; their count, or a negative DPC_E* code. */
int sl_fragment_layout(const Dipaco__V1__Lease *L, const lease_plan *p, size_t i, dpc_sparse_cfg *cfg, uint64_t *tlen,
                       int cap);

#endif
