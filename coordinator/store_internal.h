/* store_internal.h — what the store's source files (store.c, store_history.c) share: the
 * prepared-statement list, the handle's layout, and the statement/transaction helpers.
 * Not for use outside the store. */
#ifndef DPC_STORE_INTERNAL_H
#define DPC_STORE_INTERNAL_H

#include "coordinator/store.h"

#include <sqlite3.h>

/* ---- statements -------------------------------------------------------------------------- */

#define FRAG_COLS                                                                                 \
  "f.job, f.fragment, f.module, f.offset, f.len, v.version, v.round, v.param_blob, v.param_crc, " \
  "v.momentum_blob, v.momentum_crc, v.dnbuf_blob, v.dnbuf_crc, v.dn_t, v.created_at"
#define LEASE_COLS "id, job, path, replica, worker, round, inner_steps, step_begin, state, created_at, expires_at, ended_at"
#define DELTA_COLS                                                                                      \
  "id, job, round, fragment, path, replica, lease, base_version, checksum, blob, weight, tokens, state, " \
  "received_at, applied_version"
#define JOB_COLS "id, name, algorithm, state, created_at, updated_at, spec_json, error"
#define WORKER_COLS "id, name, token_hash, info, state, registered_at, last_seen, steps_per_s"
#define ROUND_COLS "job, fragment, round, state, opened_at, deadline_at, closed_at, n_deltas, version"
#define METRIC_COLS "job, round, path, replica, worker, loss, tokens, bytes_in, bytes_out, outer_seconds, created_at"

