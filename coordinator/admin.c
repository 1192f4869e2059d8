/* admin.c — the dipaco.v1.Admin RPC handlers (dipacoctl and any gRPC client): initial model
 * upload, job create/list/get/pause/resume/cancel, workers list/drain, paths, modules,
 * metrics history and path export. All run on the coordinator's loop thread.
 *
 * Choices (see also service.c's header):
 *  - CreateJob: CreateJobRequest.name, when set, replaces the spec's "name". A spec with
 *    model.init needs initial_upload_id (dipacoctl uploads DIR/model.safetensors and merges
 *    DIR/config.json's shape into the spec); the upload's tensors must match the shape. A
 *    spec without init is initialised with gpt_init_params(model.seed). The job starts
 *    RUNNING (PAUSED with start_paused). Job states map created → JOB_PENDING, finished →
 *    JOB_DONE, canceled → JOB_CANCELLED.
 *  - JobSummary.round = the smallest fragment version (= sync rounds closed).
 *  - Pause: no new leases; leases in flight finish their round. Resume: paused → running.
 *    Cancel: active leases of the job are released at once (heartbeats say STOP).
 *  - Uploads are kept as STATE/uploads/<id>.safetensors (ids count up from the largest file
 *    there, so they survive a restart); a job copies the weights into its blobs.
 *  - ExportPath: version 0 = latest; otherwise every fragment on the path at that version
 *    (NOT_FOUND once garbage-collected). config.json and model.safetensors are those that
 *    common/modeldir.c writes (deterministic: identical params → identical bytes).
 *  - GetMetrics names: "loss" (per slot, path set; path −1 = round mean), "tokens",
 *    "bytes_in" (delta bytes), "bytes_out" (parameter bytes the lease pulled), "outer_seconds"
 *    (path −1). Metric rows carry no step: step = round · H. Every job adds its delta
 *    ledger, one point per applied delta in applied order for each series: "staleness"
 *    (value = staleness), "ledger_lease" (value = lease id), "ledger_replica" (value = the
 *    slot's replica), each with round = the version the delta produced, step = its base
 *    version, path = the slot's path, fragment_id = the wire fragment id (dipacoctl job
 *    ledger prints them as a table). since_round applies to the produced version. A sync
 *    round's deltas all produce version round + 1 with staleness 0, in (path, replica) order
 *    (the rows outlive garbage collection, which drops only their blobs).
 *  - JobSummary.round for diloco-async: deltas applied (smallest fragment version) / slots.
 *  - Authentication: every Admin call needs metadata "authorization: Bearer <admin token>"
 *    (STATE/admin.token unless --admin-token-file; none with --insecure-no-auth). Missing or
 *    unknown token → UNAUTHENTICATED; a valid credential without admin rights (the join token,
 *    or a worker's id + session token) → PERMISSION_DENIED. */
#include "coordinator/coord.h"

#include "common/auth.h"
#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "kernels/modeldir.h"
#include "common/safetensors.h"
#include "proto/dipaco.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_REQ_BYTES (1u << 20)
#define MAX_UPLOAD_BYTES ((uint64_t)16 << 30)

static void sha256(const char *s, unsigned char out[DPC_TOKEN_HASH]) {
  unsigned int n = 0;
  EVP_Digest(s, strlen(s), out, &n, EVP_sha256(), NULL);
}

/* 1 if the call carries a valid worker identity (dipaco-worker-id + dipaco-session). */
static int is_worker_session(struct rpc_call *call) {
  char idbuf[32], tok[160];
  if (rpc_call_md(call, RPC_MD_WORKER_ID, idbuf, sizeof idbuf) < 0 ||
      rpc_call_md(call, RPC_MD_SESSION, tok, sizeof tok) < 0)
    return 0;
  char *end;
  long long id = strtoll(idbuf, &end, 10);
  store_worker w;
  if (*end || id <= 0 || store_get_worker(g_coord->st, id, &w) < 0) return 0;
  unsigned char h[DPC_TOKEN_HASH];
  sha256(tok, h);
  return dpc_ct_equal(h, w.token_hash, sizeof h);
}

/* The admin token check (see the header): 0 = allowed, -1 = the call was finished. */
static int admin_authorize(struct rpc_call *call) {
  const dpc_auth_keys *k = &dpc_coord_keys;
  if (!k->has_admin) return 0;
  char v[DPC_TOKEN_MAX + 32];
  const char *tok = rpc_call_md(call, RPC_MD_AUTHORIZATION, v, sizeof v) >= 0 ? dpc_bearer_token(v) : NULL;
  if (tok) {
    unsigned char h[DPC_TOKEN_HASH];
    sha256(tok, h);
    if (dpc_ct_equal(h, k->admin, sizeof h)) return 0;
    if (k->has_join && dpc_ct_equal(h, k->join, sizeof h)) {
      rpc_call_finish(call, RPC_PERMISSION_DENIED, "%s: the join token does not allow Admin calls; use the admin token",
                      rpc_call_method(call));
      return -1;
    }
  }
  if (is_worker_session(call)) {
    rpc_call_finish(call, RPC_PERMISSION_DENIED, "%s: a worker session may not call Admin methods",
                    rpc_call_method(call));
    return -1;
  }
  rpc_call_finish(call, RPC_UNAUTHENTICATED,
                  "%s: %s admin token; send \"authorization: Bearer TOKEN\" (dipacoctl --token-file "
                  "STATE/admin.token or $DIPACO_ADMIN_TOKEN)",
                  rpc_call_method(call), tok ? "wrong" : "missing");
  return -1;
}

static int unpack(struct rpc_call *call, const struct grpc_byte_buffer *req, const ProtobufCMessageDescriptor *d,
                  ProtobufCMessage **out) {
  if (g_coord->stopping) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
    return -1;
  }
  if (admin_authorize(call)) return -1;
  int rc = rpc_msg_unpack(req, d, MAX_REQ_BYTES, out);
  if (rc < 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "malformed %s: %s", d->name, dpc_errmsg());
    return -1;
  }
  return 0;
}

static Dipaco__V1__JobState job_state_wire(store_job_state s) {
  switch (s) {
  case JOB_CREATED: return DIPACO__V1__JOB_STATE__JOB_PENDING;
  case JOB_RUNNING: return DIPACO__V1__JOB_STATE__JOB_RUNNING;
  case JOB_PAUSED: return DIPACO__V1__JOB_STATE__JOB_PAUSED;
  case JOB_FINISHED: return DIPACO__V1__JOB_STATE__JOB_DONE;
  case JOB_CANCELED: return DIPACO__V1__JOB_STATE__JOB_CANCELLED;
  case JOB_FAILED: return DIPACO__V1__JOB_STATE__JOB_FAILED;
  }
  return DIPACO__V1__JOB_STATE__JOB_STATE_UNSPECIFIED;
}

static Dipaco__V1__Algorithm algo_wire(const jobspec *js) {
  if (js->algorithm != JOB_ALGO_DILOCO_ASYNC) return DIPACO__V1__ALGORITHM__ALGORITHM_SYNC;
  return js->outer.async_rule == OUTER_ASYNC_DN ? DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_DELAYED
                                                : DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_NESTEROV;
}

