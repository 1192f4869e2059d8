/* gpt.c — backend dispatch: gpt_create picks the backend's vtable and every gpt_* call checks
 * its arguments once here, so backends may assume valid shapes and ranges. The CUDA vtable is
 * either linked in (tests) or loaded on first use from the plugin libdipaco-cuda.so
 * (kernels/CMakeLists.txt), so programs start without the CUDA libraries. */
#include "kernels/gpt.h"
#include "common/errors.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const gpt_backend_ops gpt_cpu_ops;
/* Defined by kernels/cuda when the program links dpc_kernels_cuda; otherwise this weak
 * reference stays NULL and the plugin is loaded instead. */
extern const gpt_backend_ops gpt_cuda_ops __attribute__((weak));

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const gpt_backend_ops *cuda_ops;
static char cuda_why[PATH_MAX + 1024];

/* Load the plugin: $DIPACO_CUDA_PLUGIN, else ../lib/dipaco/libdipaco-cuda.so beside the
 * executable (the layout of both the build tree and an installed prefix). The handle stays
 * open for the life of the process. */
static void cuda_load(void) {
  if (&gpt_cuda_ops) {
    cuda_ops = &gpt_cuda_ops;
    return;
  }
  char path[PATH_MAX + 64];
  const char *env = getenv("DIPACO_CUDA_PLUGIN");
  if (env && *env) {
    snprintf(path, sizeof path, "%s", env);
  } else {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
      snprintf(cuda_why, sizeof cuda_why, "cannot locate the CUDA backend plugin (/proc/self/exe unreadable); "
               "set DIPACO_CUDA_PLUGIN to libdipaco-cuda.so");
      return;
    }
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(path, sizeof path, "%s/../lib/dipaco/libdipaco-cuda.so", exe);
  }
  if (access(path, F_OK) != 0) {
    snprintf(cuda_why, sizeof cuda_why, "this build has no CUDA backend (no %s; rebuild where nvcc is installed, "
             "with -DDIPACO_CUDA=ON, or set DIPACO_CUDA_PLUGIN)", path);
    return;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  const gpt_backend_ops *ops = h ? (const gpt_backend_ops *)dlsym(h, "gpt_cuda_ops") : NULL;
  if (!ops) {
    const char *e = dlerror();
    snprintf(cuda_why, sizeof cuda_why, "cannot load the CUDA backend %s: %s (are the CUDA runtime and cuBLAS "
             "installed?)", path, e ? e : "no gpt_cuda_ops symbol");
    if (h) dlclose(h);
    return;
  }
  cuda_ops = ops;
}

int gpt_backend_parse(const char *s, gpt_backend_kind *out) {
  if (strcmp(s, "cpu") == 0) *out = GPT_BACKEND_CPU;
  else if (strcmp(s, "cuda") == 0) *out = GPT_BACKEND_CUDA;
  else return dpc_err(DPC_EINVAL, "unknown backend '%s' (use cpu or cuda)", s);
  return 0;
}

int gpt_precision_parse(const char *s, int *out) {
  if (strcmp(s, "fp32") == 0) *out = GPT_PREC_FP32;
  else if (strcmp(s, "tf32") == 0) *out = GPT_PREC_TF32;
  else if (strcmp(s, "bf16") == 0) *out = GPT_PREC_BF16;
  else return dpc_err(DPC_EINVAL, "unknown precision '%s' (use fp32, tf32 or bf16)", s);
  return 0;
}

int gpt_create(gpt_model **out, const gpt_config *cfg, const gpt_backend_opts *opts, int B, int T) {
  *out = NULL;
  gpt_model *m = calloc(1, sizeof *m);
  if (!m) return dpc_err(DPC_ENOMEM, "gpt_create: out of memory");
  int rc = gpt_layout_build(cfg, &m->lay);
  if (rc) goto fail;
  if (B < 1 || T < 1 || T > cfg->n_positions) {
    rc = dpc_err(DPC_EINVAL, "batch shape B=%d T=%d invalid (need B >= 1, 1 <= T <= n_positions %d)",
                 B, T, cfg->n_positions);
    goto fail;
  }
  m->opts = *opts;
  m->maxB = B;
  m->maxT = T;
  switch (opts->kind) {
  case GPT_BACKEND_CPU: m->ops = &gpt_cpu_ops; break;
  case GPT_BACKEND_CUDA:
    pthread_once(&cuda_once, cuda_load);
    if (!cuda_ops) {
      rc = dpc_err(DPC_EUNSUPPORTED, "%s", cuda_why);
      goto fail;
    }
    m->ops = cuda_ops;
    break;
  default: rc = dpc_err(DPC_EINVAL, "unknown backend %d", (int)opts->kind); goto fail;
  }
  rc = m->ops->create(m);
  if (rc) goto fail;
  *out = m;
  return 0;
fail:
  free(m);
  return rc;
}

