#!/usr/bin/env python3
"""sparse_ref.py — PyTorch reference of SparseLoCo (arXiv 2508.15706) for sync DiLoCo:
chunked top-k of an error-feedback buffer with value_bits-bit values (common/sparse.h, normative),
the oracle the C coordinator and workers must match to 1e-4.

The spec is diloco_ref.py's spec plus
  "sparse": {"density": rho, "chunk": 4096, "value_bits": 2, "ef_beta": beta}
(chunk defaults to 4096, value_bits to 2; density and ef_beta are required), usually with
  "outer": {"lr": alpha, "momentum": 0, "nesterov": false}.

- Everything is diloco_ref.run (same batches, AdamW, schedule, inner.state, outer optimizer and
  average); only each replica's delta is replaced, through diloco_ref.run's delta_hook, by
- e_r <- f32(beta) * e_r + delta_r   (fp32, two roundings; delta_r = base - local_r)
  s_r  = sparse_encode(e_r): per tensor, canonical order of kernels/gpt.h (wte, wpe, ln_f.weight,
         ln_f.bias, then per layer ln_1.w/b, attn.c_attn.w/b, attn.c_proj.w/b, ln_2.w/b,
         mlp.c_fc.w/b, mlp.c_proj.w/b), each tensor flattened row-major in its HF (Conv1D
         [in, out]) shape, cut into chunks of `chunk` values (the last one shorter); per chunk the
         k = ceil(rho * L) entries of largest |e| (ties: lower index) quantized per sparse.h
  e_r <- e_r - s_r   (fp32)
  and the outer gradient is diloco_ref's average of the s_r.
- e_r (fp32, zeros at start) belongs to slot r like the AdamW state: inner.state "reset" restarts
  it at zero every round, "keep" / "checkpoint" keep it. ef_beta 0 is top-k without error
  feedback (e = delta every round; the residual is dropped).

  sparse_ref.py --init MODEL_DIR --data SHARD... --spec SPEC.json --compare EXPORTED_DIR [--tol 1e-4]
  sparse_ref.py --init MODEL_DIR --data SHARD... --spec SPEC.json [--out FILE.safetensors] [--eval SHARD...]
  sparse_ref.py --self-test
--compare prints the max relative error per tensor (max|a-b| / max|b|) and exits 1 above --tol;
--rounds-done N compares with the parameters after N rounds (an older export)."""
import math, os, sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import diloco_ref as D  # noqa: E402  (sets torch threads to 1)
import streaming_ref as S  # noqa: E402  (layout names, eval_loss, write_safetensors, tiny model)

f32 = np.float32


# ---------------------------------------------------------------- the codec (common/sparse.h)
def chunk_k(rho, L):
    """Entries kept in a chunk of L values: ceil(rho * L) in double, at least 1, at most L."""
    if L == 0:
        return 0
    return min(L, max(1, math.ceil(float(rho) * L)))


def index_bits(chunk):
    """ceil(log2(chunk)) bits per index (exact, in integers)."""
    return (int(chunk) - 1).bit_length()


