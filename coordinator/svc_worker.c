/* svc_worker.c — the dipaco.v1.Coordinator handlers of a worker's life: Register, Heartbeat,
 * Lease (with its long-poll) and Release (transfers: svc_push.c; inner state:
 * svc_inner.c). Every handler runs on the coordinator's loop thread (rpc_server_dispatch from
 * the uv_async callback); ud is the coord.
 *
 * Semantic choices where proto/dipaco.proto leaves room (for the worker and dipacoctl):
 *  - Sessions. The session token is 32 random bytes (getrandom) in hex; the store keeps only
 *    its SHA-256. Register with a valid (previous_worker_id, previous_session) pair keeps the
 *    worker id and token. Register itself needs the cluster's join token as metadata
 *    "authorization: Bearer <join token>" (common/auth.h; none with --insecure-no-auth):
 *    missing or wrong → UNAUTHENTICATED, the admin token → PERMISSION_DENIED (least
 *    privilege: it is not a join token). A call on another worker's lease (Heartbeat,
 *    PullFragment, PushDelta, Release) → PERMISSION_DENIED. A worker call with missing
 *    metadata, an unknown worker id or a
 *    wrong token fails UNAUTHENTICATED — except Heartbeat from a worker id the store does not
 *    know at all, which answers OK with COMMAND_REREGISTER (the coordinator lost its state).
 *  - Lease. A worker that already holds an active lease gets the same lease again. With
 *    inner.state keep a slot stays reserved for the worker that trained it last while that
 *    worker is alive (any call within lease_ttl_ms or long-polling, not gone, not draining),
 *    even while it trains another slot — its AdamW state lives there; a worker always gets
 *    its own slot first. With reset no slot is reserved. No work now:
 *    the call is held up to max_wait_ms (≤ 30 s, within the client deadline) and answered
 *    as soon as a slot frees, else LEASE_WAIT with wait_ms (≤ min(heartbeat, 500 ms)); no
 *    running job needing work → LEASE_NO_WORK.
 *    DataWindow.dataset is the lease path's data entries (data.paths[p] or data.train) joined with ','; first_batch =
 *    first_step = round · H. Hyper.total_steps = rounds · H, grad_accum = 1, seed = model seed.
 *  - Lease end. A lease ends (finished; the slot advances one round) as soon as deltas of all
 *    its fragments are durable; Release after that is an OK no-op. Release of an active lease
 *    returns the slot for the same round (no advance). Release with RELEASE_DRAINING (the
 *    worker is shutting down) also marks the worker gone: the slots kept for it are free;
 *    with lease_id 0 it only does that (a worker stopped between leases).
 *  - Heartbeat. Renews an active lease (expiry = now + lease_ttl_ms); a lease with no heartbeat
 *    for dead_after_ms (--dead-after-heartbeats intervals) is revoked sooner (leases.c). A
 *    heartbeat for a revoked (expired) lease says STOP. command: DRAIN when the
 *    worker is draining; STOP when the lease expired or was revoked/released, or its job was
 *    cancelled/failed; CONTINUE otherwise (also for a finished lease or a paused job — pause
 *    stops new leases, leases in flight finish their round). HeartbeatRequest.loss is kept
 *    and recorded with the slot's delta as the slot's loss for the round.
 *  - Watch. A worker keeps one open while it trains a lease; it is held (lease_watch_add) and
 *    answered after LEASE_WATCH_HOLD_MS, or at once with lease_ended when its lease ends here
 *    (lease_ended: revoked, its round closed without it). One that ends without an answer (the
 *    connection closed: the process died) revokes the worker's active leases after
 *    --reconnect-grace-ms unless a new Watch, a Register or a granted Lease of the worker comes
 *    first (leases.c).
 *  - Draining (Admin DrainWorker): Lease answers LEASE_NO_WORK; heartbeats say DRAIN (or the
 *    lease is released at once and heartbeats say STOP with immediate = true).
 *  - While shutting down every new call gets UNAVAILABLE. */
#include "coordinator/svc_worker.h"

#include "common/auth.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/rounds.h"
#include "coordinator/svc.h"
#include "coordinator/svc_inner.h"
#include "coordinator/svc_put.h"
#include "coordinator/blobs.h"
#include "proto/dipaco.pb-c.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ---- Register ----------------------------------------------------------------------------------- */

static int valid_text(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n > max) return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == '\t') return 0;
  return 1;
}

/* Register with a valid (previous_worker_id, previous_session) pair: the same id and token
 * (copied to tok). Returns the worker id, or 0 when the pair is not valid. */
