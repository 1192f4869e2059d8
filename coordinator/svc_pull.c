/* svc_pull.c — the dipaco.v1.Coordinator PullFragment: a lease's parameters (zero-copy from
 * the parameter cache), its fragment's momentum, or a round's deltas as sent (a replay pull,
 * or a SparseLoCo round's sparse deltas). The
 * handler runs on the loop thread; ud is the coord.
 *
 * Semantics: requires an active lease of the caller covering the fragment; version = the
 * lease's base version unless latest = true or version given; CODEC_FP32 only; chunk crc32c
 * on the last chunk is the CRC-32C of the whole fp32 stream. */
#include "coordinator/svc_pull.h"

#include "common/checksum.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/sparse.h"
#include "coordinator/jobs.h"
#include "coordinator/leases.h"
#include "coordinator/loop.h"
#include "coordinator/pcache.h"
#include "coordinator/rounds.h"
#include "coordinator/svc.h"
#include "coordinator/testhook.h"
#include "proto/dipaco.pb-c.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Stream one part to call from byte `offset`, the stream taking the reference on ud that the
 * caller hands over: an offset past the end answers OUT_OF_RANGE and no memory
 * RESOURCE_EXHAUSTED, and either drops that reference. */
static void stream_one(struct rpc_call *call, coord *c, const out_part *part, uint64_t offset, uint64_t lease_id,
                       int64_t job, uint32_t max_chunk, void (*ref)(void *), void (*unref)(void *), void *ud) {
  out_stream *os = offset <= part->total ? calloc(1, sizeof *os) : NULL;
  if (!os) {
    if (offset > part->total)
      rpc_call_finish(call, RPC_OUT_OF_RANGE, "offset %llu is past the end (%llu bytes)", (unsigned long long)offset,
                      (unsigned long long)part->total);
    else rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    unref(ud);
    return;
  }
  os->c = c;
  os->nparts = 1;
  os->part[0] = *part;
  os->next = offset;
  os->lease_id = lease_id;
  os->job = job;
  os->chunk = svc_chunk_size(max_chunk);
  os->ref = ref;
  os->unref = unref;
  os->ud = ud;
  svc_stream_start(call, os);
}

/* A momentum pull: what its stream needs once the blob is read (or zeros made). */
typedef struct {
  uint64_t lease_id, fragment_id, offset, version;
  size_t n;
  uint32_t max_chunk;
} mom_ctx;

/* Stream the momentum in b->data[0] (got floats; r's reads' outcome in rc) from x->offset. */
static void mom_stream(coord *c, struct rpc_call *call, const mom_ctx *x, svc_bufs *b, size_t got, int rc) {
  if (rc == 0 && got != x->n)
    rc = dpc_err(DPC_EFORMAT, "the momentum blob holds %zu floats, want %zu", got, x->n);
  if (rc < 0) {
    rpc_call_fail(call, rc);
    return;
  }
  out_part part = {.data = (const uint8_t *)b->data[0], .total = (uint64_t)x->n * 4,
                   .crc = dpc_crc32c(0, b->data[0], x->n * 4), .payload = DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM,
                   .fragment_id = x->fragment_id, .version = x->version, .num_floats = x->n};
  svc_bufs_ref(b); /* the stream's reference */
  stream_one(call, c, &part, x->offset, x->lease_id, 0, x->max_chunk, svc_bufs_ref, svc_bufs_unref, b);
}

static void mom_ready(coord *c, struct rpc_call *call, svc_read *r) {
  if (call) mom_stream(c, call, r->ud, r->b, r->got[0], r->rc);
  free(r->ud);
}

/* Eager updates and replay pulls: the outer momentum of fragment frag at version r->version
 * (an eager job or one with replay pulls; zeros at version 0), read from its blob on the
 * thread pool and streamed like parameters. */
/* PullFragment with objects on an S3 store: where version f's blob `name` (its parameters or
 * momentum) is, instead of its bytes; the worker reads and checks it itself. */
