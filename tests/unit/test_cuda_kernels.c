/* test_cuda_kernels.c — every CUDA kernel (kernels/cuda/cuda_kernels.cu) against its CPU twin
 * (kernels/cpu/cpu_kernels.c or a plain loop here), llm.c dev/cuda style: random inputs, both
 * sides run, max|gpu - cpu| / max|cpu| per output within 1e-5 (AdamW 1e-6). Shapes are odd on
 * purpose (C not a multiple of 32, rows not a multiple of the block). Without a GPU it prints
 * why and exits 77, which ctest reports as skipped. */
#include "common/errors.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) / 8388608.0 - 1.0);
}
static float *rand_floats(size_t n, float scale) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = scale * frand();
  return p;
}

static void *dev(const void *host, size_t bytes) {
  void *d = NULL;
  if (cudak_malloc(&d, bytes) || (host && cudak_h2d(d, host, bytes))) {
    fprintf(stderr, "device setup failed: %s\n", dpc_errmsg());
    exit(1);
  }
  return d;
}
static float *back(const void *d, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof(float));
  if (cudak_sync() || cudak_d2h(h, d, n * sizeof(float))) {
    fprintf(stderr, "device read failed: %s\n", dpc_errmsg());
    exit(1);
  }
  return h;
}

static void expect_close(const char *what, const float *got, const float *want, size_t n, double tol) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - want[i]);
    if (!(d <= md)) md = d;
    if (fabs(want[i]) > mb) mb = fabs(want[i]);
  }
  double e = mb > 0 ? md / mb : md;
  test_checks++;
  if (!(e <= tol)) {
    test_failures++;
    fprintf(stderr, "FAIL %-22s rel err %.3g > %g\n", what, e, tol);
  } else {
    fprintf(stderr, "ok   %-22s rel err %.3g\n", what, e);
  }
}

enum { B = 3, T = 37, N = B * T, C = 72, NH = 4, HS = C / NH, V = 301 };

static void test_encoder(void) {
  int inp[N];
  for (int n = 0; n < N; n++) inp[n] = (int)((frand() + 1.0f) * 0.5f * V) % V;
  float *wte = rand_floats((size_t)V * C, 1), *wpe = rand_floats((size_t)T * C, 1), *want = malloc(N * C * 4);
  for (int n = 0; n < N; n++) cpuk_encode_row(want + n * C, wte + (size_t)inp[n] * C, wpe + (n % T) * C, C);
  int *d_inp = dev(inp, sizeof inp);
  float *d_wte = dev(wte, (size_t)V * C * 4), *d_wpe = dev(wpe, T * C * 4), *d_out = dev(NULL, N * C * 4);
  CHECK_EQ_INT(cudak_encoder_fwd(d_out, d_inp, d_wte, d_wpe, N, T, C, NULL), 0);
  float *got = back(d_out, N * C);
  expect_close("encoder_fwd", got, want, N * C, 1e-6);
  free(got);

  /* Backward: dwpe sums over the batch; dwte over each token's positions (tokens repeat). */
  for (int n = 0; n < N; n++) inp[n] = n % 7 == 0 ? 5 : inp[n];
  float *dout = rand_floats(N * C, 1), *dwte = rand_floats((size_t)V * C, 1), *dwpe = rand_floats(T * C, 1);
  float *want_te = malloc((size_t)V * C * 4), *want_pe = malloc(T * C * 4);
  memcpy(want_te, dwte, (size_t)V * C * 4);
  memcpy(want_pe, dwpe, T * C * 4);
  for (int n = 0; n < N; n++) {
    cpuk_acc(want_pe + (n % T) * C, dout + n * C, C);
    cpuk_acc(want_te + (size_t)inp[n] * C, dout + n * C, C);
  }
  int uniq[N], start[N + 1], pos[N], U = 0, at = 0;
  for (int v = 0; v < V; v++) {
    int first = 1;
    for (int n = 0; n < N; n++)
      if (inp[n] == v) {
        if (first) {
          uniq[U] = v;
          start[U++] = at;
          first = 0;
        }
        pos[at++] = n;
      }
  }
  start[U] = at;
  float *d_dout = dev(dout, N * C * 4), *d_dwte = dev(dwte, (size_t)V * C * 4), *d_dwpe = dev(dwpe, T * C * 4);
  int *d_u = dev(uniq, sizeof uniq), *d_s = dev(start, sizeof start), *d_p = dev(pos, sizeof pos);
  CHECK_EQ_INT(cudak_wpe_bwd(d_dwpe, d_dout, B, T, C, NULL), 0);
  CHECK_EQ_INT(cudak_wte_bwd(d_dwte, d_dout, d_u, d_s, d_p, U, C, NULL), 0);
  got = back(d_dwpe, T * C);
  expect_close("wpe_bwd", got, want_pe, T * C, 1e-6);
  free(got);
  got = back(d_dwte, (size_t)V * C);
  expect_close("wte_bwd", got, want_te, (size_t)V * C, 1e-6);
  free(got);
  free(wte), free(wpe), free(want), free(dout), free(dwte), free(dwpe), free(want_te), free(want_pe);
  cudak_free(d_inp), cudak_free(d_wte), cudak_free(d_wpe), cudak_free(d_out), cudak_free(d_dout);
  cudak_free(d_dwte), cudak_free(d_dwpe), cudak_free(d_u), cudak_free(d_s), cudak_free(d_p);
}

