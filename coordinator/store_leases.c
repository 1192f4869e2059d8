/* store_leases.c — who trains what: workers (registration, state, liveness touches), slots
 * (path, replica) and their rounds, and leases of a slot to a worker: grant, renew, end,
 * expire. Liveness itself (last_seen, renewed expiries) is kept in memory by store_live.c;
 * readers here overlay it. Same contract as store.h: one thread per handle, one transaction
 * per multi-row change. */
#include "coordinator/store.h"
#include "coordinator/store_internal.h"
#include "common/errors.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

/* ---- workers ----------------------------------------------------------------------------- */

int store_register_worker(store *st, const char *name, const unsigned char token_hash[STORE_TOKEN_HASH_BYTES],
                          const char *info, int64_t now_ms, int64_t *id) {
  if (!name || !name[0] || strlen(name) >= sizeof(((store_worker *)0)->name))
    return dpc_err(DPC_EINVAL, "worker name empty or longer than %zu bytes", sizeof(((store_worker *)0)->name) - 1);
  if (info && strlen(info) >= sizeof(((store_worker *)0)->info))
    return dpc_err(DPC_EINVAL, "worker info longer than %zu bytes", sizeof(((store_worker *)0)->info) - 1);
  sqlite3_stmt *s = sq_stmt(st, S_INS_WORKER);
  if (!s) return DPC_EINTERNAL;
  BTXT(s, 1, name);
  sqlite3_bind_blob(s, 2, token_hash, STORE_TOKEN_HASH_BYTES, SQLITE_STATIC);
  BTXT(s, 3, info);
  B64(s, 4, now_ms);
  TRY(sq_exec_done(st, s, "register worker"));
  *id = sqlite3_last_insert_rowid(st->db);
  return 0;
}

int store_get_worker(store *st, int64_t id, store_worker *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_WORKER);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, id);
  int rc = sq_get_row(st, s, "get worker", &WORKER_MAP, out);
  if (rc < 0) return rc;
  if (!rc) return dpc_err(DPC_ENOENT, "no worker with id %lld", (long long)id);
  live_overlay_worker(st, out);
  return 0;
}

int store_touch_worker(store *st, int64_t id, int64_t now_ms, double steps_per_s) {
  int64_t last_seen = 0;
  if (!live_find(&st->live_workers, id)) {
    store_worker w; /* first touch since the store was opened: the worker must exist */
    TRY(store_get_worker(st, id, &w));
    last_seen = w.last_seen;
  }
  return live_touch_worker(st, id, last_seen, now_ms, steps_per_s);
}

static int changed_or_enoent(store *st, const char *what, int64_t id) {
  return sqlite3_changes(st->db) > 0 ? 0 : dpc_err(DPC_ENOENT, "%s: no row with id %lld", what, (long long)id);
}

int store_set_worker_state(store *st, int64_t id, store_worker_state state) {
  if ((unsigned)state > WORKER_GONE) return dpc_err(DPC_EINVAL, "unknown worker state %d", (int)state);
  sqlite3_stmt *s = sq_stmt(st, S_SET_WORKER_STATE);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, id);
  BTXT(s, 2, WORKER_STATES[state]);
  TRY(sq_exec_done(st, s, "set worker state"));
  return changed_or_enoent(st, "set worker state", id);
}

int store_mark_workers_gone(store *st, const int64_t *ids, int n) {
  if (n <= 0) return 0;
  TRY(sq_begin(st));
  for (int i = 0; i < n; i++) {
    STMT(s, S_SET_WORKER_STATE);
    B64(s, 1, ids[i]);
    BTXT(s, 2, WORKER_STATES[WORKER_GONE]);
    TX(sq_exec_done(st, s, "mark workers gone"));
  }
  TX(sq_commit(st));
  return 0;
}

int store_list_workers(store *st, store_worker **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LIST_WORKERS);
  if (!s) return DPC_EINTERNAL;
  int rc = sq_collect(st, s, "list workers", &WORKER_MAP, (void **)out, n);
  for (int i = 0; rc >= 0 && i < *n; i++) live_overlay_worker(st, &(*out)[i]);
  return rc;
}

