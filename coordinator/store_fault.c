/* store_fault.c — test-only fault injection under SQLite: a VFS shim over the default VFS
 * whose xWrite / xSync fail when DIPACO_TEST_IO_FAULT (common/fsutil.h) says so
 * (sqlite-write:N / sqlite-sync:N, optionally '+' for every later call and :ENOSPC for a full
 * disk), so that tests can check that a failed database write is answered with an error and
 * leaves the state recoverable (SQLite's own ioerr tests do the same with their test VFS).
 * Without the variable nothing is registered and the store uses SQLite's default VFS. */
#include "coordinator/store_internal.h"

#include "common/fsutil.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  sqlite3_file base;
  sqlite3_file *real; /* the default VFS's file, allocated right behind this struct */
} ffile;

static sqlite3_vfs g_vfs;
static sqlite3_vfs *g_real;
static sqlite3_io_methods g_io;
static int g_ok;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#define REAL(f) (((ffile *)(f))->real)

static int f_close(sqlite3_file *f) { return REAL(f)->pMethods->xClose(REAL(f)); }
static int f_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o) { return REAL(f)->pMethods->xRead(REAL(f), b, n, o); }
static int f_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o) {
  int e = dpc_test_io_fault("sqlite-write", NULL);
  if (e) return e == ENOSPC ? SQLITE_FULL : SQLITE_IOERR_WRITE;
  return REAL(f)->pMethods->xWrite(REAL(f), b, n, o);
}
static int f_truncate(sqlite3_file *f, sqlite3_int64 n) { return REAL(f)->pMethods->xTruncate(REAL(f), n); }
static int f_sync(sqlite3_file *f, int flags) {
  if (dpc_test_io_fault("sqlite-sync", NULL)) return SQLITE_IOERR_FSYNC;
  return REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int f_size(sqlite3_file *f, sqlite3_int64 *n) { return REAL(f)->pMethods->xFileSize(REAL(f), n); }
static int f_lock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xLock(REAL(f), l); }
static int f_unlock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xUnlock(REAL(f), l); }
static int f_check(sqlite3_file *f, int *out) { return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out); }
static int f_fctl(sqlite3_file *f, int op, void *arg) { return REAL(f)->pMethods->xFileControl(REAL(f), op, arg); }
static int f_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int f_dev(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static int f_shmmap(sqlite3_file *f, int pg, int sz, int ext, void volatile **pp) {
  return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, ext, pp);
}
static int f_shmlock(sqlite3_file *f, int off, int n, int flags) { return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags); }
static void f_shmbarrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int f_shmunmap(sqlite3_file *f, int del) { return REAL(f)->pMethods->xShmUnmap(REAL(f), del); }
static int f_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **pp) { return REAL(f)->pMethods->xFetch(REAL(f), o, n, pp); }
static int f_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p) { return REAL(f)->pMethods->xUnfetch(REAL(f), o, p); }

static int f_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *out_flags) {
  (void)vfs;
  ffile *ff = (ffile *)file;
  ff->real = (sqlite3_file *)(ff + 1);
  ff->base.pMethods = NULL;
  int rc = g_real->xOpen(g_real, name, ff->real, flags, out_flags);
  if (ff->real->pMethods) {
    /* Offer only the methods the real file has (its iVersion). */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (!g_io.iVersion) {
      g_io = (sqlite3_io_methods){.iVersion = ff->real->pMethods->iVersion, .xClose = f_close, .xRead = f_read,
                                  .xWrite = f_write, .xTruncate = f_truncate, .xSync = f_sync, .xFileSize = f_size,
                                  .xLock = f_lock, .xUnlock = f_unlock, .xCheckReservedLock = f_check,
                                  .xFileControl = f_fctl, .xSectorSize = f_sector, .xDeviceCharacteristics = f_dev,
                                  .xShmMap = f_shmmap, .xShmLock = f_shmlock, .xShmBarrier = f_shmbarrier,
                                  .xShmUnmap = f_shmunmap, .xFetch = f_fetch, .xUnfetch = f_unfetch};
    }
    pthread_mutex_unlock(&mu);
    ff->base.pMethods = &g_io;
  }
  return rc;
}

static void setup(void) {
  const char *v = getenv("DIPACO_TEST_IO_FAULT");
  if (!v || strncmp(v, "sqlite-", 7) != 0 || !(g_real = sqlite3_vfs_find(NULL))) return;
  g_vfs = *g_real; /* same pAppData and helpers; only opening files differs */
  g_vfs.pNext = NULL;
  g_vfs.zName = "dipaco-test-fault";
  g_vfs.szOsFile = (int)sizeof(ffile) + g_real->szOsFile;
  g_vfs.xOpen = f_open;
  g_ok = sqlite3_vfs_register(&g_vfs, 0) == SQLITE_OK;
}

const char *store_fault_vfs(void) {
  pthread_once(&g_once, setup);
  return g_ok ? g_vfs.zName : NULL;
}
