/* svc_push.c — the dipaco.v1.Coordinator PushDelta: a lease's deltas, spooled, checked
 * and recorded durably before the answer (PullFragment is svc_pull.c). Handlers run on the
 * loop thread; ud is the coord.
 *
 * Semantic choices (see also svc_worker.c):
 *  - PushDelta: Chunk.version must be the lease's base version; num_floats = fragment length;
 *    codec fp32 (total = 4 · num_floats) or the job's streaming.codec (total = its encoded
 *    size, block_floats = the job's); offsets contiguous from 0; the last chunk's crc32c (of
 *    the bytes as sent) must match (DATA_LOSS otherwise); NaN/Inf → INVALID_ARGUMENT. A
 *    quantized delta is kept whole in memory, decoded on the thread pool (a bad scale or code
 *    or a non-finite value → INVALID_ARGUMENT naming it, nothing stored) and spooled as fp32;
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

#include "common/checksum.h"
#include "common/codec.h"
#include "common/sparse.h"
#include "common/errors.h"
#include "common/log.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/rounds.h"
#include "coordinator/delta_screen.h"
#include "coordinator/svc.h"
#include "coordinator/testhook.h"
#include "proto/dipaco.pb-c.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  size_t total_floats;
  uint32_t crc;
  double ss, norm; /* sum of squares of the fragment's floats so far; its L2 norm at the end */
  double t0;       /* dpc_mono_s at the fragment's first chunk (dipaco_push_seconds) */
  unsigned char carry[4];
  int ncarry;
  blob_writer *w;
  char blob[BLOB_NAME_MAX];
  unsigned char *buf;
  size_t cap;
  uint64_t bytes;
  /* a quantized fragment (codec != fp32): its wire bytes, decoded on the thread pool */
  int codec;
  uint32_t block;
  unsigned char *enc;
  float *dec;
  /* a sparse fragment (SparseLoCo, codec CODEC_SPARSE): checked on the thread pool, spooled as
   * sent (zero-padded to whole floats in enc) with the job's settings and tensor lengths */
  int sparse;
  int claimed; /* holds its lease's place in coord.push_leases (a delta being written) */
  dpc_sparse_cfg sp_cfg;
  uint64_t *sp_tlen;
  int sp_nt;
  Dipaco__V1__FragmentAck *acks;
  int n_acks, cap_acks;
  uv_work_t req;
  int work_rc;
  uint32_t work_crc;
  char err[512];
  /* an fp32 chunk being checked, checksummed and spooled on the thread pool (push_chunk_work) */
  struct grpc_byte_buffer *msg_ref;
  struct rpc_chunk cur;
  uint64_t bad_at, since_writeback;
} push;

#define COORD_MAX_PUSHES ((int)(sizeof ((coord *)0)->push_leases / sizeof(int64_t)))

/* Take the lease's writing place: 0, or -1 when another stream of the lease is writing or the
 * coordinator has COORD_MAX_PUSHES deltas in flight. */
static int push_claim(push *p) {
  coord *c = p->c;
  for (int i = 0; i < c->n_push_leases; i++)
    if (c->push_leases[i] == p->lease.id) return -1;
  if (c->n_push_leases >= COORD_MAX_PUSHES) return -1;
  c->push_leases[c->n_push_leases++] = p->lease.id;
  p->claimed = 1;
  return 0;
}

static void push_unclaim(push *p) {
  coord *c = p->c;
  if (!p->claimed) return;
  p->claimed = 0;
  for (int i = 0; i < c->n_push_leases; i++)
    if (c->push_leases[i] == p->lease.id) {
      c->push_leases[i] = c->push_leases[--c->n_push_leases];
      return;
    }
}

