/* admin_upload.c — dipaco.v1.Admin UploadInitialModel: a model's safetensors streamed in
 * before the CreateJob that names it, kept as STATE/uploads/<id>.safetensors or, on an S3
 * store, as the object uploads/<id>.safetensors under its prefix (so that a coordinator whose
 * disk holds only SQLite takes a 28 GB model); ids count up from the largest upload kept, so
 * they survive a restart. The job copies the weights into its blobs and the upload goes. The
 * loop thread checks each chunk's header; its bytes are copied out, written and checksummed on
 * the thread pool (one chunk at a time, reading paused), and so is the final fsync or the
 * object's completion. */
#include "coordinator/admin_upload.h"

#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "coordinator/blobs.h"
#include "coordinator/blobs_s3.h"
#include "coordinator/loop.h"
#include "coordinator/rounds.h"
#include "coordinator/svc.h"
#include "proto/dipaco.pb-c.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* An upload's hard bound (a 256B-parameter model in F32 is 1 TiB); what bounds one in practice is
 * the free space of STATE/uploads, checked as it starts so that a model that cannot fit is
 * refused at once, not after hours of sending. */
#define MAX_UPLOAD_BYTES ((uint64_t)1 << 40)

/* ---- UploadInitialModel --------------------------------------------------------------------- */

/* The last step, the file's fsync and rename (seconds for a multi-GB model), runs on the
 * threadpool. Ownership: the call's data until on_done, except while that commit is in
 * flight, when on_done only marks it orphaned and upload_commit_after frees it. */
typedef struct {
  uv_work_t req;
  coord *c;
  struct rpc_call *call;
  dpc_afile *f;      /* the file, or */
  blob_s3 *s3;       /* on an S3 store: the object's writer w, opened with the first bytes */
  blob_s3_writer *w;
  uint64_t id, next, total;
  uint32_t crc;
  int started, finished;
  int committing, orphaned, commit_rc;
  char err[512];
  unsigned char *buf;
  size_t cap;
  /* a chunk being written on the thread pool (upload_chunk_work) */
  struct grpc_byte_buffer *msg_ref;
  struct rpc_chunk cur;
  int chunk_rc;
} upload;

void admin_upload_path(const coord *c, uint64_t id, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/uploads/%llu.safetensors", c->state_dir, (unsigned long long)id);
}

/* An upload's object name on an S3 store (not a blob name: the start-up sweep leaves it). */
static void upload_key(uint64_t id, char *buf, size_t cap) {
  snprintf(buf, cap, "uploads/%llu.safetensors", (unsigned long long)id);
}

/* "s3://BUCKET/PREFIX/uploads/<id>.safetensors", for messages. */
static void upload_url(blob_s3 *s3, uint64_t id, char *buf, size_t cap) {
  const char *u = blob_s3_url(s3);
  const size_t n = strlen(u);
  snprintf(buf, cap, "%s%suploads/%llu.safetensors", u, n && u[n - 1] == '/' ? "" : "/", (unsigned long long)id);
}

void admin_upload_drop(coord *c, uint64_t id) {
  char path[1200];
  if (blob_store_s3(c->bs)) { /* a request: on the thread pool */
    upload_key(id, path, sizeof path);
    rounds_discard(c, path, NULL);
    return;
  }
  admin_upload_path(c, id, path, sizeof path);
  if (unlink(path) != 0 && errno != ENOENT) DPC_WARN("cannot remove upload %s: %s", path, strerror(errno));
}

/* An S3 writer's abort waits for its parts in flight and asks the store to drop them: on the
 * thread pool, not the loop thread. */
typedef struct {
  uv_work_t req;
  coord *c;
  blob_s3_writer *w;
} sink_abort;

static void sink_abort_run(uv_work_t *req) { blob_s3_writer_abort(((sink_abort *)req->data)->w); }

static void sink_abort_after(uv_work_t *req, int status) {
  (void)status;
  sink_abort *a = req->data;
  coord *c = a->c;
  free(a);
  loop_work_done(c);
}

