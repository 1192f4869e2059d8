/* rounds_close.h — which deltas close a sync round now (layer 3, see coord.h): every expected
 * slot's, or a quorum's at the round's deadline or at the end of its grace window (adaptive:
 * twice the median first-to-last spread of recent full rounds), or as soon as no missing slot
 * can still deliver. rounds.c starts the outer step over what this answers.
 *
 * Contract: loop thread only (reads the store and the connected workers). */
#ifndef DPC_COORD_ROUNDS_CLOSE_H
#define DPC_COORD_ROUNDS_CLOSE_H

#include "coordinator/coord.h"

/* The deltas that close round t of (j, f) now — one per slot (the newest), in (path, replica)
 * order: all expected ones; or, with at least ceil(quorum · expected), those in at the round
 * deadline (*short_reason = REVOKE_DEADLINE), or quorum_grace_s after the quorum was reached,
 * or as soon as no missing slot can still deliver (REVOKE_GRACE; *early set in that last
 * case). 0 with *ds (caller frees) and *n set, or -1 when the round stays open. The deadline
 * and the window are durable facts (the received rows, their received_at, the round's
 * deadline); the early close depends on which workers are connected, which a restarted
 * coordinator does not know (it then waits for the window). Either way the set merged is what
 * store_commit_outer records (applied; the rest of the round's deltas dropped), so a restart
 * replays every closed round as it was. */
int rounds_closing_deltas(coord *c, const coord_job *j, int f, int64_t t, int64_t now, store_delta **ds, int *n,
                          int *short_reason, int *early);

#endif
