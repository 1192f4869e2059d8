/* dipaco_eval.c — `dipacoctl eval --dipaco DIR`: routed evaluation of a DiPaCo model directory
 * (dipaco_dir.h).
 *
 * Sequence i of the data is inputs tokens[i·T, i·T + T), targets one token later (the
 * dataset order with B = 1: floor((N − 1) / T) sequences). Each sequence goes to the path its
 * first `prefix` tokens route to (features under the router's base model, docs/design.md §3),
 * and its T tokens are scored by that path. With --reroute-every W, the sequence is cut into
 * segments of W tokens; segment 0 follows the prefix as above, segment k > 0 the `prefix`
 * tokens just before it (fed to the base model as a sequence of their own, as in fitting);
 * every token is scored by its segment's path with the whole sequence as context. Reported:
 * mean loss per token overall and per path (tokens scored by that path). */
#include "common/dataset.h"
#include "common/errors.h"
#include "coordinator/ctl/ctl.h"
#include "coordinator/ctl/dipaco_dir.h"
#include "kernels/gpt.h"
#include "kernels/router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CMD "eval --dipaco"

/* The flags of `eval --dipaco`. */
typedef struct {
  const char *dir, *backend;
  const char *const *data; /* --data and the positional shards */
  int ndata;
  int T, B, W, threads, json;
  long max_seq;
} eval_opts;

/* One evaluation: the directory, the sequences with their routes, and the sums per path. */
typedef struct {
  dipaco_dir d;
  long n;         /* sequences */
  int nseg;       /* routing segments per sequence (1 without --reroute-every) */
  int *in, *tg;   /* [n][T] inputs and targets */
  int *route;     /* [n][nseg] the path of each segment */
  gpt_model **pm; /* [n_paths] path models, batch B, length T */
  float *row;     /* [V] logits scratch */
  double *sum;    /* [n_paths] summed cross-entropy of the tokens each path scored */
  long *tok;      /* [n_paths] how many tokens each path scored */
} dipaco_eval;

static void eval_free(dipaco_eval *e) {
  for (int p = 0; e->pm && p < e->d.n_paths; p++) gpt_free(e->pm[p]);
  free(e->pm);
  dipaco_dir_free(&e->d);
  free(e->in);
  free(e->tg);
  free(e->route);
  free(e->row);
  free(e->sum);
  free(e->tok);
}

/* The flags against the directory's shapes: 0, or 2 with the usage message printed. */
static int eval_check(const eval_opts *o, const dipaco_dir *d) {
  const int prefix = d->r.prefix;
  if (o->T > d->cfg.n_positions || prefix > o->T) {
    fprintf(stderr, "dipacoctl " CMD ": need router prefix %d <= --seq-len %d <= the paths' n_positions %d\n", prefix,
            o->T, d->cfg.n_positions);
    return 2;
  }
  if (o->W > 0 && (o->W < prefix || o->W >= o->T)) {
    fprintf(stderr, "dipacoctl " CMD ": --reroute-every %d: must be in [prefix %d, --seq-len %d)\n", o->W, prefix, o->T);
    return 2;
  }
  return 0;
}

/* Read the sequences into e->in / e->tg and size the per-path sums: 0, 1 with the message
 * printed (too little data), or a negative DPC_E* code. */
static int eval_read(dipaco_eval *e, const eval_opts *o) {
  const int T = o->T, V = e->d.cfg.vocab_size;
  dataset *ds = NULL;
  int rc = dataset_open(o->data, o->ndata, &ds);
  if (!rc) rc = dataset_check_vocab(ds, V);
  if (!rc) rc = dataset_check_vocab(ds, e->d.base_cfg.vocab_size);
  long n = rc ? 0 : dataset_num_batches(ds, 1, T);
  if (!rc && n <= 0) {
    fprintf(stderr, "dipacoctl " CMD ": the data holds %llu tokens, less than one sequence of %d + 1\n",
            (unsigned long long)dataset_num_tokens(ds), T);
    dataset_close(ds);
    return 1;
  }
  if (o->max_seq > 0 && o->max_seq < n) n = o->max_seq;
  e->n = n;
  e->nseg = o->W > 0 ? (T + o->W - 1) / o->W : 1;
  if (!rc) {
    e->in = malloc((size_t)n * T * sizeof *e->in);
    e->tg = malloc((size_t)n * T * sizeof *e->tg);
    e->route = malloc((size_t)n * e->nseg * sizeof *e->route);
    e->row = malloc((size_t)V * sizeof *e->row);
    e->sum = calloc((size_t)e->d.n_paths, sizeof *e->sum);
    e->tok = calloc((size_t)e->d.n_paths, sizeof *e->tok);
    e->pm = calloc((size_t)e->d.n_paths, sizeof *e->pm);
    if (!e->in || !e->tg || !e->route || !e->row || !e->sum || !e->tok || !e->pm)
      rc = dpc_err(DPC_ENOMEM, "out of memory for %ld sequences", n);
  }
  for (long i = 0; !rc && i < n; i++) rc = dataset_batch(ds, 1, T, i, 0, 1, e->in + (size_t)i * T, e->tg + (size_t)i * T);
  dataset_close(ds);
  return rc;
}

