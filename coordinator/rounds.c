/* rounds.c — the outer optimizer's side of the loop: when a round of a fragment closes, the
 * sync outer step (outerio.h, streamed over the blobs in the libuv thread pool) and its commit,
 * the round overhead that follows it (rounds_note_pull), the async
 * delta-by-delta apply, the garbage collection of old versions and delta blobs, the end of a
 * job, and the housekeeping tick.
 *
 * A sync step's version is committed once its parameters are stored; its momentum is stored
 * after (momentum_store), and made again from the kept inputs if that fails (remake_momentum).
 *
 * Sync rule (rounds_close.c): round t of fragment f closes when every slot whose path contains f's module has
 * a received delta for it, or — at the round deadline, or quorum_grace_s after the
 * ceil(quorum · expected)-th slot's delta arrived — when at least ceil(quorum · expected)
 * have (slot rules: leases.c).
 *
 * Async rule (algorithm "diloco-async", docs/design.md §3): every received delta is applied on its
 * own, in arrival order (delta id), one at a time per fragment, with the job's outer.rule:
 * delayed-nesterov (outer_dn_apply; N = outer.delay_buffer or the number of slots), nesterov
 * (outer_nesterov_step per delta) or sgd (outer_sgd_step). Each application makes version + 1;
 * the delta's row is the ledger entry (lease, slot, base version, version produced; staleness
 * = produced − 1 − base). A delta whose staleness exceeds max_staleness (> 0) is dropped
 * instead. Async delta rows and blobs are kept (the ledger), and so is version 0, so that
 * θ_0 + the ledger reproduce every version; other parameter versions keep the newest
 * 2·slots + 2 (a lease pulls its base version right after grant). The job finishes when the
 * budget is trained, no lease is active and no delta is pending. */
#include "coordinator/rounds.h"
#include "coordinator/rounds_close.h"

#include "common/errors.h"
#include "common/sparse.h"
#include "common/log.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/pcache.h"
#include "coordinator/blobwatch.h"
#include "coordinator/testhook.h"
#include "coordinator/outerio.h"
#include "kernels/outer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- outer step ----------------------------------------------------------------------------- */

typedef struct {
  uv_work_t req;
  coord *c;
  int64_t job;
  int fragment;
  int64_t round, new_version;
  size_t len;
  int n;
  char (*delta_blobs)[BLOB_NAME_MAX]; /* [n] in (path, replica) order */
  double *weights;                    /* [n] */
  int64_t *delta_ids;                 /* [n] */
  uint32_t *delta_crcs;               /* [n] the checksums the rows recorded (what was acknowledged) */
  char param_blob[BLOB_NAME_MAX], momentum_blob[BLOB_NAME_MAX];
  char new_param[BLOB_NAME_MAX], new_momentum[BLOB_NAME_MAX];
  float lr, mu;
  int nesterov;
  int codec;                /* the job's delta codec and block size (deltas kept as sent) */
  uint32_t block_floats;
  /* SparseLoCo: the codec settings and the fragment's tensor lengths (BLOB_SPARSE deltas) */
  dpc_sparse_cfg sp_cfg;
  uint64_t *sp_tlen;
  int sp_nt;
  /* results */
  int rc;
  char err[512];
  uint32_t param_crc, momentum_crc;
  double seconds;
  int short_reason; /* 0: every expected delta; REVOKE_DEADLINE / REVOKE_GRACE: closed without some */
  int early;        /* REVOKE_GRACE before the window's end: no missing slot could deliver */
  int64_t first_at, last_at; /* earliest and latest received_at of the merged deltas */
  int remake;                /* making a committed version again: both blobs stored before the answer */
  blob_writer *momentum_w;   /* otherwise: u_{t+1}'s writer, committed after the version (momentum_store) */
} outer_work;

static void outer_work_free(outer_work *w) {
  blob_writer_abort(w->momentum_w);
  free(w->sp_tlen);
  free(w->delta_blobs);
  free(w->delta_crcs);
  free(w->weights);
  free(w->delta_ids);
  free(w);
}

static void outer_run(uv_work_t *req) {
  outer_work *w = req->data;
  double t0 = dpc_mono_s();
  outerio_sync a = {.bs = w->c->bs, .len = w->len, .param_blob = w->param_blob, .momentum_blob = w->momentum_blob,
                    .n = w->n, .delta_blobs = (const char (*)[BLOB_NAME_MAX])w->delta_blobs,
                    .delta_crcs = w->delta_crcs, .weights = w->weights, .sp_cfg = w->sp_tlen ? &w->sp_cfg : NULL,
                    .sp_tlen = w->sp_tlen, .sp_nt = w->sp_nt, .lr = w->lr, .mu = w->mu, .nesterov = w->nesterov,
                    .codec = w->codec, .block_floats = w->block_floats, .new_param = w->new_param, .new_momentum = w->new_momentum,
                    .momentum_later = w->remake ? NULL : &w->momentum_w};
  int rc = outerio_sync_step(&a, &w->param_crc, &w->momentum_crc);
  if (rc < 0) snprintf(w->err, sizeof w->err, "%s", dpc_errmsg());
  w->rc = rc;
  w->seconds = dpc_mono_s() - t0;
}

/* Blob files of collected rows are deleted on the threadpool: unlinking large files (and the
 * directory fsyncs after) can take tens of milliseconds, and each object of an S3 store is a
 * request, that the loop thread would otherwise spend not answering RPCs. Shutdown waits for
 * them (loop_queue_work counts them). */
typedef struct {
  uv_work_t req;
  coord *c;
  char **names;
  int n, rc;
  char *upload_id; /* rounds_discard: the upload of names[0] to abort first, or NULL */
} gc_work;

