/* admin_jobs.c — the dipaco.v1.Admin job methods (dipacoctl and any gRPC client): job
 * create/list/get/pause/resume/cancel and path export (uploads: admin_upload.c; workers,
 * paths, modules, metrics: admin_fleet.c). All run on the coordinator's loop thread with ud =
 * the coord; a creation's heavy part runs in the thread pool.
 *
 * Choices (see also svc_worker.c's header):
 *  - CreateJob: CreateJobRequest.name, when set, replaces the spec's "name". A spec with
 *    model.init needs initial_upload_id (dipacoctl uploads DIR/model.safetensors and merges
 *    DIR/config.json's shape into the spec); the upload's tensors must match the shape. A
 *    spec without init is initialised with gpt_init_params(model.seed). The job starts
 *    RUNNING (PAUSED with start_paused). Job states map created → JOB_PENDING, finished →
 *    JOB_DONE, canceled → JOB_CANCELLED.
 *  - JobSummary.round = the smallest fragment version (= sync rounds closed).
 *  - Pause: no new leases; leases in flight finish their round. Resume: paused → running.
 *    Cancel: active leases of the job are released at once (heartbeats say STOP).
 *  - ExportPath: version 0 = latest; otherwise every fragment on the path at that version
 *    (NOT_FOUND once garbage-collected). config.json and model.safetensors are those that
 *    kernels/modeldir.c writes (deterministic: identical params → identical bytes).
 *  - JobSummary.round for diloco-async: deltas applied (smallest fragment version) / slots. */
#include "coordinator/admin_jobs.h"

#include "common/checksum.h"
#include "common/codec.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "coordinator/admin_upload.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/membudget.h"
#include "coordinator/loop.h"
#include "coordinator/pcache.h"
#include "coordinator/rounds.h"
#include "coordinator/svc.h"
#include "coordinator/blobwatch.h"
#include "kernels/modeldir.h"
#include "proto/dipaco.pb-c.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Fill a summary; strings point into sj (keep it alive until the reply is sent). */
/* The most delta bytes one slot sends at one sync point: over paths and sync groups, the
 * encoded size of the fragments of the path that sync together (the whole path without
 * streaming). */
static uint64_t peak_sync_bytes(const coord_job *j) {
  uint64_t peak = 0;
  const int groups = jobspec_streaming(&j->spec) ? j->spec.streaming.fragments : 1;
  for (int p = 0; p < j->n_paths; p++)
    for (int g = 0; g < groups; g++) {
      uint64_t sum = 0;
      for (int f = 0; f < j->n_fragments; f++) {
        size_t b = 0;
        if (j->fragments[f].group != g || !coord_job_path_has_fragment(j, p, f)) continue;
        if (j->spec.sparse.enabled && j->sp_bytes) sum += j->sp_bytes[f]; /* a sparse stream's fixed size */
        else if (dpc_codec_bytes(j->spec.streaming.codec, j->fragments[f].len, (uint32_t)j->spec.streaming.block_floats,
                                 &b) == 0)
          sum += b;
      }
      if (sum > peak) peak = sum;
    }
  return peak;
}

