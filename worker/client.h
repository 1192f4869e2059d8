/* client.h — the worker's calls to dipaco.v1.Coordinator (proto/dipaco.proto), on top of the
 * call layer common/rpc.h: Register (and the identity metadata it sets), Lease, Heartbeat,
 * PullFragment into a float buffer with resume, PushDelta of every fragment of a lease in one
 * stream, Release, PushInnerState / PullInnerState (inner.state checkpoint).
 *
 * Every call returns 0 or a negative DPC_E* code with the detail in dpc_errmsg(), and stores
 * the gRPC status of the call in *code (RPC_OK for purely local failures); wc_classify turns
 * (rc, code) into what the lease loop should do. Replies are validated here (sizes, ids,
 * enums) before the caller sees them. Thread-safety: Heartbeat may run on another thread
 * while the owner thread pulls or pushes; wc_register (which changes the metadata) must not
 * run while any other call is in flight. */
#ifndef DPC_WORKER_CLIENT_H
#define DPC_WORKER_CLIENT_H

#include "common/rpc.h"
#include "proto/dipaco.pb-c.h"

#include <stddef.h>
#include <stdint.h>

#define WC_SESSION_MAX 128

typedef struct {
  struct rpc_client *rpc;
  uint64_t worker_id;                 /* 0 until registered */
  char session[WC_SESSION_MAX + 1];
  uint32_t heartbeat_ms;              /* from RegisterResponse, clamped to [50, 60000] */
  uint32_t lease_ttl_ms;
  uint32_t max_chunk_bytes;           /* what we send per chunk (our flag ∧ the server's) */
  uint32_t chunk_flag;                /* --max-chunk-bytes */
  /* wc_pull_payload reads from the object store again only after this (dpc_mono_ns): a read
   * that failed sends the next minute's pulls through the coordinator at once. */
  _Atomic int64_t store_retry_ns;
  /* wc_put_objects puts in the object store again only after this (dpc_mono_ns): a put the
   * store failed sends the next minute's deltas and inner state through the coordinator at
   * once, rather than one failed prepare and PUT per lease. */
  _Atomic int64_t put_retry_ns;
} wclient;

/* What to do after a failed call. */
enum wc_class {
  WC_OK = 0,
  WC_RETRY,      /* UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, DATA_LOSS, checksum: back off, retry */
  WC_REREGISTER, /* UNAUTHENTICATED: the coordinator forgot the session */
  WC_LEASE_GONE, /* ABORTED, NOT_FOUND: the lease expired or was revoked: drop the work */
  WC_FATAL       /* anything else: a bug or a refused request; give the lease up */
};
enum wc_class wc_classify(int rc, int code);

/* Credentials for every later wc_open/wc_reconnect of the process: TLS settings (NULL =
 * plain text; copied, the paths must stay valid) and the cluster's join token (NULL = none),
 * sent as "authorization: Bearer TOKEN" on Register only. Call once from main() before the
 * first wc_open. */
int wc_set_credentials(const struct rpc_tls *tls, const char *join_token);

int wc_open(wclient *c, const char *target, uint32_t chunk_flag);
void wc_close(wclient *c);

/* Replace the channel with a new one (keeping identity metadata): gRPC fails calls fast with
 * the cached error while a channel backs off between connection attempts (up to minutes),
 * so after repeated UNAVAILABLE a fresh channel reconnects as soon as the peer is back. No
 * other call may be in flight. On failure the old channel is kept. */
int wc_reconnect(wclient *c, const char *target);

/* Register (fields of req filled by the caller; previous identity added here when there is
 * one) and set dipaco-worker-id / dipaco-session for every later call. */
int wc_register(wclient *c, Dipaco__V1__RegisterRequest *req, int *code);

/* Lease long-poll: *out owned by the caller (protobuf_c_message_free_unpacked). stop(ud)
 * (may be NULL) is polled while the call waits; non-zero cancels it (DPC_ECANCELED), so that
 * a SIGTERM does not wait out the long-poll. */
int wc_lease(wclient *c, uint32_t max_wait_ms, Dipaco__V1__LeaseResponse **out, int *code, int (*stop)(void *ud),
             void *ud);

/* Watch (the worker's liveness line while it trains lease lease_id): returns when the
 * coordinator answers (after its hold, ~30 s; at once with *lease_ended = 1 when the lease
 * ended on its side), on an error (*code: the RPC status), or DPC_ECANCELED once stop(ud) is
 * non-zero (polled every 50 ms). */
