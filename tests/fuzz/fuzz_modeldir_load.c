/* fuzz_modeldir_load.c — libFuzzer target: importing model weights (modeldir_load,
 * kernels/modeldir.c, on top of common/safetensors.c). The directory holds a fixed tiny
 * config.json (1 layer, n_embd 4, vocab 8, 4 positions); the input is model.safetensors.
 * An accepted model must give exactly the layout's n_params floats, all finite. */
#include "util.h"

#include "kernels/modeldir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static gpt_layout *g_lay;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  static const char cfg[] = "{\"n_layer\":1,\"n_head\":1,\"n_embd\":4,\"n_positions\":4,\"vocab_size\":8}";
  fz_write(MODELDIR_CONFIG, cfg, strlen(cfg));
  g_lay = malloc(sizeof *g_lay);
  gpt_config c = {.n_layer = 1, .n_head = 1, .n_embd = 4, .n_positions = 4, .vocab_size = 8};
  if (gpt_layout_build(&c, g_lay) != 0) fz_fail("layout of the fixed config");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_write(MODELDIR_WEIGHTS, data, size);
  gpt_config cfg;
  float *params = NULL;
  if (modeldir_load(fz_dir(), &cfg, &params) != 0) {
    if (params) fz_fail("params set on failure");
    return 0;
  }
  if (cfg.n_layer != 1 || cfg.n_embd != 4 || cfg.vocab_size != 8) fz_fail("config changed");
  for (size_t i = 0; i < g_lay->n_params; i++)
    if (!isfinite(params[i])) fz_fail("non-finite parameter %zu accepted", i);
  free(params);
  return 0;
}
