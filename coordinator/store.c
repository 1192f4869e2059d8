/* store.c — SQLite-backed durable state of the coordinator: schema and migrations, cached
 * prepared statements, and one transaction per multi-row change (see store.h). */
#include "coordinator/store.h"
#include "coordinator/store_internal.h"
#include "common/errors.h"
#include "common/log.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- schema ------------------------------------------------------------------------------ */

/* MIGRATIONS[i] takes the schema from user_version i to i + 1. Append only; never edit a
 * released migration. */
static const char *const MIGRATIONS[] = {
    /* 0 -> 1: the initial schema. */
    "CREATE TABLE migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL);"
    "CREATE TABLE jobs ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  name TEXT NOT NULL UNIQUE,"
    "  spec_json TEXT NOT NULL,"
    "  algorithm INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('created','running','paused','finished','canceled','failed')),"
    "  error TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL);"
    "CREATE TABLE modules ("
    "  job INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  module INTEGER NOT NULL, level INTEGER NOT NULL, idx INTEGER NOT NULL,"
    "  offset INTEGER NOT NULL CHECK (offset >= 0), len INTEGER NOT NULL CHECK (len > 0),"
    "  PRIMARY KEY (job, module));"
    "CREATE TABLE fragments ("
    "  job INTEGER NOT NULL, fragment INTEGER NOT NULL, module INTEGER NOT NULL,"
    "  offset INTEGER NOT NULL CHECK (offset >= 0), len INTEGER NOT NULL CHECK (len > 0),"
    "  version INTEGER NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (job, fragment),"
    "  FOREIGN KEY (job, module) REFERENCES modules(job, module) ON DELETE CASCADE);"
    "CREATE TABLE fragment_versions ("
    "  job INTEGER NOT NULL, fragment INTEGER NOT NULL, version INTEGER NOT NULL,"
    "  round INTEGER NOT NULL,"
    "  param_blob TEXT NOT NULL, param_crc INTEGER NOT NULL,"
    "  momentum_blob TEXT, momentum_crc INTEGER NOT NULL DEFAULT 0,"
    "  dnbuf_blob TEXT, dnbuf_crc INTEGER NOT NULL DEFAULT 0, dn_t INTEGER NOT NULL DEFAULT 0,"
    "  keep INTEGER NOT NULL DEFAULT 0,"
    "  created_at INTEGER NOT NULL,"
    "  PRIMARY KEY (job, fragment, version),"
    "  FOREIGN KEY (job, fragment) REFERENCES fragments(job, fragment) ON DELETE CASCADE);"
    "CREATE TABLE paths ("
    "  job INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE, path INTEGER NOT NULL,"
    "  PRIMARY KEY (job, path));"
    "CREATE TABLE path_modules ("
    "  job INTEGER NOT NULL, path INTEGER NOT NULL, level INTEGER NOT NULL, module INTEGER NOT NULL,"
    "  PRIMARY KEY (job, path, level),"
    "  FOREIGN KEY (job, path) REFERENCES paths(job, path) ON DELETE CASCADE,"
    "  FOREIGN KEY (job, module) REFERENCES modules(job, module) ON DELETE CASCADE);"
    "CREATE INDEX path_modules_by_module ON path_modules(job, module);"
    "CREATE TABLE workers ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, token_hash BLOB NOT NULL, info TEXT,"
    "  state TEXT NOT NULL CHECK (state IN ('active','draining','gone')),"
    "  registered_at INTEGER NOT NULL, last_seen INTEGER NOT NULL, steps_per_s REAL NOT NULL DEFAULT 0);"
    "CREATE TABLE slots ("
    "  job INTEGER NOT NULL, path INTEGER NOT NULL, replica INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('idle','leased','done')),"
    "  round INTEGER NOT NULL DEFAULT 0, inner_steps INTEGER NOT NULL DEFAULT 0,"
    "  last_worker INTEGER REFERENCES workers(id),"
    "  PRIMARY KEY (job, path, replica),"
    "  FOREIGN KEY (job, path) REFERENCES paths(job, path) ON DELETE CASCADE);"
    "CREATE TABLE leases ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, job INTEGER NOT NULL, path INTEGER NOT NULL, replica INTEGER NOT NULL,"
    "  worker INTEGER NOT NULL REFERENCES workers(id),"
    "  round INTEGER NOT NULL, inner_steps INTEGER NOT NULL CHECK (inner_steps > 0), step_begin INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('active','finished','released','expired')),"
    "  created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, ended_at INTEGER NOT NULL DEFAULT 0,"
    "  FOREIGN KEY (job, path, replica) REFERENCES slots(job, path, replica) ON DELETE CASCADE);"
    "CREATE INDEX leases_by_expiry ON leases(state, expires_at);"
    "CREATE UNIQUE INDEX leases_one_active_per_slot ON leases(job, path, replica) WHERE state = 'active';"
    "CREATE TABLE lease_fragments ("
    "  lease INTEGER NOT NULL REFERENCES leases(id) ON DELETE CASCADE, fragment INTEGER NOT NULL,"
    "  base_version INTEGER NOT NULL, PRIMARY KEY (lease, fragment));"
    "CREATE TABLE rounds ("
    "  job INTEGER NOT NULL, fragment INTEGER NOT NULL, round INTEGER NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('open','closed')),"
    "  opened_at INTEGER NOT NULL, deadline_at INTEGER NOT NULL DEFAULT 0, closed_at INTEGER NOT NULL DEFAULT 0,"
    "  n_deltas INTEGER NOT NULL DEFAULT 0, version INTEGER NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (job, fragment, round),"
    "  FOREIGN KEY (job, fragment) REFERENCES fragments(job, fragment) ON DELETE CASCADE);"
    "CREATE TABLE deltas ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, job INTEGER NOT NULL, round INTEGER NOT NULL,"
    "  fragment INTEGER NOT NULL, path INTEGER NOT NULL, replica INTEGER NOT NULL,"
    "  lease INTEGER NOT NULL REFERENCES leases(id) ON DELETE CASCADE,"
    "  base_version INTEGER NOT NULL, checksum INTEGER NOT NULL, blob TEXT NOT NULL,"
    "  weight REAL NOT NULL CHECK (weight >= 0), tokens INTEGER NOT NULL DEFAULT 0,"
    "  state TEXT NOT NULL CHECK (state IN ('received','applied','dropped')),"
    "  received_at INTEGER NOT NULL, applied_version INTEGER NOT NULL DEFAULT 0,"
    "  UNIQUE (lease, fragment),"
    "  FOREIGN KEY (job, fragment) REFERENCES fragments(job, fragment) ON DELETE CASCADE);"
    "CREATE INDEX deltas_by_round ON deltas(job, fragment, round, path, replica);"
    "CREATE TABLE metrics ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, job INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    "  round INTEGER NOT NULL, path INTEGER NOT NULL DEFAULT -1, replica INTEGER NOT NULL DEFAULT -1,"
    "  worker INTEGER NOT NULL DEFAULT 0, loss REAL, tokens INTEGER NOT NULL DEFAULT 0,"
    "  bytes_in INTEGER NOT NULL DEFAULT 0, bytes_out INTEGER NOT NULL DEFAULT 0,"
    "  outer_seconds REAL NOT NULL DEFAULT 0, created_at INTEGER NOT NULL);"
    "CREATE INDEX metrics_by_job ON metrics(job, round);",
    /* 1 -> 2: the L2 norm of each received delta (the delta norm screen's reference survives a
     * restart; NULL for deltas recorded before). */
    "ALTER TABLE deltas ADD COLUMN norm REAL;",
};
#define N_MIGRATIONS ((int)(sizeof MIGRATIONS / sizeof MIGRATIONS[0]))
_Static_assert(N_MIGRATIONS == STORE_SCHEMA_VERSION, "STORE_SCHEMA_VERSION must equal the number of migrations");

