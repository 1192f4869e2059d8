/* outerio_bench.c — the streamed outer step (coordinator/outerio.h) against a plain in-memory
 * pass of the same math (outer_average of R deltas + Nesterov), in one process, interleaved,
 * best of N; for several range sizes. The blobs live in a temporary state directory (page
 * cache), so the step's time includes reading, checksumming, writing and the fsync of the new
 * parameters and momentum.
 *   outerio_bench [MiB per array, default 256] [R, default 4] [repetitions, default 3] [DIR] */
#include "coordinator/blobs.h"
#include "coordinator/outerio.h"
#include "kernels/outer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 256;
  int R = argc > 2 ? atoi(argv[2]) : 4, reps = argc > 3 ? atoi(argv[3]) : 3;
  char dir[256];
  snprintf(dir, sizeof dir, "%s/outerio_bench_XXXXXX", argc > 4 ? argv[4] : "/var/tmp");
  if (R < 1 || R > 64 || !mkdtemp(dir)) return 2;
  size_t n = mib << 20 >> 2;
  blob_store *bs;
  if (blob_store_open(dir, &bs)) return 1;
  float *theta = malloc(n * 4), *u = malloc(n * 4), *avg = malloc(n * 4), **d = calloc((size_t)R, sizeof *d);
  char (*names)[BLOB_NAME_MAX] = calloc((size_t)R, sizeof *names);
  uint32_t *crcs = calloc((size_t)R, sizeof *crcs);
  for (size_t j = 0; j < n; j++) theta[j] = 0.01f * (float)(j & 127), u[j] = 0;
  for (int i = 0; i < R; i++) {
    d[i] = malloc(n * 4);
    for (size_t j = 0; j < n; j++) d[i][j] = 1e-6f * (float)((j + (size_t)i) & 255);
    snprintf(names[i], BLOB_NAME_MAX, "1/f0-v0-a%d.delta", i + 1);
    if (blob_write(bs, names[i], BLOB_DELTA, d[i], n, &crcs[i])) return 1;
  }
  if (blob_write(bs, "1/f0-v0.params", BLOB_PARAMS, theta, n, NULL) ||
      blob_write(bs, "1/f0-v0.momentum", BLOB_MOMENTUM, u, n, NULL))
    return 1;
  const size_t ranges[] = {1u << 13, 1u << 15, 1u << 18, 1u << 20};
  const int nr = (int)(sizeof ranges / sizeof ranges[0]);
  double best_mem = 1e30, best[8];
  for (int k = 0; k < nr; k++) best[k] = 1e30;
  for (int rep = 0; rep < reps; rep++) {
    double t0 = now();
    outer_average((const float *const *)d, NULL, R, n, avg);
    outer_nesterov_step(theta, u, avg, n, 0.7f, 0.9f, 1);
    double t = now() - t0;
    if (t < best_mem) best_mem = t;
    for (int k = 0; k < nr; k++) {
      outerio_sync a = {.bs = bs, .len = n, .range_floats = ranges[k], .param_blob = "1/f0-v0.params",
                        .momentum_blob = "1/f0-v0.momentum", .n = R, .delta_blobs = (const char (*)[BLOB_NAME_MAX])names,
                        .delta_crcs = crcs, .lr = 0.7f, .mu = 0.9f, .nesterov = 1, .new_param = "1/f0-v1.params",
                        .new_momentum = "1/f0-v1.momentum"};
      uint32_t pc, mc;
      t0 = now();
      if (outerio_sync_step(&a, &pc, &mc)) return 1;
      t = now() - t0;
      if (t < best[k]) best[k] = t;
    }
  }
  printf("%zu MiB per array, R = %d, best of %d: memory pass %.3f s\n", mib, R, reps, best_mem);
  for (int k = 0; k < nr; k++)
    printf("streamed outer step, ranges of %7zu floats: %.3f s = %.2f x the memory pass\n", ranges[k], best[k],
           best[k] / best_mem);
  blob_store_close(bs);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) != 0;
}