void gpt_free(gpt_model *m) {
  if (!m) return;
  m->ops->destroy(m);
  free(m);
}

static int check_range(const gpt_model *m, size_t off, size_t n) {
  if (off > m->lay.n_params || n > m->lay.n_params - off)
    return dpc_err(DPC_ERANGE, "parameter range [%zu, %zu) outside [0, %zu)", off, off + n, m->lay.n_params);
  return 0;
}

int gpt_set_params(gpt_model *m, const float *src, size_t off, size_t n) {
  int rc = check_range(m, off, n);
  return rc ? rc : m->ops->set_params(m, src, off, n);
}

int gpt_get_params(gpt_model *m, float *dst, size_t off, size_t n) {
  int rc = check_range(m, off, n);
  return rc ? rc : m->ops->get_params(m, dst, off, n);
}

int gpt_get_grads(gpt_model *m, float *dst, size_t off, size_t n) {
  int rc = check_range(m, off, n);
  return rc ? rc : m->ops->get_grads(m, dst, off, n);
}

int gpt_forward(gpt_model *m, const int *inputs, const int *targets, int B, int T, float *loss) {
  if (B < 1 || B > m->maxB || T < 1 || T > m->maxT)
    return dpc_err(DPC_EINVAL, "forward shape B=%d T=%d exceeds the model's B=%d T=%d", B, T, m->maxB, m->maxT);
  const int V = m->lay.cfg.vocab_size;
  for (long i = 0; i < (long)B * T; i++) {
    if (inputs[i] < 0 || inputs[i] >= V)
      return dpc_err(DPC_ERANGE, "input token %d at position %ld outside vocabulary [0, %d)", inputs[i], i, V);
    if (targets && (targets[i] < 0 || targets[i] >= V))
      return dpc_err(DPC_ERANGE, "target token %d at position %ld outside vocabulary [0, %d)", targets[i], i, V);
  }
  return m->ops->forward(m, inputs, targets, B, T, loss);
}

int gpt_logits(gpt_model *m, int b, int t, float *dst) { return m->ops->logits(m, b, t, dst); }
int gpt_hidden(gpt_model *m, int b, int t, float *dst) {
  if (!m->ops->hidden) return dpc_err(DPC_EUNSUPPORTED, "backend %s has no hidden-state read-out", m->ops->name);
  return m->ops->hidden(m, b, t, dst);
}
int gpt_zero_grad(gpt_model *m) { return m->ops->zero_grad(m); }
int gpt_backward(gpt_model *m) { return m->ops->backward(m); }

int gpt_adamw_step(gpt_model *m, const gpt_adamw_hparams *hp, float lr, int t, float *grad_norm) {
  if (t < 1) return dpc_err(DPC_EINVAL, "AdamW step count %d must be >= 1", t);
  return m->ops->adamw_step(m, hp, lr, t, grad_norm);
}

int gpt_muon_step(gpt_model *m, const gpt_adamw_hparams *hp, const gpt_muon_hparams *mu, float lr, float muon_lr,
                  int t, float *grad_norm) {
  if (t < 1) return dpc_err(DPC_EINVAL, "AdamW step count %d must be >= 1", t);
  if (mu->ns_steps < 1 || mu->ns_steps > 20)
    return dpc_err(DPC_EINVAL, "Muon ns_steps %d outside [1, 20]", mu->ns_steps);
  if (!m->ops->muon_step)
    return dpc_err(DPC_EUNSUPPORTED, "the %s backend has no Muon inner optimizer (docs/design.md §3); use "
                   "inner.optimizer adamw or the cpu backend", m->ops->name);
  return m->ops->muon_step(m, hp, mu, lr, muon_lr, t, grad_norm);
}

int gpt_has_muon(const gpt_model *m) { return m->ops->muon_step != NULL; }

int gpt_get_opt_state(gpt_model *m, float *m_dst, float *v_dst) { return m->ops->get_opt_state(m, m_dst, v_dst); }
int gpt_set_opt_state(gpt_model *m, const float *m_src, const float *v_src) {
  return m->ops->set_opt_state(m, m_src, v_src);
}
int gpt_reset_opt_state(gpt_model *m) { return m->ops->reset_opt_state(m); }
int gpt_describe(gpt_model *m, char *name, size_t len, uint64_t *mem_bytes) {
  if (len) name[0] = 0;
  if (mem_bytes) *mem_bytes = 0;
  return m->ops->describe ? m->ops->describe(m, name, len, mem_bytes) : 0;
}
