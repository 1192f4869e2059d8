/* leases.c — which slot a worker gets and when its lease ends: lease assignment (sticky to the
 * worker that trained a slot last, for inner_state = keep), DyLU lease lengths from the
 * workers' speed, lease ends once every delta is durable, restart recovery, lease expiry,
 * worker liveness, and the registry of Lease calls parked until work frees.
 *
 * Sync rule: fragment f's version v counts its closed rounds, so round v of f is the open
 * one. A slot (path p, replica r) trains round t = slot.round; it may be leased when it is
 * idle, t < rounds, and every fragment on its path is at version t with no outer step in
 * flight. Streaming (jobspec_streaming): at version t − 1 or later — the slot trains round t
 * (inner steps (t·H, (t+1)·H], one sync of every fragment, each against version t) while
 * round t − 1 may still be closing, and pulls version t when its merge step comes.
 *
 * Async rule (algorithm "diloco-async", docs/design.md §3): any idle slot may be leased from the
 * CURRENT versions of its fragments once those include every acknowledged delta (while a
 * delta is queued or being applied the Lease waits: staleness counts only other workers'
 * deltas); the lease's first step is the slot's own
 * inner-step counter s (store_slot.inner_steps) and its length is H, or with DyLU
 * H_w = max(min_steps, floor(H · v_w / v_max)) from the workers' steps/s EWMA (H for a
 * worker not measured yet), cut to the job's remaining budget rounds × H × slots minus the
 * steps already trained or leased, so the total is exact. Its inner LR schedule starts at the job's
 * progress (lease_async_progress), not at s. (How deltas are applied: rounds.c.) */
#include "coordinator/leases.h"

#include "common/errors.h"
#include "common/log.h"
#include "coordinator/jobs.h"
#include "coordinator/loop.h"
#include "coordinator/blobwatch.h"

#include <math.h>
#include <stdlib.h>

int lease_worker_alive(coord *c, const store_worker *w, int64_t now) {
  if (lease_is_parked(c, w->id)) return 1;
  /* After a restart, silence counts from the start (see main.c's recovery). */
  const int64_t seen = w->last_seen >= c->started_ms ? w->last_seen : c->live_floor_ms;
  return w->state != WORKER_GONE && now - seen <= c->lease_ttl_ms;
}

/* Fragments on path p of job j with their current versions; 1 if all are at version t with
 * no outer step in flight. Streaming: round t may start while round t − 1 is still open (the
 * slot trains on and merges version t when it arrives), never earlier. */
static int path_ready(coord *c, coord_job *j, int path, int64_t t, const store_fragment *frags) {
  (void)c;
  const int streaming = jobspec_streaming(&j->spec);
  for (int f = 0; f < j->n_fragments; f++) {
    if (!coord_job_path_has_fragment(j, path, f)) continue;
    if (streaming ? frags[f].version < t - 1 : frags[f].version != t || j->outer_busy[f]) return 0;
  }
  return 1;
}

/* Async: 1 if no fragment on path p has an outer step in flight or a delta acknowledged but
 * not yet applied (or dropped), so that a lease granted now includes every acknowledged
 * delta; 0 while one is queued (the Lease waits for it); a negative DPC_E* code. */
static int async_path_settled(coord *c, coord_job *j, int path) {
  for (int f = 0; f < j->n_fragments; f++) {
    if (!coord_job_path_has_fragment(j, path, f)) continue;
    if (j->outer_busy[f]) return 0;
    store_delta d;
    int rc = store_next_pending_delta(c->st, j->id, f, &d);
    if (rc != 0) return rc < 0 ? rc : 0;
  }
  return 1;
}

/* Grant slot s of j to worker for `steps` inner steps. sched: where the lease starts on the
 * inner LR schedule (async: the job's progress; sync: −1, the slot's own step). */
