/* test_cpu_determinism.c — CPU backend run-to-run behaviour and API state: two runs with the
 * same thread count give bit-identical parameters, gradients and moments; other thread counts
 * and a smaller (B, T) than the model was built for agree numerically; zero_grad (which only
 * marks the gradients) reads as zeros and backward overwrites or accumulates as it should;
 * misuse is refused. */
#include "common/errors.h"
#include "kernels/gpt.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <string.h>

static const gpt_config CFG = {.n_layer = 2, .n_head = 4, .n_embd = 64, .n_positions = 16, .vocab_size = 96};
/* eps 1e-3: see test_cpu_oracle.c (AdamW amplifies the rounding noise of zero gradients). */
static const gpt_adamw_hparams HP = {0.9f, 0.95f, 1e-3f, 0.1f, 1.0f};
enum { B = 3, T = 16, STEPS = 3 };
static int in[STEPS][B * T], tg[STEPS][B * T];

typedef struct {
  float *p, *g, *m, *v;
  float losses[STEPS];
} run_out;

/* Train STEPS steps on `threads` threads from the seed-1 init; fills o (caller frees). */
static int run(int threads, run_out *o) {
  gpt_backend_opts opts = {GPT_BACKEND_CPU, threads, 0, 0};
  gpt_model *m = NULL;
  int rc = gpt_create(&m, &CFG, &opts, B, T);
  if (rc) return rc;
  const size_t P = m->lay.n_params;
  o->p = malloc(P * sizeof(float));
  o->g = malloc(P * sizeof(float));
  o->m = malloc(P * sizeof(float));
  o->v = malloc(P * sizeof(float));
  if (!o->p || !o->g || !o->m || !o->v) return DPC_ENOMEM;
  gpt_init_params(&m->lay, o->p, 1);
  gpt_set_params(m, o->p, 0, P);
  for (int s = 0; s < STEPS && !rc; s++) {
    rc = gpt_zero_grad(m);
    if (!rc) rc = gpt_forward(m, in[s], tg[s], B, T, &o->losses[s]);
    if (!rc) rc = gpt_backward(m);
    if (!rc) rc = gpt_adamw_step(m, &HP, 1e-3f, s + 1, NULL);
  }
  if (!rc) rc = gpt_get_params(m, o->p, 0, P);
  if (!rc) rc = gpt_get_grads(m, o->g, 0, P);
  if (!rc) rc = gpt_get_opt_state(m, o->m, o->v);
  gpt_free(m);
  return rc;
}

static void free_out(run_out *o) {
  free(o->p);
  free(o->g);
  free(o->m);
  free(o->v);
}

static double max_rel(const float *a, const float *b, size_t n) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= md)) md = d;
    if (fabs(b[i]) > mb) mb = fabs(b[i]);
  }
  return md / mb;
}

