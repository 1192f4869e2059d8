/* client_put.c — the worker's calls for objects it puts in the S3 store itself (see client.h):
 * PrepareDeltaPut, and the commits of what it put, deltas through PushDelta and inner state
 * through PushInnerState (docs/design.md §5.8). */
#include "worker/client.h"
#include "worker/client_internal.h"
#include "worker/storeget.h"
#include "worker/storeput.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/codec.h"
#include "common/errors.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wc_put_clear(wc_put *p) {
  free(p->url);
  p->url = NULL;
  for (int i = 0; p->part_urls && i < p->parts; i++) free(p->part_urls[i]);
  free(p->part_urls);
  p->part_urls = NULL;
}

/* puts[i]'s URLs from the answer's entry a: 0, or an error naming what is missing. */
static int take_urls(wc_put *w, const Dipaco__V1__DeltaPut *a) {
  w->attempt = a->attempt;
  if (w->parts == 0) {
    if (!a->url || !a->url[0]) return dpc_err(DPC_EFORMAT, "PrepareDeltaPut: no URL for fragment %" PRIu64, a->fragment_id);
    return (w->url = strdup(a->url)) ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory");
  }
  if (a->n_part_urls != (size_t)w->parts)
    return dpc_err(DPC_EFORMAT, "PrepareDeltaPut: %zu part URLs for fragment %" PRIu64 ", asked for %d", a->n_part_urls,
                   a->fragment_id, w->parts);
  if (!(w->part_urls = calloc((size_t)w->parts, sizeof *w->part_urls))) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  for (int k = 0; k < w->parts; k++)
    if (!(w->part_urls[k] = strdup(a->part_urls[k] ? a->part_urls[k] : ""))) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  return 0;
}

int wc_prepare_put(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n, wc_put *puts,
                   int *code) {
  Dipaco__V1__PrepareDeltaPutRequest req = DIPACO__V1__PREPARE_DELTA_PUT_REQUEST__INIT;
  Dipaco__V1__DeltaPut *d = calloc(n ? n : 1, sizeof *d);
  Dipaco__V1__DeltaPut **dp = calloc(n ? n : 1, sizeof *dp);
  size_t np = 0;
  for (size_t i = 0; i < n; i++) np += (size_t)puts[i].parts;
  ProtobufCBinaryData *pm5 = calloc(np ? np : 1, sizeof *pm5);
  *code = RPC_OK;
  for (size_t i = 0; i < n; i++) puts[i].url = NULL, puts[i].part_urls = NULL;
  if (!d || !dp || !pm5) {
    free(d);
    free(dp);
    free(pm5);
    return dpc_err(DPC_ENOMEM, "worker: out of memory");
  }
  for (size_t i = 0, at = 0; i < n; i++) {
    dipaco__v1__delta_put__init(&d[i]);
    d[i].fragment_id = frags[i]->fragment_id;
    d[i].num_floats = puts[i].num_floats ? puts[i].num_floats : frags[i]->num_floats;
    d[i].payload = (Dipaco__V1__Payload)puts[i].payload;
    d[i].crc32c = puts[i].crc;
    d[i].object_bytes = puts[i].bytes;
    d[i].content_md5.data = puts[i].md5;
    d[i].content_md5.len = 16;
    d[i].n_part_md5 = (size_t)puts[i].parts;
    d[i].part_md5 = pm5 + at;
    for (int k = 0; k < puts[i].parts; k++, at++) pm5[at].data = puts[i].part_md5[k], pm5[at].len = 16;
    dp[i] = &d[i];
  }
  req.lease_id = lease_id;
  req.n_puts = n;
  req.puts = dp;
  ProtobufCMessage *pm = NULL;
  int rc = rpc_unary(c->rpc, SVC "PrepareDeltaPut", &req.base, &dipaco__v1__prepare_delta_put_response__descriptor,
                     &pm, UNARY_TIMEOUT_MS);
  *code = rpc_last_code();
  free(d);
  free(dp);
  free(pm5);
  if (rc) return rc;
  Dipaco__V1__PrepareDeltaPutResponse *r = (Dipaco__V1__PrepareDeltaPutResponse *)pm;
  int *seen = calloc(n ? n : 1, sizeof *seen);
  if (!seen) rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
  for (size_t a = 0; a < r->n_puts && !rc; a++)
    for (size_t i = 0; i < n && !rc; i++)
      if (r->puts[a]->fragment_id == frags[i]->fragment_id && (int)r->puts[a]->payload == puts[i].payload && !seen[i]) {
        seen[i] = 1;
        rc = take_urls(&puts[i], r->puts[a]);
      }
  for (size_t i = 0; i < n && !rc; i++)
    if (!seen[i]) rc = dpc_err(DPC_EFORMAT, "PrepareDeltaPut: no answer for fragment %" PRIu64, frags[i]->fragment_id);
  free(seen);
  protobuf_c_message_free_unpacked(pm, NULL);
  if (rc)
    for (size_t i = 0; i < n; i++) wc_put_clear(&puts[i]);
  return rc;
}

