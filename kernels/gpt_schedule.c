/* gpt_schedule.c — what inner step t of the optimizer uses: the learning rate schedule,
 * AdamW's per-step scalars and Muon's learning-rate adjustment (gpt.h). Kept apart from the
 * backends so that the CPU and CUDA optimizers take the very same scalars, rounded the way
 * torch rounds them. */
#include "kernels/gpt.h"
#include "common/errors.h"

#include <math.h>
#include <string.h>

float gpt_lr_at(float lr, int warmup, int total_steps, float lr_min_frac, long s) {
  if (s < warmup) return lr * (float)(s + 1) / (float)warmup;
  double p = total_steps > warmup ? (double)(s - warmup) / (double)(total_steps - warmup) : 1.0;
  if (p > 1.0) p = 1.0;
  double f = lr_min_frac;
  return (float)(lr * (f + (1.0 - f) * 0.5 * (1.0 + cos(M_PI * p))));
}

void gpt_adamw_scalars_at(const gpt_adamw_hparams *hp, float lr, int t, gpt_adamw_scalars *s) {
  const double lr_d = lr, b1 = hp->beta1, b2 = hp->beta2;
  s->decay_mul = (float)(1.0 - lr_d * (double)hp->weight_decay);
  s->one_minus_beta1 = (float)(1.0 - b1);
  s->one_minus_beta2 = (float)(1.0 - b2);
  s->neg_step_size = (float)(-(lr_d / (1.0 - pow(b1, t))));
  s->bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
}

/* torch.optim.Muon's _adjust_lr: "original" keeps the update's RMS shape-independent for tall
 * matrices, "match_rms_adamw" scales it to AdamW's typical RMS (0.2). */
double gpt_muon_adjust(int adjust, int A, int B) {
  if (adjust == GPT_MUON_ADJUST_MATCH_RMS_ADAMW) return 0.2 * sqrt((double)(A > B ? A : B));
  double r = (double)A / (double)B;
  return sqrt(r > 1.0 ? r : 1.0);
}

int gpt_muon_adjust_parse(const char *s, int *out) {
  if (strcmp(s, "original") == 0) *out = GPT_MUON_ADJUST_ORIGINAL;
  else if (strcmp(s, "match_rms_adamw") == 0) *out = GPT_MUON_ADJUST_MATCH_RMS_ADAMW;
  else return dpc_err(DPC_EINVAL, "unknown Muon adjust_lr '%s' (use original or match_rms_adamw)", s);
  return 0;
}

const char *gpt_muon_adjust_name(int adjust) {
  return adjust == GPT_MUON_ADJUST_MATCH_RMS_ADAMW ? "match_rms_adamw" : "original";
}
