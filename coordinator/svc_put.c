/* svc_put.c — the dipaco.v1.Coordinator PrepareDeltaPut, and the table of objects it named:
 * on an S3 store a worker PUTs its deltas to the store itself through presigned URLs, then
 * commits them with PushDelta (PAYLOAD_DELTA_OBJECT; svc_push.c, checked and recorded in
 * svc_push_commit.c), so that the coordinator neither receives nor forwards their bytes; and
 * likewise its slot's inner state (DeltaPut.payload; committed with PushInnerState's
 * PAYLOAD_INNER_OBJECT, svc_inner.c, which has the store copy each to the slot's name).
 *
 * Semantic choices:
 *  - Only an active lease of the caller whose Lease.delta_put is set (a job on an S3 store, not
 *    SparseLoCo, fp32 deltas or quantized ones kept as sent; svc_worker.c),
 *    fragments of the lease, each once, with num_floats = the fragment's length, object_bytes =
 *    the blob file's size (docs/design.md §6.4: an fp32 delta, or in a quantized job the stream
 *    as sent, put_delta_object) and a 16-byte MD5. Anything else → INVALID_ARGUMENT or
 *    FAILED_PRECONDITION naming the field; the worker then pushes through PushDelta.
 *  - An object above Lease.delta_put_part_bytes (--s3-put-part-mb) comes in parts: the request
 *    gives each part's MD5, the coordinator starts a multipart upload and presigns one PUT per
 *    part, and the commit completes the upload (svc_push_commit.c) before its checks. The
 *    uploads start on the thread pool and the call is answered after; a store found down
 *    answers UNAVAILABLE before it. Objects and uploads dropped are deleted and aborted on the
 *    thread pool too (rounds_discard).
 *  - Every call names new objects (the delta name with a fresh attempt number, as a streamed
 *    push's spool; for inner state the slot's blob name with one), so a retried prepare never
 *    lets an old URL overwrite a committed object, and a second prepare of the same object
 *    deletes the first one's;
 *    the URL signs the MD5, so it can write only the bytes the worker announced. An upload
 *    whose entry is dropped uncommitted is aborted (an object, deleted).
 *  - The table lives in memory: a coordinator restart forgets it. A commit then names its
 *    object by the attempt number the prepare answered (Chunk.step); one stamped before this
 *    process started is checked without its MD5 (size, then read back whole, as always) and
 *    recorded, so the PUT is not lost; any other unknown commit is refused
 *    (FAILED_PRECONDITION) and the worker pushes the bytes instead. The tick (put_sweep) deletes
 *    the objects of entries whose lease ended uncommitted (a worker killed, revoked or
 *    released) or that are older than two URL lifetimes, so a running job leaves no garbage
 *    behind but what a PUT landing after that leaves (the start-up sweep's). */
#include "coordinator/svc_put.h"

#include "common/codec.h"
#include "common/errors.h"
#include "common/log.h"
#include "coordinator/blobs.h"
#include "coordinator/blobs_s3.h"
#include "coordinator/jobs.h"
#include "coordinator/loop.h"
#include "coordinator/rounds.h"
#include "coordinator/svc.h"
#include "coordinator/testhook.h"
#include "proto/dipaco.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Entries for the same lease and fragment replace each other; at most this many in all. */
#define PUT_MAX_ENTRIES 65536
/* S3's largest single PUT. */
#define PUT_MAX_BYTES ((uint64_t)5 << 30)

static int put_is(const put_prep *e, int64_t lease, int frag, blob_kind kind) {
  return e->lease == lease && e->frag == frag && e->kind == kind;
}

const put_prep *put_prepared(const coord *c, int64_t lease, int frag, blob_kind kind) {
  for (int i = 0; i < c->n_puts; i++)
    if (put_is(&c->puts[i], lease, frag, kind)) return &c->puts[i];
  return NULL;
}

/* Remove entry i (the last one takes its place); with discard, its object or upload too. */
static void put_drop(coord *c, int i, int discard) {
  put_prep *e = &c->puts[i];
  /* On the thread pool; a failed delete or abort leaves the object or upload to the start-up
   * sweep. The object goes too: an upload may have been completed. */
  if (discard) rounds_discard(c, e->name, e->upload_id);
  free(e->part_md5);
  c->puts[i] = c->puts[--c->n_puts];
}

