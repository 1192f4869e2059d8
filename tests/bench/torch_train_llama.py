#!/usr/bin/env python3
"""torch_train_llama.py — the PyTorch peer of `dipacoctl train` on a Llama-class model, for
tests/bench/cpu_train.sh's llama config.

The model is tests/oracle/llama_oracle.py's nn.Module (HF LlamaForCausalLM's definitions:
RMSNorm, rotate-half RoPE, grouped-query attention through repeat_kv, SwiGLU, tied or untied
head), built from a dipaco Llama model directory's config.json and loaded from its
model.safetensors (HF names, [out, in] weights, loaded as they are). It trains exactly as
tests/bench/torch_train.py's GPT-2 does (same shards, same batch order, AdamW with decay on the
2-D tensors, clip_grad_norm_, fixed thread count) and prints the same JSON line:
{"tokens_per_s": ..., "steps": ..., "step0_loss": ..., "final_loss": ...}.
Usage: torch_train_llama.py --init DIR --batch B --seq-len T --steps N --warmup-steps W
       --threads K --data SHARD..."""
import argparse, json, os, struct, sys
import numpy as np
import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "oracle"))
from torch_train import train  # noqa: E402
from llama_oracle import LlamaForCausalLM  # noqa: E402


class WithLoss(torch.nn.Module):
    """The oracle's module returns logits; train() wants forward(idx, targets) -> mean loss."""

    def __init__(s, m):
        super().__init__()
        s.m = m

    def forward(s, idx, targets):
        logits = s.m(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def keys_of(cfg):
    """The oracle's keys (llama_oracle.INT_KEYS / FLOAT_KEYS) from an HF config.json."""
    rs = cfg.get("rope_scaling") or {}
    if rs and rs.get("rope_type", rs.get("type")) != "llama3":
        raise SystemExit("torch_train_llama: rope_scaling %r is not supported" % rs)
    return {"n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"],
            "n_embd": cfg["hidden_size"], "n_positions": cfg["max_position_embeddings"],
            "vocab_size": cfg["vocab_size"], "n_kv_head": cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            "intermediate_size": cfg["intermediate_size"], "tie_word_embeddings": int(cfg.get("tie_word_embeddings", False)),
            "attention_bias": int(cfg.get("attention_bias", False)), "rope_scaling": 1 if rs else 0,
            "rope_original_max_position_embeddings": rs.get("original_max_position_embeddings", 0),
            "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6), "rope_theta": cfg.get("rope_theta", 10000.0),
            "rope_factor": rs.get("factor", 1.0), "rope_low_freq_factor": rs.get("low_freq_factor", 1.0),
            "rope_high_freq_factor": rs.get("high_freq_factor", 1.0)}


def load(d):
    """The module of dipaco Llama model directory d, with its weights (F32 safetensors)."""
    m = LlamaForCausalLM(keys_of(json.load(open(os.path.join(d, "config.json")))))
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    params = dict(m.named_parameters())
    seen = set()
    with torch.no_grad():
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            assert t["dtype"] == "F32", f"{name}: {t['dtype']} (F32 expected)"
            a, b = t["data_offsets"]
            params[name].copy_(torch.from_numpy(np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"]).copy()))
            seen.add(name)
    missing = set(params) - seen
    assert not missing, f"{d}: no tensors for {sorted(missing)}"
    return m


def main():
    ap = argparse.ArgumentParser()
    for k in ("batch", "seq_len", "steps", "warmup_steps", "threads"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, required=True)
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--init", required=True, help="dipaco Llama model directory to start from")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    train(WithLoss(load(a.init)), a)


if __name__ == "__main__":
    main()