static void gc_delete_run(uv_work_t *req) {
  gc_work *g = req->data;
  if (g->upload_id && blob_store_upload_abort(g->c->bs, g->names[0], g->upload_id) < 0)
    DPC_WARN("aborting the upload of %s: %s (the start-up sweep aborts it)", g->names[0], dpc_errmsg());
  g->rc = blob_delete_many(g->c->bs, g->names, g->n);
  if (g->rc < 0) DPC_WARN("garbage collection: %s (the start-up sweep removes what is left)", dpc_errmsg());
}

static void gc_delete_after(uv_work_t *req, int status) {
  (void)status;
  gc_work *g = req->data;
  coord *c = g->c;
  store_names_free(g->names, g->n);
  free(g->upload_id);
  free(g);
  loop_work_done(c);
}

/* Takes ownership of names (and of upload_id, which may be NULL). */
static void gc_delete_files(coord *c, char **names, int n, char *upload_id) {
  gc_work *g = n > 0 ? calloc(1, sizeof *g) : NULL;
  if (g) {
    g->req.data = g;
    g->c = c;
    g->names = names;
    g->n = n;
    g->upload_id = upload_id;
    if (loop_queue_work(c, &g->req, gc_delete_run, gc_delete_after) == 0) return;
    free(g);
  }
  if (n > 0 && upload_id) blob_store_upload_abort(c->bs, names[0], upload_id); /* no memory or no threadpool: inline */
  if (n > 0) blob_delete_many(c->bs, names, n);
  store_names_free(names, n);
  free(upload_id);
}

void rounds_discard(coord *c, const char *name, const char *upload_id) {
  char **names = malloc(sizeof *names);
  char *up = upload_id && upload_id[0] ? strdup(upload_id) : NULL;
  if (names && (names[0] = strdup(name)) && (up || !upload_id || !upload_id[0])) {
    gc_delete_files(c, names, 1, up);
    return;
  }
  if (names && names[0]) free(names[0]);
  free(names);
  free(up);
  if (upload_id && upload_id[0]) blob_store_upload_abort(c->bs, name, upload_id); /* no memory: inline */
  blob_delete(c->bs, name);
}

/* The rows go first (one transaction each), then the files: a crash in between leaves only
 * unreferenced blob files behind, never a row naming a missing blob. The job spec's
 * "versions" says which parameter versions stay exportable. */
static void gc_fragment(coord *c, int64_t job, int fragment, int64_t round) {
  char **names = NULL;
  int n = 0;
  const coord_job *j = coord_job_get(c, job);
  const int keep_last = j ? j->spec.versions.keep_last : 2, keep_every = j ? j->spec.versions.keep_every : 0;
  if (store_gc_versions(c->st, job, fragment, keep_last, keep_every, &names, &n) == 0) {
    if (n > 0) TESTHOOK("gc");
    gc_delete_files(c, names, n, NULL);
  }
  /* A SparseLoCo job or one with replay pulls keeps its last REPLAY_KEEP_ROUNDS rounds' deltas:
   * PullFragment serves them (PAYLOAD_SPARSE_ROUND, PAYLOAD_REPLAY_ROUND) to workers a few
   * versions behind. */
  const int keep = j && (j->spec.sparse.enabled || jobspec_replay_pull(&j->spec));
  int64_t before = keep ? round - (REPLAY_KEEP_ROUNDS - 1) : round;
  if (before > 0 && store_gc_deltas(c->st, job, fragment, before, &names, &n) == 0) {
    if (n > 0) TESTHOOK("gc");
    gc_delete_files(c, names, n, NULL);
  }
}

/* The round closed at its deadline or at the end of its quorum grace window (reason:
 * REVOKE_DEADLINE / REVOKE_GRACE) without some slots: revoke their leases for the round and
 * move every slot of the fragment's paths that has not reached the next round. */
static void skip_missing_slots(coord *c, coord_job *j, int fragment, int64_t round, int reason, int early) {
  store_lease *act;
  int na;
  if (store_list_active_leases(c->st, j->id, &act, &na) == 0) {
    for (int i = 0; i < na; i++)
      if (act[i].round == round && coord_job_path_has_fragment(j, act[i].path, fragment)) {
        DPC_WARN("lease %lld revoked: round %lld of job %lld closed %s without it", (long long)act[i].id,
                 (long long)round, (long long)j->id,
                 early                   ? "at its quorum (its worker's connection had closed)"
                 : reason == REVOKE_GRACE ? "at the end of its quorum grace window"
                                          : "at its deadline");
        if (store_end_lease(c->st, act[i].id, LEASE_RELEASED, 1, act[i].inner_steps, dpc_wall_ms()) == 0)
          lease_count_revocation(c, reason);
        lease_ended(c, act[i].id, 1);
      }
    free(act);
  }
  store_slot *slots;
  int ns;
  if (store_list_slots(c->st, j->id, &slots, &ns) == 0) {
    for (int i = 0; i < ns; i++)
      if (slots[i].state == SLOT_IDLE && slots[i].round == round && coord_job_path_has_fragment(j, slots[i].path, fragment))
        store_advance_slot(c->st, j->id, slots[i].path, slots[i].replica, round + 1,
                           (round + 1) * (int64_t)j->spec.inner_steps);
    free(slots);
  }
}

static void check_job_done(coord *c, coord_job *j) {
  if (j->state != JOB_RUNNING && j->state != JOB_PAUSED) return;
  for (int f = 0; f < j->n_fragments; f++)
    if (j->momentum[f] != COORD_MOMENTUM_STORED) return; /* a row names it: it is stored first */
  store_fragment *frags;
  int nf;
  if (store_list_fragments(c->st, j->id, &frags, &nf) < 0) return;
  int done = nf > 0;
  for (int i = 0; i < nf; i++)
    if (frags[i].version < j->spec.rounds) done = 0;
  free(frags);
  if (done) coord_job_set_state(c, j, JOB_FINISHED, NULL);
}

