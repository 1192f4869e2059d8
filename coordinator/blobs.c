/* blobs.c — checksummed float arrays (format in blobs.h) as files under STATE/blobs/ or as
 * objects on an S3-compatible store (blobs_s3.c moves those bytes; every check is here). */
#include "coordinator/blobs.h"
#include "coordinator/blobs_cache.h"
#include "coordinator/blobs_known.h"
#include "coordinator/blobs_s3.h"
#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "blob files are little-endian; add byte swapping for this target"
#endif

struct blob_store {
  char *dir;           /* STATE/blobs, or the s3:// URL */
  blob_s3 *s3;         /* NULL: files under dir */
  blobs_cache *cache;  /* NULL: none (files have the page cache) */
  blobs_known *known;  /* S3: the inner-state names in the store (NULL: ask it) */
};

struct blob_writer {
  blob_store *bs;
  dpc_afile *f;       /* a file, or */
  blob_s3_writer *sw; /* an object */
  char name[BLOB_NAME_MAX];
  uint64_t want, got; /* payload bytes */
  uint32_t crc;       /* of the payload so far */
  unsigned char header[BLOB_HEADER_BYTES];
  blobs_cache_entry *ce; /* the payload's copy for the cache, published at commit */
  blob_kind kind;
  int later; /* BLOB_WRITE_LATER on S3: nothing sent before the commit (sw opened there) */
  const atomic_int *hurry; /* later: the commit sends in the background until it is set */
};

static const char *const KIND_EXT[] = {NULL, "params", "momentum", "delta", "dnbuf", "innerm", "innerv", "innerl", "innere",
                                       "sparse", "encoded"};
#define N_KINDS ((int)(sizeof KIND_EXT / sizeof KIND_EXT[0]))

/* A slot's inner state: found by name, never recorded in a row. */
static int inner_kind(blob_kind k) {
  return k == BLOB_INNER_M || k == BLOB_INNER_V || k == BLOB_INNER_L || k == BLOB_INNER_E;
}

static int kind_ok(blob_kind k) { return (int)k >= 1 && (int)k < N_KINDS; }

int blob_store_open(const char *state_dir, blob_store **out) {
  *out = NULL;
  if (!state_dir || !state_dir[0]) return dpc_err(DPC_EINVAL, "blob store: empty state directory");
  blob_store *bs = calloc(1, sizeof *bs);
  size_t n = strlen(state_dir) + 8;
  if (bs) bs->dir = malloc(n);
  if (!bs || !bs->dir) {
    free(bs);
    return dpc_err(DPC_ENOMEM, "blob store: out of memory");
  }
  snprintf(bs->dir, n, "%s/blobs", state_dir);
  int rc = dpc_mkdir_p(bs->dir);
  if (rc == 0) rc = dpc_fsync_dir(state_dir);
  if (rc) {
    rc = dpc_err(rc, "blob store %s: %s", bs->dir, dpc_errmsg());
    blob_store_close(bs);
    return rc;
  }
  *out = bs;
  return 0;
}

int blob_store_open_s3(const s3_options *o, blob_store **out) {
  *out = NULL;
  blob_store *bs = calloc(1, sizeof *bs);
  if (!bs) return dpc_err(DPC_ENOMEM, "blob store: out of memory");
  int rc = blob_s3_open(o, &bs->s3);
  if (!rc && !(bs->dir = strdup(blob_s3_url(bs->s3)))) rc = dpc_err(DPC_ENOMEM, "blob store: out of memory");
  if (!rc) bs->known = blobs_known_new(); /* none: lease grants ask the store */
  if (rc) {
    blob_store_close(bs);
    return rc;
  }
  *out = bs;
  return 0;
}

int blob_store_is_s3(const blob_store *bs) { return bs->s3 != NULL; }
blob_s3 *blob_store_s3(blob_store *bs) { return bs->s3; }

void blob_store_close(blob_store *bs) {
  if (!bs) return;
  blobs_cache_free(bs->cache);
  blobs_known_free(bs->known);
  blob_s3_close(bs->s3);
  free(bs->dir);
  free(bs);
}

const char *blob_store_dir(const blob_store *bs) { return bs->dir; }

int blob_store_set_cache(blob_store *bs, uint64_t cap) {
  if (!bs->s3) return dpc_err(DPC_EUNSUPPORTED, "blob store %s: the memory cache is for an S3 store", bs->dir);
  blobs_cache_free(bs->cache);
  bs->cache = NULL;
  if (cap && !(bs->cache = blobs_cache_new(cap))) return dpc_err(DPC_ENOMEM, "blob store: out of memory for its cache");
  return 0;
}

void blob_store_cache_stats(blob_store *bs, blobs_cache_stats *out) { blobs_cache_stats_get(bs->cache, out); }

int blob_store_prewarm(blob_store *bs, size_t floats, int count) { return blobs_cache_prewarm(bs->cache, floats, count); }

void blob_store_uncache(blob_store *bs, const char *name) {
  if (name && name[0]) blobs_cache_remove(bs->cache, name);
}

/* The kinds an outer step reads (and a commit checks) round after round; inner state and
 * round streams are read rarely, by other paths. */
