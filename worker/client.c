/* client.c — the worker's Coordinator calls (see client.h): one function per RPC, reply
 * validation, and the error classification the lease loop acts on. */
#include "worker/client.h"
#include "worker/client_internal.h"
#include "worker/storeget.h"
#include "common/codec.h"
#include "common/auth.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOB_URLS_MAX 65536 /* an answer of URLs: a few presigned URLs */



/* Connection credentials of the process (wc_set_credentials). */
static struct {
  int use_tls;
  struct rpc_tls tls;
  char bearer[DPC_TOKEN_MAX + 8]; /* "Bearer <join token>" or "" */
} g_cred;

int wc_set_credentials(const struct rpc_tls *tls, const char *join_token) {
  memset(&g_cred, 0, sizeof g_cred);
  if (join_token) {
    size_t n = strlen(join_token);
    if (n == 0 || n > DPC_TOKEN_MAX)
      return dpc_err(DPC_ERANGE, "join token: %zu bytes; expected 1..%d", n, DPC_TOKEN_MAX);
    snprintf(g_cred.bearer, sizeof g_cred.bearer, "Bearer %s", join_token);
  }
  if (tls) {
    g_cred.use_tls = 1;
    g_cred.tls = *tls;
  }
  return 0;
}

enum wc_class wc_classify(int rc, int code) {
  if (rc == 0) return WC_OK;
  switch (code) {
  case RPC_UNAVAILABLE:
  case RPC_DEADLINE_EXCEEDED:
  case RPC_CANCELLED:
  case RPC_DATA_LOSS:
    return WC_RETRY;
  case RPC_UNAUTHENTICATED:
    return WC_REREGISTER;
  case RPC_ABORTED:
  case RPC_NOT_FOUND:
    return WC_LEASE_GONE;
  case RPC_OK: /* a local check failed on what was received */
    return rc == DPC_ECHECKSUM || rc == DPC_EFORMAT ? WC_RETRY : WC_FATAL;
  default:
    return WC_FATAL;
  }
}

int wc_open(wclient *c, const char *target, uint32_t chunk_flag) {
  memset(c, 0, sizeof *c);
  c->chunk_flag = chunk_flag ? chunk_flag : RPC_CHUNK_DEFAULT;
  c->max_chunk_bytes = c->chunk_flag;
  c->heartbeat_ms = 2000;
  struct rpc_client_config cfg = {.target = target, .tls = g_cred.use_tls ? &g_cred.tls : NULL};
  return rpc_client_open(&cfg, &c->rpc);
}

void wc_close(wclient *c) {
  rpc_client_close(c->rpc);
  c->rpc = NULL;
}

int wc_reconnect(wclient *c, const char *target) {
  struct rpc_client_config cfg = {.target = target, .tls = g_cred.use_tls ? &g_cred.tls : NULL};
  struct rpc_client *fresh = NULL;
  int rc = rpc_client_open(&cfg, &fresh);
  if (rc) return rc;
  if (c->worker_id) {
    char idbuf[32];
    snprintf(idbuf, sizeof idbuf, "%" PRIu64, c->worker_id);
    if ((rc = rpc_client_set_md(fresh, RPC_MD_WORKER_ID, idbuf)) ||
        (rc = rpc_client_set_md(fresh, RPC_MD_SESSION, c->session))) {
      rpc_client_close(fresh);
      return rc;
    }
  }
  rpc_client_close(c->rpc);
  c->rpc = fresh;
  return 0;
}

int wc_register(wclient *c, Dipaco__V1__RegisterRequest *req, int *code) {
  req->previous_worker_id = c->worker_id;
  req->previous_session = c->session;
  ProtobufCMessage *pm = NULL;
  /* The join token goes with Register only; later calls carry the session token. */
  int rc = g_cred.bearer[0] ? rpc_client_set_md(c->rpc, RPC_MD_AUTHORIZATION, g_cred.bearer) : 0;
  if (rc) {
    *code = RPC_OK;
    return rc;
  }
  rc = rpc_unary(c->rpc, SVC "Register", &req->base, &dipaco__v1__register_response__descriptor, &pm,
                 UNARY_TIMEOUT_MS);
  *code = rpc_last_code();
  if (g_cred.bearer[0]) rpc_client_set_md(c->rpc, RPC_MD_AUTHORIZATION, NULL);
  req->previous_session = NULL;
  if (rc) return rc;
  Dipaco__V1__RegisterResponse *r = (Dipaco__V1__RegisterResponse *)pm;
  size_t tl = r->session_token ? strlen(r->session_token) : 0;
  if (r->worker_id == 0 || tl == 0 || tl > WC_SESSION_MAX) {
    rc = dpc_err(DPC_EFORMAT, "Register: reply has worker_id %" PRIu64 " and a %zu-byte session token "
                 "(need an id > 0 and 1..%d bytes)", r->worker_id, tl, WC_SESSION_MAX);
    protobuf_c_message_free_unpacked(pm, NULL);
    return rc;
  }
  char idbuf[32];
  snprintf(idbuf, sizeof idbuf, "%" PRIu64, r->worker_id);
  if ((rc = rpc_client_set_md(c->rpc, RPC_MD_WORKER_ID, idbuf)) ||
      (rc = rpc_client_set_md(c->rpc, RPC_MD_SESSION, r->session_token))) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return rc; /* e.g. a token with non-printable bytes */
  }
  c->worker_id = r->worker_id;
  memcpy(c->session, r->session_token, tl + 1);
  uint32_t hb = r->heartbeat_interval_ms ? r->heartbeat_interval_ms : 2000;
  c->heartbeat_ms = hb < 50 ? 50 : hb > 60000 ? 60000 : hb;
  c->lease_ttl_ms = r->lease_ttl_ms;
  c->max_chunk_bytes = c->chunk_flag;
  if (r->max_chunk_bytes && r->max_chunk_bytes < c->max_chunk_bytes) c->max_chunk_bytes = r->max_chunk_bytes;
  if (c->max_chunk_bytes < 1024) c->max_chunk_bytes = 1024;
  protobuf_c_message_free_unpacked(pm, NULL);
  return 0;
}

