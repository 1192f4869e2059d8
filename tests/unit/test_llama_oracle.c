/* test_llama_oracle.c — the CPU backend's Llama family against PyTorch
 * (tests/oracle/llama_oracle.py, an nn.Module written from HF's LlamaForCausalLM): loss, every
 * gradient and the logits at the initial parameters, then five steps of clipped AdamW with the
 * warmup + cosine schedule. Loss within 1e-5 relative; each tensor of the gradients within 1e-5
 * and of the parameters and AdamW moments after the steps within 5e-5 (max|a - b| / max|b|).
 * Cases: tied embeddings with grouped-query attention, untied with NKV = NH and Qwen2-style
 * q/k/v biases, multi-query with llama3 RoPE scaling over T = 80 (a full and a partial 64-wide
 * attention block). A second model replaying the steps must match bit for bit. The oracle must
 * run: a missing torch is a failure, not a skip.
 * With "cuda" (the cuda_llama_oracle test, built when the CUDA backend is) the same cases run on
 * the CUDA backend in fp32 against the same torch module to 1e-4 (its products and sums round
 * in another order); without a visible GPU that test prints why and exits 77 (skipped).
 * Usage: test_llama_oracle ORACLE.py [PYTHON [cpu|cuda]] */
#include "common/errors.h"
#include "kernels/gpt.h"
#include "tests/unit/oracle_files.h"
#include "tests/unit/test.h"

#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define STEPS 5
static double TOL_LOSS = 1e-5, TOL_GRAD = 1e-5, TOL_STEPS = 5e-5;
static gpt_backend_kind BACKEND = GPT_BACKEND_CPU;
static const int WARMUP = 2, TOTAL = 5;
static const float LR_MIN_FRAC = 0.1f;

typedef struct {
  const char *what;
  gpt_config cfg;
  int B, T, threads;
  float lr;
  /* eps 1e-3 as in test_cpu_oracle.c: it keeps AdamW's division well-conditioned where a
   * gradient is rounding noise, and still pins where eps enters. */
  gpt_adamw_hparams hp;
  int mixed_clip; /* the case must clip on some steps and not on others */
} oracle_case;

/* {L, NH, C, maxT, V, arch, NKV, I, tied, bias, rope_scaling, orig_max, eps, theta, factor, low, high} */
static const oracle_case CASES[] = {
    {"tied-gqa", {2, 4, 32, 12, 64, GPT_ARCH_LLAMA, 2, 48, 1, 0, GPT_ROPE_DEFAULT, 0, 1e-5, 10000.0, 0, 0, 0},
     3, 8, 2, 2e-2f, {0.9f, 0.95f, 1e-3f, 0.1f, 3.4f}, 1},
    {"untied-bias", {2, 2, 32, 12, 64, GPT_ARCH_LLAMA, 2, 40, 0, 1, GPT_ROPE_DEFAULT, 0, 1e-6, 1e6, 0, 0, 0},
     2, 8, 2, 2e-2f, {0.9f, 0.95f, 1e-3f, 0.1f, 4.0f}, 1},
    /* theta 500 and original_max_position_embeddings 64 put the head's four frequencies in all
     * three llama3 bands (kept, interpolated, divided by factor). */
    {"llama3-mqa", {1, 4, 32, 96, 48, GPT_ARCH_LLAMA, 1, 64, 1, 0, GPT_ROPE_LLAMA3, 64, 1e-5, 500.0, 8.0, 1.0, 4.0},
     2, 80, 2, 1e-2f, {0.9f, 0.99f, 1e-3f, 0.05f, 0.0f}, 0},
};



