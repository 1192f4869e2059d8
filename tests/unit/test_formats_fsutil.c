/* test_formats_fsutil.c — atomic writes (incl. injected write/fsync/rename failures that must
 * leave the old file intact and no temporary behind), bounded reads, mkdir -p. */
#include "common/errors.h"
#include "common/fsutil.h"
#include "tests/unit/test.h"
#include "tests/unit/test_fs.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


int main(void) {
  char dir[] = "/tmp/dpc_fsutil_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256], sub[256];
  snprintf(path, sizeof path, "%s/a.txt", dir);

  CHECK_EQ_INT(dpc_write_file_atomic(path, "hello", 5), 0);
  CHECK(file_is(path, "hello"));
  CHECK_EQ_INT(dpc_write_file_atomic(path, "second version", 14), 0);
  CHECK(file_is(path, "second version"));
  CHECK_EQ_INT(count_entries(dir), 1);

  /* Empty file; NUL terminator; size bound. */
  void *buf;
  size_t n;
  CHECK_EQ_INT(dpc_write_file_atomic(path, "", 0), 0);
  CHECK_EQ_INT(dpc_read_file(path, 10, &buf, &n), 0);
  CHECK_EQ_INT(n, 0);
  CHECK(((char *)buf)[0] == '\0');
  free(buf);
  CHECK_EQ_INT(dpc_write_file_atomic(path, "0123456789ABC", 13), 0);
  CHECK_EQ_INT(dpc_read_file(path, 12, &buf, &n), DPC_ERANGE);
  CHECK(buf == NULL && strstr(dpc_errmsg(), path) != NULL);
  CHECK_EQ_INT(dpc_read_file(path, 13, &buf, &n), 0);
  CHECK_EQ_INT(n, 13);
  free(buf);
  snprintf(sub, sizeof sub, "%s/missing.txt", dir);
  CHECK_EQ_INT(dpc_read_file(sub, 100, &buf, &n), DPC_ENOENT);
  CHECK(strstr(dpc_errmsg(), sub) != NULL && strstr(dpc_errmsg(), "No such file") != NULL);
  CHECK_EQ_INT(dpc_read_file(dir, 100, &buf, &n), DPC_EINVAL); /* a directory */

  /* Writing into a missing directory names the path. */
  snprintf(sub, sizeof sub, "%s/nodir/x", dir);
  CHECK_EQ_INT(dpc_write_file_atomic(sub, "x", 1), DPC_ENOENT);
  CHECK(strstr(dpc_errmsg(), sub) != NULL);

  /* Streaming writes in pieces, and abort. */
  dpc_afile *f;
  CHECK_EQ_INT(dpc_afile_open(path, &f), 0);
  CHECK_EQ_INT(dpc_afile_write(f, "ab", 2), 0);
  CHECK_EQ_INT(dpc_afile_write(f, "cd", 2), 0);
  CHECK(file_is(path, "0123456789ABC")); /* not visible before commit */
  CHECK_EQ_INT(dpc_afile_commit(f), 0);
  CHECK(file_is(path, "abcd"));
  CHECK_EQ_INT(dpc_afile_open(path, &f), 0);
  CHECK_EQ_INT(dpc_afile_write(f, "zz", 2), 0);
  dpc_afile_abort(f);
  CHECK(file_is(path, "abcd"));
  CHECK_EQ_INT(count_entries(dir), 1);

  /* Fault injection: each failure leaves the old content and no temporary file. */
  enum dpc_fs_fault faults[] = {DPC_FS_FAULT_WRITE, DPC_FS_FAULT_FSYNC, DPC_FS_FAULT_RENAME};
  for (int i = 0; i < 3; i++) {
    dpc_fsutil_inject_fault(faults[i], i == 0 ? ENOSPC : EIO);
    CHECK_EQ_INT(dpc_write_file_atomic(path, "new content", 11), DPC_EIO);
    CHECK(strstr(dpc_errmsg(), path) != NULL);
    if (i == 0) CHECK(strstr(dpc_errmsg(), "No space") != NULL);
    CHECK(file_is(path, "abcd"));
    CHECK_EQ_INT(count_entries(dir), 1);
  }
  CHECK_EQ_INT(dpc_write_file_atomic(path, "new content", 11), 0); /* fault was one-shot */
  CHECK(file_is(path, "new content"));

  /* mkdir -p: nested, idempotent, trailing and repeated slashes, a file in the way. */
  snprintf(sub, sizeof sub, "%s/x//y/z/", dir);
  CHECK_EQ_INT(dpc_mkdir_p(sub), 0);
  CHECK_EQ_INT(dpc_mkdir_p(sub), 0);
  struct stat st;
  snprintf(sub, sizeof sub, "%s/x/y/z", dir);
  CHECK(stat(sub, &st) == 0 && S_ISDIR(st.st_mode));
  CHECK_EQ_INT(dpc_mkdir_p(path), DPC_EEXIST);
  snprintf(sub, sizeof sub, "%s/a.txt/below", dir);
  CHECK(dpc_mkdir_p(sub) < 0);
  CHECK(strstr(dpc_errmsg(), "a.txt") != NULL);
  CHECK_EQ_INT(dpc_fsync_dir(dir), 0);

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  TEST_DONE();
}
