/* test_formats_tool.c — a small driver for the python interop tests (tests/oracle/formats_*.py):
 *   load DIR OUT.bin                       modeldir_load; print the config, dump params (f32)
 *   save DIR L NH C maxT V SEED OUT.bin    gpt_init_params + modeldir_save; dump params
 *   batches B T R NB OUT.bin SHARD...      dataset_batch for b < NB, r < R; dump int32 inputs
 *                                          then targets per (b, r); print nb
 * On failure it prints "error <code>: <detail>" to stderr and exits 1. */
#include "common/dataset.h"
#include "common/errors.h"
#include "common/fsutil.h"
#include "kernels/modeldir.h"
#include "kernels/gpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(int rc) {
  fprintf(stderr, "error %d: %s\n", rc, dpc_errmsg());
  return 1;
}

int main(int argc, char **argv) {
  if (argc >= 4 && strcmp(argv[1], "load") == 0) {
    gpt_config c;
    float *p;
    int rc = modeldir_load(argv[2], &c, &p);
    if (rc) return fail(rc);
    static gpt_layout lay;
    if ((rc = gpt_layout_build(&c, &lay))) return fail(rc);
    printf("%d %d %d %d %d %zu\n", c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size, lay.n_params);
    rc = dpc_write_file_atomic(argv[3], p, lay.n_params * sizeof *p);
    free(p);
    return rc ? fail(rc) : 0;
  }
  if (argc == 10 && strcmp(argv[1], "save") == 0) {
    gpt_config c = {.n_layer = atoi(argv[3]), .n_head = atoi(argv[4]), .n_embd = atoi(argv[5]),
                    .n_positions = atoi(argv[6]), .vocab_size = atoi(argv[7])};
    static gpt_layout lay;
    int rc = gpt_layout_build(&c, &lay);
    if (rc) return fail(rc);
    float *p = malloc(lay.n_params * sizeof *p);
    gpt_init_params(&lay, p, strtoull(argv[8], NULL, 10));
    /* Make biases and LN parameters non-trivial so that a mix-up would show. */
    for (size_t i = 0; i < lay.n_params; i++) p[i] += 1e-4f * (float)(i % 101);
    rc = modeldir_save(argv[2], &c, p);
    if (!rc) rc = dpc_write_file_atomic(argv[9], p, lay.n_params * sizeof *p);
    free(p);
    return rc ? fail(rc) : 0;
  }
  if (argc >= 8 && strcmp(argv[1], "batches") == 0) {
    int B = atoi(argv[2]), T = atoi(argv[3]), R = atoi(argv[4]);
    long NB = atol(argv[5]);
    dataset *ds;
    int rc = dataset_open((const char *const *)argv + 7, argc - 7, &ds);
    if (rc) return fail(rc);
    printf("%ld\n", dataset_num_batches(ds, B, T));
    size_t bt = (size_t)B * T;
    int *buf = malloc(2 * bt * sizeof *buf * (size_t)(NB * R > 0 ? NB * R : 1));
    size_t off = 0;
    for (long b = 0; b < NB && !rc; b++)
      for (int r = 0; r < R && !rc; r++, off += 2 * bt) rc = dataset_batch(ds, B, T, b, r, R, buf + off, buf + off + bt);
    if (!rc) rc = dpc_write_file_atomic(argv[6], buf, off * sizeof *buf);
    free(buf);
    dataset_close(ds);
    return rc ? fail(rc) : 0;
  }
  fprintf(stderr, "usage: see the comment at the top of test_formats_tool.c\n");
  return 2;
}
