/* router.c — routing features, router directories and routing (router.h). */
#include "kernels/router.h"
#include "common/checksum.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "common/safetensors.h"
#include "kernels/kmeans.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUTER_MAX_JSON (1u << 20)
#define ROUTER_MAX_PATHS 65536

uint32_t router_model_crc(const gpt_layout *lay, const float *params) {
  return dpc_crc32c(0, params, lay->n_params * sizeof *params);
}

int router_features(gpt_model *m, const int *seqs, size_t n, int seq_stride, int prefix, float *out,
                    void (*progress)(size_t, size_t, void *), void *ud) {
  const int C = m->lay.cfg.n_embd, B = m->maxB;
  if (prefix < 1 || prefix > m->maxT || prefix > seq_stride)
    return dpc_err(DPC_EINVAL, "routing prefix %d: must be in [1, min(seq_len %d, model maxT %d)]", prefix, seq_stride,
                   m->maxT);
  int *in = malloc((size_t)B * prefix * sizeof *in);
  float *h = malloc((size_t)C * sizeof *h);
  double *acc = malloc((size_t)C * sizeof *acc);
  int rc = in && h && acc ? 0 : dpc_err(DPC_ENOMEM, "routing features: out of memory");
  for (size_t s0 = 0; !rc && s0 < n; s0 += (size_t)B) {
    int nb = (int)(n - s0 < (size_t)B ? n - s0 : (size_t)B);
    for (int b = 0; b < nb; b++) memcpy(in + (size_t)b * prefix, seqs + (s0 + b) * (size_t)seq_stride, (size_t)prefix * sizeof *in);
    rc = gpt_forward(m, in, NULL, nb, prefix, NULL);
    for (int b = 0; !rc && b < nb; b++) {
      for (int j = 0; j < C; j++) acc[j] = 0;
      for (int t = 0; !rc && t < prefix; t++) {
        rc = gpt_hidden(m, b, t, h);
        for (int j = 0; !rc && j < C; j++) acc[j] += h[j];
      }
      for (int j = 0; !rc && j < C; j++) out[(s0 + b) * (size_t)C + j] = (float)(acc[j] / prefix);
    }
    if (!rc && progress) progress(s0 + (size_t)nb, n, ud);
  }
  free(in);
  free(h);
  free(acc);
  return rc;
}

/* Linear router scores: best and runner-up of W·z + b (ties to the lower index). */
static int linear_route(const router *r, const float *z, int *second) {
  int best = -1, sec = -1;
  double bs = -INFINITY, ss = -INFINITY;
  for (int p = 0; p < r->n_paths; p++) {
    const float *w = r->c + (size_t)p * r->dim;
    double s = r->c2[p];
    for (int j = 0; j < r->dim; j++) s += (double)w[j] * z[j];
    if (s > bs) {
      sec = best;
      ss = bs;
      best = p;
      bs = s;
    } else if (s > ss) {
      sec = p;
      ss = s;
    }
  }
  if (second) *second = sec;
  return best;
}