/* Fill a summary; strings point into sj (keep it alive until the reply is sent). */
static void fill_summary(coord *c, const store_job *sj, Dipaco__V1__JobSummary *s) {
  dipaco__v1__job_summary__init(s);
  coord_job *j = coord_job_get(c, sj->id);
  s->job_id = (uint64_t)sj->id;
  s->name = (char *)sj->name;
  s->state = job_state_wire(sj->state);
  s->created_unix_ms = sj->created_at;
  s->updated_unix_ms = sj->updated_at;
  if (!j) return;
  s->algorithm = algo_wire(&j->spec);
  s->rounds_total = (uint64_t)j->spec.rounds;
  s->paths = (uint32_t)j->n_paths;
  s->replicas = (uint32_t)j->spec.replicas;
  s->last_loss = j->last_loss;
  store_fragment *fr;
  int nf;
  if (store_list_fragments(c->st, sj->id, &fr, &nf) == 0) {
    int64_t mn = INT64_MAX;
    for (int i = 0; i < nf; i++)
      if (fr[i].version < mn) mn = fr[i].version;
    s->round = nf ? (uint64_t)mn : 0;
    if (j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC && j->n_slots > 0) s->round /= (uint64_t)j->n_slots;
    free(fr);
  }
  store_lease *ls;
  int nl;
  if (store_list_active_leases(c->st, sj->id, &ls, &nl) == 0) {
    s->active_leases = (uint32_t)nl;
    free(ls);
  }
}

static void reply_job(struct rpc_call *call, coord *c, int64_t id) {
  store_job sj;
  int rc = store_get_job(c->st, id, &sj);
  if (rc < 0) {
    rpc_call_finish(call, rc == DPC_ENOENT ? RPC_NOT_FOUND : rpc_code_from_dpc(rc), "job_id %lld: %s", (long long)id,
                    rc == DPC_ENOENT ? "no such job" : dpc_errmsg());
    return;
  }
  Dipaco__V1__JobSummary s;
  fill_summary(c, &sj, &s);
  Dipaco__V1__Job job = DIPACO__V1__JOB__INIT;
  job.summary = &s;
  job.spec_json = sj.spec_json;
  job.message = sj.error ? sj.error : "";
  rpc_call_reply(call, &job.base);
  store_job_clear(&sj);
}

/* ---- UploadInitialModel --------------------------------------------------------------------- */

/* The last step, the file's fsync and rename (seconds for a multi-GB model), runs on the
 * threadpool. Ownership: the call's data until on_done, except while that commit is in
 * flight, when on_done only marks it orphaned and upload_commit_after frees it. */
typedef struct {
  uv_work_t req;
  struct rpc_call *call;
  dpc_afile *f;
  uint64_t id, next, total;
  uint32_t crc;
  int started, finished;
  int committing, orphaned, commit_rc;
  char err[512];
  unsigned char *buf;
  size_t cap;
} upload;

static void upload_path(coord *c, uint64_t id, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/uploads/%llu.safetensors", c->state_dir, (unsigned long long)id);
}

static void upload_fail(struct rpc_call *call, upload *u, int code, const char *msg) {
  if (u->f) dpc_afile_abort(u->f);
  u->f = NULL;
  if (!u->finished) {
    u->finished = 1;
    rpc_call_finish(call, code, "%s", msg);
  }
}

static void upload_on_call(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  (void)ud;
  if (g_coord->stopping) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
    return;
  }
  if (admin_authorize(call)) return;
  upload *u = calloc(1, sizeof *u);
  if (!u) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  rpc_call_set_data(call, u);
}

static void upload_free(upload *u) {
  if (u->f) dpc_afile_abort(u->f);
  free(u->buf);
  free(u);
}

static void upload_commit_run(uv_work_t *req) {
  upload *u = req->data;
  u->commit_rc = dpc_afile_commit(u->f);
  u->f = NULL;
  if (u->commit_rc < 0) snprintf(u->err, sizeof u->err, "storing the upload failed: %s", dpc_errmsg());
}

static void upload_commit_after(uv_work_t *req, int status) {
  upload *u = req->data;
  coord *c = g_coord;
  u->committing = 0;
  if (status != 0 && u->commit_rc == 0) {
    u->commit_rc = DPC_ECANCELED;
    snprintf(u->err, sizeof u->err, "storing the upload was canceled (coordinator shutting down); retry");
  }
  if (u->orphaned) { /* the client went away meanwhile: nobody can claim this upload */
    if (u->commit_rc == 0) {
      char path[1200];
      upload_path(c, u->id, path, sizeof path);
      unlink(path);
    }
    upload_free(u);
  } else if (u->commit_rc < 0) {
    upload_fail(u->call, u, RPC_INTERNAL, u->err);
  } else {
    DPC_INFO("upload %llu stored: %llu bytes", (unsigned long long)u->id, (unsigned long long)u->total);
    Dipaco__V1__UploadInitialModelResponse resp = DIPACO__V1__UPLOAD_INITIAL_MODEL_RESPONSE__INIT;
    resp.upload_id = u->id;
    resp.bytes = u->total;
    resp.crc32c = u->crc;
    u->finished = 1;
    rpc_call_reply(u->call, &resp.base);
  }
  coord_work_done(c);
}

static int upload_on_message(struct rpc_call *call, const struct grpc_byte_buffer *msg, void *ud) {
  (void)ud;
  coord *c = g_coord;
  upload *u = rpc_call_data(call);
  if (!u || u->finished || u->committing) return 0;
  char err[600];
  if (!msg) {
    if (!u->started || u->next != u->total) {
      upload_fail(call, u, RPC_INVALID_ARGUMENT, "upload ended before its last chunk");
      return 0;
    }
    u->call = call;
    u->req.data = u;
    u->committing = 1;
    if (coord_queue_work(c, &u->req, upload_commit_run, upload_commit_after) < 0) {
      u->committing = 0;
      snprintf(err, sizeof err, "storing the upload failed: %s", dpc_errmsg());
      upload_fail(call, u, RPC_INTERNAL, err);
    }
    return 0;
  }
  struct rpc_chunk ch;
  if (rpc_chunk_parse(msg, &ch) < 0) {
    snprintf(err, sizeof err, "malformed chunk: %s", dpc_errmsg());
    upload_fail(call, u, RPC_INVALID_ARGUMENT, err);
    return 0;
  }
  if (!u->started) {
    if (ch.payload != DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS || ch.offset != 0) {
      upload_fail(call, u, RPC_INVALID_ARGUMENT, "payload/offset: an upload is PAYLOAD_SAFETENSORS chunks from offset 0");
      return 0;
    }
    if (ch.total > MAX_UPLOAD_BYTES || ch.total < 8) {
      upload_fail(call, u, ch.total < 8 ? RPC_INVALID_ARGUMENT : RPC_RESOURCE_EXHAUSTED,
                  "total: an upload must be 8 bytes .. 16 GiB");
      return 0;
    }
    char dir[1100], path[1200];
    snprintf(dir, sizeof dir, "%s/uploads", c->state_dir);
    u->id = c->next_upload_id++;
    upload_path(c, u->id, path, sizeof path);
    if (dpc_mkdir_p(dir) < 0 || dpc_afile_open(path, &u->f) < 0) {
      snprintf(err, sizeof err, "cannot store the upload: %s", dpc_errmsg());
      upload_fail(call, u, RPC_INTERNAL, err);
      return 0;
    }
    u->total = ch.total;
    u->started = 1;
  } else if (ch.offset != u->next || ch.total != u->total) {
    upload_fail(call, u, RPC_INVALID_ARGUMENT, "offset/total: chunks must be contiguous with one total");
    return 0;
  }
  if (ch.len > u->cap) {
    unsigned char *b = realloc(u->buf, ch.len);
    if (!b) {
      upload_fail(call, u, RPC_RESOURCE_EXHAUSTED, "out of memory");
      return 0;
    }
    u->buf = b;
    u->cap = ch.len;
  }
  if (ch.len && (rpc_chunk_copy(msg, &ch, u->buf) < 0 || dpc_afile_write(u->f, u->buf, ch.len) < 0)) {
    snprintf(err, sizeof err, "cannot store the upload: %s", dpc_errmsg());
    upload_fail(call, u, RPC_INTERNAL, err);
    return 0;
  }
  u->crc = dpc_crc32c(u->crc, u->buf, ch.len);
  u->next += ch.len;
  c->bytes_in += ch.len;
  if (u->next == u->total && ch.crc32c != u->crc) {
    snprintf(err, sizeof err, "crc32c: upload has CRC-32C 0x%08x, the last chunk says 0x%08x; upload again", u->crc,
             ch.crc32c);
    upload_fail(call, u, RPC_DATA_LOSS, err);
  }
  return 0;
}

