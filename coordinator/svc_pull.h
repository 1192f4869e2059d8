/* svc_pull.h — the dipaco.v1.Coordinator PullFragment (layer 4, see coord.h): parameters,
 * momentum and SparseLoCo rounds streamed to a lease's worker.
 *
 * Contract: the handler runs on the loop thread with ud = the coord; chunks are sent zero-copy
 * from reference-counted buffers that gRPC may release from its own threads. */
#ifndef DPC_COORD_SVC_PULL_H
#define DPC_COORD_SVC_PULL_H

#include "common/rpc.h"
#include "coordinator/coord.h"

/* Fill out[] with this file's methods (ud = c) and return how many. */
int svc_pull_methods(coord *c, struct rpc_method *out);

#endif
