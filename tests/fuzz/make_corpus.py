#!/usr/bin/env python3
"""tests/fuzz/make_corpus.py — writes the small seed corpora under tests/fuzz/corpus/<target>/.

Run with $DPC_PYTHON (a python3 with torch) from the repository root; the seeds are committed, so this only needs
re-running when a format changes. Every seed is a valid (or nearly valid) input, so the fuzzers
start past the first checks of each parser. Independent of the C code: formats are written
from their specifications (safetensors, llm.c shards, protobuf wire format by hand)."""
import json
import os
import struct
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- safetensors -----------------------------------------------------------------------------
def safetensors(tensors, meta=None, pad=True):
    hdr, blob = {}, b""
    for name, dtype, shape, raw in tensors:
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    if meta is not None:
        hdr["__metadata__"] = meta
    h = json.dumps(hdr, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + blob


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
put("safetensors", "f32_two", safetensors([("a", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "F32", [3], f32(-1, 0.5, 7))],
                                          {"format": "pt"}))
put("safetensors", "bf16_f16", safetensors([("x", "BF16", [2], b"\x80\x3f\x00\x40"), ("y", "F16", [1, 2], b"\x00\x3c\x00\xc0")]))
put("safetensors", "scalar_empty", safetensors([("s", "I64", [], struct.pack("<q", 5)), ("e", "F32", [0, 3], b""),
                                                ("u", "U8", [3], b"\x01\x02\x03")], {"k": "v"}, pad=False))
put("safetensors", "empty", safetensors([]))

# ---- model weights for the fixed tiny config of fuzz_modeldir_load (L=1, C=4, V=8, P=4) -----
def gpt2_tensors(C=4, V=8, P=4, prefix="", dtype="F32"):
    shapes = [("wte.weight", [V, C]), ("wpe.weight", [P, C])]
    for n, s in [("ln_1.weight", [C]), ("ln_1.bias", [C]), ("attn.c_attn.weight", [C, 3 * C]),
                 ("attn.c_attn.bias", [3 * C]), ("attn.c_proj.weight", [C, C]), ("attn.c_proj.bias", [C]),
                 ("ln_2.weight", [C]), ("ln_2.bias", [C]), ("mlp.c_fc.weight", [C, 4 * C]),
                 ("mlp.c_fc.bias", [4 * C]), ("mlp.c_proj.weight", [4 * C, C]), ("mlp.c_proj.bias", [C])]:
        shapes.append(("h.0." + n, s))
    shapes += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    out, k = [], 0
    for n, s in shapes:
        numel = 1
        for d in s:
            numel *= d
        vals = [((k + i) % 7 - 3) * 0.125 for i in range(numel)]
        k += numel
        raw = f32(*vals) if dtype == "F32" else b"".join(struct.pack("<f", v)[2:] for v in vals)
        out.append((prefix + n, dtype, s, raw))
    return out


put("modeldir_load", "f32", safetensors(gpt2_tensors()))
put("modeldir_load", "bf16_prefixed", safetensors(gpt2_tensors(prefix="transformer.", dtype="BF16"), {"format": "pt"}))
t = gpt2_tensors()
put("modeldir_load", "tied_head", safetensors(t + [("lm_head.weight", "F32", [8, 4], t[0][3]),
                                                   ("h.0.attn.bias", "F32", [1, 1, 4, 4], f32(*([1.0] * 16)))]))

# ---- token shards ----------------------------------------------------------------------------
def shard(tokens):
    hdr = [20240520, 1, len(tokens)] + [0] * 253
    return struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(tokens), *tokens)


put("shard", "ten", shard([50256, 15496, 11, 995, 0, 1, 2, 65535, 7, 50256]))
put("shard", "empty", shard([]))

# ---- model dir config.json -------------------------------------------------------------------
put("modeldir_config", "tiny", json.dumps({"n_layer": 2, "n_head": 2, "n_embd": 16, "n_positions": 32,
                                           "vocab_size": 64}))
put("modeldir_config", "hf", json.dumps({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": None, "n_layer": 12,
    "n_positions": 1024, "scale_attn_weights": True, "tie_word_embeddings": True, "vocab_size": 50257}, indent=2))