static void fill_summary(coord *c, const store_job *sj, Dipaco__V1__JobSummary *s) {
  dipaco__v1__job_summary__init(s);
  coord_job *j = coord_job_get(c, sj->id);
  s->job_id = (uint64_t)sj->id;
  s->name = (char *)sj->name;
  s->state = job_state_wire(sj->state);
  s->created_unix_ms = sj->created_at;
  s->updated_unix_ms = sj->updated_at;
  if (!j) return;
  s->algorithm = svc_algorithm_wire(&j->spec);
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
  int64_t in = 0, out = 0;
  if (store_job_traffic(c->st, sj->id, &in, &out) == 0) {
    s->bytes_in = (uint64_t)in;
    s->bytes_out = (uint64_t)out;
  }
  if (!j->peak_sync_bytes) j->peak_sync_bytes = peak_sync_bytes(j); /* fixed by the spec: once */
  s->peak_sync_bytes = j->peak_sync_bytes;
  s->last_outer_step_s = (float)j->last_outer_s;
  s->last_round_overhead_s = (float)j->last_overhead_s;
  store_slot *sl;
  int ns;
  if (store_list_slots(c->st, sj->id, &sl, &ns) == 0) {
    for (int i = 0; i < ns; i++)
      s->tokens += (uint64_t)sl[i].inner_steps * (uint64_t)j->spec.batch * (uint64_t)j->spec.seq_len;
    free(sl);
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
  char held[700], why[512];
  int64_t since = 0;
  if ((sj.state == JOB_RUNNING || sj.state == JOB_PAUSED) && blobwatch_down(c, why, sizeof why, &since)) {
    snprintf(held, sizeof held, "waiting for the blob store (unavailable for %.0f s: %s)",
             (double)(dpc_wall_ms() - since) / 1000.0, why);
    job.message = held;
  }
  int64_t leased, merged;
  if (store_job_goodput(c->st, id, &leased, &merged) == 0) {
    job.steps_leased = (uint64_t)leased;
    job.steps_merged = (uint64_t)merged;
  }
  rpc_call_reply(call, &job.base);
  store_job_clear(&sj);
}
/* ---- CreateJob ------------------------------------------------------------------------------ */

/* Creating a job generates or reads the whole model and writes version 0 of every fragment:
 * seconds to minutes for a large model. That part runs on the threadpool, so heartbeats and
 * pushes keep flowing meanwhile. Creations run one at a time, the rest queued in arrival
 * order, so name checks and job ids behave exactly as if each ran alone. */
typedef struct create_work {
  uv_work_t req;
  coord *c;
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


/* The call ended before it was answered (client cancel, deadline, shutdown): forget it; the
 * creation still completes, its answer goes nowhere. */
static void on_create_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)cancelled;
  coord *c = ud;
  if (c->create_cur && c->create_cur->call == call) c->create_cur->call = NULL;
  for (create_work *w = c->create_head; w; w = w->next)
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
                    "n_positions, vocab_size, and for a Llama arch and its keys) with the init directory and upload "
                    "its weights (dipacoctl does both)",
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
  /* Refuse before allocating what would not fit (membudget.h). */
  size_t max_frag = 0;
  for (int i = 0; i < w->nf; i++)
    if (w->frags[i].len > max_frag) max_frag = w->frags[i].len;
  uint64_t need = membudget_job_bytes(w->lay->n_params, max_frag, jobspec_n_slots(js));
  if (c->memory_budget_bytes && need > c->memory_budget_bytes) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED,
                    "model: the job needs about %llu MiB of coordinator memory (%zu parameters, largest fragment %zu "
                    "floats, %d slots), over the memory budget of %llu MiB (--memory-budget-mb); use a smaller model "
                    "or fewer slots, or raise the budget",
                    (unsigned long long)(need >> 20), w->lay->n_params, max_frag, jobspec_n_slots(js),
                    (unsigned long long)(c->memory_budget_bytes >> 20));
    return -1;
  }
  w->theta = malloc(w->lay->n_params * sizeof *w->theta);
  if (!w->theta) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "model: %zu parameters do not fit in memory", w->lay->n_params);
    return -1;
  }
  if ((rc = store_next_job_id(c->st, &w->id)) < 0) return rpc_call_fail(call, rc), -1;
  return 0;
}