int wc_push_objects(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                    const uint32_t *crc, const uint64_t *attempts, int codec, uint32_t block, const size_t *totals,
                    uint64_t inner_steps, uint64_t tokens, int *results, int *code) {
  for (size_t i = 0; i < n; i++) results[i] = -1;
  struct rpc_stream *s = NULL;
  /* The coordinator reads every object back before it answers. */
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += (size_t)frags[i]->num_floats * sizeof(float);
  int rc = rpc_stream_open(c->rpc, SVC "PushDelta", NULL, transfer_timeout_ms(total), &s);
  *code = rpc_last_code();
  if (rc) return rc;
  static const unsigned char none[1];
  for (size_t i = 0; i < n && !rc; i++) {
    struct rpc_chunk h;
    wc_delta_header(&h, lease_id, frags[i], inner_steps, tokens, DIPACO__V1__PAYLOAD__PAYLOAD_DELTA_OBJECT);
    size_t total = totals ? totals[i] : 0;
    if (!totals && (rc = dpc_codec_bytes(codec, frags[i]->num_floats, block, &total)) < 0) break;
    h.codec = (uint32_t)codec;
    h.block_floats = dpc_codec_is_block(codec) ? block : 0;
    h.total = total;
    h.crc32c = crc[i];
    h.step = attempts[i];
    struct grpc_byte_buffer *bb = rpc_chunk_encode(&h, none, NULL, NULL);
    rc = bb ? rpc_stream_write(s, bb) : dpc_err(DPC_ENOMEM, "worker: out of memory encoding a chunk");
  }
  return wc_push_finish(s, frags, n, rc, results, code);
}

int wc_push_inner_objects(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                          const wc_put *puts, int *code) {
  struct rpc_stream *s = NULL;
  /* The coordinator checks each object and has the store copy it before it answers. */
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += (size_t)puts[i].bytes;
  int rc = rpc_stream_open(c->rpc, SVC "PushInnerState", NULL, transfer_timeout_ms(total), &s);
  *code = rpc_last_code();
  if (rc) return rc;
  static const unsigned char none[1];
  for (size_t i = 0; i < n && !rc; i++) {
    struct rpc_chunk h;
    memset(&h, 0, sizeof h);
    h.lease_id = lease_id;
    h.fragment_id = frags[i]->fragment_id;
    h.version = frags[i]->version;
    h.codec = DIPACO__V1__CODEC__CODEC_FP32;
    h.num_floats = puts[i].num_floats ? puts[i].num_floats : frags[i]->num_floats;
    h.total = h.num_floats * sizeof(float);
    h.crc32c = puts[i].crc;
    h.step = puts[i].attempt;
    h.payload = DIPACO__V1__PAYLOAD__PAYLOAD_INNER_OBJECT;
    struct grpc_byte_buffer *bb = rpc_chunk_encode(&h, none, NULL, NULL);
    rc = bb ? rpc_stream_write(s, bb) : dpc_err(DPC_ENOMEM, "worker: out of memory encoding a chunk");
  }
  ProtobufCMessage *pm = NULL;
  int frc = rpc_stream_finish(s, &dipaco__v1__push_inner_state_response__descriptor, &pm);
  *code = rpc_last_code();
  rpc_stream_free(s);
  if (pm) protobuf_c_message_free_unpacked(pm, NULL);
  if (frc) return frc;
  if (rc) *code = RPC_UNAVAILABLE;
  return rc;
}

int wc_put_objects(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                   storeput_object *o, wc_put *w, uint64_t part_bytes, int streams, int *code, int *parts) {
  int rc = 0;
  *code = RPC_OK;
  const int64_t wait_ns = atomic_load(&c->put_retry_ns) - dpc_mono_ns();
  if (wait_ns > 0) /* (code RPC_OK: the store's failure, so the caller pushes the bytes) */
    return dpc_err(DPC_EUNAVAILABLE, "the object store failed a put less than a minute ago (not tried again for "
                   "%.0f s)", (double)wait_ns / 1e9);
  for (size_t i = 0; i < n && !rc; i++) {
    w[i].crc = o[i].crc;
    w[i].bytes = storeput_bytes(&o[i]);
    if ((w[i].parts = storeput_parts(&o[i], part_bytes)) > 0 && !(w[i].part_md5 = malloc((size_t)w[i].parts * 16)))
      rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
    if (!rc) rc = storeput_digest(&o[i], part_bytes, w[i].part_md5);
    memcpy(w[i].md5, o[i].md5, 16);
  }
  if (!rc) rc = wc_prepare_put(c, lease_id, frags, n, w, code);
  for (size_t i = 0; i < n && !rc; i++) { /* a put fails after 60 s without progress */
    rc = w[i].parts ? storeput_put_parts(w[i].part_urls, &o[i], part_bytes, w[i].parts,
                                         (const unsigned char (*)[16])w[i].part_md5, streams, 60000)
                    : storeput_put(w[i].url, &o[i], 60000);
    if (rc) { /* the store's failure, not the coordinator's: the next minute's puts push instead */
      *code = RPC_OK;
      atomic_store(&c->put_retry_ns, dpc_mono_ns() + (int64_t)60 * 1000000000);
    }
    if (parts) *parts += w[i].parts;
  }
  return rc;
}

