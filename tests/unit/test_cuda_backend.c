/* test_cuda_backend.c — the whole CUDA backend against the CPU backend on the same model, a
 * GPT-2 and two Llama-class ones (tied embeddings with grouped-query attention; untied with
 * q/k/v biases and llama3 RoPE scaling): loss, logits, the final hidden state, every gradient
 * tensor and, after 5 clipped AdamW steps, parameters and both moments. fp32 must agree to max|a - b| <= 1e-4 of
 * max|b| per tensor (the state after the steps: of the model's max|b|, see compare_state); tf32 and bf16 to 1% on
 * every loss (their products round inputs to 10 and 7 mantissa bits). Also: two fp32 runs are
 * bit-identical, a smaller (B, T) than the model's works, misuse is refused as on the CPU,
 * and the state get/set round trip. Without a GPU it prints why and exits 77 (skipped). */
#include "common/errors.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/gpt.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <string.h>

/* L, NH, C, maxT, V: C = 80 is not a multiple of 32, T = 70 spans partial blocks. */
static const gpt_config CFG = {.n_layer = 2, .n_head = 4, .n_embd = 80, .n_positions = 72, .vocab_size = 211};
/* {L, NH, C, maxT, V, arch, NKV, I, tied, bias, rope_scaling, orig_max, eps, theta, factor, low, high}:
 * head size 20 and 16, I not a multiple of 32, two query heads per KV head in the first. */
static const gpt_config LLAMA_TIED_GQA = {2, 4, 80, 72, 211, GPT_ARCH_LLAMA, 2, 100, 1, 0, GPT_ROPE_DEFAULT, 0,
                                          1e-5, 10000.0, 0, 0, 0};
static const gpt_config LLAMA_UNTIED_BIAS = {2, 4, 64, 72, 211, GPT_ARCH_LLAMA, 4, 72, 0, 1, GPT_ROPE_LLAMA3, 16,
                                             1e-6, 500000.0, 8.0, 1.0, 4.0};
static const gpt_config *cfg = &CFG; /* the model under test */
/* eps 1e-6: see tests/unit/test_cpu_oracle.c (AdamW amplifies rounding noise of zero grads). */
static const gpt_adamw_hparams HP = {0.9f, 0.95f, 1e-6f, 0.1f, 1.0f};
enum { B = 3, T = 70, STEPS = 5 };
static int in[STEPS][B * T], tg[STEPS][B * T];
static int use_muon; /* run(): Muon + AdamW steps (MU) instead of AdamW */
static const gpt_muon_hparams MU = {0.95f, 0.05f, 1, 5, GPT_MUON_ADJUST_ORIGINAL};

typedef struct {
  float *p, *g, *m, *v, *logits, *hidden; /* hidden: (b, t) = (1, 5) of the first forward */
  float losses[STEPS], norms[STEPS], loss0;
} run_out;

static uint64_t rng = 77;
static uint32_t next_u32(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}

