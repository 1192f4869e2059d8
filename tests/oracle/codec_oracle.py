#!/usr/bin/env python3
"""codec_oracle.py — independent references for common/codec.c.

bf16: test_codec --dump prints random fp32 patterns and the bf16 codes dipaco made; torch
converts the same floats with .to(torch.bfloat16) (round to nearest even) and every code must
match.

int8, fp8 e4m3fn, e3m0 (docs/design.md §3): the reference below is written from the spec in
numpy float32 arithmetic, without the C code's tricks: int8 rounds with np.rint, fp8 picks the
nearest of the 127 finite positive e4m3fn values listed one by one (ties to the even code, which
is the even mantissa), e3m0 takes the argmin of the distances to its 8 levels (ties to the
larger). For every codec and several block sizes, test_codec --encode encodes and decodes the
same floats: random deltas, exact ties, tiny and subnormal values, zeros, huge and tiny scales,
random bit patterns; the stream bytes and the decoded fp32 bit patterns must be identical.

usage: codec_oracle.py TEST_CODEC"""
import subprocess
import sys

import numpy as np
import torch

F = np.float32
FLT_MAX = np.finfo(np.float32).max


def bf16_check(exe):
    out = subprocess.run([exe, "--dump", "20000", "12345"], check=True, capture_output=True, text=True).stdout.split()
    bits = torch.tensor([int(h, 16) for h in out[0::2]], dtype=torch.int64)
    ours = [int(h, 16) for h in out[1::2]]
    x = bits.to(torch.int32).view(torch.float32)
    ref = x.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    bad = [i for i in range(len(ours)) if ours[i] != int(ref[i])]
    for i in bad[:10]:
        print(f"float {out[2 * i]}: dipaco bf16 {ours[i]:04x}, torch {int(ref[i]):04x}")
    print(f"codec_oracle: {len(ours)} floats, {len(bad)} bf16 codes differ from torch")
    return not bad and ours


# ---- the block codecs, from the spec -----------------------------------------------------------
# e4m3fn: code c (0..0x7e) = exponent c >> 3 (bias 7), mantissa c & 7; exponent 0 is subnormal.
E4M3 = np.array([(c & 7) * 2.0**-9 if c >> 3 == 0 else (1 + (c & 7) / 8) * 2.0**((c >> 3) - 7) for c in range(127)])
assert E4M3[-1] == 448 and np.all(np.diff(E4M3) > 0)
E3M0 = np.array([0.0] + [2.0**(e - 7) for e in range(1, 8)])


