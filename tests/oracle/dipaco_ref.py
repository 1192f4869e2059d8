#!/usr/bin/env python3
"""dipaco_ref.py — PyTorch reference of synchronous DiPaCo with per-path data (docs/design.md §3),
the oracle for the distributed DiPaCo test (tests/integration/dipaco_dist.sh).

Levels cut the model into modules (level 0: the stem — wte/wpe/ln_f, or Llama's embed_tokens, norm
and lm_head — plus layers [0, e0); level l:
layers [b_l, e_l)); path p picks module (p // prod(K_{l'>l})) % K_l at level l. Slot (p, r) is a
torch GPT-2 (or Llama, diloco_ref.forward) with its own torch.optim.AdamW kept across rounds; each round it starts from its
path's global modules and trains H steps on path p's own token stream (data.paths[p], resolved
under --data-dir like a worker does), batch index round·H + h of replica r of R. A module's
outer gradient is the uniform mean of the deltas of every slot whose path holds it, summed by
path then replica; one torch.optim.SGD(nesterov=True) per module.

With a "sparse" block in the spec (SparseLoCo deltas, tests/oracle/sparse_ref.py) each slot's
delta is replaced by its sparse stream s, with an error-feedback buffer per slot: the codec
chunks every tensor on its own, so encoding a slot's modules one by one (what the workers do)
equals encoding its whole parameter list at once; the outer gradient is the mean of the s.

  dipaco_ref.py --init MODEL_DIR --spec SPEC.json --data-dir DIR --compare PREFIX [--tol 1e-4]
compares the export of path p at PREFIX<p> (a model directory) for every path and exits 1 when
any tensor's max relative error (max|a−b| / max|b|) is above --tol."""
import argparse, glob, json, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from diloco_ref import forward, load_model, load_tokens, lr_at, make_adamw, momentum_at  # noqa: E402

torch.set_num_threads(1)


def layer_of(name):
    """The layer of a GPT-2 ("h.N.") or Llama ("model.layers.N.") tensor; -1 for the stem."""
    if name.startswith("model.layers."):
        return int(name.split(".")[2])
    return int(name.split(".")[1]) if name.startswith("h.") else -1


def n_layer_of(cfg):
    return cfg["num_hidden_layers"] if "num_hidden_layers" in cfg else cfg["n_layer"]


