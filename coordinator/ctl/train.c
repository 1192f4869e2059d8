/* ctl_offline.c — dipacoctl's single-process tools: data prepare, init, train, eval, generate.
 * They use the same kernels, formats and data order as the daemons, so a model trained here
 * and one trained by a one-worker job with the same spec see the same batches. */
#include "common/dataset.h"
#include "common/errors.h"
#include "kernels/modeldir.h"
#include "common/shard.h"
#include "common/tokenizer.h"
#include "coordinator/ctl/ctl.h"
#include "kernels/gpt.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DPC_FAIL(cmd) fprintf(stderr, "dipacoctl %s: %s\n", cmd, dpc_errmsg())

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------- data prepare ---------- */

typedef struct {
  char **v;
  int n, cap;
} strlist;

static int strlist_push(strlist *l, const char *s) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    char **v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v) return DPC_ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  if (!(l->v[l->n] = strdup(s))) return DPC_ENOMEM;
  l->n++;
  return 0;
}

static void strlist_free(strlist *l) {
  for (int i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Expand an input argument: a regular file, or a directory whose regular files (recursively,
 * hidden ones skipped) are taken in name order, so the result does not depend on readdir. */
static int collect_inputs(const char *path, strlist *out) {
  struct stat st;
  if (stat(path, &st) != 0) return dpc_err(DPC_ENOENT, "%s: %s", path, strerror(errno));
  if (S_ISREG(st.st_mode)) return strlist_push(out, path);
  if (!S_ISDIR(st.st_mode)) return dpc_err(DPC_EINVAL, "%s: not a regular file or directory", path);
  DIR *d = opendir(path);
  if (!d) return dpc_err(DPC_EIO, "%s: %s", path, strerror(errno));
  strlist names = {0};
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char *full = NULL;
    if (asprintf(&full, "%s/%s", path, e->d_name) < 0) rc = DPC_ENOMEM;
    else rc = strlist_push(&names, full);
    free(full);
  }
  closedir(d);
  if (!rc) qsort(names.v, (size_t)names.n, sizeof *names.v, cmp_str);
  for (int i = 0; !rc && i < names.n; i++) rc = collect_inputs(names.v[i], out);
  strlist_free(&names);
  return rc;
}

static int read_whole(const char *path, char **buf, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return dpc_err(DPC_ENOENT, "%s: %s", path, strerror(errno));
  size_t cap = 1 << 16, len = 0;
  char *b = malloc(cap);
  while (b) {
    size_t r = fread(b + len, 1, cap - len, f);
    len += r;
    if (len < cap) break;
    char *nb = realloc(b, cap * 2);
    if (!nb) {
      free(b);
      b = NULL;
      break;
    }
    b = nb;
    cap *= 2;
  }
  int err = ferror(f);
  fclose(f);
  if (!b) return dpc_err(DPC_ENOMEM, "%s: out of memory reading the file", path);
  if (err) {
    free(b);
    return dpc_err(DPC_EIO, "%s: read error", path);
  }
  *buf = b;
  *n = len;
  return 0;
}

typedef struct {
  uint16_t *v;
  size_t n, cap;
} tokbuf;

static int tokbuf_append(tokbuf *t, const int *ids, size_t n) {
  if (t->n + n > t->cap) {
    size_t cap = t->cap ? t->cap : 1 << 20;
    while (cap < t->n + n) cap *= 2;
    uint16_t *v = realloc(t->v, cap * sizeof *v);
    if (!v) return dpc_err(DPC_ENOMEM, "out of memory holding %zu tokens", t->n + n);
    t->v = v;
    t->cap = cap;
  }
  for (size_t i = 0; i < n; i++) t->v[t->n + i] = (uint16_t)ids[i];
  t->n += n;
  return 0;
}

/* Writes tokens as consecutive shards PREFIX_000.bin, PREFIX_001.bin, ... of at most
 * `per_shard` tokens each. */
static int write_shards(const char *out, const char *prefix, const uint16_t *tok, size_t n, size_t per_shard) {
  int idx = 0;
  for (size_t off = 0; off < n || (n == 0 && idx == 0); off += per_shard, idx++) {
    size_t len = n - off < per_shard ? n - off : per_shard;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%03d.bin", out, prefix, idx);
    int rc = shard_write(path, tok + off, len);
    if (rc) return rc;
    fprintf(stderr, "wrote %s (%zu tokens)\n", path, len);
    if (n == 0) break;
  }
  return 0;
}

int ctl_data_prepare(int argc, char **argv) {
  const char *tokname = NULL, *vocab_dir = NULL, *out = NULL;
  float val_frac = 0.1f;
  long shard_tokens = 100000000;
  ctl_opt opts[] = {{"tokenizer", CTL_STR, &tokname, 1, 0},      {"vocab-dir", CTL_STR, &vocab_dir, 0, 0},
                    {"out", CTL_STR, &out, 1, 0},                {"val-fraction", CTL_FLOAT, &val_frac, 0, 0},
                    {"shard-tokens", CTL_LONG, &shard_tokens, 0, 0}, {NULL, 0, NULL, 0, 0}};
  char **pos = NULL;
  int npos = 0, rc = ctl_parse("data prepare", argc, argv, opts, &pos, &npos);
  if (rc) return rc < 0 ? 0 : rc;
  int status = 1;
  strlist files = {0};
  tokbuf toks = {0};
  dpc_tokenizer *tok = NULL;
  if (npos == 0) {
    fprintf(stderr, "dipacoctl data prepare: no input files given\n");
    status = 2;
    goto done;
  }
  if (!(val_frac >= 0.0f && val_frac < 1.0f)) {
    fprintf(stderr, "dipacoctl data prepare: --val-fraction %g must be in [0, 1)\n", val_frac);
    status = 2;
    goto done;
  }
  if (shard_tokens < 1 || shard_tokens > INT32_MAX) {
    fprintf(stderr, "dipacoctl data prepare: --shard-tokens %ld must be in [1, %d]\n", shard_tokens, INT32_MAX);
    status = 2;
    goto done;
  }
  if (strcmp(tokname, "byte") == 0) {
    rc = tok_open_byte(&tok);
  } else if (strcmp(tokname, "gpt2") == 0) {
    if (!vocab_dir) {
      fprintf(stderr, "dipacoctl data prepare: --tokenizer gpt2 needs --vocab-dir DIR (encoder.json, vocab.bpe)\n");
      status = 2;
      goto done;
    }
    rc = tok_open_gpt2(vocab_dir, &tok);
  } else {
    fprintf(stderr, "dipacoctl data prepare: unknown tokenizer '%s' (use byte or gpt2)\n", tokname);
    status = 2;
    goto done;
  }
  if (rc) {
    DPC_FAIL("data prepare");
    goto done;
  }
  for (int i = 0; i < npos; i++) {
    if ((rc = collect_inputs(pos[i], &files))) {
      DPC_FAIL("data prepare");
      goto done;
    }
  }
  if (files.n == 0) {
    fprintf(stderr, "dipacoctl data prepare: the inputs hold no files\n");
    goto done;
  }
  size_t total_bytes = 0;
  for (int i = 0; i < files.n; i++) {
    struct stat st;
    if (stat(files.v[i], &st) == 0) total_bytes += (size_t)st.st_size;
  }
  const int eot = tok_eot(tok);
  const int progress = isatty(STDERR_FILENO);
  double t0 = now_s(), last = 0;
  size_t done_bytes = 0;
  for (int i = 0; i < files.n; i++) {
    char *text = NULL;
    size_t len = 0;
    int *ids = NULL;
    size_t nids = 0;
    if ((rc = read_whole(files.v[i], &text, &len)) || (rc = tok_encode(tok, text, len, &ids, &nids))) {
      free(text);
      DPC_FAIL("data prepare");
      goto done;
    }
    free(text);
    /* Documents are separated by the end-of-text token where the tokenizer has one (GPT-2). */
    if (eot >= 0) rc = tokbuf_append(&toks, &eot, 1);
    if (!rc) rc = tokbuf_append(&toks, ids, nids);
    free(ids);
    if (rc) {
      DPC_FAIL("data prepare");
      goto done;
    }
    done_bytes += len;
    double t = now_s();
    if (t - last > 0.5 || i + 1 == files.n) {
      last = t;
      fprintf(stderr, "%stokenized %d/%d files, %.1f/%.1f MB, %zu tokens, %.1f MB/s%s",
              progress ? "\r" : "", i + 1, files.n, done_bytes / 1e6, total_bytes / 1e6, toks.n,
              done_bytes / 1e6 / (t - t0 + 1e-9), progress ? "" : "\n");
    }
  }
  if (progress) fputc('\n', stderr);
  size_t nval = (size_t)((double)toks.n * val_frac);
  size_t ntrain = toks.n - nval;
  if ((rc = mkdir(out, 0755)) && errno != EEXIST) {
    fprintf(stderr, "dipacoctl data prepare: %s: %s\n", out, strerror(errno));
    goto done;
  }
  if ((rc = write_shards(out, "train", toks.v, ntrain, (size_t)shard_tokens)) ||
      (nval > 0 && (rc = write_shards(out, "val", toks.v + ntrain, nval, (size_t)shard_tokens)))) {
    DPC_FAIL("data prepare");
    goto done;
  }
  fprintf(stderr, "data prepare: %zu train + %zu val tokens (vocab %d) in %s\n", ntrain, nval, tok_vocab_size(tok), out);
  status = 0;
done:
  tok_free(tok);
  free(toks.v);
  strlist_free(&files);
  free(pos);
  return status;
}

/* ---------- init ---------- */

int ctl_init(int argc, char **argv) {
  gpt_config cfg = {0};
  long seed = 1337;
  const char *out = NULL;
  ctl_opt opts[] = {{"n-layer", CTL_INT, &cfg.n_layer, 1, 0},         {"n-head", CTL_INT, &cfg.n_head, 1, 0},
                    {"n-embd", CTL_INT, &cfg.n_embd, 1, 0},           {"n-positions", CTL_INT, &cfg.n_positions, 1, 0},
                    {"vocab-size", CTL_INT, &cfg.vocab_size, 1, 0},   {"seed", CTL_LONG, &seed, 0, 0},
                    {"out", CTL_STR, &out, 1, 0},                     {NULL, 0, NULL, 0, 0}};
  char **pos = NULL;
  int npos = 0, rc = ctl_parse("init", argc, argv, opts, &pos, &npos);
  if (rc) return rc < 0 ? 0 : rc;
  free(pos);
  if (npos) {
    fprintf(stderr, "dipacoctl init: unexpected argument '%s'\n", argv[0]);
    return 2;
  }
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
    DPC_FAIL("init");
    return 1;
  }
  fprintf(stderr, "init: wrote %s (%zu parameters)\n", out, lay.n_params);
  return 0;
}

