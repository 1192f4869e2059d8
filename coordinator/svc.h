/* svc.h — what the coordinator's RPC handlers share (layer 4, see coord.h): worker session
 * authentication, request unpacking, the liveness touch, the Admin token check, FragmentInfo,
 * the chunk size rule, the zero-copy server-streaming sender, and the copy of a handler
 * file's method table with its context.
 *
 * Contract: loop thread only (rpc_server_dispatch runs every callback there), except the
 * ref/unref callbacks of an out_stream, which gRPC may call from any thread. Every method
 * table entry carries ud = the coord (svc_methods_add), so handlers get their context from ud
 * and, for streams, from the per-call data they set (rpc_call_set_data). */
#ifndef DPC_COORD_SVC_H
#define DPC_COORD_SVC_H

#include "common/auth.h"
#include "common/rpc.h"
#include "coordinator/coord.h"
#include "proto/dipaco.pb-c.h"

/* Largest request message: Coordinator service, Admin service. */
#define SVC_MAX_REQ_BYTES (64u << 10)
#define SVC_ADMIN_MAX_REQ_BYTES (1u << 20)
/* Largest chunk payload a worker may stream to us (the message limit minus header room). */
#define MAX_CHUNK_ACCEPT (RPC_MAX_MSG_DEFAULT - (64u << 10))
/* Room for every method of both services (main.c's table). */
#define SVC_MAX_METHODS 32

/* SHA-256 of a token (tokens are compared by hash, with dpc_ct_equal); 0 or DPC_EINTERNAL. */
int svc_token_hash(const char *tok, unsigned char out[DPC_TOKEN_HASH]);
/* 1 = authenticated (*worker set), 0 = unknown worker id with allow_unknown (call not
 * finished), -1 = the call was finished with UNAUTHENTICATED / UNAVAILABLE. */
int svc_authenticate(coord *c, struct rpc_call *call, int64_t *worker, int allow_unknown);
/* Unpack a request; on failure finishes the call with INVALID_ARGUMENT and returns -1. */
int svc_unpack(struct rpc_call *call, const struct grpc_byte_buffer *req, const ProtobufCMessageDescriptor *d,
               ProtobufCMessage **out);
/* Any authenticated call counts as a sign of life (sps < 0: no speed sample). */
void svc_touch(coord *c, int64_t worker, double sps);
/* The start of a worker's client-streaming call (PushDelta, PushInnerState): authenticate,
 * touch, and allocate the call's zeroed state of `size` bytes, which the caller owns from then
 * on (set it with rpc_call_set_data). NULL when the call was finished (not authenticated, or
 * RESOURCE_EXHAUSTED). */
void *svc_stream_begin(coord *c, struct rpc_call *call, size_t size, int64_t *worker);

/* The admin token check (svc.c's header describes it): 0 = allowed, -1 = the call was
 * finished. */
int svc_admin_authorize(coord *c, struct rpc_call *call);
/* An Admin request: UNAVAILABLE while stopping, the token check, then the unpack; 0 or -1
 * with the call finished. */
int svc_admin_unpack(coord *c, struct rpc_call *call, const struct grpc_byte_buffer *req,
                     const ProtobufCMessageDescriptor *d, ProtobufCMessage **out);
/* The loaded job with wire id `id`, or NULL with the call finished NOT_FOUND. */
coord_job *svc_job_or_fail(coord *c, struct rpc_call *call, uint64_t id);

/* Fill a FragmentInfo (wire ids are internal ids + 1). */
void svc_fill_fragment_info(const coord_job *j, const store_fragment *f, int64_t version,
                            Dipaco__V1__FragmentInfo *fi);
/* The wire Algorithm of a job spec (sync, async delayed-Nesterov or async Nesterov). */
Dipaco__V1__Algorithm svc_algorithm_wire(const jobspec *js);
/* Clamp a requested chunk size to [RPC_CHUNK_MIN, RPC_CHUNK_DEFAULT] (0 = default). */
uint32_t svc_chunk_size(uint32_t requested);

/* A server-streaming answer made of up to two byte strings sent as Chunk streams one after
 * another (PullFragment: the parameters; ExportPath: config.json then safetensors). The
 * bytes are sent zero-copy: ref(ud) is taken per chunk and unref(ud) runs when gRPC lets go;
 * the stream holds one reference of its own, dropped when the call ends. */
