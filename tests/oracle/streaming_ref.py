#!/usr/bin/env python3
"""streaming_ref.py — PyTorch reference of Streaming DiLoCo (docs/design.md §3, arXiv 2501.18512) with
quantized deltas (docs/design.md §3) and eager updates (arXiv 2502.12996, see EAGER.md): the
oracle the C coordinator and workers must match to 1e-4.

The spec is diloco_ref.py's spec plus an optional block
  "streaming": {"fragments": F, "overlap_steps": tau, "alpha": alpha,
                "codec": "fp32"|"bf16"|"int8"|"fp8"|"e3m0", "block_floats": 256, "eager": false}
(defaults F=1, tau=0, alpha=0, fp32, 256, false).

- Group g holds layer l when l mod F == g; group 0 also holds the stem (wte, wpe, ln_f.*; a Llama's
  embed_tokens, norm and lm_head).
- R replicas train continuously for rounds*H inner steps (AdamW kept, schedule over rounds*H,
  batch s of replica r as in diloco_ref).
- After step n (from 1), group g syncs when n >= max(1, o_g) and (n - o_g) % H == 0,
  o_g = floor(g*H/F): outer gradient = (sum over replicas in order of Q(G_g - theta_r)) / R,
  torch SGD(nesterov) with one momentum per group -> new G_g. Q is the codec's encode+decode,
  per fragment (the stem is one fragment, each layer one), blocks from the fragment's start.
- After step n + tau (at once for tau = 0) each replica merges
  theta_r <- alpha*theta_r + (1-alpha)*G_g_new; merges past the last step never happen.
- eager (tau >= 1): see EAGER.md and eager_sync() below.
- Export: the final G of every tensor.

  streaming_ref.py --init MODEL_DIR --data SHARD... --spec SPEC.json --compare EXPORTED_DIR [--tol 1e-4]
  streaming_ref.py --init MODEL_DIR --data SHARD... --spec SPEC.json [--out FILE.safetensors] [--eval SHARD...]
  streaming_ref.py --self-test
--compare prints the max relative error per tensor (max|a-b| / max|b|) and exits 1 above --tol."""
import argparse, json, os, struct, sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diloco_ref as D  # noqa: E402  (sets torch threads to 1)

STEM = ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
LAYER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
         "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
         "mlp.c_proj.weight", "mlp.c_proj.bias"]
# Llama (kernels/gpt.h's canonical order; lm_head only when untied, q/k/v biases only for Qwen2).
LLAMA_LAYER = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
               "self_attn.v_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
               "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
               "mlp.up_proj.weight", "mlp.down_proj.weight"]
CODECS = ("fp32", "bf16", "int8", "fp8", "e3m0")


