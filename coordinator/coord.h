/* coord.h — the coordinator daemon's shared state and the functions its parts call on each
 * other (main.c: loop, flags, signals, timers; service.c: Coordinator RPCs; admin.c: Admin
 * RPCs; sched.c: lease assignment, round closing and the outer step; metrics.c: Prometheus
 * endpoint).
 *
 * Threading: one libuv loop thread owns everything here. gRPC completions reach it through
 * uv_async → rpc_server_dispatch; heavy work (delta blob fsync, outer steps) runs in the libuv
 * thread pool on private copies and hands results back to the loop in the after-work
 * callback. The only object shared with other threads is a pcache entry (parameter buffer)
 * whose reference count is atomic, because gRPC releases zero-copy chunk slices from its
 * own threads. */
#ifndef DPC_COORD_H
#define DPC_COORD_H

#include "common/rpc.h"
#include "coordinator/blobs.h"
#include "coordinator/jobspec.h"
#include "coordinator/store.h"

#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

/* A parameter buffer of one fragment version, served zero-copy to PullFragment streams. */
typedef struct pcache_entry {
  int64_t job;
  int fragment;
  int64_t version;
  float *data; /* (n) fp32 parameters */
  size_t n;
  uint32_t crc;
  atomic_int refs; /* 1 for the cache's own reference + 1 per chunk gRPC still holds */
} pcache_entry;

/* A job as the loop keeps it: the parsed spec and its derived structure. */
typedef struct coord_job {
  int64_t id;
  store_job_state state;
  jobspec spec;
  int n_modules, n_fragments, n_paths;
  jobspec_module *modules;     /* [n_modules] */
  jobspec_fragment *fragments; /* [n_fragments] */
  int *outer_busy;             /* [n_fragments]: an outer step is in flight */
  int64_t *outer_retry_at;     /* [n_fragments]: after a failed outer step (e.g. a full disk), no new
                                  try before this time (coord_now_ms) */
  int *expected;               /* [n_fragments]: deltas per round (slots through the module) */
  float *path_loss;            /* [n_paths]: latest loss reported on the path (NaN unknown) */
  float last_loss;             /* mean loss of the last closed round */
  int n_slots;                 /* paths × replicas */
  /* diloco-async counters (since the coordinator started; the ledger in the store is the
   * durable record): deltas applied / dropped as too stale, staleness of the last applied
   * delta, the largest and the sum. */
  uint64_t async_applied, async_dropped;
  int64_t stale_last, stale_max;
  double stale_sum;
  struct screen_window_s *screen; /* [n_fragments] delta norm screen windows (service.c); NULL until used */
} coord_job;

/* Latest heartbeat numbers of an active lease. */
typedef struct lease_note {
  int64_t lease;
  float loss;
  uint64_t tokens;
  uint64_t bytes_out; /* parameter bytes pulled under the lease */
  double pull_done_s; /* monotonic time the last parameter chunk of the lease was sent (0 =
                         none): training runs from then until the push starts (DyLU speed) */
} lease_note;

typedef struct coord {
  uv_loop_t *loop;
  store *st;
  blob_store *bs;
  struct rpc_server *srv;
  char state_dir[1024];
  int lease_ttl_ms, heartbeat_ms;
  int64_t started_ms;    /* coord_now_ms() at start */
  int64_t live_floor_ms; /* started_ms + RESTART_GRACE_MS: a worker not heard from since the start
                            counts as seen then (it could not call a dead process) */
  int stopping;     /* SIGTERM/SIGINT seen: refuse new work, shut down when idle */
  int work_inflight; /* uv_queue_work requests not yet completed */
  int shut_started;

  coord_job **jobs;
  int n_jobs, cap_jobs;

  pcache_entry **pcache;
  int n_pcache, cap_pcache;

  lease_note *notes;
  int n_notes, cap_notes;

  uint64_t next_upload_id;
  uint64_t export_seq;

  /* counters for /metrics */
  uint64_t rounds_total, bytes_in, bytes_out, outer_steps;
  double outer_seconds_sum, outer_seconds_last;

  uv_async_t async;
  uv_timer_t tick;
  uv_signal_t sigterm, sigint;
  uv_tcp_t metrics;
  int metrics_on;
} coord;

int64_t coord_now_ms(void);
double coord_mono_s(void); /* CLOCK_MONOTONIC seconds */

/* ---- jobs (sched.c) ---- */
coord_job *coord_job_get(coord *c, int64_t id);
/* Load every job from the store into c->jobs (at start-up). */
int coord_jobs_load(coord *c);
/* Add a freshly created job (takes ownership of j). */
int coord_job_add(coord *c, coord_job *j);
/* Build a coord_job from a store row (parses the spec). Caller frees with coord_job_free. */
int coord_job_from_store(const store_job *sj, coord_job **out);
void coord_job_free(coord_job *j);
/* Change a job's state in the store and the cache. */
int coord_job_set_state(coord *c, coord_job *j, store_job_state s, const char *why);

/* ---- scheduling (sched.c) ---- */
enum { SCHED_GRANTED = 0, SCHED_WAIT = 1, SCHED_NO_WORK = 2 };
/* Find or grant a lease for worker w (job_filter 0 = any). Returns SCHED_* or a negative
 * DPC_E* code; *lease is filled when granted. */