int wc_lease(wclient *c, uint32_t max_wait_ms, Dipaco__V1__LeaseResponse **out, int *code, int (*stop)(void *ud),
             void *ud) {
  Dipaco__V1__LeaseRequest req = DIPACO__V1__LEASE_REQUEST__INIT;
  req.max_wait_ms = max_wait_ms;
  ProtobufCMessage *pm = NULL;
  *out = NULL;
  int rc = rpc_unary_stoppable(c->rpc, SVC "Lease", &req.base, &dipaco__v1__lease_response__descriptor, &pm,
                               (int)max_wait_ms + UNARY_TIMEOUT_MS, stop, ud);
  *code = rpc_last_code();
  if (rc) return rc;
  Dipaco__V1__LeaseResponse *r = (Dipaco__V1__LeaseResponse *)pm;
  if (r->outcome == DIPACO__V1__LEASE_OUTCOME__LEASE_GRANTED && (!r->lease || r->lease->lease_id == 0)) {
    protobuf_c_message_free_unpacked(pm, NULL);
    return dpc_err(DPC_EFORMAT, "Lease: LEASE_GRANTED without a lease (or with lease_id 0)");
  }
  *out = r;
  return 0;
}

int wc_watch(wclient *c, uint64_t lease_id, int *code, int *lease_ended, int (*stop)(void *ud), void *ud) {
  Dipaco__V1__WatchRequest req = DIPACO__V1__WATCH_REQUEST__INIT;
  req.lease_id = lease_id;
  ProtobufCMessage *pm = NULL;
  *lease_ended = 0;
  /* The deadline must outlast the coordinator's hold (LEASE_WATCH_HOLD_MS, 30 s). */
  int rc = rpc_unary_stoppable(c->rpc, SVC "Watch", &req.base, &dipaco__v1__watch_response__descriptor, &pm, 90000,
                               stop, ud);
  *code = rpc_last_code();
  if (pm) {
    *lease_ended = rc == 0 && ((Dipaco__V1__WatchResponse *)pm)->lease_ended;
    protobuf_c_message_free_unpacked(pm, NULL);
  }
  return rc;
}

int wc_heartbeat(wclient *c, const Dipaco__V1__HeartbeatRequest *req, Dipaco__V1__HeartbeatResponse **out,
                 int *code) {
  ProtobufCMessage *pm = NULL;
  *out = NULL;
  int to = (int)c->heartbeat_ms * 2;
  if (to < 2000) to = 2000;
  int rc = rpc_unary(c->rpc, SVC "Heartbeat", &req->base, &dipaco__v1__heartbeat_response__descriptor, &pm, to);
  *code = rpc_last_code();
  if (rc) return rc;
  *out = (Dipaco__V1__HeartbeatResponse *)pm;
  return 0;
}

static int pull_stream(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, int payload, float *dst,
                       size_t *got, int *code);
static int pull_from_store(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, int payload, float *dst,
                           int *code);

/* (The lease's own pull: the worker read f->params_url already, or could not: the bytes.) */
int wc_pull(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, float *dst, size_t *got,
            int *code) {
  return pull_stream(c, lease_id, f, DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS, dst, got, code);
}

