/* route.c — dipacoctl's DiPaCo routing tools (docs/design.md §3 "DiPaCo routing"):
 *   route fit    features of every sequence under a base model, k-means or product k-means,
 *                a router directory (kernels/router.h) holding a copy of the base model;
 *                (--discriminative: route_discriminative.c);
 *   route assign every sequence to its path (or two paths with --top 2), written as llm.c
 *                shards OUT/path_<p>/train_000.bin in the original order, a manifest, and
 *                the job spec's data.paths value on stdout.
 * A sequence is tokens [i·T, (i+1)·T) of the shards read as one stream (a trailing partial
 * sequence is left out and reported). */
#include "common/dataset.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/shard.h"
#include "coordinator/ctl/ctl.h"
#include "kernels/gpt.h"
#include "kernels/kmeans.h"
#include "kernels/modeldir.h"
#include "kernels/router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROUTE_FEATURE_BATCH 16

/* The flags fit and assign share. */
typedef struct {
  const char *data0, *backend;
  int T, threads;
  char **data; /* data0 then the positionals (not owned strings) */
  int ndata;
} route_opts;

typedef struct {
  gpt_config cfg;
  float *params;
  uint32_t crc;
  int *tokens; /* n_seq × T */
  size_t n_seq;
  uint64_t n_tokens;
  float *feat; /* n_seq × C */
} route_input;

static void input_free(route_input *in) {
  free(in->params);
  free(in->tokens);
  free(in->feat);
  memset(in, 0, sizeof *in);
}

static void progress(size_t done, size_t total, void *ud) {
  if (*(int *)ud) fprintf(stderr, "\rrouting features: %zu/%zu sequences", done, total);
}

/* Load the model from model_dir, read the sequences of the shards, compute their features
 * over the first `prefix` tokens. Returns an exit status. */
static int route_read(const char *cmd, const route_opts *o, const char *model_dir, int prefix, route_input *in) {
  memset(in, 0, sizeof *in);
  if (o->T < 1 || prefix < 1 || prefix > o->T) {
    fprintf(stderr, "dipacoctl %s: need 1 <= --prefix (%d) <= --seq-len (%d)\n", cmd, prefix, o->T);
    return 2;
  }
  if (o->threads < 0) {
    fprintf(stderr, "dipacoctl %s: --threads must be >= 0\n", cmd);
    return 2;
  }
  gpt_backend_opts bo = {.threads = o->threads};
  if (gpt_backend_parse(o->backend, &bo.kind)) {
    CTL_FAIL(cmd);
    return 2;
  }
  if (modeldir_load(model_dir, &in->cfg, &in->params)) {
    CTL_FAIL(cmd);
    return 1;
  }
  if (prefix > in->cfg.n_positions) {
    fprintf(stderr, "dipacoctl %s: --prefix %d exceeds the model's n_positions %d\n", cmd, prefix, in->cfg.n_positions);
    return 2;
  }
  static gpt_layout lay;
  if (gpt_layout_build(&in->cfg, &lay)) {
    CTL_FAIL(cmd);
    return 1;
  }
  in->crc = router_model_crc(&lay, in->params);
  dataset *ds = NULL;
  if (dataset_open((const char *const *)o->data, o->ndata, &ds) || dataset_check_vocab(ds, in->cfg.vocab_size)) {
    CTL_FAIL(cmd);
    dataset_close(ds);
    return 1;
  }
  in->n_tokens = dataset_num_tokens(ds);
  in->n_seq = (size_t)(in->n_tokens / (uint64_t)o->T);
  if (in->n_seq == 0) {
    fprintf(stderr, "dipacoctl %s: the data holds %llu tokens, less than one sequence of --seq-len %d\n", cmd,
            (unsigned long long)in->n_tokens, o->T);
    dataset_close(ds);
    return 1;
  }
  in->tokens = malloc(in->n_seq * (size_t)o->T * sizeof *in->tokens);
  in->feat = malloc(in->n_seq * (size_t)in->cfg.n_embd * sizeof *in->feat);
  int rc = in->tokens && in->feat ? 0 : dpc_err(DPC_ENOMEM, "out of memory for %zu sequences", in->n_seq);
  if (!rc) rc = dataset_read(ds, 0, in->n_seq * (size_t)o->T, in->tokens);
  dataset_close(ds);
  gpt_model *m = NULL;
  if (!rc) rc = gpt_create(&m, &in->cfg, &bo, ROUTE_FEATURE_BATCH, prefix);
  if (!rc) rc = gpt_set_params(m, in->params, 0, lay.n_params);
  int tty = isatty(STDERR_FILENO);
  if (!rc) rc = router_features(m, in->tokens, in->n_seq, o->T, prefix, in->feat, progress, &tty);
  if (tty) fputc('\n', stderr);
  gpt_free(m);
  if (rc) {
    CTL_FAIL(cmd);
    return 1;
  }
  if (in->n_tokens % (uint64_t)o->T)
    fprintf(stderr, "%s: %zu sequences of %d tokens; the last %llu tokens (less than a sequence) are left out\n", cmd,
            in->n_seq, o->T, (unsigned long long)(in->n_tokens % (uint64_t)o->T));
  return 0;
}

