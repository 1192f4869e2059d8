/* metrics.h — the coordinator's HTTP listener (layer 4, see coord.h): GET /metrics
 * (Prometheus), GET / and /api/status (statuspage.h) on --metrics-listen HOST:PORT, over
 * libuv TCP on the loop.
 *
 * Contract: loop thread only; the listener is c->metrics, closed by metrics_stop (main.c
 * makes it coord.shutdown_cb). */
#ifndef DPC_COORD_METRICS_H
#define DPC_COORD_METRICS_H

#include "coordinator/coord.h"

/* Listen on addr (HOST:PORT, [v6]:PORT); 0 or a negative DPC_E* code with a message. */
int metrics_start(coord *c, const char *addr);
void metrics_stop(coord *c);

#endif