static int64_t register_resume(coord *c, const Dipaco__V1__RegisterRequest *r, int64_t now, char *tok, size_t cap) {
  store_worker w;
  unsigned char h[DPC_TOKEN_HASH];
  svc_token_hash(r->previous_session, h);
  if (store_get_worker(c->st, (int64_t)r->previous_worker_id, &w) < 0 || !dpc_ct_equal(h, w.token_hash, sizeof h) ||
      strlen(r->previous_session) >= cap)
    return 0;
  snprintf(tok, cap, "%s", r->previous_session);
  if (w.state != WORKER_ACTIVE && w.state != WORKER_DRAINING) store_set_worker_state(c->st, w.id, WORKER_ACTIVE);
  store_touch_worker(c->st, w.id, now, -1);
  DPC_INFO("worker %lld (%s) re-registered with its previous session", (long long)w.id, w.name);
  return w.id;
}

/* The join token check of Register: 0 = allowed, -1 = the call was finished. */
static int register_join_check(const coord *c, struct rpc_call *call) {
  if (!c->keys.has_join) return 0;
  char v[DPC_TOKEN_MAX + 32];
  const char *jt = rpc_call_md(call, RPC_MD_AUTHORIZATION, v, sizeof v) >= 0 ? dpc_bearer_token(v) : NULL;
  unsigned char h[DPC_TOKEN_HASH];
  if (jt) svc_token_hash(jt, h);
  if (jt && dpc_ct_equal(h, c->keys.join, sizeof h)) return 0;
  int admin = jt && c->keys.has_admin && dpc_ct_equal(h, c->keys.admin, sizeof h);
  rpc_call_finish(call, admin ? RPC_PERMISSION_DENIED : RPC_UNAUTHENTICATED,
                  "Register: %s; send \"authorization: Bearer <join token>\" (dipaco-worker --token-file "
                  "STATE/join.token)",
                  admin ? "the admin token is not a join token" : jt ? "wrong join token" : "missing join token");
  return -1;
}

static void on_register(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  if (c->stopping) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
    return;
  }
  if (register_join_check(c, call) < 0) return;
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__register_request__descriptor, &pm)) return;
  Dipaco__V1__RegisterRequest *r = (Dipaco__V1__RegisterRequest *)pm;
  const char *bad = !valid_text(r->hostname, 127) ? "hostname"
                    : !valid_text(r->backend, 16) ? "backend"
                    : !valid_text(r->device, 96)  ? "device"
                    : !valid_text(r->labels, 120) ? "labels"
                    : !valid_text(r->previous_session, 128) ? "previous_session" : NULL;
  if (bad) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "%s: too long or has control characters", bad);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  char info[256];
  snprintf(info, sizeof info, "%s\t%s\t%s", r->backend, r->device, r->labels);
  char tok[2 * 32 + 1];
  int64_t id = 0;
  int64_t now = dpc_wall_ms();
  if (r->previous_worker_id && r->previous_worker_id <= INT64_MAX && r->previous_session[0])
    id = register_resume(c, r, now, tok, sizeof tok);
  if (!id) {
    unsigned char raw[32];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
      rpc_call_finish(call, RPC_INTERNAL, "getrandom failed");
      protobuf_c_message_free_unpacked(pm, NULL);
      return;
    }
    for (int i = 0; i < 32; i++) snprintf(tok + 2 * i, 3, "%02x", raw[i]);
    unsigned char h[DPC_TOKEN_HASH];
    svc_token_hash(tok, h);
    int rc = store_register_worker(c->st, r->hostname[0] ? r->hostname : "worker", h, info, now, &id);
    if (rc < 0) {
      rpc_call_fail(call, rc);
      protobuf_c_message_free_unpacked(pm, NULL);
      return;
    }
    DPC_INFO("worker %lld registered: host %s backend %s device %s threads %u", (long long)id, r->hostname, r->backend,
             r->device, r->threads);
  }
  lease_watch_seen(c, id); /* back on a new connection (a resumed identity) */
  Dipaco__V1__RegisterResponse resp = DIPACO__V1__REGISTER_RESPONSE__INIT;
  resp.worker_id = (uint64_t)id;
  resp.session_token = tok;
  resp.heartbeat_interval_ms = (uint32_t)c->heartbeat_ms;
  resp.lease_ttl_ms = (uint32_t)c->lease_ttl_ms;
  resp.max_chunk_bytes = MAX_CHUNK_ACCEPT;
  resp.max_message_bytes = RPC_MAX_MSG_DEFAULT;
  rpc_call_reply(call, &resp.base);
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* ---- Heartbeat ---------------------------------------------------------------------------------- */

