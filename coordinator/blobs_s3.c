/* blobs_s3.c — blob bytes on S3 (see blobs_s3.h): a pool of S3 clients and a streaming writer
 * that turns appends into a single PUT or a multipart upload. */
#include "coordinator/blobs_s3.h"

#include "common/errors.h"
#include "common/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#define POOL_MAX 64
#define DOUBT_MAX 1024 /* past this many, the start-up sweep is left to remove them */

struct blob_s3 {
  s3_options opts; /* the strings below own what it points at */
  char url[600], endpoint[512], region[64], ca_file[512], creds_file[512], profile[128];
  pthread_mutex_t mu;
  s3_client *idle[POOL_MAX];
  int n_idle;
  /* Health: the last request's outcome (guarded by mu). A store that could not be reached, or
   * answered 5xx after the retries, is down until a request succeeds again. */
  int down;
  int64_t down_since_ms;
  char down_reason[512];
  /* Writes whose last request failed: the store may have made the object anyway (a gateway that
   * dies after storing it and before answering), so each is deleted once the store answers
   * again (blob_s3_probe). doubt_mu is held across those deletes, and a writer for a name
   * takes it first and strikes the name off, so a retried write under the same name is never
   * deleted after it succeeds. */
  pthread_mutex_t doubt_mu;
  char (*doubt)[128];
  int n_doubt;
  /* The store refused a part copy (UploadPartCopy: Google Cloud Storage's XML API has none):
   * copies stop at one CopyObject's limit from then on (blob_s3_copy_limit). */
  atomic_int no_part_copy;
};

/* Parts of one writer uploading at once: a gateway takes a part in steps (hash, store, answer),
 * so one part at a time leaves it idle between them. */
#define UP_MAX 4

/* A part uploading on a thread of its own, with a client of its own: buf holds its bytes, etag
 * its answer, rc and msg its outcome. */
typedef struct {
  struct blob_s3_writer *w;
  pthread_t th;
  int busy, thread, no, rc;
  s3_client *c;
  unsigned char *buf;
  size_t n;
  char etag[80], msg[512];
} up_slot;

struct blob_s3_writer {
  blob_s3 *s;
  s3_client *c;
  char name[128];
  int once;              /* the name is never rewritten (blob_s3_writer_open) */
  uint64_t total, sent;  /* bytes declared, bytes uploaded in finished parts */
  unsigned char *part;   /* the part being filled */
  size_t fill, cap;
  char upload_id[512];   /* "" until a second part is needed */
  char (*etags)[80];
  int nparts, etag_cap;
  /* Up to UP_MAX earlier parts upload while the next one fills, taken in turn (up_next: the
   * slot the next part goes to, the oldest in flight). */
  up_slot up[UP_MAX];
  int up_next;
  const atomic_int *hurry; /* blob_s3_writer_background: one part in flight until it is set */
};

/* Parts in flight at most now: only ever grows (so the slots in use stay in range). */
static int slots(const blob_s3_writer *w) {
  return w->hurry && !atomic_load(w->hurry) ? 1 : UP_MAX;
}

static int take(blob_s3 *s, s3_client **out);
static void give(blob_s3 *s, s3_client *c);
static void doubt(blob_s3 *s, const char *name, const char *why);

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Record an outcome: DPC_EUNAVAILABLE (unreachable, or failing after the retries) marks it down
 * with the message; any other answer, success included, shows it reachable. Returns rc. */
