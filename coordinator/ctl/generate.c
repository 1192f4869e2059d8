/* generate.c — `dipacoctl generate`: sample text from a model directory, greedy at
 * temperature 0, else from the softmax restricted to the top-k logits; the prompt is echoed
 * and each token is printed as it is produced. With --dipaco DIR (a DiPaCo model directory)
 * the path is chosen by routing the first `prefix` tokens of the prompt, and with
 * --reroute-every W again from the last `prefix` tokens after every W generated tokens; the
 * choices are reported on stderr. */
#include "common/errors.h"
#include "common/tokenizer.h"
#include "coordinator/ctl/ctl.h"
#include "coordinator/ctl/dipaco_dir.h"
#include "kernels/gpt.h"
#include "kernels/modeldir.h"
#include "kernels/router.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

typedef struct {
  float logit;
  int id;
} cand;

static int cmp_cand_desc(const void *a, const void *b) {
  float x = ((const cand *)a)->logit, y = ((const cand *)b)->logit;
  if (x != y) return x < y ? 1 : -1;
  return ((const cand *)a)->id - ((const cand *)b)->id;
}

/* Samples the next token from logits[V]: greedy at temperature 0, else softmax(logits/temp)
 * restricted to the top_k largest (top_k 0 = all). */
static int sample(const float *logits, int V, float temp, int top_k, uint64_t *rng, cand *c) {
  for (int i = 0; i < V; i++) c[i] = (cand){logits[i], i};
  qsort(c, (size_t)V, sizeof *c, cmp_cand_desc);
  if (temp <= 0) return c[0].id;
  int k = top_k > 0 && top_k < V ? top_k : V;
  double z = 0;
  for (int i = 0; i < k; i++) z += exp((c[i].logit - c[0].logit) / temp);
  double u = (double)(rng_next(rng) >> 11) / 9007199254740992.0 * z, acc = 0;
  for (int i = 0; i < k; i++) {
    acc += exp((c[i].logit - c[0].logit) / temp);
    if (u < acc) return c[i].id;
  }
  return c[k - 1].id;
}

/* A DiPaCo model directory loaded for generation: every path's model (batch 1, n_positions)
 * and the router with its feature model. */
typedef struct {
  dipaco_dir d;
  gpt_model *base;  /* feature model, B = 1, T = prefix */
  gpt_model **path; /* path models, B = 1, T = n_positions */
  float *feat;
} gen_dipaco;

static void gen_dipaco_close(gen_dipaco *g) {
  if (!g) return;
  for (int p = 0; g->path && p < g->d.n_paths; p++) gpt_free(g->path[p]);
  free(g->path);
  gpt_free(g->base);
  free(g->feat);
  dipaco_dir_free(&g->d);
  free(g);
}

static int gen_dipaco_open(const char *dir, const gpt_backend_opts *bo, gen_dipaco **out) {
  *out = NULL;
  gen_dipaco *g = calloc(1, sizeof *g);
  if (!g) return dpc_err(DPC_ENOMEM, "out of memory");
  int rc = dipaco_dir_load(dir, &g->d);
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
    gen_dipaco_close(g);
    return rc;
  }
  *out = g;
  return 0;
}

/* The path of a context from its first min(n, prefix) tokens, or a negative DPC_E* code. */
static int gen_dipaco_route(gen_dipaco *g, const int *tokens, int n) {
  if (n < 1) return dpc_err(DPC_EINVAL, "routing needs at least one token");
  if (n > g->d.r.prefix) n = g->d.r.prefix;
  int rc = router_features(g->base, tokens, 1, n, n, g->feat, NULL, NULL);
  return rc ? rc : router_route(&g->d.r, g->feat, NULL);
}

/* The flags of `generate`. */
typedef struct {
  const char *model_dir, *dipaco_dir, *tokname, *vocab_dir, *prompt, *backend, *precision;
  int ntok, top_k, threads, device, reroute;
  float temp;
  long seed;
} gen_opts;

