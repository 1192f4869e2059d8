/* stream.c — a Streaming DiLoCo lease (stream.h): continuous training, fragment deltas pushed
 * from a background thread at their sync steps, the versions they help make prefetched by a
 * second thread and merged τ steps later, and eager updates. */
#include "worker/stream.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/rpc.h"
#include "worker/replay.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRANSFER_ATTEMPTS 10
#define WAIT_MIN_MS 5    /* first pause while a global version is not made yet */
#define WAIT_MAX_MS 50   /* longest pause between asks */

void stream_keep_free(stream_keep *k) {
  free(k->frag_ids);
  free(k->local);
  free(k->global);
  free(k->stage);
  free(k->eager_prev);
  free(k->eager_est);
  free(k->eager_base);
  free(k->scratch);
  free(k->have_e);
  free(k->est_ver);
  free(k->have_ver);
  free(k->u);
  free(k->ustage);
  free(k->own);
  free(k->have_u);
  free(k->own_ver);
  free(k->own_lease);
  memset(k, 0, sizeof *k);
}

int stream_sync_due(uint64_t n, uint32_t o, uint32_t H) {
  return n >= 1 && n >= o && (n - o) % H == 0;
}

int64_t stream_version_after(uint64_t n, uint32_t o, uint32_t H) {
  return (int64_t)((n - o) / H) + (o > 0 ? 1 : 0);
}

/* Replay pulls for a streaming lease: Lease.replay_pull, no eager updates, a dense codec. */
static int stream_rp(const Dipaco__V1__Lease *L) {
  return L->replay_pull && !L->eager && L->delta_codec != (Dipaco__V1__Codec)DPC_CODEC_SPARSE;
}

/* Whether a whole pull also fetches u at its version: a job with outer momentum and quantized
 * deltas (fp32 deltas replay at about the cost of a whole pull: replay.c). */
static int stream_wants_u(const Dipaco__V1__Lease *L) {
  return L->outer_momentum != 0.0f && L->delta_codec != DIPACO__V1__CODEC__CODEC_FP32;
}

/* Payload `payload` of fragment i of lease L at version v into dst; waits (polling with a
 * growing pause) while the coordinator has not made that version yet. *cls: how the last call
 * failed. quit (may be NULL) cuts the wait short. */
static int pull_version(stream_env *e, const Dipaco__V1__Lease *L, size_t i, int64_t v, int payload, float *dst,
                        enum wc_class *cls, atomic_int *quit) {
  Dipaco__V1__FragmentInfo fi = *L->fragments[i];
  fi.version = (uint64_t)v;
  fi.crc32c = 0; /* the lease names the base version's checksum only; the stream carries its own */
  int64_t pause = WAIT_MIN_MS;
  int attempt = 0;
  for (;;) {
    size_t got = 0;
    int code = RPC_OK;
    int rc = wc_pull_payload(e->wc, L->lease_id, &fi, payload, dst, &got, &code);
    if (rc == 0) return 0;
    if (worker_stopping(e->ctl) || hb_abort(e->hb) != AB_NONE || (quit && atomic_load(quit))) {
      *cls = WC_RETRY;
      return rc;
    }
    if (code == RPC_FAILED_PRECONDITION) { /* not made yet: the round is still closing */
      worker_sleep_ns(pause * 1000000);
      if (pause < WAIT_MAX_MS) pause = pause * 2 > WAIT_MAX_MS ? WAIT_MAX_MS : pause * 2;
      continue;
    }
    *cls = wc_classify(rc, code);
    if (*cls != WC_RETRY || ++attempt >= TRANSFER_ATTEMPTS) return rc;
    DPC_WARN("lease %" PRIu64 ": pulling fragment %" PRIu64 " version %" PRId64 ": %s; retrying", L->lease_id,
             fi.fragment_id, v, dpc_errmsg());
    worker_sleep_ns(worker_backoff_ms(attempt, e->seed) * 1000000);
  }
}

/* ------------------------------------------------------------------ the push thread */

typedef struct {
  stream_env *e;
  const Dipaco__V1__Lease *L;
  const lease_plan *p;
  pthread_t th;
  int running;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int *queue;            /* (nf) fragment indexes to push, in order */
  size_t head, tail;     /* queue[head..tail) waiting */
  int busy;              /* a push is on the wire */
  int quit;
  int rc;                /* first failure (0 = none) */
  enum wc_class cls;
  uint64_t sent;         /* payload bytes pushed */
  int *res;              /* (nf) PushResult per fragment, −1 until acknowledged */
  /* The prefetcher: from fragment i's sync on, its next global version is pulled into
   * keep->stage (once the round has closed) while training goes on, so that the merge finds
   * it there. Under mu. */
  pthread_t fth;
  int frunning;
  int *fq;               /* (2·nf) ring of fragment indexes to fetch */
  size_t fhead, ftail;
  int64_t *fver;         /* (nf) the version fetched or being fetched into stage, −1: none */
  int *fstate;           /* (nf) 0 pending, 1 in stage, < 0 the pull's error */
  /* Replay pulls (q->rp): the global and momentum versions held when the fetch was queued, and
   * whether the fetch left the momentum of its version in keep->ustage. */
  int rp;
  int64_t *fbase, *fubase;
  int *fu;
  atomic_int fquit;
  int inited;            /* mu and cv initialised */
  int put_off;           /* Lease.delta_put failed once: this lease pushes its deltas' bytes */
  int puts;              /* fragments put in the object store */
} pusher;

