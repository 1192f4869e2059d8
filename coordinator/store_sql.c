/* store_sql.c — the bottom of the store: the cached prepared statements, stepping them with
 * the test fault hook, transactions, SQLite error mapping, and the row mapper that turns a
 * result row into a store.h struct (and a struct into insert parameters) from one table per
 * row type (store_internal.h). Every other store file uses these; this file calls no other
 * store file. */
#include "coordinator/store_internal.h"
#include "common/errors.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- statements: the list and its enum are in store_internal.h ---- */

static const char *const STMT_SQL[] = {
#define X_SQL(name, sql) sql,
    STMTS(X_SQL)
#undef X_SQL
};

/* ---- helpers ----------------------------------------------------------------------------- */

int sq_map_rc(int rc) {
  switch (rc & 0xff) {
  case SQLITE_CONSTRAINT: return (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY) ? DPC_EEXIST : DPC_EINVAL;
  case SQLITE_BUSY:
  case SQLITE_LOCKED: return DPC_EUNAVAILABLE;
  case SQLITE_NOMEM: return DPC_ENOMEM;
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB: return DPC_EFORMAT;
  case SQLITE_CANTOPEN:
  case SQLITE_PERM:
  case SQLITE_READONLY: return DPC_EPERM;
  case SQLITE_FULL:
  case SQLITE_IOERR: return DPC_EIO;
  default: return DPC_EINTERNAL;
  }
}

int sq_db_err(store *st, int rc, const char *what) {
  return dpc_err(sq_map_rc(rc), "%s: %s: %s (sqlite %d)", st->path, what, sqlite3_errmsg(st->db), rc);
}

sqlite3_stmt *sq_stmt(store *st, int id) {
  sqlite3_stmt *s = st->stmts[id];
  if (!s) {
    int rc = sqlite3_prepare_v3(st->db, STMT_SQL[id], -1, SQLITE_PREPARE_PERSISTENT, &s, NULL);
    if (rc != SQLITE_OK) {
      sq_db_err(st, rc, "prepare");
      return NULL;
    }
    st->stmts[id] = s;
  } else {
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
  }
  return s;
}

int sq_step(store *st, sqlite3_stmt *s, const char *what) {
  if (st->fail_step > 0 && --st->fail_step == 0) {
    sqlite3_reset(s);
    return dpc_err(DPC_EIO, "%s: %s: injected failure", st->path, what);
  }
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW || rc == SQLITE_DONE) return rc;
  int err = sq_db_err(st, sqlite3_extended_errcode(st->db), what);
  sqlite3_reset(s);
  return err;
}

int sq_exec_done(store *st, sqlite3_stmt *s, const char *what) {
  int rc = sq_step(st, s, what);
  sqlite3_reset(s);
  return rc < 0 ? rc : 0;
}

int sq_begin(store *st) {
  sqlite3_stmt *s = sq_stmt(st, S_BEGIN);
  return s ? sq_exec_done(st, s, "begin transaction") : DPC_EINTERNAL;
}

int sq_commit(store *st) {
  sqlite3_stmt *s = sq_stmt(st, S_COMMIT);
  return s ? sq_exec_done(st, s, "commit") : DPC_EINTERNAL;
}

int sq_rollback(store *st, int rc) {
  if (sqlite3_get_autocommit(st->db)) return rc;
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", dpc_errmsg());
  sqlite3_stmt *s = sq_stmt(st, S_ROLLBACK);
  if (s) {
    sqlite3_step(s);
    sqlite3_reset(s);
  }
  if (!sqlite3_get_autocommit(st->db)) sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
  dpc_err(rc, "%s", keep);
  return rc;
}

const char *sq_col_text(sqlite3_stmt *s, int i) {
  const unsigned char *t = sqlite3_column_text(s, i);
  return t ? (const char *)t : "";
}

int sq_grow(void **arr, int *cap, int n, size_t elem) {
  if (n < *cap) return 0;
  int nc = *cap ? *cap * 2 : 16;
  void *p = realloc(*arr, (size_t)nc * elem);
  if (!p) return dpc_err(DPC_ENOMEM, "store: out of memory");
  *arr = p;
  *cap = nc;
  return 0;
}

void sq_bind_i64s(sqlite3_stmt *s, const int64_t *v, int n) {
  for (int i = 0; i < n; i++) B64(s, i + 1, v[i]);
}

int sq_get_i64(store *st, sqlite3_stmt *s, const char *what, int64_t *out) {
  int rc = sq_step(st, s, what);
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) *out = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  return rc == SQLITE_ROW;
}

/* ---- enum names -------------------------------------------------------------------------- */

