/* rounds.h — round closing and the outer optimizer (layer 3, see coord.h): sync outer steps
 * when a fragment's round is complete (or at its deadline with quorum), the async apply of
 * single deltas, garbage collection and job completion.
 *
 * Contract: loop thread only. The outer math runs in the libuv thread pool, streamed range by
 * range over the blobs (outerio.h: bounded memory whatever the model size and the number of
 * deltas); results are committed to the store and the parameter cache back on the
 * loop thread. Parked Lease calls are retried (leases.h) after every check. */
#ifndef DPC_COORD_ROUNDS_H
#define DPC_COORD_ROUNDS_H

#include "coordinator/coord.h"

/* A SparseLoCo job, and a job with replay pulls (jobspec_replay_pull), keeps the deltas of its
 * last REPLAY_KEEP_ROUNDS rounds per fragment as sent, so that a worker up to that many
 * versions behind replays them (PAYLOAD_SPARSE_ROUND, PAYLOAD_REPLAY_ROUND) instead of pulling
 * the whole fragment (docs/design.md §5.3). */
#define REPLAY_KEEP_ROUNDS 8

/* Look at every running job's fragments: start outer steps whose round is complete (or past
 * its deadline with quorum), apply pending async deltas, finish done jobs, then retry the
 * parked Lease calls. Called after every delta and on every timer tick. */
void rounds_check(coord *c);
/* A lease of `job` finished pulling `version` of `fragment` whole (svc.c's stream sender):
 * counts towards the round overhead of the outer step that made it (coord.h), which is logged
 * and added to dipaco_round_overhead_seconds once every slot through the fragment has it. */
void rounds_note_pull(coord *c, int64_t job, int fragment, int64_t version);
/* Start-up repair: make fragment f's current version `cur` of sync job j again, durably, from
 * the version before it and the deltas its round applied (both kept until the next round
 * closes), when its blobs failed verification (corrupt on disk, missing). 0 when the result
 * has the checksums cur's row recorded; a DPC_E* code with dpc_errmsg saying why not (async
 * job, version 0, inputs collected, or a different result). Blocks the calling thread for one
 * outer step. */
int rounds_recompute_version(coord *c, coord_job *j, int f, const store_fragment *cur);
/* Delete blob `name` on the thread pool, best effort (what is left, the start-up sweep removes),
 * aborting its multipart upload upload_id first when that is not NULL or "": a blob nobody
 * needs (a refused delta's, an object whose lease ended, inner state two rounds old). On an S3
 * store each is a request, which must not hold up the loop thread while the store is slow. */
void rounds_discard(coord *c, const char *name, const char *upload_id);
/* Periodic housekeeping (coord.tick_cb): lease expiry, worker liveness, round deadlines. */
void rounds_tick(coord *c);

#endif
