/* worker.h — the dipaco-worker lease loop (DESIGN.md §1, proto/dipaco.proto): register, ask
 * for a lease, pull the path's fragments, run the inner steps with worker/trainer.c while a
 * heartbeat thread renews the lease, push the deltas, repeat; with retries, re-registration
 * and a clean stop on request. main() (worker/main.c) parses flags, handles signals and calls
 * worker_run; the helpers below are exposed for tests.
 *
 * Ownership: worker_run owns everything it creates and frees it before returning.
 * Thread-safety: worker_run drives one worker on the calling thread (plus the heartbeat
 * thread it starts); worker_stop may be called from any thread (e.g. a signal thread). */
#ifndef DPC_WORKER_H
#define DPC_WORKER_H

#include "kernels/gpt.h"

#include <stddef.h>
#include <stdint.h>

struct worker_opts {
  const char *coordinator;  /* host:port */
  const char *data_dir;     /* job data paths are resolved under it */
  const char *name;         /* RegisterRequest.hostname; NULL = gethostname() */
  const char *labels;       /* RegisterRequest.labels, may be NULL */
  gpt_backend_kind backend;
  int threads;              /* CPU threads, 0 = all cores */
  int device;               /* CUDA device ordinal */
  int precision;            /* CUDA: GPT_PREC_FP32 / TF32 / BF16 */
  int exit_when_done;       /* exit 0 on LEASE_NO_WORK once a job was seen running (a lease
                               granted or LEASE_WAIT), so a worker started first waits */
  uint32_t max_chunk_bytes; /* 0 = RPC_CHUNK_DEFAULT */
  uint32_t poll_ms;         /* Lease long-poll max_wait_ms, 0 = 5000 */
  int progress;             /* 1: single updating progress line on stderr (a terminal) */
  double slowdown;          /* >= 1 (0 = 1): after each inner step sleep (slowdown − 1) × the
                               step's measured time (simulated heterogeneity) */
};

/* Stop control shared between worker_run and whoever asks it to stop. */
typedef struct worker_ctl worker_ctl;
int worker_ctl_create(worker_ctl **out);
void worker_ctl_free(worker_ctl *c);
/* Ask the worker to stop: it releases a lease in progress (RELEASE_PREEMPTED), pushes
 * nothing and returns 0 from worker_run as soon as it can. Async-signal-unsafe (mutex):
 * call it from a signal thread, not a handler. */
void worker_stop(worker_ctl *c);
int worker_stopping(worker_ctl *c);

/* Run until stopped, drained (COMMAND_DRAIN), or done (--exit-when-done). Returns 0, or a
 * negative DPC_E* code for a failure that retrying cannot fix (e.g. the backend cannot be
 * created). */
int worker_run(const struct worker_opts *o, worker_ctl *ctl);

/* Resolve a job's training data: every entry of spec_json's "data.train" (or of `fallback`,
 * DataWindow.dataset split at ',', when the spec has none) is a path or glob(3) pattern relative to
 * data_dir (absolute paths and ".." components are refused); each pattern's matches are
 * sorted, patterns keep their order; a pattern that matches nothing is an error naming it.
 * *paths (n entries) is malloc'd: free with worker_free_paths. */
int worker_resolve_data(const char *data_dir, const char *spec_json, const char *fallback, char ***paths,
                        int *n);
void worker_free_paths(char **paths, int n);

/* Where each fragment of a lease goes in the path's flat parameter buffer. A path's modules
 * (one per level) are consecutive ranges of the canonical layout, level 0 first, so the
 * path buffer is their concatenation. FragmentInfo.offset_floats is relative to its module
 * (the proto) or, failing that, absolute in the path buffer (the two readings agree for one
 * level and cannot both fit for several). level[i], module[i], off[i], len[i] describe
 * fragment i of n; abs_off[i] receives its offset in the path buffer. Fragments must tile
 * [0, n_params) exactly (DPC_EFORMAT with the first gap or overlap otherwise). */
int worker_place_fragments(size_t n, const uint32_t *level, const uint64_t *module, const uint64_t *off,
                           const uint64_t *len, size_t n_params, size_t *abs_off);

#endif
