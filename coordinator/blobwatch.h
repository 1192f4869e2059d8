/* blobwatch.h — the blob store's outages, seen from the loop thread (docs/design.md §5.8).
 *
 * An S3 store that stops answering (unreachable, timing out, 5xx after the retries) is down
 * from the first request that found it so until one succeeds. While it is down the coordinator
 * grants no lease and starts no outer step (they would fail), says why in `job show`, /metrics
 * (dipaco_blob_store_up) and the status page, and probes the store every BLOBWATCH_PROBE_MS on
 * the thread pool; leases in flight go on (their pushes are retried by the workers). A local
 * store is never down. Loop thread only. */
#ifndef DPC_BLOBWATCH_H
#define DPC_BLOBWATCH_H

#include "coordinator/coord.h"

#include <stddef.h>

#define BLOBWATCH_PROBE_MS 2000

/* Every tick: notice an outage or its end (logged once each); probe while down, or while failed
 * writes wait to be deleted (blob_store_doubtful). */
void blobwatch_tick(coord *c);
/* 1 while the store is down (reason[cap] and *since_ms, both may be NULL), else 0. */
int blobwatch_down(coord *c, char *reason, size_t cap, int64_t *since_ms);

#endif
