/* coord.h — the coordinator daemon's shared state: the types every part of dipaco-coordinator
 * passes around (struct coord, coord_job, pcache_entry, lease_note). Functions live in each
 * module's own header, so that a file's #include lines show what it calls.
 *
 * Map. These "core:" and "layer N:" lines are the one list of coordinator/'s modules (x.c
 * with its x.h; a trailing * matches every file of that stem): tests/arch/layers.py checks includes
 * against them and coordinator.cmake builds the core library dpc_coord from the core line.
 * The core library (no gRPC, no libuv) is shared with dipacoctl; the layers are the daemon.
 * A daemon module calls only modules on its own layer or below it, and a lower one reaches a
 * higher one only through a callback stored here (struct coord's *_cb).
 *   core: jobspec* blobs* outerio delta_screen store* s3*
 *   layer 0: coord membudget testhook
 *   layer 1: loop selfcheck
 *   layer 2: jobs pcache
 *   layer 3: leases rounds rounds_close blobwatch
 *   layer 4: svc svc_worker svc_pull svc_push svc_push_commit svc_put svc_inner
 *   layer 4: admin_upload admin_jobs admin_fleet metrics statuspage
 *   layer 5: main
 * What they hold:
 *   (core) job specs (jobspec), the blob store (blobs; its bytes on S3: blobs_s3; objects
 *       workers put: blobs_put; the memory copies an S3 store reads again: blobs_cache), the outer
 *       steps streamed range by range over blobs and run in the thread pool (outerio), the
 *       delta norm screen (delta_screen), the SQLite store (store*), the S3 object-store client
 *       and its SigV4 signer (s3, s3_sigv4).
 *   (0) coord.h: this shared state; membudget.c: the memory a job needs and the budget it
 *       must fit; testhook.c: crash-point hooks for the fault tests.
 *   (1) loop.c: the libuv loop glue, clocks, thread-pool work accounting, signals, the tick
 *       timer and the shutdown once idle; selfcheck.c: the listener's self-check thread.
 *   (2) jobs.c: loaded jobs (coord_job) and heartbeat notes; pcache.c: parameter buffers.
 *   (3) leases.c: lease assignment, DyLU, lease ends, recovery, expiry, worker liveness and
 *       the registry of parked Lease long-polls; rounds.c (calls leases.c): round closing,
 *       the sync outer step, the async apply, garbage collection, the tick's work;
 *       blobwatch.c: the blob store's outages (S3), which hold leases and outer steps.
 *   (4) svc.c: what every RPC handler shares (authentication, unpacking, streaming out, calls
 *       held for pool work); handlers by service: svc_worker.c (Register, Heartbeat, Lease,
 *       Release; calls svc_inner.c), svc_pull.c (PullFragment), svc_push.c (PushDelta:
 *       receiving; calls svc_push_commit.c: decode, screen, commit; and svc_put.c:
 *       PrepareDeltaPut and the objects workers put on an S3 store), svc_inner.c (inner state),
 *       admin_upload.c, admin_jobs.c (calls admin_upload.c), admin_fleet.c; metrics.c
 *       (the HTTP listener: Prometheus /metrics; calls statuspage.c), statuspage.c (the
 *       status page / and /api/status).
 *   (5) main.c: flags, start-up, wiring of the callbacks, shutdown.
 *
 * Threading: one libuv loop thread owns everything here. gRPC completions reach it through
 * uv_async → rpc_server_dispatch; heavy work (delta spooling and fsync, outer steps, parameter
 * fills, exports) runs in the libuv thread pool on private buffers and hands results back to
 * the loop in the after-work callback. The only object shared with other threads is a pcache entry (a mapped
 * parameter blob) whose reference count is atomic, because gRPC releases zero-copy chunk
 * slices from its own threads. */
#ifndef DPC_COORD_H
#define DPC_COORD_H

#include "common/auth.h"
#include "coordinator/blobs.h"
#include "common/sparse.h"
#include "coordinator/jobspec.h"
#include "coordinator/store.h"

#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

/* A parameter buffer of one fragment version, served zero-copy to PullFragment streams: a
 * read-only mapping of the version's blob (map != NULL; its pages are the page cache's, shared
 * by every stream and reclaimable), or a heap copy (map == NULL) where mapping failed. */
typedef struct pcache_entry {
  int64_t job;
  int fragment;
  int64_t version;
  const float *data; /* (n) fp32 parameters, never written */
  void *map;         /* the blob mapping data points into (blob_unmap), or NULL: data is malloc'd */
  size_t map_len;
  size_t n;
  uint32_t crc;
  atomic_int refs; /* 1 for the cache's own reference + 1 per chunk gRPC still holds */
} pcache_entry;