static void blob_url_answer(struct rpc_call *call, coord *c, const store_lease *l, const store_fragment *f,
                            const char *name, const Dipaco__V1__PullFragmentRequest *r) {
  const out_part meta = {.fragment_id = r->fragment_id, .version = (uint64_t)f->version, .num_floats = f->len};
  DPC_DEBUG("lease %lld reads fragment %llu version %lld's %s from the store", (long long)l->id,
            (unsigned long long)r->fragment_id, (long long)f->version,
            r->payload == DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM ? "momentum" : "parameters");
  svc_answer_urls(call, c, &meta, (uint64_t)l->id, r->max_chunk_bytes, &name, 1,
                  BLOB_HEADER_BYTES + 4 * (uint64_t)f->len + BLOB_TRAILER_BYTES);
}

static void pull_momentum(struct rpc_call *call, coord *c, const store_lease *l, int frag,
                          const Dipaco__V1__PullFragmentRequest *r) {
  coord_job *j = coord_job_get(c, l->job);
  store_fragment f;
  if (!j || !(j->spec.streaming.eager || jobspec_replay_pull(&j->spec))) {
    rpc_call_finish(call, RPC_FAILED_PRECONDITION, "job %lld has neither eager updates nor replay pulls: its momentum is "
                    "not served",
                    (long long)l->job);
    return;
  }
  if (r->version > INT64_MAX || store_get_version(c->st, l->job, frag, (int64_t)r->version, &f) < 0) {
    store_fragment cur;
    int later = store_get_fragment(c->st, l->job, frag, &cur) == 0 && r->version > (uint64_t)cur.version;
    rpc_call_finish(call, later ? RPC_FAILED_PRECONDITION : RPC_NOT_FOUND, "fragment %d momentum version %llu is %s",
                    frag + 1, (unsigned long long)r->version, later ? "not made yet; ask again" : "not kept");
    return;
  }
  store_fragment cur;
  if (j->momentum[frag] != COORD_MOMENTUM_STORED && store_get_fragment(c->st, l->job, frag, &cur) == 0 &&
      cur.version == f.version) { /* committed before its momentum is stored (rounds.c) */
    rpc_call_finish(call, RPC_FAILED_PRECONDITION, "fragment %d momentum version %llu is not stored yet; ask again",
                    frag + 1, (unsigned long long)r->version);
    return;
  }
  if (r->objects && f.momentum_blob[0] && blob_store_is_s3(c->bs)) {
    blob_url_answer(call, c, l, &f, f.momentum_blob, r);
    return;
  }
  svc_read *rd = svc_read_new();
  mom_ctx *x = rd ? calloc(1, sizeof *x) : NULL;
  if (!x) {
    svc_read_free(rd);
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  *x = (mom_ctx){.lease_id = (uint64_t)l->id, .fragment_id = r->fragment_id, .offset = r->offset,
                 .version = (uint64_t)f.version, .n = j->fragments[frag].len, .max_chunk = r->max_chunk_bytes};
  int rc = 0;
  if (f.momentum_blob[0]) {
    rd->n = 1;
    snprintf(rd->name[0], sizeof rd->name[0], "%s", f.momentum_blob);
    rd->kind[0] = BLOB_MOMENTUM;
    rd->ready = mom_ready;
    rd->ud = x;
    if ((rc = svc_read_start(c, call, rd)) == 0) return;
  } else if (!(rd->b->data[0] = calloc(x->n ? x->n : 1, sizeof(float)))) {
    rc = dpc_err(DPC_ENOMEM, "out of memory");
  }
  mom_stream(c, call, x, rd->b, rc == 0 ? x->n : 0, rc); /* zeros at once, or the failure */
  free(x);
  svc_read_free(rd);
}

static void put_le(unsigned char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* One applied delta of a replayed round: its stream as sent — a sparse stream (BLOB_SPARSE), a
 * quantized one (BLOB_ENCODED, what the outer step decoded), or an fp32 one (BLOB_DELTA) — with
 * its codec, block size and byte length. 0, or DPC_ENOENT / DPC_ECHECKSUM (not kept, or not
 * what the row recorded). */
static int replay_stream(const coord_job *j, int frag, const store_delta *d, int *codec, uint32_t *block,
                         size_t *bytes, blob_kind *kind) {
  blob_kind k;
  if (!d->blob[0] || blob_kind_of_name(d->blob, &k) < 0)
    return dpc_err(DPC_ENOENT, "the delta of lease %lld is no longer kept", (long long)d->lease);
  *block = 0;
  if (k == BLOB_SPARSE) {
    *codec = DPC_CODEC_SPARSE;
    *bytes = j->sp_bytes[frag];
    *kind = BLOB_SPARSE;
    return 0;
  }
  const size_t n = j->fragments[frag].len;
  *codec = d->enc_blob[0] ? j->spec.streaming.codec : DPC_CODEC_FP32;
  *kind = d->enc_blob[0] ? BLOB_ENCODED : BLOB_DELTA;
  if (dpc_codec_is_block(*codec)) *block = (uint32_t)j->spec.streaming.block_floats;
  return dpc_codec_bytes(*codec, n, *block, bytes);
}

/* One stream of a round being read on the thread pool: blob `name` of `kind` into the round's
 * bytes at `at`, `bytes` long, with the CRC-32C the row recorded (`crc`). */
typedef struct {
  char name[BLOB_NAME_MAX];
  blob_kind kind;
  size_t at, bytes;
  uint32_t crc;
} round_part;

/* A PAYLOAD_REPLAY_ROUND / PAYLOAD_SPARSE_ROUND answer whose streams are read from the blob store
 * on the thread pool (a round of a large model is R streams of its size): the table is filled on
 * the loop thread, the streams after it. hold.call is NULL once the call ended meanwhile. */
typedef struct round_read {
  svc_hold hold; /* registered while the streams are read */
  uv_work_t req;
  coord *c;
  store_lease l;
  int frag, replay, rc, fault; /* fault: the test hook's, for this round (testhook.h) */
  int objects; /* data holds PAYLOAD_ROUND_OBJECTS (round_objects), not the round's bytes */
  Dipaco__V1__PullFragmentRequest r; /* the request's scalars */
  unsigned char *data;
  size_t len;
  round_part *parts;
  int nparts;
  char err[512];
} round_read;

/* The applied deltas of round t of (j, frag) as sent, in the order and with the weights the
 * outer step averaged them, as PAYLOAD_REPLAY_ROUND's bytes (replay: [u32 n][u32 CRC-32C of the
 * parameters the round made, 0 if not kept][n x (f64 weight, u64 bytes, u32 codec,
 * u32 block_floats)][streams]) or PAYLOAD_SPARSE_ROUND's ([u32 n][n x (f64 weight, u64 bytes)]
 * [streams]): the table into rr->data (malloc'd, rr->len bytes in all) and the streams to read
 * into rr->parts; lease skip's delta (the caller's own) as bytes 0 without its stream.
 * DPC_ENOENT once they are collected, DPC_ERANGE (nothing read) when the streams exceed budget
 * bytes (0 = no limit). */
static int round_table(coord *c, const coord_job *j, int frag, int64_t t, int64_t skip, int replay, uint64_t budget,
                       round_read *rr) {
  store_delta *ds = NULL;
  int n = 0, rc = store_list_deltas(c->st, j->id, frag, t, DELTA_APPLIED, &ds, &n);
  if (rc < 0) return rc;
  const size_t ent = replay ? 24 : 16, at0 = replay ? 8 : 4, head = at0 + (size_t)n * ent;
  size_t sum = 0, *sb = n > 0 ? calloc((size_t)n, sizeof *sb) : NULL;
  int *codec = n > 0 ? calloc((size_t)n, sizeof *codec) : NULL;
  uint32_t *block = n > 0 ? calloc((size_t)n, sizeof *block) : NULL;
  blob_kind *kind = n > 0 ? calloc((size_t)n, sizeof *kind) : NULL;
  if (n == 0) rc = dpc_err(DPC_ENOENT, "round %lld of fragment %d applied no deltas here", (long long)t, frag + 1);
  else if (!sb || !codec || !block || !kind) rc = DPC_ENOMEM;
  for (int i = 0; i < n && !rc; i++) {
    rc = replay_stream(j, frag, &ds[i], &codec[i], &block[i], &sb[i], &kind[i]);
    if (!rc && !replay && codec[i] != DPC_CODEC_SPARSE)
      rc = dpc_err(DPC_ENOENT, "round %lld of fragment %d applied a dense delta", (long long)t, frag + 1);
    if (!(skip > 0 && ds[i].lease == skip)) sum += sb[i];
  }
  if (!rc && budget > 0 && sum > budget)
    rc = dpc_err(DPC_ERANGE, "round %lld of fragment %d is %zu bytes of deltas, over the budget of %llu", (long long)t,
                 frag + 1, sum, (unsigned long long)budget);
  unsigned char *b = rc == 0 ? calloc(1, head + sum + 4) : NULL;
  round_part *parts = rc == 0 ? calloc((size_t)n, sizeof *parts) : NULL;
  if (!rc && (!b || !parts)) rc = DPC_ENOMEM;
  if (!rc) put_le(b, (uint64_t)n, 4);
  store_fragment made; /* replay: the CRC-32C of the parameters the round made (0: not kept) */
  if (!rc && replay && store_get_version(c->st, j->id, frag, t + 1, &made) == 0) put_le(b + 4, made.param_crc, 4);
  size_t at = head; /* where the next stream goes */
  int np = 0;
  for (int i = 0; i < n && !rc; i++) {
    double w = coord_job_delta_weight(j, ds[i].tokens); /* the weight the outer step gave it */
    uint64_t wb;
    memcpy(&wb, &w, 8);
    unsigned char *e = b + at0 + (size_t)i * ent;
    put_le(e, wb, 8);
    if (replay) {
      put_le(e + 16, (uint64_t)codec[i], 4);
      put_le(e + 20, block[i], 4);
    }
    if (skip > 0 && ds[i].lease == skip) continue; /* the caller's own: weight only, bytes 0 */
    put_le(e + 8, (uint64_t)sb[i], 8);
    /* BLOB_SPARSE / BLOB_DELTA: the row's checksum is the payload's; BLOB_ENCODED: the row
     * recorded the stream's CRC-32C as sent (the blob's own trailer covers its padding too). */
    round_part *pt = &parts[np++];
    *pt = (round_part){.kind = kind[i], .at = at, .bytes = sb[i],
                       .crc = kind[i] == BLOB_ENCODED ? ds[i].enc_crc : ds[i].checksum};
    snprintf(pt->name, sizeof pt->name, "%s", kind[i] == BLOB_ENCODED ? ds[i].enc_blob : ds[i].blob);
    at += sb[i];
  }
  free(ds);
  free(sb);
  free(codec);
  free(block);
  free(kind);
  if (rc < 0) {
    free(b);
    free(parts);
    return rc;
  }
  rr->data = b;
  rr->len = at;
  rr->parts = parts;
  rr->nparts = np;
  return 0;
}

/* Thread pool: every stream of the round into its place, checked against its row's CRC. */
static void round_read_work(uv_work_t *req) {
  round_read *rr = req->data;
  rr->rc = 0;
  for (int i = 0; i < rr->nparts && !rr->rc; i++) {
    const round_part *pt = &rr->parts[i];
    float *enc = NULL;
    size_t nf = 0;
    uint32_t crc = 0;
    rr->rc = blob_read_alloc(rr->c->bs, pt->name, pt->kind, &enc, &nf, &crc);
    if (!rr->rc && (nf != (pt->bytes + 3) / 4 ||
                    (pt->kind == BLOB_ENCODED ? dpc_crc32c(0, enc, pt->bytes) != pt->crc : crc != pt->crc)))
      rr->rc = dpc_err(DPC_ECHECKSUM, "delta blob %s does not hold the recorded delta", pt->name);
    if (!rr->rc) memcpy(rr->data + pt->at, enc, pt->bytes);
    free(enc);
  }
  if (rr->rc < 0) snprintf(rr->err, sizeof rr->err, "%s", dpc_errmsg());
}

static void round_read_free(round_read *rr) {
  free(rr->data);
  free(rr->parts);
  free(rr);
}

/* A test hook's fault (testhook.h) on a served replay round b[len]: its first stream spoiled. */
static void replay_spoil(unsigned char *b, size_t len, int fault) {
  uint64_t n = len >= 4 ? b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16 | (uint64_t)b[3] << 24 : 0;
  size_t at = 8 + (size_t)n * 24;
  if (at + 4 > len) return;
  if (fault == REPLAY_FAULT_UNDECODABLE) memcpy(b + at, "\xff\xff\xff\x7f", 4);
  else if (fault == REPLAY_FAULT_MISMATCH) b[at] ^= 1;
}

/* Send round rr's bytes (read) on its call, or the error that kept them. Loop thread. */
static void round_send(round_read *rr, int rc, const char *err) {
  struct rpc_call *call = rr->hold.call;
  coord *c = rr->c;
  const Dipaco__V1__PullFragmentRequest *r = &rr->r;
  const int frag = rr->frag, replay = rr->replay;
  if (rc < 0) {
    if (rc == DPC_ENOENT || rc == DPC_ECHECKSUM)
      rpc_call_finish(call, RPC_NOT_FOUND, "the round that made fragment %d version %llu is not kept (%s); pull "
                      "the parameters", frag + 1, (unsigned long long)r->version, err);
    else if (rc == DPC_ERANGE)
      rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "%s; pull the parameters", err);
    else rpc_call_finish(call, rpc_code_from_dpc(rc), "%s", err);
    round_read_free(rr);
    return;
  }
  if (!rr->objects) replay_spoil(rr->data, rr->len, rr->fault);
  svc_bufs *b = calloc(1, sizeof *b);
  coord_job *j = coord_job_get(c, rr->l.job);
  if (!b || !j) {
    rpc_call_finish(call, j ? RPC_RESOURCE_EXHAUSTED : RPC_NOT_FOUND, "%s", j ? "out of memory" : "the job is gone");
    free(b);
    round_read_free(rr);
    return;
  }
  atomic_init(&b->refs, 1);
  b->data[0] = (float *)(void *)rr->data; /* the stream owns the bytes now */
  out_part part = {.data = rr->data, .total = (uint64_t)rr->len, .crc = dpc_crc32c(0, rr->data, rr->len),
                   .payload = rr->objects ? DIPACO__V1__PAYLOAD__PAYLOAD_ROUND_OBJECTS
                              : replay      ? DIPACO__V1__PAYLOAD__PAYLOAD_REPLAY_ROUND
                                            : DIPACO__V1__PAYLOAD__PAYLOAD_SPARSE_ROUND,
                   .fragment_id = r->fragment_id, .version = r->version, .num_floats = j->fragments[frag].len};
  DPC_DEBUG("lease %lld pulls the %s round of fragment %d version %llu (%zu bytes%s)", (long long)rr->l.id,
            replay ? "replay" : "sparse", frag + 1, (unsigned long long)r->version, rr->len,
            rr->objects ? ": the table and the streams' URLs" : "");
  const uint64_t offset = r->offset, lease_id = (uint64_t)rr->l.id;
  const int64_t job = replay ? rr->l.job : 0;
  const uint32_t max_chunk = r->max_chunk_bytes;
  rr->data = NULL;
  round_read_free(rr);
  stream_one(call, c, &part, offset, lease_id, job, max_chunk, svc_bufs_ref, svc_bufs_unref, b);
}

static void round_read_after(uv_work_t *req, int status) {
  round_read *rr = req->data;
  coord *c = rr->c;
  svc_hold_remove(c, &rr->hold);
  if (!rr->hold.call) round_read_free(rr); /* the call ended meanwhile */
  else round_send(rr, status ? DPC_EINTERNAL : rr->rc, status ? "canceled" : rr->err);
  loop_work_done(c);
}

/* round_objects on an S3 store: replace the round's bytes in rr (its table filled, its streams
 * not read) by PAYLOAD_ROUND_OBJECTS (proto/dipaco.proto): the table and, per stream, where it
 * goes, its size, CRC-32C, blob kind and a presigned GET URL of its blob, so that the worker reads
 * the streams from the store and the coordinator sends a few hundred bytes. Loop thread (presigning
 * needs no network). */
static int round_objects(coord *c, round_read *rr) {
  size_t head = rr->nparts > 0 ? rr->parts[0].at : rr->len, cap = 16 + head, at = 0;
  char(*urls)[S3_URL_MAX] = rr->nparts > 0 ? malloc((size_t)rr->nparts * sizeof *urls) : NULL;
  if (rr->nparts > 0 && !urls) return DPC_ENOMEM;
  int rc = 0;
  for (int i = 0; i < rr->nparts && !rc; i++) {
    rc = blob_store_url(c->bs, rr->parts[i].name, (uint64_t)rr->len, urls[i], sizeof urls[i]);
    cap += 28 + strlen(urls[i]);
  }
  unsigned char *b = rc ? NULL : malloc(cap);
  if (!rc && !b) rc = DPC_ENOMEM;
  if (!rc) {
    put_le(b, (uint64_t)rr->len, 8);
    put_le(b + 8, (uint64_t)head, 4);
    memcpy(b + 12, rr->data, head);
    at = 12 + head;
    put_le(b + at, (uint64_t)rr->nparts, 4);
    at += 4;
    for (int i = 0; i < rr->nparts; i++) {
      const round_part *pt = &rr->parts[i];
      size_t ul = strlen(urls[i]);
      put_le(b + at, (uint64_t)pt->at, 8);
      put_le(b + at + 8, (uint64_t)pt->bytes, 8);
      put_le(b + at + 16, pt->crc, 4);
      put_le(b + at + 20, (uint64_t)pt->kind, 4);
      put_le(b + at + 24, (uint64_t)ul, 4);
      memcpy(b + at + 28, urls[i], ul);
      at += 28 + ul;
    }
    free(rr->data);
    rr->data = b;
    rr->len = at;
    rr->objects = 1;
  }
  free(urls);
  return rc;
}

/* PAYLOAD_SPARSE_ROUND (a job with jobspec_sparse_pull) or PAYLOAD_REPLAY_ROUND (a job with
 * jobspec_replay_pull): the deltas that made version r->version of fragment frag, while the
 * coordinator keeps them (REPLAY_KEEP_ROUNDS); the table here, the streams read on the thread
 * pool. */
static void pull_round(struct rpc_call *call, coord *c, const store_lease *l, int frag,
                       const Dipaco__V1__PullFragmentRequest *r, int replay) {
  coord_job *j = coord_job_get(c, l->job);
  store_fragment cur;
  if (!j || !(replay ? jobspec_replay_pull(&j->spec) : jobspec_sparse_pull(&j->spec))) {
    rpc_call_finish(call, RPC_FAILED_PRECONDITION, "job %lld does not serve %s; pull the parameters", (long long)l->job,
                    replay ? "replay rounds (a sync job without eager updates, with pulls.replay, does)"
                           : "sparse rounds (a SparseLoCo job with outer momentum 0 does)");
    return;
  }
  if (r->version == 0 || r->version > INT64_MAX || store_get_fragment(c->st, l->job, frag, &cur) < 0 ||
      (!replay && r->version > (uint64_t)cur.version)) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "version %llu: a round makes a version in 1 .. the current one",
                    (unsigned long long)r->version);
    return;
  }
  if (r->version > (uint64_t)cur.version) { /* replay (streaming): asked for before the round closed */
    rpc_call_finish(call, RPC_FAILED_PRECONDITION, "fragment %d version %llu is not made yet (current %lld); ask again",
                    frag + 1, (unsigned long long)r->version, (long long)cur.version);
    return;
  }
  round_read *rr = calloc(1, sizeof *rr);
  if (!rr) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  rr->c = c;
  rr->hold.call = call;
  rr->l = *l;
  rr->frag = frag;
  rr->replay = replay;
  rr->r = *r;
  rr->req.data = rr;
  int64_t skip = r->skip_lease <= INT64_MAX ? (int64_t)r->skip_lease : 0;
  rr->fault = replay ? testhook_replay_fault() : REPLAY_FAULT_NONE;
  int rc = rr->fault == REPLAY_FAULT_GONE ? dpc_err(DPC_ENOENT, "test hook: DIPACO_TEST_REPLAY_FAULT=gone")
                : round_table(c, j, frag, (int64_t)r->version - 1, skip, replay, replay ? r->replay_budget : 0, rr);
  if (rc == 0 && r->round_objects && blob_store_is_s3(c->bs) && rr->fault == REPLAY_FAULT_NONE) {
    char err[512] = "";
    rc = round_objects(c, rr);
    if (rc < 0) snprintf(err, sizeof err, "%s", dpc_errmsg());
    round_send(rr, rc, err);
    return;
  }
  if (rc == 0 && loop_queue_work(c, &rr->req, round_read_work, round_read_after) == 0) {
    svc_hold_add(c, &rr->hold, call);
    return;
  }
  char err[512];
  snprintf(err, sizeof err, "%s", rc < 0 ? dpc_errmsg() : "cannot queue the read");
  round_send(rr, rc < 0 ? rc : DPC_EINTERNAL, err);
}

