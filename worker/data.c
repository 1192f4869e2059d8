/* data.c — a lease's training files under --data-dir and its fragments' places in the path
 * buffer (data.h). */
#include "worker/data.h"
#include "common/errors.h"

#include <cjson/cJSON.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DATA_FILES 4096

/* ------------------------------------------------------------------------ data files */

void worker_free_paths(char **paths, int n) {
  if (!paths) return;
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

static int check_rel(const char *p) {
  if (!p[0]) return dpc_err(DPC_EINVAL, "job data: empty path");
  if (strlen(p) > 1024) return dpc_err(DPC_EINVAL, "job data: path longer than 1024 bytes");
  if (p[0] == '/') return dpc_err(DPC_EINVAL, "job data \"%s\": absolute paths are refused (paths are relative "
                                  "to --data-dir)", p);
  for (const char *s = p; *s; s++) {
    if ((unsigned char)*s < 0x20)
      return dpc_err(DPC_EINVAL, "job data \"%s\": control character in the path", p);
    if ((s == p || s[-1] == '/') && s[0] == '.' && s[1] == '.' && (s[2] == '/' || s[2] == 0))
      return dpc_err(DPC_EINVAL, "job data \"%s\": \"..\" may not leave --data-dir", p);
  }
  return 0;
}

/* A glob match must lie under --data-dir once resolved: glob's wildcards match ".." (".?" and
 * ".*" do) and a symlink may point anywhere, so the textual check of the pattern is not
 * enough. 0, or DPC_EINVAL naming the file and where it leads. */
static int check_inside(const char *root, const char *pat, const char *match) {
  char real[PATH_MAX];
  if (!realpath(match, real))
    return dpc_err(DPC_EIO, "job data \"%s\": cannot resolve %s", pat, match);
  size_t L = strlen(root);
  if (L > 1 && (strncmp(real, root, L) != 0 || (real[L] != '/' && real[L] != 0))) /* root "/" holds all */
    return dpc_err(DPC_EINVAL, "job data \"%s\": %s resolves to %s, outside --data-dir %s (refused)", pat, match,
                   real, root);
  return 0;
}

static int add_matches(const char *data_dir, const char *pat, char ***paths, int *n) {
  int rc = check_rel(pat);
  if (rc) return rc;
  char root[PATH_MAX];
  if (!realpath(data_dir, root)) return dpc_err(DPC_ENOENT, "job data: --data-dir %s does not exist", data_dir);
  size_t L = strlen(data_dir) + strlen(pat) + 2;
  char *full = malloc(L);
  if (!full) return dpc_err(DPC_ENOMEM, "job data: out of memory");
  snprintf(full, L, "%s/%s", data_dir, pat);
  glob_t g;
  memset(&g, 0, sizeof g);
  int grc = glob(full, 0, NULL, &g); /* results come sorted; unreadable dirs match nothing */
  if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
    rc = dpc_err(DPC_ENOENT, "job data \"%s\": matches no file under --data-dir %s (looked for %s)", pat, data_dir,
                 full);
  } else if (grc != 0) {
    rc = dpc_err(DPC_EIO, "job data \"%s\": cannot read %s (glob error %d)", pat, full, grc);
  } else if (*n + (long)g.gl_pathc > MAX_DATA_FILES) {
    rc = dpc_err(DPC_ERANGE, "job data: more than %d files", MAX_DATA_FILES);
  } else {
    char **np = realloc(*paths, (size_t)(*n + (int)g.gl_pathc) * sizeof *np);
    if (!np) rc = dpc_err(DPC_ENOMEM, "job data: out of memory");
    else {
      *paths = np;
      for (size_t i = 0; i < g.gl_pathc && !rc; i++) {
        if ((rc = check_inside(root, pat, g.gl_pathv[i]))) break;
        if (!(np[*n] = strdup(g.gl_pathv[i]))) rc = dpc_err(DPC_ENOMEM, "job data: out of memory");
        else (*n)++;
      }
    }
  }
  globfree(&g);
  free(full);
  return rc;
}

/* Add every string of JSON array `list` (field name `what`) under data_dir. */
static int add_list(const char *data_dir, const cJSON *list, const char *what, char ***paths, int *n) {
  if (!cJSON_IsArray(list)) return dpc_err(DPC_EFORMAT, "lease spec_json: \"%s\" is not an array", what);
  if (!list->child) return dpc_err(DPC_EINVAL, "lease spec_json: \"%s\" is empty", what);
  const cJSON *it;
  cJSON_ArrayForEach(it, list) {
    if (!cJSON_IsString(it)) return dpc_err(DPC_EFORMAT, "lease spec_json: \"%s\" holds a non-string", what);
    int rc = add_matches(data_dir, it->valuestring, paths, n);
    if (rc) return rc;
  }
  return 0;
}

