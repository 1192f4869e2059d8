/* dataplane_client.c — the data-plane benchmark's simulated workers (run by
 * tests/bench/dataplane.sh): N workers, each a thread with its own TCP connection, speaking the
 * real dipaco.v1.Coordinator protocol against a sync DiLoCo job of a real model size, without
 * training, so that the coordinator's transfers, outer steps and round overhead are measured
 * alone.
 *
 *   dataplane_client --coordinator ADDR --job ID --workers N [--token-file F] [--timeout-s S]
 *                    [--train-ms MS]
 *   dataplane_client --memory-pass R FLOATS
 *
 * Per lease a worker pulls every fragment (chunks copied into a 4 MiB scratch buffer, CRC-32C
 * checked incrementally: a worker holds no model copy, so N workers fit beside a 1B model;
 * from the object store in one GET when the lease carries a presigned URL, as
 * worker/lease.c does),
 * then, with --train-ms, sleeps that long (the inner steps of a real worker, during which the
 * coordinator's background work, such as an S3 store's momentum upload, is off the workers'
 * path; without it every push overlaps the other workers' pulls), then pushes a delta of tiny finite values (one 4 MiB pattern sent zero-copy as every chunk;
 * the stream's CRC is computed once per fragment length; in a quantized job the pattern repeated
 * and encoded in the lease's codec, once per length), or, when the lease says delta_put (an fp32
 * blob, or the encoded stream padded to whole floats),
 * puts it in the object store as worker/lease.c does (PrepareDeltaPut, a PUT of the blob object
 * streamed from the pattern, in parts four at a time above the lease's part size, its MD5s computed
 * once per length, and the commit). It prints one line per lease
 * ("lease ROUND REPLICA pull_start pull_end push_start push_end BYTES_PULLED BYTES_PUSHED",
 * seconds on one monotonic clock) and, per round, the aggregate pull and push rates (bytes of
 * every worker over the span from the first start to the last end) and the round overhead:
 * the last push of round t acknowledged (durable at the coordinator) -> the last pull of round
 * t + 1 done (every worker has the new version).
 *
 * --memory-pass R FLOATS: the plain memory pass the outer step is compared with: the weighted
 * sum of R deltas (outer_average) and the Nesterov update over FLOATS floats, in memory, best
 * of 3; prints "memory_pass_s SECONDS". */
#include "common/auth.h"
#include "common/checksum.h"
#include "common/codec.h"
#include "common/errors.h"
#include "common/rpc.h"
#include "kernels/outer.h"
#include "proto/dipaco.pb-c.h"
#include "worker/storeget.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SVC "/dipaco.v1.Coordinator/"
#define MAX_FRAGS 64
#define PUT_PARTS_MAX 64 /* parts of one delta object here: 64 GiB at the default 1 GiB parts */
#define MAX_LEASES 4096
#define PATTERN_BYTES RPC_CHUNK_DEFAULT

typedef struct {
  int round, replica;
  double pull0, pull1, push0, push1;
  uint64_t pulled, pushed;
} lease_rec;

static struct {
  const char *target;
  uint64_t job;
  int n;
  double deadline;
  long train_ms; /* simulated inner steps between pull and push */
  char bearer[DPC_TOKEN_MAX + 8];
  unsigned char *pattern; /* PATTERN_BYTES of tiny finite floats, the bytes of every pushed chunk */
  pthread_mutex_t mu;
  lease_rec rec[MAX_LEASES];
  int nrec;
  atomic_int failed;
  char why[300];
  /* stream CRCs of a delta of n floats made of the pattern, memoised per length */
  uint64_t crc_len[MAX_FRAGS];
  uint32_t crc_val[MAX_FRAGS];
  int ncrc;
  /* a quantized job's delta (Lease.delta_codec): the pattern repeated, encoded, memoised per
   * fragment length, with its CRC-32C */
  uint64_t enc_n[MAX_FRAGS];
  unsigned char *enc[MAX_FRAGS];
  size_t enc_bytes[MAX_FRAGS];
  uint32_t enc_crc[MAX_FRAGS];
  int nenc;
} G;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fail(const char *what) {
  pthread_mutex_lock(&G.mu);
  if (!atomic_load(&G.failed)) snprintf(G.why, sizeof G.why, "%s: %s", what, dpc_errmsg());
  atomic_store(&G.failed, 1);
  pthread_mutex_unlock(&G.mu);
}

static void no_release(void *ud) { (void)ud; }