/* A PAYLOAD_PARAMS pull whose version is being mapped on the thread pool (pcache_get_async). */
typedef struct param_wait {
  svc_hold hold;
  uint64_t lease_id, fragment_id, offset;
  int64_t job, version;
  int frag;
  uint32_t max_chunk_bytes;
} param_wait;

/* Stream version e (referenced; the stream takes the reference) of the fragment from byte
 * offset, or finish the call. */
static void params_stream(struct rpc_call *call, coord *c, const param_wait *w, pcache_entry *e) {
  out_part part = {.data = (const uint8_t *)e->data, .total = (uint64_t)e->n * 4, .crc = e->crc,
                   .payload = DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS, .fragment_id = w->fragment_id,
                   .version = (uint64_t)w->version, .num_floats = e->n};
  DPC_DEBUG("lease %llu pulls fragment %d version %lld from byte %llu", (unsigned long long)w->lease_id, w->frag,
            (long long)w->version, (unsigned long long)w->offset);
  stream_one(call, c, &part, w->offset, w->lease_id, w->job, w->max_chunk_bytes, pcache_ref, pcache_unref, e);
}

static void params_ready(coord *c, pcache_entry *e, int rc, void *ud) {
  param_wait *w = ud;
  svc_hold_remove(c, &w->hold);
  if (!w->hold.call) { /* the call ended meanwhile */
    if (e) pcache_unref(e);
  } else if (rc < 0) {
    rpc_call_fail(w->hold.call, rc);
  } else {
    params_stream(w->hold.call, c, w, e);
  }
  free(w);
}