/* A failed outer step (its blobs could not be written or its commit failed: an I/O error, a
 * full disk) is tried again from the durable deltas, but not in a tight loop. */
#define OUTER_RETRY_MS 1000

/* Record the round's mean of the slot losses (and the outer step's time) as its path −1 metric
 * row; returns the mean (NaN when no slot reported a loss). */
static double record_round_loss(coord *c, coord_job *j, const outer_work *w) {
  double sum = 0;
  int cnt = 0;
  store_metric *ms;
  int nm;
  if (store_list_metrics(c->st, w->job, w->round, &ms, &nm) == 0) {
    for (int i = 0; i < nm; i++)
      if (ms[i].round == w->round && ms[i].path >= 0 && isfinite(ms[i].loss)) {
        sum += ms[i].loss;
        cnt++;
      }
    free(ms);
  }
  double mean = cnt ? sum / cnt : NAN;
  store_metric m = {.job = w->job, .round = w->round, .path = -1, .replica = -1, .loss = mean,
                    .outer_seconds = w->seconds, .created_at = dpc_wall_ms()};
  store_add_metric(c->st, &m);
  if (j && cnt) j->last_loss = (float)mean;
  return mean;
}

/* A sync outer step that cannot succeed by trying again pauses the job with the reason, where
 * `job show` prints it, rather than fail over and over: a non-finite result at once, a corrupt
 * or missing blob (checksum, format, not found) after OUTER_CORRUPT_TRIES steps in a row. I/O
 * errors such as a full disk keep being retried: they clear when the disk does. `job resume`
 * tries again. */
#define OUTER_CORRUPT_TRIES 3

/* Hold fragment f's outer steps until `job resume` and pause the running job with `what`. */
static void pause_fragment(coord *c, coord_job *j, int f, const char *what) {
  char why[768];
  snprintf(why, sizeof why, "paused: %s (fix or replace the state, then job resume; or cancel the job)", what);
  j->outer_fails[f] = 0;
  j->outer_retry_at[f] = INT64_MAX;
  if (j->state == JOB_RUNNING) coord_job_set_state(c, j, JOB_PAUSED, why);
}

static void outer_failed(coord *c, coord_job *j, const outer_work *w) {
  const int corrupt = w->rc == DPC_ECHECKSUM || w->rc == DPC_EFORMAT || w->rc == DPC_ENOENT;
  if (w->rc != DPC_ENUMERIC && !(corrupt && ++j->outer_fails[w->fragment] >= OUTER_CORRUPT_TRIES)) return;
  char what[640];
  snprintf(what, sizeof what, "the outer step of fragment %d round %lld failed%s: %s", w->fragment + 1,
           (long long)w->round, corrupt ? " repeatedly" : "", w->err);
  pause_fragment(c, j, w->fragment, what);
}

/* A sync version's momentum is stored after the version's commit, on the thread pool: the
 * round's window (last delta in -> every worker holding the new parameters) then waits for
 * θ_{t+1} alone, and on an S3 store the momentum's bytes are sent only now (BLOB_WRITE_LATER),
 * leaving the store's bandwidth to θ_{t+1} until then. A crash or a failed write before it is
 * stored loses nothing: the version's inputs (θ_t, u_t, the round's deltas) stay until the next
 * round closes, and that round's outer step waits for COORD_MOMENTUM_STORED; the momentum is
 * made again from them (remake_momentum here, rounds_recompute_version at start-up). */
typedef struct {
  uv_work_t req;
  coord *c;
  int64_t job, version;
  int fragment, rc;
  blob_writer *w;
  char name[BLOB_NAME_MAX], err[512];
  double seconds;
  atomic_int hurry; /* set once the next round waits for it (hurry_momentum) */
} momentum_work;

static void momentum_run(uv_work_t *req) {
  momentum_work *m = req->data;
  double t0 = dpc_mono_s();
  m->rc = blob_writer_commit(m->w, NULL);
  m->w = NULL;
  if (m->rc < 0) snprintf(m->err, sizeof m->err, "%s", dpc_errmsg());
  m->seconds = dpc_mono_s() - t0;
}

static void momentum_after(uv_work_t *req, int status) {
  momentum_work *m = req->data;
  coord *c = m->c;
  coord_job *j = coord_job_get(c, m->job);
  if (status != 0 && m->w) { /* canceled before it ran */
    blob_writer_abort(m->w);
    m->rc = DPC_EIO;
    snprintf(m->err, sizeof m->err, "canceled");
  }
  if (m->rc < 0)
    DPC_ERROR("job %lld fragment %d version %lld: its momentum %s could not be stored: %s; it is made again from "
              "the version before it", (long long)m->job, m->fragment + 1, (long long)m->version, m->name, m->err);
  else
    DPC_DEBUG("job %lld fragment %d version %lld: momentum stored %.3f s after the version", (long long)m->job,
              m->fragment + 1, (long long)m->version, m->seconds);
  if (j && m->fragment < j->n_fragments) {
    j->momentum[m->fragment] = m->rc < 0 ? COORD_MOMENTUM_LOST : COORD_MOMENTUM_STORED;
    j->momentum_hurry[m->fragment] = NULL;
  }
  free(m);
  loop_work_done(c);
  if (!c->stopping) rounds_check(c);
}

