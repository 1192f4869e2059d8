/* blobs_cache.h — a bounded memory cache of whole blob payloads, by name, for a blob store on
 * S3 (blobs.c uses it; nothing else does).
 *
 * Why: on the local store the outer step reads its inputs from the page cache — the deltas the
 * commit just wrote or checked, θ and u the previous step wrote. On S3 every such read is a
 * GET through the store's gateway, and each delta a worker put is read twice (the commit's
 * check, then the outer step). Blob names are written once (blobs.h: a new version, a new
 * attempt, never a rewrite), so a payload the coordinator wrote or read and verified stays
 * the object's bytes until the name is deleted: a copy in memory is never stale. The cache
 * keeps such payloads up to a byte budget and serves later reads of the same name from
 * memory, with no request to the store.
 *
 * An entry is filled privately (reserve, fill data[], publish with its verified crc, or drop)
 * and published only whole and verified, so a reader never sees a partial payload. Reserved,
 * published and spare (below) bytes together stay within the budget: a reservation evicts the least
 * recently used published entries, and fails (NULL: the caller goes on uncached) when even an
 * empty cache could not hold it. Entries are reference-counted; an evicted or removed entry
 * held by a reader is freed when its last reference goes.
 *
 * Payload buffers are recycled: a freed entry's buffer is kept as a spare (counted in the
 * budget) and a later reservation of the same length takes it instead of fresh memory. The
 * same lengths come back round after round (a fragment's deltas, θ and u), and fresh
 * model-sized memory costs a page fault and a zeroed page per 4 KiB on first touch, which
 * made those faults a sixth of a round's CPU on S3. A reservation that finds no spare of its
 * length frees spares before it evicts published entries.
 *
 * Thread-safe (one mutex; the payload copies happen outside it). */
#ifndef DPC_BLOBS_CACHE_H
#define DPC_BLOBS_CACHE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct blobs_cache blobs_cache;

typedef struct blobs_cache_entry {
  blobs_cache *owner; /* takes the buffer back when the last reference goes */
  char *name;
  int kind;
  size_t n;     /* floats */
  uint32_t crc; /* crc32c of the payload (set at publish) */
  float *data;  /* n floats */
  atomic_int refs;
  uint64_t used; /* LRU clock of the last get or publish */
} blobs_cache_entry;

/* Counters since the cache was made (bytes are payload bytes). */
typedef struct {
  uint64_t cap, resident, reserved; /* budget, published bytes, bytes being filled */
  uint64_t spare;                   /* freed payload buffers kept for reuse */
  uint64_t hit_bytes, hits, misses, evictions, reuses;
} blobs_cache_stats;

/* A cache of at most cap bytes; NULL when cap is 0 or out of memory (no cache). */
blobs_cache *blobs_cache_new(uint64_t cap);
/* Frees every entry no reader holds and the spares; held ones go with their last reference
 * (the cache's own memory with the last of them). */
void blobs_cache_free(blobs_cache *bc);

/* A referenced published entry of `name` with n floats of `kind`, or NULL (counted as a miss). */
blobs_cache_entry *blobs_cache_get(blobs_cache *bc, const char *name, int kind, size_t n);
void blobs_cache_unref(blobs_cache *bc, blobs_cache_entry *e);

/* A private entry of n floats to fill (its data[] holds garbage until filled: a recycled
 * buffer), or NULL when it cannot fit the budget or memory. */
blobs_cache_entry *blobs_cache_reserve(blobs_cache *bc, const char *name, int kind, size_t n);
/* Make a filled entry readable with its payload's verified crc (replacing an older entry of
 * the same name); the caller's reference is consumed. */
void blobs_cache_publish(blobs_cache *bc, blobs_cache_entry *e, uint32_t crc);
/* Give up a reserved entry that was not filled. */
void blobs_cache_drop(blobs_cache *bc, blobs_cache_entry *e);

/* Forget `name` (its blob is being deleted). */
void blobs_cache_remove(blobs_cache *bc, const char *name);

void blobs_cache_stats_get(blobs_cache *bc, blobs_cache_stats *out);

/* Spares of n floats made ahead, their pages touched, until `want` of that length are kept or
 * the budget or the spare slots are full: a job's first rounds then fill their θ, u and
 * delta copies without faulting fresh pages in while workers wait (the same count of the same
 * lengths comes back every round). Returns how many it made. Slow (touches the memory): call
 * it off the loop thread. */
int blobs_cache_prewarm(blobs_cache *bc, size_t n, int want);

#endif