int wc_watch(wclient *c, uint64_t lease_id, int *code, int *lease_ended, int (*stop)(void *ud), void *ud);
int wc_heartbeat(wclient *c, const Dipaco__V1__HeartbeatRequest *req,
                 Dipaco__V1__HeartbeatResponse **out, int *code);

/* Pull fragment f (at its base version f->version) of lease `lease_id` into dst[f->num_floats],
 * resuming from *got bytes (set *got = 0 for a fresh pull; it is advanced as bytes arrive,
 * also on error, so a retry resumes). Checks the served version, size and the lease's
 * CRC-32C of the fragment when it is non-zero. */
int wc_pull(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, float *dst,
            size_t *got, int *code);
/* wc_pull of another payload of the fragment: PAYLOAD_PARAMS, or PAYLOAD_OUTER_MOMENTUM
 * (eager updates: the outer momentum at f->version). When the blobs are in an object store
 * (f->params_url set) a fresh pull asks where the version's blob is (PullFragment with objects)
 * and reads and checks it there (storeget_blob); a failed read is logged and the pull goes
 * through the coordinator. Version 0's momentum is zeros, made here without a call. */
int wc_pull_payload(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, int payload, float *dst,
                    size_t *got, int *code);

/* One PushDelta stream with the deltas of frags[0..n) (delta[i] holds n floats of fragment
 * i, at its base version frags[i]->version), encoded with `codec` (common/codec.h; block:
 * floats per scale block of the block codecs), and the acks: results[i] receives the
 * PushResult of fragment i, or -1 if the reply did not name it. *sent (may be NULL) is
 * increased by the payload bytes written. A local encoding failure (a non-finite delta) is
 * returned with *code RPC_OK. */
int wc_push(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
            const float *const *delta, uint64_t inner_steps, uint64_t tokens, int codec, uint32_t block,
            int *results, int *code, uint64_t *sent);

/* One object of PrepareDeltaPut (Lease.delta_put, Lease.inner_put). In: what it holds (payload:
 * 0 a delta, else the inner-state Payload) and its floats (0: the fragment's), the payload's
 * CRC-32C, the object's MD5 and size (storeput.h) and, for an object put in parts, their count
 * and MD5s. Out (malloc'd: wc_put_clear): the presigned URL, or one per part, and the object's
 * attempt number. */
typedef struct {
  int payload;
  uint64_t num_floats;
  uint32_t crc;
  unsigned char md5[16];
  uint64_t bytes;
  int parts;
  unsigned char (*part_md5)[16];
  char *url;
  char **part_urls;
  uint64_t attempt;
} wc_put;
void wc_put_clear(wc_put *p);
/* PrepareDeltaPut for frags[0..n), puts[i] for frags[i] (a fragment may come once per payload):
 * the URLs, or none on failure. */
int wc_prepare_put(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n, wc_put *puts,
                   int *code);
/* One PushDelta stream that commits the objects put for frags[0..n) (PAYLOAD_DELTA_OBJECT chunks,
 * no data, step = the object's attempt number, codec and block the lease's: fp32, or the stream
 * as sent whose CRC-32C crc[i] is; a SparseLoCo lease's CODEC_SPARSE streams of totals[i]
 * bytes, totals NULL for the others); results as wc_push. */
int wc_push_objects(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                    const uint32_t *crc, const uint64_t *attempts, int codec, uint32_t block, const size_t *totals,
                    uint64_t inner_steps, uint64_t tokens, int *results, int *code);

/* Put objects o[0..n) for frags[0..n) (a fragment may come once per payload, w[i].payload and
 * num_floats set by the caller): their MD5s (and their parts', above part_bytes) into w, one
 * PrepareDeltaPut, then each PUT (parts over up to `streams` connections). 0 with w[i].attempt
 * and crc set for the commit; else the error, *code RPC_OK when the store failed. *parts (may be
 * NULL) counts the parts put. wc_put_free frees w's URLs and MD5s and w. */
typedef struct storeput_object storeput_object;
int wc_put_objects(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                   storeput_object *o, wc_put *w, uint64_t part_bytes, int streams, int *code, int *parts);
void wc_put_free(wc_put *w, size_t n);
/* Lease.delta_put: the deltas of frags[0..n) (delta[i]: fragment i's fp32 delta) put in the
 * store as the lease's codec says (an fp32 blob, or the stream as sent, padded to whole floats)
 * with wc_put_objects; crc[i] and attempt[i] get what their commit (wc_push_objects) names. */
