/* test_cuda_muon_wiring.cc — the CUDA backend's Muon step (kernels/cuda/cuda_muon.cu, compiled here
 * as host C++) run on the CPU with stand-ins for what it calls: the cuda_kernels.h launchers by
 * their CPU twins (kernels/cpu/cpu_kernels.h), cuda_gemm by a plain column-major product with
 * cuBLAS's contract, the CUDA runtime's allocations and copies by malloc and memmove. After two
 * steps from the same gradients (clipped: grad_clip below the norm) the parameters and the
 * optimizer state (Muon's buffers in m, AdamW's moments elsewhere) must match the CPU backend's
 * gpt_muon_step to 1e-5, so the work-matrix orientation (both flips), the column-major product
 * arguments, the non-Muon AdamW work items and the scratch plan are checked on every build with
 * nvcc, with no GPU (the kernels themselves: test_cuda_kernels, on a GPU). Cases: GPT-2
 * (Conv1D weights, the fused c_attn) with Nesterov and "original", Llama (GQA, q/k/v and
 * gate/up apart) without Nesterov and with "match_rms_adamw". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_muon.cu"
extern "C" {
#include "kernels/cpu/cpu_kernels.h"
}

/* ---- stand-ins ---- */

extern "C" {
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) {
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) {
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t n) {
  *p = calloc(n ? n : 1, 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t) {
  return "mock";
}
int cudak_sumsq_segs(double *ss, const float *g, const cudak_seg *segs, int nseg, cudak_stream) {
  for (int s = 0; s < nseg; s++) ss[s] = cpuk_sumsq(g + segs[s].off, (size_t)segs[s].n);
  return 0;
}
int cudak_norm_clip(float *scal, const double *ss, int nseg, float max_norm, cudak_stream) {
  double sum = 0;
  for (int s = 0; s < nseg; s++) sum += ss[s];
  scal[0] = (float)sqrt(sum);
  scal[1] = 1.0f;
  if (max_norm > 0.0f && max_norm / (scal[0] + 1e-6f) < 1.0f) scal[1] = max_norm / (scal[0] + 1e-6f);
  return 0;
}
int cudak_adamw(float *p, float *g, float *m, float *v, const cudak_seg *segs, int nseg, const float *clip,
                float decay_mul, float beta1, float omb1, float beta2, float omb2, float bc2_sqrt, float eps,
                float neg_step, cudak_stream) {
  for (int s = 0; s < nseg; s++) {
    const size_t o = segs[s].off;
    cpuk_adamw(p + o, g + o, m + o, v + o, (size_t)segs[s].n, *clip, segs[s].decay ? decay_mul : 1.0f, beta1, omb1,
               beta2, omb2, bc2_sqrt, eps, neg_step);
  }
  return 0;
}
int cudak_muon_momentum(float *buf, float *g, float *X, int rows, int cols, int flip, const float *clip, float w_buf,
                        float w_nest, int nesterov, cudak_stream) {
  cpuk_muon_momentum(buf, g, X, rows, cols, 0, rows, flip, *clip, w_buf, w_nest, nesterov);
  return 0;
}
size_t cudak_muon_norm_scratch(size_t n) {
  return (n + 16383) / 16384 + 1;
}
int cudak_muon_normalize(float *X, size_t n, double *part, cudak_stream) {
  const float norm = (float)sqrt(cpuk_sumsq(X, n)), den = norm > 1e-7f ? norm : 1e-7f;
  part[cudak_muon_norm_scratch(n) - 1] = den; /* the scratch must hold the divisor's slot */
  for (size_t i = 0; i < n; i++) X[i] /= den;
  return 0;
}
int cudak_muon_update(float *theta, const float *X, int rows, int cols, int flip, float decay_mul, float neg_lr,
                      cudak_stream) {
  cpuk_muon_update(theta, X, rows, cols, 0, rows, flip, decay_mul, neg_lr);
  return 0;
}
}
/* Checked like the bf16 path of cuda_shared.cu: each operand must fit c->n16. */
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

