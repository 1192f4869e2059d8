/* sched.c — the coordinator's scheduler for synchronous DiLoCo/DiPaCo: which slot a worker
 * gets (sticky to the worker that trained it last, for inner_state = keep), when a round of a
 * fragment closes, the outer step (in the libuv thread pool) and its commit, lease expiry and
 * worker liveness. Also the loop's caches: parsed jobs, parameter buffers, heartbeat notes.
 *
 * Sync rule: fragment f's version v counts its closed rounds, so round v of f is the open
 * one. A slot (path p, replica r) trains round t = slot.round; it may be leased when it is
 * idle, t < rounds, and every fragment on its path is at version t with no outer step in
 * flight. Round t of f closes when every slot whose path contains f's module has a received
 * delta for it, or — at the round deadline — when at least ceil(quorum · expected) have.
 *
 * Async rule (algorithm "diloco-async", DESIGN.md §3): any idle slot may be leased at any
 * time from the CURRENT versions of its fragments; the lease's first step is the slot's own
 * inner-step counter s (store_slot.inner_steps) and its length is H, or with DyLU
 * H_w = max(min_steps, floor(H · v_w / v_max)) from the workers' steps/s EWMA (H for a
 * worker not measured yet), cut to the job's remaining budget rounds × H × slots minus the
 * steps already trained or leased, so the total is exact. Every received delta is applied
 * on its own, in arrival order (delta id), one at a time per fragment, with the job's
 * outer.rule: delayed-nesterov (outer_dn_apply; N = outer.delay_buffer or the number of
 * slots), nesterov (outer_nesterov_step per delta) or sgd (outer_sgd_step). Each application
 * makes version + 1; the delta's row is the ledger entry (lease, slot, base version,
 * version produced; staleness = produced − 1 − base). A delta whose staleness exceeds
 * max_staleness (> 0) is dropped instead. Async delta rows and blobs are kept (the ledger),
 * and so is version 0, so that θ_0 + the ledger reproduce every version; other parameter
 * versions keep the newest 2·slots + 2 (a lease pulls its base version right after grant). The job finishes when the budget is
 * trained, no lease is active and no delta is pending. */
#include "coordinator/coord.h"

#include "common/errors.h"
#include "common/log.h"
#include "kernels/outer.h"
#include "coordinator/testhook.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t coord_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- jobs ----------------------------------------------------------------------------------- */

void coord_job_free(coord_job *j) {
  if (!j) return;
  free(j->modules);
  free(j->fragments);
  free(j->outer_busy);
  free(j->outer_retry_at);
  free(j->expected);
  free(j->path_loss);
  free(j->screen);
  free(j);
}

int coord_job_from_store(const store_job *sj, coord_job **out) {
  coord_job *j = calloc(1, sizeof *j);
  gpt_layout *lay = malloc(sizeof *lay);
  int rc = 0;
  if (!j || !lay) {
    rc = dpc_err(DPC_ENOMEM, "out of memory loading job %lld", (long long)sj->id);
    goto fail;
  }
  j->id = sj->id;
  j->state = sj->state;
  if ((rc = jobspec_parse(sj->spec_json, strlen(sj->spec_json), &j->spec)) < 0) goto fail;
  if ((rc = jobspec_layout(&j->spec, lay)) < 0) goto fail;
  j->n_modules = jobspec_modules(&j->spec, lay, NULL, 0);
  j->n_fragments = jobspec_fragments(&j->spec, lay, NULL, 0);
  j->n_paths = jobspec_n_paths(&j->spec);
  if (j->n_modules < 1 || j->n_fragments < 1 || j->n_paths < 1) {
    rc = dpc_err(DPC_EINVAL, "job %lld: spec gives no modules or fragments", (long long)sj->id);
    goto fail;
  }
  j->modules = calloc((size_t)j->n_modules, sizeof *j->modules);
  j->fragments = calloc((size_t)j->n_fragments, sizeof *j->fragments);
  j->outer_busy = calloc((size_t)j->n_fragments, sizeof *j->outer_busy);
  j->outer_retry_at = calloc((size_t)j->n_fragments, sizeof *j->outer_retry_at);
  j->expected = calloc((size_t)j->n_fragments, sizeof *j->expected);
  j->path_loss = calloc((size_t)j->n_paths, sizeof *j->path_loss);
  if (!j->modules || !j->fragments || !j->outer_busy || !j->outer_retry_at || !j->expected || !j->path_loss) {
    rc = dpc_err(DPC_ENOMEM, "out of memory loading job %lld", (long long)sj->id);
    goto fail;
  }
  jobspec_modules(&j->spec, lay, j->modules, j->n_modules);
  jobspec_fragments(&j->spec, lay, j->fragments, j->n_fragments);
  for (int p = 0; p < j->n_paths; p++) j->path_loss[p] = NAN;
  j->last_loss = NAN;
  j->n_slots = j->n_paths * j->spec.replicas;
  for (int f = 0; f < j->n_fragments; f++) {
    int n = 0;
    for (int p = 0; p < j->n_paths; p++) n += jobspec_path_has_module(&j->spec, p, j->fragments[f].module);
    j->expected[f] = n * j->spec.replicas;
  }
  free(lay);
  *out = j;
  return 0;
fail:
  free(lay);
  coord_job_free(j);
  return rc;
}

coord_job *coord_job_get(coord *c, int64_t id) {
  for (int i = 0; i < c->n_jobs; i++)
    if (c->jobs[i]->id == id) return c->jobs[i];
  return NULL;
}

int coord_job_add(coord *c, coord_job *j) {
  if (c->n_jobs == c->cap_jobs) {
    int cap = c->cap_jobs ? c->cap_jobs * 2 : 8;
    coord_job **a = realloc(c->jobs, (size_t)cap * sizeof *a);
    if (!a) return dpc_err(DPC_ENOMEM, "out of memory");
    c->jobs = a;
    c->cap_jobs = cap;
  }
  c->jobs[c->n_jobs++] = j;
  return 0;
}

