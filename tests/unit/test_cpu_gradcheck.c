/* test_cpu_gradcheck.c — the CPU backend's gradients against double-sided finite differences
 * of its own loss, on a tiny GPT-2: for every tensor, the coordinate with the largest analytic
 * gradient plus a few random ones. Independent of PyTorch, so it also guards the oracle. */
#include "common/errors.h"
#include "kernels/gpt.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <string.h>

static uint64_t rng = 42;
static uint32_t next_u32(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}
static float next_normal(void) {
  double u1 = (next_u32() + 1.0) / 4294967297.0, u2 = next_u32() / 4294967296.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static float loss_at(gpt_model *m, const int *in, const int *tg, int B, int T) {
  float loss = NAN;
  if (gpt_forward(m, in, tg, B, T, &loss) != 0) fprintf(stderr, "forward: %s\n", dpc_errmsg());
  return loss;
}

int main(void) {
  const gpt_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 16, .n_positions = 8, .vocab_size = 32};
  const int B = 2, T = 6; /* T < n_positions: the last wpe rows get no gradient */
  gpt_backend_opts opts = {GPT_BACKEND_CPU, 1, 0, 0};
  gpt_model *m = NULL;
  CHECK_EQ_INT(gpt_create(&m, &cfg, &opts, B, T), 0);
  if (!m) TEST_DONE();
  const gpt_layout *lay = &m->lay;
  const size_t P = lay->n_params;
  float *params = malloc(P * sizeof(float)), *grads = malloc(P * sizeof(float));
  if (!params || !grads) return 1;
  /* Large weights (std ~0.3) so that attention, GELU and LayerNorm all work far from linear. */
  gpt_init_params(lay, params, 3);
  for (int k = 0; k < lay->n_tensors; k++) {
    const gpt_tensor *t = &lay->tensors[k];
    for (size_t i = 0; i < t->numel; i++) {
      float *p = &params[t->offset + i];
      if (t->ndim == 2) *p = 0.3f * next_normal();
      else *p += 0.3f * next_normal();
    }
  }
  int in[12], tg[12];
  for (int i = 0; i < B * T; i++) {
    in[i] = (int)(next_u32() % cfg.vocab_size);
    tg[i] = (int)(next_u32() % cfg.vocab_size);
  }
  CHECK_EQ_INT(gpt_set_params(m, params, 0, P), 0);
  CHECK_EQ_INT(gpt_zero_grad(m), 0);
  float loss = loss_at(m, in, tg, B, T);
  CHECK(isfinite(loss));
  CHECK_EQ_INT(gpt_backward(m), 0);
  CHECK_EQ_INT(gpt_get_grads(m, grads, 0, P), 0);

  /* Float32 loss: h = 1e-2 keeps cancellation noise near 1e-4 while the O(h^2) error stays
   * below it; the tolerance is 2e-4 absolute plus 1% relative. */
  const float h = 1e-2f;
  int checked = 0, strong = 0;
  for (int k = 0; k < lay->n_tensors; k++) {
    const gpt_tensor *t = &lay->tensors[k];
    size_t idx[5];
    int nidx = 0;
    size_t amax = 0;
    for (size_t i = 1; i < t->numel; i++)
      if (fabsf(grads[t->offset + i]) > fabsf(grads[t->offset + amax])) amax = i;
    idx[nidx++] = amax;
    for (int r = 0; r < 3; r++) idx[nidx++] = next_u32() % t->numel;
    if (strcmp(t->name, "wpe.weight") == 0) idx[nidx++] = (size_t)T * cfg.n_embd + 1; /* unused position */
    double worst = 0.0;
    for (int j = 0; j < nidx; j++) {
      const size_t i = t->offset + idx[j];
      const float p0 = params[i];
      float pp = p0 + h, pm = p0 - h;
      gpt_set_params(m, &pp, i, 1);
      float lp = loss_at(m, in, tg, B, T);
      gpt_set_params(m, &pm, i, 1);
      float lm = loss_at(m, in, tg, B, T);
      gpt_set_params(m, &p0, i, 1);
      double fd = ((double)lp - (double)lm) / ((double)pp - (double)pm);
      double g = grads[i], err = fabs(fd - g), tol = 2e-4 + 1e-2 * fabs(g);
      test_checks++;
      checked++;
      strong += fabs(g) > 1e-2;
      if (!(err <= tol)) {
        test_failures++;
        fprintf(stderr, "FAIL %s[%zu]: analytic %.6g, finite difference %.6g\n", t->name, idx[j], g, fd);
      }
      if (err > worst) worst = err;
    }
    fprintf(stderr, "%-26s max|g| %.3g  worst |fd - g| %.3g\n", t->name, fabs(grads[t->offset + amax]), worst);
  }
  /* The check has teeth only if many gradients are well above the tolerance floor. */
  fprintf(stderr, "%d coordinates, %d with |g| > 1e-2\n", checked, strong);
  CHECK(strong >= lay->n_tensors);
  gpt_free(m);
  free(params);
  free(grads);
  TEST_DONE();
}
