/* service.c — the dipaco.v1.Coordinator RPC handlers (workers): Register, Heartbeat, Lease,
 * PullFragment, PushDelta, Release (PushInnerState and PullInnerState live in innerstate.c).
 * Every handler runs on the
 * coordinator's loop thread (rpc_server_dispatch from the uv_async callback).
 *
 * Semantic choices where proto/dipaco.proto leaves room (for the worker and dipacoctl):
 *  - Wire ids. fragment_id and module_id on the wire are the job spec's 0-based fragment /
 *    module ids + 1 (0 means "none" in the proto). Slot.path / Slot.replica are 0-based.
 *    FragmentInfo.offset_floats is the fragment's offset in the canonical flat layout of the
 *    WHOLE model (kernels/gpt.h), which is also the path's flat buffer (a path's modules tile
 *    the layout); num_floats its length. Plain DiLoCo: one fragment, offset 0, all params.
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
 *    DataWindow.dataset is the job spec's data.train entries joined with ','; first_batch =
 *    first_step = round · H. Hyper.total_steps = rounds · H, grad_accum = 1, seed = model seed.
 *  - Lease end. A lease ends (finished; the slot advances one round) as soon as deltas of all
 *    its fragments are durable; Release after that is an OK no-op. Release of an active lease
 *    returns the slot for the same round (no advance).
 *  - Heartbeat. Renews an active lease (expiry = now + lease_ttl_ms). command: DRAIN when the
 *    worker is draining; STOP when the lease expired or was revoked/released, or its job was
 *    cancelled/failed; CONTINUE otherwise (also for a finished lease or a paused job — pause
 *    stops new leases, leases in flight finish their round). HeartbeatRequest.loss is kept
 *    and recorded with the slot's delta as the slot's loss for the round.
 *  - PullFragment: requires an active lease of the caller covering the fragment; version =
 *    the lease's base version unless latest = true or version given; CODEC_FP32 only;
 *    chunk crc32c on the last chunk is the CRC-32C of the whole fp32 stream.
 *  - PushDelta: Chunk.version must be the lease's base version; num_floats = fragment length;
 *    total = 4 · num_floats; offsets contiguous from 0; the last chunk's crc32c must match
 *    (DATA_LOSS otherwise); NaN/Inf → INVALID_ARGUMENT. With outer.delta_norm_screen = k > 0 a
 *    delta whose L2 norm exceeds k × the median norm of the fragment's last accepted deltas
 *    (screen.h) → FAILED_PRECONDITION naming the norm and the bound; it is not stored. The
 *    answer comes only after every fragment of the stream is fsync'd and recorded.
 *    Chunk.inner_steps below the lease's (an async worker preempted mid-round) makes the lease
 *    count as that many steps (the slot's counter advances by them); in sync jobs it is
 *    ignored. A push on an expired/released lease whose round is still open → ABORTED; whose
 *    round closed → ack PUSH_LATE. A repeat of an accepted (lease, fragment, crc) →
 *    PUSH_DUPLICATE; a different delta for the same lease and fragment → ALREADY_EXISTS.
 *    FragmentAck.version = the round's target version (t + 1).
 *  - Async (diloco-async, see sched.c): leases start from the current versions; a delta is
 *    applied on its own soon after it is durable. FragmentAck.version = the fragment's
 *    version when the delta was taken in + 1, staleness = that version − base. With
 *    max_staleness > 0 a delta staler than it is read and dropped (PUSH_STALE; the lease
 *    ends and the slot's step counter moves on). Heartbeat steps_per_sec feeds the
 *    coordinator's per-worker speed EWMA (DyLU).
 *  - Draining (Admin DrainWorker): Lease answers LEASE_NO_WORK; heartbeats say DRAIN (or the
 *    lease is released at once and heartbeats say STOP with immediate = true).
 *  - Inner state (inner.state checkpoint). PushInnerState: on an active lease of the caller,
 *    for each fragment of the lease a PAYLOAD_ADAM_M and a PAYLOAD_ADAM_V stream (CODEC_FP32,
 *    num_floats = fragment length, Chunk.step = the AdamW step count after the round, crc32c
 *    on the last chunk, finite values). Each stream is written durably as blob
 *    BLOB_INNER_M / BLOB_INNER_V (version = the lease's round, aux = slot id = path · R +
 *    replica + 1; the M blob carries the step as two extra floats' bit patterns) before the
 *    reply; the checkpoint of round − 2 is then deleted. The worker pushes inner state BEFORE
 *    the delta, so when a slot's round r is finished (delta durable) its round-r state is
 *    durable too. Lease.has_inner_checkpoint: the M and V blobs of round − 1 exist for every
 *    fragment of the lease. PullInnerState: an active lease of the caller; fragment_id
 *    required (one fragment: its M stream then its V stream, Chunk.step set, version = the
 *    round the state is from); NOT_FOUND when no checkpoint of round − 1 exists.
 *  - While shutting down every new call gets UNAVAILABLE. */
#include "coordinator/coord.h"
#include "coordinator/screen.h"
#include "coordinator/service_internal.h"
#include "coordinator/testhook.h"

#include "common/auth.h"
#include "common/checksum.h"
#include "common/errors.h"
#include "common/log.h"
#include "proto/dipaco.pb-c.h"

#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define MAX_REQ_BYTES (64u << 10)

coord *g_coord;

/* ---- helpers ---------------------------------------------------------------------------------- */

static void hash_token(const char *tok, unsigned char out[STORE_TOKEN_HASH_BYTES]) {
  unsigned int n = 0;
  EVP_Digest(tok, strlen(tok), out, &n, EVP_sha256(), NULL);
}

static int ct_equal(const unsigned char *a, const unsigned char *b, size_t n) {
  unsigned char d = 0;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

static int parse_u64(const char *s, uint64_t *out) {
  if (!*s) return -1;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return -1;
    if (v > (UINT64_MAX - 9) / 10) return -1;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *out = v;
  return 0;
}

/* 1 = authenticated (*worker set), 0 = unknown worker id (call not finished), -1 = finished
 * with UNAUTHENTICATED / UNAVAILABLE. */
int svc_authenticate(struct rpc_call *call, int64_t *worker, int allow_unknown) {
  coord *c = g_coord;
  if (c->stopping) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
    return -1;
  }
  char idbuf[32], tok[160];
  uint64_t id;
  if (rpc_call_md(call, RPC_MD_WORKER_ID, idbuf, sizeof idbuf) < 0 || parse_u64(idbuf, &id) < 0 || id == 0 ||
      id > INT64_MAX) {
    rpc_call_finish(call, RPC_UNAUTHENTICATED, "missing or malformed %s metadata; call Register first", RPC_MD_WORKER_ID);
    return -1;
  }
  if (rpc_call_md(call, RPC_MD_SESSION, tok, sizeof tok) < 0) {
    rpc_call_finish(call, RPC_UNAUTHENTICATED, "missing or malformed %s metadata; call Register first", RPC_MD_SESSION);
    return -1;
  }
  store_worker w;
  int rc = store_get_worker(c->st, (int64_t)id, &w);
  if (rc == DPC_ENOENT && allow_unknown) {
    *worker = (int64_t)id;
    return 0;
  }
  unsigned char h[STORE_TOKEN_HASH_BYTES];
  hash_token(tok, h);
  if (rc < 0 || !ct_equal(h, w.token_hash, sizeof h)) {
    rpc_call_finish(call, RPC_UNAUTHENTICATED, "unknown worker %llu or wrong session token; Register again",
                    (unsigned long long)id);
    return -1;
  }
  *worker = (int64_t)id;
  return 1;
}