static void upload_on_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  upload *u = rpc_call_data(call);
  if (!u) return;
  rpc_call_set_data(call, NULL);
  if (u->committing) u->orphaned = 1; /* upload_commit_after frees it */
  else upload_free(u);
}

/* Read an uploaded safetensors file into theta (canonical layout of lay). */
static int load_upload(coord *c, uint64_t id, const gpt_layout *lay, float *theta) {
  char path[1200];
  upload_path(c, id, path, sizeof path);
  st_file *f;
  int rc = st_open(path, &f);
  if (rc < 0) return rc == DPC_ENOENT ? dpc_err(DPC_ENOENT, "initial_upload_id %llu: no such upload", (unsigned long long)id) : rc;
  for (int i = 0; i < lay->n_tensors && rc == 0; i++) {
    const gpt_tensor *t = &lay->tensors[i];
    char alt[GPT_NAME_MAX + 16];
    snprintf(alt, sizeof alt, "transformer.%s", t->name);
    int k = st_find(f, t->name);
    if (k < 0) k = st_find(f, alt);
    if (k < 0) {
      rc = dpc_err(DPC_EINVAL, "initial_upload_id %llu: tensor %s is missing", (unsigned long long)id, t->name);
      break;
    }
    const st_tensor *st = st_get(f, k);
    int ok = st->ndim == t->ndim;
    for (int d = 0; ok && d < t->ndim; d++) ok = st->shape[d] == t->shape[d];
    if (!ok) {
      rc = dpc_err(DPC_ESHAPE, "initial_upload_id %llu: tensor %s has another shape than the spec's model implies",
                   (unsigned long long)id, t->name);
      break;
    }
    rc = st_read_f32(f, k, 0, t->numel, theta + t->offset);
  }
  st_close(f);
  if (rc < 0) return rc;
  for (size_t i = 0; i < lay->n_params; i++)
    if (!isfinite(theta[i])) return dpc_err(DPC_EINVAL, "initial_upload_id %llu: non-finite parameter at %zu", (unsigned long long)id, i);
  return 0;
}

/* ---- CreateJob ------------------------------------------------------------------------------ */

/* Creating a job generates or reads the whole model and writes version 0 of every fragment:
 * seconds to minutes for a large model. That part runs on the threadpool, so heartbeats and
 * pushes keep flowing meanwhile. Creations run one at a time, the rest queued in arrival
 * order, so name checks and job ids behave exactly as if each ran alone. */
typedef struct create_work {
  uv_work_t req;
  struct rpc_call *call;
  ProtobufCMessage *pm; /* the CreateJobRequest */
  jobspec js;
  gpt_layout *lay;
  float *theta;         /* (n_params) version 0 */
  char *json;
  jobspec_module *mods;
  jobspec_fragment *frags;
  store_fragment_init *init;
  char (*names)[BLOB_NAME_MAX];
  int nm, nf;
  int64_t id;
  int code;             /* set by the threadpool part on failure */
  char err[512];
  struct create_work *next;
} create_work;

static create_work *create_head, *create_tail, *create_cur; /* cur: on the threadpool */
static int create_busy;

/* The call ended before it was answered (client cancel, deadline, shutdown): forget it; the
 * creation still completes, its answer goes nowhere. */
static void on_create_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  if (create_cur && create_cur->call == call) create_cur->call = NULL;
  for (create_work *w = create_head; w; w = w->next)
    if (w->call == call) w->call = NULL;
}

static void create_free(create_work *w) {
  free(w->lay);
  free(w->theta);
  free(w->json);
  free(w->mods);
  free(w->frags);
  free(w->init);
  free(w->names);
  protobuf_c_message_free_unpacked(w->pm, NULL);
  free(w);
}

/* Loop thread: validate the request and size everything; 0, or -1 with the call answered. */
static int create_prepare(coord *c, create_work *w) {
  struct rpc_call *call = w->call;
  if (!call) return -1; /* nobody is waiting for it any more */
  Dipaco__V1__CreateJobRequest *r = (Dipaco__V1__CreateJobRequest *)w->pm;
  jobspec *js = &w->js;
  int rc = jobspec_parse(r->spec_json, strlen(r->spec_json), js);
  if (rc < 0) return rpc_call_finish(call, RPC_INVALID_ARGUMENT, "spec_json: %s", dpc_errmsg()), -1;
  if (r->name[0] && strcmp(r->name, js->name) != 0) {
    if (strlen(r->name) >= sizeof js->name)
      return rpc_call_finish(call, RPC_INVALID_ARGUMENT, "name: longer than %d characters", JOBSPEC_NAME_MAX - 1), -1;
    snprintf(js->name, sizeof js->name, "%s", r->name);
    if (jobspec_validate(js) < 0) return rpc_call_finish(call, RPC_INVALID_ARGUMENT, "name: %s", dpc_errmsg()), -1;
  }
  if (!js->has_shape) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT,
                    "model.init: the coordinator cannot read %s; give the shape fields (n_layer, n_head, n_embd, "
                    "n_positions, vocab_size) with the init directory and upload its weights (dipacoctl does both)",
                    js->init_dir);
    return -1;
  }
  if (js->init_dir[0] && r->initial_upload_id == 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "initial_upload_id: model.init needs the weights uploaded first "
                                                "(UploadInitialModel)");
    return -1;
  }
  store_job other;
  if (store_find_job(c->st, js->name, &other) == 0) {
    store_job_clear(&other);
    rpc_call_finish(call, RPC_ALREADY_EXISTS, "name: a job named \"%s\" already exists (job %lld)", js->name,
                    (long long)other.id);
    return -1;
  }
  w->lay = malloc(sizeof *w->lay);
  if (!w->lay || (rc = jobspec_layout(js, w->lay)) < 0)
    return rpc_call_finish(call, RPC_INVALID_ARGUMENT, "model: %s", w->lay ? dpc_errmsg() : "out of memory"), -1;
  w->theta = malloc(w->lay->n_params * sizeof *w->theta);
  if (!w->theta) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "model: %zu parameters do not fit in memory", w->lay->n_params);
    return -1;
  }
  w->nm = jobspec_modules(js, w->lay, NULL, 0);
  w->nf = jobspec_fragments(js, w->lay, NULL, 0);
  if (w->nm < 1 || w->nf < 1) return rpc_call_finish(call, RPC_INVALID_ARGUMENT, "levels: %s", dpc_errmsg()), -1;
  w->mods = calloc((size_t)w->nm, sizeof *w->mods);
  w->frags = calloc((size_t)w->nf, sizeof *w->frags);
  w->init = calloc((size_t)w->nf, sizeof *w->init);
  w->names = calloc((size_t)w->nf, sizeof *w->names);
  if (!w->mods || !w->frags || !w->init || !w->names || jobspec_to_json(js, &w->json) < 0)
    return rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory"), -1;
  jobspec_modules(js, w->lay, w->mods, w->nm);
  jobspec_fragments(js, w->lay, w->frags, w->nf);
  if ((rc = store_next_job_id(c->st, &w->id)) < 0) return rpc_call_fail(call, rc), -1;
  return 0;
}