/* PAYLOAD_PARAMS of version f: streamed at once when the parameter cache holds it, else once
 * its fill on the thread pool ends (the loop thread answers other calls meanwhile). */
static void pull_params(struct rpc_call *call, coord *c, const store_lease *l, const store_fragment *f,
                        const Dipaco__V1__PullFragmentRequest *r) {
  param_wait *w = calloc(1, sizeof *w);
  if (!w) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  *w = (param_wait){.lease_id = (uint64_t)l->id, .fragment_id = r->fragment_id, .offset = r->offset, .job = l->job,
                    .version = f->version, .frag = f->fragment, .max_chunk_bytes = r->max_chunk_bytes};
  pcache_entry *e = NULL;
  int rc = pcache_get_async(c, f, &e, params_ready, w);
  if (rc == 0) {
    svc_hold_add(c, &w->hold, call);
    return;
  }
  if (rc < 0) rpc_call_fail(call, rc);
  else params_stream(call, c, w, e);
  free(w);
}

/* PullFragment's end: a round still being read (round_read_after), a parameter fill
 * (params_ready) or a momentum read (mom_ready) forgets the call. */
static void pull_on_done(struct rpc_call *call, int cancelled, void *ud) {
  coord *c = ud;
  if (svc_hold_forget(c, call)) return;
  svc_stream_on_done(call, cancelled, ud);
}