/* Lease.delta_put: put fragment i's delta d in the object store once (*crc, *att: what its
 * commit names); 0, or after a failure that falls back (wc_put_falls_back) 1 with q->put_off
 * set, so that this lease pushes its deltas' bytes; else the error. */
static int put_one(pusher *q, Dipaco__V1__FragmentInfo *fi, const float *d, uint32_t *crc, uint64_t *att) {
  int code = RPC_OK, rc = wc_put_deltas(q->e->wc, q->L, &fi, 1, &d, 4, crc, att, &code, NULL);
  if (!rc || !wc_put_falls_back(rc, code)) return rc;
  DPC_WARN("lease %" PRIu64 ": putting the delta of fragment %" PRIu64 " in the object store failed: %s; pushing the "
           "deltas to the coordinator", q->L->lease_id, fi->fragment_id, dpc_errmsg());
  q->put_off = 1;
  return 1;
}

/* One fragment's delta (slots->delta at its offset, base = the lease's base version), put in
 * the object store and committed (Lease.delta_put) or pushed, with retries on transient
 * failures. */
static int push_one(pusher *q, size_t i) {
  stream_env *e = q->e;
  const Dipaco__V1__Lease *L = q->L;
  const float *d = e->slots->delta + q->p->abs_off[i];
  Dipaco__V1__FragmentInfo *fi = L->fragments[i];
  uint64_t tok = (uint64_t)q->p->opts.B * (uint64_t)q->p->opts.T * L->inner_steps;
  uint32_t crc = 0;
  uint64_t att = 0;
  int put = L->delta_put && !q->put_off;
  int rc = put ? put_one(q, fi, d, &crc, &att) : 0;
  if (rc < 0) return rc;
  put = put && rc == 0;
  for (int attempt = 0;; attempt++) {
    int code = RPC_OK, r = -1;
    uint64_t sent = 0;
    rc = put ? wc_push_objects(e->wc, L->lease_id, &fi, 1, &crc, &att, (int)L->delta_codec, L->delta_block_floats, NULL,
                               L->inner_steps, tok, &r, &code)
             : wc_push(e->wc, L->lease_id, &fi, 1, &d, L->inner_steps, tok, (int)L->delta_codec, L->delta_block_floats,
                       &r, &code, &sent);
    if (put && wc_put_falls_back(rc, code)) { /* the coordinator cannot take the object: push the bytes */
      DPC_WARN("lease %" PRIu64 ": committing the delta of fragment %" PRIu64 " from the object store failed: %s; "
               "pushing it", L->lease_id, fi->fragment_id, dpc_errmsg());
      put = 0;
      q->put_off = 1;
      attempt--;
      continue;
    }
    enum wc_class cls = wc_classify(rc, code);
    if (rc == 0) {
      pthread_mutex_lock(&q->mu);
      q->sent += sent;
      q->res[i] = r;
      q->puts += put;
      pthread_mutex_unlock(&q->mu);
      if (r != DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED && r != DIPACO__V1__PUSH_RESULT__PUSH_DUPLICATE)
        DPC_WARN("lease %" PRIu64 ": delta of fragment %" PRIu64 " was not accepted (result %d); dropped", L->lease_id,
                 fi->fragment_id, r);
      return 0;
    }
    if (cls != WC_RETRY || attempt + 1 >= TRANSFER_ATTEMPTS || hb_abort(e->hb) != AB_NONE) {
      pthread_mutex_lock(&q->mu);
      q->cls = cls;
      pthread_mutex_unlock(&q->mu);
      return rc;
    }
    DPC_WARN("lease %" PRIu64 ": pushing fragment %" PRIu64 ": %s; retrying", L->lease_id, fi->fragment_id, dpc_errmsg());
    worker_sleep_ns(worker_backoff_ms(attempt, e->seed) * 1000000);
  }
}

/* Queue the prefetch of version v of fragment i (no-op if it is already queued or there). */
static void fetch_enqueue(pusher *q, size_t i, int64_t v) {
  pthread_mutex_lock(&q->mu);
  const size_t cap = 2 * q->L->n_fragments;
  if (q->frunning && q->fver[i] != v && q->ftail - q->fhead < cap) {
    q->fver[i] = v;
    q->fstate[i] = 0;
    if (q->rp) { /* (keep's versions change on this thread only, under no fetch of fragment i) */
      q->fbase[i] = q->e->keep->have_ver[i];
      q->fubase[i] = q->e->keep->have_u[i];
      q->fu[i] = 0;
    }
    q->fq[q->ftail++ % cap] = (int)i;
    pthread_cond_broadcast(&q->cv);
  }
  pthread_mutex_unlock(&q->mu);
}

