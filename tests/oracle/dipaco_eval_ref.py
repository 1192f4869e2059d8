#!/usr/bin/env python3
"""dipaco_eval_ref.py — PyTorch oracle of routed DiPaCo evaluation (`dipacoctl eval --dipaco`).

Reads the DiPaCo model directory by hand (dipaco.json, router/router.json, the centroids in
router/router.safetensors, router/base, path_<p>/), computes every sequence's routing feature
with a torch GPT-2 (mean of the ln_f output over the first `prefix` tokens), routes it to the
nearest centroid (product k-means: nearest per half, path c1·K2 + c2; linear: argmax of W·z + b), scores each sequence's
tokens with its chosen path's model, and compares the overall and per-path losses and token
counts with what `eval --dipaco --json` printed.

  dipaco_eval_ref.py --dipaco DIR --data SHARD... --seq-len T [--reroute-every W] --got OUT.json [--tol 1e-4]"""
import argparse, json, os, sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diloco_ref import hidden, load_model, load_tokens, read_safetensors  # noqa: E402

torch.set_num_threads(1)


def route(rj, cents, z):
    def nearest(c, v):
        return int(((c.double() - v.double()) ** 2).sum(1).argmin())
    if rj["kind"] == "kmeans":
        return nearest(cents["centroids"], z)
    if rj["kind"] == "linear":
        s = cents["linear.weight"].double() @ z.double() + cents["linear.bias"].double()
        return int(s.argmax())
    d1 = z.numel() // 2
    return nearest(cents["centroids.0"], z[:d1]) * rj["grid"][1] + nearest(cents["centroids.1"], z[d1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dipaco", required=True)
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--reroute-every", type=int, default=0)
    ap.add_argument("--got", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    meta = json.load(open(os.path.join(a.dipaco, "dipaco.json")))
    rdir = os.path.join(a.dipaco, meta["router"])
    rj = json.load(open(os.path.join(rdir, "router.json")))
    cents = read_safetensors(os.path.join(rdir, "router.safetensors"))
    bcfg, base = load_model(os.path.join(rdir, "base"))
    paths = [load_model(os.path.join(a.dipaco, f"path_{p}")) for p in range(meta["paths"])]
    tok = load_tokens(a.data)
    T, W, pre = a.seq_len, a.reroute_every, rj["prefix"]
    n = (len(tok) - 1) // T
    sums, counts = [0.0] * meta["paths"], [0] * meta["paths"]
    with torch.no_grad():
        for i in range(n):
            x = tok[i * T:(i + 1) * T]
            y = tok[i * T + 1:(i + 1) * T + 1]
            nseg = (T + W - 1) // W if W else 1
            segp = []
            for k in range(nseg):
                win = x[:pre] if k == 0 else x[k * W - pre:k * W]
                segp.append(route(rj, cents, hidden(base, bcfg, win.view(1, -1))[0].mean(0)))
            for p in sorted(set(segp)):
                cfg, P = paths[p]
                logits = hidden(P, cfg, x.view(1, -1))[0] @ P["wte.weight"].t()
                ce = F.cross_entropy(logits.double(), y, reduction="none")
                for t in range(T):
                    if segp[t // W if W else 0] == p:
                        sums[p] += float(ce[t])
                        counts[p] += 1
    got = json.load(open(a.got))
    ok = True
    total = sum(sums) / sum(counts)
    err = abs(got["loss"] - total) / abs(total)
    print(f"dipaco_eval_ref: {n} sequences, loss {total:.6f} (eval --dipaco {got['loss']:.6f}, rel err {err:.2e})")
    ok &= err <= a.tol and got["sequences"] == n and got["tokens"] == sum(counts)
    for p in range(meta["paths"]):
        g = got["paths"][p]
        ref = sums[p] / counts[p] if counts[p] else None
        print(f"  path {p}: tokens {counts[p]} (got {g['tokens']}), loss {ref} (got {g['loss']})")
        if g["tokens"] != counts[p]:
            ok = False
        elif ref is not None and abs(g["loss"] - ref) > a.tol * abs(ref):
            ok = False
    used = sum(1 for c in counts if c)
    print(f"dipaco_eval_ref: {used} of {meta['paths']} paths used; {'OK' if ok else 'MISMATCH'}")
    return 0 if ok and used > 1 else 1


if __name__ == "__main__":
    sys.exit(main())