int put_discard(coord *c, int64_t lease, int frag, blob_kind kind) {
  for (int i = 0; i < c->n_puts; i++)
    if (put_is(&c->puts[i], lease, frag, kind)) {
      put_drop(c, i, 1);
      return 1;
    }
  return 0;
}

void put_forget(coord *c, int64_t lease, int frag, blob_kind kind) {
  for (int i = 0; i < c->n_puts; i++)
    if (put_is(&c->puts[i], lease, frag, kind)) {
      put_drop(c, i, 0);
      return;
    }
}

void put_free_all(coord *c) {
  for (int i = 0; i < c->n_puts; i++) free(c->puts[i].part_md5);
  free(c->puts);
  c->puts = NULL;
  c->n_puts = c->cap_puts = 0;
}

/* An entry older than two lives of its URLs (their URLs are dead). */
static int put_old(const put_prep *e, int64_t now) {
  return now - e->made_ms > 2000LL * blob_url_ttl_s(e->url_bytes);
}

/* Drop the entries whose URLs are dead. */
static void put_expire(coord *c, int64_t now) {
  for (int i = 0; i < c->n_puts; i++)
    if (put_old(&c->puts[i], now)) put_drop(c, i--, 1);
}

void put_sweep(coord *c) {
  int64_t now = dpc_wall_ms();
  for (int i = 0; i < c->n_puts; i++) {
    store_lease l;
    int ended = store_get_lease(c->st, c->puts[i].lease, &l) < 0 || l.state != LEASE_ACTIVE;
    if (!ended && !put_old(&c->puts[i], now)) continue;
    DPC_DEBUG("delta object %s: its lease ended before it was committed; dropped", c->puts[i].name);
    put_drop(c, i--, 1);
  }
}

/* The entry for (lease, frag, kind): an earlier one is replaced and its object deleted (its
 * upload aborted), on the thread pool. A worker prepares again only after giving up on the
 * earlier object; a commit of it still under way then fails, and the worker's retry commits
 * the new one, so the earlier object is never wanted. */
static put_prep *put_slot(coord *c, int64_t lease, int frag, blob_kind kind) {
  for (int i = 0; i < c->n_puts; i++)
    if (put_is(&c->puts[i], lease, frag, kind)) {
      rounds_discard(c, c->puts[i].name, c->puts[i].upload_id);
      free(c->puts[i].part_md5);
      c->puts[i].part_md5 = NULL;
      c->puts[i].parts = 0;
      c->puts[i].upload_id[0] = 0;
      return &c->puts[i];
    }
  if (c->n_puts >= PUT_MAX_ENTRIES) return NULL;
  if (c->n_puts == c->cap_puts) {
    int cap = c->cap_puts ? 2 * c->cap_puts : 16;
    put_prep *a = realloc(c->puts, (size_t)cap * sizeof *a);
    if (!a) return NULL;
    c->puts = a;
    c->cap_puts = cap;
  }
  put_prep *e = &c->puts[c->n_puts++];
  memset(e, 0, sizeof *e);
  return e;
}

int put_inner_wants(const coord *c, const coord_job *j) {
  return c->delta_puts && blob_store_is_s3(c->bs) && j->spec.inner.state == INNER_STATE_CHECKPOINT;
}

/* The blob kind an object of the request holds (DeltaPut.payload), for job j; 0 for a payload
 * no put carries. */
static blob_kind put_kind(const coord_job *j, const Dipaco__V1__DeltaPut *d) {
  switch (d->payload) {
  case DIPACO__V1__PAYLOAD__PAYLOAD_PARAMS: /* unset */
  case DIPACO__V1__PAYLOAD__PAYLOAD_DELTA: return BLOB_DELTA;
  case DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_M: return BLOB_INNER_M;
  case DIPACO__V1__PAYLOAD__PAYLOAD_ADAM_V: return BLOB_INNER_V;
  case DIPACO__V1__PAYLOAD__PAYLOAD_LOCAL_PARAMS: return jobspec_streaming(&j->spec) ? BLOB_INNER_L : (blob_kind)0;
  case DIPACO__V1__PAYLOAD__PAYLOAD_EF_BUFFER: return j->spec.sparse.enabled ? BLOB_INNER_E : (blob_kind)0;
  default: return (blob_kind)0;
  }
}

/* The floats of an object of `kind` for a fragment of n: an inner-state M blob carries the
 * AdamW step as two more. */
