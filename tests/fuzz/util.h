/* util.h — helpers shared by the libFuzzer targets in tests/fuzz/: fuzz inputs as files
 * (most parsers take a path), a private scratch directory, and oracle failures that abort so
 * that libFuzzer records the input as a crash. */
#ifndef DPC_FUZZ_UTIL_H
#define DPC_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Quiet logging; call from LLVMFuzzerInitialize. */
void fz_init(void);

/* The input as the whole content of an in-memory file (one memfd per process, rewritten on
 * every call); returns its path "/proc/self/fd/N". */
const char *fz_memfile(const uint8_t *data, size_t n);

/* A private directory (created once under $TMPDIR, else /dev/shm, else /tmp; removed at
 * exit). */
const char *fz_dir(void);

/* Write data[0..n) to <fz_dir()>/<name> (plain write; not atomic, not synced). */
void fz_write(const char *name, const void *data, size_t n);

/* A raw gRPC byte buffer holding d[0..n) as a message arrives from the wire: `mode` 0 gives
 * one slice; otherwise slices of (mode & 0x7f) bytes (1 when 0), with an empty slice after
 * each when mode & 0x80. Each slice is heap memory of exactly its length. Caller destroys it
 * (grpc_byte_buffer_destroy). */
struct grpc_byte_buffer;
struct grpc_byte_buffer *fz_byte_buffer(const uint8_t *d, size_t n, unsigned mode);

/* An oracle violation: print and abort. */
void fz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