int wc_pull_payload(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, int payload, float *dst,
                    size_t *got, int *code) {
  if (payload == DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM && f->version == 0) {
    /* The outer momentum starts at zero (the coordinator serves zeros there, docs/design.md §4.3). */
    memset(dst, 0, (size_t)f->num_floats * sizeof(float));
    *got = (size_t)f->num_floats * sizeof(float);
    *code = RPC_OK;
    return 0;
  }
  if (*got == 0 && f->params_url && f->params_url[0] && dpc_mono_ns() >= atomic_load(&c->store_retry_ns)) {
    int rc = pull_from_store(c, lease_id, f, payload, dst, code);
    if (rc == 0) {
      *got = (size_t)f->num_floats * sizeof(float);
      return 0;
    }
    if (*code != RPC_OK) return rc; /* the coordinator's answer (e.g. not made yet): as for the bytes */
    if (rc != DPC_EUNSUPPORTED) { /* the store failed us: the next minute's pulls go through the coordinator */
      DPC_WARN("lease %" PRIu64 ": reading fragment %" PRIu64 " version %" PRIu64 " from the object store: %s; pulling "
               "it through the coordinator", lease_id, f->fragment_id, f->version, dpc_errmsg());
      atomic_store(&c->store_retry_ns, dpc_mono_ns() + (int64_t)60 * 1000000000);
    }
  }
  return pull_stream(c, lease_id, f, payload, dst, got, code);
}

static int pull_stream(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, int payload, float *dst,
                       size_t *got, int *code) {
  Dipaco__V1__PullFragmentRequest req = DIPACO__V1__PULL_FRAGMENT_REQUEST__INIT;
  size_t bytes = (size_t)f->num_floats * sizeof(float);
  req.lease_id = lease_id;
  req.fragment_id = f->fragment_id;
  req.version = f->version;
  req.latest = 0;
  req.offset = *got;
  req.codec = DIPACO__V1__CODEC__CODEC_FP32;
  req.max_chunk_bytes = c->max_chunk_bytes;
  req.payload = (Dipaco__V1__Payload)payload;
  struct rpc_chunk h;
  memset(&h, 0, sizeof h);
  size_t g = *got;
  int rc = rpc_pull(c->rpc, SVC "PullFragment", &req.base, transfer_timeout_ms(bytes), *got, dst, bytes, &h, &g);
  *code = rpc_last_code();
  if (g > *got) *got = g;
  if (rc) {
    if (rc == DPC_ECHECKSUM) *got = 0; /* corrupted somewhere: start over */
    return rc;
  }
  *code = RPC_OK;
  const char *what = NULL;
  if (h.total != bytes) what = "byte length";
  else if (h.fragment_id != f->fragment_id) what = "fragment id";
  else if (h.version != f->version) what = "version";
  else if (h.codec != DIPACO__V1__CODEC__CODEC_FP32) what = "codec (asked for fp32)";
  else if (h.payload != (uint32_t)payload) what = "payload";
  else if (h.num_floats != f->num_floats) what = "num_floats";
  else if (f->crc32c && h.crc32c != f->crc32c) what = "CRC-32C (the lease's FragmentInfo disagrees)";
  if (what) {
    *got = 0;
    return dpc_err(DPC_EFORMAT, "PullFragment: fragment %" PRIu64 " version %" PRIu64 ": the served stream has the "
                   "wrong %s (total %" PRIu64 ", fragment %" PRIu64 ", version %" PRIu64 ", crc %08x, lease crc %08x)",
                   f->fragment_id, f->version, what, h.total, h.fragment_id, h.version, h.crc32c, f->crc32c);
  }
  return 0;
}

int wc_push_finish(struct rpc_stream *s, Dipaco__V1__FragmentInfo *const *frags, size_t n, int rc, int *results,
                   int *code) {
  ProtobufCMessage *pm = NULL;
  int frc = rpc_stream_finish(s, &dipaco__v1__push_delta_response__descriptor, &pm);
  *code = rpc_last_code();
  rpc_stream_free(s);
  if (frc) return frc;
  if (rc) {
    if (pm) protobuf_c_message_free_unpacked(pm, NULL);
    *code = RPC_UNAVAILABLE;
    return rc;
  }
  Dipaco__V1__PushDeltaResponse *r = (Dipaco__V1__PushDeltaResponse *)pm;
  for (size_t a = 0; a < r->n_acks; a++)
    for (size_t i = 0; i < n; i++)
      if (r->acks[a]->fragment_id == frags[i]->fragment_id) results[i] = r->acks[a]->result;
  protobuf_c_message_free_unpacked(pm, NULL);
  return 0;
}

void wc_delta_header(struct rpc_chunk *h, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f,
                         uint64_t inner_steps, uint64_t tokens, int payload) {
  memset(h, 0, sizeof *h);
  h->lease_id = lease_id;
  h->fragment_id = f->fragment_id;
  h->version = f->version;
  h->num_floats = f->num_floats;
  h->inner_steps = inner_steps;
  h->tokens = tokens;
  h->payload = payload;
}

/* wc_push and wc_push_sparse: fp32 deltas encoded with codec on the way out, or (sp != NULL)
 * streams already encoded with CODEC_SPARSE of sp_bytes[i] bytes. */
