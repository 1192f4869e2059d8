/* admin_fleet.c — the dipaco.v1.Admin views of the fleet and of a job's progress: workers
 * (list, drain), paths, modules and the metrics history with the delta ledger. All run on the
 * coordinator's loop thread with ud = the coord.
 *
 * Choices:
 *  - GetMetrics names: "loss" (per slot, path set; path −1 = round mean), "tokens",
 *    "bytes_in" (delta bytes), "bytes_out" (parameter bytes the lease pulled), "outer_seconds"
 *    (path −1). Metric rows carry no step: step = round · H. Every job adds its delta
 *    ledger, one point per applied delta in applied order for each series: "staleness"
 *    (value = staleness), "ledger_lease" (value = lease id), "ledger_replica" (value = the
 *    slot's replica), each with round = the version the delta produced, step = its base
 *    version, path = the slot's path, fragment_id = the wire fragment id (dipacoctl job
 *    ledger prints them as a table). since_round applies to the produced version. A sync
 *    round's deltas all produce version round + 1 with staleness 0, in (path, replica) order
 *    (the rows outlive garbage collection, which drops only their blobs). One more point,
 *    "ledger_dropped" (value = deltas trained but never applied: dropped as too stale at
 *    apply or refused at push; round = step = 0), closes the ledger. Sync jobs add
 *    "ledger_missed" before it: one point per slot that a closed round expected and did not
 *    merge (closed at its deadline or quorum grace window without it): value = the slot's
 *    replica, path = its path, round = the version the round produced, step = round,
 *    fragment_id; derived from the applied rows, so it survives restarts as they do. */
#include "coordinator/admin_fleet.h"

#include "common/errors.h"
#include "common/log.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/svc.h"
#include "proto/dipaco.pb-c.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- workers ---------------------------------------------------------------------------------- */

typedef struct {
  Dipaco__V1__WorkerInfo wi;
  Dipaco__V1__Slot slot;
  char backend[256], device[256], labels[256], host[128];
} worker_row;

static void fill_worker(coord *c, store_worker *w, const store_lease *act, int na, int64_t now, worker_row *row) {
  dipaco__v1__worker_info__init(&row->wi);
  dipaco__v1__slot__init(&row->slot);
  /* info is "backend\tdevice\tlabels" (svc_worker.c Register) */
  char tmp[256];
  snprintf(tmp, sizeof tmp, "%s", w->info);
  char *a = tmp, *b = strchr(a, '\t'), *l = NULL;
  if (b) {
    *b++ = 0;
    l = strchr(b, '\t');
    if (l) *l++ = 0;
  }
  snprintf(row->backend, sizeof row->backend, "%s", a);
  snprintf(row->device, sizeof row->device, "%s", b ? b : "");
  snprintf(row->labels, sizeof row->labels, "%s", l ? l : "");
  row->wi.worker_id = (uint64_t)w->id;
  row->wi.hostname = w->name;
  row->wi.backend = row->backend;
  row->wi.device = row->device;
  row->wi.labels = row->labels;
  row->wi.steps_per_sec = (float)w->steps_per_s;
  row->wi.last_heartbeat_unix_ms = w->last_seen;
  row->wi.registered_unix_ms = w->registered_at;
  const store_lease *mine = NULL;
  for (int i = 0; i < na; i++)
    if (act[i].worker == w->id) mine = &act[i];
  int gone = w->state == WORKER_GONE || !lease_worker_alive(c, w, now);
  row->wi.state = gone ? DIPACO__V1__WORKER_STATE__WORKER_GONE
                  : w->state == WORKER_DRAINING ? DIPACO__V1__WORKER_STATE__WORKER_DRAINING
                  : mine ? DIPACO__V1__WORKER_STATE__WORKER_TRAINING : DIPACO__V1__WORKER_STATE__WORKER_IDLE;
  if (mine) {
    row->wi.lease_id = (uint64_t)mine->id;
    row->wi.job_id = (uint64_t)mine->job;
    row->slot.path = (uint32_t)mine->path;
    row->slot.replica = (uint32_t)mine->replica;
    row->wi.slot = &row->slot;
  }
}

