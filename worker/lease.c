/* lease.c — one lease: plan, pull, train, push, finish (lease.h). */
#include "worker/lease.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "worker/heartbeat.h"
#include "worker/plan.h"
#include "worker/storeget.h"
#include "worker/storeput.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRANSFER_ATTEMPTS 10
#define PUT_STREAMS 4 /* parts of one delta object put at once (storeput_put_parts) */
#define GET_STREAMS 4 /* ranged GETs of one fragment at once (storeget_parallel) */

/* The state of the lease in progress, shared by its phases. */
typedef struct lease_work {
  lease_runner *r;
  const Dipaco__V1__Lease *L;
  lease_plan p;
  heartbeat hb;
  int keep;              /* the slot's AdamW state outlives the lease (not RESET) */
  slot_state *snap;      /* the moments training started from, while the lease can still fail */
  int push_tried;        /* the delta was sent at least once: it may have landed */
  trainer_stats st;
  int partial;           /* stopped mid-round (async, or Lease.partial_push): push the steps done so far */
  enum wc_class cls;     /* how the last call failed */
  size_t bytes;          /* bytes of the path's fragments */
  size_t frag, got;      /* pull: the fragment in transfer and its bytes received */
  const float **dp;      /* push: fragment i's delta */
  int *res;              /* push: fragment i's PushResult */
  int sparse;            /* SparseLoCo lease (delta_codec CODEC_SPARSE) */
  int sl_whole;          /* pull: the sparse rounds cannot make the fragment: pull it whole */
  size_t sl_bytes;       /* pull: bytes of the fragment's sparse rounds */
  sl_push sp;            /* push: the encoded deltas and the new error-feedback buffer */
  int rp;                /* the lease replays rounds to catch up (rp_lease_replays) */
  int rp_whole;          /* pull: the rounds cannot make the fragment: pull it whole */
  size_t rp_bytes;       /* pull: bytes of the fragment's replayed rounds */
  int direct_off;        /* pull: the store's URL failed once: pull through the coordinator */
  size_t direct;         /* pull: fragments read from the object store */
  int put_off;           /* push: putting the deltas in the store failed: push them to the coordinator */
  uint32_t *put_crc;     /* push: the deltas are in the store (Lease.delta_put): their CRC-32Cs, to commit */
  uint64_t *put_attempt; /* push: and their objects' attempt numbers */
  int direct_put;        /* push: the deltas went to the store, the coordinator took them from there */
  int put_parts;         /* ... in this many parts (0: one PUT per fragment) */
} lease_work;

static const char *push_result_name(int r) {
  switch (r) {
  case DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED: return "accepted";
  case DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE: return "duplicate";
  case DIPACO__V1__PUSH_RESULT__PUSH_LATE: return "late";
  case DIPACO__V1__PUSH_RESULT__PUSH_STALE: return "stale";
  default: return "no ack";
  }
}

static void release(lease_runner *r, uint64_t lease_id, int reason, uint64_t step, const char *msg) {
  int code, rc = wc_release(r->wc, lease_id, reason, step, msg, &code);
  if (rc && reason != DIPACO__V1__RELEASE_REASON__RELEASE_DONE)
    DPC_WARN("lease %" PRIu64 ": release failed: %s", lease_id, dpc_errmsg());
  else if (rc)
    DPC_DEBUG("lease %" PRIu64 ": release after push: %s", lease_id, dpc_errmsg());
}

/* The release after a completed push: DONE, or DRAINING when the worker is shutting down
 * (SIGTERM), so that the coordinator hands the slots it keeps for this worker to others now. */
static void release_pushed(lease_runner *r, uint64_t lease_id, uint64_t step) {
  if (worker_stopping(r->ctl))
    release(r, lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_DRAINING, step, "worker shutting down");
  else
    release(r, lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_DONE, step, "");
}