/* Store w's momentum (its writer taken) now that its version is committed. */
static void momentum_store(coord *c, coord_job *j, outer_work *w) {
  momentum_work *m = calloc(1, sizeof *m);
  blob_writer *bw = w->momentum_w;
  w->momentum_w = NULL;
  if (j) j->momentum[w->fragment] = COORD_MOMENTUM_WRITING;
  TESTHOOK("outer-momentum");
  if (m) {
    *m = (momentum_work){.req.data = m, .c = c, .job = w->job, .version = w->new_version, .fragment = w->fragment,
                         .w = bw};
    snprintf(m->name, sizeof m->name, "%s", w->new_momentum);
    atomic_init(&m->hurry, 0);
    blob_writer_hurry_flag(bw, &m->hurry);
    if (loop_queue_work(c, &m->req, momentum_run, momentum_after) == 0) {
      if (j) j->momentum_hurry[w->fragment] = &m->hurry;
      return;
    }
    blob_writer_hurry_flag(bw, NULL); /* m goes: the commit below sends at full speed */
    free(m);
  }
  int rc = blob_writer_commit(bw, NULL); /* no memory or no thread pool: here */
  if (j) j->momentum[w->fragment] = rc < 0 ? COORD_MOMENTUM_LOST : COORD_MOMENTUM_STORED;
  if (rc < 0) DPC_ERROR("job %lld: momentum %s: %s; it is made again", (long long)w->job, w->new_momentum, dpc_errmsg());
}

static void outer_after(uv_work_t *req, int status) {
  outer_work *w = req->data;
  coord *c = w->c;
  coord_job *j = coord_job_get(c, w->job);
  if (j) j->outer_busy[w->fragment] = 0;
  if (status != 0 || w->rc < 0) {
    DPC_ERROR("job %lld fragment %d round %lld: outer step failed: %s; trying again in %d ms", (long long)w->job,
              w->fragment, (long long)w->round, status ? "canceled" : w->err, OUTER_RETRY_MS);
    if (j) {
      j->outer_retry_at[w->fragment] = dpc_wall_ms() + OUTER_RETRY_MS;
      outer_failed(c, j, w);
    }
    goto done;
  }
  if (j) j->outer_fails[w->fragment] = 0;
  store_outer_commit oc = {.job = w->job, .fragment = w->fragment, .round = w->round, .new_version = w->new_version,
                           .param_blob = w->new_param, .param_crc = w->param_crc, .momentum_blob = w->new_momentum,
                           .momentum_crc = w->momentum_crc, .applied = w->delta_ids, .n_applied = w->n,
                           .close_round = 1, .now_ms = dpc_wall_ms()};
  TESTHOOK("outer");
  int rc = store_commit_outer(c->st, &oc);
  if (rc < 0) {
    DPC_ERROR("job %lld fragment %d round %lld: cannot commit the outer step: %s; trying again in %d ms",
              (long long)w->job, w->fragment, (long long)w->round, dpc_errmsg(), OUTER_RETRY_MS);
    if (j) j->outer_retry_at[w->fragment] = dpc_wall_ms() + OUTER_RETRY_MS;
    goto done;
  }
  if (w->momentum_w) momentum_store(c, j, w);
  c->rounds_total++;
  c->outer_steps++;
  if (w->n > 0) coord_observe(c, HIST_ROUND_WAIT, (double)(w->last_at - w->first_at) / 1000.0);
  coord_observe(c, HIST_OUTER_STEP, w->seconds);
  for (int i = 0; i < w->n; i++) coord_observe(c, HIST_STALENESS, 0); /* a sync round's deltas: its own base */
  if (j) j->last_outer_s = w->seconds;
  double mean = record_round_loss(c, j, w);
  DPC_INFO("round %lld closed: job %lld fragment %d -> version %lld, %d deltas%s, mean loss %.4f, outer step %.3f s",
           (long long)w->round, (long long)w->job, w->fragment + 1, (long long)w->new_version, w->n,
           w->early ? " (quorum; the rest had no connected worker)"
           : w->short_reason == REVOKE_GRACE ? " (quorum grace)"
           : w->short_reason ? " (deadline)"
                             : "",
           mean,
           w->seconds);
  pcache_put_blob(c, w->job, w->fragment, w->new_version, w->new_param, w->len, w->param_crc);
  if (j && w->new_version < j->spec.rounds && w->n > 0) { /* the next round's pulls end its overhead */
    j->ov_version[w->fragment] = w->new_version;
    j->ov_from_ms[w->fragment] = w->last_at;
    j->ov_pulled[w->fragment] = 0;
  }
  if (j && w->short_reason) skip_missing_slots(c, j, w->fragment, w->round, w->short_reason, w->early);
  gc_fragment(c, w->job, w->fragment, w->round);
  if (j) check_job_done(c, j);
done:
  outer_work_free(w);
  loop_work_done(c);
  if (!c->stopping) rounds_check(c);
}

