/* store_internal.h — what the store's source files share: the row layouts and the
 * prepared-statement list, the handle's layout, the statement / transaction helpers and the row
 * mapper (store_sql.c), and the in-memory liveness (store_live.c). Not for use outside the store.
 *
 * Map (the public contract is store.h; every file below is coordinator/store*.c):
 *   store.c          schema and migrations, open and close
 *   store_deltas.c   received deltas: recording one (idempotent, one transaction) and reading them
 *   store_history.c  garbage collection, blob names, metrics, the asynchronous ledger
 *   store_leases.c   workers, slots, leases and their expiry
 *   store_jobs.c     jobs (created with their modules, fragments, paths and slots), fragment
 *                    versions, rounds, and the commit of an outer step
 *   store_live.c     worker liveness and lease renewals kept in memory and flushed in batches
 *   store_sql.c      statement cache, step / transaction helpers, SQLite error mapping, the
 *                    row mapper and the names of the state enums
 *   store_fault.c    test-only fault-injecting VFS (asked for by store.c at open)
 *
 * Calls go one way, from a line to the lines below it, never up and never within a line:
 *   store.c, store_deltas.c
 *   store_history.c, store_leases.c
 *   store_jobs.c, store_live.c
 *   store_sql.c, store_fault.c
 * A file reaches a lower one through the public store_* API or through the few internals
 * declared here (store_find_round, live_*); store_sql.c and store_fault.c call no other store
 * file. So a subsystem file can be read, and changed, knowing only the files below it. */
#ifndef DPC_STORE_INTERNAL_H
#define DPC_STORE_INTERNAL_H

#include "coordinator/store.h"

#include <sqlite3.h>
#include <stddef.h>

/* ---- row layouts ------------------------------------------------------------------------------
 * Each *_COLUMNS list names the columns a query selects, in order, with the struct field each
 * fills and its kind (col_kind below). The SELECT list (*_COLS) and the mapping table (*_MAP,
 * store_sql.c) are both made from it, so a new column is one line here plus its field in
 * store.h. The sql text of every entry but the first starts with the ", " that separates it. */

#define JOB_COLUMNS(COL)               \
  COL(id, I64, "id")                   \
  COL(name, TEXT, ", name")            \
  COL(algorithm, INT, ", algorithm")   \
  COL(state, JOB_STATE, ", state")     \
  COL(created_at, I64, ", created_at") \
  COL(updated_at, I64, ", updated_at") \
  COL(spec_json, DUP, ", spec_json")   \
  COL(error, DUP_NULL, ", error")

/* A fragment joined with one of its versions (f: fragments, v: fragment_versions). */
#define FRAG_COLUMNS(COL)                      \
  COL(job, I64, "f.job")                       \
  COL(fragment, INT, ", f.fragment")           \
  COL(module, INT, ", f.module")               \
  COL(offset, SIZE, ", f.offset")              \
  COL(len, SIZE, ", f.len")                    \
  COL(version, I64, ", v.version")             \
  COL(round, I64, ", v.round")                 \
  COL(param_blob, TEXT, ", v.param_blob")      \
  COL(param_crc, U32, ", v.param_crc")         \
  COL(momentum_blob, TEXT, ", v.momentum_blob") \
  COL(momentum_crc, U32, ", v.momentum_crc")   \
  COL(dnbuf_blob, TEXT, ", v.dnbuf_blob")      \
  COL(dnbuf_crc, U32, ", v.dnbuf_crc")         \
  COL(dn_t, I64, ", v.dn_t")                   \
  COL(created_at, I64, ", v.created_at")

#define WORKER_COLUMNS(COL)                  \
  COL(id, I64, "id")                         \
  COL(name, TEXT, ", name")                  \
  COL(token_hash, HASH, ", token_hash")      \
  COL(info, TEXT, ", info")                  \
  COL(state, WORKER_STATE, ", state")        \
  COL(registered_at, I64, ", registered_at") \
  COL(last_seen, I64, ", last_seen")         \
  COL(steps_per_s, DBL, ", steps_per_s")

#define SLOT_COLUMNS(COL)                   \
  COL(job, I64, "job")                      \
  COL(path, INT, ", path")                  \
  COL(replica, INT, ", replica")            \
  COL(state, SLOT_STATE, ", state")         \
  COL(round, I64, ", round")                \
  COL(inner_steps, I64, ", inner_steps")    \
  COL(last_worker, I64, ", coalesce(last_worker, 0)")

