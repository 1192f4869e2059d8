/* store_jobs.c — jobs and what a job is made of: creating one (its modules, fragments at
 * version 0, paths and slots in one transaction), job states, fragments and their versions,
 * rounds, and the commit of an outer step (a new version, its deltas applied, its round
 * closed). Same contract as store.h: one thread per handle, one transaction per multi-row
 * change. */
#include "coordinator/store.h"
#include "coordinator/store_internal.h"
#include "common/errors.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

/* ---- jobs -------------------------------------------------------------------------------- */

const char *store_job_state_name(store_job_state s) { return (unsigned)s <= JOB_FAILED ? JOB_STATES[s] : "?"; }

int store_job_state_parse(const char *s, store_job_state *out) {
  for (int i = 0; i <= JOB_FAILED; i++)
    if (strcmp(JOB_STATES[i], s) == 0) {
      *out = (store_job_state)i;
      return 0;
    }
  return dpc_err(DPC_EINVAL, "unknown job state \"%s\"", s);
}

int store_next_job_id(store *st, int64_t *id) {
  sqlite3_stmt *s = sq_stmt(st, S_NEXT_JOB_ID);
  if (!s) return DPC_EINTERNAL;
  *id = 0; /* the query always returns a row */
  int rc = sq_get_i64(st, s, "next job id", id);
  return rc < 0 ? rc : 0;
}

/* Insert one fragment_versions row: the version c->new_version that c describes. Inside the
 * caller's transaction; used by job creation (version 0) and by every outer step. */
static int insert_version(store *st, const store_outer_commit *c, const char *what) {
  sqlite3_stmt *v = sq_stmt(st, S_INS_VERSION);
  if (!v) return DPC_EINTERNAL;
  BIND_I64S(v, c->job, c->fragment, c->new_version, c->round);
  BTXT(v, 5, c->param_blob);
  B64(v, 6, c->param_crc);
  BTXT(v, 7, c->momentum_blob);
  B64(v, 8, c->momentum_blob ? c->momentum_crc : 0);
  BTXT(v, 9, c->dnbuf_blob);
  B64(v, 10, c->dnbuf_blob ? c->dnbuf_crc : 0);
  B64(v, 11, c->dn_t);
  B64(v, 12, c->keep ? 1 : 0);
  B64(v, 13, c->now_ms);
  return sq_exec_done(st, v, what);
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
    BIND_I64S(s, nj->id, m->id, m->level, m->index, m->offset, m->len);
    TX(sq_exec_done(st, s, "insert module"));
  }
  for (int i = 0; i < nj->n_fragments; i++) {
    const jobspec_fragment *f = &nj->fragments[i];
    const store_fragment_init *in = &nj->init[i];
    if (in->fragment != f->id || !in->param_blob)
      return sq_rollback(st, dpc_err(DPC_EINVAL, "store_create_job: init[%d] is for fragment %d, expected %d", i, in->fragment, f->id));
    STMT(s, S_INS_FRAGMENT);
    BIND_I64S(s, nj->id, f->id, f->module, f->offset, f->len);
    TX(sq_exec_done(st, s, "insert fragment"));
    const store_outer_commit v0 = {.job = nj->id, .fragment = f->id, .round = -1, .new_version = 0,
                                   .param_blob = in->param_blob, .param_crc = in->param_crc,
                                   .momentum_blob = in->momentum_blob, .momentum_crc = in->momentum_crc,
                                   .keep = 1, /* the initial version is always kept */
                                   .now_ms = nj->now_ms};
    TX(insert_version(st, &v0, "insert fragment version 0"));
  }
  const int P = jobspec_n_paths(js);
  for (int p = 0; p < P; p++) {
    STMT(s, S_INS_PATH);
    BIND_I64S(s, nj->id, p);
    TX(sq_exec_done(st, s, "insert path"));
    int mods[JOBSPEC_MAX_LEVELS];
    int nl = jobspec_path_modules(js, p, mods);
    if (nl < 0) return sq_rollback(st, nl);
    for (int l = 0; l < nl; l++) {
      STMT(m, S_INS_PATH_MODULE);
      BIND_I64S(m, nj->id, p, l, mods[l]);
      TX(sq_exec_done(st, m, "insert path module"));
    }
    for (int r = 0; r < js->replicas; r++) {
      STMT(s2, S_INS_SLOT);
      BIND_I64S(s2, nj->id, p, r);
      TX(sq_exec_done(st, s2, "insert slot"));
    }
  }
  TX(sq_commit(st));
  return 0;
}

void store_job_clear(store_job *j) {
  if (j) row_clear(&JOB_MAP, j);
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
  int rc = sq_get_row(st, s, "get job", &JOB_MAP, out);
  if (rc != 0) return rc < 0 ? rc : 0;
  return name ? dpc_err(DPC_ENOENT, "no job named \"%s\"", name) : dpc_err(DPC_ENOENT, "no job with id %lld", (long long)id);
}

int store_get_job(store *st, int64_t id, store_job *out) { return get_job_by(st, S_GET_JOB, id, NULL, out); }
int store_find_job(store *st, const char *name, store_job *out) { return get_job_by(st, S_FIND_JOB, 0, name, out); }