static int grant(coord *c, coord_job *j, const store_slot *s, int64_t worker, const store_fragment *frags, int steps,
                 int64_t sched, store_lease *out) {
  int async = j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC;
  int frag_ids[JOBSPEC_MAX_MODULES];
  int64_t bases[JOBSPEC_MAX_MODULES];
  int nf = 0;
  for (int f = 0; f < j->n_fragments && nf < JOBSPEC_MAX_MODULES; f++)
    if (coord_job_path_has_fragment(j, s->path, f)) {
      frag_ids[nf] = f;
      bases[nf++] = async ? frags[f].version : s->round; /* streaming: t, perhaps not made yet */
    }
  int64_t now = dpc_wall_ms();
  int64_t deadline = j->spec.round_timeout_s > 0 ? now + (int64_t)(j->spec.round_timeout_s * 1000.0) : 0;
  for (int i = 0; i < nf && !async; i++) {
    int rc = store_open_round(c->st, j->id, frag_ids[i], s->round, now, deadline);
    if (rc < 0) return rc;
  }
  const int64_t step_begin = async ? s->inner_steps : s->round * j->spec.inner_steps;
  store_new_lease nl = {.job = j->id, .path = s->path, .replica = s->replica, .worker = worker, .round = s->round,
                        .inner_steps = steps, .step_begin = step_begin,
                        .sched_shift = sched >= 0 ? sched - step_begin : 0,
                        .n_fragments = nf, .fragments = frag_ids, .base_versions = bases, .now_ms = now,
                        .expires_at = now + c->lease_ttl_ms};
  int64_t id;
  int rc = store_create_lease(c->st, &nl, &id);
  if (rc < 0) return rc;
  rc = store_get_lease(c->st, id, out);
  if (rc < 0) return rc;
  DPC_INFO("lease %lld granted: job %lld slot (path %d, replica %d) round %lld steps [%lld, %lld) to worker %lld",
           (long long)id, (long long)j->id, s->path, s->replica, (long long)s->round, (long long)nl.step_begin,
           (long long)(nl.step_begin + nl.inner_steps), (long long)worker);
  return SCHED_GRANTED;
}

/* ---- async: budget, DyLU, worker speed ------------------------------------------------------ */

/* rounds × H × slots minus the steps the slots trained and the steps of active leases. */
int64_t lease_async_budget_left(const coord_job *j, const store_slot *slots, int ns, const store_lease *act, int na) {
  int64_t left = (int64_t)j->spec.rounds * j->spec.inner_steps * j->n_slots;
  for (int i = 0; i < ns; i++) left -= slots[i].inner_steps;
  for (int i = 0; i < na; i++)
    if (act[i].job == j->id) left -= act[i].inner_steps;
  return left;
}

/* The job's progress on the inner LR schedule, in steps per slot: the steps trained or leased
 * by all slots over the number of slots, ⌊(rounds·H·slots − left) / slots⌋ ∈ [0, rounds·H).
 * Every async lease starts its schedule there, so that a fast slot does not run past the
 * schedule's end while a slow one still trains at the peak rate: the schedule follows the
 * job's compute, as a sync job's does. */
int64_t lease_async_progress(const coord_job *j, int64_t left) {
  int64_t total = (int64_t)j->spec.rounds * j->spec.inner_steps * j->n_slots;
  int64_t used = total - left;
  if (used < 0) used = 0;
  return used / (j->n_slots > 0 ? j->n_slots : 1);
}

/* H_w for worker `me`: H without DyLU or without a measurement of me, else
 * max(min_steps, floor(H · v_w / v_max)) over the living workers' EWMAs. */
static int dylu_steps(coord *c, const coord_job *j, const store_worker *me, int64_t now) {
  int H = j->spec.inner_steps;
  if (!j->spec.dylu.enabled || !(me->steps_per_s > 0)) return H;
  store_worker *ws;
  int nw;
  double vmax = me->steps_per_s;
  if (store_list_workers(c->st, &ws, &nw) == 0) {
    for (int i = 0; i < nw; i++)
      if (ws[i].steps_per_s > vmax && ws[i].state != WORKER_GONE && lease_worker_alive(c, &ws[i], now))
        vmax = ws[i].steps_per_s;
    free(ws);
  }
  int hw = (int)floor((double)H * me->steps_per_s / vmax);
  if (hw < j->spec.dylu.min_steps) hw = j->spec.dylu.min_steps;
  return hw > H ? H : hw;
}

void lease_speed_sample(coord *c, int64_t worker, double sample) {
  if (!isfinite(sample) || sample <= 0) return;
  store_worker w;
  if (store_get_worker(c->st, worker, &w) < 0) return;
  double v = w.steps_per_s > 0 ? 0.7 * w.steps_per_s + 0.3 * sample : sample;
  store_touch_worker(c->st, worker, w.last_seen, v);
}

int64_t lease_async_staleness(coord *c, const coord_job *j, int fragment, int64_t base) {
  store_fragment f;
  if (store_get_fragment(c->st, j->id, fragment, &f) < 0) return -1;
  return f.version - base;
}


/* The slots of j a Lease may look at: every slot (async), or the idle ones whose round lies
 * within the fragments' versions (sync). Sets *any_work when the job still has work. */