int router_fit_linear(const float *x, const int *label, size_t n, int dim, int paths, int iters, double lr,
                      double l2, float *w, float *b, double *accuracy) {
  if (n < 1 || dim < 1 || paths < 2 || iters < 1)
    return dpc_err(DPC_EINVAL, "linear router: need sequences (%zu), a feature (%d), 2+ paths (%d), iterations (%d)", n,
                   dim, paths, iters);
  const size_t np = (size_t)paths * (dim + 1);
  double *th = calloc(np, sizeof *th), *g = malloc(np * sizeof *g), *m = calloc(np, sizeof *m);
  double *v = calloc(np, sizeof *v), *pr = malloc((size_t)paths * sizeof *pr);
  int rc = th && g && m && v && pr ? 0 : dpc_err(DPC_ENOMEM, "linear router: out of memory");
  for (size_t i = 0; !rc && i < n; i++)
    if (label[i] < 0 || label[i] >= paths) rc = dpc_err(DPC_EINVAL, "linear router: label %d of sequence %zu", label[i], i);
  /* th: row p holds W[p][0..dim) then b[p]. */
  for (int it = 0; !rc && it < iters; it++) {
    memset(g, 0, np * sizeof *g);
    for (size_t i = 0; i < n; i++) {
      const float *z = x + i * dim;
      double mx = -INFINITY, sum = 0;
      for (int p = 0; p < paths; p++) {
        const double *t = th + (size_t)p * (dim + 1);
        double s = t[dim];
        for (int j = 0; j < dim; j++) s += t[j] * z[j];
        pr[p] = s;
        if (s > mx) mx = s;
      }
      for (int p = 0; p < paths; p++) sum += (pr[p] = exp(pr[p] - mx));
      for (int p = 0; p < paths; p++) {
        double d = (pr[p] / sum - (p == label[i])) / (double)n;
        double *gp = g + (size_t)p * (dim + 1);
        for (int j = 0; j < dim; j++) gp[j] += d * z[j];
        gp[dim] += d;
      }
    }
    const double b1 = 0.9, b2 = 0.999, c1 = 1 - pow(b1, it + 1), c2 = 1 - pow(b2, it + 1);
    for (size_t k = 0; k < np; k++) {
      double gk = g[k] + ((k % (size_t)(dim + 1)) != (size_t)dim ? l2 * th[k] : 0);
      m[k] = b1 * m[k] + (1 - b1) * gk;
      v[k] = b2 * v[k] + (1 - b2) * gk * gk;
      th[k] -= lr * (m[k] / c1) / (sqrt(v[k] / c2) + 1e-8);
    }
  }
  for (int p = 0; !rc && p < paths; p++) {
    for (int j = 0; j < dim; j++) w[(size_t)p * dim + j] = (float)th[(size_t)p * (dim + 1) + j];
    b[p] = (float)th[(size_t)p * (dim + 1) + dim];
  }
  if (!rc && accuracy) {
    router r = {.kind = ROUTER_LINEAR, .n_paths = paths, .dim = dim, .c = w, .c2 = b};
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) ok += linear_route(&r, x + i * dim, NULL) == label[i];
    *accuracy = (double)ok / (double)n;
  }
  free(th);
  free(g);
  free(m);
  free(v);
  free(pr);
  return rc;
}

int router_route(const router *r, const float *z, int *second) {
  if (r->kind == ROUTER_LINEAR) return linear_route(r, z, second);
  if (r->kind == ROUTER_KMEANS) {
    int sec = -1, best = kmeans_nearest(r->c, r->k, r->dim, z, &sec);
    if (second) *second = sec;
    return best;
  }
  const int d1 = r->dim / 2, d2 = r->dim - d1;
  int s1 = -1, s2 = -1;
  int a = kmeans_nearest(r->c, r->k1, d1, z, &s1), b = kmeans_nearest(r->c2, r->k2, d2, z + d1, &s2);
  if (second) {
    /* Runner-up: change the half whose runner-up costs the least extra distance. */
    double e1 = s1 >= 0 ? kmeans_dist2(r->c + (size_t)s1 * d1, z, d1) - kmeans_dist2(r->c + (size_t)a * d1, z, d1)
                        : INFINITY;
    double e2 = s2 >= 0 ? kmeans_dist2(r->c2 + (size_t)s2 * d2, z + d1, d2) -
                              kmeans_dist2(r->c2 + (size_t)b * d2, z + d1, d2)
                        : INFINITY;
    if (e1 == INFINITY && e2 == INFINITY) *second = -1;
    else if (e1 <= e2) *second = s1 * r->k2 + b;
    else *second = a * r->k2 + s2;
  }
  return a * r->k2 + b;
}

void router_free(router *r) {
  free(r->c);
  free(r->c2);
  r->c = r->c2 = NULL;
}

static void join(char *buf, size_t cap, const char *dir, const char *file) { snprintf(buf, cap, "%s/%s", dir, file); }

/* A double that reads back bit-identical (the feature model is compared with memcmp). */
static void add_exact(cJSON *o, const char *key, double v) {
  char buf[40];
  snprintf(buf, sizeof buf, "%.17g", v);
  cJSON_AddRawToObject(o, key, buf);
}