/* Grad at the init (kept in o->g, with batch 0's logits), then STEPS AdamW steps. */
static int run(gpt_backend_kind kind, int precision, run_out *o) {
  gpt_backend_opts opts = {kind, 2, 0, precision};
  gpt_model *m = NULL;
  int rc = gpt_create(&m, cfg, &opts, B, T);
  if (rc) return rc;
  const size_t P = m->lay.n_params, NV = (size_t)B * T * cfg->vocab_size;
  o->p = malloc(P * 4), o->g = malloc(P * 4), o->m = malloc(P * 4), o->v = malloc(P * 4), o->logits = malloc(NV * 4);
  o->hidden = malloc((size_t)cfg->n_embd * 4);
  gpt_init_params(&m->lay, o->p, 3);
  for (size_t i = 0; i < P; i++) o->p[i] *= 3.0f; /* sharper attention than the 0.02 init */
  rc = gpt_set_params(m, o->p, 0, P);
  if (!rc) rc = gpt_zero_grad(m);
  if (!rc) rc = gpt_forward(m, in[0], tg[0], B, T, &o->loss0);
  for (int b = 0; b < B && !rc; b++)
    for (int t = 0; t < T && !rc; t++) rc = gpt_logits(m, b, t, o->logits + ((size_t)b * T + t) * cfg->vocab_size);
  if (!rc) rc = gpt_hidden(m, 1, 5, o->hidden);
  if (!rc) rc = gpt_backward(m);
  if (!rc) rc = gpt_get_grads(m, o->g, 0, P);
  for (int s = 0; s < STEPS && !rc; s++) {
    rc = gpt_zero_grad(m);
    if (!rc) rc = gpt_forward(m, in[s], tg[s], B, T, &o->losses[s]);
    if (!rc) rc = gpt_backward(m);
    const float lr = gpt_lr_at(3e-3f, 2, STEPS, 0.1f, s);
    if (!rc && use_muon) rc = gpt_muon_step(m, &HP, &MU, lr, lr * (0.02f / 3e-3f), s + 1, &o->norms[s]);
    else if (!rc) rc = gpt_adamw_step(m, &HP, lr, s + 1, &o->norms[s]);
  }
  if (!rc) rc = gpt_get_params(m, o->p, 0, P);
  if (!rc) rc = gpt_get_opt_state(m, o->m, o->v);
  gpt_free(m);
  return rc;
}

static void free_out(run_out *o) {
  free(o->p), free(o->g), free(o->m), free(o->v), free(o->logits), free(o->hidden);
}

static double rel_err(const float *a, const float *b, size_t n) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= md)) md = d;
    if (fabs(b[i]) > mb) mb = fabs(b[i]);
  }
  return mb > 0 ? md / mb : md;
}

/* Per tensor, max|a - b| over a scale: the tensor's own max|b| (gradients), or the whole
 * model's (the state after STEPS optimizer steps). The state needs the model's scale because
 * AdamW divides each gradient by its own RMS: where a gradient is nearly zero (the key bias,
 * whose gradient vanishes in exact arithmetic since softmax ignores a shift shared by a row's
 * scores; GPT-2's c_attn bias holds it too), the backends' different summation orders become
 * step-sized differences in a tensor that is itself only a few steps large. On the model's
 * scale a wrong update (about lr = 3e-3 against weights near 1) still fails by 30 times. */
static void compare_scaled(const gpt_layout *lay, const char *what, const float *got, const float *want, double tol,
                           int model_scale) {
  double worst = 0, scale = 0;
  int wk = 0;
  for (size_t i = 0; model_scale && i < lay->n_params; i++)
    if (fabs(want[i]) > scale) scale = fabs(want[i]);
  for (int k = 0; k < lay->n_tensors; k++) {
    const gpt_tensor *t = &lay->tensors[k];
    double e = rel_err(got + t->offset, want + t->offset, t->numel);
    if (model_scale && scale > 0) {
      double mb = 0;
      for (size_t i = 0; i < t->numel; i++)
        if (fabs(want[t->offset + i]) > mb) mb = fabs(want[t->offset + i]);
      if (mb > 0) e = e * mb / scale;
    }
    test_checks++;
    if (!(e <= tol)) {
      test_failures++;
      fprintf(stderr, "FAIL %s %s: rel err %.3g > %g\n", what, t->name, e, tol);
    }
    if (!(e <= worst)) worst = e, wk = k;
  }
  fprintf(stderr, "%-10s worst %-26s rel err %.3g%s\n", what, lay->tensors[wk].name, worst,
          model_scale ? " (of the model's max)" : "");
}

static void compare(const gpt_layout *lay, const char *what, const float *got, const float *want, double tol) {
  compare_scaled(lay, what, got, want, tol, 0);
}

/* The optimizer state after STEPS steps, on the model's scale (see compare_scaled): parameters
 * to 1e-4; the moments to 3e-4, since their last term is a gradient taken at parameters that
 * already differ (an H200 gave 1.1e-4 for Muon's embedding moment; a wrong beta or a missed
 * term is off by percents). */
