/* replay.c — replay pulls: catch up on a fragment's base version from the rounds' deltas as
 * sent, bit for bit as the coordinator's outer step made it (replay.h, docs/design.md §4.4). */
#include "worker/replay.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/rpc.h"
#include "kernels/gpt.h"
#include "kernels/outer.h"
#include "worker/sparseloco.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* The most deltas one round can hold (a fragment held by every path of a job). */
#define RP_MAX_ROUND_DELTAS 65536u
/* PAYLOAD_REPLAY_ROUND: [u32 n][u32 the version's CRC-32C], then n entries of f64 weight, u64
 * bytes, u32 codec, u32 block_floats. */
#define RP_HEAD_BYTES 8u
#define RP_ENTRY_BYTES 24u

static void own_drop(rp_cache *c) {
  for (size_t i = 0; i < c->n_own; i++) free(c->own[i].dec);
  free(c->own);
  c->own = NULL;
  c->n_own = 0;
}

void rp_forget_held(rp_cache *c) {
  for (int i = 0; i < c->n_held; i++) free(c->held[i].u);
  c->n_held = 0;
  c->held_job = 0;
}

void rp_cache_free(rp_cache *c) {
  rp_forget_held(c);
  own_drop(c);
}

int rp_lease_replays(const Dipaco__V1__Lease *L) {
  /* (a SparseLoCo lease without outer momentum replays with sparse pulls: sparseloco.h) */
  return L->replay_pull && !L->streaming && !(L->delta_codec == (Dipaco__V1__Codec)DPC_CODEC_SPARSE && L->sparse_pull);
}