/* ---------- shared by train and eval ---------- */

typedef struct {
  gpt_config cfg;
  float *params;
  gpt_model *model;
  dataset *ds;
  int *inputs, *targets;
} session;

static void session_close(session *s) {
  gpt_free(s->model);
  dataset_close(s->ds);
  free(s->params);
  free(s->inputs);
  free(s->targets);
}

static int session_open(const char *cmd, session *s, const char *model_dir, char **data, int ndata, int B, int T,
                        const char *backend, int threads, const char *precision, int device) {
  memset(s, 0, sizeof *s);
  gpt_backend_opts bo = {.threads = threads, .device = device};
  if (gpt_backend_parse(backend, &bo.kind) || gpt_precision_parse(precision, &bo.precision)) {
    DPC_FAIL(cmd);
    return 2;
  }
  if (device < 0) {
    fprintf(stderr, "dipacoctl %s: --device must be >= 0\n", cmd);
    return 2;
  }
  if (ndata == 0) {
    fprintf(stderr, "dipacoctl %s: no data shards given (--data SHARD...)\n", cmd);
    return 2;
  }
  if (B < 1 || T < 1) {
    fprintf(stderr, "dipacoctl %s: --batch and --seq-len must be >= 1\n", cmd);
    return 2;
  }
  if (modeldir_load(model_dir, &s->cfg, &s->params)) {
    DPC_FAIL(cmd);
    return 1;
  }
  if (T > s->cfg.n_positions) {
    fprintf(stderr, "dipacoctl %s: --seq-len %d exceeds the model's n_positions %d (%s/config.json)\n", cmd, T,
            s->cfg.n_positions, model_dir);
    return 2;
  }
  if (dataset_open((const char **)data, ndata, &s->ds)) {
    DPC_FAIL(cmd);
    return 1;
  }
  int maxtok = 0;
  if (dataset_max_token(s->ds, &maxtok) == 0 && maxtok >= s->cfg.vocab_size) {
    fprintf(stderr, "dipacoctl %s: the data holds token id %d but the model's vocab_size is %d (wrong tokenizer?)\n",
            cmd, maxtok, s->cfg.vocab_size);
    return 1;
  }
  if (dataset_num_batches(s->ds, B, T) < 1) {
    DPC_FAIL(cmd);
    return 1;
  }
  if (gpt_create(&s->model, &s->cfg, &bo, B, T) || gpt_set_params(s->model, s->params, 0, s->model->lay.n_params)) {
    DPC_FAIL(cmd);
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

int ctl_train(int argc, char **argv) {
  const char *model_dir = NULL, *out = NULL, *data0 = NULL, *backend = "cpu", *precision = "fp32";
  int steps = 0, B = 0, T = 0, warmup = 0, threads = 0, json = 0, device = 0;
  float lr = 3e-4f, lr_min_frac = 0.1f, wd = 0.1f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, clip = 1.0f;
  ctl_opt opts[] = {{"model", CTL_STR, &model_dir, 1, 0},   {"data", CTL_STR, &data0, 1, 0},
                    {"out", CTL_STR, &out, 1, 0},           {"steps", CTL_INT, &steps, 1, 0},
                    {"batch", CTL_INT, &B, 1, 0},           {"seq-len", CTL_INT, &T, 1, 0},
                    {"lr", CTL_FLOAT, &lr, 0, 0},           {"warmup", CTL_INT, &warmup, 0, 0},
                    {"lr-min-frac", CTL_FLOAT, &lr_min_frac, 0, 0}, {"weight-decay", CTL_FLOAT, &wd, 0, 0},
                    {"beta1", CTL_FLOAT, &beta1, 0, 0},     {"beta2", CTL_FLOAT, &beta2, 0, 0},
                    {"eps", CTL_FLOAT, &eps, 0, 0},         {"grad-clip", CTL_FLOAT, &clip, 0, 0},
                    {"threads", CTL_INT, &threads, 0, 0},   {"backend", CTL_STR, &backend, 0, 0},
                    {"precision", CTL_STR, &precision, 0, 0}, {"device", CTL_INT, &device, 0, 0},
                    {"json", CTL_FLAG, &json, 0, 0},        {NULL, 0, NULL, 0, 0}};
  char **pos = NULL;
  int npos = 0, rc = ctl_parse("train", argc, argv, opts, &pos, &npos);
  if (rc) return rc < 0 ? 0 : rc;
  int status = 2;
  session s;
  memset(&s, 0, sizeof s);
  const char *why = NULL;
  if (steps < 1) why = "--steps must be >= 1";
  else if (warmup < 0) why = "--warmup must be >= 0";
  else if (!(lr > 0)) why = "--lr must be > 0";
  else if (!(lr_min_frac >= 0 && lr_min_frac <= 1)) why = "--lr-min-frac must be in [0, 1]";
  else if (!(wd >= 0)) why = "--weight-decay must be >= 0";
  else if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)) why = "--beta1 and --beta2 must be in [0, 1)";
  else if (!(eps > 0)) why = "--eps must be > 0";
  else if (!(clip >= 0)) why = "--grad-clip must be >= 0 (0 disables)";
  else if (threads < 0) why = "--threads must be >= 0";
  if (why) {
    fprintf(stderr, "dipacoctl train: %s\n", why);
    free(pos);
    return 2;
  }
  /* --data takes the first shard; further shards (a shell glob) arrive as positionals. */
  char **data = calloc((size_t)npos + 1, sizeof *data);
  if (!data) {
    free(pos);
    return 1;
  }
  data[0] = (char *)data0;
  for (int i = 0; i < npos; i++) data[i + 1] = pos[i];
  status = session_open("train", &s, model_dir, data, npos + 1, B, T, backend, threads, precision, device);
  if (status) goto done;
  status = 1;
  const long nb = dataset_num_batches(s.ds, B, T);
  gpt_adamw_hparams hp = {beta1, beta2, eps, wd, clip};
  const int tty = isatty(STDERR_FILENO);
  double t0 = now_s(), tlast = t0, last_print = 0;
  for (int step = 0; step < steps; step++) {
    float loss = 0, norm = 0;
    float lr_s = gpt_lr_at(lr, warmup, steps, lr_min_frac, step);
    if (dataset_batch(s.ds, B, T, step, 0, 1, s.inputs, s.targets) ||
        gpt_forward(s.model, s.inputs, s.targets, B, T, &loss) || gpt_zero_grad(s.model) ||
        gpt_backward(s.model) || gpt_adamw_step(s.model, &hp, lr_s, step + 1, &norm)) {
      DPC_FAIL("train");
      goto done;
    }
    if (!isfinite(loss)) {
      fprintf(stderr, "dipacoctl train: loss became %f at step %d (lower --lr?)\n", loss, step);
      goto done;
    }
    double t = now_s();
    double tps = (double)B * T / (t - tlast + 1e-12);
    tlast = t;
    if (json) {
      printf("{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,\"tokens_per_s\":%.1f}\n", step, loss, lr_s,
             norm, tps);
      fflush(stdout);
    } else if (t - last_print > (tty ? 0.2 : 5.0) || step + 1 == steps || step == 0) {
      last_print = t;
      double avg_tps = (double)B * T * (step + 1) / (t - t0 + 1e-12);
      char eta[32];
      format_eta((double)(steps - step - 1) * B * T / avg_tps, eta, sizeof eta);
      fprintf(stderr, "%sstep %*d/%d | loss %.4f | lr %.2e | %.0f tok/s | ETA %s%s", tty ? "\r" : "",
              (int)snprintf(NULL, 0, "%d", steps), step + 1, steps, loss, lr_s, avg_tps, eta, tty ? "   " : "\n");
    }
  }
  if (tty && !json) fputc('\n', stderr);
  double el = now_s() - t0;
  if (gpt_get_params(s.model, s.params, 0, s.model->lay.n_params) || modeldir_save(out, &s.cfg, s.params)) {
    DPC_FAIL("train");
    goto done;
  }
  fprintf(stderr, "train: %d steps (%ld batches per epoch) in %.1f s, %.0f tokens/s; wrote %s\n", steps, nb, el,
          (double)steps * B * T / el, out);
  status = 0;
done:
  session_close(&s);
  free(data);
  free(pos);
  return status;
}

