/* muon_step.c — what Muon's inner step costs on the CPU backend (docs/benchmarks.md §11):
 * one gpt_muon_step against one gpt_adamw_step, and against one forward + backward, at a
 * given GPT-2 size (default 124M: L 12, NH 12, C 768, V 50257, n_positions 1024).
 *
 *   bench_muon_step [threads, default all] [B, default 8] [T, default 1024] [L NH C]
 *
 * Gradients come from one real forward + backward on random tokens; each optimizer is then
 * timed over a few steps (the best is printed). Run on a Release build. */
#include "common/errors.h"
#include "kernels/gpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 0, B = argc > 2 ? atoi(argv[2]) : 8, T = argc > 3 ? atoi(argv[3]) : 1024;
  gpt_config cfg = {.n_layer = argc > 4 ? atoi(argv[4]) : 12, .n_head = argc > 5 ? atoi(argv[5]) : 12,
                    .n_embd = argc > 6 ? atoi(argv[6]) : 768, .n_positions = 1024, .vocab_size = 50257};
  gpt_backend_opts bo = {.kind = GPT_BACKEND_CPU, .threads = threads};
  gpt_model *m = NULL;
  if (gpt_create(&m, &cfg, &bo, B, T)) {
    fprintf(stderr, "bench_muon_step: %s\n", dpc_errmsg());
    return 1;
  }
  float *p = malloc(m->lay.n_params * sizeof *p);
  int *x = malloc((size_t)B * T * sizeof *x), *y = malloc((size_t)B * T * sizeof *y);
  if (!p || !x || !y) return 1;
  gpt_init_params(&m->lay, p, 1);
  gpt_set_params(m, p, 0, m->lay.n_params);
  srand(1);
  for (int i = 0; i < B * T; i++) x[i] = rand() % cfg.vocab_size, y[i] = rand() % cfg.vocab_size;
  float loss = 0;
  double t0 = now();
  if (gpt_forward(m, x, y, B, T, &loss) || gpt_zero_grad(m) || gpt_backward(m)) {
    fprintf(stderr, "bench_muon_step: %s\n", dpc_errmsg());
    return 1;
  }
  const double fb = now() - t0;
  char name[256];
  gpt_describe(m, name, sizeof name, NULL);
  gpt_adamw_hparams hp = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  gpt_muon_hparams mu = {.momentum = 0.95f, .weight_decay = 0.1f, .nesterov = 1, .ns_steps = 5};
  double best_a = 1e30, best_m = 1e30;
  for (int r = 0; r < 3; r++) {
    t0 = now();
    if (gpt_adamw_step(m, &hp, 3e-4f, r + 1, NULL)) return 1;
    double dt = now() - t0;
    if (dt < best_a) best_a = dt;
  }
  for (int r = 0; r < 2; r++) {
    t0 = now();
    if (gpt_muon_step(m, &hp, &mu, 3e-4f, 0.02f, r + 1, NULL)) {
      fprintf(stderr, "bench_muon_step: %s\n", dpc_errmsg());
      return 1;
    }
    double dt = now() - t0;
    if (dt < best_m) best_m = dt;
  }
  printf("GPT-2 L%d NH%d C%d (%.1fM parameters) on %s\n", cfg.n_layer, cfg.n_head, cfg.n_embd, m->lay.n_params / 1e6,
         name);
  printf("forward + backward, B %d x T %d: %.3f s\n", B, T, fb);
  printf("AdamW step: %.3f s;  Muon step (ns_steps 5, + AdamW on the rest): %.3f s;  Muon / AdamW %.1fx;  "
         "Muon step / (forward + backward) %.2f\n", best_a, best_m, best_m / best_a, best_m / fb);
  gpt_free(m);
  free(p);
  free(x);
  free(y);
  return 0;
}