int wc_put_deltas(wclient *c, const Dipaco__V1__Lease *L, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                  const float *const *delta, int streams, uint32_t *crc, uint64_t *attempt, int *code, int *parts);
/* The same for a SparseLoCo lease: enc[i], fragment i's sparse stream of bytes[i] bytes, put as
 * sent (padded to whole floats); crc[i] its CRC-32C. */
int wc_put_sparse(wclient *c, const Dipaco__V1__Lease *L, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                  const unsigned char *const *enc, const size_t *bytes, int streams, uint32_t *crc, uint64_t *attempt,
                  int *code, int *parts);
/* Whether a failed put or commit (rc, with the coordinator's status code) falls back to pushing
 * the bytes: the store failed, or the coordinator cannot take the object (no such method, no put
 * for the job, an object it lost or could not read); not what a push would meet too (the lease
 * is gone, a transient failure to retry, a refused delta). */
int wc_put_falls_back(int rc, int code);

/* One PushInnerState stream that commits the inner-state objects put for frags[0..n)
 * (PAYLOAD_INNER_OBJECT chunks, no data, step = the object's attempt number; puts[i] as
 * prepared). */
int wc_push_inner_objects(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                          const wc_put *puts, int *code);

/* wc_push for SparseLoCo: enc[i] holds fragment i's CODEC_SPARSE stream of bytes[i] bytes
 * (common/sparse.h), sent as it is. */
int wc_push_sparse(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                   const unsigned char *const *enc, const size_t *bytes, uint64_t inner_steps, uint64_t tokens,
                   int *results, int *code, uint64_t *sent);

/* inner.state checkpoint: one PushInnerState stream with, for each of frags[0..n), its AdamW
 * first moment m[i] (PAYLOAD_ADAM_M) then second moment v[i] (PAYLOAD_ADAM_V) and, for a
 * streaming lease (local != NULL) the slot's local parameters local[i] (third =
 * PAYLOAD_LOCAL_PARAMS) or for a SparseLoCo lease its error-feedback buffer (third =
 * PAYLOAD_EF_BUFFER), step = the AdamW step count. Returns once the coordinator has stored
 * them durably. */
int wc_push_inner(wclient *c, uint64_t lease_id, Dipaco__V1__FragmentInfo *const *frags, size_t n,
                  const float *const *m, const float *const *v, const float *const *local, int third, uint64_t step,
                  int *code);

/* PullInnerState of fragment f of lease `lease_id` into m[f->num_floats] and v[...] (and
 * local[...], the third stream of payload `third`, for a streaming or SparseLoCo lease, NULL
 * otherwise); *step receives the AdamW step count. Checks payloads, sizes, contiguity and
 * each stream's CRC. */
int wc_pull_inner(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, float *m, float *v, float *local,
                  int third, uint64_t *step, int *code);
/* The same from the object store (blobs on S3: FragmentInfo.params_url set): PullInnerState
 * with objects answers where the blobs are, and they are read and checked here (storeget_blob)
 * without their bytes passing through the coordinator. A failure of the store is returned with
 * *code RPC_OK; the caller then pulls through the coordinator. */
int wc_pull_inner_objects(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, float *m, float *v,
                          float *local, int third, uint64_t *step, int *code);

/* SparseLoCo sparse pull: the bytes of PAYLOAD_SPARSE_ROUND (proto) that made `version` of
 * fragment f (skip_lease: the lease whose delta is left out, 0 = none), at most max_bytes,
 * into *out (malloc'd, *len bytes), CRC-checked. NOT_FOUND (*code) when the coordinator no
 * longer keeps them. */
int wc_pull_sparse_round(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, uint64_t version,
                         uint64_t skip_lease, size_t max_bytes, unsigned char **out, size_t *len, int *code);

/* Replay pull: the bytes of PAYLOAD_REPLAY_ROUND (proto) that made `version` of fragment f,
 * as wc_pull_sparse_round; budget (0 = none) is the most bytes the worker takes: a larger
 * round is answered RESOURCE_EXHAUSTED (*code). */
int wc_pull_replay_round(wclient *c, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, uint64_t version,
                         uint64_t skip_lease, uint64_t budget, size_t max_bytes, unsigned char **out, size_t *len,
                         int *code);

int wc_release(wclient *c, uint64_t lease_id, int reason, uint64_t step, const char *msg,
               int *code);

#endif