static int job_slots(coord *c, const coord_job *j, const store_fragment *frags, int nf, store_slot **slots, int *ns,
                     int *any_work) {
  if (j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC) return store_list_slots(c->st, j->id, slots, ns);
  /* Sync: only idle slots whose round lies within the fragments' versions can be ready
   * (path_ready); reading just those keeps a Lease poll off the other slots' rows. */
  int64_t lo = INT64_MAX, hi = -1;
  for (int f = 0; f < nf; f++) {
    if (frags[f].version < lo) lo = frags[f].version;
    if (frags[f].version > hi) hi = frags[f].version;
  }
  if (jobspec_streaming(&j->spec)) hi++; /* path_ready: a streaming slot may run one round ahead */
  if (hi > (int64_t)j->spec.rounds - 1) hi = (int64_t)j->spec.rounds - 1;
  int rc = store_any_slot_below(c->st, j->id, j->spec.rounds);
  if (rc > 0) *any_work = 1;
  if (rc >= 0) rc = store_list_idle_slots(c->st, j->id, lo, hi, slots, ns);
  return rc;
}

/* The worker's own slot first; only without one, the first free slot (which may look up the
 * last worker of every slot before it: not once per slot for every Lease call). */
/* 1 if worker w holds an active lease among act[0..na). */
static int worker_busy(const store_lease *act, int na, int64_t w) {
  for (int i = 0; i < na; i++)
    if (act[i].worker == w && act[i].state == LEASE_ACTIVE) return 1;
  return 0;
}

/* 1 if two or more workers have finished leases of slot s (durable): its AdamW state (keep)
 * has been restarted at least once. */
static int slot_retrained(coord *c, const coord_job *j, const store_slot *s) {
  int64_t n = 0;
  return store_slot_trainers(c->st, j->id, s->path, s->replica, &n) == 0 && n >= 2;
}

static const store_slot *pick_slot(coord *c, coord_job *j, const store_slot *slots, int ns, int64_t worker,
                                   const store_fragment *frags, const store_lease *act, int na, int64_t now,
                                   int *any_work) {
  int async = j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC;
  /* Its own slot first; of several (it took over a dead worker's), one it has trained from the
   * start, so that the retrained one can go to an idle worker meanwhile (below). */
  const store_slot *own = NULL;
  for (int i = 0; i < ns; i++) {
    const store_slot *s = &slots[i];
    if (!async && s->round < j->spec.rounds) *any_work = 1;
    if (s->state != SLOT_IDLE || (!async && s->round >= j->spec.rounds)) continue;
    if (s->last_worker == worker && (async || path_ready(c, j, s->path, s->round, frags))) {
      if (j->spec.inner.state != INNER_STATE_KEEP || !slot_retrained(c, j, s)) return s;
      if (!own) own = s;
    }
  }
  if (own) return own;
  for (int i = 0; i < ns; i++) {
    const store_slot *s = &slots[i];
    if (s->state != SLOT_IDLE || (!async && s->round >= j->spec.rounds)) continue;
    if (!async && !path_ready(c, j, s->path, s->round, frags)) continue;
    store_worker lw;
    /* inner_state keep: a slot whose last worker is alive stays reserved for it (its AdamW
     * state is there), even while that worker trains another slot: moving it would silently
     * change the result (e.g. a worker that started before the others trains two slots in
     * turn, exactly). Other policies carry no state in the worker; inner_state checkpoint
     * moves the state with the slot, exactly. Except a slot that two workers have trained
     * already (its state was lost once, with a dead worker): while its worker trains another
     * slot, it goes to the idle worker asking rather than make every round wait for one
     * worker to train two slots in turn; that costs a second AdamW restart, no exactness. */
    if (j->spec.inner.state != INNER_STATE_KEEP || s->last_worker == 0 ||
        (worker_busy(act, na, s->last_worker) && slot_retrained(c, j, s)) ||
        store_get_worker(c->st, s->last_worker, &lw) < 0 || !lease_worker_alive(c, &lw, now) ||
        lw.state == WORKER_DRAINING)
      return s;
  }
  return NULL;
}

/* Try to grant `me` a slot of running job j: SCHED_GRANTED, SCHED_WAIT (nothing here; *any_work
 * says whether the job still has work) or a negative DPC_E* code. */
