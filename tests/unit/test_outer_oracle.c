/* test_outer_oracle.c — helper for tests/oracle/outer_oracle.py: runs the outer-optimizer
 * kernels on arrays the oracle wrote and writes the results back, so PyTorch can check them.
 *
 *   sync LEN NSLOTS ROUNDS LR MU NESTEROV IN OUT
 *     IN:  θ0 f32[LEN]; per round: weights f64[NSLOTS], deltas f32[NSLOTS][LEN]
 *     OUT: θ after each round f32[ROUNDS][LEN], then the momentum u f32[LEN]
 *   dn LEN NDELTAS N C LR MU IN OUT        (delayed Nesterov, one delta at a time)
 *   nesterov LEN NDELTAS LR MU IN OUT      (plain async Nesterov, one delta at a time)
 *   sgd LEN NDELTAS LR IN OUT              (plain async SGD, one delta at a time; no m)
 *     IN:  θ0 f32[LEN], deltas f32[NDELTAS][LEN]
 *     OUT: θ after each delta f32[NDELTAS][LEN], then m (or u) f32[LEN] */
#include "common/errors.h"
#include "kernels/outer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void rd(FILE *f, void *p, size_t n) {
  if (fread(p, 1, n, f) != n) {
    fprintf(stderr, "short input\n");
    exit(2);
  }
}

static void wr(FILE *f, const void *p, size_t n) {
  if (fwrite(p, 1, n, f) != n) {
    fprintf(stderr, "short output\n");
    exit(2);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  const char *mode = argv[1];
  if (strcmp(mode, "sync") == 0 && argc == 10) {
    size_t len = strtoull(argv[2], NULL, 10);
    int ns = atoi(argv[3]), rounds = atoi(argv[4]), nest = atoi(argv[7]);
    float lr = strtof(argv[5], NULL), mu = strtof(argv[6], NULL);
    FILE *in = fopen(argv[8], "rb"), *out = fopen(argv[9], "wb");
    if (!in || !out) return 2;
    float *th = malloc(len * 4), *u = calloc(len, 4), *avg = malloc(len * 4);
    float **d = malloc(ns * sizeof *d);
    double *w = malloc(ns * sizeof *w);
    for (int i = 0; i < ns; i++) d[i] = malloc(len * 4);
    rd(in, th, len * 4);
    for (int r = 0; r < rounds; r++) {
      rd(in, w, ns * sizeof *w);
      for (int i = 0; i < ns; i++) rd(in, d[i], len * 4);
      int rc = outer_average((const float *const *)d, w, ns, len, avg);
      if (rc) {
        fprintf(stderr, "outer_average: %s\n", dpc_errmsg());
        return 1;
      }
      outer_nesterov_step(th, u, avg, len, lr, mu, nest);
      wr(out, th, len * 4);
    }
    wr(out, u, len * 4);
    for (int i = 0; i < ns; i++) free(d[i]);
    free(d);
    free(w);
    free(th);
    free(u);
    free(avg);
    fclose(in);
    return fclose(out) == 0 ? 0 : 2;
  }
  if (strcmp(mode, "sgd") == 0 && argc == 7) {
    size_t len = strtoull(argv[2], NULL, 10);
    int nd = atoi(argv[3]);
    float lr = strtof(argv[4], NULL);
    FILE *in = fopen(argv[5], "rb"), *out = fopen(argv[6], "wb");
    if (!in || !out) return 2;
    float *th = malloc(len * 4), *g = malloc(len * 4);
    rd(in, th, len * 4);
    for (int t = 0; t < nd; t++) {
      rd(in, g, len * 4);
      outer_sgd_step(th, g, len, lr);
      wr(out, th, len * 4);
    }
    free(th);
    free(g);
    fclose(in);
    return fclose(out) == 0 ? 0 : 2;
  }
  int dn = strcmp(mode, "dn") == 0;
  if ((dn && argc == 10) || (strcmp(mode, "nesterov") == 0 && argc == 8)) {
    size_t len = strtoull(argv[2], NULL, 10);
    int nd = atoi(argv[3]);
    int N = dn ? atoi(argv[4]) : 1;
    double c = dn ? strtod(argv[5], NULL) : 0;
    float lr = strtof(argv[dn ? 6 : 4], NULL), mu = strtof(argv[dn ? 7 : 5], NULL);
    FILE *in = fopen(argv[dn ? 8 : 6], "rb"), *out = fopen(argv[dn ? 9 : 7], "wb");
    if (!in || !out) return 2;
    float *th = malloc(len * 4), *g = malloc(len * 4), *m = calloc(len, 4), *buf = calloc(len, 4);
    rd(in, th, len * 4);
    outer_dn_state s;
    if (dn && outer_dn_init(&s, buf, m, len, N, c, 0, 1)) {
      fprintf(stderr, "outer_dn_init: %s\n", dpc_errmsg());
      return 1;
    }
    for (int t = 0; t < nd; t++) {
      rd(in, g, len * 4);
      if (dn) {
        if (outer_dn_apply(&s, th, g, lr, mu) < 0) return 1;
      } else {
        outer_nesterov_step(th, m, g, len, lr, mu, 1);
      }
      wr(out, th, len * 4);
    }
    wr(out, m, len * 4);
    free(th);
    free(g);
    free(m);
    free(buf);
    fclose(in);
    return fclose(out) == 0 ? 0 : 2;
  }
  if (strcmp(mode, "merge") == 0 && argc == 6) {
    size_t len = strtoull(argv[2], NULL, 10);
    float alpha = strtof(argv[3], NULL);
    FILE *in = fopen(argv[4], "rb"), *out = fopen(argv[5], "wb");
    if (!in || !out) return 2;
    float *l = malloc(len * 4), *g = malloc(len * 4);
    rd(in, l, len * 4);
    rd(in, g, len * 4);
    if (outer_merge(l, g, len, alpha) < 0) return 1;
    wr(out, l, len * 4);
    free(l);
    free(g);
    fclose(in);
    return fclose(out) == 0 ? 0 : 2;
  }
  fprintf(stderr, "usage: see the header comment\n");
  return 2;
}
