/* store.h — the coordinator's durable state in SQLite (docs/design.md §5).
 *
 * One database STATE/dipaco.db in WAL mode with foreign keys on and a busy timeout; the
 * schema is versioned (PRAGMA user_version plus a `migrations` history table) and migrated
 * forward at open, each migration in its own transaction. The parameter, momentum and delta
 * arrays themselves live in the blob store (blobs.h); rows hold their names and CRCs, and the
 * caller always writes a blob durably BEFORE committing the row that names it, so a crash
 * leaves at worst an unreferenced blob, never a row pointing at nothing.
 *
 * Every call that changes more than one row runs in one transaction (BEGIN IMMEDIATE ..
 * COMMIT, rolled back on any failure), so a failure leaves the database as it was. Errors
 * are negative DPC_E* codes with sqlite3_errmsg() in the detail. Timestamps are Unix
 * milliseconds passed in by the caller (the store never reads a clock), which keeps lease
 * expiry testable.
 *
 * Ownership: functions returning arrays or strings allocate them; free them with the
 * matching *_free / store_names_free / free(). Thread-safety: a store handle belongs to one
 * thread (the coordinator's loop thread); statements are prepared once and cached per handle.
 * Another process or handle may read the same database concurrently (WAL). */
#ifndef DPC_STORE_H
#define DPC_STORE_H

#include "coordinator/blobs.h"
#include "coordinator/jobspec.h"

#include <stddef.h>
#include <stdint.h>

#define STORE_SCHEMA_VERSION 5
#define STORE_TOKEN_HASH_BYTES 32

typedef struct store store;

/* Open (creating) STATE/dipaco.db and migrate it to STORE_SCHEMA_VERSION. A database from a
 * newer dipaco (higher user_version) is refused with DPC_EUNSUPPORTED. */
int store_open(const char *state_dir, store **out);
void store_close(store *st);
/* The schema version the open database is at (PRAGMA user_version). */
int store_schema_version(store *st, int *version);

/* Test hook (SQLite ioerr style): the n-th statement step from now (1 = the next) fails
 * with DPC_EIO, once; 0 disarms. */
void store_debug_fail_step(store *st, int n);

/* ---- jobs -------------------------------------------------------------------------------- */

typedef enum {
  JOB_CREATED = 0, JOB_RUNNING, JOB_PAUSED, JOB_FINISHED, JOB_CANCELED, JOB_FAILED
} store_job_state;

const char *store_job_state_name(store_job_state s);
int store_job_state_parse(const char *s, store_job_state *out);

typedef struct {
  int64_t id;
  char name[JOBSPEC_NAME_MAX];
  jobspec_algorithm algorithm;
  store_job_state state;
  int64_t created_at, updated_at;
  char *spec_json; /* owned; canonical jobspec_to_json text */
  char *error;     /* owned; NULL unless the job failed or was canceled with a reason */
} store_job;

/* Free the strings of one job (not the struct) / an array from store_list_jobs. */
void store_job_clear(store_job *j);
void store_jobs_free(store_job *jobs, int n);

/* Version 0 of one fragment, whose blobs the caller has already written durably. */
typedef struct {
  int fragment;             /* jobspec_fragment.id */
  const char *param_blob;   /* blob name of θ_0 */
  uint32_t param_crc;
  const char *momentum_blob; /* NULL: the momentum starts at zero (no blob yet) */
  uint32_t momentum_crc;
} store_fragment_init;

typedef struct {
  int64_t id;                    /* from store_next_job_id, so blob names can carry it */
  const jobspec *spec;           /* validated, with a shape */
  const char *spec_json;         /* its canonical JSON */
  const jobspec_module *modules; /* from jobspec_modules */
  int n_modules;
  const jobspec_fragment *fragments; /* from jobspec_fragments */
  int n_fragments;
  const store_fragment_init *init; /* [n_fragments], same order as fragments */
  int64_t now_ms;
} store_new_job;

/* The id the next created job will get (ids are never reused). */
int store_next_job_id(store *st, int64_t *id);

/* Insert the job (state created), its modules, fragments (version 0), paths, path modules and
 * slots (path, replica) — all in one transaction. DPC_EEXIST if the name or id is taken. */
int store_create_job(store *st, const store_new_job *nj);

/* DPC_ENOENT if there is no such job. *out is overwritten; store_job_clear it after. */
int store_get_job(store *st, int64_t id, store_job *out);
int store_find_job(store *st, const char *name, store_job *out);
/* All jobs by id. */
int store_list_jobs(store *st, store_job **out, int *n);

