/* sparseloco.c — the worker's side of SparseLoCo: error-feedback buffers, sparse encoding of a
 * lease's deltas and sparse pulls (sparseloco.h). */
#include "worker/sparseloco.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/sparse.h"
#include "kernels/gpt.h"
#include "kernels/outer.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* A sparse round holds at most this many deltas (slots through a module). */
#define SL_MAX_ROUND_DELTAS 4096

static void ef_drop(sl_ef *s) {
  free(s->e);
  memset(s, 0, sizeof *s);
}

static void own_free(sl_cache *c) {
  for (size_t i = 0; i < c->n_own; i++) free(c->own[i].enc);
  free(c->own);
  c->own = NULL;
  c->n_own = 0;
}

void sl_cache_free(sl_cache *c) {
  own_free(c);
  for (int i = 0; i < SLOT_STATES_MAX; i++) ef_drop(&c->efs[i]);
  free(c->pulled);
  memset(c, 0, sizeof *c);
}

static sl_ef *ef_find(sl_cache *c, uint64_t job, uint32_t path, uint32_t replica) {
  for (int i = 0; i < SLOT_STATES_MAX; i++)
    if (c->efs[i].used && c->efs[i].job == job && c->efs[i].path == path && c->efs[i].replica == replica)
      return &c->efs[i];
  return NULL;
}

float *sl_pull_target(sl_cache *c, const Dipaco__V1__Lease *L, size_t n) {
  if (c->n_pulled != n) {
    free(c->pulled);
    c->n_pulled = 0;
    if (!(c->pulled = malloc(n * sizeof(float)))) return NULL;
    c->n_pulled = n;
  }
  memset(c->pulled, 0, n * sizeof(float));
  c->pulled_job = L->job_id;
  c->pulled_lease = L->lease_id;
  return c->pulled;
}

/* Fragment i's tensor lengths into tlen[cap] (the path buffer is the canonical layout). */
static int frag_tensors(const lease_plan *p, const Dipaco__V1__FragmentInfo *f, size_t off, uint64_t *tlen, int cap) {
  gpt_layout *lay = malloc(sizeof *lay);
  if (!lay) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  int n = gpt_layout_build(&p->cfg, lay);
  if (n == 0) n = gpt_layout_range_tensors(lay, off, (size_t)f->num_floats, tlen, cap);
  free(lay);
  if (n > cap) return dpc_err(DPC_ERANGE, "fragment %" PRIu64 " has %d tensors (at most %d)", f->fragment_id, n, cap);
  return n;
}

static dpc_sparse_cfg lease_cfg(const Dipaco__V1__Lease *L) {
  return (dpc_sparse_cfg){.density = L->sparse_density, .chunk = L->sparse_chunk, .value_bits = L->sparse_value_bits};
}

int sl_fragment_layout(const Dipaco__V1__Lease *L, const lease_plan *p, size_t i, dpc_sparse_cfg *cfg, uint64_t *tlen,
                       int cap) {
  *cfg = lease_cfg(L);
  return frag_tensors(p, L->fragments[i], p->abs_off[i], tlen, cap);
}

void sl_push_free(sl_push *out) {
  for (size_t i = 0; out->enc && i < out->n_frag; i++) free(out->enc[i]);
  free(out->enc);
  free(out->bytes);
  free(out->e);
  memset(out, 0, sizeof *out);
}