/* The outer step of round fr->version of (j, f) over ds[0..n); NULL when out of memory. */
static outer_work *outer_work_new(coord *c, const coord_job *j, int f, const store_fragment *fr, const store_delta *ds,
                                  int n, int short_reason, int early) {
  outer_work *w = calloc(1, sizeof *w);
  if (!w || !(w->delta_blobs = calloc((size_t)n, sizeof *w->delta_blobs)) ||
      !(w->weights = calloc((size_t)n, sizeof *w->weights)) ||
      !(w->delta_ids = calloc((size_t)n, sizeof *w->delta_ids)) ||
      !(w->delta_crcs = calloc((size_t)n, sizeof *w->delta_crcs))) {
    if (w) outer_work_free(w);
    return NULL;
  }
  int64_t t = fr->version;
  w->c = c;
  w->job = j->id;
  w->fragment = f;
  w->round = t;
  w->new_version = t + 1;
  w->len = fr->len;
  w->n = n;
  w->short_reason = short_reason;
  w->early = early;
  w->codec = j->spec.streaming.codec;
  w->block_floats = (uint32_t)j->spec.streaming.block_floats;
  w->first_at = INT64_MAX;
  w->last_at = INT64_MIN;
  for (int i = 0; i < n; i++) {
    if (ds[i].received_at < w->first_at) w->first_at = ds[i].received_at;
    if (ds[i].received_at > w->last_at) w->last_at = ds[i].received_at;
    snprintf(w->delta_blobs[i], BLOB_NAME_MAX, "%s", ds[i].blob);
    w->weights[i] = coord_job_delta_weight(j, ds[i].tokens);
    w->delta_ids[i] = ds[i].id;
    w->delta_crcs[i] = ds[i].checksum;
  }
  snprintf(w->param_blob, sizeof w->param_blob, "%s", fr->param_blob);
  snprintf(w->momentum_blob, sizeof w->momentum_blob, "%s", fr->momentum_blob);
  blob_id pid = {.job = j->id, .fragment = f, .version = t + 1, .kind = BLOB_PARAMS};
  blob_id mid = {.job = j->id, .fragment = f, .version = t + 1, .kind = BLOB_MOMENTUM};
  blob_name(&pid, w->new_param, sizeof w->new_param);
  blob_name(&mid, w->new_momentum, sizeof w->new_momentum);
  w->lr = (float)j->spec.outer.lr;
  /* Step t makes version t + 1; under the momentum schedule its momentum depends on t
   * (replayed the same way by workers, worker/replay.c). */
  w->mu = outer_momentum_at((float)j->spec.outer.momentum, (long)t, j->spec.rounds, j->spec.outer.momentum_warmup,
                            j->spec.outer.momentum_decay);
  w->nesterov = j->spec.outer.nesterov;
  if (j->spec.sparse.enabled) {
    w->sp_cfg = j->sp_cfg;
    w->sp_nt = j->sp_nt[f];
    if (!(w->sp_tlen = malloc((size_t)w->sp_nt * sizeof *w->sp_tlen))) {
      outer_work_free(w);
      return NULL;
    }
    memcpy(w->sp_tlen, j->sp_tlen + j->sp_first[f], (size_t)w->sp_nt * sizeof *w->sp_tlen);
  }
  w->req.data = w;
  return w;
}

static void remake_momentum(coord *c, coord_job *j, int f);

/* While (j, f)'s newest momentum is being stored in the background: once the next round could
 * close (its outer step waits for that momentum), or when there is none (the job's end waits
 * for it), send the rest at full speed. */
static void hurry_momentum(coord *c, coord_job *j, int f, int64_t now) {
  atomic_int *flag = j->momentum_hurry[f];
  if (j->momentum[f] != COORD_MOMENTUM_WRITING || !flag || atomic_load(flag)) return;
  store_fragment fr;
  store_delta *ds = NULL;
  int n, short_reason, early;
  if (store_get_fragment(c->st, j->id, f, &fr) < 0 ||
      (fr.version < j->spec.rounds &&
       rounds_closing_deltas(c, j, f, fr.version, now, &ds, &n, &short_reason, &early) < 0))
    return;
  free(ds);
  atomic_store(flag, 1);
  DPC_DEBUG("job %lld fragment %d: round %lld can close; version %lld's momentum is sent at full speed",
            (long long)j->id, f + 1, (long long)fr.version, (long long)fr.version);
}

/* Start the outer step of (j, f) for its open round if it is complete. */
static void check_fragment(coord *c, coord_job *j, int f, int64_t now) {
  if (j->outer_busy[f] || now < j->outer_retry_at[f]) return;
  if (j->momentum[f] == COORD_MOMENTUM_LOST) remake_momentum(c, j, f);
  if (j->momentum[f] != COORD_MOMENTUM_STORED) { /* the step reads it */
    hurry_momentum(c, j, f, now);
    return;
  }
  store_fragment fr;
  if (store_get_fragment(c->st, j->id, f, &fr) < 0) return;
  if (fr.version >= j->spec.rounds) return;
  store_delta *ds;
  int n, short_reason, early;
  if (rounds_closing_deltas(c, j, f, fr.version, now, &ds, &n, &short_reason, &early) < 0) return;
  outer_work *w = outer_work_new(c, j, f, &fr, ds, n, short_reason, early);
  free(ds);
  if (!w) {
    DPC_ERROR("out of memory starting an outer step");
    return;
  }
  j->outer_busy[f] = 1;
  if (loop_queue_work(c, &w->req, outer_run, outer_after) < 0) {
    j->outer_busy[f] = 0;
    outer_work_free(w);
  }
}

/* *out: the outer step that makes cur (fragment f of sync job j) again, from the version
 * before it and the deltas its round applied, its blobs stored before it answers; or a DPC_E*
 * code with dpc_errmsg saying why it cannot be made again. */
