#!/usr/bin/env python3
"""cpu_kernels_torch.py — PyTorch eager twin of tests/bench/cpu_kernels.c: one train step
(zero_grad, forward, backward, clip_grad_norm_, AdamW) of the same GPT-2 on the CPU.
Usage: cpu_kernels_torch.py [L NH C V B T threads steps]   (defaults 6 6 384 256 8 256 2 5)"""
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
from gpt_oracle import gpt_forward, layout  # noqa: E402


def main():
    a = [6, 6, 384, 256, 8, 256, 2, 5]
    for i, v in enumerate(sys.argv[1:9]):
        a[i] = int(v)
    L, NH, C, V, B, T, threads, steps = a
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    P, order = {}, []
    for name, shape in layout(L, C, V, T):
        t = torch.zeros(shape) if name.endswith("bias") else (
            torch.ones(shape) if "ln_" in name else torch.randn(shape) * 0.02)
        P[name] = torch.nn.Parameter(t)
        order.append(P[name])
    decay = [p for p in order if p.dim() == 2]
    no_decay = [p for p in order if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    inp = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    tf = tb = to = 0.0
    best = 1e30
    for it in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(gpt_forward(P, inp, L, NH).view(-1, V), tgt.view(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(order, 1.0)
        opt.step()
        t3 = time.perf_counter()
        if it > 0:
            tf, tb, to = tf + t1 - t0, tb + t2 - t1, to + t3 - t2
            best = min(best, t3 - t0)
    step = (tf + tb + to) / steps
    n = sum(p.numel() for p in order)
    print("pt L=%d NH=%d C=%d V=%d B=%d T=%d threads=%d params=%d: %.1f ms/step (fwd %.1f bwd %.1f adamw %.1f) "
          "%.0f tok/s, best step %.1f ms = %.0f tok/s, loss %.4f"
          % (L, NH, C, V, B, T, threads, n, step * 1e3, tf / steps * 1e3, tb / steps * 1e3, to / steps * 1e3,
             B * T / step, best * 1e3, B * T / best, loss.item()))


if __name__ == "__main__":
    main()