/* CRC-32C of a delta stream of `bytes` bytes, chunked as the pattern repeated. */
static uint32_t stream_crc(uint64_t bytes) {
  pthread_mutex_lock(&G.mu);
  for (int i = 0; i < G.ncrc; i++)
    if (G.crc_len[i] == bytes) {
      uint32_t v = G.crc_val[i];
      pthread_mutex_unlock(&G.mu);
      return v;
    }
  uint32_t crc = 0;
  for (uint64_t off = 0; off < bytes; off += PATTERN_BYTES) {
    uint64_t len = bytes - off < PATTERN_BYTES ? bytes - off : PATTERN_BYTES;
    crc = dpc_crc32c(crc, G.pattern, (size_t)len);
  }
  if (G.ncrc < MAX_FRAGS) {
    G.crc_len[G.ncrc] = bytes;
    G.crc_val[G.ncrc++] = crc;
  }
  pthread_mutex_unlock(&G.mu);
  return crc;
}

static int do_register(struct rpc_client *c, int idx) {
  Dipaco__V1__RegisterRequest req = DIPACO__V1__REGISTER_REQUEST__INIT;
  char host[32];
  snprintf(host, sizeof host, "dataplane-%d", idx);
  req.hostname = host;
  req.backend = "cpu";
  req.version = "dataplane_client";
  req.threads = 1;
  if (G.bearer[0]) rpc_client_set_md(c, RPC_MD_AUTHORIZATION, G.bearer);
  ProtobufCMessage *pm = NULL;
  int rc = rpc_unary(c, SVC "Register", &req.base, &dipaco__v1__register_response__descriptor, &pm, 30000);
  rpc_client_set_md(c, RPC_MD_AUTHORIZATION, NULL);
  if (rc) return rc;
  Dipaco__V1__RegisterResponse *r = (Dipaco__V1__RegisterResponse *)pm;
  char id[32];
  snprintf(id, sizeof id, "%" PRIu64, r->worker_id);
  rc = rpc_client_set_md(c, RPC_MD_WORKER_ID, id);
  if (!rc) rc = rpc_client_set_md(c, RPC_MD_SESSION, r->session_token ? r->session_token : "");
  protobuf_c_message_free_unpacked(pm, NULL);
  return rc;
}

/* A pull from the store, one GET: each piece is copied where a worker's buffer would hold it
 * (the scratch buffer, wrapping) and checksummed. */
typedef struct {
  unsigned char *scratch;
  uint32_t crc;
} store_sink;

static int store_take(void *ud, uint64_t at, const void *p, size_t n) {
  store_sink *k = ud;
  const unsigned char *b = p;
  while (n > 0) {
    size_t o = (size_t)(at % PATTERN_BYTES), m = PATTERN_BYTES - o < n ? PATTERN_BYTES - o : n;
    memcpy(k->scratch + o, b, m);
    k->crc = dpc_crc32c(k->crc, k->scratch + o, m);
    at += m;
    b += m;
    n -= m;
  }
  return 0;
}

/* Pull fragment fi of lease L through a 4 MiB scratch buffer; *bytes gets its size. */
static int pull_fragment(struct rpc_client *c, const Dipaco__V1__Lease *L, size_t fi, unsigned char *scratch,
                         uint64_t *bytes) {
  const Dipaco__V1__FragmentInfo *fr = L->fragments[fi];
  if (fr->params_url && fr->params_url[0]) { /* the blob's payload starts after its 24-byte header */
    uint64_t total = fr->num_floats * 4;
    store_sink k = {.scratch = scratch};
    int rc = storeget_stream(fr->params_url, 24, total, store_take, &k, 600000);
    if (rc) return rc;
    if (fr->crc32c && k.crc != fr->crc32c)
      return dpc_err(DPC_ECHECKSUM, "pull from the store: CRC-32C 0x%08x, the version's is 0x%08x", k.crc, fr->crc32c);
    *bytes = total;
    return 0;
  }
  Dipaco__V1__PullFragmentRequest pr = DIPACO__V1__PULL_FRAGMENT_REQUEST__INIT;
  pr.lease_id = L->lease_id;
  pr.fragment_id = fr->fragment_id;
  pr.version = fr->version;
  pr.codec = DIPACO__V1__CODEC__CODEC_FP32;
  struct rpc_stream *s = NULL;
  int rc = rpc_stream_open(c, SVC "PullFragment", &pr.base, 600000, &s);
  if (rc) return rc;
  uint64_t next = 0, total = fr->num_floats * 4;
  uint32_t crc = 0, want = 0;
  for (;;) {
    struct grpc_byte_buffer *m = NULL;
    rc = rpc_stream_read(s, &m);
    if (rc <= 0) break;
    struct rpc_chunk ch;
    rc = rpc_chunk_parse(m, &ch);
    if (!rc && (ch.offset != next || ch.total != total || ch.len > PATTERN_BYTES + 4096))
      rc = dpc_err(DPC_EFORMAT, "pull: chunk at %" PRIu64 " of %" PRIu64 " (expected %" PRIu64 " of %" PRIu64 ")",
                   ch.offset, ch.total, next, total);
    if (!rc) rc = rpc_chunk_copy(m, &ch, scratch);
    rpc_msg_free(m);
    if (rc) break;
    crc = dpc_crc32c(crc, scratch, (size_t)ch.len);
    next += ch.len;
    if (next == total) want = ch.crc32c;
  }
  int frc = rpc_stream_finish(s, NULL, NULL);
  rpc_stream_free(s);
  if (rc < 0) return rc;
  if (frc) return frc;
  if (next != total) return dpc_err(DPC_EFORMAT, "pull: stream ended at byte %" PRIu64 " of %" PRIu64, next, total);
  if (crc != want) return dpc_err(DPC_ECHECKSUM, "pull: CRC-32C 0x%08x, the stream says 0x%08x", crc, want);
  *bytes = total;
  return 0;
}

