#!/usr/bin/env python3
"""formats_dataset.py — dipaco's dataset batch order (docs/design.md §3 "Data order") against an
independent numpy implementation, over shards written here in llm.c's format (including an
empty shard and sequences that cross shard boundaries), for several B, T, R.
usage: formats_dataset.py FORMATS_TOOL
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

TOOL = sys.argv[1]


def write_shard(path, tokens):
    """llm.c write_datafile: 256 int32 header (magic, version, count), then uint16 tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def expected(stream, B, T, R, NB):
    nb = (len(stream) - 1) // (B * T)
    out = []
    for b in range(NB):
        for r in range(R):
            o = ((b * R + r) % nb) * B * T
            x = np.stack([stream[o + j * T: o + j * T + T] for j in range(B)])
            y = np.stack([stream[o + j * T + 1: o + j * T + T + 1] for j in range(B)])
            out += [x.reshape(-1), y.reshape(-1)]
    return nb, np.concatenate(out).astype(np.int32)


def main():
    tmp = tempfile.mkdtemp(prefix="dpc_dataset_")
    rng = np.random.default_rng(5)
    lengths = [1000, 0, 37, 2500, 1]
    paths, parts = [], []
    for i, n in enumerate(lengths):
        toks = rng.integers(0, 65536, size=n, dtype=np.uint16)
        p = os.path.join(tmp, "shard_%02d.bin" % i)
        write_shard(p, toks)
        paths.append(p)
        parts.append(toks)
    stream = np.concatenate(parts).astype(np.int64)
    fails = 0
    for B, T, R, NB in [(4, 64, 1, 20), (3, 50, 4, 9), (1, 3537, 1, 2), (2, 7, 3, 130), (8, 16, 2, 40)]:
        out = os.path.join(tmp, "out.bin")
        r = subprocess.run([TOOL, "batches", str(B), str(T), str(R), str(NB), out] + paths,
                           capture_output=True, text=True)
        nb, want = expected(stream, B, T, R, NB)
        got = np.fromfile(out, dtype=np.int32) if r.returncode == 0 else None
        ok = r.returncode == 0 and int(r.stdout.split()[0]) == nb and got is not None and np.array_equal(got, want)
        print(("ok   " if ok else "FAIL ") + "B=%d T=%d R=%d: %d batches x %d replicas vs numpy (nb=%d)" % (B, T, R, NB, R, nb))
        if not ok:
            print(r.stderr)
            fails += 1
    # Too small: one batch needs B*T + 1 tokens.
    N = len(stream)
    r = subprocess.run([TOOL, "batches", "1", str(N), "1", "1", os.path.join(tmp, "x.bin")] + paths,
                       capture_output=True, text=True)
    ok = r.returncode == 1 and ("need at least %d tokens" % (N + 1)) in r.stderr
    print(("ok   " if ok else "FAIL ") + "B*T = N refused: " + r.stderr.strip())
    fails += not ok
    subprocess.run(["rm", "-rf", tmp])
    sys.exit(1 if fails else 0)


main()