/* The error of rc as text, copied (a release may overwrite dpc_errmsg()). */
static void error_text(char *msg, size_t n, int rc) {
  snprintf(msg, n, "%s", dpc_errmsg()[0] ? dpc_errmsg() : dpc_strerror(rc));
}

/* A lease failed here: pause longer the more leases in a row failed. */
static void pause_after_failure(lease_runner *r) {
  r->local_failures++;
  worker_sleep(r->ctl, worker_backoff_ms(r->local_failures + 3, r->seed));
}

static int interrupted(lease_work *x) { return worker_stopping(x->r->ctl) || hb_abort(&x->hb) != AB_NONE; }

/* ------------------------------------------------------------------ transfers */

/* A fresh channel in the middle of a lease (see wc_reconnect): the heartbeat thread is the
 * only other user of the client, so it pauses meanwhile. */
static void lease_reconnect(lease_work *x) {
  hb_stop(&x->hb);
  if (wc_reconnect(x->r->wc, x->r->o->coordinator)) DPC_WARN("reconnect: %s", dpc_errmsg());
  if (hb_start(&x->hb)) DPC_WARN("lease %" PRIu64 ": %s", x->L->lease_id, dpc_errmsg());
}

typedef int (*xfer_fn)(lease_work *x, int *code);

/* Retry a transfer step while it fails transiently; returns the final rc, with x->cls set. A
 * stop (SIGTERM) ends the retries unless on_stop is set (pushing work already done). */
static int xfer_retry(lease_work *x, xfer_fn call, int on_stop) {
  lease_runner *r = x->r;
  int rc;
  for (int attempt = 0;; attempt++) {
    int code = RPC_OK;
    rc = call(x, &code);
    x->cls = wc_classify(rc, code);
    if (x->cls != WC_RETRY || attempt + 1 >= TRANSFER_ATTEMPTS) break;
    if ((!on_stop && worker_stopping(r->ctl)) || hb_abort(&x->hb) != AB_NONE) break;
    DPC_WARN("lease %" PRIu64 ": %s; retrying", x->L->lease_id, dpc_errmsg());
    if (code == RPC_UNAVAILABLE && attempt >= 1) lease_reconnect(x);
    if (!worker_stopping(r->ctl)) {
      if (worker_sleep(r->ctl, worker_backoff_ms(attempt, r->seed)) && !on_stop) break;
    } else {
      worker_sleep_ns(worker_backoff_ms(attempt, r->seed) * 1000000);
    }
  }
  return rc;
}

static int pull_fragment(lease_work *x, int *code) {
  if (x->sparse && !x->sl_whole) {
    int r = sl_try_pull(&x->r->sparse, x->r->wc, x->L, &x->p, x->frag, x->r->slots.theta, &x->sl_bytes, code);
    if (r < 0) return r; /* a transfer failure: retried, from the version theta reached */
    if (r == 1) return 0;
    x->sl_whole = 1;
  }
  if (x->rp && !x->rp_whole) {
    int r = rp_try_pull(&x->r->replay, x->r->wc, x->L, &x->p, x->frag, x->r->slots.theta, &x->rp_bytes, code);
    if (r < 0) return r; /* a transfer failure: retried (theta is untouched) */
    if (r == 1) return 0;
    x->rp_whole = 1;
    rp_forget_range(&x->r->replay, x->p.abs_off[x->frag], (size_t)x->L->fragments[x->frag]->num_floats);
  }
  const Dipaco__V1__FragmentInfo *f = x->L->fragments[x->frag];
  float *dst = x->r->slots.theta + x->p.abs_off[x->frag];
  if (f->params_url && f->params_url[0] && !x->direct_off) {
    /* The parameters straight from the object store: the blob's payload, checked against the
     * version's CRC-32C; any failure falls back to the coordinator (theta is rewritten whole). */
    size_t n = (size_t)f->num_floats * sizeof(float);
    int rc = storeget_parallel(f->params_url, 24, dst, n, GET_STREAMS, STOREGET_PIECE_MIN, 60000);
    if (rc == 0 && f->crc32c && dpc_crc32c(0, dst, n) != f->crc32c)
      rc = dpc_err(DPC_ECHECKSUM, "fragment %" PRIu64 " from the store does not match version %" PRIu64 "'s checksum",
                   f->fragment_id, f->version);
    if (rc == 0) {
      x->direct++;
      *code = RPC_OK;
      return 0;
    }
    DPC_WARN("lease %" PRIu64 ": fragment %" PRIu64 ": %s; pulling it through the coordinator", x->L->lease_id,
             f->fragment_id, dpc_errmsg());
    x->direct_off = 1;
  }
  return wc_pull(x->r->wc, x->L->lease_id, f, dst, &x->got, code);
}

