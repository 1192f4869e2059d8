/* test_cuda_llama.c — the CUDA twins of the Llama-class leaf kernels (kernels/cuda/cuda_llama.cu)
 * against their CPU twins (kernels/cpu/llama_kernels.c), as test_cuda_kernels.c does for GPT-2:
 * random inputs batched over B sequences, both sides run, max|gpu - cpu| / max|cpu| per output
 * within 1e-5, and every device computation run twice from the same inputs must agree bit for
 * bit (no atomics, fixed summation order). Shapes are odd on purpose (C not a multiple of 32,
 * rows not a multiple of a block, more rows than one dw chunk, q/k/v as slices of one fused
 * projection row). The argument checks run everywhere; the rest needs a GPU, and without one
 * the test prints why and exits 77, which ctest reports as skipped. */
#include "common/errors.h"
#include "kernels/cpu/llama_kernels.h"
#include "kernels/cuda/cuda_llama.h"
#include "tests/unit/test.h"

#include <stdint.h>
#include <string.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) / 8388608.0 - 1.0);
}
static float *rand_floats(size_t n, float scale) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = scale * frand();
  return p;
}
static float *copy_floats(const float *src, size_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  memcpy(p, src, n * sizeof(float));
  return p;
}

static float *dev(const float *host, size_t n) {
  void *d = NULL;
  if (cudak_malloc(&d, n * sizeof(float)) || (host && cudak_h2d(d, host, n * sizeof(float)))) {
    fprintf(stderr, "device setup failed: %s\n", dpc_errmsg());
    exit(1);
  }
  return d;
}
static void back(float *host, const float *d, size_t n) {
  if (cudak_sync() || cudak_d2h(host, d, n * sizeof(float))) {
    fprintf(stderr, "device read failed: %s\n", dpc_errmsg());
    exit(1);
  }
}
#define RUN(call)                                                                  \
  do {                                                                             \
    if ((call) != 0) {                                                             \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, dpc_errmsg()); \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

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
    fprintf(stderr, "FAIL %-26s rel err %.3g > %g\n", what, e, tol);
  } else {
    fprintf(stderr, "ok   %-26s rel err %.3g\n", what, e);
  }
}

/* The two device runs of one output must be bit-identical. */
static void expect_same_bits(const char *what, const float *a, const float *b, size_t n) {
  test_checks++;
  if (memcmp(a, b, n * sizeof(float)) != 0) {
    test_failures++;
    fprintf(stderr, "FAIL %-26s differs between two runs\n", what);
  }
}

/* Compare a device output (run twice: got[0], got[1]) with the CPU's. */
static void compare(const char *what, float *const got[2], const float *want, size_t n) {
  expect_close(what, got[0], want, n, 1e-5);
  expect_same_bits(what, got[0], got[1], n);
}

enum { B = 3, T = 37, N = B * T };

/* ---- RMSNorm: 600 rows (three dw chunks) of 75 ------------------------------------------- */

enum { RR = 600, RC = 75 };
#define RMS_EPS 1e-5f

static void rms_gpu(float *out, float *rstd, float *dx, float *dw, const float *x, const float *w, const float *dout,
                    const float *dx0, const float *dw0) {
  const size_t n = (size_t)RR * RC;
  float *d_x = dev(x, n), *d_w = dev(w, RC), *d_dout = dev(dout, n), *d_dx = dev(dx0, n), *d_dw = dev(dw0, RC);
  float *d_out = dev(NULL, n), *d_rstd = dev(NULL, RR), *d_part = dev(NULL, cudak_rmsnorm_dw_scratch(RR, RC));
  RUN(cudak_rmsnorm_fwd(d_out, d_rstd, d_x, d_w, RR, RC, RMS_EPS, NULL));
  RUN(cudak_rmsnorm_bwd_dx(d_dx, d_dout, d_x, d_w, d_rstd, RR, RC, 1, NULL));
  RUN(cudak_rmsnorm_dw(d_dw, d_part, d_dout, d_x, d_rstd, RR, RC, NULL));
  back(out, d_out, n), back(rstd, d_rstd, RR), back(dx, d_dx, n), back(dw, d_dw, RC);
  cudak_free(d_x), cudak_free(d_w), cudak_free(d_dout), cudak_free(d_dx), cudak_free(d_dw);
  cudak_free(d_out), cudak_free(d_rstd), cudak_free(d_part);
}