static int note(blob_s3 *s, int rc) {
  pthread_mutex_lock(&s->mu);
  if (rc == DPC_EUNAVAILABLE) {
    if (!s->down) s->down_since_ms = now_ms();
    s->down = 1;
    snprintf(s->down_reason, sizeof s->down_reason, "%s", dpc_errmsg());
  } else {
    s->down = 0;
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int blob_s3_health(blob_s3 *s, char *reason, size_t cap, int64_t *since_ms) {
  pthread_mutex_lock(&s->mu);
  int up = !s->down;
  if (!up && reason && cap) snprintf(reason, cap, "%s", s->down_reason);
  if (!up && since_ms) *since_ms = s->down_since_ms;
  pthread_mutex_unlock(&s->mu);
  return up;
}

int blob_s3_presign(blob_s3 *s, const char *name, const char *method, const char *content_md5, int expires_s, char *url,
                    size_t cap) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_presign(c, method, name, content_md5, expires_s, url, cap);
  give(s, c);
  return rc;
}

int blob_s3_presign_part(blob_s3 *s, const char *name, const char *upload_id, int part, const char *content_md5,
                         int expires_s, char *url, size_t cap) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_presign_part(c, name, upload_id, part, content_md5, expires_s, url, cap);
  give(s, c);
  return rc;
}

int blob_s3_upload_begin(blob_s3 *s, const char *name, char *upload_id, size_t cap) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_mpu_create(c, name, upload_id, cap);
  give(s, c);
  return note(s, rc);
}

int blob_s3_upload_complete(blob_s3 *s, const char *name, const char *upload_id, int nparts, char (*etags)[80]) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_mpu_complete(c, name, upload_id, nparts, etags);
  give(s, c);
  return note(s, rc);
}

int blob_s3_upload_abort(blob_s3 *s, const char *name, const char *upload_id) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_mpu_abort(c, name, upload_id);
  give(s, c);
  return note(s, rc);
}

/* Remember an object to delete once the store answers (see doubt_mu): a write whose outcome is
 * unknown, or a delete that failed (why says which). */
static void doubt(blob_s3 *s, const char *name, const char *why) {
  pthread_mutex_lock(&s->doubt_mu);
  if (!s->doubt) s->doubt = malloc(DOUBT_MAX * sizeof *s->doubt);
  if (s->doubt && s->n_doubt < DOUBT_MAX) {
    snprintf(s->doubt[s->n_doubt++], sizeof s->doubt[0], "%s", name);
    DPC_WARN("blob %s: %s; it is deleted once the store answers", name, why);
  } else {
    DPC_WARN("blob %s: %s; the next start-up sweep removes it", name, why);
  }
  pthread_mutex_unlock(&s->doubt_mu);
}

void blob_s3_delete_later(blob_s3 *s, const char *name) { doubt(s, name, "its delete failed"); }

int blob_s3_doubtful(blob_s3 *s) {
  pthread_mutex_lock(&s->doubt_mu);
  int n = s->n_doubt;
  pthread_mutex_unlock(&s->doubt_mu);
  return n;
}

/* Delete the doubtful writes; those the store refuses stay for the next probe. */
static void clear_doubts(blob_s3 *s) {
  pthread_mutex_lock(&s->doubt_mu);
  for (int i = 0; i < s->n_doubt; i++) {
    s3_client *c;
    int rc = take(s, &c);
    if (!rc) rc = s3_delete(c, s->doubt[i]);
    give(s, c);
    if (note(s, rc)) break;
    DPC_INFO("blob %s: deleted (its write had failed)", s->doubt[i]);
    memcpy(s->doubt[i--], s->doubt[--s->n_doubt], sizeof s->doubt[0]);
  }
  pthread_mutex_unlock(&s->doubt_mu);
}

int blob_s3_probe(blob_s3 *s) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_check_bucket(c);
  give(s, c);
  if (!note(s, rc)) clear_doubts(s);
  return rc;
}

static int take(blob_s3 *s, s3_client **out) {
  pthread_mutex_lock(&s->mu);
  s3_client *c = s->n_idle ? s->idle[--s->n_idle] : NULL;
  pthread_mutex_unlock(&s->mu);
  if (c) {
    *out = c;
    return 0;
  }
  return s3_open(out, &s->opts);
}

static void give(blob_s3 *s, s3_client *c) {
  if (!c) return;
  pthread_mutex_lock(&s->mu);
  if (s->n_idle < POOL_MAX) {
    s->idle[s->n_idle++] = c;
    c = NULL;
  }
  pthread_mutex_unlock(&s->mu);
  s3_close(c);
}

