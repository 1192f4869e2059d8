/* cpu_sgemm_peak.c — the sgemm peak that tests/bench/cpu_train.sh divides achieved training
 * GFLOP/s by: OpenBLAS's own best, square float32 products (row-major, no transposes) of a
 * few sizes on the given number of OpenBLAS threads, best of several repetitions each. The
 * kernels are the ones OpenBLAS picks at load time, as in every peer of the bench (its CPU
 * detection, or OPENBLAS_CORETYPE when set); "core" names them. Usage: bench_cpu_sgemm_peak
 * THREADS [REPS]
 * Prints one JSON line: {"threads", "core", "gflops", "best_n"}. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int num_threads);

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 5;
  if (threads < 1 || reps < 1) {
    fprintf(stderr, "usage: bench_cpu_sgemm_peak THREADS [REPS]\n");
    return 2;
  }
  openblas_set_num_threads(threads);
  static const int sizes[] = {1024, 1536, 2048, 3072};
  const int nmax = 3072;
  float *a = aligned_alloc(64, sizeof(float) * nmax * nmax), *b = aligned_alloc(64, sizeof(float) * nmax * nmax);
  float *c = aligned_alloc(64, sizeof(float) * nmax * nmax);
  if (!a || !b || !c) return 1;
  for (int i = 0; i < nmax * nmax; i++) {
    a[i] = (float)(i % 17) * 0.01f;
    b[i] = (float)(i % 13) * 0.01f;
  }
  double best = 0.0;
  int best_n = 0;
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    const int n = sizes[k];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm */
    for (int r = 0; r < reps; r++) {
      double t0 = mono_s();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      double g = 2.0 * n * n * (double)n / (mono_s() - t0) / 1e9;
      if (g > best) best = g, best_n = n;
    }
  }
  printf("{\"threads\":%d,\"core\":\"%s\",\"gflops\":%.1f,\"best_n\":%d}\n", threads, openblas_get_corename(), best,
         best_n);
  free(a);
  free(b);
  free(c);
  return 0;
}
