/* jobspec.c — the module / path / fragment structure a job spec gives (jobspec.h), and whether
 * it streams. Reading, validating and writing specs: the other jobspec*.c files
 * (jobspec_fields.h maps them). */
#include "coordinator/jobspec.h"
#include "common/errors.h"
#include "kernels/outer.h"

#include <string.h>

/* ---- sparse and streaming ------------------------------------------------------------- */

int jobspec_sparse_pull(const jobspec *js) { return js->sparse.enabled && js->outer.momentum == 0.0; }

static int schedule_applies(const jobspec *js) {
  return js->algorithm != JOB_ALGO_DILOCO_ASYNC && js->outer.momentum > 0.0 && !js->streaming.eager;
}

/* outer_default_schedule in long: rounds is not range-checked yet here. */
static int default_warmup(const jobspec *js) {
  long w, d;
  outer_default_schedule(js->rounds, &w, &d);
  return (int)w;
}
static int default_decay(const jobspec *js) {
  long w, d;
  outer_default_schedule(js->rounds, &w, &d);
  return (int)d;
}

void jobspec_derive_schedule(jobspec *js) {
  const int on = schedule_applies(js);
  if (!js->outer.has_momentum_warmup) js->outer.momentum_warmup = on ? default_warmup(js) : 0;
  if (!js->outer.has_momentum_decay) js->outer.momentum_decay = on ? default_decay(js) : 0;
  if (on) js->outer.has_momentum_warmup = js->outer.has_momentum_decay = 1;
}

int jobspec_schedule_is_derived(const jobspec *js) {
  return schedule_applies(js) && js->outer.momentum_warmup == default_warmup(js) &&
         js->outer.momentum_decay == default_decay(js);
}

int jobspec_replay_pull(const jobspec *js) {
  return js->pulls.replay && js->algorithm != JOB_ALGO_DILOCO_ASYNC && !js->streaming.eager;
}

int jobspec_streaming(const jobspec *js) {
  return js->streaming.fragments > 1 || js->streaming.overlap_steps > 0 || js->streaming.alpha != 0 ||
         js->streaming.eager;
}

int jobspec_streaming_offset(const jobspec *js, int group) {
  return (int)((long)group * js->inner_steps / (js->streaming.fragments > 0 ? js->streaming.fragments : 1));
}

/* ---- structure ------------------------------------------------------------------------- */

int jobspec_path_data(const jobspec *js, int path, const char (**first)[JOBSPEC_PATH_MAX]) {
  if (js->n_data_paths == 0) {
    *first = js->train;
    return js->n_train;
  }
  if (path < 0 || path >= js->n_data_paths) return dpc_err(DPC_ERANGE, "path %d: the spec has %d data.paths lists", path, js->n_data_paths);
  *first = &js->path_glob[js->path_first[path]];
  return js->path_first[path + 1] - js->path_first[path];
}

long jobspec_total_steps(const jobspec *js) { return (long)js->rounds * js->inner_steps; }

int jobspec_n_modules(const jobspec *js) {
  int n = 0;
  for (int l = 0; l < js->n_levels; l++) n += js->levels[l].n_modules;
  return n;
}

int jobspec_n_paths(const jobspec *js) {
  int p = 1;
  for (int l = 0; l < js->n_levels; l++) p *= js->levels[l].n_modules;
  return p;
}

int jobspec_n_slots(const jobspec *js) { return jobspec_n_paths(js) * js->replicas; }

int jobspec_path_modules(const jobspec *js, int path, int *mods) {
  int P = jobspec_n_paths(js);
  if (path < 0 || path >= P) return dpc_err(DPC_ERANGE, "path %d out of range [0, %d)", path, P);
  int first[JOBSPEC_MAX_LEVELS], acc = 0;
  for (int l = 0; l < js->n_levels; l++) {
    first[l] = acc;
    acc += js->levels[l].n_modules;
  }
  int rest = path;
  for (int l = js->n_levels - 1; l >= 0; l--) {
    int K = js->levels[l].n_modules;
    mods[l] = first[l] + rest % K;
    rest /= K;
  }
  return js->n_levels;
}

int jobspec_path_has_module(const jobspec *js, int path, int module) {
  int mods[JOBSPEC_MAX_LEVELS];
  int n = jobspec_path_modules(js, path, mods);
  for (int l = 0; l < n; l++)
    if (mods[l] == module) return 1;
  return 0;
}

int jobspec_layout(const jobspec *js, gpt_layout *lay) {
  if (!js->has_shape) return dpc_err(DPC_ESTATE, "job \"%s\": model shape unknown until model.init is resolved", js->name);
  return gpt_layout_build(&js->model, lay);
}

static int check_lay(const jobspec *js, const gpt_layout *lay) {
  if (!js->has_shape) return dpc_err(DPC_ESTATE, "job \"%s\": model shape unknown until model.init is resolved", js->name);
  if (memcmp(&lay->cfg, &js->model, sizeof lay->cfg) != 0)
    return dpc_err(DPC_ESHAPE, "job \"%s\": layout is for a different model", js->name);
  if (js->levels[js->n_levels - 1].layer_end != lay->cfg.n_layer)
    return dpc_err(DPC_ESHAPE, "job \"%s\": levels do not cover the model's %d layers", js->name, lay->cfg.n_layer);
  return 0;
}

int jobspec_modules(const jobspec *js, const gpt_layout *lay, jobspec_module *out, int cap) {
  int rc = check_lay(js, lay);
  if (rc < 0) return rc;
  int n = 0;
  for (int l = 0; l < js->n_levels; l++) {
    const jobspec_level *L = &js->levels[l];
    size_t lo = L->stem ? 0 : lay->layer_off[L->layer_begin];
    size_t hi = lay->layer_off[L->layer_end];
    for (int k = 0; k < L->n_modules; k++, n++)
      if (n < cap) out[n] = (jobspec_module){.id = n, .level = l, .index = k, .offset = lo, .len = hi - lo};
  }
  return n;
}

int jobspec_fragments(const jobspec *js, const gpt_layout *lay, jobspec_fragment *out, int cap) {
  int rc = check_lay(js, lay);
  if (rc < 0) return rc;
  /* Without streaming a module is one fragment, with the module's id. With streaming, module
   * by module: its stem (level 0: group 0), then each of its layers l (group l mod F). */
  const int streaming = jobspec_streaming(js), F = js->streaming.fragments;
  int n = 0, m = 0;
  for (int l = 0; l < js->n_levels; l++) {
    const jobspec_level *L = &js->levels[l];
    size_t lo = L->stem ? 0 : lay->layer_off[L->layer_begin];
    size_t hi = lay->layer_off[L->layer_end];
    for (int k = 0; k < L->n_modules; k++, m++) {
      if (!streaming) {
        if (n < cap) out[n] = (jobspec_fragment){.id = n, .module = m, .offset = lo, .len = hi - lo};
        n++;
        continue;
      }
      if (L->stem) {
        if (n < cap) out[n] = (jobspec_fragment){.id = n, .module = m, .offset = 0, .len = lay->stem_end};
        n++;
      }
      for (int y = L->layer_begin; y < L->layer_end; y++, n++)
        if (n < cap)
          out[n] = (jobspec_fragment){.id = n, .module = m, .offset = lay->layer_off[y],
                                      .len = lay->layer_off[y + 1] - lay->layer_off[y], .group = y % F};
    }
  }
  return n;
}
