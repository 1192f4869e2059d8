#!/usr/bin/env python3
"""diloco_ref.py — PyTorch reference of synchronous DiLoCo (docs/design.md §3), the oracle for
dipaco's distributed and single-process DiLoCo tests.

R replicas, each a torch GPT-2 (functional, from Hugging Face-named tensors in Conv1D layout) or,
for a Llama-family config.json (model_type llama / qwen2), the LlamaForCausalLM of
tests/oracle/llama_oracle.py run on the same named tensors (functional_call), each with its own torch.optim.AdamW
(or, with inner.optimizer "muon", tests/oracle/muon_ref.py's Muon + AdamW) kept across rounds (inner_state keep) or recreated each round
(reset); each round every replica starts from the global parameters, trains H steps on its
strided batches (batch index round·H + h, replica r of R), and the averaged delta
(θ_global − θ_replica, summed in replica order) is applied by torch.optim.SGD(nesterov=True).

  diloco_ref.py --init MODEL_DIR --data SHARD... --spec SPEC.json --compare EXPORTED_DIR [--tol 1e-4]
prints the max relative error per tensor (max|a−b| / max|b|) and exits 1 above --tol.
The spec must set every inner/outer hyperparameter explicitly (no defaults are assumed)."""
import argparse, json, math, os, struct, sys
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from torch.func import functional_call
except ImportError:  # torch < 2.0
    from torch.nn.utils.stateless import functional_call

torch.set_num_threads(1)
DT = {"F32": (np.float32, 4), "BF16": (None, 2)}


def read_safetensors(path):
    raw = open(path, "rb").read()
    (hl,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + hl])
    base = 8 + hl
    out = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        assert info["dtype"] == "F32", f"{path}: {name}: only F32 in the oracle"
        arr = np.frombuffer(raw[base + a:base + b], dtype=np.float32).reshape(info["shape"])
        out[name[len("transformer."):] if name.startswith("transformer.") else name] = torch.from_numpy(arr.copy())
    return out


def load_model(d):
    cfg = json.load(open(d + "/config.json"))
    return cfg, read_safetensors(d + "/model.safetensors")


def load_tokens(paths):
    parts = []
    for p in paths:
        h = np.fromfile(p, dtype=np.int32, count=256)
        assert h[0] == 20240520 and (h[1] == 1 or (h[1] == 2 and h[3] == 4)), p
        # version 1: uint16 tokens; version 2: uint32 (docs/design.md §6.1)
        parts.append(np.fromfile(p, dtype=np.uint16 if h[1] == 1 else np.uint32, offset=1024, count=int(h[2])))
    return torch.from_numpy(np.concatenate(parts).astype(np.int64))