/* The end of a PushDelta stream whose writes ended with rc: every fragment must be ACCEPTED. */
static int finish_push(struct rpc_stream *s, int rc) {
  ProtobufCMessage *pm = NULL;
  int frc = rpc_stream_finish(s, &dipaco__v1__push_delta_response__descriptor, &pm);
  rpc_stream_free(s);
  if (!frc && pm) {
    Dipaco__V1__PushDeltaResponse *r = (Dipaco__V1__PushDeltaResponse *)pm;
    for (size_t a = 0; a < r->n_acks && !rc; a++)
      if (r->acks[a]->result != DIPACO__V1__PUSH_RESULT__PUSH_ACCEPTED)
        rc = dpc_err(DPC_ESTATE, "push: fragment %" PRIu64 " ack %d, expected ACCEPTED", r->acks[a]->fragment_id,
                     r->acks[a]->result);
    protobuf_c_message_free_unpacked(pm, NULL);
  }
  return rc ? rc : frc;
}

/* The encoded delta of n floats (the pattern repeated) in the lease's codec: index into G.enc*,
 * made once per length (the pattern is a whole number of blocks, so encoding it piece by piece
 * gives the whole stream's bytes); -1 on failure. */
static int encoded_delta(const Dipaco__V1__Lease *L, uint64_t n) {
  pthread_mutex_lock(&G.mu);
  int i = 0;
  while (i < G.nenc && G.enc_n[i] != n) i++;
  if (i == G.nenc && i < MAX_FRAGS) {
    const int codec = (int)L->delta_codec;
    const uint32_t block = L->delta_block_floats;
    const uint64_t per = PATTERN_BYTES / sizeof(float);
    size_t total = 0, at = 0, b = 0;
    int rc = dpc_codec_bytes(codec, n, block, &total);
    unsigned char *e = rc ? NULL : calloc(1, (total + 3) / 4 * 4 + 4); /* (zero padding: a put object's) */
    for (uint64_t off = 0; e && off < n && !rc; off += per) {
      const uint64_t k = n - off < per ? n - off : per;
      rc = dpc_codec_bytes(codec, k, block, &b);
      if (!rc) rc = dpc_codec_encode(codec, (const float *)(const void *)G.pattern, (size_t)k, block, e + at);
      at += b;
    }
    if (!e || rc || at != total) {
      free(e);
      pthread_mutex_unlock(&G.mu);
      return -1;
    }
    G.enc_n[i] = n;
    G.enc[i] = e;
    G.enc_bytes[i] = total;
    G.enc_crc[i] = dpc_crc32c(0, e, total);
    G.nenc++;
  }
  pthread_mutex_unlock(&G.mu);
  return i < G.nenc ? i : -1;
}

/* Push every fragment's delta on one PushDelta stream, in chunks of the pattern's size: fp32, the
 * pattern itself zero-copy as every chunk; in a quantized job (Lease.delta_codec) the pattern
 * repeated and encoded (encoded_delta). */