static void compare_state(const gpt_layout *lay, const char *what, const float *got, const float *want) {
  compare_scaled(lay, what, got, want, strstr(what, "params") ? 1e-4 : 3e-4, 1);
}

static void misuse(void) {
  gpt_backend_opts opts = {GPT_BACKEND_CUDA, 0, 0, GPT_PREC_FP32};
  gpt_model *m = NULL;
  CHECK_EQ_INT(gpt_create(&m, &CFG, &opts, B, T), 0);
  if (!m) return;
  float loss, *row = malloc(CFG.vocab_size * 4);
  CHECK_EQ_INT(gpt_backward(m), DPC_ESTATE);
  CHECK_EQ_INT(gpt_logits(m, 0, 0, row), DPC_ESTATE);
  CHECK_EQ_INT(gpt_forward(m, in[0], NULL, B, T, &loss), 0);
  CHECK_EQ_INT(gpt_backward(m), DPC_ESTATE); /* nothing to differentiate */
  CHECK_EQ_INT(gpt_logits(m, B, 0, row), DPC_ERANGE);
  /* A smaller batch and sequence than the model was built for. */
  CHECK_EQ_INT(gpt_forward(m, in[0], tg[0], 2, 33, &loss), 0);
  CHECK(isfinite(loss) && loss > 0);
  CHECK_EQ_INT(gpt_backward(m), 0);
  CHECK_EQ_INT(gpt_backward(m), DPC_ESTATE);
  /* Optimizer state round trip and reset. */
  const size_t P = m->lay.n_params;
  float *a = malloc(P * 4), *b = malloc(P * 4), *c = malloc(P * 4), *d = malloc(P * 4);
  for (size_t i = 0; i < P; i++) a[i] = (float)i, b[i] = (float)(P - i);
  CHECK_EQ_INT(gpt_set_opt_state(m, a, b), 0);
  CHECK_EQ_INT(gpt_get_opt_state(m, c, d), 0);
  CHECK(memcmp(a, c, P * 4) == 0 && memcmp(b, d, P * 4) == 0);
  CHECK_EQ_INT(gpt_reset_opt_state(m), 0);
  CHECK_EQ_INT(gpt_get_opt_state(m, c, d), 0);
  int nz = 0;
  for (size_t i = 0; i < P; i++) nz += c[i] != 0.0f || d[i] != 0.0f;
  CHECK_EQ_INT(nz, 0);
  gpt_free(m);
  free(row), free(a), free(b), free(c), free(d);
  /* Bad options are refused with a reason. */
  opts.precision = 7;
  CHECK_EQ_INT(gpt_create(&m, &CFG, &opts, B, T), DPC_EINVAL);
  opts.precision = GPT_PREC_FP32;
  opts.device = 99;
  CHECK_EQ_INT(gpt_create(&m, &CFG, &opts, B, T), DPC_EINVAL);
}

/* A smaller (B, T) than the model was built for: the loss and the gradients agree with the
 * CPU's (per-layer buffers are indexed with the call's B and T, the RoPE table by n mod T). */