int store_list_jobs(store *st, store_job **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LIST_JOBS);
  if (!s) return DPC_EINTERNAL;
  return sq_collect(st, s, "list jobs", &JOB_MAP, (void **)out, n);
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

int store_get_fragment(store *st, int64_t job, int fragment, store_fragment *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_FRAGMENT);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment);
  int rc = sq_get_row(st, s, "get fragment", &FRAG_MAP, out);
  if (rc != 0) return rc < 0 ? rc : 0;
  return dpc_err(DPC_ENOENT, "job %lld has no fragment %d", (long long)job, fragment);
}

int store_get_version(store *st, int64_t job, int fragment, int64_t version, store_fragment *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_VERSION);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment, version);
  int rc = sq_get_row(st, s, "get fragment version", &FRAG_MAP, out);
  if (rc != 0) return rc < 0 ? rc : 0;
  return dpc_err(DPC_ENOENT, "job %lld fragment %d has no version %lld (never made or collected)", (long long)job,
                 fragment, (long long)version);
}

int store_list_fragments(store *st, int64_t job, store_fragment **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_LIST_FRAGMENTS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  return sq_collect(st, s, "list fragments", &FRAG_MAP, (void **)out, n);
}

/* ---- rounds ------------------------------------------------------------------------------ */

int store_open_round(store *st, int64_t job, int fragment, int64_t round, int64_t now_ms, int64_t deadline_at) {
  sqlite3_stmt *s = sq_stmt(st, S_OPEN_ROUND);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment, round, now_ms, deadline_at);
  return sq_exec_done(st, s, "open round");
}

int store_find_round(store *st, int64_t job, int fragment, int64_t round, store_round *out) {
  sqlite3_stmt *s = sq_stmt(st, S_GET_ROUND);
  if (!s) return DPC_EINTERNAL;
  BIND_I64S(s, job, fragment, round);
  return sq_get_row(st, s, "get round", &ROUND_MAP, out);
}

int store_get_round(store *st, int64_t job, int fragment, int64_t round, store_round *out) {
  int rc = store_find_round(st, job, fragment, round, out);
  if (rc < 0) return rc;
  return rc ? 0 : dpc_err(DPC_ENOENT, "job %lld fragment %d has no round %lld", (long long)job, fragment, (long long)round);
}

int store_list_open_rounds(store *st, int64_t job, store_round **out, int *n) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *s = sq_stmt(st, S_OPEN_ROUNDS);
  if (!s) return DPC_EINTERNAL;
  B64(s, 1, job);
  return sq_collect(st, s, "list open rounds", &ROUND_MAP, (void **)out, n);
}

/* ---- outer steps --------------------------------------------------------------------------- */

int store_commit_outer(store *st, const store_outer_commit *c) {
  if (!c->param_blob || (c->n_applied > 0 && !c->applied) || c->n_applied < 0)
    return dpc_err(DPC_EINVAL, "store_commit_outer: missing parameter blob or applied list");
  TRY(sq_begin(st));
  {
    STMT(s, S_FRAG_VERSION);
    BIND_I64S(s, c->job, c->fragment);
    int64_t cur;
    int rc = sq_get_i64(st, s, "read fragment version", &cur);
    if (rc < 0) return sq_rollback(st, rc);
    if (rc == 0) return sq_rollback(st, dpc_err(DPC_ENOENT, "job %lld has no fragment %d", (long long)c->job, c->fragment));
    if (c->new_version != cur + 1)
      return sq_rollback(st, dpc_err(DPC_ESTATE, "fragment %d is at version %lld; cannot commit version %lld", c->fragment,
                                  (long long)cur, (long long)c->new_version));
  }
  if (c->close_round) {
    store_round r;
    int have = store_find_round(st, c->job, c->fragment, c->round, &r);
    if (have < 0) return sq_rollback(st, have);
    if (have && r.state == ROUND_CLOSED)
      return sq_rollback(st, dpc_err(DPC_ESTATE, "round %lld of fragment %d is already closed", (long long)c->round, c->fragment));
  }
  TX(insert_version(st, c, "insert fragment version"));
  {
    STMT(u, S_SET_FRAG_VERSION);
    BIND_I64S(u, c->job, c->fragment, c->new_version);
    TX(sq_exec_done(st, u, "advance fragment version"));
  }
  for (int i = 0; i < c->n_applied; i++) {
    STMT(a, S_APPLY_DELTA);
    BIND_I64S(a, c->applied[i], c->job, c->fragment, c->round, c->new_version);
    TX(sq_exec_done(st, a, "mark delta applied"));
    if (sqlite3_changes(st->db) != 1)
      return sq_rollback(st, dpc_err(DPC_ESTATE, "delta %lld is not a received delta of job %lld fragment %d round %lld",
                                  (long long)c->applied[i], (long long)c->job, c->fragment, (long long)c->round));
  }
  if (c->close_round) {
    STMT(d, S_DROP_DELTAS);
    BIND_I64S(d, c->job, c->fragment, c->round);
    TX(sq_exec_done(st, d, "drop late deltas"));
    STMT(r, S_CLOSE_ROUND);
    BIND_I64S(r, c->job, c->fragment, c->round, c->now_ms, c->n_applied, c->new_version);
    TX(sq_exec_done(st, r, "close round"));
  }
  TX(sq_commit(st));
  return 0;
}
