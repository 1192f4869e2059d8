/* svc_push.c — the dipaco.v1.Coordinator PushDelta: a lease's deltas, spooled, checked
 * and recorded durably before the answer (PullFragment is svc_pull.c). This file receives
 * the stream (lease, header, chunks); svc_push_commit.c finishes each fragment (decode,
 * screen, commit, ack). Handlers run on the loop thread; ud is the coord.
 *
 * Semantic choices (see also svc_worker.c):
 *  - PushDelta: Chunk.version must be the lease's base version; num_floats = fragment length;
 *    codec fp32 (total = 4 · num_floats) or the job's streaming.codec (total = its encoded
 *    size, block_floats = the job's); offsets contiguous from 0; the last chunk's crc32c (of
 *    the bytes as sent) must match (DATA_LOSS otherwise); NaN/Inf → INVALID_ARGUMENT. A
 *    quantized delta is kept whole in memory, decoded on the thread pool (a bad scale or code
 *    or a non-finite value → INVALID_ARGUMENT naming it, nothing stored) and stored as sent
 *    (BLOB_ENCODED; the outer step decodes it range by range) or, in an async job, as fp32;
 *    its row's checksum is the CRC-32C of the decoded fp32 payload. With outer.delta_norm_screen = k > 0 a
 *    delta whose L2 norm exceeds k × the median norm of the fragment's last accepted deltas
 *    (delta_screen.h) → FAILED_PRECONDITION naming the norm and the bound; it is not stored. The
 *    answer comes only after every fragment of the stream is fsync'd and recorded.
 *    Chunk.inner_steps below the lease's (a worker stopped mid-round) makes the lease count
 *    as that many steps where partial deltas are taken (coord_job_partial_ok: async, and sync
 *    jobs weighted by tokens without streaming); other sync jobs refuse it
 *    (FAILED_PRECONDITION). A push on an expired/released lease whose round is still open → ABORTED; whose
 *    round closed → ack PUSH_LATE. A repeat of an accepted (lease, fragment, crc) →
 *    PUSH_DUPLICATE; a different delta for the same lease and fragment → ALREADY_EXISTS.
 *    FragmentAck.version = the round's target version (t + 1). An fp32 delta's chunks are
 *    copied, checked finite, checksummed and appended to the spool on the thread pool, one
 *    chunk at a time per stream (reading pauses meanwhile), never on the loop thread.
 *  - Async (diloco-async, see rounds.c): leases start from the current versions; a delta is
 *    applied on its own soon after it is durable. FragmentAck.version = the fragment's
 *    version when the delta was taken in + 1, staleness = that version − base. With
 *    max_staleness > 0 a delta staler than it is read and dropped (PUSH_STALE; the lease
 *    ends and the slot's step counter moves on). Heartbeat steps_per_sec feeds the
 *    coordinator's per-worker speed EWMA (DyLU). */
#include "coordinator/svc_push.h"
#include "coordinator/svc_push_commit.h"
#include "coordinator/svc_put.h"

#include "common/checksum.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/svc.h"
#include "coordinator/testhook.h"
#include "proto/dipaco.pb-c.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int grow_buf(push *p, size_t n) {
  if (n <= p->cap) return 0;
  unsigned char *b = realloc(p->buf, n);
  if (!b) return DPC_ENOMEM;
  p->buf = b;
  p->cap = n;
  return 0;
}

/* The first chunk's lease (the caller's, one per stream) and fragment (of the lease, once per
 * stream): its index, or -1 with the push failed. */
static int push_lease_fragment(push *p, const struct rpc_chunk *ch) {
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
  return frag;
}

/* The first chunk's header against fragment frag of the lease's job j: 0, or -1 with the push
 * failed. */