int svc_unpack(struct rpc_call *call, const struct grpc_byte_buffer *req, const ProtobufCMessageDescriptor *d,
                  ProtobufCMessage **out) {
  int rc = rpc_msg_unpack(req, d, MAX_REQ_BYTES, out);
  if (rc < 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "malformed %s: %s", d->name, dpc_errmsg());
    return -1;
  }
  return 0;
}

/* Any authenticated call counts as a sign of life. */
void svc_touch(coord *c, int64_t worker, double sps) {
  store_worker w;
  if (store_get_worker(c->st, worker, &w) == 0 && w.state == WORKER_GONE) {
    store_set_worker_state(c->st, worker, WORKER_ACTIVE);
    DPC_INFO("worker %lld (%s) is back", (long long)worker, w.name);
  }
  store_touch_worker(c->st, worker, coord_now_ms(), sps);
}

uint32_t coord_chunk_size(uint32_t req) {
  if (req == 0) return RPC_CHUNK_DEFAULT;
  if (req < RPC_CHUNK_MIN) return RPC_CHUNK_MIN;
  if (req > RPC_CHUNK_DEFAULT) return RPC_CHUNK_DEFAULT;
  return req;
}

void coord_fill_fragment_info(const coord_job *j, const store_fragment *f, int64_t version,
                              Dipaco__V1__FragmentInfo *fi) {
  dipaco__v1__fragment_info__init(fi);
  const jobspec_fragment *jf = &j->fragments[f->fragment];
  const jobspec_module *m = &j->modules[jf->module];
  fi->fragment_id = (uint64_t)f->fragment + 1;
  fi->module_id = (uint64_t)jf->module + 1;
  fi->level = (uint32_t)m->level;
  fi->index = 0;
  fi->version = (uint64_t)version;
  fi->offset_floats = jf->offset;
  fi->num_floats = jf->len;
  fi->crc32c = f->param_crc;
  fi->merge_alpha = 0;
  fi->updated_unix_ms = (uint64_t)f->created_at;
}

/* ---- server-streaming chunk sender -------------------------------------------------------------- */

static void stream_send_next(struct rpc_call *call, out_stream *os) {
  if (os->cur >= os->nparts) {
    rpc_call_finish(call, RPC_OK, "%s", "");
    return;
  }
  out_part *p = &os->part[os->cur];
  if (os->lease_id && os->next > 0 && p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS) TESTHOOK("pull");
  uint64_t len = p->total - os->next;
  if (len > os->chunk) len = os->chunk;
  struct rpc_chunk ch = {.lease_id = os->lease_id, .fragment_id = p->fragment_id, .version = p->version,
                         .offset = os->next, .total = p->total, .codec = 0, .num_floats = p->num_floats,
                         .payload = p->payload, .step = p->step, .len = len};
  int last = os->next + len == p->total;
  if (last) ch.crc32c = p->crc;
  if (len > 0) os->ref(os->ud);
  struct grpc_byte_buffer *m = rpc_chunk_encode(&ch, p->data + os->next, len > 0 ? os->unref : NULL, os->ud);
  if (!m) {
    if (len > 0) os->unref(os->ud);
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory encoding a chunk");
    return;
  }
  os->c->bytes_out += len;
  if (os->lease_id) {
    lease_note *n = coord_note(os->c, (int64_t)os->lease_id, 1);
    if (n) n->bytes_out += len;
    if (n && last) n->pull_done_s = coord_mono_s();
  }
  if (last) {
    os->cur++;
    os->next = 0;
  } else {
    os->next += len;
  }
  if (rpc_call_send(call, m) < 0) rpc_call_finish(call, RPC_INTERNAL, "send failed: %s", dpc_errmsg());
}

void coord_stream_start(struct rpc_call *call, out_stream *os) {
  rpc_call_set_data(call, os);
  stream_send_next(call, os);
}

void coord_stream_on_sent(struct rpc_call *call, int ok, void *ud) {
  (void)ud;
  out_stream *os = rpc_call_data(call);
  if (ok && os) stream_send_next(call, os);
}

void coord_stream_on_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  out_stream *os = rpc_call_data(call);
  if (!os) return;
  os->unref(os->ud);
  free(os);
  rpc_call_set_data(call, NULL);
}

/* ---- Register ----------------------------------------------------------------------------------- */

static int valid_text(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n > max) return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x20 || s[i] == '\t') return 0;
  return 1;
}