static int push_delta(struct rpc_client *c, const Dipaco__V1__Lease *L, uint64_t *bytes) {
  const int fp32 = L->delta_codec == DIPACO__V1__CODEC__CODEC_FP32;
  struct rpc_stream *s = NULL;
  int rc = rpc_stream_open(c, SVC "PushDelta", NULL, 600000, &s);
  if (rc) return rc;
  *bytes = 0;
  for (size_t f = 0; f < L->n_fragments && !rc; f++) {
    const Dipaco__V1__FragmentInfo *fr = L->fragments[f];
    const int k = fp32 ? 0 : encoded_delta(L, fr->num_floats);
    if (k < 0) {
      rc = dpc_err(DPC_ENOMEM, "cannot encode a %" PRIu64 "-float delta", fr->num_floats);
      break;
    }
    const uint64_t total = fp32 ? fr->num_floats * 4 : G.enc_bytes[k];
    const uint32_t crc = fp32 ? stream_crc(total) : G.enc_crc[k];
    for (uint64_t off = 0; off < total && !rc; off += PATTERN_BYTES) {
      struct rpc_chunk h;
      memset(&h, 0, sizeof h);
      h.lease_id = L->lease_id;
      h.fragment_id = fr->fragment_id;
      h.version = fr->version;
      h.codec = L->delta_codec;
      h.block_floats = fp32 ? 0 : L->delta_block_floats;
      h.num_floats = fr->num_floats;
      h.inner_steps = L->inner_steps;
      h.tokens = 1;
      h.payload = DIPACO__V1__PAYLOAD__PAYLOAD_DELTA;
      h.offset = off;
      h.total = total;
      h.len = total - off < PATTERN_BYTES ? total - off : PATTERN_BYTES;
      if (off + h.len == total) h.crc32c = crc;
      struct grpc_byte_buffer *m = rpc_chunk_encode(&h, fp32 ? G.pattern : G.enc[k] + off, no_release, NULL);
      rc = m ? rpc_stream_write(s, m) : DPC_ENOMEM;
    }
    *bytes += total;
  }
  return finish_push(s, rc);
}

/* A delta of `bytes` pattern bytes as a blob object (docs/design.md §6.4: header, payload,
 * trailer), with its MD5 and, above the lease's part size, each part's; the digests are
 * computed once per (length, part size), like stream_crc. */
typedef struct {
  unsigned char header[24], trailer[8], md5[16];
  uint64_t bytes, part_bytes;
  uint32_t crc;             /* what the commit names: the fp32 payload's, or the stream's */
  int parts;                /* 0: one PUT */
  unsigned char (*pmd5)[16]; /* [parts], shared by every object of this shape; never freed */
  const unsigned char *data; /* NULL: the pattern repeated (fp32); else a quantized stream, padded */
  uint64_t stream;           /* the stream's bytes (what the commit's total says) */
} put_obj;

static void le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* The object's bytes [at, end), the payload streamed from the pattern. */
typedef struct {
  const put_obj *o;
  uint64_t at, end;
} put_src;

static size_t put_read(char *dst, size_t sz, size_t nm, void *ud) {
  put_src *s = ud;
  size_t cap = sz * nm, out = 0;
  while (out < cap && s->at < s->end) {
    const unsigned char *src;
    uint64_t left;
    if (s->at < 24) src = s->o->header + s->at, left = 24 - s->at;
    else if (s->at < 24 + s->o->bytes && s->o->data) {
      src = s->o->data + (s->at - 24);
      left = 24 + s->o->bytes - s->at;
    } else if (s->at < 24 + s->o->bytes) {
      uint64_t p = (s->at - 24) % PATTERN_BYTES;
      src = G.pattern + p;
      left = PATTERN_BYTES - p;
      if (left > 24 + s->o->bytes - s->at) left = 24 + s->o->bytes - s->at;
    } else src = s->o->trailer + (s->at - 24 - s->o->bytes), left = 24 + s->o->bytes + 8 - s->at;
    if (left > s->end - s->at) left = s->end - s->at;
    size_t k = left < cap - out ? (size_t)left : cap - out;
    memcpy(dst + out, src, k);
    out += k;
    s->at += k;
  }
  return out;
}

/* MD5 of the object's bytes [at, end) into md (one more pass over them: no copy is kept). */
static void obj_md5(const put_obj *o, uint64_t at, uint64_t end, unsigned char md[16], unsigned char *buf) {
  EVP_MD_CTX *m = EVP_MD_CTX_new();
  unsigned int ml = 0;
  EVP_DigestInit_ex(m, EVP_md5(), NULL);
  put_src src = {.o = o, .at = at, .end = end};
  for (size_t k; (k = put_read((char *)buf, 1, PATTERN_BYTES, &src)) > 0;) EVP_DigestUpdate(m, buf, k);
  EVP_DigestFinal_ex(m, md, &ml);
  EVP_MD_CTX_free(m);
}

