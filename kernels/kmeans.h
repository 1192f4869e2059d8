/* kmeans.h — k-means for DiPaCo routing (docs/design.md §3): k-means++ seeding from a seed, then
 * Lloyd iterations until no assignment changes or a cap; and product k-means for a 2-level
 * K1 × K2 grid (one k-means on each half of the feature vector; the pair (c1, c2) is path
 * c1·K2 + c2, the job's path numbering with the last level varying fastest).
 *
 * Everything is deterministic for fixed inputs and seed: one thread, fixed summation order,
 * ties go to the lower centroid index. Distances and sums are double; centroids are float.
 * An empty cluster is re-seeded with the point farthest from its centroid (reported through
 * kmeans_result.reseeds, which the caller says aloud).
 *
 * Ownership: the caller allocates every array. Thread-safety: reentrant. Errors: 0 or a
 * negative DPC_E* code with the detail in dpc_errmsg(). */
#ifndef DPC_KMEANS_H
#define DPC_KMEANS_H

#include <stddef.h>
#include <stdint.h>

#define KMEANS_DEFAULT_MAX_ITERS 300

typedef struct {
  int iters;     /* Lloyd iterations run */
  int converged; /* 1: the last iteration changed no assignment */
  int reseeds;   /* empty clusters re-seeded */
  double inertia; /* sum of squared distances to the assigned centroid */
} kmeans_result;

/* Cluster x[n][d] into k clusters: centroids[k][d], assign[n] (0..k-1). DPC_EINVAL when
 * k < 1, d < 1 or k > n (naming both). max_iters <= 0 means KMEANS_DEFAULT_MAX_ITERS. */
int kmeans_fit(const float *x, size_t n, int d, int k, uint64_t seed, int max_iters, float *centroids, int *assign,
               kmeans_result *res);

/* Index of the centroid nearest to z[d] among centroids[k][d] (ties: lower index); the
 * second nearest in *second when second is not NULL (-1 when k == 1). */
int kmeans_nearest(const float *centroids, int k, int d, const float *z, int *second);

/* Squared Euclidean distance of a[d] and b[d], in double. */
double kmeans_dist2(const float *a, const float *b, int d);

/* Product k-means: k-means with k1 clusters on dimensions [0, d1) and with k2 clusters on
 * [d1, d) (d1 = d / 2), seeds seed and seed + 1. c1[k1][d1], c2[k2][d - d1]; assign[n] gets
 * the path c1·k2 + c2. res1/res2 may be NULL. */
int kmeans_product_fit(const float *x, size_t n, int d, int k1, int k2, uint64_t seed, int max_iters, float *c1,
                       float *c2, int *assign, kmeans_result *res1, kmeans_result *res2);

#endif
