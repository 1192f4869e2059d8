/* store_deltas.c — the deltas workers push: recording one durably (idempotent per lease and
 * fragment, in one transaction with its metric and a shortened lease), and reading them back
 * by id, by round, by state, and the recent norms for the norm screen. Same contract as
 * store.h: one thread per handle, one transaction per multi-row change. */
#include "coordinator/store.h"
#include "coordinator/store_internal.h"
#include "common/errors.h"

#include <math.h>
#include <sqlite3.h>
#include <string.h>

int store_record_delta(store *st, const store_new_delta *nd, int64_t *delta_id) {
  if (!nd->blob || !nd->blob[0] || strlen(nd->blob) >= BLOB_NAME_MAX)
    return dpc_err(DPC_EINVAL, "store_record_delta: bad blob name");
  if (nd->enc_blob && strlen(nd->enc_blob) >= BLOB_NAME_MAX)
    return dpc_err(DPC_EINVAL, "store_record_delta: bad encoded blob name");
  if (!isfinite(nd->weight) || nd->weight < 0 || nd->tokens < 0)
    return dpc_err(DPC_EINVAL, "store_record_delta: weight %g / tokens %lld invalid", nd->weight, (long long)nd->tokens);
  TRY(sq_begin(st));
  /* Idempotency first: a retry of an acknowledged push must succeed even after the lease
   * ended or the round closed. */
  {
    STMT(s, S_FIND_DELTA);
    BIND_I64S(s, nd->lease, nd->fragment);
    store_delta_ref old;
    int rc = sq_get_row(st, s, "find delta", &DELTA_REF_MAP, &old);
    if (rc < 0) return sq_rollback(st, rc);
    if (rc) {
      sq_rollback(st, 0);
      if (old.checksum != nd->checksum)
        return dpc_err(DPC_EEXIST, "lease %lld already pushed a different delta for fragment %d (crc 0x%08x, now 0x%08x)",
                       (long long)nd->lease, nd->fragment, old.checksum, nd->checksum);
      if (delta_id) *delta_id = old.id;
      return 1;
    }
  }
  store_lease l;
  TX(store_get_lease(st, nd->lease, &l));
  int64_t base;
  TX(store_lease_base_version(st, nd->lease, nd->fragment, &base));
  store_round r;
  int have = store_find_round(st, l.job, nd->fragment, l.round, &r);
  if (have < 0) return sq_rollback(st, have);
  if (have && r.state == ROUND_CLOSED)
    return sq_rollback(st, dpc_err(DPC_ESTATE, "round %lld of fragment %d is closed; the delta of lease %lld is too late",
                                (long long)l.round, nd->fragment, (long long)nd->lease));
  /* A lease that expired (or was released) while its delta was on the way no longer owns the
   * slot: the slot's next lease pushes the round's delta, and this one must not count too. */
  if (l.state != LEASE_ACTIVE)
    return sq_rollback(st, dpc_err(DPC_ECANCELED, "lease %lld is no longer active (%s); its delta does not count",
                                (long long)nd->lease, LEASE_STATES[l.state]));
  STMT(s, S_INS_DELTA);
  BIND_I64S(s, l.job, l.round, nd->fragment, l.path, l.replica, nd->lease, base, nd->checksum);
  BTXT(s, 9, nd->blob);
  BDBL(s, 10, nd->weight);
  B64(s, 11, nd->tokens);
  B64(s, 12, nd->now_ms);
  if (isfinite(nd->norm) && nd->norm >= 0) BDBL(s, 13, nd->norm);
  else sqlite3_bind_null(s, 13);
  BTXT(s, 14, nd->enc_blob ? nd->enc_blob : "");
  B64(s, 15, nd->enc_blob ? (int64_t)nd->enc_crc : 0);
  TX(sq_exec_done(st, s, "insert delta"));
  int64_t id = sqlite3_last_insert_rowid(st->db);
  if (nd->metric) TX(store_add_metric(st, nd->metric));
  if (nd->inner_steps > 0 && nd->inner_steps < l.inner_steps) {
    STMT(sh, S_SHORTEN_LEASE);
    BIND_I64S(sh, nd->lease, nd->inner_steps);
    TX(sq_exec_done(st, sh, "shorten lease"));
  }
  TX(sq_commit(st));
  if (delta_id) *delta_id = id;
  return 0;
}

