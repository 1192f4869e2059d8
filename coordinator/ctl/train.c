/* train.c — dipacoctl's single-process training tools: init (a fresh model directory),
 * train (AdamW, or Muon with AdamW, with the inner schedule) and eval (mean loss over the first K batches). They use
 * the same kernels, formats and data order as the daemons, so a model trained here and one
 * trained by a one-worker job with the same spec see the same batches. */
#include "common/dataset.h"
#include "common/errors.h"
#include "coordinator/ctl/ctl.h"
#include "kernels/gpt.h"
#include "kernels/modeldir.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------- init ---------- */

/* The Llama flags of init (after parsing; their entries in args are named "n-kv-head" ..).
 * Defaults: NKV = NH, I = 8C/3 rounded up to a multiple of 32 (the MLP parameters of GPT-2's
 * 4C), tied embeddings, rms_norm_eps 1e-5, rope_theta 10000, llama3 bands 1 and 4 over
 * original_max_position_embeddings = n_positions. Returns 0 or 2 (usage, printed). */
static int init_llama(gpt_config *cfg, const char *arch, const char *rope, int untied, const dpc_arg *args) {
  static const char *const llama_only[] = {"n-kv-head", "intermediate-size", "rms-norm-eps", "rope-theta",
                                           "untied", "attention-bias", "rope-scaling", "rope-factor",
                                           "rope-low-freq-factor", "rope-high-freq-factor",
                                           "rope-original-max-positions"};
  if (strcmp(arch, "gpt2") == 0) {
    for (size_t i = 0; i < sizeof llama_only / sizeof *llama_only; i++)
      if (dpc_args_find(args, llama_only[i])->seen) {
        fprintf(stderr, "dipacoctl init: --%s is for --arch llama\n", llama_only[i]);
        return 2;
      }
    memset(&cfg->arch, 0, sizeof *cfg - offsetof(gpt_config, arch));
    return 0;
  }
  if (strcmp(arch, "llama") != 0) {
    fprintf(stderr, "dipacoctl init: --arch %s unknown (use gpt2 or llama)\n", arch);
    return 2;
  }
  cfg->arch = GPT_ARCH_LLAMA;
  if (!dpc_args_find(args, "n-kv-head")->seen) cfg->n_kv_head = cfg->n_head;
  if (!dpc_args_find(args, "intermediate-size")->seen) cfg->intermediate_size = (8 * cfg->n_embd / 3 + 31) / 32 * 32;
  cfg->tie_word_embeddings = !untied;
  if (!rope) {
    if (dpc_args_find(args, "rope-factor")->seen || dpc_args_find(args, "rope-low-freq-factor")->seen ||
        dpc_args_find(args, "rope-high-freq-factor")->seen || dpc_args_find(args, "rope-original-max-positions")->seen) {
      fprintf(stderr, "dipacoctl init: the --rope-* scaling flags need --rope-scaling llama3\n");
      return 2;
    }
    cfg->rope_factor = cfg->rope_low_freq_factor = cfg->rope_high_freq_factor = 0.0;
    cfg->rope_original_max_position_embeddings = 0;
  } else if (strcmp(rope, "llama3") == 0) {
    cfg->rope_scaling = GPT_ROPE_LLAMA3;
    if (!dpc_args_find(args, "rope-original-max-positions")->seen)
      cfg->rope_original_max_position_embeddings = cfg->n_positions;
  } else {
    fprintf(stderr, "dipacoctl init: --rope-scaling %s unknown (only llama3)\n", rope);
    return 2;
  }
  return 0;
}

