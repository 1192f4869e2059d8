#!/usr/bin/env python3
"""put_inner.py — workers' inner-state objects on an S3 store (PrepareDeltaPut with
DeltaPut.payload, presigned PUTs, PushInnerState with PAYLOAD_INNER_OBJECT; docs/design.md §5.8),
driven by python grpcio playing the worker of a DiLoCo job with inner.state checkpoint (R = 1)
against a real dipaco-coordinator on the RADOS Gateway of tests/s3/with_rgw.sh. Run under
with_rgw.sh.

  * the lease says inner_put; prepares with the wrong num_floats (M holds the fragment's floats
    and two more, the AdamW step), a payload the job has no stream for, or the same payload twice
    are INVALID_ARGUMENT;
  * a commit with no object prepared under its attempt is FAILED_PRECONDITION, one claiming
    another CRC-32C INVALID_ARGUMENT, one of an object never PUT FAILED_PRECONDITION;
  * good PUTs and their commit make the slot's blobs f0-v0-a1.innerm/.innerv hold exactly the bytes
    put (the store copied them), and no put object is left beside them;
  * the next round's lease has a checkpoint, and PullInnerState with objects answers URLs of
    exactly those bytes;
  * a zombie: a lease prepares its round's M again, is released, and then PUTs other bytes
    through its URL (the store takes them: the URL is still valid): its commit is ABORTED and no
    blob of that round's inner state exists; the next lease of the slot still reads round 0's;
  * after a coordinator restart (which forgets prepared names) the commit of an object prepared
    before it is FAILED_PRECONDITION ("push its bytes") and the object is deleted.
  * objects in parts (--s3-put-part-mb 5) on a store whose one copy holds 5 MiB
    (DIPACO_TEST_S3_COPY_MAX_MB, standing for S3's 5 GiB): M and V of 12.6 MiB go up in 3 parts
    each and the commit has the store copy them part by part: the slot's blobs hold exactly the
    bytes put, and no put object and no multipart upload are left;
  * the same through tests/s3/faultproxy.py answering every part copy 501, as a store without
    UploadPartCopy does: the commit is FAILED_PRECONDITION ("push its bytes"), its objects are
    deleted, and the next prepare of such an object is refused at once (the coordinator learned
    that the store does not copy parts).

usage: put_inner.py COORDINATOR_BIN PROTO_DIR"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from daemon_kit import check, crc32c, free_port, grpc_stubs, run_grpc_test, status_of  # noqa: E402
from put_delta import gateway_args, http_put, run_restartable  # noqa: E402

S3CURL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "s3curl.sh")
KIND = {"m": 5, "v": 6}


def inner_object(np, values, kind, step=None):
    """The blob of docs/design.md §6.4 holding an inner-state stream (M: the step's two words
    after the floats): (bytes, payload CRC-32C, MD5, floats)."""
    payload = np.asarray(values, "<f4").tobytes()
    if step is not None:
        payload += struct.pack("<II", step & 0xFFFFFFFF, step >> 32)
    n = len(payload) // 4
    header = struct.pack("<IIIIQ", 0x42435044, 1, KIND[kind], 0, n)
    pcrc = crc32c(payload)
    body = header + payload + struct.pack("<II", pcrc, crc32c(header))
    return body, pcrc, hashlib.md5(body).digest(), n


def s3get(url_or_key):
    """The bytes of an object (a presigned URL, or a key of the bucket read with its credentials)."""
    if url_or_key.startswith("http"):
        return subprocess.run(["curl", "-s", "-f", url_or_key], capture_output=True).stdout
    ep = os.environ["S3_ENDPOINT"]
    return subprocess.run(["bash", S3CURL, "-f", f"{ep}/dpc-inner/{url_or_key}"], capture_output=True).stdout


def keys(prefix):
    ep = os.environ["S3_ENDPOINT"]
    q = urllib.parse.quote(prefix, safe="")
    out = subprocess.run(["bash", S3CURL, f"{ep}/dpc-inner?list-type=2&prefix={q}"], capture_output=True,
                         text=True).stdout
    return [k.split("</Key>")[0] for k in out.split("<Key>")[1:]]


def main():
    coord_bin, proto_dir = sys.argv[1], sys.argv[2]
    got = gateway_args("dpc-inner", "t")
    if not got:
        return 1
    args = got[1]
    rc = run_restartable(coord_bin, proto_dir, "dpc_put_inner_", run, args)
    if rc:
        return rc
    os.environ["DIPACO_TEST_S3_COPY_MAX_MB"] = "5"
    proxy = None
    try:
        rc = run_grpc_test(coord_bin, proto_dir, "dpc_put_inner_parts_",
                           lambda grpc, np, pb, d, state, log: run_parts(grpc, np, pb, d, state, "p"),
                           args=args[:-3] + ("s3://dpc-inner/p", "--s3-endpoint", got[0], "--s3-put-part-mb", "5"))
        if rc:
            return rc
        port = free_port()
        plog = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"put_inner_proxy_{port}.log")
        proxy = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                               "faultproxy.py"), str(port),
                                  got[0].split("://", 1)[1], "nopartcopy:1", plog])
        for _ in range(50):
            if subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/"]).returncode == 0:
                break
            time.sleep(0.1)
        return run_grpc_test(coord_bin, proto_dir, "dpc_put_inner_nocopy_",
                             lambda grpc, np, pb, d, state, log: run_parts(grpc, np, pb, d, state, "q", plog),
                             args=args[:-3] + ("s3://dpc-inner/q", "--s3-endpoint", f"http://127.0.0.1:{port}",
                                               "--s3-put-part-mb", "5"))
    finally:
        del os.environ["DIPACO_TEST_S3_COPY_MAX_MB"]
        if proxy:
            proxy.kill()
            proxy.wait()


def run(grpc, np, pb, d, state, restart):
    X = grpc_stubs(grpc, pb, d[0].addr, state)
    w = X["Register"](pb.RegisterRequest(hostname="w0", backend="cpu", threads=1), timeout=10)
    md = [("dipaco-worker-id", str(w.worker_id)), ("dipaco-session", w.session_token)]
    spec = {"name": "inner", "model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "n_positions": 8, "vocab_size": 16,
                                       "seed": 3},
            "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 1, "inner_steps": 2,
            "rounds": 3, "batch": 1, "seq_len": 8, "inner": {"state": "checkpoint"}}
    job = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec)), timeout=30).summary.job_id
    S = grpc.StatusCode

    def lease():
        r = X["Lease"](pb.LeaseRequest(max_wait_ms=10000, job_id=job), metadata=md, timeout=20)
        assert r.outcome == pb.LEASE_GRANTED, r
        return r.lease

    L = lease()
    check(L.inner_put, "the lease of a checkpointed job on the S3 store says inner_put")
    n = L.fragments[0].num_floats
    rng = np.random.default_rng(7)
    m = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    v = np.abs(rng.standard_normal(n) * 1e-6).astype(np.float32)
    om, cm, mm, nm = inner_object(np, m, "m", step=2)
    ov, cv, mv, nv = inner_object(np, v, "v")

    def dput(payload, floats, body, crc, md5):
        return pb.DeltaPut(fragment_id=1, num_floats=floats, crc32c=crc, object_bytes=len(body), content_md5=md5,
                           payload=payload)

    def prepare(Lx, puts):
        return status_of(grpc, X["PrepareDeltaPut"], pb.PrepareDeltaPutRequest(lease_id=Lx.lease_id, puts=puts),
                         metadata=md, timeout=10)

    def commit(Lx, objs):
        chunks = [pb.Chunk(lease_id=Lx.lease_id, fragment_id=1, total=4 * floats, codec=pb.CODEC_FP32, crc32c=crc,
                           num_floats=floats, payload=pb.PAYLOAD_INNER_OBJECT, step=att) for floats, crc, att in objs]
        return status_of(grpc, X["PushInnerState"], iter(chunks), metadata=md, timeout=60)

    def expect(res, code, word, what):
        c, msg = res
        check(c == code and word in str(msg), f"{what} → {code.name} naming '{word}' ({c}: {msg})")

    expect(prepare(L, [dput(pb.PAYLOAD_ADAM_M, n, om, cm, mm)]), S.INVALID_ARGUMENT, "num_floats",
           "an M object without the step's two floats")
    expect(prepare(L, [dput(pb.PAYLOAD_LOCAL_PARAMS, n, ov, cv, mv)]), S.INVALID_ARGUMENT, "payload",
           "a third stream on a job that has none")
    expect(prepare(L, [dput(pb.PAYLOAD_ADAM_V, n, ov, cv, mv), dput(pb.PAYLOAD_ADAM_V, n, ov, cv, mv)]),
           S.INVALID_ARGUMENT, "twice", "the same payload twice")
    expect(commit(L, [(nm, cm, 12345)]), S.FAILED_PRECONDITION, "no inner-state object was prepared",
           "a commit with nothing prepared")
    c, r = prepare(L, [dput(pb.PAYLOAD_ADAM_M, nm, om, cm, mm), dput(pb.PAYLOAD_ADAM_V, nv, ov, cv, mv)])
    check(c == S.OK and len(r.puts) == 2 and all(p.url.startswith("http") for p in r.puts),
          f"a good prepare of M and V gives two URLs ({c})")
    if c != S.OK:
        return
    um, uv = (p for p in sorted(r.puts, key=lambda p: p.payload))
    check(um.payload == pb.PAYLOAD_ADAM_M and ".innerm" in um.url and "-t" in um.url,
          f"M's URL writes a stamped name, not the slot's ({um.url.split('?')[0]})")
    check(http_put(um.url, om, mm)[0] == 200, "M's bytes are taken")
    expect(commit(L, [(nm, cm ^ 1, um.attempt)]), S.INVALID_ARGUMENT, "CRC-32C", "a commit claiming another CRC-32C")
    # The CRC refusal ended that stream; V was never PUT, so its commit finds no object.
    c, r2 = prepare(L, [dput(pb.PAYLOAD_ADAM_M, nm, om, cm, mm), dput(pb.PAYLOAD_ADAM_V, nv, ov, cv, mv)])
    um, uv = (p for p in sorted(r2.puts, key=lambda p: p.payload))
    check(http_put(um.url, om, mm)[0] == 200, "M's bytes are taken again")
    expect(commit(L, [(nv, cv, uv.attempt)]), S.FAILED_PRECONDITION, "", "a commit of an object never PUT")
    c, r3 = prepare(L, [dput(pb.PAYLOAD_ADAM_M, nm, om, cm, mm), dput(pb.PAYLOAD_ADAM_V, nv, ov, cv, mv)])
    um, uv = (p for p in sorted(r3.puts, key=lambda p: p.payload))
    check(http_put(um.url, om, mm)[0] == 200 and http_put(uv.url, ov, mv)[0] == 200, "M's and V's bytes are taken")
    c, _ = commit(L, [(nm, cm, um.attempt), (nv, cv, uv.attempt)])
    check(c == S.OK, f"their commit is accepted ({c})")
    check(s3get(f"t/{job}/f0-v0-a1.innerm") == om and s3get(f"t/{job}/f0-v0-a1.innerv") == ov,
          "the slot's round-0 M and V blobs hold exactly the bytes put (the store copied them)")
    time.sleep(1)  # the deletes of the refused commits' objects run on the thread pool
    staged = [k for k in keys(f"t/{job}/") if "-t" in k and ".inner" in k]
    check(staged == [], f"no put inner-state object is left beside them ({staged})")

    # The round closes on the delta; the next lease of the slot reads round 0's state.
    delta = (rng.standard_normal(n) * 1e-2).astype(np.float32).tobytes()
    ch = pb.Chunk(lease_id=L.lease_id, fragment_id=1, version=L.fragments[0].version, total=len(delta),
                  codec=pb.CODEC_FP32, crc32c=crc32c(delta), num_floats=n, inner_steps=2, tokens=16,
                  payload=pb.PAYLOAD_DELTA, data=delta)
    c, r = status_of(grpc, X["PushDelta"], iter([ch]), metadata=md, timeout=60)
    check(c == S.OK and r.acks[0].result == pb.PUSH_ACCEPTED, f"the round's delta is accepted ({c})")

    def read_state(Lx, what):
        cs = list(X["PullInnerState"](pb.PullInnerStateRequest(lease_id=Lx.lease_id, fragment_id=1, objects=True),
                                      metadata=md, timeout=30))
        urls = b"".join(c.data for c in cs).decode().split()
        check(len(urls) == 2 and cs[0].payload == pb.PAYLOAD_BLOB_URLS and s3get(urls[0]) == om
              and s3get(urls[1]) == ov, f"{what}: PullInnerState's URLs read round 0's M and V as put")

    L1 = lease()
    check(L1.has_inner_checkpoint and L1.round == 1, f"round 1's lease has a checkpoint ({L1.round})")
    read_state(L1, "round 1's lease")
    # A zombie: round 1's lease prepares M, is released, then PUTs other bytes through its URL.
    oz, cz, mz, nz = inner_object(np, m * 2, "m", step=4)
    c, rz = prepare(L1, [dput(pb.PAYLOAD_ADAM_M, nz, oz, cz, mz)])
    X["Release"](pb.ReleaseRequest(lease_id=L1.lease_id, reason=pb.RELEASE_PREEMPTED), metadata=md, timeout=10)
    st = http_put(rz.puts[0].url, oz, mz)[0] if c == S.OK else c
    check(st == 200, f"the released lease's PUT lands (its URL is still valid) ({st})")
    expect(commit(L1, [(nz, cz, rz.puts[0].attempt if c == S.OK else 0)]), S.ABORTED, "no longer active",
           "the released lease's commit")
    check(s3get(f"t/{job}/f0-v1-a1.innerm") == b"", "no round-1 inner state exists: the zombie's bytes went nowhere")
    L1b = lease()
    check(L1b.round == 1 and L1b.has_inner_checkpoint, "the slot's next lease trains round 1 from a checkpoint")
    read_state(L1b, "after the zombie")

    # A restart forgets prepared names: a commit of one prepared before it is refused (the worker
    # pushes the bytes instead) and the object it put is deleted.
    c, rr = prepare(L1b, [dput(pb.PAYLOAD_ADAM_V, nv, ov, cv, mv)])
    check(c == S.OK and http_put(rr.puts[0].url, ov, mv)[0] == 200, "an object put before the restart")
    d[0].stop()
    d[0] = restart()
    X.clear()
    X.update(grpc_stubs(grpc, pb, d[0].addr, state))
    expect(commit(L1b, [(nv, cv, rr.puts[0].attempt)]), S.FAILED_PRECONDITION, "push its bytes",
           "its commit after the restart")
    time.sleep(1)
    staged = [k for k in keys(f"t/{job}/") if "-t" in k and ".inner" in k]
    check(staged == [], f"the object of the refused commit is deleted ({staged})")



def run_parts(grpc, np, pb, d, state, prefix, refused_log=None):
    """Inner-state objects beyond one copy (DIPACO_TEST_S3_COPY_MAX_MB=5) put in 5 MiB parts,
    under prefix; with refused_log, through a proxy refusing part copies (logged there)."""
    X = grpc_stubs(grpc, pb, d[0].addr, state)
    w = X["Register"](pb.RegisterRequest(hostname="w0", backend="cpu", threads=1), timeout=10)
    md = [("dipaco-worker-id", str(w.worker_id)), ("dipaco-session", w.session_token)]
    # 1 layer, C 512, 256 tokens: 3.3M floats, objects of 12.6 MiB: 3 parts of 5 MiB.
    spec = {"name": "inner-parts", "model": {"n_layer": 1, "n_head": 4, "n_embd": 512, "n_positions": 8,
                                             "vocab_size": 256, "seed": 3},
            "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 1, "inner_steps": 2,
            "rounds": 2, "batch": 1, "seq_len": 8, "inner": {"state": "checkpoint"}}
    job = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec)), timeout=60).summary.job_id
    L = X["Lease"](pb.LeaseRequest(max_wait_ms=10000, job_id=job), metadata=md, timeout=20).lease
    P = 5 << 20
    check(L.inner_put and L.delta_put_part_bytes == P, f"the lease says inner_put in 5 MiB parts "
          f"({L.inner_put}, {L.delta_put_part_bytes})")
    n = L.fragments[0].num_floats
    rng = np.random.default_rng(11)
    om, cm, mm, nm = inner_object(np, (rng.standard_normal(n) * 1e-3).astype(np.float32), "m", step=2)
    ov, cv, mv, nv = inner_object(np, np.abs(rng.standard_normal(n) * 1e-6).astype(np.float32), "v")
    parts = [[o[k:k + P] for k in range(0, len(o), P)] for o in (om, ov)]
    check([len(x) for x in parts] == [3, 3], f"each object is 3 parts ({[len(x) for x in parts]})")
    pmd5 = [[hashlib.md5(x).digest() for x in ps] for ps in parts]
    puts = [pb.DeltaPut(fragment_id=1, num_floats=f, crc32c=c, object_bytes=len(o), content_md5=m, payload=pl,
                        part_md5=pm)
            for o, c, m, f, pl, pm in ((om, cm, mm, nm, pb.PAYLOAD_ADAM_M, pmd5[0]),
                                       (ov, cv, mv, nv, pb.PAYLOAD_ADAM_V, pmd5[1]))]
    c, r = status_of(grpc, X["PrepareDeltaPut"], pb.PrepareDeltaPutRequest(lease_id=L.lease_id, puts=puts),
                     metadata=md, timeout=30)
    check(c == grpc.StatusCode.OK, f"a prepare in parts ({c}: {r})")
    if c != grpc.StatusCode.OK:
        return
    got = sorted(r.puts, key=lambda p: p.payload)
    st = [http_put(u, parts[i][k], pmd5[i][k])[0] for i, p in enumerate(got) for k, u in enumerate(p.part_urls)]
    check(st == [200] * 6, f"every part is taken ({st})")
    chunks = [pb.Chunk(lease_id=L.lease_id, fragment_id=1, total=4 * f, codec=pb.CODEC_FP32, crc32c=c2,
                       num_floats=f, payload=pb.PAYLOAD_INNER_OBJECT, step=p.attempt)
              for (f, c2), p in zip(((nm, cm), (nv, cv)), got)]
    c, msg = status_of(grpc, X["PushInnerState"], iter(chunks), metadata=md, timeout=120)
    if refused_log:
        check(c == grpc.StatusCode.FAILED_PRECONDITION and "push its bytes" in str(msg),
              f"a store without part copies: the commit is refused, the worker told to push the bytes ({c}: {msg})")
        with open(refused_log) as f:
            check("nopartcopy PUT" in f.read(), "the proxy refused a part copy")
        check(s3get(f"{prefix}/{job}/f0-v0-a1.innerm") == b"", "no slot blob was made")
        c2, msg2 = status_of(grpc, X["PrepareDeltaPut"], pb.PrepareDeltaPutRequest(lease_id=L.lease_id, puts=puts),
                             metadata=md, timeout=30)
        check(c2 == grpc.StatusCode.FAILED_PRECONDITION and "push its bytes" in str(msg2),
              f"the next prepare of such an object is refused at once ({c2}: {msg2})")
        # V's upload, never committed, goes once its lease ends (the tick's sweep of prepared names).
        X["Release"](pb.ReleaseRequest(lease_id=L.lease_id, reason=pb.RELEASE_PREEMPTED), metadata=md, timeout=10)
        ep = os.environ["S3_ENDPOINT"]
        for _ in range(100):
            out = subprocess.run(["bash", S3CURL, f"{ep}/dpc-inner?uploads="], capture_output=True, text=True).stdout
            if "<UploadId>" not in out:
                break
            time.sleep(0.1)
    else:
        check(c == grpc.StatusCode.OK, f"their commit is accepted: the store copied them in parts ({c})")
        check(s3get(f"{prefix}/{job}/f0-v0-a1.innerm") == om and s3get(f"{prefix}/{job}/f0-v0-a1.innerv") == ov,
              "the slot's M and V blobs hold exactly the bytes put")
    staged = [k for k in keys(f"{prefix}/{job}/") if "-t" in k and ".inner" in k]
    check(staged == [], f"no put inner-state object is left beside them ({staged})")
    ep = os.environ["S3_ENDPOINT"]
    out = subprocess.run(["bash", S3CURL, f"{ep}/dpc-inner?uploads="], capture_output=True, text=True).stdout
    check("<UploadId>" not in out, f"no multipart upload is left unfinished ({out[:200]})")


if __name__ == "__main__":
    sys.exit(main())
