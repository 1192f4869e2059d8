/* statuspage.h — the coordinator's read-only status page (layer 4, see coord.h): one
 * snapshot of the jobs (state, progress, losses per path, a loss history), the workers and
 * their devices, and the process totals, rendered as JSON (GET /api/status) and as a
 * self-contained HTML page with the loss charts drawn as inline SVG (GET /): no script, no
 * external asset, a meta refresh every STATUSPAGE_REFRESH_S seconds. metrics.c's listener
 * (--metrics-listen) serves both.
 *
 * Bounded: STATUSPAGE_MAX_JOBS jobs (live ones first, then the newest finished), loss
 * histories for the first STATUSPAGE_MAX_CHARTS of them over their last
 * STATUSPAGE_HISTORY_ROUNDS rounds and first STATUSPAGE_MAX_PATHS paths, the latest loss of
 * the first STATUSPAGE_MAX_PATH_ROWS paths, STATUSPAGE_MAX_WORKERS workers.
 *
 * Contract: loop thread only: it reads struct coord and the store as the /metrics handler
 * does, so it never races the loop. Every string from a job spec or a worker is escaped
 * (JSON by cJSON; HTML and SVG text by dpc_xml_escape). */
#ifndef DPC_COORD_STATUSPAGE_H
#define DPC_COORD_STATUSPAGE_H

#include "coordinator/coord.h"

#include <stddef.h>

#define STATUSPAGE_REFRESH_S 5
#define STATUSPAGE_MAX_JOBS 20
#define STATUSPAGE_MAX_CHARTS 4
#define STATUSPAGE_HISTORY_ROUNDS 500
#define STATUSPAGE_MAX_PATHS 8
#define STATUSPAGE_MAX_PATH_ROWS 64
#define STATUSPAGE_MAX_WORKERS 200

/* The status as JSON (/api/status) or HTML (/): *out is malloc'd (the caller frees it), *n
 * its length. 0 or DPC_ENOMEM. */
int statuspage_json(coord *c, char **out, size_t *n);
int statuspage_html(coord *c, char **out, size_t *n);

#endif
