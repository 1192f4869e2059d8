/* cpu_sgemm_peak.c — the sgemm peaks that tests/bench/cpu_train.sh divides achieved training
 * GFLOP/s by: the best of square float32 products (row-major, no transposes) of a few sizes on
 * the given number of threads, best of several repetitions each, run either by OpenBLAS (its
 * own threads; the kernels it picks at load time, as in every peer of the bench: its CPU
 * detection, or OPENBLAS_CORETYPE when set; "core" names them) or, with the argument
 * "dipaco", by the CPU backend's own product (kernels/cpu/cpu_gemm.h) split into one column
 * block per thread as the backend splits its products. Usage:
 * bench_cpu_sgemm_peak THREADS [REPS] [openblas|dipaco]
 * Prints one JSON line: {"threads", "core", "gflops", "best_n"}. */
#include "kernels/cpu/cpu_gemm.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>
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
  const int own = argc > 3 && strcmp(argv[3], "dipaco") == 0;
  if (threads < 1 || reps < 1 || (argc > 3 && !own && strcmp(argv[3], "openblas") != 0)) {
    fprintf(stderr, "usage: bench_cpu_sgemm_peak THREADS [REPS] [openblas|dipaco]\n");
    return 2;
  }
  const int impl = own ? cpu_gemm_pick() : 0;
  if (own && !impl) {
    fprintf(stderr, "bench_cpu_sgemm_peak: dipaco's product does not run on this CPU (no AVX-512, or "
                    "DIPACO_CPU_GEMM=openblas)\n");
    return 3;
  }
  openblas_set_num_threads(own ? 1 : threads);
  const size_t wsn = cpu_gemm_ws_floats();
  float *ws = aligned_alloc(64, ((sizeof(float) * wsn * threads + 63) / 64) * 64);
  if (!ws) return 1;
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
    for (int r = -1; r < reps; r++) { /* r = -1 warms up */
      double t0 = mono_s();
      if (!own) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      } else {
        const int ch = ((n + threads - 1) / threads + 15) & ~15;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
        for (int t = 0; t < threads; t++) {
          const int lo = t * ch, w = lo + ch < n ? ch : n - lo;
          if (w > 0)
            cpu_gemm(impl, ws + (size_t)omp_get_thread_num() * wsn, 0, 0, n, w, n, 1.0f, a, n, b + lo, n, 0.0f,
                     c + lo, n);
        }
      }
      if (r < 0) continue;
      double g = 2.0 * n * n * (double)n / (mono_s() - t0) / 1e9;
      if (g > best) best = g, best_n = n;
    }
  }
  printf("{\"threads\":%d,\"core\":\"%s\",\"gflops\":%.1f,\"best_n\":%d}\n", threads,
         own ? cpu_gemm_name(impl) : openblas_get_corename(), best, best_n);
  free(ws);
  free(a);
  free(b);
  free(c);
  return 0;
}
