/* oracle_files.h — what the two whole-model oracle tests (test_cpu_oracle.c for GPT-2,
 * test_llama_oracle.c for the Llama family) share: a scratch folder the C side and the PyTorch
 * oracle exchange raw files in, a seeded normal generator for the inputs, and the per-tensor
 * comparison max|a - b| / max|b|. Header-only, included by one test file each. */
#ifndef DPC_TEST_ORACLE_FILES_H
#define DPC_TEST_ORACLE_FILES_H

#include "kernels/gpt.h"
#include "tests/unit/test.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static uint64_t rng = 0x1234567ull;
static uint32_t next_u32(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}
static float next_normal(void) {
  double u1 = (next_u32() + 1.0) / 4294967297.0, u2 = next_u32() / 4294967296.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static int write_file(const char *name, const void *p, size_t bytes) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(p, 1, bytes, f);
  return fclose(f) == 0 && w == bytes ? 0 : -1;
}

/* Reads exactly `n` floats of an oracle output; -1 if missing or of another size. */
static int read_floats(const char *name, float *p, size_t n) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t r = fread(p, sizeof(float), n, f);
  int extra = fgetc(f) != EOF;
  fclose(f);
  return r == n && !extra ? 0 : -1;
}

static void remove_dir(void) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[512];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

static double rel_err(const float *a, const float *b, size_t n) {
  double md = 0.0, mb = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= md)) md = d; /* NaN sticks */
    if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
  }
  return mb > 0.0 ? md / mb : md;
}

/* Compare every tensor of the layout; report the worst one always and each failing one. */
static void compare_tensors(const gpt_layout *lay, const char *what, const float *got, const float *want, double tol) {
  double worst = 0.0;
  int worst_k = 0;
  for (int k = 0; k < lay->n_tensors; k++) {
    const gpt_tensor *t = &lay->tensors[k];
    double e = rel_err(got + t->offset, want + t->offset, t->numel);
    test_checks++;
    if (!(e <= tol)) {
      test_failures++;
      fprintf(stderr, "FAIL %s %s: max rel err %.3g > %g\n", what, t->name, e, tol);
    }
    if (!(e <= worst)) {
      worst = e;
      worst_k = k;
    }
  }
  fprintf(stderr, "%-14s worst tensor %-44s rel err %.3g\n", what, lay->tensors[worst_k].name, worst);
}

#endif