static int push_inner_state(lease_work *x, int *code) {
  return slot_push_inner(&x->r->slots, x->r->wc, x->L, &x->p, x->sparse ? x->sp.e : NULL, code);
}

/* Lease.delta_put: put each fragment's delta in the object store once (wc_put_deltas); the
 * commit (PushDelta of PAYLOAD_DELTA_OBJECT chunks) is retried alone. */
static int put_objects(lease_work *x, int *code) {
  const size_t n = x->L->n_fragments;
  x->put_crc = calloc(n, sizeof *x->put_crc);
  x->put_attempt = calloc(n, sizeof *x->put_attempt);
  int rc = x->put_crc && x->put_attempt ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory");
  *code = RPC_OK;
  if (!rc && x->sparse)
    rc = wc_put_sparse(x->r->wc, x->L, x->L->fragments, n, (const unsigned char *const *)x->sp.enc, x->sp.bytes,
                       PUT_STREAMS, x->put_crc, x->put_attempt, code, &x->put_parts);
  else if (!rc)
    rc = wc_put_deltas(x->r->wc, x->L, x->L->fragments, n, (const float *const *)x->dp, PUT_STREAMS, x->put_crc,
                       x->put_attempt, code, &x->put_parts);
  if (rc) {
    free(x->put_crc);
    free(x->put_attempt);
    x->put_crc = NULL;
    x->put_attempt = NULL;
  }
  return rc;
}

static int push_deltas(lease_work *x, int *code) {
  if (x->L->delta_put && !x->put_off) {
    int rc = x->put_crc ? 0 : put_objects(x, code);
    if (!rc)
      rc = wc_push_objects(x->r->wc, x->L->lease_id, x->L->fragments, x->L->n_fragments, x->put_crc,
                           x->put_attempt, (int)x->L->delta_codec, x->L->delta_block_floats,
                           x->sparse ? x->sp.bytes : NULL,
                           (uint64_t)x->st.steps_done, (uint64_t)x->st.tokens, x->res, code);
    if (!rc) {
      x->direct_put = 1;
      return 0;
    }
    if (!wc_put_falls_back(rc, *code)) return rc;
    DPC_WARN("lease %" PRIu64 ": putting the deltas in the object store failed: %s; pushing them to the coordinator",
             x->L->lease_id, dpc_errmsg());
    x->put_off = 1;
  }
  if (x->sparse)
    return wc_push_sparse(x->r->wc, x->L->lease_id, x->L->fragments, x->L->n_fragments,
                          (const unsigned char *const *)x->sp.enc, x->sp.bytes, (uint64_t)x->st.steps_done,
                          (uint64_t)x->st.tokens, x->res, code, NULL);
  return wc_push(x->r->wc, x->L->lease_id, x->L->fragments, x->L->n_fragments, x->dp, (uint64_t)x->st.steps_done,
                 (uint64_t)x->st.tokens, (int)x->L->delta_codec, x->L->delta_block_floats, x->res, code, NULL);
}

/* ------------------------------------------------------------------ phases */

