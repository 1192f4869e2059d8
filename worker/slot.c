/* slot.c — the trainer and the slots' AdamW state kept between leases, and the inner.state
 * checkpoint transfers (slot.h). */
#include "worker/slot.h"
#include "common/errors.h"
#include "common/log.h"
#include "worker/data.h"
#include "worker/storeget.h"
#include "worker/storeput.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static void key_free(trainer_key *k) {
  worker_free_paths(k->paths, k->n_paths);
  memset(k, 0, sizeof *k);
}

static int key_equal(const trainer_key *a, const trainer_key *b) {
  if (a->job != b->job || memcmp(&a->cfg, &b->cfg, sizeof a->cfg) != 0 || a->n_paths != b->n_paths) return 0;
  const trainer_opts *x = &a->opts, *y = &b->opts;
  if (x->B != y->B || x->T != y->T || x->total_steps != y->total_steps || x->lr != y->lr ||
      x->lr_min_frac != y->lr_min_frac || x->warmup != y->warmup || x->hp.beta1 != y->hp.beta1 ||
      x->hp.beta2 != y->hp.beta2 || x->hp.eps != y->hp.eps || x->hp.weight_decay != y->hp.weight_decay ||
      x->hp.grad_clip != y->hp.grad_clip || x->replica != y->replica || x->n_replicas != y->n_replicas ||
      x->muon != y->muon || x->muon_lr != y->muon_lr || memcmp(&x->mu, &y->mu, sizeof x->mu) != 0)
    return 0;
  for (int i = 0; i < a->n_paths; i++)
    if (strcmp(a->paths[i], b->paths[i]) != 0) return 0;
  return 1;
}

void slot_cache_free(slot_cache *c) {
  trainer_free(c->tr);
  key_free(&c->key);
  for (int i = 0; i < SLOT_STATES_MAX; i++) slot_drop(&c->states[i]);
  slot_drop(&c->pending);
  free(c->theta);
  free(c->delta);
  memset(c, 0, sizeof *c);
}

slot_state *slot_find(slot_cache *c, uint64_t job, uint32_t path, uint32_t replica) {
  for (int i = 0; i < SLOT_STATES_MAX; i++)
    if (c->states[i].used && c->states[i].job == job && c->states[i].path == path &&
        c->states[i].replica == replica)
      return &c->states[i];
  return NULL;
}

void slot_drop(slot_state *s) {
  free(s->m);
  free(s->v);
  memset(s, 0, sizeof *s);
}

void slot_forget(slot_cache *c, uint64_t job, uint32_t path, uint32_t replica) {
  slot_state *s = slot_find(c, job, path, replica);
  if (s) slot_drop(s);
}

/* Make the empty entry s hold room for n floats of moments of (job, path, replica). */
static int state_alloc(slot_state *s, uint64_t job, uint32_t path, uint32_t replica, size_t n) {
  s->m = malloc(n * sizeof(float));
  s->v = malloc(n * sizeof(float));
  if (!s->m || !s->v) {
    slot_drop(s);
    return dpc_err(DPC_ENOMEM, "worker: out of memory for AdamW state (%zu floats)", n);
  }
  s->used = 1;
  s->n = n;
  s->job = job;
  s->path = path;
  s->replica = replica;
  return 0;
}

slot_state *slot_get(slot_cache *c, uint64_t job, uint32_t path, uint32_t replica, size_t n) {
  slot_state *s = slot_find(c, job, path, replica);
  if (!s) {
    for (int i = 0; i < SLOT_STATES_MAX && !s; i++)
      if (!c->states[i].used) s = &c->states[i];
    if (!s) {
      s = &c->states[0];
      for (int i = 1; i < SLOT_STATES_MAX; i++)
        if (c->states[i].last_used < s->last_used) s = &c->states[i];
      DPC_WARN("dropping the AdamW state of job %" PRIu64 " slot (%u,%u) to make room", s->job, s->path, s->replica);
      slot_drop(s);
    }
  }
  if (s->used && s->n != n) slot_drop(s);
  if (!s->used && state_alloc(s, job, path, replica, n)) return NULL;
  s->last_used = dpc_mono_ms();
  return s;
}

/* Move the trainer's moments into the state store (the slot it holds them for). */
static int stash_current(slot_cache *c) {
  if (!c->tr || !c->have_slot) return 0;
  slot_state *s = slot_get(c, c->key.job, c->cur_path, c->cur_replica, c->n_params);
  if (!s) return DPC_ENOMEM;
  int rc = trainer_get_state(c->tr, s->m, s->v, &s->adam_step);
  c->have_slot = 0;
  return rc;
}

/* The trainer now holds the moments of L's slot. */
static void hold_slot(slot_cache *c, const Dipaco__V1__Lease *L) {
  c->have_slot = 1;
  c->cur_path = L->slot->path;
  c->cur_replica = L->slot->replica;
}