static void test_layernorm(void) {
  float *x = rand_floats(N * C, 2), *w = rand_floats(C, 1), *b = rand_floats(C, 1), *dout = rand_floats(N * C, 1);
  for (int i = 0; i < N * C; i++) x[i] += 0.5f; /* a non-zero mean */
  float *out = malloc(N * C * 4), mean[N], rstd[N];
  float *dx = rand_floats(N * C, 1), *dw = rand_floats(C, 1), *db = rand_floats(C, 1);
  float *dx0 = malloc(N * C * 4), *dw0 = malloc(C * 4), *db0 = malloc(C * 4);
  memcpy(dx0, dx, N * C * 4), memcpy(dw0, dw, C * 4), memcpy(db0, db, C * 4);
  for (int n = 0; n < N; n++) cpuk_layernorm_row(out + n * C, &mean[n], &rstd[n], x + n * C, w, b, C);
  for (int n = 0; n < N; n++) cpuk_layernorm_bwd_row(dx + n * C, dw, db, dout + n * C, x + n * C, w, mean[n], rstd[n], C, 1);
  float *d_x = dev(x, N * C * 4), *d_w = dev(w, C * 4), *d_b = dev(b, C * 4), *d_out = dev(NULL, N * C * 4);
  float *d_mean = dev(NULL, N * 4), *d_rstd = dev(NULL, N * 4), *d_dout = dev(dout, N * C * 4);
  float *d_dx = dev(dx0, N * C * 4), *d_dw = dev(dw0, C * 4), *d_db = dev(db0, C * 4);
  float *d_part = dev(NULL, cudak_colsum_scratch(N, C) * 4);
  CHECK_EQ_INT(cudak_layernorm_fwd(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, NULL), 0);
  CHECK_EQ_INT(cudak_layernorm_bwd_dx(d_dx, d_dout, d_x, d_w, d_mean, d_rstd, N, C, NULL), 0);
  CHECK_EQ_INT(cudak_colsum(d_dw, d_db, d_part, d_dout, d_x, d_mean, d_rstd, N, C, NULL), 0);
  float *g;
  expect_close("layernorm_fwd out", g = back(d_out, N * C), out, N * C, 1e-5), free(g);
  expect_close("layernorm_fwd mean", g = back(d_mean, N), mean, N, 1e-5), free(g);
  expect_close("layernorm_fwd rstd", g = back(d_rstd, N), rstd, N, 1e-5), free(g);
  expect_close("layernorm_bwd dx", g = back(d_dx, N * C), dx, N * C, 1e-5), free(g);
  expect_close("layernorm_bwd dw", g = back(d_dw, C), dw, C, 1e-5), free(g);
  expect_close("layernorm_bwd db", g = back(d_db, C), db, C, 1e-5), free(g);

  /* Bias-gradient column sums over more rows than one partial chunk. */
  enum { R = 600, OC = 97 };
  float *d2 = rand_floats((size_t)R * OC, 1), *acc = rand_floats(OC, 1), *want = malloc(OC * 4);
  memcpy(want, acc, OC * 4);
  for (int r = 0; r < R; r++) cpuk_acc(want, d2 + (size_t)r * OC, OC);
  float *d_d2 = dev(d2, (size_t)R * OC * 4), *d_acc = dev(acc, OC * 4), *d_part2 = dev(NULL, cudak_colsum_scratch(R, OC) * 4);
  CHECK_EQ_INT(cudak_colsum(d_acc, NULL, d_part2, d_d2, NULL, NULL, NULL, R, OC, NULL), 0);
  expect_close("colsum (bias grad)", g = back(d_acc, OC), want, OC, 1e-5), free(g);
  free(x), free(w), free(b), free(dout), free(out), free(dx), free(dw), free(db), free(dx0), free(dw0), free(db0);
  free(d2), free(acc), free(want);
  cudak_free(d_x), cudak_free(d_w), cudak_free(d_b), cudak_free(d_out), cudak_free(d_mean), cudak_free(d_rstd);
  cudak_free(d_dout), cudak_free(d_dx), cudak_free(d_dw), cudak_free(d_db), cudak_free(d_part);
  cudak_free(d_d2), cudak_free(d_acc), cudak_free(d_part2);
}

