/* test_cuda_llama_wiring.cc — the CUDA backend's Llama passes (kernels/cuda/cuda_llama_model.cu,
 * compiled here as host C++) run on the CPU with stand-ins for what they call: the cuda_llama.h and
 * cuda_kernels.h launchers by their CPU twins (kernels/cpu/llama_kernels.h), cuda_gemm by a plain
 * column-major product with cuBLAS's contract, and the CUDA runtime's copies by memcpy. Loss, the
 * final hidden state and every gradient must match the CPU backend (1e-5, 1e-5, 1e-4), so the
 * file's buffer plan, offsets, strides, product arguments and accumulate flags are checked on
 * every build with nvcc, with no GPU; the kernels themselves are test_cuda_llama's and the real
 * thing test_cuda_backend's, both on a GPU. Cases: tied with GQA, untied with q/k/v biases and
 * llama3 RoPE scaling, a smaller (B, T) than the buffers, multi-query. Buffers are allocated to
 * their planned sizes exactly, so the sanitizer build catches a plan too small, and every product's
 * operands must fit the planned bf16 scratch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_llama_model.cu"
extern "C" {
#include "kernels/cpu/cpu_kernels.h"
}

/* ---- stand-ins: the CUDA runtime's copies, the launchers by their CPU twins, the product ---- */

