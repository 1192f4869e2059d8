/* jobs.c — the loop's cache of jobs (coord_job: the parsed spec and its derived structure,
 * written through to the store on state changes) and the heartbeat notes of active leases. */
#include "coordinator/jobs.h"

#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "coordinator/blobs.h"
#include "coordinator/loop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- jobs ----------------------------------------------------------------------------------- */

void coord_job_free(coord_job *j) {
  if (!j) return;
  free(j->modules);
  free(j->fragments);
  free(j->outer_busy);
  free(j->momentum);
  free(j->momentum_hurry);
  free(j->outer_retry_at);
  free(j->outer_fails);
  free(j->ov_version);
  free(j->ov_from_ms);
  free(j->ov_pulled);
  free(j->expected);
  free(j->path_loss);
  free(j->screen);
  free(j->sp_tlen);
  free(j->sp_first);
  free(j->sp_nt);
  free(j->sp_bytes);
  free(j);
}

/* A sparse job's per-fragment tensor lengths and stream sizes (coord_job.sp_*). */
static int sparse_layout(coord_job *j, const gpt_layout *lay) {
  j->sp_cfg = (dpc_sparse_cfg){.density = j->spec.sparse.density, .chunk = (uint32_t)j->spec.sparse.chunk,
                               .value_bits = (uint32_t)j->spec.sparse.value_bits};
  /* (DiPaCo: modules of one level cover the same tensors, so count them fragment by fragment) */
  size_t total = 0;
  for (int f = 0; f < j->n_fragments; f++) {
    int n = gpt_layout_range_tensors(lay, j->fragments[f].offset, j->fragments[f].len, NULL, 0);
    if (n < 0) return n;
    total += (size_t)n;
  }
  j->sp_tlen = calloc(total ? total : 1, sizeof *j->sp_tlen);
  j->sp_first = calloc((size_t)j->n_fragments, sizeof *j->sp_first);
  j->sp_nt = calloc((size_t)j->n_fragments, sizeof *j->sp_nt);
  j->sp_bytes = calloc((size_t)j->n_fragments, sizeof *j->sp_bytes);
  if (!j->sp_tlen || !j->sp_first || !j->sp_nt || !j->sp_bytes)
    return dpc_err(DPC_ENOMEM, "out of memory loading job %lld", (long long)j->id);
  int at = 0, rc;
  for (int f = 0; f < j->n_fragments; f++) {
    const jobspec_fragment *jf = &j->fragments[f];
    int n = gpt_layout_range_tensors(lay, jf->offset, jf->len, j->sp_tlen + at, (int)total - at);
    if (n < 0) return n;
    if (at + n > (int)total) return dpc_err(DPC_EINTERNAL, "job %lld: fragment tensor count changed", (long long)j->id);
    j->sp_first[f] = at;
    j->sp_nt[f] = n;
    if ((rc = dpc_sparse_bytes(&j->sp_cfg, j->sp_tlen + at, n, &j->sp_bytes[f], NULL)) < 0) return rc;
    at += n;
  }
  return 0;
}