/* ---------- eval ---------- */

int ctl_eval(int argc, char **argv) {
  const char *model_dir = NULL, *data0 = NULL, *backend = "cpu", *precision = "fp32";
  int B = 0, T = 0, threads = 0, json = 0, device = 0;
  long K = 0;
  ctl_opt opts[] = {{"model", CTL_STR, &model_dir, 1, 0}, {"data", CTL_STR, &data0, 1, 0},
                    {"batch", CTL_INT, &B, 1, 0},         {"seq-len", CTL_INT, &T, 1, 0},
                    {"batches", CTL_LONG, &K, 0, 0},      {"threads", CTL_INT, &threads, 0, 0},
                    {"backend", CTL_STR, &backend, 0, 0}, {"json", CTL_FLAG, &json, 0, 0},
                    {"precision", CTL_STR, &precision, 0, 0}, {"device", CTL_INT, &device, 0, 0},
                    {NULL, 0, NULL, 0, 0}};
  char **pos = NULL;
  int npos = 0, rc = ctl_parse("eval", argc, argv, opts, &pos, &npos);
  if (rc) return rc < 0 ? 0 : rc;
  char **data = calloc((size_t)npos + 1, sizeof *data);
  session s;
  memset(&s, 0, sizeof s);
  int status = 1;
  if (!data) goto done;
  data[0] = (char *)data0;
  for (int i = 0; i < npos; i++) data[i + 1] = pos[i];
  if (K < 0 || threads < 0) {
    fprintf(stderr, "dipacoctl eval: --batches and --threads must be >= 0\n");
    status = 2;
    goto done;
  }
  status = session_open("eval", &s, model_dir, data, npos + 1, B, T, backend, threads, precision, device);
  if (status) goto done;
  status = 1;
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
      DPC_FAIL("eval");
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
  session_close(&s);
  free(data);
  free(pos);
  return status;
}