int ctl_init(int argc, char **argv) {
  gpt_config cfg = {.rms_norm_eps = 1e-5, .rope_theta = 10000.0, .rope_factor = 8.0, .rope_low_freq_factor = 1.0,
                    .rope_high_freq_factor = 4.0};
  long seed = 1337;
  const char *out = NULL, *arch = "gpt2", *rope = NULL;
  int untied = 0;
  dpc_arg args[] = {{.name = "n-layer", .kind = DPC_ARG_INT, .dst = &cfg.n_layer, .required = 1},
                    {.name = "n-head", .kind = DPC_ARG_INT, .dst = &cfg.n_head, .required = 1},
                    {.name = "n-embd", .kind = DPC_ARG_INT, .dst = &cfg.n_embd, .required = 1},
                    {.name = "n-positions", .kind = DPC_ARG_INT, .dst = &cfg.n_positions, .required = 1},
                    {.name = "vocab-size", .kind = DPC_ARG_INT, .dst = &cfg.vocab_size, .required = 1},
                    {.name = "seed", .kind = DPC_ARG_LONG, .dst = &seed},
                    {.name = "out", .kind = DPC_ARG_STR, .dst = &out, .required = 1},
                    {.name = "arch", .kind = DPC_ARG_STR, .dst = &arch},
                    {.name = "n-kv-head", .kind = DPC_ARG_INT, .dst = &cfg.n_kv_head},
                    {.name = "intermediate-size", .kind = DPC_ARG_INT, .dst = &cfg.intermediate_size},
                    {.name = "rms-norm-eps", .kind = DPC_ARG_DOUBLE, .dst = &cfg.rms_norm_eps},
                    {.name = "rope-theta", .kind = DPC_ARG_DOUBLE, .dst = &cfg.rope_theta},
                    {.name = "untied", .kind = DPC_ARG_FLAG, .dst = &untied},
                    {.name = "attention-bias", .kind = DPC_ARG_FLAG, .dst = &cfg.attention_bias},
                    {.name = "rope-scaling", .kind = DPC_ARG_STR, .dst = &rope},
                    {.name = "rope-factor", .kind = DPC_ARG_DOUBLE, .dst = &cfg.rope_factor},
                    {.name = "rope-low-freq-factor", .kind = DPC_ARG_DOUBLE, .dst = &cfg.rope_low_freq_factor},
                    {.name = "rope-high-freq-factor", .kind = DPC_ARG_DOUBLE, .dst = &cfg.rope_high_freq_factor},
                    {.name = "rope-original-max-positions", .kind = DPC_ARG_INT,
                     .dst = &cfg.rope_original_max_position_embeddings},
                    DPC_ARGS_END};
  int rc, status;
  if (ctl_args("init", argc, argv, args, NULL, NULL, &status)) return status;
  if ((rc = init_llama(&cfg, arch, rope, untied, args))) return rc;
  static gpt_layout lay;
  if ((rc = gpt_layout_build(&cfg, &lay))) {
    fprintf(stderr, "dipacoctl init: %s\n", dpc_errmsg());
    return 2;
  }
  float *params = malloc(lay.n_params * sizeof *params);
  if (!params) {
    fprintf(stderr, "dipacoctl init: out of memory for %zu parameters\n", lay.n_params);
    return 1;
  }
  gpt_init_params(&lay, params, (uint64_t)seed);
  rc = modeldir_save(out, &cfg, params);
  free(params);
  if (rc) {
    CTL_FAIL("init");
    return 1;
  }
  fprintf(stderr, "init: wrote %s (%s, %zu parameters)\n", out, gpt_arch_name(cfg.arch), lay.n_params);
  return 0;
}

/* ---------- shared by train and eval ---------- */

/* The flags train and eval share. --data takes the first shard; further shards (a shell
 * glob) arrive as positionals and are appended by session_data. */
typedef struct {
  const char *model_dir, *data0, *backend, *precision;
  int B, T, threads, device;
  char **data; /* data0 then the positionals; owned, freed by session_close */
  int ndata;
} session_opts;

typedef struct {
  gpt_config cfg;
  float *params;
  gpt_model *model;
  dataset *ds;
  int *inputs, *targets;
} session;

static void session_close(session *s, session_opts *o) {
  gpt_free(s->model);
  dataset_close(s->ds);
  free(s->params);
  free(s->inputs);
  free(s->targets);
  free(o->data);
  o->data = NULL;
}

/* Collects o->data0 and the positional shards into o->data; returns 0 or -1 (out of memory). */
static int session_data(session_opts *o, char **pos, int npos) {
  if (!(o->data = calloc((size_t)npos + 1, sizeof *o->data))) return -1;
  o->data[0] = (char *)o->data0;
  for (int i = 0; i < npos; i++) o->data[i + 1] = pos[i];
  o->ndata = npos + 1;
  return 0;
}