/* coord_job.momentum: the newest sync version's momentum blob is stored; is being stored (its
 * commit on the thread pool); failed to be stored and must be made again; is being made again.
 * The fragment's next outer step waits for STORED (rounds.c). */
enum { COORD_MOMENTUM_STORED = 0, COORD_MOMENTUM_WRITING, COORD_MOMENTUM_LOST, COORD_MOMENTUM_REMAKING };

/* A job as the loop keeps it: the parsed spec and its derived structure. */
typedef struct coord_job {
  int64_t id;
  store_job_state state;
  jobspec spec;
  int n_modules, n_fragments, n_paths;
  jobspec_module *modules;     /* [n_modules] */
  jobspec_fragment *fragments; /* [n_fragments] */
  int *outer_busy;             /* [n_fragments]: an outer step is in flight */
  int *momentum;               /* [n_fragments]: COORD_MOMENTUM_* of the newest version's momentum blob
                                  (a sync step commits its version before that blob is stored) */
  atomic_int **momentum_hurry; /* [n_fragments]: while WRITING, the flag that sends it at full speed */
  int *outer_fails;            /* [n_fragments]: outer steps in a row that found a corrupt or missing blob */
  int64_t *outer_retry_at;     /* [n_fragments]: after a failed outer step (e.g. a full disk), no new
                                  try before this time (dpc_wall_ms) */
  int *expected;               /* [n_fragments]: deltas per round (slots through the module) */
  /* Round overhead: after a sync outer step made version ov_version[f], the time
   * from its last merged delta (ov_from_ms, dpc_wall_ms) until ov_pulled[f] reaches
   * expected[f] (every slot through the fragment has pulled that version whole). */
  int64_t *ov_version, *ov_from_ms;
  int *ov_pulled;
  double last_outer_s, last_overhead_s; /* job show: the last outer step's and round overhead's seconds */
  float *path_loss;            /* [n_paths]: latest loss reported on the path (NaN unknown) */
  float last_loss;             /* mean loss of the last closed round */
  int lease_errors;            /* leases in a row given back with RELEASE_ERROR (0 after one finishes) */
  uint64_t peak_sync_bytes;    /* job show's peak sync, from the spec alone (0 until first asked) */
  int n_slots;                 /* paths × replicas */
  /* diloco-async counters (since the coordinator started; the ledger in the store is the
   * durable record): deltas applied / dropped as too stale, staleness of the last applied
   * delta, the largest and the sum. */
  uint64_t async_applied, async_dropped;
  int64_t stale_last, stale_max;
  double stale_sum;
  struct screen_window_s *screen; /* [n_fragments] delta norm screen windows (svc_push.c); NULL until used */
  /* SparseLoCo jobs (spec.sparse.enabled): the codec settings and each fragment's tensor
   * lengths (sp_tlen[sp_first[f] .. sp_first[f] + sp_nt[f])) and encoded stream size. */
  dpc_sparse_cfg sp_cfg;
  uint64_t *sp_tlen;
  int *sp_first, *sp_nt;
  size_t *sp_bytes; /* [n_fragments] */
} coord_job;

/* An object PrepareDeltaPut named (svc_put.c): the PushDelta (PAYLOAD_DELTA_OBJECT) or
 * PushInnerState (PAYLOAD_INNER_OBJECT) that commits it must find it here with the same
 * checksum. */
typedef struct put_prep {
  int64_t lease;
  int frag;
  blob_kind kind;          /* BLOB_DELTA, or an inner-state blob (BLOB_INNER_*) */
  char name[BLOB_NAME_MAX];
  int64_t attempt;         /* the name's attempt stamp */
  uint32_t crc;            /* CRC-32C of the fp32 payload */
  uint64_t bytes;          /* the object's size (the blob file) */
  unsigned char md5[16];   /* MD5 of the object */
  int64_t made_ms;         /* dpc_wall_ms when named: entries older than two URL lives are dropped */
  uint64_t url_bytes;      /* what the URLs were made for (blob_url_ttl_s): the request's objects */
  int parts;               /* 0: one PUT; else put in this many parts of part_bytes */
  uint64_t part_bytes;     /* put_part_bytes when prepared: every part's size but the last's */
  unsigned char (*part_md5)[16]; /* [parts], owned */
  char upload_id[512];     /* the multipart upload the parts go to ("" for one PUT) */
} put_prep;