/* ---- statements: the list and its enum are in store_internal.h ---- */

static const char *const STMT_SQL[] = {
#define X_SQL(name, sql) sql,
    STMTS(X_SQL)
#undef X_SQL
};


/* ---- helpers ----------------------------------------------------------------------------- */

static int map_sqlite(int rc) {
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

static int db_err(store *st, int rc, const char *what) {
  return dpc_err(map_sqlite(rc), "%s: %s: %s (sqlite %d)", st->path, what, sqlite3_errmsg(st->db), rc);
}

/* The cached statement `id`, reset and unbound; NULL (detail recorded) on failure. */
sqlite3_stmt *sq_stmt(store *st, int id) {
  sqlite3_stmt *s = st->stmts[id];
  if (!s) {
    int rc = sqlite3_prepare_v3(st->db, STMT_SQL[id], -1, SQLITE_PREPARE_PERSISTENT, &s, NULL);
    if (rc != SQLITE_OK) {
      db_err(st, rc, "prepare");
      return NULL;
    }
    st->stmts[id] = s;
  } else {
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
  }
  return s;
}

/* sqlite3_step with the fault hook. Returns SQLITE_ROW, SQLITE_DONE or a negative DPC code. */
int sq_step(store *st, sqlite3_stmt *s, const char *what) {
  if (st->fail_step > 0 && --st->fail_step == 0) {
    sqlite3_reset(s);
    return dpc_err(DPC_EIO, "%s: %s: injected failure", st->path, what);
  }
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW || rc == SQLITE_DONE) return rc;
  int err = db_err(st, sqlite3_extended_errcode(st->db), what);
  sqlite3_reset(s);
  return err;
}

/* Run a statement that returns no rows; 0 or a negative code. */
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

/* Roll back, keeping the caller's error detail. */
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

void sq_copy_text(char *dst, size_t cap, sqlite3_stmt *s, int i) { snprintf(dst, cap, "%s", sq_col_text(s, i)); }

char *sq_dup_text_or_null(sqlite3_stmt *s, int i) {
  if (sqlite3_column_type(s, i) == SQLITE_NULL) return NULL;
  return strdup(sq_col_text(s, i));
}

/* Grow-by-doubling array append used by the list functions. */
int sq_grow(void **arr, int *cap, int n, size_t elem) {
  if (n < *cap) return 0;
  int nc = *cap ? *cap * 2 : 16;
  void *p = realloc(*arr, (size_t)nc * elem);
  if (!p) return dpc_err(DPC_ENOMEM, "store: out of memory");
  *arr = p;
  *cap = nc;
  return 0;
}

int sq_collect(store *st, sqlite3_stmt *s, const char *what, size_t elem, void (*read)(sqlite3_stmt *, void *),
               void **out, int *n) {
  char *arr = NULL;
  int cap = 0, cnt = 0, rc;
  *out = NULL;
  *n = 0;
  while ((rc = sq_step(st, s, what)) == SQLITE_ROW) {
    if ((rc = sq_grow((void **)&arr, &cap, cnt, elem)) < 0) break;
    read(s, arr + (size_t)cnt++ * elem);
  }
  sqlite3_reset(s);
  if (rc < 0) {
    free(arr);
    return rc;
  }
  *out = arr;
  *n = cnt;
  return 0;
}

/* ---- enum names -------------------------------------------------------------------------- */

static const char *const JOB_STATES[] = {"created", "running", "paused", "finished", "canceled", "failed"};
static const char *const WORKER_STATES[] = {"active", "draining", "gone"};
static const char *const SLOT_STATES[] = {"idle", "leased", "done"};
static const char *const LEASE_STATES[] = {"active", "finished", "released", "expired"};
static const char *const ROUND_STATES[] = {"open", "closed"};
static const char *const DELTA_STATES[] = {"received", "applied", "dropped"};