static void small_batch(void) {
  gpt_model *mc = NULL, *mg = NULL;
  gpt_backend_opts oc = {GPT_BACKEND_CPU, 2, 0, 0}, og = {GPT_BACKEND_CUDA, 0, 0, GPT_PREC_FP32};
  CHECK_EQ_INT(gpt_create(&mc, cfg, &oc, B, T), 0);
  CHECK_EQ_INT(gpt_create(&mg, cfg, &og, B, T), 0);
  if (mc && mg) {
    const size_t P = mc->lay.n_params;
    float *p = malloc(P * 4), *gc = malloc(P * 4), *gg = malloc(P * 4), lc = 0, lg = 0;
    gpt_init_params(&mc->lay, p, 5);
    gpt_model *ms[2] = {mc, mg};
    float *ls[2] = {&lc, &lg}, *gs[2] = {gc, gg};
    for (int i = 0; i < 2; i++) {
      CHECK_EQ_INT(gpt_set_params(ms[i], p, 0, P), 0);
      CHECK_EQ_INT(gpt_zero_grad(ms[i]), 0);
      CHECK_EQ_INT(gpt_forward(ms[i], in[1], tg[1], 2, 33, ls[i]), 0);
      CHECK_EQ_INT(gpt_backward(ms[i]), 0);
      CHECK_EQ_INT(gpt_get_grads(ms[i], gs[i], 0, P), 0);
    }
    fprintf(stderr, "B=2 T=33: loss %.7f (cpu %.7f), grads rel err %.3g\n", lg, lc, rel_err(gg, gc, P));
    CHECK(fabs(lg - lc) <= 1e-4 * lc);
    CHECK(rel_err(gg, gc, P) <= 1e-4);
    free(p), free(gc), free(gg);
  }
  gpt_free(mc);
  gpt_free(mg);
}

/* One model against the CPU backend: fp32 to 1e-4, a bit-identical rerun, tf32 and bf16. */
/* Muon (cuda_muon.cu) against the CPU backend's: fp32 parameters and state after STEPS steps
 * to 1e-4; bf16 Newton-Schulz (PyTorch's precision) losses within 1%. */
static void check_muon(const gpt_layout *lay, const run_out *cpu_adamw) {
  run_out cpu = {0}, gpu = {0}, bf = {0};
  use_muon = 1;
  CHECK_EQ_INT(run(GPT_BACKEND_CPU, 0, &cpu), 0);
  CHECK_EQ_INT(run(GPT_BACKEND_CUDA, GPT_PREC_FP32, &gpu), 0);
  CHECK(memcmp(cpu.p, cpu_adamw->p, lay->n_params * 4) != 0); /* Muon changed the outcome */
  compare_state(lay, "muon params@5", gpu.p, cpu.p);
  compare_state(lay, "muon m", gpu.m, cpu.m);
  compare_state(lay, "muon v", gpu.v, cpu.v);
  int rc = run(GPT_BACKEND_CUDA, GPT_PREC_BF16, &bf);
  if (rc != DPC_EUNSUPPORTED) {
    CHECK_EQ_INT(rc, 0);
    double worst = 0;
    for (int s = 0; s < STEPS && !rc; s++)
      if (fabs(bf.losses[s] - cpu.losses[s]) / cpu.losses[s] > worst) worst = fabs(bf.losses[s] - cpu.losses[s]) / cpu.losses[s];
    fprintf(stderr, "muon bf16: worst loss rel err %.3g\n", worst);
    CHECK(worst <= 0.01);
  }
  use_muon = 0;
  free_out(&cpu), free_out(&gpu), free_out(&bf);
}