/* Loads the model and opens the data for batches of B x T; returns an exit status (0 ready). */
static int session_open(const char *cmd, session *s, const session_opts *o) {
  const int B = o->B, T = o->T;
  memset(s, 0, sizeof *s);
  gpt_backend_opts bo = {.threads = o->threads, .device = o->device};
  if (gpt_backend_parse(o->backend, &bo.kind) || gpt_precision_parse(o->precision, &bo.precision)) {
    CTL_FAIL(cmd);
    return 2;
  }
  if (o->device < 0) {
    fprintf(stderr, "dipacoctl %s: --device must be >= 0\n", cmd);
    return 2;
  }
  if (o->ndata == 0) {
    fprintf(stderr, "dipacoctl %s: no data shards given (--data SHARD...)\n", cmd);
    return 2;
  }
  if (B < 1 || T < 1) {
    fprintf(stderr, "dipacoctl %s: --batch and --seq-len must be >= 1\n", cmd);
    return 2;
  }
  if (modeldir_load(o->model_dir, &s->cfg, &s->params)) {
    CTL_FAIL(cmd);
    return 1;
  }
  if (T > s->cfg.n_positions) {
    fprintf(stderr, "dipacoctl %s: --seq-len %d exceeds the model's n_positions %d (%s/config.json)\n", cmd, T,
            s->cfg.n_positions, o->model_dir);
    return 2;
  }
  if (dataset_open((const char **)o->data, o->ndata, &s->ds)) {
    CTL_FAIL(cmd);
    return 1;
  }
  if (dataset_check_vocab(s->ds, s->cfg.vocab_size)) { /* names the shard and the position */
    CTL_FAIL(cmd);
    return 1;
  }
  if (dataset_num_batches(s->ds, B, T) < 1) {
    CTL_FAIL(cmd);
    return 1;
  }
  if (gpt_create(&s->model, &s->cfg, &bo, B, T) || gpt_set_params(s->model, s->params, 0, s->model->lay.n_params)) {
    CTL_FAIL(cmd);
    return 1;
  }
  s->inputs = malloc((size_t)B * T * sizeof *s->inputs);
  s->targets = malloc((size_t)B * T * sizeof *s->targets);
  if (!s->inputs || !s->targets) {
    fprintf(stderr, "dipacoctl %s: out of memory\n", cmd);
    return 1;
  }
  return 0;
}

/* Writes a remaining time as "42s", "3m07s" or "1h05m" ("--" when unknown). */
static void format_eta(double s, char *buf, size_t n) {
  if (!(s >= 0) || s > 1e7) {
    snprintf(buf, n, "--");
    return;
  }
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
  else snprintf(buf, n, "%lds", t);
}


/* ---------- train ---------- */

/* The optimizer flags of train. */
typedef struct {
  int steps, warmup, json;
  float lr, lr_min_frac, wd, beta1, beta2, eps, clip;
  const char *optimizer;   /* "adamw" or "muon" */
  float muon_lr, muon_wd;  /* muon_wd NAN until given: then it is --weight-decay */
  const char *muon_adjust; /* "original" or "match_rms_adamw" */
  gpt_muon_hparams mu;     /* momentum, nesterov, ns_steps from the flags; the rest filled by train_check */
  const char *state_out;   /* --opt-state-out: the final optimizer state m then v, raw float32 */
} train_opts;

