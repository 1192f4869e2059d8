/* modeldir.h — a model directory: model.safetensors (Hugging Face tensor names, F32) plus
 * config.json (HF config keys), so an exported model loads in Hugging Face transformers and HF
 * checkpoints import (docs/design.md §6.3). Two families: GPT-2 (GPT2Config, Conv1D [in, out]
 * weights) and Llama (model_type "llama", LlamaForCausalLM, or "qwen2", Qwen2ForCausalLM, with
 * [out, in] weights; the config.json side is modeldir_hf.c).
 *
 * Loading accepts F32/BF16/F16 data, a single model.safetensors or the shards that
 * model.safetensors.index.json names (model.safetensors wins when both exist), GPT-2 names
 * with or without the "transformer." prefix, and skips the non-parameter buffers HF may store
 * ("h.N.attn.bias", "h.N.attn.masked_bias", "model.layers.N.self_attn.rotary_emb.inv_freq"); a
 * stored "lm_head.weight" of a tied model must equal the embeddings. Every tensor of the layout
 * must be present with the shape config.json implies, and nothing else may be: a mismatch means
 * the config and the weights disagree. Saving is deterministic and atomic per file (weights
 * first, then config.json), always one model.safetensors.
 *
 * Uses gpt_layout_build/gpt_layout_find from kernels/gpt_layout.c (library dpc_kernels). */
#ifndef DPC_MODELDIR_H
#define DPC_MODELDIR_H

#include "kernels/gpt.h"

#define MODELDIR_WEIGHTS "model.safetensors"
#define MODELDIR_CONFIG "config.json"
#define MODELDIR_MAX_CONFIG (1u << 20)

/* Read <dir>/config.json into *cfg. DPC_EFORMAT (bad JSON, missing or non-integer key),
 * DPC_EUNSUPPORTED (a variant dipaco does not compute, e.g. another activation, a sliding
 * window or an unknown Llama key, named in the message), DPC_EINVAL (sizes out of range). */
int modeldir_read_config(const char *dir, gpt_config *cfg);

/* Load a model directory: *cfg from config.json, *params (n_params floats in the canonical
 * layout, caller frees) from model.safetensors. Errors name the file and tensor:
 * DPC_ENOENT (missing file or tensor), DPC_ESHAPE (shape differs from config.json),
 * DPC_EUNSUPPORTED (dtype not F32/BF16/F16, a stored lm_head that differs from the tied
 * embeddings), DPC_EFORMAT (bad header or index, unknown or duplicate tensor), DPC_ENUMERIC
 * (NaN/Inf in a parameter). */
int modeldir_load(const char *dir, gpt_config *cfg, float **params);

/* Write <dir>/model.safetensors and <dir>/config.json (creating dir and parents) for params
 * (n_params floats, canonical layout). */
int modeldir_save(const char *dir, const gpt_config *cfg, const float *params);

#endif