int coord_jobs_load(coord *c) {
  store_job *jobs;
  int n;
  int rc = store_list_jobs(c->st, &jobs, &n);
  if (rc < 0) return rc;
  for (int i = 0; i < n && rc == 0; i++) {
    coord_job *j;
    if ((rc = coord_job_from_store(&jobs[i], &j)) < 0) break;
    if ((rc = coord_job_add(c, j)) < 0) coord_job_free(j);
  }
  store_jobs_free(jobs, n);
  return rc;
}

int coord_job_set_state(coord *c, coord_job *j, store_job_state s, const char *why) {
  int rc = store_set_job_state(c->st, j->id, s, why, coord_now_ms());
  if (rc < 0) return rc;
  DPC_INFO("job %lld: %s -> %s%s%s", (long long)j->id, store_job_state_name(j->state), store_job_state_name(s),
           why ? ": " : "", why ? why : "");
  j->state = s;
  return 0;
}

int sched_path_has_fragment(const coord_job *j, int path, int fragment) {
  return jobspec_path_has_module(&j->spec, path, j->fragments[fragment].module);
}

/* ---- lease notes ---------------------------------------------------------------------------- */

lease_note *coord_note(coord *c, int64_t lease, int create) {
  for (int i = 0; i < c->n_notes; i++)
    if (c->notes[i].lease == lease) return &c->notes[i];
  if (!create) return NULL;
  if (c->n_notes == c->cap_notes) {
    int cap = c->cap_notes ? c->cap_notes * 2 : 16;
    lease_note *a = realloc(c->notes, (size_t)cap * sizeof *a);
    if (!a) return NULL;
    c->notes = a;
    c->cap_notes = cap;
  }
  lease_note *n = &c->notes[c->n_notes++];
  n->lease = lease;
  n->loss = NAN;
  n->tokens = 0;
  n->bytes_out = 0;
  n->pull_done_s = 0;
  return n;
}

void coord_note_drop(coord *c, int64_t lease) {
  for (int i = 0; i < c->n_notes; i++)
    if (c->notes[i].lease == lease) {
      c->notes[i] = c->notes[--c->n_notes];
      return;
    }
}

/* ---- parameter cache ------------------------------------------------------------------------ */

void pcache_unref(void *entry) {
  pcache_entry *e = entry;
  if (atomic_fetch_sub(&e->refs, 1) == 1) {
    free(e->data);
    free(e);
  }
}

static void pcache_insert(coord *c, pcache_entry *e) {
  /* Drop older versions of the same fragment (their streams keep their own references). */
  for (int i = 0; i < c->n_pcache;) {
    pcache_entry *o = c->pcache[i];
    if (o->job == e->job && o->fragment == e->fragment && o->version < e->version) {
      c->pcache[i] = c->pcache[--c->n_pcache];
      pcache_unref(o);
    } else {
      i++;
    }
  }
  if (c->n_pcache == c->cap_pcache) {
    int cap = c->cap_pcache ? c->cap_pcache * 2 : 16;
    pcache_entry **a = realloc(c->pcache, (size_t)cap * sizeof *a);
    if (!a) {
      pcache_unref(e); /* not cached; callers hold their own reference */
      return;
    }
    c->pcache = a;
    c->cap_pcache = cap;
  }
  c->pcache[c->n_pcache++] = e;
}

int pcache_get(coord *c, const store_fragment *f, pcache_entry **out) {
  for (int i = 0; i < c->n_pcache; i++) {
    pcache_entry *e = c->pcache[i];
    if (e->job == f->job && e->fragment == f->fragment && e->version == f->version) {
      atomic_fetch_add(&e->refs, 1);
      *out = e;
      return 0;
    }
  }
  pcache_entry *e = calloc(1, sizeof *e);
  if (!e) return dpc_err(DPC_ENOMEM, "out of memory");
  e->data = malloc(f->len * sizeof(float));
  if (!e->data) {
    free(e);
    return dpc_err(DPC_ENOMEM, "out of memory for fragment %d (%zu floats)", f->fragment, f->len);
  }
  /* Loaded on the loop thread: only the first pull of a version after a restart gets here,
   * since every outer step inserts its result. */
  int rc = blob_read(c->bs, f->param_blob, BLOB_PARAMS, e->data, f->len, &e->crc);
  if (rc < 0) {
    free(e->data);
    free(e);
    return rc;
  }
  e->job = f->job;
  e->fragment = f->fragment;
  e->version = f->version;
  e->n = f->len;
  atomic_init(&e->refs, 2); /* cache + caller */
  pcache_insert(c, e);
  *out = e;
  return 0;
}

void pcache_put(coord *c, int64_t job, int fragment, int64_t version, float *data, size_t n, uint32_t crc) {
  pcache_entry *e = calloc(1, sizeof *e);
  if (!e) {
    free(data);
    return;
  }
  e->job = job;
  e->fragment = fragment;
  e->version = version;
  e->data = data;
  e->n = n;
  e->crc = crc;
  atomic_init(&e->refs, 1);
  pcache_insert(c, e);
}

void pcache_clear(coord *c) {
  for (int i = 0; i < c->n_pcache; i++) pcache_unref(c->pcache[i]);
  free(c->pcache);
  c->pcache = NULL;
  c->n_pcache = c->cap_pcache = 0;
}

/* ---- leases ---------------------------------------------------------------------------------- */

int sched_worker_alive(coord *c, const store_worker *w, int64_t now) {
  if (coord_is_parked(w->id)) return 1;
  /* After a restart, silence counts from the start (see main.c's recovery). */
  const int64_t seen = w->last_seen >= c->started_ms ? w->last_seen : c->live_floor_ms;
  return w->state != WORKER_GONE && now - seen <= c->lease_ttl_ms;
}

/* Fragments on path p of job j with their current versions; 1 if all are at version t with
 * no outer step in flight. */
static int path_ready(coord *c, coord_job *j, int path, int64_t t, const store_fragment *frags) {
  (void)c;
  for (int f = 0; f < j->n_fragments; f++) {
    if (!sched_path_has_fragment(j, path, f)) continue;
    if (frags[f].version != t || j->outer_busy[f]) return 0;
  }
  return 1;
}

