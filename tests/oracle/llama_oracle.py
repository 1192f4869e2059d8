#!/usr/bin/python3
"""llama_oracle.py — the whole-model PyTorch reference for the Llama family of kernels/gpt.h
(docs/design.md §3.12): an nn.Module written from Hugging Face transformers' LlamaForCausalLM
definitions (LlamaRMSNorm, LlamaRotaryEmbedding with the default and "llama3" inverse
frequencies, rotate_half / apply_rotary_pos_emb, repeat_kv, the eager attention with a causal
mask, LlamaMLP with SiLU, tied or untied lm_head, Qwen2's q/k/v biases), in float32 as HF runs
it, with parameters under HF's names. transformers itself is not needed.

The one deliberate difference: the RoPE cos/sin tables are computed in float64 and rounded
once to float32, as kernels/cpu/llama_kernels.c does (HF computes them in float32, which
differs only by that rounding; tests/oracle/llama_ops_oracle.py checks the formulas).

Used by tests/unit/test_llama_oracle.c, with the same files as tests/oracle/gpt_oracle.py
(config.txt, params.bin in the canonical flat layout, inputs.bin/targets.bin) and the same
outputs (out_loss0, out_grads0, out_logits0, out_lrs, out_norms, out_losses, out_params, out_m,
out_v). config.txt adds arch llama and the Llama keys.
Usage: llama_oracle.py DIR.   Exits non-zero on any error (missing torch included).
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_oracle import lr_at, read_config  # noqa: E402


class RMSNorm(nn.Module):
    """LlamaRMSNorm."""

    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


def inv_freq_of(k, D):
    """_compute_default_rope_parameters / _compute_llama3_parameters, in float64."""
    inv_freq = 1.0 / (k["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).to(torch.float64) / D))
    if k["rope_scaling"] != 1:
        return inv_freq
    factor, low, high = k["rope_factor"], k["rope_low_freq_factor"], k["rope_high_freq_factor"]
    old = k["rope_original_max_position_embeddings"]
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(hidden_states, n_rep):
    b, nkv, T, D = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(b, nkv, n_rep, T, D)
    return hidden_states.reshape(b, nkv * n_rep, T, D)


class Attention(nn.Module):
    def __init__(self, k):
        super().__init__()
        C, NH, NKV = k["n_embd"], k["n_head"], k["n_kv_head"]
        self.NH, self.NKV, self.D = NH, NKV, C // NH
        bias = k["attention_bias"] == 1
        self.q_proj = nn.Linear(C, NH * self.D, bias=bias)
        self.k_proj = nn.Linear(C, NKV * self.D, bias=bias)
        self.v_proj = nn.Linear(C, NKV * self.D, bias=bias)
        self.o_proj = nn.Linear(NH * self.D, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.NH, self.D).transpose(1, 2)
        kk = self.k_proj(x).view(B, T, self.NKV, self.D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.NKV, self.D).transpose(1, 2)
        q = (q * cos) + (rotate_half(q) * sin)
        kk = (kk * cos) + (rotate_half(kk) * sin)
        kk = repeat_kv(kk, self.NH // self.NKV)
        v = repeat_kv(v, self.NH // self.NKV)
        att = torch.matmul(q, kk.transpose(2, 3)) * (self.D ** -0.5)
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1, dtype=torch.float32)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, self.NH * self.D)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, C, I):
        super().__init__()
        self.gate_proj = nn.Linear(C, I, bias=False)
        self.up_proj = nn.Linear(C, I, bias=False)
        self.down_proj = nn.Linear(I, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, k):
        super().__init__()
        C, eps = k["n_embd"], k["rms_norm_eps"]
        self.self_attn = Attention(k)
        self.mlp = MLP(C, k["intermediate_size"])
        self.input_layernorm = RMSNorm(C, eps)
        self.post_attention_layernorm = RMSNorm(C, eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.embed_tokens = nn.Embedding(k["vocab_size"], k["n_embd"])
        self.layers = nn.ModuleList([DecoderLayer(k) for _ in range(k["n_layer"])])
        self.norm = RMSNorm(k["n_embd"], k["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.model = Model(k)
        self.tied = k["tie_word_embeddings"] == 1
        if not self.tied:
            self.lm_head = nn.Linear(k["n_embd"], k["vocab_size"], bias=False)
        D = k["n_embd"] // k["n_head"]
        inv = inv_freq_of(k, D)
        pos = torch.arange(k["n_positions"], dtype=torch.float64)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().to(torch.float32), persistent=False)
        self.register_buffer("sin", emb.sin().to(torch.float32), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.model.embed_tokens(idx)
        cos, sin = self.cos[:T][None, None], self.sin[:T][None, None]
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return F.linear(x, head)


INT_KEYS = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "n_kv_head", "intermediate_size",
            "tie_word_embeddings", "attention_bias", "rope_scaling", "rope_original_max_position_embeddings")
FLOAT_KEYS = ("rms_norm_eps", "rope_theta", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor")


def main():
    d = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print("oracle: torch %s on cpu" % torch.__version__)
    cfg = read_config(os.path.join(d, "config.txt"))
    k = {key: int(cfg[key]) for key in INT_KEYS}
    k.update({key: float(cfg[key]) for key in FLOAT_KEYS})
    V = k["vocab_size"]
    B, T, steps = int(cfg["B"]), int(cfg["T"]), int(cfg["steps"])
    f32 = lambda key: float(np.float32(cfg[key]))  # the C side holds these as float
    lr, fmin = f32("lr"), f32("lr_min_frac")
    warmup, total = int(cfg["warmup"]), int(cfg["total_steps"])
    beta1, beta2, eps, wd, clip = f32("beta1"), f32("beta2"), f32("eps"), f32("weight_decay"), f32("grad_clip")

    model = LlamaForCausalLM(k)
    names = [line.split()[0] for line in open(os.path.join(d, "layout.txt"))]
    params = dict(model.named_parameters())
    assert sorted(names) == sorted(params), "layout.txt names differ from the module's: %s vs %s" % (
        sorted(set(names) ^ set(params)), "")
    order = [params[n] for n in names]
    flat = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32)
    n_params = sum(p.numel() for p in order)
    assert flat.size == n_params, "params.bin has %d floats, layout needs %d" % (flat.size, n_params)
    off = 0
    with torch.no_grad():
        for p in order:
            p.copy_(torch.from_numpy(flat[off:off + p.numel()].copy()).view(p.shape))
            off += p.numel()
    inputs = torch.from_numpy(np.fromfile(os.path.join(d, "inputs.bin"), dtype=np.int32).astype(np.int64))
    targets = torch.from_numpy(np.fromfile(os.path.join(d, "targets.bin"), dtype=np.int32).astype(np.int64))
    inputs = inputs.view(steps, B, T)
    targets = targets.view(steps, B, T)

    def flat_of(ts):
        return torch.cat([t.detach().reshape(-1) for t in ts]).numpy().astype(np.float32)

    def write(name, arr):
        np.asarray(arr, dtype=np.float32).tofile(os.path.join(d, name))

    with torch.no_grad():
        write("out_logits0.bin", model(inputs[0]).reshape(-1).numpy())
    loss = F.cross_entropy(model(inputs[0]).view(-1, V), targets[0].reshape(-1))
    loss.backward()
    write("out_loss0.bin", [loss.item()])
    write("out_grads0.bin", flat_of([p.grad for p in order]))

    decay = [p for p in order if p.dim() == 2]
    no_decay = [p for p in order if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(beta1, beta2), eps=eps, foreach=False)
    lrs, norms, losses = [], [], []
    for s in range(steps):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(inputs[s]).view(-1, V), targets[s].reshape(-1))
        loss.backward()
        if clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(order, clip)
        else:
            norm = torch.norm(torch.stack([torch.norm(p.grad, 2.0) for p in order]), 2.0)
        lr_s = lr_at(lr, warmup, total, fmin, s)
        for g in opt.param_groups:
            g["lr"] = lr_s
        opt.step()
        lrs.append(lr_s)
        norms.append(norm.item())
        losses.append(loss.item())
    write("out_lrs.bin", lrs)
    write("out_norms.bin", norms)
    write("out_losses.bin", losses)
    write("out_params.bin", flat_of(order))
    write("out_m.bin", flat_of([opt.state[p]["exp_avg"] for p in order]))
    write("out_v.bin", flat_of([opt.state[p]["exp_avg_sq"] for p in order]))
    print("oracle: loss0 %.6f, norms %s" % (losses[0], " ".join("%.4f" % n for n in norms)))


if __name__ == "__main__":
    main()