static int cached_kind(blob_kind k) {
  return k == BLOB_PARAMS || k == BLOB_MOMENTUM || k == BLOB_DELTA || k == BLOB_DN_BUF || k == BLOB_ENCODED;
}

int blob_name(const blob_id *id, char *buf, size_t cap) {
  if (id->job < 0 || id->fragment < 0 || id->version < 0 || id->aux < 0 || id->attempt < 0)
    return dpc_err(DPC_EINVAL, "blob id: negative field (job %" PRId64 ", fragment %d, version %" PRId64 ", aux %" PRId64 ")",
                   id->job, (int)id->fragment, id->version, id->aux);
  if (!kind_ok(id->kind)) return dpc_err(DPC_EINVAL, "blob id: unknown kind %d", (int)id->kind);
  int n;
  if (id->aux && id->attempt)
    n = snprintf(buf, cap, "%" PRId64 "/f%d-v%" PRId64 "-a%" PRId64 "-t%" PRId64 ".%s", id->job, (int)id->fragment,
                 id->version, id->aux, id->attempt, KIND_EXT[id->kind]);
  else if (id->aux)
    n = snprintf(buf, cap, "%" PRId64 "/f%d-v%" PRId64 "-a%" PRId64 ".%s", id->job, (int)id->fragment, id->version,
                 id->aux, KIND_EXT[id->kind]);
  else
    n = snprintf(buf, cap, "%" PRId64 "/f%d-v%" PRId64 ".%s", id->job, (int)id->fragment, id->version, KIND_EXT[id->kind]);
  if (n < 0 || (size_t)n >= cap) return dpc_err(DPC_ERANGE, "blob name longer than %zu bytes", cap);
  return 0;
}

/* 1 when name carries an attempt stamp ("-t<digits>." before its extension, as blob_name makes
 * for a push's delta): such a name is written once and never rewritten, so the object of a failed
 * write under it may be deleted as soon as the store answers (blobs_s3.h). */
static int written_once(const char *name) {
  const char *dot = strrchr(name, '.'), *t = dot;
  while (t && t > name && t[-1] >= '0' && t[-1] <= '9') t--;
  return dot && t != dot && t - name >= 2 && t[-1] == 't' && t[-2] == '-';
}

int blob_kind_of_name(const char *name, blob_kind *out) {
  const char *dot = strrchr(name, '.');
  if (dot)
    for (int k = 1; k < N_KINDS; k++)
      if (strcmp(dot + 1, KIND_EXT[k]) == 0) {
        *out = (blob_kind)k;
        return 0;
      }
  return dpc_err(DPC_EINVAL, "blob name \"%s\" has no known kind extension", name);
}

/* Names come from the database: one level of subdirectory at most, no "..", plain chars. */
static int check_name(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (n == 0 || n >= BLOB_NAME_MAX) return dpc_err(DPC_EINVAL, "blob name empty or longer than %d bytes", BLOB_NAME_MAX - 1);
  if (name[0] == '/' || name[0] == '.' || strstr(name, "..") || strstr(name, "/.") || strstr(name, "//"))
    return dpc_err(DPC_EINVAL, "blob name \"%s\" is not a plain relative name", name);
  int slashes = 0;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (c == '/') slashes++;
    else if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_'))
      return dpc_err(DPC_EINVAL, "blob name \"%s\" has a character outside [A-Za-z0-9._-/]", name);
  }
  if (slashes > 1 || name[n - 1] == '/') return dpc_err(DPC_EINVAL, "blob name \"%s\" nests too deep", name);
  return 0;
}

int blob_path(const blob_store *bs, const char *name, char *buf, size_t cap) {
  int rc = check_name(name);
  if (rc) return rc;
  int n = bs->s3 ? snprintf(buf, cap, "%s%s%s", bs->dir, bs->dir[strlen(bs->dir) - 1] == '/' ? "" : "/", name)
                  : snprintf(buf, cap, "%s/%s", bs->dir, name);
  if (n < 0 || (size_t)n >= cap) return dpc_err(DPC_ERANGE, "blob path longer than %zu bytes", cap);
  return 0;
}