/* Build a trainer for key k (taking its paths) unless the current one was built for an equal
 * key (then k is freed). */
static int open_trainer(slot_cache *c, const struct worker_opts *o, trainer_key *k, const lease_plan *p) {
  int rc = 0;
  if (c->tr && !key_equal(&c->key, k)) {
    rc = stash_current(c);
    trainer_free(c->tr);
    c->tr = NULL;
    key_free(&c->key);
    if (rc) {
      key_free(k);
      return rc;
    }
  }
  if (c->tr) {
    key_free(k);
    return 0;
  }
  gpt_backend_opts bo = {.kind = o->backend, .threads = o->threads, .device = o->device, .precision = o->precision};
  rc = trainer_open(&c->tr, &p->cfg, &bo, (const char *const *)k->paths, k->n_paths, &p->opts);
  if (rc) {
    key_free(k);
    return rc;
  }
  c->key = *k;
  c->have_slot = 0;
  DPC_INFO("trainer for job %" PRIu64 ": L=%d NH=%d C=%d V=%d B=%d T=%d replica %d of %d, %d data file%s", k->job,
           p->cfg.n_layer, p->cfg.n_head, p->cfg.n_embd, p->cfg.vocab_size, p->opts.B, p->opts.T, p->opts.replica,
           p->opts.n_replicas, k->n_paths, k->n_paths == 1 ? "" : "s");
  return 0;
}

int slot_fit_trainer(slot_cache *c, const struct worker_opts *o, const Dipaco__V1__Lease *L, const lease_plan *p) {
  trainer_key k = {.job = L->job_id, .cfg = p->cfg, .opts = p->opts};
  int rc = worker_resolve_data(o->data_dir, L->spec_json, (int)L->slot->path, L->data->dataset, &k.paths, &k.n_paths);
  if (!rc) rc = open_trainer(c, o, &k, p);
  if (rc) return rc;
  if (trainer_num_params(c->tr) != p->n_params)
    return dpc_err(DPC_EINTERNAL, "trainer has %zu parameters, the lease's model %zu", trainer_num_params(c->tr),
                   p->n_params);
  if (c->n_params != p->n_params) {
    free(c->theta);
    free(c->delta);
    c->theta = malloc(p->n_params * sizeof(float));
    c->delta = malloc(p->n_params * sizeof(float));
    c->n_params = c->theta && c->delta ? p->n_params : 0;
    if (!c->n_params) return dpc_err(DPC_ENOMEM, "worker: out of memory for %zu parameters", p->n_params);
  }
  return 0;
}

/* Lease L's slot has moments kept by slot_keep_trained: 1 and the trainer holds them when L
 * starts where they end; otherwise they are dropped (0), or the error. */
static int take_pending(slot_cache *c, const Dipaco__V1__Lease *L) {
  slot_state *p = &c->pending;
  uint32_t path = L->slot->path, rep = L->slot->replica;
  if (!p->used || p->job != L->job_id || p->path != path || p->replica != rep) return 0;
  if ((uint64_t)p->adam_step != L->first_step) {
    slot_drop(p); /* the slot did not move on: its delta was not merged */
    return 0;
  }
  int rc = c->have_slot && c->cur_path == path && c->cur_replica == rep ? 0 : stash_current(c);
  if (!rc) rc = trainer_set_state(c->tr, p->m, p->v, p->adam_step);
  if (!rc)
    DPC_INFO("job %" PRIu64 " slot (%u,%u): its last delta was merged although its push got no answer; resuming "
             "the AdamW state trained for it (step %ld)", L->job_id, path, rep, p->adam_step);
  slot_drop(p);
  slot_forget(c, L->job_id, path, rep);
  if (rc) {
    c->have_slot = 0;
    return rc;
  }
  hold_slot(c, L);
  return 1;
}

int slot_keep_trained(slot_cache *c, const Dipaco__V1__Lease *L) {
  slot_state *s = &c->pending;
  slot_drop(s);
  int rc = state_alloc(s, L->job_id, L->slot->path, L->slot->replica, c->n_params);
  if (!rc && (rc = trainer_get_state(c->tr, s->m, s->v, &s->adam_step))) slot_drop(s);
  return rc;
}