static uint64_t put_floats(blob_kind kind, uint64_t n) { return kind == BLOB_INNER_M ? n + 2 : n; }

int put_lease_wants(const coord *c, const coord_job *j) {
  return c->delta_puts && blob_store_is_s3(c->bs) &&
         (j->spec.sparse.enabled || j->spec.streaming.codec == DPC_CODEC_FP32 || coord_job_keeps_sent(j));
}

int put_delta_stream(const coord_job *j, int frag, int *codec, uint32_t *block, size_t *bytes) {
  if (j->spec.sparse.enabled) { /* the job's sparse stream, of a size its settings fix */
    *codec = DPC_CODEC_SPARSE;
    *block = 0;
    *bytes = j->sp_bytes[frag];
    return 0;
  }
  *codec = j->spec.streaming.codec;
  *block = dpc_codec_is_block(*codec) ? (uint32_t)j->spec.streaming.block_floats : 0;
  return dpc_codec_bytes(*codec, j->fragments[frag].len, (uint32_t)j->spec.streaming.block_floats, bytes);
}

int put_delta_object(const coord_job *j, int frag, blob_kind *kind, uint64_t *bytes) {
  int codec;
  uint32_t block;
  size_t enc = 0;
  int rc = put_delta_stream(j, frag, &codec, &block, &enc);
  /* fp32: the delta's blob; else the stream as sent, padded to whole floats, in the blob a
   * pushed one is kept as (BLOB_SPARSE, BLOB_ENCODED) */
  *kind = codec == DPC_CODEC_FP32 ? BLOB_DELTA : codec == DPC_CODEC_SPARSE ? BLOB_SPARSE : BLOB_ENCODED;
  *bytes = BLOB_HEADER_BYTES + ((uint64_t)enc + 3) / 4 * 4 + BLOB_TRAILER_BYTES;
  return rc;
}

uint64_t put_part_bytes(const coord *c, const coord_job *j) {
  uint64_t most = 0;
  for (int f = 0; f < j->n_fragments; f++) {
    uint64_t bytes = BLOB_HEADER_BYTES + 4 * put_floats(BLOB_INNER_M, j->fragments[f].len) + BLOB_TRAILER_BYTES;
    if (bytes > most) most = bytes;
  }
  blob_s3 *s3 = blob_store_s3(c->bs);
  uint64_t pb = s3 ? s3_part_bytes(most, c->put_part_bytes, blob_s3_max_parts(s3)) : 0;
  return pb ? pb : c->put_part_bytes; /* beyond S3's object limit: check_put refuses it */
}

/* Check one requested object against the lease (fragment, length, sizes): 0, or -1 with the
 * call finished. */
