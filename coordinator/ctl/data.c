/* data.c — `dipacoctl data prepare`: tokenize text files (byte, GPT-2 BPE or a Hugging Face
 * tokenizer.json) into llm.c shards, train_NNN.bin and val_NNN.bin, in the order the daemons
 * read them: 16-bit tokens when the vocabulary fits, else version 2 shards of 32-bit tokens
 * (docs/design.md §6.1). */
#include "common/errors.h"
#include "common/shard.h"
#include "common/tokenizer.h"
#include "coordinator/ctl/ctl.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
  int *v;
  size_t n, cap;
} tokbuf;

static int tokbuf_append(tokbuf *t, const int *ids, size_t n) {
  if (t->n + n > t->cap) {
    size_t cap = t->cap ? t->cap : 1 << 20;
    while (cap < t->n + n) cap *= 2;
    int *v = realloc(t->v, cap * sizeof *v);
    if (!v) return dpc_err(DPC_ENOMEM, "out of memory holding %zu tokens", t->n + n);
    t->v = v;
    t->cap = cap;
  }
  memcpy(t->v + t->n, ids, n * sizeof *ids);
  t->n += n;
  return 0;
}

/* Writes tokens as consecutive shards PREFIX_000.bin, PREFIX_001.bin, ... of at most
 * `per_shard` tokens each, as wide as the vocabulary needs. */
static int write_shards(const char *out, const char *prefix, const int *tok, size_t n, size_t per_shard, int vocab) {
  int idx = 0;
  for (size_t off = 0; off < n || (n == 0 && idx == 0); off += per_shard, idx++) {
    size_t len = n - off < per_shard ? n - off : per_shard;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%03d.bin", out, prefix, idx);
    int rc = shard_write_ids(path, tok + off, len, vocab);
    if (rc) return rc;
    fprintf(stderr, "wrote %s (%zu tokens%s)\n", path, len, vocab > 65536 ? ", 32-bit" : "");
    if (n == 0) break;
  }
  return 0;
}

/* Opens the tokenizer named by --tokenizer; returns an exit status (0 opened). */
static int open_tokenizer(const char *name, const char *vocab_dir, dpc_tokenizer **tok) {
  int rc = tok_open_spec(name, vocab_dir, tok);
  if (rc == DPC_EINVAL || (rc == DPC_ENOENT && strcmp(name, "gpt2") != 0)) {
    fprintf(stderr, "dipacoctl data prepare: %s\n", dpc_errmsg());
    return 2;
  }
  if (rc) {
    CTL_FAIL("data prepare");
    return 1;
  }
  return 0;
}

/* Tokenizes every file in order into toks, with progress on stderr; returns 0 or a DPC_E*
 * code (message set). */
static int tokenize_files(dpc_tokenizer *tok, const strlist *files, tokbuf *toks) {
  size_t total_bytes = 0;
  for (int i = 0; i < files->n; i++) {
    struct stat st;
    if (stat(files->v[i], &st) == 0) total_bytes += (size_t)st.st_size;
  }
  const int eot = tok_eot(tok);
  const int progress = isatty(STDERR_FILENO);
  double t0 = dpc_mono_s(), last = 0;
  size_t done_bytes = 0;
  for (int i = 0; i < files->n; i++) {
    char *text = NULL;
    size_t len = 0;
    int *ids = NULL;
    size_t nids = 0;
    int rc = read_whole(files->v[i], &text, &len);
    if (!rc) rc = tok_encode(tok, text, len, &ids, &nids);
    free(text);
    if (rc) return rc;
    /* Documents are separated by the end-of-text token where the tokenizer has one (GPT-2's
     * <|endoftext|>, Llama 3's <|end_of_text|>, ...: tok_eot). */
    if (eot >= 0) rc = tokbuf_append(toks, &eot, 1);
    if (!rc) rc = tokbuf_append(toks, ids, nids);
    free(ids);
    if (rc) return rc;
    done_bytes += len;
    double t = dpc_mono_s();
    if (t - last > 0.5 || i + 1 == files->n) {
      last = t;
      fprintf(stderr, "%stokenized %d/%d files, %.1f/%.1f MB, %zu tokens, %.1f MB/s%s",
              progress ? "\r" : "", i + 1, files->n, done_bytes / 1e6, total_bytes / 1e6, toks->n,
              done_bytes / 1e6 / (t - t0 + 1e-9), progress ? "" : "\n");
    }
  }
  if (progress) fputc('\n', stderr);
  return 0;
}

int ctl_data_prepare(int argc, char **argv) {
  const char *tokname = NULL, *vocab_dir = NULL, *out = NULL;
  float val_frac = 0.1f;
  long shard_tokens = 100000000;
  dpc_arg args[] = {{.name = "tokenizer", .kind = DPC_ARG_STR, .dst = &tokname, .required = 1},
                    {.name = "vocab-dir", .kind = DPC_ARG_STR, .dst = &vocab_dir},
                    {.name = "out", .kind = DPC_ARG_STR, .dst = &out, .required = 1},
                    {.name = "val-fraction", .kind = DPC_ARG_FLOAT, .dst = &val_frac},
                    {.name = "shard-tokens", .kind = DPC_ARG_LONG, .dst = &shard_tokens},
                    DPC_ARGS_END};
  char **pos = NULL;
  int npos = 0, rc, status;
  if (ctl_args("data prepare", argc, argv, args, &pos, &npos, &status)) return status;
  status = 1;
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
  if ((status = open_tokenizer(tokname, vocab_dir, &tok))) goto done;
  status = 1;
  for (int i = 0; i < npos; i++) {
    if ((rc = collect_inputs(pos[i], &files))) {
      CTL_FAIL("data prepare");
      goto done;
    }
  }
  if (files.n == 0) {
    fprintf(stderr, "dipacoctl data prepare: the inputs hold no files\n");
    goto done;
  }
  if (tokenize_files(tok, &files, &toks)) {
    CTL_FAIL("data prepare");
    goto done;
  }
  size_t nval = (size_t)((double)toks.n * val_frac);
  size_t ntrain = toks.n - nval;
  if ((rc = mkdir(out, 0755)) && errno != EEXIST) {
    fprintf(stderr, "dipacoctl data prepare: %s: %s\n", out, strerror(errno));
    goto done;
  }
  const int V = tok_vocab_size(tok);
  if ((rc = write_shards(out, "train", toks.v, ntrain, (size_t)shard_tokens, V)) ||
      (nval > 0 && (rc = write_shards(out, "val", toks.v + ntrain, nval, (size_t)shard_tokens, V)))) {
    CTL_FAIL("data prepare");
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
