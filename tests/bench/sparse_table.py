#!/usr/bin/env python3
"""sparse_table.py RESULTS NPARAM B T STEPS WORKERS — the Markdown table of tests/bench/sparse.sh
from its results file (one line per run: H, row, eval loss, "bytes_in bytes_out tokens", seconds).

Data-parallel moves 2 x 4 bytes x NPARAM per inner step per worker (a ring all-reduce of fp32
gradients) over B x T tokens. "x fewer" counts every byte the coordinator sent or received;
"steady" leaves out each worker's first pull of the whole model (WORKERS x 4 x NPARAM bytes,
paid once per job whatever the algorithm; the bench preempts nobody, so no other full pull
happens), i.e. what each further round costs."""
import sys

res, n, B, T, steps, R = sys.argv[1], *map(int, sys.argv[2:])
names = {"diloco": "DiLoCo fp32 (Nesterov)", "e3m0": "DiLoCo, e3m0 deltas", "sl1": "SparseLoCo 1%",
         "sl2": "SparseLoCo 2%", "sl3": "SparseLoCo 3%", "topk2": "top-k 2%, no error feedback"}
rows = [line.rstrip("\n").split("\t") for line in open(res)]
dp = 8.0 * n / (B * T)  # data-parallel bytes per trained token, both directions
first = R * 4 * n       # the workers' first pulls of the whole model
print(f"\n{n/1e6:.2f}M parameters, {R} workers, {steps} inner steps per replica, batch {B} x {T} tokens; "
      f"data-parallel moves {dp:.0f} bytes per trained token\n")
print("| H | run | eval loss | vs DiLoCo fp32 | delta bytes vs DiLoCo | bytes/token in | bytes/token out | "
      "x fewer than data-parallel | steady: x fewer |")
print("|---|---|---|---|---|---|---|---|---|")
base = {}
for H, row, loss, io, secs in rows:
    b_in, b_out, tok = map(int, io.split())
    if row == "diloco":
        base[H] = (float(loss), b_in)
for H, row, loss, io, secs in rows:
    b_in, b_out, tok = map(int, io.split())
    bl = base.get(H)
    rel = f"{float(loss) / bl[0]:.4f}" if bl else ""
    db = f"{b_in / bl[1]:.4f}" if bl else ""
    steady = dp / ((b_in + b_out - first) / tok) if b_in + b_out > first else float("inf")
    name = names.get(row) or ("SparseLoCo {}%, ef_beta {}, outer lr {}".format(
        *(lambda d, b, lr: (round(float(d) * 100, 2), b, lr))(*row.split(":")[1:])) if row.startswith("sl:") else row)
    print(f"| {H} | {name} | {float(loss):.4f} | {rel} | {db} | {b_in / tok:.3g} | {b_out / tok:.3g} | "
          f"{dp / ((b_in + b_out) / tok):,.0f} | {steady:,.0f} |")