typedef struct out_part {
  const uint8_t *data;
  uint64_t total;
  uint32_t crc, payload;
  uint64_t fragment_id, version, num_floats;
  uint64_t step; /* Chunk.step (inner-state streams: the AdamW step), 0 otherwise */
} out_part;

typedef struct out_stream {
  coord *c;
  int nparts, cur;
  out_part part[3];
  uint64_t next, lease_id;
  int64_t job; /* the lease's job (PullFragment of parameters: round overhead accounting), 0 = none */
  uint32_t chunk;
  double t0; /* dpc_mono_s at the start (a worker's pull, lease_id != 0: dipaco_pull_seconds) */
  void (*ref)(void *ud);
  void (*unref)(void *ud);
  void *ud;
} out_stream;

/* Take ownership of os (one reference on ud included) and start sending on call. */
void svc_stream_start(struct rpc_call *call, out_stream *os);
/* On an S3 store, answer where blobs are instead of their bytes: one PAYLOAD_BLOB_URLS chunk
 * (proto/dipaco.pb-c.h) holding a presigned GET URL per name, one per line, each living
 * blob_url_ttl_s(ttl_bytes); meta gives the chunk's fragment_id, version and num_floats. The
 * call is answered either way (an error finishes it). */
void svc_answer_urls(struct rpc_call *call, coord *c, const out_part *meta, uint64_t lease_id, uint32_t max_chunk,
                     const char *const *names, int k, uint64_t ttl_bytes);
/* The on_sent / on_done callbacks of a method that streams with svc_stream_start. */
void svc_stream_on_sent(struct rpc_call *call, int ok, void *ud);
void svc_stream_on_done(struct rpc_call *call, int cancelled, void *ud);

/* A call answered later, once work on the thread pool ends (a parameter fill, an export). The
 * method's on_done calls svc_hold_forget, so a call that ended meanwhile (cancelled, its
 * deadline passed) leaves h->call NULL and the work's end drops its result instead of
 * answering a call that is gone. Embed it in the work's state; loop thread. */
typedef struct svc_hold {
  struct rpc_call *call;
  struct svc_hold *next;
} svc_hold;
void svc_hold_add(coord *c, svc_hold *h, struct rpc_call *call);
/* Unlink h (its work ended): h->call is then the call to answer, or NULL. */
void svc_hold_remove(coord *c, svc_hold *h);
/* on_done: 1 if a hold had call (now forgotten: no stream was started on it), else 0. */
int svc_hold_forget(coord *c, struct rpc_call *call);

/* Up to three blobs read whole on the thread pool for a stream (PullInnerState's M, V and L;
 * PullFragment's momentum), so that the loop thread reads no model-sized blob itself. The
 * caller fills n, name[k], kind[k] and ready (and ud), then svc_read_start; ready(c, call, r)
 * runs on the loop thread once the reads end: call is NULL when the call ended meanwhile; r->rc
 * (< 0 with r->err) or the arrays r->b->data[k] of r->got[k] floats. The arrays live in r->b,
 * reference-counted for zero-copy streams (svc_bufs_ref/unref as out_stream ref/unref; a
 * stream takes its own reference). r and its reference are freed after ready returns; ud is
 * ready's to free. */
typedef struct svc_bufs {
  atomic_int refs;
  float *data[3];
} svc_bufs;
void svc_bufs_ref(void *ud);   /* any thread */
void svc_bufs_unref(void *ud); /* any thread */

typedef struct svc_read svc_read;
struct svc_read {
  svc_hold hold;
  uv_work_t req;
  coord *c;
  int n;
  char name[3][BLOB_NAME_MAX];
  blob_kind kind[3];
  size_t got[3];
  svc_bufs *b;
  int rc;
  char err[512];
  void (*ready)(coord *c, struct rpc_call *call, svc_read *r);
  void *ud;
};
/* A zeroed svc_read with its buffers, or NULL (out of memory). */
svc_read *svc_read_new(void);
/* Queue r's reads, holding call: 0, or < 0 (nothing queued; the caller frees r with
 * svc_read_free). The method's on_done must call svc_hold_forget. */
int svc_read_start(coord *c, struct rpc_call *call, svc_read *r);
void svc_read_free(svc_read *r);

/* Copy table[0..n) to out with ud = c; returns n. */
int svc_methods_add(struct rpc_method *out, const struct rpc_method *table, int n, coord *c);

#endif