/* Check the lease, start the heartbeat, fit the trainer and its AdamW state. The heartbeat
 * starts first: the coordinator revokes a lease that misses a few heartbeats, and fitting the
 * trainer or pulling an inner-state checkpoint can take longer than that. */
static int lease_plan_phase(lease_work *x) {
  lease_runner *r = x->r;
  const Dipaco__V1__Lease *L = x->L;
  int rc = lease_plan_build(L, &x->p);
  if (!rc) {
    x->hb.tok_per_step = (uint64_t)x->p.opts.B * (uint64_t)x->p.opts.T;
    rc = hb_start(&x->hb);
  }
  if (!rc) rc = slot_fit_trainer(&r->slots, r->o, L, &x->p);
  if (!rc) {
    /* (A streaming lease resumes its checkpoint in stream_run, unless it holds the slot.) */
    if (L->inner_state == DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_CHECKPOINT && L->has_inner_checkpoint &&
        !L->streaming)
      rc = slot_resume_checkpoint(&r->slots, r->wc, r->ctl, r->seed, L, &x->p,
                                  x->sparse ? sl_pull_target(&r->sparse, L, x->p.n_params) : NULL);
    else rc = slot_select_state(&r->slots, L);
  }
  return rc;
}

/* The lease cannot be run at all (bad lease, missing data, no trainer): give it back. */
static void lease_refuse(lease_work *x, int rc) {
  char msg[512];
  error_text(msg, sizeof msg, rc);
  DPC_ERROR("lease %" PRIu64 ": cannot run it: %s", x->L->lease_id, msg);
  release(x->r, x->L->lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_ERROR, x->L->first_step, msg);
  pause_after_failure(x->r);
}

/* Every fragment at its base version into theta. */
static int lease_pull(lease_work *x) {
  const Dipaco__V1__Lease *L = x->L;
  int64_t t0 = dpc_mono_ms();
  int rc = 0;
  size_t sparse_frags = 0, replayed = 0, replay_bytes = 0;
  if (!x->sparse) sl_forget_held(&x->r->sparse); /* theta is overwritten by another job's pulls */
  if (!x->rp) rp_forget_held(&x->r->replay);
  for (size_t i = 0; i < L->n_fragments && !rc; i++) {
    x->frag = i;
    x->got = 0;
    x->sl_whole = 0;
    x->sl_bytes = 0;
    x->rp_whole = 0;
    x->rp_bytes = 0;
    rc = xfer_retry(x, pull_fragment, 0);
    if (x->sparse && !x->sl_whole) sparse_frags++;
    if (x->rp && !x->rp_whole && !rc) {
      replayed++;
      replay_bytes += x->rp_bytes;
      x->bytes += x->rp_bytes;
    } else {
      x->bytes += x->sparse && !x->sl_whole ? x->sl_bytes : (size_t)L->fragments[i]->num_floats * 4;
    }
    if (!rc && x->sparse) sl_note_pulled(&x->r->sparse, L, &x->p, i);
    if (!rc && x->rp && x->rp_whole) rp_note_pulled(&x->r->replay, L, &x->p, i);
    if (interrupted(x)) break;
  }
  if (sparse_frags)
    DPC_INFO("lease %" PRIu64 ": %zu of %zu fragments made from their sparse rounds", L->lease_id, sparse_frags,
             L->n_fragments);
  if (replayed)
    DPC_INFO("lease %" PRIu64 ": %zu of %zu fragments replayed from their rounds (%zu bytes)", L->lease_id, replayed,
             L->n_fragments, replay_bytes);
  if (x->direct)
    DPC_INFO("lease %" PRIu64 ": %zu of %zu fragments read from the object store", L->lease_id, x->direct,
             L->n_fragments);
  if (!rc && !interrupted(x)) {
    int64_t ms = dpc_mono_ms() - t0;
    DPC_INFO("lease %" PRIu64 " pulled %zu bytes in %" PRId64 " ms (%.1f MB/s)", L->lease_id, x->bytes, ms,
             ms > 0 ? (double)x->bytes / 1000.0 / (double)ms : 0.0);
  }
  return rc;
}

