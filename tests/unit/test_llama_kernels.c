/* test_llama_kernels.c — the Llama-class leaf kernels (kernels/cpu/llama_kernels.h) against
 * PyTorch (tests/oracle/llama_ops_oracle.py, Hugging Face's definitions in float64): every
 * forward output and every gradient of RMSNorm, RoPE (default and "llama3" frequencies),
 * SwiGLU and grouped-query causal attention, alone and as RoPE + attention on a fused qkv
 * buffer, on small odd shapes; each tensor must match to max|a - b| / max|b| <= 1e-5. Then
 * checks that need no oracle: long rope tables, refused rope parameters, accumulation modes and
 * bitwise repeatability. The oracle must run: a missing torch is a failure, not a skip.
 * Usage: test_llama_kernels ORACLE.py [PYTHON] */
#include "kernels/cpu/llama_kernels.h"
#include "tests/unit/test.h"

#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static const double TOL = 1e-5;

typedef struct {
  const char *what;
  int T, NH, NKV, D, I;
  float eps;
  llamak_rope rope;
} kcase;

static const kcase CASES[] = {
    /* grouped-query (rep 3), default rope */
    {"gqa", 7, 6, 2, 8, 20, 1e-5f, {LLAMAK_ROPE_DEFAULT, 10000.0, 0, 0, 0, 0}},
    /* NKV = NH, llama3 rope whose three bands (kept, interpolated, divided) all occur at D = 6 */
    {"mha-llama3", 9, 4, 4, 6, 37, 1e-6f, {LLAMAK_ROPE_LLAMA3, 10000.0, 8.0, 1.0, 4.0, 256.0}},
    /* one KV head for all, Llama 3.2's rope parameters */
    {"mqa-llama3.2", 13, 4, 1, 16, 23, 1e-5f, {LLAMAK_ROPE_LLAMA3, 500000.0, 32.0, 1.0, 4.0, 8192.0}},
};

static char dir[64];
static double worst_all = 0.0;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(rng >> 33);
}
static float next_normal(void) {
  double u1 = (next_u32() + 1.0) / 4294967297.0, u2 = next_u32() / 4294967296.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static float *randn(size_t n, float scale, float shift) {
  float *p = malloc(n * sizeof(float));
  if (!p) exit(1);
  for (size_t i = 0; i < n; i++) p[i] = shift + scale * next_normal();
  return p;
}

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n, sz);
  if (!p) exit(1);
  return p;
}

static void write_f32(const char *name, const float *p, size_t n) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s.bin", dir, name);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  size_t w = fwrite(p, sizeof(float), n, f);
  CHECK(fclose(f) == 0 && w == n);
}

/* Reads exactly n doubles of the oracle's out_NAME.bin; NULL (and a failed check) if missing or
 * of another size. */
static double *read_f64(const char *name, size_t n) {
  char path[256];
  snprintf(path, sizeof path, "%s/out_%s.bin", dir, name);
  double *p = malloc(n * sizeof(double));
  FILE *f = fopen(path, "rb");
  size_t r = f && p ? fread(p, sizeof(double), n, f) : 0;
  int extra = f ? fgetc(f) != EOF : 1;
  if (f) fclose(f);
  CHECK(r == n && !extra);
  if (r != n || extra) {
    fprintf(stderr, "oracle output %s: missing or not %zu doubles\n", name, n);
    free(p);
    return NULL;
  }
  return p;
}

static void remove_dir(void) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[512];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

/* max|got - want| / max|want| of tensor `name` against the oracle's; a check with TOL. */
static void compare(const char *name, const float *got, size_t n) {
  double *want = read_f64(name, n);
  if (!want) return;
  double md = 0.0, mb = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - want[i]);
    if (!(d <= md)) md = d; /* NaN sticks */
    if (fabs(want[i]) > mb) mb = fabs(want[i]);
  }
  double e = mb > 0.0 ? md / mb : md;
  test_checks++;
  if (!(e <= TOL)) {
    test_failures++;
    fprintf(stderr, "FAIL %-10s max rel err %.3g > %g\n", name, e, TOL);
  } else {
    fprintf(stderr, "  %-10s max rel err %.3g\n", name, e);
  }
  if (!(e <= worst_all)) worst_all = e;
  free(want);
}

