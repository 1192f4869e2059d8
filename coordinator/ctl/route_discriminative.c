/* route_discriminative.c — `dipacoctl route fit --discriminative --dipaco DIR`: the paper's
 * discriminative re-routing of a DiPaCo model directory (dipaco_dir.h). Each training sequence
 * goes to the path with the lowest loss on it, and a linear softmax router on the same prefix
 * features (under the router's base model) learns to predict that path; route.c hands the
 * command over. The new router is written with a copy of the base model beside it. */
#include "common/dataset.h"
#include "common/errors.h"
#include "coordinator/ctl/ctl.h"
#include "coordinator/ctl/dipaco_dir.h"
#include "kernels/gpt.h"
#include "kernels/modeldir.h"
#include "kernels/router.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CMD "route fit --discriminative"

/* The flags of `route fit --discriminative`. */
typedef struct {
  const char *dir, *backend, *out;
  const char *const *data; /* --data and the positional shards */
  int ndata;
  int T, B, threads, iters;
  long max_seq;
  double lr, l2;
} disc_opts;

/* The sequences of one fit: their tokens, their prefix features and their labels. */
typedef struct {
  dipaco_dir d;
  long n;       /* sequences */
  int *in, *tg; /* [n][T] inputs and targets */
  float *feat;  /* [n][C] prefix features under the base model */
  int *label;   /* [n] the path with the lowest loss on the sequence */
} disc_fit;

static void fit_free(disc_fit *f) {
  dipaco_dir_free(&f->d);
  free(f->in);
  free(f->tg);
  free(f->feat);
  free(f->label);
}

/* Per-sequence loss of path model m on sequences in[n][T] / tg[n][T], B at a time; loss[i]
 * is the mean cross-entropy over the sequence's T tokens. */
static int sequence_losses(gpt_model *m, int B, const int *in, const int *tg, long n, int T, int V, float *row,
                           double *loss) {
  for (long s0 = 0; s0 < n; s0 += B) {
    int nb = (int)(n - s0 < B ? n - s0 : B);
    int rc = gpt_forward(m, in + (size_t)s0 * T, NULL, nb, T, NULL);
    for (int b = 0; !rc && b < nb; b++) {
      double sum = 0, ce = 0;
      for (int t = 0; !rc && t < T; t++) {
        rc = dipaco_token_ce(m, b, t, tg[(size_t)(s0 + b) * T + t], row, V, &ce);
        sum += ce;
      }
      loss[s0 + b] = sum / T;
    }
    if (rc) return rc;
  }
  return 0;
}

/* Read the sequences (--sequences of them spread evenly over the data) and their prefix
 * features: 0, 1 with the message printed (too little data), or a negative DPC_E* code. */
static int fit_read(disc_fit *f, const disc_opts *o, const gpt_backend_opts *bo) {
  const int prefix = f->d.r.prefix, T = o->T, C = f->d.base_cfg.n_embd, P = f->d.n_paths;
  dataset *ds = NULL;
  int rc = dataset_open(o->data, o->ndata, &ds);
  if (!rc) rc = dataset_check_vocab(ds, f->d.cfg.vocab_size);
  if (!rc) rc = dataset_check_vocab(ds, f->d.base_cfg.vocab_size);
  long all = rc ? 0 : dataset_num_batches(ds, 1, T), n = all;
  if (!rc && n < P) {
    fprintf(stderr, "dipacoctl " CMD ": %ld sequences of %d + 1 tokens, fewer than the %d paths\n", n, T, P);
    dataset_close(ds);
    return 1;
  }
  if (o->max_seq > 0 && o->max_seq < n) n = o->max_seq; /* spread evenly over the data */
  f->n = n;
  int *seq = NULL;
  if (!rc) {
    f->in = malloc((size_t)n * T * sizeof *f->in);
    f->tg = malloc((size_t)n * T * sizeof *f->tg);
    f->feat = malloc((size_t)n * C * sizeof *f->feat);
    f->label = malloc((size_t)n * sizeof *f->label);
    seq = malloc((size_t)n * prefix * sizeof *seq);
    if (!f->in || !f->tg || !f->feat || !f->label || !seq) rc = dpc_err(DPC_ENOMEM, "out of memory for %ld sequences", n);
  }
  for (long i = 0; !rc && i < n; i++) {
    long src = n == all ? i : (long)((double)i * (double)all / (double)n);
    rc = dataset_batch(ds, 1, T, src, 0, 1, f->in + (size_t)i * T, f->tg + (size_t)i * T);
    memcpy(seq + (size_t)i * prefix, f->in + (size_t)i * T, (size_t)prefix * sizeof *seq);
  }
  dataset_close(ds);
  gpt_model *m = NULL;
  static gpt_layout blay;
  if (!rc) rc = gpt_layout_build(&f->d.base_cfg, &blay);
  if (!rc) rc = gpt_create(&m, &f->d.base_cfg, bo, 16, prefix);
  if (!rc) rc = gpt_set_params(m, f->d.base, 0, blay.n_params);
  if (!rc) rc = router_features(m, seq, (size_t)n, prefix, prefix, f->feat, NULL, NULL);
  gpt_free(m);
  free(seq);
  return rc;
}