/* Five clipped AdamW steps from params; the final parameters and moments into pa, ma, va. */
static void run_steps(gpt_model *m, const oracle_case *cs, const float *params, const int *inputs,
                      const int *targets, float *pa, float *ma, float *va, float *losses, float *norms) {
  const size_t P = m->lay.n_params, BT = (size_t)cs->B * cs->T;
  CHECK_EQ_INT(gpt_set_params(m, params, 0, P), 0);
  CHECK_EQ_INT(gpt_reset_opt_state(m), 0);
  for (int s = 0; s < STEPS; s++) {
    float lr = gpt_lr_at(cs->lr, WARMUP, TOTAL, LR_MIN_FRAC, s);
    CHECK_EQ_INT(gpt_zero_grad(m), 0);
    CHECK_EQ_INT(gpt_forward(m, inputs + s * BT, targets + s * BT, cs->B, cs->T, &losses[s]), 0);
    CHECK_EQ_INT(gpt_backward(m), 0);
    CHECK_EQ_INT(gpt_adamw_step(m, &cs->hp, lr, s + 1, &norms[s]), 0);
  }
  CHECK_EQ_INT(gpt_get_params(m, pa, 0, P), 0);
  CHECK_EQ_INT(gpt_get_opt_state(m, ma, va), 0);
}

static int write_case(const oracle_case *cs, const gpt_layout *lay, const float *params, const int *inputs,
                      const int *targets) {
  const gpt_config *c = &cs->cfg;
  const size_t BT = (size_t)cs->B * cs->T;
  char txt[2048];
  int len = snprintf(txt, sizeof txt,
                     "n_layer %d\nn_head %d\nn_embd %d\nn_positions %d\nvocab_size %d\nn_kv_head %d\n"
                     "intermediate_size %d\ntie_word_embeddings %d\nattention_bias %d\nrope_scaling %d\n"
                     "rope_original_max_position_embeddings %d\nrms_norm_eps %.17g\nrope_theta %.17g\n"
                     "rope_factor %.17g\nrope_low_freq_factor %.17g\nrope_high_freq_factor %.17g\n"
                     "B %d\nT %d\nsteps %d\nlr %.9g\nwarmup %d\ntotal_steps %d\nlr_min_frac %.9g\nbeta1 %.9g\n"
                     "beta2 %.9g\neps %.9g\nweight_decay %.9g\ngrad_clip %.9g\n",
                     c->n_layer, c->n_head, c->n_embd, c->n_positions, c->vocab_size, c->n_kv_head,
                     c->intermediate_size, c->tie_word_embeddings, c->attention_bias, c->rope_scaling,
                     c->rope_original_max_position_embeddings, c->rms_norm_eps, c->rope_theta, c->rope_factor,
                     c->rope_low_freq_factor, c->rope_high_freq_factor, cs->B, cs->T, STEPS, cs->lr, WARMUP, TOTAL,
                     LR_MIN_FRAC, cs->hp.beta1, cs->hp.beta2, cs->hp.eps, cs->hp.weight_decay, cs->hp.grad_clip);
  char names[GPT_MAX_TENSORS / 4 * 72];
  size_t nl = 0;
  for (int k = 0; k < lay->n_tensors && nl < sizeof names - 80; k++)
    nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s\n", lay->tensors[k].name);
  if (write_file("config.txt", txt, (size_t)len) || write_file("layout.txt", names, nl) ||
      write_file("params.bin", params, lay->n_params * sizeof(float)) ||
      write_file("inputs.bin", inputs, STEPS * BT * sizeof(int)) ||
      write_file("targets.bin", targets, STEPS * BT * sizeof(int)))
    return -1;
  return 0;
}

/* Init with matrices scaled up so attention is far from uniform, and norm gains and biases
 * moved off 1 and 0 so that every gradient path carries signal. */
static void init_params(const gpt_layout *lay, float *params) {
  gpt_init_params(lay, params, 7);
  for (int k = 0; k < lay->n_tensors; k++) {
    const gpt_tensor *t = &lay->tensors[k];
    int is_bias = strstr(t->name, ".bias") != NULL;
    for (size_t i = 0; i < t->numel; i++) {
      float *p = &params[t->offset + i];
      if (t->ndim == 2) *p *= 5.0f;
      else *p += (is_bias ? 0.05f : 0.2f) * next_normal();
    }
  }
}