static int assign_in_job(coord *c, coord_job *j, int64_t worker, const store_worker *me, const store_lease *act,
                         int na, int64_t now, int *any_work, store_lease *lease) {
  store_fragment *frags;
  int nf;
  int rc = store_list_fragments(c->st, j->id, &frags, &nf);
  if (rc < 0) return rc;
  if (nf != j->n_fragments) {
    free(frags);
    return dpc_err(DPC_EINTERNAL, "job %lld: store has %d fragments, spec %d", (long long)j->id, nf, j->n_fragments);
  }
  int async = j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC;
  store_slot *slots;
  int ns;
  if ((rc = job_slots(c, j, frags, nf, &slots, &ns, any_work)) < 0) {
    free(frags);
    return rc;
  }
  int steps = j->spec.inner_steps;
  int64_t sched = -1;
  if (async) {
    int64_t left = lease_async_budget_left(j, slots, ns, act, na);
    if (left <= 0) {
      for (int i = 0; i < na; i++)
        if (act[i].job == j->id) *any_work = 1; /* an active lease may still expire */
      free(slots);
      free(frags);
      return SCHED_WAIT;
    }
    *any_work = 1;
    steps = dylu_steps(c, j, me, now);
    if (steps > left) steps = (int)left;
    sched = lease_async_progress(j, left);
  }
  const store_slot *pick = pick_slot(c, j, slots, ns, worker, frags, act, na, now, any_work);
  /* Async: never hand out a version older than an acknowledged delta would make it. */
  int settled = pick && async ? async_path_settled(c, j, pick->path) : 1;
  if (settled < 0) rc = settled;
  else rc = pick && settled ? grant(c, j, pick, worker, frags, steps, sched, lease) : SCHED_WAIT;
  free(slots);
  free(frags);
  return rc;
}

int lease_assign(coord *c, int64_t worker, int64_t job_filter, store_lease *lease) {
  store_lease *act;
  int na;
  int rc = store_list_active_leases(c->st, 0, &act, &na);
  if (rc < 0) return rc;
  for (int i = 0; i < na; i++)
    if (act[i].worker == worker) {
      *lease = act[i]; /* the worker lost our answer: hand the same lease back */
      free(act);
      return SCHED_GRANTED;
    }
  store_worker me;
  if ((rc = store_get_worker(c->st, worker, &me)) < 0 || me.state == WORKER_DRAINING) {
    free(act);
    return rc < 0 ? rc : SCHED_NO_WORK;
  }
  if (blobwatch_down(c, NULL, 0, NULL)) { /* a lease could neither pull nor push: ask again later */
    free(act);
    return SCHED_WAIT;
  }
  int64_t now = dpc_wall_ms();
  int any_work = 0;
  for (int ji = 0; ji < c->n_jobs; ji++) {
    coord_job *j = c->jobs[ji];
    if (j->state != JOB_RUNNING || (job_filter && j->id != job_filter)) continue;
    rc = assign_in_job(c, j, worker, &me, act, na, now, &any_work, lease);
    if (rc != SCHED_WAIT) {
      free(act);
      return rc;
    }
  }
  free(act);
  return any_work ? SCHED_WAIT : SCHED_NO_WORK;
}

void lease_pushed(coord *c, int64_t lease_id) {
  store_lease l;
  if (store_get_lease(c->st, lease_id, &l) < 0 || l.state != LEASE_ACTIVE) return;
  int64_t now = dpc_wall_ms();
  int rc = store_end_lease(c->st, lease_id, LEASE_FINISHED, 1, l.inner_steps, now);
  if (rc < 0) DPC_ERROR("lease %lld: cannot finish: %s", (long long)lease_id, dpc_errmsg());
  coord_job *j = coord_job_get(c, l.job);
  if (j) j->lease_errors = 0;
  lease_ended(c, lease_id, 0); /* the worker's own push */
}

int lease_maybe_pushed(coord *c, const store_lease *l) {
  if (l->state != LEASE_ACTIVE) return 0;
  int *fids;
  int64_t *bases;
  int nf;
  if (store_lease_fragments(c->st, l->id, &fids, &bases, &nf) < 0) return 0;
  const coord_job *j = coord_job_get(c, l->job);
  const int sync = j && j->spec.algorithm != JOB_ALGO_DILOCO_ASYNC;
  int all = 1;
  for (int i = 0; i < nf && all; i++) {
    all = store_find_delta(c->st, l->id, fids[i], NULL, NULL) == 1;
    /* Sync: a fragment whose round already closed needs nothing more from this slot — an
     * earlier lease of the slot, lost after pushing that fragment (a streaming lease pushes
     * fragments as it goes), or the deadline, settled it; this lease's push of it was late. */
    store_round r;
    if (!all && sync && store_get_round(c->st, l->job, fids[i], l->round, &r) == 0 && r.state == ROUND_CLOSED) all = 1;
  }
  free(fids);
  free(bases);
  if (all) lease_pushed(c, l->id);
  return all;
}

void lease_recover(coord *c) {
  store_lease *act;
  int na;
  if (store_list_active_leases(c->st, 0, &act, &na) < 0) return;
  for (int i = 0; i < na; i++)
    if (lease_maybe_pushed(c, &act[i]))
      DPC_INFO("recovery: lease %lld had all its deltas in; finished it", (long long)act[i].id);
  free(act);
}

/* ---- expiry and liveness (every tick) -------------------------------------------------------- */