static int grant(coord *c, coord_job *j, const store_slot *s, int64_t worker, const store_fragment *frags, int steps,
                 store_lease *out) {
  int async = j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC;
  int frag_ids[JOBSPEC_MAX_MODULES];
  int64_t bases[JOBSPEC_MAX_MODULES];
  int nf = 0;
  for (int f = 0; f < j->n_fragments && nf < JOBSPEC_MAX_MODULES; f++)
    if (sched_path_has_fragment(j, s->path, f)) {
      frag_ids[nf] = f;
      bases[nf++] = frags[f].version;
    }
  int64_t now = coord_now_ms();
  int64_t deadline = j->spec.round_timeout_s > 0 ? now + (int64_t)(j->spec.round_timeout_s * 1000.0) : 0;
  for (int i = 0; i < nf && !async; i++) {
    int rc = store_open_round(c->st, j->id, frag_ids[i], s->round, now, deadline);
    if (rc < 0) return rc;
  }
  store_new_lease nl = {.job = j->id, .path = s->path, .replica = s->replica, .worker = worker, .round = s->round,
                        .inner_steps = steps,
                        .step_begin = async ? s->inner_steps : s->round * j->spec.inner_steps,
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
static int64_t async_budget_left(coord *c, const coord_job *j, const store_slot *slots, int ns, const store_lease *act,
                                 int na) {
  (void)c;
  int64_t left = (int64_t)j->spec.rounds * j->spec.inner_steps * j->n_slots;
  for (int i = 0; i < ns; i++) left -= slots[i].inner_steps;
  for (int i = 0; i < na; i++)
    if (act[i].job == j->id) left -= act[i].inner_steps;
  return left;
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
      if (ws[i].steps_per_s > vmax && ws[i].state != WORKER_GONE && sched_worker_alive(c, &ws[i], now))
        vmax = ws[i].steps_per_s;
    free(ws);
  }
  int hw = (int)floor((double)H * me->steps_per_s / vmax);
  if (hw < j->spec.dylu.min_steps) hw = j->spec.dylu.min_steps;
  return hw > H ? H : hw;
}

void sched_speed_sample(coord *c, int64_t worker, double sample) {
  if (!isfinite(sample) || sample <= 0) return;
  store_worker w;
  if (store_get_worker(c->st, worker, &w) < 0) return;
  double v = w.steps_per_s > 0 ? 0.7 * w.steps_per_s + 0.3 * sample : sample;
  store_touch_worker(c->st, worker, w.last_seen, v);
}

int64_t sched_async_staleness(coord *c, const coord_job *j, int fragment, int64_t base) {
  store_fragment f;
  if (store_get_fragment(c->st, j->id, fragment, &f) < 0) return -1;
  return f.version - base;
}

int sched_lease(coord *c, int64_t worker, int64_t job_filter, store_lease *lease) {
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
  int64_t now = coord_now_ms();
  int any_work = 0;
  for (int ji = 0; ji < c->n_jobs; ji++) {
    coord_job *j = c->jobs[ji];
    if (j->state != JOB_RUNNING || (job_filter && j->id != job_filter)) continue;
    store_fragment *frags;
    int nf;
    if ((rc = store_list_fragments(c->st, j->id, &frags, &nf)) < 0) {
      free(act);
      return rc;
    }
    if (nf != j->n_fragments) {
      free(frags);
      free(act);
      return dpc_err(DPC_EINTERNAL, "job %lld: store has %d fragments, spec %d", (long long)j->id, nf, j->n_fragments);
    }
    int async = j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC;
    store_slot *slots;
    int ns;
    if (async) {
      rc = store_list_slots(c->st, j->id, &slots, &ns);
    } else {
      /* Sync: only idle slots whose round lies within the fragments' versions can be ready
       * (path_ready); reading just those keeps a Lease poll off the other slots' rows. */
      int64_t lo = INT64_MAX, hi = -1;
      for (int f = 0; f < nf; f++) {
        if (frags[f].version < lo) lo = frags[f].version;
        if (frags[f].version > hi) hi = frags[f].version;
      }
      if (hi > (int64_t)j->spec.rounds - 1) hi = (int64_t)j->spec.rounds - 1;
      rc = store_any_slot_below(c->st, j->id, j->spec.rounds);
      if (rc > 0) any_work = 1;
      if (rc >= 0) rc = store_list_idle_slots(c->st, j->id, lo, hi, &slots, &ns);
    }
    if (rc < 0) {
      free(frags);
      free(act);
      return rc;
    }
    int steps = j->spec.inner_steps;
    if (async) {
      int64_t left = async_budget_left(c, j, slots, ns, act, na);
      if (left <= 0) {
        for (int i = 0; i < na; i++)
          if (act[i].job == j->id) any_work = 1; /* an active lease may still expire */
        free(slots);
        free(frags);
        continue;
      }
      any_work = 1;
      steps = dylu_steps(c, j, &me, now);
      if (steps > left) steps = (int)left;
    }
    /* The worker's own slot first; only without one, the first free slot (which may look up
     * the last worker of every slot before it: not once per slot for every Lease call). */
    const store_slot *mine = NULL, *free_slot = NULL;
    for (int i = 0; i < ns; i++) {
      const store_slot *s = &slots[i];
      if (!async && s->round < j->spec.rounds) any_work = 1;
      if (s->state != SLOT_IDLE || (!async && s->round >= j->spec.rounds)) continue;
      if (s->last_worker == worker && (async || path_ready(c, j, s->path, s->round, frags))) {
        mine = s;
        break;
      }
    }
    for (int i = 0; i < ns && !mine && !free_slot; i++) {
      const store_slot *s = &slots[i];
      if (s->state != SLOT_IDLE || (!async && s->round >= j->spec.rounds)) continue;
      if (!async && !path_ready(c, j, s->path, s->round, frags)) continue;
      store_worker lw;
      /* inner_state keep: a slot whose last worker is alive stays reserved for it (its AdamW
       * state is there), even while that worker trains something else — moving it would
       * silently change the result. Other policies carry no state in the worker. */
      if (j->spec.inner.state != INNER_STATE_KEEP || s->last_worker == 0 ||
          store_get_worker(c->st, s->last_worker, &lw) < 0 || !sched_worker_alive(c, &lw, now) ||
          lw.state == WORKER_DRAINING)
        free_slot = s;
    }
    const store_slot *pick = mine ? mine : free_slot;
    if (pick) rc = grant(c, j, pick, worker, frags, steps, lease);
    free(slots);
    free(frags);
    if (pick) {
      free(act);
      return rc;
    }
  }
  free(act);
  return any_work ? SCHED_WAIT : SCHED_NO_WORK;
}

void sched_lease_pushed(coord *c, int64_t lease_id) {
  store_lease l;
  if (store_get_lease(c->st, lease_id, &l) < 0 || l.state != LEASE_ACTIVE) return;
  int64_t now = coord_now_ms();
  int rc = store_end_lease(c->st, lease_id, LEASE_FINISHED, 1, l.inner_steps, now);
  if (rc < 0) DPC_ERROR("lease %lld: cannot finish: %s", (long long)lease_id, dpc_errmsg());
  coord_note_drop(c, lease_id);
}

int sched_lease_maybe_pushed(coord *c, const store_lease *l) {
  if (l->state != LEASE_ACTIVE) return 0;
  int *fids;
  int64_t *bases;
  int nf;
  if (store_lease_fragments(c->st, l->id, &fids, &bases, &nf) < 0) return 0;
  int all = 1;
  for (int i = 0; i < nf && all; i++) all = store_find_delta(c->st, l->id, fids[i], NULL) == 1;
  free(fids);
  free(bases);
  if (all) sched_lease_pushed(c, l->id);
  return all;
}

void sched_recover_leases(coord *c) {
  store_lease *act;
  int na;
  if (store_list_active_leases(c->st, 0, &act, &na) < 0) return;
  for (int i = 0; i < na; i++)
    if (sched_lease_maybe_pushed(c, &act[i]))
      DPC_INFO("recovery: lease %lld had all its deltas in; finished it", (long long)act[i].id);
  free(act);
}

/* ---- outer step ----------------------------------------------------------------------------- */

typedef struct {
  uv_work_t req;
  coord *c;
  int64_t job;
  int fragment;
  int64_t round, new_version;
  size_t len;
  int n;
  char (*delta_blobs)[BLOB_NAME_MAX]; /* [n] in (path, replica) order */
  double *weights;                    /* [n] */
  int64_t *delta_ids;                 /* [n] */
  char param_blob[BLOB_NAME_MAX], momentum_blob[BLOB_NAME_MAX];
  char new_param[BLOB_NAME_MAX], new_momentum[BLOB_NAME_MAX];
  float lr, mu;
  int nesterov;
  /* results */
  int rc;
  char err[512];
  float *theta;
  uint32_t param_crc, momentum_crc;
  double seconds;
  int by_deadline;
} outer_work;

static void outer_work_free(outer_work *w) {
  free(w->delta_blobs);
  free(w->weights);
  free(w->delta_ids);
  free(w->theta);
  free(w);
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double coord_mono_s(void) { return mono_s(); }

static void outer_run(uv_work_t *req) {
  outer_work *w = req->data;
  double t0 = mono_s();
  float *u = NULL, *avg = NULL, **deltas = NULL;
  int rc = 0;
  w->theta = malloc(w->len * sizeof(float));
  u = calloc(w->len, sizeof(float));
  avg = malloc(w->len * sizeof(float));
  deltas = calloc((size_t)w->n, sizeof *deltas);
  if (!w->theta || !u || !avg || !deltas) {
    rc = dpc_err(DPC_ENOMEM, "out of memory for the outer step (%zu floats)", w->len);
    goto out;
  }
  if ((rc = blob_read(w->c->bs, w->param_blob, BLOB_PARAMS, w->theta, w->len, NULL)) < 0) goto out;
  if (w->momentum_blob[0] && (rc = blob_read(w->c->bs, w->momentum_blob, BLOB_MOMENTUM, u, w->len, NULL)) < 0) goto out;
  for (int i = 0; i < w->n; i++) {
    if (!(deltas[i] = malloc(w->len * sizeof(float)))) {
      rc = dpc_err(DPC_ENOMEM, "out of memory for delta %d", i);
      goto out;
    }
    if ((rc = blob_read(w->c->bs, w->delta_blobs[i], BLOB_DELTA, deltas[i], w->len, NULL)) < 0) goto out;
  }
  if ((rc = outer_average((const float *const *)deltas, w->weights, w->n, w->len, avg)) < 0) goto out;
  outer_nesterov_step(w->theta, u, avg, w->len, w->lr, w->mu, w->nesterov);
  for (size_t i = 0; i < w->len; i++)
    if (!isfinite(w->theta[i])) {
      rc = dpc_err(DPC_ENUMERIC, "outer step gave a non-finite parameter at index %zu", i);
      goto out;
    }
  if ((rc = blob_write(w->c->bs, w->new_param, BLOB_PARAMS, w->theta, w->len, &w->param_crc)) < 0) goto out;
  rc = blob_write(w->c->bs, w->new_momentum, BLOB_MOMENTUM, u, w->len, &w->momentum_crc);
out:
  if (rc < 0) snprintf(w->err, sizeof w->err, "%s", dpc_errmsg());
  w->rc = rc;
  if (deltas)
    for (int i = 0; i < w->n; i++) free(deltas[i]);
  free(deltas);
  free(u);
  free(avg);
  w->seconds = mono_s() - t0;
}

/* Blob files of collected rows are deleted on the threadpool: unlinking large files (and the
 * directory fsyncs after) can take tens of milliseconds that the loop thread would otherwise
 * spend not answering RPCs. Shutdown waits for them (coord_queue_work counts them). */
typedef struct {
  uv_work_t req;
  coord *c;
  char **names;
  int n, rc;
} gc_work;

static void gc_delete_run(uv_work_t *req) {
  gc_work *g = req->data;
  g->rc = blob_delete_many(g->c->bs, g->names, g->n);
  if (g->rc < 0) DPC_WARN("garbage collection: %s (the start-up sweep removes what is left)", dpc_errmsg());
}

static void gc_delete_after(uv_work_t *req, int status) {
  (void)status;
  gc_work *g = req->data;
  coord *c = g->c;
  store_names_free(g->names, g->n);
  free(g);
  coord_work_done(c);
}

/* Takes ownership of names. */
static void gc_delete_files(coord *c, char **names, int n) {
  gc_work *g = n > 0 ? calloc(1, sizeof *g) : NULL;
  if (g) {
    g->req.data = g;
    g->c = c;
    g->names = names;
    g->n = n;
    if (coord_queue_work(c, &g->req, gc_delete_run, gc_delete_after) == 0) return;
    free(g);
  }
  if (n > 0) blob_delete_many(c->bs, names, n); /* no memory or no threadpool: inline */
  store_names_free(names, n);
}

/* The rows go first (one transaction each), then the files: a crash in between leaves only
 * unreferenced blob files behind, never a row naming a missing blob. The job spec's
 * "versions" says which parameter versions stay exportable. */
static void gc_fragment(coord *c, int64_t job, int fragment, int64_t round) {
  char **names = NULL;
  int n = 0;
  const coord_job *j = coord_job_get(c, job);
  const int keep_last = j ? j->spec.versions.keep_last : 2, keep_every = j ? j->spec.versions.keep_every : 0;
  if (store_gc_versions(c->st, job, fragment, keep_last, keep_every, &names, &n) == 0) {
    if (n > 0) TESTHOOK("gc");
    gc_delete_files(c, names, n);
  }
  if (store_gc_deltas(c->st, job, fragment, round, &names, &n) == 0) {
    if (n > 0) TESTHOOK("gc");
    gc_delete_files(c, names, n);
  }
}

/* The round closed at its deadline without some slots: revoke their leases for the round
 * and move every slot of the fragment's paths that has not reached the next round. */
static void skip_missing_slots(coord *c, coord_job *j, int fragment, int64_t round) {
  store_lease *act;
  int na;
  if (store_list_active_leases(c->st, j->id, &act, &na) == 0) {
    for (int i = 0; i < na; i++)
      if (act[i].round == round && sched_path_has_fragment(j, act[i].path, fragment)) {
        DPC_WARN("lease %lld revoked: round %lld of job %lld closed at its deadline without it", (long long)act[i].id,
                 (long long)round, (long long)j->id);
        store_end_lease(c->st, act[i].id, LEASE_RELEASED, 1, act[i].inner_steps, coord_now_ms());
        coord_note_drop(c, act[i].id);
      }
    free(act);
  }
  store_slot *slots;
  int ns;
  if (store_list_slots(c->st, j->id, &slots, &ns) == 0) {
    for (int i = 0; i < ns; i++)
      if (slots[i].state == SLOT_IDLE && slots[i].round == round && sched_path_has_fragment(j, slots[i].path, fragment))
        store_advance_slot(c->st, j->id, slots[i].path, slots[i].replica, round + 1,
                           (round + 1) * (int64_t)j->spec.inner_steps);
    free(slots);
  }
}

static void check_job_done(coord *c, coord_job *j) {
  if (j->state != JOB_RUNNING && j->state != JOB_PAUSED) return;
  store_fragment *frags;
  int nf;
  if (store_list_fragments(c->st, j->id, &frags, &nf) < 0) return;
  int done = nf > 0;
  for (int i = 0; i < nf; i++)
    if (frags[i].version < j->spec.rounds) done = 0;
  free(frags);
  if (done) coord_job_set_state(c, j, JOB_FINISHED, NULL);
}

/* A failed outer step (its blobs could not be written or its commit failed: an I/O error, a
 * full disk) is tried again from the durable deltas, but not in a tight loop. */
#define OUTER_RETRY_MS 1000

static void outer_after(uv_work_t *req, int status) {
  outer_work *w = req->data;
  coord *c = w->c;
  coord_job *j = coord_job_get(c, w->job);
  if (j) j->outer_busy[w->fragment] = 0;
  if (status != 0 || w->rc < 0) {
    DPC_ERROR("job %lld fragment %d round %lld: outer step failed: %s; trying again in %d ms", (long long)w->job,
              w->fragment, (long long)w->round, status ? "canceled" : w->err, OUTER_RETRY_MS);
    if (j && w->rc == DPC_ENUMERIC) coord_job_set_state(c, j, JOB_FAILED, w->err);
    if (j) j->outer_retry_at[w->fragment] = coord_now_ms() + OUTER_RETRY_MS;
    goto done;
  }
  store_outer_commit oc = {.job = w->job, .fragment = w->fragment, .round = w->round, .new_version = w->new_version,
                           .param_blob = w->new_param, .param_crc = w->param_crc, .momentum_blob = w->new_momentum,
                           .momentum_crc = w->momentum_crc, .applied = w->delta_ids, .n_applied = w->n,
                           .close_round = 1, .now_ms = coord_now_ms()};
  TESTHOOK("outer");
  int rc = store_commit_outer(c->st, &oc);
  if (rc < 0) {
    DPC_ERROR("job %lld fragment %d round %lld: cannot commit the outer step: %s; trying again in %d ms",
              (long long)w->job, w->fragment, (long long)w->round, dpc_errmsg(), OUTER_RETRY_MS);
    if (j) j->outer_retry_at[w->fragment] = coord_now_ms() + OUTER_RETRY_MS;
    goto done;
  }
  c->rounds_total++;
  c->outer_steps++;
  c->outer_seconds_sum += w->seconds;
  c->outer_seconds_last = w->seconds;
  /* Mean of the slot losses recorded for this round. */
  double sum = 0;
  int cnt = 0;
  store_metric *ms;
  int nm;
  if (store_list_metrics(c->st, w->job, w->round, &ms, &nm) == 0) {
    for (int i = 0; i < nm; i++)
      if (ms[i].round == w->round && ms[i].path >= 0 && isfinite(ms[i].loss)) {
        sum += ms[i].loss;
        cnt++;
      }
    free(ms);
  }
  double mean = cnt ? sum / cnt : NAN;
  store_metric m = {.job = w->job, .round = w->round, .path = -1, .replica = -1, .loss = mean,
                    .outer_seconds = w->seconds, .created_at = coord_now_ms()};
  store_add_metric(c->st, &m);
  if (j && cnt) j->last_loss = (float)mean;
  DPC_INFO("round %lld closed: job %lld fragment %d -> version %lld, %d deltas%s, mean loss %.4f, outer step %.3f s",
           (long long)w->round, (long long)w->job, w->fragment + 1, (long long)w->new_version, w->n,
           w->by_deadline ? " (deadline)" : "", mean, w->seconds);
  pcache_put(c, w->job, w->fragment, w->new_version, w->theta, w->len, w->param_crc);
  w->theta = NULL;
  if (j && w->by_deadline) skip_missing_slots(c, j, w->fragment, w->round);
  gc_fragment(c, w->job, w->fragment, w->round);
  if (j) check_job_done(c, j);
done:
  outer_work_free(w);
  coord_work_done(c);
  if (!c->stopping) sched_check_rounds(c);
}

/* Start the outer step of (j, f) for its open round if it is complete. */
static void check_fragment(coord *c, coord_job *j, int f, int64_t now) {
  if (j->outer_busy[f] || now < j->outer_retry_at[f]) return;
  store_fragment fr;
  if (store_get_fragment(c->st, j->id, f, &fr) < 0) return;
  int64_t t = fr.version;
  if (t >= j->spec.rounds) return;
  /* Called after every push: count first (one index scan), read the rows only when the round
   * can close. */
  int have;
  if (store_count_received_slots(c->st, j->id, f, t, &have) < 0 || have == 0) return;
  if (have < j->expected[f]) {
    store_round r;
    if (store_get_round(c->st, j->id, f, t, &r) < 0 || r.deadline_at == 0 || now < r.deadline_at) return;
  }
  store_delta *ds;
  int nd;
  if (store_list_deltas(c->st, j->id, f, t, DELTA_RECEIVED, &ds, &nd) < 0) return;
  /* Keep one delta per slot (the newest), in (path, replica) order. */
  int n = 0;
  for (int i = 0; i < nd; i++) {
    if (n > 0 && ds[n - 1].path == ds[i].path && ds[n - 1].replica == ds[i].replica) ds[n - 1] = ds[i];
    else ds[n++] = ds[i];
  }
  int by_deadline = 0;
  if (n < j->expected[f]) {
    store_round r;
    int need = (int)ceil(j->spec.quorum * j->expected[f] - 1e-9);
    if (need < 1) need = 1;
    if (n == 0 || store_get_round(c->st, j->id, f, t, &r) < 0 || r.deadline_at == 0 || now < r.deadline_at || n < need) {
      free(ds);
      return;
    }
    by_deadline = 1;
  }
  outer_work *w = calloc(1, sizeof *w);
  if (!w || !(w->delta_blobs = calloc((size_t)n, sizeof *w->delta_blobs)) ||
      !(w->weights = calloc((size_t)n, sizeof *w->weights)) || !(w->delta_ids = calloc((size_t)n, sizeof *w->delta_ids))) {
    if (w) outer_work_free(w);
    free(ds);
    DPC_ERROR("out of memory starting an outer step");
    return;
  }
  w->c = c;
  w->job = j->id;
  w->fragment = f;
  w->round = t;
  w->new_version = t + 1;
  w->len = fr.len;
  w->n = n;
  w->by_deadline = by_deadline;
  for (int i = 0; i < n; i++) {
    snprintf(w->delta_blobs[i], BLOB_NAME_MAX, "%s", ds[i].blob);
    w->weights[i] = j->spec.weighting == WEIGHTING_TOKENS ? (double)ds[i].tokens : 1.0;
    w->delta_ids[i] = ds[i].id;
  }
  free(ds);
  snprintf(w->param_blob, sizeof w->param_blob, "%s", fr.param_blob);
  snprintf(w->momentum_blob, sizeof w->momentum_blob, "%s", fr.momentum_blob);
  blob_id pid = {.job = j->id, .fragment = f, .version = t + 1, .kind = BLOB_PARAMS};
  blob_id mid = {.job = j->id, .fragment = f, .version = t + 1, .kind = BLOB_MOMENTUM};
  blob_name(&pid, w->new_param, sizeof w->new_param);
  blob_name(&mid, w->new_momentum, sizeof w->new_momentum);
  w->lr = (float)j->spec.outer.lr;
  w->mu = (float)j->spec.outer.momentum;
  w->nesterov = j->spec.outer.nesterov;
  w->req.data = w;
  j->outer_busy[f] = 1;
  if (coord_queue_work(c, &w->req, outer_run, outer_after) < 0) {
    j->outer_busy[f] = 0;
    outer_work_free(w);
  }
}

/* ---- async apply ---------------------------------------------------------------------------- */

typedef struct {
  uv_work_t req;
  coord *c;
  int64_t job;
  int fragment;
  store_delta d;          /* the delta being applied */
  int64_t new_version, staleness;
  size_t len;
  jobspec_async_rule rule;
  int N;
  double cc;
  float lr, mu;
  int64_t dn_t;           /* in: before; out: after */
  char param_blob[BLOB_NAME_MAX], momentum_blob[BLOB_NAME_MAX], dnbuf_blob[BLOB_NAME_MAX];
  char new_param[BLOB_NAME_MAX], new_momentum[BLOB_NAME_MAX], new_dnbuf[BLOB_NAME_MAX];
  /* results */
  int rc;
  char err[512];
  float *theta;
  uint32_t param_crc, momentum_crc, dnbuf_crc;
  double seconds;
} async_work;

static void async_run(uv_work_t *req) {
  async_work *w = req->data;
  double t0 = mono_s();
  float *g = NULL, *m = NULL, *buf = NULL;
  int rc = 0;
  w->theta = malloc(w->len * sizeof(float));
  g = malloc(w->len * sizeof(float));
  m = calloc(w->len, sizeof(float));
  buf = calloc(w->len, sizeof(float));
  if (!w->theta || !g || !m || !buf) {
    rc = dpc_err(DPC_ENOMEM, "out of memory for the async outer step (%zu floats)", w->len);
    goto out;
  }
  if ((rc = blob_read(w->c->bs, w->param_blob, BLOB_PARAMS, w->theta, w->len, NULL)) < 0) goto out;
  if ((rc = blob_read(w->c->bs, w->d.blob, BLOB_DELTA, g, w->len, NULL)) < 0) goto out;
  if (w->rule != OUTER_ASYNC_SGD && w->momentum_blob[0] &&
      (rc = blob_read(w->c->bs, w->momentum_blob, BLOB_MOMENTUM, m, w->len, NULL)) < 0)
    goto out;
  if (w->rule == OUTER_ASYNC_DN) {
    if (w->dnbuf_blob[0] && (rc = blob_read(w->c->bs, w->dnbuf_blob, BLOB_DN_BUF, buf, w->len, NULL)) < 0) goto out;
    outer_dn_state s;
    if ((rc = outer_dn_init(&s, buf, m, w->len, w->N, w->cc, w->dn_t, 0)) < 0) goto out;
    if ((rc = outer_dn_apply(&s, w->theta, g, w->lr, w->mu)) < 0) goto out;
    w->dn_t = s.t;
  } else if (w->rule == OUTER_ASYNC_NESTEROV) {
    outer_nesterov_step(w->theta, m, g, w->len, w->lr, w->mu, 1);
  } else {
    outer_sgd_step(w->theta, g, w->len, w->lr);
  }
  for (size_t i = 0; i < w->len; i++)
    if (!isfinite(w->theta[i])) {
      rc = dpc_err(DPC_ENUMERIC, "async outer step gave a non-finite parameter at index %zu", i);
      goto out;
    }
  if ((rc = blob_write(w->c->bs, w->new_param, BLOB_PARAMS, w->theta, w->len, &w->param_crc)) < 0) goto out;
  if (w->rule != OUTER_ASYNC_SGD &&
      (rc = blob_write(w->c->bs, w->new_momentum, BLOB_MOMENTUM, m, w->len, &w->momentum_crc)) < 0)
    goto out;
  if (w->rule == OUTER_ASYNC_DN) rc = blob_write(w->c->bs, w->new_dnbuf, BLOB_DN_BUF, buf, w->len, &w->dnbuf_crc);
out:
  if (rc < 0) snprintf(w->err, sizeof w->err, "%s", dpc_errmsg());
  w->rc = rc;
  free(g);
  free(m);
  free(buf);
  w->seconds = mono_s() - t0;
}

static void async_after(uv_work_t *req, int status) {
  async_work *w = req->data;
  coord *c = w->c;
  coord_job *j = coord_job_get(c, w->job);
  if (j) j->outer_busy[w->fragment] = 0;
  if (status != 0 || w->rc < 0) {
    DPC_ERROR("job %lld fragment %d: applying delta %lld failed: %s", (long long)w->job, w->fragment + 1,
              (long long)w->d.id, status ? "canceled" : w->err);
    if (j && (w->rc == DPC_ENUMERIC || w->rc == DPC_ESHAPE || w->rc == DPC_ECHECKSUM))
      coord_job_set_state(c, j, JOB_FAILED, w->err);
    if (j) j->outer_retry_at[w->fragment] = coord_now_ms() + OUTER_RETRY_MS;
    goto done;
  }
  int dn = w->rule == OUTER_ASYNC_DN, mom = w->rule != OUTER_ASYNC_SGD;
  store_outer_commit oc = {.job = w->job, .fragment = w->fragment, .round = w->d.round, .new_version = w->new_version,
                           .param_blob = w->new_param, .param_crc = w->param_crc,
                           .momentum_blob = mom ? w->new_momentum : NULL, .momentum_crc = w->momentum_crc,
                           .dnbuf_blob = dn ? w->new_dnbuf : NULL, .dnbuf_crc = w->dnbuf_crc, .dn_t = w->dn_t,
                           .applied = &w->d.id, .n_applied = 1, .close_round = 0, .now_ms = coord_now_ms()};
  int rc = store_commit_outer(c->st, &oc);
  if (rc < 0) {
    DPC_ERROR("job %lld fragment %d: cannot commit delta %lld: %s", (long long)w->job, w->fragment + 1,
              (long long)w->d.id, dpc_errmsg());
    if (j) j->outer_retry_at[w->fragment] = coord_now_ms() + OUTER_RETRY_MS;
    goto done;
  }
  c->outer_steps++;
  c->outer_seconds_sum += w->seconds;
  c->outer_seconds_last = w->seconds;
  if (j) {
    if (w->d.path < j->n_paths && isfinite(j->path_loss[w->d.path])) j->last_loss = j->path_loss[w->d.path];
    j->async_applied++;
    j->stale_last = w->staleness;
    if (w->staleness > j->stale_max) j->stale_max = w->staleness;
    j->stale_sum += (double)w->staleness;
  }
  DPC_INFO("delta applied: job %lld fragment %d lease %lld slot (path %d, replica %d) base %lld -> version %lld, "
           "staleness %lld, %s, %.3f s", (long long)w->job, w->fragment + 1, (long long)w->d.lease, w->d.path,
           w->d.replica, (long long)w->d.base_version, (long long)w->new_version, (long long)w->staleness,
           w->rule == OUTER_ASYNC_DN ? "delayed-nesterov" : w->rule == OUTER_ASYNC_NESTEROV ? "nesterov" : "sgd",
           w->seconds);
  pcache_put(c, w->job, w->fragment, w->new_version, w->theta, w->len, w->param_crc);
  w->theta = NULL;
  {
    char **names = NULL;
    int n = 0;
    int keep = j ? 2 * j->n_slots + 2 : 2;
    /* keep_every = 2^30 keeps version 0 (multiples of it), the ledger's starting point. */
    if (store_gc_versions(c->st, w->job, w->fragment, keep, 1 << 30, &names, &n) == 0) {
      blob_delete_many(c->bs, names, n);
      store_names_free(names, n);
    }
  }
done:
  free(w->theta);
  free(w);
  coord_work_done(c);
  if (!c->stopping) sched_check_rounds(c);
}

/* Start applying the oldest pending delta of (j, f), dropping too-stale ones first. */
static void async_check_fragment(coord *c, coord_job *j, int f) {
  if (j->outer_busy[f] || coord_now_ms() < j->outer_retry_at[f]) return;
  store_fragment fr;
  store_delta d;
  for (;;) {
    if (store_get_fragment(c->st, j->id, f, &fr) < 0) return;
    int have = store_next_pending_delta(c->st, j->id, f, &d);
    if (have <= 0) return;
    int64_t stale = fr.version - d.base_version;
    if (j->spec.max_staleness > 0 && stale > j->spec.max_staleness) {
      DPC_WARN("delta %lld of lease %lld dropped: staleness %lld exceeds max_staleness %d", (long long)d.id,
               (long long)d.lease, (long long)stale, j->spec.max_staleness);
      if (store_drop_delta(c->st, d.id) < 0) return;
      j->async_dropped++;
      continue;
    }
    break;
  }
  async_work *w = calloc(1, sizeof *w);
  if (!w) {
    DPC_ERROR("out of memory starting an async outer step");
    return;
  }
  w->c = c;
  w->job = j->id;
  w->fragment = f;
  w->d = d;
  w->new_version = fr.version + 1;
  w->staleness = fr.version - d.base_version;
  w->len = fr.len;
  w->rule = j->spec.outer.async_rule;
  w->N = j->spec.outer.buffer > 0 ? j->spec.outer.buffer : j->n_slots;
  w->cc = j->spec.outer.c;
  if (w->cc > 1.0 / w->N) w->cc = 1.0 / w->N; /* c ∈ [0, 1/N] with the default N */
  w->lr = (float)j->spec.outer.lr;
  w->mu = (float)j->spec.outer.momentum;
  w->dn_t = fr.dn_t;
  snprintf(w->param_blob, sizeof w->param_blob, "%s", fr.param_blob);
  snprintf(w->momentum_blob, sizeof w->momentum_blob, "%s", fr.momentum_blob);
  snprintf(w->dnbuf_blob, sizeof w->dnbuf_blob, "%s", fr.dnbuf_blob);
  blob_id pid = {.job = j->id, .fragment = f, .version = w->new_version, .kind = BLOB_PARAMS};
  blob_id mid = {.job = j->id, .fragment = f, .version = w->new_version, .kind = BLOB_MOMENTUM};
  blob_id bid = {.job = j->id, .fragment = f, .version = w->new_version, .kind = BLOB_DN_BUF};
  blob_name(&pid, w->new_param, sizeof w->new_param);
  blob_name(&mid, w->new_momentum, sizeof w->new_momentum);
  blob_name(&bid, w->new_dnbuf, sizeof w->new_dnbuf);
  w->req.data = w;
  j->outer_busy[f] = 1;
  if (coord_queue_work(c, &w->req, async_run, async_after) < 0) {
    j->outer_busy[f] = 0;
    free(w);
  }
}

/* Apply what is pending; finish the job once its budget is trained and nothing is left. */
static void async_check_job(coord *c, coord_job *j) {
  int busy = 0;
  for (int f = 0; f < j->n_fragments; f++) {
    async_check_fragment(c, j, f);
    busy |= j->outer_busy[f];
  }
  if (busy || j->state != JOB_RUNNING) return;
  store_slot *slots;
  int ns;
  store_lease *act;
  int na;
  if (store_list_slots(c->st, j->id, &slots, &ns) < 0) return;
  if (store_list_active_leases(c->st, j->id, &act, &na) < 0) {
    free(slots);
    return;
  }
  int64_t left = async_budget_left(c, j, slots, ns, act, na);
  free(slots);
  free(act);
  if (left > 0 || na > 0) return;
  for (int f = 0; f < j->n_fragments; f++) {
    store_delta d;
    if (store_next_pending_delta(c->st, j->id, f, &d) != 0) return;
  }
  coord_job_set_state(c, j, JOB_FINISHED, NULL);
}

void sched_check_rounds(coord *c) {
  if (c->stopping) {
    coord_retry_parked(c, 1);
    return;
  }
  int64_t now = coord_now_ms();
  for (int ji = 0; ji < c->n_jobs; ji++) {
    coord_job *j = c->jobs[ji];
    if (j->state != JOB_RUNNING && j->state != JOB_PAUSED) continue;
    if (j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC) {
      async_check_job(c, j);
      continue;
    }
    for (int f = 0; f < j->n_fragments; f++) check_fragment(c, j, f, now);
    check_job_done(c, j);
  }
  coord_retry_parked(c, 0);
}

void sched_tick(coord *c) {
  if (c->stopping) return;
  int64_t now = coord_now_ms();
  int64_t *ids = NULL;
  int n = 0;
  store_lease *act;
  int na = 0;
  /* Remember who held what, for the log line. */
  if (store_list_active_leases(c->st, 0, &act, &na) < 0) act = NULL, na = 0;
  /* A lease past its expiry whose deltas are all durable is finished, not expired: the work
   * is in, so the slot moves on instead of training the closed round again. */
  for (int k = 0; k < na; k++)
    if (act[k].expires_at <= now && sched_lease_maybe_pushed(c, &act[k])) act[k].state = LEASE_FINISHED;
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
      coord_note_drop(c, ids[i]);
    }
    free(ids);
  }
  free(act);
  store_worker *ws;
  int nw;
  if (store_list_workers(c->st, &ws, &nw) == 0) {
    int64_t gone_after = c->lease_ttl_ms > 3 * c->heartbeat_ms ? c->lease_ttl_ms : 3 * c->heartbeat_ms;
    for (int i = 0; i < nw; i++) {
      /* After a restart, silence counts from the start: workers could not call a dead process. */
      const int64_t seen = ws[i].last_seen >= c->started_ms ? ws[i].last_seen : c->live_floor_ms;
      if (ws[i].state == WORKER_ACTIVE && now - seen > gone_after && !coord_is_parked(ws[i].id)) {
        DPC_WARN("worker %lld (%s) is gone: no call for %lld ms", (long long)ws[i].id, ws[i].name,
                 (long long)(now - ws[i].last_seen));
        store_set_worker_state(c->st, ws[i].id, WORKER_GONE);
      }
    }
    free(ws);
  }
  sched_check_rounds(c);
}
