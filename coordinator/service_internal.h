/* service_internal.h — what the Coordinator service's files (service.c, innerstate.c) share:
 * call authentication, request unpacking, the liveness touch, and the inner-state handlers
 * that service.c's method table names. Loop thread only, like every handler. */
#ifndef DPC_SERVICE_INTERNAL_H
#define DPC_SERVICE_INTERNAL_H

#include "common/rpc.h"
#include "coordinator/coord.h"

/* Largest chunk payload a worker may stream to us (the message limit minus header room). */
#define MAX_CHUNK_ACCEPT (RPC_MAX_MSG_DEFAULT - (64u << 10))

/* 1 = authenticated (*worker set), 0 = unknown worker id with allow_unknown (call not
 * finished), -1 = the call was finished with UNAUTHENTICATED / UNAVAILABLE. */
int svc_authenticate(struct rpc_call *call, int64_t *worker, int allow_unknown);
/* Unpack a request; on failure finishes the call with INVALID_ARGUMENT and returns -1. */
int svc_unpack(struct rpc_call *call, const struct grpc_byte_buffer *req, const ProtobufCMessageDescriptor *d,
               ProtobufCMessage **out);
/* Any authenticated call counts as a sign of life (sps < 0: no speed sample). */
void svc_touch(coord *c, int64_t worker, double sps);
/* 1 if the slot of lease l has a complete checkpoint (m and v of every fragment fids[0..nf))
 * of the round before l's. */
int svc_inner_ckpt_exists(coord *c, const coord_job *j, const store_lease *l, const int *fids, int nf);

void ipush_on_call(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud);
int ipush_on_message(struct rpc_call *call, const struct grpc_byte_buffer *msg, void *ud);
void ipush_on_done(struct rpc_call *call, int cancelled, void *ud);
void on_ipull(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud);

#endif