#define LEASE_COLUMNS(COL)               \
  COL(id, I64, "id")                     \
  COL(job, I64, ", job")                 \
  COL(path, INT, ", path")               \
  COL(replica, INT, ", replica")         \
  COL(worker, I64, ", worker")           \
  COL(round, I64, ", round")             \
  COL(inner_steps, INT, ", inner_steps") \
  COL(step_begin, I64, ", step_begin")   \
  COL(state, LEASE_STATE, ", state")     \
  COL(created_at, I64, ", created_at")   \
  COL(expires_at, I64, ", expires_at")   \
  COL(ended_at, I64, ", ended_at")       \
  COL(sched_shift, I64, ", sched_shift")

#define DELTA_COLUMNS(COL)                       \
  COL(id, I64, "id")                             \
  COL(job, I64, ", job")                         \
  COL(round, I64, ", round")                     \
  COL(fragment, INT, ", fragment")               \
  COL(path, INT, ", path")                       \
  COL(replica, INT, ", replica")                 \
  COL(lease, I64, ", lease")                     \
  COL(base_version, I64, ", base_version")       \
  COL(checksum, U32, ", checksum")               \
  COL(blob, TEXT, ", blob")                      \
  COL(weight, DBL, ", weight")                   \
  COL(tokens, I64, ", tokens")                   \
  COL(state, DELTA_STATE, ", state")             \
  COL(received_at, I64, ", received_at")         \
  COL(applied_version, I64, ", applied_version") \
  COL(enc_blob, TEXT, ", enc_blob")              \
  COL(enc_crc, U32, ", enc_crc")

/* The (lease, fragment) lookup of a delta: its id and checksum only. */
typedef struct {
  int64_t id;
  uint32_t checksum, enc_crc;
} store_delta_ref;
#define DELTA_REF_COLUMNS(COL)     \
  COL(id, I64, "id")               \
  COL(checksum, U32, ", checksum") \
  COL(enc_crc, U32, ", enc_crc")

#define ROUND_COLUMNS(COL)               \
  COL(job, I64, "job")                   \
  COL(fragment, INT, ", fragment")       \
  COL(round, I64, ", round")             \
  COL(state, ROUND_STATE, ", state")     \
  COL(opened_at, I64, ", opened_at")     \
  COL(deadline_at, I64, ", deadline_at") \
  COL(closed_at, I64, ", closed_at")     \
  COL(n_deltas, INT, ", n_deltas")       \
  COL(version, I64, ", version")

/* Selected and inserted alike (INS_METRIC binds a whole store_metric with row_bind). */
#define METRIC_COLUMNS(COL)                  \
  COL(job, I64, "job")                       \
  COL(round, I64, ", round")                 \
  COL(path, INT, ", path")                   \
  COL(replica, INT, ", replica")             \
  COL(worker, I64, ", worker")               \
  COL(loss, DBL_NAN, ", loss")               \
  COL(tokens, I64, ", tokens")               \
  COL(bytes_in, I64, ", bytes_in")           \
  COL(bytes_out, I64, ", bytes_out")         \
  COL(outer_seconds, DBL, ", outer_seconds") \
  COL(created_at, I64, ", created_at")

#define COL_SQL(field, kind, sql) sql
#define JOB_COLS JOB_COLUMNS(COL_SQL)
#define FRAG_COLS FRAG_COLUMNS(COL_SQL)
#define WORKER_COLS WORKER_COLUMNS(COL_SQL)
#define SLOT_COLS SLOT_COLUMNS(COL_SQL)
#define LEASE_COLS LEASE_COLUMNS(COL_SQL)
#define DELTA_COLS DELTA_COLUMNS(COL_SQL)
#define DELTA_REF_COLS DELTA_REF_COLUMNS(COL_SQL)
#define ROUND_COLS ROUND_COLUMNS(COL_SQL)
#define METRIC_COLS METRIC_COLUMNS(COL_SQL)