static int push_check_header(push *p, const coord_job *j, int frag, const struct rpc_chunk *ch) {
  const jobspec_fragment *jf = &j->fragments[frag];
  if (ch->payload == DIPACO__V1__PAYLOAD__PAYLOAD_DELTA_OBJECT) { /* a put object, no data (svc_put.c) */
    /* The stream the job's objects hold: fp32, a quantized stream as sent, or a sparse one. */
    int codec = DPC_CODEC_FP32;
    uint32_t block = 0;
    size_t want = 0;
    if (put_delta_stream(j, frag, &codec, &block, &want) < 0 ||
        (int)ch->codec != codec || ch->num_floats != jf->len || ch->total != want || ch->len != 0 ||
        (codec != DPC_CODEC_FP32 && ch->block_floats != block)) {
      push_fail(p, RPC_INVALID_ARGUMENT, "fragment %llu: a PAYLOAD_DELTA_OBJECT chunk is %s (block_floats %u) with "
                "num_floats %zu, total %zu and no data; got codec %s, block_floats %u, %llu floats, total %llu, %llu "
                "data bytes", (unsigned long long)ch->fragment_id, dpc_codec_name(codec), block, jf->len, want,
                dpc_codec_name((int)ch->codec), ch->block_floats, (unsigned long long)ch->num_floats,
                (unsigned long long)ch->total, (unsigned long long)ch->len);
      return -1;
    }
    if (!put_lease_wants(p->c, j)) {
      push_fail(p, RPC_FAILED_PRECONDITION, "fragment %llu: job %lld's deltas are not put in the store: push their bytes",
                (unsigned long long)ch->fragment_id, (long long)j->id);
      return -1;
    }
  } else if (ch->payload != DIPACO__V1__PAYLOAD__PAYLOAD_DELTA) {
    push_fail(p, RPC_INVALID_ARGUMENT, "payload: must be PAYLOAD_DELTA (or PAYLOAD_DELTA_OBJECT), got %u", ch->payload);
    return -1;
  }
  if (j->spec.sparse.enabled) { /* a sparse job pushes sparse streams of the exact size */
    if (ch->codec != DPC_CODEC_SPARSE || ch->num_floats != jf->len || ch->total != j->sp_bytes[frag] ||
        ch->block_floats != 0) {
      push_fail(p, RPC_INVALID_ARGUMENT, "fragment %llu: a SparseLoCo job takes CODEC_SPARSE streams of %zu floats in "
                "%zu bytes, block_floats 0; got codec %s, %llu floats, %llu bytes, block_floats %u",
                (unsigned long long)ch->fragment_id, jf->len, j->sp_bytes[frag], dpc_codec_name((int)ch->codec),
                (unsigned long long)ch->num_floats, (unsigned long long)ch->total, ch->block_floats);
      return -1;
    }
  } else if (dpc_codec_check((int)ch->codec, DPC_CODEC_BIT(DPC_CODEC_FP32) | DPC_CODEC_BIT(j->spec.streaming.codec),
                      ch->num_floats, ch->total, ch->block_floats, jf->len) < 0) {
    /* fp32, or the job's codec (the lease's delta_codec) with the job's block size. */
    push_fail(p, RPC_INVALID_ARGUMENT, "fragment %llu: %s", (unsigned long long)ch->fragment_id, dpc_errmsg());
    return -1;
  }
  if (dpc_codec_is_block((int)ch->codec) && ch->block_floats != (uint32_t)j->spec.streaming.block_floats) {
    push_fail(p, RPC_INVALID_ARGUMENT, "fragment %llu: block_floats %u, the job's streaming.block_floats is %d",
              (unsigned long long)ch->fragment_id, ch->block_floats, j->spec.streaming.block_floats);
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
  /* A partial delta (a worker stopped mid-lease) merges only where it can count for what it
   * covers; an exact sync round averages whole rounds. (Streaming fragments sync mid-lease.) */
  if (ch->inner_steps > 0 && ch->inner_steps < (uint64_t)p->lease.inner_steps && !coord_job_partial_ok(j) &&
      !jobspec_streaming(&j->spec)) {
    push_fail(p, RPC_FAILED_PRECONDITION, "inner_steps: a delta of %llu of the lease's %d steps; job %lld takes partial "
              "deltas only with \"weighting\": \"tokens\" (or diloco-async): release the lease instead",
              (unsigned long long)ch->inner_steps, p->lease.inner_steps, (long long)j->id);
    return -1;
  }
  return 0;
}

/* What to do with the fragment's bytes (p->mode): write them (0, the spool is opened), check a
 * repeat (1), drop a late delta (2) or a too stale one (3). 0, or -1 with the push failed. */
static int push_pick_mode(push *p, const coord_job *j, int frag) {
  coord *c = p->c;
  const jobspec_fragment *jf = &j->fragments[frag];
  p->mode = 0;
  /* Already recorded (a retry)? */
  if (store_find_delta(c->st, p->lease.id, frag, &p->dup_crc, &p->dup_enc_crc) == 1) p->mode = 1;
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
    double now = dpc_mono_s();
    if (n && n->pull_done_s > 0 && now > n->pull_done_s && p->inner_steps > 0)
      lease_speed_sample(c, p->worker, (double)p->inner_steps / (now - n->pull_done_s));
    if (n) n->pull_done_s = 0;
  }
  if (p->mode == 0 && j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC && j->spec.max_staleness > 0) {
    int64_t st = lease_async_staleness(c, j, frag, p->base);
    if (st > j->spec.max_staleness) p->mode = 3; /* too stale: read the stream, keep nothing */
  }
  if (p->mode == 0 && p->object && push_object_take(p) < 0) return -1;
  if (p->mode == 0 && push_claim(p) < 0) { /* UNAVAILABLE: a worker pushes again after a pause */
    if (c->n_push_leases < COORD_MAX_PUSHES)
      push_fail(p, RPC_UNAVAILABLE, "lease %lld already has a PushDelta stream writing its delta; one at a time "
                "(push again once it is answered)", (long long)p->lease.id);
    else
      push_fail(p, RPC_UNAVAILABLE, "%d deltas are being written; push again shortly", COORD_MAX_PUSHES);
    return -1;
  }
  if (p->mode == 0 && !p->object) {
    /* Each push writes its own file: a second stream for the same lease and fragment must
     * never replace the delta the first one recorded (the row names the file it applies). */
    /* A sync job's quantized delta is kept as sent (BLOB_ENCODED): the outer step decodes it
     * range by range and replays serve it, so the store takes its bytes once, not fp32 too; an
     * async step reads an fp32 spool. */
    const int as_sent = p->enc && !p->sparse && coord_job_keeps_sent(j);
    blob_id id = {.job = p->lease.job, .fragment = frag, .version = p->lease.round, .aux = p->lease.id,
                  .attempt = ++c->push_seq, .kind = p->sparse ? BLOB_SPARSE : as_sent ? BLOB_ENCODED : BLOB_DELTA};
    blob_name(&id, p->blob, sizeof p->blob);
    if (as_sent || (p->enc && !p->sparse && jobspec_replay_pull(&j->spec))) { /* the stream as sent */
      id.kind = BLOB_ENCODED;
      blob_name(&id, p->enc_blob, sizeof p->enc_blob);
    }
    int rc = p->sparse || as_sent ? 0 : blob_writer_open(c->bs, p->blob, BLOB_DELTA, jf->len, &p->w);
    if (rc < 0) {
      push_fail(p, rpc_code_from_dpc(rc), "cannot open the delta spool: %s", dpc_errmsg());
      return -1;
    }
  }
  p->in_frag = 1;
  return 0;
}

