#!/usr/bin/env python3
"""route_ref.py — PyTorch oracle of `dipacoctl route assign` (the sharding round trip).

Computes each sequence's routing feature with torch from the router's base model (mean ln_f
output over the first `prefix` tokens), its nearest centroid (and, with --top 2 for a k-means
router, the second nearest), and checks that OUT/path_<p>/train_000.bin is exactly the
concatenation, in original order, of the sequences routed to p, that the manifest's counts
agree, and that every sequence is found again (top 1: in exactly one path).

  route_ref.py --router DIR --data SHARD... --seq-len T --routed OUT [--top 1|2]"""
import argparse, json, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diloco_ref import load_model, load_tokens, read_safetensors  # noqa: E402
from dipaco_eval_ref import hidden, route  # noqa: E402

torch.set_num_threads(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", required=True)
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--routed", required=True)
    ap.add_argument("--top", type=int, default=1)
    a = ap.parse_args()
    rj = json.load(open(os.path.join(a.router, "router.json")))
    cents = read_safetensors(os.path.join(a.router, "router.safetensors"))
    bcfg, base = load_model(os.path.join(a.router, "base"))
    tok = load_tokens(a.data)
    T, pre, P = a.seq_len, rj["prefix"], rj["paths"]
    n = len(tok) // T
    want = [[] for _ in range(P)]
    with torch.no_grad():
        for i in range(n):
            seq = tok[i * T:(i + 1) * T]
            z = hidden(base, bcfg, seq[:pre].view(1, -1))[0].mean(0)
            p = route(rj, cents, z)
            want[p].append(seq)
            if a.top == 2:
                assert rj["kind"] == "kmeans", "the top-2 oracle covers k-means routers"  # noqa: E501
                d = ((cents["centroids"].double() - z.double()) ** 2).sum(1)
                d[p] = float("inf")
                want[int(d.argmin())].append(seq)
    man = json.load(open(os.path.join(a.routed, "manifest.json")))
    ok = man["sequences"] == n and man["top"] == a.top
    total = 0
    for p in range(P):
        f = os.path.join(a.routed, f"path_{p}", "train_000.bin")
        got = load_tokens([f]) if os.path.exists(f) else torch.zeros(0, dtype=torch.int64)
        exp = torch.cat(want[p]) if want[p] else torch.zeros(0, dtype=torch.int64)
        same = got.shape == exp.shape and bool((got == exp).all())
        cnt = man["paths"][p]["sequences"]
        print(f"route_ref: path {p}: {len(want[p])} sequences expected, manifest {cnt}, shard "
              f"{'matches' if same else 'DIFFERS'}")
        ok &= same and cnt == len(want[p])
        total += len(want[p])
    ok &= total == n * a.top
    print(f"route_ref: {n} sequences, top {a.top}: {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
