/* diloco_local.c — synchronous DiLoCo in one process, from the same pieces the daemons use
 * (worker/trainer.c for the inner loop, kernels/outer.c for the outer step), with no
 * network: the reference point between the PyTorch oracle and the distributed system.
 *
 * usage: diloco_local INIT_DIR SHARD OUT_DIR R H ROUNDS B T LR WARMUP LR_MIN_FRAC WD BETA1 BETA2
 *        EPS CLIP OUTER_LR OUTER_MOMENTUM STATE(keep|reset)
 * env DILOCO_LOCAL_BACKENDS: the replicas' backends, comma-separated and repeated as needed
 * ("cuda,cpu": a heterogeneous fleet, tests/gpu/hetero_diloco.sh); default cpu.
 * The outer momentum of round t is outer_momentum_at(OUTER_MOMENTUM, t, ROUNDS, WARMUP, DECAY)
 * with the schedule a new job spec gets by default (coordinator/jobspec.c
 * jobspec_derive_schedule, kernels/outer.h outer_default_schedule; none without momentum), or
 * env DILOCO_LOCAL_MOMENTUM_SCHEDULE=WARMUP,DECAY (0,0: constant momentum; outer_study.sh).
 * env DILOCO_LOCAL_LR_DECAY=D,F (a study's probe, not a job spec field): the outer lr of the
 * last D rounds falls linearly towards F x OUTER_LR, step t at OUTER_LR x (F + (1 - F) x
 * (ROUNDS - 1 - t) / D), as the momentum decay does.
 * env DILOCO_LOCAL_MUON=LR: Muon on the block matrices at peak rate LR (torch.optim.Muon's
 * defaults otherwise: momentum 0.95, Nesterov, 5 Newton-Schulz steps, "original" scaling, the
 * AdamW weight decay), AdamW on the rest. */