static int check_put(struct rpc_call *call, coord *c, const coord_job *j, const store_lease *l,
                     const Dipaco__V1__DeltaPut *d, size_t k, const Dipaco__V1__PrepareDeltaPutRequest *r) {
  int64_t base;
  int frag = (int)(d->fragment_id - 1);
  if (d->fragment_id == 0 || d->fragment_id > (uint64_t)j->n_fragments ||
      store_lease_base_version(c->st, l->id, frag, &base) < 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "puts[%zu].fragment_id %llu is not a fragment of lease %lld", k,
                    (unsigned long long)d->fragment_id, (long long)l->id);
    return -1;
  }
  const blob_kind kind = put_kind(j, d);
  if (!kind) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "puts[%zu].payload %d: a put holds a delta or, on a job with inner.state "
                    "checkpoint, PAYLOAD_ADAM_M, PAYLOAD_ADAM_V or the job's third inner-state stream", k, (int)d->payload);
    return -1;
  }
  for (size_t i = 0; i < k; i++)
    if (r->puts[i]->fragment_id == d->fragment_id && put_kind(j, r->puts[i]) == kind) {
      rpc_call_finish(call, RPC_INVALID_ARGUMENT, "puts[%zu].fragment_id %llu appears twice with payload %d", k,
                      (unsigned long long)d->fragment_id, (int)d->payload);
      return -1;
    }
  uint64_t n = put_floats(kind, j->fragments[frag].len);
  uint64_t bytes = BLOB_HEADER_BYTES + 4 * n + BLOB_TRAILER_BYTES;
  blob_kind dk;
  if (kind == BLOB_DELTA && put_delta_object(j, frag, &dk, &bytes) < 0) {
    rpc_call_finish(call, RPC_INTERNAL, "puts[%zu]: %s", k, dpc_errmsg());
    return -1;
  }
  if (d->num_floats != n || d->object_bytes != bytes) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "puts[%zu]: fragment %llu's object holds %llu floats, %llu bytes; got "
                    "num_floats %llu, object_bytes %llu", k, (unsigned long long)d->fragment_id,
                    (unsigned long long)n, (unsigned long long)bytes, (unsigned long long)d->num_floats,
                    (unsigned long long)d->object_bytes);
    return -1;
  }
  uint64_t pb = put_part_bytes(c, j), parts = bytes > pb ? (bytes + pb - 1) / pb : 0;
  if (d->n_part_md5 != parts) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "puts[%zu].part_md5: an object of %llu bytes goes in %llu part(s) of "
                    "%llu bytes (Lease.delta_put_part_bytes), got %zu MD5s", k, (unsigned long long)bytes,
                    (unsigned long long)parts, (unsigned long long)pb, d->n_part_md5);
    return -1;
  }
  blob_s3 *s3 = blob_store_s3(c->bs);
  if (kind != BLOB_DELTA && s3 && bytes > blob_s3_copy_limit(s3)) { /* its commit could not copy it */
    rpc_call_finish(call, RPC_FAILED_PRECONDITION, "puts[%zu]: fragment %llu's inner state of %llu bytes is beyond "
                    "what the store copies (it refused a part copy): push its bytes", k,
                    (unsigned long long)d->fragment_id, (unsigned long long)bytes);
    return -1;
  }
  if (!s3 || parts > (uint64_t)blob_s3_max_parts(s3) || (!parts && bytes > PUT_MAX_BYTES)) {
    rpc_call_finish(call, RPC_FAILED_PRECONDITION, "puts[%zu]: fragment %llu's object of %llu bytes is beyond what "
                    "puts in parts of %llu bytes can hold: push its bytes", k, (unsigned long long)d->fragment_id,
                    (unsigned long long)bytes, (unsigned long long)pb);
    return -1;
  }
  for (size_t i = 0; i < d->n_part_md5; i++)
    if (d->part_md5[i].len != 16) {
      rpc_call_finish(call, RPC_INVALID_ARGUMENT, "puts[%zu].part_md5[%zu]: 16 bytes (an MD5), got %zu", k, i,
                      d->part_md5[i].len);
      return -1;
    }
  if (d->content_md5.len != 16) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "puts[%zu].content_md5: 16 bytes (an MD5), got %zu", k,
                    d->content_md5.len);
    return -1;
  }
  return 0;
}

/* The lease of the request: the caller's, active, with delta puts. NULL with the call finished. */
static coord_job *put_lease(struct rpc_call *call, coord *c, int64_t worker,
                            const Dipaco__V1__PrepareDeltaPutRequest *r, store_lease *l) {
  if (r->lease_id == 0 || r->lease_id > INT64_MAX || store_get_lease(c->st, (int64_t)r->lease_id, l) < 0) {
    rpc_call_finish(call, RPC_NOT_FOUND, "lease_id %llu: no such lease", (unsigned long long)r->lease_id);
    return NULL;
  }
  if (l->worker != worker) {
    rpc_call_finish(call, RPC_PERMISSION_DENIED, "lease %lld belongs to another worker", (long long)l->id);
    return NULL;
  }
  if (l->state != LEASE_ACTIVE) {
    rpc_call_finish(call, RPC_ABORTED, "lease %lld is no longer active; drop the work and ask for a new lease",
                    (long long)l->id);
    return NULL;
  }
  coord_job *j = coord_job_get(c, l->job);
  int deltas = 0, inner = 0;
  for (size_t k = 0; j && k < r->n_puts; k++) {
    blob_kind kind = put_kind(j, r->puts[k]);
    deltas |= kind == BLOB_DELTA;
    inner |= kind && kind != BLOB_DELTA;
  }
  if (!j || (deltas && !put_lease_wants(c, j)) || (inner && !put_inner_wants(c, j))) {
    rpc_call_finish(call, RPC_FAILED_PRECONDITION, "lease %lld: its %s go through %s (%s)", (long long)l->id,
                    inner ? "inner state" : "deltas", inner ? "PushInnerState" : "PushDelta",
                    !blob_store_is_s3(c->bs) ? "this coordinator keeps its blobs on its own disk"
                    : !c->delta_puts        ? "the coordinator runs with --no-delta-puts"
                    : inner                 ? "only the inner state of jobs with inner.state checkpoint is put"
                                            : "only deltas of jobs without SparseLoCo, fp32 or kept as sent, are put");
    return NULL;
  }
  if (r->n_puts == 0) {
    rpc_call_finish(call, RPC_INVALID_ARGUMENT, "puts: at least one fragment");
    return NULL;
  }
  char why[256];
  if (!blob_store_health(c->bs, why, sizeof why, NULL)) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "the blob store is unavailable (%s); push again later", why);
    return NULL;
  }
  return j;
}

