/* util.c — helpers shared by the libFuzzer targets (see util.h). */
#include "util.h"

#include "common/log.h"

#include <fcntl.h>
#include <grpc/byte_buffer.h>
#include <grpc/slice.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void fz_init(void) { dpc_log_init("fuzz", 0, DPC_LOG_ERROR); }

void fz_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FUZZ ORACLE FAILURE: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}

const char *fz_memfile(const uint8_t *data, size_t n) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("dpc-fuzz", 0);
    if (fd < 0) fz_fail("memfd_create failed");
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0) fz_fail("ftruncate failed");
  size_t off = 0;
  while (off < n) {
    ssize_t w = pwrite(fd, data + off, n - off, (off_t)off);
    if (w <= 0) fz_fail("pwrite failed");
    off += (size_t)w;
  }
  return path;
}

static char g_dir[64];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

static void rm_dir(void) {
  if (g_dir[0]) nftw(g_dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

const char *fz_dir(void) {
  if (!g_dir[0]) {
    /* Memory-backed when possible: targets rewrite their files on every input. */
    const char *t = getenv("TMPDIR");
    if (!t || strlen(t) >= 40) t = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/dpc-fuzz-XXXXXX", t);
    if (!mkdtemp(g_dir)) fz_fail("mkdtemp %s failed", g_dir);
    atexit(rm_dir);
  }
  return g_dir;
}

void fz_write(const char *name, const void *data, size_t n) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", fz_dir(), name);
  FILE *f = fopen(path, "wb");
  if (!f) fz_fail("cannot write %s", path);
  if (n && fwrite(data, 1, n, f) != n) fz_fail("short write %s", path);
  if (fclose(f) != 0) fz_fail("close %s failed", path);
}

struct grpc_byte_buffer *fz_byte_buffer(const uint8_t *d, size_t n, unsigned mode) {
  size_t k = mode == 0 ? (n ? n : 1) : ((mode & 0x7f) ? (mode & 0x7f) : 1);
  int empties = (mode & 0x80) != 0;
  size_t cap = (n / k + 1) * (empties ? 2 : 1) + 1, ns = 0;
  grpc_slice *sl = calloc(cap, sizeof *sl);
  if (!sl) fz_fail("out of memory");
  for (size_t off = 0; off < n || (n == 0 && ns == 0); off += k) {
    size_t len = n - off < k ? n - off : k;
    /* grpc_slice_malloc_large: refcounted heap memory even for a few bytes (no inlining). */
    sl[ns] = grpc_slice_malloc_large(len);
    if (len) memcpy(GRPC_SLICE_START_PTR(sl[ns]), d + off, len);
    ns++;
    if (empties) sl[ns++] = grpc_empty_slice();
    if (n == 0) break;
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, ns);
  for (size_t i = 0; i < ns; i++) grpc_slice_unref(sl[i]);
  free(sl);
  if (!bb) fz_fail("grpc_raw_byte_buffer_create failed");
  return bb;
}