static void on_heartbeat(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  int64_t worker;
  int a = svc_authenticate(c, call, &worker, 1);
  if (a < 0) return;
  Dipaco__V1__HeartbeatResponse resp = DIPACO__V1__HEARTBEAT_RESPONSE__INIT;
  resp.heartbeat_interval_ms = (uint32_t)c->heartbeat_ms;
  if (a == 0) {
    resp.command = DIPACO__V1__COMMAND__COMMAND_REREGISTER;
    rpc_call_reply(call, &resp.base);
    return;
  }
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__heartbeat_request__descriptor, &pm)) return;
  Dipaco__V1__HeartbeatRequest *r = (Dipaco__V1__HeartbeatRequest *)pm;
  svc_touch(c, worker, -1);
  lease_watch_heard(c, worker);
  /* steps_per_sec is the worker's own EWMA; the coordinator folds it into its estimate
   * (DyLU) together with completed leases (lease_speed_sample). */
  if (isfinite(r->steps_per_sec) && r->steps_per_sec > 0) lease_speed_sample(c, worker, r->steps_per_sec);
  store_worker w;
  store_get_worker(c->st, worker, &w);
  resp.command = w.state == WORKER_DRAINING ? DIPACO__V1__COMMAND__COMMAND_DRAIN : DIPACO__V1__COMMAND__COMMAND_CONTINUE;
  if (r->lease_id) {
    store_lease l;
    int rc = r->lease_id <= INT64_MAX ? store_get_lease(c->st, (int64_t)r->lease_id, &l) : DPC_ENOENT;
    if (rc < 0) {
      rpc_call_finish(call, RPC_NOT_FOUND, "lease_id %llu: no such lease", (unsigned long long)r->lease_id);
      protobuf_c_message_free_unpacked(pm, NULL);
      return;
    }
    if (l.worker != worker) {
      rpc_call_finish(call, RPC_PERMISSION_DENIED, "lease %lld belongs to another worker", (long long)l.id);
      protobuf_c_message_free_unpacked(pm, NULL);
      return;
    }
    coord_job *j = coord_job_get(c, l.job);
    if (l.state == LEASE_ACTIVE) {
      if (j && (j->state == JOB_CANCELED || j->state == JOB_FAILED)) {
        store_end_lease(c->st, l.id, LEASE_RELEASED, 0, 0, dpc_wall_ms());
        lease_ended(c, l.id, 1);
        resp.command = DIPACO__V1__COMMAND__COMMAND_STOP;
      } else {
        const int64_t now = dpc_wall_ms();
        int64_t exp = now + c->lease_ttl_ms;
        store_renew_lease(c->st, l.id, worker, exp);
        resp.lease_expires_unix_ms = exp;
        lease_note *n = coord_note(c, l.id, 1);
        if (n) n->hb_at = now; /* leases.c revokes a lease whose heartbeats stop */
        if (n && isfinite(r->loss)) n->loss = r->loss;
        if (n) n->tokens = r->tokens;
        if (j && isfinite(r->loss) && l.path < j->n_paths) j->path_loss[l.path] = r->loss;
      }
    } else if (l.state != LEASE_FINISHED) {
      resp.command = DIPACO__V1__COMMAND__COMMAND_STOP;
    }
  }
  rpc_call_reply(call, &resp.base);
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* ---- Watch -------------------------------------------------------------------------------------- */

/* Held until its hold is over (lease_answer_watches), then answered; answered with
 * lease_ended as soon as the lease it names ends here (lease_ended); at shutdown UNAVAILABLE. */
static void answer_watch(coord *c, void *call_, int how) {
  (void)c;
  struct rpc_call *call = call_;
  rpc_call_set_data(call, NULL); /* no longer held */
  if (how == WATCH_STOPPING) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
    return;
  }
  Dipaco__V1__WatchResponse resp = DIPACO__V1__WATCH_RESPONSE__INIT;
  resp.hold_ms = LEASE_WATCH_HOLD_MS;
  resp.lease_ended = how == WATCH_LEASE_ENDED;
  rpc_call_reply(call, &resp.base);
}

static void watch_on_done(struct rpc_call *call, int cancelled, void *ud) {
  if (!rpc_call_data(call)) return;
  if (lease_watch_ended(ud, call, cancelled)) rpc_call_set_data(call, NULL);
}