def family(cfg, names):
    """(stem tensor names, per-layer name of layer l, n_layer) of the model, canonical order."""
    if cfg is not None and D.is_llama(cfg):
        stem = [k for k in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight") if k in names]
        return stem, (lambda l: [f"model.layers.{l}.{k}" for k in LLAMA_LAYER if f"model.layers.{l}.{k}" in names]), \
            cfg["num_hidden_layers"]
    return STEM, (lambda l: [f"h.{l}.{k}" for k in LAYER]), (cfg or {}).get("n_layer")


# ---------------------------------------------------------------- codecs (docs/design.md §3.9)
f32 = np.float32


def _blocks(x, bf):
    """x (1-D fp32) cut into blocks of bf from its first value: list of slices."""
    return [slice(i, min(i + bf, x.size)) for i in range(0, x.size, bf)]


def _fp8_round(y):
    """|y| (fp32, >= 0, finite) to the nearest OCP e4m3fn value, ties to even mantissa, saturating
    at 448. Exact: every step is a power-of-two scaling or rint of an exact fp32."""
    y = np.minimum(y, f32(448.0))
    _, ex = np.frexp(y)                       # y = m * 2^ex, m in [0.5, 1)
    e = np.maximum(ex.astype(np.int32) - 1, -6)  # binade exponent; subnormals share 2^-6's spacing
    q = np.ldexp(f32(1.0), e - 3).astype(f32)  # spacing of 3 mantissa bits
    v = (np.rint(y / q) * q).astype(f32)      # y/q exact (power of two); rint = half to even
    return np.minimum(v, f32(448.0))


E3M0_LEVELS = np.array([0.0] + [2.0 ** (e - 7) for e in range(1, 8)], dtype=f32)
# y >= threshold[e-1] takes level e (a midpoint takes the larger magnitude)
E3M0_MIDS = np.array([2.0 ** -7] + [1.5 * 2.0 ** (e - 8) for e in range(2, 8)], dtype=f32)


def quantize(codec, x, bf):
    """Encode then decode one fragment x (1-D fp32 numpy) with the codec; fp32 arithmetic."""
    x = np.ascontiguousarray(x, dtype=f32)
    assert np.all(np.isfinite(x)), "encoders refuse non-finite input"
    if codec == "fp32":
        return x.copy()
    if codec == "bf16":
        return torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    out = np.empty_like(x)
    for b in _blocks(x, bf):
        v = x[b]
        amax = f32(np.max(np.abs(v)))
        if amax == 0:
            out[b] = 0
            continue
        if codec == "int8":
            scale = f32(amax / f32(127.0))
            code = np.clip(np.rint(v / scale), -127, 127).astype(f32) + f32(0.0)  # no -0 code
            out[b] = code * scale
        elif codec == "fp8":
            scale = f32(amax / f32(448.0))
            y = (v / scale).astype(f32)
            mag = _fp8_round(np.abs(y))
            out[b] = np.where((y < 0) & (mag > 0), -mag, mag).astype(f32) * scale  # no -0 code
        elif codec == "e3m0":
            scale = amax
            y = (np.abs(v) / scale).astype(f32)
            e = np.searchsorted(E3M0_MIDS, y, side="right")  # number of midpoints <= y
            mag = E3M0_LEVELS[e] * scale
            out[b] = np.where((v < 0) & (e > 0), -mag, mag).astype(f32)
        else:
            raise ValueError(f"codec {codec!r}")
    return out


# ---------------------------------------------------------------- fragments and schedule
def fragments_of_group(g, F, L, cfg=None, names=()):
    """The fragments (lists of tensor names, canonical order) of group g (GPT-2 without cfg)."""
    stem, layer, _ = family(cfg, set(names))
    frags = [stem] if g == 0 else []
    frags += [layer(l) for l in range(L) if l % F == g]
    return frags


def syncs(g, n, H, F):
    o = g * H // F
    return n >= max(1, o) and (n - o) % H == 0


def stream_cfg(spec, L):
    st = dict({"fragments": 1, "overlap_steps": 0, "alpha": 0.0, "codec": "fp32", "block_floats": 256,
               "eager": False}, **spec.get("streaming", {}))
    H = spec["inner_steps"]
    F, tau = st["fragments"], st["overlap_steps"]
    if not (1 <= F <= H):
        raise ValueError(f"streaming.fragments {F}: need 1 <= F <= inner_steps {H}")
    if F > max(1, L):
        raise ValueError(f"streaming.fragments {F}: more fragments than layers ({L}) leaves some empty")
    if not (0 <= tau < H):
        raise ValueError(f"streaming.overlap_steps {tau}: need 0 <= tau < inner_steps {H}")
    if not (0.0 <= st["alpha"] <= 1.0):
        raise ValueError(f"streaming.alpha {st['alpha']}: need 0 <= alpha <= 1")
    if st["codec"] not in CODECS:
        raise ValueError(f"streaming.codec {st['codec']!r}: expected one of {CODECS}")
    if st["block_floats"] < 1:
        raise ValueError("streaming.block_floats must be >= 1")
    if st["eager"] and tau < 1:
        raise ValueError("streaming.eager needs overlap_steps >= 1 (with tau = 0 the true global is there at once)")
    return st


# ---------------------------------------------------------------- the simulation
def run(init, tokens, spec, stop_after_steps=None, trace=None, stats=None):
    """Streaming DiLoCo; returns the final global parameters {name: tensor}.
    trace, if a list, receives (n, "sync"|"merge", g) events; stats, if a list, receives per eager
    merge (n, g, |G_new - estimate|, |G_new - G_old|) (L2 over the group, mean over replicas)."""
    cfg, G0 = init
    R, H, rounds = spec["replicas"], spec["inner_steps"], spec["rounds"]
    B, T = spec["batch"], spec["seq_len"]
    inner, outer = spec["inner"], spec["outer"]
    if inner.get("state", "keep") not in ("keep", "checkpoint"):
        raise ValueError("streaming: inner.state must be keep or checkpoint (replicas train continuously)")
    L = family(cfg, G0)[2]
    st = stream_cfg(spec, L)
    F, tau, alpha, codec, bf, eager = (st["fragments"], st["overlap_steps"], float(st["alpha"]), st["codec"],
                                       st["block_floats"], bool(st["eager"]))
    eta, mu = outer["lr"], outer["momentum"]
    groups = [fragments_of_group(g, F, L, cfg, G0.keys()) for g in range(F)]
    gnames = [[k for fr in frs for k in fr] for frs in groups]
    assert sorted(k for gn in gnames for k in gn) == sorted(G0.keys()), "tensor names do not match the layout"

    G = {k: v.clone().requires_grad_(True) for k, v in G0.items()}
    outer_opts = [torch.optim.SGD([G[k] for k in gn], lr=eta, momentum=mu, nesterov=outer.get("nesterov", True))
                  for gn in gnames]
    reps = [{k: v.detach().clone().requires_grad_(True) for k, v in G0.items()} for _ in range(R)]
    opts = [D.make_adamw(P, inner) for P in reps]
    nb = (len(tokens) - 1) // (B * T)
    total = rounds * H
    pending = {}  # step n -> list of (g, per-replica eager estimate or None)
    g_steps = [0] * F  # outer steps taken per group
    # eager state: per group the coordinator's eager base E_g (EAGER.md), per replica and group the
    # replica's previous (decoded) delta
    E = [{k: G0[k].clone() for k in gn} for gn in gnames]
    prev = [[{k: torch.zeros_like(G0[k]) for k in gn} for gn in gnames] for _ in range(R)]

    def deltas_of(g):
        """Per replica, the decoded delta G_g - theta_r of group g (per fragment codec)."""
        out = []
        for r in range(R):
            d = {}
            for fr in groups[g]:
                flat = torch.cat([(G[k].detach() - reps[r][k].detach()).reshape(-1) for k in fr])
                if codec != "fp32":
                    flat = torch.from_numpy(quantize(codec, flat.numpy(), bf))
                o = 0
                for k in fr:
                    n_ = G[k].numel()
                    d[k] = flat[o:o + n_].view_as(G[k]).clone()
                    o += n_
            out.append(d)
        return out

    def sync(g, n):
        ds = deltas_of(g)
        est = None
        g_old = {k: G[k].detach().clone() for k in gnames[g]} if stats is not None else None
        if eager:
            # eager estimate of each replica, from its own fresh and previous delta and the
            # coordinator's eager base of the last version (EAGER.md, eq. E2). The weights of the
            # paper's proxy (P) live in this one line: corr = (d_new - d_prev) / R.
            est = []
            with torch.no_grad():
                for r in range(R):
                    e = {}
                    for k in gnames[g]:
                        corr = (ds[r][k] - prev[r][g][k]) / R
                        e[k] = E[g][k] - (eta * (1 + mu)) * corr
                        prev[r][g][k] = ds[r][k]
                    est.append(e)
        with torch.no_grad():
            for k in gnames[g]:
                acc = torch.zeros_like(G[k])
                for d in ds:
                    acc += d[k]
                G[k].grad = acc / R
        for grp in outer_opts[g].param_groups:  # the group's step count: the version it makes, minus 1
            grp["momentum"] = D.momentum_at(spec, g_steps[g])
        g_steps[g] += 1
        outer_opts[g].step()
        if eager:
            with torch.no_grad():
                for k in gnames[g]:
                    # E = the step from the new (G, u) with the same mean outer gradient again,
                    # momentum left untouched: u' = mu*u + dbar; E = G - eta*(dbar + mu*u')
                    dbar = G[k].grad
                    u = outer_opts[g].state[G[k]]["momentum_buffer"]
                    E[g][k] = G[k].detach() - eta * (dbar + mu * (mu * u + dbar))
                for r in range(R):  # apply the estimate now, alpha-mixed like a merge
                    for k in gnames[g]:
                        P = reps[r][k]
                        if alpha == 0.0:
                            P.copy_(est[r][k])
                        else:
                            P.copy_(alpha * P.detach() + (1 - alpha) * est[r][k])
        for k in gnames[g]:
            G[k].grad = None
        if trace is not None:
            trace.append((n, "sync", g))
        if tau == 0:
            merge(g, None, n)
        else:
            pending.setdefault(n + tau, []).append((g, est, g_old))

    def merge(g, est, n, g_old=None):
        if stats is not None and est is not None:
            sq = lambda a: sum(float(((G[k].detach() - a[k]) ** 2).sum()) for k in gnames[g]) ** 0.5
            stats.append((n, g, sum(sq(e) for e in est) / R, sq(g_old)))
        with torch.no_grad():
            for r in range(R):
                for k in gnames[g]:
                    P, Gk = reps[r][k], G[k].detach()
                    if est is not None:     # eager: swap the estimate for the true global
                        P.add_((1 - alpha) * (Gk - est[r][k]) if alpha else Gk - est[r][k])
                    elif alpha == 0.0:
                        P.copy_(Gk)
                    else:
                        P.copy_(alpha * P.detach() + (1 - alpha) * Gk)
        if trace is not None:
            trace.append((n, "merge", g))

    steps = total if stop_after_steps is None else stop_after_steps
    for s in range(steps):
        for r in range(R):
            x, y = D.batch_at(tokens, s, r, R, nb, B, T)
            D.inner_step(reps[r], opts[r], cfg, inner, total, s, x, y)
        n = s + 1
        for g, est, g_old in pending.pop(n, []):
            merge(g, est, n, g_old)
        for g in range(F):
            if syncs(g, n, H, F):
                sync(g, n)
    return {k: v.detach() for k, v in G.items()}


def eval_loss(cfg, P, tokens, B, T):
    """Mean token cross-entropy over every whole batch of tokens (held-out shard)."""
    nb = (len(tokens) - 1) // (B * T)
    with torch.no_grad():
        tot = 0.0
        for b in range(nb):
            x, y = D.batch_at(tokens, b, 0, 1, nb, B, T)
            tot += float(D.forward(P, cfg, x, y))
    return tot / nb


def write_safetensors(path, P):
    hdr, off, blobs = {}, 0, []
    for k, v in P.items():
        a = v.detach().contiguous().numpy().astype("<f4").tobytes()
        hdr[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(a)]}
        off += len(a)
        blobs.append(a)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


