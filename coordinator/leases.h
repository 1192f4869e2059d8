/* leases.h — lease assignment and lease life (layer 3, see coord.h): which slot a worker
 * gets (SCHED_* in coord.h), DyLU lengths, the end of a lease once its deltas are durable,
 * restart recovery, expiry and worker liveness, and the registry of parked Lease long-polls.
 *
 * Contract: loop thread only. The registry keeps opaque call pointers; it answers a call it
 * takes off only through c->park_answer_cb (the RPC layer's), exactly once per parked call,
 * unless lease_unpark_call took it off first. */
#ifndef DPC_COORD_LEASES_H
#define DPC_COORD_LEASES_H

#include "coordinator/coord.h"

/* Find or grant a lease for worker w (job_filter 0 = any). Returns SCHED_* or a negative
 * DPC_E* code; *lease is filled when granted. */
int lease_assign(coord *c, int64_t worker, int64_t job_filter, store_lease *lease);
/* Worker liveness: seen within the lease TTL (or long-polling) and not gone. */
int lease_worker_alive(coord *c, const store_worker *w, int64_t now);
/* After all fragments of a lease were pushed: end it (finished, slot advances). */
void lease_pushed(coord *c, int64_t lease_id);
/* If every fragment of active lease l already has its delta recorded (durable), end it as
 * finished via lease_pushed and return 1; else 0. Idempotent: pushes, releases, expiry
 * and restart recovery all go through it, so a lease whose work is in never reopens a round. */
int lease_maybe_pushed(coord *c, const store_lease *l);
/* Restart recovery: finish every active lease whose deltas are all durable (a crash between
 * acknowledging the last delta and ending the lease leaves such leases behind). */
void lease_recover(coord *c);
/* The shortest silence that revokes a lease (coord.dead_after_ms): a heartbeat interval of
 * 100 ms must not make scheduler hiccups of a few hundred ms look like a dead worker. */
#define LEASE_DEAD_FLOOR_MS 1000
/* coord.dead_after_ms for --dead-after-heartbeats n and --heartbeat-ms hb. */
int64_t lease_dead_after_ms(int n, int hb_ms);
/* Housekeeping (every tick): revoke leases whose worker missed its heartbeats (no heartbeat
 * for dead_after_ms; the slot is free at once), expire leases past their TTL, mark silent
 * workers gone. A revoked lease is expired (LEASE_EXPIRED) as by its TTL: its heartbeats say
 * STOP and its pushes are refused (ABORTED, or PUSH_LATE once the round closed). */
void lease_expire(coord *c);
/* Count one revocation of reason REVOKE_* (dipaco_lease_revocations_total). */
void lease_count_revocation(coord *c, int reason);
/* Fold one steps/s sample of a worker (a heartbeat's steps_per_sec, or a completed lease's
 * steps / seconds between the end of its pull and the start of its push) into its EWMA
 * (store_worker.steps_per_s): v ← 0.7·v + 0.3·sample, or the sample itself when v is still
 * unknown. DyLU reads it. */
void lease_speed_sample(coord *c, int64_t worker, double sample);
/* diloco-async: the staleness the coordinator would see for a delta trained from base
 * version `base` of fragment f now (current version − base); -1 if unknown. */
int64_t lease_async_staleness(coord *c, const coord_job *j, int fragment, int64_t base);
/* diloco-async: rounds × H × slots minus the steps the slots trained and the steps of j's
 * active leases among act[0..na). */
int64_t lease_async_budget_left(const coord_job *j, const store_slot *slots, int ns, const store_lease *act, int na);
/* The job's progress in inner steps per slot, given the budget left: where an async lease
 * starts on the inner LR schedule. */
int64_t lease_async_progress(const coord_job *j, int64_t left);

/* Park a Lease call of `worker` (job filter `job`) until `deadline` (dpc_wall_ms); 0 or
 * DPC_ENOMEM (then answer it now). */
int lease_park(coord *c, void *call, int64_t worker, int64_t job, int64_t deadline);
/* The call ended on its own: forget it (1 if it was parked). Cancelled (the worker's
 * connection closed), the worker goes on c->lost as for a Watch (below). */
int lease_unpark_call(coord *c, void *call, int cancelled);
/* 1 if the worker has a long-polled Lease call open (so it is alive). */
int lease_is_parked(coord *c, int64_t worker);
/* Retry every parked call: the ones that get work, or whose deadline passed, are answered
 * (flush, or while stopping: all of them, with SCHED_STOPPING). */
void lease_retry_parked(coord *c, int flush);
void lease_flush_parked(coord *c); /* lease_retry_parked(c, 1), as a stop callback */
void lease_parked_free(coord *c);  /* at exit (the Watch registries too) */

/* Watch calls (the workers' liveness line): a worker holding a lease keeps one open;
 * the registry holds it for LEASE_WATCH_HOLD_MS, then lease_answer_watches hands it to
 * c->watch_answer_cb and the worker calls again. A Watch that ends without an answer
 * (cancelled: the worker's connection closed) puts its worker on c->lost: unless a new Watch
 * or a Register of it comes within c->reconnect_grace_ms, lease_expire revokes its active
 * leases (REVOKE_DISCONNECT), and marks it gone if it made no call since (so that a slot kept
 * for it goes to another worker at once). */
#define LEASE_WATCH_HOLD_MS 30000
/* Hold Watch call `call` of `worker`, which trains `lease` (0: none) (it also takes the worker
 * off c->lost); 0 or DPC_ENOMEM (then answer it now). */
int lease_watch_add(coord *c, void *call, int64_t worker, int64_t lease);
/* Lease `lease` is no longer active (finished, released, revoked, its job cancelled): drop its
 * progress note (coord_note_drop). Every place that ends an active lease calls it; tell = 1
 * when the coordinator ended it (not the worker's own push or Release): then a Watch held for
 * it is answered with WATCH_LEASE_ENDED, so its worker stops training it now. */
void lease_ended(coord *c, int64_t lease, int tell);
/* The Watch call ended (cancelled: without an answer); 1 if it was held. */
int lease_watch_ended(coord *c, void *call, int cancelled);
/* 1 if `worker` is on c->lost (its Watch or parked Lease ended without an answer, no call
 * since). */
int lease_worker_lost(const coord *c, int64_t worker);
/* The worker showed it is alive on a new connection (Register): take it off c->lost. */
void lease_watch_seen(coord *c, int64_t worker);
/* A heartbeat of `worker` arrived: if it came LEASE_WATCH_HEARD_MS or more after its Watch
 * ended, the worker is alive on another connection (its Watch may be what failed): take it
 * off c->lost. (Sooner, it may be one the dead process sent just before it died.) */
#define LEASE_WATCH_HEARD_MS 250
void lease_watch_heard(coord *c, int64_t worker);
/* Answer the held Watch calls whose hold is over (all of them with flush, at shutdown). */
void lease_answer_watches(coord *c, int flush);

#endif