/* Threadpool: version 0's parameters (uploaded or initialised) and their blobs. */
static void create_run(uv_work_t *req) {
  create_work *w = req->data;
  coord *c = w->c;
  const Dipaco__V1__CreateJobRequest *r = (const Dipaco__V1__CreateJobRequest *)w->pm;
  int rc;
  double t0 = dpc_mono_s();
  if (r->initial_upload_id) {
    if ((rc = admin_load_upload(c, r->initial_upload_id, w->lay, w->theta)) < 0) {
      /* the upload's fault, or the store's (an outage: UNAVAILABLE, try again) */
      w->code = rc == DPC_ENOENT ? RPC_NOT_FOUND
                : rc == DPC_EFORMAT || rc == DPC_ESHAPE || rc == DPC_EINVAL || rc == DPC_EUNSUPPORTED
                    ? RPC_INVALID_ARGUMENT
                    : rpc_code_from_dpc(rc);
      snprintf(w->err, sizeof w->err, "%s", dpc_errmsg());
      return;
    }
    DPC_INFO("job \"%s\": upload %llu read (%zu parameters) in %.2f s; writing version 0", w->js.name,
             (unsigned long long)r->initial_upload_id, w->lay->n_params, dpc_mono_s() - t0);
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
                      .fragments = w->frags, .n_fragments = w->nf, .init = w->init, .now_ms = dpc_wall_ms()};
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
  coord_job_prewarm(c, j);
  if (r->initial_upload_id) admin_upload_drop(c, r->initial_upload_id); /* version 0's blobs hold it now */
  /* Version 0 is served from its blobs' mappings: the parameters in memory can go now. */
  free(w->theta);
  w->theta = NULL;
  for (int i = 0; i < w->nf; i++)
    pcache_put_blob(c, w->id, w->frags[i].id, 0, w->names[i], w->frags[i].len, w->init[i].param_crc);
  coord_job_set_state(c, j, r->start_paused ? JOB_PAUSED : JOB_RUNNING, NULL);
  DPC_INFO("job %lld \"%s\" created: %s, %d path(s) x %d replica(s), H=%d, %d rounds, %zu parameters%s",
           (long long)w->id, w->js.name, jobspec_algorithm_name(w->js.algorithm), j->n_paths, w->js.replicas,
           w->js.inner_steps, w->js.rounds, w->lay->n_params, r->initial_upload_id ? " (uploaded weights)" : "");
  if (call) reply_job(call, c, w->id);
  rounds_check(c); /* long-polled Lease calls may now get work */
}

static void create_after(uv_work_t *req, int status);