static void on_register(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  if (c->stopping) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
    return;
  }
  if (dpc_coord_keys.has_join) {
    char v[DPC_TOKEN_MAX + 32];
    const char *jt = rpc_call_md(call, RPC_MD_AUTHORIZATION, v, sizeof v) >= 0 ? dpc_bearer_token(v) : NULL;
    unsigned char h[STORE_TOKEN_HASH_BYTES];
    if (jt) hash_token(jt, h);
    if (!jt || !ct_equal(h, dpc_coord_keys.join, sizeof h)) {
      int admin = jt && dpc_coord_keys.has_admin && ct_equal(h, dpc_coord_keys.admin, sizeof h);
      rpc_call_finish(call, admin ? RPC_PERMISSION_DENIED : RPC_UNAUTHENTICATED,
                      "Register: %s; send \"authorization: Bearer <join token>\" (dipaco-worker --token-file "
                      "STATE/join.token)",
                      admin ? "the admin token is not a join token" : jt ? "wrong join token" : "missing join token");
      return;
    }
  }
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
  int64_t now = coord_now_ms();
  if (r->previous_worker_id && r->previous_worker_id <= INT64_MAX && r->previous_session[0]) {
    store_worker w;
    unsigned char h[STORE_TOKEN_HASH_BYTES];
    hash_token(r->previous_session, h);
    if (store_get_worker(c->st, (int64_t)r->previous_worker_id, &w) == 0 && ct_equal(h, w.token_hash, sizeof h) &&
        strlen(r->previous_session) < sizeof tok) {
      id = w.id;
      snprintf(tok, sizeof tok, "%s", r->previous_session);
      if (w.state != WORKER_ACTIVE && w.state != WORKER_DRAINING) store_set_worker_state(c->st, id, WORKER_ACTIVE);
      store_touch_worker(c->st, id, now, -1);
      DPC_INFO("worker %lld (%s) re-registered with its previous session", (long long)id, w.name);
    }
  }
  if (!id) {
    unsigned char raw[32];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
      rpc_call_finish(call, RPC_INTERNAL, "getrandom failed");
      protobuf_c_message_free_unpacked(pm, NULL);
      return;
    }
    for (int i = 0; i < 32; i++) snprintf(tok + 2 * i, 3, "%02x", raw[i]);
    unsigned char h[STORE_TOKEN_HASH_BYTES];
    hash_token(tok, h);
    int rc = store_register_worker(c->st, r->hostname[0] ? r->hostname : "worker", h, info, now, &id);
    if (rc < 0) {
      rpc_call_fail(call, rc);
      protobuf_c_message_free_unpacked(pm, NULL);
      return;
    }
    DPC_INFO("worker %lld registered: host %s backend %s device %s threads %u", (long long)id, r->hostname, r->backend,
             r->device, r->threads);
  }
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
  (void)ud;
  coord *c = g_coord;
  int64_t worker;
  int a = svc_authenticate(call, &worker, 1);
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
  /* steps_per_sec is the worker's own EWMA; the coordinator folds it into its estimate
   * (DyLU) together with completed leases (sched_speed_sample). */
  if (isfinite(r->steps_per_sec) && r->steps_per_sec > 0) sched_speed_sample(c, worker, r->steps_per_sec);
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
        store_end_lease(c->st, l.id, LEASE_RELEASED, 0, 0, coord_now_ms());
        coord_note_drop(c, l.id);
        resp.command = DIPACO__V1__COMMAND__COMMAND_STOP;
      } else {
        int64_t exp = coord_now_ms() + c->lease_ttl_ms;
        store_renew_lease(c->st, l.id, worker, exp);
        resp.lease_expires_unix_ms = exp;
        lease_note *n = coord_note(c, l.id, 1);
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

/* ---- Lease -------------------------------------------------------------------------------------- */


static void reply_lease(struct rpc_call *call, coord *c, const store_lease *l) {
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
  char *dataset = NULL;
  size_t dlen = 1;
  for (int i = 0; i < j->spec.n_train; i++) dlen += strlen(j->spec.train[i]) + 1;
  dataset = calloc(1, dlen);
  if (!fi || !fp || !dataset || nl < 0) {
    rpc_call_finish(call, RPC_INTERNAL, "out of memory building lease %lld", (long long)l->id);
    goto out;
  }
  for (int i = 0; i < j->spec.n_train; i++) {
    if (i) strcat(dataset, ",");
    strcat(dataset, j->spec.train[i]);
  }
  for (int i = 0; i < nl; i++) mods[i] = (uint64_t)pm[i] + 1;
  for (int i = 0; i < nf; i++) {
    store_fragment f;
    if (store_get_version(c->st, l->job, fids[i], bases[i], &f) < 0 &&
        (rc = store_get_fragment(c->st, l->job, fids[i], &f)) < 0) {
      rpc_call_fail(call, rc);
      goto out;
    }
    coord_fill_fragment_info(j, &f, bases[i], &fi[i]);
    fp[i] = &fi[i];
  }
  Dipaco__V1__Slot slot = DIPACO__V1__SLOT__INIT;
  slot.path = (uint32_t)l->path;
  slot.replica = (uint32_t)l->replica;
  Dipaco__V1__ModelShape shape = DIPACO__V1__MODEL_SHAPE__INIT;
  shape.vocab_size = (uint32_t)j->spec.model.vocab_size;
  shape.padded_vocab_size = (uint32_t)j->spec.model.vocab_size;
  shape.max_seq_len = (uint32_t)j->spec.model.n_positions;
  shape.num_layers = (uint32_t)j->spec.model.n_layer;
  shape.num_heads = (uint32_t)j->spec.model.n_head;
  shape.channels = (uint32_t)j->spec.model.n_embd;
  Dipaco__V1__Hyper hy = DIPACO__V1__HYPER__INIT;
  hy.lr = (float)j->spec.inner.lr;
  hy.lr_min_frac = (float)j->spec.inner.lr_min_frac;
  hy.warmup_steps = (uint64_t)j->spec.inner.warmup;
  hy.total_steps = (uint64_t)jobspec_total_steps(&j->spec);
  hy.weight_decay = (float)j->spec.inner.weight_decay;
  hy.beta1 = (float)j->spec.inner.beta1;
  hy.beta2 = (float)j->spec.inner.beta2;
  hy.eps = (float)j->spec.inner.eps;
  hy.grad_clip = (float)j->spec.inner.grad_clip;
  hy.batch_size = (uint32_t)j->spec.batch;
  hy.seq_len = (uint32_t)j->spec.seq_len;
  hy.grad_accum = 1;
  hy.seed = j->spec.seed;
  Dipaco__V1__DataWindow dw = DIPACO__V1__DATA_WINDOW__INIT;
  dw.dataset = dataset;
  dw.path_index = "";
  dw.first_batch = (uint64_t)l->step_begin;
  dw.replica = (uint32_t)l->replica;
  dw.replicas = (uint32_t)j->spec.replicas;
  store_round rd;
  int64_t deadline = 0;
  if (nf > 0 && j->spec.algorithm != JOB_ALGO_DILOCO_ASYNC && store_get_round(c->st, l->job, fids[0], l->round, &rd) == 0)
    deadline = rd.deadline_at;
  char *spec_json = NULL;
  if (jobspec_to_json(&j->spec, &spec_json) < 0) spec_json = NULL;
  Dipaco__V1__Lease le = DIPACO__V1__LEASE__INIT;
  le.lease_id = (uint64_t)l->id;
  le.job_id = (uint64_t)l->job;
  le.slot = &slot;
  le.algorithm = j->spec.algorithm != JOB_ALGO_DILOCO_ASYNC ? DIPACO__V1__ALGORITHM__ALGORITHM_SYNC
                 : j->spec.outer.async_rule == OUTER_ASYNC_DN ? DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_DELAYED
                                                              : DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_NESTEROV;
  le.model = &shape;
  le.n_path_modules = (size_t)nl;
  le.path_modules = mods;
  le.n_fragments = (size_t)nf;
  le.fragments = fp;
  le.inner_steps = (uint32_t)l->inner_steps;
  le.first_step = (uint64_t)l->step_begin;
  le.round = (uint64_t)l->round;
  le.hyper = &hy;
  le.data = &dw;
  le.inner_state = (Dipaco__V1__InnerStatePolicy)j->spec.inner.state;
  le.has_inner_checkpoint = j->spec.inner.state == INNER_STATE_CHECKPOINT && l->round > 0 &&
                            svc_inner_ckpt_exists(c, j, l, fids, nf);
  le.deadline_unix_ms = deadline;
  le.delta_codec = DIPACO__V1__CODEC__CODEC_FP32;
  le.spec_json = spec_json ? spec_json : "";
  Dipaco__V1__LeaseResponse resp = DIPACO__V1__LEASE_RESPONSE__INIT;
  resp.outcome = DIPACO__V1__LEASE_OUTCOME__LEASE_GRANTED;
  resp.lease = &le;
  rpc_call_reply(call, &resp.base);
  free(spec_json);
out:
  free(fi);
  free(fp);
  free(dataset);
  free(fids);
  free(bases);
}

/* Long-poll: Lease calls that got SCHED_WAIT and asked to wait (max_wait_ms) are parked and
 * retried whenever something may have freed work (a round closed, a lease ended, a job was
 * created or resumed, the timer), answered at their deadline with LEASE_WAIT. */
typedef struct parked {
  struct rpc_call *call;
  int64_t worker, job, deadline;
} parked;

static parked *g_parked;
static int g_n_parked, g_cap_parked;

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

int coord_is_parked(int64_t worker) {
  for (int i = 0; i < g_n_parked; i++)
    if (g_parked[i].worker == worker) return 1;
  return 0;
}

static void unpark(int i) {
  rpc_call_set_data(g_parked[i].call, NULL);
  g_parked[i] = g_parked[--g_n_parked];
}

void coord_retry_parked(coord *c, int flush) {
  int64_t now = coord_now_ms();
  for (int i = 0; i < g_n_parked;) {
    parked pk = g_parked[i];
    if (flush || c->stopping) {
      unpark(i);
      rpc_call_finish(pk.call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
      continue;
    }
    store_lease l;
    int rc = sched_lease(c, pk.worker, pk.job, &l);
    if (rc == SCHED_WAIT && now < pk.deadline) {
      i++;
      continue;
    }
    unpark(i);
    /* The worker was there all along, waiting in the long-poll: it counts as seen now, or a
     * poll longer than the liveness window would mark it gone until its next call. */
    svc_touch(c, pk.worker, -1);
    if (rc < 0) rpc_call_fail(pk.call, rc);
    else if (rc == SCHED_GRANTED) reply_lease(pk.call, c, &l);
    else lease_wait_reply(pk.call, c, rc);
  }
}

static void lease_on_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  if (!rpc_call_data(call)) return;
  for (int i = 0; i < g_n_parked; i++)
    if (g_parked[i].call == call) {
      unpark(i);
      return;
    }
}

static void on_lease(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  int64_t worker;
  if (svc_authenticate(call, &worker, 0) < 0) return;
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
  int rc = sched_lease(c, worker, (int64_t)r->job_id, &l);
  if (rc < 0) {
    rpc_call_fail(call, rc);
  } else if (rc == SCHED_GRANTED) {
    reply_lease(call, c, &l);
  } else {
    int64_t wait = r->max_wait_ms > 30000 ? 30000 : r->max_wait_ms;
    int64_t dl = rpc_call_deadline_ms(call);
    if (dl < INT64_MAX && wait > dl - 100) wait = dl - 100;
    if (rc == SCHED_WAIT && wait > 0) {
      if (g_n_parked == g_cap_parked) {
        int cap = g_cap_parked ? 2 * g_cap_parked : 16;
        parked *a = realloc(g_parked, (size_t)cap * sizeof *a);
        if (a) {
          g_parked = a;
          g_cap_parked = cap;
        }
      }
      if (g_n_parked < g_cap_parked) {
        g_parked[g_n_parked++] = (parked){.call = call, .worker = worker, .job = (int64_t)r->job_id,
                                          .deadline = coord_now_ms() + wait};
        rpc_call_set_data(call, &g_parked[0]); /* non-NULL: parked */
        protobuf_c_message_free_unpacked(pm, NULL);
        return;
      }
    }
    lease_wait_reply(call, c, rc);
  }
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* ---- PullFragment ------------------------------------------------------------------------------- */

static void on_pull(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  int64_t worker;
  if (svc_authenticate(call, &worker, 0) < 0) return;
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__pull_fragment_request__descriptor, &pm)) return;
  Dipaco__V1__PullFragmentRequest *r = (Dipaco__V1__PullFragmentRequest *)pm;
  svc_touch(c, worker, -1);
  store_lease l;
  int64_t base;
  int frag = (int)(r->fragment_id - 1);
  if (r->lease_id == 0 || r->lease_id > INT64_MAX || store_get_lease(c->st, (int64_t)r->lease_id, &l) < 0) {
    rpc_call_finish(call, RPC_NOT_FOUND, "lease_id %llu: no such lease", (unsigned long long)r->lease_id);
  } else if (l.worker != worker) {
    rpc_call_finish(call, RPC_PERMISSION_DENIED, "lease %lld belongs to another worker", (long long)l.id);
  } else if (l.state != LEASE_ACTIVE) {
    rpc_call_finish(call, RPC_ABORTED, "lease %lld is no longer active; ask for a new lease", (long long)l.id);
  } else if (r->fragment_id == 0 || r->fragment_id > 1u << 30 ||
             store_lease_base_version(c->st, l.id, frag, &base) < 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "fragment_id %llu is not a fragment of lease %lld",
                    (unsigned long long)r->fragment_id, (long long)l.id);
  } else if (r->codec != DIPACO__V1__CODEC__CODEC_FP32) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "codec %d: this coordinator serves CODEC_FP32 only", (int)r->codec);
  } else {
    store_fragment f;
    int rc;
    if (r->latest) rc = store_get_fragment(c->st, l.job, frag, &f);
    else rc = store_get_version(c->st, l.job, frag, r->version ? (int64_t)r->version : base, &f);
    if (r->version > INT64_MAX) rc = DPC_ENOENT;
    pcache_entry *e = NULL;
    if (rc < 0) {
      rpc_call_finish(call, RPC_NOT_FOUND, "fragment %llu version %llu is not kept", (unsigned long long)r->fragment_id,
                      (unsigned long long)(r->version ? r->version : (uint64_t)base));
    } else if ((rc = pcache_get(c, &f, &e)) < 0) {
      rpc_call_fail(call, rc);
    } else if (r->offset > (uint64_t)e->n * 4) {
      rpc_call_finish(call, RPC_OUT_OF_RANGE, "offset %llu is past the end (%zu bytes)", (unsigned long long)r->offset,
                      e->n * 4);
      pcache_unref(e);
    } else {
      out_stream *os = calloc(1, sizeof *os);
      if (!os) {
        pcache_unref(e);
        rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
      } else {
        os->c = c;
        os->nparts = 1;
        os->part[0] = (out_part){.data = (const uint8_t *)e->data, .total = (uint64_t)e->n * 4, .crc = e->crc,
                                 .payload = DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS, .fragment_id = r->fragment_id,
                                 .version = (uint64_t)f.version, .num_floats = e->n};
        os->next = r->offset;
        os->lease_id = (uint64_t)l.id;
        os->chunk = coord_chunk_size(r->max_chunk_bytes);
        os->ref = NULL;
        os->unref = pcache_unref;
        os->ud = e;
        os->ref = coord_pcache_ref;
        DPC_DEBUG("lease %lld pulls fragment %d version %lld from byte %llu", (long long)l.id, frag, (long long)f.version,
                  (unsigned long long)r->offset);
        coord_stream_start(call, os);
      }
    }
  }
  protobuf_c_message_free_unpacked(pm, NULL);
}