static const char *keep(char *dst, size_t cap, const char *src) {
  if (!src) return NULL;
  snprintf(dst, cap, "%s", src);
  return dst;
}

int blob_s3_open(const s3_options *o, blob_s3 **out) {
  *out = NULL;
  blob_s3 *s = calloc(1, sizeof *s);
  if (!s) return DPC_ENOMEM;
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->doubt_mu, NULL);
  s->opts = *o;
  s->opts.url = keep(s->url, sizeof s->url, o->url);
  s->opts.endpoint = keep(s->endpoint, sizeof s->endpoint, o->endpoint);
  s->opts.region = keep(s->region, sizeof s->region, o->region);
  s->opts.ca_file = keep(s->ca_file, sizeof s->ca_file, o->ca_file);
  s->opts.creds_file = keep(s->creds_file, sizeof s->creds_file, o->creds_file);
  s->opts.profile = keep(s->profile, sizeof s->profile, o->profile);
  s3_client *c = NULL;
  int rc = take(s, &c);
  if (!rc) rc = s3_check_bucket(c);
  give(s, c);
  if (rc) {
    blob_s3_close(s);
    return rc;
  }
  *out = s;
  return 0;
}

void blob_s3_close(blob_s3 *s) {
  if (!s) return;
  for (int i = 0; i < s->n_idle; i++) s3_close(s->idle[i]);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->doubt_mu);
  free(s->doubt);
  free(s);
}

const char *blob_s3_url(const blob_s3 *s) { return s->url; }

/* One CopyObject's limit. */
static uint64_t copy_max(const blob_s3 *s) { return s->opts.copy_max ? s->opts.copy_max : S3_MAX_PART_BYTES; }

uint64_t blob_s3_copy_limit(blob_s3 *s) {
  return atomic_load(&s->no_part_copy) ? copy_max(s) : S3_MAX_OBJECT_BYTES;
}
int blob_s3_max_parts(const blob_s3 *s) {
  return s->opts.max_parts > 0 && s->opts.max_parts < S3_MAX_PARTS ? s->opts.max_parts : S3_MAX_PARTS;
}

int blob_s3_writer_open(blob_s3 *s, const char *name, uint64_t total, int once, blob_s3_writer **out) {
  *out = NULL;
  blob_s3_writer *w = calloc(1, sizeof *w);
  if (!w) return DPC_ENOMEM;
  w->s = s;
  w->total = total;
  w->once = once;
  snprintf(w->name, sizeof w->name, "%s", name);
  pthread_mutex_lock(&s->doubt_mu);
  for (int i = 0; i < s->n_doubt; i++)
    if (strcmp(s->doubt[i], w->name) == 0) memcpy(s->doubt[i--], s->doubt[--s->n_doubt], sizeof s->doubt[0]);
  pthread_mutex_unlock(&s->doubt_mu);
  int rc = take(s, &w->c);
  /* Parts grow past BLOB_S3_PART_BYTES only for objects that would need more parts than the
   * store allows (above 156 GiB at S3's 10000). */
  uint64_t part = rc ? 0 : s3_part_bytes(total, BLOB_S3_PART_BYTES, s3_max_parts(w->c));
  if (!rc && part == 0)
    rc = dpc_err(DPC_EINVAL, "blob %s: %llu bytes do not fit in one S3 object (%d parts of at most 5 GiB): split the "
                 "model into more fragments", name, (unsigned long long)total, s3_max_parts(w->c));
  w->cap = total < part ? (size_t)total : (size_t)part;
  if (!rc && !(w->part = malloc(w->cap ? w->cap : 1))) rc = DPC_ENOMEM;
  if (rc) {
    give(s, w->c);
    free(w->part);
    free(w);
    return rc;
  }
  *out = w;
  return 0;
}

void blob_s3_writer_background(blob_s3_writer *w, const atomic_int *hurry) {
  if (w->nparts == 0) w->hurry = hurry;
}

