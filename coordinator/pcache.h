/* pcache.h — the parameter cache (layer 2, see coord.h): fp32 buffers of fragment versions
 * served zero-copy to PullFragment streams and read by exports. Only the newest version of a
 * fragment is kept (older ones live on while streams still reference them).
 *
 * Contract: every function but pcache_ref/pcache_unref runs on the loop thread. An entry is
 * freed when its last reference goes; those two may run on any thread (gRPC lets go of
 * zero-copy chunks from its own threads), so the count is atomic. */
#ifndef DPC_COORD_PCACHE_H
#define DPC_COORD_PCACHE_H

#include "coordinator/coord.h"

/* Get a referenced entry for (job, fragment, version), loading the blob if needed. The caller
 * drops its reference with pcache_unref. */
int pcache_get(coord *c, const store_fragment *f, pcache_entry **out);
/* Insert a new version's buffer (ownership of data passes to the cache). */
void pcache_put(coord *c, int64_t job, int fragment, int64_t version, float *data, size_t n, uint32_t crc);
void pcache_ref(void *entry);   /* any thread */
void pcache_unref(void *entry); /* any thread */
void pcache_clear(coord *c);

#endif