static uint64_t get_le(const unsigned char *b, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

/* The entry of theta's range [off, off + len) for fragment_id, or NULL. */
static rp_held *held_find(rp_cache *c, uint64_t fragment_id, size_t off, size_t len) {
  for (int j = 0; j < c->n_held; j++)
    if (c->held[j].fragment_id == fragment_id && c->held[j].off == off && c->held[j].len == len) return &c->held[j];
  return NULL;
}

/* Check round b[blen]'s table for fragment length len: its entry count, or a DPC_E* code. An
 * entry of bytes 0 is the worker's own delta (own, which must be there). */
static int64_t check_table(const unsigned char *b, size_t blen, size_t len, const float *own, const rp_sparse *sp) {
  uint64_t n = blen >= 4 ? get_le(b, 4) : 0, skipped = 0, sum = 0;
  if (n < 1 || n > RP_MAX_ROUND_DELTAS || blen < RP_HEAD_BYTES + n * RP_ENTRY_BYTES)
    return dpc_err(DPC_EFORMAT, "replay round: %" PRIu64 " deltas in %zu bytes", n, blen);
  for (uint64_t i = 0; i < n; i++) {
    const unsigned char *e = b + RP_HEAD_BYTES + i * RP_ENTRY_BYTES;
    uint64_t bytes = get_le(e + 8, 8);
    int codec = (int)get_le(e + 16, 4);
    uint32_t block = (uint32_t)get_le(e + 20, 4);
    size_t want = 0;
    if (bytes == 0) {
      skipped++;
      continue;
    }
    if (codec == DPC_CODEC_SPARSE ? !sp || dpc_sparse_bytes(&sp->cfg, sp->tlen, sp->nt, &want, NULL) < 0
                                  : dpc_codec_bytes(codec, len, block, &want) < 0)
      want = 0;
    if (want == 0 || want != bytes)
      return dpc_err(DPC_EFORMAT, "replay round: delta %" PRIu64 " is %" PRIu64 " bytes of codec %s (block %u), "
                     "not a stream of %zu floats", i, bytes, dpc_codec_name(codec), block, len);
    sum += bytes;
  }
  if (skipped > 1 || (skipped && !own) || blen != RP_HEAD_BYTES + n * RP_ENTRY_BYTES + sum)
    return dpc_err(DPC_EFORMAT, "replay round: %" PRIu64 " deltas (%" PRIu64 " left out%s) in %zu bytes", n, skipped,
                   skipped && !own ? ", and this worker has no delta of its own for it" : "", blen);
  return (int64_t)n;
}

/* How many floats of every stream a replay decodes at a time (rounded to whole blocks): the
 * worker holds n × this many, not n whole fragments, and the outer functions stay below their
 * OpenMP threshold (kernels/outer.c), so a replay on the streaming prefetcher's thread does not
 * take the training threads' cores. */
#define RP_RANGE_FLOATS ((size_t)1 << 12)

/* One round's PAYLOAD_REPLAY_ROUND bytes applied to theta[len] and u[len] as the coordinator's
 * outer step applied them (coordinator/outerio.c: each stream decoded with dpc_codec_decode or
 * dpc_sparse_decode, outer_average with the weights served, outer_nesterov_step with the lease's
 * outer rule at step v - 1 of its momentum schedule). Dense streams are decoded range by range,
 * whole blocks at a time; every output element depends on the same element of the inputs only,
 * so this is the whole-array step bit for bit (as the coordinator's own ranges are). Sparse
 * streams are decoded whole. */
static int apply_round(const Dipaco__V1__Lease *L, uint64_t v, const unsigned char *b, size_t blen, const float *own,
                       float *theta, float *u, size_t len, const rp_sparse *sp) {
  /* The step that made version v was step v - 1 of the momentum schedule. */
  const float mu = outer_momentum_at(L->outer_momentum, (long)v - 1, (long)L->outer_rounds,
                                     (long)L->outer_momentum_warmup, (long)L->outer_momentum_decay);
  int64_t nn = check_table(b, blen, len, own, sp);
  if (nn < 0) return (int)nn;
  const size_t n = (size_t)nn;
  const unsigned char **st = malloc(n * sizeof *st);
  int *codec = malloc(n * sizeof *codec);
  uint32_t *block = malloc(n * sizeof *block);
  double *w = malloc(n * sizeof *w);
  const float **dp = malloc(n * sizeof *dp);
  int rc = st && codec && block && w && dp ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory for a replay round");
  size_t range = RP_RANGE_FLOATS, blk = 0;
  const unsigned char *next = b + RP_HEAD_BYTES + n * RP_ENTRY_BYTES;
  for (size_t i = 0; i < n && !rc; i++) {
    const unsigned char *e = b + RP_HEAD_BYTES + i * RP_ENTRY_BYTES;
    uint64_t wb = get_le(e, 8), bytes = get_le(e + 8, 8);
    memcpy(&w[i], &wb, 8);
    codec[i] = (int)get_le(e + 16, 4);
    block[i] = (uint32_t)get_le(e + 20, 4);
    st[i] = bytes ? next : NULL; /* NULL: the worker's own */
    next += bytes;
    if (!bytes) continue;
    if (codec[i] == DPC_CODEC_SPARSE) range = len; /* decoded whole */
    else if (dpc_codec_is_block(codec[i]) && block[i] != blk) {
      if (blk) range = len; /* two block sizes: whole */
      blk = block[i];
    }
  }
  if (range < len && blk) range = (range + blk - 1) / blk * blk;
  if (range > len) range = len;
  float *dense = rc ? NULL : malloc(n * range * sizeof(float) + 1), *avg = rc ? NULL : malloc(range * sizeof(float) + 1);
  if (!rc && (!dense || !avg)) rc = dpc_err(DPC_ENOMEM, "worker: out of memory for a replay round");
  for (size_t lo = 0; lo < len && !rc; lo += range) {
    const size_t m = len - lo < range ? len - lo : range;
    for (size_t i = 0; i < n && !rc; i++) {
      if (!st[i]) {
        dp[i] = own + lo;
        continue;
      }
      float *d = dense + i * range;
      dp[i] = d;
      if (codec[i] == DPC_CODEC_SPARSE) {
        size_t sb = 0;
        rc = dpc_sparse_bytes(&sp->cfg, sp->tlen, sp->nt, &sb, NULL);
        if (!rc) rc = dpc_sparse_decode(&sp->cfg, sp->tlen, sp->nt, st[i], sb, d);
        continue;
      }
      size_t at = 0, nb = 0; /* the range's bytes: lo is whole blocks in */
      rc = dpc_codec_bytes(codec[i], lo, block[i], &at);
      if (!rc) rc = dpc_codec_bytes(codec[i], m, block[i], &nb);
      if (!rc) rc = dpc_codec_decode(codec[i], st[i] + at, nb, m, block[i], d);
    }
    if (!rc) rc = outer_average(dp, w, (int)n, m, avg);
    if (!rc) outer_nesterov_step(theta + lo, u + lo, avg, m, L->outer_lr, mu, L->outer_nesterov);
  }
  free(dense);
  free(avg);
  free(st);
  free(codec);
  free(block);
  free(dp);
  free(w);
  return rc;
}

static int whole_marked(const rp_cache *c, uint64_t job, uint64_t fid) {
  for (int k = 0; c->whole_job == job && k < c->n_whole; k++)
    if (c->whole[k] == fid) return 1;
  return 0;
}

static void whole_mark(rp_cache *c, uint64_t job, uint64_t fid) {
  if (c->whole_job != job) c->n_whole = 0;
  c->whole_job = job;
  if (!whole_marked(c, job, fid) && c->n_whole < RP_HELD_MAX) c->whole[c->n_whole++] = fid;
}

/* This worker's own delta of fragment fid that helps make version v of job, or NULL. */
static const rp_own *own_find(const rp_cache *c, uint64_t job, uint64_t fid, uint64_t v) {
  for (size_t k = 0; k < c->n_own; k++)
    if (c->own[k].job == job && c->own[k].fragment_id == fid && c->own[k].version == v) return &c->own[k];
  return NULL;
}

int rp_replay_round(wclient *wc, const Dipaco__V1__Lease *L, const Dipaco__V1__FragmentInfo *f, uint64_t v,
                    const float *own, uint64_t own_lease, uint64_t budget, float *th, float *u, size_t len,
                    const rp_sparse *sp, size_t *bytes, uint32_t *crc, int *code) {
  unsigned char *b = NULL;
  size_t blen = 0;
  const size_t max_bytes = RP_HEAD_BYTES + (size_t)RP_MAX_ROUND_DELTAS * RP_ENTRY_BYTES + (size_t)budget;
  *crc = 0;
  int rc = wc_pull_replay_round(wc, L->lease_id, f, v, own ? own_lease : 0, budget, max_bytes, &b, &blen, code);
  if (rc && *code == RPC_FAILED_PRECONDITION && strstr(dpc_errmsg(), "not made yet")) return RP_NOT_YET;
  if (rc && *code == RPC_RESOURCE_EXHAUSTED) {
    DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 ": the round that made version %" PRIu64 " is more bytes than "
             "the fragment (%s); pulling it whole", L->lease_id, f->fragment_id, v, dpc_errmsg());
    *code = RPC_OK;
    return RP_OVER_BUDGET;
  }
  if (rc) {
    if (*code == RPC_NOT_FOUND || *code == RPC_FAILED_PRECONDITION || *code == RPC_INVALID_ARGUMENT ||
        *code == RPC_RESOURCE_EXHAUSTED || *code == RPC_OK) {
      DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 ": no replay of the round that made version %" PRIu64
               " (%s); pulling it whole", L->lease_id, f->fragment_id, v, dpc_errmsg());
      *code = RPC_OK;
      return 0;
    }
    return rc;
  }
  *bytes += blen;
  *crc = (uint32_t)get_le(b + 4, 4);
  rc = apply_round(L, v, b, blen, own, th, u, len, sp);
  free(b);
  if (rc < 0) {
    DPC_WARN("lease %" PRIu64 ": fragment %" PRIu64 ": the round that made version %" PRIu64 " is unusable: %s; "
             "pulling it whole", L->lease_id, f->fragment_id, v, dpc_errmsg());
    return 0;
  }
  if (*crc && dpc_crc32c(0, th, len * sizeof(float)) != *crc) {
    DPC_WARN("lease %" PRIu64 ": fragment %" PRIu64 " replayed to version %" PRIu64 " does not match version %" PRIu64
             "'s checksum; pulling it whole", L->lease_id, f->fragment_id, v, v);
    return 0;
  }
  return 1;
}