int main(void) {
  uint64_t s = 99;
  for (int k = 0; k < STEPS; k++)
    for (int i = 0; i < B * T; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      in[k][i] = (int)((s >> 33) % CFG.vocab_size);
      tg[k][i] = (int)((s >> 40) % CFG.vocab_size);
    }
  static gpt_layout lay;
  CHECK_EQ_INT(gpt_layout_build(&CFG, &lay), 0);
  const size_t P = lay.n_params;

  run_out a = {0}, b = {0}, c = {0};
  CHECK_EQ_INT(run(2, &a), 0);
  CHECK_EQ_INT(run(2, &b), 0);
  CHECK_EQ_INT(run(1, &c), 0);
  if (a.p && b.p && c.p) {
    CHECK(memcmp(a.p, b.p, P * sizeof(float)) == 0);
    CHECK(memcmp(a.g, b.g, P * sizeof(float)) == 0);
    CHECK(memcmp(a.m, b.m, P * sizeof(float)) == 0);
    CHECK(memcmp(a.v, b.v, P * sizeof(float)) == 0);
    CHECK(memcmp(a.losses, b.losses, sizeof a.losses) == 0);
    /* A different thread count changes only summation order. */
    double e = max_rel(c.p, a.p, P);
    fprintf(stderr, "1 vs 2 threads: params rel diff %.3g, loss %.7f vs %.7f\n", e, c.losses[2], a.losses[2]);
    CHECK(e <= 1e-5);
    CHECK(max_rel(c.g, a.g, P) <= 1e-4);
    CHECK(fabsf(c.losses[2] - a.losses[2]) <= 1e-5f * a.losses[2]);
  }
  free_out(&a);
  free_out(&b);
  free_out(&c);

  /* A forward smaller than the model's (B, T) equals one on a model built for that shape. */
  gpt_backend_opts opts = {GPT_BACKEND_CPU, 0, 0, 0}; /* 0: all cores */
  gpt_model *big = NULL, *small = NULL;
  CHECK_EQ_INT(gpt_create(&big, &CFG, &opts, B, T), 0);
  CHECK_EQ_INT(gpt_create(&small, &CFG, &opts, 2, 10), 0);
  if (big && small) {
    float *p = malloc(P * sizeof(float)), *g1 = malloc(P * sizeof(float)), *g2 = malloc(P * sizeof(float));
    float lg1[96], lg2[96];
    gpt_init_params(&lay, p, 5);
    gpt_set_params(big, p, 0, P);
    gpt_set_params(small, p, 0, P);
    int sin[20], stg[20];
    for (int j = 0; j < 2; j++)
      for (int t = 0; t < 10; t++) {
        sin[j * 10 + t] = in[0][j * T + t];
        stg[j * 10 + t] = tg[0][j * T + t];
      }
    float l1 = 0, l2 = 0;
    CHECK_EQ_INT(gpt_backward(big), DPC_ESTATE); /* no forward yet */
    CHECK_EQ_INT(gpt_zero_grad(big), 0);
    CHECK_EQ_INT(gpt_zero_grad(small), 0);
    CHECK_EQ_INT(gpt_forward(big, sin, stg, 2, 10, &l1), 0);
    CHECK_EQ_INT(gpt_forward(small, sin, stg, 2, 10, &l2), 0);
    CHECK_NEAR(l1, l2, 1e-6 * l2);
    CHECK_EQ_INT(gpt_logits(big, 1, 9, lg1), 0);
    CHECK_EQ_INT(gpt_logits(small, 1, 9, lg2), 0);
    CHECK(max_rel(lg1, lg2, 96) <= 1e-6);
    CHECK_EQ_INT(gpt_logits(big, 2, 0, lg1), DPC_ERANGE); /* b outside the last forward */
    CHECK_EQ_INT(gpt_logits(big, 0, 10, lg1), DPC_ERANGE);
    CHECK_EQ_INT(gpt_backward(big), 0);
    CHECK_EQ_INT(gpt_backward(small), 0);
    CHECK_EQ_INT(gpt_backward(big), DPC_ESTATE);          /* one backward per forward */
    CHECK_EQ_INT(gpt_logits(big, 0, 0, lg1), DPC_ESTATE); /* logits are consumed by backward */
    gpt_get_grads(big, g1, 0, P);
    gpt_get_grads(small, g2, 0, P);
    CHECK(max_rel(g1, g2, P) <= 1e-5);

    /* zero_grad only marks the gradients: they read as zero, the next backward overwrites them
     * (wpe rows past its T included), a backward without zero_grad adds, and a step taken
     * with no backward since zero_grad sees zero gradients. */
    float *g3 = malloc(P * sizeof(float)), *mv = malloc(P * sizeof(float));
    CHECK_EQ_INT(gpt_zero_grad(big), 0);
    CHECK_EQ_INT(gpt_forward(big, in[1], tg[1], B, T, &l1), 0); /* full T: every wpe row */
    CHECK_EQ_INT(gpt_backward(big), 0);
    CHECK_EQ_INT(gpt_zero_grad(big), 0);
    gpt_get_grads(big, g1, 0, P);
    size_t nonzero = 0;
    for (size_t i = 0; i < P; i++) nonzero += g1[i] != 0.0f;
    CHECK_EQ_INT((int)nonzero, 0);
    CHECK_EQ_INT(gpt_forward(big, sin, stg, 2, 10, &l1), 0);
    CHECK_EQ_INT(gpt_backward(big), 0);
    gpt_get_grads(big, g1, 0, P);
    CHECK(max_rel(g1, g2, P) <= 1e-5); /* as the small model's, from its zeroed memory */
    const size_t wpe = (size_t)CFG.vocab_size * CFG.n_embd;
    nonzero = 0;
    for (size_t i = wpe + 10 * (size_t)CFG.n_embd; i < wpe + (size_t)CFG.n_positions * CFG.n_embd; i++)
      nonzero += g1[i] != 0.0f;
    CHECK_EQ_INT((int)nonzero, 0);
    CHECK_EQ_INT(gpt_forward(big, sin, stg, 2, 10, &l1), 0);
    CHECK_EQ_INT(gpt_backward(big), 0); /* no zero_grad: accumulates */
    gpt_get_grads(big, g3, 0, P);
    for (size_t i = 0; i < P; i++) g1[i] *= 2.0f;
    CHECK(max_rel(g3, g1, P) <= 1e-5);
    CHECK_EQ_INT(gpt_reset_opt_state(big), 0);
    CHECK_EQ_INT(gpt_zero_grad(big), 0);
    float norm = -1.0f;
    CHECK_EQ_INT(gpt_adamw_step(big, &HP, 1e-3f, 1, &norm), 0);
    CHECK(norm == 0.0f);
    CHECK_EQ_INT(gpt_get_opt_state(big, mv, NULL), 0);
    nonzero = 0;
    for (size_t i = 0; i < P; i++) nonzero += mv[i] != 0.0f;
    CHECK_EQ_INT((int)nonzero, 0);
    free(g3);
    free(mv);

    int bad[2] = {0, CFG.vocab_size};
    CHECK_EQ_INT(gpt_forward(big, bad, NULL, 1, 2, &l1), DPC_ERANGE);
    CHECK_EQ_INT(gpt_forward(big, sin, NULL, 1, T + 1, &l1), DPC_EINVAL);
    free(p);
    free(g1);
    free(g2);
  }
  gpt_free(big);
  gpt_free(small);
  TEST_DONE();
}