static int remake_work(coord *c, const coord_job *j, int f, const store_fragment *cur, outer_work **out) {
  *out = NULL;
  if (j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC)
    return dpc_err(DPC_EUNSUPPORTED, "an async job's versions are not made again");
  if (cur->version < 1) return dpc_err(DPC_ENOENT, "version 0 comes from the job's creation, not from an outer step");
  store_fragment prev;
  store_delta *ds = NULL;
  int n = 0, rc = store_get_version(c->st, j->id, f, cur->version - 1, &prev);
  if (rc < 0) return dpc_err(rc, "cannot make it again: version %lld: %s", (long long)cur->version - 1, dpc_errmsg());
  if ((rc = store_list_deltas(c->st, j->id, f, cur->version - 1, DELTA_APPLIED, &ds, &n)) < 0) return rc;
  for (int i = 0; i < n && rc == 0; i++)
    if (!ds[i].blob[0] || ds[i].applied_version != cur->version)
      rc = dpc_err(DPC_ENOENT, "cannot make it again: delta %lld of round %lld is collected", (long long)ds[i].id,
                   (long long)cur->version - 1);
  if (rc == 0 && n == 0)
    rc = dpc_err(DPC_ENOENT, "cannot make it again: round %lld's deltas are not kept", (long long)cur->version - 1);
  outer_work *w = rc == 0 ? outer_work_new(c, j, f, &prev, ds, n, 0, 0) : NULL;
  free(ds);
  if (rc < 0) return rc;
  if (!w) return dpc_err(DPC_ENOMEM, "out of memory");
  if (strcmp(w->new_param, cur->param_blob) != 0 || strcmp(w->new_momentum, cur->momentum_blob) != 0) {
    outer_work_free(w);
    return dpc_err(DPC_ESTATE, "cannot make it again: its blobs are not named as an outer step names them");
  }
  w->remake = 1;
  *out = w;
  return 0;
}

/* After remake_work's step ran: 0 when it has the checksums cur's row recorded (logged with
 * `how`), else a DPC_E* code with w->err saying why. */
static int remake_result(outer_work *w, uint32_t param_crc, uint32_t momentum_crc, const char *how) {
  if (w->rc < 0) return w->rc;
  if (w->param_crc != param_crc || w->momentum_crc != momentum_crc) {
    snprintf(w->err, sizeof w->err, "made again, it has checksums 0x%08x/0x%08x, its row recorded 0x%08x/0x%08x",
             w->param_crc, w->momentum_crc, param_crc, momentum_crc);
    return w->rc = DPC_ECHECKSUM;
  }
  DPC_INFO("%sjob %lld fragment %d version %lld made again from version %lld and its %d deltas in %.2f s", how,
           (long long)w->job, w->fragment + 1, (long long)w->new_version, (long long)w->round, w->n, w->seconds);
  return 0;
}

int rounds_recompute_version(coord *c, coord_job *j, int f, const store_fragment *cur) {
  outer_work *w;
  int rc = remake_work(c, j, f, cur, &w);
  if (rc < 0) return rc;
  outer_run(&w->req);
  rc = remake_result(w, cur->param_crc, cur->momentum_crc, "recovery: ");
  if (rc < 0) rc = dpc_err(rc, "making it again failed: %s", w->err);
  outer_work_free(w);
  return rc;
}

/* A momentum that failed to be stored (momentum_after) is made again on the thread pool: its
 * version's outer step once more, both blobs stored, the checksums checked against the row. */
static void remake_after(uv_work_t *req, int status) {
  outer_work *w = req->data;
  coord *c = w->c;
  coord_job *j = coord_job_get(c, w->job);
  if (status != 0 && w->rc == 0) {
    w->rc = DPC_EIO;
    snprintf(w->err, sizeof w->err, "canceled");
  }
  uint32_t pc = w->param_crc, mc = w->momentum_crc;
  store_fragment cur;
  if (w->rc == 0 && store_get_version(c->st, w->job, w->fragment, w->new_version, &cur) == 0) {
    pc = cur.param_crc;
    mc = cur.momentum_crc;
  }
  int rc = remake_result(w, pc, mc, "");
  if (j && w->fragment < j->n_fragments) {
    j->momentum[w->fragment] = rc < 0 ? COORD_MOMENTUM_LOST : COORD_MOMENTUM_STORED;
    if (rc < 0) {
      DPC_ERROR("job %lld fragment %d: making version %lld's momentum again failed: %s; trying again in %d ms",
                (long long)w->job, w->fragment + 1, (long long)w->new_version, w->err, OUTER_RETRY_MS);
      j->outer_retry_at[w->fragment] = dpc_wall_ms() + OUTER_RETRY_MS;
      outer_failed(c, j, w);
    } else {
      j->outer_fails[w->fragment] = 0;
    }
  }
  outer_work_free(w);
  loop_work_done(c);
  if (!c->stopping) rounds_check(c);
}

static void remake_momentum(coord *c, coord_job *j, int f) {
  store_fragment cur;
  if (store_get_fragment(c->st, j->id, f, &cur) < 0) return;
  outer_work *w;
  if (remake_work(c, j, f, &cur, &w) < 0) {
    char what[640];
    snprintf(what, sizeof what, "version %lld's momentum could not be stored, nor made again: %s",
             (long long)cur.version, dpc_errmsg());
    pause_fragment(c, j, f, what);
    return;
  }
  j->momentum[f] = COORD_MOMENTUM_REMAKING;
  if (loop_queue_work(c, &w->req, outer_run, remake_after) < 0) {
    j->momentum[f] = COORD_MOMENTUM_LOST;
    outer_work_free(w);
  }
}

/* ---- async apply ---------------------------------------------------------------------------- */

typedef struct {
  uv_work_t req;
  coord *c;
  int64_t job;
  int fragment;
  store_delta d;          /* the delta being applied */
  int64_t new_version, staleness;
  size_t len;
  jobspec_async_rule rule;
  int N;
  double cc;
  float lr, mu;
  int64_t dn_t;           /* in: before; out: after */
  char param_blob[BLOB_NAME_MAX], momentum_blob[BLOB_NAME_MAX], dnbuf_blob[BLOB_NAME_MAX];
  char new_param[BLOB_NAME_MAX], new_momentum[BLOB_NAME_MAX], new_dnbuf[BLOB_NAME_MAX];
  /* results */
  int rc;
  char err[512];
  uint32_t param_crc, momentum_crc, dnbuf_crc;
  double seconds;
} async_work;