static int collect_data(route_opts *o, char **pos, int npos) {
  if (!(o->data = calloc((size_t)npos + 1, sizeof *o->data))) return -1;
  o->data[0] = (char *)o->data0;
  for (int i = 0; i < npos; i++) o->data[i + 1] = pos[i];
  o->ndata = npos + 1;
  return 0;
}

/* "K1xK2" → k1, k2 (each >= 1). */
static int parse_grid(const char *s, int *k1, int *k2) {
  char *end = NULL;
  long a = strtol(s, &end, 10);
  if (end == s || (*end != 'x' && *end != 'X')) return -1;
  const char *t = end + 1;
  long b = strtol(t, &end, 10);
  if (end == t || *end || a < 1 || b < 1 || a > 256 || b > 256) return -1;
  *k1 = (int)a;
  *k2 = (int)b;
  return 0;
}

static void print_counts(const char *cmd, const int *assign, size_t n, int paths) {
  long *cnt = calloc((size_t)paths, sizeof *cnt);
  if (!cnt) return;
  for (size_t i = 0; i < n; i++) cnt[assign[i]]++;
  fprintf(stderr, "%s: sequences per path:", cmd);
  for (int p = 0; p < paths; p++) fprintf(stderr, " %d:%ld", p, cnt[p]);
  fputc('\n', stderr);
  /* k-means never leaves a cluster empty; a product grid can leave a cell (a path) empty. */
  for (int p = 0; p < paths; p++)
    if (cnt[p] == 0)
      fprintf(stderr, "%s: warning: no sequence of this data falls in path %d (an empty grid cell); a job needs data "
              "for every path: route assign --top 2 gives it its runner-up sequences, or choose another grid\n", cmd,
              p);
  free(cnt);
}