static void on_watch(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  int64_t worker;
  if (svc_authenticate(c, call, &worker, 0) < 0) return;
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__watch_request__descriptor, &pm)) return;
  const uint64_t lease_id = ((Dipaco__V1__WatchRequest *)pm)->lease_id;
  protobuf_c_message_free_unpacked(pm, NULL);
  svc_touch(c, worker, -1);
  if (rpc_call_deadline_ms(call) < LEASE_WATCH_HOLD_MS + 1000) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "Watch: the call's deadline must be at least %d ms away (the "
                    "coordinator holds a Watch that long)", LEASE_WATCH_HOLD_MS + 1000);
    return;
  }
  /* The lease it names: this worker's, else none. One that already ended is answered now. */
  int64_t lease = 0;
  store_lease l;
  if (lease_id && lease_id <= INT64_MAX && store_get_lease(c->st, (int64_t)lease_id, &l) == 0 && l.worker == worker) {
    if (l.state != LEASE_ACTIVE) {
      lease_watch_seen(c, worker);
      answer_watch(c, call, WATCH_LEASE_ENDED);
      return;
    }
    lease = l.id;
  }
  if (lease_watch_add(c, call, worker, lease) < 0) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  rpc_call_set_data(call, c); /* non-NULL: held */
}

/* ---- Lease -------------------------------------------------------------------------------------- */

static void fill_shape(const jobspec *js, Dipaco__V1__ModelShape *shape) {
  dipaco__v1__model_shape__init(shape);
  shape->vocab_size = (uint32_t)js->model.vocab_size;
  shape->padded_vocab_size = (uint32_t)js->model.vocab_size;
  shape->max_seq_len = (uint32_t)js->model.n_positions;
  shape->num_layers = (uint32_t)js->model.n_layer;
  shape->num_heads = (uint32_t)js->model.n_head;
  shape->channels = (uint32_t)js->model.n_embd;
  const gpt_config *m = &js->model;
  shape->arch = (uint32_t)m->arch;
  shape->num_key_value_heads = (uint32_t)m->n_kv_head;
  shape->intermediate_size = (uint32_t)m->intermediate_size;
  shape->tie_word_embeddings = m->tie_word_embeddings != 0;
  shape->attention_bias = m->attention_bias != 0;
  shape->rms_norm_eps = m->rms_norm_eps;
  shape->rope_theta = m->rope_theta;
  shape->rope_scaling = (uint32_t)m->rope_scaling;
  shape->rope_factor = m->rope_factor;
  shape->rope_low_freq_factor = m->rope_low_freq_factor;
  shape->rope_high_freq_factor = m->rope_high_freq_factor;
  shape->rope_original_max_position_embeddings = (uint32_t)m->rope_original_max_position_embeddings;
}

static void fill_hyper(const jobspec *js, Dipaco__V1__Hyper *hy) {
  dipaco__v1__hyper__init(hy);
  hy->lr = (float)js->inner.lr;
  hy->lr_min_frac = (float)js->inner.lr_min_frac;
  hy->warmup_steps = (uint64_t)js->inner.warmup;
  hy->total_steps = (uint64_t)jobspec_total_steps(js);
  hy->weight_decay = (float)js->inner.weight_decay;
  hy->beta1 = (float)js->inner.beta1;
  hy->beta2 = (float)js->inner.beta2;
  hy->eps = (float)js->inner.eps;
  hy->grad_clip = (float)js->inner.grad_clip;
  hy->batch_size = (uint32_t)js->batch;
  hy->seq_len = (uint32_t)js->seq_len;
  hy->grad_accum = 1;
  hy->seed = js->seed;
}

/* Lease fields 40-46: the inner optimizer and, for Muon, its settings (docs/design.md §4.3). */
static void fill_muon(const jobspec *js, Dipaco__V1__Lease *le) {
  if (js->inner.optimizer != INNER_OPT_MUON) return;
  const jobspec_muon *mu = &js->inner.muon;
  le->inner_optimizer = DIPACO__V1__INNER_OPTIMIZER__INNER_OPTIMIZER_MUON;
  le->muon_lr = (float)mu->lr;
  le->muon_momentum = (float)mu->momentum;
  le->muon_nesterov = mu->nesterov != 0;
  le->muon_ns_steps = (uint32_t)mu->ns_steps;
  le->muon_weight_decay = (float)jobspec_muon_weight_decay(js);
  le->muon_adjust_lr = (Dipaco__V1__MuonAdjustLr)mu->adjust_lr;
}

/* DataWindow.dataset: the data entries of the lease's path (data.paths[path], or data.train)
 * joined with ','; NULL when out of memory or the path has no list (the caller frees). */
static char *lease_dataset(const jobspec *js, int path) {
  const char(*d)[JOBSPEC_PATH_MAX] = NULL;
  int n = jobspec_path_data(js, path, &d);
  if (n < 0) return NULL;
  size_t dlen = 1;
  for (int i = 0; i < n; i++) dlen += strlen(d[i]) + 1;
  char *dataset = calloc(1, dlen);
  if (!dataset) return NULL;
  for (int i = 0; i < n; i++) {
    if (i) strcat(dataset, ",");
    strcat(dataset, d[i]);
  }
  return dataset;
}

