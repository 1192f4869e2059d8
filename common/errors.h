/* errors.h — the one table of dipaco error codes (libuv UV_ERRNO_MAP style).
 *
 * Library functions return 0 or a negative DPC_E* code. A code says what kind of failure it
 * was; the human context (file, field, value, what to do) is kept in a thread-local detail
 * string set with dpc_err() at the point of failure and read with dpc_errmsg(). Only main()
 * and CLI tools print and exit. Thread-safety: all functions are safe from any thread; the
 * detail string is per thread. */
#ifndef DPC_ERRORS_H
#define DPC_ERRORS_H

#define DPC_ERRNO_MAP(X)                                              \
  X(EINVAL, -1, "invalid argument")                                   \
  X(ENOMEM, -2, "out of memory")                                      \
  X(EIO, -3, "input/output error")                                    \
  X(EFORMAT, -4, "malformed file or message")                         \
  X(ENOENT, -5, "no such file or object")                             \
  X(ERANGE, -6, "value out of range")                                 \
  X(ECHECKSUM, -7, "checksum mismatch")                               \
  X(EUNSUPPORTED, -8, "unsupported")                                  \
  X(ESHAPE, -9, "shape mismatch")                                     \
  X(EEXIST, -10, "already exists")                                    \
  X(ESTATE, -11, "operation not valid in the current state")          \
  X(EAUTH, -12, "not authenticated")                                  \
  X(EPERM, -13, "permission denied")                                  \
  X(ETIMEDOUT, -14, "timed out")                                      \
  X(ECANCELED, -15, "canceled")                                       \
  X(EUNAVAILABLE, -16, "unavailable")                                 \
  X(ENUMERIC, -17, "non-finite value")                                \
  X(EBACKEND, -18, "compute backend error")                           \
  X(EINTERNAL, -19, "internal error")

enum {
  DPC_OK = 0,
#define DPC_X_ENUM(name, code, msg) DPC_##name = code,
  DPC_ERRNO_MAP(DPC_X_ENUM)
#undef DPC_X_ENUM
};

/* Short fixed message for a code ("unknown error" for codes outside the table). */
const char *dpc_strerror(int code);

/* Record a printf-style detail for the current thread and return `code`, so that failures
 * read `return dpc_err(DPC_EFORMAT, "%s: bad magic %d", path, magic);`. */
int dpc_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The detail recorded by the last dpc_err() on this thread, or "" if none. */
const char *dpc_errmsg(void);

/* Forget the current thread's detail. */
void dpc_errclear(void);

#endif