/* A worker silent for longer than max(TTL, 3 heartbeats) and not long-polling is gone. */
static void mark_gone_workers(coord *c, int64_t now) {
  store_worker *ws;
  int nw;
  if (store_list_workers(c->st, &ws, &nw) < 0) return;
  int64_t gone_after = c->lease_ttl_ms > 3 * c->heartbeat_ms ? c->lease_ttl_ms : 3 * c->heartbeat_ms;
  /* One transaction for all of them: thousands of workers going silent together (a network
   * split, a restart with many registered) must not stall the loop for one fsync each. */
  int64_t *gone = malloc((size_t)(nw > 0 ? nw : 1) * sizeof *gone);
  int ng = 0;
  for (int i = 0; i < nw; i++) {
    /* After a restart, silence counts from the start: workers could not call a dead process. */
    const int64_t seen = ws[i].last_seen >= c->started_ms ? ws[i].last_seen : c->live_floor_ms;
    if (ws[i].state == WORKER_ACTIVE && now - seen > gone_after && !lease_is_parked(c, ws[i].id)) {
      DPC_WARN("worker %lld (%s) is gone: no call for %lld ms", (long long)ws[i].id, ws[i].name,
               (long long)(now - ws[i].last_seen));
      if (gone) gone[ng++] = ws[i].id;
      else store_set_worker_state(c->st, ws[i].id, WORKER_GONE);
    }
  }
  if (ng > 0 && store_mark_workers_gone(c->st, gone, ng) < 0)
    DPC_WARN("cannot mark %d silent worker(s) gone: %s", ng, dpc_errmsg());
  free(gone);
  free(ws);
}

/* Workers silent for the retention period (--worker-retention-s) that no lease or slot
 * refers to are deleted, at most RETIRE_BATCH per look and one look per RETIRE_EVERY_MS (or
 * per retention / 2 when shorter), so that Register calls and worker churn cannot grow the
 * table (and ListWorkers, mark_gone_workers) without bound. A worker that trained stays
 * while its leases are recorded (they name it). After a restart silence counts from the
 * start, as for going gone. */
#define RETIRE_BATCH 10000
#define RETIRE_EVERY_MS 60000

static void retire_workers(coord *c, int64_t now) {
  if (c->worker_retention_ms <= 0 || now < c->retire_next_ms) return;
  int64_t every = c->worker_retention_ms / 2 < RETIRE_EVERY_MS ? c->worker_retention_ms / 2 : RETIRE_EVERY_MS;
  c->retire_next_ms = now + (every < 200 ? 200 : every);
  const int64_t before = now - c->worker_retention_ms;
  if (before <= c->live_floor_ms) return;
  /* A long-polling worker is alive though its last call started up to 30 s ago. */
  for (int i = 0; i < c->n_parked; i++) store_touch_worker(c->st, c->parked[i].worker, now, -1);
  int64_t *ids = NULL;
  int n = 0;
  if (store_forget_workers(c->st, before, RETIRE_BATCH, &ids, &n) < 0) {
    DPC_WARN("cannot delete long-gone workers: %s", dpc_errmsg());
    return;
  }
  if (n > 0)
    DPC_INFO("deleted %d worker(s) silent for more than %lld s and holding no lease (first id %lld)", n,
             (long long)(c->worker_retention_ms / 1000), (long long)ids[0]);
  if (n == RETIRE_BATCH) c->retire_next_ms = now; /* more to do: go on at the next tick */
  free(ids);
}

int64_t lease_dead_after_ms(int n, int hb_ms) {
  int64_t ms = (int64_t)n * hb_ms;
  return ms < LEASE_DEAD_FLOOR_MS ? LEASE_DEAD_FLOOR_MS : ms;
}

void lease_count_revocation(coord *c, int reason) {
  if (reason >= 0 && reason < REVOKE_N) c->revocations[reason]++;
}

/* When active lease l last showed its worker alive: its last heartbeat or transfer chunk
 * (lease_note.hb_at), else its grant; a time
 * before this process started counts as c->live_floor_ms (workers could not call a dead
 * process; they get the restart grace to reconnect). */
static int64_t lease_last_heard(coord *c, const store_lease *l) {
  const lease_note *n = coord_note(c, l->id, 0);
  const int64_t at = n && n->hb_at > l->created_at ? n->hb_at : l->created_at;
  return at >= c->started_ms ? at : c->live_floor_ms;
}

/* Revoke every active lease of act[0..na) with no heartbeat (nor parameter or delta chunk)
 * for c->dead_after_ms: its worker died (SIGKILL, a lost machine) or is cut off. The
 * heartbeats run on their own thread beside training, so a slow worker keeps sending them and
 * keeps its lease; a transfer counts too, so heartbeats queued behind a large push on a slow
 * link do not cost the lease. A revoked lease ends as
 * expired, exactly as at its TTL (slot idle for the same round, nothing it pushes later is
 * applied), only sooner; the caller's rounds_check then answers the parked Lease calls. */