static int name_index(const char *const *names, int n, const char *s) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], s) == 0) return i;
  return 0;
}
#define NIDX(tbl, s) name_index((tbl), (int)(sizeof(tbl) / sizeof((tbl)[0])), (s))

const char *store_job_state_name(store_job_state s) { return (unsigned)s < 6 ? JOB_STATES[s] : "?"; }

int store_job_state_parse(const char *s, store_job_state *out) {
  for (int i = 0; i < 6; i++)
    if (strcmp(JOB_STATES[i], s) == 0) {
      *out = (store_job_state)i;
      return 0;
    }
  return dpc_err(DPC_EINVAL, "unknown job state \"%s\"", s);
}

/* ---- open / close / migrate -------------------------------------------------------------- */

static int exec_sql(store *st, const char *sql, const char *what) {
  char *msg = NULL;
  int rc = sqlite3_exec(st->db, sql, NULL, NULL, &msg);
  if (rc != SQLITE_OK) {
    int e = dpc_err(map_sqlite(rc), "%s: %s: %s", st->path, what, msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return e;
  }
  return 0;
}

static int get_user_version(store *st, int *v) {
  sqlite3_stmt *s;
  int rc = sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL);
  if (rc != SQLITE_OK) return db_err(st, rc, "read user_version");
  rc = sqlite3_step(s);
  *v = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) : 0;
  sqlite3_finalize(s);
  return rc == SQLITE_ROW ? 0 : db_err(st, rc, "read user_version");
}

static int migrate(store *st) {
  int v;
  TRY(get_user_version(st, &v));
  if (v > N_MIGRATIONS)
    return dpc_err(DPC_EUNSUPPORTED, "%s: schema version %d is newer than this build's %d; upgrade dipaco", st->path, v,
                   N_MIGRATIONS);
  while (v < N_MIGRATIONS) {
    TRY(exec_sql(st, "BEGIN IMMEDIATE", "begin migration"));
    /* Re-read inside the write lock: another process may have migrated meanwhile. */
    int rc = get_user_version(st, &v);
    if (rc == 0 && v < N_MIGRATIONS) {
      rc = exec_sql(st, MIGRATIONS[v], "migration");
      char sql[160];
      if (rc == 0) {
        snprintf(sql, sizeof sql, "INSERT INTO migrations (version, applied_at) VALUES (%d, CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))", v + 1);
        rc = exec_sql(st, sql, "record migration");
      }
      if (rc == 0) {
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v + 1);
        rc = exec_sql(st, sql, "set user_version");
      }
    }
    if (rc == 0) rc = exec_sql(st, "COMMIT", "commit migration");
    if (rc) {
      sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
      return rc;
    }
    TRY(get_user_version(st, &v));
  }
  return 0;
}