/* Make the name's subdirectory (durably) if it does not exist yet. */
static int ensure_subdir(blob_store *bs, const char *name) {
  const char *slash = strchr(name, '/');
  if (!slash || bs->s3) return 0;
  char dir[4096];
  int n = snprintf(dir, sizeof dir, "%s/%.*s", bs->dir, (int)(slash - name), name);
  if (n < 0 || (size_t)n >= sizeof dir) return dpc_err(DPC_ERANGE, "blob directory path too long");
  struct stat st;
  if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
  int rc = dpc_mkdir_p(dir);
  if (rc == 0) rc = dpc_fsync_dir(bs->dir);
  return rc;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static void make_header(unsigned char h[BLOB_HEADER_BYTES], blob_kind kind, uint64_t n) {
  put_u32(h, BLOB_MAGIC);
  put_u32(h + 4, BLOB_VERSION);
  put_u32(h + 8, (uint32_t)kind);
  put_u32(h + 12, 0);
  put_u64(h + 16, n);
}

static int sink_write(blob_writer *w, const void *p, size_t n) {
  return w->sw ? blob_s3_writer_append(w->sw, p, n) : dpc_afile_write(w->f, p, n);
}

static void sink_abort(blob_writer *w) {
  if (w->sw) blob_s3_writer_abort(w->sw);
  else dpc_afile_abort(w->f);
  w->sw = NULL;
  w->f = NULL;
}

/* A BLOB_WRITE_LATER writer's commit: open the object now and send the header and the
 * payload from the cache's copy. */
static int send_later(blob_writer *w) {
  int rc = blob_s3_writer_open(w->bs->s3, w->name, BLOB_HEADER_BYTES + w->want + BLOB_TRAILER_BYTES,
                               written_once(w->name), &w->sw);
  if (rc == 0) blob_s3_writer_background(w->sw, w->hurry);
  if (rc == 0) rc = sink_write(w, w->header, sizeof w->header);
  if (rc == 0) rc = sink_write(w, w->ce->data, (size_t)w->want);
  return rc;
}

int blob_writer_open_ex(blob_store *bs, const char *name, blob_kind kind, size_t n, int flags, blob_writer **out) {
  *out = NULL;
  int rc = check_name(name);
  if (rc) return rc;
  if (!kind_ok(kind)) return dpc_err(DPC_EINVAL, "blob %s: unknown kind %d", name, (int)kind);
  if ((uint64_t)n > BLOB_MAX_FLOATS) return dpc_err(DPC_ERANGE, "blob %s: %zu floats exceeds the limit", name, n);
  if ((rc = ensure_subdir(bs, name))) return rc;
  blob_writer *w = calloc(1, sizeof *w);
  if (!w) return dpc_err(DPC_ENOMEM, "blob %s: out of memory", name);
  w->bs = bs;
  w->kind = kind;
  snprintf(w->name, sizeof w->name, "%s", name);
  w->want = (uint64_t)n * 4;
  make_header(w->header, kind, n);
  if (bs->cache && cached_kind(kind)) w->ce = blobs_cache_reserve(bs->cache, name, (int)kind, n);
  /* Sent at the commit, from the cache's copy: nothing to open now. */
  w->later = bs->s3 && w->ce && (flags & BLOB_WRITE_LATER);
  char path[4096];
  rc = w->later ? 0 : blob_path(bs, name, path, sizeof path);
  if (rc == 0 && !w->later)
    rc = bs->s3 ? blob_s3_writer_open(bs->s3, name, BLOB_HEADER_BYTES + w->want + BLOB_TRAILER_BYTES,
                                      written_once(name), &w->sw)
                : dpc_afile_open(path, &w->f);
  if (rc == 0 && !w->later && (rc = sink_write(w, w->header, sizeof w->header))) sink_abort(w);
  if (rc) {
    blobs_cache_drop(bs->cache, w->ce);
    free(w);
    return rc;
  }
  *out = w;
  return 0;
}

int blob_writer_open(blob_store *bs, const char *name, blob_kind kind, size_t n, blob_writer **out) {
  return blob_writer_open_ex(bs, name, kind, n, 0, out);
}

int blob_writer_append(blob_writer *w, const void *bytes, size_t nbytes) {
  if (nbytes > w->want - w->got)
    return dpc_err(DPC_ERANGE, "blob %s: %zu more bytes would exceed the declared %" PRIu64, w->name, nbytes, w->want);
  int rc = w->later ? 0 : sink_write(w, bytes, nbytes);
  if (rc) return rc;
  if (w->ce) memcpy((unsigned char *)w->ce->data + w->got, bytes, nbytes);
  w->crc = dpc_crc32c(w->crc, bytes, nbytes);
  w->got += nbytes;
  return 0;
}

uint32_t blob_writer_crc(const blob_writer *w) { return w->crc; }

void blob_writer_hurry_flag(blob_writer *w, const atomic_int *hurry) { w->hurry = hurry; }

void blob_writer_writeback(blob_writer *w) {
  if (w->f) dpc_afile_writeback(w->f);
}

void blob_writer_abort(blob_writer *w) {
  if (!w) return;
  sink_abort(w);
  blobs_cache_drop(w->bs->cache, w->ce);
  free(w);
}

int blob_writer_commit(blob_writer *w, uint32_t *crc_out) {
  if (w->got != w->want) {
    int rc = dpc_err(DPC_ESHAPE, "blob %s: got %" PRIu64 " of %" PRIu64 " payload bytes", w->name, w->got, w->want);
    blob_writer_abort(w);
    return rc;
  }
  unsigned char t[BLOB_TRAILER_BYTES];
  put_u32(t, w->crc);
  put_u32(t + 4, dpc_crc32c(0, w->header, BLOB_HEADER_BYTES));
  int rc = w->later ? send_later(w) : 0;
  if (rc == 0) rc = sink_write(w, t, sizeof t);
  if (rc) {
    blob_writer_abort(w);
    return rc;
  }
  rc = w->sw ? blob_s3_writer_commit(w->sw) : dpc_afile_commit(w->f);
  if (rc == 0 && crc_out) *crc_out = w->crc;
  /* Durable in the store: from now on the object holds these bytes. */
  if (w->ce && rc == 0) blobs_cache_publish(w->bs->cache, w->ce, w->crc);
  else blobs_cache_drop(w->bs->cache, w->ce);
  if (rc == 0 && w->bs->known && inner_kind(w->kind)) blobs_known_add(w->bs->known, w->name);
  free(w);
  return rc;
}

int blob_write(blob_store *bs, const char *name, blob_kind kind, const float *data, size_t n, uint32_t *crc_out) {
  blob_writer *w;
  int rc = blob_writer_open(bs, name, kind, n, &w);
  if (rc) return rc;
  if (n && (rc = blob_writer_append(w, data, n * sizeof *data))) {
    blob_writer_abort(w);
    return rc;
  }
  return blob_writer_commit(w, crc_out);
}

/* Where a blob's bytes are read from: an open file, or an object of the S3 store. */
typedef struct {
  int fd;      /* -1 for an object */
  blob_s3 *s3; /* the store, for an object */
  char name[BLOB_NAME_MAX];
} blob_src;

/* Open blob `name` for reading; *size gets its length in bytes. */
static int src_open(blob_store *bs, const char *name, const char *path, blob_src *src, uint64_t *size) {
  src->fd = -1;
  src->s3 = bs->s3;
  snprintf(src->name, sizeof src->name, "%s", name);
  if (bs->s3) return blob_s3_size(bs->s3, name, size);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return dpc_err(dpc_errno_code(errno), "blob %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return dpc_err(DPC_EIO, "blob %s: fstat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return dpc_err(DPC_EFORMAT, "blob %s is not a regular file", path);
  }
  src->fd = fd;
  *size = (uint64_t)st.st_size;
  return 0;
}

static void src_close(blob_src *src) {
  if (src->fd >= 0) close(src->fd);
  src->fd = -1;
}

/* Bytes [off, off + n) of the blob into buf: all of them, or an error. */
static int src_pread(const blob_src *src, void *buf, size_t n, uint64_t off, const char *path) {
  if (src->fd < 0) return n ? blob_s3_read(src->s3, src->name, off, buf, n) : 0;
  unsigned char *p = buf;
  for (size_t done = 0; done < n;) {
    size_t chunk = n - done > (1u << 30) ? (1u << 30) : n - done;
    ssize_t k = pread(src->fd, p + done, chunk, (off_t)(off + done));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return dpc_err(dpc_errno_code(errno), "blob %s: read: %s", path, strerror(errno));
    if (k == 0) return dpc_err(DPC_EFORMAT, "blob %s: ends early (truncated while read?)", path);
    done += (size_t)k;
  }
  return 0;
}

/* Check a blob's header h (and its size in bytes) against kind and, unless want_n is
 * SIZE_MAX, its float count; *n_out gets the count. */
static int check_header(const char *path, const unsigned char *h, uint64_t size, blob_kind kind, size_t want_n,
                        uint64_t *n_out) {
  uint32_t magic = get_u32(h), version = get_u32(h + 4), k = get_u32(h + 8);
  uint64_t n = get_u64(h + 16);
  if (magic != BLOB_MAGIC)
    return dpc_err(DPC_EFORMAT, "blob %s: bad magic 0x%08x (expected 0x%08x): not a dipaco blob", path, magic,
                   BLOB_MAGIC);
  if (version != BLOB_VERSION)
    return dpc_err(DPC_EFORMAT, "blob %s: format version %u, this build reads %u", path, version, BLOB_VERSION);
  if (n > BLOB_MAX_FLOATS || size != BLOB_HEADER_BYTES + 4 * n + BLOB_TRAILER_BYTES)
    return dpc_err(DPC_EFORMAT, "blob %s: file is %llu bytes but the header says %" PRIu64
                   " floats (truncated or corrupt)", path, (unsigned long long)size, n);
  if (k != (uint32_t)kind) return dpc_err(DPC_EFORMAT, "blob %s: holds kind %u, expected %d", path, k, (int)kind);
  if (want_n != SIZE_MAX && n != (uint64_t)want_n)
    return dpc_err(DPC_ESHAPE, "blob %s: holds %" PRIu64 " floats, expected %zu", path, n, want_n);
  *n_out = n;
  return 0;
}

/* Open and validate the header; *n_out gets the float count. alloc: allocate *dstp. */
static int blob_read_impl(blob_store *bs, const char *name, blob_kind kind, float **dstp, size_t want_n, int alloc,
                          size_t *n_out, uint32_t *crc_out) {
  char path[4096];
  int rc = blob_path(bs, name, path, sizeof path);
  if (rc) return rc;
  blob_src src;
  uint64_t size = 0, n = 0;
  if ((rc = src_open(bs, name, path, &src, &size))) return rc;
  unsigned char h[BLOB_HEADER_BYTES], t[BLOB_TRAILER_BYTES];
  float *buf = NULL;
  if (size < BLOB_HEADER_BYTES + BLOB_TRAILER_BYTES) {
    rc = dpc_err(DPC_EFORMAT, "blob %s: %llu bytes, too short for a blob (truncated?)", path, (unsigned long long)size);
    goto out;
  }
  if ((rc = src_pread(&src, h, sizeof h, 0, path)) ||
      (rc = check_header(path, h, size, kind, alloc ? SIZE_MAX : want_n, &n)))
    goto out;
  if (alloc) {
    buf = malloc(n ? n * sizeof(float) : 1);
    if (!buf) {
      rc = dpc_err(DPC_ENOMEM, "blob %s: cannot allocate %" PRIu64 " floats", path, n);
      goto out;
    }
  } else {
    buf = *dstp;
  }
  if ((rc = src_pread(&src, buf, n * sizeof(float), BLOB_HEADER_BYTES, path)) ||
      (rc = src_pread(&src, t, sizeof t, BLOB_HEADER_BYTES + n * sizeof(float), path)))
    goto out;
  uint32_t hcrc = dpc_crc32c(0, h, sizeof h), pcrc = dpc_crc32c(0, buf, n * sizeof(float));
  if (hcrc != get_u32(t + 4)) {
    rc = dpc_err(DPC_ECHECKSUM, "blob %s: header checksum 0x%08x, stored 0x%08x (corrupt)", path, hcrc, get_u32(t + 4));
    goto out;
  }
  if (pcrc != get_u32(t)) {
    rc = dpc_err(DPC_ECHECKSUM, "blob %s: payload checksum 0x%08x, stored 0x%08x (corrupt)", path, pcrc, get_u32(t));
    goto out;
  }
  if (crc_out) *crc_out = pcrc;
  if (n_out) *n_out = (size_t)n;
  if (alloc) {
    *dstp = buf;
    buf = NULL;
  }
out:
  if (alloc) free(buf);
  src_close(&src);
  return rc;
}

int blob_read(blob_store *bs, const char *name, blob_kind kind, float *dst, size_t n, uint32_t *crc_out) {
  return blob_read_impl(bs, name, kind, &dst, n, 0, NULL, crc_out);
}

int blob_read_alloc(blob_store *bs, const char *name, blob_kind kind, float **out, size_t *n, uint32_t *crc_out) {
  *out = NULL;
  *n = 0;
  return blob_read_impl(bs, name, kind, out, 0, 1, n, crc_out);
}

int blob_delete_many(blob_store *bs, char *const *names, int n) {
  int first = 0;
  if (bs->s3) {
    for (int i = 0; i < n; i++) {
      int rc = check_name(names[i]);
      if (!rc) blobs_cache_remove(bs->cache, names[i]);
      if (!rc && bs->known) blobs_known_del(bs->known, names[i]);
      if (!rc) rc = blob_s3_delete(bs->s3, names[i]);
      if (rc && !first) first = rc;
    }
    return first;
  }
  char dir[4096] = "", path[4096];
  for (int i = 0; i < n; i++) {
    int rc = blob_path(bs, names[i], path, sizeof path);
    if (!rc && unlink(path) != 0 && errno != ENOENT)
      rc = dpc_err(dpc_errno_code(errno), "delete blob %s: %s", path, strerror(errno));
    if (rc) {
      if (!first) first = rc;
      continue;
    }
    char *slash = strrchr(path, '/');
    *slash = '\0';
    /* Names come sorted by job and fragment, so one directory follows another. */
    if (strcmp(dir, path) != 0) {
      if (dir[0] && (rc = dpc_fsync_dir(dir)) && !first) first = rc;
      snprintf(dir, sizeof dir, "%s", path);
    }
  }
  int rc = dir[0] ? dpc_fsync_dir(dir) : 0;
  return first ? first : rc;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* 1 if some name of keep[0..n) (sorted) starts with prefix. */
static int keep_has_prefix(char *const *keep, int n, const char *prefix) {
  size_t pl = strlen(prefix);
  int lo = 0, hi = n;
  while (lo < hi) { /* first name >= prefix */
    int mid = lo + (hi - lo) / 2;
    if (strcmp(keep[mid], prefix) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && strncmp(keep[lo], prefix, pl) == 0;
}

typedef struct {
  char *const *keep; /* sorted, or NULL: temp files only */
  int n_keep;
  int temps, orphans;
} sweep_ctx;

/* Sweep one directory: `rel` is its name relative to STATE/blobs ("" for the top). */
static int sweep_dir(sweep_ctx *sx, const char *dir, const char *rel) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : dpc_err(dpc_errno_code(errno), "blob store: open %s: %s", dir, strerror(errno));
  /* Orphans are looked for only in a job directory the database still references, so a
   * missing or foreign database can never make the sweep delete a job's blobs. */
  char prefix[BLOB_NAME_MAX + 2];
  snprintf(prefix, sizeof prefix, "%s/", rel);
  int orphans_ok = rel[0] && sx->keep && keep_has_prefix(sx->keep, sx->n_keep, prefix);
  int rc = 0, here = 0;
  struct dirent *e;
  char path[4096], name[BLOB_NAME_MAX + 300];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    struct stat stt;
    if (lstat(path, &stt) != 0) continue;
    int drop = 0;
    if (S_ISDIR(stt.st_mode)) {
      if (!rel[0] && strlen(e->d_name) < BLOB_NAME_MAX && (rc = sweep_dir(sx, path, e->d_name)) < 0) break;
    } else if (S_ISREG(stt.st_mode) && strstr(e->d_name, ".tmp.")) {
      drop = 1;
      sx->temps++;
    } else if (S_ISREG(stt.st_mode) && orphans_ok) {
      blob_kind k = BLOB_PARAMS; /* set by blob_kind_of_name; initialised for -Wmaybe-uninitialized */
      const char *key = name;
      snprintf(name, sizeof name, "%s/%s", rel, e->d_name);
      /* Inner AdamW state blobs are found by name, not through the database: never orphans. */
      if (blob_kind_of_name(e->d_name, &k) == 0 && k != BLOB_INNER_M && k != BLOB_INNER_V && k != BLOB_INNER_L &&
          k != BLOB_INNER_E &&
          !bsearch(&key, sx->keep, (size_t)sx->n_keep, sizeof *sx->keep, cmp_name)) {
        drop = 1;
        sx->orphans++;
      }
    }
    if (drop) {
      if (unlink(path) != 0 && errno != ENOENT) {
        rc = dpc_err(dpc_errno_code(errno), "blob store: remove %s: %s", path, strerror(errno));
        break;
      }
      here++;
    }
  }
  closedir(d);
  if (here) {
    int frc = dpc_fsync_dir(dir);
    if (!rc) rc = frc;
  }
  return rc;
}

/* Whether object `name` ("JOB/FILE") is an orphan: its job directory is referenced, it is not a
 * slot's inner state (found by name, never recorded; a worker's put of it, stamped with an
 * attempt, is left over once committed or abandoned), and no row names it. */
static int s3_orphan(const sweep_ctx *sx, const char *name) {
  const char *slash = strchr(name, '/');
  char prefix[BLOB_NAME_MAX + 2];
  blob_kind k = BLOB_PARAMS;
  if (!slash || check_name(name) < 0 || blob_kind_of_name(name, &k) < 0 || (size_t)(slash - name) >= BLOB_NAME_MAX)
    return 0;
  snprintf(prefix, sizeof prefix, "%.*s/", (int)(slash - name), name);
  return sx->keep && keep_has_prefix(sx->keep, sx->n_keep, prefix) && (!inner_kind(k) || written_once(name)) &&
         !bsearch(&name, sx->keep, (size_t)sx->n_keep, sizeof *sx->keep, cmp_name);
}

typedef struct {
  const sweep_ctx *sx;
  blobs_known *known;
  char **drop;
  int n, cap;
} s3_sweep;

static int s3_sweep_one(void *ud, const char *key, uint64_t size, int64_t mtime_s) {
  (void)size;
  (void)mtime_s;
  s3_sweep *w = ud;
  blob_kind k = BLOB_PARAMS;
  if (w->known && check_name(key) == 0 && blob_kind_of_name(key, &k) == 0 && inner_kind(k))
    blobs_known_add(w->known, key);
  if (!s3_orphan(w->sx, key)) return 0;
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 64;
    char **d = realloc(w->drop, (size_t)cap * sizeof *d);
    if (!d) return DPC_ENOMEM;
    w->drop = d;
    w->cap = cap;
  }
  return (w->drop[w->n] = strdup(key)) ? (w->n++, 0) : DPC_ENOMEM;
}

/* The store's sweep: unfinished multipart uploads (a crash mid-write) count as temporary files;
 * orphans as in sweep_dir. */
static int sweep_s3(blob_store *bs, sweep_ctx *sx) {
  int rc = blob_s3_abort_uploads(bs->s3, &sx->temps);
  s3_sweep w = {.sx = sx, .known = bs->known};
  if (bs->known) blobs_known_reset(bs->known);
  if (!rc) rc = blob_s3_list(bs->s3, "", s3_sweep_one, &w);
  if (!rc && bs->known) blobs_known_set_complete(bs->known); /* every inner-state name is in it */
  if (!rc) rc = blob_delete_many(bs, w.drop, w.n);
  if (!rc) sx->orphans = w.n;
  for (int i = 0; i < w.n; i++) free(w.drop[i]);
  free(w.drop);
  return rc;
}

int blob_store_sweep(blob_store *bs, char **keep, int n_keep, int *temps, int *orphans) {
  if (keep) qsort(keep, (size_t)n_keep, sizeof *keep, cmp_name);
  sweep_ctx sx = {.keep = keep, .n_keep = keep ? n_keep : 0};
  int rc = bs->s3 ? sweep_s3(bs, &sx) : sweep_dir(&sx, bs->dir, "");
  if (temps) *temps = sx.temps;
  if (orphans) *orphans = sx.orphans;
  return rc;
}

int blob_store_health(blob_store *bs, char *reason, size_t cap, int64_t *since_ms) {
  return bs->s3 ? blob_s3_health(bs->s3, reason, cap, since_ms) : 1;
}

int blob_store_probe(blob_store *bs) { return bs->s3 ? blob_s3_probe(bs->s3) : 0; }

int blob_store_doubtful(blob_store *bs) { return bs->s3 ? blob_s3_doubtful(bs->s3) : 0; }

void blob_store_known_add(blob_store *bs, const char *name) {
  blob_kind k = (blob_kind)0;
  if (bs->known && blob_kind_of_name(name, &k) == 0 && inner_kind(k)) blobs_known_add(bs->known, name);
}

int blob_store_s3_of(blob_store *bs, const char *name, const char *what, blob_s3 **out) {
  int rc = check_name(name);
  if (rc) return rc;
  if (!bs->s3) return dpc_err(DPC_EUNSUPPORTED, "blob %s: %s needs an S3 store (files are the coordinator's)", name, what);
  *out = bs->s3;
  return 0;
}

int blob_exists(blob_store *bs, const char *name) {
  char path[4096];
  uint64_t size;
  if (blob_path(bs, name, path, sizeof path) < 0) return 0;
  if (!bs->s3) return access(path, R_OK) == 0;
  blob_kind k = BLOB_PARAMS;
  int known = bs->known && blob_kind_of_name(name, &k) == 0 && inner_kind(k) ? blobs_known_has(bs->known, name) : -1;
  return known >= 0 ? known : blob_s3_size(bs->s3, name, &size) == 0;
}

int blob_delete(blob_store *bs, const char *name) {
  char path[4096];
  int rc = blob_path(bs, name, path, sizeof path);
  if (rc) return rc;
  blobs_cache_remove(bs->cache, name);
  if (bs->known) blobs_known_del(bs->known, name);
  if (bs->s3) return blob_s3_delete(bs->s3, name);
  if (unlink(path) != 0) {
    if (errno == ENOENT) return 0;
    return dpc_err(dpc_errno_code(errno), "delete blob %s: %s", path, strerror(errno));
  }
  char *slash = strrchr(path, '/');
  *slash = '\0';
  return dpc_fsync_dir(path);
}

/* ---- sequential reader and read-only mappings ------------------------------------------------ */

/* A reader reads the blob with pread into a buffer as large as the largest view asked for, and
 * hands out views of that buffer: the bytes are checksummed right after they are copied and
 * the caller computes from them while they are still in the CPU cache. It does not map the
 * file: touching a mapping's pages costs a page fault per few pages, which in a guest VM makes
 * reading a spool through a mapping 2-3x slower than pread. The process keeps no more of the
 * file than one view. */
struct blob_reader {
  blob_src src;
  blobs_cache *cache;
  blobs_cache_entry *hit;  /* the payload, verified, from the cache: no request to the store */
  blobs_cache_entry *fill; /* a copy for the cache (blob_reader_keep), published once close verified it */
  blob_kind kind;
  blob_s3_ahead *ahead; /* an object's next range, in flight (blobs_s3.h) */
  unsigned char *buf;
  size_t cap;
  char path[4096];
  uint64_t want, got; /* payload bytes; got is the next byte handed out */
  uint32_t crc, trailer_crc;
};

/* Open blob `name` for reading into *src and check its header against kind and n floats;
 * *size gets the blob's bytes, *trailer_crc the stored payload crc. */
static int open_checked(blob_store *bs, const char *name, blob_kind kind, size_t want_n, char *path, size_t cap,
                        blob_src *src, uint64_t *size, uint32_t *trailer_crc) {
  int rc = blob_path(bs, name, path, cap);
  if (rc || (rc = src_open(bs, name, path, src, size))) return rc;
  unsigned char h[BLOB_HEADER_BYTES], t[BLOB_TRAILER_BYTES];
  uint64_t n = 0;
  if (*size < BLOB_HEADER_BYTES + BLOB_TRAILER_BYTES)
    rc = dpc_err(DPC_EFORMAT, "blob %s: %llu bytes, too short for a blob (truncated?)", path, (unsigned long long)*size);
  if (!rc) rc = src_pread(src, h, sizeof h, 0, path);
  if (!rc) rc = src_pread(src, t, sizeof t, *size - BLOB_TRAILER_BYTES, path);
  if (!rc) rc = check_header(path, h, *size, kind, want_n, &n);
  if (!rc && dpc_crc32c(0, h, sizeof h) != get_u32(t + 4))
    rc = dpc_err(DPC_ECHECKSUM, "blob %s: header checksum 0x%08x, stored 0x%08x (corrupt)", path,
                 dpc_crc32c(0, h, sizeof h), get_u32(t + 4));
  if (rc) {
    src_close(src);
    return rc;
  }
  *trailer_crc = get_u32(t);
  return 0;
}

int blob_reader_open(blob_store *bs, const char *name, blob_kind kind, size_t n, blob_reader **out) {
  *out = NULL;
  blob_reader *r = calloc(1, sizeof *r);
  if (!r) return dpc_err(DPC_ENOMEM, "blob %s: out of memory", name);
  uint64_t size;
  r->want = (uint64_t)n * 4;
  r->cache = cached_kind(kind) ? bs->cache : NULL;
  r->kind = kind;
  r->src.fd = -1;
  int rc = blob_path(bs, name, r->path, sizeof r->path);
  if (!rc && (r->hit = blobs_cache_get(r->cache, name, (int)kind, n))) {
    r->trailer_crc = r->hit->crc;
    *out = r;
    return 0;
  }
  if (!rc) rc = open_checked(bs, name, kind, n, r->path, sizeof r->path, &r->src, &size, &r->trailer_crc);
  if (rc) {
    free(r);
    return rc;
  }
  if (r->src.fd >= 0) (void)posix_fadvise(r->src.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  *out = r;
  return 0;
}

void blob_reader_keep(blob_reader *r) {
  if (r->cache && !r->hit && !r->fill && r->got == 0)
    r->fill = blobs_cache_reserve(r->cache, r->src.name, (int)r->kind, (size_t)(r->want / 4));
}

/* Read the next nbytes of the payload into dst and checksum them. */
static int reader_fill(blob_reader *r, void *dst, size_t nbytes) {
  if (nbytes > r->want - r->got)
    return dpc_err(DPC_ERANGE, "blob %s: %zu more bytes would read past the payload", r->path, nbytes);
  if (r->hit) { /* verified when it was cached */
    memcpy(dst, (const unsigned char *)r->hit->data + r->got, nbytes);
    r->got += nbytes;
    return 0;
  }
  int rc = 0;
  if (r->ahead) {
    rc = blob_s3_ahead_take(r->ahead, BLOB_HEADER_BYTES + r->got, nbytes, dst);
    r->ahead = NULL;
  }
  if (rc == 0) rc = src_pread(&r->src, dst, nbytes, BLOB_HEADER_BYTES + r->got, r->path);
  else if (rc == 1) rc = 0;
  if (rc) return rc;
  r->crc = dpc_crc32c(r->crc, dst, nbytes);
  if (r->fill) memcpy((unsigned char *)r->fill->data + r->got, dst, nbytes);
  r->got += nbytes;
  /* An object: fetch the next range of the same size now (readers ask range after range). */
  if (r->src.fd < 0 && r->got < r->want) {
    size_t next = r->want - r->got < nbytes ? (size_t)(r->want - r->got) : nbytes;
    if (blob_s3_ahead_start(r->src.s3, r->src.name, BLOB_HEADER_BYTES + r->got, next, &r->ahead) < 0) r->ahead = NULL;
  }
  return 0;
}

int blob_reader_view(blob_reader *r, size_t nbytes, const void **view) {
  if (r->hit) { /* the cached payload itself: no copy */
    if (nbytes > r->want - r->got)
      return dpc_err(DPC_ERANGE, "blob %s: %zu more bytes would read past the payload", r->path, nbytes);
    *view = (const unsigned char *)r->hit->data + r->got;
    r->got += nbytes;
    return 0;
  }
  if (nbytes > r->cap) {
    unsigned char *b = realloc(r->buf, nbytes);
    if (!b) return dpc_err(DPC_ENOMEM, "blob %s: out of memory for a %zu-byte view", r->path, nbytes);
    r->buf = b;
    r->cap = nbytes;
  }
  int rc = reader_fill(r, r->buf, nbytes);
  if (rc == 0) *view = r->buf;
  return rc;
}

int blob_reader_read(blob_reader *r, void *dst, size_t nbytes) { return reader_fill(r, dst, nbytes); }

void blob_reader_abort(blob_reader *r) {
  if (!r) return;
  blobs_cache_unref(r->cache, r->hit);
  blobs_cache_drop(r->cache, r->fill);
  blob_s3_ahead_free(r->ahead);
  src_close(&r->src);
  free(r->buf);
  free(r);
}

int blob_reader_close(blob_reader *r, uint32_t *crc_out) {
  int rc = 0;
  if (r->hit) r->crc = r->hit->crc;
  if (r->got != r->want)
    rc = dpc_err(DPC_ESHAPE, "blob %s: %" PRIu64 " of %" PRIu64 " payload bytes read", r->path, r->got, r->want);
  else if (r->crc != r->trailer_crc)
    rc = dpc_err(DPC_ECHECKSUM, "blob %s: payload checksum 0x%08x, stored 0x%08x (corrupt)", r->path, r->crc,
                 r->trailer_crc);
  else if (crc_out)
    *crc_out = r->crc;
  if (!rc && r->fill) {
    blobs_cache_publish(r->cache, r->fill, r->crc);
    r->fill = NULL;
  }
  blob_reader_abort(r);
  return rc;
}

/* A file is mapped; an object is read into an anonymous mapping, so blob_unmap frees both. */
int blob_map(blob_store *bs, const char *name, blob_kind kind, size_t n, int verify, const float **data, void **map,
             size_t *map_len, uint32_t *crc_out) {
  char path[4096];
  uint64_t size;
  uint32_t stored;
  blob_src src;
  int rc = open_checked(bs, name, kind, n, path, sizeof path, &src, &size, &stored);
  if (rc) return rc;
  void *m = src.fd >= 0 ? mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, src.fd, 0)
                        : mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  int e = errno;
  if (m != MAP_FAILED && src.fd < 0) {
    if ((rc = src_pread(&src, m, (size_t)size, 0, path)) < 0) {
      munmap(m, (size_t)size);
      return rc;
    }
    verify = 1; /* fetched afresh: the bytes are checked whatever the caller knows */
  }
  src_close(&src);
  if (m == MAP_FAILED) return dpc_err(dpc_errno_code(e), "blob %s: mmap: %s", path, strerror(e));
  const float *payload = (const float *)(const void *)((const unsigned char *)m + BLOB_HEADER_BYTES);
  if (verify) {
    (void)madvise(m, (size_t)size, MADV_SEQUENTIAL);
    uint32_t crc = dpc_crc32c(0, payload, n * sizeof(float));
    if (crc != stored) {
      munmap(m, (size_t)size);
      return dpc_err(DPC_ECHECKSUM, "blob %s: payload checksum 0x%08x, stored 0x%08x (corrupt)", path, crc, stored);
    }
    if (crc_out) *crc_out = crc;
  } else if (crc_out) {
    *crc_out = stored;
  }
  *data = payload;
  *map = m;
  *map_len = (size_t)size;
  return 0;
}

void blob_unmap(void *map, size_t map_len) {
  if (map) munmap(map, map_len);
}
