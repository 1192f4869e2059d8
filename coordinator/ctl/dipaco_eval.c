/* dipaco_eval.c — what reads a DiPaCo model directory (kernels/router.h; written by
 * `dipacoctl job export --all-paths --router R`): `eval --dipaco DIR`, routed evaluation, and
 * `route fit --discriminative --dipaco DIR`, the paper's discriminative re-routing (each
 * training sequence goes to the path with the lowest loss on it; a linear softmax router on
 * the same prefix features learns to predict that path; route.c hands the command over).
 *
 * Sequence i of the data is inputs tokens[i·T, i·T + T), targets one token later (the
 * dataset order with B = 1: floor((N − 1) / T) sequences). Each sequence goes to the path its
 * first `prefix` tokens route to (features under the router's base model, DESIGN.md §3), and
 * its T tokens are scored by that path. With --reroute-every W, the sequence is cut into
 * segments of W tokens; segment 0 follows the prefix as above, segment k > 0 the `prefix`
 * tokens just before it (fed to the base model as a sequence of their own, as in fitting);
 * every token is scored by its segment's path with the whole sequence as context. Reported:
 * mean loss per token overall and per path (tokens scored by that path). */
#include "common/dataset.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "coordinator/ctl/ctl.h"
#include "kernels/gpt.h"
#include "kernels/modeldir.h"
#include "kernels/router.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DIPACO_MAX_EVAL_PATHS 4096

typedef struct {
  int n_paths;
  router r;
  gpt_config base_cfg, cfg;
  float *base;     /* the router's feature model */
  float **path;    /* path p's parameters */
} dipaco_dir;

static void dir_free(dipaco_dir *d) {
  router_free(&d->r);
  free(d->base);
  for (int p = 0; d->path && p < d->n_paths; p++) free(d->path[p]);
  free(d->path);
  memset(d, 0, sizeof *d);
}

/* Read DIR/dipaco.json, the router (checked against its base model) and every path. */
static int dir_load(const char *dir, dipaco_dir *d) {
  memset(d, 0, sizeof *d);
  char f[4096];
  snprintf(f, sizeof f, "%s/%s", dir, DIPACO_MODEL_JSON);
  void *buf = NULL;
  size_t n = 0;
  int rc = dpc_read_file(f, 1 << 20, &buf, &n);
  if (rc) return rc;
  cJSON *root = cJSON_ParseWithLength(buf, n);
  free(buf);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  const cJSON *paths = cJSON_GetObjectItemCaseSensitive(root, "paths");
  const cJSON *rt = cJSON_GetObjectItemCaseSensitive(root, "router");
  if (!root || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "dipaco-model") != 0)
    rc = dpc_err(DPC_EFORMAT, "%s: not a DiPaCo model directory (no \"format\": \"dipaco-model\")", f);
  else if (!cJSON_IsNumber(paths) || paths->valuedouble < 1 || paths->valuedouble > DIPACO_MAX_EVAL_PATHS)
    rc = dpc_err(DPC_EFORMAT, "%s: field \"paths\" must be an integer in [1, %d]", f, DIPACO_MAX_EVAL_PATHS);
  else if (!cJSON_IsString(rt))
    rc = dpc_err(DPC_EINVAL, "%s: the directory has no router (export with --all-paths --router ROUTER_DIR)", f);
  else {
    d->n_paths = (int)paths->valuedouble;
    snprintf(f, sizeof f, "%s/%s", dir, rt->valuestring);
  }
  cJSON_Delete(root);
  if (rc) return rc;
  if ((rc = router_load(f, &d->r))) return rc;
  if (d->r.n_paths != d->n_paths)
    return dpc_err(DPC_EINVAL, "%s routes to %d paths but %s holds %d", f, d->r.n_paths, dir, d->n_paths);
  char base[4200];
  snprintf(base, sizeof base, "%s/%s", f, ROUTER_BASE_DIR);
  if ((rc = modeldir_load(base, &d->base_cfg, &d->base))) return rc;
  static gpt_layout lay;
  if ((rc = gpt_layout_build(&d->base_cfg, &lay))) return rc;
  if ((rc = router_check_model(&d->r, &d->base_cfg, router_model_crc(&lay, d->base)))) return rc;
  if (!(d->path = calloc((size_t)d->n_paths, sizeof *d->path))) return dpc_err(DPC_ENOMEM, "out of memory");
  for (int p = 0; p < d->n_paths; p++) {
    gpt_config c;
    snprintf(f, sizeof f, "%s/path_%d", dir, p);
    if ((rc = modeldir_load(f, &c, &d->path[p]))) return rc;
    if (p == 0) d->cfg = c;
    else if (memcmp(&c, &d->cfg, sizeof c) != 0)
      return dpc_err(DPC_ESHAPE, "%s: another model shape than path_0 (every path of a DiPaCo model has one shape)", f);
  }
  return 0;
}