def chunk_lens(tensor_lens, chunk):
    """Lengths of the chunks, tensor by tensor (each tensor restarts chunking)."""
    out = []
    for n in tensor_lens:
        n = int(n)
        if n < 1:
            raise ValueError("zero-length tensor")
        out += [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    return out


def sparse_bytes(tensor_lens, rho, chunk, bits):
    """Encoded bytes of a fragment of tensors of these lengths (sparse.h's record: table of
    2^bits fp32, k indices of ceil(log2 chunk) bits, k codes of bits bits, each padded to a byte)."""
    ib, tot = index_bits(chunk), 0
    for L in chunk_lens(tensor_lens, chunk):
        k = chunk_k(rho, L)
        tot += 4 * (1 << bits) + (k * ib + 7) // 8 + (k * bits + 7) // 8
    return tot


def sparse_kept(tensor_lens, rho, chunk):
    return sum(chunk_k(rho, L) for L in chunk_lens(tensor_lens, chunk))


def _encode_rows(x, k, bits):
    """Chunks of equal length as the rows of x (m, L) fp32: (idx (m, k) increasing, codes (m, k),
    table (m, 2^bits) fp32). Sums run in index order in float64 (cumsum is sequential)."""
    nb = 1 << bits
    m = x.shape[0]
    order = np.argsort(-np.abs(x), axis=1, kind="stable")[:, :k]  # stable: ties to the lower index
    idx = np.sort(order, axis=1)
    v = np.take_along_axis(x, idx, axis=1).astype(np.float64)
    mu = np.cumsum(v, axis=1)[:, -1] / k
    c = v - mu[:, None]
    if k > 1:
        sigma = np.sqrt(np.cumsum(c * c, axis=1)[:, -1] / (k - 1))
    else:
        sigma = np.zeros(m)
    with np.errstate(over="ignore", invalid="ignore"):
        scale = 6.0 * sigma / nb
    scale = np.where(np.isfinite(scale) & (scale != 0.0), scale, 1.0)
    codes = np.clip(np.rint(c / scale[:, None] + nb / 2), 0, nb - 1).astype(np.int64)
    table = np.zeros((m, nb), dtype=f32)
    for q in range(nb):
        hit = codes == q
        cnt = hit.sum(axis=1)
        tot = np.cumsum(np.where(hit, v, 0.0), axis=1)[:, -1]
        with np.errstate(invalid="ignore", divide="ignore"):
            table[:, q] = np.where(cnt > 0, tot / np.maximum(cnt, 1), 0.0).astype(f32)
    return idx, codes, table


def sparse_encode_parts(e, tensor_lens, rho, chunk, bits):
    """The codec's decisions, chunk by chunk in stream order: a list of (offset, L, idx, codes,
    table) with idx within the chunk; e is the flat fp32 accumulator (sum tensor_lens values)."""
    e = np.ascontiguousarray(e, dtype=f32)
    if e.size != sum(int(n) for n in tensor_lens):
        raise ValueError(f"e has {e.size} values, the tensors {sum(int(n) for n in tensor_lens)}")
    bad = np.flatnonzero(~np.isfinite(e))
    if bad.size:
        raise ValueError(f"non-finite e at index {bad[0]}")
    parts, off = [], 0
    for n in tensor_lens:
        n = int(n)
        full = n // chunk
        if full:
            L = chunk
            idx, codes, table = _encode_rows(e[off:off + full * L].reshape(full, L), chunk_k(rho, L), bits)
            for j in range(full):
                parts.append((off + j * L, L, idx[j], codes[j], table[j]))
        if n % chunk:
            L = n % chunk
            o = off + full * chunk
            idx, codes, table = _encode_rows(e[o:o + L].reshape(1, L), chunk_k(rho, L), bits)
            parts.append((o, L, idx[0], codes[0], table[0]))
        off += n
    return parts


def sparse_encode(e, tensor_lens, rho, chunk, bits):
    """(s, e_new): the dequantized sparse vector s of accumulator e (flat fp32, tensors of
    tensor_lens in stream order) and the residual e_new = e - s (fp32)."""
    e = np.ascontiguousarray(e, dtype=f32)
    s = np.zeros_like(e)
    for off, _, idx, codes, table in sparse_encode_parts(e, tensor_lens, rho, chunk, bits):
        s[off + idx] = table[codes]
    return s, (e - s).astype(f32)


def _pack(vals, width):
    """vals (non-negative ints < 2^width), LSB-first into a bit stream, zero-padded to a byte."""
    acc, nbits, out = 0, 0, bytearray()
    for v in vals:
        acc |= int(v) << nbits
        nbits += width
        while nbits >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            nbits -= 8
    if nbits:
        out.append(acc & 0xFF)
    return bytes(out)


def sparse_stream(e, tensor_lens, rho, chunk, bits):
    """The exact byte stream of sparse.h for accumulator e (for bit-exact checks of the C encoder)."""
    ib, out = index_bits(chunk), bytearray()
    for _, _, idx, codes, table in sparse_encode_parts(e, tensor_lens, rho, chunk, bits):
        out += table.astype("<f4").tobytes() + _pack(idx, ib) + _pack(codes, bits)
    return bytes(out)


# ---------------------------------------------------------------- spec and simulation
def layout(cfg, names=()):
    """Tensor names in the canonical order of kernels/gpt.h (the order of the sparse stream); a
    Llama's (streaming_ref.family) are those of `names` that its layout holds."""
    stem, layer, L = S.family(cfg, set(names))
    return list(stem) + [k for l in range(L) for k in layer(l)]


def sparse_cfg(spec):
    if "sparse" not in spec:
        raise ValueError("spec has no \"sparse\" block")
    if "streaming" in spec:
        raise ValueError("sparse: sync DiLoCo only (a streaming spec with sparse is an error)")
    sp = dict({"chunk": 4096, "value_bits": 2}, **spec["sparse"])
    for k in ("density", "ef_beta"):
        if k not in sp:
            raise ValueError(f"sparse.{k} is required")
    if not (0.0 < sp["density"] <= 1.0):
        raise ValueError(f"sparse.density {sp['density']}: need 0 < density <= 1")
    if not (2 <= sp["chunk"] <= 65536):
        raise ValueError(f"sparse.chunk {sp['chunk']}: need 2 <= chunk <= 65536")
    if not (1 <= sp["value_bits"] <= 8):
        raise ValueError(f"sparse.value_bits {sp['value_bits']}: need 1 <= value_bits <= 8")
    if not (0.0 <= sp["ef_beta"] <= 1.0):
        raise ValueError(f"sparse.ef_beta {sp['ef_beta']}: need 0 <= ef_beta <= 1")
    return sp


def run(init, tokens, spec, stop_after=None, stats=None):
    """SparseLoCo; returns the final global parameters {name: tensor}. stats, if a list, receives
    per replica and round (t, r, kept entries, encoded bytes, |s| / |delta| (L2))."""
    cfg, G0 = init
    sp = sparse_cfg(spec)
    rho, chunk, bits, beta = float(sp["density"]), int(sp["chunk"]), int(sp["value_bits"]), f32(sp["ef_beta"])
    names = layout(cfg, G0.keys())
    assert sorted(names) == sorted(G0.keys()), "tensor names do not match the layout"
    lens = [G0[k].numel() for k in names]
    nbytes, kept = sparse_bytes(lens, rho, chunk, bits), sparse_kept(lens, rho, chunk)
    reset = spec["inner"].get("state", "keep") == "reset"
    E = [np.zeros(sum(lens), dtype=f32) for _ in range(spec["replicas"])]

    def hook(t, r, d):
        delta = np.concatenate([d[k].reshape(-1).numpy().astype(f32) for k in names])
        e = np.zeros_like(delta) if reset else E[r]
        e = (beta * e).astype(f32) + delta  # fp32: t = beta*e, then t + delta
        s, E[r] = sparse_encode(e, lens, rho, chunk, bits)
        if stats is not None:
            stats.append((t, r, kept, nbytes, float(np.linalg.norm(s) / max(np.linalg.norm(delta), 1e-30))))
        out, o = {}, 0
        for k, n in zip(names, lens):
            out[k] = torch.from_numpy(s[o:o + n].copy()).view_as(d[k])
            o += n
        return out

    return D.run(init, tokens, spec, stop_after, delta_hook=hook)


# ---------------------------------------------------------------- self-test
def _codec_checks():
    # k: ceil in double, at least 1, at most L; 0.07 * 100 is 7.000000000000001 in double -> 8
    assert chunk_k(0.02, 4096) == 82 and chunk_k(0.01, 4096) == 41 and chunk_k(0.03, 4096) == 123
    assert chunk_k(0.07, 100) == 8 and chunk_k(0.25, 4) == 1 and chunk_k(0.001, 5) == 1 and chunk_k(1.0, 7) == 7
    assert chunk_k(0.5, 1) == 1 and chunk_k(0.02, 0) == 0
    assert index_bits(4096) == 12 and index_bits(2) == 1 and index_bits(4097) == 13 and index_bits(65536) == 16
    # sizes: a full chunk of 4096 at 2% and 2 bits: table 16 + indices ceil(82*12/8) = 123 + codes 21
    assert sparse_bytes([4096], 0.02, 4096, 2) == 160
    assert sparse_bytes([3 * 4096], 0.02, 4096, 2) == 480
    # a shorter last chunk (100 values: k = 2, 3 index bytes, 1 code byte) and per-tensor restart
    assert sparse_bytes([4196], 0.02, 4096, 2) == 160 + 16 + 3 + 1
    assert sparse_bytes([4096, 100], 0.02, 4096, 2) == sparse_bytes([4196], 0.02, 4096, 2)
    assert chunk_lens([4196, 5], 4096) == [4096, 100, 5]
    assert sparse_bytes([1], 0.5, 4096, 8) == 1024 + 2 + 1
    # ties go to the lower index: |e| = 1 at 1, 3 (both -1 and +1), 5; k = 2 of 8 -> indices 1, 3
    e = np.array([0.5, 1.0, 0.0, -1.0, 0.25, 1.0, 0.0, 0.0], dtype=f32)
    (_, L, idx, codes, table), = sparse_encode_parts(e, [8], 0.25, 8, 2)
    assert L == 8 and list(idx) == [1, 3], idx
    # quantizer by hand: x = (1, -1): mu 0, sigma sqrt(2), scale 6*sqrt(2)/4 = 2.1213;
    # codes rint(1/2.1213 + 2) = rint(2.471) = 2, rint(-0.471 + 2) = rint(1.529) = 2 -> one bin,
    # table[2] = mean(1, -1) = 0, every other entry 0
    assert list(codes) == [2, 2] and np.array_equal(table, np.zeros(4, f32)), (codes, table)
    s, e2 = sparse_encode(e, [8], 0.25, 8, 2)
    assert np.array_equal(s, np.zeros(8, f32)) and np.array_equal(e2, e)
    # x = (4, 1, 0, -3) (k = all 4, 2 bits): mu 0.5, c = (3.5, 0.5, -0.5, -3.5),
    # sigma = sqrt(25/3) = 2.88675, scale = 4.33013; c/scale + 2 = 2.808, 2.115, 1.885, 1.192
    # -> codes 3, 2, 2, 1; table = (0, -3, 0.5, 4)
    x = np.array([4.0, 1.0, 0.0, -3.0], dtype=f32)
    (_, _, idx, codes, table), = sparse_encode_parts(x, [4], 1.0, 4, 2)
    assert list(codes) == [3, 2, 2, 1] and np.array_equal(table, np.array([0, -3, 0.5, 4], f32)), (codes, table)
    s, r = sparse_encode(x, [4], 1.0, 4, 2)
    assert np.array_equal(s, np.array([4, 0.5, 0.5, -3], f32)) and np.array_equal(r, np.array([0, 0.5, -0.5, 0], f32))
    # half-even: x = (1, 0, -1) (mu 0, sigma 1, scale 6/4 = 1.5 for 2 bits): 1/1.5 + 2 = 2.667 -> 3,
    # 2.0 -> 2, 1.333 -> 1; with 1 bit (nb 2, scale 3): 1/3 + 1 = 1.333 -> 1, 1 -> 1, 0.667 -> 1
    x = np.array([1.0, 0.0, -1.0], dtype=f32)
    assert list(sparse_encode_parts(x, [3], 1.0, 3, 2)[0][3]) == [3, 2, 1]
    (_, _, _, codes, table), = sparse_encode_parts(x, [3], 1.0, 3, 1)
    assert list(codes) == [1, 1, 1] and np.array_equal(table, np.array([0, 0], f32))
    # an exact tie goes to even: x = (-6, -3, -2, 2, 4), 2 bits: mu -1, c = (-5, -2, -1, 3, 5),
    # sigma = sqrt(64/4) = 4, scale 6; c/scale + 2 = 1.167, 1.667, 1.833, 2.5 (tie -> 2), 2.833
    # -> codes 1, 2, 2, 2, 3; table = (0, -6, mean(-3, -2, 2) = -1, 4)
    x = np.array([-6, -3, -2, 2, 4], dtype=f32)
    (_, _, _, codes, table), = sparse_encode_parts(x, [5], 1.0, 5, 2)
    assert list(codes) == [1, 2, 2, 2, 3] and np.array_equal(table, np.array([0, -6, -1, 4], f32)), (codes, table)
    # a 1-element chunk (tensor of 1, or a last chunk of 1): k 1, sigma 0 -> scale 1, code
    # rint(0 + nb/2) = nb/2, table[nb/2] = the value exactly: s = e, residual 0
    x = np.array([0.3, -2.0, 7.0, 1.5, -0.1], dtype=f32)
    s, r = sparse_encode(x, [4, 1], 0.25, 4, 2)   # chunks [4] and [1]
    assert np.array_equal(s, np.array([0, 0, 7.0, 0, -0.1], f32)) and r[4] == 0 and r[2] == 0, (s, r)
    (_, _, _, codes, table), = sparse_encode_parts(np.array([-0.1], f32), [1], 0.01, 4096, 2)
    assert list(codes) == [2] and table[2] == f32(-0.1) and table[[0, 1, 3]].tolist() == [0, 0, 0]
    # chunking restarts at each tensor: two tensors of 3 at k = 1 keep one entry each
    s, _ = sparse_encode(np.array([5, 1, 1, 0.1, 0.2, 0.3], f32), [3, 3], 0.2, 4, 2)
    assert np.count_nonzero(s) == 2 and s[0] == 5 and s[5] == f32(0.3), s
    # random: density 1 with 8 bits -> s close to e (8 bits over +-3 sigma, bin means);
    # always: s + e_new == e up to fp32 rounding of e - s, kept counts, s within [min, max] of e
    rng = np.random.default_rng(5)
    e = (rng.standard_normal(10000) * 0.01).astype(f32)
    lens = [4096, 4096, 1000, 808]
    s, r = sparse_encode(e, lens, 1.0, 4096, 8)
    rel = float(np.linalg.norm(s - e) / np.linalg.norm(e))
    assert rel < 0.02, rel
    s, r = sparse_encode(e, lens, 0.02, 4096, 2)
    assert np.count_nonzero(s) <= sparse_kept(lens, 0.02, 4096) == 82 + 82 + 20 + 17
    assert np.array_equal((e - s).astype(f32), r)
    assert s.min() >= e.min() and s.max() <= e.max()
    # the kept positions are the top |e| per chunk
    for off, L, idx, _, _ in sparse_encode_parts(e, lens, 0.02, 4096, 2):
        a = np.abs(e[off:off + L])
        assert a[idx].min() >= np.delete(a, idx).max()
    # stream size equals sparse_bytes; an index/codes packing check on a tiny stream
    assert len(sparse_stream(e, lens, 0.02, 4096, 2)) == sparse_bytes(lens, 0.02, 4096, 2)
    st = sparse_stream(np.array([0, 4, 0, -3], f32), [4], 0.5, 4, 2)
    # k 2: idx (1, 3), 2 bits each: 1 | 3 << 2 = 0x0d; x = (4, -3): mu 0.5, c = +-3.5,
    # sigma 4.9497, scale 7.4246, c/scale + 2 = 2.471 -> 2, 1.529 -> 2: codes (2, 2) -> 0x0a
    assert st == np.array([0, 0, 0.5, 0], "<f4").tobytes() + bytes([0x0D, 0x0A]), st.hex()
    try:
        sparse_encode(np.array([1, np.nan], f32), [2], 0.5, 2, 2)
        raise AssertionError("non-finite e accepted")
    except ValueError:
        pass
    assert _pack([1, 0, 1, 1], 1) == bytes([0x0D]) and _pack([0xABC, 0x123], 12) == bytes([0xBC, 0x3A, 0x12])


def _spec(**sp):
    spec = S._spec()
    del spec["streaming"]
    spec["outer"] = {"lr": 1.0, "momentum": 0.0, "nesterov": False}
    spec["sparse"] = sp
    return spec


def self_test():
    _codec_checks()
    print("sparse_ref self-test: codec ok (k, ties, quantizer, 1-element chunk, sizes, stream)")
    init, tokens = S._tiny()
    cfg, G0 = init
    lens = [G0[k].numel() for k in layout(cfg)]
    # density 1, 8 bits, ef_beta 0, plain averaging: close to dense plain averaging (the codec
    # error only; error feedback off)
    dense = _spec()
    del dense["sparse"]
    ref = D.run(init, tokens, dense)
    got = run(init, tokens, _spec(density=1.0, chunk=4096, value_bits=8, ef_beta=0.0))
    rel = max(float((ref[k] - got[k]).abs().max() / (ref[k] - G0[k]).abs().max().clamp_min(1e-30)) for k in ref)
    print(f"sparse_ref self-test: density 1, 8 bits, no EF vs dense averaging: max relative diff of the update {rel:.3e}")
    assert rel < 0.05, rel
    # the hook sees exactly diloco_ref's deltas: the identity hook is bit-identical to no hook
    same = D.run(init, tokens, dense, delta_hook=lambda t, r, d: d)
    assert all(torch.equal(ref[k], same[k]) for k in ref)
    # error feedback at 2%, 2 bits: stats, sizes, and the parameters moved and stay finite
    stats = []
    o = run(init, tokens, _spec(density=0.02, chunk=64, value_bits=2, ef_beta=0.95), stats=stats)
    assert len(stats) == 3 * 2 and all(b == sparse_bytes(lens, 0.02, 64, 2) for _, _, _, b, _ in stats)
    assert all(torch.isfinite(v).all() for v in o.values())
    assert max(float((o[k] - G0[k]).abs().max()) for k in o) > 0
    # with one replica the global moves by exactly the outer lr times the sent s: rounds of
    # sparse_encode by hand from the hook's view
    seen = []
    one = dict(_spec(density=0.05, chunk=128, value_bits=2, ef_beta=0.9), replicas=1, rounds=2)
    o1 = run(init, tokens, one, stop_after=1)
    D.run(init, tokens, one, stop_after=1, delta_hook=lambda t, r, d: seen.append(d) or d)
    delta = np.concatenate([seen[0][k].reshape(-1).numpy() for k in layout(cfg)])
    s, _ = sparse_encode((f32(0.9) * np.zeros_like(delta)).astype(f32) + delta, lens, 0.05, 128, 2)
    want = np.concatenate([G0[k].reshape(-1).numpy() for k in layout(cfg)]) - s
    gotv = np.concatenate([o1[k].reshape(-1).numpy() for k in layout(cfg)])
    assert np.array_equal(gotv, want.astype(f32)), float(np.abs(gotv - want).max())
    print("sparse_ref self-test: one replica, one round: G1 = G0 - s exactly")
    # ef_beta 0 (top-k without error feedback) differs from ef_beta 0.9 after round 2
    a = run(init, tokens, _spec(density=0.05, chunk=128, value_bits=2, ef_beta=0.0))
    b = run(init, tokens, _spec(density=0.05, chunk=128, value_bits=2, ef_beta=0.9))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) > 0
    # inner.state reset restarts e each round: with reset, beta has no effect
    sr = _spec(density=0.05, chunk=128, value_bits=2, ef_beta=0.0)
    sr["inner"] = dict(sr["inner"], state="reset")
    a = run(init, tokens, sr)
    b = run(init, tokens, dict(sr, sparse=dict(sr["sparse"], ef_beta=0.9)))
    assert all(torch.equal(a[k], b[k]) for k in a)
    print("sparse_ref self-test: ef_beta 0 differs from EF; inner.state reset restarts e")
    for bad in ({"density": 0.0, "ef_beta": 0.9}, {"density": 0.02}, {"density": 0.02, "ef_beta": 0.9, "chunk": 1},
                {"density": 0.02, "ef_beta": 0.9, "value_bits": 9}):
        try:
            sparse_cfg({"sparse": bad})
            raise AssertionError(f"accepted {bad}")
        except ValueError:
            pass
    print("sparse_ref self-test: OK")
    return 0


def main():
    return S.cli("sparse_ref", run, self_test, "--rounds-done",
                 "compare with the parameters after this many rounds (an exported older version)")


if __name__ == "__main__":
    sys.exit(main())