void coord_pcache_ref(void *ud) { atomic_fetch_add(&((pcache_entry *)ud)->refs, 1); }

/* ---- PushDelta ---------------------------------------------------------------------------------- */

typedef struct push {
  coord *c;
  struct rpc_call *call; /* NULL once the call is over */
  int finished;          /* a status was sent */
  int busy;              /* a commit is in the thread pool */
  int64_t worker;
  int have_lease;
  store_lease lease;
  /* the fragment being received */
  int in_frag, frag, mode; /* mode: 0 write, 1 duplicate check, 2 late, 3 stale (async) */
  uint32_t dup_crc;
  int64_t base;
  uint64_t total, next, tokens, inner_steps, version;
  uint32_t crc;
  double ss, norm; /* sum of squares of the fragment's floats so far; its L2 norm at the end */
  unsigned char carry[4];
  int ncarry;
  blob_writer *w;
  char blob[BLOB_NAME_MAX];
  unsigned char *buf;
  size_t cap;
  uint64_t bytes;
  Dipaco__V1__FragmentAck *acks;
  int n_acks, cap_acks;
  uv_work_t req;
  int work_rc;
  uint32_t work_crc;
  char err[512];
} push;

static void push_free(push *p) {
  if (p->w) blob_writer_abort(p->w);
  free(p->buf);
  free(p->acks);
  free(p);
}