/* Replay: version v of fragment i into keep->stage and u_v into keep->ustage from G_{v−1} and
 * u_{v−1} (held when the fetch was queued) and the round's deltas as sent, waiting while the
 * round closes. 1 done, 0 when it must be pulled whole (the reason logged). */
static int fetch_replay(pusher *q, size_t i, int64_t v, stream_keep *k) {
  const Dipaco__V1__Lease *L = q->L;
  const Dipaco__V1__FragmentInfo *f = L->fragments[i];
  const size_t off = q->p->abs_off[i], len = (size_t)f->num_floats;
  pthread_mutex_lock(&q->mu);
  const int held = q->fbase[i] == v - 1 && q->fubase[i] == v - 1;
  pthread_mutex_unlock(&q->mu);
  if (!held) return 0;
  const float *own = k->own_ver[i] == v ? k->own + off : NULL;
  int64_t pause = WAIT_MIN_MS;
  for (int attempt = 0;;) {
    memcpy(k->stage + off, k->global + off, len * sizeof(float));
    memcpy(k->ustage + off, k->u + off, len * sizeof(float));
    size_t bytes = 0;
    uint32_t crc = 0;
    int code = RPC_OK;
    int rc = rp_replay_round(q->e->wc, L, f, (uint64_t)v, own, k->own_lease[i], (uint64_t)len * 4 - 1, k->stage + off,
                             k->ustage + off, len, NULL, &bytes, &crc, &code);
    if (rc == 1 && crc) {
      DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 " version %" PRId64 " replayed from its round (%zu bytes)",
               L->lease_id, f->fragment_id, v, bytes);
      return 1;
    }
    if (rc == 1) {
      DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 " version %" PRId64 ": no checksum to check its replay against; "
               "pulling it whole", L->lease_id, f->fragment_id, v);
      return 0;
    }
    if (atomic_load(&q->fquit) || hb_abort(q->e->hb) != AB_NONE) return 0;
    if (rc == RP_NOT_YET) { /* the round is still closing */
      worker_sleep_ns(pause * 1000000);
      if (pause < WAIT_MAX_MS) pause = pause * 2 > WAIT_MAX_MS ? WAIT_MAX_MS : pause * 2;
      continue;
    }
    if (rc == 0 || wc_classify(rc, code) != WC_RETRY || ++attempt >= TRANSFER_ATTEMPTS) return 0;
    worker_sleep_ns(worker_backoff_ms(attempt, q->e->seed) * 1000000);
  }
}

/* The prefetch of version v of fragment i into keep->stage: replayed, or pulled whole (then,
 * for replay, with u_v into keep->ustage, so that the next version can be replayed). */
static int fetch_version(pusher *q, size_t i, int64_t v, stream_keep *k) {
  const size_t off = q->p->abs_off[i];
  if (q->rp && fetch_replay(q, i, v, k)) {
    pthread_mutex_lock(&q->mu);
    q->fu[i] = 1;
    pthread_mutex_unlock(&q->mu);
    return 0;
  }
  enum wc_class cls = WC_OK;
  int rc = pull_version(q->e, q->L, i, v, DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS, k->stage + off, &cls, &q->fquit);
  if (!rc && q->rp && stream_wants_u(q->L) &&
      pull_version(q->e, q->L, i, v, DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM, k->ustage + off, &cls, &q->fquit) == 0) {
    pthread_mutex_lock(&q->mu);
    q->fu[i] = 1;
    pthread_mutex_unlock(&q->mu);
  }
  return rc;
}

static void *fetch_main(void *arg) {
  pusher *q = arg;
  stream_keep *k = q->e->keep;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (!atomic_load(&q->fquit) && q->fhead == q->ftail) pthread_cond_wait(&q->cv, &q->mu);
    if (atomic_load(&q->fquit)) break;
    size_t i = (size_t)q->fq[q->fhead++ % (2 * q->L->n_fragments)];
    if (q->fhead == q->ftail) q->fhead = q->ftail = 0;
    int64_t v = q->fver[i];
    if (v < 0 || q->fstate[i] != 0) continue;
    pthread_mutex_unlock(&q->mu);
    int rc = fetch_version(q, i, v, k);
    pthread_mutex_lock(&q->mu);
    if (q->fver[i] == v) q->fstate[i] = rc ? (rc < 0 ? rc : DPC_EIO) : 1;
    pthread_cond_broadcast(&q->cv);
  }
  /* Stopping: whatever is still pending fails, so that nobody waits for it. */
  for (size_t i = 0; i < q->L->n_fragments; i++)
    if (q->fver[i] >= 0 && q->fstate[i] == 0) q->fstate[i] = DPC_ECANCELED;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

