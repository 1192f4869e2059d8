/* cpu_kernels.c — micro-benchmark of one CPU train step (zero_grad, forward, backward, clipped
 * AdamW) of the GPT-2 backend; twin of tests/bench/cpu_kernels_torch.py for PyTorch eager.
 * Usage: bench_cpu_kernels [L NH C V B T threads steps]   (defaults 6 6 384 256 8 256 2 5)
 * OpenBLAS picks its kernels at load time: OpenBLAS 0.3.21 picks AVX-512 ("Cooperlake") ones on
 * Zen 5, and OPENBLAS_CORETYPE in the environment (e.g. Haswell: AVX2) overrides that. */
#include "common/errors.h"
#include "kernels/gpt.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int a[8] = {6, 6, 384, 256, 8, 256, 2, 5};
  for (int i = 1; i < argc && i <= 8; i++) a[i - 1] = atoi(argv[i]);
  const int L = a[0], NH = a[1], C = a[2], V = a[3], B = a[4], T = a[5], threads = a[6], steps = a[7];
  gpt_config cfg = {L, NH, C, T, V};
  gpt_backend_opts opts = {GPT_BACKEND_CPU, threads, 0, 0};
  gpt_model *m = NULL;
  if (gpt_create(&m, &cfg, &opts, B, T) != 0 || steps < 1) {
    fprintf(stderr, "bench: %s\n", dpc_errmsg());
    return 1;
  }
  float *p = malloc(m->lay.n_params * sizeof(float));
  int *in = malloc((size_t)B * T * sizeof(int)), *tg = malloc((size_t)B * T * sizeof(int));
  if (!p || !in || !tg) return 1;
  gpt_init_params(&m->lay, p, 1);
  gpt_set_params(m, p, 0, m->lay.n_params);
  unsigned s = 1;
  for (int i = 0; i < B * T; i++) {
    s = s * 1103515245u + 12345u;
    in[i] = (int)((s >> 8) % (unsigned)V);
    tg[i] = (int)((s >> 16) % (unsigned)V);
  }
  gpt_adamw_hparams hp = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  double tf = 0, tb = 0, to = 0, best = 1e30;
  float loss = 0, norm = 0;
  for (int it = 0; it <= steps; it++) { /* step 0 warms up */
    double t0 = now();
    gpt_zero_grad(m);
    gpt_forward(m, in, tg, B, T, &loss);
    double t1 = now();
    gpt_backward(m);
    double t2 = now();
    gpt_adamw_step(m, &hp, 1e-4f, it + 1, &norm);
    double t3 = now();
    if (it > 0) {
      tf += t1 - t0;
      tb += t2 - t1;
      to += t3 - t2;
      if (t3 - t0 < best) best = t3 - t0;
    }
  }
  double step = (tf + tb + to) / steps;
  printf("c  [openblas %s] L=%d NH=%d C=%d V=%d B=%d T=%d threads=%d params=%zu: %.1f ms/step (fwd %.1f bwd %.1f adamw %.1f) "
         "%.0f tok/s, best step %.1f ms = %.0f tok/s, loss %.4f\n",
         openblas_get_corename(), L, NH, C, V, B, T, threads, m->lay.n_params, step * 1e3, tf / steps * 1e3, tb / steps * 1e3,
         to / steps * 1e3, B * T / step, best * 1e3, B * T / best, loss);
  gpt_free(m);
  free(p);
  free(in);
  free(tg);
  return 0;
}