int coord_job_from_store(const store_job *sj, coord_job **out) {
  coord_job *j = calloc(1, sizeof *j);
  gpt_layout *lay = malloc(sizeof *lay);
  int rc = 0;
  if (!j || !lay) {
    rc = dpc_err(DPC_ENOMEM, "out of memory loading job %lld", (long long)sj->id);
    goto fail;
  }
  j->id = sj->id;
  j->state = sj->state;
  if ((rc = jobspec_parse_stored(sj->spec_json, strlen(sj->spec_json), &j->spec)) < 0) goto fail;
  if ((rc = jobspec_layout(&j->spec, lay)) < 0) goto fail;
  j->n_modules = jobspec_modules(&j->spec, lay, NULL, 0);
  j->n_fragments = jobspec_fragments(&j->spec, lay, NULL, 0);
  j->n_paths = jobspec_n_paths(&j->spec);
  if (j->n_modules < 1 || j->n_fragments < 1 || j->n_paths < 1) {
    rc = dpc_err(DPC_EINVAL, "job %lld: spec gives no modules or fragments", (long long)sj->id);
    goto fail;
  }
  j->modules = calloc((size_t)j->n_modules, sizeof *j->modules);
  j->fragments = calloc((size_t)j->n_fragments, sizeof *j->fragments);
  j->outer_busy = calloc((size_t)j->n_fragments, sizeof *j->outer_busy);
  j->momentum = calloc((size_t)j->n_fragments, sizeof *j->momentum);
  j->momentum_hurry = calloc((size_t)j->n_fragments, sizeof *j->momentum_hurry);
  j->outer_retry_at = calloc((size_t)j->n_fragments, sizeof *j->outer_retry_at);
  j->outer_fails = calloc((size_t)j->n_fragments, sizeof *j->outer_fails);
  j->expected = calloc((size_t)j->n_fragments, sizeof *j->expected);
  j->ov_version = calloc((size_t)j->n_fragments, sizeof *j->ov_version);
  j->ov_from_ms = calloc((size_t)j->n_fragments, sizeof *j->ov_from_ms);
  j->ov_pulled = calloc((size_t)j->n_fragments, sizeof *j->ov_pulled);
  j->path_loss = calloc((size_t)j->n_paths, sizeof *j->path_loss);
  if (!j->modules || !j->fragments || !j->outer_busy || !j->momentum || !j->momentum_hurry || !j->outer_retry_at ||
      !j->outer_fails || !j->expected || !j->path_loss || !j->ov_version || !j->ov_from_ms || !j->ov_pulled) {
    rc = dpc_err(DPC_ENOMEM, "out of memory loading job %lld", (long long)sj->id);
    goto fail;
  }
  jobspec_modules(&j->spec, lay, j->modules, j->n_modules);
  jobspec_fragments(&j->spec, lay, j->fragments, j->n_fragments);
  if (j->spec.sparse.enabled && (rc = sparse_layout(j, lay)) < 0) goto fail;
  for (int p = 0; p < j->n_paths; p++) j->path_loss[p] = NAN;
  j->last_loss = NAN;
  j->n_slots = j->n_paths * j->spec.replicas;
  for (int f = 0; f < j->n_fragments; f++) {
    int n = 0;
    for (int p = 0; p < j->n_paths; p++) n += jobspec_path_has_module(&j->spec, p, j->fragments[f].module);
    j->expected[f] = n * j->spec.replicas;
  }
  free(lay);
  *out = j;
  return 0;
fail:
  free(lay);
  coord_job_free(j);
  return rc;
}

coord_job *coord_job_get(coord *c, int64_t id) {
  for (int i = 0; i < c->n_jobs; i++)
    if (c->jobs[i]->id == id) return c->jobs[i];
  return NULL;
}

int coord_job_add(coord *c, coord_job *j) {
  if (c->n_jobs == c->cap_jobs) {
    int cap = c->cap_jobs ? c->cap_jobs * 2 : 8;
    coord_job **a = realloc(c->jobs, (size_t)cap * sizeof *a);
    if (!a) return dpc_err(DPC_ENOMEM, "out of memory");
    c->jobs = a;
    c->cap_jobs = cap;
  }
  c->jobs[c->n_jobs++] = j;
  return 0;
}

int coord_jobs_load(coord *c) {
  store_job *jobs;
  int n;
  int rc = store_list_jobs(c->st, &jobs, &n);
  if (rc < 0) return rc;
  for (int i = 0; i < n && rc == 0; i++) {
    coord_job *j;
    if ((rc = coord_job_from_store(&jobs[i], &j)) < 0) break;
    if ((rc = coord_job_add(c, j)) < 0) coord_job_free(j);
  }
  store_jobs_free(jobs, n);
  return rc;
}

void coord_jobs_free(coord *c) {
  for (int i = 0; i < c->n_jobs; i++) coord_job_free(c->jobs[i]);
  free(c->jobs);
  c->jobs = NULL;
  c->n_jobs = c->cap_jobs = 0;
}

int coord_job_set_state(coord *c, coord_job *j, store_job_state s, const char *why) {
  int rc = store_set_job_state(c->st, j->id, s, why, dpc_wall_ms());
  if (rc < 0) return rc;
  DPC_INFO("job %lld: %s -> %s%s%s", (long long)j->id, store_job_state_name(j->state), store_job_state_name(s),
           why ? ": " : "", why ? why : "");
  j->state = s;
  if (s == JOB_RUNNING) /* resumed: outer steps held back by a pause may run again */
    for (int f = 0; f < j->n_fragments; f++) j->outer_retry_at[f] = 0;
  return 0;
}

int coord_job_path_has_fragment(const coord_job *j, int path, int fragment) {
  return jobspec_path_has_module(&j->spec, path, j->fragments[fragment].module);
}

/* ---- lease notes ---------------------------------------------------------------------------- */

