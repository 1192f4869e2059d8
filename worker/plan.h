/* plan.h — a granted lease checked and turned into what the worker runs: the model shape, the
 * trainer's settings (batch, schedule, AdamW or Muon + AdamW, data replica) and where each
 * fragment sits in the path's parameter buffer. Everything this worker cannot do
 * (grad_accum > 1, shuffle, DiPaCo routing, a delta codec it cannot encode, streaming settings
 * out of range or in a lease that is not streaming, an unknown inner optimizer) is refused
 * here, before any transfer starts.
 *
 * Ownership: lease_plan_build fills *p; lease_plan_free frees p->abs_off (also after a failed
 * build). Thread-safety: no shared state. */
#ifndef DPC_WORKER_PLAN_H
#define DPC_WORKER_PLAN_H

#include "kernels/gpt.h"
#include "proto/dipaco.pb-c.h"
#include "worker/trainer.h"

#include <stddef.h>

typedef struct {
  gpt_config cfg;
  trainer_opts opts;
  size_t *abs_off; /* (n_fragments) offset of fragment i in the path buffer */
  size_t n_params;
} lease_plan;

/* Validate lease L into *p (zeroed first). 0, or a negative DPC_E* code whose message names
 * the field and value refused. */
int lease_plan_build(const Dipaco__V1__Lease *L, lease_plan *p);
void lease_plan_free(lease_plan *p);

#endif
