#!/usr/bin/python3
"""llama_ops_oracle.py — the PyTorch reference for the Llama-class leaf kernels
(kernels/cpu/llama_kernels.h, docs/design.md §3.12), written from Hugging Face transformers'
Llama definitions (LlamaRMSNorm, the default and "llama3" inverse frequencies of its rope
utilities, LlamaRotaryEmbedding, rotate_half / apply_rotary_pos_emb,
LlamaMLP's act_fn(gate) * up with SiLU, repeat_kv and the eager attention with a causal mask),
in float64, with torch autograd for every backward. transformers itself is not needed.

Used by tests/unit/test_llama_kernels.c: the C test writes a case into a directory
(config.txt of "key value" lines, float32 inputs in the C layouts: q [T, NH, D], k and v
[T, NKV, D], rows [T, C] or [T, I]) and this script writes float64 outputs:
  rms_out, rms_rstd, rms_dx, rms_dw            RMSNorm of x with w, grads for upstream rms_dy
  inv_freq, cos, sin                           inverse frequencies [D/2], tables [T, D/2]
  rope_q, rope_k, rope_dq, rope_dk             q, k rotated; grads for upstream rope_gq, rope_gk
  swi_h, swi_dgate, swi_dup                    silu(gate) * up; grads for upstream swi_dh
  att_out, att_p, att_dq, att_dk, att_dv       attention of aq, ak, av (probabilities
                                               [NH, T, T]); grads for upstream att_dout
  ar_out, ar_dq, ar_dk, ar_dv                  the same after rotating aq and ak (grads with
                                               respect to the unrotated inputs)
With "mode table" only inv_freq, cos and sin are written (long position ranges).
Usage: llama_ops_oracle.py DIR.   Exits non-zero on any error (missing torch included).
"""
import math
import os
import sys

import numpy as np
import torch

DT = torch.float64


def read_config(path):
    cfg = {}
    with open(path) as f:
        for line in f:
            k, v = line.split()
            cfg[k] = v
    return cfg


def load(d, name, shape):
    a = np.fromfile(os.path.join(d, name + ".bin"), dtype=np.float32)
    if a.size != int(np.prod(shape)):
        raise SystemExit("%s: %d floats, expected %s" % (name, a.size, shape))
    return torch.tensor(a.astype(np.float64), dtype=DT).reshape(shape)


def save(d, name, t):
    t.detach().to(DT).contiguous().numpy().astype(np.float64).tofile(os.path.join(d, "out_" + name + ".bin"))


# ---- Hugging Face definitions (float64 where HF computes in float32) ----------------------

def rms_norm(hidden_states, weight, eps):
    """LlamaRMSNorm.forward."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states


def default_inv_freq(base, dim):
    """_compute_default_rope_parameters (partial_rotary_factor 1)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=DT) / dim))


def llama3_inv_freq(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
    """_compute_llama3_parameters."""
    inv_freq = default_inv_freq(base, dim)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotary_cos_sin(inv_freq, T):
    """LlamaRotaryEmbedding.forward for position_ids [[0, T)] (attention_scaling 1 for both
    rope types): cos, sin [1, T, D]."""
    position_ids = torch.arange(T)[None, :]
    inv_freq_expanded = inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].to(DT)
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention(query, key, value, n_rep, scaling):
    """eager_attention_forward with the causal mask of LlamaModel (min float above the diagonal)
    and no dropout: returns attn_output [B, T, NH, D] and the probabilities [B, NH, T, T]."""
    key_states = repeat_kv(key, n_rep)
    value_states = repeat_kv(value, n_rep)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    T = query.shape[2]
    causal_mask = torch.full((T, T), torch.finfo(DT).min, dtype=DT).triu(1)[None, None]
    attn_weights = attn_weights + causal_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1, dtype=DT)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def silu_mul(gate, up):
    """LlamaMLP: act_fn(gate_proj(x)) * up_proj(x) with hidden_act silu."""
    return torch.nn.SiLU()(gate) * up


# ---- the case --------------------------------------------------------------------------