static void push_free(push *p) {
  push_unclaim(p);
  if (p->msg_ref) rpc_msg_free(p->msg_ref);
  if (p->w) blob_writer_abort(p->w);
  free(p->sp_tlen);
  free(p->enc);
  free(p->dec);
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
  if (!p->busy) push_unclaim(p);
  p->in_frag = 0;
  if (!p->finished && p->call) {
    p->finished = 1;
    DPC_WARN("PushDelta from worker %lld rejected: %s", (long long)p->worker, msg);
    /* A malformed or corrupt payload (dipaco_deltas_rejected_total): nothing was stored. */
    if (code == RPC_INVALID_ARGUMENT || code == RPC_DATA_LOSS) p->c->deltas_rejected++;
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
    int64_t st = lease_async_staleness(p->c, j, frag, p->base);
    if (st >= 0) {
      a->staleness = (uint64_t)st;
      a->version = (uint64_t)(p->base + st + 1);
    }
  }
  return 0;
}

/* The fragment's norm screen window (coordinator/delta_screen.h), loaded from the store on first use
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
  p->work_rc = 0;
  if (p->sparse) { /* the stream as sent, padded to whole floats: O(kept entries) */
    p->work_rc = blob_write(p->c->bs, p->blob, BLOB_SPARSE, (const float *)p->enc, (size_t)(p->total + 3) / 4,
                            &p->work_crc);
    free(p->enc);
    p->enc = NULL;
    if (p->work_rc < 0) snprintf(p->err, sizeof p->err, "%s", dpc_errmsg());
    return;
  }
  if (p->dec) { /* a quantized delta goes to the spool decoded: the outer step reads fp32 */
    p->work_rc = blob_writer_append(p->w, p->dec, p->total_floats * sizeof(float));
    free(p->dec);
    p->dec = NULL;
  }
  if (p->work_rc == 0) p->work_rc = blob_writer_commit(p->w, &p->work_crc);
  else blob_writer_abort(p->w);
  if (p->work_rc < 0) snprintf(p->err, sizeof p->err, "%s", dpc_errmsg());
}

