/* outer_bench.c — throughput of the outer-optimizer kernels against memcpy of the same
 * parameter bytes (run by tests/bench/outer_step.sh on a Release build).
 *
 *   outer_bench [MiB of parameters, default 256] [repetitions, default 5]
 *
 * Prints, per kernel, the best time, "param GB/s" (parameter bytes updated per second) and
 * "traffic GB/s" (bytes the kernel must read + write per second), and the ratios to memcpy. */
#include "kernels/outer.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float *alloc_touch(size_t n, float v) {
  float *p = malloc(n * sizeof *p);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) p[i] = v + (float)(i & 1023) * 1e-6f;
  return p;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 256;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  size_t n = mib * 1024 * 1024 / sizeof(float);
  size_t bytes = n * sizeof(float);
  float *src = alloc_touch(n, 1.0f), *dst = alloc_touch(n, 0.0f);
  float *theta = alloc_touch(n, 0.5f), *u = alloc_touch(n, 0.0f), *avg = alloc_touch(n, 1e-3f);
  float *d1 = alloc_touch(n, 2e-3f), *d2 = alloc_touch(n, 3e-3f);

  double t_copy = 1e30, t_nest = 1e30, t_avg = 1e30, t_dn = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    memcpy(dst, src, bytes);
    double t1 = now();
    outer_nesterov_step(theta, u, avg, n, 0.7f, 0.9f, 1);
    double t2 = now();
    const float *ds[3] = {avg, d1, d2};
    double w[3] = {1, 2, 3};
    if (outer_average(ds, w, 3, n, dst) != 0) return 1;
    double t3 = now();
    outer_dn_state s;
    outer_dn_init(&s, d1, d2, n, 4, 0.0, r, 0); /* buf/m reuse d1/d2: timing only */
    outer_dn_apply(&s, theta, avg, 0.7f, 0.9f);
    double t4 = now();
    if (t1 - t0 < t_copy) t_copy = t1 - t0;
    if (t2 - t1 < t_nest) t_nest = t2 - t1;
    if (t3 - t2 < t_avg) t_avg = t3 - t2;
    if (t4 - t3 < t_dn) t_dn = t4 - t3;
  }
  const double GB = 1e9;
  printf("params: %zu MiB (%zu floats), OpenMP threads: %d, best of %d\n", mib, n, omp_get_max_threads(), reps);
  printf("%-26s %9s %14s %16s\n", "kernel", "ms", "param GB/s", "traffic GB/s");
  /* Traffic counts the streams each kernel must move: memcpy 1 read + 1 write; Nesterov
   * reads θ, u, Δ̄ and writes θ, u; average of 3 reads 3 and writes 1; DN (buffering step)
   * reads θ, buf, m, g and writes θ, buf. */
  printf("%-26s %9.2f %14.2f %16.2f\n", "memcpy", t_copy * 1e3, bytes / t_copy / GB, 2.0 * bytes / t_copy / GB);
  printf("%-26s %9.2f %14.2f %16.2f\n", "outer_nesterov_step", t_nest * 1e3, bytes / t_nest / GB, 5.0 * bytes / t_nest / GB);
  printf("%-26s %9.2f %14.2f %16.2f\n", "outer_average (3 deltas)", t_avg * 1e3, bytes / t_avg / GB, 4.0 * bytes / t_avg / GB);
  printf("%-26s %9.2f %14.2f %16.2f\n", "outer_dn_apply (buffer)", t_dn * 1e3, bytes / t_dn / GB, 6.0 * bytes / t_dn / GB);
  printf("nesterov/memcpy ratio: traffic %.2f (goal >= 0.7), param bytes %.2f\n",
         (5.0 * bytes / t_nest) / (2.0 * bytes / t_copy), t_copy / t_nest);
  free(src);
  free(dst);
  free(theta);
  free(u);
  free(avg);
  free(d1);
  free(d2);
  return 0;
}
