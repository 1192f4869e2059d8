/* trainer.h — a worker's inner loop, independent of the network: given the global parameters
 * of its path at the start of a round, run H inner AdamW (or Muon + AdamW, docs/design.md
 * §3.2) steps on the slot's data and produce
 * the outer gradient Δ = θ_start − θ_end (docs/design.md §3).
 *
 * The step counter s of a slot is global (round·H + h): it picks the data batch (batch index
 * s, replica r of R, llm.c's strided order) and the learning rate (warmup + cosine over
 * total_steps). AdamW moments persist across rounds unless the slot's inner state is reset.
 * A trainer owns its model, data and buffers; it is driven by one thread. */
#ifndef DPC_TRAINER_H
#define DPC_TRAINER_H

#include "common/dataset.h"
#include "kernels/gpt.h"

typedef struct {
  int B, T;              /* batch shape */
  long total_steps;      /* schedule length: rounds · H */
  float lr, lr_min_frac;
  int warmup;
  gpt_adamw_hparams hp;
  int replica, n_replicas; /* data order: replica r of R */
  int muon;                /* 1: Muon on the block matrices, AdamW (hp) on the rest (MuLoCo) */
  float muon_lr;           /* Muon's peak rate: step s runs at muon_lr · lr(s) / lr */
  gpt_muon_hparams mu;
} trainer_opts;

typedef struct {
  int steps_done;   /* inner steps completed in this round */
  float first_loss, last_loss, mean_loss;
  float first_lr, last_lr; /* the inner learning rate of the first and the last step */
  double seconds;
  long tokens;
} trainer_stats;

/* Called after every inner step; a non-zero return stops the round early (preemption). */
typedef int (*trainer_step_cb)(void *ctx, long step, int h, float loss, float lr);

typedef struct trainer trainer;

/* Create a trainer for model `cfg` on backend `bo`, reading the concatenated token stream of
 * shards[0..n). The caller frees with trainer_free. */
int trainer_open(trainer **out, const gpt_config *cfg, const gpt_backend_opts *bo, const char *const *shards,
                 int n, const trainer_opts *opts);
void trainer_free(trainer *t);

size_t trainer_num_params(const trainer *t);

/* Where the LR schedule runs relative to the step counter: inner step s uses the rate of
 * schedule position s + shift (0, the default: s itself; async leases start at the job's
 * progress, Lease.schedule_shift). The data batch is always s's. */
void trainer_set_sched_shift(trainer *t, long shift);

/* Run inner steps first_step .. first_step+steps-1 starting from theta[n_params] and write
 * delta[n_params] = theta − θ_end (for the steps actually done: fewer if cb stopped it).
 * theta and delta may not alias. */
int trainer_round(trainer *t, const float *theta, long first_step, int steps, float *delta, trainer_stats *st,
                  trainer_step_cb cb, void *cb_ctx);

/* Streaming DiLoCo: the model's live parameters are the slot's local parameters, changed
 * between steps. Run inner steps first_step .. first_step+steps-1 from the parameters the
 * model holds (cb may read and write them between steps with trainer_get/set_params). */
int trainer_train(trainer *t, long first_step, int steps, trainer_stats *st, trainer_step_cb cb, void *cb_ctx);
/* Copy the flat range [off, off+n) of the model's parameters out / in (canonical layout). */
int trainer_get_params(trainer *t, float *dst, size_t off, size_t n);
int trainer_set_params(trainer *t, const float *src, size_t off, size_t n);
/* Inner optimizer state (inner_state keep/reset/checkpoint). adam_step is the number of AdamW
 * steps taken so far (torch's state['step']). With Muon, m holds its momentum buffers at the
 * Muon tensors (v zero there): the same two arrays. */
int trainer_reset_state(trainer *t);
int trainer_get_state(trainer *t, float *m, float *v, long *adam_step);
int trainer_set_state(trainer *t, const float *m, const float *v, long adam_step);

#endif
