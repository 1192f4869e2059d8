/* modeldir_hf.h — the Hugging Face Llama-family side of a model directory (docs/design.md
 * §6.3): a LlamaConfig / Qwen2Config config.json to and from gpt_config, and the shard list of
 * model.safetensors.index.json. Used by kernels/modeldir.c only. */
#ifndef DPC_MODELDIR_HF_H
#define DPC_MODELDIR_HF_H

#include "kernels/gpt.h"

#include <cjson/cJSON.h>
#include <stddef.h>

#define MODELDIR_INDEX "model.safetensors.index.json"

/* Fill *cfg (arch llama) from a config.json whose model_type is "llama" or "qwen2". Every key
 * dipaco cannot compute exactly is refused, naming the key and its file `path`: DPC_EUNSUPPORTED
 * (another activation, sliding windows, other RoPE scalings, mlp_bias, head_dim != hidden/heads,
 * an unknown key), DPC_EFORMAT (a missing or mistyped key), DPC_EINVAL (sizes out of range). */
int modeldir_hf_read_config(const char *path, const cJSON *root, gpt_config *cfg);

/* config.json text for a Llama-family cfg into buf[cap]: model_type "llama"
 * (LlamaForCausalLM), or "qwen2" (Qwen2ForCausalLM) when cfg has q/k/v biases, since HF's Llama
 * attention_bias also gives o_proj one. Returns the length, or DPC_EINVAL when it does not fit. */
int modeldir_hf_config_json(const gpt_config *cfg, char *buf, size_t cap);

/* The distinct shard files of <dir>/model.safetensors.index.json's weight_map, in first-seen
 * order, as malloc'd names into *files (free each and the array). Names must be plain file
 * names. DPC_ENOENT (no index), DPC_EFORMAT (bad JSON, no weight_map, a bad file name). */
int modeldir_hf_shards(const char *dir, char ***files, int *n);

#endif