static void out_free(Dipaco__V1__DeltaPut *o) {
  if (o->url != protobuf_c_empty_string) free(o->url); /* (the init's default) */
  for (size_t i = 0; i < o->n_part_urls; i++) free(o->part_urls[i]);
  free(o->part_urls);
}

/* Name one fragment's object, record its entry and fill the answer *o (strings malloc'd:
 * out_free): a single PUT is presigned at once; an object in parts gets its part URLs once its
 * multipart upload has started (prep_begin_run, prep_after). */
static int prepare_one(coord *c, const coord_job *j, const store_lease *l, const Dipaco__V1__DeltaPut *d,
                       uint64_t all_bytes, int64_t now, Dipaco__V1__DeltaPut *o) {
  int frag = (int)(d->fragment_id - 1);
  const blob_kind kind = put_kind(j, d);
  dipaco__v1__delta_put__init(o);
  put_prep *e = put_slot(c, l->id, frag, kind);
  if (!e) return dpc_err(DPC_ENOMEM, "too many put objects in flight");
  char url[S3_URL_MAX];
  /* A delta's name carries its lease; inner state's its slot, as the blob the commit copies it
   * to (svc_inner.c), and the attempt stamp keeps it apart from that blob. */
  int64_t aux = kind == BLOB_DELTA ? l->id : (int64_t)l->path * j->spec.replicas + l->replica + 1;
  blob_id id = {.job = l->job, .fragment = frag, .version = l->round, .aux = aux, .attempt = ++c->push_seq,
                .kind = kind};
  uint64_t ob; /* (a delta's object: fp32 or, in a quantized job, the stream as sent) */
  int rc = kind == BLOB_DELTA ? put_delta_object(j, frag, &id.kind, &ob) : 0;
  if (!rc) rc = blob_name(&id, e->name, sizeof e->name);
  e->lease = l->id;
  e->frag = frag;
  e->kind = kind;
  const int parts = (int)d->n_part_md5;
  if (!rc && parts == 0) {
    rc = blob_store_put_url(c->bs, e->name, d->content_md5.data, all_bytes, url, sizeof url);
    if (!rc && !(o->url = strdup(url))) rc = dpc_err(DPC_ENOMEM, "out of memory");
  } else if (!rc) {
    e->part_md5 = malloc((size_t)parts * sizeof *e->part_md5);
    o->part_urls = calloc((size_t)parts, sizeof *o->part_urls);
    rc = e->part_md5 && o->part_urls ? 0 : dpc_err(DPC_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < parts; i++) memcpy(e->part_md5[i], d->part_md5[i].data, 16);
  }
  if (rc < 0) {
    put_discard(c, l->id, frag, kind);
    return rc;
  }
  e->parts = parts;
  e->part_bytes = parts ? put_part_bytes(c, j) : 0;
  e->attempt = id.attempt;
  e->crc = d->crc32c;
  e->bytes = d->object_bytes;
  memcpy(e->md5, d->content_md5.data, 16);
  e->made_ms = now;
  e->url_bytes = all_bytes;
  o->fragment_id = d->fragment_id;
  o->num_floats = d->num_floats;
  o->crc32c = d->crc32c;
  o->object_bytes = d->object_bytes;
  o->attempt = (uint64_t)id.attempt;
  o->payload = d->payload;
  return 0;
}

/* A PrepareDeltaPut being answered: its objects are named; those in parts wait for their
 * multipart uploads, started on the thread pool (each is a request to the store, which must
 * not hold up the loop thread while the store is slow). */
typedef struct {
  char name[BLOB_NAME_MAX]; /* the entry's object as named by this call */
  int multi;                /* in parts: its upload starts on the thread pool */
  blob_kind kind;
  char upload_id[512];
  int rc;
  char err[256];
} prep_upload;