/* Change a job's state (error may be NULL). Finished, canceled and failed are terminal:
 * leaving them is DPC_ESTATE. */
int store_set_job_state(store *st, int64_t id, store_job_state state, const char *error, int64_t now_ms);

/* ---- fragments and versions ---------------------------------------------------------------- */

typedef struct {
  int64_t job;
  int fragment, module;
  size_t offset, len;   /* floats, canonical layout */
  int64_t version;      /* current version */
  /* the current version's row: */
  int64_t round;        /* round that produced it; -1 for version 0 */
  char param_blob[BLOB_NAME_MAX];
  uint32_t param_crc;
  char momentum_blob[BLOB_NAME_MAX]; /* "" = zero momentum */
  uint32_t momentum_crc;
  char dnbuf_blob[BLOB_NAME_MAX];    /* "" = zero delayed-Nesterov buffer */
  uint32_t dnbuf_crc;
  int64_t dn_t;                      /* delayed-Nesterov counter t */
  int64_t created_at;
} store_fragment;

/* The fragment with its current version (DPC_ENOENT if none). */
int store_get_fragment(store *st, int64_t job, int fragment, store_fragment *out);
/* A specific version still kept (DPC_ENOENT once garbage-collected); out->version = version. */
int store_get_version(store *st, int64_t job, int fragment, int64_t version, store_fragment *out);
/* All fragments of a job with their current versions, by fragment id; free() the array. */
int store_list_fragments(store *st, int64_t job, store_fragment **out, int *n);

/* ---- workers ------------------------------------------------------------------------------- */

typedef enum { WORKER_ACTIVE = 0, WORKER_DRAINING, WORKER_GONE } store_worker_state;

typedef struct {
  int64_t id;
  char name[128];
  unsigned char token_hash[STORE_TOKEN_HASH_BYTES]; /* hash of the session token, never the token */
  char info[256];       /* free text the worker reported (backend, device) */
  store_worker_state state;
  int64_t registered_at, last_seen;
  double steps_per_s;   /* EWMA maintained by the caller; 0 until known */
} store_worker;

int store_register_worker(store *st, const char *name, const unsigned char token_hash[STORE_TOKEN_HASH_BYTES],
                          const char *info, int64_t now_ms, int64_t *id);
int store_get_worker(store *st, int64_t id, store_worker *out);
/* Update last_seen, and steps_per_s unless it is negative or NaN. DPC_ENOENT if unknown.
 * Kept in memory (readers see it at once) and made durable in a batch: by the next
 * store_expire_leases (every coordinator tick), store_flush_liveness or store_close — a crash
 * loses at most the touches since then (store_live.c). */
int store_touch_worker(store *st, int64_t id, int64_t now_ms, double steps_per_s);
/* Commit the pending worker touches and lease renewals now. */
int store_flush_liveness(store *st);
int store_set_worker_state(store *st, int64_t id, store_worker_state state);
/* Mark ids[0..n) gone in one transaction (ids that no longer exist are skipped). */
int store_mark_workers_gone(store *st, const int64_t *ids, int n);
/* All workers by id; free() the array. */
int store_list_workers(store *st, store_worker **out, int *n);
/* At most `limit` workers with ids above `after`, by id; free() the array. */
int store_list_workers_after(store *st, int64_t after, int limit, store_worker **out, int *n);
/* Delete (one transaction, with the pending liveness written first) at most `limit` workers
 * last seen before `before_ms` that no lease (active or past) and no slot refers to: workers
 * long gone. *ids (free()) receives the deleted ids, or pass ids NULL. Their sessions are
 * unknown afterwards (a later call answers UNAUTHENTICATED / COMMAND_REREGISTER). */
int store_forget_workers(store *st, int64_t before_ms, int limit, int64_t **ids, int *n);

/* ---- slots and leases ---------------------------------------------------------------------- */

typedef enum { SLOT_IDLE = 0, SLOT_LEASED, SLOT_DONE } store_slot_state;

typedef struct {
  int64_t job;
  int path, replica;
  store_slot_state state;
  int64_t round;       /* next round this slot trains */
  int64_t inner_steps; /* global inner steps s done so far */
  int64_t last_worker; /* 0 if never leased */
} store_slot;

int store_get_slot(store *st, int64_t job, int path, int replica, store_slot *out);
/* All slots of a job by (path, replica); free() the array. */
int store_list_slots(store *st, int64_t job, store_slot **out, int *n);
/* The idle slots of a job with lo <= round <= hi, in (path, replica) order: the candidates of
 * a sync Lease (a ready slot's round equals its fragments' version), without reading every
 * slot row. free() the array. */