int store_find_delta(store *st, int64_t lease, int fragment, uint32_t *crc, uint32_t *enc_crc) {
  sqlite3_stmt *s = sq_stmt(st, S_FIND_DELTA);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, lease, fragment);
  store_delta_ref ref;
  int found = sq_get_row(st, s, "find delta", &DELTA_REF_MAP, &ref);
  if (found > 0 && crc) *crc = ref.checksum;
  if (found > 0 && enc_crc) *enc_crc = ref.enc_crc;
  return found;
}

int store_count_received_slots(store *st, int64_t job, int fragment, int64_t round, int *n) {
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_COUNT_RECEIVED_SLOTS);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment, round);
  int64_t count = 0;
  int rc = sq_get_i64(st, s, "count received deltas", &count);
  if (rc < 0) return rc;
  *n = (int)count;
  return 0;
}

int store_count_dropped(store *st, int64_t job, int64_t *n) {
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_COUNT_DROPPED);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job);
  return sq_get_i64(st, s, "count dropped deltas", n);
}

int store_round_spreads(store *st, int64_t job, int fragment, int64_t round, int max, int64_t *spread, int *count,
                        int *n) {
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_ROUND_SPREADS);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment, round, max);
  int rc;
  while ((rc = sq_step(st, s, "round spreads")) == SQLITE_ROW && *n < max) {
    spread[*n] = sqlite3_column_int64(s, 0);
    count[*n] = sqlite3_column_int(s, 1);
    (*n)++;
  }
  sqlite3_reset(s);
  return rc < 0 ? rc : 0;
}

int store_slot_trainers(store *st, int64_t job, int path, int replica, int64_t *n) {
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_SLOT_TRAINERS);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, path, replica);
  int rc = sq_get_i64(st, s, "slot trainers", n);
  return rc < 0 ? rc : 0;
}

int store_job_goodput(store *st, int64_t job, int64_t *leased, int64_t *merged) {
  *leased = *merged = 0;
  sqlite3_stmt *s = sq_stmt(st, S_GOODPUT);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job);
  int rc = sq_step(st, s, "goodput");
  if (rc == SQLITE_ROW) {
    *leased = sqlite3_column_int64(s, 0);
    *merged = sqlite3_column_int64(s, 1);
  }
  sqlite3_reset(s);
  return rc < 0 ? rc : 0;
}

int store_delta_norms(store *st, int64_t job, int fragment, int max, double *norms, int *n) {
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_DELTA_NORMS);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment, max);
  int rc;
  while ((rc = sq_step(st, s, "recent delta norms")) == SQLITE_ROW && *n < max)
    norms[(*n)++] = sqlite3_column_double(s, 0);
  sqlite3_reset(s);
  if (rc < 0) {
    *n = 0;
    return rc;
  }
  /* Oldest first, as they were accepted. */
  for (int i = 0; i < *n / 2; i++) {
    double t = norms[i];
    norms[i] = norms[*n - 1 - i];
    norms[*n - 1 - i] = t;
  }
  return 0;
}

int store_get_delta(store *st, int64_t id, store_delta *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_DELTA);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, id);
  int rc = sq_get_row(st, s, "get delta", &DELTA_MAP, out);
  if (rc != 0) return rc < 0 ? rc : 0;
  return dpc_err(DPC_ENOENT, "no delta with id %lld", (long long)id);
}

int store_list_deltas(store *st, int64_t job, int fragment, int64_t round, int state, store_delta **out, int *n) {
  *out = NULL;
  *n = 0;
  if (state > DELTA_DROPPED) return dpc_err(DPC_EINVAL, "unknown delta state %d", state);
  sqlite3_stmt *s = sq_stmt(st, S_LIST_DELTAS);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment, round, state);
  BTXT(s, 5, state >= 0 ? DELTA_STATES[state] : "");
  return sq_collect(st, s, "list deltas", &DELTA_MAP, (void **)out, n);
}

int store_list_pending_deltas(store *st, int64_t job, int fragment, store_delta **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_PENDING_DELTAS);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment);
  return sq_collect(st, s, "list pending deltas", &DELTA_MAP, (void **)out, n);
}
