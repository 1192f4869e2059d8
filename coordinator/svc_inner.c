/* svc_inner.c — PushInnerState / PullInnerState, the inner_state = checkpoint part of the
 * dipaco.v1.Coordinator service: a slot's AdamW state (m, v, step) per fragment as durable
 * blobs, so that any worker taking the slot resumes it exactly. Handlers run on the
 * coordinator's loop thread with ud = the coord.
 *
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
 *  - Streaming DiLoCo: a slot's local parameters are part of its state (they differ from the
 *    global ones): a third stream per fragment, PAYLOAD_LOCAL_PARAMS, stored as BLOB_INNER_L,
 *    pushed after V and pulled after V; has_inner_checkpoint needs all three.
 *  - SparseLoCo: likewise a slot's error-feedback buffer, PAYLOAD_EF_BUFFER, as BLOB_INNER_E.
 *  - On an S3 store (Lease.inner_put) a stream may instead be one PAYLOAD_INNER_OBJECT chunk:
 *    the worker put the blob itself in an object PrepareDeltaPut named (svc_put.c); the store
 *    copies it to the slot's name once its size and ETag check out (ipush_obj_work), so a
 *    zombie's late PUT (to its own stamped name) never replaces a committed checkpoint. */
#include "coordinator/svc_inner.h"

#include "common/checksum.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "coordinator/jobs.h"
#include "coordinator/loop.h"
#include "coordinator/rounds.h"
#include "coordinator/svc.h"
#include "coordinator/svc_put.h"
#include "proto/dipaco.pb-c.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- inner state (inner.state checkpoint) ---------------------------------------------------------- */

/* The blobs of a slot's inner state: M and V, with streaming L (its local parameters), with
 * SparseLoCo E (its error-feedback buffer). */
static int inner_kinds(const coord_job *j) { return jobspec_streaming(&j->spec) || j->spec.sparse.enabled ? 3 : 2; }

static blob_kind inner_kind(const coord_job *j, int k) {
  return k == 0 ? BLOB_INNER_M : k == 1 ? BLOB_INNER_V : j->spec.sparse.enabled ? BLOB_INNER_E : BLOB_INNER_L;
}

/* The payload of the third stream: PAYLOAD_LOCAL_PARAMS or PAYLOAD_EF_BUFFER. */
static uint32_t third_payload(const coord_job *j) {
  return j->spec.sparse.enabled ? DIPACO__V1__PAYLOAD__PAYLOAD_EF_BUFFER : DIPACO__V1__PAYLOAD__PAYLOAD_LOCAL_PARAMS;
}

static uint32_t inner_payload(const coord_job *j, int k) {
  return k == 0 ? DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_M : k == 1 ? DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_V : third_payload(j);
}

static int64_t slot_id(const coord_job *j, int path, int replica) {
  return (int64_t)path * j->spec.replicas + replica + 1;
}

static int inner_blob_name(const store_lease *l, const coord_job *j, int frag, int64_t round, blob_kind kind, char *buf) {
  blob_id id = {.job = l->job, .fragment = frag, .version = round, .aux = slot_id(j, l->path, l->replica), .kind = kind};
  return blob_name(&id, buf, BLOB_NAME_MAX);
}

int svc_inner_ckpt_exists(coord *c, const coord_job *j, const store_lease *l, const int *fids, int nf) {
  for (int i = 0; i < nf; i++)
    for (int k = 0; k < inner_kinds(j); k++) {
      char name[BLOB_NAME_MAX];
      if (inner_blob_name(l, j, fids[i], l->round - 1, inner_kind(j, k), name) < 0 || !blob_exists(c->bs, name))
        return 0;
    }
  return nf > 0;
}