int store_list_idle_slots(store *st, int64_t job, int64_t lo, int64_t hi, store_slot **out, int *n);
/* 1 if some slot of the job is at a round below `round`, else 0; or a negative code. */
int store_any_slot_below(store *st, int64_t job, int64_t round);
/* Mark a slot done (all its rounds trained) or back to idle; DPC_ESTATE if it is leased. */
int store_set_slot_state(store *st, int64_t job, int path, int replica, store_slot_state state);

/* Move an idle slot forward to `round` with `inner_steps` done (a sync round closed at its
 * deadline without the slot's delta). DPC_ESTATE unless the slot is idle and below round.
 * (Added by the daemon: additive.) */
int store_advance_slot(store *st, int64_t job, int path, int replica, int64_t round, int64_t inner_steps);

typedef enum { LEASE_ACTIVE = 0, LEASE_FINISHED, LEASE_RELEASED, LEASE_EXPIRED } store_lease_state;

typedef struct {
  int64_t id, job;
  int path, replica;
  int64_t worker;
  int64_t round;       /* the round the slot trains under this lease */
  int inner_steps;     /* H for this lease (DyLU may shorten it) */
  int64_t step_begin;  /* slot's global inner step at lease start */
  store_lease_state state;
  int64_t created_at, expires_at, ended_at;
  int64_t sched_shift; /* the inner LR schedule runs at step_begin + sched_shift (async: the job's progress) */
} store_lease;

typedef struct {
  int64_t job;
  int path, replica;
  int64_t worker;
  int64_t round;
  int inner_steps;
  int64_t step_begin;
  int64_t sched_shift; /* LR schedule position − step_begin (0: the slot's own step) */
  int n_fragments;
  const int *fragments;          /* [n_fragments] fragments on the path */
  const int64_t *base_versions;  /* [n_fragments] versions handed out */
  int64_t now_ms, expires_at;
} store_new_lease;

/* Restart grace: every active lease expires no earlier than until_ms. Workers cannot renew
 * while the coordinator is down, so a restart gives them one TTL to reconnect before their
 * leases (and the work in flight) are taken away. Returns the number of leases extended. */
int store_lease_grace(store *st, int64_t until_ms);

/* Grant a lease on an idle slot (slot → leased, last_worker set). DPC_ESTATE if the slot is
 * not idle, DPC_ENOENT for an unknown slot or worker. */
int store_create_lease(store *st, const store_new_lease *nl, int64_t *lease_id);
int store_get_lease(store *st, int64_t id, store_lease *out);
/* Base version of `fragment` in the lease; DPC_ENOENT if the lease does not cover it. */
int store_lease_base_version(store *st, int64_t lease, int fragment, int64_t *version);
/* The fragments a lease covers with their base versions, by fragment id; free() both. */
int store_lease_fragments(store *st, int64_t lease, int **fragments, int64_t **base_versions, int *n);
/* Extend an active lease held by `worker`; DPC_ESTATE if not active, DPC_EPERM if another
 * worker holds it. In memory until the next flush, like store_touch_worker. */
int store_renew_lease(store *st, int64_t lease, int64_t worker, int64_t expires_at);
/* End an active lease as finished, released or expired; the slot returns to idle. With
 * advance != 0 the slot moves to the next round (round + 1) and its inner-step counter grows
 * by steps_done. DPC_ESTATE if the lease is not active. */
int store_end_lease(store *st, int64_t lease, store_lease_state how, int advance, int64_t steps_done, int64_t now_ms);
/* Expire every active lease with expires_at <= now (slots → idle), in one transaction that
 * first flushes the pending liveness. *ids (may be NULL; free()) receives the expired lease
 * ids, *n their number. */
int store_expire_leases(store *st, int64_t now_ms, int64_t **ids, int *n);
/* Active leases of a job (job 0: all jobs) by id; free() the array. */
int store_list_active_leases(store *st, int64_t job, store_lease **out, int *n);

/* ---- rounds and deltas --------------------------------------------------------------------- */

typedef enum { ROUND_OPEN = 0, ROUND_CLOSED } store_round_state;

typedef struct {
  int64_t job;
  int fragment;
  int64_t round;
  store_round_state state;
  int64_t opened_at, deadline_at, closed_at; /* deadline 0 = none */
  int n_deltas;   /* deltas applied when it closed */
  int64_t version; /* version it produced (0 while open) */
} store_round;

/* Open a sync round (idempotent: an existing row is left as it is). */
int store_open_round(store *st, int64_t job, int fragment, int64_t round, int64_t now_ms, int64_t deadline_at);
int store_get_round(store *st, int64_t job, int fragment, int64_t round, store_round *out);
/* Open rounds of a job (job 0: all) by (job, fragment, round); free() the array. */
int store_list_open_rounds(store *st, int64_t job, store_round **out, int *n);