int store_list_workers_after(store *st, int64_t after, int limit, store_worker **out, int *n) {
  *out = NULL;
  *n = 0;
  if (limit <= 0) return dpc_err(DPC_EINVAL, "store_list_workers_after: limit %d", limit);
  sqlite3_stmt *s = sq_stmt(st, S_LIST_WORKERS_AFTER);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, after, limit);
  int rc = sq_collect(st, s, "list workers", &WORKER_MAP, (void **)out, n);
  for (int i = 0; rc >= 0 && i < *n; i++) live_overlay_worker(st, &(*out)[i]);
  return rc;
}

int store_forget_workers(store *st, int64_t before_ms, int limit, int64_t **ids, int *n) {
  if (ids) *ids = NULL;
  *n = 0;
  if (limit <= 0) return dpc_err(DPC_EINVAL, "store_forget_workers: limit %d", limit);
  TRY(sq_begin(st));
  /* The batched last_seen values first, so that a worker seen a moment ago is not taken for
   * a long-gone one. */
  TX(live_flush_tx(st));
  int64_t *arr = NULL;
  int cap = 0, cnt = 0, rc;
  STMT(s, S_FORGET_WORKERS);
  BIND_I64S(s, before_ms, limit);
  while ((rc = sq_step(st, s, "forget workers")) == SQLITE_ROW) {
    if ((rc = sq_grow((void **)&arr, &cap, cnt, sizeof *arr)) < 0) break;
    arr[cnt++] = sqlite3_column_int64(s, 0);
  }
  sqlite3_reset(s);
  if (rc >= 0) rc = sq_commit(st);
  if (rc < 0) {
    free(arr);
    return sq_rollback(st, rc);
  }
  live_flushed(st);
  for (int i = 0; i < cnt; i++) live_remove(&st->live_workers, arr[i]);
  if (ids) *ids = arr;
  else free(arr);
  *n = cnt;
  return 0;
}

/* ---- slots ------------------------------------------------------------------------------- */

int store_get_slot(store *st, int64_t job, int path, int replica, store_slot *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_SLOT);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, path, replica);
  int rc = sq_get_row(st, s, "get slot", &SLOT_MAP, out);
  if (rc != 0) return rc < 0 ? rc : 0;
  return dpc_err(DPC_ENOENT, "job %lld has no slot (path %d, replica %d)", (long long)job, path, replica);
}

int store_list_slots(store *st, int64_t job, store_slot **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LIST_SLOTS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  return sq_collect(st, s, "list slots", &SLOT_MAP, (void **)out, n);
}

int store_list_idle_slots(store *st, int64_t job, int64_t lo, int64_t hi, store_slot **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_IDLE_SLOTS);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, lo, hi);
  return sq_collect(st, s, "list idle slots", &SLOT_MAP, (void **)out, n);
}

int store_any_slot_below(store *st, int64_t job, int64_t round) {
  sqlite3_stmt *s = sq_stmt(st, S_ANY_SLOT_BELOW);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, round);
  int64_t v = 0;
  int rc = sq_get_i64(st, s, "any slot below", &v);
  if (rc < 0) return rc;
  return rc && v != 0;
}

int store_set_slot_state(store *st, int64_t job, int path, int replica, store_slot_state state) {
  if (state != SLOT_IDLE && state != SLOT_DONE) return dpc_err(DPC_EINVAL, "slots become leased only through a lease");
  store_slot cur;
  TRY(sq_begin(st));
  TX(store_get_slot(st, job, path, replica, &cur));
  if (cur.state == SLOT_LEASED)
    return sq_rollback(st, dpc_err(DPC_ESTATE, "slot (job %lld, path %d, replica %d) is leased; end the lease first",
                                (long long)job, path, replica));
  STMT(s, S_SET_SLOT_STATE);
  BIND_I64S(s, job, path, replica);
  BTXT(s, 4, SLOT_STATES[state]);
  TX(sq_exec_done(st, s, "set slot state"));
  TX(sq_commit(st));
  return 0;
}