/* The inner steps, keeping the state they started from in case the lease is abandoned.
 * Returns 1 when there is a delta to push (the whole round, or an async partial one). */
static int lease_train(lease_work *x, int *rc_out) {
  lease_runner *r = x->r;
  const Dipaco__V1__Lease *L = x->L;
  int rc = 0;
  if (x->keep) rc = slot_snapshot(&r->slots, L, &x->snap);
  hb_mark(&x->hb);
  if (!rc) trainer_set_sched_shift(r->slots.tr, (long)L->schedule_shift);
  if (!rc)
    rc = trainer_round(r->slots.tr, r->slots.theta, (long)L->first_step, (int)L->inner_steps, r->slots.delta, &x->st,
                       hb_on_step, &x->hb);
  if (r->o->progress) fputc('\n', stderr);
  hb_poke(&x->hb); /* the last step's loss reaches the coordinator with the lease, not an interval later */
  x->cls = rc ? WC_FATAL : WC_OK;
  *rc_out = rc;
  if (rc) return 0;
  /* Async, and sync jobs weighted by tokens (Lease.partial_push): a SIGTERM mid-round pushes
   * the steps done so far (the coordinator counts them, or merges them with their tokens'
   * weight) instead of releasing the lease and losing them. */
  const trainer_stats *st = &x->st;
  const int partial_ok = L->algorithm != DIPACO__V1__ALGORITHM__ALGORITHM_SYNC || L->partial_push;
  x->partial = partial_ok && !L->streaming && worker_stopping(r->ctl) &&
               hb_abort(&x->hb) == AB_NONE && st->steps_done > 0 && st->steps_done < (int)L->inner_steps;
  if (st->steps_done != (int)L->inner_steps && !x->partial) return 0;
  DPC_INFO("lease %" PRIu64 " trained %d steps in %.2f s: loss %.4f -> %.4f (mean %.4f), %.0f tok/s, lr %.6g -> %.6g",
           L->lease_id, st->steps_done, st->seconds, st->first_loss, st->last_loss, st->mean_loss,
           st->seconds > 0 ? (double)st->tokens / st->seconds : 0.0, st->first_lr, st->last_lr);
  if (x->partial)
    DPC_INFO("lease %" PRIu64 ": stopping: pushing the partial delta of %d of %u inner steps", L->lease_id,
             st->steps_done, L->inner_steps);
  return 1;
}

/* A streaming lease (stream.h) in place of pull, train and push. Returns 1 when it completed
 * (every delta acknowledged, released), else 0 with *rc_out. */
static int lease_stream(lease_work *x, int *rc_out) {
  lease_runner *r = x->r;
  const Dipaco__V1__Lease *L = x->L;
  rp_forget_held(&r->replay); /* a streaming lease uses theta as scratch */
  stream_env e = {.wc = r->wc, .ctl = r->ctl, .seed = r->seed, .slots = &r->slots, .keep = &r->stream, .hb = &x->hb};
  int rc = x->keep ? slot_snapshot(&r->slots, L, &x->snap) : 0;
  if (!rc) rc = stream_run(&e, L, &x->p, &x->st, &x->cls);
  if (r->o->progress) fputc('\n', stderr);
  *rc_out = rc;
  if (rc || x->st.steps_done != (int)L->inner_steps) return 0;
  r->local_failures = 0;
  release_pushed(r, L->lease_id, L->first_step + (uint64_t)x->st.steps_done);
  x->snap = NULL; /* the trainer's moments are now the slot's */
  if (x->keep) slot_forget(&r->slots, L->job_id, L->slot->path, L->slot->replica);
  return 1;
}

