#!/usr/bin/env python3
"""formats_interop.py — PyTorch interop of dipaco's model directories (docs/design.md §6).

The python side reads and writes safetensors with its own struct+json code (no safetensors
package), following the format spec, and knows the Hugging Face GPT-2 names and shapes on
its own. Checks:
  (a) a GPT-2 state dict written HF-style (transformer. prefix, Conv1D [in, out] weights,
      attention mask buffers, tied lm_head, sorted names) loads in dipaco bit-exactly;
  (b) a model dir written by dipaco reads back here bit-exactly, with the names, shapes,
      dtypes and config.json keys HF GPT-2 expects;
  (c) BF16 and F16 files load as the right floats;
  plus: a torch.nn.Linear-layout (transposed) file is refused naming the tensor.
usage: formats_interop.py FORMATS_TOOL
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

TOOL = sys.argv[1]
DT = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2)}
DT_OF = {v[0]: k for k, v in DT.items()}


def st_save(path, tensors, metadata=None):
    """safetensors writer: header JSON padded with spaces to 8 bytes, data in name order."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy().tobytes()
        header[name] = {"dtype": DT_OF[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_load(path):
    """safetensors reader with the checks the spec asks for; returns (tensors, metadata, header_len)."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header length beyond file"
    header = json.loads(data[8:8 + n].decode())
    body = data[8 + n:]
    meta = header.pop("__metadata__", None)
    out, spans = {}, []
    for name, info in header.items():
        dtype, size = DT[info["dtype"]]
        b, e = info["data_offsets"]
        assert e - b == size * int(np.prod(info["shape"], dtype=np.int64)), name
        spans.append((b, e))
        raw = np.frombuffer(body[b:e], dtype=np.float32 if size == 4 else np.int16).copy()
        t = torch.from_numpy(raw)
        if size == 2:
            t = t.view(dtype)
        out[name] = t.reshape(info["shape"])
    spans.sort()
    pos = 0
    for b, e in spans:
        assert b == pos, "hole or overlap in the data section"
        pos = e
    assert pos == len(body), "trailing bytes"
    return out, meta, n


def hf_gpt2_shapes(L, C, T, V):
    """Names and shapes of HF GPT2Model parameters, in dipaco's canonical order."""
    s = [("wte.weight", (V, C)), ("wpe.weight", (T, C)), ("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    for l in range(L):
        p = "h.%d." % l
        s += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
              (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
              (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
              (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
              (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
              (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    return s


def hf_config(L, NH, C, T, V):
    """A config.json as transformers' GPT2Config.save_pretrained writes it."""
    return {"_name_or_path": "gpt2", "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
            "attn_pdrop": 0.1, "bos_token_id": V - 1, "embd_pdrop": 0.1, "eos_token_id": V - 1,
            "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": T,
            "n_embd": C, "n_head": NH, "n_inner": None, "n_layer": L, "n_positions": T,
            "reorder_and_upcast_attn": False, "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False,
            "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
            "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
            "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
            "torch_dtype": "float32", "transformers_version": "4.26.0", "use_cache": True, "vocab_size": V}


def run_tool(*args):
    return subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, text=True)


def tool_load(d, out):
    r = run_tool("load", d, out)
    if r.returncode != 0:
        raise AssertionError("dipaco load failed: " + r.stderr)
    return [int(x) for x in r.stdout.split()], np.fromfile(out, dtype=np.float32)


failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def main():
    tmp = tempfile.mkdtemp(prefix="dpc_interop_")
    L, NH, C, T, V = 2, 4, 16, 24, 50
    shapes = hf_gpt2_shapes(L, C, T, V)
    g = torch.Generator().manual_seed(1234)

    # (a) HF-style state dict -> dipaco.
    sd = {"transformer." + n: torch.randn(s, generator=g) for n, s in shapes}
    for l in range(L):
        sd["transformer.h.%d.attn.bias" % l] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        sd["transformer.h.%d.attn.masked_bias" % l] = torch.tensor(-1e4)
    sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()
    da = os.path.join(tmp, "a")
    os.makedirs(da)
    st_save(os.path.join(da, "model.safetensors"), sd, {"format": "pt"})
    json.dump(hf_config(L, NH, C, T, V), open(os.path.join(da, "config.json"), "w"), indent=2)
    hdr, flat = tool_load(da, os.path.join(tmp, "a.bin"))
    check(hdr[:5] == [L, NH, C, T, V], "(a) config.json read: %s" % hdr[:5])
    want = torch.cat([sd["transformer." + n].reshape(-1) for n, _ in shapes]).numpy()
    check(hdr[5] == want.size and flat.size == want.size, "(a) parameter count %d" % want.size)
    check(flat.size == want.size and flat.view(np.uint32).tobytes() == want.view(np.uint32).tobytes(),
          "(a) HF GPT-2 state dict loads bit-exactly in canonical order")

    # Linear [out, in] layout instead of Conv1D [in, out]: refused, naming the tensor.
    bad = dict(sd)
    bad["transformer.h.1.mlp.c_fc.weight"] = bad["transformer.h.1.mlp.c_fc.weight"].t().contiguous()
    st_save(os.path.join(da, "model.safetensors"), bad, {"format": "pt"})
    r = run_tool("load", da, os.path.join(tmp, "bad.bin"))
    check(r.returncode == 1 and "h.1.mlp.c_fc.weight" in r.stderr and "[64, 16]" in r.stderr
          and "error -9" in r.stderr, "(a) transposed weight refused: " + r.stderr.strip())
    # A tensor missing: refused, naming it.
    del bad["transformer.h.1.mlp.c_fc.weight"]
    st_save(os.path.join(da, "model.safetensors"), bad, {"format": "pt"})
    r = run_tool("load", da, os.path.join(tmp, "bad.bin"))
    check(r.returncode == 1 and "h.1.mlp.c_fc.weight" in r.stderr and "missing" in r.stderr,
          "(a) missing tensor refused: " + r.stderr.strip())

    # (b) dipaco -> python.
    db = os.path.join(tmp, "b", "export")
    r = run_tool("save", db, 3, 2, 8, 16, 40, 99, os.path.join(tmp, "b.bin"))
    check(r.returncode == 0, "(b) dipaco saves a model dir " + r.stderr.strip())
    ref = np.fromfile(os.path.join(tmp, "b.bin"), dtype=np.float32)
    tensors, meta, hlen = st_load(os.path.join(db, "model.safetensors"))
    shapes_b = hf_gpt2_shapes(3, 8, 16, 40)
    check(meta == {"format": "pt"}, "(b) __metadata__ is {'format': 'pt'} (transformers requires it)")
    check(hlen % 8 == 0, "(b) header padded to 8 bytes")
    check(sorted(tensors) == sorted(n for n, _ in shapes_b), "(b) exactly the HF GPT2Model tensor names")
    check(all(tuple(tensors[n].shape) == s and tensors[n].dtype == torch.float32 for n, s in shapes_b),
          "(b) HF shapes (Conv1D [in, out]) and F32")
    got = torch.cat([tensors[n].reshape(-1) for n, _ in shapes_b]).numpy()
    check(got.size == ref.size and got.view(np.uint32).tobytes() == ref.view(np.uint32).tobytes(),
          "(b) tensors read in python are bit-identical to dipaco's parameters")
    cfg = json.load(open(os.path.join(db, "config.json")))
    expect = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 3, "n_head": 2, "n_embd": 8,
              "n_positions": 16, "n_ctx": 16, "vocab_size": 40, "layer_norm_epsilon": 1e-05,
              "activation_function": "gelu_new"}
    check(all(cfg.get(k) == v for k, v in expect.items()), "(b) config.json has the HF GPT-2 keys")
    # Torch can use the exported Conv1D weights as HF does: y = x @ W + b.
    x = torch.randn(5, 8, generator=g)
    y = x @ tensors["h.0.attn.c_attn.weight"] + tensors["h.0.attn.c_attn.bias"]
    check(tuple(y.shape) == (5, 24), "(b) c_attn acts as Conv1D: [5, 8] @ [8, 24]")
    # And the round trip back through dipaco is exact.
    _, flat_b = tool_load(db, os.path.join(tmp, "b2.bin"))
    check(flat_b.tobytes() == ref.tobytes(), "(b) dipaco reloads its export bit-exactly")

    # (c) BF16 and F16 files.
    for dtname, dt in (("BF16", torch.bfloat16), ("F16", torch.float16)):
        dc = os.path.join(tmp, "c_" + dtname)
        os.makedirs(dc)
        low = {n: (torch.randn(s, generator=g) * 3).to(dt) for n, s in shapes}
        low["wte.weight"][0, :4] = torch.tensor([1.0, -0.0, 65504.0 if dt == torch.float16 else 3e38, 1e-7]).to(dt)
        st_save(os.path.join(dc, "model.safetensors"), low, {"format": "pt"})
        json.dump(hf_config(L, NH, C, T, V), open(os.path.join(dc, "config.json"), "w"))
        _, flat_c = tool_load(dc, os.path.join(tmp, "c.bin"))
        want_c = torch.cat([low[n].float().reshape(-1) for n, _ in shapes]).numpy()
        check(flat_c.tobytes() == want_c.tobytes(), "(c) %s file loads as torch's .float() values bit-exactly" % dtname)

    subprocess.run(["rm", "-rf", tmp])
    if failures:
        print("%d failed" % len(failures))
        sys.exit(1)
    print("all passed")


main()