/* Check an active lease of `worker` for inner-state calls; finishes the call and returns -1 if not. */
static int inner_lease(struct rpc_call *call, coord *c, int64_t worker, uint64_t lease_id, store_lease *l, coord_job **j) {
  if (lease_id == 0 || lease_id > INT64_MAX || store_get_lease(c->st, (int64_t)lease_id, l) < 0) {
    rpc_call_finish(call, RPC_NOT_FOUND, "lease_id %llu: no such lease", (unsigned long long)lease_id);
  } else if (l->worker != worker) {
    rpc_call_finish(call, RPC_PERMISSION_DENIED, "lease %lld belongs to another worker", (long long)l->id);
  } else if (l->state != LEASE_ACTIVE) {
    rpc_call_finish(call, RPC_ABORTED, "lease %lld is no longer active; ask for a new lease", (long long)l->id);
  } else if (!(*j = coord_job_get(c, l->job))) {
    rpc_call_finish(call, RPC_NOT_FOUND, "job %lld is not loaded", (long long)l->job);
  } else if ((*j)->spec.inner.state != INNER_STATE_CHECKPOINT) {
    rpc_call_finish(call, RPC_FAILED_PRECONDITION, "job %lld: inner.state is not \"checkpoint\"", (long long)l->job);
  } else {
    return 0;
  }
  return -1;
}

typedef struct ipush {
  coord *c;
  struct rpc_call *call; /* NULL once the call is over */
  int64_t worker;
  int finished, have_lease, in_part, frag, busy;
  uv_work_t req;
  int work_rc;
  blob_kind work_kind;
  size_t work_n;
  char work_name[BLOB_NAME_MAX], err[512];
  store_lease lease;
  coord_job *job;
  uint32_t payload, crc;
  uint64_t total, next, step, bytes;
  unsigned char *buf; /* total + 8 bytes (the M blob's step) */
  /* A PAYLOAD_INNER_OBJECT commit: the object the worker put (the prepared entry's copy,
   * part_md5 owned), checked and copied to work_name on the thread pool. */
  int is_obj;
  put_prep obj;
} ipush;