/* ListWorkers pages: the default and the most a page holds (a WorkerInfo is ≤ ~900 bytes,
 * so a full page stays far below the 4 MiB a default gRPC client accepts). */
#define WORKERS_PAGE_DEFAULT 500
#define WORKERS_PAGE_MAX 1000

/* page_token: the decimal id of the last worker the previous page scanned ("" = none). */
static int parse_page_token(const char *t, int64_t *after) {
  *after = 0;
  if (!t || !t[0]) return 0;
  int64_t v = 0;
  for (const char *p = t; *p; p++) {
    if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10 || p - t >= 19) return -1;
    v = v * 10 + (*p - '0');
  }
  *after = v;
  return 0;
}

static void on_list_workers(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  ProtobufCMessage *pm;
  if (svc_admin_unpack(c, call, req, &dipaco__v1__list_workers_request__descriptor, &pm)) return;
  Dipaco__V1__ListWorkersRequest *r = (Dipaco__V1__ListWorkersRequest *)pm;
  int64_t after;
  if (parse_page_token(r->page_token, &after) < 0) {
    char shown[32];
    snprintf(shown, sizeof shown, "%s", r->page_token);
    for (char *p = shown; *p; p++)
      if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "page_token \"%s\": not a token this server returned", shown);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  const int page = r->page_size == 0 ? WORKERS_PAGE_DEFAULT
                   : r->page_size > WORKERS_PAGE_MAX ? WORKERS_PAGE_MAX : (int)r->page_size;
  store_worker *ws = NULL;
  store_lease *act = NULL;
  int nw = 0, na = 0;
  int rc = store_list_active_leases(c->st, 0, &act, &na);
  worker_row *rows = rc == 0 ? calloc((size_t)page, sizeof *rows) : NULL;
  Dipaco__V1__WorkerInfo **wp = rc == 0 ? calloc((size_t)page, sizeof *wp) : NULL;
  char next[24] = "";
  size_t k = 0;
  if (rc == 0 && rows && wp) {
    /* Scan by id in batches until the page is full; filters may skip rows. next_page_token
     * is the last id scanned when the page filled before the end (the next page may then
     * turn out empty: the listing ends there). */
    int64_t now = dpc_wall_ms();
    int full = 0;
    while (!full && rc == 0) {
      if ((rc = store_list_workers_after(c->st, after, page, &ws, &nw)) < 0) break;
      for (int i = 0; i < nw && !full; i++) {
        after = ws[i].id;
        fill_worker(c, &ws[i], act, na, now, &rows[k]);
        if (!r->include_gone && rows[k].wi.state == DIPACO__V1__WORKER_STATE__WORKER_GONE) continue;
        if (r->job_id && rows[k].wi.job_id != r->job_id) continue;
        snprintf(rows[k].host, sizeof rows[k].host, "%s", ws[i].name); /* ws is freed per batch */
        rows[k].wi.hostname = rows[k].host;
        wp[k] = &rows[k].wi;
        full = ++k == (size_t)page;
      }
      int last_batch = nw < page;
      free(ws);
      ws = NULL;
      if (full) {
        snprintf(next, sizeof next, "%lld", (long long)after);
        break;
      }
      if (last_batch) break;
    }
  }
  if (rc < 0 || !rows || !wp) {
    rpc_call_fail(call, rc < 0 ? rc : DPC_ENOMEM);
  } else {
    Dipaco__V1__ListWorkersResponse resp = DIPACO__V1__LIST_WORKERS_RESPONSE__INIT;
    resp.n_workers = k;
    resp.workers = wp;
    resp.next_page_token = next;
    rpc_call_reply(call, &resp.base);
  }
  free(rows);
  free(wp);
  free(act);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static void on_drain_worker(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  ProtobufCMessage *pm;
  if (svc_admin_unpack(c, call, req, &dipaco__v1__drain_worker_request__descriptor, &pm)) return;
  Dipaco__V1__DrainWorkerRequest *r = (Dipaco__V1__DrainWorkerRequest *)pm;
  store_worker w;
  if (r->worker_id == 0 || r->worker_id > INT64_MAX || store_get_worker(c->st, (int64_t)r->worker_id, &w) < 0) {
    rpc_call_finish(call, RPC_NOT_FOUND, "worker_id %llu: no such worker", (unsigned long long)r->worker_id);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  store_set_worker_state(c->st, w.id, WORKER_DRAINING);
  store_lease *act = NULL;
  int na = 0;
  store_list_active_leases(c->st, 0, &act, &na);
  if (r->immediate)
    for (int i = 0; i < na; i++)
      if (act[i].worker == w.id) {
        store_end_lease(c->st, act[i].id, LEASE_RELEASED, 0, 0, dpc_wall_ms());
        lease_ended(c, act[i].id, 1);
      }
  DPC_INFO("worker %lld (%s) draining%s", (long long)w.id, w.name, r->immediate ? " now (lease released)" : "");
  free(act);
  store_list_active_leases(c->st, 0, &act, &na);
  store_get_worker(c->st, w.id, &w);
  worker_row row;
  fill_worker(c, &w, act, na, dpc_wall_ms(), &row);
  rpc_call_reply(call, &row.wi.base);
  free(act);
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* ---- paths, modules, metrics -------------------------------------------------------------------- */


/* A slot's row: its step, its lease and worker if active, its latest loss. */
static void fill_slot_info(coord *c, const coord_job *j, const store_slot *s, const store_lease *act, int na,
                           Dipaco__V1__SlotInfo *si, Dipaco__V1__Slot *sl) {
  dipaco__v1__slot_info__init(si);
  dipaco__v1__slot__init(sl);
  sl->path = (uint32_t)s->path;
  sl->replica = (uint32_t)s->replica;
  si->slot = sl;
  si->step = (uint64_t)s->inner_steps;
  si->last_loss = s->path < j->n_paths ? j->path_loss[s->path] : NAN;
  for (int k = 0; k < na; k++)
    if (act[k].path == s->path && act[k].replica == s->replica) {
      si->worker_id = (uint64_t)act[k].worker;
      si->lease_id = (uint64_t)act[k].id;
      lease_note *n = coord_note(c, act[k].id, 0);
      if (n && isfinite(n->loss)) si->last_loss = n->loss;
    }
}

static void on_list_paths(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  ProtobufCMessage *pm;
  if (svc_admin_unpack(c, call, req, &dipaco__v1__list_paths_request__descriptor, &pm)) return;
  Dipaco__V1__ListPathsRequest *r = (Dipaco__V1__ListPathsRequest *)pm;
  coord_job *j = svc_job_or_fail(c, call, r->job_id);
  if (!j) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  store_slot *slots = NULL;
  store_lease *act = NULL;
  int ns = 0, na = 0;
  int P = j->n_paths, L = j->spec.n_levels;
  Dipaco__V1__PathInfo *pi = calloc((size_t)P, sizeof *pi);
  Dipaco__V1__PathInfo **pp = calloc((size_t)P, sizeof *pp);
  uint64_t *mods = calloc((size_t)P * (size_t)L, sizeof *mods);
  size_t ndata = 0, nd_at = 0;
  for (int p = 0; p < P; p++) {
    const char(*d)[JOBSPEC_PATH_MAX] = NULL;
    int nd = jobspec_path_data(&j->spec, p, &d);
    ndata += nd > 0 ? (size_t)nd : 0;
  }
  char **datap = calloc(ndata + 1, sizeof *datap);
  int rc = store_list_slots(c->st, j->id, &slots, &ns);
  if (rc == 0) rc = store_list_active_leases(c->st, j->id, &act, &na);
  Dipaco__V1__SlotInfo *si = calloc((size_t)ns + 1, sizeof *si);
  Dipaco__V1__SlotInfo **sp = calloc((size_t)ns + 1, sizeof *sp);
  Dipaco__V1__Slot *sl = calloc((size_t)ns + 1, sizeof *sl);
  if (rc < 0 || !pi || !pp || !mods || !si || !sp || !sl || !datap) {
    rpc_call_fail(call, rc < 0 ? rc : DPC_ENOMEM);
    goto out;
  }
  for (int i = 0; i < ns; i++) {
    fill_slot_info(c, j, &slots[i], act, na, &si[i], &sl[i]);
    sp[i] = &si[i];
  }
  /* slots are ordered by (path, replica) */
  int at = 0;
  for (int p = 0; p < P; p++) {
    dipaco__v1__path_info__init(&pi[p]);
    pi[p].path = (uint32_t)p;
    int m[JOBSPEC_MAX_LEVELS];
    int nl = jobspec_path_modules(&j->spec, p, m);
    for (int l = 0; l < nl && l < L; l++) mods[(size_t)p * L + l] = (uint64_t)m[l] + 1;
    pi[p].n_modules = (size_t)(nl > 0 ? nl : 0);
    pi[p].modules = &mods[(size_t)p * L];
    /* The spec's strings outlive the reply (j stays while the loop runs this handler). */
    const char(*d)[JOBSPEC_PATH_MAX] = NULL;
    int nd = jobspec_path_data(&j->spec, p, &d);
    for (int k = 0; k < nd; k++) datap[nd_at + (size_t)k] = (char *)d[k];
    pi[p].n_data = (size_t)(nd > 0 ? nd : 0);
    pi[p].data = &datap[nd_at];
    nd_at += pi[p].n_data;
    int first = at;
    while (at < ns && slots[at].path == p) at++;
    pi[p].n_slots = (size_t)(at - first);
    pi[p].slots = &sp[first];
    pp[p] = &pi[p];
  }
  Dipaco__V1__ListPathsResponse resp = DIPACO__V1__LIST_PATHS_RESPONSE__INIT;
  resp.n_paths = (size_t)P;
  resp.paths = pp;
  rpc_call_reply(call, &resp.base);
out:
  free(pi);
  free(pp);
  free(mods);
  free(datap);
  free(si);
  free(sp);
  free(sl);
  free(slots);
  free(act);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static void on_list_modules(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  ProtobufCMessage *pm;
  if (svc_admin_unpack(c, call, req, &dipaco__v1__list_modules_request__descriptor, &pm)) return;
  Dipaco__V1__ListModulesRequest *r = (Dipaco__V1__ListModulesRequest *)pm;
  coord_job *j = svc_job_or_fail(c, call, r->job_id);
  if (!j) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  store_fragment *fr = NULL;
  int nf = 0;
  int rc = store_list_fragments(c->st, j->id, &fr, &nf);
  Dipaco__V1__ModuleInfo *mi = calloc((size_t)j->n_modules, sizeof *mi);
  Dipaco__V1__ModuleInfo **mp = calloc((size_t)j->n_modules, sizeof *mp);
  Dipaco__V1__FragmentInfo *fi = calloc((size_t)nf + 1, sizeof *fi);
  Dipaco__V1__FragmentInfo **fp = calloc((size_t)nf + 1, sizeof *fp);
  /* mpaths[m·P + k]: the k-th path holding module m (npaths[m] of them), in path order. */
  const int P = j->n_paths;
  uint32_t *mpaths = calloc((size_t)j->n_modules * (size_t)(P > 0 ? P : 1), sizeof *mpaths);
  size_t *npaths = calloc((size_t)j->n_modules + 1, sizeof *npaths);
  if (mpaths && npaths)
    for (int p = 0; p < P; p++) {
      int pm_[JOBSPEC_MAX_LEVELS];
      int nl = jobspec_path_modules(&j->spec, p, pm_);
      for (int l = 0; l < nl; l++)
        if (pm_[l] >= 0 && pm_[l] < j->n_modules) mpaths[(size_t)pm_[l] * (size_t)P + npaths[pm_[l]]++] = (uint32_t)p;
    }
  if (rc < 0 || !mi || !mp || !fi || !fp || !mpaths || !npaths) {
    rpc_call_fail(call, rc < 0 ? rc : DPC_ENOMEM);
  } else {
    for (int i = 0; i < nf; i++) {
      svc_fill_fragment_info(j, &fr[i], fr[i].version, &fi[i]);
      fp[i] = &fi[i];
    }
    for (int m = 0; m < j->n_modules; m++) {
      dipaco__v1__module_info__init(&mi[m]);
      mi[m].module_id = (uint64_t)j->modules[m].id + 1;
      mi[m].level = (uint32_t)j->modules[m].level;
      mi[m].index = (uint32_t)j->modules[m].index;
      mi[m].num_floats = j->modules[m].len;
      /* fragments are ordered by id and grouped by module */
      int first = -1, cnt = 0;
      for (int i = 0; i < nf; i++)
        if (fr[i].module == j->modules[m].id) {
          if (first < 0) first = i;
          cnt++;
        }
      mi[m].n_fragments = (size_t)cnt;
      mi[m].fragments = first >= 0 ? &fp[first] : NULL;
      mi[m].n_paths = npaths[m];
      mi[m].paths = &mpaths[(size_t)m * (size_t)P];
      mp[m] = &mi[m];
    }
    Dipaco__V1__ListModulesResponse resp = DIPACO__V1__LIST_MODULES_RESPONSE__INIT;
    resp.n_modules = (size_t)j->n_modules;
    resp.modules = mp;
    rpc_call_reply(call, &resp.base);
  }
  free(mi);
  free(mp);
  free(fi);
  free(fp);
  free(fr);
  free(mpaths);
  free(npaths);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static int want_name(const Dipaco__V1__GetMetricsRequest *r, const char *name) {
  if (r->n_names == 0) return 1;
  for (size_t i = 0; i < r->n_names; i++)
    if (strcmp(r->names[i], name) == 0) return 1;
  return 0;
}

/* The delta ledger of every fragment of j, in fragment order (*led: caller frees). */
static int list_ledger(coord *c, const coord_job *j, store_delta **led, int *nled) {
  int rc = 0;
  for (int f = 0; f < j->n_fragments && rc == 0; f++) {
    store_delta *d;
    int nd;
    if ((rc = store_list_ledger(c->st, j->id, f, &d, &nd)) < 0) break;
    store_delta *a = realloc(*led, (size_t)(*nled + nd + 1) * sizeof *a);
    if (!a) {
      free(d);
      rc = DPC_ENOMEM;
      break;
    }
    *led = a;
    if (nd) memcpy(*led + *nled, d, (size_t)nd * sizeof *d);
    *nled += nd;
    free(d);
  }
  return rc;
}

/* A slot that a closed sync round expected and did not merge (the round closed at its deadline
 * or at the end of its quorum grace window without it). */
typedef struct {
  int fragment, path, replica;
  int64_t version; /* the version the round produced (round + 1) */
} missed_slot;

/* The slots every closed round of sync job j missed: expected (every replica of every path
 * through the fragment's module) minus merged (its applied deltas in led[0..nled), which are
 * durable rows), by fragment, round, path, replica, from version since on. *out: caller
 * frees. Async jobs have no rounds: none. */
static int list_missed(coord *c, const coord_job *j, const store_delta *led, int nled, uint64_t since,
                       missed_slot **out, int *nout) {
  *out = NULL;
  *nout = 0;
  if (j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC) return 0;
  store_fragment *fr;
  int nf;
  int rc = store_list_fragments(c->st, j->id, &fr, &nf);
  if (rc < 0) return rc;
  const int R = j->spec.replicas, ns = j->n_paths * R;
  int cap = 0;
  for (int fi = 0; fi < nf && rc == 0; fi++) {
    const int f = fr[fi].fragment;
    const int64_t V = fr[fi].version; /* rounds 0 .. V-1 are closed */
    if (V <= 0 || f < 0 || f >= j->n_fragments) continue;
    unsigned char *seen = calloc((size_t)V * (size_t)ns, 1);
    if (!seen) {
      rc = DPC_ENOMEM;
      break;
    }
    for (int i = 0; i < nled; i++)
      if (led[i].fragment == f && led[i].applied_version >= 1 && led[i].applied_version <= V && led[i].path >= 0 &&
          led[i].path < j->n_paths && led[i].replica >= 0 && led[i].replica < R)
        seen[(size_t)(led[i].applied_version - 1) * (size_t)ns + (size_t)(led[i].path * R + led[i].replica)] = 1;
    for (int64_t t = 0; t < V && rc == 0; t++) {
      if ((uint64_t)(t + 1) < since) continue;
      for (int p = 0; p < j->n_paths && rc == 0; p++) {
        if (!coord_job_path_has_fragment(j, p, f)) continue;
        for (int r = 0; r < R; r++) {
          if (seen[(size_t)t * (size_t)ns + (size_t)(p * R + r)]) continue;
          if (*nout == cap) {
            cap = cap ? 2 * cap : 16;
            missed_slot *a = realloc(*out, (size_t)cap * sizeof *a);
            if (!a) {
              rc = DPC_ENOMEM;
              break;
            }
            *out = a;
          }
          (*out)[(*nout)++] = (missed_slot){.fragment = f, .path = p, .replica = r, .version = t + 1};
        }
      }
    }
    free(seen);
  }
  free(fr);
  return rc;
}

/* The series of the metric rows ms[0..nm) the request wants, from pt[k] on (up to limit);
 * returns the new count. */
static size_t metric_points(const coord_job *j, const Dipaco__V1__GetMetricsRequest *r, const store_metric *ms, int nm,
                            uint32_t limit, Dipaco__V1__MetricPoint *pt, Dipaco__V1__MetricPoint **pp, size_t k) {
  for (int i = 0; i < nm && k < limit; i++) {
    const store_metric *m = &ms[i];
    struct {
      const char *name;
      double v;
      int ok;
    } vals[5] = {{"loss", m->loss, isfinite(m->loss)},
                 {"tokens", (double)m->tokens, m->path >= 0},
                 {"bytes_in", (double)m->bytes_in, m->path >= 0},
                 {"bytes_out", (double)m->bytes_out, m->path >= 0},
                 {"outer_seconds", m->outer_seconds, m->path < 0}};
    for (int v = 0; v < 5 && k < limit; v++) {
      if (!vals[v].ok || !want_name(r, vals[v].name)) continue;
      dipaco__v1__metric_point__init(&pt[k]);
      pt[k].name = (char *)vals[v].name;
      pt[k].round = (uint64_t)m->round;
      pt[k].step = (uint64_t)m->round * (uint64_t)j->spec.inner_steps;
      pt[k].unix_ms = m->created_at;
      pt[k].value = vals[v].v;
      pt[k].path = m->path;
      pp[k] = &pt[k];
      k++;
    }
  }
  return k;
}

/* The ledger series ("staleness", "ledger_lease", "ledger_replica") of led[0..nled), from
 * pt[k] on (up to limit); returns the new count. */
static size_t ledger_points(const Dipaco__V1__GetMetricsRequest *r, const store_delta *led, int nled, uint32_t limit,
                            Dipaco__V1__MetricPoint *pt, Dipaco__V1__MetricPoint **pp, size_t k) {
  static const char *const lnames[3] = {"staleness", "ledger_lease", "ledger_replica"};
  for (int i = 0; i < nled && k < limit; i++) {
    const store_delta *d = &led[i];
    if ((uint64_t)d->applied_version < r->since_round) continue;
    double vals[3] = {(double)(d->applied_version - 1 - d->base_version), (double)d->lease, (double)d->replica};
    for (int v = 0; v < 3 && k < limit; v++) {
      if (!want_name(r, lnames[v])) continue;
      dipaco__v1__metric_point__init(&pt[k]);
      pt[k].name = (char *)lnames[v];
      pt[k].round = (uint64_t)d->applied_version;
      pt[k].step = (uint64_t)d->base_version;
      pt[k].unix_ms = d->received_at;
      pt[k].value = vals[v];
      pt[k].path = d->path;
      pt[k].fragment_id = (uint64_t)d->fragment + 1;
      pp[k] = &pt[k];
      k++;
    }
  }
  return k;
}

static void on_get_metrics(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  ProtobufCMessage *pm;
  if (svc_admin_unpack(c, call, req, &dipaco__v1__get_metrics_request__descriptor, &pm)) return;
  Dipaco__V1__GetMetricsRequest *r = (Dipaco__V1__GetMetricsRequest *)pm;
  coord_job *j = svc_job_or_fail(c, call, r->job_id);
  if (!j) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  store_metric *ms = NULL;
  int nm = 0;
  int rc = store_list_metrics(c->st, j->id, r->since_round > INT64_MAX ? INT64_MAX : (int64_t)r->since_round, &ms, &nm);
  uint32_t limit = r->limit ? r->limit : 10000;
  if (limit > 100000) limit = 100000;
  store_delta *led = NULL;
  int nled = 0;
  if (rc == 0) rc = list_ledger(c, j, &led, &nled);
  int64_t dropped = 0;
  if (rc == 0 && want_name(r, "ledger_dropped")) rc = store_count_dropped(c->st, j->id, &dropped);
  missed_slot *mis = NULL;
  int nmis = 0;
  if (rc >= 0 && want_name(r, "ledger_missed")) rc = list_missed(c, j, led, nled, r->since_round, &mis, &nmis);
  size_t cap = (size_t)nm * 5 + (size_t)nled * 3 + (size_t)nmis + 2;
  Dipaco__V1__MetricPoint *pt = calloc(cap, sizeof *pt);
  Dipaco__V1__MetricPoint **pp = calloc(cap, sizeof *pp);
  if (rc < 0 || !pt || !pp) {
    rpc_call_fail(call, rc < 0 ? rc : DPC_ENOMEM);
  } else {
    size_t k = metric_points(j, r, ms, nm, limit, pt, pp, 0);
    k = ledger_points(r, led, nled, limit, pt, pp, k);
    for (int i = 0; i < nmis && k < limit; i++) {
      dipaco__v1__metric_point__init(&pt[k]);
      pt[k].name = "ledger_missed";
      pt[k].round = (uint64_t)mis[i].version;
      pt[k].step = (uint64_t)mis[i].version - 1;
      pt[k].value = (double)mis[i].replica;
      pt[k].path = mis[i].path;
      pt[k].fragment_id = (uint64_t)mis[i].fragment + 1;
      pp[k] = &pt[k];
      k++;
    }
    if (want_name(r, "ledger_dropped") && k < cap) {
      dipaco__v1__metric_point__init(&pt[k]);
      pt[k].name = "ledger_dropped";
      pt[k].value = (double)dropped;
      pt[k].path = -1;
      pp[k] = &pt[k];
      k++;
    }
    Dipaco__V1__GetMetricsResponse resp = DIPACO__V1__GET_METRICS_RESPONSE__INIT;
    resp.n_points = k;
    resp.points = pp;
    rpc_call_reply(call, &resp.base);
  }
  free(pt);
  free(pp);
  free(ms);
  free(led);
  free(mis);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Admin/ListWorkers", .kind = RPC_UNARY, .on_call = on_list_workers},
    {.path = "/dipaco.v1.Admin/DrainWorker", .kind = RPC_UNARY, .on_call = on_drain_worker},
    {.path = "/dipaco.v1.Admin/ListPaths", .kind = RPC_UNARY, .on_call = on_list_paths},
    {.path = "/dipaco.v1.Admin/ListModules", .kind = RPC_UNARY, .on_call = on_list_modules},
    {.path = "/dipaco.v1.Admin/GetMetrics", .kind = RPC_UNARY, .on_call = on_get_metrics},
};

int admin_fleet_methods(coord *c, struct rpc_method *out) {
  return svc_methods_add(out, methods, (int)(sizeof methods / sizeof methods[0]), c);
}
