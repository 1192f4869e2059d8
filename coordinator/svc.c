/* svc.c — what the RPC handlers of both services share: the worker session check, request
 * unpacking, the liveness touch, the Admin token check, FragmentInfo, the zero-copy
 * server-streaming chunk sender (PullFragment, PullInnerState, ExportPath), and calls answered
 * after work on the thread pool (svc_hold; svc_read, blobs read there for a stream).
 *
 * Wire ids. fragment_id and module_id on the wire are the job spec's 0-based fragment /
 * module ids + 1 (0 means "none" in the proto). Slot.path / Slot.replica are 0-based.
 * FragmentInfo.offset_floats is the fragment's offset in the canonical flat layout of the
 * whole model (kernels/gpt.h), which is also the path's flat buffer (a path's modules tile
 * the layout), as proto/dipaco.proto says; num_floats its length. Plain DiLoCo: one
 * fragment, offset 0, all params.
 *
 * Admin authentication: every Admin call needs metadata "authorization: Bearer <admin token>"
 * (STATE/admin.token unless --admin-token-file; none with --insecure-no-auth). Missing or
 * unknown token → UNAUTHENTICATED; a valid credential without admin rights (the join token,
 * or a worker's id + session token) → PERMISSION_DENIED. */
#include "coordinator/svc.h"

#include "common/checksum.h"
#include "common/errors.h"
#include "common/log.h"
#include "coordinator/jobs.h"
#include "coordinator/loop.h"
#include "coordinator/rounds.h"
#include "coordinator/testhook.h"
#include "proto/dipaco.pb-c.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------------------------- */

int svc_token_hash(const char *tok, unsigned char out[DPC_TOKEN_HASH]) {
  unsigned int n = 0;
  if (!EVP_Digest(tok, strlen(tok), out, &n, EVP_sha256(), NULL) || n != DPC_TOKEN_HASH)
    return dpc_err(DPC_EINTERNAL, "SHA-256 failed");
  return 0;
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

int svc_authenticate(coord *c, struct rpc_call *call, int64_t *worker, int allow_unknown) {
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
  unsigned char h[DPC_TOKEN_HASH];
  svc_token_hash(tok, h);
  if (rc < 0 || !dpc_ct_equal(h, w.token_hash, sizeof h)) {
    rpc_call_finish(call, RPC_UNAUTHENTICATED, "unknown worker %llu or wrong session token; Register again",
                    (unsigned long long)id);
    return -1;
  }
  *worker = (int64_t)id;
  return 1;
}

int svc_unpack(struct rpc_call *call, const struct grpc_byte_buffer *req, const ProtobufCMessageDescriptor *d,
                  ProtobufCMessage **out) {
  int rc = rpc_msg_unpack(req, d, SVC_MAX_REQ_BYTES, out);
  if (rc < 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "malformed %s: %s", d->name, dpc_errmsg());
    return -1;
  }
  return 0;
}

void svc_touch(coord *c, int64_t worker, double sps) {
  store_worker w;
  if (store_get_worker(c->st, worker, &w) == 0 && w.state == WORKER_GONE) {
    store_set_worker_state(c->st, worker, WORKER_ACTIVE);
    DPC_INFO("worker %lld (%s) is back", (long long)worker, w.name);
  }
  store_touch_worker(c->st, worker, dpc_wall_ms(), sps);
}

void *svc_stream_begin(coord *c, struct rpc_call *call, size_t size, int64_t *worker) {
  if (svc_authenticate(c, call, worker, 0) < 0) return NULL;
  svc_touch(c, *worker, -1);
  void *p = calloc(1, size);
  if (!p) rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
  return p;
}

uint32_t svc_chunk_size(uint32_t req) {
  if (req == 0) return RPC_CHUNK_DEFAULT;
  if (req < RPC_CHUNK_MIN) return RPC_CHUNK_MIN;
  if (req > RPC_CHUNK_DEFAULT) return RPC_CHUNK_DEFAULT;
  return req;
}

void svc_fill_fragment_info(const coord_job *j, const store_fragment *f, int64_t version,
                            Dipaco__V1__FragmentInfo *fi) {
  dipaco__v1__fragment_info__init(fi);
  const jobspec_fragment *jf = &j->fragments[f->fragment];
  const jobspec_module *m = &j->modules[jf->module];
  fi->fragment_id = (uint64_t)f->fragment + 1;
  fi->module_id = (uint64_t)jf->module + 1;
  fi->level = (uint32_t)m->level;
  fi->index = (uint32_t)jf->group;
  fi->version = (uint64_t)version;
  fi->offset_floats = jf->offset;
  fi->num_floats = jf->len;
  /* A lease's base version may not exist yet (streaming: the round before is still open) or
   * be gone: then there is no checksum to name. */
  fi->crc32c = f->version == version ? f->param_crc : 0;
  if (jobspec_streaming(&j->spec)) {
    fi->sync_offset = (uint32_t)jobspec_streaming_offset(&j->spec, jf->group);
    fi->overlap_steps = (uint32_t)j->spec.streaming.overlap_steps;
    fi->merge_alpha = (float)j->spec.streaming.alpha;
  }
  fi->updated_unix_ms = (uint64_t)f->created_at;
}

