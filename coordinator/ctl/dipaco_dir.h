/* dipaco_dir.h — a DiPaCo model directory (kernels/router.h; written by `dipacoctl job export
 * --all-paths --router R`) as the offline commands read it: eval --dipaco (dipaco_eval.c),
 * route fit --discriminative (route_discriminative.c) and generate --dipaco (generate.c).
 *
 * Ownership: dipaco_dir_load fills a caller's dipaco_dir, which dipaco_dir_free releases
 * (also after a failed load). Thread-safety: none (single-threaded CLI). */
#ifndef DPC_CTL_DIPACO_DIR_H
#define DPC_CTL_DIPACO_DIR_H

#include "kernels/gpt.h"
#include "kernels/router.h"

typedef struct {
  int n_paths;
  router r;
  gpt_config base_cfg, cfg;
  float *base;  /* the router's feature model */
  float **path; /* path p's parameters */
} dipaco_dir;

/* Read DIR/dipaco.json, the router (checked against its base model) and every path (one
 * shape for all). 0 or a DPC_E* code with the message set. */
int dipaco_dir_load(const char *dir, dipaco_dir *d);
void dipaco_dir_free(dipaco_dir *d);

/* Cross-entropy, in double, of model m's logits row at (b, t) of its last forward against
 * `target`; row[V] is scratch. 0 or a DPC_E* code. */
int dipaco_token_ce(gpt_model *m, int b, int t, int target, float *row, int V, double *ce);

#endif