/* Log the coordinator's answer per fragment: PUSH_LATE / PUSH_STALE are dropped work. */
static void log_acks(lease_work *x, int64_t ms) {
  const Dipaco__V1__Lease *L = x->L;
  int ok = 1;
  for (size_t i = 0; i < L->n_fragments; i++) {
    if (x->res[i] != DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED && x->res[i] != DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE) {
      ok = 0;
      DPC_WARN("lease %" PRIu64 ": delta of fragment %" PRIu64 " was %s; dropped", L->lease_id,
               L->fragments[i]->fragment_id, push_result_name(x->res[i]));
    }
  }
  char parts[40] = "";
  if (x->direct_put && x->put_parts) snprintf(parts, sizeof parts, " (%d parts)", x->put_parts);
  DPC_INFO("lease %" PRIu64 " pushed %zu bytes%s%s in %" PRId64 " ms: %s", L->lease_id, x->bytes,
           x->direct_put ? " through the object store" : "", parts, ms, ok ? "accepted" : "not all accepted");
}

/* The inner state (with inner.state checkpoint), then the deltas; then Release(DONE). */
static int lease_push(lease_work *x) {
  lease_runner *r = x->r;
  const Dipaco__V1__Lease *L = x->L;
  size_t nf = L->n_fragments;
  x->dp = malloc(nf * sizeof *x->dp);
  x->res = malloc(nf * sizeof *x->res);
  int rc = x->dp && x->res ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory");
  for (size_t i = 0; i < nf && !rc; i++) x->dp[i] = r->slots.delta + x->p.abs_off[i];
  int64_t t0 = dpc_mono_ms();
  if (!rc && x->sparse) { /* the sparse deltas and the slot's new error-feedback buffer */
    rc = sl_encode(&r->sparse, L, &x->p, r->slots.delta, &x->sp);
    if (rc) DPC_WARN("lease %" PRIu64 ": encoding the sparse deltas failed: %s", L->lease_id, dpc_errmsg());
  }
  if (!rc && L->inner_state == DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_CHECKPOINT) {
    /* Inner state first, then the delta: once the delta is durable (the slot's round is
     * done) the state the next lease of the slot resumes from is durable too. */
    rc = xfer_retry(x, push_inner_state, 1);
    if (rc) DPC_WARN("lease %" PRIu64 ": pushing the inner state failed: %s", L->lease_id, dpc_errmsg());
  }
  if (!rc) {
    hb_set_tokens(&x->hb, (uint64_t)x->st.tokens);
    x->push_tried = 1;
    rc = xfer_retry(x, push_deltas, 1);
  }
  if (!rc) {
    if (x->sparse) {
      x->bytes = 0;
      for (size_t i = 0; i < nf; i++) x->bytes += x->sp.bytes[i];
      sl_commit(&r->sparse, L, &x->sp);
    }
    if (x->rp) rp_note_pushed(&r->replay, L, &x->p, r->slots.delta);
    log_acks(x, dpc_mono_ms() - t0);
    r->local_failures = 0;
    release_pushed(r, L->lease_id, L->first_step + (uint64_t)x->st.steps_done);
    x->snap = NULL; /* the trainer's moments are now the slot's */
    if (x->keep) slot_forget(&r->slots, L->job_id, L->slot->path, L->slot->replica);
  }
  free(x->dp);
  free(x->res);
  free(x->put_crc);
  free(x->put_attempt);
  x->put_crc = NULL;
  x->put_attempt = NULL;
  sl_push_free(&x->sp);
  x->dp = NULL;
  x->res = NULL;
  return rc;
}

/* The heartbeat's part of the lease's end: LEASE_DRAIN if the coordinator asked for it. */
static int stop_heartbeat(lease_work *x) {
  hb_stop(&x->hb);
  x->r->sps = x->hb.sps;
  return hb_drain(&x->hb) ? LEASE_DRAIN : 0;
}

/* The lease was not completed: stopped, lost, or failed. Put the AdamW state back and tell
 * the coordinator what it needs to know. */