/* Upload one filled part of the multipart upload. */
static void *upload_main(void *ud) {
  up_slot *u = ud;
  blob_s3_writer *w = u->w;
  u->rc = s3_mpu_put_part(u->c, w->name, w->upload_id, u->no, u->buf, u->n, u->etag, sizeof u->etag);
  if (u->rc) snprintf(u->msg, sizeof u->msg, "%s", dpc_errmsg());
  return NULL;
}

/* Wait for slot u's part, if any, without looking at its outcome; 1 when there was one. */
static int upload_join(up_slot *u) {
  if (!u->busy) return 0;
  if (u->thread) pthread_join(u->th, NULL);
  u->busy = u->thread = 0;
  return 1;
}

/* Wait for slot u's part, if any: its ETag goes in place, its failure is returned. */
static int upload_wait(blob_s3_writer *w, up_slot *u) {
  if (!upload_join(u)) return 0;
  if (u->rc) return note(w->s, dpc_err(u->rc, "%s", u->msg));
  memcpy(w->etags[u->no - 1], u->etag, sizeof u->etag);
  note(w->s, 0);
  return 0;
}

/* Wait for every part in flight, oldest first; the first failure is returned (with its
 * message: the parts after it are only joined). */
static int upload_wait_all(blob_s3_writer *w) {
  int first = 0;
  const int ns = slots(w);
  for (int k = 0; k < ns; k++) {
    up_slot *u = &w->up[(w->up_next + k) % ns];
    if (!first) first = upload_wait(w, u);
    else upload_join(u);
  }
  return first;
}

/* Send the filled part as the next part of the multipart upload (started on the first): it
 * uploads on a thread while the writer fills another buffer. */
static int flush_part(blob_s3_writer *w) {
  up_slot *u = &w->up[w->up_next];
  int rc = upload_wait(w, u);
  if (!rc && !w->upload_id[0]) rc = note(w->s, s3_mpu_create(w->c, w->name, w->upload_id, sizeof w->upload_id));
  if (!rc && w->nparts == w->etag_cap) {
    int cap = w->etag_cap ? 2 * w->etag_cap : 16;
    char(*e)[80] = realloc(w->etags, (size_t)cap * sizeof *e);
    if (!e) return DPC_ENOMEM;
    w->etags = e;
    w->etag_cap = cap;
  }
  if (!rc && !u->c) rc = take(w->s, &u->c);
  if (!rc && !u->buf && !(u->buf = malloc(w->cap))) rc = DPC_ENOMEM;
  if (rc) return rc;
  unsigned char *filled = w->part;
  w->part = u->buf;
  u->buf = filled;
  u->w = w;
  u->n = w->fill;
  u->no = ++w->nparts;
  u->thread = pthread_create(&u->th, NULL, upload_main, u) == 0;
  if (!u->thread) upload_main(u); /* no thread to be had: upload it here */
  u->busy = 1;
  w->up_next = (w->up_next + 1) % slots(w);
  w->sent += w->fill;
  w->fill = 0;
  return 0;
}

/* The writer's clients and buffers go (every part has been waited for). */
static void writer_free(blob_s3_writer *w) {
  give(w->s, w->c);
  for (int i = 0; i < UP_MAX; i++) {
    give(w->s, w->up[i].c);
    free(w->up[i].buf);
  }
  free(w->part);
  free(w->etags);
  free(w);
}

int blob_s3_writer_append(blob_s3_writer *w, const void *p, size_t n) {
  const unsigned char *b = p;
  if (n > w->total - w->sent - w->fill)
    return dpc_err(DPC_ERANGE, "blob %s: %zu more bytes would exceed the declared %llu", w->name, n,
                   (unsigned long long)w->total);
  while (n > 0) {
    size_t k = w->cap - w->fill < n ? w->cap - w->fill : n;
    memcpy(w->part + w->fill, b, k);
    w->fill += k;
    b += k;
    n -= k;
    /* A full part goes up unless it is the last one, which commit sends (a single PUT when
     * the whole object fits in one part). */
    if (w->fill == w->cap && w->sent + w->fill < w->total) {
      int rc = flush_part(w);
      if (rc) return rc;
    }
  }
  return 0;
}