/* ------------------------------------------------ a DiPaCo directory for generate.c */

struct ctl_dipaco {
  dipaco_dir d;
  gpt_model *base;  /* feature model, B = 1, T = prefix */
  gpt_model **path; /* path models, B = 1, T = n_positions */
  float *feat;
};

void ctl_dipaco_close(ctl_dipaco *g) {
  if (!g) return;
  for (int p = 0; g->path && p < g->d.n_paths; p++) gpt_free(g->path[p]);
  free(g->path);
  gpt_free(g->base);
  free(g->feat);
  dir_free(&g->d);
  free(g);
}

int ctl_dipaco_open(const char *dir, const gpt_backend_opts *bo, ctl_dipaco **out) {
  *out = NULL;
  ctl_dipaco *g = calloc(1, sizeof *g);
  if (!g) return dpc_err(DPC_ENOMEM, "out of memory");
  int rc = dir_load(dir, &g->d);
  static gpt_layout blay, lay;
  if (!rc) rc = gpt_layout_build(&g->d.base_cfg, &blay);
  if (!rc) rc = gpt_layout_build(&g->d.cfg, &lay);
  if (!rc) rc = gpt_create(&g->base, &g->d.base_cfg, bo, 1, g->d.r.prefix);
  if (!rc) rc = gpt_set_params(g->base, g->d.base, 0, blay.n_params);
  if (!rc && !(g->path = calloc((size_t)g->d.n_paths, sizeof *g->path))) rc = dpc_err(DPC_ENOMEM, "out of memory");
  if (!rc && !(g->feat = malloc((size_t)g->d.base_cfg.n_embd * sizeof *g->feat)))
    rc = dpc_err(DPC_ENOMEM, "out of memory");
  for (int p = 0; !rc && p < g->d.n_paths; p++) {
    rc = gpt_create(&g->path[p], &g->d.cfg, bo, 1, g->d.cfg.n_positions);
    if (!rc) rc = gpt_set_params(g->path[p], g->d.path[p], 0, lay.n_params);
  }
  if (rc) {
    ctl_dipaco_close(g);
    return rc;
  }
  *out = g;
  return 0;
}

const gpt_config *ctl_dipaco_config(const ctl_dipaco *g) { return &g->d.cfg; }
int ctl_dipaco_prefix(const ctl_dipaco *g) { return g->d.r.prefix; }
gpt_model *ctl_dipaco_model(ctl_dipaco *g, int path) { return g->path[path]; }

int ctl_dipaco_route(ctl_dipaco *g, const int *tokens, int n) {
  if (n < 1) return dpc_err(DPC_EINVAL, "routing needs at least one token");
  if (n > g->d.r.prefix) n = g->d.r.prefix;
  int rc = router_features(g->base, tokens, 1, n, n, g->feat, NULL, NULL);
  return rc ? rc : router_route(&g->d.r, g->feat, NULL);
}