static void ipush_fail(struct rpc_call *call, ipush *p, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void ipush_fail(struct rpc_call *call, ipush *p, int code, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (p->finished || !call) return;
  p->finished = 1;
  DPC_WARN("PushInnerState from worker %lld rejected: %s", (long long)p->worker, msg);
  rpc_call_finish(call, code, "%s", msg);
}

static void ipush_on_call(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  coord *c = ud;
  int64_t worker;
  ipush *p = svc_stream_begin(c, call, sizeof *p, &worker);
  if (!p) return;
  p->c = c;
  p->call = call;
  p->worker = worker;
  p->req.data = p;
  rpc_call_set_data(call, p);
}

static void ipush_free(ipush *p) {
  free(p->buf);
  free(p->obj.part_md5);
  free(p);
}

/* Thread pool: the object a worker put (its upload completed first when it came in parts) is
 * checked (HEAD: its size and the ETag its prepared MD5s give), then the store copies it to the
 * slot's inner-state name, only while it still has that ETag, and the put object is deleted.
 * The coordinator receives none of its bytes; a reader checks the blob's checksums. */
static int ipush_obj_work(ipush *p) {
  blob_store *bs = p->c->bs;
  const put_prep *e = &p->obj;
  char etag[80];
  int rc = blob_store_settle_put(bs, e->name, e->bytes, e->md5, e->upload_id, e->parts,
                                 (const unsigned char(*)[16])e->part_md5, etag);
  if (!rc)
    rc = blob_store_copy(bs, e->name, p->work_name, etag, e->bytes, e->part_bytes, e->parts,
                         (const unsigned char(*)[16])e->part_md5);
  if (!rc && blob_delete(bs, e->name) < 0) blob_store_delete_later(bs, e->name);
  return rc;
}

static void ipush_work(uv_work_t *req) {
  ipush *p = req->data;
  p->work_rc = p->is_obj ? ipush_obj_work(p)
                         : blob_write(p->c->bs, p->work_name, p->work_kind, (const float *)p->buf, p->work_n, NULL);
  if (p->work_rc < 0) snprintf(p->err, sizeof p->err, "%s", dpc_errmsg());
}

static void ipush_after(uv_work_t *req, int status) {
  ipush *p = req->data;
  coord *c = p->c;
  p->busy = 0;
  if (p->is_obj) { /* its entry goes either way: committed, or its object and upload dropped */
    const put_prep *e = put_prepared(c, p->lease.id, p->frag, p->work_kind);
    if (e && e->attempt == p->obj.attempt) {
      if (status == 0 && p->work_rc == 0) put_forget(c, p->lease.id, p->frag, p->work_kind);
      else put_discard(c, p->lease.id, p->frag, p->work_kind);
    }
    free(p->obj.part_md5);
    p->obj.part_md5 = NULL;
  }
  if (status != 0 || p->work_rc < 0) {
    /* A put object the store could not check or copy: the worker pushes the bytes instead
     * (unless the store is down: UNAVAILABLE, and the worker tries again later). */
    ipush_fail(p->call, p, status ? RPC_UNAVAILABLE : p->is_obj && p->work_rc != DPC_EUNAVAILABLE ? RPC_FAILED_PRECONDITION
                                                                                                   : rpc_code_from_dpc(p->work_rc),
               "could not store the inner state durably: %s%s", status ? "canceled" : p->err,
               p->is_obj ? " (push its bytes)" : "");
  } else {
    char name[BLOB_NAME_MAX];
    if (p->lease.round >= 2 &&
        inner_blob_name(&p->lease, p->job, p->frag, p->lease.round - 2, p->work_kind, name) == 0)
      rounds_discard(c, name, NULL); /* best effort: the state of round − 2 is no longer needed */
    DPC_DEBUG("lease %lld: inner state %s of fragment %d round %lld stored%s (step %llu)", (long long)p->lease.id,
              p->work_kind == BLOB_INNER_M   ? "m"
              : p->work_kind == BLOB_INNER_V ? "v"
              : p->work_kind == BLOB_INNER_E ? "error feedback"
                                             : "local parameters", p->frag + 1, (long long)p->lease.round,
              p->is_obj ? " from the worker's put" : "", (unsigned long long)p->step);
  }
  if (!p->call) ipush_free(p);
  else if (!p->finished) rpc_call_read(p->call);
  loop_work_done(c);
}

/* Name the slot's blob of p->work_kind for the lease's round and queue ipush_work, which writes
 * the stream's bytes or checks and copies the worker's object there: 1 while it runs (reading
 * pauses), 0 with the call failed. */
static int ipush_queue(struct rpc_call *call, ipush *p) {
  if (inner_blob_name(&p->lease, p->job, p->frag, p->lease.round, p->work_kind, p->work_name) < 0) {
    ipush_fail(call, p, RPC_INTERNAL, "inner state blob name: %s", dpc_errmsg());
    return 0;
  }
  p->busy = 1;
  if (loop_queue_work(p->c, &p->req, ipush_work, ipush_after) < 0) {
    p->busy = 0;
    ipush_fail(call, p, RPC_UNAVAILABLE, "cannot queue the inner state's store now; push again later");
    return 0;
  }
  return 1;
}

/* A whole M or V stream of one fragment arrived: write it durably. */
static int ipush_commit(struct rpc_call *call, ipush *p) {
  p->work_kind = p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_M   ? BLOB_INNER_M
                : p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_V ? BLOB_INNER_V
                                                                    : inner_kind(p->job, 2);
  p->work_n = (size_t)(p->total / 4);
  if (p->work_kind == BLOB_INNER_M) { /* the step rides along as two floats' bit patterns */
    uint32_t lo = (uint32_t)p->step, hi = (uint32_t)(p->step >> 32);
    memcpy(p->buf + p->total, &lo, 4);
    memcpy(p->buf + p->total + 4, &hi, 4);
    p->work_n += 2;
  }
  return ipush_queue(call, p);
}

/* A stream's first chunk: its lease (once per call: the caller's, active) and fragment (of the
 * lease) into p. 0, or -1 with the call failed. */
static int ipush_frag(struct rpc_call *call, ipush *p, const struct rpc_chunk *ch) {
  coord *c = p->c;
  if (p->have_lease && (uint64_t)p->lease.id != ch->lease_id) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "lease_id: one PushInnerState stream carries one lease");
    return -1;
  }
  if (!p->have_lease) {
    if (inner_lease(call, c, p->worker, ch->lease_id, &p->lease, &p->job) < 0) {
      p->finished = 1;
      return -1;
    }
    p->have_lease = 1;
  }
  int64_t base;
  int frag = (int)(ch->fragment_id - 1);
  if (ch->fragment_id == 0 || ch->fragment_id > (uint64_t)p->job->n_fragments ||
      store_lease_base_version(c->st, p->lease.id, frag, &base) < 0) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "fragment_id %llu is not a fragment of lease %lld",
               (unsigned long long)ch->fragment_id, (long long)p->lease.id);
    return -1;
  }
  p->frag = frag;
  return 0;
}