def e4m3_round(y):
    """Nearest e4m3fn code of |y| (float64 exact copies of fp32), ties to the even code."""
    a = np.abs(y.astype(np.float64))
    hi = np.clip(np.searchsorted(E4M3, a), 1, 126)  # E4M3[hi - 1] <= a <= E4M3[hi] inside the range
    lo = hi - 1
    dlo, dhi = a - E4M3[lo], E4M3[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.where(a >= 448.0, 126, code)  # saturate


def ref_block(codec, b):
    """(scale, codes as a uint8 array, one per value, decoded float32) of one block."""
    amax = np.max(np.abs(b))
    if codec == "int8":
        s = F(amax / F(127))
    elif codec == "fp8":
        s = F(amax / F(448))
    else:
        s = F(amax)
    if s == 0:
        codes = np.zeros(len(b), np.uint8)
        return s, codes, np.zeros(len(b), F)
    if codec == "int8":
        q = np.clip(np.rint(b / s), -127, 127).astype(np.int64)
        return s, (q & 0xFF).astype(np.uint8), q.astype(F) * s
    if codec == "fp8":
        c = e4m3_round(b / s)
        c = np.where((b < 0) & (c != 0), c | 0x80, c)
        v = E4M3[c & 0x7F].astype(F)
        return s, c.astype(np.uint8), np.where(c & 0x80, -v, v).astype(F) * s
    y = (np.abs(b) / s).astype(np.float64)
    # argmin over the levels reversed: the first minimum there is the larger level of a tie
    e = 7 - np.argmin(np.abs(y[:, None] - E3M0[None, ::-1]), axis=1)
    c = np.where((b < 0) & (e > 0), e | 8, e)
    v = E3M0[e].astype(F)
    return s, c.astype(np.uint8), np.where(c & 8, -v, v).astype(F) * s


def ref_encode(codec, x, bf):
    stream, dec = bytearray(), []
    for i in range(0, len(x), bf):
        s, codes, y = ref_block(codec, x[i:i + bf])
        stream += np.array([s], "<f4").tobytes()
        if codec == "e3m0":
            if len(codes) % 2:
                codes = np.append(codes, 0)
            stream += (codes[0::2] | codes[1::2] << 4).astype(np.uint8).tobytes()
        else:
            stream += codes.tobytes()
        dec.append(y)
    return bytes(stream), np.concatenate(dec) if dec else np.zeros(0, F)


def run_c(exe, codec, x, bf):
    p = subprocess.run([exe, "--encode", codec, str(bf)], input=x.astype("<f4").tobytes(), capture_output=True)
    return p.returncode, p.stdout, p.stderr.decode()


# ---- test data -------------------------------------------------------------------------------
def cases(rng):
    """(name, float32 array, block sizes) to run through every block codec."""
    out = []
    # Deltas: each block of 256 at its own magnitude, 2^-120 .. 2^100; values spread over binades.
    n = 256 * 40 + 77
    mag = np.repeat(2.0 ** rng.integers(-120, 100, n // 256 + 1), 256)[:n]
    x = rng.standard_normal(n) * mag * 2.0 ** -rng.integers(0, 12, n)
    x[rng.random(n) < 0.03] = 0.0
    x[rng.random(n) < 0.01] = -0.0
    x[256 * 3:256 * 4] = 0.0  # a block of zeros
    out.append(("deltas", x.astype(F), [256, 7, 64, 1]))
    # Ties at a power-of-2 scale (exact division): for each codec the block's first value sets
    # scale = 2^k; the rest are midpoints between neighbouring codes, both signs.
    for k in (-100, -3, 0, 5, 90):
        t = 2.0**k
        mids8 = np.arange(-127, 127) + 0.5
        mids_fp8 = (E4M3[:-1] + E4M3[1:]) / 2
        mids_e3 = np.concatenate([(E3M0[:-1] + E3M0[1:]) / 2, E3M0])
        for name, top, mids in (("int8", 127.0, mids8), ("fp8", 448.0, mids_fp8), ("e3m0", 1.0, mids_e3)):
            v = np.concatenate([[top], mids, -mids, np.nextafter(mids, 0), np.nextafter(mids, 1e9)]) * t
            out.append((f"ties_{name}_2^{k}", v.astype(F), [len(v), 16]))
    # The fp8 subnormal range and tiny values: |x| / scale below 2^-6, multiples of 2^-10.
    v = np.concatenate([[448.0], np.arange(-64, 65) * 2.0**-11, rng.uniform(-2**-5, 2**-5, 200)])
    out.append(("fp8_subnormals", v.astype(F), [len(v), 33]))
    # Subnormal inputs: scales that are subnormal or round to 0 (amax <= 127 or 448 * 2^-150).
    sub = np.array([1, 2, 3, 5, 63, 64, 65, 127, 128, 200, 224, 225, 448, 449, 1000, 2**20, 2**23 - 1],
                   np.uint32).view(F)
    v = np.concatenate([sub, -sub, rng.choice(sub, 300) * rng.choice([-1, 1], 300)]).astype(F)
    out.append(("subnormals", v, [1, 2, 5, 17, 256]))
    # Huge: amax near FLT_MAX (int8 refuses its block, see below) and large normal values.
    v = np.concatenate([[FLT_MAX / 2, -1e38, 3e37], rng.standard_normal(100) * 1e37]).astype(F)
    out.append(("huge", v, [256, 3]))
    # Random finite bit patterns: every exponent, including subnormals.
    bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    v = bits.view(F)
    v = v[np.isfinite(v)]
    out.append(("bits", v, [256, 5, 1]))
    out.append(("empty", np.zeros(0, F), [256]))
    out.append(("odd", np.array([0.5, -1.0, 0.25, 3e-3, -0.0], F), [2, 4, 5, 256]))
    return out


def block_check(exe):
    rng = np.random.default_rng(20240614)
    runs = mismatches = 0
    for codec in ("int8", "fp8", "e3m0"):
        for name, x, sizes in cases(rng):
            for bf in sizes:
                runs += 1
                rc, out, err = run_c(exe, codec, x, bf)
                stream, dec = ref_encode(codec, x, bf)
                if rc != 0:
                    mismatches += 1
                    print(f"{codec} {name} block {bf}: dipaco refused: {err.strip()}")
                    continue
                ours, ydec = out[:len(stream)], np.frombuffer(out[len(stream):], "<f4")
                if len(out) != len(stream) + 4 * len(x):
                    mismatches += 1
                    print(f"{codec} {name} block {bf}: {len(out)} bytes out, expected {len(stream) + 4 * len(x)}")
                    continue
                if ours != stream:
                    mismatches += 1
                    i = next(i for i in range(len(stream)) if ours[i] != stream[i])
                    print(f"{codec} {name} block {bf}: stream byte {i} is {ours[i]:02x}, reference {stream[i]:02x}")
                diff = np.nonzero(ydec.view(np.uint32) != dec.view(np.uint32))[0]
                if len(diff):
                    mismatches += 1
                    i = diff[0]
                    print(f"{codec} {name} block {bf}: decoded value {i} of {x[i]!r} is {ydec[i]!r}, "
                          f"reference {dec[i]!r} ({len(diff)} differ)")
    # An input whose int8 block would decode to infinity (127 * RN(FLT_MAX / 127) overflows) is
    # refused; fp8 and e3m0 code it.
    x = np.array([1.0, -FLT_MAX], F)
    for codec, want in (("int8", 2), ("fp8", 0), ("e3m0", 0)):
        runs += 1
        rc, out, err = run_c(exe, codec, x, 256)
        if rc != want:
            mismatches += 1
            print(f"{codec} FLT_MAX: exit {rc}, expected {want} ({err.strip()})")
        elif rc == 0 and out != b"".join([ref_encode(codec, x, 256)[0], ref_encode(codec, x, 256)[1].tobytes()]):
            mismatches += 1
            print(f"{codec} FLT_MAX: output differs from the reference")
    assert np.isinf(F(127) * F(FLT_MAX / F(127))) and np.isfinite(F(448) * F(FLT_MAX / F(448)))
    print(f"codec_oracle: {runs} block-codec streams, {mismatches} differ from the numpy reference")
    return mismatches == 0


def main():
    ok = bf16_check(sys.argv[1])
    with np.errstate(over="ignore"):
        ok = block_check(sys.argv[1]) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
