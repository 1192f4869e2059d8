#!/usr/bin/env python3
"""sparse_oracle.py — an independent numpy implementation of SparseLoCo's sparse delta codec
(common/sparse.h) against the C encoder.

The reference is written from the header's format alone: per chunk, the k = ceil(density * L)
(at least 1, at most L) entries of largest |e| from a stable argsort of -|e| (ties to the lower
index), the statistics in float64 summed in index order (np.cumsum is a sequential sum), codes
np.rint(c / scale + nb / 2) (round half to even) clipped to [0, nb), the table the float32 of
each used code's float64 mean, indices and codes packed LSB-first with np.packbits, and the
residual e - s in float32 at the kept positions. test_sparse encode runs the C encoder on the
same input; the stream and the residual must be identical bit for bit. Inputs: gaussians, heavy
tails, many ties, exact zeros and signed zeros, subnormals, magnitudes near FLT_MAX, over
several tensor lists (short last chunks, tensors shorter than a chunk), densities 0.01 .. 1,
chunks 2 .. 65536 and value_bits 1 .. 8, and chunks built to put a code exactly on a rounding
tie; a non-finite input must be refused.

usage: sparse_oracle.py TEST_SPARSE"""
import math
import subprocess
import sys

import numpy as np

F32 = np.float32


def pack(vals, width):
    """vals (ints < 2^width) packed LSB-first: value j occupies bits j*width .. j*width+width-1."""
    if width == 0 or len(vals) == 0:
        return b""
    v = np.asarray(vals, dtype=np.int64)
    bits = ((v[:, None] >> np.arange(width)) & 1).astype(np.uint8).ravel()
    return np.packbits(bits, bitorder="little").tobytes()


def chunk_k(density, L):
    return min(L, max(1, math.ceil(density * L)))


