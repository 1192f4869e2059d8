/* fuzz_modeldir_config.c — libFuzzer target: a model directory's config.json
 * (modeldir_read_config, kernels/modeldir.c). The input is the file; an accepted config must
 * be a valid GPT config from which the canonical layout builds. */
#include "util.h"

#include "kernels/modeldir.h"

#include <stdlib.h>

static gpt_layout *g_lay;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  g_lay = malloc(sizeof *g_lay);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_write(MODELDIR_CONFIG, data, size);
  gpt_config cfg;
  if (modeldir_read_config(fz_dir(), &cfg) != 0) return 0;
  if (gpt_config_validate(&cfg) != 0) fz_fail("accepted config does not validate");
  if (gpt_layout_build(&cfg, g_lay) != 0) fz_fail("accepted config has no layout");
  if (g_lay->n_params == 0 || g_lay->layer_off[cfg.n_layer] != g_lay->n_params) fz_fail("layout inconsistent");
  return 0;
}
