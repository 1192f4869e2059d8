#!/usr/bin/env python3
"""muon_ref.py — PyTorch reference of the MuLoCo inner optimizer (docs/design.md §3.2): Muon on
the transformer blocks' matrices, AdamW on everything else, one global gradient clip first.

Muon is torch.optim.Muon's step (PyTorch 2.9, torch/optim/_muon.py) rewritten here because the
torch this tree tests with predates it; the one deliberate difference is that Newton-Schulz runs
in fp32 (torch runs it in bf16), as dipaco's kernels do:
  buf <- lerp(buf, g, 1 - mu);  U = lerp(g, buf, mu) if nesterov else buf
  X = U as an [out, in] matrix (A x B), transposed when A > B;  X /= max(|X|_F, 1e-7)
  ns_steps times: G = X X^T;  G2 = addmm(G, G, G, beta=b, alpha=c);  X = addmm(X, G2, X, beta=a)
  theta *= 1 - lr wd;  theta -= lr adjust X (back in theta's orientation)
with (a, b, c) = (3.4445, -4.7750, 2.0315) and adjust sqrt(max(1, A/B)) ("original") or
0.2 sqrt(max(A, B)) ("match_rms_adamw"). GPT-2's Conv1D weights are stored [in, out]: Muon sees
their transpose. The Muon learning rate follows the AdamW schedule: muon.lr * lr_t / inner.lr.

diloco_ref.make_adamw builds this optimizer when the spec's inner.optimizer is "muon", so every
reference built on diloco_ref (DiLoCo, DiPaCo, SparseLoCo, ...) gets it. Standalone, this file is
the oracle of `dipacoctl train --optimizer muon`:
  muon_ref.py --init MODEL_DIR --data SHARD --spec SPEC.json --compare TRAINED_DIR
              [--state STATE.bin] [--tol 5e-5]
(AdamW eps 1e-6 in exactness tests, docs/design.md §3.2) runs spec["steps"] inner steps on batches 0, 1, ... of B x T (dipacoctl train's order) and
compares the parameters (and, with --state, the momentum buffers that `train --opt-state-out`
wrote: m then v, canonical layout) per tensor, max|a-b| / max|b|; exits 1 above --tol."""
import argparse, json, math, os, re, sys
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NS_A, NS_B, NS_C = 3.4445, -4.7750, 2.0315
_MUON = re.compile(r"^(h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)|"
                   r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj))\.weight$")


def is_muon(name):
    """A transformer block's matrix (kernels/gpt_layout.c marks the same ones)."""
    return _MUON.match(name) is not None


def conv1d(name):
    return name.startswith("h.")


def newton_schulz(U, steps, eps=1e-7):
    X = U.float()
    tall = X.size(0) > X.size(1)
    if tall:
        X = X.T
    X = X / X.norm().clamp(min=eps)
    for _ in range(steps):
        G = X @ X.T
        G2 = torch.addmm(G, G, G, beta=NS_B, alpha=NS_C)
        X = torch.addmm(X, G2, X, beta=NS_A)
    return X.T if tall else X


def adjust(kind, A, B):
    if kind == "match_rms_adamw":
        return 0.2 * math.sqrt(max(A, B))
    return math.sqrt(max(1.0, A / B))


class Inner:
    """AdamW on the non-Muon tensors and Muon on the Muon ones, stepped together. param_groups
    are AdamW's plus one for Muon; a caller sets every group's "lr" to the scheduled AdamW rate
    and Muon runs at that times muon.lr / inner.lr."""

    def __init__(self, P, inner):
        mu = inner.get("muon", {})
        self.muon = [(k, p) for k, p in P.items() if is_muon(k)]
        rest = [p for k, p in P.items() if not is_muon(k)]
        self.adamw = torch.optim.AdamW([{"params": [p for p in rest if p.dim() == 2], "weight_decay": inner["weight_decay"]},
                                        {"params": [p for p in rest if p.dim() != 2], "weight_decay": 0.0}],
                                       lr=inner["lr"], betas=(inner["beta1"], inner["beta2"]), eps=inner["eps"])
        self.scale = mu.get("lr", 0.02) / inner["lr"]
        self.mom = mu.get("momentum", 0.95)
        self.nesterov = mu.get("nesterov", True)
        self.steps = mu.get("ns_steps", 5)
        self.wd = mu.get("weight_decay", inner["weight_decay"])
        self.adjust = mu.get("adjust_lr", "original")
        self.group = {"lr": inner["lr"]}
        self.param_groups = self.adamw.param_groups + [self.group]
        self.buf = {k: torch.zeros_like(p) for k, p in self.muon}

    def zero_grad(self, set_to_none=True):
        self.adamw.zero_grad(set_to_none=set_to_none)
        for _, p in self.muon:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.adamw.step()
        lr = self.group["lr"] * self.scale
        for k, p in self.muon:
            g, buf = p.grad, self.buf[k]
            buf.lerp_(g, 1 - self.mom)
            U = g.lerp(buf, self.mom) if self.nesterov else buf
            M = U.T if conv1d(k) else U  # [out, in]
            A, B = M.shape
            O = newton_schulz(M, self.steps)
            p.mul_(1 - lr * self.wd)
            p.add_(O.T if conv1d(k) else O, alpha=-lr * adjust(self.adjust, A, B))

