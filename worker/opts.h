/* opts.h — the worker daemon's settings (struct worker_opts), filled by main() from its flags
 * and read by the lease loop (worker.c), one lease (lease.c) and the trainer cache (slot.c).
 *
 * Ownership: the strings point into argv (or the caller's storage) and must outlive
 * worker_run; nothing here is freed by the worker. Thread-safety: read-only once worker_run
 * has started. */
#ifndef DPC_WORKER_OPTS_H
#define DPC_WORKER_OPTS_H

#include "kernels/gpt.h"

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
  double min_step_ms;       /* > 0: each inner step takes at least this long (a device of a fixed
                               speed, whatever else runs on this machine) */
  double drain_finish_s;    /* after SIGTERM, finish the lease in training when its remaining
                               steps should take at most this long (0: stop after the step) */
};

#endif
