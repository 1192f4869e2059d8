/* pcache.c — the parameter cache: one referenced fp32 buffer per (job, fragment, version),
 * filled by outer steps and job creation, loaded from the blob store on a miss. */
#include "coordinator/pcache.h"

#include "common/errors.h"

#include <stdlib.h>

void pcache_ref(void *entry) { atomic_fetch_add(&((pcache_entry *)entry)->refs, 1); }

void pcache_unref(void *entry) {
  pcache_entry *e = entry;
  if (atomic_fetch_sub(&e->refs, 1) == 1) {
    free(e->data);
    free(e);
  }
}

static void pcache_insert(coord *c, pcache_entry *e) {
  /* Drop older versions of the same fragment (their streams keep their own references). */
  for (int i = 0; i < c->n_pcache;) {
    pcache_entry *o = c->pcache[i];
    if (o->job == e->job && o->fragment == e->fragment && o->version < e->version) {
      c->pcache[i] = c->pcache[--c->n_pcache];
      pcache_unref(o);
    } else {
      i++;
    }
  }
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

int pcache_get(coord *c, const store_fragment *f, pcache_entry **out) {
  for (int i = 0; i < c->n_pcache; i++) {
    pcache_entry *e = c->pcache[i];
    if (e->job == f->job && e->fragment == f->fragment && e->version == f->version) {
      atomic_fetch_add(&e->refs, 1);
      *out = e;
      return 0;
    }
  }
  pcache_entry *e = calloc(1, sizeof *e);
  if (!e) return dpc_err(DPC_ENOMEM, "out of memory");
  e->data = malloc(f->len * sizeof(float));
  if (!e->data) {
    free(e);
    return dpc_err(DPC_ENOMEM, "out of memory for fragment %d (%zu floats)", f->fragment, f->len);
  }
  /* Loaded on the loop thread: only the first pull of a version after a restart gets here,
   * since every outer step inserts its result. */
  int rc = blob_read(c->bs, f->param_blob, BLOB_PARAMS, e->data, f->len, &e->crc);
  if (rc < 0) {
    free(e->data);
    free(e);
    return rc;
  }
  e->job = f->job;
  e->fragment = f->fragment;
  e->version = f->version;
  e->n = f->len;
  atomic_init(&e->refs, 2); /* cache + caller */
  pcache_insert(c, e);
  *out = e;
  return 0;
}

void pcache_put(coord *c, int64_t job, int fragment, int64_t version, float *data, size_t n, uint32_t crc) {
  pcache_entry *e = calloc(1, sizeof *e);
  if (!e) {
    free(data);
    return;
  }
  e->job = job;
  e->fragment = fragment;
  e->version = version;
  e->data = data;
  e->n = n;
  e->crc = crc;
  atomic_init(&e->refs, 1);
  pcache_insert(c, e);
}

void pcache_clear(coord *c) {
  for (int i = 0; i < c->n_pcache; i++) pcache_unref(c->pcache[i]);
  free(c->pcache);
  c->pcache = NULL;
  c->n_pcache = c->cap_pcache = 0;
}