/* The deadline of the lease's round (sync jobs with round_timeout_s), else 0. */
/* Lease.replay_pull: the job serves replay rounds (jobspec_replay_pull) and, for at least one
 * of the lease's fragments, the other slots' streams of a round are fewer bytes than the
 * fragment whole (fp32 deltas never are past one other slot; e3m0 up to 8 slots are): else the
 * worker would fetch the outer momentum for replays that cannot pay (docs/design.md §4.4). */
static int lease_replays(const coord_job *j, const int *fids, int nf) {
  if (!jobspec_replay_pull(&j->spec)) return 0;
  for (int i = 0; i < nf; i++) {
    const int f = fids[i];
    const size_t len = j->fragments[f].len;
    size_t sb = 0;
    if (j->spec.sparse.enabled) sb = j->sp_bytes[f];
    else if (dpc_codec_bytes(j->spec.streaming.codec, len,
                             dpc_codec_is_block(j->spec.streaming.codec) ? (uint32_t)j->spec.streaming.block_floats : 0,
                             &sb) < 0)
      continue;
    const double others = j->expected && j->expected[f] > 1 ? (double)(j->expected[f] - 1) : 1.0;
    if (others * (double)sb < 4.0 * (double)len) return 1;
  }
  return 0;
}

static int64_t lease_deadline(coord *c, const coord_job *j, const store_lease *l, const int *fids, int nf) {
  store_round rd;
  if (nf > 0 && j->spec.algorithm != JOB_ALGO_DILOCO_ASYNC &&
      store_get_round(c->st, l->job, fids[0], l->round, &rd) == 0)
    return rd.deadline_at;
  return 0;
}

/* FragmentInfo of the lease's fragments at their base versions (the current row when the base
 * version is no longer kept). */
static int lease_fragment_infos(coord *c, const coord_job *j, const store_lease *l, const int *fids,
                                const int64_t *bases, int nf, Dipaco__V1__FragmentInfo *fi,
                                Dipaco__V1__FragmentInfo **fp) {
  uint64_t pulled = 0;
  for (int i = 0; i < nf; i++) {
    store_fragment f;
    int rc;
    if (store_get_version(c->st, l->job, fids[i], bases[i], &f) < 0 &&
        (rc = store_get_fragment(c->st, l->job, fids[i], &f)) < 0)
      return rc;
    svc_fill_fragment_info(j, &f, bases[i], &fi[i]);
    fp[i] = &fi[i];
    /* On an S3 store the worker reads the parameters from the store itself; a URL that cannot
     * be made leaves it to PullFragment. (Only the row of the base version itself: a fallback
     * row holds another version.) */
    char url[S3_URL_MAX];
    pulled += (uint64_t)fi[i].num_floats * sizeof(float); /* fragments are pulled one after another */
    if (blob_store_is_s3(c->bs) && f.version == bases[i] && f.param_blob[0] &&
        blob_store_url(c->bs, f.param_blob, pulled, url, sizeof url) == 0)
      fi[i].params_url = strdup(url);
  }
  return 0;
}