/* Revoke active lease l (reason REVOKE_HEARTBEAT or REVOKE_DISCONNECT; `why` completes the
 * log line): it ends as expired, exactly as at its TTL, only sooner. A lease whose deltas
 * are all durable is finished instead. Returns 1 when revoked. */
static int revoke_lease(coord *c, store_lease *l, int64_t now, int reason, const char *why) {
  if (lease_maybe_pushed(c, l)) { /* its work is in: finished, not revoked */
    l->state = LEASE_FINISHED;
    return 0;
  }
  if (store_end_lease(c->st, l->id, LEASE_EXPIRED, 0, 0, now) < 0) {
    DPC_WARN("lease %lld: cannot revoke it: %s", (long long)l->id, dpc_errmsg());
    return 0;
  }
  l->state = LEASE_EXPIRED;
  lease_count_revocation(c, reason);
  DPC_WARN("lease %lld revoked: worker %lld %s; job %lld slot (path %d, replica %d) round %lld is free again",
           (long long)l->id, (long long)l->worker, why, (long long)l->job, l->path, l->replica, (long long)l->round);
  lease_ended(c, l->id, 1);
  return 1;
}

/* Revoke every active lease of act[0..na) with no heartbeat (nor parameter or delta chunk)
 * for c->dead_after_ms: its worker died (SIGKILL, a lost machine) or is cut off. The
 * heartbeats run on their own thread beside training, so a slow worker keeps sending them and
 * keeps its lease; a transfer counts too, so heartbeats queued behind a large push on a slow
 * link do not cost the lease. The caller's rounds_check then answers the parked Lease calls. */
static void revoke_silent(coord *c, store_lease *act, int na, int64_t now) {
  if (c->dead_after_ms <= 0) return;
  for (int k = 0; k < na; k++) {
    if (act[k].state != LEASE_ACTIVE) continue;
    const int64_t silent = now - lease_last_heard(c, &act[k]);
    if (silent <= c->dead_after_ms) continue;
    char why[128];
    snprintf(why, sizeof why, "sent no heartbeat for %lld ms (limit %lld ms)", (long long)silent,
             (long long)c->dead_after_ms);
    if (!revoke_lease(c, &act[k], now, REVOKE_HEARTBEAT, why)) continue;
    /* A worker silent as long as its lease is gone too, so that a slot reserved for it
     * (inner_state keep) goes to another worker now rather than after the lease TTL. Any
     * call of it brings it back (svc_touch). */
    store_worker w;
    if (store_get_worker(c->st, act[k].worker, &w) == 0 && w.state == WORKER_ACTIVE && !lease_is_parked(c, w.id) &&
        now - (w.last_seen >= c->started_ms ? w.last_seen : c->live_floor_ms) > c->dead_after_ms)
      store_set_worker_state(c->st, w.id, WORKER_GONE);
  }
}

/* Revoke the active leases of the workers whose Watch call ended without an answer more than
 * --reconnect-grace-ms ago with no new Watch since (c->lost): the connection, and almost
 * always the process, is gone — a SIGKILLed worker loses its lease in about a second instead
 * of after its missed heartbeats. */
static int watch_open(const coord *c, int64_t worker);
static void call_lost(coord *c, int64_t worker);

static void revoke_lost(coord *c, store_lease *act, int na, int64_t now) {
  for (int i = 0; i < c->n_lost;) {
    lease_wait g = c->lost[i];
    if (now < g.deadline) {
      i++;
      continue;
    }
    c->lost[i] = c->lost[--c->n_lost];
    for (int k = 0; k < na; k++) {
      if (act[k].state != LEASE_ACTIVE || act[k].worker != g.worker) continue;
      char why[128];
      snprintf(why, sizeof why, "closed its connection (Watch ended; no new one within %d ms)", c->reconnect_grace_ms);
      revoke_lease(c, &act[k], now, REVOKE_DISCONNECT, why);
    }
    /* No call of it since its connection closed (g.job: when): it is gone, so that a slot
     * kept for it (inner_state keep) goes to another worker now, not after the liveness
     * window. Any later call brings it back (svc_touch). */
    store_worker w;
    if (!lease_is_parked(c, g.worker) && !watch_open(c, g.worker) && store_get_worker(c->st, g.worker, &w) == 0 &&
        w.state == WORKER_ACTIVE && w.last_seen <= g.job) {
      DPC_INFO("worker %lld (%s) is gone: its connection closed and it has not called since", (long long)g.worker,
               w.name);
      store_set_worker_state(c->st, g.worker, WORKER_GONE);
    }
  }
}