/* ---------- generate ---------- */

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

int ctl_generate(int argc, char **argv) {
  const char *model_dir = NULL, *tokname = NULL, *vocab_dir = NULL, *prompt = NULL, *backend = "cpu";
  const char *precision = "fp32";
  int ntok = 0, top_k = 40, threads = 0, device = 0;
  float temp = 0.8f;
  long seed = 1337;
  ctl_opt opts[] = {{"model", CTL_STR, &model_dir, 1, 0},   {"tokenizer", CTL_STR, &tokname, 1, 0},
                    {"vocab-dir", CTL_STR, &vocab_dir, 0, 0}, {"prompt", CTL_STR, &prompt, 1, 0},
                    {"tokens", CTL_INT, &ntok, 1, 0},       {"temperature", CTL_FLOAT, &temp, 0, 0},
                    {"top-k", CTL_INT, &top_k, 0, 0},       {"seed", CTL_LONG, &seed, 0, 0},
                    {"threads", CTL_INT, &threads, 0, 0},   {"backend", CTL_STR, &backend, 0, 0},
                    {"precision", CTL_STR, &precision, 0, 0}, {"device", CTL_INT, &device, 0, 0},
                    {NULL, 0, NULL, 0, 0}};
  char **pos = NULL;
  int npos = 0, rc = ctl_parse("generate", argc, argv, opts, &pos, &npos);
  if (rc) return rc < 0 ? 0 : rc;
  free(pos);
  if (npos) {
    fprintf(stderr, "dipacoctl generate: unexpected argument (quote the --prompt text)\n");
    return 2;
  }
  if (ntok < 0 || top_k < 0 || temp < 0 || threads < 0 || device < 0) {
    fprintf(stderr, "dipacoctl generate: --tokens, --top-k, --temperature, --threads and --device must be >= 0\n");
    return 2;
  }
  int status = 1;
  dpc_tokenizer *tok = NULL;
  gpt_model *model = NULL;
  float *params = NULL, *logits = NULL;
  int *ids = NULL, *ctx = NULL;
  cand *cands = NULL;
  size_t nids = 0;
  gpt_config cfg;
  gpt_backend_opts bo = {.threads = threads, .device = device};
  if (strcmp(tokname, "byte") == 0) rc = tok_open_byte(&tok);
  else if (strcmp(tokname, "gpt2") == 0 && vocab_dir) rc = tok_open_gpt2(vocab_dir, &tok);
  else {
    fprintf(stderr, "dipacoctl generate: --tokenizer must be byte, or gpt2 with --vocab-dir DIR\n");
    return 2;
  }
  if (rc || gpt_backend_parse(backend, &bo.kind) || gpt_precision_parse(precision, &bo.precision) ||
      modeldir_load(model_dir, &cfg, &params)) {
    DPC_FAIL("generate");
    goto done;
  }
  if (tok_vocab_size(tok) > cfg.vocab_size) {
    fprintf(stderr, "dipacoctl generate: tokenizer vocab %d exceeds the model's vocab_size %d\n", tok_vocab_size(tok),
            cfg.vocab_size);
    goto done;
  }
  if (tok_encode(tok, prompt, strlen(prompt), &ids, &nids)) {
    DPC_FAIL("generate");
    goto done;
  }
  const int maxT = cfg.n_positions, V = cfg.vocab_size;
  size_t cap = nids + (size_t)ntok + 1;
  ctx = malloc(cap * sizeof *ctx);
  logits = malloc((size_t)V * sizeof *logits);
  cands = malloc((size_t)V * sizeof *cands);
  if (!ctx || !logits || !cands) goto done;
  size_t n = 0;
  if (nids == 0 && tok_eot(tok) >= 0) ctx[n++] = tok_eot(tok);
  for (size_t i = 0; i < nids; i++) ctx[n++] = ids[i];
  if (n == 0) {
    fprintf(stderr, "dipacoctl generate: empty prompt and the tokenizer has no end-of-text token to start from\n");
    goto done;
  }
  if (gpt_create(&model, &cfg, &bo, 1, maxT) || gpt_set_params(model, params, 0, model->lay.n_params)) {
    DPC_FAIL("generate");
    goto done;
  }
  fwrite(prompt, 1, strlen(prompt), stdout);
  fflush(stdout);
  uint64_t rng = (uint64_t)seed;
  for (int k = 0; k < ntok; k++) {
    size_t start = n > (size_t)maxT ? n - (size_t)maxT : 0;
    int t = (int)(n - start);
    if (gpt_forward(model, ctx + start, NULL, 1, t, NULL) || gpt_logits(model, 0, t - 1, logits)) {
      DPC_FAIL("generate");
      goto done;
    }
    int next = sample(logits, V, temp, top_k, &rng, cands);
    ctx[n++] = next;
    char *text = NULL;
    size_t tlen = 0;
    if (next < tok_vocab_size(tok) && tok_decode(tok, &next, 1, &text, &tlen) == 0) fwrite(text, 1, tlen, stdout);
    free(text);
    fflush(stdout);
  }
  fputc('\n', stdout);
  status = 0;
done:
  gpt_free(model);
  tok_free(tok);
  free(params);
  free(ids);
  free(ctx);
  free(logits);
  free(cands);
  return status;
}

#ifndef DIPACO_HAVE_ADMIN
int ctl_admin(const char *coordinator, int argc, char **argv) {
  (void)coordinator;
  (void)argc;
  fprintf(stderr,
          "dipacoctl: unknown command '%s'. This dipacoctl was built without the admin commands "
          "(DIPACO_DISTRIBUTED=OFF); run 'dipacoctl --help' for the offline tools.\n",
          argv[0]);
  return 2;
}
#endif