typedef enum { DELTA_RECEIVED = 0, DELTA_APPLIED, DELTA_DROPPED } store_delta_state;

typedef struct {
  int64_t id, job;
  int64_t round;
  int fragment, path, replica;
  int64_t lease;
  int64_t base_version;
  uint32_t checksum; /* crc32c of the delta's float bytes */
  char blob[BLOB_NAME_MAX];
  double weight;
  int64_t tokens;
  store_delta_state state;
  int64_t received_at;
  int64_t applied_version; /* 0 unless applied */
  /* A quantized delta's stream as sent (BLOB_ENCODED, kept for replay pulls, docs/design.md
   * §4.3) and its CRC-32C as sent; "" and 0 for an fp32 or sparse delta, whose blob is the
   * stream as sent. */
  char enc_blob[BLOB_NAME_MAX];
  uint32_t enc_crc;
} store_delta;

typedef struct {
  int64_t lease;       /* path, replica, job and round come from the lease */
  int fragment;
  uint32_t checksum;
  const char *blob;    /* written and fsync'd before this call */
  const char *enc_blob; /* NULL, or the stream as sent (BLOB_ENCODED), written and fsync'd before */
  uint32_t enc_crc;     /* the stream's CRC-32C as sent (with enc_blob) */
  double weight;       /* >= 0, finite */
  int64_t tokens;
  int64_t now_ms;
  double norm;         /* the delta's L2 norm (kept for the norm screen); NaN or < 0 = unknown */
  const struct store_metric *metric; /* optional: recorded in the same transaction (one commit) */
  int inner_steps;     /* steps the delta covers: 0 < n < the lease's inner_steps shortens the lease to
                          n (async partial work, e.g. a preempted worker: the slot's step counter then
                          advances by n when the lease ends); 0 = the whole lease */
} store_new_delta;

/* Record a received delta, durably. Returns 0 when newly recorded, 1 when the same delta
 * (lease, fragment, checksum) was already recorded (idempotent retry; *delta_id is the old
 * row), DPC_EEXIST when the lease already pushed a different delta for the fragment,
 * DPC_ENOENT for an unknown lease or a fragment outside it, DPC_ESTATE when the fragment's
 * round for the lease is already closed, DPC_ECANCELED when the lease is no longer active
 * (expired or released: its slot belongs to another lease now). delta_id may be NULL. */
int store_record_delta(store *st, const store_new_delta *nd, int64_t *delta_id);
int store_get_delta(store *st, int64_t id, store_delta *out);
/* The delta a lease recorded for a fragment: 1 (its checksum in *crc and its stream's as sent,
 * or 0, in *enc_crc; either may be NULL), 0 if none, or a negative code. One indexed lookup
 * (the UNIQUE (lease, fragment) index). */
int store_find_delta(store *st, int64_t lease, int fragment, uint32_t *crc, uint32_t *enc_crc);
/* How many slots (distinct path, replica) have a received delta for (job, fragment, round):
 * decides whether a round can close without reading every delta row. */
int store_count_received_slots(store *st, int64_t job, int fragment, int64_t round, int *n);
/* The L2 norms recorded with the last (up to) max deltas of (job, fragment), oldest first,
 * into norms[max]; *n = how many. For the delta norm screen (coordinator/delta_screen.h). */
int store_delta_norms(store *st, int64_t job, int fragment, int max, double *norms, int *n);
/* Deltas of (job, fragment, round) in the reduction order (path, replica); state < 0 for all
 * states, else only that state. free() the array. */
int store_list_deltas(store *st, int64_t job, int fragment, int64_t round, int state, store_delta **out, int *n);

/* Every 'received' (not yet applied or dropped) delta of (job, fragment), by (round, path,
 * replica): what a restarted coordinator (or the async apply loop) still has to process.
 * free() the array. */
int store_list_pending_deltas(store *st, int64_t job, int fragment, store_delta **out, int *n);

/* One outer step of a fragment: the new version's blobs are already written. */
typedef struct {
  int64_t job;
  int fragment;
  int64_t round;           /* sync: the round it closes; async: the lease round of the delta */
  int64_t new_version;     /* must be the current version + 1 */
  const char *param_blob;
  uint32_t param_crc;
  const char *momentum_blob; /* may be NULL (zero) */
  uint32_t momentum_crc;
  const char *dnbuf_blob;    /* async delayed Nesterov; may be NULL */
  uint32_t dnbuf_crc;
  int64_t dn_t;
  const int64_t *applied;    /* delta ids consumed by this step; each must be 'received' */
  int n_applied;
  int close_round;           /* sync: close (job, fragment, round) and drop its other deltas */
  int keep;                  /* 1: exempt this version from GC (checkpoint interval) */
  int64_t now_ms;
} store_outer_commit;

