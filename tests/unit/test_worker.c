/* test_worker.c — dipaco-worker against a fake coordinator built from common/rpc.h, run as a
 * real process on loopback:
 *  1. the happy path with faults: Register fails once with UNAVAILABLE (retried), Lease
 *     answers UNAUTHENTICATED (the worker registers again with its previous identity), a
 *     lease whose pull is ABORTED (dropped), a pull cut off mid-stream (resumed from the
 *     offset reached), then a lease of three fragments over two levels listed out of order;
 *     the pushed deltas must equal trainer_round's delta computed here from the same θ,
 *     data and options (the oracle is the network-free trainer; the test checks the network
 *     path around it), with the right chunk headers, identity metadata on every call, and
 *     Release(DONE); then LEASE_NO_WORK with --exit-when-done ends it with status 0;
 *  2. SIGTERM during a long round (far more than --drain-finish-s left): heartbeats arrive
 *     with progress, the worker releases the lease with RELEASE_DRAINING ("worker shutting
 *     down") at a step inside the round, pushes nothing, says it is leaving (Release of lease
 *     0, RELEASE_DRAINING) and exits 0;
 *  3. COMMAND_DRAIN on heartbeats: the worker finishes the round, pushes, exits 0;
 *  4. a job whose data glob matches nothing, and a Muon lease with a momentum outside [0, 1):
 *     Release(RELEASE_ERROR) naming the pattern / the setting, before any pull;
 *  5. a push refused by the delta norm screen (FAILED_PRECONDITION): the worker does not push
 *     it again, releases the lease with RELEASE_ERROR and the refusal, and takes new work;
 * plus the data-path resolution and fragment placement helpers directly, and flag errors.
 *
 * usage: test_worker PATH/TO/dipaco-worker */
#include "common/checksum.h"
#include "common/errors.h"
#include "common/rpc.h"
#include "common/shard.h"
#include "proto/dipaco.pb-c.h"
#include "tests/unit/test.h"
#include "worker/trainer.h"
#include "worker/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define SVC "/dipaco.v1.Coordinator/"
#define WID 42
#define TOKEN "tok-42"
#define B_ 2
#define T_ 8
#define NFRAG 3

static const char *g_worker;
static char g_tmp[256];
static gpt_config g_cfg = {.n_layer = 2, .n_head = 2, .n_embd = 16, .n_positions = 16, .vocab_size = 64};
static gpt_layout g_lay;
static float *g_theta; /* (n_params) the parameters served, version 1 */

/* Fragment f: id, level, module, offset_floats as sent (the whole layout's), length, place in the path buffer. */
static uint64_t f_id[NFRAG] = {11, 12, 13}, f_mod[NFRAG] = {1, 2, 2};
static uint32_t f_level[NFRAG] = {0, 1, 1};
static uint64_t f_off[NFRAG], f_len[NFRAG], f_abs[NFRAG];

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------- fake coordinator state */

enum scenario { SC_HAPPY = 1, SC_SIGTERM, SC_DRAIN, SC_NODATA, SC_KEEP, SC_STOP, SC_REFUSED, SC_BADMUON };
#define NPUSH 5 /* pushed-delta buffers: lease 7/9 → 0, leases 21..24 → 1..4 */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  enum scenario sc;
  int registers, leases, heartbeats, pulls, pushes, releases;
  int bad_md;                 /* worker calls without the right identity */
  uint64_t prev_id;           /* previous_worker_id of the last Register */
  char prev_session[64];
  int pull_resumed_ok;        /* the resumed pull asked from the right offset */
  uint64_t cut_at;            /* bytes sent before the cut-off pull ended */
  int cut_done;
  int release_reason[8];
  uint64_t release_step[8], release_lease[8];
  char release_msg[8][512];
  uint64_t hb_last_step;
  float hb_last_sps, hb_last_loss;
  uint64_t hb_lease;
  /* pushed data */
  float *pushed[NPUSH];       /* (n_params) reassembled per lease */
  uint64_t last_granted;
  int push_frag_seen[NFRAG], push_hdr_ok[NFRAG], push_crc_ok[NFRAG];
  uint64_t push_inner_steps, push_tokens;
  int drain_in_lease;         /* DRAIN answered a heartbeat of the lease before its push */
} S;

static int check_md(struct rpc_call *c) {
  char id[32], tok[64];
  if (rpc_call_md(c, RPC_MD_WORKER_ID, id, sizeof id) < 0 || strcmp(id, "42") != 0 ||
      rpc_call_md(c, RPC_MD_SESSION, tok, sizeof tok) < 0 || strcmp(tok, TOKEN) != 0) {
    pthread_mutex_lock(&g_mu);
    S.bad_md++;
    pthread_mutex_unlock(&g_mu);
    rpc_call_finish(c, RPC_UNAUTHENTICATED, "missing or wrong identity");
    return 0;
  }
  return 1;
}

static void on_register(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &dipaco__v1__register_request__descriptor, 0, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return;
  }
  Dipaco__V1__RegisterRequest *r = (Dipaco__V1__RegisterRequest *)pm;
  pthread_mutex_lock(&g_mu);
  int n = ++S.registers;
  S.prev_id = r->previous_worker_id;
  snprintf(S.prev_session, sizeof S.prev_session, "%s", r->previous_session ? r->previous_session : "");
  int host_ok = r->hostname && strcmp(r->hostname, "test-worker") == 0 && r->threads == 1 &&
                strcmp(r->backend, "cpu") == 0;
  pthread_mutex_unlock(&g_mu);
  protobuf_c_message_free_unpacked(pm, NULL);
  if (!host_ok) {
    rpc_call_finish(c, RPC_INVALID_ARGUMENT, "unexpected hostname/threads/backend");
    return;
  }
  if (S.sc == SC_HAPPY && n == 1) {
    rpc_call_finish(c, RPC_UNAVAILABLE, "starting up");
    return;
  }
  Dipaco__V1__RegisterResponse resp = DIPACO__V1__REGISTER_RESPONSE__INIT;
  resp.worker_id = WID;
  resp.session_token = TOKEN;
  resp.heartbeat_interval_ms = 50;
  resp.lease_ttl_ms = 10000;
  resp.max_chunk_bytes = 4096; /* several chunks per fragment */
  rpc_call_reply(c, &resp.base);
}