def moments(opt, P):
    """{name: (m, v)} as dipaco keeps them: AdamW's moments; Muon's buffer in m with v zero."""
    adamw, buf = (opt.adamw, opt.buf) if hasattr(opt, "buf") else (opt, {})
    out = {}
    for k, p in P.items():
        if k in buf:
            out[k] = (buf[k], torch.zeros_like(p))
        else:
            st = adamw.state.get(p, {})
            out[k] = (st.get("exp_avg", torch.zeros_like(p)), st.get("exp_avg_sq", torch.zeros_like(p)))
    return out


def rel(a, b):
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


def main():
    from diloco_ref import batch_at, forward, load_model, load_tokens, lr_at, make_adamw
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--compare", required=True)
    ap.add_argument("--state")
    ap.add_argument("--tol", type=float, default=5e-5)
    a = ap.parse_args()
    spec = json.load(open(a.spec))
    inner, steps, B, T = spec["inner"], spec["steps"], spec["batch"], spec["seq_len"]
    cfg, P0 = load_model(a.init)
    tokens = load_tokens(a.data)
    P = {k: v.clone().requires_grad_(True) for k, v in P0.items()}
    opt = make_adamw(P, inner)
    nb = (len(tokens) - 1) // (B * T)
    for s in range(steps):
        x, y = batch_at(tokens, s, 0, 1, nb, B, T)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(inner["lr"], inner["warmup"], steps, inner["lr_min_frac"], s)
        opt.zero_grad(set_to_none=True)
        forward(P, cfg, x, y).backward()
        if inner["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(P.values()), inner["grad_clip"])
        opt.step()
    _, got = load_model(a.compare)
    worst, worst_m, fail = 0.0, 0.0, 0
    for k, v in P.items():
        e = rel(got[k], v.detach())
        worst = max(worst, e)
        if e > a.tol:
            print(f"{k}: max relative error {e:.3e} > {a.tol}")
            fail = 1
    moved = max(float((P[k].detach() - P0[k]).abs().max()) for k in P)
    if a.state:
        n = sum(v.numel() for v in P.values())
        raw = torch.from_numpy(np.fromfile(a.state, dtype=np.float32))
        if raw.numel() != 2 * n:
            print(f"{a.state}: {raw.numel()} floats, expected {2 * n}")
            return 1
        mom, off = moments(opt, P), 0
        for k, v in P.items():  # the canonical layout is the model directory's tensor order
            m_got = raw[off:off + v.numel()].view(v.shape)
            v_got = raw[n + off:n + off + v.numel()].view(v.shape)
            off += v.numel()
            m_ref, v_ref = mom[k]
            muon_k = hasattr(opt, "buf") and k in opt.buf
            for what, e in [("m", rel(m_got, m_ref))] + ([] if muon_k else [("v", rel(v_got, v_ref))]):
                worst_m = max(worst_m, e)
                if e > a.tol:
                    print(f"{k}: state {what} error {e:.3e} > {a.tol}")
                    fail = 1
            if muon_k and float(v_got.abs().max()) != 0.0:
                print(f"{k}: v must stay zero at a Muon tensor, max {float(v_got.abs().max()):.3e}")
                fail = 1
    print(f"muon_ref: {len(P)} tensors ({sum(is_muon(k) for k in P)} Muon), worst parameter error {worst:.3e}, "
          f"worst state error {worst_m:.3e} (tol {a.tol}); largest change from init {moved:.3e}")
    if moved == 0.0:
        print("muon_ref: parameters did not move: the comparison would be vacuous")
        return 1
    return fail


if __name__ == "__main__":
    sys.exit(main())