static void test_rmsnorm(void) {
  const size_t n = (size_t)RR * RC;
  float *x = rand_floats(n, 2), *w = rand_floats(RC, 1), *dout = rand_floats(n, 1);
  float *dx0 = rand_floats(n, 1), *dw0 = rand_floats(RC, 1); /* both accumulate onto these */
  for (size_t i = 0; i < n; i += 7) x[i] += 0.5f;
  float *out = malloc(n * 4), *rstd = malloc(RR * 4), *dx = copy_floats(dx0, n), *dw = copy_floats(dw0, RC);
  for (int r = 0; r < RR; r++) llamak_rmsnorm_fwd(out + (size_t)r * RC, &rstd[r], x + (size_t)r * RC, w, RC, RMS_EPS);
  for (int r = 0; r < RR; r++)
    llamak_rmsnorm_bwd(dx + (size_t)r * RC, dw, dout + (size_t)r * RC, x + (size_t)r * RC, w, rstd[r], RC, 1);
  float *g_out[2], *g_rstd[2], *g_dx[2], *g_dw[2];
  for (int k = 0; k < 2; k++) {
    g_out[k] = malloc(n * 4), g_rstd[k] = malloc(RR * 4), g_dx[k] = malloc(n * 4), g_dw[k] = malloc(RC * 4);
    rms_gpu(g_out[k], g_rstd[k], g_dx[k], g_dw[k], x, w, dout, dx0, dw0);
  }
  compare("rmsnorm_fwd out", g_out, out, n);
  compare("rmsnorm_fwd rstd", g_rstd, rstd, RR);
  compare("rmsnorm_bwd dx (acc)", g_dx, dx, n);
  compare("rmsnorm_dw", g_dw, dw, RC);
  for (int k = 0; k < 2; k++) free(g_out[k]), free(g_rstd[k]), free(g_dx[k]), free(g_dw[k]);
  free(x), free(w), free(dout), free(dx0), free(dw0), free(out), free(rstd), free(dx), free(dw);
}

/* ---- RoPE on the q and k slices of a fused [N, (NH + 2*NKV)*D] row ----------------------- */

enum { RNH = 6, RNKV = 2, RD = 14, RH = RD / 2, RLD = (RNH + 2 * RNKV) * RD, P0 = 5 };

/* Forward on q and k (fwd holds the result), then the backward on that (bwd). */
static void rope_gpu(float *fwd, float *bwd, const float *x, const float *cos_t, const float *sin_t) {
  const size_t n = (size_t)N * RLD, nt = (size_t)(T + P0) * RH;
  float *d_x = dev(x, n), *d_cos = dev(cos_t, nt), *d_sin = dev(sin_t, nt);
  for (int dir = 0; dir < 2; dir++) {
    RUN(cudak_rope(d_x, RLD, d_cos + P0 * RH, d_sin + P0 * RH, B, T, RNH, RD, dir, NULL));
    RUN(cudak_rope(d_x + RNH * RD, RLD, d_cos + P0 * RH, d_sin + P0 * RH, B, T, RNKV, RD, dir, NULL));
    back(dir ? bwd : fwd, d_x, n);
  }
  cudak_free(d_x), cudak_free(d_cos), cudak_free(d_sin);
}

