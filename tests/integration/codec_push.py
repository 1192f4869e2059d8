#!/usr/bin/env python3
"""codec_push.py — quantized deltas in PushDelta (job spec streaming.codec / block_floats) on a
real dipaco-coordinator, driven by python grpcio playing the workers of sync DiLoCo jobs
(streaming.fragments 1, overlap_steps 0, alpha 0: plain sync DiLoCo, R = 2). The encoders and
decoders below are numpy, written from docs/design.md §3 (fp32 arithmetic).

  * e3m0 job (block_floats 256, a model whose one fragment has an odd length, so the last
    block pads a nibble): the lease names the codec and block size. Refused with
    INVALID_ARGUMENT and a message naming the problem, each leaving the fragment's version
    unchanged and no delta file of the lease: total too short and too long for num_floats,
    num_floats != the fragment's length, block_floats != the job's, a codec that is neither
    fp32 nor the job's (fp8), a NaN / Inf / negative block scale, a nonzero pad nibble; a wrong
    crc32c is DATA_LOSS. Refused headers count no received bytes; payloads refused after
    arriving (decode, crc) count their bytes in dipaco_bytes_in_total, as push_chunk_data does.
    Then a correct push from each replica is accepted (the refused lease's push is ACCEPTED,
    not a duplicate: nothing was recorded), is kept as sent (one .encoded blob, no decoded fp32
    spool beside it), and adds exactly its encoded size to
    dipaco_bytes_in_total; the same encoded delta again on the lease is PUSH_DUPLICATE, a
    different one ALREADY_EXISTS. The round closes and the new parameters equal the outer step
    (SGD nesterov, numpy) over the DECODED deltas of the accepted pushes only; GetJob's
    summary.bytes_in is the sum of the accepted pushes' encoded sizes.
  * int8 job: a code -128 (0x80) and a finite scale whose codes decode to infinity are refused
    (INVALID_ARGUMENT), the job's own codec only (e3m0 refused); one replica pushes int8, the
    other fp32 (always accepted), and the outer step over the int8-decoded and the fp32 delta
    is checked the same way, bytes_in adding the two streams' sizes.
  * a chunk whose data runs past the header's total (total itself right for num_floats) is
    refused with INVALID_ARGUMENT (rpc_chunk_parse) before the quantized stream's buffer,
    sized by total, is written, and the coordinator keeps serving.

usage: codec_push.py COORDINATOR_BIN PROTO_DIR"""
import json
import re
import sys
import urllib.request

from daemon_kit import PushKit, check, crc32c, grpc_stubs, run_grpc_test, status_of

LR, MU = 0.7, 0.9
BLOCK = 256


# ---- numpy codecs from docs/design.md §3 --------------------------------------------------------
def encode(np, codec, x, bf=BLOCK):
    """(stream bytes, decoded float32) of x under int8 or e3m0 with bf floats per block."""
    F = np.float32
    x = np.asarray(x, F)
    out, dec = bytearray(), []
    # e3m0 levels m(e) = 2^(e-7), e = 1..7, and the midpoints between neighbours (a tie takes
    # the larger level: e = number of midpoints <= y).
    mids = np.array([2.0**-7] + [1.5 * 2.0**k for k in range(-6, 0)], F)
    lev = np.array([0.0] + [2.0**(e - 7) for e in range(1, 8)], F)
    for i in range(0, len(x), bf):
        b = x[i:i + bf]
        amax = F(np.max(np.abs(b)))
        s = F(amax / F(127)) if codec == "int8" else amax
        if s == 0:
            codes = np.zeros(len(b), np.uint8)
            y = np.zeros(len(b), F)
        elif codec == "int8":
            q = np.clip(np.rint((b / s).astype(F)), -127, 127).astype(np.int64)
            codes = (q & 0xFF).astype(np.uint8)
            y = (q.astype(F) * s).astype(F)
        else:
            e = np.searchsorted(mids, (np.abs(b) / s).astype(F), side="right")
            neg = (b < 0) & (e > 0)
            codes = (e | np.where(neg, 8, 0)).astype(np.uint8)
            y = (np.where(neg, -lev[e], lev[e]).astype(F) * s).astype(F)
        out += np.array([s], "<f4").tobytes()
        if codec == "e3m0":
            if len(codes) % 2:
                codes = np.append(codes, np.uint8(0))
            out += (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8).tobytes()
        else:
            out += codes.tobytes()
        dec.append(y)
    return bytes(out), np.concatenate(dec).astype(F)