/* The Llama keys of feature model m into fm (read_llama reads them back). */
static void write_llama(cJSON *fm, const gpt_config *m) {
  cJSON_AddStringToObject(fm, "arch", "llama");
  cJSON_AddNumberToObject(fm, "n_kv_head", m->n_kv_head);
  cJSON_AddNumberToObject(fm, "intermediate_size", m->intermediate_size);
  cJSON_AddNumberToObject(fm, "tie_word_embeddings", m->tie_word_embeddings);
  cJSON_AddNumberToObject(fm, "attention_bias", m->attention_bias);
  cJSON_AddNumberToObject(fm, "rope_scaling", m->rope_scaling);
  add_exact(fm, "rms_norm_eps", m->rms_norm_eps);
  add_exact(fm, "rope_theta", m->rope_theta);
  if (m->rope_scaling != GPT_ROPE_LLAMA3) return;
  add_exact(fm, "rope_factor", m->rope_factor);
  add_exact(fm, "rope_low_freq_factor", m->rope_low_freq_factor);
  add_exact(fm, "rope_high_freq_factor", m->rope_high_freq_factor);
  cJSON_AddNumberToObject(fm, "rope_original_max_position_embeddings", m->rope_original_max_position_embeddings);
}

int router_save(const char *dir, const router *r) {
  int rc = dpc_mkdir_p(dir);
  if (rc) return rc;
  const int d1 = r->kind == ROUTER_PRODUCT ? r->dim / 2 : r->dim, d2 = r->dim - r->dim / 2;
  st_write_tensor t[2];
  memset(t, 0, sizeof t);
  int nt = 1;
  if (r->kind == ROUTER_LINEAR) {
    t[0] = (st_write_tensor){.name = "linear.weight", .dtype = ST_F32, .ndim = 2, .shape = {r->n_paths, r->dim},
                             .data = r->c};
    t[1] = (st_write_tensor){.name = "linear.bias", .dtype = ST_F32, .ndim = 1, .shape = {r->n_paths}, .data = r->c2};
    nt = 2;
  } else {
    t[0] = (st_write_tensor){.name = r->kind == ROUTER_KMEANS ? "centroids" : "centroids.0", .dtype = ST_F32,
                             .ndim = 2, .shape = {r->kind == ROUTER_KMEANS ? r->k : r->k1, d1}, .data = r->c};
  }
  if (r->kind == ROUTER_PRODUCT) {
    t[1] = (st_write_tensor){.name = "centroids.1", .dtype = ST_F32, .ndim = 2, .shape = {r->k2, d2}, .data = r->c2};
    nt = 2;
  }
  char path[4096];
  join(path, sizeof path, dir, ROUTER_WEIGHTS);
  const char *meta[] = {"format", "dipaco-router"};
  if ((rc = st_write(path, t, nt, meta, 1))) return rc;
  cJSON *root = cJSON_CreateObject(), *fm;
  char crc[16], *txt = NULL;
  snprintf(crc, sizeof crc, "%08x", r->model_crc);
  if (root) {
    cJSON_AddStringToObject(root, "format", "dipaco-router");
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON_AddStringToObject(root, "kind", r->kind == ROUTER_KMEANS    ? "kmeans"
                                          : r->kind == ROUTER_PRODUCT ? "product-kmeans"
                                                                      : "linear");
    if (r->kind == ROUTER_KMEANS) cJSON_AddNumberToObject(root, "k", r->k);
    else if (r->kind == ROUTER_PRODUCT) {
      int g[2] = {r->k1, r->k2};
      cJSON_AddItemToObject(root, "grid", cJSON_CreateIntArray(g, 2));
    }
    cJSON_AddNumberToObject(root, "paths", r->n_paths);
    cJSON_AddNumberToObject(root, "dim", r->dim);
    cJSON_AddNumberToObject(root, "prefix", r->prefix);
    cJSON_AddNumberToObject(root, "seed", (double)r->seed);
    if ((fm = cJSON_AddObjectToObject(root, "feature_model"))) {
      cJSON_AddNumberToObject(fm, "n_layer", r->model.n_layer);
      cJSON_AddNumberToObject(fm, "n_head", r->model.n_head);
      cJSON_AddNumberToObject(fm, "n_embd", r->model.n_embd);
      cJSON_AddNumberToObject(fm, "n_positions", r->model.n_positions);
      cJSON_AddNumberToObject(fm, "vocab_size", r->model.vocab_size);
      if (r->model.arch == GPT_ARCH_LLAMA) write_llama(fm, &r->model);
      cJSON_AddStringToObject(fm, "crc32c", crc);
    }
    txt = cJSON_Print(root);
  }
  cJSON_Delete(root);
  if (!txt) return dpc_err(DPC_ENOMEM, "router: out of memory writing %s", ROUTER_JSON);
  join(path, sizeof path, dir, ROUTER_JSON);
  size_t n = strlen(txt);
  txt[n] = '\n';
  rc = dpc_write_file_atomic(path, txt, n + 1);
  free(txt);
  return rc;
}