/* The double inverse frequencies must agree element by element (1e-12 relative). */
static void compare_inv_freq(const double *got, int H) {
  double *want = read_f64("inv_freq", (size_t)H);
  if (!want) return;
  double e = 0.0;
  for (int i = 0; i < H; i++) {
    double r = fabs(got[i] - want[i]) / fabs(want[i]);
    if (!(r <= e)) e = r;
  }
  fprintf(stderr, "  %-10s max elementwise rel err %.3g\n", "inv_freq", e);
  CHECK(e <= 1e-12);
  free(want);
}

static int run_oracle(const char *python, const char *script) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", python, script, dir);
  int prc = system(cmd);
  CHECK_EQ_INT(prc, 0);
  if (prc != 0)
    fprintf(stderr, "oracle failed (%s); it needs torch at %s (tests/run.sh installs python3-torch)\n", cmd, python);
  return prc;
}

static int make_dir(void) {
  snprintf(dir, sizeof dir, "/tmp/dpc_llama_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    test_failures++;
    return -1;
  }
  return 0;
}

static int write_config(const kcase *cs, const char *mode) {
  const llamak_rope *r = &cs->rope;
  char txt[1024];
  int len = snprintf(txt, sizeof txt,
                     "mode %s\nT %d\nNH %d\nNKV %d\nD %d\nC %d\nI %d\neps %.9g\nrope_type %s\ntheta %.17g\n"
                     "factor %.17g\nlow_freq_factor %.17g\nhigh_freq_factor %.17g\n"
                     "original_max_position_embeddings %.17g\n",
                     mode, cs->T, cs->NH, cs->NKV, cs->D, cs->NH * cs->D, cs->I, cs->eps,
                     r->type == LLAMAK_ROPE_LLAMA3 ? "llama3" : "default", r->theta, r->factor,
                     r->low_freq_factor, r->high_freq_factor, r->original_max_position_embeddings);
  char path[256];
  snprintf(path, sizeof path, "%s/config.txt", dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  size_t w = fwrite(txt, 1, (size_t)len, f);
  return fclose(f) == 0 && w == (size_t)len ? 0 : -1;
}

/* One case's inputs, in the C layouts. */
typedef struct {
  float *rms_x, *rms_w, *rms_dy;            /* [T, C], [C], [T, C] */
  float *rope_q, *rope_k, *rope_gq, *rope_gk; /* [T, NH, D], [T, NKV, D], upstream grads alike */
  float *swi_gate, *swi_up, *swi_dh;        /* [T, I] each */
  float *att_q, *att_k, *att_v, *att_dout;  /* [T, NH, D], [T, NKV, D] x2, [T, NH, D] */
} kinputs;

static void make_inputs(kinputs *in, const kcase *cs) {
  const size_t T = cs->T, C = (size_t)cs->NH * cs->D, I = cs->I;
  const size_t nq = T * cs->NH * cs->D, nk = T * cs->NKV * cs->D;
  in->rms_x = randn(T * C, 1.0f, 0.0f);
  in->rms_w = randn(C, 0.3f, 1.0f);
  in->rms_dy = randn(T * C, 1.0f, 0.0f);
  in->rope_q = randn(nq, 1.0f, 0.0f);
  in->rope_k = randn(nk, 1.0f, 0.0f);
  in->rope_gq = randn(nq, 1.0f, 0.0f);
  in->rope_gk = randn(nk, 1.0f, 0.0f);
  in->swi_gate = randn(T * I, 3.0f, 0.0f);
  /* silu's tails: exp(-g) overflows float at g < -88.7, and large |g| saturates sigmoid. */
  const float tails[] = {-100.0f, 100.0f, -20.0f, 20.0f, 0.0f, -88.9f, 88.9f};
  for (size_t i = 0; i < sizeof tails / sizeof tails[0] && i < T * I; i++) in->swi_gate[i * 3 % (T * I)] = tails[i];
  in->swi_up = randn(T * I, 1.0f, 0.0f);
  in->swi_dh = randn(T * I, 1.0f, 0.0f);
  /* q and k scaled up so the probabilities are far from uniform. */
  in->att_q = randn(nq, 1.5f, 0.0f);
  in->att_k = randn(nk, 1.5f, 0.0f);
  in->att_v = randn(nk, 1.0f, 0.0f);
  in->att_dout = randn(nq, 1.0f, 0.0f);
  write_f32("rms_x", in->rms_x, T * C);
  write_f32("rms_w", in->rms_w, C);
  write_f32("rms_dy", in->rms_dy, T * C);
  write_f32("rope_q", in->rope_q, nq);
  write_f32("rope_k", in->rope_k, nk);
  write_f32("rope_gq", in->rope_gq, nq);
  write_f32("rope_gk", in->rope_gk, nk);
  write_f32("swi_gate", in->swi_gate, T * I);
  write_f32("swi_up", in->swi_up, T * I);
  write_f32("swi_dh", in->swi_dh, T * I);
  write_f32("att_q", in->att_q, nq);
  write_f32("att_k", in->att_k, nk);
  write_f32("att_v", in->att_v, nk);
  write_f32("att_dout", in->att_dout, nq);
}

static void free_inputs(kinputs *in) {
  float *all[] = {in->rms_x,    in->rms_w,  in->rms_dy,  in->rope_q, in->rope_k, in->rope_gq, in->rope_gk,
                  in->swi_gate, in->swi_up, in->swi_dh, in->att_q,  in->att_k,  in->att_v,   in->att_dout};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

static void check_rmsnorm(const kcase *cs, const kinputs *in) {
  const int T = cs->T, C = cs->NH * cs->D;
  float *out = xcalloc((size_t)T * C, sizeof(float)), *rstd = xcalloc((size_t)T, sizeof(float));
  float *dx = xcalloc((size_t)T * C, sizeof(float)), *dw = xcalloc((size_t)C, sizeof(float));
  for (int t = 0; t < T; t++) {
    llamak_rmsnorm_fwd(out + (size_t)t * C, rstd + t, in->rms_x + (size_t)t * C, in->rms_w, C, cs->eps);
    llamak_rmsnorm_bwd(dx + (size_t)t * C, dw, in->rms_dy + (size_t)t * C, in->rms_x + (size_t)t * C, in->rms_w,
                       rstd[t], C, 0);
  }
  compare("rms_out", out, (size_t)T * C);
  compare("rms_rstd", rstd, (size_t)T);
  compare("rms_dx", dx, (size_t)T * C);
  compare("rms_dw", dw, (size_t)C);
  free(out), free(rstd), free(dx), free(dw);
}

/* Fills the case's tables after checking its inverse frequencies; the caller frees both. */
static void make_tables(const kcase *cs, float **cos_t, float **sin_t) {
  const int H = cs->D / 2;
  double *inv = xcalloc((size_t)H, sizeof(double));
  CHECK_EQ_INT(llamak_rope_inv_freq(inv, cs->D, &cs->rope), 0);
  compare_inv_freq(inv, H);
  if (cs->rope.type == LLAMAK_ROPE_LLAMA3) { /* each case's frequencies fall in all three bands */
    llamak_rope plain = cs->rope;
    plain.type = LLAMAK_ROPE_DEFAULT;
    double *f0 = xcalloc((size_t)H, sizeof(double));
    CHECK_EQ_INT(llamak_rope_inv_freq(f0, cs->D, &plain), 0);
    int kept = 0, divided = 0, between = 0;
    for (int i = 0; i < H; i++) {
      if (inv[i] == f0[i]) kept++;
      else if (inv[i] == f0[i] / cs->rope.factor) divided++;
      else between++;
    }
    fprintf(stderr, "  llama3 bands: %d kept, %d interpolated, %d divided by factor\n", kept, between, divided);
    CHECK(kept > 0 && between > 0 && divided > 0);
    free(f0);
  }
  *cos_t = xcalloc((size_t)cs->T * H, sizeof(float));
  *sin_t = xcalloc((size_t)cs->T * H, sizeof(float));
  llamak_rope_table(*cos_t, *sin_t, inv, cs->T, cs->D);
  compare("cos", *cos_t, (size_t)cs->T * H);
  compare("sin", *sin_t, (size_t)cs->T * H);
  free(inv);
}

static void check_rope(const kcase *cs, const kinputs *in, const float *cos_t, const float *sin_t) {
  const int T = cs->T, NH = cs->NH, NKV = cs->NKV, D = cs->D;
  const size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D;
  float *q = xcalloc(nq, sizeof(float)), *k = xcalloc(nk, sizeof(float));
  memcpy(q, in->rope_q, nq * sizeof(float));
  memcpy(k, in->rope_k, nk * sizeof(float));
  llamak_rope_fwd(q, NH * D, cos_t, sin_t, T, NH, D);
  llamak_rope_fwd(k, NKV * D, cos_t, sin_t, T, NKV, D);
  compare("rope_q", q, nq);
  compare("rope_k", k, nk);
  memcpy(q, in->rope_gq, nq * sizeof(float));
  memcpy(k, in->rope_gk, nk * sizeof(float));
  llamak_rope_bwd(q, NH * D, cos_t, sin_t, T, NH, D);
  llamak_rope_bwd(k, NKV * D, cos_t, sin_t, T, NKV, D);
  compare("rope_dq", q, nq);
  compare("rope_dk", k, nk);
  free(q), free(k);
}

static void check_swiglu(const kcase *cs, const kinputs *in) {
  const int T = cs->T, I = cs->I;
  const size_t n = (size_t)T * I;
  float *h = xcalloc(n, sizeof(float)), *dg = xcalloc(n, sizeof(float)), *du = xcalloc(n, sizeof(float));
  for (int t = 0; t < T; t++) {
    const size_t o = (size_t)t * I;
    llamak_swiglu_fwd(h + o, in->swi_gate + o, in->swi_up + o, I);
    llamak_swiglu_bwd(dg + o, du + o, in->swi_dh + o, in->swi_gate + o, in->swi_up + o, I);
  }
  for (size_t i = 0; i < n; i++) CHECK(isfinite(h[i]) && isfinite(dg[i]) && isfinite(du[i]));
  compare("swi_h", h, n);
  compare("swi_dgate", dg, n);
  compare("swi_dup", du, n);
  free(h), free(dg), free(du);
}

/* Attention over separate blocks q [T, NH, D], k, v [T, NKV, D]: every head, then the backward
 * with query heads in ascending order. */
static void attention_all(const kcase *cs, float *out, float *att, float *dq, float *dk, float *dv,
                          const float *q, const float *k, const float *v, const float *dout) {
  const int T = cs->T, NH = cs->NH, NKV = cs->NKV, D = cs->D;
  float *scratch = xcalloc((size_t)T, sizeof(float));
  for (int h = 0; h < NH; h++) {
    const int j = llamak_kv_head(h, NH, NKV);
    llamak_attn_fwd(out + (size_t)h * D, NH * D, att + (size_t)h * T * T, q + (size_t)h * D, NH * D,
                    k + (size_t)j * D, v + (size_t)j * D, NKV * D, T, D);
  }
  memset(dk, 0, (size_t)T * NKV * D * sizeof(float));
  memset(dv, 0, (size_t)T * NKV * D * sizeof(float));
  for (int h = 0; h < NH; h++) {
    const int j = llamak_kv_head(h, NH, NKV);
    llamak_attn_bwd(dq + (size_t)h * D, dk + (size_t)j * D, dv + (size_t)j * D, scratch, dout + (size_t)h * D,
                    NH * D, att + (size_t)h * T * T, q + (size_t)h * D, NH * D, k + (size_t)j * D,
                    v + (size_t)j * D, NKV * D, T, D);
  }
  free(scratch);
}

static void check_attention(const kcase *cs, const kinputs *in) {
  const int T = cs->T, NH = cs->NH, NKV = cs->NKV, D = cs->D;
  const size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, np = (size_t)NH * T * T;
  float *out = xcalloc(nq, sizeof(float)), *att = xcalloc(np, sizeof(float)), *dq = xcalloc(nq, sizeof(float));
  float *dk = xcalloc(nk, sizeof(float)), *dv = xcalloc(nk, sizeof(float));
  attention_all(cs, out, att, dq, dk, dv, in->att_q, in->att_k, in->att_v, in->att_dout);
  compare("att_out", out, nq);
  compare("att_p", att, np);
  compare("att_dq", dq, nq);
  compare("att_dk", dk, nk);
  compare("att_dv", dv, nk);
  free(out), free(att), free(dq), free(dk), free(dv);
}

/* RoPE then attention on one fused buffer qkv [T, W], row t = (q heads, k heads, v heads, 3
 * unused floats), as a fused projection would leave it: strides other than NH*D everywhere. */
static void check_rope_attention(const kcase *cs, const kinputs *in, const float *cos_t, const float *sin_t) {
  const int T = cs->T, NH = cs->NH, NKV = cs->NKV, D = cs->D;
  const int QW = NH * D, KW = NKV * D, W = QW + 2 * KW + 3;
  const size_t nq = (size_t)T * QW;
  float *qkv = xcalloc((size_t)T * W, sizeof(float)), *dqkv = xcalloc((size_t)T * W, sizeof(float));
  float *out = xcalloc(nq, sizeof(float)), *att = xcalloc((size_t)NH * T * T, sizeof(float));
  float *scratch = xcalloc((size_t)T, sizeof(float)), *g = xcalloc(nq, sizeof(float));
  for (int t = 0; t < T; t++) {
    float *row = qkv + (size_t)t * W;
    memcpy(row, in->att_q + (size_t)t * QW, QW * sizeof(float));
    memcpy(row + QW, in->att_k + (size_t)t * KW, KW * sizeof(float));
    memcpy(row + QW + KW, in->att_v + (size_t)t * KW, KW * sizeof(float));
  }
  llamak_rope_fwd(qkv, W, cos_t, sin_t, T, NH, D);
  llamak_rope_fwd(qkv + QW, W, cos_t, sin_t, T, NKV, D);
  for (int h = 0; h < NH; h++) {
    const float *kj = qkv + QW + (size_t)llamak_kv_head(h, NH, NKV) * D;
    llamak_attn_fwd(out + (size_t)h * D, QW, att + (size_t)h * T * T, qkv + (size_t)h * D, W, kj, kj + KW, W, T, D);
  }
  compare("ar_out", out, nq);
  for (int h = 0; h < NH; h++) {
    const size_t kv = QW + (size_t)llamak_kv_head(h, NH, NKV) * D;
    llamak_attn_bwd(dqkv + (size_t)h * D, dqkv + kv, dqkv + kv + KW, scratch, in->att_dout + (size_t)h * D, QW,
                    att + (size_t)h * T * T, qkv + (size_t)h * D, W, qkv + kv, qkv + kv + KW, W, T, D);
  }
  llamak_rope_bwd(dqkv, W, cos_t, sin_t, T, NH, D);
  llamak_rope_bwd(dqkv + QW, W, cos_t, sin_t, T, NKV, D);
  const char *names[] = {"ar_dq", "ar_dk", "ar_dv"};
  const int offs[] = {0, QW, QW + KW}, widths[] = {QW, KW, KW};
  for (int s = 0; s < 3; s++) {
    for (int t = 0; t < T; t++)
      memcpy(g + (size_t)t * widths[s], dqkv + (size_t)t * W + offs[s], widths[s] * sizeof(float));
    compare(names[s], g, (size_t)T * widths[s]);
  }
  for (int t = 0; t < T; t++) /* the unused floats stay untouched */
    for (int i = QW + 2 * KW; i < W; i++) CHECK(dqkv[(size_t)t * W + i] == 0.0f);
  free(qkv), free(dqkv), free(out), free(att), free(scratch), free(g);
}

static void run_case(const kcase *cs, const char *python, const char *script) {
  fprintf(stderr, "== case %s: T=%d NH=%d NKV=%d D=%d C=%d I=%d rope %s\n", cs->what, cs->T, cs->NH, cs->NKV,
          cs->D, cs->NH * cs->D, cs->I, cs->rope.type == LLAMAK_ROPE_LLAMA3 ? "llama3" : "default");
  if (make_dir() != 0) return;
  kinputs in;
  make_inputs(&in, cs);
  CHECK(write_config(cs, "ops") == 0);
  if (run_oracle(python, script) != 0) {
    remove_dir();
    exit(1);
  }
  float *cos_t = NULL, *sin_t = NULL;
  check_rmsnorm(cs, &in);
  make_tables(cs, &cos_t, &sin_t);
  check_rope(cs, &in, cos_t, sin_t);
  check_swiglu(cs, &in);
  check_attention(cs, &in);
  check_rope_attention(cs, &in, cos_t, sin_t);
  free(cos_t), free(sin_t);
  free_inputs(&in);
  remove_dir();
}

/* Tables over long position ranges (angles up to ~8e3 rad): inverse frequencies, cos, sin. */
static void run_table_case(const kcase *cs, const char *python, const char *script) {
  fprintf(stderr, "== table %s: T=%d D=%d\n", cs->what, cs->T, cs->D);
  if (make_dir() != 0) return;
  CHECK(write_config(cs, "table") == 0);
  if (run_oracle(python, script) != 0) {
    remove_dir();
    exit(1);
  }
  float *cos_t = NULL, *sin_t = NULL;
  make_tables(cs, &cos_t, &sin_t);
  free(cos_t), free(sin_t);
  remove_dir();
}

/* Parameters Hugging Face warns about, or that divide by zero, are refused and write nothing. */
static void check_rope_refusals(void) {
  double inv[8];
  const llamak_rope ok3 = {LLAMAK_ROPE_LLAMA3, 10000.0, 8.0, 1.0, 4.0, 256.0};
  llamak_rope bad[8];
  for (int i = 0; i < 8; i++) bad[i] = ok3;
  bad[0].theta = 0.0;
  bad[1].factor = 0.5;
  bad[2].high_freq_factor = 1.0; /* == low_freq_factor */
  bad[3].low_freq_factor = 0.0;
  bad[4].original_max_position_embeddings = 0.0;
  bad[5].type = (llamak_rope_type)7;
  bad[6].factor = NAN;
  bad[7].theta = NAN;
  for (int i = 0; i < 8; i++) {
    for (int k = 0; k < 8; k++) inv[k] = -1.0;
    CHECK_EQ_INT(llamak_rope_inv_freq(inv, 16, &bad[i]), -1);
    for (int k = 0; k < 8; k++) CHECK(inv[k] == -1.0);
  }
  CHECK_EQ_INT(llamak_rope_inv_freq(inv, 7, &ok3), -1);
  CHECK_EQ_INT(llamak_rope_inv_freq(inv, 0, &ok3), -1);
  /* factor 1 leaves every frequency as it was (up to rounding in the interpolated band). */
  double plain[8];
  llamak_rope one = ok3, def = {LLAMAK_ROPE_DEFAULT, 10000.0, 0, 0, 0, 0};
  one.factor = 1.0;
  CHECK_EQ_INT(llamak_rope_inv_freq(inv, 16, &one), 0);
  CHECK_EQ_INT(llamak_rope_inv_freq(plain, 16, &def), 0);
  for (int k = 0; k < 8; k++) CHECK(fabs(inv[k] - plain[k]) <= 1e-15 * plain[k]);
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* Accumulation modes, aliasing and bitwise repeatability, on the first case's shape. */
static void check_accumulation_and_repeats(void) {
  const kcase *cs = &CASES[0];
  const int T = cs->T, NH = cs->NH, NKV = cs->NKV, D = cs->D, C = NH * D, I = cs->I;
  const size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D;
  fprintf(stderr, "== accumulation, aliasing, repeatability\n");
  /* RMSNorm: dx_acc adds to what is there, dw accumulates, out may alias x. */
  float *x = randn(C, 1.0f, 0.0f), *w = randn(C, 0.3f, 1.0f), *dy = randn(C, 1.0f, 0.0f), *base = randn(C, 1.0f, 0.0f);
  float *y = xcalloc(C, sizeof(float)), *dx = xcalloc(C, sizeof(float)), *dx2 = xcalloc(C, sizeof(float));
  float *dw = xcalloc(C, sizeof(float)), *dw1 = xcalloc(C, sizeof(float)), rs = 0.0f, rs2 = 0.0f;
  llamak_rmsnorm_fwd(y, &rs, x, w, C, cs->eps);
  llamak_rmsnorm_bwd(dx, dw, dy, x, w, rs, C, 0);
  memcpy(dw1, dw, C * sizeof(float));
  memcpy(dx2, base, C * sizeof(float));
  llamak_rmsnorm_bwd(dx2, dw, dy, x, w, rs, C, 1);
  for (int i = 0; i < C; i++) {
    CHECK(dx2[i] == base[i] + dx[i]);
    CHECK(dw[i] == dw1[i] + dw1[i]);
  }
  memcpy(dx2, x, C * sizeof(float));
  llamak_rmsnorm_fwd(dx2, &rs2, dx2, w, C, cs->eps);
  CHECK(same_bits(dx2, y, C) && rs2 == rs);
  free(x), free(w), free(dy), free(base), free(y), free(dx), free(dx2), free(dw), free(dw1);

  /* SwiGLU backward in place over gate and up equals the out-of-place one. */
  float *g = randn(I, 3.0f, 0.0f), *u = randn(I, 1.0f, 0.0f), *dh = randn(I, 1.0f, 0.0f);
  float *dg = xcalloc(I, sizeof(float)), *du = xcalloc(I, sizeof(float)), *g2 = xcalloc(I, sizeof(float)),
        *u2 = xcalloc(I, sizeof(float));
  llamak_swiglu_bwd(dg, du, dh, g, u, I);
  memcpy(g2, g, I * sizeof(float));
  memcpy(u2, u, I * sizeof(float));
  llamak_swiglu_bwd(g2, u2, dh, g2, u2, I);
  CHECK(same_bits(g2, dg, I) && same_bits(u2, du, I));
  free(g), free(u), free(dh), free(dg), free(du), free(g2), free(u2);

  /* RoPE backward undoes the forward (a rotation's transpose is its inverse). */
  double *inv = xcalloc((size_t)D / 2, sizeof(double));
  float *cos_t = xcalloc((size_t)T * D / 2, sizeof(float)), *sin_t = xcalloc((size_t)T * D / 2, sizeof(float));
  CHECK_EQ_INT(llamak_rope_inv_freq(inv, D, &cs->rope), 0);
  llamak_rope_table(cos_t, sin_t, inv, T, D);
  float *q = randn(nq, 1.0f, 0.0f), *q2 = xcalloc(nq, sizeof(float));
  memcpy(q2, q, nq * sizeof(float));
  llamak_rope_fwd(q2, NH * D, cos_t, sin_t, T, NH, D);
  llamak_rope_bwd(q2, NH * D, cos_t, sin_t, T, NH, D);
  for (size_t i = 0; i < nq; i++) CHECK_NEAR(q2[i], q[i], 1e-6);

  /* Attention: two identical runs agree bit for bit; dq is overwritten, dk and dv accumulate. */
  float *k = randn(nk, 1.5f, 0.0f), *v = randn(nk, 1.0f, 0.0f), *dout = randn(nq, 1.0f, 0.0f);
  float *out[2], *att[2], *dq[2], *dk[2], *dv[2];
  for (int r = 0; r < 2; r++) {
    out[r] = xcalloc(nq, sizeof(float)), att[r] = xcalloc((size_t)NH * T * T, sizeof(float));
    dq[r] = xcalloc(nq, sizeof(float)), dk[r] = xcalloc(nk, sizeof(float)), dv[r] = xcalloc(nk, sizeof(float));
    attention_all(cs, out[r], att[r], dq[r], dk[r], dv[r], q, k, v, dout);
  }
  CHECK(same_bits(out[0], out[1], nq) && same_bits(att[0], att[1], (size_t)NH * T * T));
  CHECK(same_bits(dq[0], dq[1], nq) && same_bits(dk[0], dk[1], nk) && same_bits(dv[0], dv[1], nk));
  float *scratch = xcalloc((size_t)T, sizeof(float));
  for (int h = 0; h < NH; h++) { /* a second backward into the same buffers */
    const int j = llamak_kv_head(h, NH, NKV);
    llamak_attn_bwd(dq[1] + (size_t)h * D, dk[1] + (size_t)j * D, dv[1] + (size_t)j * D, scratch,
                    dout + (size_t)h * D, NH * D, att[1] + (size_t)h * T * T, q + (size_t)h * D, NH * D,
                    k + (size_t)j * D, v + (size_t)j * D, NKV * D, T, D);
  }
  CHECK(same_bits(dq[0], dq[1], nq));
  for (size_t i = 0; i < nk; i++) {
    CHECK_NEAR(dk[1][i], 2.0f * dk[0][i], 1e-5);
    CHECK_NEAR(dv[1][i], 2.0f * dv[0][i], 1e-5);
  }
  for (int r = 0; r < 2; r++) free(out[r]), free(att[r]), free(dq[r]), free(dk[r]), free(dv[r]);
  free(scratch), free(q), free(q2), free(k), free(v), free(dout), free(inv), free(cos_t), free(sin_t);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s llama_ops_oracle.py [python]\n", argv[0]);
    return 2;
  }
  const char *script = argv[1], *python = argc > 2 ? argv[2] : "/usr/bin/python3";
  for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) run_case(&CASES[i], python, script);
  /* Long tables: Llama 3.2's scaled rope, and a plain one at D = 128. */
  const kcase long1 = {"table-llama3.2", 8200, 1, 1, 64, 1, 1e-5f,
                       {LLAMAK_ROPE_LLAMA3, 500000.0, 32.0, 1.0, 4.0, 8192.0}};
  const kcase long2 = {"table-default", 4100, 1, 1, 128, 1, 1e-5f, {LLAMAK_ROPE_DEFAULT, 500000.0, 0, 0, 0, 0}};
  run_table_case(&long1, python, script);
  run_table_case(&long2, python, script);
  check_rope_refusals();
  check_accumulation_and_repeats();
  fprintf(stderr, "worst rel err against the oracle over all tensors: %.3g (tol %g)\n", worst_all, TOL);
  TEST_DONE();
}