static void test_bias_gelu(void) {
  enum { OC = 4 * C };
  float *out = rand_floats(N * OC, 3), *bias = rand_floats(OC, 1), *res = rand_floats(N * OC, 1);
  float *d_out = dev(out, N * OC * 4), *d_bias = dev(bias, OC * 4), *d_res = dev(res, N * OC * 4);
  float *want = malloc(N * OC * 4), *act = malloc(N * OC * 4), *g;
  memcpy(want, out, N * OC * 4);
  for (int n = 0; n < N; n++) cpuk_add_bias_row(want + n * OC, bias, res + n * OC, OC);
  CHECK_EQ_INT(cudak_bias_add(d_out, d_bias, d_res, N, OC, NULL), 0);
  expect_close("bias_add +res", g = back(d_out, N * OC), want, N * OC, 1e-6), free(g);
  for (int n = 0; n < N; n++) cpuk_add_bias_row(want + n * OC, bias, NULL, OC);
  CHECK_EQ_INT(cudak_bias_add(d_out, d_bias, NULL, N, OC, NULL), 0);
  expect_close("bias_add", g = back(d_out, N * OC), want, N * OC, 1e-6), free(g);

  float *d_act = dev(NULL, N * OC * 4);
  for (int n = 0; n < N; n++) cpuk_bias_gelu_row(want + n * OC, act + n * OC, bias, OC);
  CHECK_EQ_INT(cudak_bias_gelu(d_out, d_act, d_bias, N, OC, NULL), 0);
  expect_close("bias_gelu pre", g = back(d_out, N * OC), want, N * OC, 1e-6), free(g);
  expect_close("bias_gelu act", g = back(d_act, N * OC), act, N * OC, 1e-5), free(g);
  float *d = rand_floats(N * OC, 1), *d_d = dev(d, N * OC * 4);
  for (int n = 0; n < N; n++) cpuk_gelu_bwd_row(d + n * OC, want + n * OC, OC);
  CHECK_EQ_INT(cudak_gelu_bwd(d_d, d_out, (size_t)N * OC, NULL), 0);
  expect_close("gelu_bwd", g = back(d_d, N * OC), d, N * OC, 1e-5), free(g);
  free(out), free(bias), free(res), free(want), free(act), free(d);
  cudak_free(d_out), cudak_free(d_bias), cudak_free(d_res), cudak_free(d_act), cudak_free(d_d);
}