# ---------------------------------------------------------------- self-test
def _tiny(L=2, C=16, NH=2, V=64, maxT=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    cfg = {"n_layer": L, "n_head": NH, "n_embd": C, "n_positions": maxT, "vocab_size": V}
    P = {"wte.weight": torch.randn(V, C, generator=g) * 0.02, "wpe.weight": torch.randn(maxT, C, generator=g) * 0.02,
         "ln_f.weight": torch.ones(C), "ln_f.bias": torch.zeros(C)}
    for l in range(L):
        for k, shp in [("ln_1.weight", (C,)), ("ln_1.bias", (C,)), ("attn.c_attn.weight", (C, 3 * C)),
                       ("attn.c_attn.bias", (3 * C,)), ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
                       ("ln_2.weight", (C,)), ("ln_2.bias", (C,)), ("mlp.c_fc.weight", (C, 4 * C)),
                       ("mlp.c_fc.bias", (4 * C,)), ("mlp.c_proj.weight", (4 * C, C)), ("mlp.c_proj.bias", (C,))]:
            name = f"h.{l}.{k}"
            if k.startswith("ln_") and k.endswith("weight"):
                P[name] = torch.ones(shp)
            elif k.endswith("bias"):
                P[name] = torch.randn(shp, generator=g) * 0.01
            else:
                P[name] = torch.randn(shp, generator=g) * 0.02
    tokens = torch.randint(0, V, (3000,), generator=g)
    return (cfg, P), tokens


def _spec(**st):
    return {"replicas": 2, "inner_steps": 4, "rounds": 3, "batch": 2, "seq_len": 8,
            "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9,
                      "beta2": 0.95, "eps": 1e-6, "grad_clip": 0.5, "state": "keep"},
            "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True}, "streaming": st}


def _maxdiff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _codec_checks():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(1000) * 0.01).astype(f32)
    x[5] = 0.0
    for c in CODECS:
        y = quantize(c, x, 256)
        assert y.dtype == f32 and y.shape == x.shape
        if c == "fp32":
            assert np.array_equal(x, y)
        err = float(np.max(np.abs(y - x)) / np.max(np.abs(x)))
        bound = {"fp32": 0, "bf16": 2 ** -8, "int8": 0.5 / 127 + 1e-6, "fp8": 2 ** -4 + 1e-6, "e3m0": 0.34}[c]
        assert err <= bound, (c, err)
    # e3m0 levels and midpoints (block of one scale 1 value plus probes)
    probe = np.array([1.0, 2 ** -7, 2 ** -7 * 0.999, 1.5 * 2 ** -3, 1.4 * 2 ** -3, -0.3, -2 ** -9], dtype=f32)
    got = quantize("e3m0", probe, 256)
    want = np.array([1.0, 2 ** -6, 0.0, 0.25, 0.125, -0.25, 0.0], dtype=f32)
    assert np.array_equal(got, want), (got, want)
    assert not np.signbit(got[6]), "no -0 codes"
    # int8: ties to even: 2.5*scale -> 2, 3.5*scale -> 4 (scale 1)
    got = quantize("int8", np.array([127.0, 2.5, 3.5, -2.5, 0.0], dtype=f32), 256)
    assert np.array_equal(got, np.array([127, 2, 4, -2, 0], dtype=f32)), got
    # fp8 e4m3fn: scale 1 (amax 448); 17 -> 16 (tie, even mantissa), 19 -> 20, 2^-10 -> 0 (tie to 0),
    # 3*2^-10 -> 2^-8 (tie, mantissa 1 -> 2), 1.0625 -> 1.0 (tie), 1.1875 -> 1.25 (tie)
    got = quantize("fp8", np.array([448, 17, 19, 2 ** -10, 3 * 2 ** -10, 1.0625, 1.1875, -2 ** -11], dtype=f32), 256)
    want = np.array([448, 16, 20, 0, 2 ** -8, 1.0, 1.25, 0.0], dtype=f32)
    assert np.array_equal(got, want), (got, want)
    assert not np.signbit(got[7])
    # fp8 and e3m0 against brute force over every representable magnitude (nearest; ties: even
    # mantissa for fp8, larger magnitude for e3m0)
    vals = [m * 2.0 ** -9 for m in range(8)] + [(1 + m / 8) * 2.0 ** e for e in range(-6, 9) for m in range(8)]
    vals = np.array([v for v in vals if v <= 448], dtype=np.float64)
    mant = np.array([i % 8 for i in range(len(vals))])
    y = np.abs(rng.standard_normal(20000) * 60).astype(f32)
    y = np.concatenate([y, ((vals[1:] + vals[:-1]) / 2).astype(f32), np.array([448.0], f32)])
    got = _fp8_round(y)
    for yi, gi in zip(y.astype(np.float64), got):
        dist = np.abs(vals - yi)
        best = np.flatnonzero(dist == dist.min())
        want = vals[best[0]] if len(best) == 1 else vals[best[mant[best] % 2 == 0][0]]
        assert gi == want, (yi, gi, want)
    y = rng.uniform(0, 1, 20000).astype(f32)
    y = np.concatenate([y, ((E3M0_LEVELS[1:] + E3M0_LEVELS[:-1]) / 2).astype(f32)])
    e = np.searchsorted(E3M0_MIDS, y, side="right")
    for yi, ei in zip(y.astype(np.float64), e):
        dist = np.abs(E3M0_LEVELS.astype(np.float64) - yi)
        assert ei == np.flatnonzero(dist == dist.min())[-1], (yi, ei)
    # blocks restart at every block_floats
    z = np.array([1.0, 0.5, 0.001, 0.001], dtype=f32)
    assert np.array_equal(quantize("e3m0", z, 2), np.array([1.0, 0.5, 0.001, 0.001], dtype=f32))


