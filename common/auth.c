/* auth.c — token files, bearer parsing and constant-time comparison (see auth.h). */
#include "common/auth.h"

#include "common/errors.h"
#include "common/fsutil.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

int dpc_token_generate(char *out, size_t cap) {
  unsigned char raw[DPC_TOKEN_BYTES];
  if (cap < 2 * DPC_TOKEN_BYTES + 1) return dpc_err(DPC_EINVAL, "token: buffer of %zu bytes is too small", cap);
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return dpc_err(DPC_EIO, "token: getrandom: %s", strerror(errno));
    }
    got += (size_t)r;
  }
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof raw; i++) {
    out[2 * i] = hex[raw[i] >> 4];
    out[2 * i + 1] = hex[raw[i] & 15];
  }
  out[2 * DPC_TOKEN_BYTES] = 0;
  return 0;
}

/* Written to a 0600 temporary first and linked into place, so that `path` appears complete or
 * not at all and an existing file is never replaced. */
int dpc_token_create_file(const char *path, char *out, size_t cap) {
  int rc = dpc_token_generate(out, cap);
  if (rc) return rc;
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
    return dpc_err(DPC_ERANGE, "token file %s: path too long", path);
  unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return dpc_err(dpc_errno_code(errno), "token file %s: create: %s", tmp, strerror(errno));
  char line[2 * DPC_TOKEN_BYTES + 2];
  size_t n = (size_t)snprintf(line, sizeof line, "%s\n", out);
  ssize_t w = write(fd, line, n);
  int err = w == (ssize_t)n ? (fsync(fd) == 0 ? 0 : errno) : (w < 0 ? errno : EIO);
  close(fd);
  if (!err && link(tmp, path) != 0) err = errno;
  unlink(tmp);
  if (err == EEXIST) return dpc_err(DPC_EEXIST, "token file %s already exists", path);
  if (err) return dpc_err(dpc_errno_code(err), "token file %s: write: %s", path, strerror(err));
  char dir[4200];
  snprintf(dir, sizeof dir, "%s", path);
  return dpc_fsync_dir(dirname(dir));
}

int dpc_token_read_file(const char *path, char *out, size_t cap) {
  struct stat st;
  if (stat(path, &st) != 0)
    return dpc_err(dpc_errno_code(errno), "token file %s: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) return dpc_err(DPC_EFORMAT, "token file %s: not a regular file", path);
  if (st.st_mode & 022)
    return dpc_err(DPC_EPERM, "token file %s: writable by group or others (mode %03o); chmod 600 it", path,
                   (unsigned)(st.st_mode & 0777));
  if (st.st_mode & 044)
    DPC_WARN("token file %s is readable by group or others (mode %03o); chmod 600 is advised", path,
             (unsigned)(st.st_mode & 0777));
  void *buf = NULL;
  size_t n = 0;
  int rc = dpc_read_file(path, DPC_TOKEN_MAX + 64, &buf, &n);
  if (rc) return rc == DPC_ERANGE ? dpc_err(rc, "token file %s: longer than %d bytes", path, DPC_TOKEN_MAX) : rc;
  char *s = buf;
  while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
  s[n] = 0;
  rc = 0;
  if (n < DPC_TOKEN_MIN || n > DPC_TOKEN_MAX || n + 1 > cap)
    rc = dpc_err(DPC_EFORMAT, "token file %s: the token has %zu bytes; expected %d..%d", path, n, DPC_TOKEN_MIN,
                 DPC_TOKEN_MAX);
  for (size_t i = 0; rc == 0 && i < n; i++)
    if (s[i] <= ' ' || s[i] > '~')
      rc = dpc_err(DPC_EFORMAT, "token file %s: byte %zu is not printable ASCII (one token, one line)", path, i);
  if (rc == 0) memcpy(out, s, n + 1);
  memset(buf, 0, n);
  free(buf);
  return rc;
}

const char *dpc_bearer_token(const char *v) {
  if (!v || strncasecmp(v, "Bearer ", 7) != 0) return NULL;
  v += 7;
  while (*v == ' ') v++;
  return *v ? v : NULL;
}

int dpc_ct_equal(const void *a, const void *b, size_t n) {
  const volatile unsigned char *x = a, *y = b;
  unsigned char d = 0;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(x[i] ^ y[i]);
  return d == 0;
}