/* First chunk of a fragment: check the lease and the header, pick the mode, open the blob. */
static int push_begin(push *p, const struct rpc_chunk *ch) {
  int frag = push_lease_fragment(p, ch);
  if (frag < 0) return -1;
  const coord_job *j = coord_job_get(p->c, p->lease.job);
  if (push_check_header(p, j, frag, ch) < 0) return -1;
  p->frag = frag;
  p->t0 = dpc_mono_s();
  p->total = ch->total;
  p->next = 0;
  p->crc = 0;
  p->ss = 0;
  p->norm = NAN;
  p->ncarry = 0;
  p->tokens = ch->tokens;
  p->inner_steps = ch->inner_steps;
  p->codec = (int)ch->codec;
  p->block = ch->block_floats;
  p->total_floats = (size_t)ch->num_floats;
  free(p->enc);
  free(p->dec);
  free(p->sp_tlen);
  p->enc = NULL;
  p->dec = NULL;
  p->sp_tlen = NULL;
  p->enc_blob[0] = 0;
  p->sparse = p->codec == DPC_CODEC_SPARSE;
  p->object = ch->payload == DIPACO__V1__PAYLOAD__PAYLOAD_DELTA_OBJECT;
  p->obj_crc = ch->crc32c;
  p->obj_attempt = p->object && ch->step <= INT64_MAX ? (int64_t)ch->step : 0;
  p->obj_nomd5 = 0;
  free(p->obj_part_md5);
  p->obj_part_md5 = NULL;
  p->obj_parts = 0;
  if (p->sparse) { /* (the job's own settings and layout: header checked above) */
    p->sp_cfg = j->sp_cfg;
    p->sp_nt = j->sp_nt[frag];
    if (!(p->sp_tlen = malloc((size_t)p->sp_nt * sizeof *p->sp_tlen))) {
      push_fail(p, RPC_RESOURCE_EXHAUSTED, "out of memory");
      return -1;
    }
    memcpy(p->sp_tlen, j->sp_tlen + j->sp_first[frag], (size_t)p->sp_nt * sizeof *p->sp_tlen);
  }
  /* (whole floats, the pad zeroed: a sparse stream is spooled as it is) */
  size_t enc_cap = (size_t)((p->total + 3) & ~(uint64_t)3);
  p->obj_encoded = p->object && p->codec != DPC_CODEC_FP32; /* read back whole by push_object_work */
  if (p->codec != DPC_CODEC_FP32 && !p->object && !(p->enc = calloc(enc_cap ? enc_cap : 4, 1))) {
    push_fail(p, RPC_RESOURCE_EXHAUSTED, "out of memory for a %llu-byte delta", (unsigned long long)p->total);
    return -1;
  }
  return push_pick_mode(p, j, frag);
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
  coord *c = ud;
  int64_t worker;
  push *p = svc_stream_begin(c, call, sizeof *p, &worker);
  if (!p) return;
  p->c = c;
  p->call = call;
  p->worker = worker;
  p->req.data = p;
  rpc_call_set_data(call, p);
}