static void async_run(uv_work_t *req) {
  async_work *w = req->data;
  double t0 = dpc_mono_s();
  outerio_async a = {.bs = w->c->bs, .len = w->len, .param_blob = w->param_blob, .momentum_blob = w->momentum_blob,
                     .dnbuf_blob = w->dnbuf_blob, .delta_blob = w->d.blob, .delta_crc = w->d.checksum, .N = w->N,
                     .c = w->cc, .dn_t = w->dn_t, .lr = w->lr, .mu = w->mu, .new_param = w->new_param,
                     .new_momentum = w->new_momentum, .new_dnbuf = w->new_dnbuf,
                     .rule = w->rule == OUTER_ASYNC_DN ? OUTERIO_DN
                             : w->rule == OUTER_ASYNC_NESTEROV ? OUTERIO_NESTEROV : OUTERIO_SGD};
  int rc = outerio_async_step(&a, &w->param_crc, &w->momentum_crc, &w->dnbuf_crc, &w->dn_t);
  if (rc < 0) snprintf(w->err, sizeof w->err, "%s", dpc_errmsg());
  w->rc = rc;
  w->seconds = dpc_mono_s() - t0;
}

/* The counters of an applied delta (/metrics and the job's loss). */
static void async_account(coord *c, coord_job *j, const async_work *w) {
  c->outer_steps++;
  coord_observe(c, HIST_OUTER_STEP, w->seconds);
  coord_observe(c, HIST_STALENESS, (double)w->staleness);
  if (!j) return;
  if (w->d.path < j->n_paths && isfinite(j->path_loss[w->d.path])) j->last_loss = j->path_loss[w->d.path];
  j->async_applied++;
  j->stale_last = w->staleness;
  if (w->staleness > j->stale_max) j->stale_max = w->staleness;
  j->stale_sum += (double)w->staleness;
}

/* Parameter versions past the newest 2·slots + 2 go, except version 0. */
static void async_gc(coord *c, const coord_job *j, const async_work *w) {
  char **names = NULL;
  int n = 0;
  int keep = j ? 2 * j->n_slots + 2 : 2;
  /* keep_every = 2^30 keeps version 0 (multiples of it), the ledger's starting point. */
  if (store_gc_versions(c->st, w->job, w->fragment, keep, 1 << 30, &names, &n) == 0) {
    if (n > 0) TESTHOOK("gc");
    gc_delete_files(c, names, n, NULL);
  }
}

static void async_after(uv_work_t *req, int status) {
  async_work *w = req->data;
  coord *c = w->c;
  coord_job *j = coord_job_get(c, w->job);
  if (j) j->outer_busy[w->fragment] = 0;
  if (status != 0 || w->rc < 0) {
    DPC_ERROR("job %lld fragment %d: applying delta %lld failed: %s", (long long)w->job, w->fragment + 1,
              (long long)w->d.id, status ? "canceled" : w->err);
    if (j) j->outer_retry_at[w->fragment] = dpc_wall_ms() + OUTER_RETRY_MS;
    /* Nothing a retry can fix (a non-finite result, a corrupt or malformed delta): pause with
     * the reason, as outer_failed does for sync jobs; `job resume` tries the delta again. */
    if (j && (w->rc == DPC_ENUMERIC || w->rc == DPC_ESHAPE || w->rc == DPC_ECHECKSUM || w->rc == DPC_EFORMAT)) {
      char what[640];
      snprintf(what, sizeof what, "applying delta %lld to fragment %d failed: %s", (long long)w->d.id,
               w->fragment + 1, w->err);
      pause_fragment(c, j, w->fragment, what);
    }
    goto done;
  }
  int dn = w->rule == OUTER_ASYNC_DN, mom = w->rule != OUTER_ASYNC_SGD;
  store_outer_commit oc = {.job = w->job, .fragment = w->fragment, .round = w->d.round, .new_version = w->new_version,
                           .param_blob = w->new_param, .param_crc = w->param_crc,
                           .momentum_blob = mom ? w->new_momentum : NULL, .momentum_crc = w->momentum_crc,
                           .dnbuf_blob = dn ? w->new_dnbuf : NULL, .dnbuf_crc = w->dnbuf_crc, .dn_t = w->dn_t,
                           .applied = &w->d.id, .n_applied = 1, .close_round = 0, .now_ms = dpc_wall_ms()};
  TESTHOOK("outer");
  int rc = store_commit_outer(c->st, &oc);
  if (rc < 0) {
    DPC_ERROR("job %lld fragment %d: cannot commit delta %lld: %s", (long long)w->job, w->fragment + 1,
              (long long)w->d.id, dpc_errmsg());
    if (j) j->outer_retry_at[w->fragment] = dpc_wall_ms() + OUTER_RETRY_MS;
    goto done;
  }
  async_account(c, j, w);
  DPC_INFO("delta applied: job %lld fragment %d lease %lld slot (path %d, replica %d) base %lld -> version %lld, "
           "staleness %lld, %s, %.3f s", (long long)w->job, w->fragment + 1, (long long)w->d.lease, w->d.path,
           w->d.replica, (long long)w->d.base_version, (long long)w->new_version, (long long)w->staleness,
           w->rule == OUTER_ASYNC_DN ? "delayed-nesterov" : w->rule == OUTER_ASYNC_NESTEROV ? "nesterov" : "sgd",
           w->seconds);
  pcache_put_blob(c, w->job, w->fragment, w->new_version, w->new_param, w->len, w->param_crc);
  async_gc(c, j, w);
done:
  free(w);
  loop_work_done(c);
  if (!c->stopping) rounds_check(c);
}