/* The object of a delta of `bytes` payload bytes: fp32 (data NULL, the pattern repeated) or, in
 * a quantized job, the stream at data (index k of G.enc), padded to whole floats. */
static int make_obj(put_obj *o, uint64_t bytes, uint64_t part_bytes, int k) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static put_obj done[MAX_FRAGS];
  static int n;
  memset(o, 0, sizeof *o);
  o->data = k >= 0 ? G.enc[k] : NULL;
  o->bytes = k >= 0 ? (G.enc_bytes[k] + 3) / 4 * 4 : bytes;
  o->stream = k >= 0 ? G.enc_bytes[k] : bytes;
  o->crc = k >= 0 ? G.enc_crc[k] : stream_crc(bytes);
  le32(o->header, 0x42435044u);
  le32(o->header + 4, 1);
  le32(o->header + 8, k >= 0 ? 10 : 3); /* a quantized stream as sent, or an fp32 delta */
  for (int i = 0; i < 8; i++) o->header[16 + i] = (unsigned char)((o->bytes / 4) >> (8 * i));
  le32(o->trailer, k >= 0 ? dpc_crc32c(0, o->data, o->bytes) : o->crc);
  le32(o->trailer + 4, dpc_crc32c(0, o->header, 24));
  const uint64_t total = 24 + o->bytes + 8;
  o->part_bytes = part_bytes;
  o->parts = part_bytes && total > part_bytes ? (int)((total + part_bytes - 1) / part_bytes) : 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < n; i++)
    if (done[i].bytes == o->bytes && done[i].part_bytes == part_bytes && done[i].data == o->data) {
      memcpy(o->md5, done[i].md5, 16);
      o->pmd5 = done[i].pmd5;
      pthread_mutex_unlock(&mu);
      return 0;
    }
  unsigned char *buf = malloc(PATTERN_BYTES);
  if (o->parts) o->pmd5 = malloc((size_t)o->parts * 16);
  if (!buf || (o->parts && !o->pmd5)) {
    free(buf);
    pthread_mutex_unlock(&mu);
    return dpc_err(DPC_ENOMEM, "out of memory");
  }
  obj_md5(o, 0, total, o->md5, buf);
  for (int k = 0; k < o->parts; k++) {
    uint64_t at = (uint64_t)k * part_bytes;
    obj_md5(o, at, at + part_bytes < total ? at + part_bytes : total, o->pmd5[k], buf);
  }
  free(buf);
  if (n < MAX_FRAGS) done[n++] = *o;
  pthread_mutex_unlock(&mu);
  return 0;
}

static size_t put_sink(char *p, size_t sz, size_t nm, void *ud) {
  (void)p;
  (void)ud;
  return sz * nm;
}

/* PUT the object's bytes [at, end) with their MD5 to url (a whole object or one part). */
static int put_range(const char *url, const put_obj *o, uint64_t at, uint64_t end, const unsigned char md5[16]) {
  CURL *e = curl_easy_init();
  if (!e) return DPC_ENOMEM;
  unsigned char b64[32];
  char hdr[64];
  EVP_EncodeBlock(b64, md5, 16);
  snprintf(hdr, sizeof hdr, "Content-MD5: %s", (const char *)b64);
  struct curl_slist *h = curl_slist_append(curl_slist_append(NULL, hdr), "Expect:");
  put_src src = {.o = o, .at = at, .end = end};
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)(end - at));
  curl_easy_setopt(e, CURLOPT_READFUNCTION, put_read);
  curl_easy_setopt(e, CURLOPT_READDATA, &src);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, put_sink);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 600000L);
  CURLcode cc = curl_easy_perform(e);
  long st = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st);
  curl_easy_cleanup(e);
  curl_slist_free_all(h);
  if (cc != CURLE_OK || st / 100 != 2)
    return dpc_err(DPC_EIO, "PUT of a delta object: %s, HTTP %ld", curl_easy_strerror(cc), st);
  return 0;
}

typedef struct {
  const put_obj *o;
  const Dipaco__V1__DeltaPut *u;
} put_job;

static int put_part(void *ud, int k) {
  const put_job *j = ud;
  const uint64_t total = 24 + j->o->bytes + 8, at = (uint64_t)k * j->o->part_bytes;
  return put_range(j->u->part_urls[k], j->o, at, at + j->o->part_bytes < total ? at + j->o->part_bytes : total,
                   j->o->pmd5[k]);
}