void blob_s3_writer_abort(blob_s3_writer *w) {
  if (!w) return;
  (void)upload_wait_all(w);
  if (w->upload_id[0] && s3_mpu_abort(w->c, w->name, w->upload_id) < 0)
    DPC_WARN("blob %s: aborting its upload: %s (the start-up sweep removes it)", w->name, dpc_errmsg());
  writer_free(w);
}

int blob_s3_writer_commit(blob_s3_writer *w) {
  int rc = 0;
  if (w->sent + w->fill != w->total)
    rc = dpc_err(DPC_ESHAPE, "blob %s: got %llu of %llu bytes", w->name, (unsigned long long)(w->sent + w->fill),
                 (unsigned long long)w->total);
  else if (!w->upload_id[0])
    rc = s3_put(w->c, w->name, w->part, w->fill);
  else if (!(rc = flush_part(w)) && !(rc = upload_wait_all(w)))
    rc = s3_mpu_complete(w->c, w->name, w->upload_id, w->nparts, w->etags);
  if (w->sent + w->fill == w->total) {
    note(w->s, rc);
    /* Only names written once are deleted later: another name may be rewritten while a row
     * still names its earlier object. */
    if (rc && w->once) doubt(w->s, w->name, "its write failed and may have landed");
  }
  if (rc) {
    blob_s3_writer_abort(w);
    return rc;
  }
  writer_free(w);
  return 0;
}

int blob_s3_size(blob_s3 *s, const char *name, uint64_t *size) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_head(c, name, size, NULL, 0);
  give(s, c);
  return note(s, rc);
}

int blob_s3_head(blob_s3 *s, const char *name, uint64_t *size, char *etag, size_t cap) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_head(c, name, size, etag, cap);
  give(s, c);
  return note(s, rc);
}

int blob_s3_read(blob_s3 *s, const char *name, uint64_t off, void *dst, size_t n) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_get_range(c, name, off, dst, n);
  give(s, c);
  return note(s, rc);
}

/* ---- read-ahead ---- */

struct blob_s3_ahead {
  blob_s3 *s;
  pthread_t th;
  char name[128];
  uint64_t off;
  size_t n;
  void *buf;
  int rc;
  char msg[512]; /* dpc_errmsg() is per thread: the reader's failure is carried over */
};

static void *ahead_main(void *ud) {
  blob_s3_ahead *a = ud;
  a->rc = blob_s3_read(a->s, a->name, a->off, a->buf, a->n);
  if (a->rc) snprintf(a->msg, sizeof a->msg, "%s", dpc_errmsg());
  return NULL;
}

int blob_s3_ahead_start(blob_s3 *s, const char *name, uint64_t off, size_t n, blob_s3_ahead **out) {
  *out = NULL;
  blob_s3_ahead *a = calloc(1, sizeof *a);
  if (!a || !(a->buf = malloc(n ? n : 1))) {
    free(a);
    return DPC_ENOMEM;
  }
  a->s = s;
  snprintf(a->name, sizeof a->name, "%s", name);
  a->off = off;
  a->n = n;
  if (pthread_create(&a->th, NULL, ahead_main, a) != 0) {
    free(a->buf);
    free(a);
    return dpc_err(DPC_ENOMEM, "blob %s: cannot start a read-ahead thread", name);
  }
  *out = a;
  return 0;
}

int blob_s3_ahead_take(blob_s3_ahead *a, uint64_t off, size_t n, void *dst) {
  pthread_join(a->th, NULL);
  int rc = 0;
  if (a->off == off && a->n == n) {
    rc = a->rc ? dpc_err(a->rc, "%s", a->msg) : 1;
    if (rc == 1) memcpy(dst, a->buf, n);
  }
  free(a->buf);
  free(a);
  return rc;
}

void blob_s3_ahead_free(blob_s3_ahead *a) {
  if (!a) return;
  pthread_join(a->th, NULL);
  free(a->buf);
  free(a);
}