int store_open(const char *state_dir, store **out) {
  *out = NULL;
  store *st = calloc(1, sizeof *st);
  if (!st) return dpc_err(DPC_ENOMEM, "store: out of memory");
  size_t n = strlen(state_dir) + 16;
  st->path = malloc(n);
  if (!st->path) {
    free(st);
    return dpc_err(DPC_ENOMEM, "store: out of memory");
  }
  snprintf(st->path, n, "%s/dipaco.db", state_dir);
  int rc = sqlite3_open_v2(st->path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           store_fault_vfs());
  if (rc != SQLITE_OK) {
    rc = dpc_err(map_sqlite(rc), "open %s: %s", st->path, st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
    store_close(st);
    return rc;
  }
  sqlite3_extended_result_codes(st->db, 1);
  sqlite3_busy_timeout(st->db, 5000);
  /* WAL: readers never block the writer; synchronous=FULL makes every commit durable, which
   * the "acknowledge only after commit" rule of DESIGN.md §5 relies on. */
  rc = exec_sql(st, "PRAGMA journal_mode = WAL", "enable WAL");
  if (rc == 0) rc = exec_sql(st, "PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON", "set pragmas");
  if (rc == 0) rc = migrate(st);
  if (rc) {
    store_close(st);
    return rc;
  }
  *out = st;
  return 0;
}

void store_close(store *st) {
  if (!st) return;
  if (st->db && store_flush_liveness(st) < 0) DPC_WARN("store: %s", dpc_errmsg());
  live_free(&st->live_workers);
  live_free(&st->live_leases);
  for (int i = 0; i < S_COUNT; i++) sqlite3_finalize(st->stmts[i]);
  if (st->db) sqlite3_close(st->db);
  free(st->path);
  free(st);
}

int store_schema_version(store *st, int *version) { return get_user_version(st, version); }

void store_debug_fail_step(store *st, int n) { st->fail_step = n > 0 ? n : 0; }

/* ---- jobs -------------------------------------------------------------------------------- */

int store_next_job_id(store *st, int64_t *id) {
  sqlite3_stmt *s = sq_stmt(st, S_NEXT_JOB_ID);
  if (!s) return DPC_EINTERNAL;
  int rc = sq_step(st, s, "next job id");
  if (rc < 0) return rc;
  *id = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  return 0;
}

int store_create_job(store *st, const store_new_job *nj) {
  const jobspec *js = nj->spec;
  if (!js || !js->has_shape || !nj->spec_json || nj->id < 1 || nj->n_fragments < 1 || nj->n_modules < 1)
    return dpc_err(DPC_EINVAL, "store_create_job: incomplete job (id %lld)", (long long)nj->id);
  TRY(sq_begin(st));
  {
    STMT(s, S_INS_JOB);
    B64(s, 1, nj->id);
    BTXT(s, 2, js->name);
    BTXT(s, 3, nj->spec_json);
    B64(s, 4, js->algorithm);
    B64(s, 5, nj->now_ms);
    int rc = sq_exec_done(st, s, "insert job");
    if (rc == DPC_EEXIST) rc = dpc_err(DPC_EEXIST, "a job named \"%s\" (or id %lld) already exists", js->name, (long long)nj->id);
    TX(rc);
  }
  for (int i = 0; i < nj->n_modules; i++) {
    const jobspec_module *m = &nj->modules[i];
    STMT(s, S_INS_MODULE);
    B64(s, 1, nj->id);
    B64(s, 2, m->id);
    B64(s, 3, m->level);
    B64(s, 4, m->index);
    B64(s, 5, m->offset);
    B64(s, 6, m->len);
    TX(sq_exec_done(st, s, "insert module"));
  }
  for (int i = 0; i < nj->n_fragments; i++) {
    const jobspec_fragment *f = &nj->fragments[i];
    const store_fragment_init *in = &nj->init[i];
    if (in->fragment != f->id || !in->param_blob)
      return sq_rollback(st, dpc_err(DPC_EINVAL, "store_create_job: init[%d] is for fragment %d, expected %d", i, in->fragment, f->id));
    STMT(s, S_INS_FRAGMENT);
    B64(s, 1, nj->id);
    B64(s, 2, f->id);
    B64(s, 3, f->module);
    B64(s, 4, f->offset);
    B64(s, 5, f->len);
    TX(sq_exec_done(st, s, "insert fragment"));
    STMT(v, S_INS_VERSION);
    B64(v, 1, nj->id);
    B64(v, 2, f->id);
    B64(v, 3, 0);
    B64(v, 4, -1);
    BTXT(v, 5, in->param_blob);
    B64(v, 6, in->param_crc);
    BTXT(v, 7, in->momentum_blob);
    B64(v, 8, in->momentum_blob ? in->momentum_crc : 0);
    BTXT(v, 9, (const char *)NULL);
    B64(v, 10, 0);
    B64(v, 11, 0);
    B64(v, 12, 1); /* the initial version is always kept */
    B64(v, 13, nj->now_ms);
    TX(sq_exec_done(st, v, "insert fragment version 0"));
  }
  const int P = jobspec_n_paths(js);
  for (int p = 0; p < P; p++) {
    STMT(s, S_INS_PATH);
    B64(s, 1, nj->id);
    B64(s, 2, p);
    TX(sq_exec_done(st, s, "insert path"));
    int mods[JOBSPEC_MAX_LEVELS];
    int nl = jobspec_path_modules(js, p, mods);
    if (nl < 0) return sq_rollback(st, nl);
    for (int l = 0; l < nl; l++) {
      STMT(m, S_INS_PATH_MODULE);
      B64(m, 1, nj->id);
      B64(m, 2, p);
      B64(m, 3, l);
      B64(m, 4, mods[l]);
      TX(sq_exec_done(st, m, "insert path module"));
    }
    for (int r = 0; r < js->replicas; r++) {
      STMT(s2, S_INS_SLOT);
      B64(s2, 1, nj->id);
      B64(s2, 2, p);
      B64(s2, 3, r);
      TX(sq_exec_done(st, s2, "insert slot"));
    }
  }
  TX(sq_commit(st));
  return 0;
}

static int read_job(sqlite3_stmt *s, store_job *j) {
  memset(j, 0, sizeof *j);
  j->id = sqlite3_column_int64(s, 0);
  sq_copy_text(j->name, sizeof j->name, s, 1);
  j->algorithm = (jobspec_algorithm)sqlite3_column_int(s, 2);
  j->state = (store_job_state)NIDX(JOB_STATES, sq_col_text(s, 3));
  j->created_at = sqlite3_column_int64(s, 4);
  j->updated_at = sqlite3_column_int64(s, 5);
  j->spec_json = strdup(sq_col_text(s, 6));
  j->error = sq_dup_text_or_null(s, 7);
  if (!j->spec_json || (sqlite3_column_type(s, 7) != SQLITE_NULL && !j->error)) {
    store_job_clear(j);
    return dpc_err(DPC_ENOMEM, "store: out of memory");
  }
  return 0;
}

void store_job_clear(store_job *j) {
  if (!j) return;
  free(j->spec_json);
  free(j->error);
  j->spec_json = j->error = NULL;
}

void store_jobs_free(store_job *jobs, int n) {
  if (!jobs) return;
  for (int i = 0; i < n; i++) store_job_clear(&jobs[i]);
  free(jobs);
}

static int get_job_by(store *st, int id_stmt, int64_t id, const char *name, store_job *out) {
  memset(out, 0, sizeof *out);
  sqlite3_stmt *s = sq_stmt(st, id_stmt);
  if (!s) return DPC_EINTERNAL;
  if (name) BTXT(s, 1, name);
  else B64(s, 1, id);
  int rc = sq_step(st, s, "get job");
  if (rc < 0) return rc;
  if (rc != SQLITE_ROW) {
    sqlite3_reset(s);
    return name ? dpc_err(DPC_ENOENT, "no job named \"%s\"", name) : dpc_err(DPC_ENOENT, "no job with id %lld", (long long)id);
  }
  rc = read_job(s, out);
  sqlite3_reset(s);
  return rc;
}

int store_get_job(store *st, int64_t id, store_job *out) { return get_job_by(st, S_GET_JOB, id, NULL, out); }
int store_find_job(store *st, const char *name, store_job *out) { return get_job_by(st, S_FIND_JOB, 0, name, out); }

int store_list_jobs(store *st, store_job **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LIST_JOBS);
  if (!s) return DPC_EINTERNAL;
  store_job *arr = NULL;
  int cap = 0, cnt = 0, rc;
  while ((rc = sq_step(st, s, "list jobs")) == SQLITE_ROW) {
    if ((rc = sq_grow((void **)&arr, &cap, cnt, sizeof *arr)) < 0) break;
    if ((rc = read_job(s, &arr[cnt])) < 0) break;
    cnt++;
  }
  sqlite3_reset(s);
  if (rc < 0) {
    store_jobs_free(arr, cnt);
    return rc;
  }
  *out = arr;
  *n = cnt;
  return 0;
}