/* The object whole, or its parts four at a time as worker/lease.c puts them. */
static int put_one(const Dipaco__V1__DeltaPut *u, const put_obj *o) {
  if (!o->parts) return put_range(u->url, o, 0, 24 + o->bytes + 8, o->md5);
  if (u->n_part_urls != (size_t)o->parts)
    return dpc_err(DPC_EFORMAT, "PrepareDeltaPut: %zu part URLs for %d parts", u->n_part_urls, o->parts);
  put_job j = {.o = o, .u = u};
  return storehttp_fanout(o->parts, 4, put_part, &j);
}

/* Lease.delta_put: PrepareDeltaPut for every fragment, a PUT of each object, and the commit
 * (one PushDelta stream of PAYLOAD_DELTA_OBJECT chunks). */
static int put_delta(struct rpc_client *c, const Dipaco__V1__Lease *L, uint64_t *bytes) {
  size_t n = L->n_fragments;
  put_obj o[MAX_FRAGS];
  Dipaco__V1__DeltaPut d[MAX_FRAGS], *dp[MAX_FRAGS];
  *bytes = 0;
  ProtobufCBinaryData pmd[MAX_FRAGS][PUT_PARTS_MAX];
  const int fp32 = L->delta_codec == DIPACO__V1__CODEC__CODEC_FP32;
  for (size_t f = 0; f < n; f++) {
    const int k = fp32 ? -1 : encoded_delta(L, L->fragments[f]->num_floats);
    if (!fp32 && k < 0) return dpc_err(DPC_ENOMEM, "cannot encode a delta");
    int rc = make_obj(&o[f], L->fragments[f]->num_floats * 4, L->delta_put_part_bytes, k);
    if (rc) return rc;
    if (o[f].parts > PUT_PARTS_MAX) return dpc_err(DPC_EINVAL, "%d parts: at most %d here", o[f].parts, PUT_PARTS_MAX);
    dipaco__v1__delta_put__init(&d[f]);
    d[f].fragment_id = L->fragments[f]->fragment_id;
    d[f].num_floats = L->fragments[f]->num_floats;
    d[f].crc32c = o[f].crc;
    d[f].object_bytes = 24 + o[f].bytes + 8;
    d[f].content_md5.data = o[f].md5;
    d[f].content_md5.len = 16;
    for (int k = 0; k < o[f].parts; k++) pmd[f][k] = (ProtobufCBinaryData){.len = 16, .data = o[f].pmd5[k]};
    d[f].n_part_md5 = (size_t)o[f].parts;
    d[f].part_md5 = pmd[f];
    dp[f] = &d[f];
  }
  Dipaco__V1__PrepareDeltaPutRequest req = DIPACO__V1__PREPARE_DELTA_PUT_REQUEST__INIT;
  req.lease_id = L->lease_id;
  req.n_puts = n;
  req.puts = dp;
  ProtobufCMessage *pm = NULL;
  int rc = rpc_unary(c, SVC "PrepareDeltaPut", &req.base, &dipaco__v1__prepare_delta_put_response__descriptor, &pm,
                     30000);
  if (rc) return rc;
  Dipaco__V1__PrepareDeltaPutResponse *pr = (Dipaco__V1__PrepareDeltaPutResponse *)pm;
  uint64_t attempt[MAX_FRAGS];
  for (size_t f = 0; f < n && !rc; f++) {
    attempt[f] = f < pr->n_puts ? pr->puts[f]->attempt : 0;
    rc = f < pr->n_puts && pr->puts[f]->fragment_id == d[f].fragment_id ? put_one(pr->puts[f], &o[f])
                                                                          : dpc_err(DPC_EFORMAT, "PrepareDeltaPut: URLs out of order");
    *bytes += o[f].stream;
  }
  protobuf_c_message_free_unpacked(pm, NULL);
  if (rc) return rc;
  struct rpc_stream *s = NULL;
  if ((rc = rpc_stream_open(c, SVC "PushDelta", NULL, 600000, &s))) return rc;
  static const unsigned char none[1];
  for (size_t f = 0; f < n && !rc; f++) {
    struct rpc_chunk h;
    memset(&h, 0, sizeof h);
    h.lease_id = L->lease_id;
    h.fragment_id = L->fragments[f]->fragment_id;
    h.version = L->fragments[f]->version;
    h.codec = L->delta_codec;
    h.block_floats = fp32 ? 0 : L->delta_block_floats;
    h.num_floats = L->fragments[f]->num_floats;
    h.inner_steps = L->inner_steps;
    h.tokens = 1;
    h.payload = DIPACO__V1__PAYLOAD__PAYLOAD_DELTA_OBJECT;
    h.step = attempt[f];
    h.total = o[f].stream;
    h.crc32c = o[f].crc;
    struct grpc_byte_buffer *m = rpc_chunk_encode(&h, none, NULL, NULL);
    rc = m ? rpc_stream_write(s, m) : DPC_ENOMEM;
  }
  return finish_push(s, rc);
}