static int push_impl(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                     const float *const *delta, const unsigned char *const *sp, const size_t *sp_bytes,
                     uint64_t inner_steps, uint64_t tokens, int codec, uint32_t block, int *results, int *code,
                     uint64_t *sent) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    size_t b = 0;
    *code = RPC_OK;
    if (sp) b = sp_bytes[i];
    else if (dpc_codec_bytes(codec, frags[i]->num_floats, block, &b) < 0) return DPC_EINVAL;
    total += b;
    results[i] = -1;
  }
  struct rpc_stream *s = NULL;
  int rc = rpc_stream_open(c->rpc, SVC "PushDelta", NULL, transfer_timeout_ms(total), &s);
  *code = rpc_last_code();
  if (rc) return rc;
  unsigned char *enc = NULL;
  for (size_t i = 0; i < n && !rc; i++) {
    struct rpc_chunk h;
    wc_delta_header(&h, lease_id, frags[i], inner_steps, tokens, DIPACO__V1__PAYLOAD__PAYLOAD_DELTA);
    h.codec = (uint32_t)codec;
    h.block_floats = dpc_codec_is_block(codec) ? block : 0;
    size_t bytes = 0;
    const void *data = sp ? (const void *)sp[i] : (const void *)delta[i];
    if (sp) bytes = sp_bytes[i];
    else dpc_codec_bytes(codec, frags[i]->num_floats, block, &bytes);
    if (!sp && codec != DPC_CODEC_FP32) { /* quantized on the way out; the CRC covers the bytes sent */
      free(enc);
      enc = malloc(bytes ? bytes : 1);
      rc = enc ? dpc_codec_encode(codec, delta[i], (size_t)frags[i]->num_floats, block, enc)
               : dpc_err(DPC_ENOMEM, "worker: out of memory encoding a delta");
      data = enc;
    }
    if (!rc) rc = rpc_stream_write_chunks(s, &h, data, bytes, c->max_chunk_bytes);
    if (!rc && sent) *sent += bytes;
  }
  free(enc);
  return wc_push_finish(s, frags, n, rc, results, code);
}

int wc_push(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
            const float *const *delta, uint64_t inner_steps, uint64_t tokens, int codec, uint32_t block,
            int *results, int *code, uint64_t *sent) {
  return push_impl(c, lease_id, frags, n, delta, NULL, NULL, inner_steps, tokens, codec, block, results, code, sent);
}

int wc_push_sparse(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                   const unsigned char *const *enc, const size_t *bytes, uint64_t inner_steps, uint64_t tokens,
                   int *results, int *code, uint64_t *sent) {
  return push_impl(c, lease_id, frags, n, NULL, enc, bytes, inner_steps, tokens, DPC_CODEC_SPARSE, 0, results, code,
                   sent);
}

/* One PullFragment of a round (pull_round_impl): with objects, PAYLOAD_ROUND_OBJECTS is taken
 * as well as `payload` (*got says which came). */
static int pull_round_once(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, uint64_t version,
                           uint64_t skip_lease, int payload, uint64_t budget, size_t max_bytes, int objects,
                           unsigned char **out, size_t *len, uint32_t *got, int *code) {
  *out = NULL;
  *len = 0;
  *got = (uint32_t)payload;
  Dipaco__V1__PullFragmentRequest req = DIPACO__V1__PULL_FRAGMENT_REQUEST__INIT;
  req.lease_id = lease_id;
  req.fragment_id = f->fragment_id;
  req.version = version;
  req.codec = DIPACO__V1__CODEC__CODEC_FP32;
  req.max_chunk_bytes = c->max_chunk_bytes;
  req.payload = (Dipaco__V1__Payload)payload;
  req.skip_lease = skip_lease;
  req.replay_budget = budget;
  req.round_objects = objects != 0;
  const char *kind = payload == DIPACO__V1__PAYLOAD__PAYLOAD_REPLAY_ROUND ? "replay" : "sparse";
  struct rpc_stream *s = NULL;
  int rc = rpc_stream_open(c->rpc, SVC "PullFragment", &req.base, transfer_timeout_ms(max_bytes), &s);
  *code = rpc_last_code();
  if (rc) return rc;
  unsigned char *buf = NULL;
  uint64_t next = 0, total = 0;
  uint32_t crc = 0;
  int done = 0;
  for (;;) {
    struct grpc_byte_buffer *msg = NULL;
    rc = rpc_stream_read(s, &msg);
    if (rc <= 0) break;
    struct rpc_chunk h;
    const char *what = NULL;
    rc = rpc_chunk_parse(msg, &h);
    if (rc == 0) {
      if (done) what = "extra chunk after the stream";
      else if (h.payload != (uint32_t)payload &&
               !(objects && h.payload == DIPACO__V1__PAYLOAD__PAYLOAD_ROUND_OBJECTS && !buf))
        what = "payload";
      else if (h.fragment_id != f->fragment_id || h.version != version || h.num_floats != f->num_floats) what = "fragment";
      else if (h.total < 4 || h.total > max_bytes || (buf && h.total != total)) what = "total";
      else if (h.offset != next || h.len > h.total - next) what = "offset";
      if (!what && !buf) {
        *got = h.payload;
        total = h.total;
        if (!(buf = malloc((size_t)total))) rc = dpc_err(DPC_ENOMEM, "worker: out of memory for a %s round", kind);
      }
      if (!what && !rc) rc = rpc_chunk_copy(msg, &h, buf + next);
    }
    rpc_msg_free(msg);
    if (rc == 0 && what)
      rc = dpc_err(DPC_EFORMAT, "PullFragment (%s round): fragment %" PRIu64 " version %" PRIu64 ": bad %s", kind,
                   f->fragment_id, version, what);
    if (rc) break;
    crc = dpc_crc32c(crc, buf + next, h.len);
    next += h.len;
    if (next == total) {
      if (h.crc32c != crc) {
        rc = dpc_err(DPC_ECHECKSUM, "PullFragment (%s round): fragment %" PRIu64 ": CRC-32C mismatch", kind, f->fragment_id);
        break;
      }
      done = 1;
    }
  }
  *code = rpc_last_code();
  rpc_stream_free(s);
  if (rc == 0 && !done) {
    *code = RPC_OK;
    rc = dpc_err(DPC_EFORMAT, "PullFragment (%s round): fragment %" PRIu64 ": the stream ended early", kind, f->fragment_id);
  }
  if (rc) {
    free(buf);
    return rc;
  }
  *out = buf;
  *len = (size_t)total;
  return 0;
}