int sl_encode(sl_cache *c, const Dipaco__V1__Lease *L, const lease_plan *p, const float *delta, sl_push *out) {
  memset(out, 0, sizeof *out);
  const size_t n = p->n_params, nf = L->n_fragments;
  const dpc_sparse_cfg cfg = lease_cfg(L);
  const uint32_t path = L->slot->path, rep = L->slot->replica;
  /* The buffer this lease starts from. */
  const float *src = NULL;
  const char *from = "zeros";
  if (L->inner_state != DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_RESET) {
    sl_ef *s = ef_find(c, L->job_id, path, rep);
    if (c->pulled && c->pulled_lease == L->lease_id && c->n_pulled == n) {
      src = c->pulled;
      from = "the checkpoint";
    } else if (s && s->n == n) {
      src = s->e;
      from = "this worker's last lease of the slot";
    } else if (L->round > 0) {
      DPC_WARN("job %" PRIu64 " slot (%u,%u): no error-feedback buffer for this slot here (round %" PRIu64
               "); starting from zeros", L->job_id, path, rep, L->round);
    }
  }
  out->n_frag = nf;
  out->n = n;
  out->e = calloc(n, sizeof(float));
  out->enc = calloc(nf, sizeof *out->enc);
  out->bytes = calloc(nf, sizeof *out->bytes);
  uint64_t *tlen = malloc(GPT_MAX_TENSORS * sizeof *tlen);
  int rc = out->e && out->enc && out->bytes && tlen ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory for sparse deltas");
  const float beta = (float)L->sparse_ef_beta;
  for (size_t i = 0; i < nf && !rc; i++) {
    const Dipaco__V1__FragmentInfo *f = L->fragments[i];
    const size_t off = p->abs_off[i], len = (size_t)f->num_floats;
    float *e = out->e + off;
    const float *d = delta + off, *s = src ? src + off : NULL;
    /* e <- beta·e + Δ: two fp32 roundings, as the reference computes it. */
    for (size_t k = 0; k < len; k++) {
      float t = s ? beta * s[k] : 0.0f;
      e[k] = t + d[k];
    }
    int nt = frag_tensors(p, f, off, tlen, GPT_MAX_TENSORS);
    if (nt < 0) {
      rc = nt;
      break;
    }
    uint64_t kept = 0;
    if ((rc = dpc_sparse_bytes(&cfg, tlen, nt, &out->bytes[i], &kept)) < 0) break;
    if (!(out->enc[i] = malloc(out->bytes[i] ? out->bytes[i] : 1))) {
      rc = dpc_err(DPC_ENOMEM, "worker: out of memory for a sparse delta");
      break;
    }
    if ((rc = dpc_sparse_encode(&cfg, tlen, nt, e, out->enc[i])) < 0) break;
    out->kept += kept;
  }
  free(tlen);
  if (rc) {
    sl_push_free(out);
    return rc;
  }
  DPC_DEBUG("lease %" PRIu64 ": sparse deltas from %s: %" PRIu64 " entries kept", L->lease_id, from, out->kept);
  return 0;
}

void sl_commit(sl_cache *c, const Dipaco__V1__Lease *L, sl_push *out) {
  if (c->pulled_lease == L->lease_id) c->pulled_lease = 0;
  own_free(c); /* the streams just pushed replace the last lease's */
  if (out->enc && (c->own = calloc(out->n_frag, sizeof *c->own))) {
    c->n_own = out->n_frag;
    for (size_t i = 0; i < out->n_frag; i++) {
      c->own[i] = (sl_own){.job = L->job_id, .fragment_id = L->fragments[i]->fragment_id,
                           .version = L->fragments[i]->version + 1, .lease = L->lease_id, .enc = out->enc[i],
                           .bytes = out->bytes[i]};
      out->enc[i] = NULL;
    }
  }
  if (L->inner_state == DIPACO__V1__INNER_STATE_POLICY__INNER_STATE_RESET || !out->e) return;
  const uint32_t path = L->slot->path, rep = L->slot->replica;
  sl_ef *s = ef_find(c, L->job_id, path, rep);
  if (!s) {
    for (int i = 0; i < SLOT_STATES_MAX && !s; i++)
      if (!c->efs[i].used) s = &c->efs[i];
    if (!s) { /* evict the least recently used */
      s = &c->efs[0];
      for (int i = 1; i < SLOT_STATES_MAX; i++)
        if (c->efs[i].last_used < s->last_used) s = &c->efs[i];
      DPC_WARN("dropping the error-feedback buffer of job %" PRIu64 " slot (%u,%u) to make room", s->job, s->path,
               s->replica);
    }
  }
  ef_drop(s);
  s->used = 1;
  s->job = L->job_id;
  s->path = path;
  s->replica = rep;
  s->e = out->e;
  s->n = out->n;
  out->e = NULL;
  s->last_used = dpc_mono_ms();
}