typedef struct {
  svc_hold hold;
  uv_work_t req;
  coord *c;
  int64_t lease;
  size_t n;
  Dipaco__V1__DeltaPut *out; /* [n] the answer */
  Dipaco__V1__DeltaPut **op;
  prep_upload *up; /* [n] */
} prep_work;

static void prep_free(prep_work *w) {
  for (size_t k = 0; w->out && k < w->n; k++) out_free(&w->out[k]);
  free(w->out);
  free(w->op);
  free(w->up);
  free(w);
}

/* The call failed: drop the entries it named that are still there (nobody will put them). */
static void prep_drop(coord *c, prep_work *w) {
  for (size_t k = 0; k < w->n; k++) {
    const put_prep *e = put_prepared(c, w->lease, (int)(w->out[k].fragment_id - 1), w->up[k].kind);
    if (e && strcmp(e->name, w->up[k].name) == 0) put_discard(c, w->lease, e->frag, e->kind);
  }
}

static void prep_begin_run(uv_work_t *req) {
  prep_work *w = req->data;
  int ms = testhook_pool_delay_ms();
  if (ms > 0) uv_sleep((unsigned)ms);
  for (size_t k = 0; k < w->n; k++) {
    prep_upload *u = &w->up[k];
    if (!u->multi) continue;
    u->rc = blob_store_upload_begin(w->c->bs, u->name, u->upload_id, sizeof u->upload_id);
    if (u->rc < 0) snprintf(u->err, sizeof u->err, "%s", dpc_errmsg());
  }
}

/* Upload k's start has ended: give its entry the upload and presign a PUT per part into the
 * answer. With drop (the call is gone, or another object of it failed), or when the entry was
 * dropped or replaced meanwhile (its lease ended, a newer prepare), the entry and the upload
 * go instead. */
static int prep_parts(coord *c, prep_work *w, size_t k, int drop) {
  prep_upload *u = &w->up[k];
  int frag = (int)(w->out[k].fragment_id - 1);
  put_prep *e = (put_prep *)put_prepared(c, w->lease, frag, u->kind);
  if (e && strcmp(e->name, u->name) != 0) e = NULL;
  if (u->rc < 0) {
    if (e) put_discard(c, w->lease, frag, u->kind);
    return dpc_err(u->rc, "%s", u->err);
  }
  if (!e || drop) {
    if (e) {
      snprintf(e->upload_id, sizeof e->upload_id, "%s", u->upload_id);
      put_discard(c, w->lease, frag, u->kind); /* (aborts the upload) */
    } else {
      rounds_discard(c, u->name, u->upload_id);
    }
    return drop ? DPC_ECANCELED
                : dpc_err(DPC_ESTATE, "the lease ended, or a newer PrepareDeltaPut replaced this one, while its "
                                      "upload started");
  }
  snprintf(e->upload_id, sizeof e->upload_id, "%s", u->upload_id);
  char url[S3_URL_MAX];
  Dipaco__V1__DeltaPut *o = &w->out[k];
  for (int i = 0; i < e->parts; i++) {
    int rc = blob_store_part_url(c->bs, e->name, e->upload_id, i + 1, e->part_md5[i], e->url_bytes, url, sizeof url);
    if (!rc && !(o->part_urls[o->n_part_urls++] = strdup(url))) rc = dpc_err(DPC_ENOMEM, "out of memory");
    if (rc < 0) {
      put_discard(c, w->lease, frag, u->kind); /* (aborts the upload) */
      return rc;
    }
  }
  return 0;
}

static void prep_reply(struct rpc_call *call, prep_work *w) {
  Dipaco__V1__PrepareDeltaPutResponse resp = DIPACO__V1__PREPARE_DELTA_PUT_RESPONSE__INIT;
  resp.n_puts = w->n;
  resp.puts = w->op;
  rpc_call_reply(call, &resp.base);
  DPC_DEBUG("lease %lld: %zu delta object(s) prepared", (long long)w->lease, w->n);
}