static int route_fit(int argc, char **argv) {
  route_opts o = {.backend = "cpu"};
  const char *model_dir = NULL, *grid = NULL, *out = NULL;
  int K = 0, prefix = ROUTER_DEFAULT_PREFIX, max_iters = 0;
  long seed = 1;
  dpc_arg args[] = {{.name = "model", .kind = DPC_ARG_STR, .dst = &model_dir, .required = 1},
                    {.name = "data", .kind = DPC_ARG_STR, .dst = &o.data0, .required = 1},
                    {.name = "seq-len", .kind = DPC_ARG_INT, .dst = &o.T, .required = 1},
                    {.name = "k", .kind = DPC_ARG_INT, .dst = &K},
                    {.name = "grid", .kind = DPC_ARG_STR, .dst = &grid},
                    {.name = "prefix", .kind = DPC_ARG_INT, .dst = &prefix},
                    {.name = "seed", .kind = DPC_ARG_LONG, .dst = &seed},
                    {.name = "max-iters", .kind = DPC_ARG_INT, .dst = &max_iters},
                    {.name = "out", .kind = DPC_ARG_STR, .dst = &out, .required = 1},
                    {.name = "threads", .kind = DPC_ARG_INT, .dst = &o.threads},
                    {.name = "backend", .kind = DPC_ARG_STR, .dst = &o.backend},
                    DPC_ARGS_END};
  char **pos = NULL;
  int npos = 0, status;
  const char *cmd = "route fit";
  if (ctl_args(cmd, argc, argv, args, &pos, &npos, &status)) return status;
  route_input in;
  memset(&in, 0, sizeof in);
  router r;
  memset(&r, 0, sizeof r);
  int *assign = NULL;
  status = 2;
  int k1 = 0, k2 = 0;
  if ((K > 0) == (grid != NULL)) {
    fprintf(stderr, "dipacoctl %s: give exactly one of --k K and --grid K1xK2\n", cmd);
    goto done;
  }
  if (grid && parse_grid(grid, &k1, &k2)) {
    fprintf(stderr, "dipacoctl %s: --grid '%s': expected K1xK2 with each in [1, 256], e.g. 2x2\n", cmd, grid);
    goto done;
  }
  if (K < 0 || seed < 0 || max_iters < 0) {
    fprintf(stderr, "dipacoctl %s: --k, --seed and --max-iters must be >= 0\n", cmd);
    goto done;
  }
  if (collect_data(&o, pos, npos)) {
    status = 1;
    goto done;
  }
  if ((status = route_read(cmd, &o, model_dir, prefix, &in))) goto done;
  status = 1;
  const int C = in.cfg.n_embd;
  r = (router){.kind = grid ? ROUTER_PRODUCT : ROUTER_KMEANS, .k = K, .k1 = k1, .k2 = k2,
               .n_paths = grid ? k1 * k2 : K, .dim = C, .prefix = prefix, .seed = (uint64_t)seed,
               .model = in.cfg, .model_crc = in.crc};
  if (grid && C < 2) {
    fprintf(stderr, "dipacoctl %s: --grid needs a feature of at least 2 dimensions (n_embd is %d)\n", cmd, C);
    goto done;
  }
  int kmax = grid ? (k1 > k2 ? k1 : k2) : K;
  if ((size_t)kmax > in.n_seq) {
    fprintf(stderr, "dipacoctl %s: %d clusters but the data holds only %zu sequences of %d tokens; give more data, "
            "a shorter --seq-len or a smaller K\n", cmd, kmax, in.n_seq, o.T);
    status = 2;
    goto done;
  }
  r.c = malloc((size_t)(grid ? k1 : K) * (grid ? C / 2 : C) * sizeof *r.c);
  if (grid) r.c2 = malloc((size_t)k2 * (C - C / 2) * sizeof *r.c2);
  assign = malloc(in.n_seq * sizeof *assign);
  if (!r.c || (grid && !r.c2) || !assign) {
    fprintf(stderr, "dipacoctl %s: out of memory\n", cmd);
    goto done;
  }
  kmeans_result res[2];
  memset(res, 0, sizeof res);
  int rc = grid ? kmeans_product_fit(in.feat, in.n_seq, C, k1, k2, (uint64_t)seed, max_iters, r.c, r.c2, assign, &res[0],
                                     &res[1])
                : kmeans_fit(in.feat, in.n_seq, C, K, (uint64_t)seed, max_iters, r.c, assign, &res[0]);
  if (rc) {
    CTL_FAIL(cmd);
    goto done;
  }
  for (int h = 0; h < (grid ? 2 : 1); h++) {
    const char *what = grid ? (h ? "second half" : "first half") : "k-means";
    if (res[h].reseeds)
      fprintf(stderr, "%s: %s: re-seeded %d empty cluster%s with the farthest sequence\n", cmd, what, res[h].reseeds,
              res[h].reseeds == 1 ? "" : "s");
    fprintf(stderr, "%s: %s: %d Lloyd iteration%s, %s, inertia %.6g\n", cmd, what, res[h].iters,
            res[h].iters == 1 ? "" : "s", res[h].converged ? "converged" : "stopped at the cap", res[h].inertia);
  }
  print_counts(cmd, assign, in.n_seq, r.n_paths);
  char base[4096];
  snprintf(base, sizeof base, "%s/%s", out, ROUTER_BASE_DIR);
  if (router_save(out, &r) || modeldir_save(base, &in.cfg, in.params)) {
    CTL_FAIL(cmd);
    goto done;
  }
  fprintf(stderr, "%s: wrote %s (%s, %d paths, %zu sequences, prefix %d)\n", cmd, out,
          grid ? "product k-means" : "k-means", r.n_paths, in.n_seq, prefix);
  status = 0;
done:
  free(assign);
  router_free(&r);
  input_free(&in);
  free(o.data);
  free(pos);
  return status;
}