/* Threadpool: version 0's parameters (uploaded or initialised) and their blobs. */
static void create_run(uv_work_t *req) {
  create_work *w = req->data;
  coord *c = g_coord;
  const Dipaco__V1__CreateJobRequest *r = (const Dipaco__V1__CreateJobRequest *)w->pm;
  int rc;
  if (r->initial_upload_id) {
    if ((rc = load_upload(c, r->initial_upload_id, w->lay, w->theta)) < 0) {
      w->code = rc == DPC_ENOENT ? RPC_NOT_FOUND : RPC_INVALID_ARGUMENT;
      snprintf(w->err, sizeof w->err, "%s", dpc_errmsg());
      return;
    }
  } else {
    gpt_init_params(w->lay, w->theta, w->js.seed);
  }
  for (int i = 0; i < w->nf; i++) {
    blob_id bid = {.job = w->id, .fragment = w->frags[i].id, .version = 0, .kind = BLOB_PARAMS};
    blob_name(&bid, w->names[i], BLOB_NAME_MAX);
    rc = blob_write(c->bs, w->names[i], BLOB_PARAMS, w->theta + w->frags[i].offset, w->frags[i].len,
                    &w->init[i].param_crc);
    if (rc < 0) {
      w->code = rpc_code_from_dpc(rc);
      snprintf(w->err, sizeof w->err, "%s", dpc_errmsg()[0] ? dpc_errmsg() : dpc_strerror(rc));
      return;
    }
    w->init[i].fragment = w->frags[i].id;
    w->init[i].param_blob = w->names[i];
  }
}

