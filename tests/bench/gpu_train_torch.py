#!/usr/bin/env python3
"""gpu_train_torch.py — the PyTorch side of tests/bench/gpu_train.sh: the same GPT-2 124M
(learned positions, pre-LayerNorm, tanh GELU, tied embeddings, biases) written nanoGPT-style,
bf16 autocast (or fp32 / tf32 to match gpu_train.c's precision), F.scaled_dot_product_attention
(flash), fused AdamW, torch.compile when it works (falls back to eager and says so). Random
tokens, warmup steps untimed, then timed steps; prints one JSON line like gpu_train.c.
Usage: gpu_train_torch.py B T PRECISION [STEPS] [--no-compile]"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, NH=12, C=768, maxT=1024, V=50257):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(maxT, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if n.endswith("proj.weight") else 0.02)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    B, T, prec = int(args[0]), int(args[1]), args[2]
    steps = int(args[3]) if len(args) > 3 else 10
    warmup = 3
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    torch.manual_seed(0)
    model = GPT().to(dev)
    nparams = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    compiled = "--no-compile" not in sys.argv
    fwd = model
    if compiled:
        try:
            fwd = torch.compile(model)
        except Exception as e:  # noqa: BLE001 - report and fall back
            print("torch.compile unavailable (%s); eager" % e, file=sys.stderr)
            compiled = False
    g = torch.Generator().manual_seed(42)
    data = torch.randint(0, 50257, (B, T + 1), generator=g).to(dev)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if prec == "bf16" else torch.autocast("cuda", enabled=False)

    def step():
        opt.zero_grad(set_to_none=True)
        with ctx:
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    try:
        for _ in range(warmup):
            loss = step()
    except Exception as e:  # noqa: BLE001 - compile failures surface at the first call
        if not compiled:
            raise
        print("torch.compile failed at run time (%s); eager" % str(e).splitlines()[0], file=sys.stderr)
        fwd, compiled = model, False
        for _ in range(warmup):
            loss = step()
    torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.time() - t0) / steps
    name = torch.cuda.get_device_name(0)
    peak = 756e12 if ("H100" in name and "PCIe" in name) else 989e12 if ("H100" in name or "H200" in name) else 312e12 if "A100" in name else 0
    fpt = 6 * nparams + 12 * 12 * 768 * T
    tps = B * T / dt
    print(json.dumps({"impl": "torch" + (".compile" if compiled else ".eager"), "precision": prec, "B": B, "T": T,
                      "ms_per_step": round(dt * 1e3, 2), "tokens_per_s": round(tps), "mfu": round(tps * fpt / peak, 4) if peak else 0,
                      "loss": round(loss.item(), 4), "device": name, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
