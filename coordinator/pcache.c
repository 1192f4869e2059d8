/* pcache.c — the parameter cache: one referenced, read-only mapping of the parameter blob per
 * (job, fragment, version), made by outer steps and job creation, mapped and verified on a
 * miss (contract in pcache.h). */
#include "coordinator/pcache.h"

#include "common/errors.h"
#include "common/log.h"

#include <stdlib.h>

void pcache_ref(void *entry) { atomic_fetch_add(&((pcache_entry *)entry)->refs, 1); }

void pcache_unref(void *entry) {
  pcache_entry *e = entry;
  if (atomic_fetch_sub(&e->refs, 1) == 1) {
    if (e->map) blob_unmap(e->map, e->map_len);
    else free((void *)e->data);
    free(e);
  }
}

/* Drop the versions of (job, fragment) older than version (their streams keep their own
 * references). */
static void pcache_drop_older(coord *c, int64_t job, int fragment, int64_t version) {
  for (int i = 0; i < c->n_pcache;) {
    pcache_entry *o = c->pcache[i];
    if (o->job == job && o->fragment == fragment && o->version < version) {
      c->pcache[i] = c->pcache[--c->n_pcache];
      pcache_unref(o);
    } else {
      i++;
    }
  }
}

static void pcache_insert(coord *c, pcache_entry *e) {
  pcache_drop_older(c, e->job, e->fragment, e->version);
  if (c->n_pcache == c->cap_pcache) {
    int cap = c->cap_pcache ? c->cap_pcache * 2 : 16;
    pcache_entry **a = realloc(c->pcache, (size_t)cap * sizeof *a);
    if (!a) {
      pcache_unref(e); /* not cached; callers hold their own reference */
      return;
    }
    c->pcache = a;
    c->cap_pcache = cap;
  }
  c->pcache[c->n_pcache++] = e;
}

static pcache_entry *entry_new(int64_t job, int fragment, int64_t version, const float *data, void *map, size_t map_len,
                               size_t n, uint32_t crc, int refs) {
  pcache_entry *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->job = job;
  e->fragment = fragment;
  e->version = version;
  e->data = data;
  e->map = map;
  e->map_len = map_len;
  e->n = n;
  e->crc = crc;
  atomic_init(&e->refs, refs);
  return e;
}

int pcache_get(coord *c, const store_fragment *f, pcache_entry **out) {
  for (int i = 0; i < c->n_pcache; i++) {
    pcache_entry *e = c->pcache[i];
    if (e->job == f->job && e->fragment == f->fragment && e->version == f->version) {
      atomic_fetch_add(&e->refs, 1);
      *out = e;
      return 0;
    }
  }
  /* Mapped and verified on the loop thread: only the first pull of a version that is not the
   * newest (start-up maps every current version, outer steps map theirs) gets here. */
  const float *data;
  void *map;
  size_t map_len;
  uint32_t crc;
  int rc = blob_map(c->bs, f->param_blob, BLOB_PARAMS, f->len, 1, &data, &map, &map_len, &crc);
  if (rc < 0) return rc;
  pcache_entry *e = entry_new(f->job, f->fragment, f->version, data, map, map_len, f->len, crc, 2); /* cache + caller */
  if (!e) {
    blob_unmap(map, map_len);
    return dpc_err(DPC_ENOMEM, "out of memory");
  }
  pcache_insert(c, e);
  *out = e;
  return 0;
}

/* On an S3 store every lease carries the version's URL and workers read it from there: a new
 * version is not kept (mapping it at a round's close would fetch it whole on the loop thread
 * before the next lease is granted), only the older ones dropped; a worker that falls back to
 * PullFragment has pcache_get map it. */
static int keeps_new(coord *c, int64_t job, int fragment, int64_t version) {
  if (!blob_store_is_s3(c->bs)) return 1;
  pcache_drop_older(c, job, fragment, version);
  return 0;
}

void pcache_put_map(coord *c, int64_t job, int fragment, int64_t version, const float *data, void *map, size_t map_len,
                    size_t n, uint32_t crc) {
  if (!keeps_new(c, job, fragment, version)) {
    blob_unmap(map, map_len);
    return;
  }
  pcache_entry *e = entry_new(job, fragment, version, data, map, map_len, n, crc, 1);
  if (!e) {
    blob_unmap(map, map_len);
    return;
  }
  pcache_insert(c, e);
}

void pcache_put_blob(coord *c, int64_t job, int fragment, int64_t version, const char *blob, size_t n, uint32_t crc) {
  if (!keeps_new(c, job, fragment, version)) return;
  const float *data;
  void *map;
  size_t map_len;
  uint32_t got = 0;
  int rc = blob_map(c->bs, blob, BLOB_PARAMS, n, 0, &data, &map, &map_len, &got);
  if (rc == 0 && got != crc) {
    blob_unmap(map, map_len);
    rc = dpc_err(DPC_ECHECKSUM, "blob %s: trailer crc 0x%08x, its writer reported 0x%08x", blob, got, crc);
  }
  if (rc < 0) {
    DPC_WARN("parameter cache: %s (the first pull maps it again)", dpc_errmsg());
    return;
  }
  pcache_put_map(c, job, fragment, version, data, map, map_len, n, crc);
}

void pcache_clear(coord *c) {
  for (int i = 0; i < c->n_pcache; i++) pcache_unref(c->pcache[i]);
  free(c->pcache);
  c->pcache = NULL;
  c->n_pcache = c->cap_pcache = 0;
}