/* Loop thread: commit the job (one transaction), load it, answer. */
static void create_commit(coord *c, create_work *w) {
  struct rpc_call *call = w->call;
  const Dipaco__V1__CreateJobRequest *r = (const Dipaco__V1__CreateJobRequest *)w->pm;
  store_new_job nj = {.id = w->id, .spec = &w->js, .spec_json = w->json, .modules = w->mods, .n_modules = w->nm,
                      .fragments = w->frags, .n_fragments = w->nf, .init = w->init, .now_ms = coord_now_ms()};
  int rc = store_create_job(c->st, &nj);
  if (rc < 0) {
    DPC_WARN("job \"%s\" not created: %s", w->js.name, dpc_errmsg());
    if (call) rpc_call_finish(call, rc == DPC_EEXIST ? RPC_ALREADY_EXISTS : rpc_code_from_dpc(rc), "%s", dpc_errmsg());
    return;
  }
  store_job sj;
  coord_job *j = NULL;
  if ((rc = store_get_job(c->st, w->id, &sj)) < 0 || (rc = coord_job_from_store(&sj, &j)) < 0 ||
      (rc = coord_job_add(c, j)) < 0) {
    if (rc != DPC_ENOENT) store_job_clear(&sj);
    coord_job_free(j);
    DPC_ERROR("job %lld created but not loaded: %s", (long long)w->id, dpc_errmsg());
    if (call) rpc_call_fail(call, rc);
    return;
  }
  store_job_clear(&sj);
  if (r->initial_upload_id) { /* consumed: version 0's blobs hold the weights now */
    char path[1200];
    upload_path(c, r->initial_upload_id, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
      DPC_WARN("job %lld: cannot remove upload %s: %s", (long long)w->id, path, strerror(errno));
  }
  for (int i = 0; i < w->nf; i++) {
    float *copy = malloc(w->frags[i].len * sizeof *copy);
    if (copy) {
      memcpy(copy, w->theta + w->frags[i].offset, w->frags[i].len * sizeof *copy);
      pcache_put(c, w->id, w->frags[i].id, 0, copy, w->frags[i].len, w->init[i].param_crc);
    }
  }
  coord_job_set_state(c, j, r->start_paused ? JOB_PAUSED : JOB_RUNNING, NULL);
  DPC_INFO("job %lld \"%s\" created: %s, %d path(s) x %d replica(s), H=%d, %d rounds, %zu parameters%s",
           (long long)w->id, w->js.name, jobspec_algorithm_name(w->js.algorithm), j->n_paths, w->js.replicas,
           w->js.inner_steps, w->js.rounds, w->lay->n_params, r->initial_upload_id ? " (uploaded weights)" : "");
  if (call) reply_job(call, c, w->id);
  sched_check_rounds(c); /* long-polled Lease calls may now get work */
}

static void create_after(uv_work_t *req, int status);

/* Start the next queued creation unless one is running. */
static void create_next(coord *c) {
  while (!create_busy && create_head) {
    create_work *w = create_head;
    create_head = w->next;
    if (!create_head) create_tail = NULL;
    if (c->stopping) {
      if (w->call) rpc_call_finish(w->call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
      create_free(w);
      continue;
    }
    if (create_prepare(c, w) == 0) {
      w->req.data = w;
      int rc = coord_queue_work(c, &w->req, create_run, create_after);
      if (rc == 0) {
        create_busy = 1;
        create_cur = w;
        return;
      }
      rpc_call_fail(w->call, rc);
    }
    create_free(w);
  }
}

static void create_after(uv_work_t *req, int status) {
  create_work *w = req->data;
  coord *c = g_coord;
  if (status != 0 && w->code == RPC_OK) {
    w->code = RPC_UNAVAILABLE;
    snprintf(w->err, sizeof w->err, "job creation was canceled (coordinator shutting down); retry");
  }
  create_cur = NULL;
  if (w->code != RPC_OK) {
    DPC_WARN("job \"%s\" not created: %s", w->js.name, w->err);
    if (w->call) rpc_call_finish(w->call, w->code, "%s", w->err);
  } else {
    create_commit(c, w);
  }
  create_free(w);
  create_busy = 0;
  create_next(c);    /* before coord_work_done, which may start the shutdown */
  coord_work_done(c);
}

static void on_create_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  ProtobufCMessage *pm;
  if (unpack(call, req, &dipaco__v1__create_job_request__descriptor, &pm)) return;
  create_work *w = calloc(1, sizeof *w);
  if (!w) {
    protobuf_c_message_free_unpacked(pm, NULL);
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->call = call;
  w->pm = pm;
  w->code = RPC_OK;
  if (create_tail) create_tail->next = w;
  else create_head = w;
  create_tail = w;
  create_next(c);
}

/* ---- jobs ------------------------------------------------------------------------------------ */

static void on_list_jobs(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  ProtobufCMessage *pm;
  if (unpack(call, req, &dipaco__v1__list_jobs_request__descriptor, &pm)) return;
  Dipaco__V1__ListJobsRequest *r = (Dipaco__V1__ListJobsRequest *)pm;
  store_job *jobs;
  int n;
  int rc = store_list_jobs(c->st, &jobs, &n);
  if (rc < 0) {
    rpc_call_fail(call, rc);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  uint32_t limit = r->limit ? r->limit : 100;
  if (limit > 1000) limit = 1000;
  Dipaco__V1__JobSummary *s = calloc((size_t)n + 1, sizeof *s);
  Dipaco__V1__JobSummary **sp = calloc((size_t)n + 1, sizeof *sp);
  size_t k = 0;
  if (s && sp)
    for (int i = 0; i < n && k < limit; i++) {
      if ((uint64_t)jobs[i].id <= r->after_job_id) continue;
      if (r->state && job_state_wire(jobs[i].state) != r->state) continue;
      fill_summary(c, &jobs[i], &s[k]);
      sp[k] = &s[k];
      k++;
    }
  Dipaco__V1__ListJobsResponse resp = DIPACO__V1__LIST_JOBS_RESPONSE__INIT;
  resp.n_jobs = k;
  resp.jobs = sp;
  if (s && sp) rpc_call_reply(call, &resp.base);
  else rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
  free(s);
  free(sp);
  store_jobs_free(jobs, n);
  protobuf_c_message_free_unpacked(pm, NULL);
}

enum job_op { OP_GET, OP_PAUSE, OP_RESUME, OP_CANCEL };

static void job_op(struct rpc_call *call, const struct grpc_byte_buffer *req, enum job_op op) {
  coord *c = g_coord;
  ProtobufCMessage *pm;
  if (unpack(call, req, &dipaco__v1__job_request__descriptor, &pm)) return;
  Dipaco__V1__JobRequest *r = (Dipaco__V1__JobRequest *)pm;
  coord_job *j = r->job_id <= INT64_MAX ? coord_job_get(c, (int64_t)r->job_id) : NULL;
  if (!j) {
    rpc_call_finish(call, RPC_NOT_FOUND, "job_id %llu: no such job", (unsigned long long)r->job_id);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  const char *why = r->reason[0] ? r->reason : NULL;
  int rc = 0;
  if (op == OP_PAUSE) {
    if (j->state == JOB_RUNNING || j->state == JOB_CREATED) rc = coord_job_set_state(c, j, JOB_PAUSED, why);
    else if (j->state != JOB_PAUSED) rc = dpc_err(DPC_ESTATE, "job %lld is %s; only a running job can be paused", (long long)j->id, store_job_state_name(j->state));
  } else if (op == OP_RESUME) {
    if (j->state == JOB_PAUSED || j->state == JOB_CREATED) rc = coord_job_set_state(c, j, JOB_RUNNING, why);
    else if (j->state != JOB_RUNNING) rc = dpc_err(DPC_ESTATE, "job %lld is %s; only a paused job can be resumed", (long long)j->id, store_job_state_name(j->state));
  } else if (op == OP_CANCEL) {
    if (j->state == JOB_FINISHED || j->state == JOB_FAILED)
      rc = dpc_err(DPC_ESTATE, "job %lld is already %s", (long long)j->id, store_job_state_name(j->state));
    else if (j->state != JOB_CANCELED) {
      rc = coord_job_set_state(c, j, JOB_CANCELED, why ? why : "cancelled by an admin");
      store_lease *ls;
      int nl;
      if (rc == 0 && store_list_active_leases(c->st, j->id, &ls, &nl) == 0) {
        for (int i = 0; i < nl; i++) {
          store_end_lease(c->st, ls[i].id, LEASE_RELEASED, 0, 0, coord_now_ms());
          coord_note_drop(c, ls[i].id);
        }
        free(ls);
      }
    }
  }
  if (rc < 0) rpc_call_finish(call, rc == DPC_ESTATE ? RPC_FAILED_PRECONDITION : rpc_code_from_dpc(rc), "%s", dpc_errmsg());
  else reply_job(call, c, j->id);
  if (rc == 0 && op != OP_GET) sched_check_rounds(c);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static void on_get_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  job_op(call, req, OP_GET);
}
static void on_pause_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  job_op(call, req, OP_PAUSE);
}
static void on_resume_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  job_op(call, req, OP_RESUME);
}
static void on_cancel_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  job_op(call, req, OP_CANCEL);
}

/* ---- workers ---------------------------------------------------------------------------------- */

typedef struct {
  Dipaco__V1__WorkerInfo wi;
  Dipaco__V1__Slot slot;
  char backend[256], device[256], labels[256];
} worker_row;

static void fill_worker(coord *c, store_worker *w, const store_lease *act, int na, int64_t now, worker_row *row) {
  dipaco__v1__worker_info__init(&row->wi);
  dipaco__v1__slot__init(&row->slot);
  /* info is "backend\tdevice\tlabels" (service.c Register) */
  char tmp[256];
  snprintf(tmp, sizeof tmp, "%s", w->info);
  char *a = tmp, *b = strchr(a, '\t'), *l = NULL;
  if (b) {
    *b++ = 0;
    l = strchr(b, '\t');
    if (l) *l++ = 0;
  }
  snprintf(row->backend, sizeof row->backend, "%s", a);
  snprintf(row->device, sizeof row->device, "%s", b ? b : "");
  snprintf(row->labels, sizeof row->labels, "%s", l ? l : "");
  row->wi.worker_id = (uint64_t)w->id;
  row->wi.hostname = w->name;
  row->wi.backend = row->backend;
  row->wi.device = row->device;
  row->wi.labels = row->labels;
  row->wi.steps_per_sec = (float)w->steps_per_s;
  row->wi.last_heartbeat_unix_ms = w->last_seen;
  row->wi.registered_unix_ms = w->registered_at;
  const store_lease *mine = NULL;
  for (int i = 0; i < na; i++)
    if (act[i].worker == w->id) mine = &act[i];
  int gone = w->state == WORKER_GONE || !sched_worker_alive(c, w, now);
  row->wi.state = gone ? DIPACO__V1__WORKER_STATE__WORKER_GONE
                  : w->state == WORKER_DRAINING ? DIPACO__V1__WORKER_STATE__WORKER_DRAINING
                  : mine ? DIPACO__V1__WORKER_STATE__WORKER_TRAINING : DIPACO__V1__WORKER_STATE__WORKER_IDLE;
  if (mine) {
    row->wi.lease_id = (uint64_t)mine->id;
    row->wi.job_id = (uint64_t)mine->job;
    row->slot.path = (uint32_t)mine->path;
    row->slot.replica = (uint32_t)mine->replica;
    row->wi.slot = &row->slot;
  }
}

static void on_list_workers(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  ProtobufCMessage *pm;
  if (unpack(call, req, &dipaco__v1__list_workers_request__descriptor, &pm)) return;
  Dipaco__V1__ListWorkersRequest *r = (Dipaco__V1__ListWorkersRequest *)pm;
  store_worker *ws = NULL;
  store_lease *act = NULL;
  int nw = 0, na = 0;
  int rc = store_list_workers(c->st, &ws, &nw);
  if (rc == 0) rc = store_list_active_leases(c->st, 0, &act, &na);
  worker_row *rows = rc == 0 ? calloc((size_t)nw + 1, sizeof *rows) : NULL;
  Dipaco__V1__WorkerInfo **wp = rc == 0 ? calloc((size_t)nw + 1, sizeof *wp) : NULL;
  if (rc < 0 || !rows || !wp) {
    rpc_call_fail(call, rc < 0 ? rc : DPC_ENOMEM);
  } else {
    int64_t now = coord_now_ms();
    size_t k = 0;
    for (int i = 0; i < nw; i++) {
      fill_worker(c, &ws[i], act, na, now, &rows[k]);
      if (!r->include_gone && rows[k].wi.state == DIPACO__V1__WORKER_STATE__WORKER_GONE) continue;
      if (r->job_id && rows[k].wi.job_id != r->job_id) continue;
      wp[k] = &rows[k].wi;
      k++;
    }
    Dipaco__V1__ListWorkersResponse resp = DIPACO__V1__LIST_WORKERS_RESPONSE__INIT;
    resp.n_workers = k;
    resp.workers = wp;
    rpc_call_reply(call, &resp.base);
  }
  free(rows);
  free(wp);
  free(ws);
  free(act);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static void on_drain_worker(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  ProtobufCMessage *pm;
  if (unpack(call, req, &dipaco__v1__drain_worker_request__descriptor, &pm)) return;
  Dipaco__V1__DrainWorkerRequest *r = (Dipaco__V1__DrainWorkerRequest *)pm;
  store_worker w;
  if (r->worker_id == 0 || r->worker_id > INT64_MAX || store_get_worker(c->st, (int64_t)r->worker_id, &w) < 0) {
    rpc_call_finish(call, RPC_NOT_FOUND, "worker_id %llu: no such worker", (unsigned long long)r->worker_id);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  store_set_worker_state(c->st, w.id, WORKER_DRAINING);
  store_lease *act = NULL;
  int na = 0;
  store_list_active_leases(c->st, 0, &act, &na);
  if (r->immediate)
    for (int i = 0; i < na; i++)
      if (act[i].worker == w.id) {
        store_end_lease(c->st, act[i].id, LEASE_RELEASED, 0, 0, coord_now_ms());
        coord_note_drop(c, act[i].id);
      }
  DPC_INFO("worker %lld (%s) draining%s", (long long)w.id, w.name, r->immediate ? " now (lease released)" : "");
  free(act);
  store_list_active_leases(c->st, 0, &act, &na);
  store_get_worker(c->st, w.id, &w);
  worker_row row;
  fill_worker(c, &w, act, na, coord_now_ms(), &row);
  rpc_call_reply(call, &row.wi.base);
  free(act);
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* ---- paths, modules, metrics -------------------------------------------------------------------- */

static coord_job *job_or_fail(struct rpc_call *call, uint64_t id) {
  coord_job *j = id <= INT64_MAX ? coord_job_get(g_coord, (int64_t)id) : NULL;
  if (!j) rpc_call_finish(call, RPC_NOT_FOUND, "job_id %llu: no such job", (unsigned long long)id);
  return j;
}

static void on_list_paths(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  ProtobufCMessage *pm;
  if (unpack(call, req, &dipaco__v1__list_paths_request__descriptor, &pm)) return;
  Dipaco__V1__ListPathsRequest *r = (Dipaco__V1__ListPathsRequest *)pm;
  coord_job *j = job_or_fail(call, r->job_id);
  if (!j) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  store_slot *slots = NULL;
  store_lease *act = NULL;
  int ns = 0, na = 0;
  int P = j->n_paths, L = j->spec.n_levels;
  Dipaco__V1__PathInfo *pi = calloc((size_t)P, sizeof *pi);
  Dipaco__V1__PathInfo **pp = calloc((size_t)P, sizeof *pp);
  uint64_t *mods = calloc((size_t)P * (size_t)L, sizeof *mods);
  int rc = store_list_slots(c->st, j->id, &slots, &ns);
  if (rc == 0) rc = store_list_active_leases(c->st, j->id, &act, &na);
  Dipaco__V1__SlotInfo *si = calloc((size_t)ns + 1, sizeof *si);
  Dipaco__V1__SlotInfo **sp = calloc((size_t)ns + 1, sizeof *sp);
  Dipaco__V1__Slot *sl = calloc((size_t)ns + 1, sizeof *sl);
  if (rc < 0 || !pi || !pp || !mods || !si || !sp || !sl) {
    rpc_call_fail(call, rc < 0 ? rc : DPC_ENOMEM);
    goto out;
  }
  for (int i = 0; i < ns; i++) {
    dipaco__v1__slot_info__init(&si[i]);
    dipaco__v1__slot__init(&sl[i]);
    sl[i].path = (uint32_t)slots[i].path;
    sl[i].replica = (uint32_t)slots[i].replica;
    si[i].slot = &sl[i];
    si[i].step = (uint64_t)slots[i].inner_steps;
    si[i].last_loss = slots[i].path < P ? j->path_loss[slots[i].path] : NAN;
    for (int k = 0; k < na; k++)
      if (act[k].path == slots[i].path && act[k].replica == slots[i].replica) {
        si[i].worker_id = (uint64_t)act[k].worker;
        si[i].lease_id = (uint64_t)act[k].id;
        lease_note *n = coord_note(c, act[k].id, 0);
        if (n && isfinite(n->loss)) si[i].last_loss = n->loss;
      }
    sp[i] = &si[i];
  }
  /* slots are ordered by (path, replica) */
  int at = 0;
  for (int p = 0; p < P; p++) {
    dipaco__v1__path_info__init(&pi[p]);
    pi[p].path = (uint32_t)p;
    int m[JOBSPEC_MAX_LEVELS];
    int nl = jobspec_path_modules(&j->spec, p, m);
    for (int l = 0; l < nl && l < L; l++) mods[(size_t)p * L + l] = (uint64_t)m[l] + 1;
    pi[p].n_modules = (size_t)(nl > 0 ? nl : 0);
    pi[p].modules = &mods[(size_t)p * L];
    int first = at;
    while (at < ns && slots[at].path == p) at++;
    pi[p].n_slots = (size_t)(at - first);
    pi[p].slots = &sp[first];
    pp[p] = &pi[p];
  }
  Dipaco__V1__ListPathsResponse resp = DIPACO__V1__LIST_PATHS_RESPONSE__INIT;
  resp.n_paths = (size_t)P;
  resp.paths = pp;
  rpc_call_reply(call, &resp.base);
out:
  free(pi);
  free(pp);
  free(mods);
  free(si);
  free(sp);
  free(sl);
  free(slots);
  free(act);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static void on_list_modules(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  ProtobufCMessage *pm;
  if (unpack(call, req, &dipaco__v1__list_modules_request__descriptor, &pm)) return;
  Dipaco__V1__ListModulesRequest *r = (Dipaco__V1__ListModulesRequest *)pm;
  coord_job *j = job_or_fail(call, r->job_id);
  if (!j) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  store_fragment *fr = NULL;
  int nf = 0;
  int rc = store_list_fragments(c->st, j->id, &fr, &nf);
  Dipaco__V1__ModuleInfo *mi = calloc((size_t)j->n_modules, sizeof *mi);
  Dipaco__V1__ModuleInfo **mp = calloc((size_t)j->n_modules, sizeof *mp);
  Dipaco__V1__FragmentInfo *fi = calloc((size_t)nf + 1, sizeof *fi);
  Dipaco__V1__FragmentInfo **fp = calloc((size_t)nf + 1, sizeof *fp);
  if (rc < 0 || !mi || !mp || !fi || !fp) {
    rpc_call_fail(call, rc < 0 ? rc : DPC_ENOMEM);
  } else {
    for (int i = 0; i < nf; i++) {
      coord_fill_fragment_info(j, &fr[i], fr[i].version, &fi[i]);
      fp[i] = &fi[i];
    }
    for (int m = 0; m < j->n_modules; m++) {
      dipaco__v1__module_info__init(&mi[m]);
      mi[m].module_id = (uint64_t)j->modules[m].id + 1;
      mi[m].level = (uint32_t)j->modules[m].level;
      mi[m].index = (uint32_t)j->modules[m].index;
      mi[m].num_floats = j->modules[m].len;
      /* fragments are ordered by id and grouped by module */
      int first = -1, cnt = 0;
      for (int i = 0; i < nf; i++)
        if (fr[i].module == j->modules[m].id) {
          if (first < 0) first = i;
          cnt++;
        }
      mi[m].n_fragments = (size_t)cnt;
      mi[m].fragments = first >= 0 ? &fp[first] : NULL;
      mp[m] = &mi[m];
    }
    Dipaco__V1__ListModulesResponse resp = DIPACO__V1__LIST_MODULES_RESPONSE__INIT;
    resp.n_modules = (size_t)j->n_modules;
    resp.modules = mp;
    rpc_call_reply(call, &resp.base);
  }
  free(mi);
  free(mp);
  free(fi);
  free(fp);
  free(fr);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static int want_name(const Dipaco__V1__GetMetricsRequest *r, const char *name) {
  if (r->n_names == 0) return 1;
  for (size_t i = 0; i < r->n_names; i++)
    if (strcmp(r->names[i], name) == 0) return 1;
  return 0;
}

static void on_get_metrics(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  ProtobufCMessage *pm;
  if (unpack(call, req, &dipaco__v1__get_metrics_request__descriptor, &pm)) return;
  Dipaco__V1__GetMetricsRequest *r = (Dipaco__V1__GetMetricsRequest *)pm;
  coord_job *j = job_or_fail(call, r->job_id);
  if (!j) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  store_metric *ms = NULL;
  int nm = 0;
  int rc = store_list_metrics(c->st, j->id, r->since_round > INT64_MAX ? INT64_MAX : (int64_t)r->since_round, &ms, &nm);
  uint32_t limit = r->limit ? r->limit : 10000;
  if (limit > 100000) limit = 100000;
  /* The delta ledger of every fragment. */
  store_delta *led = NULL;
  int nled = 0;
  if (rc == 0) {
    for (int f = 0; f < j->n_fragments && rc == 0; f++) {
      store_delta *d;
      int nd;
      if ((rc = store_list_ledger(c->st, j->id, f, &d, &nd)) < 0) break;
      store_delta *a = realloc(led, (size_t)(nled + nd + 1) * sizeof *a);
      if (!a) {
        free(d);
        rc = DPC_ENOMEM;
        break;
      }
      led = a;
      if (nd) memcpy(led + nled, d, (size_t)nd * sizeof *d);
      nled += nd;
      free(d);
    }
  }
  size_t cap = (size_t)nm * 5 + (size_t)nled * 3 + 1;
  Dipaco__V1__MetricPoint *pt = calloc(cap, sizeof *pt);
  Dipaco__V1__MetricPoint **pp = calloc(cap, sizeof *pp);
  if (rc < 0 || !pt || !pp) {
    rpc_call_fail(call, rc < 0 ? rc : DPC_ENOMEM);
  } else {
    size_t k = 0;
    for (int i = 0; i < nm && k < limit; i++) {
      const store_metric *m = &ms[i];
      struct {
        const char *name;
        double v;
        int ok;
      } vals[5] = {{"loss", m->loss, isfinite(m->loss)},
                   {"tokens", (double)m->tokens, m->path >= 0},
                   {"bytes_in", (double)m->bytes_in, m->path >= 0},
                   {"bytes_out", (double)m->bytes_out, m->path >= 0},
                   {"outer_seconds", m->outer_seconds, m->path < 0}};
      for (int v = 0; v < 5 && k < limit; v++) {
        if (!vals[v].ok || !want_name(r, vals[v].name)) continue;
        dipaco__v1__metric_point__init(&pt[k]);
        pt[k].name = (char *)vals[v].name;
        pt[k].round = (uint64_t)m->round;
        pt[k].step = (uint64_t)m->round * (uint64_t)j->spec.inner_steps;
        pt[k].unix_ms = m->created_at;
        pt[k].value = vals[v].v;
        pt[k].path = m->path;
        pp[k] = &pt[k];
        k++;
      }
    }
    static const char *const lnames[3] = {"staleness", "ledger_lease", "ledger_replica"};
    for (int i = 0; i < nled && k < limit; i++) {
      const store_delta *d = &led[i];
      if ((uint64_t)d->applied_version < r->since_round) continue;
      double vals[3] = {(double)(d->applied_version - 1 - d->base_version), (double)d->lease, (double)d->replica};
      for (int v = 0; v < 3 && k < limit; v++) {
        if (!want_name(r, lnames[v])) continue;
        dipaco__v1__metric_point__init(&pt[k]);
        pt[k].name = (char *)lnames[v];
        pt[k].round = (uint64_t)d->applied_version;
        pt[k].step = (uint64_t)d->base_version;
        pt[k].unix_ms = d->received_at;
        pt[k].value = vals[v];
        pt[k].path = d->path;
        pt[k].fragment_id = (uint64_t)d->fragment + 1;
        pp[k] = &pt[k];
        k++;
      }
    }
    Dipaco__V1__GetMetricsResponse resp = DIPACO__V1__GET_METRICS_RESPONSE__INIT;
    resp.n_points = k;
    resp.points = pp;
    rpc_call_reply(call, &resp.base);
  }
  free(pt);
  free(pp);
  free(ms);
  free(led);
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* ---- ExportPath ------------------------------------------------------------------------------- */

typedef struct {
  atomic_int refs;
  void *cfg, *st;
} export_buf;

static void export_ref(void *ud) { atomic_fetch_add(&((export_buf *)ud)->refs, 1); }
static void export_unref(void *ud) {
  export_buf *e = ud;
  if (atomic_fetch_sub(&e->refs, 1) == 1) {
    free(e->cfg);
    free(e->st);
    free(e);
  }
}

static void on_export_path(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  ProtobufCMessage *pm;
  if (unpack(call, req, &dipaco__v1__export_path_request__descriptor, &pm)) return;
  Dipaco__V1__ExportPathRequest *r = (Dipaco__V1__ExportPathRequest *)pm;
  coord_job *j = job_or_fail(call, r->job_id);
  float *theta = NULL;
  gpt_layout *lay = NULL;
  export_buf *eb = NULL;
  char dir[1200] = "", p1[1300], p2[1300];
  if (!j) goto out;
  if (r->path >= (uint32_t)j->n_paths) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "path: job %lld has %d path(s); got %u", (long long)j->id, j->n_paths, r->path);
    goto out;
  }
  lay = malloc(sizeof *lay);
  if (!lay || jobspec_layout(&j->spec, lay) < 0 || !(theta = calloc(lay->n_params, sizeof *theta))) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory for the export");
    goto out;
  }
  for (int f = 0; f < j->n_fragments; f++) {
    if (!sched_path_has_fragment(j, (int)r->path, f)) continue;
    store_fragment fr;
    int rc = r->version ? (r->version > INT64_MAX ? DPC_ENOENT : store_get_version(c->st, j->id, f, (int64_t)r->version, &fr))
                        : store_get_fragment(c->st, j->id, f, &fr);
    if (rc < 0) {
      rpc_call_finish(call, RPC_NOT_FOUND, "fragment %d version %llu is not kept", f + 1, (unsigned long long)r->version);
      goto out;
    }
    pcache_entry *e;
    if ((rc = pcache_get(c, &fr, &e)) < 0) {
      rpc_call_fail(call, rc);
      goto out;
    }
    memcpy(theta + j->fragments[f].offset, e->data, e->n * sizeof(float));
    pcache_unref(e);
  }
  snprintf(dir, sizeof dir, "%s/tmp/export-%d-%llu", c->state_dir, (int)getpid(), (unsigned long long)++c->export_seq);
  snprintf(p1, sizeof p1, "%s/%s", dir, MODELDIR_CONFIG);
  snprintf(p2, sizeof p2, "%s/%s", dir, MODELDIR_WEIGHTS);
  eb = calloc(1, sizeof *eb);
  size_t n1 = 0, n2 = 0;
  int rc = eb ? modeldir_save(dir, &j->spec.model, theta) : DPC_ENOMEM;
  if (rc == 0) rc = dpc_read_file(p1, 1u << 20, &eb->cfg, &n1);
  if (rc == 0) rc = dpc_read_file(p2, (size_t)1 << 40, &eb->st, &n2);
  unlink(p1);
  unlink(p2);
  rmdir(dir);
  if (rc < 0) {
    rpc_call_fail(call, rc);
    goto out;
  }
  atomic_init(&eb->refs, 1);
  out_stream *os = calloc(1, sizeof *os);
  if (!os) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  os->c = c;
  os->nparts = 2;
  os->part[0] = (out_part){.data = eb->cfg, .total = n1, .crc = dpc_crc32c(0, eb->cfg, n1),
                           .payload = DIPACO__V1__PAYLOAD__PAYLOAD_CONFIG_JSON};
  os->part[1] = (out_part){.data = eb->st, .total = n2, .crc = dpc_crc32c(0, eb->st, n2),
                           .payload = DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS};
  os->chunk = coord_chunk_size(r->max_chunk_bytes);
  os->ref = export_ref;
  os->unref = export_unref;
  os->ud = eb;
  eb = NULL;
  DPC_INFO("export of job %lld path %u: %zu + %zu bytes", (long long)j->id, r->path, n1, n2);
  coord_stream_start(call, os);
out:
  if (eb) {
    free(eb->cfg);
    free(eb->st);
    free(eb);
  }
  free(theta);
  free(lay);
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* Uploads count up from the largest id already in STATE/uploads. */
/* Uploads are consumed by the CreateJob that names them. At start-up the ids continue after
 * the highest file left, unfinished uploads (temp files of a crash mid-upload) are removed,
 * and so are uploads no job claimed within UPLOAD_MAX_AGE_S (a client that gave up). */
#define UPLOAD_MAX_AGE_S (24 * 3600)
void admin_init_uploads(coord *c) {
  char dir[1100], path[1400];
  snprintf(dir, sizeof dir, "%s/uploads", c->state_dir);
  c->next_upload_id = 1;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  const time_t now = time(NULL);
  int removed = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
    unsigned long long v;
    int n = 0;
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    int is_upload = sscanf(e->d_name, "%llu.safetensors%n", &v, &n) == 1 && e->d_name[n] == 0;
    if (is_upload && v >= c->next_upload_id) c->next_upload_id = v + 1;
    if (!is_upload || now - st.st_mtime > UPLOAD_MAX_AGE_S) {
      if (unlink(path) == 0) removed++;
      else DPC_WARN("uploads: cannot remove %s: %s", path, strerror(errno));
    }
  }
  closedir(d);
  if (removed) {
    dpc_fsync_dir(dir);
    DPC_INFO("recovery: removed %d unfinished or unclaimed upload(s) from %s", removed, dir);
  }
}

const struct rpc_method coord_admin_methods[] = {
    {.path = "/dipaco.v1.Admin/UploadInitialModel", .kind = RPC_CLIENT_STREAM, .on_call = upload_on_call,
     .on_message = upload_on_message, .on_done = upload_on_done},
    {.path = "/dipaco.v1.Admin/CreateJob", .kind = RPC_UNARY, .on_call = on_create_job, .on_done = on_create_done},
    {.path = "/dipaco.v1.Admin/ListJobs", .kind = RPC_UNARY, .on_call = on_list_jobs},
    {.path = "/dipaco.v1.Admin/GetJob", .kind = RPC_UNARY, .on_call = on_get_job},
    {.path = "/dipaco.v1.Admin/PauseJob", .kind = RPC_UNARY, .on_call = on_pause_job},
    {.path = "/dipaco.v1.Admin/ResumeJob", .kind = RPC_UNARY, .on_call = on_resume_job},
    {.path = "/dipaco.v1.Admin/CancelJob", .kind = RPC_UNARY, .on_call = on_cancel_job},
    {.path = "/dipaco.v1.Admin/ListWorkers", .kind = RPC_UNARY, .on_call = on_list_workers},
    {.path = "/dipaco.v1.Admin/DrainWorker", .kind = RPC_UNARY, .on_call = on_drain_worker},
    {.path = "/dipaco.v1.Admin/ListPaths", .kind = RPC_UNARY, .on_call = on_list_paths},
    {.path = "/dipaco.v1.Admin/ListModules", .kind = RPC_UNARY, .on_call = on_list_modules},
    {.path = "/dipaco.v1.Admin/GetMetrics", .kind = RPC_UNARY, .on_call = on_get_metrics},
    {.path = "/dipaco.v1.Admin/ExportPath", .kind = RPC_SERVER_STREAM, .on_call = on_export_path,
     .on_sent = coord_stream_on_sent, .on_done = coord_stream_on_done},
};
const int coord_admin_n_methods = (int)(sizeof coord_admin_methods / sizeof coord_admin_methods[0]);
