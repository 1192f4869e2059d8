#!/usr/bin/env python3
"""sparse_experiment.py — final held-out loss of a tiny GPT-2 under DiLoCo fp32 (Nesterov) and
SparseLoCo (sparse_ref.py: chunked top-k of an error-feedback buffer, 2-bit values, plain SGD
outer step) over a grid of density, outer lr alpha and ef_beta, plus top-k without error feedback;
all from one init, one data order and the same inner steps (the study whose table is in SPARSE.md).

Byte tokens (vocab 256) of the State of the Union corpus (deploy/fetch_assets.sh puts it in
tests/.cache/sotu): the files in name order, concatenated; the last --val-bytes are held out.

  sparse_experiment.py [--corpus DIR] [--replicas 2 --inner-steps 20 --rounds 30 --batch 8 --seq-len 64]
                       [--grid full|quick] [--match 'NAME PART|NAME PART...']
Prints one line per run as it finishes, then a markdown table: eval loss, ratio to the DiLoCo fp32
reference (the first row), and the sparse delta bytes per round as a fraction of fp32's."""
import argparse, copy, glob, math, os, sys, time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import diloco_ref as D  # noqa: E402  (sets torch threads to 1)
import sparse_ref as SP  # noqa: E402


def load_corpus(d, train_bytes, val_bytes):
    files = sorted(glob.glob(os.path.join(d, "*.txt")))
    if not files:
        sys.exit(f"no *.txt under {d}: run `bash deploy/fetch_assets.sh tests/.cache` first")
    raw = b"".join(open(f, "rb").read() for f in files)
    tok = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).astype(np.int64))
    return tok[:min(train_bytes, len(tok) - val_bytes)], tok[len(tok) - val_bytes:]


