/* test_kmeans.c — DiPaCo routing pieces: k-means and product k-means recover planted
 * clusters exactly, are deterministic, refuse K > n and re-seed empty clusters; routing
 * features match a hand computation with gpt_hidden; router directories round-trip and
 * refuse another feature model; the linear (discriminative) router fits separable labels. */
#include "common/errors.h"
#include "kernels/gpt.h"
#include "kernels/kmeans.h"
#include "kernels/router.h"
#include "tests/unit/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Points around k well-separated centers, in an interleaved order; truth[i] is the center. */
static void planted(float *x, int *truth, size_t n, int d, int k, unsigned seed) {
  srand(seed);
  for (size_t i = 0; i < n; i++) {
    int c = (int)((i * 7 + i / 3) % (size_t)k);
    truth[i] = c;
    for (int j = 0; j < d; j++) {
      float center = (j % k == c ? 10.0f : 0.0f) + (float)c * (j == 0 ? 3.0f : 0.0f);
      x[i * d + j] = center + 0.1f * ((float)rand() / (float)RAND_MAX - 0.5f);
    }
  }
}

/* assign equals truth up to a relabelling. */
static int same_partition(const int *a, const int *b, size_t n, int k) {
  int map[64];
  for (int c = 0; c < k; c++) map[c] = -1;
  for (size_t i = 0; i < n; i++) {
    if (map[b[i]] < 0) map[b[i]] = a[i];
    if (map[b[i]] != a[i]) return 0;
  }
  for (int c = 0; c < k; c++)
    for (int e = c + 1; e < k; e++)
      if (map[c] >= 0 && map[c] == map[e]) return 0;
  return 1;
}

static void test_kmeans(void) {
  enum { N = 240, D = 8, K = 4 };
  static float x[N * D], cent[K * D], cent2[K * D];
  static int truth[N], a[N], a2[N];
  planted(x, truth, N, D, K, 1);
  kmeans_result r;
  CHECK_EQ_INT(kmeans_fit(x, N, D, K, 7, 0, cent, a, &r), 0);
  CHECK(same_partition(a, truth, N, K));
  CHECK_EQ_INT(r.converged, 1);
  /* Each centroid is the mean of its planted cluster. */
  for (int c = 0; c < K; c++) {
    double s = 0;
    int cnt = 0;
    for (size_t i = 0; i < N; i++)
      if (a[i] == c) s += x[i * D], cnt++;
    CHECK_NEAR(cent[c * D], s / cnt, 1e-4);
  }
  /* Deterministic for a seed. */
  CHECK_EQ_INT(kmeans_fit(x, N, D, K, 7, 0, cent2, a2, NULL), 0);
  CHECK(memcmp(cent, cent2, sizeof cent) == 0 && memcmp(a, a2, sizeof a) == 0);
  /* Nearest and runner-up. */
  int sec = -2, best = kmeans_nearest(cent, K, D, x, &sec);
  CHECK_EQ_INT(best, a[0]);
  CHECK(sec >= 0 && sec != best);
  /* K > n: a clear error. */
  CHECK_EQ_INT(kmeans_fit(x, 3, D, 4, 1, 0, cent, a, NULL), DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "4 clusters but only 3 sequences") != NULL);
  /* Duplicate points leave a cluster empty after seeding: it is re-seeded, every cluster is used. */
  float dup[5 * 2] = {0, 0, 0, 0, 0, 0, 5, 5, 5, 5};
  int da[5];
  float dc[3 * 2];
  CHECK_EQ_INT(kmeans_fit(dup, 5, 2, 3, 1, 0, dc, da, &r), 0);
  int used[3] = {0, 0, 0};
  for (int i = 0; i < 5; i++) used[da[i]]++;
  CHECK(used[0] > 0 && used[1] > 0 && used[2] > 0);
  CHECK(r.reseeds >= 1);
}

static void test_product(void) {
  /* 2 × 2 grid: the first half of the feature picks c1, the second c2. */
  enum { N = 200, D = 6 };
  static float x[N * D], c1[2 * 3], c2[2 * 3];
  static int t1[N], t2[N], a[N];
  for (size_t i = 0; i < N; i++) {
    t1[i] = (int)(i % 2);
    t2[i] = (int)((i / 2) % 2);
    for (int j = 0; j < D; j++) {
      float base = j < 3 ? (t1[i] ? 8.0f : -8.0f) : (t2[i] ? 4.0f : -4.0f);
      x[i * D + j] = base + 0.05f * (float)((i * 31 + j * 17) % 11) / 11.0f;
    }
  }
  kmeans_result r1, r2;
  CHECK_EQ_INT(kmeans_product_fit(x, N, D, 2, 2, 3, 0, c1, c2, a, &r1, &r2), 0);
  int want[N], a1[N], a2[N];
  for (size_t i = 0; i < N; i++) {
    want[i] = t1[i] * 2 + t2[i];
    a1[i] = a[i] / 2;
    a2[i] = a[i] % 2;
  }
  CHECK(same_partition(a1, t1, N, 2));
  CHECK(same_partition(a2, t2, N, 2));
  CHECK(same_partition(a, want, N, 4));
  /* The router gives the same path as the fit. */
  router r = {.kind = ROUTER_PRODUCT, .k1 = 2, .k2 = 2, .n_paths = 4, .dim = D, .prefix = 2, .c = c1, .c2 = c2};
  for (size_t i = 0; i < N; i++) {
    int sec = -1;
    CHECK_EQ_INT(router_route(&r, x + i * D, &sec), a[i]);
    CHECK(sec >= 0 && sec != a[i] && (sec / 2 == a[i] / 2 || sec % 2 == a[i] % 2));
  }
}