static int json_int(const char *file, const cJSON *o, const char *key, long lo, long hi, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
    return dpc_err(DPC_EFORMAT, "%s: field \"%s\" missing or not an integer in [%ld, %ld]", file, key, lo, hi);
  *out = (int)v->valuedouble;
  return 0;
}

static int json_num(const char *file, const cJSON *o, const char *key, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return dpc_err(DPC_EFORMAT, "%s: field \"feature_model.%s\" missing or not a number", file, key);
  *out = v->valuedouble;
  return 0;
}

/* The Llama keys of a feature model (router.h), so that a router keeps the whole config it was
 * fitted on; older router files and GPT-2 feature models have none (arch gpt2). */
static int read_llama(const char *file, const cJSON *fm, gpt_config *m) {
  const cJSON *arch = cJSON_GetObjectItemCaseSensitive(fm, "arch");
  if (!arch || (cJSON_IsString(arch) && strcmp(arch->valuestring, "gpt2") == 0)) return 0;
  if (!cJSON_IsString(arch) || strcmp(arch->valuestring, "llama") != 0)
    return dpc_err(DPC_EFORMAT, "%s: field \"feature_model.arch\" must be \"gpt2\" or \"llama\"", file);
  m->arch = GPT_ARCH_LLAMA;
  int rc;
  if ((rc = json_int(file, fm, "n_kv_head", 1, 1024, &m->n_kv_head)) ||
      (rc = json_int(file, fm, "intermediate_size", 1, 1 << 20, &m->intermediate_size)) ||
      (rc = json_int(file, fm, "tie_word_embeddings", 0, 1, &m->tie_word_embeddings)) ||
      (rc = json_int(file, fm, "attention_bias", 0, 1, &m->attention_bias)) ||
      (rc = json_int(file, fm, "rope_scaling", 0, 1, &m->rope_scaling)) ||
      (rc = json_num(file, fm, "rms_norm_eps", &m->rms_norm_eps)) ||
      (rc = json_num(file, fm, "rope_theta", &m->rope_theta)))
    return rc;
  if (m->rope_scaling == GPT_ROPE_LLAMA3 &&
      ((rc = json_num(file, fm, "rope_factor", &m->rope_factor)) ||
       (rc = json_num(file, fm, "rope_low_freq_factor", &m->rope_low_freq_factor)) ||
       (rc = json_num(file, fm, "rope_high_freq_factor", &m->rope_high_freq_factor)) ||
       (rc = json_int(file, fm, "rope_original_max_position_embeddings", 1, 1 << 30,
                      &m->rope_original_max_position_embeddings))))
    return rc;
  if (gpt_config_validate(m)) {
    char why[256];
    snprintf(why, sizeof why, "%s", dpc_errmsg());
    return dpc_err(DPC_EFORMAT, "%s: feature_model: %s", file, why);
  }
  return 0;
}

/* Read tensor `name` [rows][cols] (cols 0: a vector [rows]) of the router file into a new
 * array *out. */