static void test_attention_layout(void) {
  const size_t NC = (size_t)N * C;
  float *qkv = rand_floats(3 * NC, 1), *want = malloc(3 * NC * 4), *g;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++)
        for (int d = 0; d < HS; d++)
          for (int part = 0; part < 3; part++)
            want[part * NC + (((size_t)b * NH + h) * T + t) * HS + d] = qkv[((size_t)b * T + t) * 3 * C + part * C + h * HS + d];
  float *d_qkv = dev(qkv, 3 * NC * 4), *d_r = dev(NULL, 3 * NC * 4), *d_back = dev(NULL, 3 * NC * 4);
  CHECK_EQ_INT(cudak_qkv_permute(d_r, d_r + NC, d_r + 2 * NC, d_qkv, B, T, NH, HS, NULL), 0);
  expect_close("qkv_permute", g = back(d_r, 3 * NC), want, 3 * NC, 0), free(g);
  CHECK_EQ_INT(cudak_qkv_unpermute(d_back, d_r, d_r + NC, d_r + 2 * NC, B, T, NH, HS, NULL), 0);
  expect_close("qkv_unpermute", g = back(d_back, 3 * NC), qkv, 3 * NC, 0), free(g);
  CHECK_EQ_INT(cudak_heads(d_back, d_qkv, B, T, NH, HS, 0, NULL), 0); /* (B,T,C) view of the first NC */
  CHECK_EQ_INT(cudak_heads(d_r, d_back, B, T, NH, HS, 1, NULL), 0);
  expect_close("heads round trip", g = back(d_r, NC), qkv, NC, 0), free(g);
  free(qkv), free(want);
  cudak_free(d_qkv), cudak_free(d_r), cudak_free(d_back);
}

static void test_softmax(void) {
  enum { BH = 5, TT = 70 };
  const size_t n = (size_t)BH * TT * TT;
  float *s = rand_floats(n, 4), *d = rand_floats(n, 1), *g;
  for (size_t i = 0; i < n; i += 13) s[i] = NAN; /* masked positions must not leak: set some above diagonal */
  for (size_t r = 0; r < (size_t)BH * TT; r++)
    for (int u = 0; u <= (int)(r % TT); u++)
      if (isnan(s[r * TT + u])) s[r * TT + u] = 0.5f;
  float *d_s = dev(s, n * 4), *d_d = dev(d, n * 4);
  for (size_t r = 0; r < (size_t)BH * TT; r++) cpuk_causal_softmax_row(s + r * TT, (int)(r % TT), TT);
  CHECK_EQ_INT(cudak_causal_softmax(d_s, (size_t)BH * TT, TT, NULL), 0);
  expect_close("causal_softmax", g = back(d_s, n), s, n, 1e-5), free(g);
  for (size_t r = 0; r < (size_t)BH * TT; r++) cpuk_causal_softmax_bwd_row(d + r * TT, s + r * TT, (int)(r % TT), TT, 0.3f);
  CHECK_EQ_INT(cudak_causal_softmax_bwd(d_d, d_s, (size_t)BH * TT, TT, 0.3f, NULL), 0);
  expect_close("causal_softmax_bwd", g = back(d_d, n), d, n, 1e-5), free(g);
  free(s), free(d);
  cudak_free(d_s), cudak_free(d_d);
}

static void test_xent(void) {
  enum { VV = 5003 };
  float *l = rand_floats((size_t)N * VV, 6), losses[N], lse[N], *g;
  int tg[N];
  for (int n = 0; n < N; n++) tg[n] = (n * 977) % VV;
  float *d_l = dev(l, (size_t)N * VV * 4), *d_losses = dev(NULL, N * 4), *d_lse = dev(NULL, N * 4);
  int *d_tg = dev(tg, sizeof tg);
  double sum = 0, got_sum = 0;
  for (int n = 0; n < N; n++) sum += losses[n] = cpuk_xent_row(l + (size_t)n * VV, VV, tg[n], &lse[n]);
  CHECK_EQ_INT(cudak_xent_fwd(d_losses, d_lse, d_l, d_tg, N, VV, NULL), 0);
  expect_close("xent_fwd loss", g = back(d_losses, N), losses, N, 1e-5), free(g);
  expect_close("xent_fwd lse", g = back(d_lse, N), lse, N, 1e-6), free(g);
  double *d_sum = dev(NULL, sizeof(double));
  CHECK_EQ_INT(cudak_sum(d_sum, d_losses, N, NULL), 0);
  CHECK_EQ_INT(cudak_d2h(&got_sum, d_sum, sizeof got_sum), 0);
  CHECK_NEAR(got_sum, sum, 1e-5 * fabs(sum));
  for (int n = 0; n < N; n++) cpuk_xent_bwd_row(l + (size_t)n * VV, VV, tg[n], lse[n], 1.0f / N);
  CHECK_EQ_INT(cudak_xent_bwd(d_l, d_lse, d_tg, N, VV, 1.0f / N, NULL), 0);
  expect_close("xent_bwd", g = back(d_l, (size_t)N * VV), l, (size_t)N * VV, 1e-5), free(g);
  free(l);
  cudak_free(d_l), cudak_free(d_losses), cudak_free(d_lse), cudak_free(d_tg), cudak_free(d_sum);
}