class _LlamaHidden(torch.nn.Module):
    """model.norm's output of a llama_oracle.py module (under "m."), for functional_call."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, idx):
        m, T = self.m, idx.shape[1]
        x = m.model.embed_tokens(idx)
        cos, sin = m.cos[:T][None, None], m.sin[:T][None, None]
        for layer in m.model.layers:
            x = layer(x, cos, sin)
        return m.model.norm(x)


def hidden(P, cfg, idx):
    """ln_f output (B, T, C) of the GPT-2 of docs/design.md §3, or model.norm's of a Llama (the
    DiPaCo routing feature)."""
    if is_llama(cfg):
        return functional_call(_LlamaHidden(llama_module(cfg)), {"m." + k: v for k, v in P.items()}, (idx,))
    B, T = idx.shape
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    x = P["wte.weight"][idx] + P["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(L):
        g = lambda k: P[f"h.{l}.{k}"]
        h = F.layer_norm(x, (C,), g("ln_1.weight"), g("ln_1.bias"), 1e-5)
        q, k, v = (h @ g("attn.c_attn.weight") + g("attn.c_attn.bias")).split(C, dim=2)
        q = q.view(B, T, NH, C // NH).transpose(1, 2)
        k = k.view(B, T, NH, C // NH).transpose(1, 2)
        v = v.view(B, T, NH, C // NH).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // NH)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ g("attn.c_proj.weight") + g("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), g("ln_2.weight"), g("ln_2.bias"), 1e-5)
        h = F.gelu(h @ g("mlp.c_fc.weight") + g("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ g("mlp.c_proj.weight") + g("mlp.c_proj.bias")
    return F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)


def is_llama(cfg):
    return cfg.get("model_type") in ("llama", "qwen2")


_LLAMA = {}


def llama_module(cfg):
    """The llama_oracle.py module for an HF LlamaConfig / Qwen2Config dict (built once per config)."""
    key = json.dumps(cfg, sort_keys=True)
    if key not in _LLAMA:
        from llama_oracle import LlamaForCausalLM
        rs = cfg.get("rope_scaling") or {}
        llama3 = rs.get("rope_type", rs.get("type")) == "llama3"
        k = dict(n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"], n_embd=cfg["hidden_size"],
                 n_positions=cfg["max_position_embeddings"], vocab_size=cfg["vocab_size"],
                 n_kv_head=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                 intermediate_size=cfg["intermediate_size"], tie_word_embeddings=int(cfg.get("tie_word_embeddings", False)),
                 attention_bias=int(cfg["model_type"] == "qwen2"), rope_scaling=1 if llama3 else 0,
                 rope_original_max_position_embeddings=rs.get("original_max_position_embeddings", 0),
                 rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=cfg.get("rope_theta", 10000.0),
                 rope_factor=rs.get("factor", 0.0), rope_low_freq_factor=rs.get("low_freq_factor", 0.0),
                 rope_high_freq_factor=rs.get("high_freq_factor", 0.0))
        _LLAMA[key] = LlamaForCausalLM(k)
    return _LLAMA[key]


def forward(P, cfg, idx, tgt):
    if is_llama(cfg):
        m = llama_module(cfg)
        assert sorted(P) == sorted(n for n, _ in m.named_parameters()), "tensor names differ from HF's"
        logits = functional_call(m, P, (idx,))
    else:
        logits = hidden(P, cfg, idx) @ P["wte.weight"].t()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))


def lr_at(lr, warmup, total, fmin, s):
    if s < warmup:
        return lr * (s + 1) / warmup
    p = min(1.0, (s - warmup) / (total - warmup)) if total > warmup else 1.0
    return lr * (fmin + (1 - fmin) * 0.5 * (1 + math.cos(math.pi * p)))


def make_adamw(P, inner):
    """The inner optimizer of a replica: torch.optim.AdamW, or with inner.optimizer "muon" Muon on
    the block matrices and AdamW on the rest (muon_ref.Inner; the same param_groups protocol)."""
    if inner.get("optimizer", "adamw") == "muon":
        from muon_ref import Inner
        return Inner(P, inner)
    decay = [p for p in P.values() if p.dim() == 2]
    other = [p for p in P.values() if p.dim() != 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": inner["weight_decay"]},
                              {"params": other, "weight_decay": 0.0}],
                             lr=inner["lr"], betas=(inner["beta1"], inner["beta2"]), eps=inner["eps"])


def schedule_of(spec):
    """(warm-up, decay) of the spec's momentum schedule: as given, or where left out the default
    a new job gets (coordinator/jobspec.c jobspec_derive_schedule): ceil(rounds / 10) and
    ceil(rounds / 5) for a sync job with outer momentum and without eager updates, else 0."""
    outer, rounds = spec["outer"], spec["rounds"]
    on = (spec.get("algorithm", "diloco") != "diloco-async" and outer.get("momentum", 0) > 0
          and not spec.get("streaming", {}).get("eager", False))
    return (outer.get("momentum_warmup", (rounds + 9) // 10 if on else 0),
            outer.get("momentum_decay", (rounds + 4) // 5 if on else 0))


def momentum_at(spec, t):
    """The outer momentum of step t (0-based) of the spec's rounds under its momentum schedule
    (kernels/outer.c outer_momentum_at): the smaller of the warm-up factor (t + 1) / warmup and
    the decay factor (rounds - 1 - t) / decay, computed in double and rounded to fp32 once, as
    the coordinator does."""
    rounds = spec["rounds"]
    mu = struct.unpack("f", struct.pack("f", spec["outer"]["momentum"]))[0]
    k, n = 1, 1
    warm, dec = schedule_of(spec)
    if warm > 0 and t < warm:
        k, n = t + 1, warm
    if dec > 0 and t >= rounds - dec:
        kd = max(rounds - 1 - t, 0)
        if kd * n < k * dec:
            k, n = kd, dec
    if k == n:
        return mu
    return struct.unpack("f", struct.pack("f", mu * k / n))[0]


def batch_at(tokens, s, r, R, nb, B, T):
    """Inputs and targets of batch s of replica r of R (docs/design.md §3 data order)."""
    o = ((s * R + r) % nb) * B * T
    return tokens[o:o + B * T].view(B, T), tokens[o + 1:o + B * T + 1].view(B, T)


def inner_step(P, opt, cfg, inner, total, s, x, y):
    """One AdamW inner step at global step s (LR schedule over total steps, clipping)."""
    for grp in opt.param_groups:
        grp["lr"] = lr_at(inner["lr"], inner["warmup"], total, inner["lr_min_frac"], s)
    opt.zero_grad(set_to_none=True)
    forward(P, cfg, x, y).backward()
    if inner["grad_clip"] > 0:
        torch.nn.utils.clip_grad_norm_(list(P.values()), inner["grad_clip"])
    opt.step()


def run(init, tokens, spec, stop_after=None, delta_hook=None):
    """Sync DiLoCo; returns the final global parameters. delta_hook(t, r, delta), if given, maps
    replica r's delta of round t ({name: fp32 tensor}, base - local) to the delta that is averaged
    (sparse_ref.py's error feedback and codec live there); called in replica order."""
    cfg, G0 = init
    R, H, rounds = spec["replicas"], spec["inner_steps"], spec["rounds"]
    B, T = spec["batch"], spec["seq_len"]
    inner, outer = spec["inner"], spec["outer"]
    names = list(G0.keys())
    G = {k: v.clone().requires_grad_(True) for k, v in G0.items()}
    outer_opt = torch.optim.SGD(list(G.values()), lr=outer["lr"], momentum=outer["momentum"],
                                nesterov=outer.get("nesterov", True))
    reps = [{k: v.detach().clone().requires_grad_(True) for k, v in G0.items()} for _ in range(R)]
    opts = [make_adamw(P, inner) for P in reps]
    nb = (len(tokens) - 1) // (B * T)
    total = rounds * H
    for t in range(rounds if stop_after is None else stop_after):
        deltas = []
        for r in range(R):
            P = reps[r]
            if inner.get("state", "keep") == "reset":
                opts[r] = make_adamw(P, inner)
            with torch.no_grad():
                for k in names:
                    P[k].copy_(G[k])
            for h in range(H):
                s = t * H + h
                x, y = batch_at(tokens, s, r, R, nb, B, T)
                inner_step(P, opts[r], cfg, inner, total, s, x, y)
            d = {k: (G[k].detach() - P[k].detach()) for k in names}
            deltas.append(d if delta_hook is None else delta_hook(t, r, d))
        with torch.no_grad():
            for k in names:
                acc = torch.zeros_like(G[k])
                for d in deltas:
                    acc += d[k]
                G[k].grad = acc / R
        for grp in outer_opt.param_groups:
            grp["momentum"] = momentum_at(spec, t)
        outer_opt.step()
    return {k: v.detach() for k, v in G.items()}


def compare(ref, init, export_dir, tol, name):
    """The exported parameters in export_dir against ref (max |a-b| / max |b| per tensor); 0 when
    every tensor is within tol and the parameters moved from init at all, else 1."""
    _, got = load_model(export_dir)
    worst = 0.0
    for k, v in ref.items():
        if k not in got:
            print(f"missing tensor {k} in {export_dir}")
            return 1
        g = got[k]
        if tuple(g.shape) != tuple(v.shape):
            print(f"{k}: shape {tuple(g.shape)} != {tuple(v.shape)}")
            return 1
        err = float((g - v).abs().max() / max(float(v.abs().max()), 1e-30))
        worst = max(worst, err)
        if err > tol:
            print(f"{k}: max relative error {err:.3e} > {tol}")
    moved = max(float((ref[k] - init[k]).abs().max()) for k in ref)
    print(f"{name}: {len(ref)} tensors, worst max relative error {worst:.3e} (tol {tol}); "
          f"largest parameter change from init {moved:.3e}")
    if moved == 0.0:
        print(f"{name}: parameters did not move: the comparison would be vacuous")
        return 1
    return 0 if worst <= tol else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", required=True)
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--compare", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--rounds-done", type=int, default=None,
                    help="compare with the parameters after this many rounds (an exported older version)")
    a = ap.parse_args()
    spec = json.load(open(a.spec))
    ref = run(load_model(a.init), load_tokens(a.data), spec, a.rounds_done)
    return compare(ref, load_model(a.init)[1], a.compare, a.tol, "diloco_ref")


if __name__ == "__main__":
    sys.exit(main())
