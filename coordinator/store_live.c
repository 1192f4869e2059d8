/* store_live.c — liveness kept in memory: a worker's last_seen / steps_per_s (every
 * authenticated call touches it) and an active lease's renewed expiry (every heartbeat).
 *
 * Committing each of these on its own made every worker call an fsync'd SQLite transaction
 * on the loop thread (synchronous = FULL). They are soft state: losing the last few hundred
 * milliseconds of them in a crash changes nothing that matters (a worker is seen again when
 * it next calls; a lease's durable expiry lags by at most one flush). So they live in two
 * small hash maps and are written in one batch inside the transaction store_expire_leases
 * runs on every coordinator tick anyway (before its expiry query, so expiry sees every
 * renewal), by store_flush_liveness, and at store_close. Readers of workers and leases see
 * the in-memory values (live_overlay_*). Leases themselves, deltas, rounds and versions are
 * still committed transactionally where they change.
 *
 * This file keeps the values and writes them; whether a worker or lease exists is decided by
 * its caller (store_leases.c), so it calls nothing above store_sql.c. */
#include "coordinator/store_internal.h"

#include "common/errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static size_t slot_of(const live_map *m, int64_t key) {
  return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 17) & (m->cap - 1);
}

live_ent *live_find(live_map *m, int64_t key) {
  if (!m->cap || key == 0) return NULL;
  for (size_t i = slot_of(m, key);; i = (i + 1) & (m->cap - 1)) {
    if (m->e[i].key == key) return &m->e[i];
    if (m->e[i].key == 0) return NULL;
  }
}

static int live_grow(live_map *m) {
  size_t cap = m->cap ? 2 * m->cap : 64;
  live_ent *e = calloc(cap, sizeof *e);
  if (!e) return DPC_ENOMEM;
  live_map n = {.e = e, .cap = cap, .n = 0};
  for (size_t i = 0; i < m->cap; i++)
    if (m->e[i].key) {
      size_t j = slot_of(&n, m->e[i].key);
      while (n.e[j].key) j = (j + 1) & (cap - 1);
      n.e[j] = m->e[i];
      n.n++;
    }
  free(m->e);
  *m = n;
  return 0;
}

live_ent *live_put(live_map *m, int64_t key) {
  if (key == 0) return NULL;
  live_ent *e = live_find(m, key);
  if (e) return e;
  if ((m->n + 1) * 4 > m->cap * 3 && live_grow(m) < 0) return NULL; /* load factor ≤ 3/4 */
  size_t i = slot_of(m, key);
  while (m->e[i].key) i = (i + 1) & (m->cap - 1);
  memset(&m->e[i], 0, sizeof m->e[i]);
  m->e[i].key = key;
  m->n++;
  return &m->e[i];
}

/* Linear probing: removal shifts back every later entry of the run that its home slot
 * allows, so that no lookup meets a hole before its key. */
void live_remove(live_map *m, int64_t key) {
  live_ent *e = live_find(m, key);
  if (!e) return;
  const size_t mask = m->cap - 1;
  size_t i = (size_t)(e - m->e);
  for (size_t j = (i + 1) & mask; m->e[j].key; j = (j + 1) & mask) {
    size_t home = slot_of(m, m->e[j].key);
    /* Entry j may move to hole i when its home is not cyclically in (i, j]. */
    int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!stays) {
      m->e[i] = m->e[j];
      i = j;
    }
  }
  memset(&m->e[i], 0, sizeof m->e[i]);
  m->n--;
}

void live_clear(live_map *m) {
  if (m->cap) memset(m->e, 0, m->cap * sizeof *m->e);
  m->n = 0;
}

void live_free(live_map *m) {
  free(m->e);
  memset(m, 0, sizeof *m);
}

void live_overlay_worker(store *st, store_worker *w) {
  live_ent *e = live_find(&st->live_workers, w->id);
  if (!e) return;
  if (e->t > w->last_seen) w->last_seen = e->t;
  if (e->has_sps) w->steps_per_s = e->sps;
}

void live_overlay_lease(store *st, store_lease *l) {
  if (l->state != LEASE_ACTIVE) return;
  live_ent *e = live_find(&st->live_leases, l->id);
  if (e) l->expires_at = e->t; /* the latest renewal */
}

int live_flush_tx(store *st) {
  if (!st->live_dirty) return 0;
  for (size_t i = 0; i < st->live_workers.cap; i++) {
    live_ent *e = &st->live_workers.e[i];
    if (!e->key || !e->dirty) continue;
    sqlite3_stmt *s = sq_stmt(st, S_TOUCH_WORKER);
    if (!s) return DPC_EINTERNAL;
    B64(s, 1, e->key);
    B64(s, 2, e->t);
    if (e->has_sps) BDBL(s, 3, e->sps);
    else sqlite3_bind_null(s, 3);
    TRY(sq_exec_done(st, s, "flush worker liveness"));
  }
  for (size_t i = 0; i < st->live_leases.cap; i++) {
    live_ent *e = &st->live_leases.e[i];
    if (!e->key) continue;
    sqlite3_stmt *s = sq_stmt(st, S_RENEW_LEASE);
    if (!s) return DPC_EINTERNAL;
    BIND_I64S(s, e->key, e->t);
    TRY(sq_exec_done(st, s, "flush lease renewals"));
  }
  return 0;
}

void live_flushed(store *st) {
  for (size_t i = 0; i < st->live_workers.cap; i++) st->live_workers.e[i].dirty = 0;
  live_clear(&st->live_leases); /* the rows hold the values now */
  st->live_dirty = 0;
}

int store_flush_liveness(store *st) {
  if (!st->live_dirty) return 0;
  TRY(sq_begin(st));
  int rc = live_flush_tx(st);
  if (rc >= 0) rc = sq_commit(st);
  if (rc < 0) return sq_rollback(st, rc);
  live_flushed(st);
  return 0;
}

int live_touch_worker(store *st, int64_t id, int64_t last_seen, int64_t now_ms, double steps_per_s) {
  live_ent *e = live_find(&st->live_workers, id);
  if (!e) {
    if (!(e = live_put(&st->live_workers, id))) return dpc_err(DPC_ENOMEM, "touch worker: out of memory");
    e->t = last_seen;
  }
  if (now_ms > e->t) e->t = now_ms;
  if (isfinite(steps_per_s) && steps_per_s >= 0) {
    e->sps = steps_per_s;
    e->has_sps = 1;
  }
  e->dirty = 1;
  st->live_dirty = 1;
  return 0;
}

int live_renew_lease(store *st, int64_t lease, int64_t expires_at) {
  live_ent *e = live_put(&st->live_leases, lease);
  if (!e) return dpc_err(DPC_ENOMEM, "renew lease: out of memory");
  e->t = expires_at;
  e->dirty = 1;
  st->live_dirty = 1;
  return 0;
}