/* Why the flags are unusable, or NULL. Completes t->mu. */
static const char *train_check(train_opts *t, int threads) {
  if (t->steps < 1) return "--steps must be >= 1";
  if (t->warmup < 0) return "--warmup must be >= 0";
  if (!(t->lr > 0)) return "--lr must be > 0";
  if (!(t->lr_min_frac >= 0 && t->lr_min_frac <= 1)) return "--lr-min-frac must be in [0, 1]";
  if (!(t->wd >= 0)) return "--weight-decay must be >= 0";
  if (!(t->beta1 >= 0 && t->beta1 < 1 && t->beta2 >= 0 && t->beta2 < 1)) return "--beta1 and --beta2 must be in [0, 1)";
  if (!(t->eps > 0)) return "--eps must be > 0";
  if (!(t->clip >= 0)) return "--grad-clip must be >= 0 (0 disables)";
  if (threads < 0) return "--threads must be >= 0";
  if (strcmp(t->optimizer, "adamw") != 0 && strcmp(t->optimizer, "muon") != 0)
    return "--optimizer must be adamw or muon";
  if (!(t->muon_lr > 0)) return "--muon-lr must be > 0";
  if (!(t->mu.momentum >= 0 && t->mu.momentum < 1)) return "--muon-momentum must be in [0, 1)";
  if (t->mu.nesterov != 0 && t->mu.nesterov != 1) return "--muon-nesterov must be 0 or 1";
  if (t->mu.ns_steps < 1 || t->mu.ns_steps > 20) return "--muon-ns-steps must be in [1, 20]";
  if (isnan(t->muon_wd)) t->muon_wd = t->wd;
  if (!(t->muon_wd >= 0)) return "--muon-weight-decay must be >= 0";
  if (gpt_muon_adjust_parse(t->muon_adjust, &t->mu.adjust)) return "--muon-adjust-lr must be original or match_rms_adamw";
  t->mu.weight_decay = t->muon_wd;
  return NULL;
}

/* One optimizer step at 0-based step s: AdamW, or Muon at muon_lr * (lr_s / lr) with AdamW. */
static int train_opt_step(session *s, const train_opts *t, const gpt_adamw_hparams *hp, float lr_s, int step,
                          float *norm) {
  if (strcmp(t->optimizer, "muon") != 0) return gpt_adamw_step(s->model, hp, lr_s, step + 1, norm);
  const float muon_lr = (float)((double)t->muon_lr * ((double)lr_s / (double)t->lr));
  return gpt_muon_step(s->model, hp, &t->mu, lr_s, muon_lr, step + 1, norm);
}

/* --opt-state-out: the optimizer state (m, then v; n_params float32 each, canonical layout). */
static int write_opt_state(session *s, const char *path) {
  const size_t P = s->model->lay.n_params;
  float *buf = malloc(2 * P * sizeof *buf);
  if (!buf) return dpc_err(DPC_ENOMEM, "out of memory for the optimizer state");
  int rc = gpt_get_opt_state(s->model, buf, buf + P);
  FILE *f = rc ? NULL : fopen(path, "wb");
  if (!rc && (!f || fwrite(buf, sizeof *buf, 2 * P, f) != 2 * P))
    rc = dpc_err(DPC_EIO, "cannot write the optimizer state to %s", path);
  if (f && fclose(f) && !rc) rc = dpc_err(DPC_EIO, "cannot write the optimizer state to %s", path);
  free(buf);
  return rc;
}

/* Runs t->steps AdamW steps on the session's model, printing progress (a JSON line per step
 * with --json); returns 0 or 1 (message printed). */
static int train_steps(session *s, const train_opts *t, int B, int T) {
  gpt_adamw_hparams hp = {t->beta1, t->beta2, t->eps, t->wd, t->clip};
  const int steps = t->steps, tty = isatty(STDERR_FILENO);
  double t0 = dpc_mono_s(), tlast = t0, last_print = 0;
  for (int step = 0; step < steps; step++) {
    float loss = 0, norm = 0;
    float lr_s = gpt_lr_at(t->lr, t->warmup, steps, t->lr_min_frac, step);
    if (dataset_batch(s->ds, B, T, step, 0, 1, s->inputs, s->targets) ||
        gpt_forward(s->model, s->inputs, s->targets, B, T, &loss) || gpt_zero_grad(s->model) ||
        gpt_backward(s->model) || train_opt_step(s, t, &hp, lr_s, step, &norm)) {
      CTL_FAIL("train");
      return 1;
    }
    if (!isfinite(loss)) {
      fprintf(stderr, "dipacoctl train: loss became %f at step %d (lower --lr?)\n", loss, step);
      return 1;
    }
    double now = dpc_mono_s();
    double tps = (double)B * T / (now - tlast + 1e-12);
    tlast = now;
    if (t->json) {
      printf("{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens_per_s\":%.1f}\n", step, loss, lr_s,
             norm, tps);
      fflush(stdout);
    } else if (now - last_print > (tty ? 0.2 : 5.0) || step + 1 == steps || step == 0) {
      last_print = now;
      double avg_tps = (double)B * T * (step + 1) / (now - t0 + 1e-12);
      char eta[32];
      format_eta((double)(steps - step - 1) * B * T / avg_tps, eta, sizeof eta);
      fprintf(stderr, "%sstep %*d/%d | loss %.4f | lr %.2e | %.0f tok/s | ETA %s%s", tty ? "\r" : "",
              (int)snprintf(NULL, 0, "%d", steps), step + 1, steps, loss, lr_s, avg_tps, eta, tty ? "   " : "\n");
    }
  }
  if (tty && !t->json) fputc('\n', stderr);
  return 0;
}

