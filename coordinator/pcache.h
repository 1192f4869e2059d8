/* pcache.h — the parameter cache (layer 2, see coord.h): fp32 parameters of fragment versions
 * served zero-copy to PullFragment streams and read by exports. An entry is a read-only
 * mapping of the version's parameter blob (blob_map), so every concurrent pull of a version
 * is served from one copy — the page cache's, which the kernel may reclaim and read back —
 * and the coordinator holds no private copy of the model. Only the newest version of a
 * fragment is kept (older ones live on while streams still reference them).
 *
 * Contract: every function but pcache_ref/pcache_unref runs on the loop thread. An entry is
 * freed when its last reference goes; those two may run on any thread (gRPC lets go of
 * zero-copy chunks from its own threads), so the count is atomic. */
#ifndef DPC_COORD_PCACHE_H
#define DPC_COORD_PCACHE_H

#include "coordinator/coord.h"

/* A fill's end, on the loop thread: e is a referenced entry (the callee drops it with
 * pcache_unref), or NULL with rc < 0 and dpc_errmsg() saying why. */
typedef void (*pcache_ready_fn)(coord *c, pcache_entry *e, int rc, void *ud);
/* Get a referenced entry for (job, fragment, version) (the caller drops it with pcache_unref)
 * without blocking the loop thread: on a hit, 1 with *out set; on a miss, 0, the blob being
 * mapped and verified on the thread pool (a whole download on an S3 store), after which
 * ready(c, entry, rc, ud) runs. Misses of one version while its fill runs wait on that fill.
 * < 0 (message set) when the fill could not be started; ready then never runs. */
int pcache_get_async(coord *c, const store_fragment *f, pcache_entry **out, pcache_ready_fn ready, void *ud);
/* Insert a new version whose parameter blob `blob` (n floats, payload crc `crc`) was just
 * written and committed: it is mapped without re-reading it. A failure is logged and leaves
 * the version to a later pcache_get. On an S3 store (workers read versions from the store)
 * only the older versions are dropped, and the first PullFragment's fill maps it. */
void pcache_put_blob(coord *c, int64_t job, int fragment, int64_t version, const char *blob, size_t n, uint32_t crc);
/* Insert a mapping the caller made and verified (blob_map: data inside map[0..map_len));
 * ownership of the mapping passes to the cache (on an S3 store it is released at once, and
 * only the older versions are dropped, as in pcache_put_blob). */
void pcache_put_map(coord *c, int64_t job, int fragment, int64_t version, const float *data, void *map, size_t map_len,
                    size_t n, uint32_t crc);
void pcache_ref(void *entry);   /* any thread */
void pcache_unref(void *entry); /* any thread */
void pcache_clear(coord *c);

#endif
