/* test_io_fault.c — the process-wide I/O fault injector of common/fsutil.h
 * (DIPACO_TEST_IO_FAULT=OP:N[+][:ERR][@SUBSTR]): only the named operation on matching paths is
 * counted, the N-th fails with the named errno (and with '+' every later one, a full disk),
 * each failed atomic write leaves the old file intact and no temporary behind, and a
 * malformed value is ignored. Each case runs in a child process (the variable is read once per
 * process). */
#include "common/errors.h"
#include "common/fsutil.h"
#include "tests/unit/test.h"
#include "tests/unit/test_fs.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[64];


/* Child: with `spec` in the environment, write "target.params" four times and "other.bin"
 * once; exit status = a bit per failed target write (1, 2, 4, 8), 16 if "other" failed, 32 if
 * a failure did not say what was asked, 64 if a failure left a mix of old and new content or
 * a temporary behind, 128 if it left the new content in place (only a failed directory fsync
 * may: the rename is done, its durability unknown). */
static int child(const char *spec, const char *want_text) {
  setenv("DIPACO_TEST_IO_FAULT", spec, 1);
  char target[128], other[128];
  snprintf(target, sizeof target, "%s/target.params", g_dir);
  snprintf(other, sizeof other, "%s/other.bin", g_dir);
  int status = 0;
  char prev[16] = "v0";
  if (dpc_write_file_atomic(target, prev, strlen(prev))) return 255;
  for (int i = 1; i <= 4; i++) {
    char now[16];
    snprintf(now, sizeof now, "v%d", i);
    if (dpc_write_file_atomic(target, now, strlen(now))) {
      status |= 1 << (i - 1);
      if (!strstr(dpc_errmsg(), want_text)) status |= 32;
      if ((!file_is(target, prev) && !file_is(target, now)) || count_entries(g_dir) != 1) status |= 64;
      if (file_is(target, now)) status |= 128;
    } else {
      snprintf(prev, sizeof prev, "%s", now);
    }
  }
  if (dpc_write_file_atomic(other, "x", 1)) status |= 16;
  return status;
}

static int run(const char *spec, const char *want_text) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s/*", g_dir);
  if (system(cmd) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) _exit(child(spec, want_text));
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/dpc_iofault_XXXXXX");
  if (!mkdtemp(g_dir)) return 1;
  /* The first write is the setup ("v0"), so target writes 1..4 are calls 2..5 of the op. */
  CHECK_EQ_INT(run("fsync:3", "Input/output error"), 2);                      /* only the 3rd fsync */
  CHECK_EQ_INT(run("rename:2+:ENOSPC", "No space left on device"), 1 | 2 | 4 | 8 | 16); /* a full disk */
  CHECK_EQ_INT(run("write:4:ENOSPC@target", "No space left on device"), 4);   /* other.bin not counted */
  CHECK_EQ_INT(run("rename:1+@other", "Input/output error"), 16);             /* only other.bin */
  CHECK_EQ_INT(run("dirfsync:2", "fsync directory"), 1 | 128);               /* renamed, dir fsync failed */
  CHECK_EQ_INT(run("fsync:x", ""), 0);                                       /* malformed: ignored */
  CHECK_EQ_INT(run("chmod:1", ""), 0);                                       /* unknown op: ignored */
  CHECK_EQ_INT(run("fsync:1:EPERM", ""), 0);                                 /* unknown errno: ignored */
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  TEST_DONE();
}