/* Write path p's sequences (assign == p or, with top 2, second == p) as OUT/path_<p>/train_000.bin. */
static int write_path(const char *out, int p, const route_input *in, int T, const int *assign, const int *second,
                      long *count) {
  char dir[4096], file[4200];
  snprintf(dir, sizeof dir, "%s/path_%d", out, p);
  snprintf(file, sizeof file, "%s/train_000.bin", dir);
  long c = 0;
  for (size_t i = 0; i < in->n_seq; i++) c += assign[i] == p || (second && second[i] == p);
  *count = c;
  if ((uint64_t)c * (uint64_t)T > SHARD_MAX_TOKENS) return dpc_err(DPC_ERANGE, "path %d: more tokens than one shard holds", p);
  int rc = dpc_mkdir_p(dir);
  if (rc) return rc;
  unlink(file);
  if (c == 0) return 0;
  int *tok = malloc((size_t)c * T * sizeof *tok);
  if (!tok) return dpc_err(DPC_ENOMEM, "out of memory writing path %d", p);
  size_t w = 0;
  for (size_t i = 0; i < in->n_seq; i++)
    if (assign[i] == p || (second && second[i] == p))
      for (int t = 0; t < T; t++) tok[w++] = in->tokens[i * (size_t)T + t];
  /* 16-bit tokens whenever the model's vocabulary fits, as the input shards had. */
  rc = shard_write_ids(file, tok, w, in->cfg.vocab_size);
  free(tok);
  return rc;
}