/* PAYLOAD_INNER_OBJECT: the worker put one of the fragment's blobs in the store (svc_put.c
 * named it); the prepared entry with the chunk's attempt must agree with the chunk, and the
 * thread pool checks the object and copies it to the slot's name (ipush_obj_work). Returns
 * on_message's value. */
static int ipush_object(struct rpc_call *call, ipush *p, const struct rpc_chunk *ch) {
  coord *c = p->c;
  if (ipush_frag(call, p, ch) < 0) return 0;
  const put_prep *e = NULL;
  for (int i = 0; i < c->n_puts && !e; i++)
    if (c->puts[i].lease == p->lease.id && c->puts[i].frag == p->frag && c->puts[i].kind != BLOB_DELTA &&
        (uint64_t)c->puts[i].attempt == ch->step)
      e = &c->puts[i];
  if (!e && ch->step > 0 && ch->step < (uint64_t)c->started_ms * 1000 && ch->step <= INT64_MAX) {
    /* Named by an earlier run of this coordinator (push_seq starts at start-ms·1000): the worker
     * pushes the bytes instead, and the object it put goes now rather than at the next start. */
    for (int k = 0; k < inner_kinds(p->job); k++) {
      blob_id id = {.job = p->lease.job, .fragment = p->frag, .version = p->lease.round,
                    .aux = slot_id(p->job, p->lease.path, p->lease.replica), .attempt = (int64_t)ch->step,
                    .kind = inner_kind(p->job, k)};
      char name[BLOB_NAME_MAX];
      if (blob_name(&id, name, sizeof name) == 0) rounds_discard(c, name, NULL);
    }
  }
  if (!e) {
    ipush_fail(call, p, RPC_FAILED_PRECONDITION, "lease %lld fragment %d: no inner-state object was prepared with "
               "attempt %llu (PrepareDeltaPut; a restarted coordinator forgets them): push its bytes",
               (long long)p->lease.id, p->frag + 1, (unsigned long long)ch->step);
    return 0;
  }
  uint64_t n = (e->bytes - BLOB_HEADER_BYTES - BLOB_TRAILER_BYTES) / 4;
  if (ch->num_floats != n || ch->total != 4 * n || ch->crc32c != e->crc || ch->len != 0) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "fragment %d's inner-state object was prepared with %llu floats and "
               "CRC-32C 0x%08x; the commit says %llu floats (total %llu) and 0x%08x%s", p->frag + 1,
               (unsigned long long)n, e->crc, (unsigned long long)ch->num_floats, (unsigned long long)ch->total,
               ch->crc32c, ch->len ? ", with data" : "");
    return 0;
  }
  p->obj = *e;
  p->obj.part_md5 = NULL;
  if (e->parts && !(p->obj.part_md5 = malloc((size_t)e->parts * sizeof *e->part_md5))) {
    ipush_fail(call, p, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return 0;
  }
  if (e->parts) memcpy(p->obj.part_md5, e->part_md5, (size_t)e->parts * sizeof *e->part_md5);
  p->is_obj = 1;
  p->work_kind = e->kind;
  p->step = 0;
  return ipush_queue(call, p);
}

/* The first chunk of an M or V stream: the lease (once per call), the fragment and the header;
 * sizes the buffer. 0, or -1 with the call failed. */