def gpt2_init(L, C, NH, V, maxT, seed):
    """GPT-2 initialisation (kernels/gpt.h): weights N(0, 0.02), c_proj weights N(0, 0.02/sqrt(2L)),
    biases 0, LayerNorm weights 1."""
    g = torch.Generator().manual_seed(seed)
    cfg = {"n_layer": L, "n_head": NH, "n_embd": C, "n_positions": maxT, "vocab_size": V}
    shapes = {"wte.weight": (V, C), "wpe.weight": (maxT, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for l in range(L):
        for k, shp in [("ln_1.weight", (C,)), ("ln_1.bias", (C,)), ("attn.c_attn.weight", (C, 3 * C)),
                       ("attn.c_attn.bias", (3 * C,)), ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
                       ("ln_2.weight", (C,)), ("ln_2.bias", (C,)), ("mlp.c_fc.weight", (C, 4 * C)),
                       ("mlp.c_fc.bias", (4 * C,)), ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", (C,))]:
            shapes[f"h.{l}.{k}"] = shp
    P = {}
    for name in SP.layout(cfg):
        shp = shapes[name]
        if name.endswith(".bias"):
            P[name] = torch.zeros(shp)
        elif "ln_" in name:
            P[name] = torch.ones(shp)
        else:
            std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
            P[name] = torch.randn(shp, generator=g) * std
    return cfg, P


def eval_loss(cfg, P, val, B, T, nbatches):
    nb = min(nbatches, (len(val) - 1) // (B * T))
    with torch.no_grad():
        return sum(float(D.forward(P, cfg, *D.batch_at(val, b, 0, 1, nb, B, T))) for b in range(nb)) / nb


def variants(grid):
    dil = [("DiLoCo fp32 Nesterov 0.7/0.9", {"lr": 0.7, "momentum": 0.9, "nesterov": True}, None),
           ("DiLoCo fp32 Nesterov 0.6/0.7 (default)", {"lr": 0.6, "momentum": 0.7, "nesterov": True}, None),
           ("DiLoCo fp32 averaging 1.0/0", {"lr": 1.0, "momentum": 0.0, "nesterov": False}, None)]
    sgd = lambda a: {"lr": a, "momentum": 0.0, "nesterov": False}
    out = list(dil)
    if grid == "quick":
        cells = [(0.02, a, b) for a in (1.0, 2.0) for b in (0.9, 0.95)]
        topk = [(0.02, 1.0)]
    else:
        cells = [(0.02, a, b) for a in (1.0, 1.5, 2.0, 3.0) for b in (0.9, 0.95, 0.99)]
        cells += [(rho, a, b) for rho in (0.01, 0.03) for a in (1.0, 1.5, 2.0, 3.0) for b in (0.9, 0.95, 0.99)]
        topk = [(rho, a) for rho in (0.01, 0.02, 0.03) for a in (1.0, 2.0)]
    for rho, a, b in cells:
        out.append((f"SparseLoCo {rho:.0%} alpha {a} beta {b}", sgd(a), {"density": rho, "ef_beta": b}))
    for rho, a in topk:
        out.append((f"top-k {rho:.0%} no EF alpha {a}", sgd(a), {"density": rho, "ef_beta": 0.0}))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.path.join(HERE, "..", ".cache", "sotu"))
    ap.add_argument("--train-bytes", type=int, default=2_000_000)
    ap.add_argument("--val-bytes", type=int, default=200_000)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--inner-steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--value-bits", type=int, default=2)
    ap.add_argument("--eval-batches", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--grid", choices=("full", "quick"), default="full")
    ap.add_argument("--match", help="run only the variants whose name contains one of these |-separated strings")
    a = ap.parse_args()
    train, val = load_corpus(a.corpus, a.train_bytes, a.val_bytes)
    init = gpt2_init(a.n_layer, a.n_embd, a.n_head, 256, a.seq_len, a.seed)
    cfg, G0 = init
    lens = [G0[k].numel() for k in SP.layout(cfg)]
    n = sum(lens)
    base = {"replicas": a.replicas, "inner_steps": a.inner_steps, "rounds": a.rounds, "batch": a.batch,
            "seq_len": a.seq_len,
            "inner": {"lr": a.lr, "warmup": a.inner_steps, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9,
                      "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0, "state": "keep"}}
    print(f"{n} parameters, {len(train)} train / {len(val)} eval bytes; init eval loss "
          f"{eval_loss(cfg, G0, val, a.batch, a.seq_len, a.eval_batches):.4f}  (R={a.replicas} H={a.inner_steps} "
          f"rounds={a.rounds} B={a.batch} T={a.seq_len} L={a.n_layer} C={a.n_embd} chunk={a.chunk} "
          f"bits={a.value_bits})", flush=True)
    rows = []
    todo = variants(a.grid)
    if a.match:
        todo = [v for v in todo if any(m in v[0] for m in a.match.split("|"))]
    for name, outer, sp in todo:
        spec = copy.deepcopy(base)
        spec["outer"] = outer
        t0 = time.time()
        if sp is None:
            G = D.run(init, train, spec)
            nbytes = 4 * n
        else:
            spec["sparse"] = dict(sp, chunk=a.chunk, value_bits=a.value_bits)
            G = SP.run(init, train, spec)
            nbytes = SP.sparse_bytes(lens, sp["density"], a.chunk, a.value_bits)
        loss = eval_loss(cfg, G, val, a.batch, a.seq_len, a.eval_batches)
        rows.append((name, loss, nbytes))
        print(f"{name:42s} eval loss {loss:.4f}  bytes/round/replica {nbytes}  ({time.time() - t0:.0f}s)", flush=True)
    ref = rows[0][1]
    best_dense = min(r[1] for r in rows[:3])
    print(f"\nratio: to the first row ({rows[0][0]}); best dense row {best_dense:.4f}\n")
    print("| run | eval loss | ratio to DiLoCo fp32 | ratio to best dense | delta bytes / fp32's |")
    print("|---|---|---|---|---|")
    for name, loss, nbytes in rows:
        print(f"| {name} | {loss:.4f} | {loss / ref:.3f} | {loss / best_dense:.3f} | {nbytes / (4 * n):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