static void reply_lease(struct rpc_call *call, coord *c, const store_lease *l) {
  lease_watch_seen(c, l->worker); /* alive and connected: its new lease's Watch follows */
  coord_job *j = coord_job_get(c, l->job);
  if (!j) {
    rpc_call_finish(call, RPC_INTERNAL, "lease %lld names unknown job %lld", (long long)l->id, (long long)l->job);
    return;
  }
  int *fids = NULL;
  int64_t *bases = NULL;
  int nf = 0;
  int rc = store_lease_fragments(c->st, l->id, &fids, &bases, &nf);
  if (rc < 0) {
    rpc_call_fail(call, rc);
    return;
  }
  Dipaco__V1__FragmentInfo *fi = calloc((size_t)nf, sizeof *fi);
  Dipaco__V1__FragmentInfo **fp = calloc((size_t)nf, sizeof *fp);
  uint64_t mods[JOBSPEC_MAX_LEVELS];
  int pm[JOBSPEC_MAX_LEVELS];
  int nl = jobspec_path_modules(&j->spec, l->path, pm);
  char *dataset = lease_dataset(&j->spec, l->path);
  if (!fi || !fp || !dataset || nl < 0) {
    rpc_call_finish(call, RPC_INTERNAL, "out of memory building lease %lld", (long long)l->id);
    goto out;
  }
  for (int i = 0; i < nl; i++) mods[i] = (uint64_t)pm[i] + 1;
  if ((rc = lease_fragment_infos(c, j, l, fids, bases, nf, fi, fp)) < 0) {
    rpc_call_fail(call, rc);
    goto out;
  }
  Dipaco__V1__Slot slot = DIPACO__V1__SLOT__INIT;
  slot.path = (uint32_t)l->path;
  slot.replica = (uint32_t)l->replica;
  Dipaco__V1__ModelShape shape;
  fill_shape(&j->spec, &shape);
  Dipaco__V1__Hyper hy;
  fill_hyper(&j->spec, &hy);
  Dipaco__V1__DataWindow dw = DIPACO__V1__DATA_WINDOW__INIT;
  dw.dataset = dataset;
  dw.path_index = "";
  dw.first_batch = (uint64_t)l->step_begin;
  dw.replica = (uint32_t)l->replica;
  dw.replicas = (uint32_t)j->spec.replicas;
  char *spec_json = NULL;
  if (jobspec_to_json(&j->spec, &spec_json) < 0) spec_json = NULL;
  Dipaco__V1__Lease le = DIPACO__V1__LEASE__INIT;
  le.lease_id = (uint64_t)l->id;
  le.job_id = (uint64_t)l->job;
  le.slot = &slot;
  le.algorithm = svc_algorithm_wire(&j->spec);
  le.model = &shape;
  le.n_path_modules = (size_t)nl;
  le.path_modules = mods;
  le.n_fragments = (size_t)nf;
  le.fragments = fp;
  le.inner_steps = (uint32_t)l->inner_steps;
  le.first_step = (uint64_t)l->step_begin;
  le.schedule_shift = l->sched_shift;
  le.round = (uint64_t)l->round;
  le.hyper = &hy;
  le.data = &dw;
  le.inner_state = (Dipaco__V1__InnerStatePolicy)j->spec.inner.state;
  le.has_inner_checkpoint = j->spec.inner.state == INNER_STATE_CHECKPOINT && l->round > 0 &&
                            svc_inner_ckpt_exists(c, j, l, fids, nf);
  le.deadline_unix_ms = lease_deadline(c, j, l, fids, nf);
  le.delta_codec = (Dipaco__V1__Codec)j->spec.streaming.codec;
  le.delta_block_floats = dpc_codec_is_block(j->spec.streaming.codec) ? (uint32_t)j->spec.streaming.block_floats : 0;
  le.streaming = jobspec_streaming(&j->spec);
  le.partial_push = coord_job_partial_ok(j);
  le.eager = j->spec.streaming.eager;
  le.pull_codec = (Dipaco__V1__Codec)j->spec.streaming.pull_codec;
  le.outer_lr = (float)j->spec.outer.lr;
  le.outer_momentum = (float)j->spec.outer.momentum;
  le.outer_nesterov = j->spec.outer.nesterov != 0;
  le.outer_momentum_warmup = (uint32_t)j->spec.outer.momentum_warmup;
  le.outer_momentum_decay = (uint32_t)j->spec.outer.momentum_decay;
  le.outer_rounds = (uint32_t)j->spec.rounds;
  le.replay_pull = lease_replays(j, fids, nf);
  le.delta_put = put_lease_wants(c, j);
  le.inner_put = put_inner_wants(c, j);
  le.delta_put_part_bytes = le.delta_put || le.inner_put ? put_part_bytes(c, j) : 0;
  if (j->spec.sparse.enabled) {
    le.delta_codec = (Dipaco__V1__Codec)DPC_CODEC_SPARSE;
    le.delta_block_floats = 0;
    le.sparse_density = j->spec.sparse.density;
    le.sparse_chunk = (uint32_t)j->spec.sparse.chunk;
    le.sparse_value_bits = (uint32_t)j->spec.sparse.value_bits;
    le.sparse_ef_beta = j->spec.sparse.ef_beta;
    le.sparse_pull = jobspec_sparse_pull(&j->spec);
  }
  fill_muon(&j->spec, &le);
  le.spec_json = spec_json ? spec_json : "";
  Dipaco__V1__LeaseResponse resp = DIPACO__V1__LEASE_RESPONSE__INIT;
  resp.outcome = DIPACO__V1__LEASE_OUTCOME__LEASE_GRANTED;
  resp.lease = &le;
  rpc_call_reply(call, &resp.base);
  free(spec_json);
out:
  for (int i = 0; fi && i < nf; i++)
    if (fi[i].params_url && fi[i].params_url != protobuf_c_empty_string) free(fi[i].params_url);
  free(fi);
  free(fp);
  free(dataset);
  free(fids);
  free(bases);
}