/* Replay rounds h->version + 1 .. f->version of fragment f into th[len] and uu[len]: 1 done, 0
 * to pull whole (logged), or a DPC_E* code with *code for a transfer to retry. */
static int replay_rounds(rp_cache *c, wclient *wc, const Dipaco__V1__Lease *L, const Dipaco__V1__FragmentInfo *f,
                         const rp_held *h, float *th, float *uu, size_t len, const rp_sparse *sp, size_t *bytes,
                         int *code) {
  const uint64_t full = (uint64_t)len * 4;
  size_t spent = 0;
  for (uint64_t v = h->version + 1; v <= f->version; v++) {
    const rp_own *own = own_find(c, L->job_id, f->fragment_id, v);
    if (spent + 1 >= full) { /* (a replay must be strictly smaller than the whole fragment) */
      DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 ": replaying to version %" PRIu64 " would pull more than the "
               "fragment (%" PRIu64 " bytes); pulling it whole", L->lease_id, f->fragment_id, f->version, full);
      return 0;
    }
    uint32_t crc;
    int rc = rp_replay_round(wc, L, f, v, own && own->len == len ? own->dec : NULL, own ? own->lease : 0,
                             full - spent - 1, th, uu, len, sp, &spent, &crc, code);
    if (rc == RP_OVER_BUDGET && v == h->version + 1) whole_mark(c, L->job_id, f->fragment_id); /* one round is */
    if (rc == RP_NOT_YET)
      DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 ": version %" PRIu64 " is not made yet; pulling it whole",
               L->lease_id, f->fragment_id, v);
    if (rc != 1) return rc == RP_NOT_YET || rc == RP_OVER_BUDGET ? 0 : rc;
  }
  *bytes += spent;
  return 1;
}