def decode(np, codec, data, n, bf=BLOCK):
    """Independent decode of a stream (the test's own bytes round-trip through it)."""
    F = np.float32
    y, at = [], 0
    for i in range(0, n, bf):
        k = min(bf, n - i)
        s = np.frombuffer(data[at:at + 4], "<f4")[0]
        at += 4
        if codec == "int8":
            c = np.frombuffer(data[at:at + k], np.int8).astype(F)
            y.append((c * s).astype(F))
            at += k
        else:
            nb = (k + 1) // 2
            raw = np.frombuffer(data[at:at + nb], np.uint8)
            c = np.empty(2 * nb, np.uint8)
            c[0::2], c[1::2] = raw & 0xF, raw >> 4
            c = c[:k]
            e = c & 7
            m = np.where(e == 0, F(0), np.ldexp(F(1), e.astype(np.int32) - 7)).astype(F)
            y.append((np.where(c & 8, -m, m).astype(F) * s).astype(F))
            at += nb
    return np.concatenate(y).astype(F)


def main():
    coord_bin, proto_dir = sys.argv[1], sys.argv[2]
    return run_grpc_test(coord_bin, proto_dir, "dpc_codec_push_",
                         lambda grpc, np, pb, d, state, log: body(grpc, np, pb, d, state))