static void *push_main(void *arg) {
  pusher *q = arg;
  pthread_mutex_lock(&q->mu);
  for (;;) {
    while (!q->quit && q->head == q->tail) pthread_cond_wait(&q->cv, &q->mu);
    if (q->head == q->tail) break; /* quit with nothing queued */
    size_t i = (size_t)q->queue[q->head++];
    q->busy = 1;
    int failed = q->rc != 0;
    pthread_mutex_unlock(&q->mu);
    int rc = failed ? 0 : push_one(q, i);
    pthread_mutex_lock(&q->mu);
    if (rc && !q->rc) q->rc = rc;
    q->busy = 0;
    pthread_cond_broadcast(&q->cv);
  }
  pthread_mutex_unlock(&q->mu);
  return NULL;
}

static void push_enqueue(pusher *q, size_t i) {
  pthread_mutex_lock(&q->mu);
  q->queue[q->tail++] = (int)i;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

/* Wait until every queued push is acknowledged (or one failed); its rc. */
static int push_drain(pusher *q) {
  pthread_mutex_lock(&q->mu);
  while (!q->rc && (q->head != q->tail || q->busy)) pthread_cond_wait(&q->cv, &q->mu);
  int rc = q->rc;
  pthread_mutex_unlock(&q->mu);
  return rc;
}

static int push_failed(pusher *q) {
  pthread_mutex_lock(&q->mu);
  int rc = q->rc;
  pthread_mutex_unlock(&q->mu);
  return rc;
}

/* ------------------------------------------------------------------ the lease */

typedef struct {
  stream_env *e;
  const Dipaco__V1__Lease *L;
  const lease_plan *p;
  pusher q;
  uint64_t end;          /* the lease's last step n = first_step + H */
  int defer_last;        /* push the last step's deltas after the inner state (checkpoint) */
  int rc;                /* first failure inside the step callback */
  enum wc_class cls;
  int64_t wait_ms;       /* time spent waiting for global versions */
} stream_lease;

static int stopped(stream_lease *x) { return worker_stopping(x->e->ctl) || hb_abort(x->e->hb) != AB_NONE; }

/* pull_version on the lease's own thread, its wait counted. */
static int pull_wait(stream_lease *x, size_t i, int64_t v, int payload, float *dst) {
  int64_t t0 = dpc_mono_ms();
  int rc = pull_version(x->e, x->L, i, v, payload, dst, &x->cls, NULL);
  x->wait_ms += dpc_mono_ms() - t0;
  return rc;
}

/* Global version v of fragment i into keep->global: held already, prefetched (waiting for the
 * prefetch if it is on its way), or pulled now. */
static int ensure_global(stream_lease *x, size_t i, int64_t v) {
  stream_keep *k = x->e->keep;
  if (k->have_ver[i] == v) return 0;
  pusher *q = &x->q;
  size_t off = x->p->abs_off[i], len = (size_t)x->L->fragments[i]->num_floats;
  if (q->frunning) {
    int64_t t0 = dpc_mono_ms();
    pthread_mutex_lock(&q->mu);
    int got = 0;
    if (q->fver[i] == v) {
      while (q->fstate[i] == 0) pthread_cond_wait(&q->cv, &q->mu);
      if (q->fstate[i] == 1) {
        memcpy(k->global + off, k->stage + off, len * sizeof(float));
        got = 1;
        if (q->rp && q->fu[i]) memcpy(k->u + off, k->ustage + off, len * sizeof(float));
        if (q->rp) k->have_u[i] = q->fu[i] ? v : -1;
      }
      q->fver[i] = -1;
    }
    pthread_mutex_unlock(&q->mu);
    x->wait_ms += dpc_mono_ms() - t0;
    if (got) {
      k->have_ver[i] = v;
      return 0;
    }
  }
  k->have_ver[i] = -1; /* the buffer may be half written until the pull completes */
  if (k->have_u) k->have_u[i] = -1;
  int rc = pull_wait(x, i, v, DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS, k->global + off);
  if (rc == 0) k->have_ver[i] = v;
  if (rc == 0 && k->have_u && stream_wants_u(x->L) &&
      pull_wait(x, i, v, DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM, k->u + off) == 0)
    k->have_u[i] = v;
  return rc;
}

/* ---- eager updates (docs/design.md §3): the eager base E_v = G_v + (1 + μ)(G_v − G_{v−1})
 * + η·μ·u_v — the global the coordinator would make next if the next mean delta equalled the
 * last one — with E_0 = G_0; `prev` holds G_{v−1} (v > 0), `g` G_v. */
static void eager_base_of(stream_lease *x, float *E, const float *g, const float *prev, const float *u, size_t len,
                          int64_t v) {
  const float mu = x->L->outer_momentum, c1 = 1.0f + mu, c2 = x->L->outer_lr * mu;
  if (v == 0) {
    memcpy(E, g, len * sizeof *E);
    return;
  }
  for (size_t k = 0; k < len; k++) E[k] = g[k] + c1 * (g[k] - prev[k]) + c2 * u[k];
}

/* E at version v of fragment i into keep->eager_base (pulling G_{v−1}, G_v and u_v). */
static int ensure_eager(stream_lease *x, size_t i, int64_t v) {
  stream_keep *k = x->e->keep;
  if (k->have_e[i] == v) return 0;
  size_t off = x->p->abs_off[i], len = (size_t)x->L->fragments[i]->num_floats;
  float *E = k->eager_base + off, *prev = k->scratch + off;
  int rc = 0;
  if (v > 0 && k->have_ver[i] == v - 1) memcpy(prev, k->global + off, len * sizeof *prev); /* the usual case */
  else if (v > 0) rc = pull_wait(x, i, v - 1, DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS, prev);
  k->have_e[i] = -1;
  if (!rc && v > 0) rc = pull_wait(x, i, v, DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM, E); /* u_v, for now */
  if (!rc) rc = ensure_global(x, i, v);
  if (rc) return rc;
  eager_base_of(x, E, k->global + off, prev, E, len, v);
  k->have_e[i] = v;
  return 0;
}

/* Eager, at fragment i's sync against version `base` (its delta d in slots->delta): the
 * estimate of version base + 1, ĝ = E_base − η(1 + μ)·(d̂ − d̂_prev)/R (d̂: the delta as the
 * coordinator decodes it), merged at once: local ← α·local + (1 − α)·ĝ. */
static int eager_step(stream_lease *x, size_t i, int64_t base) {
  stream_keep *k = x->e->keep;
  const Dipaco__V1__Lease *L = x->L;
  size_t off = x->p->abs_off[i], len = (size_t)L->fragments[i]->num_floats;
  int rc = ensure_eager(x, i, base);
  if (rc) return rc;
  const float *d = x->e->slots->delta + off;
  float *dd = k->scratch + off, *prev = k->eager_prev + off, *est = k->eager_est + off, *l = x->e->slots->theta + off;
  const float *E = k->eager_base + off;
  if (L->delta_codec == DIPACO__V1__CODEC__CODEC_FP32) {
    memcpy(dd, d, len * sizeof *dd);
  } else { /* what the coordinator will average */
    size_t bytes = 0;
    unsigned char *enc = NULL;
    rc = dpc_codec_bytes((int)L->delta_codec, len, L->delta_block_floats, &bytes);
    if (!rc && !(enc = malloc(bytes ? bytes : 1))) rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
    if (!rc) rc = dpc_codec_encode((int)L->delta_codec, d, len, L->delta_block_floats, enc);
    if (!rc) rc = dpc_codec_decode((int)L->delta_codec, enc, bytes, len, L->delta_block_floats, dd);
    free(enc);
    if (rc) return rc;
  }
  const float R = (float)x->p->opts.n_replicas, c1 = (float)((double)L->outer_lr * (1.0 + (double)L->outer_momentum));
  const float a = L->fragments[i]->merge_alpha, b = 1.0f - a;
  if ((rc = trainer_get_params(x->e->slots->tr, l, off, len))) return rc;
  for (size_t j = 0; j < len; j++) {
    const float corr = (dd[j] - prev[j]) / R;
    est[j] = E[j] - c1 * corr;
    l[j] = a == 0.0f ? est[j] : a * l[j] + b * est[j];
    prev[j] = dd[j];
  }
  k->est_ver[i] = base + 1;
  return trainer_set_params(x->e->slots->tr, l, off, len);
}

/* Step n syncs fragment i: delta = global − local into slots->delta, queued for the pusher. */
static int do_sync(stream_lease *x, size_t i, uint64_t n, int enqueue) {
  const Dipaco__V1__Lease *L = x->L;
  const Dipaco__V1__FragmentInfo *f = L->fragments[i];
  int64_t base = stream_version_after(n, f->sync_offset, L->inner_steps) - 1;
  if (base != (int64_t)f->version)
    return dpc_err(DPC_EFORMAT, "lease %" PRIu64 ": fragment %" PRIu64 " syncs at step %" PRIu64 " against version %" PRId64
                   ", but the lease names base version %" PRIu64, L->lease_id, f->fragment_id, n, base, f->version);
  int rc = ensure_global(x, i, base);
  if (rc) return rc;
  size_t off = x->p->abs_off[i], len = (size_t)f->num_floats;
  float *d = x->e->slots->delta + off;
  const float *g = x->e->keep->global + off;
  if ((rc = trainer_get_params(x->e->slots->tr, d, off, len))) return rc;
  for (size_t k = 0; k < len; k++) d[k] = g[k] - d[k];
  if (L->eager && (rc = eager_step(x, i, base))) return rc; /* reads d before the push thread may send it */
  if (x->q.rp) { /* what the coordinator will average of it, for replaying version base + 1 */
    stream_keep *k = x->e->keep;
    k->own_ver[i] = rp_decode_own(L, d, len, k->own + off) == 0 ? base + 1 : -1;
    k->own_lease[i] = L->lease_id;
  }
  if (enqueue) push_enqueue(&x->q, i);
  /* The version this delta helps make comes back to the merge τ steps on: fetch it meanwhile
   * (the fetch waits while the round closes). A merge in the next lease fetches it there. */
  if (n + f->overlap_steps < x->end) fetch_enqueue(&x->q, i, base + 1);
  return 0;
}

/* Step n merges fragment i's global version made by its sync at step m = n − τ. */
static int do_merge(stream_lease *x, size_t i, uint64_t m) {
  const Dipaco__V1__FragmentInfo *f = x->L->fragments[i];
  stream_keep *k = x->e->keep;
  int64_t v = stream_version_after(m, f->sync_offset, x->L->inner_steps);
  /* Eager: the next eager base needs G_{v−1}, which the global buffer still holds. */
  int rc = x->L->eager ? ensure_eager(x, i, v) : ensure_global(x, i, v);
  if (rc) return rc;
  size_t off = x->p->abs_off[i], len = (size_t)f->num_floats;
  if (x->L->eager && k->est_ver[i] == v) { /* swap the estimate for the truth, keep the steps since */
    float *l = x->e->slots->theta + off;
    const float *g = k->global + off, *est = k->eager_est + off, b = 1.0f - f->merge_alpha;
    if ((rc = trainer_get_params(x->e->slots->tr, l, off, len))) return rc;
    for (size_t j = 0; j < len; j++) l[j] += b * (g[j] - est[j]);
    k->est_ver[i] = -1;
    return trainer_set_params(x->e->slots->tr, l, off, len);
  }
  float *l = x->e->slots->theta + off; /* scratch: streaming keeps its globals in keep->global */
  const float *g = x->e->keep->global + off;
  const float a = f->merge_alpha, b = 1.0f - a;
  if (a == 0.0f) return trainer_set_params(x->e->slots->tr, g, off, len);
  if ((rc = trainer_get_params(x->e->slots->tr, l, off, len))) return rc;
  for (size_t k = 0; k < len; k++) l[k] = a * l[k] + b * g[k];
  return trainer_set_params(x->e->slots->tr, l, off, len);
}

/* The merges due after step n (their sync was at m = n − τ ≥ 1). */
static int merges_at(stream_lease *x, uint64_t n) {
  const Dipaco__V1__Lease *L = x->L;
  for (size_t i = 0; i < L->n_fragments; i++) {
    const Dipaco__V1__FragmentInfo *f = L->fragments[i];
    if (n < (uint64_t)f->overlap_steps + 1) continue;
    uint64_t m = n - f->overlap_steps;
    if (!stream_sync_due(m, f->sync_offset, L->inner_steps)) continue;
    int rc = do_merge(x, i, m);
    if (rc) return rc;
  }
  return 0;
}

static int on_step(void *ctx, long s, int h, float loss, float lr) {
  stream_lease *x = ctx;
  const Dipaco__V1__Lease *L = x->L;
  int stop = hb_on_step(x->e->hb, s, h, loss, lr);
  const uint64_t n = (uint64_t)s + 1;
  int rc = push_failed(&x->q);
  for (size_t i = 0; i < L->n_fragments && !rc; i++)
    if (stream_sync_due(n, L->fragments[i]->sync_offset, L->inner_steps))
      rc = do_sync(x, i, n, !(x->defer_last && n == x->end));
  /* The last step's merges belong to the next lease (stream.h). */
  if (!rc && n < x->end) rc = merges_at(x, n);
  if (rc) {
    x->rc = rc;
    if (x->cls == WC_OK) x->cls = WC_FATAL;
    return 1;
  }
  return stop;
}

/* Size keep for L's slot; 1 if it holds the slot's state at L's first step (a continuation). */
static int keep_fit(stream_keep *k, const Dipaco__V1__Lease *L, size_t n_params, int *cont) {
  int same = k->valid && k->job == L->job_id && k->path == L->slot->path && k->replica == L->slot->replica &&
             k->step == L->first_step && k->n_params == n_params && k->nf == L->n_fragments;
  for (size_t i = 0; same && i < k->nf; i++) same = k->frag_ids[i] == L->fragments[i]->fragment_id;
  *cont = same;
  if (same) return 0;
  stream_keep_free(k);
  k->n_params = n_params;
  k->nf = L->n_fragments;
  k->frag_ids = malloc(k->nf * sizeof *k->frag_ids);
  k->local = malloc(n_params * sizeof *k->local);
  k->global = malloc(n_params * sizeof *k->global);
  k->have_ver = malloc(k->nf * sizeof *k->have_ver);
  k->stage = malloc(n_params * sizeof *k->stage);
  if (L->eager) { /* a fresh start knows no previous delta: zero */
    k->eager_prev = calloc(n_params, sizeof *k->eager_prev);
    k->eager_est = malloc(n_params * sizeof *k->eager_est);
    k->eager_base = malloc(n_params * sizeof *k->eager_base);
    k->scratch = malloc(n_params * sizeof *k->scratch);
    k->have_e = malloc(k->nf * sizeof *k->have_e);
    k->est_ver = malloc(k->nf * sizeof *k->est_ver);
  }
  if (stream_rp(L)) {
    k->u = malloc(n_params * sizeof *k->u);
    k->ustage = malloc(n_params * sizeof *k->ustage);
    k->own = malloc(n_params * sizeof *k->own);
    k->have_u = malloc(k->nf * sizeof *k->have_u);
    k->own_ver = malloc(k->nf * sizeof *k->own_ver);
    k->own_lease = calloc(k->nf, sizeof *k->own_lease);
  }
  if (!k->frag_ids || !k->local || !k->global || !k->have_ver || !k->stage ||
      (L->eager && (!k->eager_prev || !k->eager_est || !k->eager_base || !k->scratch || !k->have_e || !k->est_ver)) ||
      (stream_rp(L) && (!k->u || !k->ustage || !k->own || !k->have_u || !k->own_ver || !k->own_lease))) {
    stream_keep_free(k);
    return dpc_err(DPC_ENOMEM, "worker: out of memory for the streaming state");
  }
  for (size_t i = 0; i < k->nf; i++) {
    k->frag_ids[i] = L->fragments[i]->fragment_id;
    k->have_ver[i] = -1;
    if (L->eager) k->have_e[i] = k->est_ver[i] = -1;
    if (stream_rp(L)) k->have_u[i] = k->own_ver[i] = -1;
  }
  k->job = L->job_id;
  k->path = L->slot->path;
  k->replica = L->slot->replica;
  return 0;
}

/* A slot this worker does not hold: its local parameters start as the global ones at the
 * lease's base versions (waiting for any not made yet). */
static int fresh_start(stream_lease *x) {
  const Dipaco__V1__Lease *L = x->L;
  stream_keep *k = x->e->keep;
  DPC_INFO("lease %" PRIu64 ": streaming slot (%u,%u) starts at step %" PRIu64 " from the global parameters", L->lease_id,
           L->slot->path, L->slot->replica, L->first_step);
  for (size_t i = 0; i < L->n_fragments; i++) {
    int rc = ensure_global(x, i, (int64_t)L->fragments[i]->version);
    if (rc) return rc;
  }
  memcpy(k->local, k->global, k->n_params * sizeof *k->local);
  return 0;
}

static int pusher_start(pusher *q, stream_env *e, const Dipaco__V1__Lease *L, const lease_plan *p) {
  memset(q, 0, sizeof *q);
  q->e = e;
  q->L = L;
  q->p = p;
  q->queue = malloc(L->n_fragments * sizeof *q->queue);
  q->res = malloc(L->n_fragments * sizeof *q->res);
  if (!q->queue || !q->res) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  q->fq = malloc(2 * L->n_fragments * sizeof *q->fq);
  q->fver = malloc(L->n_fragments * sizeof *q->fver);
  q->fstate = calloc(L->n_fragments, sizeof *q->fstate);
  if (!q->fq || !q->fver || !q->fstate) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  q->rp = stream_rp(L) && e->keep->have_u != NULL;
  q->fbase = malloc(L->n_fragments * sizeof *q->fbase);
  q->fubase = malloc(L->n_fragments * sizeof *q->fubase);
  q->fu = calloc(L->n_fragments, sizeof *q->fu);
  if (!q->fbase || !q->fubase || !q->fu) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  for (size_t i = 0; i < L->n_fragments; i++) {
    q->res[i] = -1;
    q->fver[i] = -1;
  }
  atomic_init(&q->fquit, 0);
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  q->inited = 1;
  if (pthread_create(&q->th, NULL, push_main, q) != 0) return dpc_err(DPC_EIO, "worker: cannot start the push thread");
  q->running = 1;
  if (pthread_create(&q->fth, NULL, fetch_main, q) != 0) return dpc_err(DPC_EIO, "worker: cannot start the fetch thread");
  q->frunning = 1;
  return 0;
}

static void pusher_stop(pusher *q) {
  if (q->running) {
    pthread_mutex_lock(&q->mu);
    q->quit = 1;
    if (!q->rc) q->rc = q->head == q->tail ? 0 : DPC_ECANCELED; /* drop what is still queued */
    q->head = q->tail;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
  }
  if (q->frunning) {
    pthread_mutex_lock(&q->mu);
    atomic_store(&q->fquit, 1);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->fth, NULL);
  }
  if (q->inited) {
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
  }
  free(q->queue);
  free(q->res);
  free(q->fq);
  free(q->fver);
  free(q->fstate);
  free(q->fbase);
  free(q->fubase);
  free(q->fu);
  q->fbase = q->fubase = NULL;
  q->fu = NULL;
  q->queue = NULL;
  q->res = NULL;
  q->fq = NULL;
  q->fver = NULL;
  q->fstate = NULL;
  q->running = q->frunning = q->inited = 0;
}