static void test_adamw(void) {
  /* Two tensors, one decayed, spanning several segments with a partial last one. */
  const size_t n1 = 2 * CUDAK_SEG + 123, n2 = 777, n = n1 + n2;
  float *p = rand_floats(n, 1), *gr = rand_floats(n, 0.5f), *m = rand_floats(n, 0.1f), *v = rand_floats(n, 0.1f), *g;
  for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
  cudak_seg segs[8];
  int ns = 0;
  for (size_t o = 0; o < n1; o += CUDAK_SEG) segs[ns++] = (cudak_seg){o, (int)(n1 - o < CUDAK_SEG ? n1 - o : CUDAK_SEG), 1};
  segs[ns++] = (cudak_seg){n1, (int)n2, 0};
  float *d_p = dev(p, n * 4), *d_g = dev(gr, n * 4), *d_m = dev(m, n * 4), *d_v = dev(v, n * 4), *d_scal = dev(NULL, 8);
  cudak_seg *d_segs = dev(segs, sizeof segs);
  double *d_ss = dev(NULL, ns * sizeof(double));
  double sumsq = 0;
  for (int s = 0; s < ns; s++) sumsq += cpuk_sumsq(gr + segs[s].off, (size_t)segs[s].n);
  const float norm = (float)sqrt(sumsq), max_norm = 0.5f * norm, clip = max_norm / (norm + 1e-6f);
  CHECK_EQ_INT(cudak_sumsq_segs(d_ss, d_g, d_segs, ns, NULL), 0);
  CHECK_EQ_INT(cudak_norm_clip(d_scal, d_ss, ns, max_norm, NULL), 0);
  float scal[2];
  CHECK_EQ_INT(cudak_d2h(scal, d_scal, sizeof scal), 0);
  CHECK_NEAR(scal[0], norm, 1e-6 * norm);
  CHECK_NEAR(scal[1], clip, 1e-6);
  for (int s = 0; s < ns; s++)
    cpuk_adamw(p + segs[s].off, gr + segs[s].off, m + segs[s].off, v + segs[s].off, (size_t)segs[s].n, clip,
               segs[s].decay ? 0.999f : 1.0f, 0.9f, 0.1f, 0.95f, 0.05f, 0.3f, 1e-8f, -0.01f);
  CHECK_EQ_INT(cudak_adamw(d_p, d_g, d_m, d_v, d_segs, ns, d_scal + 1, 0.999f, 0.9f, 0.1f, 0.95f, 0.05f, 0.3f, 1e-8f,
                           -0.01f, NULL), 0);
  /* Same clip value on both sides (the device's), so the update must agree to rounding. */
  expect_close("adamw p", g = back(d_p, n), p, n, 1e-6), free(g);
  expect_close("adamw m", g = back(d_m, n), m, n, 1e-6), free(g);
  expect_close("adamw v", g = back(d_v, n), v, n, 1e-6), free(g);
  expect_close("adamw clipped g", g = back(d_g, n), gr, n, 1e-6), free(g);
  free(p), free(gr), free(m), free(v);
  cudak_free(d_p), cudak_free(d_g), cudak_free(d_m), cudak_free(d_v), cudak_free(d_scal), cudak_free(d_segs), cudak_free(d_ss);
}

/* Muon's passes against cpuk_muon_momentum / cpuk_muon_update (both orientations, Nesterov and
 * not, a clip below 1 read from device memory) and the normalisation against cpuk_sumsq. */
