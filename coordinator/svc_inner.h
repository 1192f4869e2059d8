/* svc_inner.h — the inner-state checkpoint methods of dipaco.v1.Coordinator (layer 4, see
 * coord.h): PushInnerState and PullInnerState, and whether a slot has a checkpoint (the Lease
 * reply's has_inner_checkpoint).
 *
 * Contract: loop thread only; the handlers get ud = the coord. */
#ifndef DPC_COORD_SVC_INNER_H
#define DPC_COORD_SVC_INNER_H

#include "common/rpc.h"
#include "coordinator/coord.h"

/* 1 if the slot of lease l has a complete checkpoint (m and v of every fragment fids[0..nf))
 * of the round before l's. */
int svc_inner_ckpt_exists(coord *c, const coord_job *j, const store_lease *l, const int *fids, int nf);
/* Fill out[] with this file's methods (ud = c) and return how many. */
int svc_inner_methods(coord *c, struct rpc_method *out);

#endif