static void test_router_dir(void) {
  gpt_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 8, .n_positions = 8, .vocab_size = 16};
  static gpt_layout lay;
  CHECK_EQ_INT(gpt_layout_build(&cfg, &lay), 0);
  float *p = malloc(lay.n_params * sizeof *p);
  gpt_init_params(&lay, p, 3);
  gpt_model *m = NULL;
  gpt_backend_opts bo = {.kind = GPT_BACKEND_CPU, .threads = 1};
  CHECK_EQ_INT(gpt_create(&m, &cfg, &bo, 4, 4), 0);
  CHECK_EQ_INT(gpt_set_params(m, p, 0, lay.n_params), 0);
  /* Features of 5 sequences of 6 tokens over a prefix of 3, against a forward per sequence. */
  int seqs[5 * 6];
  for (int i = 0; i < 30; i++) seqs[i] = (i * 5 + 3) % 16;
  float feat[5 * 8], h[8];
  CHECK_EQ_INT(router_features(m, seqs, 5, 6, 3, feat, NULL, NULL), 0);
  for (int s = 0; s < 5; s++) {
    CHECK_EQ_INT(gpt_forward(m, seqs + s * 6, NULL, 1, 3, NULL), 0);
    double acc[8] = {0};
    for (int t = 0; t < 3; t++) {
      CHECK_EQ_INT(gpt_hidden(m, 0, t, h), 0);
      for (int j = 0; j < 8; j++) acc[j] += h[j];
    }
    for (int j = 0; j < 8; j++) CHECK_NEAR(feat[s * 8 + j], acc[j] / 3, 1e-6);
  }
  float cent[3 * 8];
  int a[5];
  CHECK_EQ_INT(kmeans_fit(feat, 5, 8, 3, 1, 0, cent, a, NULL), 0);
  router r = {.kind = ROUTER_KMEANS, .k = 3, .n_paths = 3, .dim = 8, .prefix = 3, .seed = 1, .model = cfg,
              .model_crc = router_model_crc(&lay, p), .c = cent};
  char dir[] = "/tmp/dpc_router_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  CHECK_EQ_INT(router_save(dir, &r), 0);
  router back;
  CHECK_EQ_INT(router_load(dir, &back), 0);
  CHECK_EQ_INT(back.kind, ROUTER_KMEANS);
  CHECK_EQ_INT(back.k, 3);
  CHECK_EQ_INT(back.prefix, 3);
  CHECK(back.c && memcmp(back.c, cent, sizeof cent) == 0);
  for (int s = 0; s < 5; s++) CHECK_EQ_INT(router_route(&back, feat + s * 8, NULL), a[s]);
  CHECK_EQ_INT(router_check_model(&back, &cfg, router_model_crc(&lay, p)), 0);
  p[0] += 1.0f;
  CHECK_EQ_INT(router_check_model(&back, &cfg, router_model_crc(&lay, p)), DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "other weights") != NULL);
  gpt_config other = cfg;
  other.n_layer = 2;
  CHECK_EQ_INT(router_check_model(&back, &other, 0), DPC_EINVAL);
  CHECK(strstr(dpc_errmsg(), "L=1") != NULL);
  router_free(&back);
  char f[256];
  snprintf(f, sizeof f, "%s/%s", dir, ROUTER_JSON);
  unlink(f);
  snprintf(f, sizeof f, "%s/%s", dir, ROUTER_WEIGHTS);
  unlink(f);
  rmdir(dir);
  gpt_free(m);
  free(p);
}

/* The discriminative router: a linear softmax classifier learns separable labels exactly, and
 * a linear router directory round-trips. */
static void test_linear(void) {
  enum { N = 300, D = 4, P = 3 };
  static float x[N * D], w[P * D], b[P];
  static int label[N];
  for (size_t i = 0; i < N; i++) {
    label[i] = (int)(i % P);
    for (int j = 0; j < D; j++) x[i * D + j] = (j == label[i] ? 2.0f : -1.0f) + 0.3f * (float)((i * 13 + j * 7) % 10) / 10.0f;
  }
  double acc = 0;
  CHECK_EQ_INT(router_fit_linear(x, label, N, D, P, 200, 0.05, 1e-4, w, b, &acc), 0);
  CHECK_NEAR(acc, 1.0, 1e-12);
  router r = {.kind = ROUTER_LINEAR, .n_paths = P, .dim = D, .prefix = 2, .model = {1, 1, D, 8, 16}, .c = w, .c2 = b};
  for (size_t i = 0; i < N; i++) {
    int sec = -1;
    CHECK_EQ_INT(router_route(&r, x + i * D, &sec), label[i]);
    CHECK(sec >= 0 && sec != label[i]);
  }
  char dir[] = "/tmp/dpc_router_lin_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  CHECK_EQ_INT(router_save(dir, &r), 0);
  router back;
  CHECK_EQ_INT(router_load(dir, &back), 0);
  CHECK_EQ_INT(back.kind, ROUTER_LINEAR);
  CHECK_EQ_INT(back.n_paths, P);
  CHECK(back.c && back.c2 && memcmp(back.c, w, sizeof w) == 0 && memcmp(back.c2, b, sizeof b) == 0);
  router_free(&back);
  int bad[2] = {0, 5};
  CHECK_EQ_INT(router_fit_linear(x, bad, 2, D, P, 10, 0.05, 0, w, b, NULL), DPC_EINVAL);
  char f[256];
  snprintf(f, sizeof f, "%s/%s", dir, ROUTER_JSON);
  unlink(f);
  snprintf(f, sizeof f, "%s/%s", dir, ROUTER_WEIGHTS);
  unlink(f);
  rmdir(dir);
}

int main(void) {
  test_linear();
  test_kmeans();
  test_product();
  test_router_dir();
  TEST_DONE();
}