/* Latest heartbeat numbers of an active lease. */
typedef struct lease_note {
  int64_t lease;
  float loss;
  uint64_t tokens;
  uint64_t bytes_out; /* parameter bytes pulled under the lease */
  double pull_done_s; /* monotonic time the last parameter chunk of the lease was sent (0 =
                         none): training runs from then until the push starts (DyLU speed) */
  int64_t hb_at;      /* dpc_wall_ms of the lease's last sign of life: a heartbeat, a parameter
                         chunk sent, a delta chunk received (0 = none since the coordinator
                         started); a lease silent for coord.dead_after_ms is revoked (leases.c) */
} lease_note;

/* A Lease call held open (long-poll) until work frees or its deadline passes (leases.c keeps
 * them; the RPC layer answers them through coord.park_answer_cb). */
typedef struct lease_wait {
  void *call; /* the held call (a struct rpc_call *; opaque below the RPC layer) */
  int64_t worker, job, deadline;
  int64_t lease; /* Watch: the lease the worker trains (0: none) */
  double since; /* dpc_mono_s when parked (dipaco_lease_wait_seconds) */
} lease_wait;

/* What lease_assign (leases.h) found for a worker, also handed to coord.park_answer_cb;
 * SCHED_STOPPING only there: the coordinator is shutting down, answer UNAVAILABLE. */
enum { SCHED_GRANTED = 0, SCHED_WAIT = 1, SCHED_NO_WORK = 2, SCHED_STOPPING = 3 };

/* How coord.watch_answer_cb answers a held Watch call. */
enum { WATCH_HOLD_OVER = 0, WATCH_LEASE_ENDED = 1, WATCH_STOPPING = 2 };

/* Why the coordinator took an active lease away (dipaco_lease_revocations_total{reason}):
 * its worker missed dead_after_heartbeats heartbeats in a row; its TTL ran out with no
 * renewal; its round closed at round_timeout_s without it; or its quorum round closed at the
 * end of the quorum grace window (quorum_grace_s) without it; or its worker's Watch call ended
 * without an answer (the connection or process is gone) and no new one came within
 * --reconnect-grace-ms. */
enum { REVOKE_HEARTBEAT = 0, REVOKE_TTL, REVOKE_DEADLINE, REVOKE_GRACE, REVOKE_DISCONNECT, REVOKE_N };

/* The histograms of /metrics (loop.h coord_observe; metrics.c prints them): durations in
 * seconds of the outer steps, of receiving and recording a pushed delta fragment (first
 * chunk to durable record), of sending a pulled fragment (first to last chunk), of a Lease
 * call until its grant (0 when granted at once; else its time parked in the long-poll), of a
 * closed sync round from its first to its last merged delta; and the staleness of every
 * applied delta (versions; 0 for sync rounds). Bucket bounds: loop.c. */
enum { HIST_OUTER_STEP = 0, HIST_PUSH, HIST_PULL, HIST_LEASE_WAIT, HIST_ROUND_WAIT, HIST_STALENESS,
       HIST_ROUND_OVERHEAD, HIST_N };
#define COORD_HIST_MAX_BUCKETS 16
typedef struct coord_hist {
  uint64_t count[COORD_HIST_MAX_BUCKETS + 1]; /* count[i]: observations <= bound i; [n_bounds]: all */
  double sum;
} coord_hist;

struct rpc_server;
struct create_work;