int store_set_job_state(store *st, int64_t id, store_job_state state, const char *error, int64_t now_ms) {
  if ((unsigned)state > JOB_FAILED) return dpc_err(DPC_EINVAL, "unknown job state %d", (int)state);
  TRY(sq_begin(st));
  STMT(s, S_JOB_STATE);
  B64(s, 1, id);
  int rc = sq_step(st, s, "read job state");
  if (rc < 0) return sq_rollback(st, rc);
  if (rc != SQLITE_ROW) {
    sqlite3_reset(s);
    return sq_rollback(st, dpc_err(DPC_ENOENT, "no job with id %lld", (long long)id));
  }
  store_job_state cur = (store_job_state)NIDX(JOB_STATES, sq_col_text(s, 0));
  sqlite3_reset(s);
  if (cur >= JOB_FINISHED && cur != state)
    return sq_rollback(st, dpc_err(DPC_ESTATE, "job %lld is %s; it cannot become %s", (long long)id, JOB_STATES[cur],
                                JOB_STATES[state]));
  STMT(u, S_SET_JOB_STATE);
  B64(u, 1, id);
  BTXT(u, 2, JOB_STATES[state]);
  BTXT(u, 3, error);
  B64(u, 4, now_ms);
  TX(sq_exec_done(st, u, "set job state"));
  TX(sq_commit(st));
  return 0;
}

/* ---- fragments --------------------------------------------------------------------------- */

static void read_fragment(sqlite3_stmt *s, void *out) {
  store_fragment *f = out;
  memset(f, 0, sizeof *f);
  f->job = sqlite3_column_int64(s, 0);
  f->fragment = sqlite3_column_int(s, 1);
  f->module = sqlite3_column_int(s, 2);
  f->offset = (size_t)sqlite3_column_int64(s, 3);
  f->len = (size_t)sqlite3_column_int64(s, 4);
  f->version = sqlite3_column_int64(s, 5);
  f->round = sqlite3_column_int64(s, 6);
  sq_copy_text(f->param_blob, sizeof f->param_blob, s, 7);
  f->param_crc = (uint32_t)sqlite3_column_int64(s, 8);
  sq_copy_text(f->momentum_blob, sizeof f->momentum_blob, s, 9);
  f->momentum_crc = (uint32_t)sqlite3_column_int64(s, 10);
  sq_copy_text(f->dnbuf_blob, sizeof f->dnbuf_blob, s, 11);
  f->dnbuf_crc = (uint32_t)sqlite3_column_int64(s, 12);
  f->dn_t = sqlite3_column_int64(s, 13);
  f->created_at = sqlite3_column_int64(s, 14);
}

int store_get_fragment(store *st, int64_t job, int fragment, store_fragment *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_FRAGMENT);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, fragment);
  int rc = sq_step(st, s, "get fragment");
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) read_fragment(s, out);
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0 : dpc_err(DPC_ENOENT, "job %lld has no fragment %d", (long long)job, fragment);
}

int store_get_version(store *st, int64_t job, int fragment, int64_t version, store_fragment *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_VERSION);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, fragment);
  B64(s, 3, version);
  int rc = sq_step(st, s, "get fragment version");
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) read_fragment(s, out);
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0
                          : dpc_err(DPC_ENOENT, "job %lld fragment %d has no version %lld (never made or collected)",
                                    (long long)job, fragment, (long long)version);
}

int store_list_fragments(store *st, int64_t job, store_fragment **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LIST_FRAGMENTS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  return sq_collect(st, s, "list fragments", sizeof(store_fragment), read_fragment, (void **)out, n);
}

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

static void read_worker(sqlite3_stmt *s, void *out) {
  store_worker *w = out;
  memset(w, 0, sizeof *w);
  w->id = sqlite3_column_int64(s, 0);
  sq_copy_text(w->name, sizeof w->name, s, 1);
  const void *h = sqlite3_column_blob(s, 2);
  if (h && sqlite3_column_bytes(s, 2) == STORE_TOKEN_HASH_BYTES) memcpy(w->token_hash, h, STORE_TOKEN_HASH_BYTES);
  sq_copy_text(w->info, sizeof w->info, s, 3);
  w->state = (store_worker_state)NIDX(WORKER_STATES, sq_col_text(s, 4));
  w->registered_at = sqlite3_column_int64(s, 5);
  w->last_seen = sqlite3_column_int64(s, 6);
  w->steps_per_s = sqlite3_column_double(s, 7);
}

int store_get_worker(store *st, int64_t id, store_worker *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_WORKER);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, id);
  int rc = sq_step(st, s, "get worker");
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) {
    read_worker(s, out);
    live_overlay_worker(st, out);
  }
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0 : dpc_err(DPC_ENOENT, "no worker with id %lld", (long long)id);
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

int store_list_workers(store *st, store_worker **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LIST_WORKERS);
  if (!s) return DPC_EINTERNAL;
  int rc = sq_collect(st, s, "list workers", sizeof(store_worker), read_worker, (void **)out, n);
  for (int i = 0; rc >= 0 && i < *n; i++) live_overlay_worker(st, &(*out)[i]);
  return rc;
}

/* ---- slots and leases ---------------------------------------------------------------------- */

static void read_slot(sqlite3_stmt *s, void *out) {
  store_slot *o = out;
  o->job = sqlite3_column_int64(s, 0);
  o->path = sqlite3_column_int(s, 1);
  o->replica = sqlite3_column_int(s, 2);
  o->state = (store_slot_state)NIDX(SLOT_STATES, sq_col_text(s, 3));
  o->round = sqlite3_column_int64(s, 4);
  o->inner_steps = sqlite3_column_int64(s, 5);
  o->last_worker = sqlite3_column_int64(s, 6);
}

int store_get_slot(store *st, int64_t job, int path, int replica, store_slot *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_SLOT);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, path);
  B64(s, 3, replica);
  int rc = sq_step(st, s, "get slot");
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) read_slot(s, out);
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0
                          : dpc_err(DPC_ENOENT, "job %lld has no slot (path %d, replica %d)", (long long)job, path, replica);
}

