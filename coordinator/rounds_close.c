/* rounds_close.c — when a sync round closes and with which deltas (contract in
 * rounds_close.h): all expected ones, or a quorum at the round's deadline or at the end of its
 * grace window. */
#include "coordinator/rounds_close.h"

#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"

#include <math.h>
#include <stdlib.h>

/* ceil(quorum · expected), at least 1: the deltas a round of fragment f needs to close short. */
static int quorum_need(const coord_job *j, int f) {
  int need = (int)ceil(j->spec.quorum * j->expected[f] - 1e-9);
  return need < 1 ? 1 : need;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* When the quorum of a round was reached: the need-th earliest first arrival (received_at, a
 * durable fact) among the slots of ds[0..n) (in (path, replica) order, one slot's deltas
 * adjacent), or INT64_MAX with fewer slots or no memory. A restarted coordinator computes the
 * same time, so a round's grace window ends when it would have without the restart. */
static int64_t quorum_reached_at(const store_delta *ds, int n, int need) {
  int64_t *first = malloc((size_t)(n > 0 ? n : 1) * sizeof *first);
  if (!first) return INT64_MAX;
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (k > 0 && ds[i - 1].path == ds[i].path && ds[i - 1].replica == ds[i].replica) {
      if (ds[i].received_at < first[k - 1]) first[k - 1] = ds[i].received_at;
    } else {
      first[k++] = ds[i].received_at;
    }
  }
  int64_t at = INT64_MAX;
  if (k >= need) {
    qsort(first, (size_t)k, sizeof *first, cmp_i64);
    at = first[need - 1];
  }
  free(first);
  return at;
}

/* The adaptive grace window (a quorum below 1 and no quorum_grace_s): twice the median
 * first-to-last delta spread of the last GRACE_ROUNDS rounds of the fragment that merged every
 * slot, within [GRACE_MIN_MS, GRACE_MAX_MS]; none (-1) until such a round exists. Healthy
 * rounds set it: a slow but live worker that keeps making the full rounds widens the spread,
 * and so the window, for itself; a dead one costs a round at most that long. It is computed
 * from durable rows (the closed rounds' applied deltas), so a restarted coordinator gets the
 * same window. */
#define GRACE_ROUNDS 8
#define GRACE_MIN_MS 250
#define GRACE_MAX_MS 60000

static int64_t grace_window_ms(coord *c, const coord_job *j, int f, int64_t t) {
  if (j->spec.has_quorum_grace) return (int64_t)llround(j->spec.quorum_grace_s * 1000.0);
  if (j->spec.quorum >= 1.0) return -1;
  int64_t spread[GRACE_ROUNDS];
  int count[GRACE_ROUNDS], n = 0, k = 0;
  if (store_round_spreads(c->st, j->id, f, t, GRACE_ROUNDS, spread, count, &n) < 0) return -1;
  for (int i = 0; i < n; i++)
    if (count[i] >= j->expected[f]) spread[k++] = spread[i];
  if (k == 0) return -1;
  qsort(spread, (size_t)k, sizeof *spread, cmp_i64);
  int64_t g = 2 * spread[k / 2];
  return g < GRACE_MIN_MS ? GRACE_MIN_MS : g > GRACE_MAX_MS ? GRACE_MAX_MS : g;
}

/* Whether a slot of round t of (j, f) missing from d[0..k) (the slots in, (path, replica)
 * order) can still deliver: an active lease of round t for it whose worker is connected (not
 * on c->lost). A quorum round need not wait out its grace window for slots that cannot: no
 * worker trains them (none was free; a SIGTERMed worker released its lease), or the one that
 * does has closed its connection. On an error it answers yes (the window decides). Not for
 * streaming jobs, whose leases span the rounds of several fragments. */
static int missing_can_arrive(coord *c, const coord_job *j, int f, int64_t t, const store_delta *d, int k) {
  store_lease *act;
  int na;
  if (store_list_active_leases(c->st, j->id, &act, &na) < 0) return 1;
  int can = 0;
  for (int i = 0; i < na && !can; i++) {
    if (act[i].round != t || !coord_job_path_has_fragment(j, act[i].path, f) || lease_worker_lost(c, act[i].worker))
      continue;
    int in = 0;
    for (int q = 0; q < k && !in; q++) in = d[q].path == act[i].path && d[q].replica == act[i].replica;
    can = !in;
  }
  free(act);
  return can;
}

/* Contract in rounds_close.h. */
int rounds_closing_deltas(coord *c, const coord_job *j, int f, int64_t t, int64_t now, store_delta **ds, int *n,
                          int *short_reason, int *early) {
  /* Called after every push: count first (one index scan), read the rows only when the round
   * can close. */
  int have;
  *early = 0;
  if (store_count_received_slots(c->st, j->id, f, t, &have) < 0 || have == 0) return -1;
  const int need = quorum_need(j, f);
  int past_deadline = 0;
  int64_t grace_ms = -1;
  if (have < j->expected[f]) {
    if (have < need) return -1;
    store_round r;
    past_deadline = store_get_round(c->st, j->id, f, t, &r) == 0 && r.deadline_at != 0 && now >= r.deadline_at;
    if (!past_deadline) grace_ms = grace_window_ms(c, j, f, t);
  }
  int nd;
  if (store_list_deltas(c->st, j->id, f, t, DELTA_RECEIVED, ds, &nd) < 0) return -1;
  store_delta *d = *ds;
  const int64_t quorum_at = have < j->expected[f] && !past_deadline ? quorum_reached_at(d, nd, need) : INT64_MAX;
  /* Keep one delta per slot (the newest), in (path, replica) order. */
  int k = 0;
  for (int i = 0; i < nd; i++) {
    if (k > 0 && d[k - 1].path == d[i].path && d[k - 1].replica == d[i].replica) d[k - 1] = d[i];
    else d[k++] = d[i];
  }
  *n = k;
  *short_reason = 0;
  if (k < j->expected[f]) {
    const int quorum = k > 0 && k >= need;
    if (quorum && past_deadline) {
      *short_reason = REVOKE_DEADLINE;
    } else if (quorum && grace_ms >= 0 && quorum_at != INT64_MAX && now >= quorum_at + grace_ms) {
      *short_reason = REVOKE_GRACE;
    } else if (quorum && !jobspec_streaming(&j->spec) && !missing_can_arrive(c, j, f, t, d, k)) {
      *short_reason = REVOKE_GRACE;
      *early = 1;
    } else {
      /* The window closes the round on time, not at the next tick (up to 500 ms later). */
      if (quorum && grace_ms >= 0 && quorum_at != INT64_MAX) loop_wake_at(c, quorum_at + grace_ms);
      free(d);
      *ds = NULL;
      return -1;
    }
  }
  return 0;
}