/* Put objects o[0..n) made by the caller (enc[i]: the streams they point at) and free them;
 * crc[i] and attempt[i] get what the commit names. */
static int put_made(wclient *c, const Dipaco__V1__Lease *L, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                    storeput_object *o, unsigned char **enc, wc_put *w, int rc, int streams, uint32_t *crc,
                    uint64_t *attempt, int *code, int *parts) {
  if (!rc) rc = wc_put_objects(c, L->lease_id, frags, n, o, w, L->delta_put_part_bytes, streams, code, parts);
  for (size_t i = 0; i < n && !rc; i++) crc[i] = w[i].crc, attempt[i] = w[i].attempt;
  wc_put_free(w, n);
  for (size_t i = 0; enc && i < n; i++) free(enc[i]);
  free(enc);
  free(o);
  return rc;
}

/* Object i of kind holding a stream of eb bytes at enc[i] (padded with zeros to whole floats,
 * the caller's buffer of (eb + 3) / 4 * 4 bytes); the commit names the stream's own CRC-32C. */
static void make_stream(storeput_object *o, uint32_t kind, const unsigned char *enc, size_t eb) {
  storeput_make_kind(o, kind, (const float *)(const void *)enc, (eb + 3) / 4, NULL, 0);
  o->crc = dpc_crc32c(0, enc, eb);
}

int wc_put_deltas(wclient *c, const Dipaco__V1__Lease *L, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                  const float *const *delta, int streams, uint32_t *crc, uint64_t *attempt, int *code, int *parts) {
  const int codec = (int)L->delta_codec;
  storeput_object *o = calloc(n ? n : 1, sizeof *o);
  wc_put *w = calloc(n ? n : 1, sizeof *w);
  unsigned char **enc = calloc(n ? n : 1, sizeof *enc);
  int rc = o && w && enc ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory");
  *code = RPC_OK;
  for (size_t i = 0; i < n && !rc; i++) {
    const uint64_t nf = frags[i]->num_floats;
    size_t eb = 0;
    if (codec == DPC_CODEC_FP32) {
      storeput_make(&o[i], delta[i], nf);
    } else if ((rc = dpc_codec_bytes(codec, nf, L->delta_block_floats, &eb)) == 0) {
      /* a quantized job's object is the stream as sent, padded to whole floats */
      if (!(enc[i] = calloc(1, (eb + 3) / 4 * 4 + 4))) rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
      if (!rc) rc = dpc_codec_encode(codec, delta[i], nf, L->delta_block_floats, enc[i]);
      if (!rc) make_stream(&o[i], STORE_KIND_ENCODED, enc[i], eb);
    }
  }
  return put_made(c, L, frags, n, o, enc, w, rc, streams, crc, attempt, code, parts);
}

int wc_put_sparse(wclient *c, const Dipaco__V1__Lease *L, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                  const unsigned char *const *in, const size_t *bytes, int streams, uint32_t *crc, uint64_t *attempt,
                  int *code, int *parts) {
  storeput_object *o = calloc(n ? n : 1, sizeof *o);
  wc_put *w = calloc(n ? n : 1, sizeof *w);
  unsigned char **enc = calloc(n ? n : 1, sizeof *enc);
  int rc = o && w && enc ? 0 : dpc_err(DPC_ENOMEM, "worker: out of memory");
  *code = RPC_OK;
  for (size_t i = 0; i < n && !rc; i++) { /* (a copy padded with zeros: the streams are a few % of fp32) */
    if (!(enc[i] = calloc(1, (bytes[i] + 3) / 4 * 4 + 4))) rc = dpc_err(DPC_ENOMEM, "worker: out of memory");
    if (!rc) memcpy(enc[i], in[i], bytes[i]);
    if (!rc) make_stream(&o[i], STORE_KIND_SPARSE, enc[i], bytes[i]);
  }
  return put_made(c, L, frags, n, o, enc, w, rc, streams, crc, attempt, code, parts);
}

int wc_put_falls_back(int rc, int code) {
  if (!rc) return 0;
  return code == RPC_OK || code == RPC_FAILED_PRECONDITION || code == RPC_UNIMPLEMENTED ||
         code == RPC_INVALID_ARGUMENT;
}

void wc_put_free(wc_put *w, size_t n) {
  for (size_t i = 0; w && i < n; i++) {
    wc_put_clear(&w[i]);
    free(w[i].part_md5);
    w[i].part_md5 = NULL;
  }
  free(w);
}