int slot_select_state(slot_cache *c, const Dipaco__V1__Lease *L) {
  uint32_t path = L->slot->path, rep = L->slot->replica;
  if (L->inner_state == DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_RESET) {
    c->have_slot = 0;
    slot_forget(c, L->job_id, path, rep);
    slot_drop(&c->pending);
    return trainer_reset_state(c->tr);
  }
  int rc = take_pending(c, L);
  if (rc) return rc < 0 ? rc : 0;
  if (c->have_slot && c->cur_path == path && c->cur_replica == rep) return 0;
  rc = stash_current(c);
  if (rc) return rc;
  slot_state *s = slot_find(c, L->job_id, path, rep);
  if (s) {
    rc = trainer_set_state(c->tr, s->m, s->v, s->adam_step);
    if (!rc && (uint64_t)s->adam_step != L->first_step)
      DPC_WARN("job %" PRIu64 " slot (%u,%u): AdamW state is from step %ld but the lease starts at step %" PRIu64
               " (another worker trained the slot in between); using it anyway", L->job_id, path, rep, s->adam_step,
               L->first_step);
    slot_drop(s);
  } else {
    rc = trainer_reset_state(c->tr);
    if (L->first_step > 0)
      DPC_WARN("job %" PRIu64 " slot (%u,%u): no AdamW state for this slot here (first step %" PRIu64
               "); starting fresh", L->job_id, path, rep, L->first_step);
  }
  if (rc) return rc;
  hold_slot(c, L);
  return 0;
}

/* The inner state's third stream: the local parameters (streaming) or the error-feedback
 * buffer (SparseLoCo). */
static int third_payload(const Dipaco__V1__Lease *L) {
  return L->streaming ? DIPACO__V1__PAYLOAD__PAYLOAD_LOCAL_PARAMS : DIPACO__V1__PAYLOAD__PAYLOAD_EF_BUFFER;
}

/* Pull the slot's AdamW state (every fragment of the lease) into m and v, *step the AdamW
 * step the fragments agree on. */
static int pull_inner(wclient *wc, worker_ctl *ctl, unsigned *seed, const Dipaco__V1__Lease *L, const lease_plan *p,
                      float *m, float *v, float *local, uint64_t *step) {
  uint64_t step0 = 0;
  int rc = 0;
  for (size_t i = 0; i < L->n_fragments && !rc; i++) {
    const Dipaco__V1__FragmentInfo *f = L->fragments[i];
    float *const mi = m + p->abs_off[i], *const vi = v + p->abs_off[i], *const li = local ? local + p->abs_off[i] : NULL;
    int done = 0;
    if (f->params_url && f->params_url[0]) { /* the blobs are in an object store: read them there */
      int code = RPC_OK;
      if ((done = wc_pull_inner_objects(wc, L->lease_id, f, mi, vi, li, third_payload(L), step, &code) == 0))
        DPC_INFO("lease %" PRIu64 ": inner state of fragment %" PRIu64 " read from the object store (step %" PRIu64 ")",
                 L->lease_id, f->fragment_id, *step);
      else
        DPC_WARN("lease %" PRIu64 ": reading the inner state from the object store: %s; asking the coordinator for "
                 "its bytes", L->lease_id, dpc_errmsg());
    }
    for (int attempt = 0; !done; attempt++) {
      int code = RPC_OK;
      rc = wc_pull_inner(wc, L->lease_id, f, mi, vi, li, third_payload(L), step, &code);
      if (rc == 0 || wc_classify(rc, code) != WC_RETRY || attempt >= 3 || worker_stopping(ctl)) break;
      DPC_WARN("lease %" PRIu64 ": pulling the inner state: %s; retrying", L->lease_id, dpc_errmsg());
      if (worker_sleep(ctl, worker_backoff_ms(attempt, seed))) break;
    }
    if (!rc && i > 0 && *step != step0)
      rc = dpc_err(DPC_EFORMAT, "lease %" PRIu64 ": inner state fragments disagree on the AdamW step (%" PRIu64
                   " vs %" PRIu64 ")", L->lease_id, *step, step0);
    step0 = *step;
  }
  if (!rc && *step > (uint64_t)LONG_MAX)
    rc = dpc_err(DPC_EFORMAT, "inner state step %" PRIu64 " out of range", *step);
  return rc;
}

int slot_resume_checkpoint(slot_cache *c, wclient *wc, worker_ctl *ctl, unsigned *seed, const Dipaco__V1__Lease *L,
                           const lease_plan *p, float *local) {
  int rc = stash_current(c);
  if (rc) return rc;
  slot_forget(c, L->job_id, L->slot->path, L->slot->replica);
  float *m = calloc(p->n_params, sizeof(float)), *v = calloc(p->n_params, sizeof(float));
  uint64_t step = 0;
  rc = m && v ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory for the inner state");
  if (!rc) rc = pull_inner(wc, ctl, seed, L, p, m, v, local, &step);
  if (!rc) rc = trainer_set_state(c->tr, m, v, (long)step);
  if (!rc)
    DPC_INFO("lease %" PRIu64 ": resumed the slot's AdamW state from its checkpoint (step %" PRIu64 ", lease starts at %"
             PRIu64 ")", L->lease_id, step, L->first_step);
  free(m);
  free(v);
  if (rc) return rc;
  hold_slot(c, L);
  return 0;
}