int rp_try_pull(rp_cache *c, wclient *wc, const Dipaco__V1__Lease *L, const lease_plan *p, size_t i, float *theta,
                size_t *bytes, int *code) {
  const Dipaco__V1__FragmentInfo *f = L->fragments[i];
  const size_t off = p->abs_off[i], len = (size_t)f->num_floats;
  *code = RPC_OK;
  if (!rp_lease_replays(L)) return 0;
  rp_held *h = c->held_job == L->job_id && c->held_n == p->n_params ? held_find(c, f->fragment_id, off, len) : NULL;
  const char *why = whole_marked(c, L->job_id, f->fragment_id) ? "its rounds are larger than the fragment"
                    : !h                         ? "this worker holds no earlier version of it"
                    : h->version > f->version  ? "it holds a later version"
                    : !f->crc32c               ? "the lease names no checksum to check a replay against"
                                               : NULL;
  if (why) {
    DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 " version %" PRIu64 ": pulling it whole: %s", L->lease_id,
             f->fragment_id, f->version, why);
    return 0;
  }
  float *th = malloc(len * sizeof(float) + 1), *uu = calloc(len + 1, sizeof(float));
  if (!th || !uu) {
    free(th);
    free(uu);
    return 0;
  }
  memcpy(th, theta + off, len * sizeof(float));
  if (h->u) memcpy(uu, h->u, len * sizeof(float));
  size_t got = 0;
  if (L->outer_momentum != 0.0f && !h->u) {
    /* The outer momentum at the version held, pulled once, when a replay is about to use it
     * (kept as long as the version is: versions.keep_last); carried on by the replays. */
    Dipaco__V1__FragmentInfo fi = *f;
    fi.version = h->version;
    fi.crc32c = 0; /* the lease's checksum is the parameters'; the stream carries its own */
    int rc = wc_pull_payload(wc, L->lease_id, &fi, DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM, uu, &got, code);
    if (rc) {
      free(th);
      free(uu);
      if (*code != RPC_NOT_FOUND && *code != RPC_FAILED_PRECONDITION && *code != RPC_OK) return rc;
      DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 ": no outer momentum at version %" PRIu64 " (%s); pulling "
               "version %" PRIu64 " whole", L->lease_id, f->fragment_id, h->version, dpc_errmsg(), f->version);
      *code = RPC_OK;
      return 0;
    }
  }
  rp_sparse sp = {.nt = 0};
  uint64_t *tlen = NULL;
  if (L->delta_codec == (Dipaco__V1__Codec)DPC_CODEC_SPARSE) { /* the fragment's layout, for its streams */
    tlen = malloc(GPT_MAX_TENSORS * sizeof *tlen);
    sp.nt = tlen ? sl_fragment_layout(L, p, i, &sp.cfg, tlen, GPT_MAX_TENSORS) : DPC_ENOMEM;
    sp.tlen = tlen;
  }
  int rc = sp.nt < 0 ? 0 : replay_rounds(c, wc, L, f, h, th, uu, len, tlen ? &sp : NULL, &got, code);
  free(tlen);
  if (rc == 1 && dpc_crc32c(0, th, len * sizeof(float)) != f->crc32c) {
    DPC_WARN("lease %" PRIu64 ": fragment %" PRIu64 " replayed from version %" PRIu64 " does not match version %" PRIu64
             "'s checksum; pulling it whole", L->lease_id, f->fragment_id, h->version, f->version);
    rc = 0;
  }
  if (rc == 1) { /* only now does theta's range change */
    memcpy(theta + off, th, len * sizeof(float));
    free(h->u);
    h->u = uu;
    uu = NULL;
    if (h->version < f->version)
      DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 " replayed from version %" PRIu64 " to %" PRIu64 " (%zu bytes)",
               L->lease_id, f->fragment_id, h->version, f->version, got);
    h->version = f->version;
    *bytes += got;
  }
  free(th);
  free(uu);
  return rc;
}