/* Builds and sends a lease. */
static void grant(struct rpc_call *c, uint64_t lease_id, uint32_t H, uint64_t first_step, const char *spec,
                  uint32_t replica, int inner_state) {
  Dipaco__V1__FragmentInfo fi[NFRAG], *fp[NFRAG];
  int order[NFRAG] = {2, 0, 1}; /* listed out of order on purpose */
  for (int k = 0; k < NFRAG; k++) {
    int i = order[k];
    dipaco__v1__fragment_info__init(&fi[k]);
    fi[k].fragment_id = f_id[i];
    fi[k].module_id = f_mod[i];
    fi[k].level = f_level[i];
    fi[k].version = 1;
    fi[k].offset_floats = f_off[i];
    fi[k].num_floats = f_len[i];
    fi[k].crc32c = dpc_crc32c(0, g_theta + f_abs[i], f_len[i] * 4);
    fp[k] = &fi[k];
  }
  Dipaco__V1__Slot slot = DIPACO__V1__SLOT__INIT;
  slot.path = 0;
  slot.replica = replica;
  Dipaco__V1__ModelShape ms = DIPACO__V1__MODEL_SHAPE__INIT;
  ms.vocab_size = (uint32_t)g_cfg.vocab_size;
  ms.padded_vocab_size = (uint32_t)g_cfg.vocab_size;
  ms.max_seq_len = (uint32_t)g_cfg.n_positions;
  ms.num_layers = (uint32_t)g_cfg.n_layer;
  ms.num_heads = (uint32_t)g_cfg.n_head;
  ms.channels = (uint32_t)g_cfg.n_embd;
  Dipaco__V1__Hyper hy = DIPACO__V1__HYPER__INIT;
  hy.lr = 0.01f;
  hy.lr_min_frac = 0.1f;
  hy.warmup_steps = 2;
  hy.total_steps = 1000000;
  hy.weight_decay = 0.1f;
  hy.beta1 = 0.9f;
  hy.beta2 = 0.95f;
  hy.eps = 1e-8f;
  hy.grad_clip = 0.5f;
  hy.batch_size = B_;
  hy.seq_len = T_;
  hy.grad_accum = 1;
  Dipaco__V1__DataWindow dw = DIPACO__V1__DATA_WINDOW__INIT;
  dw.dataset = "";
  dw.first_batch = first_step;
  dw.replica = replica;
  dw.replicas = 2;
  Dipaco__V1__Lease L = DIPACO__V1__LEASE__INIT;
  L.lease_id = lease_id;
  L.job_id = 3;
  L.slot = &slot;
  L.model = &ms;
  L.n_fragments = NFRAG;
  L.fragments = fp;
  L.inner_steps = H;
  L.first_step = first_step;
  L.round = first_step / (H ? H : 1);
  L.hyper = &hy;
  L.data = &dw;
  L.spec_json = (char *)spec;
  L.inner_state = inner_state;
  if (S.sc == SC_BADMUON) { /* Muon with a momentum outside [0, 1) */
    L.inner_optimizer = DIPACO__V1__INNER_OPTIMIZER__INNER_OPTIMIZER_MUON;
    L.muon_lr = 0.02f;
    L.muon_momentum = 1.5f;
    L.muon_ns_steps = 5;
  }
  pthread_mutex_lock(&g_mu);
  S.last_granted = lease_id;
  pthread_mutex_unlock(&g_mu);
  Dipaco__V1__LeaseResponse resp = DIPACO__V1__LEASE_RESPONSE__INIT;
  resp.outcome = DIPACO__V1__LEASE_OUTCOME__LEASE_GRANTED;
  resp.lease = &L;
  rpc_call_reply(c, &resp.base);
}

static void no_work(struct rpc_call *c, uint32_t wait_ms) {
  Dipaco__V1__LeaseResponse resp = DIPACO__V1__LEASE_RESPONSE__INIT;
  resp.outcome = DIPACO__V1__LEASE_OUTCOME__LEASE_NO_WORK;
  resp.wait_ms = wait_ms;
  rpc_call_reply(c, &resp.base);
}

static const char *SPEC_OK = "{\"name\":\"t\",\"data\":{\"train\":[\"data/train_*.bin\"]}}";

static void on_lease(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  (void)ud;
  if (!check_md(c)) return;
  pthread_mutex_lock(&g_mu);
  int n = ++S.leases;
  int regs = S.registers;
  pthread_mutex_unlock(&g_mu);
  switch (S.sc) {
  case SC_HAPPY:
    if (n == 1 && regs == 2) rpc_call_finish(c, RPC_UNAUTHENTICATED, "unknown session (coordinator restarted)");
    else if (n == 2) grant(c, 6, 3, 3, SPEC_OK, 1, 0); /* its pull is ABORTED */
    else if (n == 3) grant(c, 7, 3, 3, SPEC_OK, 1, 0);
    else no_work(c, 50);
    break;
  case SC_STOP: /* the first attempt is stopped mid-round, the round is leased again */
    if (n == 1) grant(c, 21, 1000000, 0, SPEC_OK, 0, DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_KEEP);
    else if (n == 2) grant(c, 22, 2, 0, SPEC_OK, 0, DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_KEEP);
    else no_work(c, 50);
    break;
  case SC_SIGTERM:
    if (n == 1) grant(c, 8, 1000000, 6, SPEC_OK, 1, 0);
    else no_work(c, 50);
    break;
  case SC_DRAIN:
    if (n == 1) grant(c, 9, 300, 0, SPEC_OK, 1, 0);
    else no_work(c, 50);
    break;
  case SC_NODATA:
    if (n == 1) grant(c, 10, 3, 0, "{\"data\":{\"train\":[\"nothing/here_*.bin\"]}}", 1, 0);
    else no_work(c, 50);
    break;
  case SC_BADMUON:
    if (n == 1) grant(c, 11, 3, 0, SPEC_OK, 1, 0);
    else no_work(c, 50);
    break;
  case SC_REFUSED: /* lease 30's push is refused by the norm screen; lease 31 is the retry */
    if (n == 1) grant(c, 30, 2, 0, SPEC_OK, 1, 0);
    else if (n == 2) grant(c, 31, 2, 0, SPEC_OK, 1, 0);
    else no_work(c, 50);
    break;
  case SC_KEEP: /* one worker alternating between the two replicas of a path */
    if (n == 1) grant(c, 21, 2, 0, SPEC_OK, 0, DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_KEEP);
    else if (n == 2) grant(c, 22, 2, 0, SPEC_OK, 1, DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_KEEP);
    else if (n == 3) grant(c, 23, 2, 2, SPEC_OK, 0, DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_KEEP);
    else if (n == 4) grant(c, 24, 2, 2, SPEC_OK, 1, DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_RESET);
    else no_work(c, 50);
    break;
  }
}

