/* svc_push.h — the dipaco.v1.Coordinator PushDelta (layer 4, see coord.h; PullFragment
 * is svc_pull.h).
 *
 * Contract: the handlers run on the loop thread with ud = the coord; a push's state is the
 * call's data (rpc_call_set_data) and outlives the call while its commit is in the pool. */
#ifndef DPC_COORD_SVC_PUSH_H
#define DPC_COORD_SVC_PUSH_H

#include "common/rpc.h"
#include "coordinator/coord.h"

/* Fill out[] with this file's methods (ud = c) and return how many. */
int svc_push_methods(coord *c, struct rpc_method *out);

#endif
