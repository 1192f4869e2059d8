#!/usr/bin/env python3
"""ledger_check.py — after a sync DiLoCo job that lived through crashes, check the
coordinator's durable record (no lost or doubled delta, nothing half written).

usage: ledger_check.py [--async] LEDGER_JSON STATE_DIR JOB ROUNDS REPLICAS [WORKER_LOG...]

LEDGER_JSON is `dipacoctl job ledger JOB --json` ({"deltas": one object per applied delta,
"summary": ...}). Checks:
  - each (version, path 0, replica, fragment f) for version 1..ROUNDS, replica
    0..REPLICAS-1 and every fragment f of the job (one for plain DiLoCo; the stem and each
    layer for Streaming DiLoCo) was applied exactly once, with base = version - 1, and
    nothing else was;
  - the same from SQLite (STATE/dipaco.db, read-only): per (round, replica) exactly one
    'applied' delta row, no 'received' row left in a closed round, every round 0..ROUNDS-1
    closed with version round + 1 and REPLICAS deltas, the fragment at version ROUNDS;
  - every blob a row names exists with the blob header magic and the size its length needs,
    no temporary file ("*.tmp.*") is left under STATE/blobs, and no parameter, momentum or
    delta blob (dense or sparse) of the job that no row names;
  - every lease a worker log says was acknowledged ("lease N pushed ... accepted") is in the
    ledger exactly once (an acknowledged delta is never lost nor applied twice).
With --async (a diloco-async job with one slot, REPLICAS = 1, no DyLU: one delta per lease of
H steps), the round checks become: versions 1..ROUNDS each applied exactly once with base =
version - 1 (staleness 0: a lease includes every acknowledged delta), ROUNDS 'applied' rows
and no 'received' one left, the fragment at version ROUNDS; the blob and acknowledgement
checks are the same.
Prints a summary; exits 1 with the reasons on any failure.
"""
import collections
import json
import os
import re
import sqlite3
import struct
import sys


def main():
    argv = sys.argv[1:]
    is_async = bool(argv) and argv[0] == "--async"
    if is_async:
        argv = argv[1:]
    if len(argv) < 5:
        print(__doc__)
        return 2
    ledger_path, state, job, rounds, reps = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    logs = argv[5:]
    if is_async and reps != 1:
        print("ledger_check.py --async: only one slot (REPLICAS = 1) has a fixed ledger")
        return 2
    bad = []
    doc = json.load(open(ledger_path))
    ledger = doc["deltas"]
    if doc["summary"]["deltas"] != len(ledger) or doc["summary"]["staleness_max"] != 0:
        bad.append(f"ledger summary {doc['summary']} does not match {len(ledger)} deltas of staleness 0")
    db = sqlite3.connect(f"file:{state}/dipaco.db?mode=ro", uri=True)
    q = lambda sql, *a: db.execute(sql, a).fetchall()
    frags = [f for (f,) in q("SELECT fragment FROM fragments WHERE job = ? ORDER BY fragment", job)]
    if is_async and len(frags) != 1:
        bad.append(f"db: {len(frags)} fragments; --async checks one")
    seen = collections.Counter((e["version"], e["path"], e["replica"], e["fragment"]) for e in ledger)
    want = {(v, 0, r, f + 1) for v in range(1, rounds + 1) for r in range(reps) for f in frags}
    for k in sorted(want):
        if seen[k] != 1:
            bad.append(f"ledger: version {k[0]} replica {k[2]} fragment {k[3]} applied {seen[k]} times (want 1)")
    for k in sorted(set(seen) - want):
        bad.append(f"ledger: unexpected entry version {k[0]} path {k[1]} replica {k[2]} fragment {k[3]}")
    for e in ledger:
        if e["base"] != e["version"] - 1 or e["staleness"] != 0:
            bad.append(f"ledger: lease {e['lease']} version {e['version']} has base {e['base']}, staleness {e['staleness']}")
    ledger_leases = collections.Counter(int(e["lease"]) for e in ledger)

    names = []
    for frag in frags:
        check_fragment(q, bad, job, frag, rounds, reps, is_async, names)
    for pb, mb in q("SELECT param_blob, momentum_blob FROM fragment_versions WHERE job = ?", job):
        names += [n for n in (pb, mb) if n]
    check_blobs(state, job, q, bad, names)

    acked = set()
    for lg in logs:
        for line in open(lg, errors="replace"):
            m = re.search(r"lease (\d+) pushed \d+ bytes in \d+ ms: accepted", line)
            if m:
                acked.add(int(m.group(1)))
    for lease in sorted(acked):
        if ledger_leases[lease] != len(frags):
            bad.append(f"acknowledged deltas of lease {lease} are in the ledger {ledger_leases[lease]} times "
                       f"(want {len(frags)}: once per fragment)")

    print(f"ledger: {len(ledger)} applied deltas for {rounds} rounds x {reps} replicas x {len(frags)} fragment(s); "
          f"{len(acked)} acknowledged leases found in the worker logs, all applied exactly once" if not bad
          else "ledger check FAILED:")
    for b in bad[:40]:
        print("  " + b)
    return 1 if bad else 0