# ---- job specs -------------------------------------------------------------------------------
base = {"name": "t1", "model": {"n_layer": 4, "n_head": 2, "n_embd": 8, "n_positions": 16, "vocab_size": 32},
        "data": {"train": ["shards/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 5,
        "rounds": 3, "batch": 4, "seq_len": 8}
put("jobspec", "minimal", json.dumps(base))
full = dict(base, name="full-run_2", algorithm="dipaco", replicas=3,
            model=dict(base["model"], seed=1234),
            data={"train": ["a.bin", "dir/b_*.bin"], "val": ["v.bin"]},
            inner={"lr": 0.001, "warmup": 5, "lr_min_frac": 1, "weight_decay": 0, "beta1": 0.8, "beta2": 0.99,
                   "eps": 1e-6, "grad_clip": 0, "state": "reset"},
            outer={"lr": 0.5, "momentum": 0.8, "nesterov": False, "c": 0},
            levels=[{"stem": True, "layers": [0, 0], "modules": 1}, {"layers": [0, 2], "modules": 2},
                    {"layers": [2, 4], "modules": 3}],
            quorum=0.5, round_timeout_s=60, weighting="tokens")
put("jobspec", "dipaco_full", json.dumps(full))
put("jobspec", "init", json.dumps(dict(base, model={"init": "models/m"})))
js = json.dumps(base)
put("jobspec", "edges", json.dumps(dict(base, rounds=2147483647, inner_steps=2147483647, quorum=0.30000000000000004,
                                        round_timeout_s=5e-324, model=dict(base["model"], seed=9007199254740991),
                                        levels=[{"stem": True, "layers": [0, 4], "modules": 256}])))
put("jobspec", "huge_numbers", js[:-1] + ', "replicas": 1e999, "round_timeout_s": -1e999, "name": "t\\u0000x"}')

# ---- GPT-2 tokenizer files (encoder.json, "\n\x01\n", vocab.bpe) ----------------------------
def byte_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


bu = byte_unicode()
enc = {bu[b]: i for i, b in enumerate(sorted(bu, key=lambda b: ord(bu[b])))}
merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("i", "n"), ("in", "g")]
for a, b in merges:
    enc[a + b] = len(enc)
enc["<|endoftext|>"] = len(enc)
vocab = "#version: 0.2\n" + "".join("%s %s\n" % m for m in merges)
put("tokenizer_files", "small", json.dumps(enc) + "\n\x01\n" + vocab)

# ---- Hugging Face tokenizer.json (the same small vocabulary, three pipelines) ---------------
LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def hf_json(pre, normalizer=None, pair_merges=False, ignore_merges=False):
    vocab = dict(enc)
    del vocab["<|endoftext|>"]
    added = [{"id": len(enc) - 1, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True},
             {"id": len(enc), "content": "<x>", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": False}]
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                       "normalizer": normalizer, "pre_tokenizer": pre,
                       "post_processor": {"type": "ByteLevel", "add_prefix_space": True},
                       "decoder": {"type": "ByteLevel"},
                       "model": {"type": "BPE", "dropout": None, "unk_token": None, "ignore_merges": ignore_merges,
                                 "vocab": vocab,
                                 "merges": [list(m) if pair_merges else "%s %s" % m for m in merges]}})


BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
BL_NOREGEX = dict(BL, use_regex=False)
put("tokenizer_json", "gpt2_style", hf_json(BL))
put("tokenizer_json", "llama3_style", hf_json(
    {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": LLAMA3_RE}, "behavior": "Isolated",
                                            "invert": False}, BL_NOREGEX]}, pair_merges=True, ignore_merges=True))
put("tokenizer_json", "nfc_digits", hf_json(
    {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BL]}, normalizer={"type": "NFC"}))

# ---- text for encode/decode ------------------------------------------------------------------
put("tokenizer_roundtrip", "ascii", "Hello world, it's the quick brown fox. 12345 don't   \n\n  spaces\t")
put("tokenizer_roundtrip", "utf8", "caf\u00e9 \u65e5\u672c\u8a9e \U0001F600 \u0085\u180e\ufeff <|endoftext|>")
put("tokenizer_roundtrip", "invalid", b"ab\xff\xfe\xc3(\xe2\x82 \x00\x01 x\xf0\x9f\x98")

# ---- protobuf wire format by hand ------------------------------------------------------------
def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def fv(field, v):  # varint field
    return varint(field << 3) + varint(v)


def fl(field, data):  # length-delimited field
    data = data.encode() if isinstance(data, str) else data
    return varint(field << 3 | 2) + varint(len(data)) + data


