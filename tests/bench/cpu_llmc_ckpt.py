#!/usr/bin/env python3
"""cpu_llmc_ckpt.py — converts a dipaco model directory (model.safetensors in Hugging Face
GPT-2 names, Conv1D [in, out] weights; config.json) into llm.c's train_gpt2.c checkpoint
(header magic 20240326 version 3, then float32 wte padded to Vp rows, wpe, and the per-layer
tensors stacked over layers in llm.c's order with Linear [out, in] weights), so that
tests/bench/cpu_llmc.c trains llm.c on the same weights as dipaco and PyTorch.
Usage: cpu_llmc_ckpt.py MODEL_DIR OUT.bin"""
import json, struct, sys
import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}, expected F32")
        a, b = t["data_offsets"]
        out[name.removeprefix("transformer.")] = np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"])
    return out


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    d, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(f"{d}/config.json"))
    L, NH, C, V, maxT = cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    Vp = (V + 127) // 128 * 128
    w = read_safetensors(f"{d}/model.safetensors")
    wte = np.zeros((Vp, C), np.float32)
    wte[:V] = w["wte.weight"]
    per = lambda key, t=False: np.stack([w[f"h.{l}.{key}"].T if t else w[f"h.{l}.{key}"] for l in range(L)])
    tensors = [wte, w["wpe.weight"], per("ln_1.weight"), per("ln_1.bias"), per("attn.c_attn.weight", True),
               per("attn.c_attn.bias"), per("attn.c_proj.weight", True), per("attn.c_proj.bias"),
               per("ln_2.weight"), per("ln_2.bias"), per("mlp.c_fc.weight", True), per("mlp.c_fc.bias"),
               per("mlp.c_proj.weight", True), per("mlp.c_proj.bias"), w["ln_f.weight"], w["ln_f.bias"]]
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
    with open(out, "wb") as f:
        f.write(header.tobytes())
        for t in tensors:
            f.write(np.ascontiguousarray(t, dtype=np.float32).tobytes())


if __name__ == "__main__":
    main()