/* Extends ctx[0..n) by o->ntok sampled tokens (ctx holds n + ntok), printing each one; the
 * model sees at most its last n_positions tokens. Returns 0 or a DPC_E* code. */
static int sample_tokens(const gen_opts *o, gpt_model *model, gen_dipaco *dp, const gpt_config *cfg,
                         dpc_tokenizer *tok, int *ctx, size_t n, float *logits, cand *cands) {
  const int maxT = cfg->n_positions, V = cfg->vocab_size;
  uint64_t rng = (uint64_t)o->seed;
  int path = -1;
  for (int k = 0; k < o->ntok; k++) {
    if (dp && (k == 0 || (o->reroute > 0 && k % o->reroute == 0))) {
      /* The prompt's first prefix tokens, then the last prefix tokens of the context. */
      int m = dp->d.r.prefix;
      size_t from = k == 0 ? 0 : (n > (size_t)m ? n - (size_t)m : 0);
      int p = gen_dipaco_route(dp, ctx + from, (int)(n - from < (size_t)m ? n - from : (size_t)m));
      if (p < 0) return p;
      if (p != path) fprintf(stderr, "%sgenerate --dipaco: %s path %d\n", k ? "\n" : "", k ? "re-routed to" : "routed to", p);
      path = p;
      model = dp->path[path];
    }
    size_t start = n > (size_t)maxT ? n - (size_t)maxT : 0;
    int t = (int)(n - start);
    int rc = gpt_forward(model, ctx + start, NULL, 1, t, NULL);
    if (rc || (rc = gpt_logits(model, 0, t - 1, logits))) return rc;
    int next = sample(logits, V, o->temp, o->top_k, &rng, cands);
    ctx[n++] = next;
    char *text = NULL;
    size_t tlen = 0;
    if (next < tok_vocab_size(tok) && tok_decode(tok, &next, 1, &text, &tlen) == 0) fwrite(text, 1, tlen, stdout);
    free(text);
    fflush(stdout);
  }
  return 0;
}

static int generate(const gen_opts *o) {
  int status = 1, rc;
  dpc_tokenizer *tok = NULL;
  gpt_model *model = NULL;
  gen_dipaco *dp = NULL;
  float *params = NULL, *logits = NULL;
  int *ids = NULL, *ctx = NULL;
  cand *cands = NULL;
  size_t nids = 0;
  gpt_config cfg;
  gpt_backend_opts bo = {.threads = o->threads, .device = o->device};
  rc = tok_open_spec(o->tokname, o->vocab_dir, &tok);
  if (rc == DPC_EINVAL || (rc == DPC_ENOENT && strcmp(o->tokname, "gpt2") != 0)) {
    fprintf(stderr, "dipacoctl generate: --tokenizer: %s\n", dpc_errmsg());
    return 2;
  }
  if (rc || gpt_backend_parse(o->backend, &bo.kind) || gpt_precision_parse(o->precision, &bo.precision) ||
      (o->model_dir && modeldir_load(o->model_dir, &cfg, &params)) ||
      (o->dipaco_dir && gen_dipaco_open(o->dipaco_dir, &bo, &dp))) {
    CTL_FAIL("generate");
    goto done;
  }
  if (dp) cfg = dp->d.cfg;
  if (tok_vocab_size(tok) > cfg.vocab_size) {
    fprintf(stderr, "dipacoctl generate: tokenizer vocab %d exceeds the model's vocab_size %d\n", tok_vocab_size(tok),
            cfg.vocab_size);
    goto done;
  }
  if (tok_encode(tok, o->prompt, strlen(o->prompt), &ids, &nids)) {
    CTL_FAIL("generate");
    goto done;
  }
  size_t cap = nids + (size_t)o->ntok + 1;
  ctx = malloc(cap * sizeof *ctx);
  logits = malloc((size_t)cfg.vocab_size * sizeof *logits);
  cands = malloc((size_t)cfg.vocab_size * sizeof *cands);
  if (!ctx || !logits || !cands) goto done;
  size_t n = 0;
  if (nids == 0 && tok_eot(tok) >= 0) ctx[n++] = tok_eot(tok);
  for (size_t i = 0; i < nids; i++) ctx[n++] = ids[i];
  if (n == 0) {
    fprintf(stderr, "dipacoctl generate: empty prompt and the tokenizer has no end-of-text token to start from\n");
    goto done;
  }
  if (!dp && (gpt_create(&model, &cfg, &bo, 1, cfg.n_positions) ||
              gpt_set_params(model, params, 0, model->lay.n_params))) {
    CTL_FAIL("generate");
    goto done;
  }
  fwrite(o->prompt, 1, strlen(o->prompt), stdout);
  fflush(stdout);
  if (sample_tokens(o, model, dp, &cfg, tok, ctx, n, logits, cands)) {
    CTL_FAIL("generate");
    goto done;
  }
  fputc('\n', stdout);
  status = 0;
done:
  gpt_free(model);
  gen_dipaco_close(dp);
  tok_free(tok);
  free(params);
  free(ids);
  free(ctx);
  free(logits);
  free(cands);
  return status;
}

