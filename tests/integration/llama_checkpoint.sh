#!/usr/bin/env bash
# llama_checkpoint.sh COORDINATOR WORKER DIPACOCTL — a downloaded-style Hugging Face checkpoint
# through the daemons and back: the test writes a Llama directory as HF hub repositories ship
# them (BF16, two shards and model.safetensors.index.json, untied head, GQA, llama3 RoPE
# scaling, a LlamaConfig with the keys HF writes), `dipacoctl job create` takes it as model.init,
# 2 workers train one DiLoCo round, and `job export` must give: version 0 equal to the BF16
# values widened to F32; tensors under exactly HF's names and shapes (loaded strictly into the
# LlamaForCausalLM of tests/oracle/llama_oracle.py); a config.json with only LlamaConfig keys
# and the checkpoint's values; and round 1 equal to the PyTorch DiLoCo reference
# (tests/oracle/diloco_ref.py) to 1e-4 relative.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs llama_checkpoint 30 "$@"; }

make_corpus "$W/corpus"
$PY - "$W/hf" <<'PY' || fail "writing the checkpoint"
import json, os, struct, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d)
L, C, NH, NKV, I, V, T = 2, 32, 4, 2, 64, 256, 32
D = C // NH
cfg = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
       "eos_token_id": 2, "head_dim": D, "hidden_act": "silu", "hidden_size": C, "initializer_range": 0.02,
       "intermediate_size": I, "max_position_embeddings": T, "mlp_bias": False, "model_type": "llama",
       "num_attention_heads": NH, "num_hidden_layers": L, "num_key_value_heads": NKV, "pretraining_tp": 1,
       "rms_norm_eps": 1e-06, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
       "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "rope_theta": 500000.0,
       "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.45.0", "use_cache": True,
       "vocab_size": V}
json.dump(cfg, open(d + "/config.json", "w"), indent=2)
rng = np.random.default_rng(3)
def t(*shape, std=0.02):
    return rng.normal(0, std, shape).astype(np.float32)
shards = [{"model.embed_tokens.weight": t(V, C)}, {}]
for l in range(L):
    p = f"model.layers.{l}."
    s = shards[l]
    s[p + "input_layernorm.weight"] = 1 + t(C, std=0.1)
    s[p + "self_attn.q_proj.weight"] = t(NH * D, C)
    s[p + "self_attn.k_proj.weight"] = t(NKV * D, C)
    s[p + "self_attn.v_proj.weight"] = t(NKV * D, C)
    s[p + "self_attn.o_proj.weight"] = t(C, NH * D)
    s[p + "post_attention_layernorm.weight"] = 1 + t(C, std=0.1)
    s[p + "mlp.gate_proj.weight"] = t(I, C)
    s[p + "mlp.up_proj.weight"] = t(I, C)
    s[p + "mlp.down_proj.weight"] = t(C, I)
shards[1]["model.norm.weight"] = 1 + t(C, std=0.1)
shards[1]["lm_head.weight"] = t(V, C)
def bf16(a):  # round to nearest even, as torch's .to(torch.bfloat16)
    u = a.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
weight_map, total = {}, 0
for i, s in enumerate(shards):
    name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    hdr, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for k in sorted(s):  # hub files list tensors by name, not in layer order
        b = bf16(s[k]).tobytes()
        hdr[k] = {"dtype": "BF16", "shape": list(s[k].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b); weight_map[k] = name; total += len(b)
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    open(os.path.join(d, name), "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
          open(d + "/model.safetensors.index.json", "w"), indent=2)
PY
cat > "$W/spec.json" <<JSON
{"name": "llama-ckpt", "model": {"init": "hf"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 2, "rounds": 1, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 1, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 1.0, "state": "keep"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}, "versions": {"keep_last": 2, "keep_every": 1}}
JSON
start_coordinator "$W/state" --lease-ttl-ms 20000
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create with the BF16 sharded model.init"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --version 0 --out "$W/v0" >/dev/null || fail "export of version 0"
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 120 || fail "job did not finish"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export" || fail "export"
$PY - "$HERE/../oracle" "$W/hf" "$W/v0" "$W/export" <<'PY' || fail "the export is not the checkpoint's HF layout"
import json, struct, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[1])
from llama_oracle import LlamaForCausalLM
from diloco_ref import llama_module
hf, v0, out = sys.argv[2:5]
def read(path):
    raw = open(path, "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); hdr = json.loads(raw[8:8 + n])
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in hdr.items() if k != "__metadata__"}
src = {}
for shard in sorted(set(json.load(open(hf + "/model.safetensors.index.json"))["weight_map"].values())):
    src.update(read(f"{hf}/{shard}"))
for d in (v0, out):
    got = read(d + "/model.safetensors")
    assert sorted(got) == sorted(src), f"{d}: names {sorted(set(got) ^ set(src))} differ from the checkpoint's"
    for k, (dt, shape, _) in got.items():
        assert dt == "F32" and shape == src[k][1], f"{d}: {k} is {dt} {shape}, the checkpoint {src[k][1]}"
# Version 0 is the BF16 checkpoint widened exactly.
g0 = read(v0 + "/model.safetensors")
for k, (_, _, b) in src.items():
    want = (np.frombuffer(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(np.frombuffer(g0[k][2], dtype=np.float32), want), f"version 0: {k} differs from BF16"
# config.json: only LlamaConfig keys, the checkpoint's values for every key that shapes the model.
LLAMA_KEYS = {"architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim",
              "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
              "mlp_bias", "model_type", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
              "pretraining_tp", "rms_norm_eps", "rope_scaling", "rope_theta", "tie_word_embeddings", "torch_dtype",
              "transformers_version", "use_cache", "vocab_size"}
c_in, c_out = json.load(open(hf + "/config.json")), json.load(open(out + "/config.json"))
assert set(c_out) <= LLAMA_KEYS, f"keys HF's LlamaConfig does not have: {set(c_out) - LLAMA_KEYS}"
for k in ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
          "rope_theta", "rope_scaling", "tie_word_embeddings", "hidden_act", "attention_bias", "mlp_bias", "head_dim"):
    assert c_out.get(k) == c_in[k], f"config.json {k}: {c_out.get(k)!r}, the checkpoint {c_in[k]!r}"
assert c_out["torch_dtype"] == "float32"
# The export loads strictly (every name and shape HF's, nothing more) into the PyTorch module.
m = llama_module(c_out)
sd = {k: torch.from_numpy(np.frombuffer(b, dtype=np.float32).copy()).view(s) for k, (_, s, b) in read(out + "/model.safetensors").items()}
m.load_state_dict(sd, strict=True)
print(f"llama_checkpoint: {len(sd)} tensors under HF's names and shapes, config.json keys {len(c_out)} (all LlamaConfig's)")
PY
$PY "$HERE/../oracle/diloco_ref.py" --init "$W/v0" --data "$W/corpus/data/train_000.bin" --spec "$W/spec.json" \
  --compare "$W/export" --tol 1e-4 || fail "round 1 differs from the PyTorch reference"
echo "llama_checkpoint: PASS"