/* x rotated in place on the q and k slices of every sequence, forward or backward. */
static void rope_cpu(float *x, const float *cos_t, const float *sin_t, int bwd) {
  for (int b = 0; b < B; b++) {
    float *xb = x + (size_t)b * T * RLD;
    if (bwd) {
      llamak_rope_bwd(xb, RLD, cos_t + P0 * RH, sin_t + P0 * RH, T, RNH, RD);
      llamak_rope_bwd(xb + RNH * RD, RLD, cos_t + P0 * RH, sin_t + P0 * RH, T, RNKV, RD);
    } else {
      llamak_rope_fwd(xb, RLD, cos_t + P0 * RH, sin_t + P0 * RH, T, RNH, RD);
      llamak_rope_fwd(xb + RNH * RD, RLD, cos_t + P0 * RH, sin_t + P0 * RH, T, RNKV, RD);
    }
  }
}

static void test_rope(void) {
  const size_t n = (size_t)N * RLD, nt = (size_t)(T + P0) * RH;
  llamak_rope r = {LLAMAK_ROPE_LLAMA3, 10000.0, 8.0, 1.0, 4.0, 64.0}; /* all three wavelength bands */
  double inv_freq[RH];
  CHECK_EQ_INT(llamak_rope_inv_freq(inv_freq, RD, &r), 0);
  float *cos_t = malloc(nt * 4), *sin_t = malloc(nt * 4);
  llamak_rope_table(cos_t, sin_t, inv_freq, T + P0, RD); /* uploaded as they are: same tables */
  float *x = rand_floats(n, 1), *want_f = copy_floats(x, n);
  rope_cpu(want_f, cos_t, sin_t, 0);
  float *want_b = copy_floats(want_f, n);
  rope_cpu(want_b, cos_t, sin_t, 1);
  float *g_f[2], *g_b[2];
  for (int k = 0; k < 2; k++) {
    g_f[k] = malloc(n * 4), g_b[k] = malloc(n * 4);
    rope_gpu(g_f[k], g_b[k], x, cos_t, sin_t);
  }
  compare("rope_fwd (q, k slices)", g_f, want_f, n);
  compare("rope_bwd (q, k slices)", g_b, want_b, n);
  for (int k = 0; k < 2; k++) free(g_f[k]), free(g_b[k]);
  free(cos_t), free(sin_t), free(x), free(want_f), free(want_b);
}

/* ---- SwiGLU on the halves of a fused gate/up row [N, 2*NI] ------------------------------- */

enum { NI = 53, GLD = 2 * NI };

static void swiglu_gpu(float *h, float *dgu, const float *gu, const float *dh) {
  const size_t ng = (size_t)N * GLD, nh = (size_t)N * NI;
  float *d_gu = dev(gu, ng), *d_dh = dev(dh, nh), *d_h = dev(NULL, nh), *d_dgu = dev(NULL, ng);
  RUN(cudak_swiglu_fwd(d_h, NI, d_gu, d_gu + NI, GLD, N, NI, NULL));
  RUN(cudak_swiglu_bwd(d_dgu, d_dgu + NI, d_dh, NI, d_gu, d_gu + NI, GLD, N, NI, NULL));
  back(h, d_h, nh), back(dgu, d_dgu, ng);
  cudak_free(d_gu), cudak_free(d_dh), cudak_free(d_h), cudak_free(d_dgu);
}

static void test_swiglu(void) {
  const size_t ng = (size_t)N * GLD, nh = (size_t)N * NI;
  float *gu = rand_floats(ng, 4), *dh = rand_floats(nh, 1);
  gu[0] = -100.0f, gu[1] = 100.0f, gu[2] = -30.0f; /* saturated gates: no NaN on either side */
  float *h = malloc(nh * 4), *dgu = malloc(ng * 4);
  for (int r = 0; r < N; r++) {
    const float *g = gu + (size_t)r * GLD;
    llamak_swiglu_fwd(h + (size_t)r * NI, g, g + NI, NI);
    llamak_swiglu_bwd(dgu + (size_t)r * GLD, dgu + (size_t)r * GLD + NI, dh + (size_t)r * NI, g, g + NI, NI);
  }
  float *g_h[2], *g_dgu[2];
  for (int k = 0; k < 2; k++) {
    g_h[k] = malloc(nh * 4), g_dgu[k] = malloc(ng * 4);
    swiglu_gpu(g_h[k], g_dgu[k], gu, dh);
  }
  compare("swiglu_fwd", g_h, h, nh);
  compare("swiglu_bwd (dgate, dup)", g_dgu, dgu, ng);
  for (int k = 0; k < 2; k++) free(g_h[k]), free(g_dgu[k]);
  free(gu), free(dh), free(h), free(dgu);
}