static void on_heartbeat(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!check_md(c)) return;
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &dipaco__v1__heartbeat_request__descriptor, 0, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return;
  }
  Dipaco__V1__HeartbeatRequest *r = (Dipaco__V1__HeartbeatRequest *)pm;
  pthread_mutex_lock(&g_mu);
  S.heartbeats++;
  if (r->lease_id) {
    S.hb_lease = r->lease_id;
    S.hb_last_step = r->step;
    S.hb_last_sps = r->steps_per_sec;
    S.hb_last_loss = r->loss;
  }
  pthread_mutex_unlock(&g_mu);
  protobuf_c_message_free_unpacked(pm, NULL);
  Dipaco__V1__HeartbeatResponse resp = DIPACO__V1__HEARTBEAT_RESPONSE__INIT;
  if (S.sc == SC_DRAIN) resp.command = DIPACO__V1__COMMAND__COMMAND_DRAIN;
  pthread_mutex_lock(&g_mu);
  if (S.sc == SC_DRAIN && S.hb_lease == 9 && S.pushes == 0) S.drain_in_lease = 1;
  if (S.sc == SC_STOP && S.hb_lease == 21 && S.hb_last_step >= 3) resp.command = DIPACO__V1__COMMAND__COMMAND_STOP;
  pthread_mutex_unlock(&g_mu);
  rpc_call_reply(c, &resp.base);
}

struct pull_st {
  int frag;           /* index into f_* */
  uint64_t off, end;  /* bytes */
  size_t chunk;
  int cut;            /* end the stream with UNAVAILABLE after one chunk */
};

static void pull_next(struct rpc_call *c) {
  struct pull_st *st = rpc_call_data(c);
  uint64_t total = f_len[st->frag] * 4;
  if (st->off >= st->end) {
    rpc_call_finish(c, RPC_OK, NULL);
    return;
  }
  if (st->cut == 2) {
    pthread_mutex_lock(&g_mu);
    S.cut_at = st->off;
    S.cut_done = 1;
    pthread_mutex_unlock(&g_mu);
    rpc_call_finish(c, RPC_UNAVAILABLE, "connection reset (test)");
    return;
  }
  if (st->cut) st->cut = 2;
  const uint8_t *src = (const uint8_t *)(g_theta + f_abs[st->frag]);
  struct rpc_chunk h;
  memset(&h, 0, sizeof h);
  h.fragment_id = f_id[st->frag];
  h.version = 1;
  h.offset = st->off;
  h.total = total;
  h.num_floats = f_len[st->frag];
  h.payload = DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS;
  h.len = total - st->off < st->chunk ? total - st->off : st->chunk;
  if (st->off + h.len == total) h.crc32c = dpc_crc32c(0, src, total);
  st->off += h.len;
  rpc_call_send(c, rpc_chunk_encode(&h, src + h.offset, NULL, NULL));
}

static void on_pull(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!check_md(c)) return;
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &dipaco__v1__pull_fragment_request__descriptor, 0, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return;
  }
  Dipaco__V1__PullFragmentRequest *r = (Dipaco__V1__PullFragmentRequest *)pm;
  uint64_t lease = r->lease_id, fid = r->fragment_id, off = r->offset, ver = r->version;
  uint32_t mcb = r->max_chunk_bytes;
  int latest = r->latest;
  protobuf_c_message_free_unpacked(pm, NULL);
  pthread_mutex_lock(&g_mu);
  S.pulls++;
  int cut_done = S.cut_done;
  if (off > 0 && cut_done && off == S.cut_at) S.pull_resumed_ok = 1;
  pthread_mutex_unlock(&g_mu);
  if (lease == 6) {
    rpc_call_finish(c, RPC_ABORTED, "lease 6 was revoked");
    return;
  }
  int frag = -1;
  for (int i = 0; i < NFRAG; i++)
    if (f_id[i] == fid) frag = i;
  if (frag < 0 || ver != 1 || latest || off > f_len[frag] * 4) {
    rpc_call_finish(c, RPC_NOT_FOUND, "no fragment %llu version %llu", (unsigned long long)fid,
                    (unsigned long long)ver);
    return;
  }
  struct pull_st *st = calloc(1, sizeof *st);
  st->frag = frag;
  st->off = off;
  st->end = f_len[frag] * 4;
  st->chunk = mcb && mcb < 4096 ? mcb : 4096;
  st->cut = (S.sc == SC_HAPPY && fid == 12 && !cut_done) ? 1 : 0;
  rpc_call_set_data(c, st);
  pull_next(c);
}

static void on_pull_sent(struct rpc_call *c, int ok, void *ud) {
  (void)ud;
  if (ok) pull_next(c);
}

static void on_pull_done(struct rpc_call *c, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  free(rpc_call_data(c));
}

struct push_st {
  int frag;       /* current fragment, -1 before the first chunk */
  uint64_t expect;
  uint8_t *buf;
  int failed;
  int acks[NFRAG];
  int nacks;
};

