/* router.h — DiPaCo routers (docs/design.md §3 "DiPaCo routing"): the routing feature of a
 * sequence, a router directory on disk, and the path a feature goes to.
 *
 * Feature: the mean of a base model's final hidden states (after ln_f, or Llama's model.norm) over the first
 * `prefix` tokens of a sequence, computed with the training core (kernels/gpt.h, any backend).
 * Causal attention makes it depend on those tokens only, so the forward runs on the prefix.
 *
 * Router kinds: "kmeans" (K centroids over the whole feature; path = nearest centroid),
 * "product-kmeans" (a K1 × K2 grid: K1 centroids over the first half of the feature, K2 over
 * the second half; path = c1·K2 + c2, the job's path numbering for levels of K1 then K2
 * modules) and "linear" (DiPaCo's discriminative router: a linear softmax classifier over the
 * feature, path = argmax of W·z + b; fitted by router_fit_linear on the path each training
 * sequence has the lowest loss under).
 *
 * Router directory: base/ (a copy of the feature model, written by `dipacoctl route fit`),
 * router.safetensors (F32 "centroids" [K, C], or "centroids.0" [K1, C/2]
 * and "centroids.1" [K2, C - C/2], or "linear.weight" [P, C] and "linear.bias" [P]) plus
 * router.json:
 *   {"format": "dipaco-router", "version": 1, "kind": "kmeans"|"product-kmeans"|"linear",
 *    "k": K | "grid": [K1, K2] (linear: neither), "paths": P, "dim": C, "prefix": n, "seed": S,
 *    "feature_model": {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size",
 *                      "crc32c": "xxxxxxxx"}}      (CRC-32C of the canonical float array)
 * A Llama-class feature model adds the rest of its gpt_config to feature_model, under the job
 * spec's names: "arch": "llama", "n_kv_head", "intermediate_size", "tie_word_embeddings" and
 * "attention_bias" (0/1), "rope_scaling" (0 none, 1 llama3), "rms_norm_eps", "rope_theta", and
 * with llama3 scaling "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
 * "rope_original_max_position_embeddings". Without "arch" (files written before these keys) the
 * feature model is GPT-2.
 *
 * Ownership: a router owns its centroid arrays (router_free). Thread-safety: reentrant. */
#ifndef DPC_ROUTER_H
#define DPC_ROUTER_H

#include "kernels/gpt.h"

#include <stddef.h>
#include <stdint.h>

#define ROUTER_JSON "router.json"
#define ROUTER_WEIGHTS "router.safetensors"
#define ROUTER_BASE_DIR "base" /* the copy of the feature model `route fit` keeps beside the router */
#define ROUTER_DEFAULT_PREFIX 32
/* A DiPaCo model directory (`dipacoctl job export --all-paths`): DIPACO_MODEL_JSON
 * {"format": "dipaco-model", "version": 1, "job_id", "paths": P, "router": "router" | null},
 * path_<p>/ (a model directory per path) and router/ (a router directory). */
#define DIPACO_MODEL_JSON "dipaco.json"

typedef enum { ROUTER_KMEANS = 0, ROUTER_PRODUCT = 1, ROUTER_LINEAR = 2 } router_kind;

typedef struct {
  router_kind kind;
  int k;          /* kmeans: K */
  int k1, k2;     /* product-kmeans: the grid */
  int n_paths;    /* K or K1·K2 */
  int dim;        /* C, the feature size */
  int prefix;     /* tokens averaged */
  uint64_t seed;
  gpt_config model;     /* the feature model */
  uint32_t model_crc;   /* CRC-32C of its canonical parameters */
  float *c;       /* kmeans: [K][C]; product: [K1][C/2]; linear: W [P][C] */
  float *c2;      /* product: [K2][C - C/2]; linear: b [P]; NULL for kmeans */
} router;

/* CRC-32C of a model's canonical parameter array (the feature model's identity). */
uint32_t router_model_crc(const gpt_layout *lay, const float *params);

/* Features of n sequences seqs[n][seq_stride] (token ids; only the first `prefix` of each are
 * read): out[n][C]. The model must have been created with maxT >= prefix; sequences are run
 * in batches of up to the model's maxB. progress (may be NULL) is called after each batch. */
int router_features(gpt_model *m, const int *seqs, size_t n, int seq_stride, int prefix, float *out,
                    void (*progress)(size_t done, size_t total, void *ud), void *ud);

/* The path of feature z[dim]; with second not NULL also the runner-up path (-1 if none):
 * for kmeans the second-nearest centroid, for product-kmeans the better of changing c1 or c2
 * to its runner-up (the sum of the two halves' squared distances decides). */
int router_route(const router *r, const float *z, int *second);

/* Fit a linear softmax router: W [P][C] and b [P] (caller-allocated, r->c and r->c2 of a
 * ROUTER_LINEAR router) minimising the mean cross-entropy of softmax(W·z_i + b) against
 * label[i] over x[n][C], plus l2/2·|W|², by `iters` full-batch gradient steps of Adam
 * (lr, betas 0.9/0.999), from zero; deterministic (one thread, fixed order). *accuracy
 * (may be NULL) gets the fraction of training features routed to their label. */
int router_fit_linear(const float *x, const int *label, size_t n, int dim, int paths, int iters, double lr,
                      double l2, float *w, float *b, double *accuracy);

/* Write the router directory `dir` (created if missing); atomic per file. */
int router_save(const char *dir, const router *r);
/* Read and validate a router directory; errors name the file and the field. */
int router_load(const char *dir, router *r);
void router_free(router *r);

/* DPC_EINVAL unless the feature model `cfg` with parameter CRC `crc` is the router's: the
 * message names both, so a router is never used with another model's features. */
int router_check_model(const router *r, const gpt_config *cfg, uint32_t crc);

#endif