/* Start the next queued creation unless one is running. */
static void create_next(coord *c) {
  while (!c->create_busy && c->create_head) {
    create_work *w = c->create_head;
    c->create_head = w->next;
    if (!c->create_head) c->create_tail = NULL;
    if (c->stopping) {
      if (w->call) rpc_call_finish(w->call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
      create_free(w);
      continue;
    }
    if (create_prepare(c, w) == 0) {
      w->req.data = w;
      int rc = loop_queue_work(c, &w->req, create_run, create_after);
      if (rc == 0) {
        c->create_busy = 1;
        c->create_cur = w;
        return;
      }
      rpc_call_fail(w->call, rc);
    }
    create_free(w);
  }
}

static void create_after(uv_work_t *req, int status) {
  create_work *w = req->data;
  coord *c = w->c;
  if (status != 0 && w->code == RPC_OK) {
    w->code = RPC_UNAVAILABLE;
    snprintf(w->err, sizeof w->err, "job creation was canceled (coordinator shutting down); retry");
  }
  c->create_cur = NULL;
  if (w->code != RPC_OK) {
    DPC_WARN("job \"%s\" not created: %s", w->js.name, w->err);
    if (w->call) rpc_call_finish(w->call, w->code, "%s", w->err);
  } else {
    create_commit(c, w);
  }
  create_free(w);
  c->create_busy = 0;
  create_next(c);    /* before loop_work_done, which may start the shutdown */
  loop_work_done(c);
}

static void on_create_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  ProtobufCMessage *pm;
  if (svc_admin_unpack(c, call, req, &dipaco__v1__create_job_request__descriptor, &pm)) return;
  create_work *w = calloc(1, sizeof *w);
  if (!w) {
    protobuf_c_message_free_unpacked(pm, NULL);
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->c = c;
  w->call = call;
  w->pm = pm;
  w->code = RPC_OK;
  if (c->create_tail) c->create_tail->next = w;
  else c->create_head = w;
  c->create_tail = w;
  create_next(c);
}

/* ---- jobs ------------------------------------------------------------------------------------ */

static void on_list_jobs(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  ProtobufCMessage *pm;
  if (svc_admin_unpack(c, call, req, &dipaco__v1__list_jobs_request__descriptor, &pm)) return;
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

static void job_op(coord *c, struct rpc_call *call, const struct grpc_byte_buffer *req, enum job_op op) {
  ProtobufCMessage *pm;
  if (svc_admin_unpack(c, call, req, &dipaco__v1__job_request__descriptor, &pm)) return;
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
          store_end_lease(c->st, ls[i].id, LEASE_RELEASED, 0, 0, dpc_wall_ms());
          lease_ended(c, ls[i].id, 1);
        }
        free(ls);
      }
    }
  }
  if (rc < 0) rpc_call_finish(call, rc == DPC_ESTATE ? RPC_FAILED_PRECONDITION : rpc_code_from_dpc(rc), "%s", dpc_errmsg());
  else reply_job(call, c, j->id);
  if (rc == 0 && op != OP_GET) rounds_check(c);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static void on_get_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  job_op(ud, call, req, OP_GET);
}
static void on_pause_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  job_op(ud, call, req, OP_PAUSE);
}
static void on_resume_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  job_op(ud, call, req, OP_RESUME);
}
static void on_cancel_job(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  job_op(ud, call, req, OP_CANCEL);
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

/* An export in flight: the path's fragment versions from the parameter cache (those it lacks
 * filled on the thread pool), then copied into one θ and written out as a model directory on
 * the thread pool; the loop thread only starts the stream. A model's worth of reading, copying
 * and writing would otherwise stop every other call for as long. */
typedef struct export_work export_work;
typedef struct {
  export_work *x;
  int f;
} export_slot;

struct export_work {
  svc_hold hold;
  uv_work_t req;
  coord *c;
  int64_t job;
  uint32_t path, max_chunk;
  gpt_config model;
  size_t n_params;
  char dir[1200];
  int n_frag;
  pcache_entry **e;   /* [n_frag]: the path's versions; NULL off the path */
  size_t *off;        /* [n_frag]: each fragment's offset in θ */
  export_slot *slots; /* [n_frag]: the fills' callback data */
  int pending;        /* fills still running */
  int rc;             /* the first failure, its message in err */
  char err[512];
  export_buf *eb;
  size_t n1, n2;
};

static void export_free(export_work *x) {
  for (int f = 0; f < x->n_frag; f++)
    if (x->e[f]) pcache_unref(x->e[f]);
  if (x->eb) export_unref(x->eb);
  free(x->e);
  free(x->off);
  free(x->slots);
  free(x);
}

static void export_fail(export_work *x, int rc) {
  if (x->rc < 0) return;
  x->rc = rc;
  snprintf(x->err, sizeof x->err, "%s", dpc_errmsg());
}

/* config.json and model.safetensors of θ as kernels/modeldir.c writes them, read back into
 * x->eb (through a temporary directory under STATE/tmp that is removed again). Thread pool. */
static void export_run(uv_work_t *req) {
  export_work *x = req->data;
  float *theta = calloc(x->n_params, sizeof *theta);
  if (!theta) {
    x->rc = dpc_err(DPC_ENOMEM, "out of memory for the export (%zu parameters)", x->n_params);
  } else {
    for (int f = 0; f < x->n_frag; f++)
      if (x->e[f]) memcpy(theta + x->off[f], x->e[f]->data, x->e[f]->n * sizeof(float));
    char p1[1300], p2[1300];
    snprintf(p1, sizeof p1, "%s/%s", x->dir, MODELDIR_CONFIG);
    snprintf(p2, sizeof p2, "%s/%s", x->dir, MODELDIR_WEIGHTS);
    x->eb = calloc(1, sizeof *x->eb);
    int rc = x->eb ? modeldir_save(x->dir, &x->model, theta) : dpc_err(DPC_ENOMEM, "out of memory");
    free(theta);
    if (x->eb) atomic_init(&x->eb->refs, 1);
    if (rc == 0) rc = dpc_read_file(p1, 1u << 20, &x->eb->cfg, &x->n1);
    if (rc == 0) rc = dpc_read_file(p2, (size_t)1 << 40, &x->eb->st, &x->n2);
    unlink(p1);
    unlink(p2);
    rmdir(x->dir);
    if (rc < 0) x->rc = rc;
  }
  if (x->rc < 0) snprintf(x->err, sizeof x->err, "%s", dpc_errmsg());
}

static void export_after(uv_work_t *req, int status) {
  export_work *x = req->data;
  coord *c = x->c;
  svc_hold_remove(c, &x->hold);
  struct rpc_call *call = x->hold.call;
  if (status && x->rc == 0) x->rc = dpc_err(DPC_EINTERNAL, "export canceled");
  else if (x->rc < 0) dpc_err(x->rc, "%s", x->err);
  out_stream *os = call && x->rc == 0 ? calloc(1, sizeof *os) : NULL;
  if (!call) {
    /* the call ended meanwhile */
  } else if (x->rc < 0) {
    rpc_call_fail(call, x->rc);
  } else if (!os) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
  } else {
    export_buf *eb = x->eb;
    os->c = c;
    os->nparts = 2;
    os->part[0] = (out_part){.data = eb->cfg, .total = x->n1, .crc = dpc_crc32c(0, eb->cfg, x->n1),
                             .payload = DIPACO__V1__PAYLOAD__PAYLOAD_CONFIG_JSON};
    os->part[1] = (out_part){.data = eb->st, .total = x->n2, .crc = dpc_crc32c(0, eb->st, x->n2),
                             .payload = DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS};
    os->chunk = svc_chunk_size(x->max_chunk);
    os->ref = export_ref;
    os->unref = export_unref;
    os->ud = eb;
    x->eb = NULL; /* the stream's reference now */
    DPC_INFO("export of job %lld path %u: %zu + %zu bytes", (long long)x->job, x->path, x->n1, x->n2);
    svc_stream_start(call, os);
  }
  export_free(x);
  loop_work_done(c);
}