static int on_push_msg(struct rpc_call *c, const struct grpc_byte_buffer *msg, void *ud) {
  (void)ud;
  struct push_st *st = rpc_call_data(c);
  if (!msg) {
    if (st->failed || (st->frag >= 0 && st->expect != f_len[st->frag] * 4)) {
      rpc_call_finish(c, RPC_INVALID_ARGUMENT, "bad push stream");
      return 0;
    }
    if (S.sc == SC_REFUSED && S.last_granted == 30) {
      rpc_call_finish(c, RPC_FAILED_PRECONDITION, "delta norm screen: fragment 1's delta has L2 norm 33.3, above "
                      "the bound 1.31 (outer.delta_norm_screen 4 x the median 0.327); refused, not applied");
      return 0;
    }
    Dipaco__V1__FragmentAck ack[NFRAG], *ap[NFRAG];
    for (int i = 0; i < st->nacks; i++) {
      dipaco__v1__fragment_ack__init(&ack[i]);
      ack[i].fragment_id = f_id[st->acks[i]];
      ack[i].result = DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED;
      ack[i].version = 2;
      ap[i] = &ack[i];
    }
    Dipaco__V1__PushDeltaResponse resp = DIPACO__V1__PUSH_DELTA_RESPONSE__INIT;
    resp.n_acks = (size_t)st->nacks;
    resp.acks = ap;
    rpc_call_reply(c, &resp.base);
    return 0;
  }
  struct rpc_chunk h;
  if (rpc_chunk_parse(msg, &h)) {
    st->failed = 1;
    return 0;
  }
  if (h.offset == 0) { /* a new fragment starts */
    st->frag = -1;
    for (int i = 0; i < NFRAG; i++)
      if (f_id[i] == h.fragment_id) st->frag = i;
    st->expect = 0;
    if (st->frag < 0 || h.total != f_len[st->frag] * 4) {
      st->failed = 1;
      return 0;
    }
    int k = h.lease_id >= 20 && h.lease_id < 20 + NPUSH ? (int)(h.lease_id - 20) : 0;
    st->buf = (uint8_t *)(S.pushed[k] + f_abs[st->frag]);
  }
  if (st->frag < 0 || h.offset != st->expect) {
    st->failed = 1;
    return 0;
  }
  rpc_chunk_copy(msg, &h, st->buf + h.offset);
  st->expect += h.len;
  int i = st->frag;
  int hdr_ok = h.lease_id == S.last_granted && h.version == 1 && h.payload == DIPACO__V1__PAYLOAD__PAYLOAD_DELTA &&
               h.codec == DIPACO__V1__CODEC__CODEC_FP32 && h.num_floats == f_len[i];
  pthread_mutex_lock(&g_mu);
  if (h.offset == 0) S.push_hdr_ok[i] = hdr_ok;
  else S.push_hdr_ok[i] &= hdr_ok;
  S.push_inner_steps = h.inner_steps;
  S.push_tokens = h.tokens;
  if (st->expect == h.total) {
    S.push_frag_seen[i]++;
    S.push_crc_ok[i] = h.crc32c == dpc_crc32c(0, st->buf, h.total);
    st->acks[st->nacks < NFRAG ? st->nacks++ : NFRAG - 1] = i;
  }
  pthread_mutex_unlock(&g_mu);
  return 0;
}

static void on_push(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  (void)ud;
  if (!check_md(c)) return;
  pthread_mutex_lock(&g_mu);
  S.pushes++;
  pthread_mutex_unlock(&g_mu);
  struct push_st *st = calloc(1, sizeof *st);
  st->frag = -1;
  rpc_call_set_data(c, st);
}

static void on_push_done(struct rpc_call *c, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  free(rpc_call_data(c));
}

static void on_release(struct rpc_call *c, const struct grpc_byte_buffer *req, void *ud) {
  (void)ud;
  if (!check_md(c)) return;
  ProtobufCMessage *pm;
  if (rpc_msg_unpack(req, &dipaco__v1__release_request__descriptor, 0, &pm)) {
    rpc_call_fail(c, DPC_EFORMAT);
    return;
  }
  Dipaco__V1__ReleaseRequest *r = (Dipaco__V1__ReleaseRequest *)pm;
  pthread_mutex_lock(&g_mu);
  if (S.releases < 8) {
    S.release_reason[S.releases] = r->reason;
    S.release_step[S.releases] = r->step;
    S.release_lease[S.releases] = r->lease_id;
    snprintf(S.release_msg[S.releases], sizeof S.release_msg[0], "%s", r->message ? r->message : "");
  }
  S.releases++;
  pthread_mutex_unlock(&g_mu);
  protobuf_c_message_free_unpacked(pm, NULL);
  Dipaco__V1__ReleaseResponse resp = DIPACO__V1__RELEASE_RESPONSE__INIT;
  rpc_call_reply(c, &resp.base);
}

static const struct rpc_method methods[] = {
    {.path = SVC "Register", .kind = RPC_UNARY, .on_call = on_register},
    {.path = SVC "Lease", .kind = RPC_UNARY, .on_call = on_lease},
    {.path = SVC "Heartbeat", .kind = RPC_UNARY, .on_call = on_heartbeat},
    {.path = SVC "PullFragment", .kind = RPC_SERVER_STREAM, .on_call = on_pull, .on_sent = on_pull_sent,
     .on_done = on_pull_done},
    {.path = SVC "PushDelta", .kind = RPC_CLIENT_STREAM, .on_call = on_push, .on_message = on_push_msg,
     .on_done = on_push_done},
    {.path = SVC "Release", .kind = RPC_UNARY, .on_call = on_release},
};

/* ----------------------------------------------------------------------- processes */

static pid_t spawn_worker(int port, int exit_when_done, const char *log) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  const char *argv[20];
  int n = 0;
  argv[n++] = g_worker;
  argv[n++] = "--coordinator";
  argv[n++] = addr;
  argv[n++] = "--data-dir";
  argv[n++] = g_tmp;
  argv[n++] = "--threads";
  argv[n++] = "1";
  argv[n++] = "--name";
  argv[n++] = "test-worker";
  argv[n++] = "--log-level";
  argv[n++] = "debug";
  argv[n++] = "--poll-ms";
  argv[n++] = "200";
  argv[n++] = "--grace-s";
  argv[n++] = "20";
  if (exit_when_done) argv[n++] = "--exit-when-done";
  argv[n] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, g_worker, &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

/* Wait up to ms for pid; returns the exit status, or -1 on timeout (then kills it). */
static int wait_exit(pid_t pid, int ms) {
  for (int t = 0; t < ms; t += 20) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    sleep_ms(20);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}