int ctl_train(int argc, char **argv) {
  const char *out = NULL;
  session_opts o = {.backend = "cpu", .precision = "fp32"};
  train_opts t = {.lr = 3e-4f, .lr_min_frac = 0.1f, .wd = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                  .clip = 1.0f, .optimizer = "adamw", .muon_lr = 0.02f, .muon_wd = NAN, .muon_adjust = "original",
                  .mu = {.momentum = 0.95f, .nesterov = 1, .ns_steps = 5}};
  dpc_arg args[] = {{.name = "model", .kind = DPC_ARG_STR, .dst = &o.model_dir, .required = 1},
                    {.name = "data", .kind = DPC_ARG_STR, .dst = &o.data0, .required = 1},
                    {.name = "out", .kind = DPC_ARG_STR, .dst = &out, .required = 1},
                    {.name = "steps", .kind = DPC_ARG_INT, .dst = &t.steps, .required = 1},
                    {.name = "batch", .kind = DPC_ARG_INT, .dst = &o.B, .required = 1},
                    {.name = "seq-len", .kind = DPC_ARG_INT, .dst = &o.T, .required = 1},
                    {.name = "lr", .kind = DPC_ARG_FLOAT, .dst = &t.lr},
                    {.name = "warmup", .kind = DPC_ARG_INT, .dst = &t.warmup},
                    {.name = "lr-min-frac", .kind = DPC_ARG_FLOAT, .dst = &t.lr_min_frac},
                    {.name = "weight-decay", .kind = DPC_ARG_FLOAT, .dst = &t.wd},
                    {.name = "beta1", .kind = DPC_ARG_FLOAT, .dst = &t.beta1},
                    {.name = "beta2", .kind = DPC_ARG_FLOAT, .dst = &t.beta2},
                    {.name = "eps", .kind = DPC_ARG_FLOAT, .dst = &t.eps},
                    {.name = "grad-clip", .kind = DPC_ARG_FLOAT, .dst = &t.clip},
                    {.name = "threads", .kind = DPC_ARG_INT, .dst = &o.threads},
                    {.name = "backend", .kind = DPC_ARG_STR, .dst = &o.backend},
                    {.name = "precision", .kind = DPC_ARG_STR, .dst = &o.precision},
                    {.name = "device", .kind = DPC_ARG_INT, .dst = &o.device},
                    {.name = "json", .kind = DPC_ARG_FLAG, .dst = &t.json},
                    {.name = "optimizer", .kind = DPC_ARG_STR, .dst = &t.optimizer},
                    {.name = "muon-lr", .kind = DPC_ARG_FLOAT, .dst = &t.muon_lr},
                    {.name = "muon-momentum", .kind = DPC_ARG_FLOAT, .dst = &t.mu.momentum},
                    {.name = "muon-nesterov", .kind = DPC_ARG_INT, .dst = &t.mu.nesterov},
                    {.name = "muon-ns-steps", .kind = DPC_ARG_INT, .dst = &t.mu.ns_steps},
                    {.name = "muon-weight-decay", .kind = DPC_ARG_FLOAT, .dst = &t.muon_wd},
                    {.name = "muon-adjust-lr", .kind = DPC_ARG_STR, .dst = &t.muon_adjust},
                    {.name = "opt-state-out", .kind = DPC_ARG_STR, .dst = &t.state_out},
                    DPC_ARGS_END};
  char **pos = NULL;
  int npos = 0, status;
  if (ctl_args("train", argc, argv, args, &pos, &npos, &status)) return status;
  const char *why = train_check(&t, o.threads);
  if (why) {
    fprintf(stderr, "dipacoctl train: %s\n", why);
    free(pos);
    return 2;
  }
  session s;
  memset(&s, 0, sizeof s);
  status = 1;
  if (session_data(&o, pos, npos)) goto done;
  status = session_open("train", &s, &o);
  if (status) goto done;
  const int B = o.B, T = o.T;
  const long nb = dataset_num_batches(s.ds, B, T);
  double t0 = dpc_mono_s();
  if ((status = train_steps(&s, &t, B, T))) goto done;
  status = 1;
  double el = dpc_mono_s() - t0;
  if (gpt_get_params(s.model, s.params, 0, s.model->lay.n_params) || modeldir_save(out, &s.cfg, s.params) ||
      (t.state_out && write_opt_state(&s, t.state_out))) {
    CTL_FAIL("train");
    goto done;
  }
  fprintf(stderr, "train: %d steps (%ld batches per epoch) in %.1f s, %.0f tokens/s; wrote %s\n", t.steps, nb, el,
          (double)t.steps * B * T / el, out);
  status = 0;
done:
  session_close(&s, &o);
  free(pos);
  return status;
}