/* ---- statements ------------------------------------------------------------------------------ */

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
  X(LIST_WORKERS_AFTER, "SELECT " WORKER_COLS " FROM workers WHERE id > ?1 ORDER BY id LIMIT ?2")            \
  X(FORGET_WORKERS, "DELETE FROM workers WHERE id IN (SELECT id FROM workers WHERE last_seen < ?1 "             \
                    "AND id NOT IN (SELECT worker FROM leases) "                                              \
                    "AND id NOT IN (SELECT last_worker FROM slots WHERE last_worker IS NOT NULL) "            \
                    "ORDER BY id LIMIT ?2) RETURNING id")                                                     \
  X(TOUCH_WORKER, "UPDATE workers SET last_seen = ?2, steps_per_s = coalesce(?3, steps_per_s) WHERE id = ?1") \
  X(SET_WORKER_STATE, "UPDATE workers SET state = ?2 WHERE id = ?1")                                          \
  X(GET_SLOT, "SELECT " SLOT_COLS " FROM slots "    \
              "WHERE job = ?1 AND path = ?2 AND replica = ?3")                                                \
  X(LIST_SLOTS, "SELECT " SLOT_COLS " FROM slots "  \
                "WHERE job = ?1 ORDER BY path, replica")                                                     \
  X(IDLE_SLOTS, "SELECT " SLOT_COLS " FROM slots "  \
                "WHERE job = ?1 AND state = 'idle' AND round >= ?2 AND round <= ?3 ORDER BY path, replica")   \
  X(ANY_SLOT_BELOW, "SELECT EXISTS (SELECT 1 FROM slots WHERE job = ?1 AND round < ?2)")                      \
  X(SET_SLOT_STATE, "UPDATE slots SET state = ?4 WHERE job = ?1 AND path = ?2 AND replica = ?3")              \
  X(LEASE_SLOT, "UPDATE slots SET state = 'leased', last_worker = ?4 "                                        \
                "WHERE job = ?1 AND path = ?2 AND replica = ?3 AND state = 'idle'")                           \
  X(FREE_SLOT, "UPDATE slots SET state = 'idle', round = round + ?4, inner_steps = inner_steps + ?5 "        \
               "WHERE job = ?1 AND path = ?2 AND replica = ?3")                                              \
  X(INS_LEASE, "INSERT INTO leases (job, path, replica, worker, round, inner_steps, step_begin, state, "       \
               "created_at, expires_at, sched_shift, granted_steps) "                                         \
               "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'active', ?8, ?9, ?10, ?6)")                              \
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
  X(FIND_DELTA, "SELECT " DELTA_REF_COLS " FROM deltas WHERE lease = ?1 AND fragment = ?2")                         \
  X(COUNT_RECEIVED_SLOTS, "SELECT count(*) FROM (SELECT DISTINCT path, replica FROM deltas WHERE job = ?1 "    \
                          "AND fragment = ?2 AND round = ?3 AND state = 'received')")                          \
  X(COUNT_DROPPED, "SELECT (SELECT count(*) FROM deltas WHERE job = ?1 AND state = 'dropped') + "                \
                   "(SELECT count(*) FROM leases l JOIN lease_fragments lf ON lf.lease = l.id WHERE l.job = ?1 "  \
                   "AND l.state = 'finished' AND NOT EXISTS (SELECT 1 FROM deltas d WHERE d.lease = l.id "       \
                   "AND d.fragment = lf.fragment))")                                                             \
  X(INS_DELTA, "INSERT INTO deltas (job, round, fragment, path, replica, lease, base_version, checksum, blob, " \
               "weight, tokens, state, received_at, norm, enc_blob, enc_crc) "                               \
               "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'received', ?12, ?13, ?14, ?15)")      \
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
  X(GC_DELTAS_SEL, "SELECT id, blob, enc_blob FROM deltas WHERE job = ?1 AND fragment = ?2 AND round < ?3 "             \
                   "AND state != 'received' AND blob != '' ORDER BY id")                                     \
  X(GC_DELTA_DEL, "UPDATE deltas SET blob = '', enc_blob = '' WHERE id = ?1")                                                \
  X(INS_METRIC, "INSERT INTO metrics (" METRIC_COLS ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)") \
  X(LIST_METRICS, "SELECT " METRIC_COLS " FROM metrics WHERE job = ?1 AND round >= ?2 ORDER BY round, id") \
  X(JOB_TRAFFIC, "SELECT coalesce(sum(bytes_in), 0), coalesce(sum(bytes_out), 0) FROM metrics "              \
                 "WHERE job = ?1 AND path >= 0")                                                              \
  X(ADVANCE_SLOT, "UPDATE slots SET round = ?4, inner_steps = ?5 "                                           \
                  "WHERE job = ?1 AND path = ?2 AND replica = ?3 AND state = 'idle' AND round < ?4")      \
  X(NEXT_PENDING, "SELECT " DELTA_COLS " FROM deltas WHERE job = ?1 AND fragment = ?2 AND state = 'received' " \
                  "ORDER BY id LIMIT 1")                                                                   \
  X(DROP_DELTA, "UPDATE deltas SET state = 'dropped' WHERE id = ?1 AND state = 'received'")                 \
  X(BLOB_NAMES, "SELECT param_blob FROM fragment_versions UNION ALL "                                        \
                "SELECT momentum_blob FROM fragment_versions WHERE momentum_blob != '' UNION ALL "            \
                "SELECT dnbuf_blob FROM fragment_versions WHERE dnbuf_blob != '' UNION ALL "                  \
                "SELECT blob FROM deltas WHERE blob != '' UNION ALL "                                        \
                "SELECT enc_blob FROM deltas WHERE enc_blob != ''")                                         \
  X(ROUND_SPREADS, "SELECT max(received_at) - min(received_at), count(*) FROM deltas WHERE job = ?1 AND "       \
                   "fragment = ?2 AND state = 'applied' AND round < ?3 GROUP BY round ORDER BY round DESC "      \
                   "LIMIT ?4")                                                                                  \
  X(SLOT_TRAINERS, "SELECT count(DISTINCT worker) FROM leases WHERE job = ?1 AND path = ?2 AND replica = ?3 "   \
                   "AND state = 'finished'")                                                                    \
  X(GOODPUT, "SELECT coalesce(sum(CASE WHEN granted_steps > 0 THEN granted_steps ELSE inner_steps END), 0), "  \
             "coalesce(sum(CASE WHEN EXISTS (SELECT 1 FROM deltas d WHERE d.lease = leases.id AND "           \
             "d.state = 'applied') THEN inner_steps ELSE 0 END), 0) FROM leases "                             \
             "WHERE job = ?1 AND state != 'active'")                                                         \
  X(LEDGER, "SELECT " DELTA_COLS " FROM deltas WHERE job = ?1 AND fragment = ?2 AND state = 'applied' "      \
            "ORDER BY applied_version, path, replica, id")

