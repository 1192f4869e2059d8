/* svc_push_commit.c — PushDelta, once a fragment's bytes are all in (svc_push_commit.h): the
 * CRC, a quantized delta decoded and a sparse one checked on the thread pool, the delta norm
 * screen (delta_screen.h), the durable commit and the delta's row, and the ack; plus the
 * stream's failure and cleanup. The semantic choices are listed in svc_push.c. */
#include "coordinator/svc_push_commit.h"

#include "common/checksum.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "coordinator/delta_screen.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/rounds.h"
#include "coordinator/svc_put.h"
#include "coordinator/testhook.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Take the lease's writing place: 0, or -1 when another stream of the lease is writing or the
 * coordinator has COORD_MAX_PUSHES deltas in flight. */
int push_claim(push *p) {
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

void push_free(push *p) {
  push_unclaim(p);
  if (p->msg_ref) rpc_msg_free(p->msg_ref);
  if (p->w) blob_writer_abort(p->w);
  free(p->sp_tlen);
  free(p->enc);
  free(p->dec);
  free(p->buf);
  free(p->acks);
  free(p->obj_part_md5);
  free(p);
}

void push_fail(push *p, int code, const char *fmt, ...) {
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
  if (p->object) { /* already durable in the store, and read back whole by push_object_work */
    p->work_crc = p->obj_encoded ? p->obj_dec_crc : p->obj_crc; /* the row's: the decoded payload's */
    return;
  }
  if (p->sparse) { /* the stream as sent, padded to whole floats: O(kept entries) */
    p->work_rc = blob_write(p->c->bs, p->blob, BLOB_SPARSE, (const float *)p->enc, (size_t)(p->total + 3) / 4,
                            &p->work_crc);
    free(p->enc);
    p->enc = NULL;
    if (p->work_rc < 0) snprintf(p->err, sizeof p->err, "%s", dpc_errmsg());
    return;
  }
  if (p->enc && p->enc_blob[0]) { /* the stream as sent (read by outer step, replays), durable before the row */
    p->work_rc = blob_write(p->c->bs, p->enc_blob, BLOB_ENCODED, (const float *)p->enc, (size_t)(p->total + 3) / 4,
                            NULL);
    free(p->enc);
    p->enc = NULL;
  }
  if (p->dec && !p->w) { /* kept as sent only: the row records the decoded payload's checksum */
    p->work_crc = dpc_crc32c(0, (const unsigned char *)p->dec, p->total_floats * sizeof(float));
    free(p->dec);
    p->dec = NULL;
  } else if (p->dec && p->work_rc == 0) { /* async: the spool holds it decoded, the step reads fp32 */
    p->work_rc = blob_writer_append(p->w, p->dec, p->total_floats * sizeof(float));
    free(p->dec);
    p->dec = NULL;
  }
  if (p->w && p->work_rc == 0) p->work_rc = blob_writer_commit(p->w, &p->work_crc);
  else if (p->w) blob_writer_abort(p->w);
  if (p->work_rc < 0) snprintf(p->err, sizeof p->err, "%s", dpc_errmsg());
}

static void push_commit_after(uv_work_t *req, int status) {
  push *p = req->data;
  coord *c = p->c;
  p->w = NULL; /* freed by commit */
  p->busy = 0;
  p->in_frag = 0;
  push_unclaim(p); /* the delta is recorded (or refused) before the next stream of the lease writes */
  if (p->object) put_forget(c, p->lease.id, p->frag, BLOB_DELTA); /* recorded below, or deleted */
  if (status != 0 || p->work_rc < 0) {
    if (p->enc_blob[0]) rounds_discard(c, p->enc_blob, NULL);
    push_fail(p, RPC_INTERNAL, "could not store the delta durably: %s", status ? "canceled" : p->err);
  } else {
    TESTHOOK("push-commit");
    coord_job *j = coord_job_get(c, p->lease.job);
    lease_note *n = coord_note(c, p->lease.id, 0);
    float loss = n ? n->loss : NAN;
    /* The slot's metric row goes in with the delta: one commit (fsync) per delta, not two. */
    /* (bytes_in: what came through the coordinator; a put object's bytes went to the store) */
    store_metric m = {.job = p->lease.job, .round = p->lease.round, .path = p->lease.path,
                      .replica = p->lease.replica, .worker = p->worker, .loss = loss, .tokens = (int64_t)p->tokens,
                      .bytes_in = p->object ? 0 : (int64_t)p->total, .bytes_out = n ? (int64_t)n->bytes_out : 0,
                      .created_at = dpc_wall_ms()};
    /* Each row carries the pulls since the lease's previous delta, so that rows add up. */
    uint64_t pulled = n ? n->bytes_out : 0;
    if (n) n->bytes_out = 0;
    store_new_delta nd = {.lease = p->lease.id, .fragment = p->frag, .checksum = p->work_crc, .blob = p->blob,
                          .enc_blob = p->enc_blob[0] ? p->enc_blob : p->obj_encoded && !p->sparse ? p->blob : NULL,
                          .enc_crc = p->crc, .weight = 1.0,
                          .tokens = (int64_t)p->tokens, .now_ms = dpc_wall_ms(), .norm = p->norm, .metric = &m};
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
    if (rc != 0) rounds_discard(c, p->blob, NULL);
    if (rc != 0 && p->enc_blob[0] && strcmp(p->enc_blob, p->blob) != 0) rounds_discard(c, p->enc_blob, NULL);
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
  /* A committed object in the job's codec names its stream's CRC-32C as sent, as the row's enc_crc. */
  if (p->obj_encoded ? p->dup_enc_crc != crc : p->dup_crc != crc) {
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
  if (!p->dec && !p->sparse && !p->obj_encoded)
    p->norm = sqrt(p->ss); /* a decoded quantized or sparse delta has its norm already */
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
  if (!p->sparse && !p->enc_blob[0]) { /* (a sparse stream, or a quantized one kept, is written as sent:
                                          push_commit_work frees it) */
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

int push_object_take(push *p) {
  const put_prep *e = put_prepared(p->c, p->lease.id, p->frag, BLOB_DELTA);
  if (e && p->obj_attempt != 0 && p->obj_attempt != e->attempt) {
    push_fail(p, RPC_FAILED_PRECONDITION, "lease %lld fragment %d: the commit names object attempt %lld, the one "
              "prepared last is %lld: put and commit that one, or push the delta's bytes", (long long)p->lease.id,
              p->frag + 1, (long long)p->obj_attempt, (long long)e->attempt);
    return -1;
  }
  if (!e && p->obj_attempt > 0 && p->obj_attempt < p->c->started_ms * 1000) {
    /* Prepared by an earlier run of this coordinator (push_seq starts at start-ms·1000): the
     * object is where that run named it; its bytes are checked in full all the same. */
    blob_id id = {.job = p->lease.job, .fragment = p->frag, .version = p->lease.round, .aux = p->lease.id,
                  .attempt = p->obj_attempt, .kind = BLOB_DELTA};
    const coord_job *j = coord_job_get(p->c, p->lease.job);
    if (!j || put_delta_object(j, p->frag, &id.kind, &p->obj_bytes) < 0 || blob_name(&id, p->blob, sizeof p->blob) < 0) {
      push_fail(p, RPC_INVALID_ARGUMENT, "step: object attempt %lld: %s", (long long)p->obj_attempt, dpc_errmsg());
      return -1;
    }
    p->obj_nomd5 = 1;
    DPC_INFO("lease %lld fragment %d: committing object %s, prepared before this coordinator started",
             (long long)p->lease.id, p->frag + 1, p->blob);
    return 0;
  }
  if (!e) {
    push_fail(p, RPC_FAILED_PRECONDITION, "lease %lld fragment %d: no delta object was prepared for it (PrepareDeltaPut): "
              "push the delta's bytes", (long long)p->lease.id, p->frag + 1);
    return -1;
  }
  if (e->crc != p->obj_crc) {
    push_fail(p, RPC_INVALID_ARGUMENT, "crc32c: fragment %d's object was prepared with CRC-32C 0x%08x, the commit says "
              "0x%08x", p->frag + 1, e->crc, p->obj_crc);
    return -1;
  }
  snprintf(p->blob, sizeof p->blob, "%s", e->name);
  p->obj_bytes = e->bytes;
  memcpy(p->obj_md5, e->md5, sizeof p->obj_md5);
  if (e->parts) { /* the thread pool completes the upload (push_object_work) */
    if (!(p->obj_part_md5 = malloc((size_t)e->parts * sizeof *p->obj_part_md5))) {
      push_fail(p, RPC_RESOURCE_EXHAUSTED, "out of memory");
      return -1;
    }
    memcpy(p->obj_part_md5, e->part_md5, (size_t)e->parts * sizeof *p->obj_part_md5);
    p->obj_parts = e->parts;
    snprintf(p->obj_upload_id, sizeof p->obj_upload_id, "%s", e->upload_id);
  }
  return 0;
}

/* Views of this many bytes when reading a put object back. */
#define OBJECT_VIEW_BYTES ((size_t)4 << 20)

/* Thread pool, after its HEAD: an object holding the stream as sent in the job's codec, read
 * back whole (it is small) and kept in the blob cache for the outer step; p->work_crc gets the
 * stream's CRC-32C (checked against the commit's by push_object_after), and the stream is
 * decoded as a pushed one is (a bad scale or code, a non-finite value: DPC_EFORMAT or
 * DPC_ENUMERIC, the message in p->err), its norm in p->norm and its decoded payload's CRC-32C
 * in p->obj_dec_crc (the row's checksum). A SparseLoCo stream is checked, never expanded, and
 * its row's checksum is the padded stream's, as a pushed one's spool (BLOB_SPARSE). */
static int object_encoded_check(push *p) {
  const size_t padded = (size_t)(p->obj_bytes - BLOB_HEADER_BYTES - BLOB_TRAILER_BYTES);
  blob_reader *r = NULL;
  int rc = padded >= p->total ? blob_reader_open(p->c->bs, p->blob, p->sparse ? BLOB_SPARSE : BLOB_ENCODED,
                                                 padded / 4, &r)
                              : dpc_err(DPC_EFORMAT, "object of %zu payload bytes for a %llu-byte stream", padded,
                                        (unsigned long long)p->total);
  if (!rc) blob_reader_keep(r); /* the outer step reads it again */
  if (!rc && !(p->enc = malloc(padded ? padded : 4))) rc = dpc_err(DPC_ENOMEM, "out of memory for the object");
  if (!rc) rc = blob_reader_read(r, p->enc, padded);
  if (r && !rc) rc = blob_reader_close(r, NULL);
  else if (r) blob_reader_abort(r);
  if (!rc) {
    p->work_crc = dpc_crc32c(0, p->enc, (size_t)p->total);
    rc = push_decode(p, p->err);
    if (!rc)
      p->obj_dec_crc = p->sparse ? dpc_crc32c(0, p->enc, padded)
                                 : dpc_crc32c(0, (const unsigned char *)p->dec, p->total_floats * sizeof(float));
    if (rc < 0) p->bad_at = UINT64_MAX; /* (p->err names the block or value) */
  } else {
    snprintf(p->err, sizeof p->err, "%s", dpc_errmsg());
  }
  free(p->enc);
  free(p->dec);
  p->enc = NULL;
  p->dec = NULL;
  return rc;
}

/* Thread pool: the object a worker put (its upload completed first when it came in parts),
 * checked as a streamed push's bytes are: its size and ETag (HEAD: the MD5s it was prepared
 * with), then read back whole: the blob's format and trailer, finite values, the sum of squares
 * (the norm screen) and the payload CRC-32C (p->work_crc). */
static void push_object_work(uv_work_t *req) {
  push *p = req->data;
  blob_store *bs = p->c->bs;
  blob_reader *r = NULL;
  p->ss = 0;
  p->bad_at = UINT64_MAX;
  char etag[80];
  int rc = blob_store_settle_put(bs, p->blob, p->obj_bytes, p->obj_nomd5 ? NULL : p->obj_md5, p->obj_upload_id,
                                 p->obj_parts, (const unsigned char(*)[16])p->obj_part_md5, etag);
  if (!rc && p->obj_encoded) {
    p->work_rc = object_encoded_check(p);
    return;
  }
  if (!rc) rc = blob_reader_open(bs, p->blob, BLOB_DELTA, p->total_floats, &r);
  if (!rc) blob_reader_keep(r); /* the outer step reads it again */
  size_t left = p->total_floats * sizeof(float), at = 0;
  while (!rc && left > 0) {
    size_t n = left < OBJECT_VIEW_BYTES ? left : OBJECT_VIEW_BYTES;
    const void *v;
    if ((rc = blob_reader_view(r, n, &v)) < 0) break;
    const float *f = v;
    double ss = 0;
    for (size_t i = 0; i < n / sizeof(float); i++) {
      if (!isfinite(f[i])) {
        p->bad_at = at + i;
        rc = DPC_ENUMERIC;
        break;
      }
      ss += (double)f[i] * (double)f[i];
    }
    p->ss += ss;
    left -= n;
    at += n / sizeof(float);
  }
  if (r && !rc) rc = blob_reader_close(r, &p->work_crc);
  else if (r) blob_reader_abort(r);
  if (rc < 0 && rc != DPC_ENUMERIC) snprintf(p->err, sizeof p->err, "%s", dpc_errmsg());
  p->work_rc = rc;
}

static void push_object_after(uv_work_t *req, int status) {
  push *p = req->data;
  coord *c = p->c;
  p->busy = 0;
  int rc = status ? DPC_EUNAVAILABLE : p->work_rc, queued = 0, drop = 1;
  if (status) {
    drop = 0;
    push_fail(p, RPC_UNAVAILABLE, "coordinator is shutting down; push again after it is back");
  } else if (rc == DPC_EUNAVAILABLE) { /* the store is down: the object may be fine, keep it */
    drop = 0;
    push_fail(p, RPC_UNAVAILABLE, "reading fragment %d's object %s: %s; push again later", p->frag + 1, p->blob, p->err);
  } else if (rc == DPC_ENUMERIC && p->bad_at == UINT64_MAX) {
    push_fail(p, RPC_INVALID_ARGUMENT, "fragment %d's %s delta object: %s", p->frag + 1, dpc_codec_name(p->codec), p->err);
  } else if (rc == DPC_ENUMERIC) {
    push_fail(p, RPC_INVALID_ARGUMENT, "data: delta of fragment %d has a non-finite value (NaN/Inf) at float %llu",
              p->frag + 1, (unsigned long long)p->bad_at);
  } else if (rc < 0) {
    push_fail(p, RPC_FAILED_PRECONDITION, "fragment %d's object %s: %s: put it again or push the delta's bytes",
              p->frag + 1, p->blob, p->err);
  } else if (p->work_crc != p->obj_crc) {
    push_fail(p, RPC_FAILED_PRECONDITION, "fragment %d's object %s holds a delta with CRC-32C 0x%08x, the commit says "
              "0x%08x", p->frag + 1, p->blob, p->work_crc, p->obj_crc);
  } else if (!p->call || p->finished) {
    drop = 0; /* the worker commits it again */
  } else if (push_screen(p) == 0) {
    lease_note *n = coord_note(c, p->lease.id, 0);
    if (n) n->hb_at = dpc_wall_ms(); /* its worker is alive (leases.c) */
    queued = push_queue_commit(p);
    drop = !queued;
  }
  if (!queued) {
    if (drop) { /* refused: nobody will record it */
      if (!put_discard(c, p->lease.id, p->frag, BLOB_DELTA)) rounds_discard(c, p->blob, NULL);
    }
    push_unclaim(p);
    p->in_frag = 0;
    if (!p->call) push_free(p);
    else if (!p->finished) rpc_call_read(p->call);
  }
  loop_work_done(c);
}

/* Mode 0 of a PAYLOAD_DELTA_OBJECT fragment: check the object on the thread pool, then screen
 * and record it. Returns on_message's value. */
static int push_object_verify(push *p) {
  p->busy = 1;
  if (loop_queue_work(p->c, &p->req, push_object_work, push_object_after) < 0) {
    p->busy = 0;
    push_fail(p, RPC_INTERNAL, "cannot queue the check of the delta object");
    return 0;
  }
  return 1;
}

/* The last chunk of a fragment arrived: check the CRC, then by mode acknowledge a repeat, drop
 * a stale or late delta, or screen it and queue its durable commit. Returns on_message's
 * value: 1 while the commit runs (reading pauses), else 0. */
int push_finish_fragment(push *p, const struct rpc_chunk *ch) {
  if (ch->crc32c != p->crc) {
    push_fail(p, RPC_DATA_LOSS, "crc32c: fragment %d's stream has CRC-32C 0x%08x, the last chunk says 0x%08x; push again",
              p->frag + 1, p->crc, ch->crc32c);
    return 0;
  }
  if (p->object && p->mode != 0) { /* a repeat, late or stale: the prepared object is not needed */
    /* (an entry's name is never one a row names: recording a delta forgets its entry) */
    put_discard(p->c, p->lease.id, p->frag, BLOB_DELTA);
  }
  if (p->mode == 1) {
    push_finish_duplicate(p);
    return 0;
  }
  if (p->mode == 3) {
    push_finish_stale(p);
    return 0;
  }
  if (p->mode == 0 && p->object) return push_object_verify(p);
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