static void lease_wait_reply(struct rpc_call *call, coord *c, int outcome) {
  Dipaco__V1__LeaseResponse resp = DIPACO__V1__LEASE_RESPONSE__INIT;
  resp.outcome = outcome == SCHED_WAIT ? DIPACO__V1__LEASE_OUTCOME__LEASE_WAIT : DIPACO__V1__LEASE_OUTCOME__LEASE_NO_WORK;
  uint32_t wait = (uint32_t)(c->heartbeat_ms < 500 ? c->heartbeat_ms : 500);
  resp.wait_ms = outcome == SCHED_WAIT ? wait : (uint32_t)c->heartbeat_ms;
  if (outcome != SCHED_WAIT) {
    int live = 0;
    for (int i = 0; i < c->n_jobs; i++)
      live += c->jobs[i]->state == JOB_CREATED || c->jobs[i]->state == JOB_RUNNING || c->jobs[i]->state == JOB_PAUSED;
    resp.jobs_ended = c->n_jobs > 0 && live == 0;
  }
  rpc_call_reply(call, &resp.base);
}

/* Long-poll: a Lease call that got SCHED_WAIT and asked to wait (max_wait_ms) is parked in
 * leases.c's registry and retried whenever something may have freed work (a round closed, a
 * lease ended, a job was created or resumed, the timer); this answers it once the registry
 * lets go of it (c->park_answer_cb). */
static void answer_parked(coord *c, void *call_, int64_t worker, int outcome, const store_lease *l) {
  struct rpc_call *call = call_;
  rpc_call_set_data(call, NULL); /* no longer parked */
  if (outcome == SCHED_STOPPING) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
    return;
  }
  /* The worker was there all along, waiting in the long-poll: it counts as seen now, or a
   * poll longer than the liveness window would mark it gone until its next call. */
  svc_touch(c, worker, -1);
  if (outcome < 0) rpc_call_fail(call, outcome);
  else if (outcome == SCHED_GRANTED) reply_lease(call, c, l);
  else lease_wait_reply(call, c, outcome);
}

static void lease_on_done(struct rpc_call *call, int cancelled, void *ud) {
  if (!rpc_call_data(call)) return;
  if (lease_unpark_call(ud, call, cancelled)) rpc_call_set_data(call, NULL);
}

/* Park the call for up to max_wait_ms (within its deadline); 1 if parked. */
static int lease_try_park(coord *c, struct rpc_call *call, int64_t worker, const Dipaco__V1__LeaseRequest *r) {
  int64_t wait = r->max_wait_ms > 30000 ? 30000 : r->max_wait_ms;
  int64_t dl = rpc_call_deadline_ms(call);
  if (dl < INT64_MAX && wait > dl - 100) wait = dl - 100;
  if (wait <= 0 || lease_park(c, call, worker, (int64_t)r->job_id, dpc_wall_ms() + wait) < 0) return 0;
  rpc_call_set_data(call, c); /* non-NULL: parked */
  return 1;
}