static void push_fail(push *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void push_fail(push *p, int code, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (p->w) {
    blob_writer_abort(p->w);
    p->w = NULL;
  }
  p->in_frag = 0;
  if (!p->finished && p->call) {
    p->finished = 1;
    DPC_WARN("PushDelta from worker %lld rejected: %s", (long long)p->worker, msg);
    rpc_call_finish(p->call, code, "%s", msg);
  }
}

static int push_ack(push *p, int frag, int result, uint64_t version) {
  if (p->n_acks == p->cap_acks) {
    int cap = p->cap_acks ? 2 * p->cap_acks : 4;
    Dipaco__V1__FragmentAck *a = realloc(p->acks, (size_t)cap * sizeof *a);
    if (!a) return DPC_ENOMEM;
    p->acks = a;
    p->cap_acks = cap;
  }
  Dipaco__V1__FragmentAck *a = &p->acks[p->n_acks++];
  dipaco__v1__fragment_ack__init(a);
  a->fragment_id = (uint64_t)frag + 1;
  a->result = result;
  a->version = version;
  /* Async: the version the fragment is at when the delta was taken in + 1 (the version it
   * produces unless other deltas are queued before it) and the staleness it had then. */
  coord_job *j = coord_job_get(p->c, p->lease.job);
  if (j && j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC) {
    int64_t st = sched_async_staleness(p->c, j, frag, p->base);
    if (st >= 0) {
      a->staleness = (uint64_t)st;
      a->version = (uint64_t)(p->base + st + 1);
    }
  }
  return 0;
}

/* The fragment's norm screen window (coordinator/screen.h), loaded from the store on first use
 * after a start; NULL (logged) when it cannot be had — the screen then lets deltas through
 * rather than refuse honest work for a local failure. */
static screen_window *push_screen_window(coord *c, coord_job *j, int frag) {
  if (frag < 0 || frag >= j->n_fragments) return NULL;
  if (!j->screen && !(j->screen = calloc((size_t)j->n_fragments, sizeof *j->screen))) return NULL;
  screen_window *sw = &j->screen[frag];
  if (!sw->loaded) {
    double v[SCREEN_WINDOW];
    int n = 0;
    if (store_delta_norms(c->st, j->id, frag, SCREEN_WINDOW, v, &n) < 0) {
      DPC_WARN("job %lld fragment %d: cannot read recent delta norms: %s", (long long)j->id, frag + 1, dpc_errmsg());
      return NULL;
    }
    for (int i = 0; i < n; i++) screen_add(sw, v[i]);
    sw->loaded = 1;
  }
  return sw;
}

static void push_commit_work(uv_work_t *req) {
  push *p = req->data;
  p->work_rc = blob_writer_commit(p->w, &p->work_crc);
  if (p->work_rc < 0) snprintf(p->err, sizeof p->err, "%s", dpc_errmsg());
}

static void push_commit_after(uv_work_t *req, int status) {
  push *p = req->data;
  coord *c = p->c;
  p->w = NULL; /* freed by commit */
  p->busy = 0;
  p->in_frag = 0;
  if (status != 0 || p->work_rc < 0) {
    push_fail(p, RPC_INTERNAL, "could not store the delta durably: %s", status ? "canceled" : p->err);
  } else {
    TESTHOOK("push-commit");
    coord_job *j = coord_job_get(c, p->lease.job);
    lease_note *n = coord_note(c, p->lease.id, 0);
    float loss = n ? n->loss : NAN;
    /* The slot's metric row goes in with the delta: one commit (fsync) per delta, not two. */
    store_metric m = {.job = p->lease.job, .round = p->lease.round, .path = p->lease.path,
                      .replica = p->lease.replica, .worker = p->worker, .loss = loss, .tokens = (int64_t)p->tokens,
                      .bytes_in = (int64_t)p->total, .bytes_out = n ? (int64_t)n->bytes_out : 0,
                      .created_at = coord_now_ms()};
    store_new_delta nd = {.lease = p->lease.id, .fragment = p->frag, .checksum = p->work_crc, .blob = p->blob,
                          .weight = 1.0, .tokens = (int64_t)p->tokens, .now_ms = coord_now_ms(), .norm = p->norm,
                          .metric = &m};
    /* Async: a delta of fewer steps than leased (a preempted worker's partial work) counts
     * for the steps it covers; sync rounds always take the lease's steps. */
    if (j && j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC && p->inner_steps > 0) nd.inner_steps = (int)p->inner_steps;
    int64_t did;
    int rc = store_record_delta(c->st, &nd, &did);
    if (rc == 0 || rc == 1) {
      push_ack(p, p->frag, rc == 0 ? DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED : DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE,
               (uint64_t)p->lease.round + 1);
      if (rc == 0) {
        screen_window *sw = j ? push_screen_window(c, j, p->frag) : NULL;
        if (sw) screen_add(sw, p->norm);
        if (j && isfinite(loss) && p->lease.path < j->n_paths) j->path_loss[p->lease.path] = loss;
        DPC_INFO("delta received: lease %lld job %lld slot (path %d, replica %d) round %lld fragment %d, %llu bytes, "
                 "crc 0x%08x, loss %.4f", (long long)p->lease.id, (long long)p->lease.job, p->lease.path,
                 p->lease.replica, (long long)p->lease.round, p->frag + 1, (unsigned long long)p->total, p->work_crc, loss);
      }
      if (rc == 0) TESTHOOK("push-ack");
      sched_lease_maybe_pushed(c, &p->lease);
      sched_check_rounds(c);
    } else if (rc == DPC_ESTATE || rc == DPC_ECANCELED) {
      /* Not recorded, and no row names this spool blob (a recorded delta of the lease
       * would have made this a duplicate): remove it rather than leave it to the restart
       * sweep. */
      blob_delete(c->bs, p->blob);
      if (rc == DPC_ESTATE) push_ack(p, p->frag, DIPACO__V1__PUSH_RESULT__PUSH_LATE, (uint64_t)p->lease.round + 1);
      else push_fail(p, RPC_ABORTED, "%s; drop the work and ask for a new lease", dpc_errmsg());
    } else if (rc == DPC_EEXIST) {
      push_fail(p, RPC_ALREADY_EXISTS, "%s", dpc_errmsg());
    } else {
      push_fail(p, rpc_code_from_dpc(rc), "recording the delta failed: %s", dpc_errmsg());
    }
  }
  if (!p->call) {
    push_free(p);
  } else if (!p->finished) {
    rpc_call_read(p->call);
  }
  coord_work_done(c);
}

static int grow_buf(push *p, size_t n) {
  if (n <= p->cap) return 0;
  unsigned char *b = realloc(p->buf, n);
  if (!b) return DPC_ENOMEM;
  p->buf = b;
  p->cap = n;
  return 0;
}

/* First chunk of a fragment: check the lease and the header, pick the mode, open the blob. */
static int push_begin(push *p, const struct rpc_chunk *ch) {
  coord *c = p->c;
  if (ch->lease_id == 0 || ch->lease_id > INT64_MAX) {
    push_fail(p, RPC_INVALID_ARGUMENT, "lease_id: required");
    return -1;
  }
  if (p->have_lease && p->lease.id != (int64_t)ch->lease_id) {
    push_fail(p, RPC_INVALID_ARGUMENT, "lease_id: one PushDelta stream carries one lease (%lld, then %llu)",
              (long long)p->lease.id, (unsigned long long)ch->lease_id);
    return -1;
  }
  if (store_get_lease(c->st, (int64_t)ch->lease_id, &p->lease) < 0) {
    push_fail(p, RPC_NOT_FOUND, "lease_id %llu: no such lease", (unsigned long long)ch->lease_id);
    return -1;
  }
  p->have_lease = 1;
  if (p->lease.worker != p->worker) {
    push_fail(p, RPC_PERMISSION_DENIED, "lease %lld belongs to another worker", (long long)p->lease.id);
    return -1;
  }
  coord_job *j = coord_job_get(c, p->lease.job);
  int frag = (int)(ch->fragment_id - 1);
  if (!j || ch->fragment_id == 0 || ch->fragment_id > (uint64_t)j->n_fragments ||
      store_lease_base_version(c->st, p->lease.id, frag, &p->base) < 0) {
    push_fail(p, RPC_INVALID_ARGUMENT, "fragment_id %llu is not a fragment of lease %lld",
              (unsigned long long)ch->fragment_id, (long long)p->lease.id);
    return -1;
  }
  for (int i = 0; i < p->n_acks; i++)
    if (p->acks[i].fragment_id == ch->fragment_id) {
      push_fail(p, RPC_INVALID_ARGUMENT, "fragment_id %llu appears twice in one stream", (unsigned long long)ch->fragment_id);
      return -1;
    }
  const jobspec_fragment *jf = &j->fragments[frag];
  if (ch->payload != DIPACO__V1__PAYLOAD__PAYLOAD_DELTA) {
    push_fail(p, RPC_INVALID_ARGUMENT, "payload: must be PAYLOAD_DELTA, got %u", ch->payload);
    return -1;
  }
  if (ch->codec != DIPACO__V1__CODEC__CODEC_FP32) {
    push_fail(p, RPC_INVALID_ARGUMENT, "codec: only CODEC_FP32 deltas are accepted, got %u", ch->codec);
    return -1;
  }
  if (ch->num_floats != jf->len || ch->total != (uint64_t)jf->len * 4) {
    push_fail(p, RPC_INVALID_ARGUMENT, "num_floats/total: fragment %llu has %zu floats (%zu bytes); got %llu floats, %llu bytes",
              (unsigned long long)ch->fragment_id, jf->len, jf->len * 4, (unsigned long long)ch->num_floats,
              (unsigned long long)ch->total);
    return -1;
  }
  if (ch->version != (uint64_t)p->base) {
    push_fail(p, RPC_INVALID_ARGUMENT, "version: the lease's base version of fragment %llu is %lld, got %llu",
              (unsigned long long)ch->fragment_id, (long long)p->base, (unsigned long long)ch->version);
    return -1;
  }
  if (ch->inner_steps > (uint64_t)p->lease.inner_steps) {
    push_fail(p, RPC_INVALID_ARGUMENT, "inner_steps: %llu exceeds the lease's %d", (unsigned long long)ch->inner_steps,
              p->lease.inner_steps);
    return -1;
  }
  p->frag = frag;
  p->total = ch->total;
  p->next = 0;
  p->crc = 0;
  p->ss = 0;
  p->norm = NAN;
  p->ncarry = 0;
  p->tokens = ch->tokens;
  p->inner_steps = ch->inner_steps;
  p->mode = 0;
  /* Already recorded (a retry)? */
  if (store_find_delta(c->st, p->lease.id, frag, &p->dup_crc) == 1) p->mode = 1;
  if (p->mode == 0 && p->lease.state != LEASE_ACTIVE) {
    store_round r;
    if (store_get_round(c->st, p->lease.job, frag, p->lease.round, &r) == 0 && r.state == ROUND_CLOSED) {
      p->mode = 2;
    } else {
      push_fail(p, RPC_ABORTED, "lease %lld is no longer active (expired or released); drop the work and ask for a new lease",
                (long long)p->lease.id);
      return -1;
    }
  }
  if (p->mode == 0 && p->lease.state == LEASE_ACTIVE) {
    /* A completed lease's training speed: its steps over the time from the end of its pull
     * to the start of its push (transfers excluded, so short DyLU leases are not penalised). */
    lease_note *n = coord_note(c, p->lease.id, 0);
    double now = coord_mono_s();
    if (n && n->pull_done_s > 0 && now > n->pull_done_s && p->inner_steps > 0)
      sched_speed_sample(c, p->worker, (double)p->inner_steps / (now - n->pull_done_s));
    if (n) n->pull_done_s = 0;
  }
  if (p->mode == 0 && j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC && j->spec.max_staleness > 0) {
    int64_t st = sched_async_staleness(c, j, frag, p->base);
    if (st > j->spec.max_staleness) p->mode = 3; /* too stale: read the stream, keep nothing */
  }
  if (p->mode == 0) {
    blob_id id = {.job = p->lease.job, .fragment = frag, .version = p->lease.round, .aux = p->lease.id, .kind = BLOB_DELTA};
    blob_name(&id, p->blob, sizeof p->blob);
    int rc = blob_writer_open(c->bs, p->blob, BLOB_DELTA, jf->len, &p->w);
    if (rc < 0) {
      push_fail(p, rpc_code_from_dpc(rc), "cannot open the delta spool: %s", dpc_errmsg());
      return -1;
    }
  }
  p->in_frag = 1;
  return 0;
}

/* Check the floats of data[0..n) (with up to 3 carried bytes) for NaN/Inf, adding their
 * squares to p->ss. */
static int check_finite(push *p, const unsigned char *data, size_t n, uint64_t *bad_at) {
  size_t i = 0;
  uint64_t base_float = (p->next - (uint64_t)p->ncarry) / 4;
  if (p->ncarry) {
    while (p->ncarry < 4 && i < n) p->carry[p->ncarry++] = data[i++];
    if (p->ncarry < 4) return 0;
    float f;
    memcpy(&f, p->carry, 4);
    if (!isfinite(f)) {
      *bad_at = base_float;
      return -1;
    }
    p->ss += (double)f * (double)f;
    p->ncarry = 0;
    base_float++;
  }
  size_t whole = (n - i) / 4;
  double ss = 0;
  for (size_t k = 0; k < whole; k++) {
    float f;
    memcpy(&f, data + i + 4 * k, 4);
    if (!isfinite(f)) {
      *bad_at = base_float + k;
      return -1;
    }
    ss += (double)f * (double)f;
  }
  p->ss += ss;
  i += whole * 4;
  while (i < n) p->carry[p->ncarry++] = data[i++];
  return 0;
}

static void push_on_call(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  (void)ud;
  coord *c = g_coord;
  int64_t worker;
  if (svc_authenticate(call, &worker, 0) < 0) return;
  svc_touch(c, worker, -1);
  push *p = calloc(1, sizeof *p);
  if (!p) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  p->c = c;
  p->call = call;
  p->worker = worker;
  p->req.data = p;
  rpc_call_set_data(call, p);
}

static int push_on_message(struct rpc_call *call, const struct grpc_byte_buffer *msg, void *ud) {
  (void)ud;
  push *p = rpc_call_data(call);
  if (!p || p->finished) return 0;
  coord *c = p->c;
  if (!msg) {
    if (p->in_frag)
      push_fail(p, RPC_INVALID_ARGUMENT, "stream ended inside fragment %d at byte %llu of %llu", p->frag + 1,
                (unsigned long long)p->next, (unsigned long long)p->total);
    else if (p->n_acks == 0)
      push_fail(p, RPC_INVALID_ARGUMENT, "empty PushDelta stream: send at least one fragment's chunks");
    else {
      Dipaco__V1__PushDeltaResponse resp = DIPACO__V1__PUSH_DELTA_RESPONSE__INIT;
      Dipaco__V1__FragmentAck **ap = calloc((size_t)p->n_acks, sizeof *ap);
      if (!ap) {
        push_fail(p, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return 0;
      }
      for (int i = 0; i < p->n_acks; i++) ap[i] = &p->acks[i];
      resp.n_acks = (size_t)p->n_acks;
      resp.acks = ap;
      p->finished = 1;
      rpc_call_reply(call, &resp.base);
      free(ap);
    }
    return 0;
  }
  if (c->stopping) {
    push_fail(p, RPC_UNAVAILABLE, "coordinator is shutting down; push again after it is back");
    return 0;
  }
  struct rpc_chunk ch;
  if (rpc_chunk_parse(msg, &ch) < 0) {
    push_fail(p, RPC_INVALID_ARGUMENT, "malformed chunk: %s", dpc_errmsg());
    return 0;
  }
  if (!p->in_frag) {
    if (ch.offset != 0) {
      push_fail(p, RPC_INVALID_ARGUMENT, "offset: a fragment's chunks start at 0, got %llu", (unsigned long long)ch.offset);
      return 0;
    }
    if (push_begin(p, &ch) < 0) return 0;
  } else if (ch.lease_id != (uint64_t)p->lease.id || ch.fragment_id != (uint64_t)p->frag + 1 || ch.total != p->total) {
    push_fail(p, RPC_INVALID_ARGUMENT, "lease_id/fragment_id/total changed inside fragment %d's chunks", p->frag + 1);
    return 0;
  } else if (ch.offset != p->next) {
    push_fail(p, RPC_INVALID_ARGUMENT, "offset: expected %llu (contiguous chunks), got %llu", (unsigned long long)p->next,
              (unsigned long long)ch.offset);
    return 0;
  }
  if (ch.len > MAX_CHUNK_ACCEPT) {
    push_fail(p, RPC_RESOURCE_EXHAUSTED, "chunk of %llu bytes exceeds %u", (unsigned long long)ch.len, MAX_CHUNK_ACCEPT);
    return 0;
  }
  if (grow_buf(p, ch.len ? ch.len : 1) < 0 || rpc_chunk_copy(msg, &ch, p->buf) < 0) {
    push_fail(p, RPC_RESOURCE_EXHAUSTED, "cannot take a chunk of %llu bytes", (unsigned long long)ch.len);
    return 0;
  }
  uint64_t bad;
  if (check_finite(p, p->buf, ch.len, &bad) < 0) {
    push_fail(p, RPC_INVALID_ARGUMENT, "data: delta of fragment %d has a non-finite value (NaN/Inf) at float %llu",
              p->frag + 1, (unsigned long long)bad);
    return 0;
  }
  p->crc = dpc_crc32c(p->crc, p->buf, ch.len);
  if (p->w) {
    int rc = blob_writer_append(p->w, p->buf, ch.len);
    if (rc < 0) {
      push_fail(p, rpc_code_from_dpc(rc), "spooling the delta failed: %s", dpc_errmsg());
      return 0;
    }
  }
  p->next += ch.len;
  c->bytes_in += ch.len;
  p->bytes += ch.len;
  if (p->next < p->total) {
    if (p->w) TESTHOOK("push");
    return 0;
  }
  /* last chunk */
  if (ch.crc32c != p->crc) {
    push_fail(p, RPC_DATA_LOSS, "crc32c: fragment %d's stream has CRC-32C 0x%08x, the last chunk says 0x%08x; push again",
              p->frag + 1, p->crc, ch.crc32c);
    return 0;
  }
  if (p->mode == 1) {
    p->in_frag = 0;
    if (p->dup_crc != p->crc) {
      push_fail(p, RPC_ALREADY_EXISTS, "lease %lld already pushed a different delta for fragment %d", (long long)p->lease.id,
                p->frag + 1);
      return 0;
    }
    push_ack(p, p->frag, DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE, (uint64_t)p->lease.round + 1);
    if (sched_lease_maybe_pushed(c, &p->lease)) sched_check_rounds(c);
    return 0;
  }
  if (p->mode == 3) {
    p->in_frag = 0;
    coord_job *j = coord_job_get(c, p->lease.job);
    DPC_WARN("stale delta dropped: lease %lld fragment %d base version %lld, staleness %lld > max_staleness %d",
             (long long)p->lease.id, p->frag + 1, (long long)p->base,
             j ? (long long)sched_async_staleness(c, j, p->frag, p->base) : -1LL, j ? j->spec.max_staleness : 0);
    if (j) j->async_dropped++;
    push_ack(p, p->frag, DIPACO__V1__PUSH_RESULT__PUSH_STALE, (uint64_t)p->base);
    /* The steps were trained (the slot's counter moves on); the delta is not applied. */
    sched_lease_pushed(c, p->lease.id);
    sched_check_rounds(c);
    return 0;
  }
  if (p->mode == 0) {
    p->norm = sqrt(p->ss);
    coord_job *j = coord_job_get(c, p->lease.job);
    double k = j ? j->spec.outer.delta_norm_screen : 0, bound;
    screen_window *sw = k > 0 ? push_screen_window(c, j, p->frag) : NULL;
    if (sw && screen_reject(sw, k, p->norm, &bound)) {
      /* Never stored, never applied; the lease stays active, so the worker (which releases a
       * lease whose push was refused) hands the slot back for the same round. */
      push_fail(p, RPC_FAILED_PRECONDITION,
                "delta norm screen: fragment %d's delta has L2 norm %.6g, above the bound %.6g (outer.delta_norm_screen "
                "%g x the median %.6g of the fragment's last %d accepted deltas); refused, not applied",
                p->frag + 1, p->norm, bound, k, screen_reference(sw), sw->n);
      return 0;
    }
  }
  if (p->mode == 2) {
    p->in_frag = 0;
    DPC_INFO("late delta dropped: lease %lld fragment %d round %lld already closed", (long long)p->lease.id, p->frag,
             (long long)p->lease.round);
    push_ack(p, p->frag, DIPACO__V1__PUSH_RESULT__PUSH_LATE, (uint64_t)p->lease.round + 1);
    return 0;
  }
  p->busy = 1;
  if (coord_queue_work(c, &p->req, push_commit_work, push_commit_after) < 0) {
    p->busy = 0;
    push_fail(p, RPC_INTERNAL, "cannot queue the delta commit");
    return 0;
  }
  return 1; /* paused until the commit is durable */
}

static void push_on_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)ud;
  push *p = rpc_call_data(call);
  if (!p) return;
  if (cancelled && !p->finished) DPC_WARN("PushDelta from worker %lld cancelled by the client", (long long)p->worker);
  p->call = NULL;
  rpc_call_set_data(call, NULL);
  if (!p->busy) push_free(p);
}

