/* safetensors.h — reading and writing the safetensors format (Hugging Face): an 8-byte
 * little-endian header length N, N bytes of JSON header {"name": {"dtype": "F32", "shape":
 * [..], "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}, then the data
 * section, offsets relative to its start.
 *
 * Reading: st_open() (or st_open_source(), over ranged reads of any source) reads and
 * validates only the header (the file is untrusted: header
 * length against the file size and a 100 MB cap, well-formed JSON, known dtypes,
 * non-negative shapes without overflow, each tensor's byte size = numel x dtype size, and
 * the tensors tiling the data section exactly — no overlap, no hole, nothing past the end —
 * as the reference implementation requires). Tensor data is read on demand with pread into
 * caller buffers, so a huge file is never held in memory twice and a file truncated later
 * gives an error rather than SIGBUS. An st_file may be read from several threads at once.
 *
 * Writing: st_write() is deterministic — tensors in the given order, contiguous, header
 * padded with spaces so the data starts 8-byte aligned — so identical inputs give
 * byte-identical files; the file is written atomically (common/fsutil.h). */
#ifndef DPC_SAFETENSORS_H
#define DPC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u * 1000u * 1000u) /* same cap as the reference implementation */

typedef enum {
  ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16,
  ST_I32, ST_U32, ST_F32, ST_I64, ST_U64, ST_F64, ST_NUM_DTYPES
} st_dtype;

typedef struct {
  char *name;                   /* as in the header, NUL-terminated */
  st_dtype dtype;
  int ndim;                     /* 0 (scalar) .. ST_MAX_DIMS */
  int64_t shape[ST_MAX_DIMS];
  uint64_t numel;
  uint64_t begin, end;          /* byte offsets into the data section */
} st_tensor;

typedef struct st_file st_file;

/* Open and validate `path`. On error the detail names the file and the problem:
 * DPC_ENOENT/DPC_EPERM/DPC_EIO (cannot read), DPC_EFORMAT (bad header). Free with st_close. */
int st_open(const char *path, st_file **out);
/* The same over any source of `size` bytes (an object in a store, read in ranges): rd(ctx, off,
 * dst, n) fills dst with bytes [off, off + n) and returns 0, 1 when the source ends first, or a
 * DPC_E* code with its detail set; it is called once per header field and once per tensor
 * range read, and from several threads only if the caller reads from several. `label` names the
 * source in messages. */
typedef int (*st_read_fn)(void *ctx, uint64_t off, void *dst, size_t n);
int st_open_source(const char *label, uint64_t size, st_read_fn rd, void *ctx, st_file **out);
void st_close(st_file *f);

const char *st_path(const st_file *f);
int st_num_tensors(const st_file *f);
/* Tensors in header (JSON) order; i in [0, st_num_tensors). */
const st_tensor *st_get(const st_file *f, int i);
/* Index of the tensor called `name`, or -1. */
int st_find(const st_file *f, const char *name);
/* Value of a __metadata__ key, or NULL. */
const char *st_metadata(const st_file *f, const char *key);

/* Elements [start, start + n) of tensor i as float: F32 copied, BF16 and F16 converted
 * exactly; other dtypes give DPC_EUNSUPPORTED. Range errors give DPC_EINVAL, short reads
 * (file truncated since it was opened) DPC_EFORMAT. */
int st_read_f32(const st_file *f, int i, uint64_t start, uint64_t n, float *dst);
/* Raw little-endian bytes of tensor i (dst holds end - begin bytes). */
int st_read_raw(const st_file *f, int i, void *dst);

size_t st_dtype_size(st_dtype dt);
const char *st_dtype_name(st_dtype dt);
/* DPC_EFORMAT for an unknown name. */
int st_dtype_parse(const char *s, st_dtype *out);

/* Exact conversions of the 16-bit formats to float. */
float st_bf16_to_f32(uint16_t h);
float st_f16_to_f32(uint16_t h);
/* float -> bf16 with round-to-nearest-even (NaN stays NaN). */
uint16_t st_f32_to_bf16(float f);

/* One tensor to write; `data` holds numel x dtype size little-endian bytes. */
typedef struct {
  const char *name;
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  const void *data;
} st_write_tensor;

/* Write `n` tensors (in this order) and `n_meta` metadata pairs meta[2k] = key,
 * meta[2k+1] = value (may be 0/NULL) atomically to `path`. Names must be unique and
 * non-empty and not "__metadata__". */
int st_write(const char *path, const st_write_tensor *t, int n, const char *const *meta, int n_meta);

#endif