static int ipush_begin(struct rpc_call *call, ipush *p, const struct rpc_chunk *ch) {
  if (ch->offset != 0) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "offset: a stream starts at 0, got %llu", (unsigned long long)ch->offset);
    return -1;
  }
  if (ipush_frag(call, p, ch) < 0) return -1;
  const int frag = p->frag;
  size_t len = p->job->fragments[frag].len;
  if (ch->payload != DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_M && ch->payload != DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_V &&
      !(ch->payload == third_payload(p->job) && inner_kinds(p->job) == 3)) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "payload: must be PAYLOAD_ADAM_M or PAYLOAD_ADAM_V%s, got %u",
               inner_kinds(p->job) < 3                ? ""
               : p->job->spec.sparse.enabled          ? " or PAYLOAD_EF_BUFFER"
                                                      : " or PAYLOAD_LOCAL_PARAMS", ch->payload);
    return -1;
  }
  if (dpc_codec_check((int)ch->codec, DPC_CODEC_BIT(DPC_CODEC_FP32), ch->num_floats, ch->total, ch->block_floats,
                      len) < 0) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "fragment %llu: %s", (unsigned long long)ch->fragment_id, dpc_errmsg());
    return -1;
  }
  if (ch->step > (uint64_t)1 << 40) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "step %llu is out of range", (unsigned long long)ch->step);
    return -1;
  }
  unsigned char *b = realloc(p->buf, (size_t)ch->total + 8);
  if (!b) {
    ipush_fail(call, p, RPC_RESOURCE_EXHAUSTED, "out of memory for %llu bytes", (unsigned long long)ch->total);
    return -1;
  }
  p->buf = b;
  p->is_obj = 0;
  p->payload = ch->payload;
  p->total = ch->total;
  p->step = ch->step;
  p->next = 0;
  p->crc = 0;
  p->in_part = 1;
  return 0;
}

/* A whole M or V stream arrived: its CRC and values, then the durable write (returns
 * on_message's value). */
static int ipush_finish(struct rpc_call *call, ipush *p, const struct rpc_chunk *ch) {
  if (ch->crc32c != p->crc) {
    ipush_fail(call, p, RPC_DATA_LOSS, "crc32c: the stream has CRC-32C 0x%08x, the last chunk says 0x%08x; push again",
               p->crc, ch->crc32c);
    return 0;
  }
  for (uint64_t k = 0; k < p->total / 4; k++) {
    float f;
    memcpy(&f, p->buf + 4 * k, 4);
    if (!isfinite(f) || (p->payload == DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_V && f < 0)) {
      ipush_fail(call, p, RPC_INVALID_ARGUMENT, "data: inner state of fragment %d has a bad value at float %llu",
                 p->frag + 1, (unsigned long long)k);
      return 0;
    }
  }
  return ipush_commit(call, p);
}

static int ipush_on_message(struct rpc_call *call, const struct grpc_byte_buffer *msg, void *ud) {
  (void)ud;
  ipush *p = rpc_call_data(call);
  if (!p || p->finished) return 0;
  coord *c = p->c;
  if (!msg) {
    if (p->in_part || !p->have_lease) {
      ipush_fail(call, p, RPC_INVALID_ARGUMENT, "PushInnerState stream ended %s",
                 p->in_part ? "inside a fragment's stream" : "without any chunk");
    } else {
      Dipaco__V1__PushInnerStateResponse resp = DIPACO__V1__PUSH_INNER_STATE_RESPONSE__INIT;
      resp.bytes = p->bytes;
      p->finished = 1;
      rpc_call_reply(call, &resp.base);
    }
    return 0;
  }
  if (c->stopping) {
    ipush_fail(call, p, RPC_UNAVAILABLE, "coordinator is shutting down; push again after it is back");
    return 0;
  }
  struct rpc_chunk ch;
  if (rpc_chunk_parse(msg, &ch) < 0) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "malformed chunk: %s", dpc_errmsg());
    return 0;
  }
  if (!p->in_part && ch.payload == DIPACO__V1__PAYLOAD__PAYLOAD_INNER_OBJECT) {
    return ipush_object(call, p, &ch);
  } else if (!p->in_part) {
    if (ipush_begin(call, p, &ch) < 0) return 0;
  } else if (ch.lease_id != (uint64_t)p->lease.id || ch.fragment_id != (uint64_t)p->frag + 1 || ch.total != p->total ||
             ch.payload != p->payload || ch.step != p->step) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "lease_id/fragment_id/total/payload/step changed inside a stream");
    return 0;
  } else if (ch.offset != p->next) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "offset: expected %llu (contiguous chunks), got %llu",
               (unsigned long long)p->next, (unsigned long long)ch.offset);
    return 0;
  }
  if (ch.len > p->total - p->next || ch.len > MAX_CHUNK_ACCEPT) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "chunk of %llu bytes runs past the stream's end or the chunk limit",
               (unsigned long long)ch.len);
    return 0;
  }
  if (rpc_chunk_copy(msg, &ch, p->buf + p->next) < 0) {
    ipush_fail(call, p, RPC_INVALID_ARGUMENT, "cannot read a chunk: %s", dpc_errmsg());
    return 0;
  }
  p->crc = dpc_crc32c(p->crc, p->buf + p->next, ch.len);
  p->next += ch.len;
  p->bytes += ch.len;
  c->bytes_in += ch.len;
  if (p->next < p->total) return 0;
  p->in_part = 0;
  return ipush_finish(call, p, &ch);
}

