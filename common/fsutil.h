/* fsutil.h — crash-safe file writing and bounded file reading, used by every file dipaco
 * writes (weights, shards, blobs, configs).
 *
 * An atomic write goes to a temporary file in the same directory ("<path>.tmp.<pid>.<n>"),
 * is fsync'd, renamed over `path`, and the directory is fsync'd; after a crash at any point
 * `path` holds either the complete old content or the complete new one, never a mix. On
 * failure the temporary file is removed and `path` is untouched. Errors name the path and
 * the errno text. All functions are thread-safe (no shared state except the test fault
 * hook). */
#ifndef DPC_FSUTIL_H
#define DPC_FSUTIL_H

#include <stddef.h>
#include <sys/types.h>

/* Write data[0, n) to `path` atomically (mode 0666 & ~umask). */
int dpc_write_file_atomic(const char *path, const void *data, size_t n);

/* Streaming variant: open, write any number of times, then commit (fsync, rename, fsync
 * dir) or abort (remove the temporary). Both commit and abort free the handle; commit frees
 * it even when it fails. */
typedef struct dpc_afile dpc_afile;
int dpc_afile_open(const char *path, dpc_afile **out);
int dpc_afile_write(dpc_afile *f, const void *data, size_t n);
int dpc_afile_commit(dpc_afile *f);
/* Start writing back what was written so far, without waiting (Linux sync_file_range; a no-op
 * elsewhere): a large file written in steps then has little left for the commit's fsync. */
void dpc_afile_writeback(dpc_afile *f);
void dpc_afile_abort(dpc_afile *f);

/* Read a whole regular file of at most max_bytes. On success *buf (caller frees) holds the
 * n bytes followed by a NUL terminator (not counted in *n), convenient for text. Errors:
 * DPC_ENOENT (missing), DPC_EPERM (access), DPC_ERANGE (larger than max_bytes), DPC_EIO. */
int dpc_read_file(const char *path, size_t max_bytes, void **buf, size_t *n);

/* mkdir -p: create `path` and missing parents (mode 0777 & ~umask); an existing directory
 * is success, an existing non-directory is DPC_EEXIST. */
int dpc_mkdir_p(const char *path);

/* fsync a directory (so that a rename or create inside it is durable). */
int dpc_fsync_dir(const char *dir);

/* Map an errno value to a DPC_E* code. */
int dpc_errno_code(int err);

/* Test hook (fault injection, SQLite ioerr style): make the next atomic write fail at `op`
 * with errno `err`, once. Not for production use. */
enum dpc_fs_fault { DPC_FS_FAULT_NONE = 0, DPC_FS_FAULT_WRITE, DPC_FS_FAULT_FSYNC, DPC_FS_FAULT_RENAME };
void dpc_fsutil_inject_fault(enum dpc_fs_fault op, int err);

/* Test hook for whole processes: the environment variable
 *   DIPACO_TEST_IO_FAULT=OP:N[+][:ERR][@SUBSTR]
 * makes the N-th call (1-based, counted per process) of OP fail with errno ERR (EIO, the
 * default, or ENOSPC) — only that call, or with '+' that call and every later one (a full
 * disk). With @SUBSTR only calls on a path containing SUBSTR count (e.g. rename:1@-v1.params:
 * the rename of version 1's parameter blob). OP is one of write, fsync, rename, dirfsync
 * (this file's atomic writes and directory fsyncs), sqlite-write, sqlite-sync (the
 * coordinator's SQLite file I/O, see coordinator/store_fault.c). dpc_test_io_fault(op, path)
 * counts one call of `op` on `path` (may be NULL) and returns the errno to fail it with, or
 * 0; a malformed variable is reported once on stderr and ignored. Thread-safe. */
int dpc_test_io_fault(const char *op, const char *path);

#endif
