/* gpt_init.c — GPT-2 and Llama initialisation of a parameter array in the canonical layout (gpt.h):
 * deterministic in the seed, the same on every backend, so a job's version 0 is reproducible
 * from its spec. */
#include "kernels/gpt.h"

#include <math.h>
#include <string.h>

/* splitmix64: a small, well-mixed generator; enough for initialisation. */
static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1), never 0 so that log() is finite. */
static double uniform01(uint64_t *s) { return ((splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

void gpt_init_params(const gpt_layout *lay, float *params, uint64_t seed) {
  uint64_t s = seed ^ 0xD1B54A32D192ED03ull;
  const double resid_std = 0.02 / sqrt(2.0 * lay->cfg.n_layer);
  for (int k = 0; k < lay->n_tensors; k++) {
    const gpt_tensor *t = &lay->tensors[k];
    float *p = params + t->offset;
    size_t len = strlen(t->name);
    const int llama = lay->cfg.arch == GPT_ARCH_LLAMA;
    /* Norm gains: GPT-2's ln_1, ln_2, ln_f; Llama's input_layernorm, post_attention_layernorm
     * and model.norm (every 1-D Llama tensor that is not a bias). */
    int is_ln = llama ? t->ndim == 1 : strstr(t->name, "ln_") != NULL;
    int is_bias = len > 5 && strcmp(t->name + len - 5, ".bias") == 0;
    int is_resid = llama ? strstr(t->name, "o_proj.weight") || strstr(t->name, "down_proj.weight")
                         : strstr(t->name, "c_proj.weight") != NULL;
    if (is_bias) {
      memset(p, 0, t->numel * sizeof *p);
    } else if (is_ln) {
      for (size_t i = 0; i < t->numel; i++) p[i] = 1.0f;
    } else {
      double std = is_resid ? resid_std : 0.02;
      for (size_t i = 0; i < t->numel; i += 2) {
        /* Box-Muller: two normals per pair of uniforms. */
        double u1 = uniform01(&s), u2 = uniform01(&s);
        double r = sqrt(-2.0 * log(u1));
        p[i] = (float)(std * r * cos(2.0 * M_PI * u2));
        if (i + 1 < t->numel) p[i + 1] = (float)(std * r * sin(2.0 * M_PI * u2));
      }
    }
  }
}
