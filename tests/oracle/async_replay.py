#!/usr/bin/env python3
"""async_replay.py — replays a diloco-async job's ledger through an independent reference of
the async outer rules (docs/design.md §3) and compares with the coordinator's parameters.

The coordinator's ledger is its deltas table (state 'applied', ordered by applied_version:
lease, slot, base version, version produced, blob). Starting from version 0's parameter blob,
each applied delta blob g is applied in that order with the job's rule, written here in
float32 torch ops independently of kernels/outer.c:
  delayed-nesterov: Δbuf += g; if (t+1) mod N == 0 { m ← β·m + Δbuf/N;
                    θ ← θ − ε·((1 − c·N + c)·β·m + g/N); Δbuf ← 0 } else { θ ← θ − ε·(c·β·m + g/N) }
  nesterov:         torch.optim.SGD(lr=ε, momentum=β, nesterov=True) with p.grad = g
  sgd:              θ ← θ − ε·g
Checks: versions 1..V applied exactly once each, in order; staleness = version − 1 − base ≥ 0;
the replayed θ equals the current version's blob (≤ tol relative); and the exported
safetensors (if given) hold exactly the current blob's values (same multiset of floats).

Usage: async_replay.py --state DIR --job ID [--export DIR] [--tol 1e-5] [--ledger-out FILE]"""
import argparse
import glob
import json
import os
import sqlite3
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"FAIL: torch/numpy not importable with {sys.executable}: {e} "
          "(Debian python3-torch, python3-numpy: deploy/install_deps.sh --test)")
    sys.exit(1)

ap = argparse.ArgumentParser()
ap.add_argument("--state", required=True)
ap.add_argument("--job", type=int, required=True)
ap.add_argument("--export")
ap.add_argument("--tol", type=float, default=1e-5)
ap.add_argument("--ledger-out")
a = ap.parse_args()


def read_blob(name):
    raw = open(os.path.join(a.state, "blobs", name), "rb").read()
    magic, ver, kind, _, n = struct.unpack("<IIIIQ", raw[:24])
    assert magic == 0x42435044 and ver == 1, f"{name}: not a blob"
    assert len(raw) == 24 + 4 * n + 8, f"{name}: size"
    return np.frombuffer(raw[24:24 + 4 * n], dtype=np.float32).copy()


db = sqlite3.connect(f"file:{os.path.join(a.state, 'dipaco.db')}?mode=ro", uri=True)
spec = json.loads(db.execute("SELECT spec_json FROM jobs WHERE id = ?", (a.job,)).fetchone()[0])
assert spec["algorithm"] == "diloco-async", spec["algorithm"]
outer = spec["outer"]
rule, eps, beta, c = outer["rule"], float(outer["lr"]), float(outer["momentum"]), float(outer["c"])
n_slots = spec["replicas"]  # diloco-async: one path
N = int(outer["delay_buffer"]) or n_slots
c = min(c, 1.0 / N)
fails = 0
ledger_rows = []
frags = db.execute("SELECT fragment, version FROM fragments WHERE job = ? ORDER BY fragment", (a.job,)).fetchall()
finals = []
for frag, cur in frags:
    v0 = db.execute("SELECT param_blob FROM fragment_versions WHERE job=? AND fragment=? AND version=0",
                    (a.job, frag)).fetchone()
    assert v0, f"fragment {frag}: version 0 was garbage-collected"
    theta = torch.from_numpy(read_blob(v0[0]))
    rows = db.execute("SELECT id, lease, path, replica, round, base_version, applied_version, blob FROM deltas "
                      "WHERE job=? AND fragment=? AND state='applied' ORDER BY applied_version",
                      (a.job, frag)).fetchall()
    versions = [r[6] for r in rows]
    if versions != list(range(1, cur + 1)):
        print(f"FAIL fragment {frag}: applied versions {versions[:10]}... are not 1..{cur}")
        fails += 1
    L = theta.numel()
    dbuf, m = torch.zeros(L), torch.zeros(L)
    p = torch.nn.Parameter(theta.clone())
    opt = torch.optim.SGD([p], lr=eps, momentum=beta, nesterov=True) if rule == "nesterov" else None
    for t, (did, lease, path, rep, rnd, base, ver, blob) in enumerate(rows):
        stale = ver - 1 - base
        if stale < 0:
            print(f"FAIL delta {did}: negative staleness {stale}")
            fails += 1
        ledger_rows.append((frag, ver, lease, path, rep, base, stale))
        g = torch.from_numpy(read_blob(blob))
        if rule == "delayed-nesterov":
            dbuf += g
            if (t + 1) % N == 0:
                m = beta * m + dbuf / N
                theta = theta - eps * ((1 - c * N + c) * beta * m + g / N)
                dbuf = torch.zeros(L)
            else:
                theta = theta - eps * (c * beta * m + g / N)
        elif rule == "nesterov":
            p.grad = g
            opt.step()
            theta = p.detach()
        else:
            theta = theta - eps * g
    cur_blob = db.execute("SELECT param_blob FROM fragment_versions WHERE job=? AND fragment=? AND version=?",
                          (a.job, frag, cur)).fetchone()[0]
    ours = read_blob(cur_blob)
    finals.append(ours)
    ref = theta.numpy()
    err = float(np.max(np.abs(ours.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    moved = float(np.max(np.abs(ours - read_blob(v0[0]))))
    ok = err <= a.tol and moved > 0
    print(f"{'ok  ' if ok else 'FAIL'} fragment {frag}: {len(rows)} deltas replayed ({rule}, N={N}, c={c}): "
          f"rel err {err:.3g} (tol {a.tol}), max |θ_V − θ_0| {moved:.3g}")
    fails += not ok

if a.export:
    raw = open(glob.glob(os.path.join(a.export, "*.safetensors"))[0], "rb").read()
    (hl,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + hl])
    vals = np.concatenate([np.frombuffer(raw[8 + hl + v["data_offsets"][0]:8 + hl + v["data_offsets"][1]],
                                         dtype=np.float32) for k, v in hdr.items() if k != "__metadata__"])
    same = vals.size == sum(f.size for f in finals) and np.array_equal(np.sort(vals), np.sort(np.concatenate(finals)))
    print(f"{'ok  ' if same else 'FAIL'} export holds exactly the current version's parameters ({vals.size} floats)")
    fails += not same

if a.ledger_out:
    with open(a.ledger_out, "w") as f:
        for r in ledger_rows:
            f.write(" ".join(str(x) for x in r) + "\n")
sys.exit(1 if fails else 0)