int sched_lease(coord *c, int64_t worker, int64_t job_filter, store_lease *lease);
/* Look at every running job's fragments: start outer steps whose round is complete (or past
 * its deadline with quorum). Called after every delta and on every timer tick. */
void sched_check_rounds(coord *c);
/* Periodic housekeeping: lease expiry, worker liveness, round deadlines. */
void sched_tick(coord *c);
/* Worker liveness: seen within the lease TTL and not gone. */
int sched_worker_alive(coord *c, const store_worker *w, int64_t now);
/* Paths through module m: 1 if path p contains fragment f's module. */
int sched_path_has_fragment(const coord_job *j, int path, int fragment);
/* After all fragments of a lease were pushed: end it (finished, slot advances). */
void sched_lease_pushed(coord *c, int64_t lease_id);
/* If every fragment of active lease l already has its delta recorded (durable), end it as
 * finished via sched_lease_pushed and return 1; else 0. Idempotent: pushes, releases, expiry
 * and restart recovery all go through it, so a lease whose work is in never reopens a round. */
int sched_lease_maybe_pushed(coord *c, const store_lease *l);
/* Restart recovery: finish every active lease whose deltas are all durable (a crash between
 * acknowledging the last delta and ending the lease leaves such leases behind). */
void sched_recover_leases(coord *c);
/* Fold one steps/s sample of a worker (a heartbeat's steps_per_sec, or a completed lease's
 * steps / seconds between the end of its pull and the start of its push) into its EWMA (store_worker.steps_per_s): v ← 0.7·v + 0.3·sample,
 * or the sample itself when v is still unknown. DyLU reads it. */
void sched_speed_sample(coord *c, int64_t worker, double sample);
/* diloco-async: the staleness the coordinator would see for a delta trained from base
 * version `base` of fragment f now (current version − base); -1 if unknown. */
int64_t sched_async_staleness(coord *c, const coord_job *j, int fragment, int64_t base);

/* ---- parameter cache (sched.c) ---- */
/* Get a referenced entry for (job, fragment, version), loading the blob if needed. The caller
 * drops its reference with pcache_unref. */
int pcache_get(coord *c, const store_fragment *f, pcache_entry **out);
/* Insert a new version's buffer (ownership of data passes to the cache). */
void pcache_put(coord *c, int64_t job, int fragment, int64_t version, float *data, size_t n, uint32_t crc);
void pcache_unref(void *entry); /* any thread */
void pcache_clear(coord *c);

/* ---- lease notes (sched.c) ---- */
lease_note *coord_note(coord *c, int64_t lease, int create);
void coord_note_drop(coord *c, int64_t lease);

/* ---- work accounting (main.c) ---- */
/* Wrap uv_queue_work so that shutdown waits for in-flight work. */
int coord_queue_work(coord *c, uv_work_t *req, uv_work_cb work, uv_after_work_cb after);
void coord_work_done(coord *c);

/* ---- RPC method tables ---- */
extern const struct rpc_method coord_service_methods[];
extern const int coord_service_n_methods;
extern const struct rpc_method coord_admin_methods[];
extern const int coord_admin_n_methods;
/* The coord pointer the method handlers use (set by main before the server starts). */
extern coord *g_coord;

/* ---- helpers shared by service.c and admin.c ---- */
/* Fill a FragmentInfo (wire ids are internal ids + 1). */
struct Dipaco__V1__FragmentInfo;
void coord_fill_fragment_info(const coord_job *j, const store_fragment *f, int64_t version,
                              struct Dipaco__V1__FragmentInfo *fi);
/* A server-streaming answer made of up to two byte strings sent as Chunk streams one after
 * another (PullFragment: the parameters; ExportPath: config.json then safetensors). The
 * bytes are sent zero-copy: ref(ud) is taken per chunk and unref(ud) runs when gRPC lets go;
 * the stream holds one reference of its own, dropped when the call ends. */
typedef struct out_part {
  const uint8_t *data;
  uint64_t total;
  uint32_t crc, payload;
  uint64_t fragment_id, version, num_floats;
  uint64_t step; /* Chunk.step (inner-state streams: the AdamW step), 0 otherwise */
} out_part;

typedef struct out_stream {
  coord *c;
  int nparts, cur;
  out_part part[2];
  uint64_t next, lease_id;
  uint32_t chunk;
  void (*ref)(void *ud);
  void (*unref)(void *ud);
  void *ud;
} out_stream;

/* Take ownership of os (one reference on ud included) and start sending on call. */
void coord_stream_start(struct rpc_call *call, out_stream *os);
void coord_stream_on_sent(struct rpc_call *call, int ok, void *ud);
void coord_stream_on_done(struct rpc_call *call, int cancelled, void *ud);
/* Clamp a requested chunk size to [RPC_CHUNK_MIN, RPC_CHUNK_DEFAULT] (0 = default). */
uint32_t coord_chunk_size(uint32_t requested);

/* service.c: retry long-polled Lease calls (flush: answer them all UNAVAILABLE). */
void coord_retry_parked(coord *c, int flush);
/* 1 if the worker has a long-polled Lease call open (so it is alive). */
int coord_is_parked(int64_t worker);
/* admin.c: upload ids continue after the largest stored upload. */
void admin_init_uploads(coord *c);
/* service.c: take one reference on a pcache entry (any thread). */
void coord_pcache_ref(void *entry);

/* ---- metrics (metrics.c) ---- */
int metrics_start(coord *c, const char *addr);
void metrics_stop(coord *c);

#endif