/* Every fill has ended: write the files on the thread pool, or answer the first failure. */
static void export_gathered(export_work *x) {
  coord *c = x->c;
  if (x->rc == 0 && loop_queue_work(c, &x->req, export_run, export_after) == 0) return;
  if (x->rc == 0) export_fail(x, dpc_err(DPC_EINTERNAL, "cannot queue the export"));
  svc_hold_remove(c, &x->hold);
  if (x->hold.call) {
    dpc_err(x->rc, "%s", x->err);
    rpc_call_fail(x->hold.call, x->rc);
  }
  export_free(x);
}

static void export_ready(coord *c, pcache_entry *e, int rc, void *ud) {
  (void)c;
  export_slot *sl = ud;
  export_work *x = sl->x;
  if (rc < 0) export_fail(x, rc);
  else x->e[sl->f] = e;
  if (--x->pending == 0) export_gathered(x);
}

/* Ask the parameter cache for every fragment of the path at the requested version (0 =
 * latest); export_gathered runs once all are there (now, or when the last fill ends). */
static void export_gather(coord *c, const coord_job *j, const Dipaco__V1__ExportPathRequest *r, export_work *x) {
  x->pending = 1; /* this loop's own, so that no fill's end can finish x before it ends */
  for (int f = 0; f < j->n_fragments && x->rc == 0; f++) {
    if (!coord_job_path_has_fragment(j, (int)r->path, f)) continue;
    store_fragment fr;
    int rc = !r->version ? store_get_fragment(c->st, j->id, f, &fr)
             : r->version > INT64_MAX ? DPC_ENOENT
                                      : store_get_version(c->st, j->id, f, (int64_t)r->version, &fr);
    if (rc < 0) {
      export_fail(x, dpc_err(DPC_ENOENT, "fragment %d version %llu is not kept", f + 1, (unsigned long long)r->version));
      break;
    }
    x->off[f] = j->fragments[f].offset;
    x->slots[f] = (export_slot){.x = x, .f = f};
    rc = pcache_get_async(c, &fr, &x->e[f], export_ready, &x->slots[f]);
    if (rc == 0) x->pending++;
    else if (rc < 0) export_fail(x, rc);
  }
  if (--x->pending == 0) export_gathered(x);
}