enum {
#define X_ENUM(name, sql) S_##name,
  STMTS(X_ENUM)
#undef X_ENUM
  S_COUNT
};

/* ---- the handle -------------------------------------------------------------------------------- */

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

/* ---- store_sql.c: statements, transactions, errors ----------------------------------------- */

/* The DPC code for a SQLite result code. */
int sq_map_rc(int rc);
/* Record "path: what: sqlite3_errmsg" under the mapped code; returns that code. */
int sq_db_err(store *st, int rc, const char *what);
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
/* Column i as text; "" for NULL. */
const char *sq_col_text(sqlite3_stmt *s, int i);
/* Grow-by-doubling array append used by the list functions. */
int sq_grow(void **arr, int *cap, int n, size_t elem);
/* Bind v[0..n-1] to the parameters ?1..?n as integers. */
void sq_bind_i64s(sqlite3_stmt *s, const int64_t *v, int n);
/* Step a bound single-column statement once: 1 and *out = its integer when there is a row,
 * 0 when there is none, or a negative code. The statement is reset either way. */
int sq_get_i64(store *st, sqlite3_stmt *s, const char *what, int64_t *out);

/* The names the state columns hold, indexed by the enums of store.h. */
extern const char *const JOB_STATES[JOB_FAILED + 1];
extern const char *const WORKER_STATES[WORKER_GONE + 1];
extern const char *const SLOT_STATES[SLOT_DONE + 1];
extern const char *const LEASE_STATES[LEASE_EXPIRED + 1];
extern const char *const ROUND_STATES[ROUND_CLOSED + 1];
extern const char *const DELTA_STATES[DELTA_DROPPED + 1];
/* The index of s in names[n]; 0 (the first state) for an unknown name. */
int sq_name_index(const char *const *names, int n, const char *s);
#define NIDX(tbl, s) sq_name_index((tbl), (int)(sizeof(tbl) / sizeof((tbl)[0])), (s))

/* ---- store_sql.c: the row mapper ----------------------------------------------------------- */