static void test_muon(void) {
  const int rows = 237, cols = 191; /* more than one normalisation chunk */
  const size_t n = (size_t)rows * cols;
  const float clip = 0.7f;
  for (int flip = 0; flip < 2; flip++) {
    const int nest = !flip;
    float *buf = rand_floats(n, 0.1f), *gr = rand_floats(n, 0.5f), *th = rand_floats(n, 1), *X = malloc(n * 4), *g;
    float *d_buf = dev(buf, n * 4), *d_g = dev(gr, n * 4), *d_th = dev(th, n * 4), *d_X = dev(NULL, n * 4);
    float *d_clip = dev(&clip, 4);
    cpuk_muon_momentum(buf, gr, X, rows, cols, 0, rows, flip, clip, 0.05f, 0.95f, nest);
    CHECK_EQ_INT(cudak_muon_momentum(d_buf, d_g, d_X, rows, cols, flip, d_clip, 0.05f, 0.95f, nest, NULL), 0);
    expect_close(flip ? "muon buf (flip)" : "muon buf", g = back(d_buf, n), buf, n, 1e-6), free(g);
    expect_close(flip ? "muon clipped g (flip)" : "muon clipped g", g = back(d_g, n), gr, n, 1e-6), free(g);
    expect_close(flip ? "muon X (flip)" : "muon X", g = back(d_X, n), X, n, 1e-6), free(g);
    const float norm = (float)sqrt(cpuk_sumsq(X, n));
    for (size_t i = 0; i < n; i++) X[i] /= norm;
    double *d_part = dev(NULL, cudak_muon_norm_scratch(n) * sizeof(double));
    CHECK_EQ_INT(cudak_muon_normalize(d_X, n, d_part, NULL), 0);
    expect_close("muon normalize", g = back(d_X, n), X, n, 1e-6), free(g);
    cudak_free(d_part);
    cpuk_muon_update(th, X, rows, cols, 0, rows, flip, 0.998f, -0.03f);
    CHECK_EQ_INT(cudak_muon_update(d_th, d_X, rows, cols, flip, 0.998f, -0.03f, NULL), 0);
    expect_close(flip ? "muon update (flip)" : "muon update", g = back(d_th, n), th, n, 1e-6), free(g);
    free(buf), free(gr), free(th), free(X);
    cudak_free(d_buf), cudak_free(d_g), cudak_free(d_th), cudak_free(d_X), cudak_free(d_clip);
  }
}

static void test_bf16(void) {
  const size_t n = 1001;
  float *x = rand_floats(n, 100);
  x[0] = 1.0f + 1.0f / 256; /* a tie: rounds to even (1.0) */
  x[1] = 1.0f + 3.0f / 256; /* a tie: rounds to even (1 + 4/256) */
  float *d_x = dev(x, n * 4);
  uint16_t *d_h = dev(NULL, n * 2), *h = malloc(n * 2);
  CHECK_EQ_INT(cudak_to_bf16(d_h, d_x + 1, n - 1, NULL), 0); /* misaligned start: scalar path */
  CHECK_EQ_INT(cudak_to_bf16(d_h, d_x, n, NULL), 0);
  CHECK_EQ_INT(cudak_sync(), 0);
  CHECK_EQ_INT(cudak_d2h(h, d_h, n * 2), 0);
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16; /* round to nearest even */
    bad += h[i] != (uint16_t)r;
  }
  CHECK_EQ_INT(bad, 0);
  CHECK_EQ_INT(h[0], 0x3F80);
  CHECK_EQ_INT(h[1], 0x3F82);
  free(x), free(h);
  cudak_free(d_x), cudak_free(d_h);
}

int main(void) {
  int ndev = cudak_device_count();
  if (ndev == 0) {
    fprintf(stderr, "SKIP: no CUDA device visible (the kernels compiled; run on a GPU machine to test them)\n");
    return 77;
  }
  char name[128];
  int major = 0, minor = 0;
  cudak_device_info(0, name, sizeof name, &major, &minor);
  fprintf(stderr, "device 0: %s (sm_%d%d)\n", name, major, minor);
  test_encoder();
  test_layernorm();
  test_bias_gelu();
  test_attention_layout();
  test_softmax();
  test_xent();
  test_adamw();
  test_muon();
  test_bf16();
  TEST_DONE();
}