def chunk(lease, frag, ver, off, total, data, crc=None, payload=0, codec=0):
    m = fv(1, lease) + fv(2, frag) + fv(3, ver) + fv(4, off) + fv(5, total)
    if codec:
        m += fv(6, codec)
    if crc is not None:
        m += varint(7 << 3 | 5) + struct.pack("<I", crc)
    m += fv(8, total // 4) + fv(10, 5) + fv(11, 4096)
    if payload:
        m += fv(12, payload)
    return m + fl(15, data)


# fuzz_chunk: byte 0 = slice mode
put("chunk", "whole_one_slice", b"\x00" + chunk(7, 1, 3, 0, 16, f32(1, 2, 3, 4), crc=0x12345678))
put("chunk", "middle_sliced", b"\x05" + chunk(7, 2, 3, 16, 64, f32(5, 6, 7, 8), payload=1))
put("chunk", "empty_slices", b"\x83" + chunk(1, 1, 1, 0, 8, f32(1, 2), crc=1, codec=1))

# fuzz_proto: byte 0 = message index (order of `message` in proto/dipaco.proto), byte 1 = slicing
import re
names = re.findall(r"^message (\w+)", open(os.path.join(ROOT, "..", "..", "..", "proto", "dipaco.proto")).read(), re.M)
idx = {n: i for i, n in enumerate(names)}
spec = json.dumps(full)
protos = {
    "RegisterRequest": fl(1, "host-1") + fl(2, "cpu") + fl(3, "x86_64") + fv(4, 8),
    "HeartbeatRequest": fv(1, 3) + fl(2, b"\x08\x01"),
    "LeaseRequest": fv(1, 1000),
    "PullFragmentRequest": fv(1, 5) + fv(2, 1) + fv(3, 2),
    "ReleaseRequest": fv(1, 5) + fv(2, 1),
    "CreateJobRequest": fl(1, spec) + fl(2, "full-run_2"),
    "JobRequest": fl(1, "t1"),
    "ListWorkersRequest": fv(1, 1),
    "ExportPathRequest": fl(1, "t1") + fv(2, 0),
    "Chunk": chunk(1, 1, 1, 0, 8, f32(1, 2), crc=7),
}
for n, body in protos.items():
    if n in idx:
        put("proto", n, bytes([idx[n], 0]) + body)
        put("proto", n + "_sliced", bytes([idx[n], 0x82]) + body)
# fuzz_codec: byte 0 = codec, bytes 1-2 = block_floats, byte 3 = count mode (odd: as many floats
# as the stream holds), then the stream: [fp32 scale][codes] per block.
def block(scale, codes):
    return struct.pack("<f", scale) + bytes(codes)


put("codec", "fp32", bytes([0, 0, 0, 1]) + f32(1, -2, 0.5, 3e-39))
put("codec", "bf16", bytes([1, 0, 0, 1]) + b"\x80\x3f\x00\xc0")
put("codec", "int8_short_last", bytes([2, 4, 0, 1]) + block(0.5, [1, 0x7f, 0x81, 0]) + block(0.0, [0, 0]))
put("codec", "fp8_subnormal_nan", bytes([3, 4, 0, 1]) + block(2.0, [0x7e, 0x01, 0x88, 0x38]) + block(1.0, [0x7f]))
put("codec", "e3m0_odd", bytes([4, 5, 0, 1]) + block(1.5, [0xf7, 0x81, 0x05]) + block(1e38, [0x07]))
put("codec", "e3m0_wrong_len", bytes([4, 0, 1, 6]) + block(1.0, [0x12] * 10))

# fuzz_sparse: byte 0 = value_bits - 1 (| 8: exact length), bytes 1-2 = chunk - 2, byte 3 =
# density * 256 - 1, byte 4 = tensors - 1, then each tensor's length - 1 (u16), then the
# stream, written by the independent reference encoder of tests/oracle/sparse_oracle.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
import numpy as np  # noqa: E402
from sparse_oracle import ref_encode  # noqa: E402


def sparse_seed(name, bits, chunk, dens256, tlens, values, exact=True):
    stream, _ = ref_encode(np.array(values, dtype=np.float32), tlens, dens256 / 256, chunk, bits)
    head = bytes([(bits - 1) | (8 if exact else 0)]) + struct.pack("<HBB", chunk - 2, dens256 - 1, len(tlens) - 1)
    put("sparse", name, head + b"".join(struct.pack("<H", t - 1) for t in tlens) + stream)


sparse_seed("two_bits_short_last", 2, 8, 128, [8, 13], [(i * 7) % 11 - 5.0 for i in range(21)])
sparse_seed("one_bit_chunk2", 1, 2, 256, [1, 2, 5], [0.5, -1, 2, 0, 3, -3, 1e-40, 7])
sparse_seed("eight_bits_zeros", 8, 5, 64, [12], [0.0, -0.0] * 6)
sparse_seed("three_bits_chunk3", 3, 3, 200, [7, 3], [1, 2, 3, -4, 5, -6, 7, 8, -9, 1e30])
sparse_seed("four_bits_1024", 4, 1024, 8, [300], [((i * 37) % 101 - 50) * 1e-3 for i in range(300)])
sparse_seed("wrong_length", 2, 8, 128, [8], [1, 2, 3, 4, 5, 6, 7, 8], exact=False)
print("seeds written under", ROOT, file=sys.stderr)