def check_fragment(q, bad, job, frag, rounds, reps, is_async, names):
    """The delta rows, rounds and version of one fragment; collects the blob names its rows use."""
    tag = f"fragment {frag + 1}: "
    rows = q("SELECT round, path, replica, state, blob FROM deltas WHERE job = ? AND fragment = ?", job, frag)
    applied = collections.Counter((r, p, rep) for r, p, rep, st, _ in rows if st == "applied")
    if is_async:
        states = collections.Counter(st for _, _, _, st, _ in rows)
        if states["applied"] != rounds or states["received"] or states["dropped"]:
            bad.append(f"db: {tag}delta rows by state {dict(states)}, want {rounds} applied and nothing else")
        versions = sorted(v for (v,) in q("SELECT applied_version FROM deltas WHERE job = ? AND state = 'applied'", job))
        if versions != list(range(1, rounds + 1)):
            bad.append(f"db: applied versions {versions}, want 1..{rounds}")
    for r in range(0 if is_async else rounds):
        for rep in range(reps):
            if applied[(r, 0, rep)] != 1:
                bad.append(f"db: {tag}round {r} replica {rep} has {applied[(r, 0, rep)]} applied delta rows (want 1)")
    rounds_rows = {r: (st, n, v) for r, st, n, v in q("SELECT round, state, n_deltas, version FROM rounds "
                                                      "WHERE job = ? AND fragment = ?", job, frag)}
    for r in range(0 if is_async else rounds):
        if rounds_rows.get(r) != ("closed", reps, r + 1):
            bad.append(f"db: {tag}round {r} is {rounds_rows.get(r)}, want ('closed', {reps}, {r + 1})")
    for r, p, rep, st, _ in rows:
        if st == "received" and rounds_rows.get(r, ("open",))[0] == "closed":
            bad.append(f"db: {tag}a received (never applied) delta of replica {rep} is left in closed round {r}")
    (ver,) = q("SELECT version FROM fragments WHERE job = ? AND fragment = ?", job, frag)[0]
    if ver != rounds:
        bad.append(f"db: {tag}at version {ver}, want {rounds}")
    names += [b for (_, _, _, _, b) in rows if b]


def check_blobs(state, job, q, bad, names):
    """Every named blob whole (its fragment's length), no temporary file, no orphan."""
    flen = {f: n for f, n in q("SELECT fragment, len FROM fragments WHERE job = ?", job)}
    for n in names:
        m = re.search(r"/f(\d+)-", n)
        want_len = flen.get(int(m.group(1))) if m else None
        path = os.path.join(state, "blobs", n)
        try:
            with open(path, "rb") as f:
                head = f.read(24)
            size = os.path.getsize(path)
        except OSError as e:
            bad.append(f"blobs: {n} named in the database is missing ({e.strerror})")
            continue
        magic, _, _, _, count = struct.unpack("<IIIIQ", head)
        # A SparseLoCo delta (".sparse") or a quantized one kept as sent (".encoded") holds its
        # stream padded to whole floats: fewer than the fragment's length (its exact size follows
        # from the job's layout or codec; the coordinator checks it when it reads the blob).
        if (n.endswith(".sparse") or n.endswith(".encoded")) and want_len is not None and 0 < count < want_len:
            want_len = count
        if magic != 0x42435044 or count != want_len or size != 24 + 4 * count + 8:
            bad.append(f"blobs: {n} is not a whole blob of {want_len} floats (magic {magic:#x}, n {count}, {size} bytes)")
    named = set(names)
    for root, _, files in os.walk(os.path.join(state, "blobs")):
        for fn in files:
            rel = os.path.relpath(os.path.join(root, fn), os.path.join(state, "blobs"))
            if ".tmp." in fn:
                bad.append(f"blobs: temporary file left behind: {rel}")
            elif rel.startswith(f"{job}/") and fn.rsplit(".", 1)[-1] in ("params", "momentum", "delta", "sparse",
                                                                                    "encoded") and rel not in named:
                bad.append(f"blobs: {rel} is named by no row (orphaned)")


if __name__ == "__main__":
    sys.exit(main())