/* ---- grouped-query attention on a fused qkv row [N, (NH + 2*NKV)*D] ---------------------- */

typedef struct {
  int nh, nkv, d;
} attn_cfg;

static int cfg_ld(attn_cfg c) { return (c.nh + 2 * c.nkv) * c.d; }

/* out [N, nh*d], att [B, nh, T, T]; dqkv starts as dqkv0 (dq overwritten, dk/dv accumulated). */
static void attn_cpu(attn_cfg c, float *out, float *att, float *dqkv, const float *qkv, const float *dout) {
  const int ld = cfg_ld(c), ldo = c.nh * c.d;
  float scratch[T];
  for (int b = 0; b < B; b++)
    for (int h = 0; h < c.nh; h++) { /* h ascending: the order the dk/dv sums are defined in */
      const int j = llamak_kv_head(h, c.nh, c.nkv);
      const size_t qo = (size_t)b * T * ld + (size_t)h * c.d, oo = (size_t)b * T * ldo + (size_t)h * c.d;
      const size_t ko = (size_t)b * T * ld + (size_t)(c.nh + j) * c.d, vo = ko + (size_t)c.nkv * c.d;
      float *a = att + ((size_t)b * c.nh + h) * T * T;
      llamak_attn_fwd(out + oo, ldo, a, qkv + qo, ld, qkv + ko, qkv + vo, ld, T, c.d);
      llamak_attn_bwd(dqkv + qo, dqkv + ko, dqkv + vo, scratch, dout + oo, ldo, a, qkv + qo, ld, qkv + ko, qkv + vo,
                      ld, T, c.d);
    }
}

static void attn_gpu(attn_cfg c, float *out, float *att, float *dqkv, const float *qkv, const float *dout,
                     const float *dqkv0) {
  const int ld = cfg_ld(c), ldo = c.nh * c.d, ko = c.nh * c.d, vo = (c.nh + c.nkv) * c.d;
  const size_t n = (size_t)N * ld, no = (size_t)N * ldo, na = (size_t)B * c.nh * T * T;
  float *d_qkv = dev(qkv, n), *d_dout = dev(dout, no), *d_dqkv = dev(dqkv0, n);
  float *d_out = dev(NULL, no), *d_att = dev(NULL, na), *d_datt = dev(NULL, na);
  RUN(cudak_gqa_attn_fwd(d_out, ldo, d_att, d_qkv, ld, d_qkv + ko, d_qkv + vo, ld, B, T, c.nh, c.nkv, c.d, NULL));
  RUN(cudak_gqa_attn_bwd(d_dqkv, d_dqkv + ko, d_dqkv + vo, d_datt, d_dout, ldo, d_att, d_qkv, ld, d_qkv + ko,
                         d_qkv + vo, ld, B, T, c.nh, c.nkv, c.d, NULL));
  back(out, d_out, no), back(att, d_att, na), back(dqkv, d_dqkv, n);
  cudak_free(d_qkv), cudak_free(d_dout), cudak_free(d_dqkv), cudak_free(d_out), cudak_free(d_att);
  cudak_free(d_datt);
}