static void ipush_on_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  ipush *p = rpc_call_data(call);
  if (!p) return;
  p->call = NULL;
  rpc_call_set_data(call, NULL);
  if (!p->busy) ipush_free(p);
}

/* A PullInnerState whose blobs are being read on the thread pool: what its stream needs. */
typedef struct {
  int64_t lease, round;
  int frag, nk;
  uint64_t fragment_id;
  size_t n;
  uint32_t payload[3], max_chunk;
} ipull_ctx;

/* The M and V (and with streaming L) blobs of the round before the lease's are read: stream
 * them (M carries n + 2 floats, the last two the AdamW step's bit pattern; V and L n). */
static void ipull_ready(coord *c, struct rpc_call *call, svc_read *r) {
  ipull_ctx *x = r->ud;
  const size_t n = x->n;
  int rc = r->rc;
  if (rc == 0 && (r->got[0] != n + 2 || r->got[1] != n || (x->nk == 3 && r->got[2] != n)))
    rc = dpc_err(DPC_EFORMAT, "inner state blobs of fragment %d hold %zu/%zu/%zu floats, expected %zu+2/%zu/%zu",
                 x->frag + 1, r->got[0], r->got[1], r->got[2], n, n, n);
  out_stream *os = call && rc == 0 ? calloc(1, sizeof *os) : NULL;
  if (call && rc == 0 && !os) rc = dpc_err(DPC_ENOMEM, "out of memory for a stream");
  if (!call) {
    /* the call ended meanwhile */
  } else if (rc < 0) {
    rpc_call_finish(call, rc == DPC_ENOENT ? RPC_NOT_FOUND : rpc_code_from_dpc(rc),
                    "no inner state checkpoint of round %lld for lease %lld fragment %d: %s", (long long)x->round - 1,
                    (long long)x->lease, x->frag + 1, dpc_errmsg());
  } else {
    uint32_t lo, hi;
    memcpy(&lo, &r->b->data[0][n], 4);
    memcpy(&hi, &r->b->data[0][n + 1], 4);
    uint64_t step = (uint64_t)lo | (uint64_t)hi << 32;
    os->c = c;
    os->nparts = x->nk;
    for (int k = 0; k < os->nparts; k++)
      os->part[k] = (out_part){.data = (const uint8_t *)r->b->data[k], .total = (uint64_t)n * 4,
                               .crc = dpc_crc32c(0, r->b->data[k], n * 4), .payload = x->payload[k],
                               .fragment_id = x->fragment_id, .version = (uint64_t)x->round - 1, .num_floats = n,
                               .step = step};
    os->lease_id = (uint64_t)x->lease;
    os->chunk = svc_chunk_size(x->max_chunk);
    os->ref = svc_bufs_ref;
    os->unref = svc_bufs_unref;
    os->ud = r->b;
    svc_bufs_ref(r->b); /* the stream's reference */
    DPC_INFO("lease %lld pulls the inner state of fragment %d from round %lld (step %llu)", (long long)x->lease,
             x->frag + 1, (long long)x->round - 1, (unsigned long long)step);
    svc_stream_start(call, os);
  }
  free(x);
}

/* PullInnerState with objects on an S3 store: the blobs' presigned GET URLs (svc_answer_urls)
 * instead of their bytes; the worker reads and checks them itself. Whether they exist is
 * answered as for the lease's grant (blobs_known: no request). */