static int route_assign(int argc, char **argv) {
  route_opts o = {.backend = "cpu"};
  const char *router_dir = NULL, *model_dir = NULL, *out = NULL;
  int top = 1;
  dpc_arg args[] = {{.name = "router", .kind = DPC_ARG_STR, .dst = &router_dir, .required = 1},
                    {.name = "data", .kind = DPC_ARG_STR, .dst = &o.data0, .required = 1},
                    {.name = "seq-len", .kind = DPC_ARG_INT, .dst = &o.T, .required = 1},
                    {.name = "top", .kind = DPC_ARG_INT, .dst = &top},
                    {.name = "model", .kind = DPC_ARG_STR, .dst = &model_dir},
                    {.name = "out", .kind = DPC_ARG_STR, .dst = &out, .required = 1},
                    {.name = "threads", .kind = DPC_ARG_INT, .dst = &o.threads},
                    {.name = "backend", .kind = DPC_ARG_STR, .dst = &o.backend},
                    DPC_ARGS_END};
  char **pos = NULL;
  int npos = 0, status;
  const char *cmd = "route assign";
  if (ctl_args(cmd, argc, argv, args, &pos, &npos, &status)) return status;
  route_input in;
  memset(&in, 0, sizeof in);
  router r;
  memset(&r, 0, sizeof r);
  int *assign = NULL, *second = NULL;
  long *counts = NULL;
  char base[4096];
  status = 2;
  if (top != 1 && top != 2) {
    fprintf(stderr, "dipacoctl %s: --top must be 1 or 2\n", cmd);
    goto done;
  }
  if (collect_data(&o, pos, npos)) {
    status = 1;
    goto done;
  }
  status = 1;
  if (router_load(router_dir, &r)) {
    CTL_FAIL(cmd);
    goto done;
  }
  if (top == 2 && r.n_paths < 2) {
    fprintf(stderr, "dipacoctl %s: --top 2 needs a router with at least 2 paths (%s has %d)\n", cmd, router_dir, r.n_paths);
    status = 2;
    goto done;
  }
  if (!model_dir) {
    snprintf(base, sizeof base, "%s/%s", router_dir, ROUTER_BASE_DIR);
    model_dir = base;
  }
  if ((status = route_read(cmd, &o, model_dir, r.prefix, &in))) goto done;
  status = 1;
  if (router_check_model(&r, &in.cfg, in.crc)) {
    fprintf(stderr, "dipacoctl %s: %s (router %s, model %s)\n", cmd, dpc_errmsg(), router_dir, model_dir);
    goto done;
  }
  assign = malloc(in.n_seq * sizeof *assign);
  second = top == 2 ? malloc(in.n_seq * sizeof *second) : NULL;
  counts = calloc((size_t)r.n_paths, sizeof *counts);
  if (!assign || (top == 2 && !second) || !counts) {
    fprintf(stderr, "dipacoctl %s: out of memory\n", cmd);
    goto done;
  }
  for (size_t i = 0; i < in.n_seq; i++)
    assign[i] = router_route(&r, in.feat + i * (size_t)in.cfg.n_embd, second ? &second[i] : NULL);
  int empty = 0;
  for (int p = 0; p < r.n_paths; p++) {
    if (write_path(out, p, &in, o.T, assign, second, &counts[p])) {
      CTL_FAIL(cmd);
      goto done;
    }
    if (counts[p] == 0) {
      fprintf(stderr, "dipacoctl %s: warning: no sequence routes to path %d (it gets no shard; a job needs data for "
              "every path)\n", cmd, p);
      empty++;
    }
  }
  /* The manifest: counts per path, for people and scripts. */
  char mpath[4200];
  snprintf(mpath, sizeof mpath, "%s/manifest.json", out);
  size_t cap = 512 + (size_t)r.n_paths * 128, len = 0;
  char *m = malloc(cap);
  if (!m) goto done;
  len += (size_t)snprintf(m + len, cap - len, "{\"format\":\"dipaco-routed-data\",\"router\":\"%s\",\"seq_len\":%d,"
                          "\"prefix\":%d,\"top\":%d,\"sequences\":%zu,\"tokens_left_out\":%llu,\"paths\":[", router_dir,
                          o.T, r.prefix, top, in.n_seq, (unsigned long long)(in.n_tokens % (uint64_t)o.T));
  for (int p = 0; p < r.n_paths; p++) {
    len += (size_t)snprintf(m + len, cap - len, "%s{\"path\":%d,\"sequences\":%ld,\"tokens\":%lld,\"shard\":",
                            p ? "," : "", p, counts[p], (long long)counts[p] * o.T);
    if (counts[p]) len += (size_t)snprintf(m + len, cap - len, "\"path_%d/train_000.bin\"}", p);
    else len += (size_t)snprintf(m + len, cap - len, "null}");
  }
  len += (size_t)snprintf(m + len, cap - len, "]}\n");
  int rc = dpc_write_file_atomic(mpath, m, len);
  free(m);
  if (rc) {
    CTL_FAIL(cmd);
    goto done;
  }
  fprintf(stderr, "%s: %zu sequences to %d paths (top %d):", cmd, in.n_seq, r.n_paths, top);
  for (int p = 0; p < r.n_paths; p++) fprintf(stderr, " %d:%ld", p, counts[p]);
  fputc('\n', stderr);
  /* The job spec's data.paths value (paths relative to the workers' --data-dir). */
  fputc('[', stdout);
  for (int p = 0; p < r.n_paths; p++) printf("%s[\"%s/path_%d/train_*.bin\"]", p ? ", " : "", out, p);
  fputs("]\n", stdout);
  status = empty ? 1 : 0;
done:
  free(assign);
  free(second);
  free(counts);
  router_free(&r);
  input_free(&in);
  free(o.data);
  free(pos);
  return status;
}

int ctl_route(int argc, char **argv) {
  if (argc >= 1 && strcmp(argv[0], "fit") == 0) {
    for (int k = 1; k < argc; k++)
      if (strcmp(argv[k], "--discriminative") == 0) return ctl_route_discriminative(argc - 1, argv + 1);
    return route_fit(argc - 1, argv + 1);
  }
  if (argc >= 1 && strcmp(argv[0], "assign") == 0) return route_assign(argc - 1, argv + 1);
  fprintf(stderr, "dipacoctl route: unknown subcommand (use 'route fit' or 'route assign')\n");
  return 2;
}
