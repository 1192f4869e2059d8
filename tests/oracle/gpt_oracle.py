#!/usr/bin/env python3
"""gpt_oracle.py — the PyTorch reference for the GPT-2 of docs/design.md §3.

Used by tests/unit/test_cpu_oracle.c: the C test writes a case into a directory (config.txt,
params.bin in the canonical flat layout of kernels/gpt.h, inputs.bin/targets.bin with one
(B, T) batch per AdamW step), this script rebuilds the model from the flat parameters with
stock torch functions (F.layer_norm, F.gelu(approximate='tanh'), F.softmax, F.cross_entropy,
torch.optim.AdamW, torch.nn.utils.clip_grad_norm_) and writes back:
  out_loss0.bin    loss of batch 0 at the initial parameters (1 float32)
  out_grads0.bin   its gradient, flat canonical layout (n_params float32)
  out_logits0.bin  logits of batch 0 at the initial parameters (B*T*V float32)
  out_lrs.bin      learning rate of each step (steps float32)
  out_norms.bin    pre-clip global gradient norm of each step (steps float32)
  out_losses.bin   loss of each step (steps float32)
  out_params.bin   parameters after the steps; out_m.bin, out_v.bin the AdamW moments
Usage: gpt_oracle.py DIR.   Exits non-zero on any error (missing torch included).
DPC_ORACLE_DEVICE=cuda runs torch on the GPU (TF32 off), =auto on the GPU when torch sees
one; the default is the CPU.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def read_config(path):
    cfg = {}
    with open(path) as f:
        for line in f:
            k, v = line.split()
            cfg[k] = v
    return cfg


def layout(L, C, V, maxT):
    """Canonical tensor order and HF shapes of kernels/gpt.h (Conv1D weights are [in, out])."""
    t = [("wte.weight", (V, C)), ("wpe.weight", (maxT, C)), ("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    for l in range(L):
        p = "h.%d." % l
        t += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
              (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
              (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
              (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
              (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
              (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    return t


def gpt_forward(P, idx, L, NH):
    B, T = idx.shape
    V, C = P["wte.weight"].shape
    hs = C // NH
    x = P["wte.weight"][idx] + P["wpe.weight"][torch.arange(T, device=idx.device)]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=idx.device))
    for l in range(L):
        p = "h.%d." % l
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps=1e-5)
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + (y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps=1e-5)
        h = F.gelu(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + (h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps=1e-5)
    return x @ P["wte.weight"].t()


def lr_at(lr, warmup, total, fmin, s):
    """docs/design.md §3 schedule, rounded like gpt_lr_at (float32 result)."""
    if s < warmup:
        return float(np.float32(np.float32(lr) * np.float32(s + 1) / np.float32(warmup)))
    p = (s - warmup) / (total - warmup) if total > warmup else 1.0
    p = min(p, 1.0)
    return float(np.float32(lr * (fmin + (1.0 - fmin) * 0.5 * (1.0 + math.cos(math.pi * p)))))


def main():
    d = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    want = os.environ.get("DPC_ORACLE_DEVICE", "cpu")
    dev = torch.device("cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    print("oracle: torch %s on %s" % (torch.__version__, dev))
    cfg = read_config(os.path.join(d, "config.txt"))
    L, NH, C = int(cfg["n_layer"]), int(cfg["n_head"]), int(cfg["n_embd"])
    maxT, V = int(cfg["n_positions"]), int(cfg["vocab_size"])
    B, T, steps = int(cfg["B"]), int(cfg["T"]), int(cfg["steps"])
    f32 = lambda k: float(np.float32(cfg[k]))  # the C side holds these as float
    lr, fmin = f32("lr"), f32("lr_min_frac")
    warmup, total = int(cfg["warmup"]), int(cfg["total_steps"])
    beta1, beta2, eps, wd, clip = f32("beta1"), f32("beta2"), f32("eps"), f32("weight_decay"), f32("grad_clip")

    flat = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32)
    lay = layout(L, C, V, maxT)
    n_params = sum(int(np.prod(s)) for _, s in lay)
    assert flat.size == n_params, "params.bin has %d floats, layout needs %d" % (flat.size, n_params)
    P, order, off = {}, [], 0
    for name, shape in lay:
        n = int(np.prod(shape))
        P[name] = torch.nn.Parameter(torch.from_numpy(flat[off:off + n].copy()).view(shape).to(dev))
        order.append(P[name])
        off += n
    inputs = torch.from_numpy(np.fromfile(os.path.join(d, "inputs.bin"), dtype=np.int32).astype(np.int64))
    targets = torch.from_numpy(np.fromfile(os.path.join(d, "targets.bin"), dtype=np.int32).astype(np.int64))
    inputs = inputs.view(steps, B, T).to(dev)
    targets = targets.view(steps, B, T).to(dev)

    def flat_of(ts):
        return torch.cat([t.detach().reshape(-1) for t in ts]).cpu().numpy().astype(np.float32)

    def write(name, arr):
        np.asarray(arr, dtype=np.float32).tofile(os.path.join(d, name))

    with torch.no_grad():
        write("out_logits0.bin", gpt_forward(P, inputs[0], L, NH).reshape(-1).cpu().numpy())
    logits = gpt_forward(P, inputs[0], L, NH)
    loss = F.cross_entropy(logits.view(-1, V), targets[0].reshape(-1))
    loss.backward()
    write("out_loss0.bin", [loss.item()])
    write("out_grads0.bin", flat_of([p.grad for p in order]))

    decay = [p for (name, shape), p in zip(lay, order) if len(shape) == 2]
    no_decay = [p for (name, shape), p in zip(lay, order) if len(shape) != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(beta1, beta2), eps=eps, foreach=False)
    lrs, norms, losses = [], [], []
    for s in range(steps):
        opt.zero_grad(set_to_none=False)
        logits = gpt_forward(P, inputs[s], L, NH)
        loss = F.cross_entropy(logits.view(-1, V), targets[s].reshape(-1))
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
