/* test_blobs_cache.c — the blob payload cache (coordinator/blobs_cache.h): an entry is readable
 * only once published, under its name, kind and length; reserved and published bytes stay
 * within the budget by evicting the least recently used entry; a payload larger than the
 * budget is not cached; an entry a reader holds outlives its eviction and removal; publishing
 * a name again replaces the old entry; the counters add up; a freed entry's buffer is kept as a
 * spare within the budget and taken by the next reservation of its length, and spares go
 * before published entries when room is needed; an entry held past the cache's end stays
 * valid; buffers made ahead (prewarm) are spares within the count and the budget. */
#include "coordinator/blobs_cache.h"
#include "tests/unit/test.h"

#include <string.h>

/* Reserve, fill with v and publish name (n floats); 1 when it was cached. */
static int put(blobs_cache *bc, const char *name, size_t n, float v) {
  blobs_cache_entry *e = blobs_cache_reserve(bc, name, 3, n);
  if (!e) return 0;
  for (size_t i = 0; i < n; i++) e->data[i] = v;
  blobs_cache_publish(bc, e, (uint32_t)(v * 10));
  return 1;
}

static int has(blobs_cache *bc, const char *name, size_t n) {
  blobs_cache_entry *e = blobs_cache_get(bc, name, 3, n);
  blobs_cache_unref(bc, e);
  return e != NULL;
}

