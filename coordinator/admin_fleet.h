/* admin_fleet.h — the dipaco.v1.Admin views of workers and job progress (layer 4, see
 * coord.h): ListWorkers, DrainWorker, ListPaths, ListModules and GetMetrics.
 *
 * Contract: the handlers run on the loop thread with ud = the coord. */
#ifndef DPC_COORD_ADMIN_FLEET_H
#define DPC_COORD_ADMIN_FLEET_H

#include "common/rpc.h"
#include "coordinator/coord.h"

/* Fill out[] with this file's methods (ud = c) and return how many. */
int admin_fleet_methods(coord *c, struct rpc_method *out);

#endif
