/* dipaco_dir.c — reading a DiPaCo model directory for the offline commands (dipaco_dir.h):
 * its dipaco.json, the router with its base (feature) model, and every path's parameters. */
#include "coordinator/ctl/dipaco_dir.h"

#include "common/errors.h"
#include "common/fsutil.h"
#include "kernels/modeldir.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIPACO_MAX_EVAL_PATHS 4096

void dipaco_dir_free(dipaco_dir *d) {
  router_free(&d->r);
  free(d->base);
  for (int p = 0; d->path && p < d->n_paths; p++) free(d->path[p]);
  free(d->path);
  memset(d, 0, sizeof *d);
}

int dipaco_dir_load(const char *dir, dipaco_dir *d) {
  memset(d, 0, sizeof *d);
  char f[4096];
  snprintf(f, sizeof f, "%s/%s", dir, DIPACO_MODEL_JSON);
  void *buf = NULL;
  size_t n = 0;
  int rc = dpc_read_file(f, 1 << 20, &buf, &n);
  if (rc) return rc;
  cJSON *root = cJSON_ParseWithLength(buf, n);
  free(buf);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
  const cJSON *paths = cJSON_GetObjectItemCaseSensitive(root, "paths");
  const cJSON *rt = cJSON_GetObjectItemCaseSensitive(root, "router");
  if (!root || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "dipaco-model") != 0)
    rc = dpc_err(DPC_EFORMAT, "%s: not a DiPaCo model directory (no \"format\": \"dipaco-model\")", f);
  else if (!cJSON_IsNumber(paths) || paths->valuedouble < 1 || paths->valuedouble > DIPACO_MAX_EVAL_PATHS)
    rc = dpc_err(DPC_EFORMAT, "%s: field \"paths\" must be an integer in [1, %d]", f, DIPACO_MAX_EVAL_PATHS);
  else if (!cJSON_IsString(rt))
    rc = dpc_err(DPC_EINVAL, "%s: the directory has no router (export with --all-paths --router ROUTER_DIR)", f);
  else {
    d->n_paths = (int)paths->valuedouble;
    snprintf(f, sizeof f, "%s/%s", dir, rt->valuestring);
  }
  cJSON_Delete(root);
  if (rc) return rc;
  if ((rc = router_load(f, &d->r))) return rc;
  if (d->r.n_paths != d->n_paths)
    return dpc_err(DPC_EINVAL, "%s routes to %d paths but %s holds %d", f, d->r.n_paths, dir, d->n_paths);
  char base[4200];
  snprintf(base, sizeof base, "%s/%s", f, ROUTER_BASE_DIR);
  if ((rc = modeldir_load(base, &d->base_cfg, &d->base))) return rc;
  static gpt_layout lay;
  if ((rc = gpt_layout_build(&d->base_cfg, &lay))) return rc;
  if ((rc = router_check_model(&d->r, &d->base_cfg, router_model_crc(&lay, d->base)))) return rc;
  if (!(d->path = calloc((size_t)d->n_paths, sizeof *d->path))) return dpc_err(DPC_ENOMEM, "out of memory");
  for (int p = 0; p < d->n_paths; p++) {
    gpt_config c;
    snprintf(f, sizeof f, "%s/path_%d", dir, p);
    if ((rc = modeldir_load(f, &c, &d->path[p]))) return rc;
    if (p == 0) d->cfg = c;
    else if (memcmp(&c, &d->cfg, sizeof c) != 0)
      return dpc_err(DPC_ESHAPE, "%s: another model shape than path_0 (every path of a DiPaCo model has one shape)", f);
  }
  return 0;
}

int dipaco_token_ce(gpt_model *m, int b, int t, int target, float *row, int V, double *ce) {
  int rc = gpt_logits(m, b, t, row);
  if (rc) return rc;
  double mx = row[0];
  for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
  double s = 0;
  for (int v = 0; v < V; v++) s += exp((double)row[v] - mx);
  *ce = mx + log(s) - (double)row[target];
  return 0;
}