static uint64_t get_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

#define BLOB_KIND_ENCODED 10 /* a stream kept as sent (coordinator/blobs.h); others: the padded payload */

/* A round's bytes from PAYLOAD_ROUND_OBJECTS (proto/dipaco.proto) in b[n]: the table copied, every
 * stream read from the store through its URL and checked against its CRC-32C. Any malformed entry,
 * failed read or mismatch fails (the caller then asks for the bytes). */
static int round_from_objects(const unsigned char *b, size_t n, size_t max_bytes, unsigned char **out, size_t *len) {
  if (n < 16) return dpc_err(DPC_EFORMAT, "round objects: %zu bytes", n);
  uint64_t rlen = get_le(b, 8), head = get_le(b + 8, 4);
  if (rlen > max_bytes || head > rlen || 12 + head + 4 > n)
    return dpc_err(DPC_EFORMAT, "round objects: a round of %" PRIu64 " bytes, table %" PRIu64, rlen, head);
  unsigned char *r = malloc((size_t)rlen + 4);
  if (!r) return dpc_err(DPC_ENOMEM, "worker: out of memory for a round of %" PRIu64 " bytes", rlen);
  memcpy(r, b + 12, (size_t)head);
  size_t at = 12 + (size_t)head;
  uint64_t np = get_le(b + at, 4), filled = head;
  at += 4;
  int rc = 0;
  for (uint64_t i = 0; i < np && !rc; i++) {
    if (n - at < 28) {
      rc = dpc_err(DPC_EFORMAT, "round objects: entry %" PRIu64 " cut short", i);
      break;
    }
    uint64_t where = get_le(b + at, 8), bytes = get_le(b + at + 8, 8), ul = get_le(b + at + 24, 4);
    uint32_t crc = (uint32_t)get_le(b + at + 16, 4), kind = (uint32_t)get_le(b + at + 20, 4);
    /* streams follow each other from the table's end; a blob's payload is padded to whole floats */
    uint64_t take = kind == BLOB_KIND_ENCODED ? bytes : (bytes + 3) & ~(uint64_t)3;
    if (where != filled || bytes > rlen - where || take > rlen + 4 - where || ul == 0 || ul > 8192 ||
        n - at - 28 < ul) {
      rc = dpc_err(DPC_EFORMAT, "round objects: entry %" PRIu64 " out of place", i);
      break;
    }
    char url[8193];
    memcpy(url, b + at + 28, (size_t)ul);
    url[ul] = 0;
    at += 28 + (size_t)ul;
    rc = storeget_range(url, 24, r + where, (size_t)take, 60000);
    if (!rc && dpc_crc32c(0, r + where, (size_t)take) != crc)
      rc = dpc_err(DPC_ECHECKSUM, "round objects: stream %" PRIu64 " from the store does not match its CRC-32C", i);
    filled = where + bytes;
  }
  if (!rc && filled != rlen) rc = dpc_err(DPC_EFORMAT, "round objects: the streams fill %" PRIu64 " of %" PRIu64
                                          " bytes", filled, rlen);
  if (rc) {
    free(r);
    return rc;
  }
  *out = r;
  *len = (size_t)rlen;
  return 0;
}

/* wc_pull_sparse_round and wc_pull_replay_round: payload PAYLOAD_SPARSE_ROUND or
 * PAYLOAD_REPLAY_ROUND (with its byte budget). The coordinator is asked for the streams' URLs
 * (round_objects; ignored unless its blobs are on S3), and the streams are read from the store;
 * if that fails, the round is asked for again, bytes and all. */