/* Lease.inner_put: put every fragment's M, V (and third) blob in the object store
 * (PrepareDeltaPut with their payloads, a PUT each or per part), then commit them (one
 * PushInnerState of PAYLOAD_INNER_OBJECT chunks); M carries the AdamW step in two more floats,
 * as the coordinator's own M blobs do. */
static int put_inner(wclient *wc, const Dipaco__V1__Lease *L, const float *const *mp, const float *const *vp,
                     const float *const *lp, uint64_t step, int *code) {
  const size_t kinds = lp ? 3 : 2, n = L->n_fragments * kinds;
  const int payload[3] = {DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_M, DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_V, third_payload(L)};
  const uint32_t kind[3] = {STORE_KIND_INNER_M, STORE_KIND_INNER_V,
                            L->streaming ? STORE_KIND_INNER_L : STORE_KIND_INNER_E};
  const uint32_t lohi[2] = {(uint32_t)step, (uint32_t)(step >> 32)};
  storeput_object *o = calloc(n, sizeof *o);
  wc_put *w = calloc(n, sizeof *w);
  Dipaco__V1__FragmentInfo **fr = calloc(n, sizeof *fr);
  int rc = o && w && fr ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory");
  uint64_t bytes = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    const size_t f = i / kinds, k = i % kinds;
    fr[i] = L->fragments[f];
    storeput_make_kind(&o[i], kind[k], (k == 0 ? mp : k == 1 ? vp : lp)[f], fr[i]->num_floats, lohi,
                       k == 0 ? sizeof lohi : 0);
    w[i].payload = payload[k];
    w[i].num_floats = o[i].n;
    bytes += storeput_bytes(&o[i]);
  }
  if (!rc) rc = wc_put_objects(wc, L->lease_id, fr, n, o, w, L->delta_put_part_bytes, 4, code, NULL);
  if (!rc) rc = wc_push_inner_objects(wc, L->lease_id, fr, n, w, code);
  if (!rc)
    DPC_INFO("lease %" PRIu64 ": inner state of %zu fragment(s) put in the object store (%zu objects, %" PRIu64
             " bytes, step %" PRIu64 ")", L->lease_id, (size_t)L->n_fragments, n, bytes, step);
  wc_put_free(w, n);
  free(o);
  free(fr);
  return rc;
}

int slot_push_inner(slot_cache *c, wclient *wc, const Dipaco__V1__Lease *L, const lease_plan *p, const float *ef,
                    int *code) {
  size_t nf = L->n_fragments;
  float *m = malloc(c->n_params * sizeof(float)), *v = malloc(c->n_params * sizeof(float));
  const float **mp = malloc(nf * sizeof *mp), **vp = malloc(nf * sizeof *vp), **lp = malloc(nf * sizeof *lp);
  float *loc = L->streaming ? malloc(c->n_params * sizeof(float)) : NULL; /* the slot's local parameters */
  const float *third = loc ? loc : ef;
  long step = 0;
  int rc = m && v && mp && vp && lp && (loc || !L->streaming) ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory for the inner state");
  if (!rc) rc = trainer_get_state(c->tr, m, v, &step);
  if (!rc && loc) rc = trainer_get_params(c->tr, loc, 0, c->n_params);
  for (size_t i = 0; i < nf && !rc; i++) {
    mp[i] = m + p->abs_off[i];
    vp[i] = v + p->abs_off[i];
    lp[i] = third ? third + p->abs_off[i] : NULL;
  }
  int put = !rc && L->inner_put && L->n_fragments > 0;
  if (put) {
    rc = put_inner(wc, L, mp, vp, third ? lp : NULL, (uint64_t)step, code);
    if (wc_put_falls_back(rc, *code)) { /* (as a delta's put: the store failed, or the object was refused) */
      DPC_WARN("lease %" PRIu64 ": putting the inner state in the object store failed: %s; pushing it to the "
               "coordinator", L->lease_id, dpc_errmsg());
      rc = 0;
      put = 0;
    }
  }
  if (!rc && !put)
    rc = wc_push_inner(wc, L->lease_id, L->fragments, nf, mp, vp, third ? lp : NULL, third_payload(L), (uint64_t)step,
                       code);
  free(m);
  free(v);
  free(loc);
  free(mp);
  free(vp);
  free(lp);
  return rc;
}

int slot_snapshot(slot_cache *c, const Dipaco__V1__Lease *L, slot_state **snap) {
  *snap = slot_get(c, L->job_id, L->slot->path, L->slot->replica, c->n_params);
  if (!*snap) return DPC_ENOMEM;
  return trainer_get_state(c->tr, (*snap)->m, (*snap)->v, &(*snap)->adam_step);
}

void slot_restore(slot_cache *c, slot_state *snap) {
  if (trainer_set_state(c->tr, snap->m, snap->v, snap->adam_step)) c->have_slot = 0;
  slot_drop(snap);
}