int store_list_slots(store *st, int64_t job, store_slot **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LIST_SLOTS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  return sq_collect(st, s, "list slots", sizeof(store_slot), read_slot, (void **)out, n);
}

int store_list_idle_slots(store *st, int64_t job, int64_t lo, int64_t hi, store_slot **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_IDLE_SLOTS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, lo);
  B64(s, 3, hi);
  return sq_collect(st, s, "list idle slots", sizeof(store_slot), read_slot, (void **)out, n);
}

int store_any_slot_below(store *st, int64_t job, int64_t round) {
  sqlite3_stmt *s = sq_stmt(st, S_ANY_SLOT_BELOW);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, round);
  int rc = sq_step(st, s, "any slot below");
  if (rc < 0) return rc;
  int yes = rc == SQLITE_ROW && sqlite3_column_int(s, 0) != 0;
  sqlite3_reset(s);
  return yes;
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
  B64(s, 1, job);
  B64(s, 2, path);
  B64(s, 3, replica);
  BTXT(s, 4, SLOT_STATES[state]);
  TX(sq_exec_done(st, s, "set slot state"));
  TX(sq_commit(st));
  return 0;
}

int store_advance_slot(store *st, int64_t job, int path, int replica, int64_t round, int64_t inner_steps) {
  if (round < 0 || inner_steps < 0) return dpc_err(DPC_EINVAL, "store_advance_slot: negative round or inner steps");
  sqlite3_stmt *s = sq_stmt(st, S_ADVANCE_SLOT);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, path);
  B64(s, 3, replica);
  B64(s, 4, round);
  B64(s, 5, inner_steps);
  TRY(sq_exec_done(st, s, "advance slot"));
  if (sqlite3_changes(st->db) != 1)
    return dpc_err(DPC_ESTATE, "slot (job %lld, path %d, replica %d) is not idle below round %lld", (long long)job, path,
                   replica, (long long)round);
  return 0;
}

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
    B64(s, 1, nl->job);
    B64(s, 2, nl->path);
    B64(s, 3, nl->replica);
    B64(s, 4, nl->worker);
    TX(sq_exec_done(st, s, "lease slot"));
    if (sqlite3_changes(st->db) != 1)
      return sq_rollback(st, dpc_err(DPC_ESTATE, "slot (job %lld, path %d, replica %d) is %s, not idle", (long long)nl->job,
                                  nl->path, nl->replica, SLOT_STATES[slot.state]));
  }
  STMT(s, S_INS_LEASE);
  B64(s, 1, nl->job);
  B64(s, 2, nl->path);
  B64(s, 3, nl->replica);
  B64(s, 4, nl->worker);
  B64(s, 5, nl->round);
  B64(s, 6, nl->inner_steps);
  B64(s, 7, nl->step_begin);
  B64(s, 8, nl->now_ms);
  B64(s, 9, nl->expires_at);
  TX(sq_exec_done(st, s, "insert lease"));
  int64_t id = sqlite3_last_insert_rowid(st->db);
  for (int i = 0; i < nl->n_fragments; i++) {
    STMT(f, S_INS_LEASE_FRAG);
    B64(f, 1, id);
    B64(f, 2, nl->fragments[i]);
    B64(f, 3, nl->base_versions[i]);
    TX(sq_exec_done(st, f, "insert lease fragment"));
  }
  TX(sq_commit(st));
  *lease_id = id;
  return 0;
}

static void read_lease(sqlite3_stmt *s, void *out) {
  store_lease *l = out;
  l->id = sqlite3_column_int64(s, 0);
  l->job = sqlite3_column_int64(s, 1);
  l->path = sqlite3_column_int(s, 2);
  l->replica = sqlite3_column_int(s, 3);
  l->worker = sqlite3_column_int64(s, 4);
  l->round = sqlite3_column_int64(s, 5);
  l->inner_steps = sqlite3_column_int(s, 6);
  l->step_begin = sqlite3_column_int64(s, 7);
  l->state = (store_lease_state)NIDX(LEASE_STATES, sq_col_text(s, 8));
  l->created_at = sqlite3_column_int64(s, 9);
  l->expires_at = sqlite3_column_int64(s, 10);
  l->ended_at = sqlite3_column_int64(s, 11);
}

int store_get_lease(store *st, int64_t id, store_lease *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_LEASE);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, id);
  int rc = sq_step(st, s, "get lease");
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) {
    read_lease(s, out);
    live_overlay_lease(st, out);
  }
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0 : dpc_err(DPC_ENOENT, "no lease with id %lld", (long long)id);
}

int store_lease_base_version(store *st, int64_t lease, int fragment, int64_t *version) {
  sqlite3_stmt *s = sq_stmt(st, S_LEASE_BASE);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, lease);
  B64(s, 2, fragment);
  int rc = sq_step(st, s, "lease base version");
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) *version = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0 : dpc_err(DPC_ENOENT, "lease %lld does not cover fragment %d", (long long)lease, fragment);
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
  B64(f, 1, l->job);
  B64(f, 2, l->path);
  B64(f, 3, l->replica);
  B64(f, 4, advance ? 1 : 0);
  B64(f, 5, advance ? steps_done : 0);
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
  int rc = sq_collect(st, s, "list leases", sizeof(store_lease), read_lease, (void **)out, n);
  for (int i = 0; rc >= 0 && i < *n; i++) live_overlay_lease(st, &(*out)[i]);
  return rc;
}

/* ---- rounds and deltas --------------------------------------------------------------------- */

int store_open_round(store *st, int64_t job, int fragment, int64_t round, int64_t now_ms, int64_t deadline_at) {
  sqlite3_stmt *s = sq_stmt(st, S_OPEN_ROUND);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, fragment);
  B64(s, 3, round);
  B64(s, 4, now_ms);
  B64(s, 5, deadline_at);
  return sq_exec_done(st, s, "open round");
}