static int read_centroids(const st_file *f, const char *name, int rows, int cols, float **out) {
  int i = st_find(f, name);
  if (i < 0) return dpc_err(DPC_EFORMAT, "%s: no tensor \"%s\"", st_path(f), name);
  const st_tensor *t = st_get(f, i);
  if (cols == 0) {
    if (t->ndim != 1 || t->shape[0] != rows)
      return dpc_err(DPC_ESHAPE, "%s: tensor \"%s\" is not [%d] as router.json says", st_path(f), name, rows);
    cols = 1;
  } else if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
    return dpc_err(DPC_ESHAPE, "%s: tensor \"%s\" is not [%d, %d] as router.json says", st_path(f), name, rows, cols);
  if (!(*out = malloc((size_t)rows * cols * sizeof **out))) return dpc_err(DPC_ENOMEM, "router: out of memory");
  int rc = st_read_f32(f, i, 0, (uint64_t)rows * cols, *out);
  for (size_t j = 0; !rc && j < (size_t)rows * cols; j++)
    if (!isfinite((*out)[j])) rc = dpc_err(DPC_ENUMERIC, "%s: tensor \"%s\" holds NaN or Inf", st_path(f), name);
  return rc;
}

static int parse_json(const char *file, const cJSON *root, router *r) {
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "dipaco-router") != 0)
    return dpc_err(DPC_EFORMAT, "%s: not a dipaco router (\"format\" is not \"dipaco-router\")", file);
  int ver = 0, rc;
  if ((rc = json_int(file, root, "version", 1, 1, &ver))) return rc;
  const cJSON *kind = cJSON_GetObjectItemCaseSensitive(root, "kind");
  if (cJSON_IsString(kind) && strcmp(kind->valuestring, "kmeans") == 0) {
    r->kind = ROUTER_KMEANS;
    if ((rc = json_int(file, root, "k", 1, ROUTER_MAX_PATHS, &r->k))) return rc;
    r->n_paths = r->k;
  } else if (cJSON_IsString(kind) && strcmp(kind->valuestring, "product-kmeans") == 0) {
    r->kind = ROUTER_PRODUCT;
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "grid");
    if (!cJSON_IsArray(g) || cJSON_GetArraySize(g) != 2 || !cJSON_IsNumber(g->child) || !cJSON_IsNumber(g->child->next))
      return dpc_err(DPC_EFORMAT, "%s: field \"grid\" must be [K1, K2]", file);
    r->k1 = (int)g->child->valuedouble;
    r->k2 = (int)g->child->next->valuedouble;
    if (r->k1 < 1 || r->k2 < 1 || (long)r->k1 * r->k2 > ROUTER_MAX_PATHS)
      return dpc_err(DPC_EFORMAT, "%s: field \"grid\" = [%d, %d] out of range", file, r->k1, r->k2);
    r->n_paths = r->k1 * r->k2;
  } else if (cJSON_IsString(kind) && strcmp(kind->valuestring, "linear") == 0) {
    r->kind = ROUTER_LINEAR;
    if ((rc = json_int(file, root, "paths", 2, ROUTER_MAX_PATHS, &r->n_paths))) return rc;
  } else {
    return dpc_err(DPC_EFORMAT, "%s: field \"kind\" must be \"kmeans\", \"product-kmeans\" or \"linear\"", file);
  }
  int paths = 0;
  if ((rc = json_int(file, root, "paths", 1, ROUTER_MAX_PATHS, &paths))) return rc;
  if (paths != r->n_paths) return dpc_err(DPC_EFORMAT, "%s: \"paths\" = %d disagrees with the clusters (%d)", file, paths, r->n_paths);
  if ((rc = json_int(file, root, "prefix", 1, 1 << 20, &r->prefix))) return rc;
  const cJSON *fm = cJSON_GetObjectItemCaseSensitive(root, "feature_model");
  if (!cJSON_IsObject(fm)) return dpc_err(DPC_EFORMAT, "%s: field \"feature_model\" missing", file);
  if ((rc = json_int(file, fm, "n_layer", 1, 256, &r->model.n_layer)) ||
      (rc = json_int(file, fm, "n_head", 1, 1024, &r->model.n_head)) ||
      (rc = json_int(file, fm, "n_embd", 1, 65536, &r->model.n_embd)) ||
      (rc = json_int(file, fm, "n_positions", 1, 1 << 20, &r->model.n_positions)) ||
      (rc = json_int(file, fm, "vocab_size", 2, 1 << 24, &r->model.vocab_size)) ||
      (rc = read_llama(file, fm, &r->model)))
    return rc;
  const cJSON *crc = cJSON_GetObjectItemCaseSensitive(fm, "crc32c");
  char *end = NULL;
  if (!cJSON_IsString(crc) || strlen(crc->valuestring) != 8 ||
      (r->model_crc = (uint32_t)strtoul(crc->valuestring, &end, 16), *end != 0))
    return dpc_err(DPC_EFORMAT, "%s: field \"feature_model.crc32c\" must be 8 hex digits", file);
  if ((rc = json_int(file, root, "dim", 1, 65536, &r->dim))) return rc;
  if (r->dim != r->model.n_embd)
    return dpc_err(DPC_EFORMAT, "%s: \"dim\" = %d but the feature model's n_embd is %d", file, r->dim, r->model.n_embd);
  if (r->kind == ROUTER_PRODUCT && r->dim < 2) return dpc_err(DPC_EFORMAT, "%s: product-kmeans needs dim >= 2", file);
  const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
  r->seed = cJSON_IsNumber(seed) && seed->valuedouble >= 0 ? (uint64_t)seed->valuedouble : 0;
  return 0;
}