/* Cross-entropy of the logits row at (b, t) against `target`, in double. */
static int token_ce(gpt_model *m, int b, int t, int target, float *row, int V, double *ce) {
  int rc = gpt_logits(m, b, t, row);
  if (rc) return rc;
  double mx = row[0];
  for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
  double s = 0;
  for (int v = 0; v < V; v++) s += exp((double)row[v] - mx);
  *ce = mx + log(s) - (double)row[target];
  return 0;
}

int ctl_eval_dipaco(int argc, char **argv) {
  const char *dir = NULL, *data0 = NULL, *backend = "cpu";
  int T = 0, B = 8, W = 0, threads = 0, json = 0;
  long max_seq = 0;
  dpc_arg args[] = {{.name = "dipaco", .kind = DPC_ARG_STR, .dst = &dir, .required = 1},
                    {.name = "data", .kind = DPC_ARG_STR, .dst = &data0, .required = 1},
                    {.name = "seq-len", .kind = DPC_ARG_INT, .dst = &T, .required = 1},
                    {.name = "batch", .kind = DPC_ARG_INT, .dst = &B},
                    {.name = "reroute-every", .kind = DPC_ARG_INT, .dst = &W},
                    {.name = "sequences", .kind = DPC_ARG_LONG, .dst = &max_seq},
                    {.name = "threads", .kind = DPC_ARG_INT, .dst = &threads},
                    {.name = "backend", .kind = DPC_ARG_STR, .dst = &backend},
                    {.name = "json", .kind = DPC_ARG_FLAG, .dst = &json},
                    DPC_ARGS_END};
  const char *cmd = "eval --dipaco";
  char **pos = NULL;
  int npos = 0, status;
  if (ctl_args("eval", argc, argv, args, &pos, &npos, &status)) return status;
  dipaco_dir d;
  memset(&d, 0, sizeof d);
  dataset *ds = NULL;
  gpt_model *base = NULL, **pm = NULL;
  int *in = NULL, *tg = NULL, *route = NULL, *seg_in = NULL, *seg_path = NULL;
  float *feat = NULL, *row = NULL;
  double *sum = NULL;
  long *tok = NULL;
  char **data = calloc((size_t)npos + 1, sizeof *data);
  status = 2;
  if (!data) goto fail;
  data[0] = (char *)data0;
  for (int i = 0; i < npos; i++) data[i + 1] = pos[i];
  gpt_backend_opts bo = {.threads = threads};
  if (gpt_backend_parse(backend, &bo.kind)) {
    CTL_FAIL(cmd);
    goto done;
  }
  if (T < 1 || B < 1 || W < 0 || threads < 0 || max_seq < 0) {
    fprintf(stderr, "dipacoctl %s: --seq-len and --batch must be >= 1; --reroute-every, --sequences, --threads >= 0\n",
            cmd);
    goto done;
  }
  status = 1;
  if (dir_load(dir, &d)) goto fail;
  const int prefix = d.r.prefix, V = d.cfg.vocab_size;
  if (T > d.cfg.n_positions || prefix > T) {
    fprintf(stderr, "dipacoctl %s: need router prefix %d <= --seq-len %d <= the paths' n_positions %d\n", cmd, prefix,
            T, d.cfg.n_positions);
    status = 2;
    goto done;
  }
  if (W > 0 && (W < prefix || W >= T)) {
    fprintf(stderr, "dipacoctl %s: --reroute-every %d: must be in [prefix %d, --seq-len %d)\n", cmd, W, prefix, T);
    status = 2;
    goto done;
  }
  if (dataset_open((const char *const *)data, npos + 1, &ds) || dataset_check_vocab(ds, V) ||
      dataset_check_vocab(ds, d.base_cfg.vocab_size))
    goto fail;
  long n = dataset_num_batches(ds, 1, T);
  if (n <= 0) {
    fprintf(stderr, "dipacoctl %s: the data holds %llu tokens, less than one sequence of %d + 1\n", cmd,
            (unsigned long long)dataset_num_tokens(ds), T);
    goto done;
  }
  if (max_seq > 0 && max_seq < n) n = max_seq;
  const int nseg = W > 0 ? (T + W - 1) / W : 1;
  in = malloc((size_t)n * T * sizeof *in);
  tg = malloc((size_t)n * T * sizeof *tg);
  route = malloc((size_t)n * nseg * sizeof *route);
  seg_in = malloc((size_t)n * nseg * prefix * sizeof *seg_in);
  feat = malloc((size_t)n * nseg * d.base_cfg.n_embd * sizeof *feat);
  row = malloc((size_t)V * sizeof *row);
  sum = calloc((size_t)d.n_paths, sizeof *sum);
  tok = calloc((size_t)d.n_paths, sizeof *tok);
  pm = calloc((size_t)d.n_paths, sizeof *pm);
  seg_path = malloc((size_t)T * sizeof *seg_path);
  if (!in || !tg || !route || !seg_in || !feat || !row || !sum || !tok || !pm || !seg_path) {
    dpc_err(DPC_ENOMEM, "out of memory for %ld sequences", n);
    goto fail;
  }
  for (long i = 0; i < n; i++)
    if (dataset_batch(ds, 1, T, i, 0, 1, in + (size_t)i * T, tg + (size_t)i * T)) goto fail;
  /* Routing windows: segment 0 is the sequence's first `prefix` tokens, segment k the
   * `prefix` tokens before k·W. */
  for (long i = 0; i < n; i++)
    for (int k = 0; k < nseg; k++)
      memcpy(seg_in + ((size_t)i * nseg + k) * prefix, in + (size_t)i * T + (k ? (size_t)k * W - prefix : 0),
             (size_t)prefix * sizeof *seg_in);
  if (gpt_create(&base, &d.base_cfg, &bo, 16, prefix)) goto fail;
  static gpt_layout blay;
  if (gpt_layout_build(&d.base_cfg, &blay) || gpt_set_params(base, d.base, 0, blay.n_params) ||
      router_features(base, seg_in, (size_t)n * nseg, prefix, prefix, feat, NULL, NULL))
    goto fail;
  for (size_t s = 0; s < (size_t)n * nseg; s++) route[s] = router_route(&d.r, feat + s * d.base_cfg.n_embd, NULL);
  static gpt_layout lay;
  if (gpt_layout_build(&d.cfg, &lay)) goto fail;
  for (int p = 0; p < d.n_paths; p++)
    if (gpt_create(&pm[p], &d.cfg, &bo, B, T) || gpt_set_params(pm[p], d.path[p], 0, lay.n_params)) goto fail;
  const int tty = isatty(STDERR_FILENO) && !json;
  if (W == 0) {
    /* One path per sequence: batches of up to B sequences of one path. */
    int *bin = malloc((size_t)B * T * sizeof *bin), *btg = malloc((size_t)B * T * sizeof *btg);
    if (!bin || !btg) {
      free(bin);
      free(btg);
      dpc_err(DPC_ENOMEM, "out of memory");
      goto fail;
    }
    int rc = 0;
    for (int p = 0; p < d.n_paths && !rc; p++) {
      int nb = 0;
      for (long i = 0; i <= n && !rc; i++) {
        if (i < n && route[i] == p) {
          memcpy(bin + (size_t)nb * T, in + (size_t)i * T, (size_t)T * sizeof *bin);
          memcpy(btg + (size_t)nb * T, tg + (size_t)i * T, (size_t)T * sizeof *btg);
          nb++;
        }
        if (nb == B || (i == n && nb > 0)) {
          float loss = 0;
          rc = gpt_forward(pm[p], bin, btg, nb, T, &loss);
          sum[p] += (double)loss * nb * T;
          tok[p] += (long)nb * T;
          nb = 0;
        }
      }
      if (tty) fprintf(stderr, "\reval --dipaco: path %d/%d", p + 1, d.n_paths);
    }
    free(bin);
    free(btg);
    if (rc) goto fail;
  } else {
    /* Re-routing: each path that a segment of the sequence uses scores that segment's tokens. */
    for (long i = 0; i < n; i++) {
      for (int t = 0; t < T; t++) seg_path[t] = route[(size_t)i * nseg + t / W];
      for (int p = 0; p < d.n_paths; p++) {
        int used = 0;
        for (int k = 0; k < nseg; k++) used |= route[(size_t)i * nseg + k] == p;
        if (!used) continue;
        if (gpt_forward(pm[p], in + (size_t)i * T, NULL, 1, T, NULL)) goto fail;
        for (int t = 0; t < T; t++) {
          if (seg_path[t] != p) continue;
          double ce = 0;
          if (token_ce(pm[p], 0, t, tg[(size_t)i * T + t], row, V, &ce)) goto fail;
          sum[p] += ce;
          tok[p]++;
        }
      }
      if (tty && (i % 64 == 63 || i == n - 1)) fprintf(stderr, "\reval --dipaco: sequence %ld/%ld", i + 1, n);
    }
  }
  if (tty) fputc('\n', stderr);
  double all = 0;
  long all_tok = 0;
  for (int p = 0; p < d.n_paths; p++) {
    all += sum[p];
    all_tok += tok[p];
  }
  if (json) {
    printf("{\"loss\":%.6f,\"sequences\":%ld,\"tokens\":%ld,\"reroute_every\":%d,\"paths\":[", all / all_tok, n, all_tok,
           W);
    for (int p = 0; p < d.n_paths; p++) {
      printf("%s{\"path\":%d,\"tokens\":%ld,\"loss\":", p ? "," : "", p, tok[p]);
      if (tok[p]) printf("%.6f}", sum[p] / tok[p]);
      else printf("null}");
    }
    printf("]}\n");
  } else {
    printf("dipaco eval loss %.4f over %ld sequences (%ld tokens), %d paths", all / all_tok, n, all_tok, d.n_paths);
    if (W) printf(", re-routed every %d tokens", W);
    putchar('\n');
    for (int p = 0; p < d.n_paths; p++) {
      if (tok[p]) printf("  path %d: %ld tokens, loss %.4f\n", p, tok[p], sum[p] / tok[p]);
      else printf("  path %d: no tokens routed here\n", p);
    }
  }
  status = 0;
  goto done;
fail:
  CTL_FAIL(cmd);
  status = 1;
done:
  for (int p = 0; pm && p < d.n_paths; p++) gpt_free(pm[p]);
  free(pm);
  gpt_free(base);
  dataset_close(ds);
  dir_free(&d);
  free(in);
  free(tg);
  free(route);
  free(seg_in);
  free(seg_path);
  free(feat);
  free(row);
  free(sum);
  free(tok);
  free(data);
  free(pos);
  return status;
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
        rc = token_ce(m, b, t, tg[(size_t)(s0 + b) * T + t], row, V, &ce);
        sum += ce;
      }
      loss[s0 + b] = sum / T;
    }
    if (rc) return rc;
  }
  return 0;
}