/* The label of a sequence: the path with the lowest loss on it (ties to the lower path). */
static int fit_label(disc_fit *f, const disc_opts *o, const gpt_backend_opts *bo) {
  const int P = f->d.n_paths, V = f->d.cfg.vocab_size;
  const long n = f->n;
  double *loss = malloc((size_t)n * sizeof *loss), *best = malloc((size_t)n * sizeof *best);
  float *row = malloc((size_t)V * sizeof *row);
  int rc = loss && best && row ? 0 : dpc_err(DPC_ENOMEM, "out of memory for %ld sequences", n);
  static gpt_layout lay;
  if (!rc) rc = gpt_layout_build(&f->d.cfg, &lay);
  for (long i = 0; !rc && i < n; i++) best[i] = INFINITY;
  const int tty = isatty(STDERR_FILENO);
  for (int p = 0; p < P && !rc; p++) {
    gpt_model *m = NULL;
    rc = gpt_create(&m, &f->d.cfg, bo, o->B, o->T);
    if (!rc) rc = gpt_set_params(m, f->d.path[p], 0, lay.n_params);
    if (!rc) rc = sequence_losses(m, o->B, f->in, f->tg, n, o->T, V, row, loss);
    gpt_free(m);
    for (long i = 0; !rc && i < n; i++)
      if (loss[i] < best[i]) {
        best[i] = loss[i];
        f->label[i] = p;
      }
    if (!rc && tty) fprintf(stderr, "\r" CMD ": losses under path %d/%d", p + 1, P);
  }
  if (!rc && tty) fputc('\n', stderr);
  free(loss);
  free(best);
  free(row);
  return rc;
}

/* Report the labels, fit the linear router to them and write it with its base model. */
static int fit_router(const disc_fit *f, const disc_opts *o) {
  const int P = f->d.n_paths, C = f->d.base_cfg.n_embd, prefix = f->d.r.prefix;
  const long n = f->n;
  long *cnt = calloc((size_t)P, sizeof *cnt);
  router nr = {.kind = ROUTER_LINEAR, .n_paths = P, .dim = C, .prefix = prefix, .seed = f->d.r.seed,
               .model = f->d.r.model, .model_crc = f->d.r.model_crc,
               .c = malloc((size_t)P * C * sizeof(float)), .c2 = malloc((size_t)P * sizeof(float))};
  int rc = cnt && nr.c && nr.c2 ? 0 : dpc_err(DPC_ENOMEM, "out of memory for %ld sequences", n);
  if (!rc) {
    for (long i = 0; i < n; i++) cnt[f->label[i]]++;
    int agree = 0;
    for (long i = 0; i < n; i++) agree += router_route(&f->d.r, f->feat + (size_t)i * C, NULL) == f->label[i];
    fprintf(stderr, CMD ": %ld sequences; lowest-loss path:", n);
    for (int p = 0; p < P; p++) fprintf(stderr, " %d:%ld", p, cnt[p]);
    fprintf(stderr, "; the old router agrees on %.1f%%\n", 100.0 * agree / n);
  }
  double acc = 0;
  if (!rc) rc = router_fit_linear(f->feat, f->label, (size_t)n, C, P, o->iters, o->lr, o->l2, nr.c, nr.c2, &acc);
  if (!rc)
    fprintf(stderr, CMD ": linear router (%d iterations): %.1f%% of the sequences routed to their lowest-loss path\n",
            o->iters, 100.0 * acc);
  char base[4096];
  snprintf(base, sizeof base, "%s/%s", o->out, ROUTER_BASE_DIR);
  if (!rc) rc = router_save(o->out, &nr);
  if (!rc) rc = modeldir_save(base, &f->d.base_cfg, f->d.base);
  if (!rc) fprintf(stderr, CMD ": wrote %s (linear, %d paths, prefix %d)\n", o->out, P, prefix);
  router_free(&nr);
  free(cnt);
  return rc;
}

