/* kmeans.c — k-means++ seeding, Lloyd iterations and product k-means (kmeans.h). */
#include "kernels/kmeans.h"
#include "common/errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: a small, well-mixed generator; the whole sequence follows from the seed. */
static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }

double kmeans_dist2(const float *a, const float *b, int d) {
  double s = 0;
  for (int j = 0; j < d; j++) {
    double t = (double)a[j] - (double)b[j];
    s += t * t;
  }
  return s;
}

int kmeans_nearest(const float *centroids, int k, int d, const float *z, int *second) {
  int best = 0, sec = -1;
  double bd = INFINITY, sd = INFINITY;
  for (int c = 0; c < k; c++) {
    double t = kmeans_dist2(centroids + (size_t)c * d, z, d);
    if (t < bd) {
      sec = bd < INFINITY ? best : -1;
      sd = bd;
      best = c;
      bd = t;
    } else if (t < sd) {
      sec = c;
      sd = t;
    }
  }
  if (second) *second = k > 1 ? sec : -1;
  return best;
}

/* k-means++: the first centroid is a uniformly drawn point, each further one a point drawn
 * with probability proportional to its squared distance to the nearest centroid so far. */
static void seed_plusplus(const float *x, size_t n, int d, int k, uint64_t *rng, float *cent, double *dmin) {
  size_t first = (size_t)(next_unit(rng) * (double)n);
  if (first >= n) first = n - 1;
  memcpy(cent, x + first * d, (size_t)d * sizeof *cent);
  for (size_t i = 0; i < n; i++) dmin[i] = kmeans_dist2(x + i * d, cent, d);
  for (int c = 1; c < k; c++) {
    double total = 0;
    for (size_t i = 0; i < n; i++) total += dmin[i];
    size_t pick = 0;
    if (total > 0) {
      double r = next_unit(rng) * total, acc = 0;
      pick = n - 1;
      for (size_t i = 0; i < n; i++) {
        acc += dmin[i];
        if (dmin[i] > 0 && r < acc) {
          pick = i;
          break;
        }
      }
    } else {
      pick = (size_t)c % n; /* every point sits on a centroid already */
    }
    float *cc = cent + (size_t)c * d;
    memcpy(cc, x + pick * d, (size_t)d * sizeof *cc);
    for (size_t i = 0; i < n; i++) {
      double t = kmeans_dist2(x + i * d, cc, d);
      if (t < dmin[i]) dmin[i] = t;
    }
  }
}

int kmeans_fit(const float *x, size_t n, int d, int k, uint64_t seed, int max_iters, float *centroids, int *assign,
               kmeans_result *res) {
  if (k < 1 || d < 1) return dpc_err(DPC_EINVAL, "k-means: k = %d and dimension %d must be >= 1", k, d);
  if ((size_t)k > n)
    return dpc_err(DPC_EINVAL, "k-means: %d clusters but only %zu sequences (need at least one sequence per cluster; "
                   "give more data or a smaller K)", k, n);
  if (max_iters <= 0) max_iters = KMEANS_DEFAULT_MAX_ITERS;
  kmeans_result r = {0};
  double *dmin = malloc(n * sizeof *dmin);
  double *sum = malloc((size_t)k * d * sizeof *sum);
  size_t *count = malloc((size_t)k * sizeof *count);
  if (!dmin || !sum || !count) {
    free(dmin);
    free(sum);
    free(count);
    return dpc_err(DPC_ENOMEM, "k-means: out of memory for %zu points", n);
  }
  uint64_t rng = seed;
  seed_plusplus(x, n, d, k, &rng, centroids, dmin);
  for (size_t i = 0; i < n; i++) assign[i] = -1;
  for (int it = 0; it < max_iters; it++) {
    size_t changed = 0;
    for (size_t i = 0; i < n; i++) {
      int c = kmeans_nearest(centroids, k, d, x + i * d, NULL);
      dmin[i] = kmeans_dist2(x + i * d, centroids + (size_t)c * d, d);
      if (c != assign[i]) changed++;
      assign[i] = c;
    }
    r.iters = it + 1;
    /* Empty clusters: re-seed each with the point farthest from its own centroid. */
    memset(count, 0, (size_t)k * sizeof *count);
    for (size_t i = 0; i < n; i++) count[assign[i]]++;
    int reseeded = 0;
    for (int c = 0; c < k; c++) {
      if (count[c] > 0) continue;
      size_t far = 0;
      double fd = -1;
      for (size_t i = 0; i < n; i++)
        if (count[assign[i]] > 1 && dmin[i] > fd) {
          fd = dmin[i];
          far = i;
        }
      count[assign[far]]--;
      assign[far] = c;
      count[c] = 1;
      dmin[far] = 0;
      r.reseeds++;
      reseeded = 1;
    }
    if (changed == 0 && !reseeded) {
      r.converged = 1;
      break;
    }
    memset(sum, 0, (size_t)k * d * sizeof *sum);
    for (size_t i = 0; i < n; i++) {
      double *s = sum + (size_t)assign[i] * d;
      const float *xi = x + i * d;
      for (int j = 0; j < d; j++) s[j] += xi[j];
    }
    for (int c = 0; c < k; c++)
      for (int j = 0; j < d; j++) centroids[(size_t)c * d + j] = (float)(sum[(size_t)c * d + j] / (double)count[c]);
  }
  r.inertia = 0;
  for (size_t i = 0; i < n; i++) r.inertia += kmeans_dist2(x + i * d, centroids + (size_t)assign[i] * d, d);
  if (res) *res = r;
  free(dmin);
  free(sum);
  free(count);
  return 0;
}

int kmeans_product_fit(const float *x, size_t n, int d, int k1, int k2, uint64_t seed, int max_iters, float *c1,
                       float *c2, int *assign, kmeans_result *res1, kmeans_result *res2) {
  if (d < 2) return dpc_err(DPC_EINVAL, "product k-means: the feature has %d dimension(s); it needs at least 2", d);
  const int d1 = d / 2, d2 = d - d1;
  float *h1 = calloc(n * (size_t)d1, sizeof *h1), *h2 = calloc(n * (size_t)d2, sizeof *h2);
  int *a1 = malloc(n * sizeof *a1), *a2 = malloc(n * sizeof *a2);
  int rc = 0;
  if (!h1 || !h2 || !a1 || !a2) rc = dpc_err(DPC_ENOMEM, "product k-means: out of memory for %zu points", n);
  for (size_t i = 0; !rc && i < n; i++) {
    memcpy(h1 + i * d1, x + i * d, (size_t)d1 * sizeof *h1);
    memcpy(h2 + i * d2, x + i * d + d1, (size_t)d2 * sizeof *h2);
  }
  if (!rc) rc = kmeans_fit(h1, n, d1, k1, seed, max_iters, c1, a1, res1);
  if (!rc) rc = kmeans_fit(h2, n, d2, k2, seed + 1, max_iters, c2, a2, res2);
  for (size_t i = 0; !rc && i < n; i++) assign[i] = a1[i] * k2 + a2[i];
  free(h1);
  free(h2);
  free(a1);
  free(a2);
  return rc;
}