int main(void) {
  CHECK(blobs_cache_new(0) == NULL);
  blobs_cache *bc = blobs_cache_new(4000); /* 1000 floats */
  CHECK(bc != NULL);
  if (!bc) TEST_DONE();
  blobs_cache_stats st;

  /* Not readable while being filled; readable once published, with its crc and bytes. */
  blobs_cache_entry *e = blobs_cache_reserve(bc, "1/f0-v1.delta", 3, 300);
  CHECK(e != NULL);
  CHECK(!has(bc, "1/f0-v1.delta", 300));
  blobs_cache_stats_get(bc, &st);
  CHECK(st.reserved == 1200 && st.resident == 0);
  for (int i = 0; i < 300; i++) e->data[i] = (float)i;
  blobs_cache_publish(bc, e, 77);
  blobs_cache_entry *g = blobs_cache_get(bc, "1/f0-v1.delta", 3, 300);
  CHECK(g && g->crc == 77 && g->data[299] == 299.0f);
  blobs_cache_unref(bc, g);
  CHECK(!blobs_cache_get(bc, "1/f0-v1.delta", 2, 300)); /* another kind */
  CHECK(!blobs_cache_get(bc, "1/f0-v1.delta", 3, 299)); /* another length */
  blobs_cache_stats_get(bc, &st);
  CHECK(st.reserved == 0 && st.resident == 1200 && st.hits == 1 && st.hit_bytes == 1200 && st.misses == 3);

  /* A dropped reservation leaves nothing; a payload over the budget is not cached. */
  blobs_cache_drop(bc, blobs_cache_reserve(bc, "1/f0-v2.delta", 3, 100));
  CHECK(!has(bc, "1/f0-v2.delta", 100));
  CHECK(blobs_cache_reserve(bc, "big", 3, 1001) == NULL);
  CHECK(has(bc, "1/f0-v1.delta", 300)); /* ... and evicted nothing for it */

  /* The least recently used entry goes first: b was read after a, so c evicts a. */
  CHECK(put(bc, "a", 300, 1) && put(bc, "b", 300, 2));
  CHECK(has(bc, "1/f0-v1.delta", 300) && has(bc, "b", 300));
  CHECK(put(bc, "c", 300, 3));
  CHECK(!has(bc, "a", 300) && has(bc, "b", 300) && has(bc, "c", 300) && has(bc, "1/f0-v1.delta", 300));
  blobs_cache_stats_get(bc, &st);
  CHECK(st.resident == 3600 && st.evictions == 1 && st.resident <= st.cap);

  /* An entry held by a reader stays valid after eviction and removal. */
  blobs_cache_entry *held = blobs_cache_get(bc, "b", 3, 300);
  CHECK(held != NULL);
  blobs_cache_remove(bc, "b");
  CHECK(!has(bc, "b", 300));
  CHECK(put(bc, "d", 900, 4)); /* evicts everything else */
  CHECK(held && held->data[0] == 2.0f && held->data[299] == 2.0f);
  blobs_cache_unref(bc, held);
  blobs_cache_stats_get(bc, &st);
  CHECK(st.resident == 3600 && !has(bc, "c", 300) && !has(bc, "1/f0-v1.delta", 300));

  /* Publishing a name again replaces its entry. */
  CHECK(put(bc, "d", 900, 5));
  g = blobs_cache_get(bc, "d", 3, 900);
  CHECK(g && g->data[0] == 5.0f && g->crc == 50);
  blobs_cache_unref(bc, g);
  blobs_cache_stats_get(bc, &st);
  CHECK(st.resident == 3600);

  /* Recycling: the replaced and removed entries' buffers are spares within the budget; a
   * reservation of the same length takes one (the same memory, no fresh allocation). */
  blobs_cache_stats_get(bc, &st);
  CHECK(st.spare <= st.cap - st.resident);
  g = blobs_cache_get(bc, "d", 3, 900);
  float *d_mem = g ? g->data : NULL;
  blobs_cache_unref(bc, g);
  blobs_cache_remove(bc, "d");
  blobs_cache_stats_get(bc, &st);
  CHECK(st.resident == 0 && st.spare >= 3600 && st.spare <= st.cap);
  uint64_t reuses = st.reuses;
  e = blobs_cache_reserve(bc, "e", 3, 900);
  CHECK(e && e->data == d_mem);
  blobs_cache_stats_get(bc, &st);
  CHECK(st.reuses == reuses + 1 && st.reserved == 3600 && st.resident + st.reserved + st.spare <= st.cap);
  for (int i = 0; e && i < 900; i++) e->data[i] = 6.0f;
  if (e) blobs_cache_publish(bc, e, 60);
  g = blobs_cache_get(bc, "e", 3, 900);
  CHECK(g && g->data[0] == 6.0f && g->data[899] == 6.0f && g->crc == 60);
  blobs_cache_unref(bc, g);

  /* Room for another length: spares are freed before any published entry is evicted. */
  blobs_cache_remove(bc, "e");
  CHECK(put(bc, "f", 100, 7));
  blobs_cache_stats_get(bc, &st);
  uint64_t evictions = st.evictions;
  CHECK(st.spare == 3600 && st.resident == 400); /* e's buffer waits for a 900-float entry */
  CHECK(put(bc, "g", 500, 8));                   /* 400 + 2000 + 3600 > 4000: the spare goes */
  blobs_cache_stats_get(bc, &st);
  CHECK(st.evictions == evictions && st.spare == 0 && st.resident == 2400);
  CHECK(has(bc, "f", 100) && has(bc, "g", 500));

  /* A dropped reservation's buffer is a spare too; a reader may hold an entry past the end. */
  blobs_cache_drop(bc, blobs_cache_reserve(bc, "h", 3, 200));
  blobs_cache_stats_get(bc, &st);
  CHECK(st.reserved == 0 && st.spare == 800 && st.resident + st.spare <= st.cap);
  held = blobs_cache_get(bc, "g", 3, 500);
  blobs_cache_free(bc);
  CHECK(held && held->data[0] == 8.0f && held->data[499] == 8.0f);
  blobs_cache_unref(NULL, held); /* frees the entry and, last, the cache (ASan: no leak) */

  /* Buffers made ahead: spares of one length up to the count asked for and the budget; a
   * reservation of that length takes one instead of fresh memory. */
  CHECK(blobs_cache_prewarm(NULL, 10, 1) == 0);
  bc = blobs_cache_new(4000);
  CHECK(bc != NULL);
  if (!bc) TEST_DONE();
  CHECK(blobs_cache_prewarm(bc, 300, 5) == 3); /* a fourth would pass 1000 floats */
  blobs_cache_stats_get(bc, &st);
  CHECK(st.spare == 3600 && st.resident == 0 && st.reserved == 0 && st.reuses == 0);
  CHECK(blobs_cache_prewarm(bc, 300, 5) == 0); /* no room left */
  CHECK(blobs_cache_prewarm(bc, 300, 2) == 0); /* already three */
  e = blobs_cache_reserve(bc, "p", 3, 300);
  blobs_cache_stats_get(bc, &st);
  CHECK(e && st.reuses == 1 && st.spare == 2400 && st.reserved == 1200);
  blobs_cache_drop(bc, e);
  blobs_cache_free(bc); /* the spares go with it (ASan: no leak) */
  TEST_DONE();
}
