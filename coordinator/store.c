/* store.c — SQLite-backed durable state of the coordinator: the schema and its migrations,
 * opening and closing the database (see store.h; the map of the other store files is in
 * store_internal.h). */
#include "coordinator/store.h"
#include "coordinator/store_internal.h"
#include "common/errors.h"
#include "common/log.h"

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
    /* 2 -> 3: where a lease starts on the inner LR schedule, as a shift from step_begin (async
     * jobs: the job's progress, not the slot's own step; 0 = step_begin, as every lease before). */
    "ALTER TABLE leases ADD COLUMN sched_shift INTEGER NOT NULL DEFAULT 0;",
    /* 3 -> 4: the inner steps a lease was granted (inner_steps shrinks to the steps a partial
     * delta covers), for goodput: steps merged / steps leased (0 = as inner_steps, before). */
    "ALTER TABLE leases ADD COLUMN granted_steps INTEGER NOT NULL DEFAULT 0;",
    /* 4 -> 5: a quantized delta's stream as sent and its CRC-32C, kept for replay pulls
     * (docs/design.md §4.3; '' and 0 for fp32 and sparse deltas and for rows before). */
    "ALTER TABLE deltas ADD COLUMN enc_blob TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE deltas ADD COLUMN enc_crc INTEGER NOT NULL DEFAULT 0;",
};
#define N_MIGRATIONS ((int)(sizeof MIGRATIONS / sizeof MIGRATIONS[0]))
_Static_assert(N_MIGRATIONS == STORE_SCHEMA_VERSION, "STORE_SCHEMA_VERSION must equal the number of migrations");

/* ---- open / close / migrate -------------------------------------------------------------- */

static int exec_sql(store *st, const char *sql, const char *what) {
  char *msg = NULL;
  int rc = sqlite3_exec(st->db, sql, NULL, NULL, &msg);
  if (rc != SQLITE_OK) {
    int e = dpc_err(sq_map_rc(rc), "%s: %s: %s", st->path, what, msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return e;
  }
  return 0;
}

static int get_user_version(store *st, int *v) {
  sqlite3_stmt *s;
  int rc = sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL);
  if (rc != SQLITE_OK) return sq_db_err(st, rc, "read user_version");
  rc = sqlite3_step(s);
  *v = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) : 0;
  sqlite3_finalize(s);
  return rc == SQLITE_ROW ? 0 : sq_db_err(st, rc, "read user_version");
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
    rc = dpc_err(sq_map_rc(rc), "open %s: %s", st->path, st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
    store_close(st);
    return rc;
  }
  sqlite3_extended_result_codes(st->db, 1);
  sqlite3_busy_timeout(st->db, 5000);
  /* WAL: readers never block the writer; synchronous=FULL makes every commit durable, which
   * the "acknowledge only after commit" rule of docs/design.md §5 relies on. */
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