static void push_commit_after(uv_work_t *req, int status) {
  push *p = req->data;
  coord *c = p->c;
  p->w = NULL; /* freed by commit */
  p->busy = 0;
  p->in_frag = 0;
  push_unclaim(p); /* the delta is recorded (or refused) before the next stream of the lease writes */
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
                      .created_at = dpc_wall_ms()};
    /* Each row carries the pulls since the lease's previous delta, so that rows add up. */
    uint64_t pulled = n ? n->bytes_out : 0;
    if (n) n->bytes_out = 0;
    store_new_delta nd = {.lease = p->lease.id, .fragment = p->frag, .checksum = p->work_crc, .blob = p->blob,
                          .weight = 1.0, .tokens = (int64_t)p->tokens, .now_ms = dpc_wall_ms(), .norm = p->norm,
                          .metric = &m};
    /* Async: a delta of fewer steps than leased (a preempted worker's partial work) counts
     * for the steps it covers; sync rounds always take the lease's steps. */
    if (j && coord_job_partial_ok(j) && p->inner_steps > 0) nd.inner_steps = (int)p->inner_steps;
    int64_t did;
    int rc = store_record_delta(c->st, &nd, &did);
    /* Only a recorded push (rc 0) leaves its spool file named by a row: a duplicate's row
     * names the file of the push recorded first, and a refused or failed one is named by
     * none; each removes its own file now rather than leave it to the restart sweep. */
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rc < 0 ? dpc_errmsg() : "");
    if (rc != 0) blob_delete(c->bs, p->blob);
    if (rc != 0 && n) n->bytes_out += pulled; /* not recorded: the next row carries them */
    if (rc == 0 || rc == 1) {
      push_ack(p, p->frag, rc == 0 ? DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED : DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE,
               (uint64_t)p->lease.round + 1);
      if (rc == 0) {
        coord_observe(c, HIST_PUSH, dpc_mono_s() - p->t0);
        screen_window *sw = j ? push_screen_window(c, j, p->frag) : NULL;
        if (sw) screen_add(sw, p->norm);
        if (j && isfinite(loss) && p->lease.path < j->n_paths) j->path_loss[p->lease.path] = loss;
        DPC_INFO("delta received: lease %lld job %lld slot (path %d, replica %d) round %lld fragment %d, %llu bytes, "
                 "crc 0x%08x, loss %.4f", (long long)p->lease.id, (long long)p->lease.job, p->lease.path,
                 p->lease.replica, (long long)p->lease.round, p->frag + 1, (unsigned long long)p->total, p->work_crc, loss);
        TESTHOOK("push-ack");
      }
      lease_maybe_pushed(c, &p->lease);
      rounds_check(c);
    } else if (rc == DPC_ESTATE) {
      push_ack(p, p->frag, DIPACO__V1__PUSH_RESULT__PUSH_LATE, (uint64_t)p->lease.round + 1);
      if (lease_maybe_pushed(c, &p->lease)) rounds_check(c); /* the round closed without it: nothing left owed */
    } else if (rc == DPC_ECANCELED) {
      push_fail(p, RPC_ABORTED, "%s; drop the work and ask for a new lease", msg);
    } else if (rc == DPC_EEXIST) { /* the lease recorded a different delta: that one stays */
      push_fail(p, RPC_ALREADY_EXISTS, "%s", msg);
    } else {
      push_fail(p, rpc_code_from_dpc(rc), "recording the delta failed: %s", msg);
    }
  }
  if (!p->call) {
    push_free(p);
  } else if (!p->finished) {
    rpc_call_read(p->call);
  }
  loop_work_done(c);
}

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
  if (ch->payload != DIPACO__V1__PAYLOAD__PAYLOAD_DELTA) {
    push_fail(p, RPC_INVALID_ARGUMENT, "payload: must be PAYLOAD_DELTA, got %u", ch->payload);
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
    double now = dpc_mono_s();
    if (n && n->pull_done_s > 0 && now > n->pull_done_s && p->inner_steps > 0)
      lease_speed_sample(c, p->worker, (double)p->inner_steps / (now - n->pull_done_s));
    if (n) n->pull_done_s = 0;
  }
  if (p->mode == 0 && j->spec.algorithm == JOB_ALGO_DILOCO_ASYNC && j->spec.max_staleness > 0) {
    int64_t st = lease_async_staleness(c, j, frag, p->base);
    if (st > j->spec.max_staleness) p->mode = 3; /* too stale: read the stream, keep nothing */
  }
  if (p->mode == 0 && push_claim(p) < 0) { /* UNAVAILABLE: a worker pushes again after a pause */
    if (c->n_push_leases < COORD_MAX_PUSHES)
      push_fail(p, RPC_UNAVAILABLE, "lease %lld already has a PushDelta stream writing its delta; one at a time "
                "(push again once it is answered)", (long long)p->lease.id);
    else
      push_fail(p, RPC_UNAVAILABLE, "%d deltas are being written; push again shortly", COORD_MAX_PUSHES);
    return -1;
  }
  if (p->mode == 0) {
    /* Each push writes its own file: a second stream for the same lease and fragment must
     * never replace the delta the first one recorded (the row names the file it applies). */
    blob_id id = {.job = p->lease.job, .fragment = frag, .version = p->lease.round, .aux = p->lease.id,
                  .attempt = ++c->push_seq, .kind = p->sparse ? BLOB_SPARSE : BLOB_DELTA};
    blob_name(&id, p->blob, sizeof p->blob);
    int rc = p->sparse ? 0 : blob_writer_open(c->bs, p->blob, BLOB_DELTA, jf->len, &p->w);
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
  p->sparse = p->codec == DPC_CODEC_SPARSE;
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
  if (p->codec != DPC_CODEC_FP32 && !(p->enc = calloc(enc_cap ? enc_cap : 4, 1))) {
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

/* Decode a quantized fragment's bytes into p->dec (malloc'd) with its L2 norm in p->norm: 0,
 * or a DPC_E* code with the message in err[512]. Runs on the thread pool for new deltas. */
static int push_decode(push *p, char *err) {
  if (p->sparse) { /* checked, never expanded: O(kept entries) */
    double ss = 0;
    int rc = dpc_sparse_sumsq(&p->sp_cfg, p->sp_tlen, p->sp_nt, p->enc, (size_t)p->total, &ss);
    if (rc < 0) snprintf(err, 512, "%s", dpc_errmsg());
    else p->norm = sqrt(ss);
    return rc;
  }
  int rc = (p->dec = malloc((p->total_floats ? p->total_floats : 1) * sizeof(float))) ? 0 : DPC_ENOMEM;
  if (rc == 0) rc = dpc_codec_decode(p->codec, p->enc, (size_t)p->total, p->total_floats, p->block, p->dec);
  if (rc < 0) {
    snprintf(err, 512, "%s", rc == DPC_ENOMEM ? "out of memory" : dpc_errmsg());
    return rc;
  }
  double ss = 0;
  for (size_t i = 0; i < p->total_floats; i++) ss += (double)p->dec[i] * (double)p->dec[i];
  p->norm = sqrt(ss);
  return 0;
}

/* The checksum a quantized delta's row records: CRC-32C of the decoded fp32 payload (what the
 * spool holds). For an fp32 delta it is the stream's own CRC. */
static int push_payload_crc(push *p, uint32_t *crc) {
  if (!p->enc) {
    *crc = p->crc;
    return 0;
  }
  if (p->sparse) { /* the spool holds the stream padded to whole floats */
    *crc = dpc_crc32c(0, p->enc, (size_t)((p->total + 3) & ~(uint64_t)3));
    return 0;
  }
  char err[512];
  int rc = push_decode(p, err);
  if (rc == 0) *crc = dpc_crc32c(0, (const unsigned char *)p->dec, p->total_floats * sizeof(float));
  else push_fail(p, RPC_INVALID_ARGUMENT, "fragment %d's %s delta: %s", p->frag + 1, dpc_codec_name(p->codec), err);
  free(p->dec);
  p->dec = NULL;
  return rc;
}

/* The whole fragment arrived as a repeat of an accepted push (mode 1). */
static void push_finish_duplicate(push *p) {
  coord *c = p->c;
  p->in_frag = 0;
  uint32_t crc = 0;
  if (push_payload_crc(p, &crc) < 0) return;
  if (p->dup_crc != crc) {
    push_fail(p, RPC_ALREADY_EXISTS, "lease %lld already pushed a different delta for fragment %d", (long long)p->lease.id,
              p->frag + 1);
    return;
  }
  push_ack(p, p->frag, DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE, (uint64_t)p->lease.round + 1);
  if (lease_maybe_pushed(c, &p->lease)) rounds_check(c);
}

/* The whole fragment arrived too stale to apply (mode 3, async). */
static void push_finish_stale(push *p) {
  coord *c = p->c;
  p->in_frag = 0;
  coord_job *j = coord_job_get(c, p->lease.job);
  DPC_WARN("stale delta dropped: lease %lld fragment %d base version %lld, staleness %lld > max_staleness %d",
           (long long)p->lease.id, p->frag + 1, (long long)p->base,
           j ? (long long)lease_async_staleness(c, j, p->frag, p->base) : -1LL, j ? j->spec.max_staleness : 0);
  if (j) j->async_dropped++;
  push_ack(p, p->frag, DIPACO__V1__PUSH_RESULT__PUSH_STALE, (uint64_t)p->base);
  /* The steps were trained (the slot's counter moves on); the delta is not applied. */
  lease_pushed(c, p->lease.id);
  rounds_check(c);
}

/* The delta norm screen (mode 0): 0 = let through, -1 = refused (push failed). */
static int push_screen(push *p) {
  coord *c = p->c;
  if (!p->dec && !p->sparse) p->norm = sqrt(p->ss); /* a decoded quantized or sparse delta has its norm already */
  coord_job *j = coord_job_get(c, p->lease.job);
  double ab = j ? screen_adamw_bound(j->spec.inner.lr, j->spec.inner.beta2, j->spec.inner.weight_decay,
                                     j->spec.sparse.enabled ? j->spec.sparse.ef_beta : 0.0, p->lease.inner_steps,
                                     p->total_floats)
                 : INFINITY;
  if (!(p->norm <= ab)) {
    push_fail(p, RPC_FAILED_PRECONDITION,
              "delta norm screen: fragment %d's delta has L2 norm %.6g, above the bound %.6g that %d AdamW steps at "
              "inner.lr %g can move %zu parameters; refused, not applied (a diverged or corrupt worker?)",
              p->frag + 1, p->norm, ab, p->lease.inner_steps, j ? j->spec.inner.lr : 0.0, p->total_floats);
    return -1;
  }
  double k = j ? j->spec.outer.delta_norm_screen : 0, bound;
  screen_window *sw = k > 0 ? push_screen_window(c, j, p->frag) : NULL;
  if (!sw || !screen_reject(sw, k, p->norm, &bound)) return 0;
  /* Never stored, never applied; the lease stays active, so the worker (which releases a
   * lease whose push was refused) hands the slot back for the same round. */
  push_fail(p, RPC_FAILED_PRECONDITION,
            "delta norm screen: fragment %d's delta has L2 norm %.6g, above the bound %.6g (outer.delta_norm_screen "
            "%g x the median %.6g of the fragment's last %d accepted deltas); refused, not applied",
            p->frag + 1, p->norm, bound, k, screen_reference(sw), sw->n);
  return -1;
}

/* Queue the durable commit of the spooled (or decoded) delta: 1 while it runs, else 0. */
static int push_queue_commit(push *p) {
  p->busy = 1;
  if (loop_queue_work(p->c, &p->req, push_commit_work, push_commit_after) < 0) {
    p->busy = 0;
    push_fail(p, RPC_INTERNAL, "cannot queue the delta commit");
    return 0;
  }
  return 1;
}

static void push_decode_work(uv_work_t *req) {
  push *p = req->data;
  p->work_rc = push_decode(p, p->err);
}

/* A quantized delta decoded (or refused): screen it and queue its commit. */
static void push_decode_after(uv_work_t *req, int status) {
  push *p = req->data;
  coord *c = p->c;
  p->busy = 0;
  if (!p->sparse) { /* (a sparse stream is spooled as sent: push_commit_work frees it) */
    free(p->enc);
    p->enc = NULL;
  }
  int queued = 0;
  if (status != 0 || p->work_rc < 0) {
    push_fail(p, RPC_INVALID_ARGUMENT, "fragment %d's %s delta: %s", p->frag + 1, dpc_codec_name(p->codec),
              status ? "canceled" : p->err);
  } else if (p->call && !p->finished && push_screen(p) == 0) {
    queued = push_queue_commit(p);
  }
  if (!queued) {
    free(p->dec);
    free(p->enc);
    p->dec = NULL;
    p->enc = NULL;
    if (p->w) {
      blob_writer_abort(p->w);
      p->w = NULL;
    }
    p->in_frag = 0;
    if (!p->call) push_free(p);
    else if (!p->finished) rpc_call_read(p->call);
  }
  loop_work_done(c);
}

/* The last chunk of a fragment arrived: check the CRC, then by mode acknowledge a repeat, drop
 * a stale or late delta, or screen it and queue its durable commit. Returns on_message's
 * value: 1 while the commit runs (reading pauses), else 0. */
static int push_finish_fragment(push *p, const struct rpc_chunk *ch) {
  if (ch->crc32c != p->crc) {
    push_fail(p, RPC_DATA_LOSS, "crc32c: fragment %d's stream has CRC-32C 0x%08x, the last chunk says 0x%08x; push again",
              p->frag + 1, p->crc, ch->crc32c);
    return 0;
  }
  if (p->mode == 1) {
    push_finish_duplicate(p);
    return 0;
  }
  if (p->mode == 3) {
    push_finish_stale(p);
    return 0;
  }
  if (p->mode == 0 && p->enc) { /* decode on the thread pool, then screen and commit */
    p->busy = 1;
    if (loop_queue_work(p->c, &p->req, push_decode_work, push_decode_after) < 0) {
      p->busy = 0;
      push_fail(p, RPC_INTERNAL, "cannot queue the delta decode");
      return 0;
    }
    return 1;
  }
  if (p->mode == 0 && push_screen(p) < 0) return 0;
  if (p->mode == 2) {
    p->in_frag = 0;
    DPC_INFO("late delta dropped: lease %lld fragment %d round %lld already closed", (long long)p->lease.id, p->frag,
             (long long)p->lease.round);
    push_ack(p, p->frag, DIPACO__V1__PUSH_RESULT__PUSH_LATE, (uint64_t)p->lease.round + 1);
    return 0;
  }
  return push_queue_commit(p); /* paused until the commit is durable */
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