void lease_expire(coord *c) {
  if (c->stopping) return;
  int64_t now = dpc_wall_ms();
  int64_t *ids = NULL;
  int n = 0;
  store_lease *act;
  int na = 0;
  /* Remember who held what, for the log line. */
  if (store_list_active_leases(c->st, 0, &act, &na) < 0) act = NULL, na = 0;
  /* A loop that stalled (a long commit, a descheduled process) has heartbeats and Watch calls
   * queued that it has not read yet, and libuv runs timers before it polls: judge silence and
   * lost connections only when the previous tick came less than half the heartbeat window
   * ago (the tick runs every heartbeat / 2, 50 to 500 ms), so that no stall can make them up. */
  const int64_t prev = c->tick_prev_ms;
  c->tick_prev_ms = now;
  if (prev != 0 && now - prev <= c->dead_after_ms / 2) {
    revoke_silent(c, act, na, now);
    revoke_lost(c, act, na, now);
  }
  /* A lease past its expiry whose deltas are all durable is finished, not expired: the work
   * is in, so the slot moves on instead of training the closed round again. */
  for (int k = 0; k < na; k++)
    if (act[k].state == LEASE_ACTIVE && act[k].expires_at <= now && lease_maybe_pushed(c, &act[k]))
      act[k].state = LEASE_FINISHED;
  if (store_expire_leases(c->st, now, &ids, &n) == 0) {
    for (int i = 0; i < n; i++) {
      const store_lease *l = NULL;
      for (int k = 0; k < na; k++)
        if (act[k].id == ids[i]) l = &act[k];
      if (l)
        DPC_WARN("lease %lld expired: worker %lld missed its heartbeats; job %lld slot (path %d, replica %d) round %lld "
                 "is free again", (long long)ids[i], (long long)l->worker, (long long)l->job, l->path, l->replica,
                 (long long)l->round);
      else
        DPC_WARN("lease %lld expired", (long long)ids[i]);
      lease_count_revocation(c, REVOKE_TTL);
      lease_ended(c, ids[i], 1);
    }
    free(ids);
  }
  free(act);
  mark_gone_workers(c, now);
  retire_workers(c, now);
}

/* ---- parked Lease long-polls ------------------------------------------------------------------ */

/* Long-poll: Lease calls that got SCHED_WAIT and asked to wait (max_wait_ms) are parked and
 * retried whenever something may have freed work (a round closed, a lease ended, a job was
 * created or resumed, the timer), answered at their deadline with LEASE_WAIT. */
int lease_park(coord *c, void *call, int64_t worker, int64_t job, int64_t deadline) {
  if (c->n_parked == c->cap_parked) {
    int cap = c->cap_parked ? 2 * c->cap_parked : 16;
    lease_wait *a = realloc(c->parked, (size_t)cap * sizeof *a);
    if (!a) return DPC_ENOMEM;
    c->parked = a;
    c->cap_parked = cap;
  }
  c->parked[c->n_parked++] =
      (lease_wait){.call = call, .worker = worker, .job = job, .deadline = deadline, .since = dpc_mono_s()};
  return 0;
}

int lease_is_parked(coord *c, int64_t worker) {
  for (int i = 0; i < c->n_parked; i++)
    if (c->parked[i].worker == worker) return 1;
  return 0;
}

int lease_unpark_call(coord *c, void *call, int cancelled) {
  for (int i = 0; i < c->n_parked; i++)
    if (c->parked[i].call == call) {
      const int64_t worker = c->parked[i].worker;
      c->parked[i] = c->parked[--c->n_parked];
      if (cancelled) call_lost(c, worker); /* e.g. SIGKILLed while it waited for work */
      return 1;
    }
  return 0;
}

void lease_retry_parked(coord *c, int flush) {
  int64_t now = dpc_wall_ms();
  for (int i = 0; i < c->n_parked;) {
    lease_wait pk = c->parked[i];
    store_lease l;
    int rc = SCHED_STOPPING;
    if (!flush && !c->stopping) {
      rc = lease_assign(c, pk.worker, pk.job, &l);
      if (rc == SCHED_WAIT && now < pk.deadline) {
        i++;
        continue;
      }
    }
    /* Off the registry before the answer: answering may end the call. */
    c->parked[i] = c->parked[--c->n_parked];
    if (rc == SCHED_GRANTED) coord_observe(c, HIST_LEASE_WAIT, dpc_mono_s() - pk.since);
    if (c->park_answer_cb) c->park_answer_cb(c, pk.call, pk.worker, rc, rc == SCHED_GRANTED ? &l : NULL);
  }
}

void lease_flush_parked(coord *c) { lease_retry_parked(c, 1); }