/* ---------- eval ---------- */

int ctl_eval(int argc, char **argv) {
  session_opts o = {.backend = "cpu", .precision = "fp32"};
  int json = 0;
  long K = 0;
  dpc_arg args[] = {{.name = "model", .kind = DPC_ARG_STR, .dst = &o.model_dir, .required = 1},
                    {.name = "data", .kind = DPC_ARG_STR, .dst = &o.data0, .required = 1},
                    {.name = "batch", .kind = DPC_ARG_INT, .dst = &o.B, .required = 1},
                    {.name = "seq-len", .kind = DPC_ARG_INT, .dst = &o.T, .required = 1},
                    {.name = "batches", .kind = DPC_ARG_LONG, .dst = &K},
                    {.name = "threads", .kind = DPC_ARG_INT, .dst = &o.threads},
                    {.name = "backend", .kind = DPC_ARG_STR, .dst = &o.backend},
                    {.name = "json", .kind = DPC_ARG_FLAG, .dst = &json},
                    {.name = "precision", .kind = DPC_ARG_STR, .dst = &o.precision},
                    {.name = "device", .kind = DPC_ARG_INT, .dst = &o.device},
                    DPC_ARGS_END};
  char **pos = NULL;
  int npos = 0, status;
  if (ctl_args("eval", argc, argv, args, &pos, &npos, &status)) return status;
  session s;
  memset(&s, 0, sizeof s);
  status = 1;
  if (session_data(&o, pos, npos)) goto done;
  if (K < 0 || o.threads < 0) {
    fprintf(stderr, "dipacoctl eval: --batches and --threads must be >= 0\n");
    status = 2;
    goto done;
  }
  status = session_open("eval", &s, &o);
  if (status) goto done;
  status = 1;
  const int B = o.B, T = o.T;
  long nb = dataset_num_batches(s.ds, B, T);
  if (K == 0) K = nb;
  if (K > nb) {
    fprintf(stderr, "dipacoctl eval: --batches %ld but the data holds only %ld batches of %dx%d\n", K, nb, B, T);
    status = 2;
    goto done;
  }
  double sum = 0;
  const int tty = isatty(STDERR_FILENO);
  for (long b = 0; b < K; b++) {
    float loss = 0;
    if (dataset_batch(s.ds, B, T, b, 0, 1, s.inputs, s.targets) ||
        gpt_forward(s.model, s.inputs, s.targets, B, T, &loss)) {
      CTL_FAIL("eval");
      goto done;
    }
    sum += loss;
    if (tty && !json) fprintf(stderr, "\reval batch %ld/%ld, mean loss %.4f", b + 1, K, sum / (b + 1));
  }
  if (tty && !json) fputc('\n', stderr);
  if (json)
    printf("{\"loss\":%.6f,\"batches\":%ld,\"tokens\":%ld}\n", sum / K, K, K * B * T);
  else
    printf("eval loss %.4f over %ld batches (%ld tokens)\n", sum / K, K, K * B * T);
  status = 0;
done:
  session_close(&s, &o);
  free(pos);
  return status;
}
