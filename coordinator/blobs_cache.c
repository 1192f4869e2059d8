/* blobs_cache.c — the memory cache of whole, verified blob payloads (contract in
 * blobs_cache.h). A handful of entries at a time (a round's deltas, θ and u), so the table is a
 * plain array searched linearly and eviction scans it for the least recently used entry. */
#include "coordinator/blobs_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Spare buffers kept at most (a round's deltas, θ and u of a few fragments). */
#define SPARE_MAX 16

struct blobs_cache {
  pthread_mutex_t mu;
  blobs_cache_entry **e; /* published entries */
  int n, cap_e;
  uint64_t clock;
  blobs_cache_stats st;
  struct {
    float *data;
    size_t n;
  } spare[SPARE_MAX];
  int n_spare;
  int closed;       /* blobs_cache_free ran: buffers are no longer kept */
  atomic_int refs;  /* the owner's, and one per entry alive */
};

blobs_cache *blobs_cache_new(uint64_t cap) {
  if (cap == 0) return NULL;
  blobs_cache *bc = calloc(1, sizeof *bc);
  if (!bc) return NULL;
  pthread_mutex_init(&bc->mu, NULL);
  atomic_init(&bc->refs, 1);
  bc->st.cap = cap;
  return bc;
}

static void cache_unref(blobs_cache *bc) {
  if (atomic_fetch_sub(&bc->refs, 1) != 1) return;
  pthread_mutex_destroy(&bc->mu);
  free(bc);
}

/* Keep a freed payload buffer as a spare when the budget has room, else free it (under the
 * lock). */
static void spare_or_free(blobs_cache *bc, float *data, size_t n) {
  uint64_t bytes = (uint64_t)n * sizeof(float);
  if (data && !bc->closed && bc->n_spare < SPARE_MAX &&
      bc->st.resident + bc->st.reserved + bc->st.spare + bytes <= bc->st.cap) {
    bc->spare[bc->n_spare].data = data;
    bc->spare[bc->n_spare++].n = n;
    bc->st.spare += bytes;
  } else {
    free(data);
  }
}

/* The last reference to e went. locked: the caller holds the cache's lock (and so a reference
 * of its own to the cache, which therefore outlives this). */
static void entry_release(blobs_cache_entry *e, int locked) {
  blobs_cache *bc = e->owner;
  if (!locked) pthread_mutex_lock(&bc->mu);
  spare_or_free(bc, e->data, e->n);
  if (!locked) pthread_mutex_unlock(&bc->mu);
  free(e->name);
  free(e);
  cache_unref(bc);
}

static void entry_unref(blobs_cache_entry *e, int locked) {
  if (atomic_fetch_sub(&e->refs, 1) == 1) entry_release(e, locked);
}

void blobs_cache_free(blobs_cache *bc) {
  if (!bc) return;
  pthread_mutex_lock(&bc->mu);
  bc->closed = 1;
  for (int i = 0; i < bc->n; i++) entry_unref(bc->e[i], 1);
  bc->n = 0;
  free(bc->e);
  bc->e = NULL;
  for (int i = 0; i < bc->n_spare; i++) free(bc->spare[i].data);
  bc->n_spare = 0;
  pthread_mutex_unlock(&bc->mu);
  cache_unref(bc);
}

/* Take entry i out of the table (under the lock); the table's reference goes. */
static void unpublish(blobs_cache *bc, int i) {
  blobs_cache_entry *e = bc->e[i];
  bc->e[i] = bc->e[--bc->n];
  bc->st.resident -= (uint64_t)e->n * sizeof(float);
  entry_unref(e, 1);
}

static int find(const blobs_cache *bc, const char *name) {
  for (int i = 0; i < bc->n; i++)
    if (strcmp(bc->e[i]->name, name) == 0) return i;
  return -1;
}

blobs_cache_entry *blobs_cache_get(blobs_cache *bc, const char *name, int kind, size_t n) {
  if (!bc) return NULL;
  pthread_mutex_lock(&bc->mu);
  int i = find(bc, name);
  blobs_cache_entry *e = i >= 0 && bc->e[i]->kind == kind && bc->e[i]->n == n ? bc->e[i] : NULL;
  if (e) {
    atomic_fetch_add(&e->refs, 1);
    e->used = ++bc->clock;
    bc->st.hits++;
    bc->st.hit_bytes += (uint64_t)n * sizeof(float);
  } else {
    bc->st.misses++;
  }
  pthread_mutex_unlock(&bc->mu);
  return e;
}

void blobs_cache_unref(blobs_cache *bc, blobs_cache_entry *e) {
  (void)bc;
  if (e) entry_unref(e, 0);
}

/* Under the lock: a spare of exactly n floats taken out of the spares, or NULL. */
static float *take_spare(blobs_cache *bc, size_t n) {
  for (int i = 0; i < bc->n_spare; i++)
    if (bc->spare[i].n == n) {
      float *d = bc->spare[i].data;
      bc->spare[i] = bc->spare[--bc->n_spare];
      bc->st.spare -= (uint64_t)n * sizeof(float);
      bc->st.reuses++;
      return d;
    }
  return NULL;
}