/* ---- Watch calls: the workers' connections ------------------------------------------------------ */

static int wait_push(lease_wait **a, int *n, int *cap, lease_wait w) {
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 16;
    lease_wait *b = realloc(*a, (size_t)nc * sizeof *b);
    if (!b) return DPC_ENOMEM;
    *a = b;
    *cap = nc;
  }
  (*a)[(*n)++] = w;
  return 0;
}

/* The index of worker's entry on c->lost, or -1. */
static int lost_find(const coord *c, int64_t worker) {
  for (int i = 0; i < c->n_lost; i++)
    if (c->lost[i].worker == worker) return i;
  return -1;
}

int lease_worker_lost(const coord *c, int64_t worker) { return lost_find(c, worker) >= 0; }

void lease_watch_seen(coord *c, int64_t worker) {
  int i = lost_find(c, worker);
  if (i >= 0) c->lost[i] = c->lost[--c->n_lost];
}

void lease_watch_heard(coord *c, int64_t worker) {
  int i = lost_find(c, worker);
  if (i >= 0 && dpc_wall_ms() - c->lost[i].job >= LEASE_WATCH_HEARD_MS) c->lost[i] = c->lost[--c->n_lost];
}

int lease_watch_add(coord *c, void *call, int64_t worker, int64_t lease) {
  lease_watch_seen(c, worker);
  return wait_push(&c->watches, &c->n_watches, &c->cap_watches,
                   (lease_wait){.call = call, .worker = worker, .lease = lease,
                                .deadline = dpc_wall_ms() + LEASE_WATCH_HOLD_MS});
}

void lease_ended(coord *c, int64_t lease, int tell) {
  coord_note_drop(c, lease);
  for (int i = 0; tell && i < c->n_watches;) {
    lease_wait w = c->watches[i];
    if (w.lease != lease) {
      i++;
      continue;
    }
    c->watches[i] = c->watches[--c->n_watches]; /* off the registry before the answer ends it */
    if (c->watch_answer_cb) c->watch_answer_cb(c, w.call, WATCH_LEASE_ENDED);
  }
}

static int watch_open(const coord *c, int64_t worker) {
  for (int i = 0; i < c->n_watches; i++)
    if (c->watches[i].worker == worker) return 1;
  return 0;
}

/* A call of `worker` that stays open while it lives (Watch, a parked Lease) ended without an
 * answer: unless a newer one is open, it is on c->lost until the reconnect grace is over
 * (lost.job = when the call ended). */
static void call_lost(coord *c, int64_t worker) {
  if (c->stopping || c->reconnect_grace_ms <= 0 || watch_open(c, worker)) return;
  const int64_t now = dpc_wall_ms(), at = now + c->reconnect_grace_ms;
  int i = lost_find(c, worker);
  if (i >= 0) {
    c->lost[i].deadline = at;
    c->lost[i].job = now;
    return;
  }
  if (wait_push(&c->lost, &c->n_lost, &c->cap_lost, (lease_wait){.worker = worker, .job = now, .deadline = at}) != 0)
    return;
  loop_wake_at(c, now); /* a quorum round waiting only for this worker may close now (rounds.c) */
  DPC_DEBUG("worker %lld: its Watch or Lease call ended without an answer (its lease ended, or its connection "
            "closed); its active leases are revoked in %d ms unless it calls again", (long long)worker,
            c->reconnect_grace_ms);
}

int lease_watch_ended(coord *c, void *call, int cancelled) {
  int64_t worker = 0;
  for (int i = 0; i < c->n_watches; i++)
    if (c->watches[i].call == call) {
      worker = c->watches[i].worker;
      c->watches[i] = c->watches[--c->n_watches];
      break;
    }
  if (!worker) return 0;
  if (cancelled) call_lost(c, worker);
  return 1;
}

void lease_answer_watches(coord *c, int flush) {
  const int64_t now = dpc_wall_ms();
  for (int i = 0; i < c->n_watches;) {
    lease_wait w = c->watches[i];
    if (!flush && now < w.deadline) {
      i++;
      continue;
    }
    c->watches[i] = c->watches[--c->n_watches]; /* off the registry before the answer ends it */
    if (c->watch_answer_cb) c->watch_answer_cb(c, w.call, flush ? WATCH_STOPPING : WATCH_HOLD_OVER);
  }
}

void lease_parked_free(coord *c) {
  free(c->parked);
  c->parked = NULL;
  c->n_parked = c->cap_parked = 0;
  free(c->watches);
  c->watches = NULL;
  c->n_watches = c->cap_watches = 0;
  free(c->lost);
  c->lost = NULL;
  c->n_lost = c->cap_lost = 0;
}