#define STMTS(X)                                                                                              \
  X(BEGIN, "BEGIN IMMEDIATE")                                                                                 \
  X(COMMIT, "COMMIT")                                                                                         \
  X(ROLLBACK, "ROLLBACK")                                                                                     \
  X(NEXT_JOB_ID, "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), 0) + 1")             \
  X(INS_JOB, "INSERT INTO jobs (id, name, spec_json, algorithm, state, created_at, updated_at) "              \
             "VALUES (?1, ?2, ?3, ?4, 'created', ?5, ?5)")                                                   \
  X(INS_MODULE, "INSERT INTO modules (job, module, level, idx, offset, len) VALUES (?1, ?2, ?3, ?4, ?5, ?6)") \
  X(INS_FRAGMENT, "INSERT INTO fragments (job, fragment, module, offset, len, version) VALUES (?1, ?2, ?3, ?4, ?5, 0)") \
  X(INS_VERSION, "INSERT INTO fragment_versions (job, fragment, version, round, param_blob, param_crc, "      \
                 "momentum_blob, momentum_crc, dnbuf_blob, dnbuf_crc, dn_t, keep, created_at) "              \
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)")                          \
  X(INS_PATH, "INSERT INTO paths (job, path) VALUES (?1, ?2)")                                                \
  X(INS_PATH_MODULE, "INSERT INTO path_modules (job, path, level, module) VALUES (?1, ?2, ?3, ?4)")           \
  X(INS_SLOT, "INSERT INTO slots (job, path, replica, state) VALUES (?1, ?2, ?3, 'idle')")                    \
  X(GET_JOB, "SELECT " JOB_COLS " FROM jobs WHERE id = ?1")                                                   \
  X(FIND_JOB, "SELECT " JOB_COLS " FROM jobs WHERE name = ?1")                                                \
  X(LIST_JOBS, "SELECT " JOB_COLS " FROM jobs ORDER BY id")                                                   \
  X(JOB_STATE, "SELECT state FROM jobs WHERE id = ?1")                                                        \
  X(SET_JOB_STATE, "UPDATE jobs SET state = ?2, error = ?3, updated_at = ?4 WHERE id = ?1")                   \
  X(GET_FRAGMENT, "SELECT " FRAG_COLS " FROM fragments f JOIN fragment_versions v "                          \
                  "ON v.job = f.job AND v.fragment = f.fragment AND v.version = f.version "                  \
                  "WHERE f.job = ?1 AND f.fragment = ?2")                                                     \
  X(GET_VERSION, "SELECT " FRAG_COLS " FROM fragments f JOIN fragment_versions v "                           \
                 "ON v.job = f.job AND v.fragment = f.fragment "                                             \
                 "WHERE f.job = ?1 AND f.fragment = ?2 AND v.version = ?3")                                  \
  X(LIST_FRAGMENTS, "SELECT " FRAG_COLS " FROM fragments f JOIN fragment_versions v "                        \
                    "ON v.job = f.job AND v.fragment = f.fragment AND v.version = f.version "                \
                    "WHERE f.job = ?1 ORDER BY f.fragment")                                                  \
  X(FRAG_VERSION, "SELECT version FROM fragments WHERE job = ?1 AND fragment = ?2")                           \
  X(SET_FRAG_VERSION, "UPDATE fragments SET version = ?3 WHERE job = ?1 AND fragment = ?2")                   \
  X(INS_WORKER, "INSERT INTO workers (name, token_hash, info, state, registered_at, last_seen) "              \
                "VALUES (?1, ?2, ?3, 'active', ?4, ?4)")                                                     \
  X(GET_WORKER, "SELECT " WORKER_COLS " FROM workers WHERE id = ?1")                                          \
  X(LIST_WORKERS, "SELECT " WORKER_COLS " FROM workers ORDER BY id")                                          \
  X(TOUCH_WORKER, "UPDATE workers SET last_seen = ?2, steps_per_s = coalesce(?3, steps_per_s) WHERE id = ?1") \
  X(SET_WORKER_STATE, "UPDATE workers SET state = ?2 WHERE id = ?1")                                          \
  X(GET_SLOT, "SELECT job, path, replica, state, round, inner_steps, coalesce(last_worker, 0) FROM slots "    \
              "WHERE job = ?1 AND path = ?2 AND replica = ?3")                                                \
  X(LIST_SLOTS, "SELECT job, path, replica, state, round, inner_steps, coalesce(last_worker, 0) FROM slots "  \
                "WHERE job = ?1 ORDER BY path, replica")                                                     \
  X(IDLE_SLOTS, "SELECT job, path, replica, state, round, inner_steps, coalesce(last_worker, 0) FROM slots "  \
                "WHERE job = ?1 AND state = 'idle' AND round >= ?2 AND round <= ?3 ORDER BY path, replica")   \
  X(ANY_SLOT_BELOW, "SELECT EXISTS (SELECT 1 FROM slots WHERE job = ?1 AND round < ?2)")                      \
  X(SET_SLOT_STATE, "UPDATE slots SET state = ?4 WHERE job = ?1 AND path = ?2 AND replica = ?3")              \
  X(LEASE_SLOT, "UPDATE slots SET state = 'leased', last_worker = ?4 "                                        \
                "WHERE job = ?1 AND path = ?2 AND replica = ?3 AND state = 'idle'")                           \
  X(FREE_SLOT, "UPDATE slots SET state = 'idle', round = round + ?4, inner_steps = inner_steps + ?5 "        \
               "WHERE job = ?1 AND path = ?2 AND replica = ?3")                                              \
  X(INS_LEASE, "INSERT INTO leases (job, path, replica, worker, round, inner_steps, step_begin, state, "       \
               "created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'active', ?8, ?9)")              \
  X(INS_LEASE_FRAG, "INSERT INTO lease_fragments (lease, fragment, base_version) VALUES (?1, ?2, ?3)")       \
  X(GET_LEASE, "SELECT " LEASE_COLS " FROM leases WHERE id = ?1")                                             \
  X(LEASE_BASE, "SELECT base_version FROM lease_fragments WHERE lease = ?1 AND fragment = ?2")                \
  X(RENEW_LEASE, "UPDATE leases SET expires_at = ?2 WHERE id = ?1 AND state = 'active'")                    \
  X(LEASE_GRACE, "UPDATE leases SET expires_at = ?1 WHERE state = 'active' AND expires_at < ?1")             \
  X(SHORTEN_LEASE, "UPDATE leases SET inner_steps = ?2 WHERE id = ?1 AND state = 'active' AND inner_steps > ?2")                                           \
  X(END_LEASE, "UPDATE leases SET state = ?2, ended_at = ?3 WHERE id = ?1 AND state = 'active'")             \
  X(DUE_LEASES, "SELECT id FROM leases WHERE state = 'active' AND expires_at <= ?1 ORDER BY id")             \
  X(ACTIVE_LEASES, "SELECT " LEASE_COLS " FROM leases WHERE state = 'active' AND (?1 = 0 OR job = ?1) "     \
                   "ORDER BY id")                                                                            \
  X(OPEN_ROUND, "INSERT OR IGNORE INTO rounds (job, fragment, round, state, opened_at, deadline_at) "         \
                "VALUES (?1, ?2, ?3, 'open', ?4, ?5)")                                                       \
  X(GET_ROUND, "SELECT " ROUND_COLS " FROM rounds WHERE job = ?1 AND fragment = ?2 AND round = ?3")          \
  X(OPEN_ROUNDS, "SELECT " ROUND_COLS " FROM rounds WHERE state = 'open' AND (?1 = 0 OR job = ?1) "         \
                 "ORDER BY job, fragment, round")                                                            \
  X(CLOSE_ROUND, "INSERT INTO rounds (job, fragment, round, state, opened_at, closed_at, n_deltas, version) " \
                 "VALUES (?1, ?2, ?3, 'closed', ?4, ?4, ?5, ?6) "                                            \
                 "ON CONFLICT (job, fragment, round) DO UPDATE SET state = 'closed', closed_at = ?4, "       \
                 "n_deltas = ?5, version = ?6")                                                              \
  X(FIND_DELTA, "SELECT id, checksum FROM deltas WHERE lease = ?1 AND fragment = ?2")                         \
  X(COUNT_RECEIVED_SLOTS, "SELECT count(*) FROM (SELECT DISTINCT path, replica FROM deltas WHERE job = ?1 "    \
                          "AND fragment = ?2 AND round = ?3 AND state = 'received')")                          \
  X(INS_DELTA, "INSERT INTO deltas (job, round, fragment, path, replica, lease, base_version, checksum, blob, " \
               "weight, tokens, state, received_at, norm) "                                                  \
               "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'received', ?12, ?13)")                \
  X(DELTA_NORMS, "SELECT norm FROM deltas WHERE job = ?1 AND fragment = ?2 AND norm IS NOT NULL "             \
                 "ORDER BY id DESC LIMIT ?3")                                                                 \
  X(GET_DELTA, "SELECT " DELTA_COLS " FROM deltas WHERE id = ?1")                                             \
  X(LIST_DELTAS, "SELECT " DELTA_COLS " FROM deltas WHERE job = ?1 AND fragment = ?2 AND round = ?3 "        \
                 "AND (?4 < 0 OR state = ?5) ORDER BY path, replica, id")                                    \
  X(PENDING_DELTAS, "SELECT " DELTA_COLS " FROM deltas WHERE job = ?1 AND fragment = ?2 AND state = 'received' " \
                    "ORDER BY round, path, replica, id")                                                     \
  X(LEASE_FRAGS, "SELECT fragment, base_version FROM lease_fragments WHERE lease = ?1 ORDER BY fragment")     \
  X(APPLY_DELTA, "UPDATE deltas SET state = 'applied', applied_version = ?5 "                                 \
                 "WHERE id = ?1 AND job = ?2 AND fragment = ?3 AND round = ?4 AND state = 'received'")       \
  X(DROP_DELTAS, "UPDATE deltas SET state = 'dropped' "                                                       \
                 "WHERE job = ?1 AND fragment = ?2 AND round = ?3 AND state = 'received'")                   \
  X(GC_VERSIONS_SEL, "SELECT version, param_blob, momentum_blob, dnbuf_blob FROM fragment_versions "         \
                     "WHERE job = ?1 AND fragment = ?2 AND version <= ?3 AND keep = 0 "                      \
                     "AND (?4 <= 0 OR version % ?4 != 0) ORDER BY version")                                  \
  X(GC_VERSION_DEL, "DELETE FROM fragment_versions WHERE job = ?1 AND fragment = ?2 AND version = ?3")       \
  X(GC_DELTAS_SEL, "SELECT id, blob FROM deltas WHERE job = ?1 AND fragment = ?2 AND round < ?3 "             \
                   "AND state != 'received' AND blob != '' ORDER BY id")                                     \
  X(GC_DELTA_DEL, "UPDATE deltas SET blob = '' WHERE id = ?1")                                                \
  X(INS_METRIC, "INSERT INTO metrics (" METRIC_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)") \
  X(LIST_METRICS, "SELECT " METRIC_COLS " FROM metrics WHERE job = ?1 AND round >= ?2 ORDER BY round, id") \
  X(ADVANCE_SLOT, "UPDATE slots SET round = ?4, inner_steps = ?5 "                                           \
                  "WHERE job = ?1 AND path = ?2 AND replica = ?3 AND state = 'idle' AND round < ?4")      \
  X(NEXT_PENDING, "SELECT " DELTA_COLS " FROM deltas WHERE job = ?1 AND fragment = ?2 AND state = 'received' " \
                  "ORDER BY id LIMIT 1")                                                                   \
  X(DROP_DELTA, "UPDATE deltas SET state = 'dropped' WHERE id = ?1 AND state = 'received'")                 \
  X(BLOB_NAMES, "SELECT param_blob FROM fragment_versions UNION ALL "                                        \
                "SELECT momentum_blob FROM fragment_versions WHERE momentum_blob != '' UNION ALL "            \
                "SELECT dnbuf_blob FROM fragment_versions WHERE dnbuf_blob != '' UNION ALL "                  \
                "SELECT blob FROM deltas WHERE blob != ''")                                                 \
  X(LEDGER, "SELECT " DELTA_COLS " FROM deltas WHERE job = ?1 AND fragment = ?2 AND state = 'applied' "      \
            "ORDER BY applied_version, path, replica, id")