/* Route every segment of every sequence into e->route. Routing windows: segment 0 is the
 * sequence's first `prefix` tokens, segment k the `prefix` tokens before k·W. */
static int eval_route(dipaco_eval *e, const eval_opts *o, const gpt_backend_opts *bo) {
  const int prefix = e->d.r.prefix, T = o->T, C = e->d.base_cfg.n_embd;
  const size_t nsegs = (size_t)e->n * e->nseg;
  int *seg_in = malloc(nsegs * prefix * sizeof *seg_in);
  float *feat = malloc(nsegs * C * sizeof *feat);
  gpt_model *base = NULL;
  int rc = seg_in && feat ? 0 : dpc_err(DPC_ENOMEM, "out of memory for %ld sequences", e->n);
  for (long i = 0; !rc && i < e->n; i++)
    for (int k = 0; k < e->nseg; k++)
      memcpy(seg_in + ((size_t)i * e->nseg + k) * prefix, e->in + (size_t)i * T + (k ? (size_t)k * o->W - prefix : 0),
             (size_t)prefix * sizeof *seg_in);
  static gpt_layout blay;
  if (!rc) rc = gpt_create(&base, &e->d.base_cfg, bo, 16, prefix);
  if (!rc) rc = gpt_layout_build(&e->d.base_cfg, &blay);
  if (!rc) rc = gpt_set_params(base, e->d.base, 0, blay.n_params);
  if (!rc) rc = router_features(base, seg_in, nsegs, prefix, prefix, feat, NULL, NULL);
  for (size_t s = 0; !rc && s < nsegs; s++) e->route[s] = router_route(&e->d.r, feat + s * C, NULL);
  gpt_free(base);
  free(seg_in);
  free(feat);
  return rc;
}

/* One path per sequence: batches of up to B sequences of one path. */
static int eval_score_whole(dipaco_eval *e, const eval_opts *o, int tty) {
  const int T = o->T, B = o->B;
  int *bin = malloc((size_t)B * T * sizeof *bin), *btg = malloc((size_t)B * T * sizeof *btg);
  int rc = bin && btg ? 0 : dpc_err(DPC_ENOMEM, "out of memory");
  for (int p = 0; p < e->d.n_paths && !rc; p++) {
    int nb = 0;
    for (long i = 0; i <= e->n && !rc; i++) {
      if (i < e->n && e->route[i] == p) {
        memcpy(bin + (size_t)nb * T, e->in + (size_t)i * T, (size_t)T * sizeof *bin);
        memcpy(btg + (size_t)nb * T, e->tg + (size_t)i * T, (size_t)T * sizeof *btg);
        nb++;
      }
      if (nb == B || (i == e->n && nb > 0)) {
        float loss = 0;
        rc = gpt_forward(e->pm[p], bin, btg, nb, T, &loss);
        e->sum[p] += (double)loss * nb * T;
        e->tok[p] += (long)nb * T;
        nb = 0;
      }
    }
    if (tty) fprintf(stderr, "\reval --dipaco: path %d/%d", p + 1, e->d.n_paths);
  }
  free(bin);
  free(btg);
  return rc;
}

/* Re-routing: each path that a segment of the sequence uses scores that segment's tokens. */
static int eval_score_rerouted(dipaco_eval *e, const eval_opts *o, int tty) {
  const int T = o->T, W = o->W, nseg = e->nseg, V = e->d.cfg.vocab_size;
  int *seg_path = malloc((size_t)T * sizeof *seg_path);
  if (!seg_path) return dpc_err(DPC_ENOMEM, "out of memory");
  int rc = 0;
  for (long i = 0; i < e->n && !rc; i++) {
    for (int t = 0; t < T; t++) seg_path[t] = e->route[(size_t)i * nseg + t / W];
    for (int p = 0; p < e->d.n_paths && !rc; p++) {
      int used = 0;
      for (int k = 0; k < nseg; k++) used |= e->route[(size_t)i * nseg + k] == p;
      if (!used) continue;
      rc = gpt_forward(e->pm[p], e->in + (size_t)i * T, NULL, 1, T, NULL);
      for (int t = 0; t < T && !rc; t++) {
        if (seg_path[t] != p) continue;
        double ce = 0;
        rc = dipaco_token_ce(e->pm[p], 0, t, e->tg[(size_t)i * T + t], e->row, V, &ce);
        e->sum[p] += ce;
        e->tok[p]++;
      }
    }
    if (tty && (i % 64 == 63 || i == e->n - 1)) fprintf(stderr, "\reval --dipaco: sequence %ld/%ld", i + 1, e->n);
  }
  free(seg_path);
  return rc;
}

