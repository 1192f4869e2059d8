/* gpu_train.c — training throughput of the CUDA backend on GPT-2 124M (L12 NH12 C768 V50257),
 * the dipaco side of tests/bench/gpu_train.sh (its twin is gpu_train_torch.py). Random tokens
 * (throughput does not depend on the data), a few untimed warmup steps, then timed steps of
 * zero_grad + forward + backward + clipped AdamW; prints one JSON line with tokens/s and MFU.
 * MFU uses nanoGPT's estimate (6N + 12 L C T flops per token, N without wpe) against the
 * device's dense bf16 peak (DPC_PEAK_TFLOPS overrides).
 * Usage: gpu_train B T PRECISION(fp32|tf32|bf16) [STEPS] */
#include "common/errors.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/gpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double peak_flops(const char *name) {
  const char *env = getenv("DPC_PEAK_TFLOPS");
  if (env) return atof(env) * 1e12;
  if (strstr(name, "H100") && strstr(name, "PCIe")) return 756e12;
  if (strstr(name, "H100") || strstr(name, "H200") || strstr(name, "H20")) return 989e12;
  if (strstr(name, "A100")) return 312e12;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s B T fp32|tf32|bf16 [STEPS]\n", argv[0]);
    return 2;
  }
  const int B = atoi(argv[1]), T = atoi(argv[2]), steps = argc > 4 ? atoi(argv[4]) : 10, warmup = 3;
  gpt_backend_opts opts = {GPT_BACKEND_CUDA, 0, 0, 0};
  if (gpt_precision_parse(argv[3], &opts.precision)) {
    fprintf(stderr, "%s\n", dpc_errmsg());
    return 2;
  }
  const gpt_config cfg = {.n_layer = 12, .n_head = 12, .n_embd = 768, .n_positions = 1024, .vocab_size = 50257};
  gpt_model *m = NULL;
  int rc = gpt_create(&m, &cfg, &opts, B, T);
  if (rc) {
    fprintf(stderr, "gpt_create: %s: %s\n", dpc_strerror(rc), dpc_errmsg());
    return rc == DPC_EUNSUPPORTED ? 77 : 1;
  }
  const size_t P = m->lay.n_params, N = (size_t)B * T;
  float *params = malloc(P * sizeof(float));
  int *in = malloc((N + 1) * sizeof(int));
  gpt_init_params(&m->lay, params, 1);
  gpt_set_params(m, params, 0, P);
  uint64_t r = 42;
  for (size_t i = 0; i <= N; i++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    in[i] = (int)((r >> 33) % (uint64_t)cfg.vocab_size);
  }
  const gpt_adamw_hparams hp = {0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  double t0 = 0;
  float loss = 0, norm = 0;
  for (int s = 0; s < warmup + steps; s++) {
    if (s == warmup) t0 = now();
    if ((rc = gpt_zero_grad(m)) || (rc = gpt_forward(m, in, in + 1, B, T, &loss)) || (rc = gpt_backward(m)) ||
        (rc = gpt_adamw_step(m, &hp, 6e-4f, s + 1, &norm))) {
      fprintf(stderr, "step %d: %s: %s\n", s, dpc_strerror(rc), dpc_errmsg());
      return 1;
    }
  }
  const double dt = (now() - t0) / steps; /* adamw_step synchronizes (it reads the norm) */
  char name[128] = "?";
  cudak_device_info(0, name, sizeof name, NULL, NULL);
  const double nparams = (double)P - (double)cfg.n_positions * cfg.n_embd;
  const double fpt = 6.0 * nparams + 12.0 * cfg.n_layer * cfg.n_embd * T;
  const double tps = N / dt, peak = peak_flops(name);
  printf("{\"impl\": \"dipaco\", \"precision\": \"%s\", \"B\": %d, \"T\": %d, \"ms_per_step\": %.2f, "
         "\"tokens_per_s\": %.0f, \"mfu\": %.4f, \"loss\": %.4f, \"device\": \"%s\"}\n",
         argv[3], B, T, dt * 1e3, tps, peak > 0 ? tps * fpt / peak : 0.0, loss, name);
  gpt_free(m);
  free(params);
  free(in);
  return 0;
}
