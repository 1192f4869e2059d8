/* store_history.c — the store's history: garbage collection of old versions and applied
 * deltas, the blob names rows reference, per-round metrics, and the asynchronous ledger
 * (pending deltas in arrival order, applied deltas in version order). Same contract as
 * store.h: one thread per handle, one transaction per multi-row change. */
#include "coordinator/store.h"
#include "coordinator/store_internal.h"
#include "common/errors.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

/* ---- garbage collection ------------------------------------------------------------------- */

void store_names_free(char **names, int n) {
  if (!names) return;
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
}

static int push_name(char ***arr, int *cap, int *cnt, const char *name) {
  if (!name || !name[0]) return 0;
  TRY(sq_grow((void **)arr, cap, *cnt, sizeof **arr));
  (*arr)[*cnt] = strdup(name);
  if (!(*arr)[*cnt]) return dpc_err(DPC_ENOMEM, "store: out of memory");
  (*cnt)++;
  return 0;
}

int store_gc_versions(store *st, int64_t job, int fragment, int keep_last, int keep_every, char ***names, int *n) {
  *names = NULL;
  *n = 0;
  if (keep_last < 1) return dpc_err(DPC_EINVAL, "store_gc_versions: keep_last %d (need >= 1)", keep_last);
  store_fragment f;
  TRY(sq_begin(st));
  TX(store_get_fragment(st, job, fragment, &f));
  int64_t upto = f.version - keep_last; /* versions <= upto may go */
  char **arr = NULL;
  int cap = 0, cnt = 0, rc = 0;
  int64_t *vers = NULL;
  int vcap = 0, nv = 0;
  if (upto >= 0) {
    sqlite3_stmt *s = sq_stmt(st, S_GC_VERSIONS_SEL);
    if (!s) rc = DPC_EINTERNAL;
    else {
      BIND_I64S(s, job, fragment, upto, keep_every);
      while ((rc = sq_step(st, s, "select old versions")) == SQLITE_ROW) {
        if ((rc = sq_grow((void **)&vers, &vcap, nv, sizeof *vers)) < 0) break;
        vers[nv++] = sqlite3_column_int64(s, 0);
        for (int k = 1; k <= 3 && rc >= 0; k++) rc = push_name(&arr, &cap, &cnt, sq_col_text(s, k));
        if (rc < 0) break;
      }
      sqlite3_reset(s);
    }
    for (int i = 0; rc >= 0 && i < nv; i++) {
      sqlite3_stmt *d = sq_stmt(st, S_GC_VERSION_DEL);
      if (!d) {
        rc = DPC_EINTERNAL;
        break;
      }
      BIND_I64S(d, job, fragment, vers[i]);
      rc = sq_exec_done(st, d, "delete old version");
    }
  }
  free(vers);
  if (rc >= 0) rc = sq_commit(st);
  if (rc < 0) {
    store_names_free(arr, cnt);
    return sq_rollback(st, rc);
  }
  *names = arr;
  *n = cnt;
  return 0;
}

int store_gc_deltas(store *st, int64_t job, int fragment, int64_t before_round, char ***names, int *n) {
  *names = NULL;
  *n = 0;
  TRY(sq_begin(st));
  char **arr = NULL;
  int cap = 0, cnt = 0, rc;
  int64_t *ids = NULL;
  int icap = 0, ni = 0;
  sqlite3_stmt *s = sq_stmt(st, S_GC_DELTAS_SEL);
  if (!s) return sq_rollback(st, DPC_EINTERNAL);
  BIND_I64S(s, job, fragment, before_round);
  while ((rc = sq_step(st, s, "select old deltas")) == SQLITE_ROW) {
    if ((rc = sq_grow((void **)&ids, &icap, ni, sizeof *ids)) < 0) break;
    ids[ni++] = sqlite3_column_int64(s, 0);
    if ((rc = push_name(&arr, &cap, &cnt, sq_col_text(s, 1))) < 0) break;
    const char *enc = sq_col_text(s, 2); /* a quantized delta's stream as sent goes with it */
    if (enc && enc[0] && (rc = push_name(&arr, &cap, &cnt, enc)) < 0) break;
  }
  sqlite3_reset(s);
  for (int i = 0; rc >= 0 && i < ni; i++) {
    sqlite3_stmt *d = sq_stmt(st, S_GC_DELTA_DEL);
    if (!d) {
      rc = DPC_EINTERNAL;
      break;
    }
    B64(d, 1, ids[i]);
    rc = sq_exec_done(st, d, "forget an old delta's blob");
  }
  free(ids);
  if (rc >= 0) rc = sq_commit(st);
  if (rc < 0) {
    store_names_free(arr, cnt);
    return sq_rollback(st, rc);
  }
  *names = arr;
  *n = cnt;
  return 0;
}

int store_blob_names(store *st, char ***names, int *n) {
  *names = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_BLOB_NAMES);
  if (!s) return DPC_EINTERNAL;
  char **arr = NULL;
  int cap = 0, cnt = 0, rc;
  while ((rc = sq_step(st, s, "list blob names")) == SQLITE_ROW)
    if ((rc = push_name(&arr, &cap, &cnt, sq_col_text(s, 0))) < 0) break;
  sqlite3_reset(s);
  if (rc < 0) {
    store_names_free(arr, cnt);
    return rc;
  }
  *names = arr;
  *n = cnt;
  return 0;
}

/* ---- metrics ------------------------------------------------------------------------------ */

int store_add_metric(store *st, const store_metric *m) {
  sqlite3_stmt *s = sq_stmt(st, S_INS_METRIC);
  if (!s) return DPC_EINTERNAL;
  row_bind(s, &METRIC_MAP, m); /* a NaN loss is stored as NULL, a non-finite time as 0 */
  return sq_exec_done(st, s, "insert metric");
}

int store_list_metrics(store *st, int64_t job, int64_t since_round, store_metric **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LIST_METRICS);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, since_round);
  return sq_collect(st, s, "list metrics", &METRIC_MAP, (void **)out, n);
}

int store_job_traffic(store *st, int64_t job, int64_t *bytes_in, int64_t *bytes_out) {
  *bytes_in = *bytes_out = 0;
  sqlite3_stmt *s = sq_stmt(st, S_JOB_TRAFFIC);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job);
  int rc = sq_step(st, s, "job traffic");
  if (rc == SQLITE_ROW) {
    *bytes_in = sqlite3_column_int64(s, 0);
    *bytes_out = sqlite3_column_int64(s, 1);
  }
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0 : dpc_err(DPC_EIO, "job traffic: no row");
}

/* ---- async ledger (additive: asynchronous Local-SGD) ---------------------------------------- */

int store_next_pending_delta(store *st, int64_t job, int fragment, store_delta *out) {
  sqlite3_stmt *s = sq_stmt(st, S_NEXT_PENDING);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment);
  return sq_get_row(st, s, "next pending delta", &DELTA_MAP, out);
}

int store_drop_delta(store *st, int64_t id) {
  sqlite3_stmt *s = sq_stmt(st, S_DROP_DELTA);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, id);
  TRY(sq_exec_done(st, s, "drop delta"));
  if (sqlite3_changes(st->db) != 1) return dpc_err(DPC_ESTATE, "delta %lld is not a received delta", (long long)id);
  return 0;
}

int store_list_ledger(store *st, int64_t job, int fragment, store_delta **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LEDGER);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment);
  return sq_collect(st, s, "list ledger", &DELTA_MAP, (void **)out, n);
}