extern "C" {
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) {
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) {
  memset(d, v, n);
  return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t) {
  return "mock";
}
int cudak_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps, cudak_stream) {
  for (int n = 0; n < N; n++) llamak_rmsnorm_fwd(out + (size_t)n * C, rstd + n, x + (size_t)n * C, w, C, eps);
  return 0;
}
int cudak_rmsnorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w, const float *rstd, int N, int C,
                         int acc, cudak_stream) {
  float *dw = (float *)calloc((size_t)C, 4); /* the twin's weight gradient; cudak_rmsnorm_dw's here */
  for (int n = 0; n < N; n++)
    llamak_rmsnorm_bwd(dx + (size_t)n * C, dw, dout + (size_t)n * C, x + (size_t)n * C, w, rstd[n], C, acc);
  free(dw);
  return 0;
}
size_t cudak_rmsnorm_dw_scratch(int N, int C) {
  return (size_t)((N + 255) / 256) * C;
}
int cudak_rmsnorm_dw(float *dw, float *part, const float *dout, const float *x, const float *rstd, int N, int C,
                     cudak_stream) {
  (void)part;
  for (int i = 0; i < C; i++) {
    float s = 0;
    for (int n = 0; n < N; n++) s += dout[(size_t)n * C + i] * (x[(size_t)n * C + i] * rstd[n]);
    dw[i] += s;
  }
  return 0;
}
int cudak_rope(float *x, int ldx, const float *cs, const float *sn, int B, int T, int NH, int D, int bwd,
               cudak_stream) {
  for (int n = 0; n < B * T; n++) {
    const float *c = cs + (size_t)(n % T) * (D / 2), *s = sn + (size_t)(n % T) * (D / 2);
    if (bwd)
      llamak_rope_bwd(x + (size_t)n * ldx, ldx, c, s, 1, NH, D);
    else
      llamak_rope_fwd(x + (size_t)n * ldx, ldx, c, s, 1, NH, D);
  }
  return 0;
}
int cudak_swiglu_fwd(float *h, int ldh, const float *g, const float *u, int ldg, int N, int nc, cudak_stream) {
  for (int n = 0; n < N; n++) llamak_swiglu_fwd(h + (size_t)n * ldh, g + (size_t)n * ldg, u + (size_t)n * ldg, nc);
  return 0;
}
int cudak_swiglu_bwd(float *dg, float *du, const float *dh, int ldh, const float *g, const float *u, int ldg, int N,
                     int nc, cudak_stream) {
  for (int n = 0; n < N; n++)
    llamak_swiglu_bwd(dg + (size_t)n * ldg, du + (size_t)n * ldg, dh + (size_t)n * ldh, g + (size_t)n * ldg,
                      u + (size_t)n * ldg, nc);
  return 0;
}
int cudak_gqa_attn_fwd(float *out, int ldo, float *att, const float *q, int ldq, const float *k, const float *v,
                       int ldkv, int B, int T, int NH, int NKV, int D, cudak_stream) {
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      int j = h / (NH / NKV);
      llamak_attn_fwd(out + (size_t)b * T * ldo + h * D, ldo, att + ((size_t)b * NH + h) * T * T,
                      q + (size_t)b * T * ldq + h * D, ldq, k + (size_t)b * T * ldkv + j * D,
                      v + (size_t)b * T * ldkv + j * D, ldkv, T, D);
    }
  return 0;
}
int cudak_gqa_attn_bwd(float *dq, float *dk, float *dv, float *datt, const float *dout, int ldo, const float *att,
                       const float *q, int ldq, const float *k, const float *v, int ldkv, int B, int T, int NH, int NKV,
                       int D, cudak_stream) {
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      int j = h / (NH / NKV);
      size_t kv = (size_t)b * T * ldkv + j * D;
      llamak_attn_bwd(dq + (size_t)b * T * ldq + h * D, dk + kv, dv + kv, datt, dout + (size_t)b * T * ldo + h * D, ldo,
                      att + ((size_t)b * NH + h) * T * T, q + (size_t)b * T * ldq + h * D, ldq, k + kv, v + kv, ldkv, T,
                      D);
    }
  return 0;
}
int cudak_bias_add(float *out, const float *bias, const float *res, int N, int OC, cudak_stream) {
  for (size_t i = 0; i < (size_t)N * OC; i++) {
    float o = out[i] + bias[i % OC];
    out[i] = res ? res[i] + o : o;
  }
  return 0;
}
size_t cudak_colsum_scratch(int N, int C) {
  return (size_t)((N + 31) / 32) * 2 * C;
}
int cudak_colsum(float *d0, float *d1, float *part, const float *dout, const float *x, const float *mean,
                 const float *rstd, int N, int C, cudak_stream) {
  (void)d1;
  (void)part;
  (void)mean;
  (void)rstd;
  if (x) abort();
  for (int i = 0; i < C; i++) {
    float s = 0;
    for (int n = 0; n < N; n++) s += dout[(size_t)n * C + i];
    d0[i] += s;
  }
  return 0;
}
int cudak_encoder_fwd(float *out, const int *inp, const float *wte, const float *wpe, int N, int T, int C,
                      cudak_stream) {
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = wte[(size_t)inp[n] * C + c] + wpe[(size_t)(n % T) * C + c];
  return 0;
}
int cudak_wte_bwd(float *dwte, const float *dout, const int *uniq, const int *start, const int *pos, int U, int C,
                  cudak_stream) {
  for (int u = 0; u < U; u++)
    for (int jj = start[u]; jj < start[u + 1]; jj++)
      for (int c = 0; c < C; c++) dwte[(size_t)uniq[u] * C + c] += dout[(size_t)pos[jj] * C + c];
  return 0;
}
}
/* Checked like the bf16 path of cuda_shared.cu: each operand must fit the planned bf16 scratch
 * (c->n16, set from the plan here whatever the precision), or the product fails. */
static int gemm_oversize;
int cuda_gemm(cuda_impl *c, int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, long long,
              const float *B, int ldb, long long, float beta, float *Cm, int ldc, long long, int batch) {
  if (batch != 1) abort();
  const size_t na = ta ? (size_t)(m - 1) * lda + k : (size_t)(k - 1) * lda + m;
  const size_t nb = tb ? (size_t)(k - 1) * ldb + n : (size_t)(n - 1) * ldb + k;
  if (na > c->n16 || nb > c->n16) {
    fprintf(stderr, "FAIL: a product operand of %zu/%zu floats exceeds the bf16 scratch %zu\n", na, nb, c->n16);
    gemm_oversize++;
    return DPC_EINTERNAL;
  }
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double s = 0;
      for (int p = 0; p < k; p++) {
        float a = ta ? A[(size_t)i * lda + p] : A[(size_t)p * lda + i];
        float b = tb ? B[(size_t)p * ldb + j] : B[(size_t)j * ldb + p];
        s += (double)a * b;
      }
      float &o = Cm[(size_t)j * ldc + i];
      o = (float)(alpha * s + (beta != 0.0f ? beta * o : 0.0f));
    }
  return 0;
}