int ctl_route_discriminative(int argc, char **argv) {
  const char *dir = NULL, *data0 = NULL, *backend = "cpu", *out = NULL;
  int T = 0, B = 8, threads = 0, iters = 300, flag = 0;
  long max_seq = 0;
  double lr = 0.05, l2 = 1e-4;
  dpc_arg args[] = {{.name = "discriminative", .kind = DPC_ARG_FLAG, .dst = &flag},
                    {.name = "dipaco", .kind = DPC_ARG_STR, .dst = &dir, .required = 1},
                    {.name = "data", .kind = DPC_ARG_STR, .dst = &data0, .required = 1},
                    {.name = "seq-len", .kind = DPC_ARG_INT, .dst = &T, .required = 1},
                    {.name = "out", .kind = DPC_ARG_STR, .dst = &out, .required = 1},
                    {.name = "batch", .kind = DPC_ARG_INT, .dst = &B},
                    {.name = "sequences", .kind = DPC_ARG_LONG, .dst = &max_seq},
                    {.name = "iters", .kind = DPC_ARG_INT, .dst = &iters},
                    {.name = "lr", .kind = DPC_ARG_DOUBLE, .dst = &lr},
                    {.name = "l2", .kind = DPC_ARG_DOUBLE, .dst = &l2},
                    {.name = "threads", .kind = DPC_ARG_INT, .dst = &threads},
                    {.name = "backend", .kind = DPC_ARG_STR, .dst = &backend},
                    DPC_ARGS_END};
  const char *cmd = "route fit --discriminative";
  char **pos = NULL;
  int npos = 0, status;
  if (ctl_args("route fit", argc, argv, args, &pos, &npos, &status)) return status;
  dipaco_dir d;
  memset(&d, 0, sizeof d);
  dataset *ds = NULL;
  gpt_model *m = NULL;
  int *in = NULL, *tg = NULL, *label = NULL, *seq = NULL;
  float *feat = NULL, *row = NULL;
  double *loss = NULL, *best = NULL;
  long *cnt = NULL;
  router nr;
  memset(&nr, 0, sizeof nr);
  char **data = calloc((size_t)npos + 1, sizeof *data);
  status = 2;
  if (!data) goto fail;
  data[0] = (char *)data0;
  for (int i = 0; i < npos; i++) data[i + 1] = pos[i];
  gpt_backend_opts bo = {.threads = threads};
  if (gpt_backend_parse(backend, &bo.kind)) {
    CTL_FAIL(cmd);
    goto done;
  }
  if (T < 1 || B < 1 || threads < 0 || max_seq < 0 || iters < 1 || !(lr > 0) || l2 < 0) {
    fprintf(stderr, "dipacoctl %s: need --seq-len, --batch, --iters >= 1, --lr > 0, --l2, --sequences, --threads >= 0\n",
            cmd);
    goto done;
  }
  status = 1;
  if (dir_load(dir, &d)) goto fail;
  const int prefix = d.r.prefix, V = d.cfg.vocab_size, C = d.base_cfg.n_embd, P = d.n_paths;
  if (P < 2 || T > d.cfg.n_positions || prefix > T) {
    fprintf(stderr, "dipacoctl %s: need 2+ paths (%d) and router prefix %d <= --seq-len %d <= n_positions %d\n", cmd, P,
            prefix, T, d.cfg.n_positions);
    status = 2;
    goto done;
  }
  if (dataset_open((const char *const *)data, npos + 1, &ds) || dataset_check_vocab(ds, V) ||
      dataset_check_vocab(ds, d.base_cfg.vocab_size))
    goto fail;
  long all = dataset_num_batches(ds, 1, T), n = all;
  if (n < P) {
    fprintf(stderr, "dipacoctl %s: %ld sequences of %d + 1 tokens, fewer than the %d paths\n", cmd, n, T, P);
    goto done;
  }
  if (max_seq > 0 && max_seq < n) n = max_seq; /* spread evenly over the data */
  in = malloc((size_t)n * T * sizeof *in);
  tg = malloc((size_t)n * T * sizeof *tg);
  seq = malloc((size_t)n * prefix * sizeof *seq);
  feat = malloc((size_t)n * C * sizeof *feat);
  row = malloc((size_t)V * sizeof *row);
  loss = malloc((size_t)n * sizeof *loss);
  best = malloc((size_t)n * sizeof *best);
  label = malloc((size_t)n * sizeof *label);
  cnt = calloc((size_t)P, sizeof *cnt);
  nr = (router){.kind = ROUTER_LINEAR, .n_paths = P, .dim = C, .prefix = prefix, .seed = d.r.seed,
                .model = d.r.model, .model_crc = d.r.model_crc,
                .c = malloc((size_t)P * C * sizeof(float)), .c2 = malloc((size_t)P * sizeof(float))};
  if (!in || !tg || !seq || !feat || !row || !loss || !best || !label || !cnt || !nr.c || !nr.c2) {
    dpc_err(DPC_ENOMEM, "out of memory for %ld sequences", n);
    goto fail;
  }
  for (long i = 0; i < n; i++) {
    long src = n == all ? i : (long)((double)i * (double)all / (double)n);
    if (dataset_batch(ds, 1, T, src, 0, 1, in + (size_t)i * T, tg + (size_t)i * T)) goto fail;
    memcpy(seq + (size_t)i * prefix, in + (size_t)i * T, (size_t)prefix * sizeof *seq);
  }
  static gpt_layout blay, lay;
  if (gpt_layout_build(&d.base_cfg, &blay) || gpt_layout_build(&d.cfg, &lay) ||
      gpt_create(&m, &d.base_cfg, &bo, 16, prefix) || gpt_set_params(m, d.base, 0, blay.n_params) ||
      router_features(m, seq, (size_t)n, prefix, prefix, feat, NULL, NULL))
    goto fail;
  gpt_free(m);
  m = NULL;
  /* The label of a sequence: the path with the lowest loss on it (ties to the lower path). */
  for (long i = 0; i < n; i++) best[i] = INFINITY;
  const int tty = isatty(STDERR_FILENO);
  for (int p = 0; p < P; p++) {
    if (gpt_create(&m, &d.cfg, &bo, B, T) || gpt_set_params(m, d.path[p], 0, lay.n_params) ||
        sequence_losses(m, B, in, tg, n, T, V, row, loss))
      goto fail;
    gpt_free(m);
    m = NULL;
    for (long i = 0; i < n; i++)
      if (loss[i] < best[i]) {
        best[i] = loss[i];
        label[i] = p;
      }
    if (tty) fprintf(stderr, "\r%s: losses under path %d/%d", cmd, p + 1, P);
  }
  if (tty) fputc('\n', stderr);
  for (long i = 0; i < n; i++) cnt[label[i]]++;
  int agree = 0;
  for (long i = 0; i < n; i++) agree += router_route(&d.r, feat + (size_t)i * C, NULL) == label[i];
  fprintf(stderr, "%s: %ld sequences; lowest-loss path:", cmd, n);
  for (int p = 0; p < P; p++) fprintf(stderr, " %d:%ld", p, cnt[p]);
  fprintf(stderr, "; the old router agrees on %.1f%%\n", 100.0 * agree / n);
  double acc = 0;
  if (router_fit_linear(feat, label, (size_t)n, C, P, iters, lr, l2, nr.c, nr.c2, &acc)) goto fail;
  fprintf(stderr, "%s: linear router (%d iterations): %.1f%% of the sequences routed to their lowest-loss path\n",
          cmd, iters, 100.0 * acc);
  char base[4096];
  snprintf(base, sizeof base, "%s/%s", out, ROUTER_BASE_DIR);
  if (router_save(out, &nr) || modeldir_save(base, &d.base_cfg, d.base)) goto fail;
  fprintf(stderr, "%s: wrote %s (linear, %d paths, prefix %d)\n", cmd, out, P, prefix);
  status = 0;
  goto done;
fail:
  CTL_FAIL(cmd);
  status = 1;
done:
  (void)flag;
  gpt_free(m);
  router_free(&nr);
  dataset_close(ds);
  dir_free(&d);
  free(in);
  free(tg);
  free(seq);
  free(feat);
  free(row);
  free(loss);
  free(best);
  free(label);
  free(cnt);
  free(data);
  free(pos);
  return status;
}