Dipaco__V1__Algorithm svc_algorithm_wire(const jobspec *js) {
  if (js->algorithm != JOB_ALGO_DILOCO_ASYNC) return DIPACO__V1__ALGORITHM__ALGORITHM_SYNC;
  return js->outer.async_rule == OUTER_ASYNC_DN ? DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_DELAYED
                                                : DIPACO__V1__ALGORITHM__ALGORITHM_ASYNC_NESTEROV;
}

/* ---- server-streaming chunk sender -------------------------------------------------------------- */

static void stream_send_next(struct rpc_call *call, out_stream *os) {
  if (os->cur >= os->nparts) {
    if (os->lease_id) coord_observe(os->c, HIST_PULL, dpc_mono_s() - os->t0);
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
  if (os->lease_id && (p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS ||
                       p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_REPLAY_ROUND ||
                       p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_SPARSE_ROUND ||
                       p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM)) {
    /* dipaco_pulls_total / dipaco_pull_bytes_total by kind: whole fragments, replayed rounds, momenta */
    const int k = p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS           ? 0
                  : p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM ? 2
                                                                             : 1;
    os->c->pull_bytes[k] += len;
    if (last) os->c->pulls[k]++;
  }
  if (os->lease_id) {
    lease_note *n = coord_note(os->c, (int64_t)os->lease_id, 1);
    if (n) n->bytes_out += len;
    if (n) n->hb_at = dpc_wall_ms(); /* the previous chunk went out: the worker is reading (leases.c) */
    if (n && last) n->pull_done_s = dpc_mono_s();
    if (last && os->job && p->fragment_id > 0 &&
        (p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS || p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_REPLAY_ROUND))
      rounds_note_pull(os->c, os->job, (int)p->fragment_id - 1, (int64_t)p->version);
  }
  if (last) {
    os->cur++;
    os->next = 0;
  } else {
    os->next += len;
  }
  if (rpc_call_send(call, m) < 0) rpc_call_finish(call, RPC_INTERNAL, "send failed: %s", dpc_errmsg());
}

void svc_stream_start(struct rpc_call *call, out_stream *os) {
  rpc_call_set_data(call, os);
  os->t0 = dpc_mono_s();
  stream_send_next(call, os);
}

void svc_stream_on_sent(struct rpc_call *call, int ok, void *ud) {
  (void)ud;
  out_stream *os = rpc_call_data(call);
  if (ok && os) stream_send_next(call, os);
}

void svc_stream_on_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  out_stream *os = rpc_call_data(call);
  if (!os) return;
  os->unref(os->ud);
  free(os);
  rpc_call_set_data(call, NULL);
}
/* ---- Admin calls -------------------------------------------------------------------------------- */

/* 1 if the call carries a valid worker identity (dipaco-worker-id + dipaco-session). */
static int is_worker_session(coord *c, struct rpc_call *call) {
  char idbuf[32], tok[160];
  if (rpc_call_md(call, RPC_MD_WORKER_ID, idbuf, sizeof idbuf) < 0 ||
      rpc_call_md(call, RPC_MD_SESSION, tok, sizeof tok) < 0)
    return 0;
  char *end;
  long long id = strtoll(idbuf, &end, 10);
  store_worker w;
  if (*end || id <= 0 || store_get_worker(c->st, id, &w) < 0) return 0;
  unsigned char h[DPC_TOKEN_HASH];
  svc_token_hash(tok, h);
  return dpc_ct_equal(h, w.token_hash, sizeof h);
}

int svc_admin_authorize(coord *c, struct rpc_call *call) {
  const dpc_auth_keys *k = &c->keys;
  if (!k->has_admin) return 0;
  char v[DPC_TOKEN_MAX + 32];
  const char *tok = rpc_call_md(call, RPC_MD_AUTHORIZATION, v, sizeof v) >= 0 ? dpc_bearer_token(v) : NULL;
  if (tok) {
    unsigned char h[DPC_TOKEN_HASH];
    svc_token_hash(tok, h);
    if (dpc_ct_equal(h, k->admin, sizeof h)) return 0;
    if (k->has_join && dpc_ct_equal(h, k->join, sizeof h)) {
      rpc_call_finish(call, RPC_PERMISSION_DENIED, "%s: the join token does not allow Admin calls; use the admin token",
                      rpc_call_method(call));
      return -1;
    }
  }
  if (is_worker_session(c, call)) {
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

int svc_admin_unpack(coord *c, struct rpc_call *call, const struct grpc_byte_buffer *req,
                     const ProtobufCMessageDescriptor *d, ProtobufCMessage **out) {
  if (c->stopping) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
    return -1;
  }
  if (svc_admin_authorize(c, call)) return -1;
  int rc = rpc_msg_unpack(req, d, SVC_ADMIN_MAX_REQ_BYTES, out);
  if (rc < 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "malformed %s: %s", d->name, dpc_errmsg());
    return -1;
  }
  return 0;
}
coord_job *svc_job_or_fail(coord *c, struct rpc_call *call, uint64_t id) {
  coord_job *j = id <= INT64_MAX ? coord_job_get(c, (int64_t)id) : NULL;
  if (!j) rpc_call_finish(call, RPC_NOT_FOUND, "job_id %llu: no such job", (unsigned long long)id);
  return j;
}