static void dump(const char *log) {
  FILE *f = fopen(log, "r");
  if (!f) return;
  char line[1024];
  fprintf(stderr, "---- worker log %s\n", log);
  while (fgets(line, sizeof line, f)) fputs(line, stderr);
  fclose(f);
}

static int file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[2048];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

static void reset_state(enum scenario sc) {
  pthread_mutex_lock(&g_mu);
  float *p[NPUSH];
  memcpy(p, S.pushed, sizeof p);
  memset(&S, 0, sizeof S);
  memcpy(S.pushed, p, sizeof p);
  S.sc = sc;
  for (int i = 0; i < NPUSH; i++) memset(S.pushed[i], 0, g_lay.n_params * sizeof(float));
  pthread_mutex_unlock(&g_mu);
}

/* --------------------------------------------------------------------------- tests */

static void test_happy(int port) {
  reset_state(SC_HAPPY);
  char log[300];
  snprintf(log, sizeof log, "%s/happy.log", g_tmp);
  pid_t pid = spawn_worker(port, 1, log);
  CHECK(pid > 0);
  int st = wait_exit(pid, 60000);
  CHECK_EQ_INT(st, 0);
  /* The oracle: the same round, computed here with the network-free trainer. */
  const char *shards[2];
  char s0[300], s1[300];
  snprintf(s0, sizeof s0, "%s/data/train_000.bin", g_tmp);
  snprintf(s1, sizeof s1, "%s/data/train_001.bin", g_tmp);
  shards[0] = s0;
  shards[1] = s1;
  trainer_opts o = {.B = B_, .T = T_, .total_steps = 1000000, .lr = 0.01f, .lr_min_frac = 0.1f, .warmup = 2,
                    .hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 0.5f},
                    .replica = 1, .n_replicas = 2};
  gpt_backend_opts bo = {.kind = GPT_BACKEND_CPU, .threads = 1};
  trainer *tr = NULL;
  CHECK_EQ_INT(trainer_open(&tr, &g_cfg, &bo, shards, 2, &o), 0);
  size_t n = g_lay.n_params;
  float *want = calloc(n, sizeof *want);
  trainer_stats ts;
  if (tr) {
    CHECK_EQ_INT(trainer_round(tr, g_theta, 3, 3, want, &ts, NULL, NULL), 0);
    trainer_free(tr);
  }
  /* Data too small for one batch: a clear error naming the sizes. */
  trainer_opts big = o;
  big.B = 100000;
  trainer *tb = NULL;
  CHECK_EQ_INT(trainer_open(&tb, &g_cfg, &bo, shards, 2, &big), DPC_ERANGE);
  CHECK(strstr(dpc_errmsg(), "less than one batch of B=100000") != NULL);
  CHECK(tb == NULL);
  pthread_mutex_lock(&g_mu);
  double maxd = 0, maxw = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)S.pushed[0][i] - want[i]);
    if (d > maxd) maxd = d;
    if (fabs(want[i]) > maxw) maxw = fabs(want[i]);
  }
  fprintf(stderr, "happy: pushed delta vs trainer_round: max |diff| %.3g (max |delta| %.3g)\n", maxd, maxw);
  CHECK(maxw > 1e-4);     /* training moved the parameters */
  CHECK(maxd <= 1e-6 * maxw);
  for (int i = 0; i < NFRAG; i++) {
    CHECK_EQ_INT(S.push_frag_seen[i], 1);
    CHECK(S.push_hdr_ok[i]);
    CHECK(S.push_crc_ok[i]);
  }
  CHECK_EQ_INT(S.push_inner_steps, 3);
  CHECK_EQ_INT(S.push_tokens, 3 * B_ * T_);
  CHECK_EQ_INT(S.pushes, 1);
  CHECK_EQ_INT(S.bad_md, 0);
  CHECK_EQ_INT(S.registers, 3);            /* UNAVAILABLE, ok, again after UNAUTHENTICATED */
  CHECK_EQ_INT(S.prev_id, WID);            /* re-registration names its previous identity */
  CHECK(strcmp(S.prev_session, TOKEN) == 0);
  CHECK(S.pull_resumed_ok);                /* the cut-off pull resumed where it stopped */
  CHECK(S.cut_at > 0);
  CHECK_EQ_INT(S.releases, 1);             /* lease 6 (ABORTED) is dropped without Release */
  CHECK_EQ_INT(S.release_lease[0], 7);
  CHECK_EQ_INT(S.release_reason[0], DIPACO__V1__RELEASE_REASON__RELEASE_DONE);
  CHECK_EQ_INT(S.release_step[0], 6);
  CHECK(S.leases >= 4);
  pthread_mutex_unlock(&g_mu);
  CHECK(file_has(log, "no AdamW state for this slot")); /* fresh state for a slot never trained */
  if (test_failures || getenv("TEST_VERBOSE")) dump(log);
  free(want);
}

static void test_sigterm(int port) {
  reset_state(SC_SIGTERM);
  char log[300];
  snprintf(log, sizeof log, "%s/sigterm.log", g_tmp);
  pid_t pid = spawn_worker(port, 0, log);
  CHECK(pid > 0);
  int training = 0;
  for (int t = 0; t < 30000 && !training; t += 20) {
    pthread_mutex_lock(&g_mu);
    training = S.hb_lease == 8 && S.hb_last_step > 6 + 2 && S.hb_last_sps > 0 && isfinite(S.hb_last_loss);
    pthread_mutex_unlock(&g_mu);
    if (!training) sleep_ms(20);
  }
  CHECK(training);
  kill(pid, SIGTERM);
  int64_t t0 = time(NULL);
  int st = wait_exit(pid, 20000);
  CHECK_EQ_INT(st, 0);
  CHECK(time(NULL) - t0 < 10);
  pthread_mutex_lock(&g_mu);
  CHECK_EQ_INT(S.pushes, 0);
  /* The lease's Release, then the one at exit (lease 0: the worker itself is leaving). */
  CHECK_EQ_INT(S.releases, 2);
  CHECK_EQ_INT(S.release_lease[0], 8);
  CHECK_EQ_INT(S.release_reason[0], DIPACO__V1__RELEASE_REASON__RELEASE_DRAINING);
  CHECK_EQ_INT(S.release_lease[1], 0);
  CHECK_EQ_INT(S.release_reason[1], DIPACO__V1__RELEASE_REASON__RELEASE_DRAINING);
  CHECK(S.release_step[0] > 6 && S.release_step[0] < 6 + 1000000);
  CHECK(S.release_step[0] >= S.hb_last_step);
  CHECK_EQ_INT(S.bad_md, 0);
  pthread_mutex_unlock(&g_mu);
  if (test_failures || getenv("TEST_VERBOSE")) dump(log);
}