int ctl_generate(int argc, char **argv) {
  gen_opts o = {.backend = "cpu", .precision = "fp32", .top_k = 40, .temp = 0.8f, .seed = 1337};
  dpc_arg args[] = {{.name = "model", .kind = DPC_ARG_STR, .dst = &o.model_dir},
                    {.name = "dipaco", .kind = DPC_ARG_STR, .dst = &o.dipaco_dir},
                    {.name = "reroute-every", .kind = DPC_ARG_INT, .dst = &o.reroute},
                    {.name = "tokenizer", .kind = DPC_ARG_STR, .dst = &o.tokname, .required = 1},
                    {.name = "vocab-dir", .kind = DPC_ARG_STR, .dst = &o.vocab_dir},
                    {.name = "prompt", .kind = DPC_ARG_STR, .dst = &o.prompt, .required = 1},
                    {.name = "tokens", .kind = DPC_ARG_INT, .dst = &o.ntok, .required = 1},
                    {.name = "temperature", .kind = DPC_ARG_FLOAT, .dst = &o.temp},
                    {.name = "top-k", .kind = DPC_ARG_INT, .dst = &o.top_k},
                    {.name = "seed", .kind = DPC_ARG_LONG, .dst = &o.seed},
                    {.name = "threads", .kind = DPC_ARG_INT, .dst = &o.threads},
                    {.name = "backend", .kind = DPC_ARG_STR, .dst = &o.backend},
                    {.name = "precision", .kind = DPC_ARG_STR, .dst = &o.precision},
                    {.name = "device", .kind = DPC_ARG_INT, .dst = &o.device},
                    DPC_ARGS_END};
  char **pos = NULL;
  int npos = 0, status;
  if (ctl_args("generate", argc, argv, args, &pos, &npos, &status)) return status;
  free(pos);
  if (npos) {
    fprintf(stderr, "dipacoctl generate: unexpected argument (quote the --prompt text)\n");
    return 2;
  }
  if (!o.model_dir == !o.dipaco_dir) {
    fprintf(stderr, "dipacoctl generate: give one of --model DIR and --dipaco DIR\n");
    return 2;
  }
  if (o.reroute < 0 || (o.reroute && !o.dipaco_dir)) {
    fprintf(stderr, "dipacoctl generate: --reroute-every W (>= 0) goes with --dipaco\n");
    return 2;
  }
  if (o.ntok < 0 || o.top_k < 0 || o.temp < 0 || o.threads < 0 || o.device < 0) {
    fprintf(stderr, "dipacoctl generate: --tokens, --top-k, --temperature, --threads and --device must be >= 0\n");
    return 2;
  }
  return generate(&o);
}
