/* svc_push_commit.h — a PushDelta stream's state, shared by the two halves of the handler:
 * svc_push.c receives the chunks (checks the lease and header, spools fp32 bytes) and calls
 * down into svc_push_commit.c, which finishes a fragment whose bytes are all in (CRC, decode,
 * norm screen, durable commit, the row, the ack) and holds the stream's failure and cleanup.
 * Calls go one way, svc_push.c → svc_push_commit.c. Private to those two files.
 *
 * Thread-safety: the loop thread owns a push; while p->busy its buffers belong to the one
 * thread-pool job queued on p->req. */
#ifndef DPC_COORD_SVC_PUSH_COMMIT_H
#define DPC_COORD_SVC_PUSH_COMMIT_H

#include "common/rpc.h"
#include "common/sparse.h"
#include "coordinator/blobs.h"
#include "coordinator/coord.h"
#include "coordinator/store.h"
#include "proto/dipaco.pb-c.h"

#include <stdint.h>
#include <uv.h>

/* One PushDelta stream: the caller's lease, the fragment being received and its spool, and
 * the acks so far. Lives in the call's data and outlives the call while p->busy. */
typedef struct push {
  coord *c;
  struct rpc_call *call; /* NULL once the call is over */
  int finished;          /* a status was sent */
  int busy;              /* a commit is in the thread pool */
  int64_t worker;
  int have_lease;
  store_lease lease;
  /* the fragment being received */
  int in_frag, frag, mode; /* mode: 0 write, 1 duplicate check, 2 late, 3 stale (async) */
  uint32_t dup_crc;
  int64_t base;
  uint64_t total, next, tokens, inner_steps, version;
  size_t total_floats;
  uint32_t crc;
  double ss, norm; /* sum of squares of the fragment's floats so far; its L2 norm at the end */
  double t0;       /* dpc_mono_s at the fragment's first chunk (dipaco_push_seconds) */
  unsigned char carry[4];
  int ncarry;
  blob_writer *w;
  char blob[BLOB_NAME_MAX];
  unsigned char *buf;
  size_t cap;
  uint64_t bytes;
  /* a quantized fragment (codec != fp32): its wire bytes, decoded on the thread pool */
  int codec;
  uint32_t block;
  unsigned char *enc;
  float *dec;
  /* where enc goes, kept as sent for replay pulls (BLOB_ENCODED; "" = not kept) */
  char enc_blob[BLOB_NAME_MAX];
  /* a sparse fragment (SparseLoCo, codec CODEC_SPARSE): checked on the thread pool, spooled as
   * sent (zero-padded to whole floats in enc) with the job's settings and tensor lengths */
  int sparse;
  int claimed; /* holds its lease's place in coord.push_leases (a delta being written) */
  dpc_sparse_cfg sp_cfg;
  uint64_t *sp_tlen;
  int sp_nt;
  Dipaco__V1__FragmentAck *acks;
  int n_acks, cap_acks;
  uv_work_t req;
  int work_rc;
  uint32_t work_crc;
  char err[512];
  /* an fp32 chunk being checked, checksummed and spooled on the thread pool (push_chunk_work) */
  struct grpc_byte_buffer *msg_ref;
  struct rpc_chunk cur;
  uint64_t bad_at, since_writeback;
  /* PAYLOAD_DELTA_OBJECT: the delta is the object PrepareDeltaPut named (svc_put.c), p->blob;
   * its claimed payload CRC, and the size and MD5 it was prepared with */
  int object, obj_nomd5; /* obj_nomd5: prepared by an earlier run of the coordinator: no MD5 known */
  uint32_t obj_crc;
  uint32_t dup_enc_crc;  /* mode 1: the recorded delta's stream CRC-32C as sent (0: fp32) */
  uint32_t obj_dec_crc;  /* an encoded object: its decoded payload's CRC-32C (the row's checksum) */
  int obj_encoded;       /* the object holds the stream as sent in the job's codec (BLOB_ENCODED) */
  int64_t obj_attempt;
  uint64_t obj_bytes;
  unsigned char obj_md5[16];
  int obj_parts;                     /* put in parts: the upload to complete, its parts' MD5s */
  unsigned char (*obj_part_md5)[16]; /* [obj_parts], owned */
  char obj_upload_id[512];
} push;

/* How many deltas the coordinator writes at once (coord.push_leases). */
#define COORD_MAX_PUSHES ((int)(sizeof ((coord *)0)->push_leases / sizeof(int64_t)))

/* Take the lease's writing place: 0, or -1 when another stream of the lease is writing or the
 * coordinator has COORD_MAX_PUSHES deltas in flight. */
int push_claim(push *p);
/* Free the push (its lease's place, spool, buffers). */
void push_free(push *p);
/* Refuse the push with status code and message (once; the spool is dropped, nothing stored). */
void push_fail(push *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The last chunk of a fragment arrived: check the CRC, then by mode acknowledge a repeat, drop
 * a stale or late delta, or screen it and queue its durable commit. Returns on_message's
 * value: 1 while the commit runs (reading pauses), else 0. */
int push_finish_fragment(push *p, const struct rpc_chunk *ch);

/* PAYLOAD_DELTA_OBJECT (mode 0): take the prepared object for the push's lease and fragment into
 * p->blob (0), or fail the push (-1): none prepared, or another checksum. */
int push_object_take(push *p);

#endif
