/* fsutil.c — atomic writes (temp file, fsync, rename, fsync dir), bounded reads, mkdir -p. */
#include "common/fsutil.h"
#include "common/errors.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct dpc_afile {
  int fd;
  char *path;
  char *tmp;
};

static atomic_uint tmp_counter;
static _Atomic int fault_op;
static _Atomic int fault_errno;

void dpc_fsutil_inject_fault(enum dpc_fs_fault op, int err) {
  atomic_store(&fault_errno, err);
  atomic_store(&fault_op, (int)op);
}

/* DIPACO_TEST_IO_FAULT (see fsutil.h), parsed once. */
static struct {
  char op[16];
  char sub[64]; /* only paths containing this count ("" = every path) */
  long nth;
  int persist, err;
} env_fault;
static atomic_long env_calls;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void env_fault_parse(void) {
  const char *v = getenv("DIPACO_TEST_IO_FAULT");
  if (!v || !*v) return;
  char op[16] = "", err[16] = "EIO", sub[64] = "";
  long nth = 0;
  char plus = 0;
  int k = 0;
  if (sscanf(v, "%15[a-z-]:%ld%n", op, &nth, &k) == 2) {
    const char *rest = v + k;
    if (*rest == '+') plus = *rest++;
    if (*rest == ':') {
      int m = 0;
      if (sscanf(rest + 1, "%15[A-Z]%n", err, &m) != 1) nth = 0;
      rest += 1 + m;
    }
    if (*rest == '@' && strlen(rest + 1) < sizeof sub && rest[1]) snprintf(sub, sizeof sub, "%s", rest + 1);
    else if (*rest) nth = 0;
  }
  static const char *const ops[] = {"write", "fsync", "rename", "dirfsync", "sqlite-write", "sqlite-sync"};
  int known = 0;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) known |= strcmp(op, ops[i]) == 0;
  int e = !strcmp(err, "EIO") ? EIO : !strcmp(err, "ENOSPC") ? ENOSPC : 0;
  if (!known || nth < 1 || !e) {
    fprintf(stderr, "DIPACO_TEST_IO_FAULT=\"%s\" ignored: expected OP:N[+][:EIO|ENOSPC][@SUBSTR], OP one of write, "
            "fsync, rename, dirfsync, sqlite-write, sqlite-sync\n", v);
    return;
  }
  snprintf(env_fault.op, sizeof env_fault.op, "%s", op);
  snprintf(env_fault.sub, sizeof env_fault.sub, "%s", sub);
  env_fault.nth = nth;
  env_fault.persist = plus == '+';
  env_fault.err = e;
  fprintf(stderr, "DIPACO_TEST_IO_FAULT: call %ld%s of %s%s%s fails with %s\n", nth, plus ? " and later" : "", op,
          sub[0] ? " on paths containing " : "", sub, err);
}

int dpc_test_io_fault(const char *op, const char *path) {
  pthread_once(&env_once, env_fault_parse);
  if (!env_fault.nth || strcmp(op, env_fault.op) != 0) return 0;
  if (env_fault.sub[0] && (!path || !strstr(path, env_fault.sub))) return 0;
  long n = atomic_fetch_add(&env_calls, 1) + 1;
  if (n == env_fault.nth || (env_fault.persist && n > env_fault.nth)) {
    fprintf(stderr, "DIPACO_TEST_IO_FAULT: injecting %s into %s call %ld%s%s\n", strerror(env_fault.err), op, n,
            path ? " on " : "", path ? path : "");
    return env_fault.err;
  }
  return 0;
}

static const char *const FAULT_NAMES[] = {"", "write", "fsync", "rename"};

/* 1 (and errno set) if the one-shot fault is armed for `op`, or DIPACO_TEST_IO_FAULT says so
 * for this call on `path`. */
static int fault_hit(enum dpc_fs_fault op, const char *path) {
  int expect = (int)op;
  if (atomic_load(&fault_op) == expect &&
      atomic_compare_exchange_strong(&fault_op, &expect, DPC_FS_FAULT_NONE)) {
    errno = atomic_load(&fault_errno);
    return 1;
  }
  int e = dpc_test_io_fault(FAULT_NAMES[op], path);
  if (e) errno = e;
  return e != 0;
}

int dpc_errno_code(int err) {
  switch (err) {
  case ENOENT:
  case ENOTDIR: return DPC_ENOENT;
  case EACCES:
  case EPERM:
  case EROFS: return DPC_EPERM;
  case EEXIST: return DPC_EEXIST;
  case ENOMEM: return DPC_ENOMEM;
  case EFBIG: return DPC_ERANGE;
  default: return DPC_EIO;
  }
}

static int errno_err(const char *what, const char *path, int err) {
  return dpc_err(dpc_errno_code(err), "%s %s: %s", what, path, strerror(err));
}

/* Directory part of `path` ("." when there is none); caller frees. */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

int dpc_fsync_dir(const char *dir) {
  int e = dpc_test_io_fault("dirfsync", dir);
  if (e) return errno_err("fsync directory", dir, e);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_err("open directory", dir, errno);
  int rc = 0;
  if (fsync(fd) != 0 && errno != EINVAL) rc = errno_err("fsync directory", dir, errno);
  close(fd);
  return rc;
}