int blob_s3_delete(blob_s3 *s, const char *name) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_delete(c, name);
  give(s, c);
  return note(s, rc);
}

/* Beyond one CopyObject: an upload on `to` whose part i the store copies from `from`'s
 * bytes [i·pb, (i + 1)·pb), each part's ETag (its MD5) checked against want[i]; an aborted
 * upload on any failure (one the abort misses is left to the start-up sweep of uploads). */
static int copy_parts(blob_s3 *s, s3_client *c, const char *from, const char *to, const char *etag, uint64_t size,
                      uint64_t pb, int parts, const char (*want)[80]) {
  if (!parts || !pb || (uint64_t)parts != (size + pb - 1) / pb)
    return dpc_err(DPC_EINVAL, "copying %s (%llu bytes): beyond one copy's limit, and not put in parts that tile it",
                   from, (unsigned long long)size);
  char(*got)[80] = calloc((size_t)parts, sizeof *got), id[512] = "";
  if (!got) return dpc_err(DPC_ENOMEM, "copying %s: out of memory", from);
  int rc = s3_mpu_create(c, to, id, sizeof id);
  for (int i = 0; !rc && i < parts; i++) {
    const uint64_t off = (uint64_t)i * pb, len = size - off < pb ? size - off : pb;
    rc = s3_mpu_copy_part(c, from, to, id, i + 1, off, len, etag, got[i], sizeof got[i]);
    if (i == 0 && (rc == DPC_EIO || rc == DPC_EPERM || rc == DPC_EUNSUPPORTED) && !atomic_exchange(&s->no_part_copy, 1))
      DPC_WARN("S3 %s refused a part copy (%s): objects above %llu MiB are no longer copied (workers push such inner "
               "state through the coordinator)", s->url, dpc_errmsg(), (unsigned long long)(copy_max(s) >> 20));
    if (!rc && want && strcasecmp(got[i], want[i]) != 0) /* rewritten since its commit's check */
      rc = dpc_err(DPC_ECHECKSUM, "copying %s: part %d came out with MD5 %s, not the %s it was put with (the object "
                   "was overwritten)", from, i + 1, got[i], want[i]);
  }
  if (!rc) rc = s3_mpu_complete(c, to, id, parts, got);
  if (rc && id[0]) {
    char err[512];
    snprintf(err, sizeof err, "%s", dpc_errmsg());
    if (s3_mpu_abort(c, to, id) < 0) DPC_WARN("copy to %s: aborting its upload: %s (the start-up sweep removes it)", to,
                                              dpc_errmsg());
    dpc_err(rc, "%s", err);
  }
  free(got);
  return rc;
}

int blob_s3_copy(blob_s3 *s, const char *from, const char *to, const char *etag, uint64_t size, uint64_t part_bytes,
                 int parts, const char (*part_etags)[80]) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc)
    rc = size <= copy_max(s) ? s3_copy(c, from, to, etag)
                             : copy_parts(s, c, from, to, etag, size, part_bytes, parts, part_etags);
  give(s, c);
  return note(s, rc);
}

int blob_s3_list(blob_s3 *s, const char *under, s3_list_fn fn, void *ud) {
  s3_client *c;
  int rc = take(s, &c);
  if (!rc) rc = s3_list(c, under, fn, ud);
  give(s, c);
  return note(s, rc);
}

typedef struct {
  s3_client *c;
  int n, rc;
} abort_ctx;

static int abort_one(void *ud, const char *key, const char *id) {
  abort_ctx *a = ud;
  int rc = s3_mpu_abort(a->c, key, id);
  if (rc == 0) a->n++;
  else if (!a->rc) a->rc = rc;
  return 0;
}

int blob_s3_abort_uploads(blob_s3 *s, int *n) {
  abort_ctx a = {0};
  int rc = take(s, &a.c);
  if (!rc) rc = s3_mpu_list(a.c, abort_one, &a);
  give(s, a.c);
  if (n) *n = a.n;
  return rc ? rc : a.rc;
}