static int pull_round_impl(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, uint64_t version,
                           uint64_t skip_lease, int payload, uint64_t budget, size_t max_bytes, unsigned char **out,
                           size_t *len, int *code) {
  uint32_t got = 0;
  int rc = pull_round_once(c, lease_id, f, version, skip_lease, payload, budget, max_bytes, 1, out, len, &got, code);
  if (rc || got != DIPACO__V1__PAYLOAD__PAYLOAD_ROUND_OBJECTS) return rc;
  unsigned char *obj = *out;
  size_t olen = *len;
  rc = round_from_objects(obj, olen, max_bytes, out, len);
  free(obj);
  if (!rc) {
    DPC_INFO("fragment %" PRIu64 ": the %s round of version %" PRIu64 " read from the object store (%zu bytes)",
             f->fragment_id, payload == DIPACO__V1__PAYLOAD__PAYLOAD_REPLAY_ROUND ? "replay" : "sparse", version, *len);
    return 0;
  }
  DPC_WARN("fragment %" PRIu64 " round %" PRIu64 ": reading its streams from the store failed: %s; pulling them "
           "through the coordinator", f->fragment_id, version, dpc_errmsg());
  return pull_round_once(c, lease_id, f, version, skip_lease, payload, budget, max_bytes, 0, out, len, &got, code);
}

int wc_pull_sparse_round(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, uint64_t version,
                         uint64_t skip_lease, size_t max_bytes, unsigned char **out, size_t *len, int *code) {
  return pull_round_impl(c, lease_id, f, version, skip_lease, DIPACO__V1__PAYLOAD__PAYLOAD_SPARSE_ROUND, 0, max_bytes,
                         out, len, code);
}

int wc_pull_replay_round(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, uint64_t version,
                         uint64_t skip_lease, uint64_t budget, size_t max_bytes, unsigned char **out, size_t *len,
                         int *code) {
  return pull_round_impl(c, lease_id, f, version, skip_lease, DIPACO__V1__PAYLOAD__PAYLOAD_REPLAY_ROUND, budget,
                         max_bytes, out, len, code);
}

int wc_release(wclient *c, uint64_t lease_id, int reason, uint64_t step, const char *msg, int *code) {
  Dipaco__V1__ReleaseRequest req = DIPACO__V1__RELEASE_REQUEST__INIT;
  req.lease_id = lease_id;
  req.reason = reason;
  req.step = step;
  req.message = (char *)(msg ? msg : "");
  ProtobufCMessage *pm = NULL;
  int rc = rpc_unary(c->rpc, SVC "Release", &req.base, &dipaco__v1__release_response__descriptor, &pm,
                     UNARY_TIMEOUT_MS);
  *code = rpc_last_code();
  if (pm) protobuf_c_message_free_unpacked(pm, NULL);
  return rc;
}

int wc_push_inner(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                  const float *const *m, const float *const *v, const float *const *local, int third, uint64_t step,
                  int *code) {
  const uint32_t payload[3] = {DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_M, DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_V,
                               (uint32_t)third};
  const size_t parts = local ? 3 : 2;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += parts * (size_t)frags[i]->num_floats * sizeof(float);
  struct rpc_stream *s = NULL;
  int rc = rpc_stream_open(c->rpc, SVC "PushInnerState", NULL, transfer_timeout_ms(total), &s);
  *code = rpc_last_code();
  if (rc) return rc;
  for (size_t i = 0; i < parts * n && !rc; i++) {
    const Dipaco__V1__FragmentInfo *f = frags[i / parts];
    const size_t k = i % parts;
    struct rpc_chunk h;
    memset(&h, 0, sizeof h);
    h.lease_id = lease_id;
    h.fragment_id = f->fragment_id;
    h.version = f->version;
    h.codec = DIPACO__V1__CODEC__CODEC_FP32;
    h.num_floats = f->num_floats;
    h.step = step;
    h.payload = payload[k];
    rc = rpc_stream_write_chunks(s, &h, (k == 0 ? m : k == 1 ? v : local)[i / parts],
                                 (size_t)f->num_floats * sizeof(float), c->max_chunk_bytes);
  }
  ProtobufCMessage *pm = NULL;
  int frc = rpc_stream_finish(s, &dipaco__v1__push_inner_state_response__descriptor, &pm);
  *code = rpc_last_code();
  rpc_stream_free(s);
  if (pm) protobuf_c_message_free_unpacked(pm, NULL);
  if (frc) return frc;
  if (rc) {
    *code = RPC_UNAVAILABLE;
    return rc;
  }
  return 0;
}

