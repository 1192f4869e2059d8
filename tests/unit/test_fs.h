/* test_fs.h — file helpers shared by the durable-write tests (test_formats_fsutil.c,
 * test_io_fault.c): how many entries a directory holds, and whether a file holds exactly
 * a given text. */
#ifndef DPC_TEST_FS_H
#define DPC_TEST_FS_H
#include "common/fsutil.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

/* Entries of dir other than . and ..; -1 if it cannot be opened. */
static inline int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

/* 1 if the file at path holds exactly the bytes of want. */
static inline int file_is(const char *path, const char *want) {
  void *buf;
  size_t n;
  if (dpc_read_file(path, 1 << 20, &buf, &n)) return 0;
  int ok = n == strlen(want) && memcmp(buf, want, n) == 0;
  free(buf);
  return ok;
}
#endif