def body(grpc, np, pb, d, state):
    F = np.float32

    def connect():
        return grpc_stubs(grpc, pb, d[0].addr, state)

    def code_of(fn, *a, **kw):
        return status_of(grpc, fn, *a, **kw)

    X = connect()
    mds = []
    for i in range(4):
        w = X["Register"](pb.RegisterRequest(hostname=f"w{i}", backend="cpu", threads=1), timeout=10)
        mds.append([("dipaco-worker-id", str(w.worker_id)), ("dipaco-session", w.session_token)])

    def bytes_in_total():
        with urllib.request.urlopen(f"http://127.0.0.1:{d[0].mport}/metrics", timeout=10) as r:
            m = re.search(r"^dipaco_bytes_in_total (\d+)$", r.read().decode(), re.M)
        return int(m.group(1)) if m else -1

    def lease_in(md, job):
        r = X["Lease"](pb.LeaseRequest(max_wait_ms=5000, job_id=job), metadata=md, timeout=10)
        assert r.outcome == pb.LEASE_GRANTED, r
        return r.lease

    def pull(md, L):
        cs = list(X["PullFragment"](pb.PullFragmentRequest(lease_id=L.lease_id, fragment_id=1), metadata=md,
                                    timeout=30))
        return np.frombuffer(b"".join(c.data for c in cs), dtype="<f4").copy()

    K = PushKit(grpc, pb, X, state)

    def chunks(L, data, codec, num_floats, block=BLOCK, total=None, crc=None, step=100):
        """The chunks of one fragment's stream `data` (header fields overridable)."""
        return K.chunks(L, data, codec, num_floats, block if codec != pb.CODEC_FP32 else 0, total, crc, step)

    push, result, version, wait_version, lease_files = K.push, K.result, K.version, K.wait_version, K.lease_files

    def job_spec(name, model, codec):
        return {"name": name, "model": model, "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco",
                "replicas": 2, "inner_steps": 2, "rounds": 2, "batch": 1, "seq_len": 8,
                "outer": {"lr": LR, "momentum": MU, "nesterov": True},
                "streaming": {"fragments": 1, "overlap_steps": 0, "alpha": 0, "codec": codec, "block_floats": BLOCK}}

    def refused(job, md, L, cs, code, words, what, counted):
        """Push cs; expect `code` with every word of `words` in the message, the fragment's
        version unchanged, no delta file of the lease, and the received-bytes counter moved by
        `counted` (0 for a header refused on the first chunk, else the bytes sent)."""
        v0, b0 = version(job), bytes_in_total()
        c, msg = push(md, cs)
        msg = msg if isinstance(msg, str) else str(msg)
        check(c == code and all(w in msg for w in words), f"{what} → {code.name} naming {words} ({c}: {msg})")
        check(version(job) == v0 and not lease_files(L), f"{what}: nothing stored (version {v0}, no delta file)")
        b1 = bytes_in_total()
        check(b1 - b0 == counted, f"{what}: dipaco_bytes_in_total +{b1 - b0} (want +{counted})")

    def outer_oracle(theta0, decoded):
        avg = sum(decoded[r].astype(np.float64) for r in range(len(decoded))) / len(decoded)
        avg32 = avg.astype(F)
        return theta0 - F(LR) * (avg32 + F(MU) * avg32)

    rng = np.random.default_rng(7)
    IA = grpc.StatusCode.INVALID_ARGUMENT

    # ---- the e3m0 job: L=2, E=5, H=1, P=8, V=15 → 5*25 + 2*(12*25 + 13*5) = 855 floats (odd) ----
    model = {"n_layer": 2, "n_head": 1, "n_embd": 5, "n_positions": 8, "vocab_size": 15, "seed": 3}
    ja = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(job_spec("e3m0", model, "e3m0"))),
                        timeout=30).summary.job_id
    La = [lease_in(mds[i], ja) for i in range(2)]
    n = La[0].fragments[0].num_floats
    check(all(L.delta_codec == pb.CODEC_E3M0 and L.delta_block_floats == BLOCK for L in La),
          f"e3m0 job: the lease says delta_codec e3m0, block_floats {BLOCK}")
    theta0 = pull(mds[0], La[0])
    check(len(theta0) == n and n > BLOCK, f"e3m0 job: one fragment of {n} floats ({len(theta0)} pulled)")
    deltas = [(rng.standard_normal(n) * 1e-2).astype(F) for _ in range(2)]
    enc, dec = zip(*(encode(np, "e3m0", x) for x in deltas))
    nbytes = len(enc[0])
    nblk = (n + BLOCK - 1) // BLOCK
    check(nbytes == 4 * nblk + (n // BLOCK) * (BLOCK // 2) + ((n % BLOCK) + 1) // 2,
          f"e3m0: {n} floats take {nbytes} bytes")
    check(all(np.array_equal(decode(np, "e3m0", enc[r], n), dec[r]) for r in range(2)),
          "the numpy e3m0 stream decodes to what its encoder says")
    check(all(np.max(np.abs(dec[r] - deltas[r])) <= np.max(np.abs(deltas[r])) / 2 for r in range(2)),
          "e3m0 decoded within amax / 2 of the delta")
    md0, L0 = mds[0], La[0]
    E3 = pb.CODEC_E3M0

    def with_scale(data, blk, value):
        b = bytearray(data)
        at = blk * (4 + BLOCK // 2)
        b[at:at + 4] = np.array([value], "<f4").tobytes()
        return bytes(b)

    refused(ja, md0, L0, chunks(L0, enc[0][:-1], E3, n), IA, ["total"], "total one byte short of num_floats' size", 0)
    refused(ja, md0, L0, chunks(L0, enc[0] + b"\0", E3, n), IA, ["total"], "total one byte over num_floats' size", 0)
    short, _ = encode(np, "e3m0", deltas[0][:-1])
    refused(ja, md0, L0, chunks(L0, short, E3, n - 1), IA, ["num_floats"], "num_floats = fragment length - 1", 0)
    half, _ = encode(np, "e3m0", deltas[0], BLOCK // 2)
    refused(ja, md0, L0, chunks(L0, half, E3, n, block=BLOCK // 2), IA, ["block_floats"],
            f"block_floats {BLOCK // 2} on a block_floats {BLOCK} job", 0)
    fp8 = bytes(nblk * 4 + n)  # an all-zero fp8 stream of the right size: well formed but not the job's codec
    refused(ja, md0, L0, chunks(L0, fp8, pb.CODEC_FP8_E4M3, n), IA, ["codec", "fp8"], "fp8 on the e3m0 job", 0)
    refused(ja, md0, L0, chunks(L0, with_scale(enc[0], 1, np.nan), E3, n), IA, ["block 1", "scale", "nan"],
            "NaN scale in block 1", nbytes)
    refused(ja, md0, L0, chunks(L0, with_scale(enc[0], 0, np.inf), E3, n), IA, ["block 0", "scale", "inf"],
            "Inf scale in block 0", nbytes)
    refused(ja, md0, L0, chunks(L0, with_scale(enc[0], 2, -1e-2), E3, n), IA, ["block 2", "negative"],
            "negative scale in block 2", nbytes)
    if n % 2:
        pad = bytearray(enc[0])
        pad[-1] |= 0x10  # the high nibble after the odd last value
        refused(ja, md0, L0, chunks(L0, bytes(pad), E3, n), IA, ["pad nibble"],
                "a nonzero e3m0 pad nibble (odd fragment length)", nbytes)
    else:
        print(f"note: fragment length {n} is even: no pad nibble to corrupt, case skipped")
    refused(ja, md0, L0, chunks(L0, enc[0], E3, n, crc=crc32c(enc[0]) ^ 1), grpc.StatusCode.DATA_LOSS, ["crc32c"],
            "a wrong crc32c", nbytes)
    check(version(ja) == 0, "e3m0 job: still version 0 after the refusals")

    b0 = bytes_in_total()
    check(result(push(md0, chunks(L0, enc[0], E3, n))) == pb.PUSH_ACCEPTED,
          "replica 0's e3m0 delta accepted on the lease its refused pushes used (nothing was recorded before)")
    b1 = bytes_in_total()
    check(b1 - b0 == nbytes, f"accepted push: dipaco_bytes_in_total +{b1 - b0} = its {nbytes} encoded bytes")
    check(sorted(f.rsplit(".", 1)[1] for f in lease_files(L0)) == ["encoded"],
          "the accepted delta is kept as sent (one .encoded file for the lease, no decoded fp32 spool: the outer "
          "step decodes it)")
    check(result(push(md0, chunks(L0, enc[0], E3, n, step=64))) == pb.PUSH_DUPLICATE,
          "the same encoded delta again on the lease → PUSH_DUPLICATE")
    other, _ = encode(np, "e3m0", (rng.standard_normal(n) * 1e-2).astype(F))
    c, msg = push(md0, chunks(L0, other, E3, n))
    check(c == grpc.StatusCode.ALREADY_EXISTS and "different" in str(msg),
          f"a different delta on the same lease → ALREADY_EXISTS ({c}: {msg})")
    b2 = bytes_in_total()
    check(b2 - b1 == 2 * nbytes, f"duplicate and conflicting pushes count as received: +{b2 - b1} = 2 x {nbytes}")
    check(version(ja) == 0 and len(lease_files(L0)) == 1, "still version 0, one delta file (its .encoded) for the lease")
    check(result(push(mds[1], chunks(La[1], enc[1], E3, n))) == pb.PUSH_ACCEPTED, "replica 1's e3m0 delta accepted")
    check(wait_version(ja, 1), "e3m0 job: round 0 closed (version 1)")
    got = pull(mds[0], lease_in(mds[0], ja))
    want = outer_oracle(theta0, dec)
    check(np.allclose(got, want, rtol=1e-5, atol=1e-7),
          f"version 1 = outer step over the two decoded e3m0 deltas (max err {np.max(np.abs(got - want)):.2e})")
    raw = outer_oracle(theta0, deltas)
    check(not np.allclose(got, raw, rtol=1e-5, atol=1e-7), "… and not the step over the unquantized deltas")
    j = X["GetJob"](pb.JobRequest(job_id=ja), timeout=10).summary
    check(j.bytes_in == 2 * nbytes, f"GetJob summary.bytes_in {j.bytes_in} = 2 accepted pushes x {nbytes} bytes")

    # ---- the int8 job: the default tiny model (1080 floats, 5 blocks) ----
    model = {"n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 8, "vocab_size": 16, "seed": 5}
    jb = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(job_spec("int8", model, "int8"))),
                        timeout=30).summary.job_id
    Lb = [lease_in(mds[2 + i], jb) for i in range(2)]
    n = Lb[0].fragments[0].num_floats
    check(all(L.delta_codec == pb.CODEC_INT8 for L in Lb), "int8 job: the lease says delta_codec int8")
    theta0 = pull(mds[2], Lb[0])
    deltas = [(rng.standard_normal(n) * 1e-2).astype(F) for _ in range(2)]
    enc, dec = zip(*(encode(np, "int8", x) for x in deltas))
    nbytes = len(enc[0])
    check(nbytes == 4 * ((n + BLOCK - 1) // BLOCK) + n, f"int8: {n} floats take {nbytes} bytes")
    check(all(np.array_equal(decode(np, "int8", enc[r], n), dec[r]) for r in range(2)),
          "the numpy int8 stream decodes to what its encoder says")
    md2, L2 = mds[2], Lb[0]
    I8 = pb.CODEC_INT8
    bad = bytearray(enc[0])
    bad[4 + BLOCK + 4 + 17] = 0x80  # value 256 + 17, block 1
    refused(jb, md2, L2, chunks(L2, bytes(bad), I8, n), IA, ["0x80", "-128"], "an int8 code -128 (0x80)", nbytes)
    big = bytearray(enc[0])
    big[0:4] = np.array([3e38], "<f4").tobytes()
    big[4] = 127  # 127 * 3e38 overflows fp32
    refused(jb, md2, L2, chunks(L2, bytes(big), I8, n), IA, ["not finite"],
            "a finite scale whose code 127 decodes to infinity", nbytes)
    e3, _ = encode(np, "e3m0", deltas[0])
    refused(jb, md2, L2, chunks(L2, e3, E3, n), IA, ["codec", "e3m0"], "e3m0 on the int8 job", 0)
    b0 = bytes_in_total()
    check(result(push(md2, chunks(L2, enc[0], I8, n))) == pb.PUSH_ACCEPTED, "int8 job: replica 0's delta accepted")
    raw1 = deltas[1].astype("<f4").tobytes()
    check(result(push(mds[3], chunks(Lb[1], raw1, pb.CODEC_FP32, n, step=1000))) == pb.PUSH_ACCEPTED,
          "int8 job: replica 1's delta accepted as fp32 (fp32 is always accepted)")
    b1 = bytes_in_total()
    check(b1 - b0 == nbytes + 4 * n, f"int8 job: dipaco_bytes_in_total +{b1 - b0} = {nbytes} + {4 * n}")
    check(wait_version(jb, 1), "int8 job: round 0 closed (version 1)")
    got = pull(mds[2], lease_in(mds[2], jb))
    want = outer_oracle(theta0, [dec[0], deltas[1]])
    check(np.allclose(got, want, rtol=1e-5, atol=1e-7),
          f"int8 job: version 1 = outer step over the decoded int8 delta and the fp32 one "
          f"(max err {np.max(np.abs(got - want)):.2e})")
    j = X["GetJob"](pb.JobRequest(job_id=jb), timeout=10).summary
    check(j.bytes_in == nbytes + 4 * n, f"int8 job: GetJob summary.bytes_in {j.bytes_in} = {nbytes} + {4 * n}")
    check(X["GetJob"](pb.JobRequest(job_id=ja), timeout=10).summary.bytes_in == 2 * len(encode(np, "e3m0",
          np.zeros(La[0].fragments[0].num_floats, F))[0]), "the e3m0 job's bytes_in is its own")

    # ---- a chunk running past the header's total (the total itself right for num_floats) ----
    L3 = lease_in(mds[3], jb)
    x3, _ = encode(np, "int8", (rng.standard_normal(n) * 1e-2).astype(F))
    over = [pb.Chunk(lease_id=L3.lease_id, fragment_id=1, version=L3.fragments[0].version, offset=0, total=len(x3),
                     codec=I8, crc32c=crc32c(x3 + bytes(4096)), num_floats=n, block_floats=BLOCK, inner_steps=2,
                     tokens=16, payload=pb.PAYLOAD_DELTA, data=x3 + bytes(4096))]
    c, msg = push(mds[3], over)
    check(c == IA, f"int8 chunk of {len(x3) + 4096} bytes for a {len(x3)}-byte stream → INVALID_ARGUMENT ({c}: {msg})")
    alive = d[0].proc.poll() is None
    check(alive, "the coordinator is still running after it")
    if alive:
        check(d[0].stop() == 0, "SIGTERM → exit 0")


if __name__ == "__main__":
    sys.exit(main())
