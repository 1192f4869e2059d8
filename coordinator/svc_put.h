/* svc_put.h — PrepareDeltaPut and the objects it named (layer 4, see coord.h): workers PUT fp32
 * deltas and inner state to an S3 store themselves and commit them with PushDelta
 * (PAYLOAD_DELTA_OBJECT, svc_push.c) or PushInnerState (PAYLOAD_INNER_OBJECT, svc_inner.c).
 *
 * Contract: loop thread only; the table is coord.puts (coord.h put_prep). */
#ifndef DPC_COORD_SVC_PUT_H
#define DPC_COORD_SVC_PUT_H

#include "common/rpc.h"
#include "coordinator/coord.h"

/* Fill out[] with this file's methods (ud = c) and return how many. */
int svc_put_methods(coord *c, struct rpc_method *out);

/* 1 when the leases of job j carry Lease.delta_put (an S3 store; fp32 deltas, quantized ones
 * kept as sent, or SparseLoCo's; and the coordinator allows it). */
int put_lease_wants(const coord *c, const coord_job *j);
/* The stream a put delta object of fragment frag of job j holds, as its commit names it: the
 * codec (fp32, the job's quantized codec, or CODEC_SPARSE in a SparseLoCo job), its block size
 * (0 unless a block codec) and the stream's bytes. 0, or dpc_codec_bytes's error. */
int put_delta_stream(const coord_job *j, int frag, int *codec, uint32_t *block, size_t *bytes);
/* What a put delta object of fragment frag of job j is: an fp32 blob (BLOB_DELTA), or the
 * stream as sent (put_delta_stream), padded to whole floats, in the blob a pushed one is kept
 * as (BLOB_ENCODED, BLOB_SPARSE); *bytes the object's size. 0, or dpc_codec_bytes's error. */
int put_delta_object(const coord_job *j, int frag, blob_kind *kind, uint64_t *bytes);
/* Lease.delta_put_part_bytes of job j's leases: --s3-put-part-mb, or the smallest whole MiB
 * above it that puts the job's largest delta object in S3's 10000 parts (s3_part_bytes). */
uint64_t put_part_bytes(const coord *c, const coord_job *j);

/* 1 when the leases of job j carry Lease.inner_put (an S3 store, inner.state checkpoint, and
 * the coordinator allows puts). */
int put_inner_wants(const coord *c, const coord_job *j);

/* The object of `kind` (BLOB_DELTA or BLOB_INNER_*) prepared for (lease, fragment), or NULL;
 * put_forget drops it (committed or refused); put_free_all frees the table at shutdown. */
const put_prep *put_prepared(const coord *c, int64_t lease, int frag, blob_kind kind);
void put_forget(coord *c, int64_t lease, int frag, blob_kind kind);
/* put_forget for an entry whose object is not wanted: its upload aborted, its object deleted;
 * 0 when there was no entry. */
int put_discard(coord *c, int64_t lease, int frag, blob_kind kind);
void put_free_all(coord *c);
/* The tick's part: delete the objects of entries whose lease ended uncommitted or whose URLs
 * are long dead, and drop the entries. */
void put_sweep(coord *c);

#endif