static int lease_finish_abandoned(lease_work *x, int rc) {
  lease_runner *r = x->r;
  const Dipaco__V1__Lease *L = x->L;
  if (x->snap && x->push_tried && slot_keep_trained(&r->slots, L))
    DPC_WARN("lease %" PRIu64 ": cannot keep the trained AdamW state: %s", L->lease_id, dpc_errmsg());
  if (x->snap) slot_restore(&r->slots, x->snap);
  x->snap = NULL;
  uint64_t step = L->first_step + (uint64_t)x->st.steps_done;
  int ab = hb_abort(&x->hb);
  if (ab == AB_REREG || x->cls == WC_REREGISTER) {
    DPC_WARN("lease %" PRIu64 ": the coordinator forgot this worker's session; registering again", L->lease_id);
    return LEASE_REREGISTER;
  }
  if (ab == AB_LOST || x->cls == WC_LEASE_GONE) {
    DPC_WARN("lease %" PRIu64 ": lease expired or revoked%s%s; dropping the work", L->lease_id, rc ? ": " : "",
             rc ? dpc_errmsg() : "");
  } else if (worker_stopping(r->ctl)) {
    DPC_INFO("lease %" PRIu64 ": stopping: releasing it at step %" PRIu64, L->lease_id, step);
    release(r, L->lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_DRAINING, step, "worker shutting down");
  } else if (ab == AB_STOP) {
    DPC_INFO("lease %" PRIu64 ": stopped by the coordinator: releasing it at step %" PRIu64, L->lease_id, step);
    release(r, L->lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_PREEMPTED, step, "stopped by the coordinator");
  } else {
    char msg[512];
    error_text(msg, sizeof msg, rc);
    DPC_ERROR("lease %" PRIu64 " failed: %s", L->lease_id, msg);
    int flags = 0;
    if (x->cls == WC_RETRY) flags = LEASE_REREGISTER; /* the coordinator is unreachable: start over */
    else release(r, L->lease_id, DIPACO__V1__RELEASE_REASON__RELEASE_ERROR, step, msg);
    pause_after_failure(r);
    return flags;
  }
  return 0;
}

int lease_run(lease_runner *r, const Dipaco__V1__Lease *L) {
  const uint32_t path = L->slot ? L->slot->path : 0, rep = L->slot ? L->slot->replica : 0;
  DPC_INFO("lease %" PRIu64 " granted: job %" PRIu64 " round %" PRIu64 " slot (%u,%u) steps %" PRIu64 "..%" PRIu64
           " fragments %zu", L->lease_id, L->job_id, L->round, path, rep, L->first_step,
           L->first_step + L->inner_steps, L->n_fragments);
  lease_work x;
  memset(&x, 0, sizeof x);
  x.r = r;
  x.L = L;
  x.keep = L->inner_state != DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_RESET;
  x.sparse = L->delta_codec == (Dipaco__V1__Codec)DPC_CODEC_SPARSE;
  x.rp = rp_lease_replays(L);
  hb_init(&x.hb, r->wc, r->ctl, L, r->sps, r->o->progress, r->o->slowdown, r->o->min_step_ms, r->o->drain_finish_s);
  int rc = lease_plan_phase(&x);
  if (rc) {
    hb_stop(&x.hb);
    lease_refuse(&x, rc);
    lease_plan_free(&x.p);
    return 0;
  }
  int pushed = 0;
  if (L->streaming) {
    pushed = lease_stream(&x, &rc);
  } else {
    rc = lease_pull(&x);
    if (!rc && !interrupted(&x) && lease_train(&x, &rc)) pushed = (rc = lease_push(&x)) == 0;
  }
  int flags = stop_heartbeat(&x);
  flags |= pushed ? LEASE_PUSHED : lease_finish_abandoned(&x, rc);
  lease_plan_free(&x.p);
  return flags;
}