static void run_case(const oracle_case *cs, const char *python, const char *script) {
  const int B = cs->B, T = cs->T;
  fprintf(stderr, "== case %s: L=%d NH=%d NKV=%d C=%d I=%d maxT=%d V=%d tied=%d bias=%d rope=%d B=%d T=%d\n",
          cs->what, cs->cfg.n_layer, cs->cfg.n_head, cs->cfg.n_kv_head, cs->cfg.n_embd, cs->cfg.intermediate_size,
          cs->cfg.n_positions, cs->cfg.vocab_size, cs->cfg.tie_word_embeddings, cs->cfg.attention_bias,
          cs->cfg.rope_scaling, B, T);
  snprintf(dir, sizeof dir, "/tmp/dpc_llama_oracle_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    test_failures++;
    return;
  }
  gpt_model *m = NULL, *m2 = NULL;
  gpt_backend_opts opts = {BACKEND, cs->threads, 0, 0};
  int rc = gpt_create(&m, &cs->cfg, &opts, B, T);
  if (rc == DPC_EUNSUPPORTED && BACKEND == GPT_BACKEND_CUDA) {
    fprintf(stderr, "SKIP: the CUDA backend cannot run here: %s\n", dpc_errmsg());
    remove_dir();
    exit(77);
  }
  CHECK_EQ_INT(rc, 0);
  if (rc) {
    fprintf(stderr, "gpt_create: %s\n", dpc_errmsg());
    remove_dir();
    return;
  }
  const gpt_layout *lay = &m->lay;
  const size_t P = lay->n_params, BT = (size_t)B * T, V = cs->cfg.vocab_size;
  float *params = malloc(P * sizeof(float)), *grads = malloc(P * sizeof(float)), *want = malloc(P * sizeof(float));
  float *pa = malloc(3 * P * sizeof(float)), *pb = malloc(3 * P * sizeof(float));
  float *logits = malloc(BT * V * sizeof(float)), *want_logits = malloc(BT * V * sizeof(float));
  int *inputs = malloc(STEPS * BT * sizeof(int)), *targets = malloc(STEPS * BT * sizeof(int));
  if (!params || !grads || !want || !pa || !pb || !logits || !want_logits || !inputs || !targets) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  init_params(lay, params);
  for (size_t i = 0; i < STEPS * BT; i++) inputs[i] = (int)(next_u32() % V);
  for (size_t i = 0; i < STEPS * BT; i++)
    targets[i] = (i + 1) % T != 0 && next_u32() % 4 != 0 ? inputs[i + 1] : (int)(next_u32() % V);
  CHECK(write_case(cs, lay, params, inputs, targets) == 0);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", python, script, dir);
  int prc = system(cmd);
  CHECK_EQ_INT(prc, 0);
  if (prc != 0) {
    fprintf(stderr, "oracle failed (%s); it needs torch at %s (tests/run.sh installs python3-torch)\n", cmd, python);
    remove_dir();
    exit(1);
  }

  /* Loss, gradients and logits at the initial parameters, batch 0. */
  float loss0 = 0.0f, want_loss0 = 0.0f;
  CHECK_EQ_INT(gpt_set_params(m, params, 0, P), 0);
  CHECK_EQ_INT(gpt_forward(m, inputs, NULL, B, T, &loss0), 0);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) CHECK_EQ_INT(gpt_logits(m, b, t, logits + ((size_t)b * T + t) * V), 0);
  CHECK_EQ_INT(gpt_zero_grad(m), 0);
  CHECK_EQ_INT(gpt_forward(m, inputs, targets, B, T, &loss0), 0);
  CHECK_EQ_INT(gpt_backward(m), 0);
  CHECK_EQ_INT(gpt_get_grads(m, grads, 0, P), 0);
  CHECK(read_floats("out_loss0.bin", &want_loss0, 1) == 0);
  fprintf(stderr, "loss0 %.7f torch %.7f rel err %.3g\n", loss0, want_loss0, fabs(loss0 - want_loss0) / want_loss0);
  CHECK(fabs(loss0 - want_loss0) <= TOL_LOSS * fabs(want_loss0));
  CHECK(read_floats("out_logits0.bin", want_logits, BT * V) == 0);
  double le = rel_err(logits, want_logits, BT * V);
  fprintf(stderr, "logits         rel err %.3g\n", le);
  CHECK(le <= TOL_GRAD);
  CHECK(read_floats("out_grads0.bin", want, P) == 0);
  compare_tensors(lay, "grads", grads, want, TOL_GRAD);

  /* Five AdamW steps with the schedule and clipping, against torch, then replayed. */
  float losses[STEPS], norms[STEPS], want_lrs[STEPS], want_norms[STEPS], want_losses[STEPS];
  run_steps(m, cs, params, inputs, targets, pa, pa + P, pa + 2 * P, losses, norms);
  CHECK(read_floats("out_lrs.bin", want_lrs, STEPS) == 0);
  CHECK(read_floats("out_norms.bin", want_norms, STEPS) == 0);
  CHECK(read_floats("out_losses.bin", want_losses, STEPS) == 0);
  int clipped = 0;
  for (int s = 0; s < STEPS; s++) {
    float lr = gpt_lr_at(cs->lr, WARMUP, TOTAL, LR_MIN_FRAC, s);
    fprintf(stderr, "step %d lr %.6g (torch %.6g) loss %.6f (torch %.6f) norm %.6f (torch %.6f)%s\n", s, lr,
            want_lrs[s], losses[s], want_losses[s], norms[s], want_norms[s],
            cs->hp.grad_clip > 0 && want_norms[s] > cs->hp.grad_clip ? " clipped" : "");
    CHECK(fabs(lr - want_lrs[s]) <= 1e-6 * want_lrs[s]);
    CHECK(fabs(losses[s] - want_losses[s]) <= TOL_LOSS * fabs(want_losses[s]));
    CHECK(fabs(norms[s] - want_norms[s]) <= TOL_STEPS * want_norms[s]);
    clipped += cs->hp.grad_clip > 0 && want_norms[s] > cs->hp.grad_clip;
  }
  if (cs->mixed_clip) CHECK(clipped > 0 && clipped < STEPS);
  CHECK(read_floats("out_params.bin", want, P) == 0);
  compare_tensors(lay, "params@5", pa, want, TOL_STEPS);
  CHECK(read_floats("out_m.bin", want, P) == 0);
  compare_tensors(lay, "adam m", pa + P, want, TOL_STEPS);
  CHECK(read_floats("out_v.bin", want, P) == 0);
  compare_tensors(lay, "adam v", pa + 2 * P, want, TOL_STEPS);

  /* A second model with the same thread count replays the steps bit for bit. */
  CHECK_EQ_INT(gpt_create(&m2, &cs->cfg, &opts, B, T), 0);
  if (m2) {
    float l2[STEPS], n2[STEPS];
    run_steps(m2, cs, params, inputs, targets, pb, pb + P, pb + 2 * P, l2, n2);
    CHECK(memcmp(pa, pb, 3 * P * sizeof(float)) == 0);
    CHECK(memcmp(losses, l2, sizeof l2) == 0 && memcmp(norms, n2, sizeof n2) == 0);
    gpt_free(m2);
  }
  gpt_free(m);
  remove_dir();
  free(params);
  free(grads);
  free(want);
  free(pa);
  free(pb);
  free(logits);
  free(want_logits);
  free(inputs);
  free(targets);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s ORACLE.py [PYTHON [cpu|cuda]]\n", argv[0]);
    return 2;
  }
  const char *python = argc > 2 ? argv[2] : "/usr/bin/python3";
  if (argc > 3 && gpt_backend_parse(argv[3], &BACKEND)) {
    fprintf(stderr, "%s\n", dpc_errmsg());
    return 2;
  }
  if (BACKEND == GPT_BACKEND_CUDA) TOL_LOSS = TOL_GRAD = TOL_STEPS = 1e-4;
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i], python, argv[1]);
  TEST_DONE();
}