static void test_drain(int port) {
  reset_state(SC_DRAIN);
  char log[300];
  snprintf(log, sizeof log, "%s/drain.log", g_tmp);
  pid_t pid = spawn_worker(port, 0, log); /* no --exit-when-done: only DRAIN ends it */
  CHECK(pid > 0);
  int st = wait_exit(pid, 60000);
  CHECK_EQ_INT(st, 0);
  pthread_mutex_lock(&g_mu);
  CHECK_EQ_INT(S.pushes, 1);
  for (int i = 0; i < NFRAG; i++) CHECK_EQ_INT(S.push_frag_seen[i], 1);
  CHECK_EQ_INT(S.push_inner_steps, 300);
  /* DRAIN during the round (the usual case): no further Lease call. A very fast round may
   * end before the first heartbeat; then an idle heartbeat carries DRAIN. */
  fprintf(stderr, "drain: DRAIN %s\n", S.drain_in_lease ? "during the lease" : "on an idle heartbeat");
  if (S.drain_in_lease) CHECK_EQ_INT(S.leases, 1);
  else CHECK(S.leases >= 1 && S.leases <= 3);
  CHECK(S.heartbeats >= 1);
  pthread_mutex_unlock(&g_mu);
  if (test_failures || getenv("TEST_VERBOSE")) dump(log);
}

/* A lease the worker must refuse before any pull: Release(RELEASE_ERROR) whose message holds
 * want1 and want2. */
static void test_refusal(int port, int sc, const char *name, const char *want1, const char *want2) {
  reset_state(sc);
  char log[300];
  snprintf(log, sizeof log, "%s/%s.log", g_tmp, name);
  pid_t pid = spawn_worker(port, 0, log);
  CHECK(pid > 0);
  int released = 0;
  for (int t = 0; t < 20000 && !released; t += 20) {
    pthread_mutex_lock(&g_mu);
    released = S.releases > 0;
    pthread_mutex_unlock(&g_mu);
    if (!released) sleep_ms(20);
  }
  kill(pid, SIGTERM);
  CHECK_EQ_INT(wait_exit(pid, 20000), 0);
  pthread_mutex_lock(&g_mu);
  CHECK(released);
  CHECK_EQ_INT(S.release_reason[0], DIPACO__V1__RELEASE_REASON__RELEASE_ERROR);
  CHECK(strstr(S.release_msg[0], want1) != NULL);
  CHECK(strstr(S.release_msg[0], want2) != NULL);
  CHECK_EQ_INT(S.pulls, 0);
  pthread_mutex_unlock(&g_mu);
  if (test_failures || getenv("TEST_VERBOSE")) dump(log);
}

static void test_refused(int port) {
  reset_state(SC_REFUSED);
  char log[300];
  snprintf(log, sizeof log, "%s/refused.log", g_tmp);
  pid_t pid = spawn_worker(port, 1, log);
  CHECK(pid > 0);
  CHECK_EQ_INT(wait_exit(pid, 60000), 0);
  pthread_mutex_lock(&g_mu);
  CHECK_EQ_INT(S.pushes, 2); /* lease 30 once (not retried), lease 31 once */
  CHECK_EQ_INT(S.releases, 2);
  CHECK_EQ_INT(S.release_lease[0], 30);
  CHECK_EQ_INT(S.release_reason[0], DIPACO__V1__RELEASE_REASON__RELEASE_ERROR);
  CHECK(strstr(S.release_msg[0], "delta norm screen") != NULL);
  CHECK_EQ_INT(S.release_lease[1], 31);
  CHECK_EQ_INT(S.release_reason[1], DIPACO__V1__RELEASE_REASON__RELEASE_DONE);
  pthread_mutex_unlock(&g_mu);
  CHECK(file_has(log, "FAILED_PRECONDITION"));
  if (test_failures || getenv("TEST_VERBOSE")) dump(log);
}

/* Max |a − b| relative to max |b|; prints both. */
static double rel_diff(const char *what, const float *a, const float *b, size_t n) {
  double maxd = 0, maxw = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > maxd) maxd = d;
    if (fabs(b[i]) > maxw) maxw = fabs(b[i]);
  }
  fprintf(stderr, "%s: max |diff| %.3g (max |expected| %.3g)\n", what, maxd, maxw);
  return maxw > 0 ? maxd / maxw : (maxd > 0 ? INFINITY : 0);
}

