/* fuzz_safetensors.c — libFuzzer target: a safetensors file (common/safetensors.c).
 * The input is the whole file. When st_open accepts it, the invariants its header comment
 * promises are checked (tensors tile the data section, sizes = numel x dtype size, names are
 * found again), every tensor is read raw and, for float dtypes, as f32, and writing the
 * tensors back with st_write gives a file that opens to the same tensors and bytes. */
#include "util.h"

#include "common/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  return 0;
}

/* st_write the tensors of f (data section at `sec`) and check the copy reads back the same. */
static void rewrite(const st_file *f, const uint8_t *sec) {
  int n = st_num_tensors(f);
  st_write_tensor w[64];
  for (int i = 0; i < n; i++) {
    const st_tensor *t = st_get(f, i);
    w[i] = (st_write_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = sec + t->begin};
    memcpy(w[i].shape, t->shape, sizeof w[i].shape);
  }
  char path[300];
  snprintf(path, sizeof path, "%s/copy.safetensors", fz_dir());
  if (st_write(path, w, n, NULL, 0) != 0) fz_fail("st_write of accepted tensors failed");
  st_file *g;
  if (st_open(path, &g) != 0) fz_fail("written copy does not open");
  if (st_num_tensors(g) != n) fz_fail("copy has %d tensors, not %d", st_num_tensors(g), n);
  for (int i = 0; i < n; i++) {
    const st_tensor *a = st_get(f, i), *b = st_get(g, i);
    if (strcmp(a->name, b->name) != 0 || a->dtype != b->dtype || a->ndim != b->ndim ||
        memcmp(a->shape, b->shape, sizeof a->shape) != 0 || a->end - a->begin != b->end - b->begin)
      fz_fail("copy differs at tensor %d", i);
    size_t nb = (size_t)(b->end - b->begin);
    unsigned char *raw = malloc(nb ? nb : 1);
    if (st_read_raw(g, i, raw) != 0 || (nb && memcmp(raw, sec + a->begin, nb) != 0)) fz_fail("copy data %d", i);
    free(raw);
  }
  st_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  st_file *f;
  if (st_open(fz_memfile(data, size), &f) != 0) return 0;
  if (size < 8) fz_fail("accepted a %zu-byte file", size);
  uint64_t hlen = 0;
  for (int k = 0; k < 8; k++) hlen |= (uint64_t)data[k] << (8 * k);
  if (hlen > size - 8) fz_fail("header length %llu beyond the file", (unsigned long long)hlen);
  uint64_t data_bytes = size - 8 - hlen;
  int n = st_num_tensors(f);
  if (n < 0) fz_fail("negative tensor count");
  uint64_t covered = 0;
  for (int i = 0; i < n; i++) {
    const st_tensor *t = st_get(f, i);
    if (!t || !t->name) fz_fail("tensor %d missing", i);
    if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) fz_fail("ndim %d", t->ndim);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      if (t->shape[d] < 0) fz_fail("negative dim");
      numel *= (uint64_t)t->shape[d];
    }
    if (numel != t->numel) fz_fail("numel %llu != product of shape", (unsigned long long)t->numel);
    if (t->begin > t->end || t->end > data_bytes) fz_fail("tensor %d range outside the data", i);
    if ((t->end - t->begin) != t->numel * st_dtype_size(t->dtype)) fz_fail("tensor %d size", i);
    covered += t->end - t->begin;
    int j = st_find(f, t->name);
    if (j < 0 || strcmp(st_get(f, j)->name, t->name) != 0) fz_fail("st_find(%s) = %d", t->name, j);
    size_t nb = (size_t)(t->end - t->begin);
    unsigned char *raw = malloc(nb ? nb : 1);
    if (st_read_raw(f, i, raw) != 0) fz_fail("st_read_raw %d failed on a valid file", i);
    if (nb && memcmp(raw, data + 8 + hlen + t->begin, nb) != 0) fz_fail("st_read_raw %d differs", i);
    free(raw);
    if (t->dtype == ST_F32 || t->dtype == ST_BF16 || t->dtype == ST_F16) {
      float *v = malloc(t->numel ? t->numel * sizeof(float) : 1);
      if (st_read_f32(f, i, 0, t->numel, v) != 0) fz_fail("st_read_f32 %d failed", i);
      if (t->numel && st_read_f32(f, i, t->numel, 1, v) == 0) fz_fail("read past the end accepted");
      free(v);
    }
  }
  if (n > 0 && n <= 64) rewrite(f, data + 8 + hlen);
  if (covered != data_bytes) fz_fail("tensors cover %llu of %llu data bytes", (unsigned long long)covered,
                                     (unsigned long long)data_bytes);
  (void)st_metadata(f, "format");
  (void)st_find(f, "__metadata__");
  st_close(f);
  return 0;
}