static void read_round(sqlite3_stmt *s, void *out) {
  store_round *r = out;
  r->job = sqlite3_column_int64(s, 0);
  r->fragment = sqlite3_column_int(s, 1);
  r->round = sqlite3_column_int64(s, 2);
  r->state = (store_round_state)NIDX(ROUND_STATES, sq_col_text(s, 3));
  r->opened_at = sqlite3_column_int64(s, 4);
  r->deadline_at = sqlite3_column_int64(s, 5);
  r->closed_at = sqlite3_column_int64(s, 6);
  r->n_deltas = sqlite3_column_int(s, 7);
  r->version = sqlite3_column_int64(s, 8);
}

/* 1 and *out filled if the round row exists, 0 if not, negative on error. */
static int find_round(store *st, int64_t job, int fragment, int64_t round, store_round *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_ROUND);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, fragment);
  B64(s, 3, round);
  int rc = sq_step(st, s, "get round");
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) read_round(s, out);
  sqlite3_reset(s);
  return rc == SQLITE_ROW;
}

int store_get_round(store *st, int64_t job, int fragment, int64_t round, store_round *out) {
  int rc = find_round(st, job, fragment, round, out);
  if (rc < 0) return rc;
  return rc ? 0 : dpc_err(DPC_ENOENT, "job %lld fragment %d has no round %lld", (long long)job, fragment, (long long)round);
}

int store_list_open_rounds(store *st, int64_t job, store_round **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_OPEN_ROUNDS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  return sq_collect(st, s, "list open rounds", sizeof(store_round), read_round, (void **)out, n);
}

int store_record_delta(store *st, const store_new_delta *nd, int64_t *delta_id) {
  if (!nd->blob || !nd->blob[0] || strlen(nd->blob) >= BLOB_NAME_MAX)
    return dpc_err(DPC_EINVAL, "store_record_delta: bad blob name");
  if (!isfinite(nd->weight) || nd->weight < 0 || nd->tokens < 0)
    return dpc_err(DPC_EINVAL, "store_record_delta: weight %g / tokens %lld invalid", nd->weight, (long long)nd->tokens);
  TRY(sq_begin(st));
  /* Idempotency first: a retry of an acknowledged push must succeed even after the lease
   * ended or the round closed. */
  {
    STMT(s, S_FIND_DELTA);
    B64(s, 1, nd->lease);
    B64(s, 2, nd->fragment);
    int rc = sq_step(st, s, "find delta");
    if (rc < 0) return sq_rollback(st, rc);
    if (rc == SQLITE_ROW) {
      int64_t id = sqlite3_column_int64(s, 0);
      uint32_t crc = (uint32_t)sqlite3_column_int64(s, 1);
      sqlite3_reset(s);
      sq_rollback(st, 0);
      if (crc != nd->checksum)
        return dpc_err(DPC_EEXIST, "lease %lld already pushed a different delta for fragment %d (crc 0x%08x, now 0x%08x)",
                       (long long)nd->lease, nd->fragment, crc, nd->checksum);
      if (delta_id) *delta_id = id;
      return 1;
    }
    sqlite3_reset(s);
  }
  store_lease l;
  TX(store_get_lease(st, nd->lease, &l));
  int64_t base;
  TX(store_lease_base_version(st, nd->lease, nd->fragment, &base));
  store_round r;
  int have = find_round(st, l.job, nd->fragment, l.round, &r);
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
  B64(s, 1, l.job);
  B64(s, 2, l.round);
  B64(s, 3, nd->fragment);
  B64(s, 4, l.path);
  B64(s, 5, l.replica);
  B64(s, 6, nd->lease);
  B64(s, 7, base);
  B64(s, 8, nd->checksum);
  BTXT(s, 9, nd->blob);
  BDBL(s, 10, nd->weight);
  B64(s, 11, nd->tokens);
  B64(s, 12, nd->now_ms);
  if (isfinite(nd->norm) && nd->norm >= 0) BDBL(s, 13, nd->norm);
  else sqlite3_bind_null(s, 13);
  TX(sq_exec_done(st, s, "insert delta"));
  int64_t id = sqlite3_last_insert_rowid(st->db);
  if (nd->metric) TX(store_add_metric(st, nd->metric));
  if (nd->inner_steps > 0 && nd->inner_steps < l.inner_steps) {
    STMT(sh, S_SHORTEN_LEASE);
    B64(sh, 1, nd->lease);
    B64(sh, 2, nd->inner_steps);
    TX(sq_exec_done(st, sh, "shorten lease"));
  }
  TX(sq_commit(st));
  if (delta_id) *delta_id = id;
  return 0;
}

void sq_read_delta(sqlite3_stmt *s, void *out) {
  store_delta *d = out;
  d->id = sqlite3_column_int64(s, 0);
  d->job = sqlite3_column_int64(s, 1);
  d->round = sqlite3_column_int64(s, 2);
  d->fragment = sqlite3_column_int(s, 3);
  d->path = sqlite3_column_int(s, 4);
  d->replica = sqlite3_column_int(s, 5);
  d->lease = sqlite3_column_int64(s, 6);
  d->base_version = sqlite3_column_int64(s, 7);
  d->checksum = (uint32_t)sqlite3_column_int64(s, 8);
  sq_copy_text(d->blob, sizeof d->blob, s, 9);
  d->weight = sqlite3_column_double(s, 10);
  d->tokens = sqlite3_column_int64(s, 11);
  d->state = (store_delta_state)NIDX(DELTA_STATES, sq_col_text(s, 12));
  d->received_at = sqlite3_column_int64(s, 13);
  d->applied_version = sqlite3_column_int64(s, 14);
}

