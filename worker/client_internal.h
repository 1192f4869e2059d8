/* client_internal.h — what the worker's Coordinator calls (client.c, client_put.c) share and
 * nothing else includes: the service's path, the timeouts, and the PushDelta helpers. */
#ifndef DPC_WORKER_CLIENT_INTERNAL_H
#define DPC_WORKER_CLIENT_INTERNAL_H

#include "common/rpc.h"
#include "proto/dipaco.pb-c.h"

#include <stddef.h>
#include <stdint.h>

#define SVC "/dipaco.v1.Coordinator/"
#define UNARY_TIMEOUT_MS 10000

/* A transfer gets 30 s plus 1 s per 10 MB (a floor of 10 MB/s). */
static inline int transfer_timeout_ms(size_t bytes) {
  uint64_t ms = 30000 + bytes / 10000;
  return ms > 3600000 ? 3600000 : (int)ms;
}

/* The end of a PushDelta stream s (wc_push, wc_push_sparse, wc_push_objects) whose writes ended
 * with rc: finish it also after a failed write (the status says why the server hung up), and
 * fill results[i] with fragment i's PushResult from the acks. */
int wc_push_finish(struct rpc_stream *s, Dipaco__V1__FragmentInfo *const *frags, size_t n, int rc, int *results,
                   int *code);
/* The chunk header fields every delta a lease pushes shares, bytes or an object's commit. */
void wc_delta_header(struct rpc_chunk *h, uint64_t lease_id, const Dipaco__V1__FragmentInfo *f, uint64_t inner_steps,
                     uint64_t tokens, int payload);

#endif