/* Start applying the oldest pending delta of (j, f), dropping too-stale ones first. */
static void async_check_fragment(coord *c, coord_job *j, int f) {
  if (j->outer_busy[f] || dpc_wall_ms() < j->outer_retry_at[f]) return;
  store_fragment fr;
  store_delta d;
  for (;;) {
    if (store_get_fragment(c->st, j->id, f, &fr) < 0) return;
    int have = store_next_pending_delta(c->st, j->id, f, &d);
    if (have <= 0) return;
    int64_t stale = fr.version - d.base_version;
    if (j->spec.max_staleness > 0 && stale > j->spec.max_staleness) {
      DPC_WARN("delta %lld of lease %lld dropped: staleness %lld exceeds max_staleness %d", (long long)d.id,
               (long long)d.lease, (long long)stale, j->spec.max_staleness);
      if (store_drop_delta(c->st, d.id) < 0) return;
      j->async_dropped++;
      continue;
    }
    break;
  }
  async_work *w = calloc(1, sizeof *w);
  if (!w) {
    DPC_ERROR("out of memory starting an async outer step");
    return;
  }
  w->c = c;
  w->job = j->id;
  w->fragment = f;
  w->d = d;
  w->new_version = fr.version + 1;
  w->staleness = fr.version - d.base_version;
  w->len = fr.len;
  w->rule = j->spec.outer.async_rule;
  w->N = j->spec.outer.buffer > 0 ? j->spec.outer.buffer : j->n_slots;
  w->cc = j->spec.outer.c;
  if (w->cc > 1.0 / w->N) w->cc = 1.0 / w->N; /* c ∈ [0, 1/N] with the default N */
  w->lr = (float)j->spec.outer.lr;
  w->mu = (float)j->spec.outer.momentum;
  w->dn_t = fr.dn_t;
  snprintf(w->param_blob, sizeof w->param_blob, "%s", fr.param_blob);
  snprintf(w->momentum_blob, sizeof w->momentum_blob, "%s", fr.momentum_blob);
  snprintf(w->dnbuf_blob, sizeof w->dnbuf_blob, "%s", fr.dnbuf_blob);
  blob_id pid = {.job = j->id, .fragment = f, .version = w->new_version, .kind = BLOB_PARAMS};
  blob_id mid = {.job = j->id, .fragment = f, .version = w->new_version, .kind = BLOB_MOMENTUM};
  blob_id bid = {.job = j->id, .fragment = f, .version = w->new_version, .kind = BLOB_DN_BUF};
  blob_name(&pid, w->new_param, sizeof w->new_param);
  blob_name(&mid, w->new_momentum, sizeof w->new_momentum);
  blob_name(&bid, w->new_dnbuf, sizeof w->new_dnbuf);
  w->req.data = w;
  j->outer_busy[f] = 1;
  if (loop_queue_work(c, &w->req, async_run, async_after) < 0) {
    j->outer_busy[f] = 0;
    free(w);
  }
}

/* Apply what is pending; finish the job once its budget is trained and nothing is left. */
static void async_check_job(coord *c, coord_job *j) {
  int busy = 0;
  for (int f = 0; f < j->n_fragments; f++) {
    async_check_fragment(c, j, f);
    busy |= j->outer_busy[f];
  }
  if (busy || j->state != JOB_RUNNING) return;
  store_slot *slots;
  int ns;
  store_lease *act;
  int na;
  if (store_list_slots(c->st, j->id, &slots, &ns) < 0) return;
  if (store_list_active_leases(c->st, j->id, &act, &na) < 0) {
    free(slots);
    return;
  }
  int64_t left = lease_async_budget_left(j, slots, ns, act, na);
  free(slots);
  free(act);
  if (left > 0 || na > 0) return;
  for (int f = 0; f < j->n_fragments; f++) {
    store_delta d;
    if (store_next_pending_delta(c->st, j->id, f, &d) != 0) return;
  }
  coord_job_set_state(c, j, JOB_FINISHED, NULL);
}

void rounds_check(coord *c) {
  if (c->stopping) {
    lease_retry_parked(c, 1);
    return;
  }
  if (blobwatch_down(c, NULL, 0, NULL)) return; /* nothing can be read or written: rounds wait */
  int64_t now = dpc_wall_ms();
  for (int ji = 0; ji < c->n_jobs; ji++) {
    coord_job *j = c->jobs[ji];
    if (j->state != JOB_RUNNING && j->state != JOB_PAUSED) continue;
    if (j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC) {
      async_check_job(c, j);
      continue;
    }
    for (int f = 0; f < j->n_fragments; f++) check_fragment(c, j, f, now);
    check_job_done(c, j);
  }
  lease_retry_parked(c, 0);
}

void rounds_note_pull(coord *c, int64_t job, int fragment, int64_t version) {
  coord_job *j = coord_job_get(c, job);
  if (!j || j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC || fragment < 0 || fragment >= j->n_fragments ||
      j->ov_version[fragment] != version || version == 0 || j->ov_pulled[fragment] < 0)
    return;
  if (++j->ov_pulled[fragment] < j->expected[fragment]) return;
  j->ov_pulled[fragment] = -1; /* counted once */
  double s = (double)(dpc_wall_ms() - j->ov_from_ms[fragment]) / 1000.0;
  coord_observe(c, HIST_ROUND_OVERHEAD, s);
  j->last_overhead_s = s;
  DPC_INFO("round overhead: job %lld fragment %d version %lld: %.3f s from the last delta of round %lld to every "
           "slot holding the new version", (long long)job, fragment + 1, (long long)version, s, (long long)version - 1);
}

void rounds_tick(coord *c) {
  if (c->stopping) return;
  blobwatch_tick(c);
  lease_expire(c);
  lease_answer_watches(c, 0);
  rounds_check(c);
}