def self_test():
    _codec_checks()
    print("streaming_ref self-test: codecs ok")
    init, tokens = _tiny()
    spec = _spec()
    ref = D.run(init, tokens, dict(spec, rounds=spec["rounds"]))
    got = run(init, tokens, spec)
    d = _maxdiff(ref, got)
    print(f"streaming_ref self-test: F=1 tau=0 alpha=0 fp32 vs diloco_ref: max abs diff {d}")
    assert d == 0.0, "F=1, tau=0, alpha=0, fp32 must equal sync DiLoCo bit for bit"
    # the schedule: H=4, F=2 -> o = 0, 2; syncs of g0 at 4, 8, 12; g1 at 2, 6, 10; merges tau later
    tr = []
    run(init, tokens, _spec(fragments=2, overlap_steps=1), trace=tr)
    want = [(2, "sync", 1), (3, "merge", 1), (4, "sync", 0), (5, "merge", 0), (6, "sync", 1), (7, "merge", 1),
            (8, "sync", 0), (9, "merge", 0), (10, "sync", 1), (11, "merge", 1), (12, "sync", 0)]
    assert tr == want, tr
    print("streaming_ref self-test: F=2 tau=1 schedule ok")
    # eager with one replica: the estimate is the true step (own delta = the mean), so eager with
    # any tau equals tau = 0 up to fp32 rounding
    s1 = dict(_spec(fragments=2, overlap_steps=0), replicas=1)
    s2 = dict(_spec(fragments=2, overlap_steps=2, eager=True), replicas=1)
    a, b = run(init, tokens, s1), run(init, tokens, s2)
    rel = max(float((a[k] - b[k]).abs().max() / a[k].abs().max()) for k in a)
    print(f"streaming_ref self-test: R=1 eager tau=2 vs tau=0: max relative diff {rel:.2e}")
    assert rel < 1e-4
    # the eager estimate through the eager base E (what travels) equals torch's Nesterov step on the
    # eager outer gradient dbar_prev + (d_new - d_prev)/R from (G, u) (EAGER.md, E1 = E2)
    g = torch.Generator().manual_seed(3)
    G0, G1 = torch.randn(50, generator=g), None
    d_prev = [torch.randn(50, generator=g) * 0.01 for _ in range(3)]
    d_new = [torch.randn(50, generator=g) * 0.01 for _ in range(3)]
    eta, mu, R = 0.7, 0.9, 3
    p = G0.clone().requires_grad_(True)
    opt = torch.optim.SGD([p], lr=eta, momentum=mu, nesterov=True)
    p.grad = torch.randn(50, generator=g) * 0.01
    opt.step()  # a first version, so that u != dbar
    p.grad = sum(d_prev) / R
    opt.step()
    G1, u1, dbar1 = p.detach().clone(), opt.state[p]["momentum_buffer"].clone(), p.grad.clone()
    Ebase = G1 - eta * (dbar1 + mu * (mu * u1 + dbar1))
    for r in range(R):
        via_e = Ebase - (eta * (1 + mu)) * ((d_new[r] - d_prev[r]) / R)
        q = G1.clone().requires_grad_(True)
        o2 = torch.optim.SGD([q], lr=eta, momentum=mu, nesterov=True)
        o2.state[q]["momentum_buffer"] = u1.clone()
        q.grad = dbar1 + (d_new[r] - d_prev[r]) / R
        o2.step()
        assert float((via_e - q.detach()).abs().max()) < 1e-6 * float(G1.abs().max())
    print("streaming_ref self-test: eager estimate via E = direct Nesterov step on the eager outer gradient")
    for c in CODECS:
        o = run(init, tokens, _spec(fragments=2, overlap_steps=1, alpha=0.5, codec=c, block_floats=64, eager=True))
        assert all(torch.isfinite(v).all() for v in o.values())
    print("streaming_ref self-test: every codec with eager F=2 tau=1 alpha=0.5 runs")
    print("streaming_ref self-test: OK")
    return 0


