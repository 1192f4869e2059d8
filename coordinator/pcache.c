/* pcache.c — the parameter cache: one referenced, read-only mapping of the parameter blob per
 * (job, fragment, version), made by outer steps and job creation, mapped and verified on the
 * thread pool on a miss (contract in pcache.h). */
#include "coordinator/pcache.h"

#include "common/errors.h"
#include "common/log.h"
#include "coordinator/loop.h"
#include "coordinator/testhook.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A version being mapped and verified on the thread pool, and the calls waiting for it. */
typedef struct pcache_waiter {
  pcache_ready_fn ready;
  void *ud;
  struct pcache_waiter *next;
} pcache_waiter;

typedef struct pcache_fill {
  uv_work_t req;
  coord *c;
  int64_t job;
  int fragment;
  int64_t version;
  char blob[BLOB_NAME_MAX];
  size_t n;
  const float *data; /* result (work thread) */
  void *map;
  size_t map_len;
  uint32_t crc;
  int rc;
  char err[512];
  pcache_waiter *waiters;
  struct pcache_fill *next;
} pcache_fill;

static void fill_run(uv_work_t *req) {
  pcache_fill *fl = req->data;
  int ms = testhook_pool_delay_ms();
  if (ms > 0) uv_sleep((unsigned)ms);
  fl->rc = blob_map(fl->c->bs, fl->blob, BLOB_PARAMS, fl->n, 1, &fl->data, &fl->map, &fl->map_len, &fl->crc);
  if (fl->rc < 0) snprintf(fl->err, sizeof fl->err, "%s", dpc_errmsg());
}

/* Loop thread: cache the mapping and hand each waiter its reference (or the failure). */
static void fill_after(uv_work_t *req, int status) {
  pcache_fill *fl = req->data;
  coord *c = fl->c;
  for (pcache_fill **p = &c->pcache_fills; *p; p = &(*p)->next)
    if (*p == fl) {
      *p = fl->next;
      break;
    }
  if (status && fl->rc == 0) {
    blob_unmap(fl->map, fl->map_len);
    fl->rc = DPC_EINTERNAL;
    snprintf(fl->err, sizeof fl->err, "parameter fill canceled");
  }
  int nw = 0;
  for (pcache_waiter *w = fl->waiters; w; w = w->next) nw++;
  pcache_entry *e = NULL;
  if (fl->rc == 0) {
    e = entry_new(fl->job, fl->fragment, fl->version, fl->data, fl->map, fl->map_len, fl->n, fl->crc, 1 + nw);
    if (!e) {
      blob_unmap(fl->map, fl->map_len);
      fl->rc = DPC_ENOMEM;
      snprintf(fl->err, sizeof fl->err, "out of memory");
    } else {
      pcache_insert(c, e); /* the cache's reference */
    }
  }
  while (fl->waiters) {
    pcache_waiter *w = fl->waiters;
    fl->waiters = w->next;
    if (fl->rc < 0) dpc_err(fl->rc, "%s", fl->err);
    w->ready(c, e, fl->rc, w->ud);
    free(w);
  }
  free(fl);
  loop_work_done(c);
}

int pcache_get_async(coord *c, const store_fragment *f, pcache_entry **out, pcache_ready_fn ready, void *ud) {
  for (int i = 0; i < c->n_pcache; i++) {
    pcache_entry *e = c->pcache[i];
    if (e->job == f->job && e->fragment == f->fragment && e->version == f->version) {
      atomic_fetch_add(&e->refs, 1);
      *out = e;
      return 1;
    }
  }
  pcache_waiter *w = calloc(1, sizeof *w);
  if (!w) return dpc_err(DPC_ENOMEM, "out of memory");
  w->ready = ready;
  w->ud = ud;
  for (pcache_fill *fl = c->pcache_fills; fl; fl = fl->next)
    if (fl->job == f->job && fl->fragment == f->fragment && fl->version == f->version) {
      w->next = fl->waiters;
      fl->waiters = w;
      return 0;
    }
  /* A miss (a version a worker pulls through the coordinator on an S3 store, an older one, an
   * export's): reading and checking it is a whole pass over the version, or a whole download,
   * which must not hold up the loop thread. */
  pcache_fill *fl = calloc(1, sizeof *fl);
  if (!fl || strlen(f->param_blob) >= sizeof fl->blob) {
    free(w);
    free(fl);
    return fl ? dpc_err(DPC_EINTERNAL, "blob name too long") : dpc_err(DPC_ENOMEM, "out of memory");
  }
  fl->c = c;
  fl->job = f->job;
  fl->fragment = f->fragment;
  fl->version = f->version;
  snprintf(fl->blob, sizeof fl->blob, "%s", f->param_blob);
  fl->n = f->len;
  fl->waiters = w;
  fl->req.data = fl;
  if (loop_queue_work(c, &fl->req, fill_run, fill_after) < 0) {
    free(w);
    free(fl);
    return dpc_err(DPC_EINTERNAL, "cannot queue the parameter fill");
  }
  fl->next = c->pcache_fills;
  c->pcache_fills = fl;
  DPC_INFO("parameter cache: job %lld fragment %d version %lld is read and checked on the thread pool",
           (long long)f->job, f->fragment + 1, (long long)f->version);
  return 0;
}

/* On an S3 store every lease carries the version's URL and workers read it from there: a new
 * version is not kept (mapping it at a round's close would fetch it whole on the loop thread
 * before the next lease is granted), only the older ones dropped; a worker that falls back to
 * PullFragment has pcache_get_async map it. */
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