static double rel_err(const float *a, const float *b, size_t n) {
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - b[i]);
    if (!(d <= md)) md = d;
    if (fabs(b[i]) > mb) mb = fabs(b[i]);
  }
  return mb > 0 ? md / mb : md;
}

/* cuda_backend.cu's upload_tokens into host memory: inputs | targets | uniq | start | pos. */
static void tokens(cuda_impl *c, const int *in, const int *tg, int N, int V) {
  int *din = c->d_tok, *dtg = din + N, *uniq = din + 2 * N, *start = din + 3 * N, *pos = din + 4 * N + 1;
  memcpy(din, in, (size_t)N * 4);
  memcpy(dtg, tg, (size_t)N * 4);
  int *cnt = (int *)calloc((size_t)V, 4);
  for (int n = 0; n < N; n++) cnt[in[n]]++;
  int U = 0, at = 0;
  for (int v = 0; v < V; v++) {
    if (!cnt[v]) continue;
    uniq[U] = v;
    start[U++] = at;
    at += cnt[v];
    cnt[v] = start[U - 1];
  }
  start[U] = at;
  for (int n = 0; n < N; n++) pos[cnt[in[n]]++] = n;
  c->U = U;
  free(cnt);
}

/* The reference: the CPU backend's loss, hidden state at the last position and gradients. */
static int reference(const gpt_config *cfg, const float *p, const int *in, const int *tg, int B, int T, int mB, int mT,
                     float *loss, float *hid, float *g) {
  gpt_backend_opts o = {GPT_BACKEND_CPU, 2, 0, 0};
  gpt_model *ref = NULL;
  int rc = gpt_create(&ref, cfg, &o, mB, mT);
  if (!rc) rc = gpt_set_params(ref, p, 0, ref->lay.n_params);
  if (!rc) rc = gpt_zero_grad(ref);
  if (!rc) rc = gpt_forward(ref, in, tg, B, T, loss);
  if (!rc) rc = gpt_hidden(ref, B - 1, T - 1, hid);
  if (!rc) rc = gpt_backward(ref);
  if (!rc) rc = gpt_get_grads(ref, g, 0, ref->lay.n_params);
  if (rc) fprintf(stderr, "cpu reference: %s\n", dpc_errmsg());
  gpt_free(ref);
  return rc;
}