blobs_cache_entry *blobs_cache_reserve(blobs_cache *bc, const char *name, int kind, size_t n) {
  if (!bc || n == 0) return NULL;
  uint64_t bytes = (uint64_t)n * sizeof(float);
  if (bytes > bc->st.cap) return NULL; /* would empty the cache and still not fit */
  pthread_mutex_lock(&bc->mu);
  float *data = take_spare(bc, n);
  /* Room for a fresh buffer: spares go before published entries, the least recently used
   * first. */
  while (!data && bc->st.resident + bc->st.reserved + bc->st.spare + bytes > bc->st.cap && (bc->n_spare || bc->n)) {
    if (bc->n_spare) {
      bc->n_spare--;
      bc->st.spare -= (uint64_t)bc->spare[bc->n_spare].n * sizeof(float);
      free(bc->spare[bc->n_spare].data);
      continue;
    }
    int lru = 0;
    for (int i = 1; i < bc->n; i++)
      if (bc->e[i]->used < bc->e[lru]->used) lru = i;
    unpublish(bc, lru);
    bc->st.evictions++;
    data = take_spare(bc, n); /* the evicted entry's buffer, when it had this length */
  }
  int fits = data || bc->st.resident + bc->st.reserved + bc->st.spare + bytes <= bc->st.cap;
  if (fits) {
    bc->st.reserved += bytes;
    atomic_fetch_add(&bc->refs, 1); /* the entry's */
  }
  pthread_mutex_unlock(&bc->mu);
  if (!fits) return NULL;
  blobs_cache_entry *e = calloc(1, sizeof *e);
  if (e && (e->name = strdup(name)) && (data || (data = malloc(bytes)))) {
    e->owner = bc;
    e->data = data;
    e->kind = kind;
    e->n = n;
    atomic_init(&e->refs, 1);
    return e;
  }
  if (e) free(e->name);
  free(e);
  pthread_mutex_lock(&bc->mu);
  bc->st.reserved -= bytes;
  spare_or_free(bc, data, n);
  pthread_mutex_unlock(&bc->mu);
  cache_unref(bc);
  return NULL;
}

void blobs_cache_drop(blobs_cache *bc, blobs_cache_entry *e) {
  if (!e) return;
  pthread_mutex_lock(&bc->mu);
  bc->st.reserved -= (uint64_t)e->n * sizeof(float);
  pthread_mutex_unlock(&bc->mu);
  entry_unref(e, 0);
}

void blobs_cache_publish(blobs_cache *bc, blobs_cache_entry *e, uint32_t crc) {
  e->crc = crc;
  pthread_mutex_lock(&bc->mu);
  bc->st.reserved -= (uint64_t)e->n * sizeof(float);
  int i = find(bc, e->name);
  if (i >= 0) unpublish(bc, i);
  if (bc->n == bc->cap_e) {
    int cap = bc->cap_e ? 2 * bc->cap_e : 16;
    blobs_cache_entry **a = realloc(bc->e, (size_t)cap * sizeof *a);
    if (!a) { /* not cached: the reader goes to the store next time */
      entry_unref(e, 1);
      pthread_mutex_unlock(&bc->mu);
      return;
    }
    bc->e = a;
    bc->cap_e = cap;
  }
  e->used = ++bc->clock;
  bc->e[bc->n++] = e;
  bc->st.resident += (uint64_t)e->n * sizeof(float);
  pthread_mutex_unlock(&bc->mu);
}

void blobs_cache_remove(blobs_cache *bc, const char *name) {
  if (!bc) return;
  pthread_mutex_lock(&bc->mu);
  int i = find(bc, name);
  if (i >= 0) unpublish(bc, i);
  pthread_mutex_unlock(&bc->mu);
}

void blobs_cache_stats_get(blobs_cache *bc, blobs_cache_stats *out) {
  if (!bc) {
    *out = (blobs_cache_stats){0};
    return;
  }
  pthread_mutex_lock(&bc->mu);
  *out = bc->st;
  pthread_mutex_unlock(&bc->mu);
}

/* Under the lock: whether one more spare of n floats would be kept, with `want` of them. */
static int spare_wanted(const blobs_cache *bc, size_t n, int want) {
  int have = 0;
  for (int i = 0; i < bc->n_spare; i++) have += bc->spare[i].n == n;
  return !bc->closed && have < want && bc->n_spare < SPARE_MAX &&
         bc->st.resident + bc->st.reserved + bc->st.spare + (uint64_t)n * sizeof(float) <= bc->st.cap;
}

int blobs_cache_prewarm(blobs_cache *bc, size_t n, int want) {
  if (!bc || n == 0) return 0;
  const size_t bytes = n * sizeof(float);
  for (int made = 0;; made++) {
    pthread_mutex_lock(&bc->mu);
    int more = spare_wanted(bc, n, want);
    pthread_mutex_unlock(&bc->mu);
    float *d = more ? malloc(bytes) : NULL;
    if (!d) return made;
    for (size_t i = 0; i < bytes; i += 4096) ((volatile char *)d)[i] = 0; /* fault each page in now */
    pthread_mutex_lock(&bc->mu);
    more = spare_wanted(bc, n, want); /* a reservation may have taken the room meanwhile */
    if (more) spare_or_free(bc, d, n);
    pthread_mutex_unlock(&bc->mu);
    if (!more) {
      free(d);
      return made;
    }
  }
}