static void on_lease(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  int64_t worker;
  if (svc_authenticate(c, call, &worker, 0) < 0) return;
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__lease_request__descriptor, &pm)) return;
  Dipaco__V1__LeaseRequest *r = (Dipaco__V1__LeaseRequest *)pm;
  svc_touch(c, worker, -1);
  if (r->job_id > INT64_MAX || (r->job_id && !coord_job_get(c, (int64_t)r->job_id))) {
    rpc_call_finish(call, RPC_NOT_FOUND, "job_id %llu: no such job", (unsigned long long)r->job_id);
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  store_lease l;
  int rc = lease_assign(c, worker, (int64_t)r->job_id, &l);
  if (rc < 0) rpc_call_fail(call, rc);
  else if (rc == SCHED_GRANTED) {
    coord_observe(c, HIST_LEASE_WAIT, 0); /* granted at once */
    reply_lease(call, c, &l);
  } else if (rc != SCHED_WAIT || !lease_try_park(c, call, worker, r)) lease_wait_reply(call, c, rc);
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* ---- Release ------------------------------------------------------------------------------------ */

/* Leases given back with RELEASE_ERROR this many times in a row (no lease of the job finished
 * in between) pause the job with the last worker's reason, so that a job whose data cannot be
 * read does not stay RUNNING with its slots taken and given back every few seconds forever.
 * `job resume` tries again. */
#define LEASE_ERRORS_PAUSE 6

static void lease_error(coord *c, const store_lease *l, const char *msg) {
  coord_job *j = coord_job_get(c, l->job);
  if (!j || j->state != JOB_RUNNING || ++j->lease_errors < LEASE_ERRORS_PAUSE) return;
  /* The worker's text goes into the job's message: printable ASCII only, bounded. */
  char clean[401];
  size_t n = 0;
  for (const char *m = msg ? msg : ""; *m && n < sizeof clean - 1; m++)
    clean[n++] = (*m >= 0x20 && *m < 0x7f) ? *m : '?';
  clean[n] = 0;
  char why[768];
  snprintf(why, sizeof why, "paused: %d leases in a row failed on the workers; the last (slot (path %d, replica %d), "
           "worker %lld): %s (fix it, then job resume; or cancel the job)", j->lease_errors, l->path, l->replica,
           (long long)l->worker, n ? clean : "no reason given");
  j->lease_errors = 0;
  coord_job_set_state(c, j, JOB_PAUSED, why);
}

/* The lease part of a Release: end an active lease of this worker (the slot is free for the
 * same round). 0, or -1 with the call answered with the error. */
static int release_lease(coord *c, struct rpc_call *call, int64_t worker, const Dipaco__V1__ReleaseRequest *r) {
  store_lease l;
  if (r->lease_id == 0 || r->lease_id > INT64_MAX || store_get_lease(c->st, (int64_t)r->lease_id, &l) < 0) {
    rpc_call_finish(call, RPC_NOT_FOUND, "lease_id %llu: no such lease", (unsigned long long)r->lease_id);
    return -1;
  }
  if (l.worker != worker) {
    rpc_call_finish(call, RPC_PERMISSION_DENIED, "lease %lld belongs to another worker", (long long)l.id);
    return -1;
  }
  if (l.state == LEASE_ACTIVE && lease_maybe_pushed(c, &l)) {
    /* Every delta of the lease is already durable (e.g. acknowledged just before a
     * coordinator restart): the lease is done, the slot moves on; the Release is a no-op. */
    rounds_check(c);
  } else if (l.state == LEASE_ACTIVE) {
    int rc = store_end_lease(c->st, l.id, LEASE_RELEASED, 0, 0, dpc_wall_ms());
    if (rc < 0) {
      rpc_call_fail(call, rc);
      return -1;
    }
    lease_ended(c, l.id, 0); /* the worker's own Release */
    rounds_check(c);
    if (r->reason == DIPACO__V1__RELEASE_REASON__RELEASE_ERROR) lease_error(c, &l, r->message);
    char msg[128];
    snprintf(msg, sizeof msg, "%.*s", 100, r->message);
    DPC_INFO("lease %lld released by worker %lld (reason %d%s%s): slot (path %d, replica %d) round %lld is free",
             (long long)l.id, (long long)worker, (int)r->reason, msg[0] ? ": " : "", msg, l.path, l.replica,
             (long long)l.round);
  }
  return 0;
}

static void on_release(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  int64_t worker;
  if (svc_authenticate(c, call, &worker, 0) < 0) return;
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__release_request__descriptor, &pm)) return;
  Dipaco__V1__ReleaseRequest *r = (Dipaco__V1__ReleaseRequest *)pm;
  svc_touch(c, worker, -1);
  const int leaving = r->reason == DIPACO__V1__RELEASE_REASON__RELEASE_DRAINING;
  /* Lease 0 with RELEASE_DRAINING: a worker stopped between leases holds none; only the
   * leaving below applies. */
  if ((r->lease_id != 0 || !leaving) && release_lease(c, call, worker, r) < 0) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return;
  }
  /* RELEASE_DRAINING: the worker is shutting down (SIGTERM: preemption, scancel, pod
   * deletion). It is gone from now on, so that a slot kept for it (inner_state keep) goes
   * to another worker at once rather than after the lease TTL; a call of it brings it back
   * (svc_touch), as for a worker revoked for silence. */
  if (leaving && store_set_worker_state(c->st, worker, WORKER_GONE) == 0) {
    DPC_INFO("worker %lld is shutting down%s: the slots kept for it are free", (long long)worker,
             r->lease_id ? "" : " (no lease)");
    rounds_check(c); /* answers parked Lease calls too */
  }
  Dipaco__V1__ReleaseResponse resp = DIPACO__V1__RELEASE_RESPONSE__INIT;
  rpc_call_reply(call, &resp.base);
  protobuf_c_message_free_unpacked(pm, NULL);
}

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Coordinator/Register", .kind = RPC_UNARY, .on_call = on_register},
    {.path = "/dipaco.v1.Coordinator/Heartbeat", .kind = RPC_UNARY, .on_call = on_heartbeat},
    {.path = "/dipaco.v1.Coordinator/Lease", .kind = RPC_UNARY, .on_call = on_lease, .on_done = lease_on_done},
    {.path = "/dipaco.v1.Coordinator/Release", .kind = RPC_UNARY, .on_call = on_release},
    {.path = "/dipaco.v1.Coordinator/Watch", .kind = RPC_UNARY, .on_call = on_watch, .on_done = watch_on_done},
};

int svc_worker_methods(coord *c, struct rpc_method *out) {
  c->park_answer_cb = answer_parked;
  c->watch_answer_cb = answer_watch;
  return svc_methods_add(out, methods, (int)(sizeof methods / sizeof methods[0]), c);
}
