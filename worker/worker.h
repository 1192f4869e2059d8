/* worker.h — the dipaco-worker lease loop (docs/design.md §1, proto/dipaco.proto): register, ask
 * for a lease, pull the path's fragments, run the inner steps with worker/trainer.c while a
 * heartbeat thread renews the lease, push the deltas, repeat; with retries, re-registration
 * and a clean stop on request. main() (worker/main.c) parses flags, handles signals and calls
 * worker_run; the helpers of data.h and the stop control of stop.h are included here, for
 * main() and for tests.
 *
 * Files (worker/): main.c flags and signals; worker.c the register / lease loop and the
 * protocol notes; lease.c one lease (plan, pull, train, push, finish); stream.c a Streaming
 * DiLoCo lease in place of pull, train and push; sparseloco.c SparseLoCo's error-feedback
 * buffers, sparse encoding and sparse pulls; replay.c replay pulls (catching up on a version
 * from the rounds' deltas as sent); plan.c a lease checked into a plan; slot.c the
 * trainer and AdamW state kept between leases (and inner.state checkpoint transfers);
 * heartbeat.c the heartbeat thread and the coordinator's commands; data.c training files and
 * fragment placement; stop.c stop control, sleeps and backoff; client.c the Coordinator RPCs;
 * storeget.c reads of the object store through a lease's presigned URLs; storeput.c the
 * delta objects a worker puts there;
 * trainer.c the network-free inner loop; opts.h the flags' values.
 *
 * Layers, lowest first: a module includes and calls only modules on its own line or below.
 * These "layer N:" lines are the one list of worker/'s modules; tests/arch/layers.py checks
 * the includes against them.
 *   layer 0: opts trainer
 *   layer 1: data client client_put stop storeget storeput
 *   layer 2: plan slot heartbeat
 *   layer 3: stream sparseloco replay
 *   layer 4: lease
 *   layer 5: worker
 *   layer 6: main
 *
 * Ownership: worker_run owns everything it creates and frees it before returning.
 * Thread-safety: worker_run drives one worker on the calling thread (plus the heartbeat
 * thread it starts); worker_stop may be called from any thread (e.g. a signal thread). */
#ifndef DPC_WORKER_H
#define DPC_WORKER_H

#include "kernels/gpt.h"
#include "worker/data.h"
#include "worker/opts.h"
#include "worker/stop.h"

#include <stddef.h>
#include <stdint.h>

/* Run until stopped, drained (COMMAND_DRAIN), or done (--exit-when-done). Returns 0, or a
 * negative DPC_E* code for a failure that retrying cannot fix (e.g. the backend cannot be
 * created). */
int worker_run(const struct worker_opts *o, worker_ctl *ctl);

#endif
