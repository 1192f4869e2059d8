/* shard.c — llm.c token shard reader (mmap, exact validation) and atomic writer, for uint16
 * (version 1) and uint32 (version 2) tokens. */
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
  int width; /* bytes per token */
  const void *tokens;
};

static int write_shard(const char *path, int version, const void *tokens, size_t n, size_t width) {
  if (n > SHARD_MAX_TOKENS)
    return dpc_err(DPC_ERANGE, "write shard %s: %zu tokens exceed the int32 count of the format (split it)", path, n);
  if (n && !tokens) return dpc_err(DPC_EINVAL, "write shard %s: no tokens", path);
  int32_t hdr[SHARD_HEADER_INTS] = {0};
  hdr[0] = SHARD_MAGIC;
  hdr[1] = version;
  hdr[2] = (int32_t)n;
  if (version == SHARD_VERSION_U32) hdr[3] = 4;
  dpc_afile *f;
  int rc = dpc_afile_open(path, &f);
  if (rc) return rc;
  rc = dpc_afile_write(f, hdr, sizeof hdr);
  if (!rc) rc = dpc_afile_write(f, tokens, n * width);
  if (rc) {
    dpc_afile_abort(f);
    return rc;
  }
  return dpc_afile_commit(f);
}

int shard_write(const char *path, const uint16_t *tokens, size_t n) {
  return write_shard(path, SHARD_VERSION, tokens, n, 2);
}

int shard_write_ids(const char *path, const int *ids, size_t n, int vocab_size) {
  if (vocab_size < 1) return dpc_err(DPC_EINVAL, "write shard %s: vocab_size %d", path, vocab_size);
  if (n > SHARD_MAX_TOKENS)
    return dpc_err(DPC_ERANGE, "write shard %s: %zu tokens exceed the int32 count of the format (split it)", path, n);
  if (n && !ids) return dpc_err(DPC_EINVAL, "write shard %s: no tokens", path);
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= vocab_size)
      return dpc_err(DPC_ERANGE, "write shard %s: token %d at position %zu is outside the vocabulary [0, %d)", path,
                     ids[i], i, vocab_size);
  int wide = vocab_size > 65536;
  void *buf = malloc((n ? n : 1) * (wide ? 4 : 2));
  if (!buf) return dpc_err(DPC_ENOMEM, "write shard %s: out of memory for %zu tokens", path, n);
  for (size_t i = 0; i < n; i++) {
    if (wide) ((uint32_t *)buf)[i] = (uint32_t)ids[i];
    else ((uint16_t *)buf)[i] = (uint16_t)ids[i];
  }
  int rc = write_shard(path, wide ? SHARD_VERSION_U32 : SHARD_VERSION, buf, n, wide ? 4 : 2);
  free(buf);
  return rc;
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
  int rc = 0, width = 2;
  uint64_t want = 0;
  if (hdr[0] != SHARD_MAGIC) {
    rc = dpc_err(DPC_EFORMAT, "shard %s: wrong magic %d (expected %d; not an llm.c token shard)", path, hdr[0],
                 SHARD_MAGIC);
  } else if (hdr[1] != SHARD_VERSION && hdr[1] != SHARD_VERSION_U32) {
    rc = dpc_err(DPC_EFORMAT, "shard %s: unsupported version %d (1: uint16 tokens, 2: uint32 tokens)", path, hdr[1]);
  } else if (hdr[1] == SHARD_VERSION_U32 && hdr[3] != 4) {
    rc = dpc_err(DPC_EFORMAT, "shard %s: version 2 header gives %d bytes per token (header int 3 must be 4)", path,
                 hdr[3]);
  } else if (hdr[2] < 0) {
    rc = dpc_err(DPC_EFORMAT, "shard %s: negative token count %d", path, hdr[2]);
  } else {
    width = hdr[1] == SHARD_VERSION_U32 ? 4 : 2;
    want = SHARD_HEADER_BYTES + (uint64_t)width * (uint64_t)hdr[2];
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
  s->width = width;
  s->tokens = (const char *)map + SHARD_HEADER_BYTES;
  *out = s;
  return 0;
}

size_t shard_num_tokens(const shard *s) { return s->n; }
int shard_token_bytes(const shard *s) { return s->width; }
const uint16_t *shard_tokens(const shard *s) { return s->width == 2 ? s->tokens : NULL; }
const uint32_t *shard_tokens32(const shard *s) { return s->width == 4 ? s->tokens : NULL; }
const char *shard_path(const shard *s) { return s->path; }