int store_advance_slot(store *st, int64_t job, int path, int replica, int64_t round, int64_t inner_steps) {
  if (round < 0 || inner_steps < 0) return dpc_err(DPC_EINVAL, "store_advance_slot: negative round or inner steps");
  sqlite3_stmt *s = sq_stmt(st, S_ADVANCE_SLOT);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, path, replica, round, inner_steps);
  TRY(sq_exec_done(st, s, "advance slot"));
  if (sqlite3_changes(st->db) != 1)
    return dpc_err(DPC_ESTATE, "slot (job %lld, path %d, replica %d) is not idle below round %lld", (long long)job, path,
                   replica, (long long)round);
  return 0;
}

/* ---- leases ------------------------------------------------------------------------------ */

int store_create_lease(store *st, const store_new_lease *nl, int64_t *lease_id) {
  if (nl->inner_steps < 1 || nl->n_fragments < 1 || !nl->fragments || !nl->base_versions)
    return dpc_err(DPC_EINVAL, "store_create_lease: need inner_steps >= 1 and at least one fragment");
  store_worker w;
  TRY(store_get_worker(st, nl->worker, &w));
  TRY(sq_begin(st));
  store_slot slot;
  TX(store_get_slot(st, nl->job, nl->path, nl->replica, &slot));
  {
    STMT(s, S_LEASE_SLOT);
    BIND_I64S(s, nl->job, nl->path, nl->replica, nl->worker);
    TX(sq_exec_done(st, s, "lease slot"));
    if (sqlite3_changes(st->db) != 1)
      return sq_rollback(st, dpc_err(DPC_ESTATE, "slot (job %lld, path %d, replica %d) is %s, not idle", (long long)nl->job,
                                  nl->path, nl->replica, SLOT_STATES[slot.state]));
  }
  STMT(s, S_INS_LEASE);
  BIND_I64S(s, nl->job, nl->path, nl->replica, nl->worker, nl->round, nl->inner_steps, nl->step_begin, nl->now_ms,
            nl->expires_at, nl->sched_shift);
  TX(sq_exec_done(st, s, "insert lease"));
  int64_t id = sqlite3_last_insert_rowid(st->db);
  for (int i = 0; i < nl->n_fragments; i++) {
    STMT(f, S_INS_LEASE_FRAG);
    BIND_I64S(f, id, nl->fragments[i], nl->base_versions[i]);
    TX(sq_exec_done(st, f, "insert lease fragment"));
  }
  TX(sq_commit(st));
  *lease_id = id;
  return 0;
}

int store_get_lease(store *st, int64_t id, store_lease *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_LEASE);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, id);
  int rc = sq_get_row(st, s, "get lease", &LEASE_MAP, out);
  if (rc < 0) return rc;
  if (!rc) return dpc_err(DPC_ENOENT, "no lease with id %lld", (long long)id);
  live_overlay_lease(st, out);
  return 0;
}

int store_lease_base_version(store *st, int64_t lease, int fragment, int64_t *version) {
  sqlite3_stmt *s = sq_stmt(st, S_LEASE_BASE);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, lease, fragment);
  int rc = sq_get_i64(st, s, "lease base version", version);
  if (rc < 0) return rc;
  return rc ? 0 : dpc_err(DPC_ENOENT, "lease %lld does not cover fragment %d", (long long)lease, fragment);
}

int store_lease_fragments(store *st, int64_t lease, int **fragments, int64_t **base_versions, int *n) {
  *fragments = NULL;
  *base_versions = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LEASE_FRAGS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, lease);
  int *f = NULL;
  int64_t *v = NULL;
  int fcap = 0, vcap = 0, cnt = 0, rc;
  while ((rc = sq_step(st, s, "lease fragments")) == SQLITE_ROW) {
    if ((rc = sq_grow((void **)&f, &fcap, cnt, sizeof *f)) < 0) break;
    if ((rc = sq_grow((void **)&v, &vcap, cnt, sizeof *v)) < 0) break;
    f[cnt] = sqlite3_column_int(s, 0);
    v[cnt++] = sqlite3_column_int64(s, 1);
  }
  sqlite3_reset(s);
  if (rc < 0) {
    free(f);
    free(v);
    return rc;
  }
  *fragments = f;
  *base_versions = v;
  *n = cnt;
  return 0;
}