static void test_keep(int port) {
  reset_state(SC_KEEP);
  char log[300];
  snprintf(log, sizeof log, "%s/keep.log", g_tmp);
  pid_t pid = spawn_worker(port, 1, log);
  CHECK(pid > 0);
  CHECK_EQ_INT(wait_exit(pid, 60000), 0);
  /* Oracle: one trainer per replica, state kept across its rounds; replica 1 reset at its
   * second round. */
  char s0[300], s1[300];
  snprintf(s0, sizeof s0, "%s/data/train_000.bin", g_tmp);
  snprintf(s1, sizeof s1, "%s/data/train_001.bin", g_tmp);
  const char *shards[2] = {s0, s1};
  gpt_backend_opts bo = {.kind = GPT_BACKEND_CPU, .threads = 1};
  size_t n = g_lay.n_params;
  float *want[4];
  for (int r = 0; r < 2; r++) {
    trainer_opts o = {.B = B_, .T = T_, .total_steps = 1000000, .lr = 0.01f, .lr_min_frac = 0.1f, .warmup = 2,
                      .hp = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 0.5f},
                      .replica = r, .n_replicas = 2};
    trainer *tr = NULL;
    CHECK_EQ_INT(trainer_open(&tr, &g_cfg, &bo, shards, 2, &o), 0);
    want[r] = calloc(n, sizeof(float));
    want[2 + r] = calloc(n, sizeof(float));
    trainer_stats ts;
    if (!tr) continue;
    CHECK_EQ_INT(trainer_round(tr, g_theta, 0, 2, want[r], &ts, NULL, NULL), 0);
    if (r == 1) trainer_reset_state(tr);
    CHECK_EQ_INT(trainer_round(tr, g_theta, 2, 2, want[2 + r], &ts, NULL, NULL), 0);
    trainer_free(tr);
  }
  pthread_mutex_lock(&g_mu);
  CHECK(rel_diff("keep: lease 21 (replica 0, steps 0-1)", S.pushed[1], want[0], n) <= 1e-6);
  CHECK(rel_diff("keep: lease 22 (replica 1, steps 0-1)", S.pushed[2], want[1], n) <= 1e-6);
  CHECK(rel_diff("keep: lease 23 (replica 0, steps 2-3, kept state)", S.pushed[3], want[2], n) <= 1e-6);
  CHECK(rel_diff("keep: lease 24 (replica 1, steps 2-3, reset state)", S.pushed[4], want[3], n) <= 1e-6);
  CHECK_EQ_INT(S.pushes, 4);
  CHECK_EQ_INT(S.bad_md, 0);
  pthread_mutex_unlock(&g_mu);
  /* The kept-state round differs from a fresh-state one (the test can tell them apart). */
  CHECK(rel_diff("keep: kept vs fresh state differ", want[2], want[3], n) > 1e-3);
  CHECK(!file_has(log, "no AdamW state"));   /* every slot started at step 0 or had state */
  CHECK(!file_has(log, "using it anyway"));
  if (test_failures || getenv("TEST_VERBOSE")) dump(log);

  /* COMMAND_STOP mid-round: Release(PREEMPTED), nothing pushed, the worker keeps leasing, and
   * the retried round starts from the AdamW state the stopped one started from. */
  reset_state(SC_STOP);
  snprintf(log, sizeof log, "%s/stop.log", g_tmp);
  pid = spawn_worker(port, 1, log);
  CHECK(pid > 0);
  CHECK_EQ_INT(wait_exit(pid, 60000), 0);
  pthread_mutex_lock(&g_mu);
  CHECK_EQ_INT(S.pushes, 1);
  CHECK(S.releases >= 2);
  CHECK_EQ_INT(S.release_lease[0], 21);
  CHECK_EQ_INT(S.release_reason[0], DIPACO__V1__RELEASE_REASON__RELEASE_PREEMPTED);
  CHECK(S.release_step[0] >= 3);
  CHECK(strstr(S.release_msg[0], "stopped by the coordinator") != NULL);
  CHECK_EQ_INT(S.release_lease[1], 22);
  CHECK_EQ_INT(S.release_reason[1], DIPACO__V1__RELEASE_REASON__RELEASE_DONE);
  CHECK(rel_diff("stop: lease 22 (the round again, state restored)", S.pushed[2], want[0], n) <= 1e-6);
  pthread_mutex_unlock(&g_mu);
  for (int i = 0; i < 4; i++) free(want[i]);
  if (test_failures || getenv("TEST_VERBOSE")) dump(log);
}

static void test_resolve_data(void) {
  char **p = NULL;
  int n = 0;
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "{\"data\":{\"train\":[\"data/train_*.bin\", \"data/train_000.bin\"]}}",
                                   0, NULL, &p, &n), 0);
  CHECK_EQ_INT(n, 3);
  if (n == 3) {
    CHECK(strstr(p[0], "/data/train_000.bin") != NULL);
    CHECK(strstr(p[1], "/data/train_001.bin") != NULL);
    CHECK(strstr(p[2], "/data/train_000.bin") != NULL);
  }
  worker_free_paths(p, n);
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "{\"data\":{\"train\":[\"data/none_*.bin\"]}}", 0, NULL, &p, &n), DPC_ENOENT);
  CHECK(strstr(dpc_errmsg(), "data/none_*.bin") != NULL);
  CHECK(p == NULL && n == 0);
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "{\"data\":{\"train\":[\"/etc/passwd\"]}}", 0, NULL, &p, &n), DPC_EINVAL);
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "{\"data\":{\"train\":[\"data/../../x\"]}}", 0, NULL, &p, &n), DPC_EINVAL);
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "{\"data\":{\"train\":[3]}}", 0, NULL, &p, &n), DPC_EFORMAT);
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "{not json", 0, NULL, &p, &n), DPC_EFORMAT);
  /* No data.train in the spec: DataWindow.dataset is the fallback. */
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "{}", 0, "data/train_001.bin,data/train_000.bin", &p, &n), 0);
  CHECK_EQ_INT(n, 2);
  if (n == 2) CHECK(strstr(p[0], "train_001") && strstr(p[1], "train_000"));
  worker_free_paths(p, n);
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "", 0, "", &p, &n), DPC_EINVAL);
  /* data.paths: path 1 reads only its own list. */
  const char *pp = "{\"data\":{\"paths\":[[\"data/train_000.bin\"],[\"data/train_001.bin\"]]}}";
  CHECK_EQ_INT(worker_resolve_data(g_tmp, pp, 1, "ignored", &p, &n), 0);
  CHECK_EQ_INT(n, 1);
  if (n == 1) CHECK(strstr(p[0], "train_001") != NULL);
  worker_free_paths(p, n);
  CHECK_EQ_INT(worker_resolve_data(g_tmp, pp, 2, NULL, &p, &n), DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "2 lists") != NULL);
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "{\"data\":{\"paths\":[[]]}}", 0, NULL, &p, &n), DPC_EINVAL);
  /* Containment by resolved path: glob's ".?" matches "..", and a symlink may lead
   * anywhere; both are refused once resolved, naming where they lead. */
  char inner[300], link[320], out[300];
  snprintf(inner, sizeof inner, "%s/inner", g_tmp);
  CHECK(mkdir(inner, 0755) == 0 || errno == EEXIST);
  snprintf(out, sizeof out, "%s/outside.bin", g_tmp);
  FILE *f = fopen(out, "wb");
  CHECK(f != NULL);
  if (f) fclose(f);
  CHECK_EQ_INT(worker_resolve_data(inner, "{\"data\":{\"train\":[\".?/outside.bin\"]}}", 0, NULL, &p, &n), DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "outside --data-dir") != NULL && p == NULL && n == 0);
  snprintf(link, sizeof link, "%s/inner/link.bin", g_tmp);
  CHECK(symlink(out, link) == 0 || errno == EEXIST);
  CHECK_EQ_INT(worker_resolve_data(inner, "{\"data\":{\"train\":[\"link.bin\"]}}", 0, NULL, &p, &n), DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "outside.bin") != NULL);
  /* The same file reached from a --data-dir that holds it is fine. */
  CHECK_EQ_INT(worker_resolve_data(g_tmp, "{\"data\":{\"train\":[\"inner/link.bin\"]}}", 0, NULL, &p, &n), 0);
  worker_free_paths(p, n);
}