const char *const JOB_STATES[JOB_FAILED + 1] = {"created", "running", "paused", "finished", "canceled", "failed"};
const char *const WORKER_STATES[WORKER_GONE + 1] = {"active", "draining", "gone"};
const char *const SLOT_STATES[SLOT_DONE + 1] = {"idle", "leased", "done"};
const char *const LEASE_STATES[LEASE_EXPIRED + 1] = {"active", "finished", "released", "expired"};
const char *const ROUND_STATES[ROUND_CLOSED + 1] = {"open", "closed"};
const char *const DELTA_STATES[DELTA_DROPPED + 1] = {"received", "applied", "dropped"};

int sq_name_index(const char *const *names, int n, const char *s) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], s) == 0) return i;
  return 0;
}

/* The name table of a COL_*_STATE kind. */
static const char *const *state_names(col_kind k, int *n) {
#define STATE_CASE(kind, tbl)                 \
  case kind:                                  \
    *n = (int)(sizeof tbl / sizeof tbl[0]);   \
    return tbl;
  switch (k) {
    STATE_CASE(COL_JOB_STATE, JOB_STATES)
    STATE_CASE(COL_WORKER_STATE, WORKER_STATES)
    STATE_CASE(COL_SLOT_STATE, SLOT_STATES)
    STATE_CASE(COL_LEASE_STATE, LEASE_STATES)
    STATE_CASE(COL_ROUND_STATE, ROUND_STATES)
    STATE_CASE(COL_DELTA_STATE, DELTA_STATES)
  default: *n = 0; return NULL;
  }
#undef STATE_CASE
}

/* ---- the row maps: one per *_COLUMNS list of store_internal.h ------------------------------ */

/* ROW_TYPE names the struct of the map being defined; it is expanded where MAP_DEFINE is used. */
#define MAP_COL(field, kind, sql) {COL_##kind, offsetof(ROW_TYPE, field), sizeof(((ROW_TYPE *)0)->field)},
#define MAP_DEFINE(name, LIST)                                                       \
  static const row_col name##_cols[] = {LIST(MAP_COL)};                              \
  const row_map name = {name##_cols, (int)(sizeof name##_cols / sizeof name##_cols[0]), sizeof(ROW_TYPE)}

#define ROW_TYPE store_job
MAP_DEFINE(JOB_MAP, JOB_COLUMNS);
#undef ROW_TYPE
#define ROW_TYPE store_fragment
MAP_DEFINE(FRAG_MAP, FRAG_COLUMNS);
#undef ROW_TYPE
#define ROW_TYPE store_worker
MAP_DEFINE(WORKER_MAP, WORKER_COLUMNS);
#undef ROW_TYPE
#define ROW_TYPE store_slot
MAP_DEFINE(SLOT_MAP, SLOT_COLUMNS);
#undef ROW_TYPE
#define ROW_TYPE store_lease
MAP_DEFINE(LEASE_MAP, LEASE_COLUMNS);
#undef ROW_TYPE
#define ROW_TYPE store_delta
MAP_DEFINE(DELTA_MAP, DELTA_COLUMNS);
#undef ROW_TYPE
#define ROW_TYPE store_delta_ref
MAP_DEFINE(DELTA_REF_MAP, DELTA_REF_COLUMNS);
#undef ROW_TYPE
#define ROW_TYPE store_round
MAP_DEFINE(ROUND_MAP, ROUND_COLUMNS);
#undef ROW_TYPE
#define ROW_TYPE store_metric
MAP_DEFINE(METRIC_MAP, METRIC_COLUMNS);
#undef ROW_TYPE

/* Enums are int-sized here (C leaves it to the compiler), which the state and INT kinds rely on
 * when they store an int into the field. */
_Static_assert(sizeof(store_job_state) == sizeof(int) && sizeof(jobspec_algorithm) == sizeof(int) &&
                   sizeof(store_worker_state) == sizeof(int) && sizeof(store_slot_state) == sizeof(int) &&
                   sizeof(store_lease_state) == sizeof(int) && sizeof(store_round_state) == sizeof(int) &&
                   sizeof(store_delta_state) == sizeof(int),
               "the row mapper stores enums as int");

/* ---- the row mapper ------------------------------------------------------------------------- */

/* Store v as a T at p (fields are reached by offset, so through memcpy). */
#define PUT(p, T, v)             \
  do {                           \
    T _v = (T)(v);               \
    memcpy((p), &_v, sizeof _v); \
  } while (0)

int row_read(sqlite3_stmt *s, const row_map *m, void *out) {
  assert(sqlite3_column_count(s) == m->n);
  memset(out, 0, m->size);
  for (int i = 0; i < m->n; i++) {
    const row_col *c = &m->cols[i];
    char *p = (char *)out + c->off;
    switch (c->kind) {
    case COL_I64: PUT(p, int64_t, sqlite3_column_int64(s, i)); break;
    case COL_INT: PUT(p, int, sqlite3_column_int(s, i)); break;
    case COL_U32: PUT(p, uint32_t, sqlite3_column_int64(s, i)); break;
    case COL_SIZE: PUT(p, size_t, sqlite3_column_int64(s, i)); break;
    case COL_DBL: PUT(p, double, sqlite3_column_double(s, i)); break;
    case COL_DBL_NAN:
      PUT(p, double, sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i));
      break;
    case COL_TEXT: snprintf(p, c->size, "%s", sq_col_text(s, i)); break;
    case COL_DUP:
    case COL_DUP_NULL: {
      char *dup = NULL;
      if (c->kind == COL_DUP || sqlite3_column_type(s, i) != SQLITE_NULL) {
        if (!(dup = strdup(sq_col_text(s, i)))) {
          row_clear(m, out);
          return dpc_err(DPC_ENOMEM, "store: out of memory");
        }
      }
      memcpy(p, &dup, sizeof dup);
      break;
    }
    case COL_HASH: {
      const void *h = sqlite3_column_blob(s, i);
      if (h && (size_t)sqlite3_column_bytes(s, i) == c->size) memcpy(p, h, c->size);
      break;
    }
    default: {
      int n;
      const char *const *names = state_names(c->kind, &n);
      PUT(p, int, sq_name_index(names, n, sq_col_text(s, i)));
      break;
    }
    }
  }
  return 0;
}