/* Load, label, fit and write: the exit status (1 runtime failure, 2 usage error). */
static int fit_run(const disc_opts *o, const gpt_backend_opts *bo) {
  disc_fit f;
  memset(&f, 0, sizeof f);
  int status = 1, rc = dipaco_dir_load(o->dir, &f.d);
  const int P = f.d.n_paths, prefix = f.d.r.prefix;
  if (!rc && (P < 2 || o->T > f.d.cfg.n_positions || prefix > o->T)) {
    fprintf(stderr, "dipacoctl " CMD ": need 2+ paths (%d) and router prefix %d <= --seq-len %d <= n_positions %d\n", P,
            prefix, o->T, f.d.cfg.n_positions);
    status = 2;
    goto done;
  }
  if (!rc && (rc = fit_read(&f, o, bo)) > 0) goto done; /* too little data: message printed */
  if (!rc) rc = fit_label(&f, o, bo);
  if (!rc) rc = fit_router(&f, o);
  if (rc) CTL_FAIL(CMD);
  else status = 0;
done:
  fit_free(&f);
  return status;
}

int ctl_route_discriminative(int argc, char **argv) {
  disc_opts o = {.backend = "cpu", .B = 8, .iters = 300, .lr = 0.05, .l2 = 1e-4};
  const char *data0 = NULL;
  int flag = 0; /* --discriminative itself, which brought the command here */
  dpc_arg args[] = {{.name = "discriminative", .kind = DPC_ARG_FLAG, .dst = &flag},
                    {.name = "dipaco", .kind = DPC_ARG_STR, .dst = &o.dir, .required = 1},
                    {.name = "data", .kind = DPC_ARG_STR, .dst = &data0, .required = 1},
                    {.name = "seq-len", .kind = DPC_ARG_INT, .dst = &o.T, .required = 1},
                    {.name = "out", .kind = DPC_ARG_STR, .dst = &o.out, .required = 1},
                    {.name = "batch", .kind = DPC_ARG_INT, .dst = &o.B},
                    {.name = "sequences", .kind = DPC_ARG_LONG, .dst = &o.max_seq},
                    {.name = "iters", .kind = DPC_ARG_INT, .dst = &o.iters},
                    {.name = "lr", .kind = DPC_ARG_DOUBLE, .dst = &o.lr},
                    {.name = "l2", .kind = DPC_ARG_DOUBLE, .dst = &o.l2},
                    {.name = "threads", .kind = DPC_ARG_INT, .dst = &o.threads},
                    {.name = "backend", .kind = DPC_ARG_STR, .dst = &o.backend},
                    DPC_ARGS_END};
  char **pos = NULL;
  int npos = 0, status;
  if (ctl_args("route fit", argc, argv, args, &pos, &npos, &status)) return status;
  const char **data = calloc((size_t)npos + 1, sizeof *data);
  gpt_backend_opts bo = {.threads = o.threads};
  if (!data) {
    CTL_FAIL(CMD);
    status = 1;
  } else if (gpt_backend_parse(o.backend, &bo.kind)) {
    CTL_FAIL(CMD);
    status = 2;
  } else if (o.T < 1 || o.B < 1 || o.threads < 0 || o.max_seq < 0 || o.iters < 1 || !(o.lr > 0) || o.l2 < 0) {
    fprintf(stderr,
            "dipacoctl " CMD ": need --seq-len, --batch, --iters >= 1, --lr > 0, --l2, --sequences, --threads >= 0\n");
    status = 2;
  } else {
    data[0] = data0;
    for (int i = 0; i < npos; i++) data[i + 1] = pos[i];
    o.data = data;
    o.ndata = npos + 1;
    status = fit_run(&o, &bo);
  }
  free(data);
  free(pos);
  return status;
}