typedef struct coord {
  uv_loop_t *loop;
  store *st;
  blob_store *bs;
  struct rpc_server *srv;
  struct selfcheck *selfcheck; /* the listener's self-check (selfcheck.h); NULL when off */
  char state_dir[1024];
  dpc_auth_keys keys; /* token hashes (main.c sets them before serving; zero = auth off) */
  int lease_ttl_ms, heartbeat_ms;
  int64_t dead_after_ms; /* a lease with no heartbeat for this long is revoked (leases.c):
                            max(--dead-after-heartbeats x heartbeat_ms, LEASE_DEAD_FLOOR_MS) */
  int64_t tick_prev_ms;  /* dpc_wall_ms of the previous lease_expire (loop stall detection) */
  int64_t worker_retention_ms; /* a worker silent this long and holding no lease is deleted (leases.c) */
  int64_t retire_next_ms;
  uint64_t memory_budget_bytes; /* job create refuses jobs estimated above it (membudget.h); 0 = none */      /* when lease_expire next looks for such workers */
  int64_t started_ms;    /* dpc_wall_ms() at start */
  int64_t push_seq;      /* the last push attempt number (delta spool names; starts at start-ms·1000) */
  /* Leases with a PushDelta stream writing a delta now (svc_push.c): one per lease, at
   * most COORD_MAX_PUSHES in all, so no worker can hold open spools without bound. */
  int64_t push_leases[256];
  int n_push_leases;
  /* Delta objects a worker was given presigned PUTs for and has not committed (svc_put.c). */
  struct put_prep *puts;
  int n_puts, cap_puts;
  int delta_puts; /* leases of jobs on an S3 store may put their fp32 deltas there (--no-delta-puts: 0) */
  uint64_t put_part_bytes; /* a put object above this goes in parts of this size (--s3-put-part-mb) */
  int64_t live_floor_ms; /* started_ms + RESTART_GRACE_MS: a worker not heard from since the start
                            counts as seen then (it could not call a dead process) */
  int stopping;     /* SIGTERM/SIGINT seen: refuse new work, shut down when idle */
  int work_inflight; /* uv_queue_work requests not yet completed */
  int shut_started;

  coord_job **jobs;
  int n_jobs, cap_jobs;

  pcache_entry **pcache;
  int n_pcache, cap_pcache;
  struct pcache_fill *pcache_fills; /* versions being mapped on the thread pool (pcache.c) */
  struct svc_hold *holds;           /* calls waiting on the thread pool's work (svc.c) */

  lease_note *notes;
  int n_notes, cap_notes;

  lease_wait *parked; /* parked Lease long-polls (leases.c) */
  int n_parked, cap_parked;
  /* Watch calls held open (leases.c): deadline = when to answer it (the worker calls again). */
  lease_wait *watches;
  int n_watches, cap_watches;
  /* Workers whose last Watch (or parked Lease) ended without an answer (leases.c): job = when,
   * deadline = when their active leases are revoked (and they count as gone if they made no
   * call since) unless a new Watch, Register, granted Lease or later heartbeat comes first. */
  lease_wait *lost;
  int n_lost, cap_lost;
  int reconnect_grace_ms; /* --reconnect-grace-ms; 0 = a closed Watch revokes nothing */

  /* CreateJob queue (admin_jobs.c): creations run one at a time, the rest wait in arrival
   * order; cur is the one on the thread pool. */
  struct create_work *create_head, *create_tail, *create_cur;
  int create_busy;

  uint64_t next_upload_id;
  uint64_t export_seq;

  /* The blob store's health as blobwatch.c last saw it (loop thread): while an S3 store is
   * down no lease is granted and no outer step starts; a probe on the thread pool every
   * BLOBWATCH_PROBE_MS finds out when it is back. */
  struct coord_store_health {
    int down, probing;
    int64_t since_ms, probe_at_ms, outages;
    char reason[512];
    uv_work_t req;
  } store_health;

  /* counters for /metrics */
  uint64_t rounds_total, bytes_in, bytes_out, outer_steps;
  uint64_t deltas_rejected; /* PushDelta streams refused as malformed or corrupt (nothing stored) */
  /* Workers' pulls under a lease by kind, [0] whole fragments (PAYLOAD_PARAMS), [1] replayed
   * rounds (PAYLOAD_REPLAY_ROUND, PAYLOAD_SPARSE_ROUND), [2] outer momenta
   * (PAYLOAD_OUTER_MOMENTUM): streams completed and bytes sent. */
  uint64_t pulls[3], pull_bytes[3];
  uint64_t revocations[REVOKE_N]; /* active leases taken away, by REVOKE_* reason */
  coord_hist hist[HIST_N];        /* by HIST_* (coord_observe) */

  /* Callbacks by which a lower layer reaches a higher one (main.c sets them; NULL = none). */
  void (*tick_cb)(struct coord *c);     /* loop.c, every tick: housekeeping (rounds_tick) */
  void (*stop_cb)(struct coord *c);     /* loop.c, on SIGTERM/SIGINT: answer parked calls */
  void (*shutdown_cb)(struct coord *c); /* loop.c, idle after a stop: close other listeners */
  void (*wake_cb)(struct coord *c);     /* loop.c, at a time asked by loop_wake_at: rounds_check */
  /* leases.c: answer a parked Lease call taken off the registry; outcome is SCHED_* or a
   * negative DPC_E* code; l is the lease when SCHED_GRANTED. */
  void (*park_answer_cb)(struct coord *c, void *call, int64_t worker, int outcome, const store_lease *l);
  /* leases.c: answer a held Watch call taken off the registry: WATCH_HOLD_OVER (the worker
   * calls again), WATCH_LEASE_ENDED (its lease ended here), WATCH_STOPPING (UNAVAILABLE). */
  void (*watch_answer_cb)(struct coord *c, void *call, int how);

  uv_async_t async;
  uv_timer_t tick;
  uv_timer_t wake; /* loop_wake_at's one-shot timer */
  int64_t wake_at; /* when it fires (dpc_wall_ms; 0 = not armed) */
  uv_signal_t sigterm, sigint;
  uv_tcp_t metrics;
  int metrics_on;
} coord;

#endif