#include "common/errors.h"
#include "kernels/modeldir.h"
#include "kernels/outer.h"
#include "worker/trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  if (argc != 20) {
    fprintf(stderr, "usage: diloco_local INIT SHARD OUT R H ROUNDS B T LR WARMUP LR_MIN_FRAC WD B1 B2 EPS CLIP OLR OMU STATE\n");
    return 2;
  }
  const char *init = argv[1], *shard = argv[2], *out = argv[3];
  int R = atoi(argv[4]), H = atoi(argv[5]), rounds = atoi(argv[6]), B = atoi(argv[7]), T = atoi(argv[8]);
  trainer_opts o = {.B = B, .T = T, .total_steps = (long)rounds * H, .lr = strtof(argv[9], NULL),
                    .warmup = atoi(argv[10]), .lr_min_frac = strtof(argv[11], NULL),
                    .hp = {strtof(argv[13], NULL), strtof(argv[14], NULL), strtof(argv[15], NULL),
                           strtof(argv[12], NULL), strtof(argv[16], NULL)},
                    .n_replicas = R};
  float olr = strtof(argv[17], NULL), omu = strtof(argv[18], NULL);
  int reset = strcmp(argv[19], "reset") == 0;
  long warmup = 0, decay = 0;
  if (omu > 0) outer_default_schedule(rounds, &warmup, &decay);
  const char *sched = getenv("DILOCO_LOCAL_MOMENTUM_SCHEDULE");
  if (sched && *sched && (sscanf(sched, "%ld,%ld", &warmup, &decay) != 2 || warmup < 0 || decay < 0)) {
    fprintf(stderr, "diloco_local: DILOCO_LOCAL_MOMENTUM_SCHEDULE=%s: want WARMUP,DECAY (rounds >= 0)\n", sched);
    return 2;
  }
  long lr_decay = 0;
  float lr_floor = 1;
  const char *lrd = getenv("DILOCO_LOCAL_LR_DECAY");
  if (lrd && *lrd && (sscanf(lrd, "%ld,%f", &lr_decay, &lr_floor) != 2 || lr_decay < 0 || lr_decay > rounds ||
                      !(lr_floor >= 0 && lr_floor <= 1))) {
    fprintf(stderr, "diloco_local: DILOCO_LOCAL_LR_DECAY=%s: want D,F (0 <= D <= rounds, 0 <= F <= 1)\n", lrd);
    return 2;
  }
  const char *muon = getenv("DILOCO_LOCAL_MUON");
  if (muon && *muon) {
    o.muon = 1;
    o.muon_lr = strtof(muon, NULL);
    o.mu = (gpt_muon_hparams){.momentum = 0.95f, .weight_decay = o.hp.weight_decay, .nesterov = 1, .ns_steps = 5,
                              .adjust = GPT_MUON_ADJUST_ORIGINAL};
    if (!(o.muon_lr > 0)) {
      fprintf(stderr, "diloco_local: DILOCO_LOCAL_MUON=%s: want a rate > 0\n", muon);
      return 2;
    }
  }
  gpt_config cfg;
  float *theta = NULL;
  if (modeldir_load(init, &cfg, &theta)) {
    fprintf(stderr, "diloco_local: %s\n", dpc_errmsg());
    return 1;
  }
  const char *kinds = getenv("DILOCO_LOCAL_BACKENDS");
  if (!kinds || !*kinds) kinds = "cpu";
  trainer **tr = calloc((size_t)R, sizeof *tr);
  float **deltas = calloc((size_t)R, sizeof *deltas);
  const char *shards[1] = {shard};
  size_t n = 0;
  for (int r = 0; r < R; r++) {
    o.replica = r;
    gpt_backend_opts bo = {.kind = GPT_BACKEND_CPU, .threads = 1};
    const char *k = kinds;
    for (int i = 0; i < r; i++) k = strchr(k, ',') ? strchr(k, ',') + 1 : kinds; /* the r-th, cycling */
    char name[16];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(k, ","), k);
    if (gpt_backend_parse(name, &bo.kind)) {
      fprintf(stderr, "diloco_local: DILOCO_LOCAL_BACKENDS: %s\n", dpc_errmsg());
      return 2;
    }
    fprintf(stderr, "replica %d: %s backend\n", r, name);
    if (trainer_open(&tr[r], &cfg, &bo, shards, 1, &o)) {
      fprintf(stderr, "diloco_local: %s\n", dpc_errmsg());
      return 1;
    }
    n = trainer_num_params(tr[r]);
    deltas[r] = malloc(n * sizeof(float));
  }
  float *u = calloc(n, sizeof *u), *avg = malloc(n * sizeof *avg);
  for (int t = 0; t < rounds; t++) {
    for (int r = 0; r < R; r++) {
      trainer_stats st;
      if (reset) trainer_reset_state(tr[r]);
      if (trainer_round(tr[r], theta, (long)t * H, H, deltas[r], &st, NULL, NULL)) {
        fprintf(stderr, "diloco_local: %s\n", dpc_errmsg());
        return 1;
      }
      fprintf(stderr, "round %d replica %d: loss %.4f -> %.4f\n", t, r, st.first_loss, st.last_loss);
    }
    if (outer_average((const float *const *)deltas, NULL, R, n, avg)) {
      fprintf(stderr, "diloco_local: %s\n", dpc_errmsg());
      return 1;
    }
    float lr_t = olr;
    if (lr_decay > 0 && t >= rounds - lr_decay)
      lr_t = (float)((double)olr * (lr_floor + (1.0 - lr_floor) * (double)(rounds - 1 - t) / (double)lr_decay));
    outer_nesterov_step(theta, u, avg, n, lr_t, outer_momentum_at(omu, t, rounds, warmup, decay), 1);
  }
  int rc = modeldir_save(out, &cfg, theta);
  if (rc) fprintf(stderr, "diloco_local: %s\n", dpc_errmsg());
  for (int r = 0; r < R; r++) {
    trainer_free(tr[r]);
    free(deltas[r]);
  }
  free(tr);
  free(deltas);
  free(u);
  free(avg);
  free(theta);
  return rc ? 1 : 0;
}
