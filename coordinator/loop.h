/* loop.h — the coordinator's libuv loop glue (layer 1, see coord.h): clocks, the loop and its
 * uv_async that runs gRPC completions, thread-pool work accounting, SIGTERM/SIGINT, the
 * housekeeping tick, the graceful shutdown once the loop is idle, and the /metrics
 * histograms every layer above observes into (coord_observe).
 *
 * Contract: everything here runs on the loop thread except loop_notify (any thread) and the
 * clocks (any thread). Higher layers are reached only through coord's tick_cb, stop_cb and
 * shutdown_cb. The loop owns the handles in struct coord (async, tick, sigterm, sigint); the
 * gRPC server c->srv is stopped here once a stop was asked and no work is in flight. */
#ifndef DPC_COORD_LOOP_H
#define DPC_COORD_LOOP_H

#include "common/clock.h"
#include "coordinator/coord.h"


/* Block SIGTERM/SIGINT in the calling thread (call before the gRPC server starts: its threads
 * inherit the mask, so signals reach only the loop thread) and ignore SIGPIPE. */
void loop_block_signals(void);
/* Take the default loop and its uv_async for gRPC completions (c->srv is dispatched there). */
void loop_init(coord *c);
/* The rpc_server_config.notify callback: wake the loop (ud = the coord). Any thread. */
void loop_notify(void *ud);
/* Unblock SIGTERM/SIGINT and watch them: the first one starts the graceful stop. */
void loop_watch_signals(coord *c);
/* Call c->tick_cb every tick_ms (and set up loop_wake_at's timer). */
void loop_start_tick(coord *c, int tick_ms);
/* Call c->wake_cb at dpc_wall_ms() time at_ms (once; the earliest of the times asked wins),
 * for what must happen on time rather than at the next tick: a quorum round's grace window. */
void loop_wake_at(coord *c, int64_t at_ms);
/* Stop at once (a start-up step failed after the server started): as after a signal, minus
 * the callbacks. */
void loop_stop_now(coord *c);
/* Run until every handle is closed; then close the loop. */
void loop_run(coord *c);
void loop_close(coord *c);

/* Wrap uv_queue_work so that shutdown waits for in-flight work: every queued request's after
 * callback must end with loop_work_done. */
int loop_queue_work(coord *c, uv_work_t *req, uv_work_cb work, uv_after_work_cb after);
void loop_work_done(coord *c);

/* Histograms (coord.hist, HIST_*): add one observation v to histogram h; the upper bounds of
 * h's buckets (*n of them, ascending; +Inf is implied). Loop thread. */
void coord_observe(coord *c, int h, double v);
const double *coord_hist_bounds(int h, int *n);

#endif