static void eval_report(const dipaco_eval *e, const eval_opts *o) {
  const int P = e->d.n_paths, W = o->W;
  double all = 0;
  long all_tok = 0;
  for (int p = 0; p < P; p++) {
    all += e->sum[p];
    all_tok += e->tok[p];
  }
  if (o->json) {
    printf("{\"loss\":%.6f,\"sequences\":%ld,\"tokens\":%ld,\"reroute_every\":%d,\"paths\":[", all / all_tok, e->n,
           all_tok, W);
    for (int p = 0; p < P; p++) {
      printf("%s{\"path\":%d,\"tokens\":%ld,\"loss\":", p ? "," : "", p, e->tok[p]);
      if (e->tok[p]) printf("%.6f}", e->sum[p] / e->tok[p]);
      else printf("null}");
    }
    printf("]}\n");
    return;
  }
  printf("dipaco eval loss %.4f over %ld sequences (%ld tokens), %d paths", all / all_tok, e->n, all_tok, P);
  if (W) printf(", re-routed every %d tokens", W);
  putchar('\n');
  for (int p = 0; p < P; p++) {
    if (e->tok[p]) printf("  path %d: %ld tokens, loss %.4f\n", p, e->tok[p], e->sum[p] / e->tok[p]);
    else printf("  path %d: no tokens routed here\n", p);
  }
}

/* Load, route, score and report: the exit status (1 runtime failure, 2 usage error). */
static int eval_run(const eval_opts *o, const gpt_backend_opts *bo) {
  dipaco_eval e;
  memset(&e, 0, sizeof e);
  int status = 1, rc = dipaco_dir_load(o->dir, &e.d);
  if (!rc && (status = eval_check(o, &e.d)) != 0) goto done;
  status = 1;
  if (!rc && (rc = eval_read(&e, o)) > 0) goto done; /* too little data: message printed */
  if (!rc) rc = eval_route(&e, o, bo);
  static gpt_layout lay;
  if (!rc) rc = gpt_layout_build(&e.d.cfg, &lay);
  for (int p = 0; !rc && p < e.d.n_paths; p++) {
    rc = gpt_create(&e.pm[p], &e.d.cfg, bo, o->B, o->T);
    if (!rc) rc = gpt_set_params(e.pm[p], e.d.path[p], 0, lay.n_params);
  }
  const int tty = isatty(STDERR_FILENO) && !o->json;
  if (!rc) rc = o->W == 0 ? eval_score_whole(&e, o, tty) : eval_score_rerouted(&e, o, tty);
  if (rc) {
    CTL_FAIL(CMD);
    goto done;
  }
  if (tty) fputc('\n', stderr);
  eval_report(&e, o);
  status = 0;
done:
  eval_free(&e);
  return status;
}

int ctl_eval_dipaco(int argc, char **argv) {
  eval_opts o = {.backend = "cpu", .B = 8};
  const char *data0 = NULL;
  dpc_arg args[] = {{.name = "dipaco", .kind = DPC_ARG_STR, .dst = &o.dir, .required = 1},
                    {.name = "data", .kind = DPC_ARG_STR, .dst = &data0, .required = 1},
                    {.name = "seq-len", .kind = DPC_ARG_INT, .dst = &o.T, .required = 1},
                    {.name = "batch", .kind = DPC_ARG_INT, .dst = &o.B},
                    {.name = "reroute-every", .kind = DPC_ARG_INT, .dst = &o.W},
                    {.name = "sequences", .kind = DPC_ARG_LONG, .dst = &o.max_seq},
                    {.name = "threads", .kind = DPC_ARG_INT, .dst = &o.threads},
                    {.name = "backend", .kind = DPC_ARG_STR, .dst = &o.backend},
                    {.name = "json", .kind = DPC_ARG_FLAG, .dst = &o.json},
                    DPC_ARGS_END};
  char **pos = NULL;
  int npos = 0, status;
  if (ctl_args("eval", argc, argv, args, &pos, &npos, &status)) return status;
  const char **data = calloc((size_t)npos + 1, sizeof *data);
  gpt_backend_opts bo = {.threads = o.threads};
  if (!data) {
    CTL_FAIL(CMD);
    status = 1;
  } else if (gpt_backend_parse(o.backend, &bo.kind)) {
    CTL_FAIL(CMD);
    status = 2;
  } else if (o.T < 1 || o.B < 1 || o.W < 0 || o.threads < 0 || o.max_seq < 0) {
    fprintf(stderr, "dipacoctl " CMD ": --seq-len and --batch must be >= 1; --reroute-every, --sequences, --threads >= 0\n");
    status = 2;
  } else {
    data[0] = data0;
    for (int i = 0; i < npos; i++) data[i + 1] = pos[i];
    o.data = data;
    o.ndata = npos + 1;
    status = eval_run(&o, &bo);
  }
  free(data);
  free(pos);
  return status;
}
