/* admin_upload.c — dipaco.v1.Admin UploadInitialModel: a model's safetensors streamed in
 * before the CreateJob that names it, kept as STATE/uploads/<id>.safetensors (ids count up
 * from the largest file there, so they survive a restart); the job copies the weights into its
 * blobs and the upload goes. The loop thread checks each chunk's header; its bytes are copied
 * out, written and checksummed on the thread pool (one chunk at a time, reading paused), and
 * so is the final fsync. */
#include "coordinator/admin_upload.h"

#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "coordinator/loop.h"
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
  dpc_afile *f;
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

static void upload_fail(struct rpc_call *call, upload *u, int code, const char *msg) {
  if (u->f) dpc_afile_abort(u->f);
  u->f = NULL;
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
  rpc_call_set_data(call, u);
}

static void upload_free(upload *u) {
  if (u->msg_ref) rpc_msg_free(u->msg_ref);
  if (u->f) dpc_afile_abort(u->f);
  free(u->buf);
  free(u);
}

static void upload_commit_run(uv_work_t *req) {
  upload *u = req->data;
  u->commit_rc = dpc_afile_commit(u->f);
  u->f = NULL;
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
    if (u->commit_rc == 0) {
      char path[1200];
      admin_upload_path(c, u->id, path, sizeof path);
      unlink(path);
    }
    upload_free(u);
  } else if (u->commit_rc < 0) {
    upload_fail(u->call, u, RPC_INTERNAL, u->err);
  } else {
    DPC_INFO("upload %llu stored: %llu bytes", (unsigned long long)u->id, (unsigned long long)u->total);
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
  if (rpc_chunk_copy(u->msg_ref, ch, u->buf) < 0 || dpc_afile_write(u->f, u->buf, ch->len) < 0) {
    u->chunk_rc = DPC_EIO;
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
    upload_fail(u->call, u, u->chunk_rc == DPC_ENOMEM ? RPC_RESOURCE_EXHAUSTED : RPC_INTERNAL,
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

int admin_load_upload(const coord *c, uint64_t id, const gpt_layout *lay, float *theta) {
  char path[1200];
  admin_upload_path(c, id, path, sizeof path);
  st_file *f;
  int rc = st_open(path, &f);
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
  if (rc < 0) return rc;
  for (size_t i = 0; i < lay->n_params; i++)
    if (!isfinite(theta[i])) return dpc_err(DPC_EINVAL, "initial_upload_id %llu: non-finite parameter at %zu", (unsigned long long)id, i);
  return 0;
}
/* Uploads are consumed by the CreateJob that names them. At start-up the ids continue after
 * the highest file left, unfinished uploads (temp files of a crash mid-upload) are removed,
 * and so are uploads no job claimed within UPLOAD_MAX_AGE_S (a client that gave up). */
#define UPLOAD_MAX_AGE_S (24 * 3600)
void admin_uploads_init(coord *c) {
  char dir[1100], path[1400];
  snprintf(dir, sizeof dir, "%s/uploads", c->state_dir);
  c->next_upload_id = 1;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  const time_t now = time(NULL);
  int removed = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
    unsigned long long v;
    int n = 0;
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
    int is_upload = sscanf(e->d_name, "%llu.safetensors%n", &v, &n) == 1 && e->d_name[n] == 0;
    if (is_upload && v >= c->next_upload_id) c->next_upload_id = v + 1;
    if (!is_upload || now - st.st_mtime > UPLOAD_MAX_AGE_S) {
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

static const struct rpc_method methods[] = {
    {.path = "/dipaco.v1.Admin/UploadInitialModel", .kind = RPC_CLIENT_STREAM, .on_call = upload_on_call,
     .on_message = upload_on_message, .on_done = upload_on_done},
};

int admin_upload_methods(coord *c, struct rpc_method *out) {
  return svc_methods_add(out, methods, (int)(sizeof methods / sizeof methods[0]), c);
}