void svc_hold_add(coord *c, svc_hold *h, struct rpc_call *call) {
  h->call = call;
  h->next = c->holds;
  c->holds = h;
}

void svc_hold_remove(coord *c, svc_hold *h) {
  for (svc_hold **p = &c->holds; *p; p = &(*p)->next)
    if (*p == h) {
      *p = h->next;
      return;
    }
}

int svc_hold_forget(coord *c, struct rpc_call *call) {
  for (svc_hold *h = c->holds; h; h = h->next)
    if (h->call == call) {
      h->call = NULL;
      return 1;
    }
  return 0;
}

void svc_bufs_ref(void *ud) { atomic_fetch_add(&((svc_bufs *)ud)->refs, 1); }

void svc_bufs_unref(void *ud) {
  svc_bufs *b = ud;
  if (!b || atomic_fetch_sub(&b->refs, 1) != 1) return;
  for (int k = 0; k < 3; k++) free(b->data[k]);
  free(b);
}

svc_read *svc_read_new(void) {
  svc_read *r = calloc(1, sizeof *r);
  if (r && !(r->b = calloc(1, sizeof *r->b))) {
    free(r);
    return NULL;
  }
  if (r) atomic_init(&r->b->refs, 1);
  return r;
}

void svc_read_free(svc_read *r) {
  if (!r) return;
  svc_bufs_unref(r->b);
  free(r);
}

static void read_run(uv_work_t *req) {
  svc_read *r = req->data;
  int ms = testhook_pool_delay_ms();
  if (ms > 0) uv_sleep((unsigned)ms);
  for (int k = 0; k < r->n && r->rc == 0; k++)
    r->rc = blob_read_alloc(r->c->bs, r->name[k], r->kind[k], &r->b->data[k], &r->got[k], NULL);
  if (r->rc < 0) snprintf(r->err, sizeof r->err, "%s", dpc_errmsg());
}

static void read_after(uv_work_t *req, int status) {
  svc_read *r = req->data;
  coord *c = r->c;
  svc_hold_remove(c, &r->hold);
  if (status && r->rc == 0) {
    r->rc = DPC_ECANCELED;
    snprintf(r->err, sizeof r->err, "canceled");
  }
  if (r->rc < 0) dpc_err(r->rc, "%s", r->err);
  r->ready(c, r->hold.call, r);
  svc_read_free(r);
  loop_work_done(c);
}

int svc_read_start(coord *c, struct rpc_call *call, svc_read *r) {
  r->c = c;
  r->req.data = r;
  if (loop_queue_work(c, &r->req, read_run, read_after) < 0) return dpc_err(DPC_EUNAVAILABLE, "cannot queue the read");
  svc_hold_add(c, &r->hold, call);
  return 0;
}

int svc_methods_add(struct rpc_method *out, const struct rpc_method *table, int n, coord *c) {
  for (int i = 0; i < n; i++) {
    out[i] = table[i];
    out[i].ud = c;
  }
  return n;
}

void svc_answer_urls(struct rpc_call *call, coord *c, const out_part *meta, uint64_t lease_id, uint32_t max_chunk,
                     const char *const *names, int k, uint64_t ttl_bytes) {
  svc_bufs *b = calloc(1, sizeof *b);
  char *text = b ? malloc((size_t)k * 4096 + 1) : NULL;
  out_stream *os = text ? calloc(1, sizeof *os) : NULL;
  int rc = os ? 0 : dpc_err(DPC_ENOMEM, "out of memory");
  size_t len = 0;
  for (int i = 0; i < k && rc == 0; i++)
    if ((rc = blob_store_url(c->bs, names[i], ttl_bytes, text + len, 4095)) == 0) {
      len += strlen(text + len);
      text[len++] = '\n';
    }
  if (rc < 0) {
    rpc_call_fail(call, rc);
    free(os);
    free(text);
    free(b);
    return;
  }
  atomic_init(&b->refs, 1);
  b->data[0] = (float *)(void *)text; /* the stream owns the text now */
  *os = (out_stream){.c = c, .nparts = 1, .lease_id = lease_id, .chunk = svc_chunk_size(max_chunk),
                     .ref = svc_bufs_ref, .unref = svc_bufs_unref, .ud = b};
  os->part[0] = *meta;
  os->part[0].data = (const uint8_t *)text;
  os->part[0].total = len;
  os->part[0].crc = dpc_crc32c(0, text, len);
  os->part[0].payload = DIPACO__V1__PAYLOAD__PAYLOAD_BLOB_URLS;
  svc_stream_start(call, os);
}