/* Drop what was stored of an unfinished upload. */
static void upload_drop_sink(upload *u) {
  if (u->f) dpc_afile_abort(u->f);
  u->f = NULL;
  if (!u->w) return;
  sink_abort *a = calloc(1, sizeof *a);
  if (a) {
    *a = (sink_abort){.req.data = a, .c = u->c, .w = u->w};
    if (loop_queue_work(u->c, &a->req, sink_abort_run, sink_abort_after) == 0) {
      u->w = NULL;
      return;
    }
    free(a);
  }
  blob_s3_writer_abort(u->w); /* no memory or no thread pool: here */
  u->w = NULL;
}

static void upload_fail(struct rpc_call *call, upload *u, int code, const char *msg) {
  upload_drop_sink(u);
  if (!u->finished) {
    u->finished = 1;
    rpc_call_finish(call, code, "%s", msg);
  }
}

static void upload_on_call(struct rpc_call *call, const struct grpc_byte_buffer *req, void *ud) {
  (void)req;
  coord *c = ud;
  if (c->stopping) {
    rpc_call_finish(call, RPC_UNAVAILABLE, "coordinator is shutting down; retry with backoff");
    return;
  }
  if (svc_admin_authorize(c, call)) return;
  upload *u = calloc(1, sizeof *u);
  if (!u) {
    rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  u->c = c;
  u->s3 = blob_store_s3(c->bs);
  rpc_call_set_data(call, u);
}

static void upload_free(upload *u) {
  if (u->msg_ref) rpc_msg_free(u->msg_ref);
  upload_drop_sink(u);
  free(u->buf);
  free(u);
}

static void upload_commit_run(uv_work_t *req) {
  upload *u = req->data;
  u->commit_rc = u->w ? blob_s3_writer_commit(u->w) : u->f ? dpc_afile_commit(u->f) : dpc_err(DPC_EINVAL, "nothing sent");
  u->f = NULL;
  u->w = NULL;
  if (u->commit_rc < 0) snprintf(u->err, sizeof u->err, "storing the upload failed: %s", dpc_errmsg());
}

static void upload_commit_after(uv_work_t *req, int status) {
  upload *u = req->data;
  coord *c = u->c;
  u->committing = 0;
  if (status != 0 && u->commit_rc == 0) {
    u->commit_rc = DPC_ECANCELED;
    snprintf(u->err, sizeof u->err, "storing the upload was canceled (coordinator shutting down); retry");
  }
  if (u->orphaned) { /* the client went away meanwhile: nobody can claim this upload */
    if (u->commit_rc == 0) admin_upload_drop(c, u->id);
    upload_free(u);
  } else if (u->commit_rc < 0) {
    upload_fail(u->call, u, u->commit_rc == DPC_EUNAVAILABLE ? RPC_UNAVAILABLE : RPC_INTERNAL, u->err);
  } else {
    DPC_INFO("upload %llu stored: %llu bytes%s", (unsigned long long)u->id, (unsigned long long)u->total,
             u->s3 ? " (in the blob store)" : "");
    Dipaco__V1__UploadInitialModelResponse resp = DIPACO__V1__UPLOAD_INITIAL_MODEL_RESPONSE__INIT;
    resp.upload_id = u->id;
    resp.bytes = u->total;
    resp.crc32c = u->crc;
    u->finished = 1;
    rpc_call_reply(u->call, &resp.base);
  }
  loop_work_done(c);
}

/* The first chunk: check the header, pick the id and open the file. 0, or -1 with the call
 * failed. */
static int upload_begin(coord *c, struct rpc_call *call, upload *u, const struct rpc_chunk *ch) {
  char err[1800];
  if (ch->payload != DIPACO__V1__PAYLOAD__PAYLOAD_SAFETENSORS || ch->offset != 0) {
    upload_fail(call, u, RPC_INVALID_ARGUMENT, "payload/offset: an upload is PAYLOAD_SAFETENSORS chunks from offset 0");
    return -1;
  }
  if (ch->total > MAX_UPLOAD_BYTES || ch->total < 8) {
    upload_fail(call, u, ch->total < 8 ? RPC_INVALID_ARGUMENT : RPC_RESOURCE_EXHAUSTED,
                "total: an upload must be 8 bytes .. 1 TiB");
    return -1;
  }
  if (u->s3) { /* the object's writer opens on the thread pool with the first bytes */
    u->id = c->next_upload_id++;
    u->total = ch->total;
    u->started = 1;
    char where[1200];
    upload_url(u->s3, u->id, where, sizeof where);
    DPC_INFO("upload %llu started: %llu bytes, to %s", (unsigned long long)u->id, (unsigned long long)u->total, where);
    return 0;
  }
  char dir[1100], path[1200];
  snprintf(dir, sizeof dir, "%s/uploads", c->state_dir);
  struct statvfs sv;
  int made = dpc_mkdir_p(dir) == 0;
  if (made && statvfs(dir, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < ch->total) {
    snprintf(err, sizeof err, "total: an upload of %llu bytes does not fit in %s (%llu bytes free)",
             (unsigned long long)ch->total, dir, (unsigned long long)sv.f_bavail * sv.f_frsize);
    upload_fail(call, u, RPC_RESOURCE_EXHAUSTED, err);
    return -1;
  }
  u->id = c->next_upload_id++;
  admin_upload_path(c, u->id, path, sizeof path);
  if (!made || dpc_afile_open(path, &u->f) < 0) {
    snprintf(err, sizeof err, "cannot store the upload: %s", dpc_errmsg());
    upload_fail(call, u, RPC_INTERNAL, err);
    return -1;
  }
  u->total = ch->total;
  u->started = 1;
  DPC_INFO("upload %llu started: %llu bytes", (unsigned long long)u->id, (unsigned long long)u->total);
  return 0;
}

/* The client closed its side: commit the file in the thread pool (the answer comes then). */
static void upload_end(coord *c, struct rpc_call *call, upload *u) {
  if (!u->started || u->next != u->total) {
    upload_fail(call, u, RPC_INVALID_ARGUMENT, "upload ended before its last chunk");
    return;
  }
  u->call = call;
  u->req.data = u;
  u->committing = 1;
  if (loop_queue_work(c, &u->req, upload_commit_run, upload_commit_after) < 0) {
    char err[600];
    u->committing = 0;
    snprintf(err, sizeof err, "storing the upload failed: %s", dpc_errmsg());
    upload_fail(call, u, RPC_INTERNAL, err);
  }
}

/* Thread pool: one chunk's bytes copied out of its message, written and checksummed. */
static void upload_chunk_work(uv_work_t *req) {
  upload *u = req->data;
  const struct rpc_chunk *ch = &u->cur;
  u->chunk_rc = 0;
  if (ch->len > u->cap) {
    unsigned char *b = realloc(u->buf, ch->len);
    if (!b) {
      u->chunk_rc = DPC_ENOMEM;
      snprintf(u->err, sizeof u->err, "out of memory");
      return;
    }
    u->buf = b;
    u->cap = ch->len;
  }
  char key[64];
  upload_key(u->id, key, sizeof key);
  int rc = u->s3 && !u->w ? blob_s3_writer_open(u->s3, key, u->total, 1, &u->w) : 0;
  if (!rc) rc = rpc_chunk_copy(u->msg_ref, ch, u->buf);
  if (!rc) rc = u->w ? blob_s3_writer_append(u->w, u->buf, ch->len) : dpc_afile_write(u->f, u->buf, ch->len);
  if (rc < 0) {
    u->chunk_rc = rc == DPC_EUNAVAILABLE || rc == DPC_ENOMEM ? rc : DPC_EIO;
    snprintf(u->err, sizeof u->err, "cannot store the upload: %s", dpc_errmsg());
    return;
  }
  rpc_msg_free(u->msg_ref);
  u->msg_ref = NULL;
  u->crc = dpc_crc32c(u->crc, u->buf, ch->len);
}

/* A chunk is stored: count it and check the CRC after the last one. 1 if the upload failed. */
static int upload_chunk_done(coord *c, struct rpc_call *call, upload *u, const struct rpc_chunk *ch) {
  u->next += ch->len;
  c->bytes_in += ch->len;
  if (u->next == u->total && ch->crc32c != u->crc) {
    char err[600];
    snprintf(err, sizeof err, "crc32c: upload has CRC-32C 0x%08x, the last chunk says 0x%08x; upload again", u->crc,
             ch->crc32c);
    upload_fail(call, u, RPC_DATA_LOSS, err);
    return 1;
  }
  return 0;
}

static void upload_chunk_after(uv_work_t *req, int status) {
  upload *u = req->data;
  coord *c = u->c;
  u->committing = 0;
  if (u->msg_ref) {
    rpc_msg_free(u->msg_ref);
    u->msg_ref = NULL;
  }
  if (u->orphaned) {
    upload_free(u);
  } else if (status != 0 || u->chunk_rc < 0) {
    upload_fail(u->call, u,
                u->chunk_rc == DPC_ENOMEM ? RPC_RESOURCE_EXHAUSTED
                : u->chunk_rc == DPC_EUNAVAILABLE ? RPC_UNAVAILABLE : RPC_INTERNAL,
                status ? "the upload was canceled (coordinator shutting down); retry" : u->err);
  } else if (!upload_chunk_done(c, u->call, u, &u->cur) && !u->finished) {
    rpc_call_read(u->call);
  }
  loop_work_done(c);
}

static int upload_on_message(struct rpc_call *call, const struct grpc_byte_buffer *msg, void *ud) {
  coord *c = ud;
  upload *u = rpc_call_data(call);
  if (!u || u->finished || u->committing) return 0;
  char err[600];
  if (!msg) {
    upload_end(c, call, u);
    return 0;
  }
  struct rpc_chunk ch;
  if (rpc_chunk_parse(msg, &ch) < 0) {
    snprintf(err, sizeof err, "malformed chunk: %s", dpc_errmsg());
    upload_fail(call, u, RPC_INVALID_ARGUMENT, err);
    return 0;
  }
  if (!u->started) {
    if (upload_begin(c, call, u, &ch) < 0) return 0;
  } else if (ch.offset != u->next || ch.total != u->total) {
    upload_fail(call, u, RPC_INVALID_ARGUMENT, "offset/total: chunks must be contiguous with one total");
    return 0;
  }
  if (ch.len == 0) { /* nothing to write */
    upload_chunk_done(c, call, u, &ch);
    return 0;
  }
  if (!(u->msg_ref = rpc_msg_ref(msg))) {
    upload_fail(call, u, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return 0;
  }
  u->cur = ch;
  u->call = call;
  u->req.data = u;
  u->committing = 1; /* (a chunk in the thread pool: on_done leaves the upload to upload_chunk_after) */
  if (loop_queue_work(c, &u->req, upload_chunk_work, upload_chunk_after) < 0) {
    u->committing = 0;
    rpc_msg_free(u->msg_ref);
    u->msg_ref = NULL;
    upload_fail(call, u, RPC_INTERNAL, "cannot queue the upload chunk");
    return 0;
  }
  return 1;
}

static void upload_on_done(struct rpc_call *call, int cancelled, void *ud) {
  (void)cancelled;
  (void)ud;
  upload *u = rpc_call_data(call);
  if (!u) return;
  rpc_call_set_data(call, NULL);
  if (u->committing) u->orphaned = 1; /* upload_commit_after frees it */
  else upload_free(u);
}

/* st_open_source over an upload's object. A model has hundreds of tensors, most of them small
 * (norms, biases), and a request costs the store milliseconds however few bytes it moves, so
 * reads under WINDOW bytes are served from a window of the object fetched in one GET (tensors
 * are read in the file's order, so the next small ones are in it); larger ones go straight to
 * their destination in GETs of at most 64 MiB, so no request of a multi-GB tensor runs into the
 * client's per-request deadline. */
#define WINDOW ((size_t)4 << 20)
typedef struct {
  blob_s3 *s3;
  char key[64];
  uint64_t size;
  unsigned char *win; /* [WINDOW], bytes [win_off, win_off + win_len) of the object */
  uint64_t win_off;
  size_t win_len;
} s3_source;

static int s3_source_read(void *ctx, uint64_t off, void *dst, size_t n) {
  s3_source *src = ctx;
  if (off > src->size || n > src->size - off) return 1;
  if (n < WINDOW && src->win) {
    if (off < src->win_off || off + n > src->win_off + src->win_len) {
      size_t len = src->size - off < WINDOW ? (size_t)(src->size - off) : WINDOW;
      int rc = blob_s3_read(src->s3, src->key, off, src->win, len);
      src->win_len = 0;
      if (rc < 0) return rc;
      src->win_off = off;
      src->win_len = len;
    }
    memcpy(dst, src->win + (off - src->win_off), n);
    return 0;
  }
  const size_t step = (size_t)64 << 20;
  for (size_t done = 0; done < n; done += step) {
    int rc = blob_s3_read(src->s3, src->key, off + done, (char *)dst + done, n - done < step ? n - done : step);
    if (rc < 0) return rc;
  }
  return 0;
}

/* The upload's safetensors, from its file or its object (*f: st_close). */
static int open_upload(const coord *c, uint64_t id, s3_source *src, st_file **f) {
  char path[1200];
  if (!(src->s3 = blob_store_s3(c->bs))) {
    admin_upload_path(c, id, path, sizeof path);
    return st_open(path, f);
  }
  upload_key(id, src->key, sizeof src->key);
  int rc = blob_s3_size(src->s3, src->key, &src->size);
  upload_url(src->s3, id, path, sizeof path);
  if (rc < 0) return rc;
  if (!(src->win = malloc(WINDOW))) return dpc_err(DPC_ENOMEM, "out of memory");
  return st_open_source(path, src->size, s3_source_read, src, f);
}

int admin_load_upload(const coord *c, uint64_t id, const gpt_layout *lay, float *theta) {
  st_file *f;
  s3_source src = {0};
  int rc = open_upload(c, id, &src, &f);
  if (rc < 0) free(src.win);
  if (rc < 0) return rc == DPC_ENOENT ? dpc_err(DPC_ENOENT, "initial_upload_id %llu: no such upload", (unsigned long long)id) : rc;
  for (int i = 0; i < lay->n_tensors && rc == 0; i++) {
    const gpt_tensor *t = &lay->tensors[i];
    char alt[GPT_NAME_MAX + 16];
    snprintf(alt, sizeof alt, "transformer.%s", t->name);
    int k = st_find(f, t->name);
    if (k < 0) k = st_find(f, alt);
    if (k < 0) {
      rc = dpc_err(DPC_EINVAL, "initial_upload_id %llu: tensor %s is missing", (unsigned long long)id, t->name);
      break;
    }
    const st_tensor *st = st_get(f, k);
    int ok = st->ndim == t->ndim;
    for (int d = 0; ok && d < t->ndim; d++) ok = st->shape[d] == t->shape[d];
    if (!ok) {
      rc = dpc_err(DPC_ESHAPE, "initial_upload_id %llu: tensor %s has another shape than the spec's model implies",
                   (unsigned long long)id, t->name);
      break;
    }
    rc = st_read_f32(f, k, 0, t->numel, theta + t->offset);
  }
  st_close(f);
  free(src.win);
  if (rc < 0) return rc;
  for (size_t i = 0; i < lay->n_params; i++)
    if (!isfinite(theta[i])) return dpc_err(DPC_EINVAL, "initial_upload_id %llu: non-finite parameter at %zu", (unsigned long long)id, i);
  return 0;
}
/* Uploads are consumed by the CreateJob that names them. At start-up the ids continue after
 * the highest upload left, unfinished uploads (temp files of a crash mid-upload; on S3 the
 * store sweep's unfinished multipart uploads) are removed, and so are uploads no job claimed
 * within UPLOAD_MAX_AGE_S (a client that gave up). */
#define UPLOAD_MAX_AGE_S (24 * 3600)

/* An upload's id from its file or object name ("<id>.safetensors"), or 0 for anything else. */
static uint64_t upload_id_of(const char *name) {
  unsigned long long v = 0;
  int n = 0;
  return name[0] >= '0' && name[0] <= '9' && sscanf(name, "%llu.safetensors%n", &v, &n) == 1 && name[n] == 0 ? v : 0;
}

static void uploads_init_dir(coord *c, time_t now) {
  char dir[1100], path[1400];
  snprintf(dir, sizeof dir, "%s/uploads", c->state_dir);
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  int removed = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    uint64_t v = upload_id_of(e->d_name);
    if (v >= c->next_upload_id) c->next_upload_id = v + 1;
    if (!v || now - st.st_mtime > UPLOAD_MAX_AGE_S) {
      if (unlink(path) == 0) removed++;
      else DPC_WARN("uploads: cannot remove %s: %s", path, strerror(errno));
    }
  }
  closedir(d);
  if (removed) {
    dpc_fsync_dir(dir);
    DPC_INFO("recovery: removed %d unfinished or unclaimed upload(s) from %s", removed, dir);
  }
}

/* The S3 listing's walk: ids, and the names of objects to delete. */
typedef struct {
  coord *c;
  time_t now;
  char (*drop)[96];
  int n, cap;
} s3_uploads;

static int s3_upload_seen(void *ud, const char *key, uint64_t size, int64_t mtime_s) {
  (void)size;
  s3_uploads *w = ud;
  uint64_t v = upload_id_of(key + strlen("uploads/"));
  if (v >= w->c->next_upload_id) w->c->next_upload_id = v + 1;
  if (v && w->now - mtime_s <= UPLOAD_MAX_AGE_S) return 0;
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 16;
    char(*d)[96] = realloc(w->drop, (size_t)cap * sizeof *d);
    if (!d) return dpc_err(DPC_ENOMEM, "out of memory");
    w->drop = d;
    w->cap = cap;
  }
  snprintf(w->drop[w->n++], sizeof w->drop[0], "%s", key);
  return 0;
}

int admin_uploads_init(coord *c) {
  const time_t now = time(NULL);
  c->next_upload_id = 1;
  uploads_init_dir(c, now);
  blob_s3 *s3 = blob_store_s3(c->bs);
  if (!s3) return 0;
  s3_uploads w = {.c = c, .now = now};
  int rc = blob_s3_list(s3, "uploads/", s3_upload_seen, &w);
  for (int i = 0; i < w.n && rc == 0; i++) rc = blob_s3_delete(s3, w.drop[i]);
  if (rc == 0 && w.n) DPC_INFO("recovery: removed %d unclaimed upload(s) from %s's uploads/", w.n, blob_s3_url(s3));
  free(w.drop);
  if (rc == 0) return 0;
  char why[512];
  snprintf(why, sizeof why, "%s", dpc_errmsg());
  return dpc_err(rc, "uploads in %s: %s", blob_s3_url(s3), why);
}

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Admin/UploadInitialModel", .kind = RPC_CLIENT_STREAM, .on_call = upload_on_call,
     .on_message = upload_on_message, .on_done = upload_on_done},
};

int admin_upload_methods(coord *c, struct rpc_method *out) {
  return svc_methods_add(out, methods, (int)(sizeof methods / sizeof methods[0]), c);
}
