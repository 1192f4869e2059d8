/* s3_write_bench.c — the coordinator's blob writer on an S3 store (coordinator/blobs_s3.c:
 * a multipart upload in 16 MiB parts, each with its Content-MD5, several in flight), timed
 * writing one blob of MiB mebibytes, repeated; tests/bench/s3_write.sh runs it beside curl's
 * single PUT of the same bytes to the same gateway.
 *   s3_write_bench MiB REPEATS     (S3_ENDPOINT, AWS_* and S3_BENCH_URL = s3://BUCKET/PREFIX)
 * Prints one line per write: "write MiB SECONDS". */
#include "common/errors.h"
#include "coordinator/blobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  long mib = argc == 3 ? atol(argv[1]) : 0, reps = argc == 3 ? atol(argv[2]) : 0;
  if (mib <= 0 || mib > 65536 || reps <= 0 || reps > 1000 || !getenv("S3_ENDPOINT") || !getenv("S3_BENCH_URL")) {
    fprintf(stderr, "usage: S3_ENDPOINT=… S3_BENCH_URL=s3://BUCKET/PREFIX s3_write_bench MiB REPEATS\n");
    return 2;
  }
  s3_options o = {.url = getenv("S3_BENCH_URL"), .endpoint = getenv("S3_ENDPOINT")};
  blob_store *bs = NULL;
  if (blob_store_open_s3(&o, &bs)) {
    fprintf(stderr, "s3_write_bench: %s\n", dpc_errmsg());
    return 1;
  }
  size_t n = (size_t)mib << 18;
  float *x = malloc(n * sizeof *x);
  if (!x) return 1;
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 1000003) * 1e-3f;
  int rc = 0;
  for (long r = 0; r < reps && !rc; r++) {
    char name[64];
    snprintf(name, sizeof name, "1/f0-v%ld.params", r + 1);
    double t0 = now();
    rc = blob_write(bs, name, BLOB_PARAMS, x, n, NULL);
    double t1 = now();
    if (rc) fprintf(stderr, "s3_write_bench: %s\n", dpc_errmsg());
    else printf("write %ld %.3f\n", mib, t1 - t0);
    fflush(stdout);
    (void)blob_delete(bs, name);
  }
  free(x);
  blob_store_close(bs);
  return rc ? 1 : 0;
}
