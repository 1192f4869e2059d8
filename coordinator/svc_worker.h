/* svc_worker.h — the dipaco.v1.Coordinator methods of a worker's life (layer 4, see coord.h):
 * Register, Heartbeat, Lease (long-polled) and Release.
 *
 * Contract: the handlers run on the loop thread with ud = the coord. */
#ifndef DPC_COORD_SVC_WORKER_H
#define DPC_COORD_SVC_WORKER_H

#include "common/rpc.h"
#include "coordinator/coord.h"

/* Fill out[] with this file's methods (ud = c) and return how many; also registers the
 * answer of parked Lease calls (c->park_answer_cb), so call it before serving. */
int svc_worker_methods(coord *c, struct rpc_method *out);

#endif