int wc_pull_inner(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, float *m, float *v, float *local,
                  int third, uint64_t *step, int *code) {
  const uint32_t payload[3] = {DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_M, DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_V,
                               (uint32_t)third};
  float *const dst[3] = {m, v, local};
  const int parts = local ? 3 : 2;
  Dipaco__V1__PullInnerStateRequest req = DIPACO__V1__PULL_INNER_STATE_REQUEST__INIT;
  size_t bytes = (size_t)f->num_floats * sizeof(float);
  req.lease_id = lease_id;
  req.fragment_id = f->fragment_id;
  req.max_chunk_bytes = c->max_chunk_bytes;
  struct rpc_stream *s = NULL;
  int rc = rpc_stream_open(c->rpc, SVC "PullInnerState", &req.base, transfer_timeout_ms((size_t)parts * bytes), &s);
  *code = rpc_last_code();
  if (rc) return rc;
  int part = 0; /* 0: m, 1: v, 2: local (streaming); parts: all complete */
  uint64_t next = 0;
  uint32_t crc = 0;
  for (;;) {
    struct grpc_byte_buffer *msg = NULL;
    rc = rpc_stream_read(s, &msg);
    if (rc <= 0) break;
    struct rpc_chunk h;
    const char *what = NULL;
    rc = rpc_chunk_parse(msg, &h);
    if (rc == 0) {
      if (part >= parts) what = "extra chunk after the last stream";
      else if (h.payload != payload[part]) what = "payload";
      else if (h.fragment_id != f->fragment_id || h.total != bytes || h.num_floats != f->num_floats) what = "fragment/size";
      else if (h.codec != DIPACO__V1__CODEC__CODEC_FP32) what = "codec";
      else if (h.offset != next || h.len > bytes - next) what = "offset";
      else if (part >= 1 && h.step != *step) what = "step (the streams disagree)";
      if (!what) rc = rpc_chunk_copy(msg, &h, (unsigned char *)dst[part] + next);
    }
    rpc_msg_free(msg);
    if (rc == 0 && what) rc = dpc_err(DPC_EFORMAT, "PullInnerState: fragment %" PRIu64 ": bad %s", f->fragment_id, what);
    if (rc) break;
    crc = dpc_crc32c(crc, (unsigned char *)dst[part] + next, h.len);
    next += h.len;
    *step = h.step;
    if (next == bytes) {
      if (h.crc32c != crc) {
        rc = dpc_err(DPC_ECHECKSUM, "PullInnerState: fragment %" PRIu64 ": CRC-32C mismatch", f->fragment_id);
        break;
      }
      part++;
      next = 0;
      crc = 0;
    }
  }
  *code = rpc_last_code(); /* rpc_stream_read returned 0: the stream ended with OK */
  rpc_stream_free(s);
  if (rc == 0 && part != parts) {
    *code = RPC_OK;
    rc = dpc_err(DPC_EFORMAT, "PullInnerState: fragment %" PRIu64 ": the stream ended early", f->fragment_id);
  }
  return rc;
}


/* A PullFragment or PullInnerState (method) asked with objects: the answer's PAYLOAD_BLOB_URLS
 * text into *text (NUL-ended, caller frees) and its Chunk.version into *version (may be NULL).
 * DPC_EUNSUPPORTED with *code RPC_OK when the coordinator answered with the bytes instead. */
static int blob_urls(wclient *c, const char *method, const ProtobufCMessage *req, uint64_t fragment_id, char **text,
                     uint64_t *version, int *code) {
  struct rpc_stream *s = NULL;
  int rc = rpc_stream_open(c->rpc, method, req, UNARY_TIMEOUT_MS, &s);
  *code = rpc_last_code();
  if (rc) return rc;
  char *t = NULL;
  uint64_t next = 0, total = 0;
  uint32_t crc = 0, want = 0;
  int ours = 0; /* the failure is in what came, not in the call */
  for (;;) {
    struct grpc_byte_buffer *msg = NULL;
    rc = rpc_stream_read(s, &msg);
    if (rc <= 0) break;
    ours = 1;
    struct rpc_chunk h;
    rc = rpc_chunk_parse(msg, &h);
    if (rc == 0 && h.payload != DIPACO__V1__PAYLOAD__PAYLOAD_BLOB_URLS)
      rc = dpc_err(DPC_EUNSUPPORTED, "%s: fragment %" PRIu64 ": answered with payload %u, not the blobs' URLs", method,
                   fragment_id, h.payload);
    else if (rc == 0 && (h.total >= BLOB_URLS_MAX || h.offset != next || h.len > h.total - next || (t && h.total != total)))
      rc = dpc_err(DPC_EFORMAT, "%s: fragment %" PRIu64 ": a malformed answer of URLs", method, fragment_id);
    if (rc == 0 && !t && !(t = calloc(1, (size_t)h.total + 1))) rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
    if (rc == 0) rc = rpc_chunk_copy(msg, &h, t + next);
    rpc_msg_free(msg);
    if (rc) break;
    total = h.total;
    crc = dpc_crc32c(crc, t + next, h.len);
    next += h.len;
    want = h.crc32c;
    if (version) *version = h.version;
    ours = 0;
  }
  *code = ours ? RPC_OK : rpc_last_code(); /* rpc_stream_read returned 0: the stream ended with OK */
  rpc_stream_free(s);
  if (rc == 0 && (!t || next != total || crc != want))
    rc = dpc_err(DPC_EFORMAT, "%s: fragment %" PRIu64 ": the URLs' answer is incomplete", method, fragment_id);
  if (rc) free(t);
  else *text = t;
  return rc;
}