static void prep_after(uv_work_t *req, int status) {
  prep_work *w = req->data;
  coord *c = w->c;
  svc_hold_remove(c, &w->hold);
  struct rpc_call *call = w->hold.call;
  int failed = 0;
  for (size_t k = 0; k < w->n; k++) {
    prep_upload *u = &w->up[k];
    if (!u->multi) continue;
    if (status && u->rc == 0) { /* (libuv never cancels started work; kept for the contract) */
      u->rc = DPC_ECANCELED;
      snprintf(u->err, sizeof u->err, "canceled");
    }
    int rc = prep_parts(c, w, k, failed || !call);
    if (rc < 0 && !failed && call)
      rpc_call_finish(call, rpc_code_from_dpc(rc), "fragment %llu's object: %s",
                      (unsigned long long)w->out[k].fragment_id, dpc_errmsg());
    failed |= rc < 0;
  }
  if (failed) prep_drop(c, w);
  if (call && !failed) prep_reply(call, w);
  prep_free(w);
  loop_work_done(c);
}

static void on_prepare(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  coord *c = ud;
  int64_t worker;
  if (svc_authenticate(c, call, &worker, 0) < 0) return;
  ProtobufCMessage *pm;
  if (svc_unpack(call, req, &dipaco__v1__prepare_delta_put_request__descriptor, &pm)) return;
  Dipaco__V1__PrepareDeltaPutRequest *r = (Dipaco__V1__PrepareDeltaPutRequest *)pm;
  svc_touch(c, worker, -1);
  store_lease l;
  coord_job *j = put_lease(call, c, worker, r, &l);
  size_t n = j ? r->n_puts : 0;
  for (size_t k = 0; k < n; k++)
    if (check_put(call, c, j, &l, r->puts[k], k, r) < 0) n = 0, j = NULL;
  prep_work *w = j ? calloc(1, sizeof *w) : NULL;
  if (w) {
    w->out = calloc(n, sizeof *w->out);
    w->op = calloc(n, sizeof *w->op);
    w->up = calloc(n, sizeof *w->up);
  }
  if (j && (!w || !w->out || !w->op || !w->up)) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    j = NULL;
  }
  int64_t now = dpc_wall_ms();
  if (j) put_expire(c, now);
  uint64_t all_bytes = 0; /* the worker puts the objects one after another: the URLs must outlive them all */
  for (size_t k = 0; j && k < n; k++) all_bytes += r->puts[k]->object_bytes;
  int uploads = 0;
  for (size_t k = 0; j && k < n; k++) {
    w->op[k] = &w->out[k];
    w->n = k + 1;
    int rc = prepare_one(c, j, &l, r->puts[k], all_bytes, now, &w->out[k]);
    if (rc < 0) {
      rpc_call_finish(call, rpc_code_from_dpc(rc), "fragment %llu's object: %s",
                      (unsigned long long)r->puts[k]->fragment_id, dpc_errmsg());
      w->n = k; /* (prepare_one dropped its own entry) */
      w->lease = l.id;
      prep_drop(c, w);
      w->n = k + 1; /* (its answer is freed with the others) */
      j = NULL;
    } else {
      w->up[k].kind = put_kind(j, r->puts[k]);
      snprintf(w->up[k].name, sizeof w->up[k].name, "%s",
               put_prepared(c, l.id, (int)(r->puts[k]->fragment_id - 1), w->up[k].kind)->name);
      w->up[k].multi = r->puts[k]->n_part_md5 > 0;
      uploads += w->up[k].multi;
    }
  }
  if (j && !uploads) {
    prep_reply(call, w);
  } else if (j) {
    w->c = c;
    w->lease = l.id;
    w->req.data = w;
    if (loop_queue_work(c, &w->req, prep_begin_run, prep_after) == 0) {
      svc_hold_add(c, &w->hold, call);
      w = NULL;
    } else {
      prep_drop(c, w);
      rpc_call_finish(call, RPC_UNAVAILABLE, "cannot start the multipart uploads now; push again later");
    }
  }
  if (w) prep_free(w);
  protobuf_c_message_free_unpacked(pm, NULL);
}

/* PrepareDeltaPut's end: a prepare still starting its uploads forgets the call. */
static void prep_on_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)cancelled;
  svc_hold_forget(ud, call);
}

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Coordinator/PrepareDeltaPut", .kind = RPC_UNARY, .on_call = on_prepare,
     .on_done = prep_on_done},
};

int svc_put_methods(coord *c, struct rpc_method *out) {
  return svc_methods_add(out, methods, (int)(sizeof methods / sizeof methods[0]), c);
}
