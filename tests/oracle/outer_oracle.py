#!/usr/bin/env python3
"""outer_oracle.py — checks the outer optimizer (kernels/outer.c) against PyTorch.

1. Sync DiLoCo: 4 rounds of weighted random deltas from 3 slots; our outer_average +
   outer_nesterov_step vs torch.optim.SGD(momentum=0.9, nesterov=True, lr=0.7) with
   p.grad = the weighted average (and nesterov=False), <= 1e-6 relative.
2. Delayed Nesterov with N=1 (c=0) is bit-identical to plain Nesterov applied per delta.
3. Delayed Nesterov with N=4, c=0.1 and c=0 vs a direct transcription of docs/design.md §3's async
   rule in float32 torch ops, on a recorded (fixed, seeded) sequence of deltas.
4. c = 1/N spreads the momentum evenly: every application (not only every N-th) moves θ by
   ε·β·m/N + ε·g/N, with m the momentum after the last update; and over each window of N
   deltas the total momentum step equals c=0's single step at the window's end.
5. The async "sgd" baseline: θ ← θ − ε·g per delta, vs torch.optim.SGD(momentum=0).
6. The streaming merge local ← α·local + (1 − α)·global vs torch's
   local.mul_(α).add_(global, alpha=1 − α) within one rounding of the operands (torch may fuse the add into an FMA);
   α = 0 copies global and α = 1 keeps local, bit for bit.

Usage: outer_oracle.py PATH/TO/test_outer_oracle"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"FAIL: torch/numpy not importable with {sys.executable}: {e} "
          "(Debian python3-torch, python3-numpy: deploy/install_deps.sh --test)")
    sys.exit(1)

HELPER = sys.argv[1]
LEN = 4099  # odd, so no kernel path sees only whole vectors
rng = np.random.default_rng(20240520)
failures = 0


def run(args, inp, out_floats):
    with tempfile.TemporaryDirectory() as d:
        fi, fo = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        with open(fi, "wb") as f:
            f.write(inp)
        subprocess.run([HELPER] + [str(a) for a in args] + [fi, fo], check=True)
        out = np.fromfile(fo, dtype=np.float32)
    assert out.size == out_floats, (out.size, out_floats)
    return out


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def check(name, ok, detail=""):
    global failures
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        failures += 1


# ---- 1. sync Nesterov vs torch.optim.SGD ---------------------------------------------------
for nesterov in (True, False):
    NS, ROUNDS = 3, 4
    theta0 = rng.standard_normal(LEN).astype(np.float32)
    blob = [theta0.tobytes()]
    rounds = []
    for r in range(ROUNDS):
        w = rng.uniform(0.5, 3.0, NS).astype(np.float64)
        ds = (rng.standard_normal((NS, LEN)) * 0.01).astype(np.float32)
        rounds.append((w, ds))
        blob.append(w.tobytes())
        blob.append(ds.tobytes())
    out = run(["sync", LEN, NS, ROUNDS, 0.7, 0.9, int(nesterov)], b"".join(blob), (ROUNDS + 1) * LEN)
    ours = out[: ROUNDS * LEN].reshape(ROUNDS, LEN)
    our_u = out[ROUNDS * LEN:]

    p = torch.nn.Parameter(torch.from_numpy(theta0.copy()))
    opt = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=nesterov)
    worst = 0.0
    for r, (w, ds) in enumerate(rounds):
        avg = (torch.from_numpy(w)[:, None] * torch.from_numpy(ds).double()).sum(0) / float(w.sum())
        p.grad = avg.float()
        opt.step()
        worst = max(worst, rel_err(ours[r], p.detach().numpy()))
    check(f"sync nesterov={nesterov}: theta vs torch SGD over {ROUNDS} rounds", worst <= 1e-6, f"rel err {worst:.3g}")
    buf = opt.state[p]["momentum_buffer"].numpy()
    e = rel_err(our_u, buf)
    check(f"sync nesterov={nesterov}: momentum buffer vs torch", e <= 1e-6, f"rel err {e:.3g}")

# ---- 2. delayed Nesterov, N=1, equals Nesterov bit for bit -----------------------------------
ND = 6
theta0 = rng.standard_normal(LEN).astype(np.float32)
gs = (rng.standard_normal((ND, LEN)) * 0.01).astype(np.float32)
inp = theta0.tobytes() + gs.tobytes()
dn1 = run(["dn", LEN, ND, 1, 0.0, 0.7, 0.9], inp, (ND + 1) * LEN)
nes = run(["nesterov", LEN, ND, 0.7, 0.9], inp, (ND + 1) * LEN)
check("delayed Nesterov N=1 == async Nesterov (bitwise, theta and momentum)", dn1.tobytes() == nes.tobytes())
# and async Nesterov itself vs torch SGD stepping once per delta
p = torch.nn.Parameter(torch.from_numpy(theta0.copy()))
opt = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
worst = 0.0
for t in range(ND):
    p.grad = torch.from_numpy(gs[t].copy())
    opt.step()
    worst = max(worst, rel_err(nes[t * LEN:(t + 1) * LEN], p.detach().numpy()))
check("async Nesterov per delta vs torch SGD", worst <= 1e-6, f"rel err {worst:.3g}")

# ---- 3. delayed Nesterov, N=4, vs docs/design.md §3 transcription on a recorded delta sequence ------
def dn_reference(theta0, gs, N, c, eps, beta):
    """docs/design.md §3 async rule, float32 torch ops; returns θ after each delta and the final m."""
    theta = torch.from_numpy(theta0.copy())
    dbuf = torch.zeros(theta.numel())
    m = torch.zeros(theta.numel())
    thetas, ms = [], []
    for t in range(len(gs)):
        g = torch.from_numpy(gs[t].copy())
        # On each arriving delta g: Δbuf += g; if (t+1) mod N == 0 { m ← β·m + Δbuf/N;
        # θ ← θ − ε·((1 − c·N + c)·β·m + g/N); Δbuf ← 0 } else { θ ← θ − ε·(c·β·m + g/N) }; t += 1
        dbuf += g
        if (t + 1) % N == 0:
            m = beta * m + dbuf / N
            theta = theta - eps * ((1 - c * N + c) * beta * m + g / N)
            dbuf = torch.zeros(theta.numel())
        else:
            theta = theta - eps * (c * beta * m + g / N)
        thetas.append(theta.numpy().copy())
        ms.append(m.numpy().copy())
    return thetas, ms


ND, N, eps, beta = 11, 4, 0.7, 0.9
theta0 = rng.standard_normal(LEN).astype(np.float32)
# A recorded sequence: deltas with a common drift (like successive pseudo-gradients) + noise.
drift = (rng.standard_normal(LEN) * 0.01).astype(np.float32)
gs = (drift[None, :] + rng.standard_normal((ND, LEN)) * 0.005).astype(np.float32)
for c in (0.1, 0.0):
    ours = run(["dn", LEN, ND, N, c, eps, beta], theta0.tobytes() + gs.tobytes(), (ND + 1) * LEN)
    thetas, ms = dn_reference(theta0, gs, N, c, eps, beta)
    worst = max(rel_err(ours[t * LEN:(t + 1) * LEN], thetas[t]) for t in range(ND))
    check(f"delayed Nesterov N={N} c={c} vs docs/design.md transcription over {ND} deltas", worst <= 1e-6,
          f"rel err {worst:.3g}")
    e = rel_err(ours[ND * LEN:], ms[-1])
    check(f"delayed Nesterov N={N} c={c}: momentum m", e <= 1e-6, f"rel err {e:.3g}")

# ---- 4. c = 1/N spreads the momentum evenly ------------------------------------------------------
c = 1.0 / N
ours = run(["dn", LEN, ND, N, c, eps, beta], theta0.tobytes() + gs.tobytes(), (ND + 1) * LEN)
prev = theta0.astype(np.float64)
m = np.zeros(LEN)
dbuf = np.zeros(LEN)
worst = 0.0
for t in range(ND):
    g = gs[t].astype(np.float64)
    dbuf += g
    if (t + 1) % N == 0:
        m = beta * m + dbuf / N
        dbuf[:] = 0
    cur = ours[t * LEN:(t + 1) * LEN].astype(np.float64)
    momentum_step = (prev - cur) - eps * g / N  # what the application moved beyond its own g/N
    want = eps * beta * m / N                   # the same share of β·m at every application
    worst = max(worst, float(np.max(np.abs(momentum_step - want)) / max(np.max(np.abs(want)), 1e-12))
                if np.any(m) else float(np.max(np.abs(momentum_step))))
    prev = cur
check(f"c = 1/N: every application takes the same momentum share ε·β·m/N", worst <= 1e-3, f"rel err {worst:.3g}")
# Over the window that follows a momentum update, c=1/N applies N·(ε·β·m/N) = ε·β·m in total,
# what c=0 applies at once at the window's end (θ at the window ends agree up to the
# difference in timing of that one window's own update).
ours0 = run(["dn", LEN, ND, N, 0.0, eps, beta], theta0.tobytes() + gs.tobytes(), (ND + 1) * LEN)
tot_c = (ours[(N - 1) * LEN:N * LEN].astype(np.float64) - ours[(2 * N - 1) * LEN:2 * N * LEN])
tot_0 = (ours0[(N - 1) * LEN:N * LEN].astype(np.float64) - ours0[(2 * N - 1) * LEN:2 * N * LEN])
m1 = beta * 0 + gs[:N].astype(np.float64).sum(0) / N
m2 = beta * m1 + gs[N:2 * N].astype(np.float64).sum(0) / N
g_part = eps * gs[N:2 * N].astype(np.float64).sum(0) / N
want_c = g_part + eps * beta * m1 * (N - 1) / N + eps * beta * m2 / N   # spread: m1 for N-1 steps, m2 once
want_0 = g_part + eps * beta * m2                                         # c=0: m2 at the end only
e = max(rel_err(tot_c, want_c), rel_err(tot_0, want_0))
check("window totals: c=1/N spreads β·m over the N applications, c=0 applies it once", e <= 1e-3, f"rel err {e:.3g}")

# ---- 5. async SGD baseline -----------------------------------------------------------------------
ours = run(["sgd", LEN, ND, eps], theta0.tobytes() + gs.tobytes(), ND * LEN)
p = torch.nn.Parameter(torch.from_numpy(theta0.copy()))
opt = torch.optim.SGD([p], lr=eps, momentum=0)
worst = 0.0
for t in range(ND):
    p.grad = torch.from_numpy(gs[t].copy())
    opt.step()
    worst = max(worst, rel_err(ours[t * LEN:(t + 1) * LEN], p.detach().numpy()))
check("async sgd per delta vs torch SGD(momentum=0)", worst <= 1e-6, f"rel err {worst:.3g}")

# ---- 6. streaming merge -------------------------------------------------------------------------
local0 = rng.standard_normal(LEN).astype(np.float32)
global0 = rng.standard_normal(LEN).astype(np.float32)
for alpha in (0.0, 0.5, 0.3, 1.0):
    ours = run(["merge", LEN, alpha], local0.tobytes() + global0.tobytes(), LEN)
    ref = torch.from_numpy(local0.copy()).mul_(np.float32(alpha).item()).add_(torch.from_numpy(global0),
                                                                               alpha=1 - np.float32(alpha).item())
    # One rounding's worth of the operands' size (results near 0 cancel, so not ulps of the result).
    scale = np.abs(alpha * local0.astype(np.float64)) + np.abs((1 - alpha) * global0.astype(np.float64))
    worst = float(np.max(np.abs(ours.astype(np.float64) - ref.numpy()) / np.maximum(scale, 1e-30)))
    check(f"merge alpha={alpha} vs torch mul_/add_ within one rounding", worst <= 2 ** -22, f"{worst:.3g} of the operands")
check("merge alpha=0 copies global exactly",
      np.array_equal(run(["merge", LEN, 0.0], local0.tobytes() + global0.tobytes(), LEN), global0))
check("merge alpha=1 keeps local exactly",
      np.array_equal(run(["merge", LEN, 1.0], local0.tobytes() + global0.tobytes(), LEN), local0))

sys.exit(1 if failures else 0)