/* PullInnerState with objects: the URLs of fragment f's inner-state blobs. */
static int inner_object_urls(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, char **text,
                             int *code) {
  Dipaco__V1__PullInnerStateRequest req = DIPACO__V1__PULL_INNER_STATE_REQUEST__INIT;
  req.lease_id = lease_id;
  req.fragment_id = f->fragment_id;
  req.max_chunk_bytes = c->max_chunk_bytes;
  req.objects = 1;
  return blob_urls(c, SVC "PullInnerState", &req.base, f->fragment_id, text, NULL, code);
}

/* PullFragment with objects: version f->version's parameters or momentum read from the store
 * and checked (the blob's own checksums, and the lease's CRC-32C where it names one). */
static int pull_from_store(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, int payload, float *dst,
                           int *code) {
  Dipaco__V1__PullFragmentRequest req = DIPACO__V1__PULL_FRAGMENT_REQUEST__INIT;
  req.lease_id = lease_id;
  req.fragment_id = f->fragment_id;
  req.version = f->version;
  req.codec = DIPACO__V1__CODEC__CODEC_FP32;
  req.max_chunk_bytes = c->max_chunk_bytes;
  req.payload = (Dipaco__V1__Payload)payload;
  req.objects = 1;
  char *text = NULL, what[128];
  uint64_t version = 0;
  int rc = blob_urls(c, SVC "PullFragment", &req.base, f->fragment_id, &text, &version, code);
  if (rc) return rc;
  char *nl = strchr(text, '\n');
  if (nl) *nl = 0;
  snprintf(what, sizeof what, "fragment %" PRIu64 " version %" PRIu64 "'s %s", f->fragment_id, f->version,
           payload == DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM ? "momentum" : "parameters");
  if (!nl || version != f->version)
    rc = dpc_err(DPC_EFORMAT, "PullFragment: %s: an answer of URLs for version %" PRIu64, what, version);
  else
    rc = storeget_blob(text, what,
                       payload == DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM ? STORE_KIND_MOMENTUM : STORE_KIND_PARAMS,
                       f->num_floats, dst, f->num_floats, NULL, 60000 /* a stall limit, as for the lease's pull */);
  free(text);
  if (rc == 0 && f->crc32c && dpc_crc32c(0, dst, (size_t)f->num_floats * sizeof(float)) != f->crc32c)
    rc = dpc_err(DPC_ECHECKSUM, "%s: the store's copy disagrees with the lease's CRC-32C", what);
  if (rc == 0)
    DPC_INFO("lease %" PRIu64 ": %s read from the object store", lease_id, what);
  return rc;
}

int wc_pull_inner_objects(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, float *m, float *v,
                          float *local, int third, uint64_t *step, int *code) {
  char *text = NULL;
  int rc = inner_object_urls(c, lease_id, f, &text, code);
  if (rc) return rc;
  float *const dst[3] = {m, v, local};
  const uint32_t kinds[3] = {
      STORE_KIND_INNER_M, STORE_KIND_INNER_V,
      third == DIPACO__V1__PAYLOAD__PAYLOAD_LOCAL_PARAMS ? STORE_KIND_INNER_L : STORE_KIND_INNER_E};
  const int parts = local ? 3 : 2;
  const uint64_t n = f->num_floats;
  unsigned char stepb[8] = {0};
  char *line = text, what[96];
  *code = RPC_OK;
  for (int k = 0; k < parts && rc == 0; k++) {
    char *nl = strchr(line, '\n');
    if (!nl) {
      rc = dpc_err(DPC_EFORMAT, "PullInnerState: fragment %" PRIu64 ": %d object URL(s), expected %d", f->fragment_id,
                   k, parts);
      break;
    }
    *nl = 0;
    snprintf(what, sizeof what, "inner state object %d of fragment %" PRIu64, k + 1, f->fragment_id);
    /* M holds the AdamW step in two more floats' bit patterns (svc_inner.c) */
    rc = storeget_blob(line, what, kinds[k], k == 0 ? n + 2 : n, dst[k], n, k == 0 ? stepb : NULL,
                       60000 /* a stall limit, as for the parameters */);
    line = nl + 1;
  }
  free(text);
  if (rc == 0) {
    *step = 0;
    for (int i = 7; i >= 0; i--) *step = *step << 8 | stepb[i];
  }
  return rc;
}
