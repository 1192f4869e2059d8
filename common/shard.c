/* shard.c — llm.c token shard reader (mmap, exact validation) and atomic writer. */
#include "common/shard.h"
#include "common/errors.h"
#include "common/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shard.c assumes a little-endian host"
#endif

struct shard {
  char *path;
  void *map;
  size_t map_len;
  size_t n;
  const uint16_t *tokens;
};

int shard_write(const char *path, const uint16_t *tokens, size_t n) {
  if (n > SHARD_MAX_TOKENS)
    return dpc_err(DPC_ERANGE, "write shard %s: %zu tokens exceed the int32 count of the format (split it)", path, n);
  if (n && !tokens) return dpc_err(DPC_EINVAL, "write shard %s: no tokens", path);
  int32_t hdr[SHARD_HEADER_INTS] = {0};
  hdr[0] = SHARD_MAGIC;
  hdr[1] = SHARD_VERSION;
  hdr[2] = (int32_t)n;
  dpc_afile *f;
  int rc = dpc_afile_open(path, &f);
  if (rc) return rc;
  rc = dpc_afile_write(f, hdr, sizeof hdr);
  if (!rc) rc = dpc_afile_write(f, tokens, n * sizeof *tokens);
  if (rc) {
    dpc_afile_abort(f);
    return rc;
  }
  return dpc_afile_commit(f);
}

void shard_close(shard *s) {
  if (!s) return;
  if (s->map) munmap(s->map, s->map_len);
  free(s->path);
  free(s);
}

int shard_open(const char *path, shard **out) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return dpc_err(dpc_errno_code(e), "open shard %s: %s", path, strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return dpc_err(DPC_EIO, "shard %s: not a readable regular file", path);
  }
  uint64_t size = (uint64_t)st.st_size;
  if (size < SHARD_HEADER_BYTES) {
    close(fd);
    return dpc_err(DPC_EFORMAT, "shard %s: truncated: %llu bytes, shorter than the %d-byte header", path,
                   (unsigned long long)size, SHARD_HEADER_BYTES);
  }
  void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (map == MAP_FAILED) return dpc_err(DPC_EIO, "mmap shard %s: %s", path, strerror(e));
  const int32_t *hdr = map;
  int rc = 0;
  uint64_t want = 0;
  if (hdr[0] != SHARD_MAGIC) {
    rc = dpc_err(DPC_EFORMAT, "shard %s: wrong magic %d (expected %d; not an llm.c token shard)", path, hdr[0],
                 SHARD_MAGIC);
  } else if (hdr[1] != SHARD_VERSION) {
    rc = dpc_err(DPC_EFORMAT, "shard %s: unsupported version %d (expected %d)", path, hdr[1], SHARD_VERSION);
  } else if (hdr[2] < 0) {
    rc = dpc_err(DPC_EFORMAT, "shard %s: negative token count %d", path, hdr[2]);
  } else {
    want = SHARD_HEADER_BYTES + 2 * (uint64_t)hdr[2];
    if (size < want)
      rc = dpc_err(DPC_EFORMAT, "shard %s: truncated: header says %d tokens (%llu bytes) but the file has %llu bytes",
                   path, hdr[2], (unsigned long long)want, (unsigned long long)size);
    else if (size > want)
      rc = dpc_err(DPC_EFORMAT, "shard %s: %llu trailing bytes after the %d tokens the header declares", path,
                   (unsigned long long)(size - want), hdr[2]);
  }
  shard *s = NULL;
  if (!rc && (!(s = calloc(1, sizeof *s)) || !(s->path = strdup(path)))) {
    free(s);
    s = NULL;
    rc = dpc_err(DPC_ENOMEM, "shard %s: out of memory", path);
  }
  if (rc) {
    munmap(map, (size_t)size);
    return rc;
  }
  s->map = map;
  s->map_len = (size_t)size;
  s->n = (size_t)hdr[2];
  s->tokens = (const uint16_t *)((const char *)map + SHARD_HEADER_BYTES);
  *out = s;
  return 0;
}

size_t shard_num_tokens(const shard *s) { return s->n; }
const uint16_t *shard_tokens(const shard *s) { return s->tokens; }
const char *shard_path(const shard *s) { return s->path; }