enum {
#define X_ENUM(name, sql) S_##name,
  STMTS(X_ENUM)
#undef X_ENUM
  S_COUNT
};

/* In-memory liveness (store_live.c): an open-addressing map from a worker or lease id (≥ 1;
 * 0 marks an empty slot) to its latest last_seen / expiry t, the worker's steps_per_s. */
typedef struct {
  int64_t key;
  int64_t t;
  double sps;
  int has_sps, dirty;
} live_ent;
typedef struct {
  live_ent *e; /* [cap], cap a power of two */
  size_t cap, n;
} live_map;

struct store {
  sqlite3 *db;
  char *path;
  sqlite3_stmt *stmts[S_COUNT];
  int fail_step; /* test hook: steps left until an injected failure; 0 = off */
  live_map live_workers; /* kept (the ids known to exist); dirty until flushed */
  live_map live_leases;  /* renewals not yet flushed; emptied by each flush */
  int live_dirty;
};

live_ent *live_find(live_map *m, int64_t key);
/* Find or insert key; NULL when out of memory. */
live_ent *live_put(live_map *m, int64_t key);
void live_clear(live_map *m);
void live_free(live_map *m);
/* Readers: replace last_seen / steps_per_s / an active lease's expiry by the in-memory value. */
void live_overlay_worker(store *st, store_worker *w);
void live_overlay_lease(store *st, store_lease *l);
/* Remember a renewal (validated by the caller). */
int live_renew_lease(store *st, int64_t lease, int64_t expires_at);
/* Inside the caller's transaction: write every pending value; after its commit, live_flushed
 * marks them written (a rolled-back flush keeps them pending). */