int store_renew_lease(store *st, int64_t lease, int64_t worker, int64_t expires_at) {
  store_lease l;
  TRY(store_get_lease(st, lease, &l));
  if (l.state != LEASE_ACTIVE)
    return dpc_err(DPC_ESTATE, "lease %lld is %s; ask for a new lease", (long long)lease, LEASE_STATES[l.state]);
  if (l.worker != worker)
    return dpc_err(DPC_EPERM, "lease %lld belongs to worker %lld, not %lld", (long long)lease, (long long)l.worker,
                   (long long)worker);
  return live_renew_lease(st, lease, expires_at); /* durable at the next flush (store_live.c) */
}

/* Inside a transaction: end one active lease and free its slot. */
static int end_lease_tx(store *st, const store_lease *l, store_lease_state how, int advance, int64_t steps_done,
                        int64_t now_ms) {
  sqlite3_stmt *s = sq_stmt(st, S_END_LEASE);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, l->id);
  BTXT(s, 2, LEASE_STATES[how]);
  B64(s, 3, now_ms);
  TRY(sq_exec_done(st, s, "end lease"));
  if (sqlite3_changes(st->db) != 1) return dpc_err(DPC_ESTATE, "lease %lld is not active", (long long)l->id);
  sqlite3_stmt *f = sq_stmt(st, S_FREE_SLOT);
  if (!f) return DPC_EINTERNAL;
  BIND_I64S(f, l->job, l->path, l->replica, advance ? 1 : 0, advance ? steps_done : 0);
  return sq_exec_done(st, f, "free slot");
}

int store_end_lease(store *st, int64_t lease, store_lease_state how, int advance, int64_t steps_done, int64_t now_ms) {
  if (how == LEASE_ACTIVE || (unsigned)how > LEASE_EXPIRED) return dpc_err(DPC_EINVAL, "store_end_lease: bad end state %d", (int)how);
  if (steps_done < 0) return dpc_err(DPC_EINVAL, "store_end_lease: negative steps_done");
  store_lease l;
  TRY(sq_begin(st));
  TX(store_get_lease(st, lease, &l));
  if (l.state != LEASE_ACTIVE)
    return sq_rollback(st, dpc_err(DPC_ESTATE, "lease %lld is already %s", (long long)lease, LEASE_STATES[l.state]));
  TX(end_lease_tx(st, &l, how, advance, steps_done, now_ms));
  TX(sq_commit(st));
  return 0;
}

int store_lease_grace(store *st, int64_t until_ms) {
  sqlite3_stmt *s = sq_stmt(st, S_LEASE_GRACE);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, until_ms);
  TRY(sq_exec_done(st, s, "lease grace"));
  return sqlite3_changes(st->db);
}

int store_expire_leases(store *st, int64_t now_ms, int64_t **ids, int *n) {
  if (ids) *ids = NULL;
  *n = 0;
  TRY(sq_begin(st));
  /* The batched liveness first (store_live.c), in this same transaction: one commit a tick,
   * and the expiry query below sees every renewal. */
  TX(live_flush_tx(st));
  int64_t *arr = NULL;
  int cap = 0, cnt = 0, rc;
  STMT(s, S_DUE_LEASES);
  B64(s, 1, now_ms);
  while ((rc = sq_step(st, s, "due leases")) == SQLITE_ROW) {
    if ((rc = sq_grow((void **)&arr, &cap, cnt, sizeof *arr)) < 0) break;
    arr[cnt++] = sqlite3_column_int64(s, 0);
  }
  sqlite3_reset(s);
  for (int i = 0; rc >= 0 && i < cnt; i++) {
    store_lease l;
    rc = store_get_lease(st, arr[i], &l);
    if (rc >= 0) rc = end_lease_tx(st, &l, LEASE_EXPIRED, 0, 0, now_ms);
  }
  if (rc >= 0) rc = sq_commit(st);
  if (rc < 0) {
    free(arr);
    return sq_rollback(st, rc);
  }
  live_flushed(st);
  if (ids) *ids = arr;
  else free(arr);
  *n = cnt;
  return 0;
}

int store_list_active_leases(store *st, int64_t job, store_lease **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_ACTIVE_LEASES);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  int rc = sq_collect(st, s, "list leases", &LEASE_MAP, (void **)out, n);
  for (int i = 0; rc >= 0 && i < *n; i++) live_overlay_lease(st, &(*out)[i]);
  return rc;
}