/* Commit an outer step in one transaction: insert the version row, advance the fragment,
 * mark the applied deltas, and (close_round) close the round and mark its remaining
 * 'received' deltas dropped. DPC_ESTATE if new_version is not current + 1, a delta is not
 * 'received' or belongs elsewhere, or the round is already closed. */
int store_commit_outer(store *st, const store_outer_commit *c);

/* ---- garbage collection ------------------------------------------------------------------- */

/* Delete version rows of (job, fragment) older than the newest keep_last, except versions
 * marked keep and (keep_every > 0) multiples of keep_every. The blob names no longer
 * referenced are returned in *names (store_names_free) for the caller to delete AFTER this
 * call returns (the rows are already gone, so a crash in between leaks files, never rows). */
int store_gc_versions(store *st, int64_t job, int fragment, int keep_last, int keep_every, char ***names, int *n);
/* Collect the blobs of applied or dropped deltas of (job, fragment) with round <
 * before_round: their rows stay (the job's delta ledger: which lease's delta was applied to
 * which version, exactly once) with blob = '', and the names are returned the same way. */
int store_gc_deltas(store *st, int64_t job, int fragment, int64_t before_round, char ***names, int *n);
void store_names_free(char **names, int n);
/* Every blob name a row references (versions' parameter, momentum and async-buffer blobs,
 * deltas' spool blobs), unsorted, for the start-up sweep of orphaned blob files
 * (blob_store_sweep). Free with store_names_free. */
int store_blob_names(store *st, char ***names, int *n);

/* ---- async ledger (asynchronous Local-SGD, additive) ----------------------------------------- */

/* The ledger of an async fragment is its deltas table: each applied delta row records the
 * lease, slot, base version and the version it produced (applied_version); its staleness is
 * applied_version − 1 − base_version (the current version when it was applied minus the
 * version it was trained from). */

/* The oldest (lowest id = arrival order) 'received' delta of (job, fragment): returns 1 and
 * fills *out, or 0 when there is none. */
int store_next_pending_delta(store *st, int64_t job, int fragment, store_delta *out);
/* Mark one 'received' delta dropped (too stale); DPC_ESTATE if it is not 'received'. */
int store_drop_delta(store *st, int64_t id);
/* Applied deltas of (job, fragment) in applied order (by applied_version); free() the array. */
int store_list_ledger(store *st, int64_t job, int fragment, store_delta **out, int *n);
/* Deltas of job that were trained but never applied: dropped at apply (too stale) plus the
 * fragments of finished leases with no delta row (refused at push as too stale or late). */
int store_count_dropped(store *st, int64_t job, int64_t *n);
/* The closed rounds of (job, fragment) before `round`, newest first, at most max: for each, the
 * time from its first to its last applied delta (received_at, ms) in spread[i] and how many
 * deltas it applied in count[i]; *n rounds. */
int store_round_spreads(store *st, int64_t job, int fragment, int64_t round, int max, int64_t *spread, int *count,
                        int *n);
/* How many distinct workers finished a lease of slot (job, path, replica) in *n. */
int store_slot_trainers(store *st, int64_t job, int path, int replica, int64_t *n);
/* Goodput of job's ended leases: *leased = the inner steps they were granted, *merged = the
 * steps of those whose delta was applied (a partial delta: the steps it covers). */
int store_job_goodput(store *st, int64_t job, int64_t *leased, int64_t *merged);

/* ---- metrics ------------------------------------------------------------------------------ */

typedef struct store_metric {
  int64_t job, round;
  int path, replica;   /* -1 when not per slot (e.g. an outer step) */
  int64_t worker;      /* 0 when not from a worker */
  double loss;         /* NaN when not measured */
  int64_t tokens, bytes_in, bytes_out;
  double outer_seconds;
  int64_t created_at;
} store_metric;

int store_add_metric(store *st, const store_metric *m);
/* Metrics of a job with round >= since_round, by (round, id); free() the array. */
int store_list_metrics(store *st, int64_t job, int64_t since_round, store_metric **out, int *n);
/* The bytes a job's slot metric rows recorded: delta bytes received (as sent on the wire) and
 * parameter bytes pulled. */
int store_job_traffic(store *st, int64_t job, int64_t *bytes_in, int64_t *bytes_out);

#endif
