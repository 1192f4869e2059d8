/* trainer.c — the worker's inner loop: H AdamW (or Muon + AdamW) steps from the round's global
 * parameters, producing the outer gradient. See trainer.h for the contract. */
#include "worker/trainer.h"
#include "common/clock.h"
#include "common/errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct trainer {
  trainer_opts o;
  gpt_model *model;
  dataset *ds;
  int *inputs, *targets; /* (B, T) */
  long adam_step;        /* AdamW steps taken with the current moments */
  long sched_shift;      /* LR schedule position − step counter (trainer_set_sched_shift) */
};

void trainer_set_sched_shift(trainer *t, long shift) { t->sched_shift = shift; }

/* One optimizer step at learning rate lr: AdamW, or Muon at muon_lr · lr / o.lr with AdamW. */
static int opt_step(trainer *t, float lr) {
  const int step = (int)(t->adam_step + 1);
  if (!t->o.muon) return gpt_adamw_step(t->model, &t->o.hp, lr, step, NULL);
  const float muon_lr = (float)((double)t->o.muon_lr * ((double)lr / (double)t->o.lr));
  return gpt_muon_step(t->model, &t->o.hp, &t->o.mu, lr, muon_lr, step, NULL);
}

int trainer_open(trainer **out, const gpt_config *cfg, const gpt_backend_opts *bo, const char *const *shards,
                 int n, const trainer_opts *opts) {
  *out = NULL;
  if (opts->B < 1 || opts->T < 1 || opts->n_replicas < 1 || opts->replica < 0 || opts->replica >= opts->n_replicas)
    return dpc_err(DPC_EINVAL, "trainer: bad shape B=%d T=%d or replica %d of %d", opts->B, opts->T, opts->replica,
                   opts->n_replicas);
  trainer *t = calloc(1, sizeof *t);
  if (!t) return dpc_err(DPC_ENOMEM, "trainer: out of memory");
  t->o = *opts;
  int rc = dataset_open((const char **)shards, n, &t->ds);
  if (!rc && dataset_num_batches(t->ds, opts->B, opts->T) < 1)
    rc = dpc_err(DPC_ERANGE, "training data (%d file%s from %s): %llu tokens, less than one batch of B=%d x T=%d + 1",
                 n, n == 1 ? "" : "s", shards[0], (unsigned long long)dataset_num_tokens(t->ds), opts->B, opts->T);
  if (!rc) rc = dataset_check_vocab(t->ds, cfg->vocab_size); /* names the shard and the position */
  if (!rc) rc = gpt_create(&t->model, cfg, bo, opts->B, opts->T);
  if (!rc && opts->muon && !gpt_has_muon(t->model))
    rc = dpc_err(DPC_EUNSUPPORTED, "the job's inner optimizer is Muon, which the %s backend does not have "
                 "(docs/design.md §3.2)", t->model->ops->name);
  if (!rc) {
    t->inputs = malloc((size_t)opts->B * opts->T * sizeof *t->inputs);
    t->targets = malloc((size_t)opts->B * opts->T * sizeof *t->targets);
    if (!t->inputs || !t->targets) rc = dpc_err(DPC_ENOMEM, "trainer: out of memory for batch buffers");
  }
  if (rc) {
    trainer_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

void trainer_free(trainer *t) {
  if (!t) return;
  gpt_free(t->model);
  dataset_close(t->ds);
  free(t->inputs);
  free(t->targets);
  free(t);
}

size_t trainer_num_params(const trainer *t) { return t->model->lay.n_params; }

int trainer_get_params(trainer *t, float *dst, size_t off, size_t n) { return gpt_get_params(t->model, dst, off, n); }

int trainer_set_params(trainer *t, const float *src, size_t off, size_t n) { return gpt_set_params(t->model, src, off, n); }

int trainer_train(trainer *t, long first_step, int steps, trainer_stats *st, trainer_step_cb cb, void *cb_ctx) {
  const int B = t->o.B, T = t->o.T;
  memset(st, 0, sizeof *st);
  int rc = 0;
  double t0 = dpc_mono_s(), sum = 0;
  for (int h = 0; h < steps; h++) {
    long s = first_step + h;
    float loss = 0, lr = gpt_lr_at(t->o.lr, t->o.warmup, (int)t->o.total_steps, t->o.lr_min_frac, s + t->sched_shift);
    if ((rc = dataset_batch(t->ds, B, T, s, t->o.replica, t->o.n_replicas, t->inputs, t->targets)) ||
        (rc = gpt_forward(t->model, t->inputs, t->targets, B, T, &loss)) || (rc = gpt_zero_grad(t->model)) ||
        (rc = gpt_backward(t->model)) ||
        (rc = opt_step(t, lr)))
      return rc;
    if (!isfinite(loss)) return dpc_err(DPC_ENUMERIC, "inner step %ld: loss is %f", s, loss);
    t->adam_step++;
    if (h == 0) st->first_loss = loss, st->first_lr = lr;
    st->last_loss = loss;
    st->last_lr = lr;
    sum += loss;
    st->steps_done = h + 1;
    st->tokens += (long)B * T;
    if (cb && cb(cb_ctx, s, h, loss, lr)) break;
  }
  st->mean_loss = st->steps_done ? (float)(sum / st->steps_done) : 0.0f;
  st->seconds = dpc_mono_s() - t0;
  return 0;
}

int trainer_round(trainer *t, const float *theta, long first_step, int steps, float *delta, trainer_stats *st,
                  trainer_step_cb cb, void *cb_ctx) {
  const size_t n = t->model->lay.n_params;
  int rc = gpt_set_params(t->model, theta, 0, n);
  if (!rc) rc = trainer_train(t, first_step, steps, st, cb, cb_ctx);
  if (rc) return rc;
  if ((rc = gpt_get_params(t->model, delta, 0, n))) return rc;
  for (size_t i = 0; i < n; i++) delta[i] = theta[i] - delta[i];
  return 0;
}

int trainer_reset_state(trainer *t) {
  t->adam_step = 0;
  return gpt_reset_opt_state(t->model);
}

int trainer_get_state(trainer *t, float *m, float *v, long *adam_step) {
  *adam_step = t->adam_step;
  return gpt_get_opt_state(t->model, m, v);
}

int trainer_set_state(trainer *t, const float *m, const float *v, long adam_step) {
  if (adam_step < 0) return dpc_err(DPC_EINVAL, "inner state: negative AdamW step %ld", adam_step);
  t->adam_step = adam_step;
  return gpt_set_opt_state(t->model, m, v);
}