int store_find_delta(store *st, int64_t lease, int fragment, uint32_t *crc) {
  sqlite3_stmt *s = sq_stmt(st, S_FIND_DELTA);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, lease);
  B64(s, 2, fragment);
  int rc = sq_step(st, s, "find delta");
  if (rc < 0) return rc;
  int found = rc == SQLITE_ROW;
  if (found && crc) *crc = (uint32_t)sqlite3_column_int64(s, 1);
  sqlite3_reset(s);
  return found;
}

int store_count_received_slots(store *st, int64_t job, int fragment, int64_t round, int *n) {
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_COUNT_RECEIVED_SLOTS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, fragment);
  B64(s, 3, round);
  int rc = sq_step(st, s, "count received deltas");
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) *n = sqlite3_column_int(s, 0);
  sqlite3_reset(s);
  return 0;
}

int store_delta_norms(store *st, int64_t job, int fragment, int max, double *norms, int *n) {
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_DELTA_NORMS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, fragment);
  B64(s, 3, max);
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
  int rc = sq_step(st, s, "get delta");
  if (rc < 0) return rc;
  if (rc == SQLITE_ROW) sq_read_delta(s, out);
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0 : dpc_err(DPC_ENOENT, "no delta with id %lld", (long long)id);
}

int store_list_deltas(store *st, int64_t job, int fragment, int64_t round, int state, store_delta **out, int *n) {
  *out = NULL;
  *n = 0;
  if (state > DELTA_DROPPED) return dpc_err(DPC_EINVAL, "unknown delta state %d", state);
  sqlite3_stmt *s = sq_stmt(st, S_LIST_DELTAS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, fragment);
  B64(s, 3, round);
  B64(s, 4, state);
  BTXT(s, 5, state >= 0 ? DELTA_STATES[state] : "");
  return sq_collect(st, s, "list deltas", sizeof(store_delta), sq_read_delta, (void **)out, n);
}

int store_list_pending_deltas(store *st, int64_t job, int fragment, store_delta **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_PENDING_DELTAS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  B64(s, 2, fragment);
  return sq_collect(st, s, "list pending deltas", sizeof(store_delta), sq_read_delta, (void **)out, n);
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

int store_commit_outer(store *st, const store_outer_commit *c) {
  if (!c->param_blob || (c->n_applied > 0 && !c->applied) || c->n_applied < 0)
    return dpc_err(DPC_EINVAL, "store_commit_outer: missing parameter blob or applied list");
  TRY(sq_begin(st));
  {
    STMT(s, S_FRAG_VERSION);
    B64(s, 1, c->job);
    B64(s, 2, c->fragment);
    int rc = sq_step(st, s, "read fragment version");
    if (rc < 0) return sq_rollback(st, rc);
    if (rc != SQLITE_ROW) {
      sqlite3_reset(s);
      return sq_rollback(st, dpc_err(DPC_ENOENT, "job %lld has no fragment %d", (long long)c->job, c->fragment));
    }
    int64_t cur = sqlite3_column_int64(s, 0);
    sqlite3_reset(s);
    if (c->new_version != cur + 1)
      return sq_rollback(st, dpc_err(DPC_ESTATE, "fragment %d is at version %lld; cannot commit version %lld", c->fragment,
                                  (long long)cur, (long long)c->new_version));
  }
  if (c->close_round) {
    store_round r;
    int have = find_round(st, c->job, c->fragment, c->round, &r);
    if (have < 0) return sq_rollback(st, have);
    if (have && r.state == ROUND_CLOSED)
      return sq_rollback(st, dpc_err(DPC_ESTATE, "round %lld of fragment %d is already closed", (long long)c->round, c->fragment));
  }
  {
    STMT(v, S_INS_VERSION);
    B64(v, 1, c->job);
    B64(v, 2, c->fragment);
    B64(v, 3, c->new_version);
    B64(v, 4, c->round);
    BTXT(v, 5, c->param_blob);
    B64(v, 6, c->param_crc);
    BTXT(v, 7, c->momentum_blob);
    B64(v, 8, c->momentum_blob ? c->momentum_crc : 0);
    BTXT(v, 9, c->dnbuf_blob);
    B64(v, 10, c->dnbuf_blob ? c->dnbuf_crc : 0);
    B64(v, 11, c->dn_t);
    B64(v, 12, c->keep ? 1 : 0);
    B64(v, 13, c->now_ms);
    TX(sq_exec_done(st, v, "insert fragment version"));
  }
  {
    STMT(u, S_SET_FRAG_VERSION);
    B64(u, 1, c->job);
    B64(u, 2, c->fragment);
    B64(u, 3, c->new_version);
    TX(sq_exec_done(st, u, "advance fragment version"));
  }
  for (int i = 0; i < c->n_applied; i++) {
    STMT(a, S_APPLY_DELTA);
    B64(a, 1, c->applied[i]);
    B64(a, 2, c->job);
    B64(a, 3, c->fragment);
    B64(a, 4, c->round);
    B64(a, 5, c->new_version);
    TX(sq_exec_done(st, a, "mark delta applied"));
    if (sqlite3_changes(st->db) != 1)
      return sq_rollback(st, dpc_err(DPC_ESTATE, "delta %lld is not a received delta of job %lld fragment %d round %lld",
                                  (long long)c->applied[i], (long long)c->job, c->fragment, (long long)c->round));
  }
  if (c->close_round) {
    STMT(d, S_DROP_DELTAS);
    B64(d, 1, c->job);
    B64(d, 2, c->fragment);
    B64(d, 3, c->round);
    TX(sq_exec_done(st, d, "drop late deltas"));
    STMT(r, S_CLOSE_ROUND);
    B64(r, 1, c->job);
    B64(r, 2, c->fragment);
    B64(r, 3, c->round);
    B64(r, 4, c->now_ms);
    B64(r, 5, c->n_applied);
    B64(r, 6, c->new_version);
    TX(sq_exec_done(st, r, "close round"));
  }
  TX(sq_commit(st));
  return 0;
}