/* ---- Release ------------------------------------------------------------------------------------ */

static void on_release(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  coord *c = g_coord;
  int64_t worker;
  if (svc_authenticate(call, &worker, 0) < 0) return;
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__release_request__descriptor, &pm)) return;
  Dipaco__V1__ReleaseRequest *r = (Dipaco__V1__ReleaseRequest *)pm;
  svc_touch(c, worker, -1);
  store_lease l;
  if (r->lease_id == 0 || r->lease_id > INT64_MAX || store_get_lease(c->st, (int64_t)r->lease_id, &l) < 0) {
    rpc_call_finish(call, RPC_NOT_FOUND, "lease_id %llu: no such lease", (unsigned long long)r->lease_id);
  } else if (l.worker != worker) {
    rpc_call_finish(call, RPC_PERMISSION_DENIED, "lease %lld belongs to another worker", (long long)l.id);
  } else {
    if (l.state == LEASE_ACTIVE && sched_lease_maybe_pushed(c, &l)) {
      /* Every delta of the lease is already durable (e.g. acknowledged just before a
       * coordinator restart): the lease is done, the slot moves on; the Release is a no-op. */
      sched_check_rounds(c);
    } else if (l.state == LEASE_ACTIVE) {
      int rc = store_end_lease(c->st, l.id, LEASE_RELEASED, 0, 0, coord_now_ms());
      if (rc < 0) {
        rpc_call_fail(call, rc);
        protobuf_c_message_free_unpacked(pm, NULL);
        return;
      }
      coord_note_drop(c, l.id);
      sched_check_rounds(c);
      char msg[128];
      snprintf(msg, sizeof msg, "%.*s", 100, r->message);
      DPC_INFO("lease %lld released by worker %lld (reason %d%s%s): slot (path %d, replica %d) round %lld is free",
               (long long)l.id, (long long)worker, (int)r->reason, msg[0] ? ": " : "", msg, l.path, l.replica,
               (long long)l.round);
    }
    Dipaco__V1__ReleaseResponse resp = DIPACO__V1__RELEASE_RESPONSE__INIT;
    rpc_call_reply(call, &resp.base);
  }
  protobuf_c_message_free_unpacked(pm, NULL);
}