static void on_export_path(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  ProtobufCMessage *pm;
  if (svc_admin_unpack(c, call, req, &dipaco__v1__export_path_request__descriptor, &pm)) return;
  Dipaco__V1__ExportPathRequest *r = (Dipaco__V1__ExportPathRequest *)pm;
  coord_job *j = svc_job_or_fail(c, call, r->job_id);
  gpt_layout *lay = NULL;
  export_work *x = NULL;
  if (!j) goto out;
  if (r->path >= (uint32_t)j->n_paths) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "path: job %lld has %d path(s); got %u", (long long)j->id, j->n_paths, r->path);
    goto out;
  }
  lay = malloc(sizeof *lay);
  x = calloc(1, sizeof *x);
  if (x) {
    x->e = calloc((size_t)j->n_fragments, sizeof *x->e);
    x->off = calloc((size_t)j->n_fragments, sizeof *x->off);
    x->slots = calloc((size_t)j->n_fragments, sizeof *x->slots);
  }
  if (!lay || !x || !x->e || !x->off || !x->slots || jobspec_layout(&j->spec, lay) < 0) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory for the export");
    if (x) export_free(x);
    goto out;
  }
  x->c = c;
  x->job = j->id;
  x->path = r->path;
  x->max_chunk = r->max_chunk_bytes;
  x->model = j->spec.model;
  x->n_params = lay->n_params;
  x->n_frag = j->n_fragments;
  x->req.data = x;
  snprintf(x->dir, sizeof x->dir, "%s/tmp/export-%d-%llu", c->state_dir, (int)getpid(),
           (unsigned long long)++c->export_seq);
  svc_hold_add(c, &x->hold, call);
  export_gather(c, j, r, x);
out:
  free(lay);
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* ExportPath's end: an export still being gathered or written forgets the call. */
static void export_on_done(struct rpc_call *call, int cancelled, void *ud) {
  if (svc_hold_forget(ud, call)) return;
  svc_stream_on_done(call, cancelled, ud);
}

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Admin/CreateJob", .kind = RPC_UNARY, .on_call = on_create_job, .on_done = on_create_done},
    {.path = "/dipaco.v1.Admin/ListJobs", .kind = RPC_UNARY, .on_call = on_list_jobs},
    {.path = "/dipaco.v1.Admin/GetJob", .kind = RPC_UNARY, .on_call = on_get_job},
    {.path = "/dipaco.v1.Admin/PauseJob", .kind = RPC_UNARY, .on_call = on_pause_job},
    {.path = "/dipaco.v1.Admin/ResumeJob", .kind = RPC_UNARY, .on_call = on_resume_job},
    {.path = "/dipaco.v1.Admin/CancelJob", .kind = RPC_UNARY, .on_call = on_cancel_job},
    {.path = "/dipaco.v1.Admin/ExportPath", .kind = RPC_SERVER_STREAM, .on_call = on_export_path,
     .on_sent = svc_stream_on_sent, .on_done = export_on_done},
};

int admin_jobs_methods(coord *c, struct rpc_method *out) {
  return svc_methods_add(out, methods, (int)(sizeof methods / sizeof methods[0]), c);
}