/* Two Muon steps through cuda_muon.cu on host buffers against the CPU backend; returns the failures. */
static int check(const gpt_config *cfg, const gpt_muon_hparams *mu) {
  const int B = 2, T = 8;
  gpt_backend_opts o = {GPT_BACKEND_CPU, 2, 0, 0};
  gpt_model *ref = NULL;
  if (gpt_create(&ref, cfg, &o, B, T)) return 1;
  const size_t P = ref->lay.n_params;
  float *p = (float *)malloc(P * 4);
  int in[B * T], tg[B * T];
  gpt_init_params(&ref->lay, p, 3);
  for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % cfg->vocab_size, tg[i] = (i * 5 + 1) % cfg->vocab_size;
  float loss, norm_ref = 0, norm = 0;
  int bad = gpt_set_params(ref, p, 0, P) || gpt_forward(ref, in, tg, B, T, &loss) || gpt_zero_grad(ref) ||
            gpt_backward(ref);
  /* The mock device state: parameters, the same gradients, zero moments, every work item. */
  gpt_model *mm = (gpt_model *)calloc(1, sizeof *mm);
  cuda_impl *c = (cuda_impl *)calloc(1, sizeof *c);
  mm->lay = ref->lay;
  mm->impl = c;
  c->store = (float *)calloc(4 * P, 4);
  c->params = c->store, c->grads = c->store + P, c->adam_m = c->store + 2 * P, c->adam_v = c->store + 3 * P;
  memcpy(c->params, p, P * 4);
  bad += gpt_get_grads(ref, c->grads, 0, P) != 0;
  c->segs = (cudak_seg *)malloc((P / CUDAK_SEG + mm->lay.n_tensors + 1) * sizeof(cudak_seg));
  for (int k = 0; k < mm->lay.n_tensors; k++)
    for (size_t q = 0; q < mm->lay.tensors[k].numel; q += CUDAK_SEG) {
      const gpt_tensor *t = &mm->lay.tensors[k];
      c->segs[c->nseg++] = {t->offset + q, (int)(t->numel - q < CUDAK_SEG ? t->numel - q : CUDAK_SEG), t->decay};
    }
  c->seg_sumsq = (double *)calloc((size_t)c->nseg, sizeof(double));
  c->scal = (float *)calloc(2, 4);
  c->n16 = 0;
  for (int k = 0; k < mm->lay.n_tensors; k++)
    if (mm->lay.tensors[k].muon && mm->lay.tensors[k].numel > c->n16) c->n16 = mm->lay.tensors[k].numel;
  gpt_adamw_hparams hp = {0.9f, 0.95f, 1e-6f, 0.1f, 0.05f}; /* clip well below the norm */
  for (int s = 1; s <= 2 && !bad; s++) {
    bad += gpt_muon_step(ref, &hp, mu, 2e-3f, 0.02f, s, &norm_ref) != 0;
    bad += cuda_muon_step(mm, &hp, mu, 2e-3f, 0.02f, s, &norm) != 0;
  }
  if (bad) fprintf(stderr, "FAIL: a step refused: %s\n", dpc_errmsg());
  float *pr = (float *)malloc(P * 4), *mr = (float *)malloc(P * 4), *vr = (float *)malloc(P * 4);
  gpt_get_params(ref, pr, 0, P);
  gpt_get_opt_state(ref, mr, vr);
  double worst = 0;
  for (int k = 0; k < mm->lay.n_tensors; k++) {
    const gpt_tensor *t = &mm->lay.tensors[k];
    const double e[3] = {rel_err(c->params + t->offset, pr + t->offset, t->numel),
                         rel_err(c->adam_m + t->offset, mr + t->offset, t->numel),
                         rel_err(c->adam_v + t->offset, vr + t->offset, t->numel)};
    for (int i = 0; i < 3; i++) {
      if (!(e[i] <= worst)) worst = e[i];
      if (!(e[i] <= 1e-5)) {
        bad++;
        fprintf(stderr, "FAIL %s %s: rel err %.3g\n", t->name, i == 0 ? "param" : i == 1 ? "m" : "v", e[i]);
      }
    }
  }
  bad += !(norm == norm_ref) + gemm_oversize;
  gemm_oversize = 0;
  fprintf(stderr, "%s %s: grad norm %.6g (cpu %.6g), worst rel err %.3g over params, m and v\n", bad ? "FAIL" : "ok",
          gpt_arch_name(cfg->arch), norm, norm_ref, worst);
  cuda_muon_destroy(c);
  free(c->store), free(c->segs), free(c->seg_sumsq), free(c->scal), free(c), free(mm);
  free(p), free(pr), free(mr), free(vr);
  gpt_free(ref);
  return bad;
}

int main(void) {
  /* {L, NH, C, maxT, V, arch, NKV, I, tied, bias, rope_scaling, orig_max, eps, theta, factor, low, high} */
  static const gpt_config gpt2 = {2, 2, 32, 16, 67, GPT_ARCH_GPT2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  static const gpt_config llama = {2,    4,       32, 16, 67, GPT_ARCH_LLAMA, 2, 96, 0, 0, GPT_ROPE_DEFAULT, 0,
                                   1e-5, 10000.0, 0,  0,  0};
  const gpt_muon_hparams nest = {0.95f, 0.05f, 1, 5, GPT_MUON_ADJUST_ORIGINAL};
  const gpt_muon_hparams plain = {0.9f, 0.0f, 0, 3, GPT_MUON_ADJUST_MATCH_RMS_ADAMW};
  int bad = check(&gpt2, &nest) + check(&llama, &plain);
  fprintf(stderr, "%d failure(s)\n", bad);
  return bad != 0;
}