int worker_resolve_data(const char *data_dir, const char *spec_json, int path, const char *fallback, char ***paths,
                        int *n) {
  *paths = NULL;
  *n = 0;
  int rc = 0, found = 0;
  cJSON *root = spec_json && spec_json[0] ? cJSON_Parse(spec_json) : NULL;
  if (spec_json && spec_json[0] && !root) return dpc_err(DPC_EFORMAT, "lease spec_json is not valid JSON");
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
  const cJSON *train = cJSON_GetObjectItemCaseSensitive(data, "train");
  const cJSON *per_path = cJSON_GetObjectItemCaseSensitive(data, "paths");
  if (per_path) {
    /* DiPaCo routed data: this slot's path reads only its own list. */
    char what[48];
    snprintf(what, sizeof what, "data.paths[%d]", path);
    if (!cJSON_IsArray(per_path)) rc = dpc_err(DPC_EFORMAT, "lease spec_json: \"data.paths\" is not an array");
    else if (path < 0 || path >= cJSON_GetArraySize(per_path))
      rc = dpc_err(DPC_EINVAL, "lease for path %d: the spec's data.paths has %d lists", path,
                   cJSON_GetArraySize(per_path));
    else rc = add_list(data_dir, cJSON_GetArrayItem(per_path, path), what, paths, n);
    found = 1;
  } else if (train && cJSON_IsArray(train) && train->child) {
    rc = add_list(data_dir, train, "data.train", paths, n);
    found = 1;
  } else if (train && !cJSON_IsArray(train))
    rc = dpc_err(DPC_EFORMAT, "lease spec_json: \"data.train\" is not an array");
  cJSON_Delete(root);
  if (!rc && !found) {
    if (fallback && fallback[0]) {
      /* DataWindow.dataset: the spec's data.train entries joined with ','. */
      char *copy = strdup(fallback), *save = NULL;
      if (!copy) rc = dpc_err(DPC_ENOMEM, "job data: out of memory");
      for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && !rc; tok = strtok_r(NULL, ",", &save))
        rc = add_matches(data_dir, tok, paths, n);
      if (!rc && *n == 0) rc = dpc_err(DPC_EINVAL, "lease: data.dataset \"%s\" names no path", fallback);
      free(copy);
    } else
      rc = dpc_err(DPC_EINVAL, "lease names no training data (spec_json data.train and data.dataset are empty)");
  }
  if (rc) {
    worker_free_paths(*paths, *n);
    *paths = NULL;
    *n = 0;
  }
  return rc;
}

/* ------------------------------------------------------------------------- placement */

int worker_place_fragments(size_t n, const uint32_t *level, const uint64_t *module, const uint64_t *off,
                           const uint64_t *len, size_t n_params, size_t *abs_off) {
  if (n == 0) return dpc_err(DPC_EFORMAT, "lease has no fragments");
  size_t *ord = malloc(n * sizeof *ord);
  if (!ord) return dpc_err(DPC_ENOMEM, "worker: out of memory");
  /* By offset (insertion sort: n is small); the fragments must then tile [0, n_params). */
  for (size_t i = 0; i < n; i++) ord[i] = i;
  for (size_t i = 1; i < n; i++) {
    size_t k = ord[i], j = i;
    while (j > 0 && off[ord[j - 1]] > off[k]) {
      ord[j] = ord[j - 1];
      j--;
    }
    ord[j] = k;
  }
  int rc = 0;
  uint64_t expect = 0;
  for (size_t q = 0; q < n && !rc; q++) {
    size_t i = ord[q], prev = q > 0 ? ord[q - 1] : i;
    if (len[i] == 0 || off[i] != expect || len[i] > n_params || expect + len[i] > n_params)
      rc = dpc_err(DPC_EFORMAT, "lease: fragment %zu covers [%" PRIu64 ", +%" PRIu64 ") of the path buffer, "
                   "expected it to start at %" PRIu64, i, off[i], len[i], expect);
    else if (level[i] < level[prev]) /* the path's modules lie in the layout level 0 first */
      rc = dpc_err(DPC_EFORMAT, "lease: fragment %zu (level %u) lies after a fragment of level %u in the layout", i,
                   level[i], level[prev]);
    else if (level[i] == level[prev] && module[i] != module[prev])
      rc = dpc_err(DPC_EFORMAT, "lease: modules %" PRIu64 " and %" PRIu64 " both at level %u (a path has one "
                   "module per level)", module[prev], module[i], level[i]);
    abs_off[i] = (size_t)off[i];
    expect += len[i];
  }
  if (!rc && expect != n_params)
    rc = dpc_err(DPC_EFORMAT, "lease: fragments cover %" PRIu64 " of the path's %zu parameters", expect, n_params);
  free(ord);
  return rc;
}