lease_note *coord_note(coord *c, int64_t lease, int create) {
  for (int i = 0; i < c->n_notes; i++)
    if (c->notes[i].lease == lease) return &c->notes[i];
  if (!create) return NULL;
  if (c->n_notes == c->cap_notes) {
    int cap = c->cap_notes ? c->cap_notes * 2 : 16;
    lease_note *a = realloc(c->notes, (size_t)cap * sizeof *a);
    if (!a) return NULL;
    c->notes = a;
    c->cap_notes = cap;
  }
  lease_note *n = &c->notes[c->n_notes++];
  n->lease = lease;
  n->loss = NAN;
  n->tokens = 0;
  n->bytes_out = 0;
  n->pull_done_s = 0;
  n->hb_at = 0;
  return n;
}

void coord_note_drop(coord *c, int64_t lease) {
  for (int i = 0; i < c->n_notes; i++)
    if (c->notes[i].lease == lease) {
      c->notes[i] = c->notes[--c->n_notes];
      return;
    }
}

void coord_notes_free(coord *c) {
  free(c->notes);
  c->notes = NULL;
  c->n_notes = c->cap_notes = 0;
}

int coord_job_keeps_sent(const coord_job *j) { return j->spec.algorithm != JOB_ALGO_DILOCO_ASYNC; }

int coord_job_partial_ok(const coord_job *j) {
  if (j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC) return 1;
  return j->spec.weighting == WEIGHTING_TOKENS && !jobspec_streaming(&j->spec);
}

double coord_job_delta_weight(const coord_job *j, int64_t tokens) {
  return j->spec.weighting == WEIGHTING_TOKENS ? (double)tokens : 1.0;
}

/* ---- blob-cache buffers made ahead ---------------------------------------------------------- */

typedef struct {
  uv_work_t req;
  coord *c;
  int64_t job;
  int n, made;
  size_t *len; /* [n] fragment lengths (floats) */
  int *count;  /* [n] buffers wanted of that length */
} prewarm_work;

static void prewarm_run(uv_work_t *req) {
  prewarm_work *w = req->data;
  for (int i = 0; i < w->n; i++) w->made += blob_store_prewarm(w->c->bs, w->len[i], w->count[i]);
}

static void prewarm_after(uv_work_t *req, int status) {
  (void)status;
  prewarm_work *w = req->data;
  if (w->made) DPC_INFO("job %lld: %d blob-cache buffers made ready", (long long)w->job, w->made);
  loop_work_done(w->c);
  free(w->len);
  free(w->count);
  free(w);
}

/* count more buffers of len floats (w->len and w->count hold two entries per fragment). */
static void prewarm_add(prewarm_work *w, size_t len, int count) {
  int k = 0;
  while (k < w->n && w->len[k] != len) k++;
  if (k == w->n) w->len[w->n++] = len;
  w->count[k] += count;
}

void coord_job_prewarm(coord *c, const coord_job *j) {
  if (!blob_store_is_s3(c->bs) || j->n_fragments <= 0) return;
  blobs_cache_stats st;
  blob_store_cache_stats(c->bs, &st);
  if (!st.cap) return;
  prewarm_work *w = calloc(1, sizeof *w);
  if (w) {
    w->len = calloc(2 * (size_t)j->n_fragments, sizeof *w->len);
    w->count = calloc(2 * (size_t)j->n_fragments, sizeof *w->count);
  }
  if (!w || !w->len || !w->count) goto fail;
  w->c = c;
  w->job = j->id;
  w->req.data = w;
  /* Buffers of one length share their count: per fragment, the deltas of a round (a sync
   * job's quantized ones are kept as sent, so their buffers are the encoded stream's length;
   * SparseLoCo's are short and not counted) plus θ and u of the version read and of the
   * version written. */
  const int codec = j->spec.streaming.codec;
  const int as_sent = codec != DPC_CODEC_FP32 && coord_job_keeps_sent(j);
  for (int f = 0; f < j->n_fragments; f++) {
    size_t enc = 0, dlen = j->fragments[f].len;
    if (as_sent && dpc_codec_bytes(codec, dlen, (uint32_t)j->spec.streaming.block_floats, &enc) == 0)
      dlen = (enc + 3) / 4;
    prewarm_add(w, j->fragments[f].len, 4);
    if (!j->spec.sparse.enabled) prewarm_add(w, dlen, j->expected[f]);
  }
  if (loop_queue_work(c, &w->req, prewarm_run, prewarm_after) == 0) return;
fail:
  if (w) {
    free(w->len);
    free(w->count);
  }
  free(w);
}