int router_load(const char *dir, router *r) {
  memset(r, 0, sizeof *r);
  char path[4096];
  join(path, sizeof path, dir, ROUTER_JSON);
  void *buf = NULL;
  size_t n = 0;
  int rc = dpc_read_file(path, ROUTER_MAX_JSON, &buf, &n);
  if (rc) return rc;
  cJSON *root = cJSON_ParseWithLength(buf, n);
  free(buf);
  if (!root) return dpc_err(DPC_EFORMAT, "%s: not valid JSON", path);
  rc = parse_json(path, root, r);
  cJSON_Delete(root);
  if (rc) return rc;
  join(path, sizeof path, dir, ROUTER_WEIGHTS);
  st_file *f = NULL;
  if ((rc = st_open(path, &f))) return rc;
  if (r->kind == ROUTER_KMEANS) rc = read_centroids(f, "centroids", r->k, r->dim, &r->c);
  else if (r->kind == ROUTER_LINEAR) {
    rc = read_centroids(f, "linear.weight", r->n_paths, r->dim, &r->c);
    if (!rc) rc = read_centroids(f, "linear.bias", r->n_paths, 0, &r->c2);
  } else {
    rc = read_centroids(f, "centroids.0", r->k1, r->dim / 2, &r->c);
    if (!rc) rc = read_centroids(f, "centroids.1", r->k2, r->dim - r->dim / 2, &r->c2);
  }
  st_close(f);
  if (rc) router_free(r);
  return rc;
}

int router_check_model(const router *r, const gpt_config *cfg, uint32_t crc) {
  const gpt_config *m = &r->model;
  if (memcmp(m, cfg, sizeof *cfg) != 0)
    return dpc_err(DPC_EINVAL, "the router's feature model is %s L=%d NH=%d C=%d maxT=%d V=%d, but the model given is "
                   "%s L=%d NH=%d C=%d maxT=%d V=%d%s: route with the base model the router was fitted on",
                   gpt_arch_name(m->arch), m->n_layer, m->n_head, m->n_embd, m->n_positions, m->vocab_size,
                   gpt_arch_name(cfg->arch), cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->n_positions, cfg->vocab_size,
                   m->arch == GPT_ARCH_LLAMA && m->arch == cfg->arch ? " (or differs in a Llama key)" : "");
  if (crc != r->model_crc)
    return dpc_err(DPC_EINVAL, "the router's feature model has parameter CRC-32C %08x, the model given %08x: same "
                   "shape, other weights; route with the base model the router was fitted on", r->model_crc, crc);
  return 0;
}