static void ipull_objects(struct rpc_call *call, coord *c, const store_lease *l, const coord_job *j, int frag,
                          const Dipaco__V1__PullInnerStateRequest *r) {
  const int nk = inner_kinds(j);
  const uint64_t n = j->fragments[frag].len;
  char name[3][BLOB_NAME_MAX];
  const char *names[3] = {name[0], name[1], name[2]};
  int rc = 0;
  for (int k = 0; k < nk && rc == 0; k++)
    if ((rc = inner_blob_name(l, j, frag, l->round - 1, inner_kind(j, k), name[k])) == 0 && !blob_exists(c->bs, name[k]))
      rc = dpc_err(DPC_ENOENT, "%s is not in the store", name[k]);
  if (rc < 0) {
    rpc_call_finish(call, rc == DPC_ENOENT ? RPC_NOT_FOUND : rpc_code_from_dpc(rc),
                    "no inner state checkpoint of round %lld for lease %lld fragment %d: %s", (long long)l->round - 1,
                    (long long)l->id, frag + 1, dpc_errmsg());
    return;
  }
  DPC_INFO("lease %lld reads the inner state of fragment %d from round %lld in the store", (long long)l->id, frag + 1,
           (long long)l->round - 1);
  const out_part meta = {.fragment_id = r->fragment_id, .version = (uint64_t)l->round - 1, .num_floats = n};
  svc_answer_urls(call, c, &meta, (uint64_t)l->id, r->max_chunk_bytes, names, nk,
                  (uint64_t)nk * (BLOB_HEADER_BYTES + 4 * n + BLOB_TRAILER_BYTES) + 8);
}

static void on_ipull(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  int64_t worker;
  if (svc_authenticate(c, call, &worker, 0) < 0) return;
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__pull_inner_state_request__descriptor, &pm)) return;
  Dipaco__V1__PullInnerStateRequest *r = (Dipaco__V1__PullInnerStateRequest *)pm;
  svc_touch(c, worker, -1);
  store_lease l;
  coord_job *j = NULL;
  int64_t base;
  int frag = (int)(r->fragment_id - 1);
  if (inner_lease(call, c, worker, r->lease_id, &l, &j) < 0) {
  } else if (r->fragment_id == 0 || r->fragment_id > (uint64_t)j->n_fragments ||
             store_lease_base_version(c->st, l.id, frag, &base) < 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "fragment_id %llu is not a fragment of lease %lld (0 is not served: "
                    "pull each fragment)", (unsigned long long)r->fragment_id, (long long)l.id);
  } else if (r->offset != 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "offset: resume is not served for inner state; pull from 0");
  } else if (l.round < 1) {
    rpc_call_finish(call, RPC_NOT_FOUND, "lease %lld trains round 0: there is no earlier inner state", (long long)l.id);
  } else if (r->objects && blob_store_is_s3(c->bs)) {
    ipull_objects(call, c, &l, j, frag, r);
  } else {
    svc_read *rd = svc_read_new();
    ipull_ctx *x = rd ? calloc(1, sizeof *x) : NULL;
    int rc = x ? 0 : dpc_err(DPC_ENOMEM, "out of memory");
    if (x) {
      *x = (ipull_ctx){.lease = l.id, .round = l.round, .frag = frag, .nk = inner_kinds(j),
                       .fragment_id = r->fragment_id, .n = j->fragments[frag].len, .max_chunk = r->max_chunk_bytes};
      rd->n = x->nk;
      rd->ready = ipull_ready;
      rd->ud = x;
      for (int k = 0; k < x->nk && rc == 0; k++) {
        x->payload[k] = inner_payload(j, k);
        rd->kind[k] = inner_kind(j, k);
        rc = inner_blob_name(&l, j, frag, l.round - 1, rd->kind[k], rd->name[k]);
      }
    }
    if (rc == 0) rc = svc_read_start(c, call, rd);
    if (rc < 0) {
      rpc_call_fail(call, rc);
      free(x);
      svc_read_free(rd);
    }
  }
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* PullInnerState's end: a read still under way forgets the call. */
static void ipull_on_done(struct rpc_call *call, int cancelled, void *ud) {
  if (svc_hold_forget(ud, call)) return;
  svc_stream_on_done(call, cancelled, ud);
}

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Coordinator/PushInnerState", .kind = RPC_CLIENT_STREAM, .on_call = ipush_on_call,
     .on_message = ipush_on_message, .on_done = ipush_on_done},
    {.path = "/dipaco.v1.Coordinator/PullInnerState", .kind = RPC_SERVER_STREAM, .on_call = on_ipull,
     .on_sent = svc_stream_on_sent, .on_done = ipull_on_done},
};

int svc_inner_methods(coord *c, struct rpc_method *out) {
  return svc_methods_add(out, methods, (int)(sizeof methods / sizeof methods[0]), c);
}