/* One Lease call: 1 after a lease was served, 0 to ask again, 2 when no work is left. */
static int one_lease(struct rpc_client *c, unsigned char *scratch) {
  Dipaco__V1__LeaseRequest req = DIPACO__V1__LEASE_REQUEST__INIT;
  req.max_wait_ms = 2000;
  req.job_id = G.job;
  ProtobufCMessage *pm = NULL;
  int rc = rpc_unary(c, SVC "Lease", &req.base, &dipaco__v1__lease_response__descriptor, &pm, 30000);
  if (rc) return rc;
  Dipaco__V1__LeaseResponse *lr = (Dipaco__V1__LeaseResponse *)pm;
  if (lr->outcome != DIPACO__V1__LEASE_OUTCOME__LEASE_GRANTED || !lr->lease) {
    int outcome = lr->outcome;
    protobuf_c_message_free_unpacked(pm, NULL);
    if (outcome == DIPACO__V1__LEASE_OUTCOME__LEASE_NO_WORK) return 2;
    if (outcome == DIPACO__V1__LEASE_OUTCOME__LEASE_WAIT) {
      struct timespec ts = {0, 5000000};
      nanosleep(&ts, NULL);
      return 0;
    }
    return dpc_err(DPC_EFORMAT, "Lease: outcome %d without a lease", outcome);
  }
  const Dipaco__V1__Lease *L = lr->lease;
  lease_rec r = {.round = (int)L->round, .replica = L->slot ? (int)L->slot->replica : -1};
  if (L->n_fragments == 0 || L->n_fragments > MAX_FRAGS) rc = dpc_err(DPC_ERANGE, "Lease: %zu fragments", L->n_fragments);
  r.pull0 = now_s();
  for (size_t f = 0; f < L->n_fragments && !rc; f++) {
    uint64_t b = 0;
    rc = pull_fragment(c, L, f, scratch, &b);
    r.pulled += b;
  }
  r.pull1 = now_s();
  if (!rc && G.train_ms > 0) {
    struct timespec ts = {G.train_ms / 1000, (G.train_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  r.push0 = now_s();
  if (!rc) rc = L->delta_put ? put_delta(c, L, &r.pushed) : push_delta(c, L, &r.pushed);
  r.push1 = now_s();
  protobuf_c_message_free_unpacked(pm, NULL);
  if (rc) return rc;
  pthread_mutex_lock(&G.mu);
  if (G.nrec < MAX_LEASES) G.rec[G.nrec++] = r;
  pthread_mutex_unlock(&G.mu);
  return 1;
}

static void *thread_main(void *ud) {
  int idx = (int)(intptr_t)ud;
  struct rpc_client_config cfg = {.target = G.target, .own_connection = 1};
  struct rpc_client *c = NULL;
  unsigned char *scratch = malloc(PATTERN_BYTES + 4096);
  if (!scratch || rpc_client_open(&cfg, &c)) {
    fail("open");
    free(scratch);
    return NULL;
  }
  if (do_register(c, idx)) fail("Register");
  while (!atomic_load(&G.failed)) {
    int rc = one_lease(c, scratch);
    if (rc < 0) fail("lease");
    if (rc == 2) break;
    if (now_s() > G.deadline) {
      dpc_err(DPC_ETIMEDOUT, "the job did not finish within --timeout-s");
      fail("timeout");
    }
  }
  rpc_client_close(c);
  free(scratch);
  return NULL;
}

static int memory_pass(int R, size_t n) {
  float **d = calloc((size_t)R, sizeof *d);
  float *theta = malloc(n * 4), *u = malloc(n * 4), *avg = malloc(n * 4);
  if (!d || !theta || !u || !avg) return 1;
  for (int i = 0; i < R; i++) {
    if (!(d[i] = malloc(n * 4))) return 1;
    for (size_t j = 0; j < n; j++) d[i][j] = 1e-6f * (float)((j + (size_t)i) & 255);
  }
  for (size_t j = 0; j < n; j++) {
    theta[j] = 0.01f * (float)(j & 127);
    u[j] = 0;
  }
  double best = 1e30;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = now_s();
    if (outer_average((const float *const *)d, NULL, R, n, avg)) return 1;
    outer_nesterov_step(theta, u, avg, n, 0.7f, 0.9f, 1);
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  printf("memory_pass_s %.6f (R %d, %zu floats)\n", best, R, n);
  for (int i = 0; i < R; i++) free(d[i]);
  free(d);
  free(theta);
  free(u);
  free(avg);
  return 0;
}

static int cmp_rec(const void *a, const void *b) {
  const lease_rec *x = a, *y = b;
  if (x->round != y->round) return x->round - y->round;
  return x->replica - y->replica;
}

int main(int argc, char **argv) {
  const char *token_file = NULL;
  double timeout_s = 3600;
  if (argc == 4 && !strcmp(argv[1], "--memory-pass")) return memory_pass(atoi(argv[2]), strtoull(argv[3], NULL, 10));
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--coordinator")) G.target = v;
    else if (!strcmp(a, "--job")) G.job = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--workers")) G.n = atoi(v);
    else if (!strcmp(a, "--token-file")) token_file = v;
    else if (!strcmp(a, "--timeout-s")) timeout_s = atof(v);
    else if (!strcmp(a, "--train-ms")) G.train_ms = atol(v);
    else {
      fprintf(stderr, "dataplane_client: unknown flag %s\n", a);
      return 2;
    }
  }
  if (!G.target || !G.job || G.n < 1 || G.n > 64 || G.train_ms < 0 || G.train_ms > 3600000) {
    fprintf(stderr, "usage: dataplane_client --coordinator ADDR --job ID --workers N(1..64) [--token-file F] "
                    "[--timeout-s S] [--train-ms MS]\n       dataplane_client --memory-pass R FLOATS\n");
    return 2;
  }
  if (token_file) {
    char tok[DPC_TOKEN_MAX + 1];
    if (dpc_token_read_file(token_file, tok, sizeof tok)) {
      fprintf(stderr, "dataplane_client: %s\n", dpc_errmsg());
      return 2;
    }
    snprintf(G.bearer, sizeof G.bearer, "Bearer %s", tok);
  }
  rpc_tune_malloc();
  G.pattern = malloc(PATTERN_BYTES);
  if (!G.pattern) return 1;
  for (size_t i = 0; i < PATTERN_BYTES / 4; i++) {
    float v = 1e-7f * (float)((int)(i % 97) - 48);
    memcpy(G.pattern + 4 * i, &v, 4);
  }
  pthread_mutex_init(&G.mu, NULL);
  G.deadline = now_s() + timeout_s;
  pthread_t tid[64];
  int started = 0;
  for (int t = 0; t < G.n; t++, started++)
    if (pthread_create(&tid[t], NULL, thread_main, (void *)(intptr_t)t)) break;
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
  if (atomic_load(&G.failed)) {
    printf("DATAPLANE FAILED: %s\n", G.why);
    return 1;
  }
  qsort(G.rec, (size_t)G.nrec, sizeof G.rec[0], cmp_rec);
  for (int i = 0; i < G.nrec; i++) {
    const lease_rec *r = &G.rec[i];
    printf("lease %d %d %.6f %.6f %.6f %.6f %" PRIu64 " %" PRIu64 "\n", r->round, r->replica, r->pull0, r->pull1,
           r->push0, r->push1, r->pulled, r->pushed);
  }
  /* Per round: aggregate rates over each phase's span, and the overhead from the previous round. */
  double prev_push_end = -1;
  for (int i = 0; i < G.nrec;) {
    int k = i;
    double p0 = 1e30, p1 = 0, q0 = 1e30, q1 = 0;
    uint64_t pb = 0, qb = 0;
    for (; k < G.nrec && G.rec[k].round == G.rec[i].round; k++) {
      const lease_rec *r = &G.rec[k];
      if (r->pull0 < p0) p0 = r->pull0;
      if (r->pull1 > p1) p1 = r->pull1;
      if (r->push0 < q0) q0 = r->push0;
      if (r->push1 > q1) q1 = r->push1;
      pb += r->pulled;
      qb += r->pushed;
    }
    printf("round %d workers %d pull_GBps %.3f push_GBps %.3f overhead_s %.3f\n", G.rec[i].round, k - i,
           (double)pb / (p1 - p0) / 1e9, (double)qb / (q1 - q0) / 1e9, prev_push_end >= 0 ? p1 - prev_push_end : -1.0);
    prev_push_end = q1;
    i = k;
  }
  printf("DATAPLANE OK\n");
  return 0;
}