/* The client closed its side: answer with every fragment's ack, or refuse an incomplete or
 * empty stream. */
static void push_end_of_stream(push *p, struct rpc_call *call) {
  if (p->in_frag) {
    push_fail(p, RPC_INVALID_ARGUMENT, "stream ended inside fragment %d at byte %llu of %llu", p->frag + 1,
              (unsigned long long)p->next, (unsigned long long)p->total);
    return;
  }
  if (p->n_acks == 0) {
    push_fail(p, RPC_INVALID_ARGUMENT, "empty PushDelta stream: send at least one fragment's chunks");
    return;
  }
  Dipaco__V1__PushDeltaResponse resp = DIPACO__V1__PUSH_DELTA_RESPONSE__INIT;
  Dipaco__V1__FragmentAck **ap = calloc((size_t)p->n_acks, sizeof *ap);
  if (!ap) {
    push_fail(p, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (int i = 0; i < p->n_acks; i++) ap[i] = &p->acks[i];
  resp.n_acks = (size_t)p->n_acks;
  resp.acks = ap;
  p->finished = 1;
  rpc_call_reply(call, &resp.base);
  free(ap);
}

/* A chunk's header: the first of a fragment starts it (push_begin), the others must continue
 * it. 0, or -1 with the push failed. */
static int push_chunk_header(push *p, const struct rpc_chunk *ch) {
  if (!p->in_frag) {
    if (ch->offset != 0) {
      push_fail(p, RPC_INVALID_ARGUMENT, "offset: a fragment's chunks start at 0, got %llu",
                (unsigned long long)ch->offset);
      return -1;
    }
    if (push_begin(p, ch) < 0) return -1;
  } else if (ch->lease_id != (uint64_t)p->lease.id || ch->fragment_id != (uint64_t)p->frag + 1 ||
             ch->total != p->total) {
    push_fail(p, RPC_INVALID_ARGUMENT, "lease_id/fragment_id/total changed inside fragment %d's chunks", p->frag + 1);
    return -1;
  } else if (ch->offset != p->next) {
    push_fail(p, RPC_INVALID_ARGUMENT, "offset: expected %llu (contiguous chunks), got %llu", (unsigned long long)p->next,
              (unsigned long long)ch->offset);
    return -1;
  }
  if (ch->len > MAX_CHUNK_ACCEPT) {
    push_fail(p, RPC_RESOURCE_EXHAUSTED, "chunk of %llu bytes exceeds %u", (unsigned long long)ch->len,
              MAX_CHUNK_ACCEPT);
    return -1;
  }
  return 0;
}

/* A chunk's bytes: finite floats, the running CRC, the spool. 0, or -1 with the push failed. */
static int push_chunk_data(push *p, const struct grpc_byte_buffer *msg, const struct rpc_chunk *ch) {
  if (grow_buf(p, ch->len ? ch->len : 1) < 0 || rpc_chunk_copy(msg, ch, p->buf) < 0) {
    push_fail(p, RPC_RESOURCE_EXHAUSTED, "cannot take a chunk of %llu bytes", (unsigned long long)ch->len);
    return -1;
  }
  uint64_t bad;
  if (p->enc) { /* quantized: kept as sent, decoded and checked once whole */
    memcpy(p->enc + p->next, p->buf, ch->len);
  } else if (check_finite(p, p->buf, ch->len, &bad) < 0) {
    push_fail(p, RPC_INVALID_ARGUMENT, "data: delta of fragment %d has a non-finite value (NaN/Inf) at float %llu",
              p->frag + 1, (unsigned long long)bad);
    return -1;
  }
  p->crc = dpc_crc32c(p->crc, p->buf, ch->len);
  if (p->w && !p->enc) {
    int rc = blob_writer_append(p->w, p->buf, ch->len);
    if (rc < 0) {
      push_fail(p, rpc_code_from_dpc(rc), "spooling the delta failed: %s", dpc_errmsg());
      return -1;
    }
  }
  p->next += ch->len;
  p->c->bytes_in += ch->len;
  p->bytes += ch->len;
  /* A worker whose delta is arriving is alive, even while a slow link holds its heartbeats
   * back behind the push (leases.c revokes only silent leases). */
  lease_note *n = coord_note(p->c, p->lease.id, 0);
  if (n) n->hb_at = dpc_wall_ms();
  return 0;
}

/* Ask for write-back of a spool every this many bytes (its fsync at the commit then has little
 * left to do). */
#define PUSH_WRITEBACK_BYTES ((uint64_t)64 << 20)

/* Thread pool: one fp32 chunk of a delta being written (mode 0): copied out of the message,
 * checked finite, checksummed and appended to the spool, off the loop thread. */
static void push_chunk_work(uv_work_t *req) {
  push *p = req->data;
  const struct rpc_chunk *ch = &p->cur;
  p->work_rc = 0;
  if (grow_buf(p, ch->len ? ch->len : 1) < 0 || rpc_chunk_copy(p->msg_ref, ch, p->buf) < 0) {
    p->work_rc = DPC_ENOMEM;
    return;
  }
  rpc_msg_free(p->msg_ref);
  p->msg_ref = NULL;
  if (check_finite(p, p->buf, ch->len, &p->bad_at) < 0) {
    p->work_rc = DPC_ENUMERIC;
    return;
  }
  p->crc = dpc_crc32c(p->crc, p->buf, ch->len);
  if ((p->work_rc = blob_writer_append(p->w, p->buf, ch->len)) < 0) {
    snprintf(p->err, sizeof p->err, "%s", dpc_errmsg());
    return;
  }
  if ((p->since_writeback += ch->len) >= PUSH_WRITEBACK_BYTES) {
    blob_writer_writeback(p->w);
    p->since_writeback = 0;
  }
}

static void push_chunk_after(uv_work_t *req, int status) {
  push *p = req->data;
  coord *c = p->c;
  p->busy = 0;
  if (p->msg_ref) {
    rpc_msg_free(p->msg_ref);
    p->msg_ref = NULL;
  }
  if (!p->call) { /* the call ended meanwhile */
    push_free(p);
  } else if (status != 0) {
    push_fail(p, RPC_UNAVAILABLE, "coordinator is shutting down; push again after it is back");
  } else if (p->work_rc == DPC_ENOMEM) {
    push_fail(p, RPC_RESOURCE_EXHAUSTED, "cannot take a chunk of %llu bytes", (unsigned long long)p->cur.len);
  } else if (p->work_rc == DPC_ENUMERIC) {
    push_fail(p, RPC_INVALID_ARGUMENT, "data: delta of fragment %d has a non-finite value (NaN/Inf) at float %llu",
              p->frag + 1, (unsigned long long)p->bad_at);
  } else if (p->work_rc < 0) {
    push_fail(p, rpc_code_from_dpc(p->work_rc), "spooling the delta failed: %s", p->err);
  } else if (!p->finished) {
    p->next += p->cur.len;
    c->bytes_in += p->cur.len;
    p->bytes += p->cur.len;
    lease_note *n = coord_note(c, p->lease.id, 0);
    if (n) n->hb_at = dpc_wall_ms(); /* a worker whose delta is arriving is alive (leases.c) */
    int paused = 0;
    if (p->next < p->total) TESTHOOK("push");
    else paused = push_finish_fragment(p, &p->cur);
    if (!paused && p->call && !p->finished) rpc_call_read(p->call);
  }
  loop_work_done(c);
}

/* Queue an fp32 chunk of a delta being written to the thread pool: 1 (reading pauses until it
 * is spooled), or 0 with the push failed. */
static int push_chunk_offload(push *p, const struct grpc_byte_buffer *msg, const struct rpc_chunk *ch) {
  if (!(p->msg_ref = rpc_msg_ref(msg))) {
    push_fail(p, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return 0;
  }
  p->cur = *ch;
  p->busy = 1;
  if (loop_queue_work(p->c, &p->req, push_chunk_work, push_chunk_after) < 0) {
    p->busy = 0;
    rpc_msg_free(p->msg_ref);
    p->msg_ref = NULL;
    push_fail(p, RPC_INTERNAL, "cannot queue the delta chunk");
    return 0;
  }
  return 1;
}

static int push_on_message(struct rpc_call *call, const struct grpc_byte_buffer *msg, void *ud) {
  (void)ud;
  push *p = rpc_call_data(call);
  if (!p || p->finished) return 0;
  if (!msg) {
    push_end_of_stream(p, call);
    return 0;
  }
  if (p->c->stopping) {
    push_fail(p, RPC_UNAVAILABLE, "coordinator is shutting down; push again after it is back");
    return 0;
  }
  struct rpc_chunk ch;
  if (rpc_chunk_parse(msg, &ch) < 0) {
    push_fail(p, RPC_INVALID_ARGUMENT, "malformed chunk: %s", dpc_errmsg());
    return 0;
  }
  if (push_chunk_header(p, &ch) < 0) return 0;
  if (p->object) { /* the whole fragment is in the store: no bytes follow */
    p->next = p->total;
    p->crc = ch.crc32c;
    return push_finish_fragment(p, &ch);
  }
  if (p->mode == 0 && p->w && !p->enc && ch.len > 0) return push_chunk_offload(p, msg, &ch);
  if (push_chunk_data(p, msg, &ch) < 0) return 0;
  if (p->next < p->total) {
    if (p->w) TESTHOOK("push");
    return 0;
  }
  return push_finish_fragment(p, &ch);
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

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Coordinator/PushDelta", .kind = RPC_CLIENT_STREAM, .on_call = push_on_call,
     .on_message = push_on_message, .on_done = push_on_done},
};

int svc_push_methods(coord *c, struct rpc_method *out) {
  return svc_methods_add(out, methods, (int)(sizeof methods / sizeof methods[0]), c);
}