int live_flush_tx(store *st);
void live_flushed(store *st);

/* store_fault.c: the name of the fault-injecting test VFS when DIPACO_TEST_IO_FAULT asks for
 * a sqlite-* fault, else NULL (SQLite's default VFS). */
const char *store_fault_vfs(void);

/* The cached statement `id`, reset and unbound; NULL (detail recorded) on failure. */
sqlite3_stmt *sq_stmt(store *st, int id);
/* sqlite3_step with the fault hook: SQLITE_ROW, SQLITE_DONE or a negative DPC code. */
int sq_step(store *st, sqlite3_stmt *s, const char *what);
/* Run a statement that returns no rows; 0 or a negative code. */
int sq_exec_done(store *st, sqlite3_stmt *s, const char *what);
int sq_begin(store *st);
int sq_commit(store *st);
/* Roll back, keeping the caller's error detail; returns rc. */
int sq_rollback(store *st, int rc);
const char *sq_col_text(sqlite3_stmt *s, int i);
void sq_copy_text(char *dst, size_t cap, sqlite3_stmt *s, int i);
char *sq_dup_text_or_null(sqlite3_stmt *s, int i);
/* Grow-by-doubling array append used by the list functions. */
int sq_grow(void **arr, int *cap, int n, size_t elem);
/* Read one deltas row (DELTA_COLS) into *(store_delta *)out. */
void sq_read_delta(sqlite3_stmt *s, void *out);
/* Step a bound statement to the end, reading each row with read() into a malloc'd array of
 * elem-sized records: *out (caller frees) and *n. On error nothing is returned. */
int sq_collect(store *st, sqlite3_stmt *s, const char *what, size_t elem, void (*read)(sqlite3_stmt *, void *),
               void **out, int *n);

#define B64(s, i, v) sqlite3_bind_int64((s), (i), (sqlite3_int64)(v))
#define BTXT(s, i, v) ((v) ? sqlite3_bind_text((s), (i), (v), -1, SQLITE_STATIC) : sqlite3_bind_null((s), (i)))
#define BDBL(s, i, v) sqlite3_bind_double((s), (i), (v))

#define TRY(x)                  \
  do {                          \
    int _rc = (x);              \
    if (_rc < 0) return _rc;    \
  } while (0)
/* Inside a transaction: on failure roll back and return. */
#define TX(x)                                \
  do {                                       \
    int _rc = (x);                           \
    if (_rc < 0) return sq_rollback(st, _rc);   \
  } while (0)
#define STMT(var, id)                              \
  sqlite3_stmt *var = sq_stmt(st, (id));              \
  if (!var) return sq_rollback(st, DPC_EINTERNAL)


#endif
