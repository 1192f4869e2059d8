/* test_outer.c — outer-optimizer kernels: hand-computed steps, a long-double reference for
 * the weighted average, argument and non-finite checks, and bit-identical results for any
 * thread count or chunking (the determinism docs/design.md §5 relies on). The PyTorch comparison
 * lives in tests/oracle/outer_oracle.py. */
#include "common/errors.h"
#include "kernels/outer.h"
#include "tests/unit/test.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x1234567ull;
static float frand(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

int main(void) {
  /* Hand-computed Nesterov: θ=1, u=0, Δ̄=1, η=0.7, μ=0.9.
   * step 1: u = 1,   θ = 1 − 0.7·(1 + 0.9·1)    = −0.33
   * step 2: u = 1.9, θ = −0.33 − 0.7·(1 + 1.71) = −2.227 */
  float th = 1.0f, u = 0.0f, g = 1.0f;
  outer_nesterov_step(&th, &u, &g, 1, 0.7f, 0.9f, 1);
  CHECK_NEAR(u, 1.0, 1e-7);
  CHECK_NEAR(th, -0.33, 1e-6);
  outer_nesterov_step(&th, &u, &g, 1, 0.7f, 0.9f, 1);
  CHECK_NEAR(u, 1.9, 1e-6);
  CHECK_NEAR(th, -2.227, 1e-5);
  /* Plain momentum: θ ← θ − η·u: 1 − 0.7 = 0.3, then 0.3 − 0.7·1.9 = −1.03. */
  th = 1.0f, u = 0.0f;
  outer_nesterov_step(&th, &u, &g, 1, 0.7f, 0.9f, 0);
  CHECK_NEAR(th, 0.3, 1e-6);
  outer_nesterov_step(&th, &u, &g, 1, 0.7f, 0.9f, 0);
  CHECK_NEAR(th, -1.03, 1e-5);
  th = 1.0f;
  outer_sgd_step(&th, &g, 1, 0.25f);
  CHECK_NEAR(th, 0.75, 0);

  /* The momentum schedule: 10 steps, warm-up 4, decay 3 — 1/4, 2/4, 3/4, 1, 1, 1, 1, then
   * 2/3, 1/3, 0 of μ; no schedule, and a t past the end, keep the bounds. */
  const double want[10] = {0.25, 0.5, 0.75, 1, 1, 1, 1, 2.0 / 3, 1.0 / 3, 0};
  for (int t = 0; t < 10; t++) {
    CHECK_EQ_INT(outer_momentum_at(0.9f, t, 10, 4, 3) == (float)(0.9f * want[t]), 1);
    CHECK_EQ_INT(outer_momentum_at(0.9f, t, 10, 0, 0) == 0.9f, 1);
  }
  CHECK_EQ_INT(outer_momentum_at(0.9f, 12, 10, 0, 3) == 0.0f, 1);
  /* Overlapping ramps take the smaller factor: 3 steps, warm-up 3, decay 3 — 1/3, 1/3, 0. */
  CHECK_EQ_INT(outer_momentum_at(0.6f, 0, 3, 3, 3) == (float)(0.6f / 3.0), 1);
  CHECK_EQ_INT(outer_momentum_at(0.6f, 1, 3, 3, 3) == (float)(0.6f / 3.0), 1);
  CHECK_EQ_INT(outer_momentum_at(0.6f, 2, 3, 3, 3) == 0.0f, 1);

  /* Weighted average against a long-double reference. */
  enum { NS = 5, LEN = 3001 };
  float *d[NS];
  double w[NS] = {1.0, 2.5, 0.0, 7.0, 0.125};
  for (int i = 0; i < NS; i++) {
    d[i] = malloc(LEN * sizeof(float));
    for (int j = 0; j < LEN; j++) d[i][j] = frand() * (float)(i + 1);
  }
  float *avg = malloc(LEN * sizeof(float));
  CHECK_EQ_INT(outer_average((const float *const *)d, w, NS, LEN, avg), 0);
  double maxerr = 0;
  for (int j = 0; j < LEN; j++) {
    long double s = 0, ws = 0;
    for (int i = 0; i < NS; i++) {
      s += (long double)w[i] * d[i][j];
      ws += w[i];
    }
    double ref = (double)(s / ws);
    double e = fabs(avg[j] - ref) / fmax(fabs(ref), 1e-3);
    if (e > maxerr) maxerr = e;
  }
  CHECK(maxerr < 1e-6);
  /* Uniform weights (NULL) = the plain mean. */
  CHECK_EQ_INT(outer_average((const float *const *)d, NULL, 2, LEN, avg), 0);
  CHECK_NEAR(avg[17], ((double)d[0][17] + d[1][17]) / 2, 1e-7);
  /* Chunking invariance: averaging a sub-range gives the same bits. */
  float *part = malloc(LEN * sizeof(float));
  const float *sub[NS];
  for (int i = 0; i < NS; i++) sub[i] = d[i] + 1000;
  CHECK_EQ_INT(outer_average((const float *const *)d, w, NS, LEN, avg), 0);
  CHECK_EQ_INT(outer_average(sub, w, NS, LEN - 1000, part), 0);
  CHECK(memcmp(avg + 1000, part, (LEN - 1000) * sizeof(float)) == 0);

  /* Bad arguments and non-finite deltas. */
  CHECK_EQ_INT(outer_average((const float *const *)d, w, 0, LEN, avg), DPC_EINVAL);
  double wneg[NS] = {1, -1, 1, 1, 1};
  CHECK_EQ_INT(outer_average((const float *const *)d, wneg, NS, LEN, avg), DPC_EINVAL);
  double wzero[NS] = {0};
  CHECK_EQ_INT(outer_average((const float *const *)d, wzero, NS, LEN, avg), DPC_EINVAL);
  double wnan[NS] = {1, NAN, 1, 1, 1};
  CHECK_EQ_INT(outer_average((const float *const *)d, wnan, NS, LEN, avg), DPC_EINVAL);
  d[3][2500] = INFINITY;
  CHECK_EQ_INT(outer_average((const float *const *)d, w, NS, LEN, avg), DPC_ENUMERIC);
  CHECK(strstr(dpc_errmsg(), "index 2500") != NULL);
  d[3][2500] = NAN;
  CHECK_EQ_INT(outer_average((const float *const *)d, w, NS, LEN, avg), DPC_ENUMERIC);
  d[3][2500] = 0.5f;

  /* Delayed Nesterov with N = 1, c = 0 is bit-identical to Nesterov. */
  float th1[LEN], u1[LEN], th2[LEN], buf[LEN], m[LEN];
  for (int j = 0; j < LEN; j++) th1[j] = th2[j] = frand();
  memset(u1, 0, sizeof u1);
  outer_dn_state dn;
  CHECK_EQ_INT(outer_dn_init(&dn, buf, m, LEN, 1, 0.0, 0, 1), 0);
  for (int t = 0; t < NS; t++) {
    outer_nesterov_step(th1, u1, d[t], LEN, 0.7f, 0.9f, 1);
    CHECK_EQ_INT(outer_dn_apply(&dn, th2, d[t], 0.7f, 0.9f), 1);
  }
  CHECK(memcmp(th1, th2, sizeof th1) == 0);
  CHECK(memcmp(u1, m, sizeof u1) == 0);
  CHECK_EQ_INT(dn.t, NS);

  /* N = 3, c = 0.2, one coordinate by hand (β = 0.5, ε = 1): g = 1, 2, 3.
   * t=0: buf=1; θ −= 0.2·0.5·0 + 1/3          → θ = −1/3
   * t=1: buf=3; θ −= 2/3                       → θ = −1
   * t=2: m = 0.5·0 + (3+3)/3 = 2; θ −= (1 − 0.6 + 0.2)·0.5·2 + 3/3 = 1.6 → θ = −2.6; buf = 0
   * t=3 (g = 3): buf = 3; θ −= 0.2·0.5·2 + 1 = 1.2 → θ = −3.8 */
  float x = 0.0f, bb, mm, gs[4] = {1, 2, 3, 3};
  CHECK_EQ_INT(outer_dn_init(&dn, &bb, &mm, 1, 3, 0.2, 0, 1), 0);
  int upd[4];
  for (int t = 0; t < 4; t++) upd[t] = outer_dn_apply(&dn, &x, &gs[t], 1.0f, 0.5f);
  CHECK(upd[0] == 0 && upd[1] == 0 && upd[2] == 1 && upd[3] == 0);
  CHECK_NEAR(x, -3.8, 1e-5);
  CHECK_NEAR(mm, 2.0, 1e-6);
  CHECK_NEAR(bb, 3.0, 1e-6);
  CHECK_EQ_INT(outer_dn_init(&dn, &bb, &mm, 1, 0, 0.0, 0, 0), DPC_EINVAL);
  CHECK_EQ_INT(outer_dn_init(&dn, &bb, &mm, 1, 4, 0.3, 0, 0), DPC_EINVAL); /* c > 1/N */

  /* Thread-count independence on an array large enough to be split across threads. */
  const size_t BIG = (size_t)1 << 20;
  float *a1 = malloc(BIG * 4), *a2 = malloc(BIG * 4), *ua = malloc(BIG * 4), *ub = malloc(BIG * 4);
  float *big[3], *av1 = malloc(BIG * 4), *av2 = malloc(BIG * 4);
  for (int i = 0; i < 3; i++) {
    big[i] = malloc(BIG * 4);
    for (size_t j = 0; j < BIG; j++) big[i][j] = frand();
  }
  double w3[3] = {3, 1, 2};
  for (size_t j = 0; j < BIG; j++) {
    a1[j] = a2[j] = frand();
    ua[j] = ub[j] = frand() * 0.1f;
  }
  omp_set_num_threads(1);
  CHECK_EQ_INT(outer_average((const float *const *)big, w3, 3, BIG, av1), 0);
  outer_nesterov_step(a1, ua, av1, BIG, 0.7f, 0.9f, 1);
  omp_set_num_threads(3);
  CHECK_EQ_INT(outer_average((const float *const *)big, w3, 3, BIG, av2), 0);
  outer_nesterov_step(a2, ub, av2, BIG, 0.7f, 0.9f, 1);
  CHECK(memcmp(av1, av2, BIG * 4) == 0);
  CHECK(memcmp(a1, a2, BIG * 4) == 0);
  CHECK(memcmp(ua, ub, BIG * 4) == 0);

  for (int i = 0; i < NS; i++) free(d[i]);
  for (int i = 0; i < 3; i++) free(big[i]);
  free(avg);
  free(part);
  free(a1);
  free(a2);
  free(ua);
  free(ub);
  free(av1);
  free(av2);
  TEST_DONE();
}