/* B x T through the CUDA passes on buffers planned for mB x mT; returns the failures. */
static int check(const gpt_config *cfg, int B, int T, int mB, int mT) {
  gpt_model *mm = (gpt_model *)calloc(1, sizeof *mm);
  cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
  if (gpt_layout_build(cfg, &mm->lay)) return 1;
  mm->maxB = mB;
  mm->maxT = mT;
  const size_t P = mm->lay.n_params;
  const int N = B * T, V = cfg->vocab_size, C = cfg->n_embd;
  float *p = (float *)malloc(P * 4), *g0 = (float *)malloc(P * 4), *hid = (float *)malloc((size_t)C * 4);
  int *in = (int *)malloc((size_t)N * 4), *tg = (int *)malloc((size_t)N * 4);
  gpt_init_params(&mm->lay, p, 11);
  for (size_t i = 0; i < P; i++) p[i] *= 3.0f; /* sharper attention than the 0.02 init */
  unsigned r = 5;
  for (int i = 0; i < N; i++) {
    r = r * 1103515245u + 12345u;
    in[i] = (int)((r >> 8) % V);
    r = r * 1103515245u + 12345u;
    tg[i] = (int)((r >> 8) % V);
  }
  float lref = 0;
  int bad = reference(cfg, p, in, tg, B, T, mB, mT, &lref, hid, g0) != 0;

  double sizes[40], n16;
  float **ptrs[40];
  const int nb = cuda_llama_plan(mm, c, sizes, ptrs, 40, &n16);
  for (int i = 0; i < nb; i++) *ptrs[i] = (float *)calloc(sizes[i] > 0 ? (size_t)sizes[i] : 1, 4);
  c->params = p;
  c->n16 = nb > 0 ? (size_t)n16 : 0;
  c->grads = (float *)calloc(P, 4);
  c->d_tok = (int *)calloc(5 * (size_t)N + 1, 4);
  c->B = B;
  c->T = T;
  tokens(c, in, tg, N, V);
  float loss = 0;
  double he = 1;
  if (!bad && nb > 0 && !cuda_llama_init(mm, c) && !cuda_llama_forward(mm, c, B, T)) {
    /* cuda_backend.cu's loss and dlogits, with the CPU's row kernels. */
    double sum = 0;
    for (int n = 0; n < N; n++) sum += cpuk_xent_row(c->logits + (size_t)n * V, V, tg[n], c->lse + n);
    loss = (float)(sum / N);
    for (int n = 0; n < N; n++) cpuk_xent_bwd_row(c->logits + (size_t)n * V, V, tg[n], c->lse[n], 1.0f / N);
    he = rel_err(c->lnf + (size_t)(N - 1) * C, hid, (size_t)C);
    bad += cuda_llama_backward(mm, c) != 0;
  } else {
    fprintf(stderr, "FAIL: the passes refused: %s\n", dpc_errmsg());
    bad++;
  }
  double worst = 0;
  const char *wn = "";
  for (int k = 0; k < mm->lay.n_tensors; k++) {
    const gpt_tensor *t = &mm->lay.tensors[k];
    const double e = rel_err(c->grads + t->offset, g0 + t->offset, t->numel);
    if (!(e <= worst)) worst = e, wn = t->name;
    if (!(e <= 1e-4)) {
      bad++;
      fprintf(stderr, "FAIL grad %s: rel err %.3g\n", t->name, e);
    }
  }
  bad += !(fabs(loss - lref) <= 1e-5 * lref) + !(he <= 1e-5) + gemm_oversize;
  gemm_oversize = 0;
  fprintf(stderr, "%s B=%d T=%d (buffers %d x %d): loss %.7f (cpu %.7f), hidden rel err %.3g, worst grad %s %.3g\n",
          bad ? "FAIL" : "ok", B, T, mB, mT, loss, lref, he, wn, worst);
  for (int i = 0; i < nb; i++) free(*ptrs[i]);
  cuda_llama_destroy(c);
  free(c->grads), free(c->d_tok), free(c), free(mm);
  free(p), free(g0), free(hid), free(in), free(tg);
  return bad;
}

int main(void) {
  /* {L, NH, C, maxT, V, arch, NKV, I, tied, bias, rope_scaling, orig_max, eps, theta, factor, low, high} */
  static const gpt_config tied_gqa = {2,    4,       80, 72, 211, GPT_ARCH_LLAMA, 2, 100, 1, 0, GPT_ROPE_DEFAULT, 0,
                                      1e-5, 10000.0, 0,  0,  0};
  static const gpt_config untied_bias = {
      2, 4, 64, 72, 211, GPT_ARCH_LLAMA, 4, 72, 0, 1, GPT_ROPE_LLAMA3, 16, 1e-6, 500000.0, 8.0, 1.0, 4.0};
  static const gpt_config mqa = {1,    4,       32, 20, 50, GPT_ARCH_LLAMA, 1, 40, 0, 1, GPT_ROPE_DEFAULT, 0,
                                 1e-5, 10000.0, 0,  0,  0};
  int bad = check(&tied_gqa, 3, 70, 3, 70);
  bad += check(&untied_bias, 3, 70, 3, 70);
  bad += check(&tied_gqa, 2, 33, 3, 70);
  bad += check(&mqa, 2, 17, 3, 20);
  fprintf(stderr, "%d failure(s)\n", bad);
  return bad != 0;
}