static void check_model(const gpt_config *c, const char *name) {
  cfg = c;
  fprintf(stderr, "== %s\n", name);
  gpt_layout lay;
  CHECK_EQ_INT(gpt_layout_build(cfg, &lay), 0);
  const size_t NV = (size_t)B * T * cfg->vocab_size;
  run_out cpu = {0}, gpu = {0}, gpu2 = {0};
  CHECK_EQ_INT(run(GPT_BACKEND_CPU, 0, &cpu), 0);
  int rc = run(GPT_BACKEND_CUDA, GPT_PREC_FP32, &gpu);
  CHECK_EQ_INT(rc, 0);
  if (rc) {
    fprintf(stderr, "cuda run of %s failed: %s\n", name, dpc_errmsg());
    free_out(&cpu);
    free_out(&gpu);
    return;
  }
  fprintf(stderr, "fp32: loss0 %.7f cpu %.7f\n", gpu.loss0, cpu.loss0);
  CHECK(fabs(gpu.loss0 - cpu.loss0) <= 1e-4 * cpu.loss0);
  double le = rel_err(gpu.logits, cpu.logits, NV), he = rel_err(gpu.hidden, cpu.hidden, cfg->n_embd);
  fprintf(stderr, "logits     rel err %.3g, hidden rel err %.3g\n", le, he);
  CHECK(le <= 1e-4);
  CHECK(he <= 1e-4);
  compare(&lay, "grads", gpu.g, cpu.g, 1e-4);
  int clipped = 0;
  for (int s = 0; s < STEPS; s++) {
    fprintf(stderr, "step %d loss %.6f (cpu %.6f) norm %.5f (cpu %.5f)\n", s, gpu.losses[s], cpu.losses[s],
            gpu.norms[s], cpu.norms[s]);
    CHECK(fabs(gpu.losses[s] - cpu.losses[s]) <= 1e-4 * cpu.losses[s]);
    CHECK(fabs(gpu.norms[s] - cpu.norms[s]) <= 1e-4 * cpu.norms[s]);
    clipped += cpu.norms[s] > HP.grad_clip;
  }
  CHECK(clipped > 0); /* the clipping path ran */
  compare_state(&lay, "params@5", gpu.p, cpu.p);
  compare_state(&lay, "adam m", gpu.m, cpu.m);
  compare_state(&lay, "adam v", gpu.v, cpu.v);

  /* Run to run: bit-identical (no atomics, fixed reduction orders, one stream). */
  CHECK_EQ_INT(run(GPT_BACKEND_CUDA, GPT_PREC_FP32, &gpu2), 0);
  const size_t P = lay.n_params;
  CHECK(memcmp(gpu.p, gpu2.p, P * 4) == 0);
  CHECK(memcmp(gpu.m, gpu2.m, P * 4) == 0);
  CHECK(memcmp(gpu.g, gpu2.g, P * 4) == 0);
  free_out(&gpu2);

  /* Reduced precisions: losses within 1% of the CPU's at every step. */
  const char *names[] = {"fp32", "tf32", "bf16"};
  for (int prec = GPT_PREC_TF32; prec <= GPT_PREC_BF16; prec++) {
    run_out r = {0};
    rc = run(GPT_BACKEND_CUDA, prec, &r);
    if (rc == DPC_EUNSUPPORTED) {
      fprintf(stderr, "SKIP %s: %s\n", names[prec], dpc_errmsg());
      free_out(&r);
      continue;
    }
    CHECK_EQ_INT(rc, 0);
    double worst = fabs(r.loss0 - cpu.loss0) / cpu.loss0;
    for (int s = 0; s < STEPS; s++) {
      double e = fabs(r.losses[s] - cpu.losses[s]) / cpu.losses[s];
      if (e > worst) worst = e;
    }
    fprintf(stderr, "%s: worst loss rel err over %d steps %.3g; grads rel err %.3g\n", names[prec], STEPS + 1, worst,
            rc ? -1.0 : rel_err(r.g, cpu.g, P));
    CHECK(worst <= 0.01);
    free_out(&r);
  }
  small_batch();
  check_muon(&lay, &cpu);
  free_out(&cpu);
  free_out(&gpu);
}

int main(void) {
  if (cudak_device_count() == 0) {
    fprintf(stderr, "SKIP: no CUDA device visible (the backend compiled; run on a GPU machine to test it)\n");
    return 77;
  }
  const int V = CFG.vocab_size; /* every model here has this vocabulary */
  for (int s = 0; s < STEPS; s++)
    for (int i = 0; i < B * T; i++) in[s][i] = (int)(next_u32() % V);
  for (int s = 0; s < STEPS; s++)
    for (int i = 0; i < B * T; i++) tg[s][i] = (i + 1) % T && next_u32() % 4 ? in[s][i + 1] : (int)(next_u32() % V);
  check_model(&CFG, "gpt2");
  check_model(&LLAMA_TIED_GQA, "llama tied, grouped-query (NKV 2 of NH 4)");
  check_model(&LLAMA_UNTIED_BIAS, "llama untied, q/k/v biases, llama3 RoPE scaling");
  cfg = &CFG;
  misuse();
  TEST_DONE();
}