static void on_pull(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  int64_t worker;
  if (svc_authenticate(c, call, &worker, 0) < 0) return;
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__pull_fragment_request__descriptor, &pm)) return;
  Dipaco__V1__PullFragmentRequest *r = (Dipaco__V1__PullFragmentRequest *)pm;
  svc_touch(c, worker, -1);
  store_lease l;
  int64_t base;
  int frag = (int)(r->fragment_id - 1);
  if (r->lease_id == 0 || r->lease_id > INT64_MAX || store_get_lease(c->st, (int64_t)r->lease_id, &l) < 0) {
    rpc_call_finish(call, RPC_NOT_FOUND, "lease_id %llu: no such lease", (unsigned long long)r->lease_id);
  } else if (l.worker != worker) {
    rpc_call_finish(call, RPC_PERMISSION_DENIED, "lease %lld belongs to another worker", (long long)l.id);
  } else if (l.state != LEASE_ACTIVE) {
    rpc_call_finish(call, RPC_ABORTED, "lease %lld is no longer active; ask for a new lease", (long long)l.id);
  } else if (r->fragment_id == 0 || r->fragment_id > 1u << 30 ||
             store_lease_base_version(c->st, l.id, frag, &base) < 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "fragment_id %llu is not a fragment of lease %lld",
                    (unsigned long long)r->fragment_id, (long long)l.id);
  } else if (r->codec != DIPACO__V1__CODEC__CODEC_FP32) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "codec %d: this coordinator serves CODEC_FP32 only", (int)r->codec);
  } else if (r->payload == DIPACO__V1__PAYLOAD__PAYLOAD_OUTER_MOMENTUM) {
    pull_momentum(call, c, &l, frag, r);
  } else if (r->payload == DIPACO__V1__PAYLOAD__PAYLOAD_SPARSE_ROUND ||
             r->payload == DIPACO__V1__PAYLOAD__PAYLOAD_REPLAY_ROUND) {
    pull_round(call, c, &l, frag, r, r->payload == DIPACO__V1__PAYLOAD__PAYLOAD_REPLAY_ROUND);
  } else if (r->payload != DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "payload %d: PullFragment serves PAYLOAD_PARAMS, PAYLOAD_OUTER_MOMENTUM, "
                    "PAYLOAD_SPARSE_ROUND or PAYLOAD_REPLAY_ROUND",
                    (int)r->payload);
  } else {
    store_fragment f;
    int rc;
    if (r->latest) rc = store_get_fragment(c->st, l.job, frag, &f);
    else rc = store_get_version(c->st, l.job, frag, r->version ? (int64_t)r->version : base, &f);
    if (r->version > INT64_MAX) rc = DPC_ENOENT;
    store_fragment cur;
    const uint64_t want = r->version ? r->version : (uint64_t)base;
    if (rc < 0 && !r->latest && store_get_fragment(c->st, l.job, frag, &cur) == 0 && want > (uint64_t)cur.version) {
      /* Streaming: the worker asks for the version its merge needs before the round closed. */
      rpc_call_finish(call, RPC_FAILED_PRECONDITION, "fragment %llu version %llu is not made yet (current %lld); ask again",
                      (unsigned long long)r->fragment_id, (unsigned long long)want, (long long)cur.version);
    } else if (rc < 0) {
      rpc_call_finish(call, RPC_NOT_FOUND, "fragment %llu version %llu is not kept", (unsigned long long)r->fragment_id,
                      (unsigned long long)want);
    } else if (r->objects && blob_store_is_s3(c->bs)) {
      blob_url_answer(call, c, &l, &f, f.param_blob, r);
    } else {
      pull_params(call, c, &l, &f, r);
    }
  }
  protobuf_c_message_free_unpacked(pm, NULL);
}

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Coordinator/PullFragment", .kind = RPC_SERVER_STREAM, .on_call = on_pull,
     .on_sent = svc_stream_on_sent, .on_done = pull_on_done},
};

int svc_pull_methods(coord *c, struct rpc_method *out) {
  return svc_methods_add(out, methods, (int)(sizeof methods / sizeof methods[0]), c);
}
