/* jobs.h — the jobs the coordinator has loaded (layer 2, see coord.h): coord_job built from a
 * store row (the parsed spec and its derived modules, fragments and per-fragment state), the
 * list in struct coord, state changes written through to the store, and the heartbeat notes
 * of active leases (lease_note).
 *
 * Contract: loop thread only. c->jobs owns its coord_jobs (freed by coord_jobs_free); a
 * lease_note pointer is valid until the next coord_note(.., 1) or coord_note_drop. */
#ifndef DPC_COORD_JOBS_H
#define DPC_COORD_JOBS_H

#include "coordinator/coord.h"

coord_job *coord_job_get(coord *c, int64_t id);
/* Load every job from the store into c->jobs (at start-up). */
int coord_jobs_load(coord *c);
/* Add a freshly created job (takes ownership of j). */
int coord_job_add(coord *c, coord_job *j);
/* Build a coord_job from a store row (parses the spec). Caller frees with coord_job_free. */
int coord_job_from_store(const store_job *sj, coord_job **out);
void coord_job_free(coord_job *j);
/* Free every loaded job (at exit). */
void coord_jobs_free(coord *c);
/* Change a job's state in the store and the cache. */
int coord_job_set_state(coord *c, coord_job *j, store_job_state s, const char *why);
/* On an S3 store with a blob cache: make ready, on the thread pool, the payload buffers job
 * j's rounds fill in the cache (per fragment its deltas, θ and u of two versions), so that its
 * first rounds do not fault fresh memory in while workers wait (blobs_cache_prewarm). Nothing
 * otherwise, or when the pool refuses the work. */
void coord_job_prewarm(coord *c, const coord_job *j);
/* 1 if path `path` of j contains fragment `fragment`'s module. */
int coord_job_path_has_fragment(const coord_job *j, int path, int fragment);
/* Whether a delta may cover fewer steps than its lease (a worker stopped mid-lease pushes what
 * it trained): async jobs (the steps count), and sync jobs without streaming weighted by
 * tokens (the delta merges with the weight of the tokens it covers). */
int coord_job_partial_ok(const coord_job *j);
/* 1 when job j keeps a quantized delta as sent (BLOB_ENCODED, decoded by the outer step range by
 * range: sync jobs), 0 when its outer step reads a decoded fp32 spool (async). */
int coord_job_keeps_sent(const coord_job *j);
/* A delta's weight in the sync outer step's average (the job's "weighting": its tokens, or 1);
 * sparse pulls send the same weights so that workers replay the step exactly. */
double coord_job_delta_weight(const coord_job *j, int64_t tokens);

/* The note of `lease` (created when missing and create is set; NULL when absent or out of
 * memory). */
lease_note *coord_note(coord *c, int64_t lease, int create);
void coord_note_drop(coord *c, int64_t lease);
/* Free every note (at exit). */
void coord_notes_free(coord *c);

#endif