void rp_forget_range(rp_cache *c, size_t off, size_t len) {
  int k = 0;
  for (int j = 0; j < c->n_held; j++) {
    rp_held *h = &c->held[j];
    if (h->off < off + len && off < h->off + h->len) {
      free(h->u);
      continue;
    }
    c->held[k++] = *h;
  }
  c->n_held = k;
}

void rp_note_pulled(rp_cache *c, const Dipaco__V1__Lease *L, const lease_plan *p, size_t i) {
  const Dipaco__V1__FragmentInfo *f = L->fragments[i];
  const size_t off = p->abs_off[i], len = (size_t)f->num_floats;
  if (c->held_job != L->job_id || c->held_n != p->n_params) rp_forget_held(c);
  c->held_job = L->job_id;
  c->held_n = p->n_params;
  rp_forget_range(c, off, len); /* every entry the range overwrote */
  if (c->n_held < RP_HELD_MAX && !whole_marked(c, L->job_id, f->fragment_id))
    c->held[c->n_held++] = (rp_held){.fragment_id = f->fragment_id, .version = f->version, .off = off, .len = len};
}

int rp_decode_own(const Dipaco__V1__Lease *L, const float *delta, size_t len, float *out) {
  const int codec = (int)L->delta_codec;
  const uint32_t block = dpc_codec_is_block(codec) ? L->delta_block_floats : 0;
  size_t nb = 0;
  unsigned char *enc = NULL;
  int rc = dpc_codec_bytes(codec, len, block, &nb);
  if (!rc && !(enc = malloc(nb + 1))) rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
  /* the bytes the push sends (client.c encodes the same way), decoded as the coordinator does */
  if (!rc) rc = dpc_codec_encode(codec, delta, len, block, enc);
  if (!rc) rc = dpc_codec_decode(codec, enc, nb, len, block, out);
  free(enc);
  return rc;
}

void rp_note_pushed(rp_cache *c, const Dipaco__V1__Lease *L, const lease_plan *p, const float *delta) {
  own_drop(c);
  /* (a sparse delta is not the dense one encoded: the coordinator then serves its stream too) */
  if (!rp_lease_replays(L) || L->n_fragments == 0 || L->delta_codec == (Dipaco__V1__Codec)DPC_CODEC_SPARSE) return;
  if (!(c->own = calloc(L->n_fragments, sizeof *c->own))) return;
  for (size_t i = 0; i < L->n_fragments; i++) {
    const Dipaco__V1__FragmentInfo *f = L->fragments[i];
    const size_t len = (size_t)f->num_floats;
    float *dec = malloc(len * sizeof(float) + 1);
    if (!dec || rp_decode_own(L, delta + p->abs_off[i], len, dec) < 0) {
      free(dec);
      continue;
    }
    c->own[c->n_own++] = (rp_own){.job = L->job_id, .fragment_id = f->fragment_id, .version = f->version + 1,
                                  .lease = L->lease_id, .dec = dec, .len = len};
  }
}