def structure(spec, n_layer):
    levels = spec.get("levels") or [{"stem": True, "layers": [0, n_layer], "modules": 1}]
    Ks = [lv["modules"] for lv in levels]
    n_paths = 1
    for k in Ks:
        n_paths *= k
    first = [sum(Ks[:l]) for l in range(len(Ks))]

    def level_of(name):
        li = layer_of(name)
        if li < 0:
            return 0
        for l, lv in enumerate(levels):
            if lv["layers"][0] <= li < lv["layers"][1]:
                return l
        raise ValueError(name)

    def path_modules(p):
        mods = []
        for l in range(len(Ks)):
            below = 1
            for k in Ks[l + 1:]:
                below *= k
            mods.append(first[l] + (p // below) % Ks[l])
        return mods

    return n_paths, level_of, path_modules, sum(Ks)


def sparse_hook(init, spec, n_slots):
    """delta_hook for run(): SparseLoCo's error feedback and codec (sparse_ref.py), one buffer per slot."""
    import numpy as np
    import sparse_ref as SR
    cfg, G0 = init
    sp = SR.sparse_cfg(spec)
    rho, chunk, bits, beta = float(sp["density"]), int(sp["chunk"]), int(sp["value_bits"]), np.float32(sp["ef_beta"])
    names = SR.layout(cfg, G0.keys())
    lens = [G0[k].numel() for k in names]
    reset = spec["inner"].get("state", "keep") == "reset"
    E = [np.zeros(sum(lens), dtype=np.float32) for _ in range(n_slots)]

    def hook(t, i, d):
        delta = np.concatenate([d[k].reshape(-1).numpy().astype(np.float32) for k in names])
        e = np.zeros_like(delta) if reset else E[i]
        e = (beta * e).astype(np.float32) + delta
        s, E[i] = SR.sparse_encode(e, lens, rho, chunk, bits)
        out, o = {}, 0
        for k, n in zip(names, lens):
            out[k] = torch.from_numpy(s[o:o + n].copy()).view_as(d[k])
            o += n
        return out

    return hook


def run(init, spec, data_dir, delta_hook=None):
    """The exported parameters of every path; delta_hook(round, slot index, {name: delta}), if
    given, returns what each slot sends instead of its delta."""
    cfg, G0 = init
    R, H, rounds = spec["replicas"], spec["inner_steps"], spec["rounds"]
    B, T = spec["batch"], spec["seq_len"]
    inner, outer = spec["inner"], spec["outer"]
    names = list(G0.keys())
    n_paths, level_of, path_modules, n_modules = structure(spec, n_layer_of(cfg))
    lists = spec["data"]["paths"]
    assert len(lists) == n_paths, "data.paths: one list per path"
    tokens = []
    for lst in lists:
        files = []
        for pat in lst:
            files += sorted(glob.glob(os.path.join(data_dir, pat)))
        tokens.append(load_tokens(files))
    # Global parameters: one copy of each tensor per module of its level.
    G = {m: {} for m in range(n_modules)}
    for p in range(n_paths):
        mods = path_modules(p)
        for k in names:
            m = mods[level_of(k)]
            if k not in G[m]:
                G[m][k] = G0[k].clone().requires_grad_(True)
    outer_opts = {m: torch.optim.SGD(list(G[m].values()), lr=outer["lr"], momentum=outer["momentum"],
                                     nesterov=outer.get("nesterov", True)) for m in G}
    slots = [(p, r) for p in range(n_paths) for r in range(R)]
    reps = {s: {k: v.detach().clone().requires_grad_(True) for k, v in G0.items()} for s in slots}
    opts = {s: make_adamw(reps[s], inner) for s in slots}
    total = rounds * H
    for t in range(rounds):
        deltas = []  # (path, {name: delta}) in path, replica order
        for i, (p, r) in enumerate(slots):
            P = reps[(p, r)]
            mods = path_modules(p)
            with torch.no_grad():
                for k in names:
                    P[k].copy_(G[mods[level_of(k)]][k])
            tok = tokens[p]
            nb = (len(tok) - 1) // (B * T)
            assert nb > 0, f"path {p}: too little data"
            for h in range(H):
                s = t * H + h
                o = ((s * R + r) % nb) * B * T
                x = tok[o:o + B * T].view(B, T)
                y = tok[o + 1:o + B * T + 1].view(B, T)
                for grp in opts[(p, r)].param_groups:
                    grp["lr"] = lr_at(inner["lr"], inner["warmup"], total, inner["lr_min_frac"], s)
                opts[(p, r)].zero_grad(set_to_none=True)
                forward(P, cfg, x, y).backward()
                if inner["grad_clip"] > 0:
                    torch.nn.utils.clip_grad_norm_(list(P.values()), inner["grad_clip"])
                opts[(p, r)].step()
            d = {k: G[mods[level_of(k)]][k].detach() - P[k].detach() for k in names}
            deltas.append((p, delta_hook(t, i, d) if delta_hook else d))
        with torch.no_grad():
            for m in G:
                for k in G[m]:
                    acc = torch.zeros_like(G[m][k])
                    n = 0
                    for (p, d) in deltas:
                        if path_modules(p)[level_of(k)] == m:
                            acc += d[k]
                            n += 1
                    G[m][k].grad = acc / n
        for m in G:
            for grp in outer_opts[m].param_groups:
                grp["momentum"] = momentum_at(spec, t)  # every module steps once a round
            outer_opts[m].step()
    out = []
    for p in range(n_paths):
        mods = path_modules(p)
        out.append({k: G[mods[level_of(k)]][k].detach() for k in names})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--compare", required=True, help="path p's export is PREFIX<p>")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    spec = json.load(open(a.spec))
    init = load_model(a.init)
    hook = None
    if "sparse" in spec:
        n_paths = structure(spec, n_layer_of(init[0]))[0]
        hook = sparse_hook(init, spec, n_paths * spec["replicas"])
    ref = run(init, spec, a.data_dir, hook)
    worst, bad = 0.0, 0
    for p, rp in enumerate(ref):
        _, got = load_model(f"{a.compare}{p}")
        pw = 0.0
        for k, v in rp.items():
            g = got[k]
            err = float((g - v).abs().max() / max(float(v.abs().max()), 1e-30))
            pw = max(pw, err)
            if err > a.tol:
                print(f"path {p}: {k}: max relative error {err:.3e} > {a.tol}")
                bad += 1
        moved = max(float((rp[k] - init[1][k]).abs().max()) for k in rp)
        print(f"dipaco_ref: path {p}: worst max relative error {pw:.3e} (tol {a.tol}); largest change from init {moved:.3e}")
        if moved == 0.0:
            print("dipaco_ref: parameters did not move: the comparison would be vacuous")
            return 1
        worst = max(worst, pw)
    print(f"dipaco_ref: {len(ref)} paths, worst max relative error {worst:.3e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
