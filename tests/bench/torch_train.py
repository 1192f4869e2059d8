#!/usr/bin/env python3
"""torch_train.py — the PyTorch peer of `dipacoctl train` for tests/bench/cpu_train.sh.

A nanoGPT-style GPT-2 (same shapes as dipaco's: tied LM head, GELU tanh, LayerNorm eps 1e-5),
trained on the same llm.c token shards in the same data order with torch.optim.AdamW and
clip_grad_norm_, on the CPU with a fixed thread count; with --init, from the weights of a
dipaco model directory (model.safetensors, Conv1D [in, out] weights). Prints one JSON line:
{"tokens_per_s": ..., "steps": ..., "step0_loss": ..., "final_loss": ...}. Warm-up steps are
not timed."""
import argparse, json, math, struct, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, C, NH):
        super().__init__()
        s.NH = NH
        s.ln_1 = nn.LayerNorm(C, eps=1e-5)
        s.c_attn = nn.Linear(C, 3 * C)
        s.c_proj = nn.Linear(C, C)
        s.ln_2 = nn.LayerNorm(C, eps=1e-5)
        s.c_fc = nn.Linear(C, 4 * C)
        s.mlp_proj = nn.Linear(4 * C, C)

    def forward(s, x, mask):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, s.NH, C // s.NH).transpose(1, 2)
        k = k.view(B, T, s.NH, C // s.NH).transpose(1, 2)
        v = v.view(B, T, s.NH, C // s.NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // s.NH))
        att = att.masked_fill(mask[:T, :T] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + s.c_proj(y)
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, L, NH, C, maxT, V):
        super().__init__()
        s.wte = nn.Embedding(V, C)
        s.wpe = nn.Embedding(maxT, C)
        s.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        s.ln_f = nn.LayerNorm(C, eps=1e-5)
        s.register_buffer("mask", torch.tril(torch.ones(maxT, maxT)))
        for p in s.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(s, idx, targets):
        B, T = idx.shape
        x = s.wte(idx) + s.wpe(torch.arange(T))
        for b in s.h:
            x = b(x, s.mask)
        logits = s.ln_f(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def load_init(m, d, L):
    """Copies the weights of dipaco model directory d into m (Linear weights transposed)."""
    with open(f"{d}/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    w = {}
    for name, t in hdr.items():
        if name != "__metadata__":
            a, b = t["data_offsets"]
            w[name.removeprefix("transformer.")] = torch.from_numpy(
                np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"]).copy())
    names = {"ln_1.weight": "ln_1.weight", "ln_1.bias": "ln_1.bias", "c_attn.weight": "attn.c_attn.weight",
             "c_attn.bias": "attn.c_attn.bias", "c_proj.weight": "attn.c_proj.weight", "c_proj.bias": "attn.c_proj.bias",
             "ln_2.weight": "ln_2.weight", "ln_2.bias": "ln_2.bias", "c_fc.weight": "mlp.c_fc.weight",
             "c_fc.bias": "mlp.c_fc.bias", "mlp_proj.weight": "mlp.c_proj.weight", "mlp_proj.bias": "mlp.c_proj.bias"}
    with torch.no_grad():
        m.wte.weight.copy_(w["wte.weight"])
        m.wpe.weight.copy_(w["wpe.weight"])
        m.ln_f.weight.copy_(w["ln_f.weight"])
        m.ln_f.bias.copy_(w["ln_f.bias"])
        for l in range(L):
            blk = dict(m.h[l].named_parameters())
            for ours, theirs in names.items():
                src = w[f"h.{l}.{theirs}"]
                blk[ours].copy_(src.t() if src.dim() == 2 else src)


def load_tokens(paths):
    out = []
    for p in paths:
        h = np.fromfile(p, dtype=np.int32, count=256)
        assert h[0] == 20240520 and (h[1] == 1 or (h[1] == 2 and h[3] == 4)), f"{p}: not an llm.c shard (version 1 or 2)"
        # version 1: uint16 tokens; version 2: uint32 (docs/design.md §6.1)
        out.append(np.fromfile(p, dtype=np.uint16 if h[1] == 1 else np.uint32, offset=1024, count=int(h[2])))
    return np.concatenate(out).astype(np.int64)


def train(m, a):
    """Trains m (whose forward(idx, targets) returns the mean loss) on a.data for a.warmup_steps
    untimed and a.steps timed steps of a.batch x a.seq_len tokens, and prints the JSON line."""
    decay = [p for p in m.parameters() if p.dim() == 2]
    other = [p for p in m.parameters() if p.dim() < 2]
    kw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    try:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], foreach=True, **kw)
    except TypeError:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], **kw)
    tok = load_tokens(a.data)
    B, T = a.batch, a.seq_len
    nb = (len(tok) - 1) // (B * T)
    t0, loss, step0 = None, None, None
    for s in range(a.warmup_steps + a.steps):
        if s == a.warmup_steps:
            t0 = time.perf_counter()
        o = (s % nb) * B * T
        x = torch.from_numpy(tok[o:o + B * T].reshape(B, T))
        y = torch.from_numpy(tok[o + 1:o + B * T + 1].reshape(B, T))
        loss = m(x, y)
        if s == 0:
            step0 = float(loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    el = time.perf_counter() - t0
    print(json.dumps({"tokens_per_s": a.steps * B * T / el, "steps": a.steps, "step0_loss": step0,
                      "final_loss": float(loss)}))


def main():
    ap = argparse.ArgumentParser()
    for k in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "batch", "seq_len", "steps", "warmup_steps", "threads"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, required=True)
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--init", help="dipaco model directory to start from (default: a seeded random init)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = GPT(a.n_layer, a.n_head, a.n_embd, a.n_positions, a.vocab_size)
    if a.init:
        load_init(m, a.init, a.n_layer)
    train(m, a)


if __name__ == "__main__":
    main()