def inv_freq_of(cfg, D):
    theta = float(cfg["theta"])
    if cfg["rope_type"] == "llama3":
        return llama3_inv_freq(theta, D, float(cfg["factor"]), float(cfg["low_freq_factor"]),
                               float(cfg["high_freq_factor"]), float(cfg["original_max_position_embeddings"]))
    if cfg["rope_type"] != "default":
        raise SystemExit("unknown rope_type " + cfg["rope_type"])
    return default_inv_freq(theta, D)


def heads(x):
    """[T, H, D] (the C layout) -> HF's [1, H, T, D]."""
    return x[None].transpose(1, 2)


def attention_case(d, aq, ak, av, dout, cos, sin, NH, NKV, D, rope, prefix):
    aq, ak, av = (t.clone().requires_grad_(True) for t in (aq, ak, av))
    q, k = heads(aq), heads(ak)
    if rope:
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    out, probs = eager_attention(q, k, heads(av), NH // NKV, D ** -0.5)
    out = out[0]  # [T, NH, D]
    (out * dout).sum().backward()
    save(d, prefix + "out", out)
    if not rope:
        save(d, prefix + "p", probs[0])
    save(d, prefix + "dq", aq.grad)
    save(d, prefix + "dk", ak.grad)
    save(d, prefix + "dv", av.grad)


def main():
    d = sys.argv[1]
    cfg = read_config(os.path.join(d, "config.txt"))
    T, D = int(cfg["T"]), int(cfg["D"])
    inv_freq = inv_freq_of(cfg, D)
    cos, sin = rotary_cos_sin(inv_freq, T)
    save(d, "inv_freq", inv_freq)
    save(d, "cos", cos[0, :, : D // 2])
    save(d, "sin", sin[0, :, : D // 2])
    if cfg.get("mode") == "table":
        return
    NH, NKV, C, I, eps = int(cfg["NH"]), int(cfg["NKV"]), int(cfg["C"]), int(cfg["I"]), float(cfg["eps"])

    x = load(d, "rms_x", (T, C)).requires_grad_(True)
    w = load(d, "rms_w", (C,)).requires_grad_(True)
    y = rms_norm(x, w, eps)
    (y * load(d, "rms_dy", (T, C))).sum().backward()
    save(d, "rms_out", y)
    save(d, "rms_rstd", torch.rsqrt(x.detach().pow(2).mean(-1) + eps))
    save(d, "rms_dx", x.grad)
    save(d, "rms_dw", w.grad)

    q = load(d, "rope_q", (T, NH, D)).requires_grad_(True)
    k = load(d, "rope_k", (T, NKV, D)).requires_grad_(True)
    qe, ke = apply_rotary_pos_emb(heads(q), heads(k), cos, sin)
    qe, ke = qe[0].transpose(0, 1), ke[0].transpose(0, 1)  # back to [T, H, D]
    ((qe * load(d, "rope_gq", (T, NH, D))).sum() + (ke * load(d, "rope_gk", (T, NKV, D))).sum()).backward()
    save(d, "rope_q", qe)
    save(d, "rope_k", ke)
    save(d, "rope_dq", q.grad)
    save(d, "rope_dk", k.grad)

    gate = load(d, "swi_gate", (T, I)).requires_grad_(True)
    up = load(d, "swi_up", (T, I)).requires_grad_(True)
    h = silu_mul(gate, up)
    (h * load(d, "swi_dh", (T, I))).sum().backward()
    save(d, "swi_h", h)
    save(d, "swi_dgate", gate.grad)
    save(d, "swi_dup", up.grad)

    aq, ak, av = load(d, "att_q", (T, NH, D)), load(d, "att_k", (T, NKV, D)), load(d, "att_v", (T, NKV, D))
    dout = load(d, "att_dout", (T, NH, D))
    attention_case(d, aq, ak, av, dout, cos, sin, NH, NKV, D, False, "att_")
    attention_case(d, aq, ak, av, dout, cos, sin, NH, NKV, D, True, "ar_")


if __name__ == "__main__":
    main()