def cli(name, run_fn, self_test_fn, limit_flag, limit_help, argv=None):
    """The oracles' command line (streaming_ref, sparse_ref): simulate SPEC from INIT on DATA with
    run_fn(init, tokens, spec, limit), then --out / --eval / --compare; --self-test runs
    self_test_fn. limit_flag (e.g. "--steps-done") stops early, to compare with an older export."""
    ap = argparse.ArgumentParser(prog=name)
    ap.add_argument("--init")
    ap.add_argument("--data", nargs="+")
    ap.add_argument("--spec")
    ap.add_argument("--compare")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument(limit_flag, dest="limit", type=int, default=None, help=limit_help)
    ap.add_argument("--out", help="write the final global parameters to this safetensors file")
    ap.add_argument("--eval", nargs="+", help="print the mean CE of the final global on these shards")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test_fn()
    if not (a.init and a.data and a.spec):
        ap.error("--init, --data and --spec are required (or --self-test)")
    spec = json.load(open(a.spec))
    init = D.load_model(a.init)
    ref = run_fn(init, D.load_tokens(a.data), spec, a.limit)
    if a.out:
        write_safetensors(a.out, ref)
    if a.eval:
        print(f"{name}: eval loss {eval_loss(init[0], ref, D.load_tokens(a.eval), spec['batch'], spec['seq_len']):.6f}")
    if not a.compare:
        return 0
    return D.compare(ref, init[1], a.compare, a.tol, name)


def main():
    return cli("streaming_ref", run, self_test, "--steps-done",
               "stop after this many inner steps (compare with an older export)")


if __name__ == "__main__":
    sys.exit(main())