void row_bind(sqlite3_stmt *s, const row_map *m, const void *row) {
  assert(sqlite3_bind_parameter_count(s) == m->n);
  for (int i = 0; i < m->n; i++) {
    const row_col *c = &m->cols[i];
    const char *p = (const char *)row + c->off;
    int k = i + 1;
    switch (c->kind) {
    case COL_I64: {
      int64_t v;
      memcpy(&v, p, sizeof v);
      B64(s, k, v);
      break;
    }
    case COL_INT: {
      int v;
      memcpy(&v, p, sizeof v);
      B64(s, k, v);
      break;
    }
    case COL_U32: {
      uint32_t v;
      memcpy(&v, p, sizeof v);
      B64(s, k, v);
      break;
    }
    case COL_SIZE: {
      size_t v;
      memcpy(&v, p, sizeof v);
      B64(s, k, v);
      break;
    }
    case COL_DBL:
    case COL_DBL_NAN: {
      double v;
      memcpy(&v, p, sizeof v);
      if (isfinite(v)) BDBL(s, k, v);
      else if (c->kind == COL_DBL) BDBL(s, k, 0.0);
      else sqlite3_bind_null(s, k);
      break;
    }
    case COL_TEXT: BTXT(s, k, p); break;
    case COL_DUP:
    case COL_DUP_NULL: {
      const char *v;
      memcpy(&v, p, sizeof v);
      BTXT(s, k, v);
      break;
    }
    case COL_HASH: sqlite3_bind_blob(s, k, p, (int)c->size, SQLITE_STATIC); break;
    default: {
      int v, n;
      memcpy(&v, p, sizeof v);
      const char *const *names = state_names(c->kind, &n);
      BTXT(s, k, (unsigned)v < (unsigned)n ? names[v] : NULL);
      break;
    }
    }
  }
}

void row_clear(const row_map *m, void *row) {
  for (int i = 0; i < m->n; i++) {
    const row_col *c = &m->cols[i];
    if (c->kind != COL_DUP && c->kind != COL_DUP_NULL) continue;
    char *p = (char *)row + c->off, *v;
    memcpy(&v, p, sizeof v);
    free(v);
    v = NULL;
    memcpy(p, &v, sizeof v);
  }
}

int sq_get_row(store *st, sqlite3_stmt *s, const char *what, const row_map *m, void *out) {
  int rc = sq_step(st, s, what);
  if (rc < 0) return rc;
  int found = rc == SQLITE_ROW;
  if (found) rc = row_read(s, m, out);
  sqlite3_reset(s);
  return rc < 0 ? rc : found;
}

int sq_collect(store *st, sqlite3_stmt *s, const char *what, const row_map *m, void **out, int *n) {
  char *arr = NULL;
  int cap = 0, cnt = 0, rc;
  *out = NULL;
  *n = 0;
  while ((rc = sq_step(st, s, what)) == SQLITE_ROW) {
    if ((rc = sq_grow((void **)&arr, &cap, cnt, m->size)) < 0) break;
    if ((rc = row_read(s, m, arr + (size_t)cnt * m->size)) < 0) break;
    cnt++;
  }
  sqlite3_reset(s);
  if (rc < 0) {
    for (int i = 0; i < cnt; i++) row_clear(m, arr + (size_t)i * m->size);
    free(arr);
    return rc;
  }
  *out = arr;
  *n = cnt;
  return 0;
}
