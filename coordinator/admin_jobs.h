/* admin_jobs.h — the dipaco.v1.Admin job methods (layer 4, see coord.h): CreateJob, ListJobs,
 * GetJob, PauseJob, ResumeJob, CancelJob and ExportPath.
 *
 * Contract: the handlers run on the loop thread with ud = the coord; creations queue in
 * struct coord (create_head...) and run one at a time. */
#ifndef DPC_COORD_ADMIN_JOBS_H
#define DPC_COORD_ADMIN_JOBS_H

#include "common/rpc.h"
#include "coordinator/coord.h"

/* Fill out[] with this file's methods (ud = c) and return how many. */
int admin_jobs_methods(coord *c, struct rpc_method *out);

#endif
