#!/usr/bin/env python3
"""sparse_push.py — SparseLoCo sparse deltas (job spec "sparse", CODEC_SPARSE, common/sparse.h) in
PushDelta and PAYLOAD_SPARSE_ROUND in PullFragment, on a real dipaco-coordinator driven by python
grpcio playing the two workers of a sync DiLoCo job (R = 2, outer plain SGD lr 2, momentum 0).
The streams come from the numpy encoder of tests/oracle/sparse_oracle.py (ref_encode); the
test's own record walker (from the header's layout) decodes and corrupts them.

  * The lease says delta_codec CODEC_SPARSE with the job's density, chunk, value_bits, ef_beta,
    sparse_pull (momentum 0) and outer_nesterov false; the fragment is the whole model, its
    tensors those of kernels/gpt.h's layout (their lengths sum to the fragment's).
  * Refused with INVALID_ARGUMENT and a message naming the problem (the tensor and chunk for a
    bad record), each leaving the fragment's version, the job's bytes_in and the blob directory
    (no delta file of the lease) unchanged: total one byte short and one byte long, num_floats
    != the fragment's length, codec fp32 and e3m0 on the sparse job, block_floats != 0, a NaN
    and an Inf table value, a non-zero (and a -0.0) table value for a code no index uses, a
    repeated and a decreasing index, an index >= the length of a short last chunk, non-zero
    index padding bits, non-zero code padding bits; a wrong crc32c is DATA_LOSS.
    dipaco_deltas_rejected_total rises by exactly the number of refusals.
  * Then each replica's correct stream is ACCEPTED (replica 1 first: the coordinator still
    averages in (path, replica) order); the same stream again is PUSH_DUPLICATE, a different
    one ALREADY_EXISTS. The round closes and version 1 equals numpy's outer step
    theta + (-lr) * fp32(sum_i 0.5 * s_i in float64) over the decoded streams BIT FOR BIT: with
    two unit weights the coefficients are 0.5 (exact), each product is exact in float64, the
    sum rounds once to float64 and once to fp32 in both; lr = 2 makes -lr * avg exact, so the
    single fp32 addition rounds the same with or without a fused multiply-add. GetJob's
    summary.bytes_in is the two accepted streams' sizes.
  * PullFragment(PAYLOAD_SPARSE_ROUND, version 1) is [u32 2][(1.0, bytes) x 2][the two accepted
    streams in (path, replica) order], its chunk CRC right, a pull resumed at an offset giving
    the rest of the same bytes; version 0 and version 2 (not made
    yet) are INVALID_ARGUMENT; a non-sparse job, and a sparse job with outer momentum, refuse
    the payload with FAILED_PRECONDITION.
  * The coordinator keeps serving (a later push on the next round is accepted) and exits 0 on
    SIGTERM.

usage: sparse_push.py COORDINATOR_BIN PROTO_DIR"""
import json
import math
import os
import re
import struct
import sys
import urllib.request

from daemon_kit import PushKit, check, crc32c, grpc_stubs, run_grpc_test, status_of

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))

LR = 2.0
DENSITY, CHUNK, BITS, EF_BETA = 0.1, 64, 2, 0.95
# L = 2, C = 12, H = 2, maxT = 8, V = 17: wte has 204 values (chunks of 64, 64, 64 and a short 12)
MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 12, "n_positions": 8, "vocab_size": 17, "seed": 11}


def main():
    coord_bin, proto_dir = sys.argv[1], sys.argv[2]
    return run_grpc_test(coord_bin, proto_dir, "dpc_sparse_push_",
                         lambda grpc, np, pb, d, state, log: body(grpc, np, pb, d, state))


def tensor_lengths(V, maxT, L, C):
    """The fragment's tensors of a diloco job: kernels/gpt.c gpt_layout_build's order."""
    t = [V * C, maxT * C, C, C]
    for _ in range(L):
        t += [C, C, C * 3 * C, 3 * C, C * C, C, C, C, C * 4 * C, 4 * C, 4 * C * C, C]
    return t


