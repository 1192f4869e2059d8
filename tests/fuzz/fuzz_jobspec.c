/* fuzz_jobspec.c — libFuzzer target: the job spec JSON (coordinator/jobspec.c). An accepted
 * spec must re-validate, its canonical JSON must parse back to an identical struct and be a
 * fixed point of parse/print, and with a shape its module/fragment structure must tile the
 * model: modules contiguous, non-empty, inside the layout; fragments inside their modules. */
#include "util.h"

#include "common/errors.h"
#include "coordinator/jobspec.h"

#include <stdlib.h>
#include <string.h>

static gpt_layout *g_lay;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  g_lay = malloc(sizeof *g_lay);
  return 0;
}

static void check_structure(const jobspec *js) {
  if (jobspec_layout(js, g_lay) != 0) fz_fail("no layout for a valid spec");
  int nm = jobspec_modules(js, g_lay, NULL, 0);
  int nf = jobspec_fragments(js, g_lay, NULL, 0);
  if (nm <= 0 || nm != jobspec_n_modules(js) || nm > JOBSPEC_MAX_MODULES) fz_fail("module count %d", nm);
  if (nf < nm) fz_fail("fragment count %d < modules %d", nf, nm);
  jobspec_module *m = calloc((size_t)nm, sizeof *m);
  jobspec_fragment *f = calloc((size_t)nf, sizeof *f);
  if (jobspec_modules(js, g_lay, m, nm) != nm || jobspec_fragments(js, g_lay, f, nf) != nf)
    fz_fail("second structure call differs");
  for (int i = 0; i < nm; i++) {
    if (m[i].id != i || m[i].offset + m[i].len > g_lay->n_params) fz_fail("module %d outside the layout", i);
    if (m[i].level < 0 || m[i].level >= js->n_levels) fz_fail("module %d level %d", i, m[i].level);
  }
  for (int i = 0; i < nf; i++) {
    if (f[i].id != i || f[i].module < 0 || f[i].module >= nm) fz_fail("fragment %d module %d", i, f[i].module);
    const jobspec_module *mm = &m[f[i].module];
    if (f[i].offset < mm->offset || f[i].offset + f[i].len > mm->offset + mm->len)
      fz_fail("fragment %d outside module %d", i, f[i].module);
  }
  int np = jobspec_n_paths(js);
  if (np <= 0 || np > JOBSPEC_MAX_PATHS) fz_fail("path count %d", np);
  int mods[JOBSPEC_MAX_LEVELS];
  for (int p = 0; p < np && p < 64; p++) {
    if (jobspec_path_modules(js, p, mods) != js->n_levels) fz_fail("path %d", p);
    for (int l = 0; l < js->n_levels; l++) {
      if (mods[l] < 0 || mods[l] >= nm || m[mods[l]].level != l) fz_fail("path %d level %d module %d", p, l, mods[l]);
      if (!jobspec_path_has_module(js, p, mods[l])) fz_fail("path_has_module disagrees");
    }
  }
  if (jobspec_path_modules(js, np, mods) >= 0) fz_fail("path %d past the end accepted", np);
  free(m);
  free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  jobspec *a = malloc(sizeof *a), *b = malloc(sizeof *b);
  char *j1 = NULL, *j2 = NULL;
  if (jobspec_parse((const char *)data, size, a) != 0) goto out;
  if (jobspec_validate(a) != 0) fz_fail("parsed spec does not validate: %s", dpc_errmsg());
  if (jobspec_to_json(a, &j1) != 0) fz_fail("to_json failed");
  if (jobspec_parse(j1, strlen(j1), b) != 0) fz_fail("canonical JSON does not parse: %s\n%s", dpc_errmsg(), j1);
  if (memcmp(a, b, sizeof *a) != 0) fz_fail("canonical JSON parses to a different spec:\n%s", j1);
  if (jobspec_to_json(b, &j2) != 0 || strcmp(j1, j2) != 0) fz_fail("canonical JSON is not a fixed point:\n%s\n%s", j1, j2);
  if (a->has_shape) check_structure(a);
out:
  free(j1);
  free(j2);
  free(a);
  free(b);
  return 0;
}