const struct rpc_method coord_service_methods[] = {
    {.path = "/dipaco.v1.Coordinator/Register", .kind = RPC_UNARY, .on_call = on_register},
    {.path = "/dipaco.v1.Coordinator/Heartbeat", .kind = RPC_UNARY, .on_call = on_heartbeat},
    {.path = "/dipaco.v1.Coordinator/Lease", .kind = RPC_UNARY, .on_call = on_lease, .on_done = lease_on_done},
    {.path = "/dipaco.v1.Coordinator/PullFragment", .kind = RPC_SERVER_STREAM, .on_call = on_pull,
     .on_sent = coord_stream_on_sent, .on_done = coord_stream_on_done},
    {.path = "/dipaco.v1.Coordinator/PushDelta", .kind = RPC_CLIENT_STREAM, .on_call = push_on_call,
     .on_message = push_on_message, .on_done = push_on_done},
    {.path = "/dipaco.v1.Coordinator/Release", .kind = RPC_UNARY, .on_call = on_release},
    {.path = "/dipaco.v1.Coordinator/PushInnerState", .kind = RPC_CLIENT_STREAM, .on_call = ipush_on_call,
     .on_message = ipush_on_message, .on_done = ipush_on_done},
    {.path = "/dipaco.v1.Coordinator/PullInnerState", .kind = RPC_SERVER_STREAM, .on_call = on_ipull,
     .on_sent = coord_stream_on_sent, .on_done = coord_stream_on_done},
};
const int coord_service_n_methods = (int)(sizeof coord_service_methods / sizeof coord_service_methods[0]);