static void test_attention(attn_cfg c) {
  const size_t n = (size_t)N * cfg_ld(c), no = (size_t)N * c.nh * c.d, na = (size_t)B * c.nh * T * T;
  float *qkv = rand_floats(n, 1), *dout = rand_floats(no, 1), *dqkv0 = rand_floats(n, 1);
  float *out = malloc(no * 4), *att = malloc(na * 4), *dqkv = copy_floats(dqkv0, n);
  attn_cpu(c, out, att, dqkv, qkv, dout);
  float *g_out[2], *g_att[2], *g_dqkv[2];
  for (int k = 0; k < 2; k++) {
    g_out[k] = malloc(no * 4), g_att[k] = malloc(na * 4), g_dqkv[k] = malloc(n * 4);
    attn_gpu(c, g_out[k], g_att[k], g_dqkv[k], qkv, dout, dqkv0);
  }
  fprintf(stderr, "attention NH %d, NKV %d, D %d:\n", c.nh, c.nkv, c.d);
  compare("gqa_attn_fwd out", g_out, out, no);
  compare("gqa_attn_fwd att", g_att, att, na);
  compare("gqa_attn_bwd dq, dk+, dv+", g_dqkv, dqkv, n);
  for (int k = 0; k < 2; k++) free(g_out[k]), free(g_att[k]), free(g_dqkv[k]);
  free(qkv), free(dout), free(dqkv0), free(out), free(att), free(dqkv);
}

/* ---- argument checks (no device needed: they return before any CUDA call) ---------------- */

static void test_args(void) {
  float *p = (float *)(uintptr_t)64; /* never dereferenced */
  CHECK_EQ_INT(cudak_gqa_attn_fwd(p, 40, p, p, 40, p, p, 16, B, T, 5, 2, 8, NULL), DPC_EINVAL); /* NH % NKV */
  CHECK_EQ_INT(cudak_gqa_attn_fwd(p, 40, p, p, 40, p, p, 16, B, T, 4, 0, 8, NULL), DPC_EINVAL);
  CHECK_EQ_INT(cudak_gqa_attn_bwd(p, p, p, p, p, 32, p, p, 31, p, p, 16, B, T, 4, 2, 8, NULL), DPC_EINVAL); /* ldq */
  CHECK_EQ_INT(cudak_rope(p, 60, p, p, B, T, 4, 15, 0, NULL), DPC_EINVAL); /* odd D */
  CHECK_EQ_INT(cudak_rope(p, 59, p, p, B, T, 4, 16, 0, NULL), DPC_EINVAL); /* ldx < NH*D */
  CHECK_EQ_INT(cudak_swiglu_fwd(p, 10, p, p, 9, N, 10, NULL), DPC_EINVAL);
  CHECK_EQ_INT(cudak_rmsnorm_dw(p, p, p, p, p, 65535 * 256 + 1, 8, NULL), DPC_EINVAL); /* gridDim.y */
  /* Empty shapes launch nothing. */
  CHECK_EQ_INT(cudak_gqa_attn_fwd(p, 32, p, p, 32, p, p, 16, 0, T, 4, 2, 8, NULL), 0);
  CHECK_EQ_INT(cudak_rope(p, 64, p, p, B, 0, 4, 16, 1, NULL), 0);
  CHECK_EQ_INT(cudak_rmsnorm_fwd(p, p, p, p, 0, 8, 1e-5f, NULL), 0);
  CHECK_EQ_INT(cudak_swiglu_bwd(p, p, p, 10, p, p, 20, 0, 10, NULL), 0);
  CHECK_EQ_INT(cudak_rmsnorm_dw_scratch(0, 8), 0);
  CHECK_EQ_INT(cudak_rmsnorm_dw_scratch(257, 8), 16);
}

int main(void) {
  test_args();
  int ndev = cudak_device_count();
  if (ndev == 0) {
    if (test_failures) TEST_DONE();
    fprintf(stderr, "SKIP: no CUDA device visible (the kernels compiled and %d argument checks passed; run on a "
                    "GPU machine to test them)\n", test_checks);
    return 77;
  }
  char name[128];
  int major = 0, minor = 0;
  cudak_device_info(0, name, sizeof name, &major, &minor);
  fprintf(stderr, "device 0: %s (sm_%d%d)\n", name, major, minor);
  test_rmsnorm();
  test_rope();
  test_swiglu();
  test_attention((attn_cfg){6, 2, 16}); /* grouped: rep 3 */
  test_attention((attn_cfg){4, 1, 10}); /* multi-query: one KV head */
  test_attention((attn_cfg){3, 3, 8});  /* plain multi-head */
  TEST_DONE();
}