/* ------------------------------------------------------------------ sparse pulls */

void sl_forget_held(sl_cache *c) {
  c->n_held = 0;
  c->held_job = 0;
}

void sl_note_pulled(sl_cache *c, const Dipaco__V1__Lease *L, const lease_plan *p, size_t i) {
  const Dipaco__V1__FragmentInfo *f = L->fragments[i];
  const size_t off = p->abs_off[i], len = (size_t)f->num_floats;
  if (c->held_job != L->job_id) sl_forget_held(c);
  c->held_job = L->job_id;
  int k = 0; /* drop every entry the range overwrote */
  for (int j = 0; j < c->n_held; j++) {
    const sl_held *h = &c->held[j];
    if (h->off < off + len && off < h->off + h->len) continue;
    c->held[k++] = *h;
  }
  c->n_held = k;
  if (c->n_held < SL_HELD_MAX)
    c->held[c->n_held++] = (sl_held){.fragment_id = f->fragment_id, .version = f->version, .off = off, .len = len};
}

static uint64_t get_le(const unsigned char *b, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

/* One round's PAYLOAD_SPARSE_ROUND bytes applied to theta[len] as the coordinator's outer step
 * applied them (outer_average, then the outer rule with momentum 0); an entry of bytes 0 is
 * own's stream (the worker's own delta, left out of the transfer). */
static int apply_round(const Dipaco__V1__Lease *L, const dpc_sparse_cfg *cfg, const uint64_t *tlen, int nt,
                       const unsigned char *b, size_t blen, const sl_own *own, float *theta, size_t len) {
  size_t sb = 0;
  int rc = dpc_sparse_bytes(cfg, tlen, nt, &sb, NULL);
  if (rc < 0) return rc;
  uint64_t n = blen >= 4 ? get_le(b, 4) : 0, skipped = 0;
  for (uint64_t i = 0; n <= SL_MAX_ROUND_DELTAS && 4 + (i + 1) * 16 <= blen && i < n; i++)
    skipped += get_le(b + 12 + i * 16, 8) == 0;
  if (n < 1 || n > SL_MAX_ROUND_DELTAS || skipped > 1 || (skipped && (!own || own->bytes != sb)) ||
      blen != 4 + n * 16 + (n - skipped) * sb)
    return dpc_err(DPC_EFORMAT, "sparse round: %" PRIu64 " deltas (%" PRIu64 " left out) in %zu bytes (each %zu bytes)",
                   n, skipped, blen, sb);
  float *dense = malloc((size_t)n * len * sizeof(float)), *avg = malloc(len * sizeof(float)),
        *u = calloc(len, sizeof(float));
  const float **dp = malloc((size_t)n * sizeof *dp);
  double *w = malloc((size_t)n * sizeof *w);
  rc = dense && avg && u && dp && w ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory for a sparse round");
  const unsigned char *next = b + 4 + n * 16;
  for (uint64_t i = 0; i < n && !rc; i++) {
    uint64_t wb = get_le(b + 4 + i * 16, 8), bytes = get_le(b + 12 + i * 16, 8);
    memcpy(&w[i], &wb, 8);
    const unsigned char *st = bytes == 0 ? own->enc : next;
    if (bytes != 0 && bytes != sb)
      rc = dpc_err(DPC_EFORMAT, "sparse round: delta %" PRIu64 " is %" PRIu64 " bytes, want %zu", i, bytes, sb);
    if (bytes != 0) next += sb;
    dp[i] = dense + i * len;
    if (!rc) rc = dpc_sparse_decode(cfg, tlen, nt, st, sb, dense + i * len);
  }
  if (!rc) rc = outer_average(dp, w, (int)n, len, avg);
  if (!rc) outer_nesterov_step(theta, u, avg, len, L->outer_lr, 0.0f, L->outer_nesterov);
  free(dense);
  free(avg);
  free(u);
  free(dp);
  free(w);
  return rc;
}

int sl_try_pull(sl_cache *c, wclient *wc, const Dipaco__V1__Lease *L, const lease_plan *p, size_t i, float *theta,
                size_t *bytes, int *code) {
  const Dipaco__V1__FragmentInfo *f = L->fragments[i];
  const size_t off = p->abs_off[i], len = (size_t)f->num_floats;
  *code = RPC_OK;
  if (!L->sparse_pull || L->delta_codec != (Dipaco__V1__Codec)DPC_CODEC_SPARSE || c->held_job != L->job_id) return 0;
  sl_held *h = NULL;
  for (int j = 0; j < c->n_held && !h; j++)
    if (c->held[j].fragment_id == f->fragment_id && c->held[j].off == off && c->held[j].len == len) h = &c->held[j];
  if (!h || h->version > f->version) return 0;
  float *dst = theta + off;
  uint64_t *tlen = malloc(GPT_MAX_TENSORS * sizeof *tlen);
  if (!tlen) return 0;
  const dpc_sparse_cfg cfg = lease_cfg(L);
  int nt = frag_tensors(p, f, off, tlen, GPT_MAX_TENSORS), rc = 0, ok = nt > 0;
  size_t sb = 0;
  if (ok && dpc_sparse_bytes(&cfg, tlen, nt, &sb, NULL) < 0) ok = 0;
  const size_t max_bytes = 4 + (size_t)SL_MAX_ROUND_DELTAS * (16 + sb);
  while (ok && h->version < f->version) {
    unsigned char *b = NULL;
    size_t blen = 0;
    const sl_own *own = NULL; /* this worker's own delta of the round, if it has it */
    for (size_t k = 0; k < c->n_own && !own; k++)
      if (c->own[k].job == L->job_id && c->own[k].fragment_id == f->fragment_id &&
          c->own[k].version == h->version + 1)
        own = &c->own[k];
    rc = wc_pull_sparse_round(wc, L->lease_id, f, h->version + 1, own ? own->lease : 0, max_bytes, &b, &blen, code);
    if (rc) {
      if (*code == RPC_NOT_FOUND || *code == RPC_FAILED_PRECONDITION || *code == RPC_INVALID_ARGUMENT ||
          *code == RPC_OK) {
        DPC_INFO("lease %" PRIu64 ": fragment %" PRIu64 ": no sparse round for version %" PRIu64 " (%s); pulling it "
                 "whole", L->lease_id, f->fragment_id, h->version + 1, dpc_errmsg());
        rc = 0;
        ok = 0;
      }
      break;
    }
    *bytes += blen;
    if (apply_round(L, &cfg, tlen, nt, b, blen, own, dst, len) < 0) {
      DPC_WARN("lease %" PRIu64 ": fragment %" PRIu64 ": sparse round %" PRIu64 " unusable: %s; pulling it whole",
               L->lease_id, f->fragment_id, h->version + 1, dpc_errmsg());
      ok = 0;
    } else {
      h->version++;
    }
    free(b);
  }
  free(tlen);
  if (rc) return rc; /* a transfer to retry: h->version says how far theta got */
  if (ok && f->crc32c && dpc_crc32c(0, dst, len * sizeof(float)) != f->crc32c) {
    DPC_WARN("lease %" PRIu64 ": fragment %" PRIu64 " after its sparse rounds does not match version %" PRIu64
             "'s checksum; pulling it whole", L->lease_id, f->fragment_id, f->version);
    ok = 0;
  }
  if (!ok) h->version = UINT64_MAX; /* theta's range no longer holds a known version */
  *code = RPC_OK;
  return ok;
}