/* How a column maps to its field (read with row_read, written with row_bind). */
typedef enum {
  COL_I64,      /* int64_t */
  COL_INT,      /* int, or an enum stored as its number */
  COL_U32,      /* uint32_t (checksums), stored as a non-negative integer */
  COL_SIZE,     /* size_t */
  COL_DBL,      /* double; a non-finite value is written as 0 */
  COL_DBL_NAN,  /* double; NULL in the row is NaN in the struct (not measured) and back */
  COL_TEXT,     /* char[N]: copied, truncated to fit; NULL reads as "" */
  COL_DUP,      /* char *, owned by the struct (row_clear): NULL reads as "" */
  COL_DUP_NULL, /* char *, owned by the struct (row_clear): NULL stays NULL */
  COL_HASH,     /* unsigned char[N]: copied only when the blob has exactly N bytes, else zero */
  /* enums stored by name (*_STATES above); an unknown name reads as the first state */
  COL_JOB_STATE,
  COL_WORKER_STATE,
  COL_SLOT_STATE,
  COL_LEASE_STATE,
  COL_ROUND_STATE,
  COL_DELTA_STATE,
} col_kind;

typedef struct {
  col_kind kind;
  size_t off, size; /* the field's offsetof and sizeof in the row struct */
} row_col;

/* A row struct's mapping: column i of the statement is cols[i]. */
typedef struct {
  const row_col *cols;
  int n;
  size_t size; /* sizeof the row struct */
} row_map;

extern const row_map JOB_MAP, FRAG_MAP, WORKER_MAP, SLOT_MAP, LEASE_MAP, DELTA_MAP, DELTA_REF_MAP, ROUND_MAP,
    METRIC_MAP;

/* Fill *out (zeroed first) from the current row of s. 0, or DPC_ENOMEM (nothing left owned). */
int row_read(sqlite3_stmt *s, const row_map *m, void *out);
/* Bind the fields of *row to the parameters ?1..?n in column order. */
void row_bind(sqlite3_stmt *s, const row_map *m, const void *row);
/* Free the owned strings of one row (COL_DUP*), setting them NULL; not the row itself. */
void row_clear(const row_map *m, void *row);
/* Step a bound statement once: 1 and *out read when there is a row, 0 when there is none, or
 * a negative code. The statement is reset either way. */
int sq_get_row(store *st, sqlite3_stmt *s, const char *what, const row_map *m, void *out);
/* Step a bound statement to the end, reading each row into a malloc'd array: *out (caller
 * frees it, and the rows' owned strings) and *n. On error nothing is returned. */
int sq_collect(store *st, sqlite3_stmt *s, const char *what, const row_map *m, void **out, int *n);

/* ---- store_live.c: liveness in memory ------------------------------------------------------ */

live_ent *live_find(live_map *m, int64_t key);
/* Find or insert key; NULL when out of memory. */
live_ent *live_put(live_map *m, int64_t key);
/* Remove key (no-op when absent). */
void live_remove(live_map *m, int64_t key);
void live_clear(live_map *m);
void live_free(live_map *m);
/* Readers: replace last_seen / steps_per_s / an active lease's expiry by the in-memory value. */
void live_overlay_worker(store *st, store_worker *w);
void live_overlay_lease(store *st, store_lease *l);
/* Remember a touch of a worker known to exist (its durable last_seen is last_seen). */
int live_touch_worker(store *st, int64_t id, int64_t last_seen, int64_t now_ms, double steps_per_s);
/* Remember a renewal (validated by the caller). */
int live_renew_lease(store *st, int64_t lease, int64_t expires_at);
/* Inside the caller's transaction: write every pending value; after its commit, live_flushed
 * marks them written (a rolled-back flush keeps them pending). */
int live_flush_tx(store *st);
void live_flushed(store *st);

/* ---- store_jobs.c: for the delta path -------------------------------------------------------- */

/* 1 and *out filled if the round row exists, 0 if not, negative on error. */
int store_find_round(store *st, int64_t job, int fragment, int64_t round, store_round *out);

/* ---- store_fault.c ------------------------------------------------------------------------- */

/* The name of the fault-injecting test VFS when DIPACO_TEST_IO_FAULT asks for a sqlite-* fault,
 * else NULL (SQLite's default VFS). */
const char *store_fault_vfs(void);

/* ---- shorthands ------------------------------------------------------------------------------- */

#define B64(s, i, v) sqlite3_bind_int64((s), (i), (sqlite3_int64)(v))
#define BTXT(s, i, v) ((v) ? sqlite3_bind_text((s), (i), (v), -1, SQLITE_STATIC) : sqlite3_bind_null((s), (i)))
#define BDBL(s, i, v) sqlite3_bind_double((s), (i), (v))
/* Bind integers to ?1, ?2, ... in order: BIND_I64S(s, job, fragment, round). */
#define BIND_I64S(s, ...)                                  \
  sq_bind_i64s((s), (const int64_t[]){__VA_ARGS__},        \
               (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

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