def ref_encode(e, tlens, density, chunk, bits):
    """(stream bytes, residual float32 array) for accumulator e."""
    e = np.array(e, dtype=F32)
    nb = 1 << bits
    ib = (chunk - 1).bit_length()  # ceil(log2(chunk)) for chunk >= 2
    out = bytearray()
    pos = 0
    for tl in tlens:
        for c0 in range(0, tl, chunk):
            L = min(chunk, tl - c0)
            x = e[pos + c0: pos + c0 + L]  # a view: the residual is written through it
            k = chunk_k(density, L)
            order = np.argsort(-np.abs(x), kind="stable")
            kept = np.sort(order[:k])
            xs = x[kept].astype(np.float64)
            mu = (np.cumsum(xs)[-1] + 0.0) / k
            c = xs - mu
            sigma = math.sqrt(np.cumsum(c * c)[-1] / (k - 1)) if k > 1 else 0.0
            scale = 6.0 * sigma / nb
            if scale == 0.0 or not math.isfinite(scale):
                scale = 1.0
            codes = np.clip(np.rint(c / scale + nb // 2), 0, nb - 1).astype(np.int64)
            table = np.zeros(nb, dtype=F32)
            for code in np.unique(codes):
                sel = xs[codes == code]
                table[code] = F32((np.cumsum(sel)[-1] + 0.0) / len(sel))
            out += table.astype("<f4").tobytes()
            out += pack(kept, ib)
            out += pack(codes, bits)
            x[kept] = x[kept] - table[codes]
        pos += tl
    return bytes(out), e


def run_c(exe, x, tlens, density, chunk, bits):
    args = [exe, "encode", repr(float(density)), str(chunk), str(bits), ",".join(map(str, tlens))]
    p = subprocess.run(args, input=np.asarray(x, dtype="<f4").tobytes(), capture_output=True)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def gen(rng, kind, n):
    if kind == "gauss":
        return rng.standard_normal(n) * 1e-3
    if kind == "heavy":
        return rng.standard_cauchy(n) * 1e-4
    if kind == "ties":
        return rng.integers(-3, 4, n) * 0.25
    if kind == "zeros":
        x = np.where(rng.random(n) < 0.9, 0.0, rng.standard_normal(n))
        return np.where(rng.random(n) < 0.5, -x, x)  # signed zeros among them
    if kind == "allzero":
        return np.where(rng.random(n) < 0.5, -0.0, 0.0)
    if kind == "subnormal":
        return (rng.standard_normal(n) * 1e-40).astype(F32)
    if kind == "huge":
        return rng.standard_normal(n) * 1e37
    if kind.startswith("qtie"):
        # Chunks of 8 whose 5 kept values put one code exactly on a .5 tie (found by search;
        # value_bits is the digit): round half to even and half up disagree there.
        pat = {"1": [-12, -5, -2, 0, 4], "2": [-12, -9, -8, -4, -2], "3": [-12, -1, 4, 6, 8]}[kind[-1]]
        out = []
        for _ in range(n // 8):
            ch = np.array(pat + [0, 0, 0], dtype=np.float64)[rng.permutation(8)]
            out.append(ch * 2.0 ** int(rng.integers(-20, 20)))
        return np.concatenate(out)
    if kind == "mixed":
        return rng.standard_normal(n) * np.exp(rng.uniform(-30, 10, n))
    raise ValueError(kind)


KINDS = ["gauss", "heavy", "ties", "zeros", "allzero", "subnormal", "huge", "mixed"]


def tensor_list(rng, chunk):
    choice = rng.integers(0, 5)
    if choice == 0:
        return [int(chunk * rng.integers(1, 4))]  # whole chunks only
    if choice == 1:
        return [int(rng.integers(1, chunk + 1))]  # shorter than (or one) chunk
    if choice == 2:
        return [int(rng.integers(1, 3 * chunk + 2)) for _ in range(rng.integers(2, 6))]
    if choice == 3:
        return [1, int(chunk + 1), 2, int(2 * chunk - 1)]
    return [int(rng.integers(1, 8)) for _ in range(rng.integers(1, 10))]


def main():
    exe = sys.argv[1]
    rng = np.random.default_rng(20240521)
    chunks = [2, 3, 4, 5, 7, 16, 33, 100, 256, 1000, 1024, 4096]
    densities = [0.01, 0.02, 0.05, 0.1, 0.25, 0.3, 0.5, 0.77, 1.0]
    runs = bad = 0
    cases = []
    for i in range(150):
        chunk = chunks[i % len(chunks)] if i % 4 else int(rng.integers(2, 3000))
        density = densities[i % len(densities)] if i % 3 else float(rng.uniform(0.005, 1.0))
        bits = 1 + i % 8
        tl = tensor_list(rng, chunk)
        while sum(tl) > 40000:
            tl = tl[:-1] if len(tl) > 1 else [40000]
        cases.append((KINDS[i % len(KINDS)], tl, density, chunk, bits))
    for b in (1, 2, 3):
        cases.append((f"qtie{b}", [8 * 50, 16], 0.625, 8, b))
    # A realistic fragment: a few large tensors at the default chunk.
    cases.append(("gauss", [4096 * 30 + 123, 768, 3 * 4096], 0.02, 4096, 2))
    cases.append(("heavy", [65536 + 5], 0.01, 65536, 4))
    for kind, tl, density, chunk, bits in cases:
        x = gen(rng, kind, sum(tl)).astype(F32)
        want_s, want_e = ref_encode(x, tl, density, chunk, bits)
        rc, out, err = run_c(exe, x, tl, density, chunk, bits)
        runs += 1
        what = f"{kind} tensors {tl if len(tl) < 6 else str(len(tl)) + ' tensors'} density {density!r} chunk {chunk} bits {bits}"
        if rc != 0:
            print(f"{what}: dipaco refused: {err.strip()}")
            bad += 1
            continue
        got_s, got_e = out[: len(want_s)], np.frombuffer(out[len(want_s):], dtype="<f4")
        if len(out) != len(want_s) + 4 * len(x):
            print(f"{what}: {len(out)} bytes out, expected {len(want_s)} + {4 * len(x)}")
            bad += 1
        elif got_s != want_s:
            i = next(j for j in range(len(want_s)) if got_s[j] != want_s[j])
            print(f"{what}: stream byte {i} is {got_s[i]:02x}, reference {want_s[i]:02x}")
            bad += 1
        elif got_e.view(np.uint32).tolist() != want_e.view(np.uint32).tolist():
            i = int(np.nonzero(got_e.view(np.uint32) != want_e.view(np.uint32))[0][0])
            print(f"{what}: residual {i} is {got_e[i]!r}, reference {want_e[i]!r}")
            bad += 1
    # Non-finite input is refused with nothing on stdout.
    for v in (np.nan, np.inf, -np.inf):
        x = gen(rng, "gauss", 300).astype(F32)
        x[217] = v
        rc, out, err = run_c(exe, x, [100, 200], 0.1, 64, 2)
        runs += 1
        if rc != 2 or out or "value 217" not in err:
            print(f"non-finite {v}: exit {rc}, {len(out)} bytes out, stderr {err.strip()!r}")
            bad += 1
    print(f"sparse_oracle: {runs} encodes, {bad} differ from the numpy reference")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