static void test_place(void) {
  size_t abs[4];
  /* Two levels, listed out of order; level 1 split in two. offset_floats is an offset in the
   * whole model's layout (proto/dipaco.proto). */
  uint32_t lv[3] = {1, 0, 1};
  uint64_t mo[3] = {5, 1, 5}, of[3] = {140, 0, 100}, ln[3] = {60, 100, 40};
  CHECK_EQ_INT(worker_place_fragments(3, lv, mo, of, ln, 200, abs), 0);
  CHECK_EQ_INT(abs[0], 140);
  CHECK_EQ_INT(abs[1], 0);
  CHECK_EQ_INT(abs[2], 100);
  /* Offsets within each module (one reading only: these repeat 0 and leave a gap) are refused. */
  uint64_t rel[3] = {40, 0, 0};
  CHECK_EQ_INT(worker_place_fragments(3, lv, mo, rel, ln, 200, abs), DPC_EFORMAT);
  /* Offsets whose level order disagrees with the layout are refused. */
  uint32_t lv5[3] = {0, 1, 1};
  CHECK_EQ_INT(worker_place_fragments(3, lv5, mo, of, ln, 200, abs), DPC_EFORMAT);
  /* A gap, a short cover, two modules on one level, no fragments. */
  uint64_t of3[3] = {141, 0, 100};
  CHECK_EQ_INT(worker_place_fragments(3, lv, mo, of3, ln, 200, abs), DPC_EFORMAT);
  CHECK_EQ_INT(worker_place_fragments(3, lv, mo, of, ln, 201, abs), DPC_EFORMAT);
  uint64_t mo4[3] = {5, 1, 6};
  CHECK_EQ_INT(worker_place_fragments(3, lv, mo4, of, ln, 200, abs), DPC_EFORMAT);
  CHECK_EQ_INT(worker_place_fragments(0, lv, mo, of, ln, 200, abs), DPC_EFORMAT);
}

static void test_flags(void) {
  const char *cases[][4] = {{"--bogus", NULL, NULL, NULL},
                            {"--coordinator", "x:1", NULL, NULL},
                            {"--coordinator", "x:1", "--data-dir", "/nonexistent/dir"},
                            {"--threads", "abc", NULL, NULL}};
  for (int k = 0; k < 4; k++) {
    const char *argv[6] = {g_worker};
    int n = 1;
    for (int j = 0; j < 4 && cases[k][j]; j++) argv[n++] = cases[k][j];
    argv[n] = NULL;
    pid_t pid;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    CHECK_EQ_INT(posix_spawn(&pid, g_worker, &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    CHECK_EQ_INT(wait_exit(pid, 20000), 2);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_worker PATH/TO/dipaco-worker\n");
    return 2;
  }
  g_worker = argv[1];
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_tmp, sizeof g_tmp, "/tmp/test_worker.XXXXXX");
  if (!mkdtemp(g_tmp)) return 1;
  char dir[300], path[400];
  snprintf(dir, sizeof dir, "%s/data", g_tmp);
  mkdir(dir, 0755);
  uint16_t tok[1500];
  uint32_t x = 12345;
  for (int s = 0; s < 2; s++) {
    for (int i = 0; i < 1500; i++) {
      x = x * 1664525u + 1013904223u;
      tok[i] = (uint16_t)((x >> 16) % 64);
    }
    snprintf(path, sizeof path, "%s/train_%03d.bin", dir, s);
    CHECK_EQ_INT(shard_write(path, tok, 1500), 0);
  }
  CHECK_EQ_INT(gpt_layout_build(&g_cfg, &g_lay), 0);
  g_theta = malloc(g_lay.n_params * sizeof(float));
  for (int i = 0; i < NPUSH; i++) S.pushed[i] = calloc(g_lay.n_params, sizeof(float));
  gpt_init_params(&g_lay, g_theta, 7);
  /* Level 0: stem + layer 0; level 1: layer 1 in two fragments. */
  size_t l1 = g_lay.layer_off[1], rest = g_lay.n_params - l1, half = rest / 2;
  f_off[0] = 0, f_len[0] = l1, f_abs[0] = 0;
  f_off[1] = l1, f_len[1] = half, f_abs[1] = l1;
  f_off[2] = l1 + half, f_len[2] = rest - half, f_abs[2] = l1 + half;

  test_resolve_data();
  test_place();
  test_flags();

  struct rpc_server_config cfg = {.addr = "127.0.0.1:0"};
  struct rpc_server *srv = NULL;
  CHECK_EQ_INT(rpc_server_start(&cfg, methods, sizeof methods / sizeof methods[0], &srv), 0);
  if (srv) {
    int port = rpc_server_port(srv);
    test_happy(port);
    test_sigterm(port);
    test_drain(port);
    test_refusal(port, SC_NODATA, "nodata", "nothing/here_*.bin", "matches no file");
    test_refusal(port, SC_BADMUON, "badmuon", "Muon settings out of range", "momentum 1.5");
    test_refused(port);
    test_keep(port);
    rpc_server_stop(srv, 500);
  }
  free(g_theta);
  for (int i = 0; i < NPUSH; i++) free(S.pushed[i]);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
  if (!test_failures && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
  TEST_DONE();
}