int stream_run(stream_env *e, const Dipaco__V1__Lease *L, const lease_plan *p, trainer_stats *st, enum wc_class *cls) {
  stream_lease x;
  memset(&x, 0, sizeof x);
  memset(st, 0, sizeof *st);
  x.e = e;
  x.L = L;
  x.p = p;
  x.end = L->first_step + L->inner_steps;
  x.defer_last = L->inner_state == DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_CHECKPOINT;
  stream_keep *k = e->keep;
  int cont = 0;
  int rc = keep_fit(k, L, p->n_params, &cont);
  if (!rc && !cont && L->inner_state == DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_CHECKPOINT &&
      L->has_inner_checkpoint) {
    /* Exactly where the slot's last lease ended: moments and local parameters. */
    rc = slot_resume_checkpoint(e->slots, e->wc, e->ctl, e->seed, L, p, k->local);
    if (!rc)
      DPC_INFO("lease %" PRIu64 ": resumed the streaming slot (%u,%u) at step %" PRIu64 " from its checkpoint",
               L->lease_id, L->slot->path, L->slot->replica, L->first_step);
  } else if (!rc && !cont) {
    rc = fresh_start(&x);
  }
  if (!rc) rc = trainer_set_params(e->slots->tr, k->local, 0, k->n_params);
  k->valid = 0; /* until the lease completes, the kept state is in flux */
  if (!rc) rc = pusher_start(&x.q, e, L, p);
  for (size_t i = 0; i < L->n_fragments && !rc; i++) /* a continuing slot's pending merges */
    if (k->have_ver[i] != (int64_t)L->fragments[i]->version) fetch_enqueue(&x.q, i, (int64_t)L->fragments[i]->version);
  /* Merges due at the first step (the previous lease's last step). */
  if (!rc && L->first_step > 0) rc = merges_at(&x, L->first_step);
  if (!rc) {
    hb_mark(e->hb);
    trainer_set_sched_shift(e->slots->tr, 0);
    rc = trainer_train(e->slots->tr, (long)L->first_step, (int)L->inner_steps, st, on_step, &x);
    if (!rc && x.rc) rc = x.rc;
  }
  hb_poke(e->hb);
  int complete = !rc && st->steps_done == (int)L->inner_steps;
  if (complete) {
    hb_set_tokens(e->hb, (uint64_t)st->tokens);
    if (x.defer_last) {
      int code = RPC_OK;
      for (int attempt = 0;; attempt++) { /* inner state (moments + local parameters), then the last deltas */
        rc = slot_push_inner(e->slots, e->wc, L, p, NULL, &code);
        enum wc_class c = wc_classify(rc, code);
        if (!rc || c != WC_RETRY || attempt + 1 >= TRANSFER_ATTEMPTS || stopped(&x)) {
          x.cls = c;
          break;
        }
        worker_sleep_ns(worker_backoff_ms(attempt, e->seed) * 1000000);
      }
      for (size_t i = 0; i < L->n_fragments && !rc; i++)
        if (stream_sync_due(x.end, L->fragments[i]->sync_offset, L->inner_steps)) push_enqueue(&x.q, i);
    }
    int64_t t0 = dpc_mono_ms();
    if (!rc) rc = push_drain(&x.q);
    if (rc && x.q.cls != WC_OK) x.cls = x.q.cls;
    if (!rc)
      DPC_INFO("lease %" PRIu64 " streamed %d steps in %.2f s: loss %.4f -> %.4f, pushed %" PRIu64 " bytes (%s), "
               "%d fragment delta(s) through the object store, waited %" PRId64 " ms for global fragments, %" PRId64
               " ms for the last pushes", L->lease_id, st->steps_done, st->seconds, st->first_loss, st->last_loss,
               x.q.sent, dpc_codec_name((int)L->delta_codec), x.q.puts, x.wait_ms, dpc_mono_ms() - t0);
  }
  pusher_stop(&x.q);
  if (complete && !rc) {
    rc = trainer_get_params(e->slots->tr, k->local, 0, k->n_params);
    if (!rc) {
      k->step = x.end;
      k->valid = 1;
    }
  }
  *cls = rc ? (x.cls != WC_OK ? x.cls : WC_FATAL) : WC_OK;
  return rc;
}
