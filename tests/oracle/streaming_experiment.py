#!/usr/bin/env python3
"""streaming_experiment.py — final held-out loss of a tiny model under plain DiLoCo and Streaming
DiLoCo variants (fragments, overlap, alpha, codecs, eager), all from one init and one data order.

  streaming_experiment.py --init MODEL_DIR --data TRAIN... --eval VAL... [--replicas 2 --inner-steps 8
                          --rounds 12 --batch 4 --seq-len 32]"""
import argparse, copy, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diloco_ref as D  # noqa: E402
import streaming_ref as S  # noqa: E402

VARIANTS = [
    ("DiLoCo (F=1 tau=0)", {}),
    ("F=2 tau=0 alpha=0", {"fragments": 2}),
    ("F=2 tau=1 alpha=0.5", {"fragments": 2, "overlap_steps": 1, "alpha": 0.5}),
    ("F=2 tau=2 alpha=0.5", {"fragments": 2, "overlap_steps": 2, "alpha": 0.5}),
    ("F=2 tau=2 alpha=0.5 eager", {"fragments": 2, "overlap_steps": 2, "alpha": 0.5, "eager": True}),
    ("F=2 tau=2 alpha=0", {"fragments": 2, "overlap_steps": 2}),
    ("F=2 tau=2 alpha=0 eager", {"fragments": 2, "overlap_steps": 2, "eager": True}),
    ("F=2 tau=1 alpha=0.5 bf16", {"fragments": 2, "overlap_steps": 1, "alpha": 0.5, "codec": "bf16"}),
    ("F=2 tau=1 alpha=0.5 int8", {"fragments": 2, "overlap_steps": 1, "alpha": 0.5, "codec": "int8"}),
    ("F=2 tau=1 alpha=0.5 fp8", {"fragments": 2, "overlap_steps": 1, "alpha": 0.5, "codec": "fp8"}),
    ("F=2 tau=1 alpha=0.5 e3m0", {"fragments": 2, "overlap_steps": 1, "alpha": 0.5, "codec": "e3m0"}),
    ("F=1 tau=0 e3m0", {"codec": "e3m0"}),
    ("F=1 tau=0 int8", {"codec": "int8"}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--eval", nargs="+", required=True)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--inner-steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args()
    init = D.load_model(a.init)
    train, val = D.load_tokens(a.data), D.load_tokens(a.eval)
    base = {"replicas": a.replicas, "inner_steps": a.inner_steps, "rounds": a.rounds, "batch": a.batch,
            "seq_len": a.seq_len,
            "inner": {"lr": a.lr, "warmup": a.inner_steps, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9,
                      "beta2": 0.95, "eps": 1e-8, "grad_clip": 1.0, "state": "keep"},
            "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True}}
    print(f"init eval loss {S.eval_loss(init[0], init[1], val, a.batch, a.seq_len):.4f}  "
          f"(R={a.replicas} H={a.inner_steps} rounds={a.rounds} B={a.batch} T={a.seq_len})")
    for name, st in VARIANTS:
        spec = copy.deepcopy(base)
        spec["streaming"] = st
        t0 = time.time()
        G = S.run(init, train, spec)
        print(f"{name:32s} eval loss {S.eval_loss(init[0], G, val, a.batch, a.seq_len):.4f}  ({time.time() - t0:.0f}s)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