def records(tlens):
    """Every chunk record of a stream: dict(t, c, L, k, at, size) in stream order."""
    nb, ib = 1 << BITS, (CHUNK - 1).bit_length()
    out, at = [], 0
    for t, tl in enumerate(tlens):
        for c, c0 in enumerate(range(0, tl, CHUNK)):
            L = min(CHUNK, tl - c0)
            k = min(L, max(1, math.ceil(DENSITY * L)))
            size = 4 * nb + (k * ib + 7) // 8 + (k * BITS + 7) // 8
            out.append({"t": t, "c": c, "L": L, "k": k, "at": at, "size": size, "v0": sum(tlens[:t]) + c0})
            at += size
    return out


def body(grpc, np, pb, d, state):
    from sparse_oracle import pack, ref_encode
    F = np.float32
    nb, ib = 1 << BITS, (CHUNK - 1).bit_length()

    def unpack(np, raw, k, width):
        bits = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little")[:k * width].reshape(k, width)
        return (bits.astype(np.int64) << np.arange(width)).sum(axis=1)

    def parse(data, r):
        """(table, indices, codes) of record r of stream data."""
        b = data[r["at"]:r["at"] + r["size"]]
        table = np.frombuffer(b[:4 * nb], "<f4").copy()
        ibytes = (r["k"] * ib + 7) // 8
        idx = unpack(np, b[4 * nb:4 * nb + ibytes], r["k"], ib)
        codes = unpack(np, b[4 * nb + ibytes:], r["k"], BITS)
        return table, idx, codes

    def rebuild(data, r, table=None, idx=None, codes=None):
        """data with record r's fields replaced (packed as the format says)."""
        t0, i0, c0 = parse(data, r)
        table = t0 if table is None else table
        idx = i0 if idx is None else idx
        codes = c0 if codes is None else codes
        rec = np.asarray(table, "<f4").tobytes() + pack(idx, ib) + pack(codes, BITS)
        assert len(rec) == r["size"]
        return data[:r["at"]] + rec + data[r["at"] + r["size"]:]

    def decode(data, n, recs):
        y = np.zeros(n, F)
        for r in recs:
            table, idx, codes = parse(data, r)
            y[r["v0"] + idx] = table[codes]
        return y

    def connect():
        return grpc_stubs(grpc, pb, d[0].addr, state)

    def code_of(fn, *a, **kw):
        return status_of(grpc, fn, *a, **kw)

    X = connect()
    mds = []
    for i in range(5):
        w = X["Register"](pb.RegisterRequest(hostname=f"w{i}", backend="cpu", threads=1), timeout=10)
        mds.append([("dipaco-worker-id", str(w.worker_id)), ("dipaco-session", w.session_token)])

    def metric(name):
        with urllib.request.urlopen(f"http://127.0.0.1:{d[0].mport}/metrics", timeout=10) as r:
            m = re.search(rf"^{name} (\d+)$", r.read().decode(), re.M)
        return int(m.group(1)) if m else -1

    def lease_in(md, job):
        r = X["Lease"](pb.LeaseRequest(max_wait_ms=5000, job_id=job), metadata=md, timeout=10)
        assert r.outcome == pb.LEASE_GRANTED, r
        return r.lease

    def pull_chunks(md, L, **kw):
        return list(X["PullFragment"](pb.PullFragmentRequest(lease_id=L.lease_id, fragment_id=1, **kw),
                                      metadata=md, timeout=30))

    def pull(md, L, **kw):
        return np.frombuffer(b"".join(c.data for c in pull_chunks(md, L, **kw)), dtype="<f4").copy()

    K = PushKit(grpc, pb, X, state)

    def chunks(L, data, num_floats, codec=pb.CODEC_SPARSE, block=0, total=None, crc=None, step=500):
        return K.chunks(L, data, codec, num_floats, block, total, crc, step, inner_steps=L.inner_steps, tokens=64)

    push, result, version, wait_version, lease_files = K.push, K.result, K.version, K.wait_version, K.lease_files

    def bytes_in(job):
        return X["GetJob"](pb.JobRequest(job_id=job), timeout=10).summary.bytes_in

    def job_spec(name, sparse=True, momentum=0.0):
        s = {"name": name, "model": MODEL, "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco",
             "replicas": 2, "inner_steps": 4, "rounds": 3, "batch": 2, "seq_len": 8,
             "outer": {"lr": LR, "momentum": momentum, "nesterov": False}}
        if sparse:
            s["sparse"] = {"density": DENSITY, "chunk": CHUNK, "value_bits": BITS, "ef_beta": EF_BETA}
        return s

    def create(spec):
        return X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec)), timeout=30).summary.job_id

    IA = grpc.StatusCode.INVALID_ARGUMENT
    rng = np.random.default_rng(21)

    # ---- the sparse job: two slots, one lease each ----
    job = create(job_spec("sparse"))
    La = [lease_in(mds[i], job) for i in range(2)]
    L0, md0 = La[0], mds[0]
    n = L0.fragments[0].num_floats
    ms = L0.model
    tl = tensor_lengths(ms.vocab_size, ms.max_seq_len, ms.num_layers, ms.channels)
    check(all(L.delta_codec == pb.CODEC_SPARSE and L.delta_block_floats == 0 and L.sparse_density == DENSITY
              and L.sparse_chunk == CHUNK and L.sparse_value_bits == BITS and L.sparse_ef_beta == EF_BETA
              and L.sparse_pull and not L.outer_nesterov for L in La),
          f"the leases say CODEC_SPARSE, density {DENSITY}, chunk {CHUNK}, value_bits {BITS}, ef_beta {EF_BETA}, "
          "sparse_pull, outer_nesterov false")
    check(len(L0.fragments) == 1 and sum(tl) == n and len(tl) == 4 + 12 * MODEL["n_layer"],
          f"one fragment of {n} floats = the {len(tl)} tensors of the layout")
    theta0 = pull(md0, L0)
    check(len(theta0) == n, f"version 0 pulled ({len(theta0)} floats)")
    recs = records(tl)
    deltas = [(rng.standard_normal(n) * 1e-2).astype(F) for _ in range(3)]
    enc = [ref_encode(x, tl, DENSITY, CHUNK, BITS)[0] for x in deltas]
    nbytes = len(enc[0])
    check(nbytes == recs[-1]["at"] + recs[-1]["size"] and all(len(e) == nbytes for e in enc),
          f"{len(recs)} chunk records, {nbytes} bytes a stream")
    dec = [decode(e, n, recs) for e in enc]
    check(all(np.count_nonzero(dec[i]) == sum(r["k"] for r in recs) for i in range(3)),
          "each decoded stream has k non-zero values per chunk")
    res = [ref_encode(x, tl, DENSITY, CHUNK, BITS)[1] for x in deltas]
    check(all(np.allclose(dec[i] + res[i], deltas[i], rtol=1e-6, atol=1e-9) for i in range(3)),
          "decoded + the encoder's residual gives the delta back (the walker reads what ref_encode wrote)")

    # ---- the records to corrupt ----
    def find(pred, what):
        for r in recs:
            if pred(r):
                return r
        raise AssertionError(f"no chunk record {what}")

    e0 = enc[0]
    r_short = find(lambda r: r["L"] < CHUNK and r["c"] > 0 and r["k"] >= 2, "short last chunk with k >= 2")
    r_ipad = find(lambda r: (r["k"] * ib) % 8 and r["k"] >= 2, "with index padding")
    r_cpad = find(lambda r: (r["k"] * BITS) % 8 and r["c"] > 0, "with code padding")
    r_unused = next((r for r in recs if len(set(parse(e0, r)[2].tolist())) < nb), None)
    check(r_unused is not None, "some chunk record of stream 0 leaves a code unused")
    r_mid = recs[len(recs) // 2]

    def where(r):
        return f"tensor {r['t']} chunk {r['c']}"

    cases = []  # (what, chunks, code, words)
    cases.append(("total one byte short", chunks(L0, e0[:-1], n), IA, ["CODEC_SPARSE", f"{nbytes} bytes",
                                                                          f"{nbytes - 1} bytes"]))
    cases.append(("total one byte long", chunks(L0, e0 + b"\0", n), IA, [f"{nbytes} bytes", f"{nbytes + 1} bytes"]))
    cases.append(("num_floats = fragment length - 1", chunks(L0, e0, n - 1), IA, [f"{n} floats", f"{n - 1} floats"]))
    fp32 = deltas[0].astype("<f4").tobytes()
    cases.append(("codec fp32 on the sparse job", chunks(L0, fp32, n, codec=pb.CODEC_FP32, step=4000), IA,
                  ["CODEC_SPARSE", "codec fp32"]))
    e3 = bytes(4 * ((n + 255) // 256) + (n + 1) // 2)  # a well-formed all-zero e3m0 stream, block 256
    cases.append(("codec e3m0 on the sparse job", chunks(L0, e3, n, codec=pb.CODEC_E3M0, block=256), IA,
                  ["CODEC_SPARSE", "codec e3m0"]))
    cases.append(("block_floats 256 on a sparse stream", chunks(L0, e0, n, block=256), IA,
                  ["block_floats 0", "block_floats 256"]))
    t, _, c = parse(e0, r_mid)
    bad = t.copy()
    bad[c[0]] = np.nan
    cases.append(("a NaN table value", chunks(L0, rebuild(e0, r_mid, table=bad), n), IA,
                  [where(r_mid), f"table[{c[0]}]", "nan"]))
    bad = t.copy()
    bad[c[-1]] = np.inf
    cases.append(("an Inf table value", chunks(L0, rebuild(e0, r_mid, table=bad), n), IA,
                  [where(r_mid), f"table[{c[-1]}]", "inf"]))
    if r_unused is not None:
        t, _, c = parse(e0, r_unused)
        u = min(set(range(nb)) - set(c.tolist()))
        check(t[u] == 0 and not np.signbit(t[u]), f"{where(r_unused)}: unused code {u} has table value +0")
        bad = t.copy()
        bad[u] = 1e-3
        cases.append((f"a non-zero table value for unused code {u}", chunks(L0, rebuild(e0, r_unused, table=bad), n),
                      IA, [where(r_unused), f"no index uses code {u}"]))
        bad[u] = -0.0
        cases.append((f"-0.0 for unused code {u}", chunks(L0, rebuild(e0, r_unused, table=bad), n), IA,
                      [where(r_unused), f"no index uses code {u}"]))
    _, i, _ = parse(e0, r_mid)
    rep = i.copy()
    rep[1] = rep[0]
    cases.append(("a repeated index", chunks(L0, rebuild(e0, r_mid, idx=rep), n), IA,
                  [where(r_mid), f"index {i[0]} follows {i[0]}", "increase"]))
    dcr = i.copy()
    dcr[0], dcr[1] = i[1], i[0]
    cases.append(("a decreasing index", chunks(L0, rebuild(e0, r_mid, idx=dcr), n), IA,
                  [where(r_mid), f"index {i[0]} follows {i[1]}", "increase"]))
    _, i, _ = parse(e0, r_short)
    past = i.copy()
    past[-1] = r_short["L"]  # representable in ib bits, past the short chunk's end
    cases.append((f"index {r_short['L']} in a short last chunk of {r_short['L']} values",
                  chunks(L0, rebuild(e0, r_short, idx=past), n), IA,
                  [where(r_short), f"index {r_short['L']}", f"past the chunk's {r_short['L']} values"]))
    b = bytearray(e0)
    b[r_ipad["at"] + 4 * nb + (r_ipad["k"] * ib + 7) // 8 - 1] |= 0x80
    cases.append(("non-zero index padding bits", chunks(L0, bytes(b), n), IA,
                  [where(r_ipad), "index padding bits"]))
    b = bytearray(e0)
    b[r_cpad["at"] + r_cpad["size"] - 1] |= 0x80
    cases.append(("non-zero code padding bits", chunks(L0, bytes(b), n), IA, [where(r_cpad), "code padding bits"]))
    cases.append(("a wrong crc32c", chunks(L0, e0, n, crc=crc32c(e0) ^ 1), grpc.StatusCode.DATA_LOSS, ["crc32c"]))

    rej0 = metric("dipaco_deltas_rejected_total")
    check(rej0 == 0, f"dipaco_deltas_rejected_total starts at 0 ({rej0})")
    for what, cs, code, words in cases:
        v0, bi0 = version(job), bytes_in(job)
        c, msg = push(md0, cs)
        msg = msg if isinstance(msg, str) else str(msg)
        check(c == code and all(w in msg for w in words), f"{what} → {code.name} naming {words} ({c}: {msg})")
        check(version(job) == v0 == 0 and bytes_in(job) == bi0 == 0 and not lease_files(L0),
              f"{what}: nothing recorded (version 0, bytes_in 0, no delta file)")
    rej1 = metric("dipaco_deltas_rejected_total")
    check(rej1 - rej0 == len(cases), f"dipaco_deltas_rejected_total +{rej1 - rej0} = the {len(cases)} refusals")
    check(X["GetJob"](pb.JobRequest(job_id=job), timeout=10).summary.state == pb.JOB_RUNNING,
          "the job still runs")

    # ---- correct pushes: replica 1's lease first ----
    order = sorted(range(2), key=lambda i: (La[i].slot.path, La[i].slot.replica))
    check([(La[i].slot.path, La[i].slot.replica) for i in order] == [(0, 0), (0, 1)],
          "the two leases hold slots (0, 0) and (0, 1)")
    first, second = order[1], order[0]  # replica 1 pushes first
    check(result(push(mds[first], chunks(La[first], enc[first], n, step=97))) == pb.PUSH_ACCEPTED,
          f"slot (0, 1)'s sparse delta accepted (lease {La[first].lease_id})")
    check(len(lease_files(La[first])) == 1, "… spooled as one file")
    check(result(push(mds[first], chunks(La[first], enc[first], n, step=1000))) == pb.PUSH_DUPLICATE,
          "the same stream again on the lease → PUSH_DUPLICATE")
    c, msg = push(mds[first], chunks(La[first], enc[2], n))
    check(c == grpc.StatusCode.ALREADY_EXISTS and "different" in str(msg),
          f"a different stream on the lease → ALREADY_EXISTS ({c}: {msg})")
    check(version(job) == 0 and len(lease_files(La[first])) == 1, "still version 0, one delta file")
    check(metric("dipaco_deltas_rejected_total") == rej1, "duplicate and conflicting pushes are not counted as rejected")
    check(result(push(mds[second], chunks(La[second], enc[second], n))) == pb.PUSH_ACCEPTED,
          "slot (0, 0)'s sparse delta accepted (on the lease its refused pushes used)")
    check(wait_version(job, 1), "round 0 closed (version 1)")
    check(bytes_in(job) == 2 * nbytes, f"GetJob summary.bytes_in {bytes_in(job)} = 2 accepted streams x {nbytes}")

    Lb = [lease_in(mds[i], job) for i in range(2)]
    got = pull(mds[0], Lb[0], version=1)
    avg = (0.5 * dec[order[0]].astype(np.float64) + 0.5 * dec[order[1]].astype(np.float64)).astype(F)
    want = (theta0 + F(-LR) * avg).astype(F)
    check(got.shape == want.shape and np.array_equal(got, want),
          f"version 1 = theta0 - lr * fp32(mean of the decoded streams), bit for bit "
          f"(max err {np.max(np.abs(got - want)) if got.shape == want.shape else 'shape'})")
    check(not np.array_equal(got, (theta0 + F(-LR) * ((deltas[0].astype(np.float64) + deltas[1]) / 2).astype(F))),
          "… and not the step over the dense deltas")

    # ---- PAYLOAD_SPARSE_ROUND ----
    SR = pb.PAYLOAD_SPARSE_ROUND
    cs = pull_chunks(mds[1], Lb[1], version=1, payload=SR)
    raw = b"".join(c.data for c in cs)
    check(len(cs) >= 1 and cs[0].payload == SR and cs[0].total == len(raw) and cs[-1].crc32c == crc32c(raw),
          f"the sparse round of version 1 comes as {len(raw)} bytes, CRC-32C right")
    head = struct.unpack_from("<I", raw, 0)[0] if len(raw) >= 4 else -1
    want_raw = struct.pack("<I", 2) + struct.pack("<dQ", 1.0, nbytes) * 2 + enc[order[0]] + enc[order[1]]
    check(head == 2 and raw[4:36] == want_raw[4:36], f"n = {head}, weights 1.0, {nbytes} bytes each")
    check(raw == want_raw, "the two accepted streams in (path, replica) order, byte for byte")
    rest = pull_chunks(mds[1], Lb[1], version=1, payload=SR, offset=1001)
    check(rest and rest[0].offset == 1001 and b"".join(c.data for c in rest) == raw[1001:],
          "a resumed sparse-round pull (offset 1001) gives the rest of the same bytes")
    for v, what in ((0, "version 0"), (2, "version 2 (not made yet)")):
        c, msg = code_of(pull_chunks, mds[1], Lb[1], version=v, payload=SR)
        check(c == IA and "version" in str(msg), f"sparse round of {what} → INVALID_ARGUMENT ({c}: {msg})")

    plain = create(job_spec("plain", sparse=False))
    Lp = lease_in(mds[2], plain)
    check(Lp.delta_codec == pb.CODEC_FP32 and not Lp.sparse_pull, "a non-sparse job's lease: fp32, no sparse pull")
    c, msg = code_of(pull_chunks, mds[2], Lp, version=1, payload=SR)
    check(c == grpc.StatusCode.FAILED_PRECONDITION and "sparse" in str(msg),
          f"PAYLOAD_SPARSE_ROUND on a non-sparse job → FAILED_PRECONDITION ({c}: {msg})")
    mom = create(job_spec("momentum", momentum=0.9))
    Lm = lease_in(mds[3], mom)
    check(Lm.delta_codec == pb.CODEC_SPARSE and not Lm.sparse_pull, "a sparse job with outer momentum: no sparse pull")
    c, msg = code_of(pull_chunks, mds[3], Lm, version=1, payload=SR)
    check(c == grpc.StatusCode.FAILED_PRECONDITION, f"… and PAYLOAD_SPARSE_ROUND → FAILED_PRECONDITION ({c}: {msg})")

    # ---- still serving ----
    e3b = ref_encode((rng.standard_normal(n) * 1e-2).astype(F), tl, DENSITY, CHUNK, BITS)[0]
    check(result(push(mds[0], chunks(Lb[0], e3b, n))) == pb.PUSH_ACCEPTED,
          "the next round's push is accepted after all of it")
    check(metric("dipaco_deltas_rejected_total") == rej1, "no further refusals counted")
    alive = d[0].proc.poll() is None
    check(alive, "the coordinator is still running")
    if alive:
        check(d[0].stop() == 0, "SIGTERM → exit 0")


if __name__ == "__main__":
    sys.exit(main())