int dpc_afile_open(const char *path, dpc_afile **out) {
  *out = NULL;
  if (!path || !*path) return dpc_err(DPC_EINVAL, "atomic write: empty path");
  dpc_afile *f = calloc(1, sizeof *f);
  if (!f) return dpc_err(DPC_ENOMEM, "atomic write %s: out of memory", path);
  f->fd = -1;
  f->path = strdup(path);
  size_t tl = strlen(path) + 64;
  f->tmp = malloc(tl);
  if (!f->path || !f->tmp) {
    free(f->path);
    free(f->tmp);
    free(f);
    return dpc_err(DPC_ENOMEM, "atomic write %s: out of memory", path);
  }
  for (int attempt = 0; attempt < 100; attempt++) {
    snprintf(f->tmp, tl, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&tmp_counter, 1));
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f->fd >= 0 || errno != EEXIST) break;
  }
  if (f->fd < 0) {
    int rc = errno_err("create temporary for", path, errno);
    free(f->path);
    free(f->tmp);
    free(f);
    return rc;
  }
  *out = f;
  return 0;
}

int dpc_afile_write(dpc_afile *f, const void *data, size_t n) {
  const char *p = data;
  while (n > 0) {
    size_t chunk = n > (1u << 30) ? (1u << 30) : n;
    ssize_t w = fault_hit(DPC_FS_FAULT_WRITE, f->path) ? -1 : write(f->fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno_err("write", f->path, errno);
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

void dpc_afile_writeback(dpc_afile *f) {
#if defined(__linux__) && defined(SYNC_FILE_RANGE_WRITE)
  /* Asynchronous: queues the dirty pages for write-back and returns; errors surface at the
   * commit's fsync, which is what makes the file durable. */
  (void)sync_file_range(f->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
#else
  (void)f;
#endif
}

static void afile_free(dpc_afile *f) {
  if (f->fd >= 0) close(f->fd);
  free(f->path);
  free(f->tmp);
  free(f);
}

void dpc_afile_abort(dpc_afile *f) {
  if (!f) return;
  unlink(f->tmp);
  afile_free(f);
}

int dpc_afile_commit(dpc_afile *f) {
  int rc = 0;
  if (fault_hit(DPC_FS_FAULT_FSYNC, f->path) || fsync(f->fd) != 0) {
    rc = errno_err("fsync", f->path, errno);
  } else if (close(f->fd) != 0) {
    f->fd = -1;
    rc = errno_err("close", f->path, errno);
  } else {
    f->fd = -1;
    if (fault_hit(DPC_FS_FAULT_RENAME, f->path) || rename(f->tmp, f->path) != 0) {
      rc = errno_err("rename temporary over", f->path, errno);
    } else {
      char *dir = dir_of(f->path);
      rc = dir ? dpc_fsync_dir(dir) : dpc_err(DPC_ENOMEM, "fsync directory of %s", f->path);
      free(dir);
      afile_free(f);
      return rc;
    }
  }
  dpc_afile_abort(f);
  return rc;
}

int dpc_write_file_atomic(const char *path, const void *data, size_t n) {
  dpc_afile *f;
  int rc = dpc_afile_open(path, &f);
  if (rc) return rc;
  rc = dpc_afile_write(f, data, n);
  if (rc) {
    dpc_afile_abort(f);
    return rc;
  }
  return dpc_afile_commit(f);
}

int dpc_read_file(const char *path, size_t max_bytes, void **buf, size_t *n) {
  *buf = NULL;
  *n = 0;
  if (max_bytes > SIZE_MAX / 4) max_bytes = SIZE_MAX / 4; /* keep the growth arithmetic safe */
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_err("open", path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int rc = errno_err("stat", path, errno);
    close(fd);
    return rc;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return dpc_err(DPC_EINVAL, "read %s: not a regular file", path);
  }
  if ((unsigned long long)st.st_size > max_bytes) {
    close(fd);
    return dpc_err(DPC_ERANGE, "read %s: file is %lld bytes, more than the limit of %zu", path,
                   (long long)st.st_size, max_bytes);
  }
  /* The size may change under us: read at most max_bytes and notice anything beyond. */
  size_t cap = (size_t)st.st_size + 1, len = 0;
  char *b = malloc(cap + 1);
  if (!b) {
    close(fd);
    return dpc_err(DPC_ENOMEM, "read %s: cannot allocate %zu bytes", path, cap);
  }
  for (;;) {
    if (len == cap) {
      if (cap > max_bytes) break;
      size_t ncap = cap * 2 > max_bytes + 1 ? max_bytes + 1 : cap * 2;
      char *nb = realloc(b, ncap + 1);
      if (!nb) {
        free(b);
        close(fd);
        return dpc_err(DPC_ENOMEM, "read %s: cannot allocate %zu bytes", path, ncap);
      }
      b = nb;
      cap = ncap;
    }
    ssize_t r = read(fd, b + len, cap - len);
    if (r < 0) {
      if (errno == EINTR) continue;
      int rc = errno_err("read", path, errno);
      free(b);
      close(fd);
      return rc;
    }
    if (r == 0) break;
    len += (size_t)r;
  }
  close(fd);
  if (len > max_bytes) {
    free(b);
    return dpc_err(DPC_ERANGE, "read %s: file grew beyond the limit of %zu bytes", path, max_bytes);
  }
  b[len] = '\0';
  *buf = b;
  *n = len;
  return 0;
}

int dpc_mkdir_p(const char *path) {
  if (!path || !*path) return dpc_err(DPC_EINVAL, "mkdir: empty path");
  size_t len = strlen(path);
  if (len >= PATH_MAX) return dpc_err(DPC_EINVAL, "mkdir %s: path too long", path);
  char buf[PATH_MAX];
  memcpy(buf, path, len + 1);
  for (size_t i = 1; i <= len; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    if (buf[i - 1] == '/') continue; /* repeated or trailing slash */
    char saved = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return errno_err("mkdir", buf, errno);
    buf[i] = saved;
  }
  struct stat st;
  if (stat(path, &st) != 0) return errno_err("stat", path, errno);
  if (!S_ISDIR(st.st_mode)) return dpc_err(DPC_EEXIST, "mkdir %s: exists and is not a directory", path);
  return 0;
}
