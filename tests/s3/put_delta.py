#!/usr/bin/env python3
"""put_delta.py — workers' delta objects on an S3 store (PrepareDeltaPut, a presigned PUT,
PushDelta with PAYLOAD_DELTA_OBJECT; docs/design.md §4.3, §5.8), driven by python grpcio playing
the workers of a sync DiLoCo job (R = 2, fp32 deltas, outer lr 0.7, momentum 0) against a real
dipaco-coordinator on the RADOS Gateway of tests/s3/with_rgw.sh. Run under with_rgw.sh.

  * the lease says delta_put; a commit with no object prepared is FAILED_PRECONDITION; prepares
    with a wrong num_floats, object_bytes or MD5 length are INVALID_ARGUMENT, another worker's
    lease PERMISSION_DENIED;
  * the presigned PUT takes the announced bytes (200) and nothing else: other bytes with the
    signed MD5 are refused by the store (400 BadDigest), a URL with a tampered signature too
    (403), and a URL for another object name is not one the store accepts (403);
  * a commit claiming another CRC-32C is INVALID_ARGUMENT; a commit of an object never PUT is
    FAILED_PRECONDITION (missing); an object holding a NaN is INVALID_ARGUMENT naming the float;
  * good commits are PUSH_ACCEPTED, a repeat PUSH_DUPLICATE; the round closes and version 1
    equals θ0 − 0.7 · mean(the two deltas) (numpy), so the bytes applied are the objects';
  * a commit naming another attempt than the one prepared is FAILED_PRECONDITION; after a
    coordinator restart (which forgets the prepared names) an object PUT then is committed by
    its attempt number and accepted;
  * GetJob's bytes_in counts none of the objects' bytes (they went to the store);
  * an int8 job's objects are the streams as sent (an fp32-sized one is INVALID_ARGUMENT, and so
    is an fp32 commit of one): accepted, a repeat PUSH_DUPLICATE, and version 1 is the outer step
    over the decoded deltas, with no byte through the coordinator;
  * an upload (UploadInitialModel, 20 MiB: two parts) is the object t/uploads/<id>.safetensors
    in the bucket, none of it under the state directory; a CreateJob naming it reads it from the
    store and refuses bytes that are not safetensors, naming the object; one naming no upload
    is NOT_FOUND; after the restart a new upload's id follows the stored one's;
  * on a second coordinator (its thread-pool work that calls wait for held 2 s by
    DIPACO_TEST_POOL_DELAY_MS), two workers' pulls of θ0 through it wait on one parameter fill,
    and a prepare in parts on its upload's start, while ListJobs answers at once; with
    --s3-put-part-mb 5 and a store taking 2 parts to an upload (DIPACO_TEST_S3_MAX_PARTS), objects
    of 12.6 MiB go in 2 parts of 7 MiB: the lease says so, a prepare with too few part MD5s, or
    with those of 5 MiB parts, is INVALID_ARGUMENT, each part's URL takes only its
    part's bytes, a commit with a part missing is FAILED_PRECONDITION naming the upload (which is
    aborted), good parts commit and make version 1 as above, and no upload is left unfinished.

usage: put_delta.py COORDINATOR_BIN PROTO_DIR"""
import hashlib
import base64
import json
import os
import re
import struct
import sys
import urllib.error
import subprocess
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from daemon_kit import Daemon, check, crc32c, grpc_stubs, run_grpc_test, status_of  # noqa: E402

LR = 0.7
POOL_DELAY_MS = 2000


def blob_object(np, delta):
    """The blob file of docs/design.md §6.4 holding an fp32 delta: (bytes, payload CRC-32C, MD5)."""
    payload = np.asarray(delta, "<f4").tobytes()
    header = struct.pack("<IIIIQ", 0x42435044, 1, 3, 0, len(delta))
    pcrc = crc32c(payload)
    body = header + payload + struct.pack("<II", pcrc, crc32c(header))
    return body, pcrc, hashlib.md5(body).digest()


def version1(np, pb, X, job, md, theta0, deltas, what):
    """Once the round closed: round 2's lease starts at version 1, which is θ0 − LR · the mean of
    the two deltas (so the bytes applied are the objects'). Returns that lease's answer."""
    import time
    t0 = time.time()
    while time.time() - t0 < 60:
        if X["ListModules"](pb.ListModulesRequest(job_id=job), timeout=10).modules[0].fragments[0].version >= 1:
            break
        time.sleep(0.05)
    r = X["Lease"](pb.LeaseRequest(max_wait_ms=5000, job_id=job), metadata=md, timeout=10)
    check(r.outcome == pb.LEASE_GRANTED and r.lease.fragments[0].version == 1, "round 2's lease starts at version 1")
    cs = list(X["PullFragment"](pb.PullFragmentRequest(lease_id=r.lease.lease_id, fragment_id=1), metadata=md,
                                timeout=60))
    theta1 = np.frombuffer(b"".join(c.data for c in cs), dtype="<f4")
    avg = ((deltas[0].astype(np.float64) + deltas[1].astype(np.float64)) / 2).astype(np.float32)
    err = float(np.max(np.abs(theta1 - (theta0 - np.float32(LR) * avg))))
    check(err <= 1e-6, f"version 1 = θ0 − {LR}·mean({what}) (max error {err:.2e})")
    return r


def subprocess_out(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout


def http_put(url, body, md5):
    """The HTTP status of a PUT of body to url with Content-MD5 md5 (and the S3 error code)."""
    req = urllib.request.Request(url, data=body, method="PUT",
                                 headers={"Content-MD5": base64.b64encode(md5).decode()})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def upload(grpc, pb, X, data, chunk=4 << 20):
    """UploadInitialModel of data in chunks: (status code, reply or details)."""
    crc = crc32c(data)
    chunks = [pb.Chunk(payload=pb.PAYLOAD_SAFETENSORS, offset=o, total=len(data), data=data[o:o + chunk],
                       crc32c=crc if o + chunk >= len(data) else 0) for o in range(0, len(data), chunk)]
    return status_of(grpc, X["UploadInitialModel"], iter(chunks), timeout=60)


def uploads_in_store(grpc, pb, X, state, S):
    """Uploads are objects in the store, not files under the state directory. The id of the
    upload made, for the check after the restart."""
    endpoint = os.environ["S3_ENDPOINT"]
    junk = bytes(range(256)) * (80 << 10)  # 20 MiB: more than one 16 MiB part
    c, up = upload(grpc, pb, X, junk)
    check(c == S.OK and up.bytes == len(junk), f"a 20 MiB upload is stored ({c})")
    uid = up.upload_id if c == S.OK else 0
    ls = subprocess_out(["bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "s3curl.sh"),
                         f"{endpoint}/dpc-put?list-type=2&prefix=t%2Fuploads%2F"])
    check(f"<Key>t/uploads/{uid}.safetensors</Key>" in ls and f"<Size>{len(junk)}</Size>" in ls,
          f"the upload is the object t/uploads/{uid}.safetensors of {len(junk)} bytes ({ls[-300:]})")
    on_disk = [os.path.join(r, f) for r, _, fs in os.walk(state) for f in fs if "upload" in r or "safetensors" in f]
    check(on_disk == [], f"no upload under the state directory ({on_disk})")
    spec = {"name": "from-upload", "model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "n_positions": 8,
                                             "vocab_size": 16},
            "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 1, "inner_steps": 1,
            "rounds": 1, "batch": 1, "seq_len": 8}
    c, why = status_of(grpc, X["CreateJob"], pb.CreateJobRequest(spec_json=json.dumps(spec), initial_upload_id=uid),
                       timeout=60)
    check(c == S.INVALID_ARGUMENT and f"s3://dpc-put/t/uploads/{uid}.safetensors" in str(why),
          f"a job from an upload that is not safetensors is refused, naming the object ({c}: {why})")
    c, why = status_of(grpc, X["CreateJob"],
                       pb.CreateJobRequest(spec_json=json.dumps(spec), initial_upload_id=uid + 1000), timeout=60)
    check(c == S.NOT_FOUND and "no such upload" in str(why), f"a job from no upload: NOT_FOUND ({c}: {why})")
    return uid


def gateway_args(bucket, prefix):
    """(endpoint, the coordinator's flags for blobs under s3://bucket/prefix on with_rgw.sh's
    gateway, the bucket made), or None outside with_rgw.sh."""
    endpoint = os.environ.get("S3_ENDPOINT")
    if not endpoint:
        print("FAIL: run me under tests/s3/with_rgw.sh")
        return None
    # The bucket: created through the gateway's own credentials by with_rgw.sh's helper.
    os.system(f"bash {os.path.dirname(os.path.abspath(__file__))}/s3curl.sh -X PUT {endpoint}/{bucket} >/dev/null")
    return endpoint, ("--lease-ttl-ms", "30000", "--heartbeat-ms", "200", "--dead-after-heartbeats", "150",
                      "--blob-store", f"s3://{bucket}/{prefix}", "--s3-endpoint", endpoint)


def run_restartable(coord_bin, proto_dir, prefix, body, args):
    """run_grpc_test of body(grpc, np, pb, d, state, restart) on a coordinator with flags args;
    restart() starts a new one on the same state directory (the body stops the old one first)."""
    return run_grpc_test(coord_bin, proto_dir, prefix,
                         lambda grpc, np, pb, d, state, log: body(grpc, np, pb, d, state,
                                                                  lambda: Daemon(coord_bin, state, log, args)),
                         args=args)


def main():
    coord_bin, proto_dir = sys.argv[1], sys.argv[2]
    got = gateway_args("dpc-put", "t")
    if not got:
        return 1
    endpoint, args = got
    rc = run_restartable(coord_bin, proto_dir, "dpc_put_delta_", run, args)
    if rc:
        return rc
    pargs = args[:-3] + ("s3://dpc-put/p", "--s3-endpoint", endpoint, "--s3-put-part-mb", "5")
    os.environ["DIPACO_TEST_POOL_DELAY_MS"] = str(POOL_DELAY_MS)
    os.environ["DIPACO_TEST_S3_MAX_PARTS"] = "2"
    try:
        return run_grpc_test(coord_bin, proto_dir, "dpc_put_parts_",
                             lambda grpc, np, pb, d, state, log: run_parts(grpc, np, pb, d, state, endpoint, log),
                             args=pargs)
    finally:
        del os.environ["DIPACO_TEST_POOL_DELAY_MS"]
        del os.environ["DIPACO_TEST_S3_MAX_PARTS"]


def while_waiting(pb, X, calls):
    """Run calls (functions) in threads, each waiting on the coordinator's thread pool (held
    POOL_DELAY_MS by the test hook); meanwhile time ListJobs, which the loop thread answers.
    Returns ([(result, seconds)] per call, ListJobs' seconds)."""
    import threading
    import time
    got = [None] * len(calls)

    def run(i):
        t = time.time()
        got[i] = (calls[i](), time.time() - t)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in ts:
        t.start()
    time.sleep(0.3)
    t1 = time.time()
    X["ListJobs"](pb.ListJobsRequest(), timeout=10)
    answered = time.time() - t1
    for t in ts:
        t.join()
    return got, answered


def check_waited(got, answered, what):
    wait = [g and round(g[1], 2) for g in got]
    check(all(g and g[1] >= POOL_DELAY_MS / 1000 - 0.1 for g in got), f"{what} waited on the thread pool ({wait} s)")
    check(answered < 0.5 * POOL_DELAY_MS / 1000,
          f"ListJobs answered in {answered:.2f} s meanwhile ({POOL_DELAY_MS} ms): the loop thread is free")


def pull_during_fill(np, pb, X, leases, mds, log):
    """Both workers pull θ0 through the coordinator at once. On S3 the parameter cache holds no
    version, so it reads and checks θ0 on the thread pool: the two pulls wait on one fill while
    the loop thread answers ListJobs at once. Returns θ0."""
    def pull(i):
        cs = X["PullFragment"](pb.PullFragmentRequest(lease_id=leases[i].lease_id, fragment_id=1), metadata=mds[i],
                               timeout=60)
        return b"".join(c.data for c in cs)

    got, answered = while_waiting(pb, X, [lambda: pull(0), lambda: pull(1)])
    check_waited(got, answered, "both pulls")
    n = leases[0].fragments[0].num_floats
    check(got[0][0] == got[1][0] and len(got[0][0]) == 4 * n, "both pulls got the same θ0, whole")
    with open(log) as f:
        fills = sum("fragment 1 version 0 is read and checked on the thread pool" in line for line in f)
    check(fills == 1, f"the two pulls shared one fill ({fills} in the log)")
    return np.frombuffer(got[0][0], dtype="<f4").copy()


def run_parts(grpc, np, pb, d, state, endpoint, log):
    """Objects above Lease.delta_put_part_bytes (--s3-put-part-mb 5) go in parts through a
    multipart upload the coordinator starts and completes; with a store that takes 2 parts to an
    upload (DIPACO_TEST_S3_MAX_PARTS) the parts grow to fit. First, θ0 through the coordinator
    while its fill runs (pull_during_fill)."""
    X = grpc_stubs(grpc, pb, d[0].addr, state)
    mds = []
    for i in range(2):
        w = X["Register"](pb.RegisterRequest(hostname=f"w{i}", backend="cpu", threads=1), timeout=10)
        mds.append([("dipaco-worker-id", str(w.worker_id)), ("dipaco-session", w.session_token)])
    # 1 layer, C 512, 256 tokens: 3.3M floats, a 12.6 MiB object: 3 parts of 5 MiB, but the store
    # takes 2, so 2 parts of 7 MiB (the smallest whole MiB that fits).
    spec = {"name": "parts", "model": {"n_layer": 1, "n_head": 4, "n_embd": 512, "n_positions": 8,
                                       "vocab_size": 256, "seed": 3},
            "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 2,
            "rounds": 2, "batch": 1, "seq_len": 8, "outer": {"lr": LR, "momentum": 0, "nesterov": False}}
    job = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec)), timeout=60).summary.job_id
    leases = [X["Lease"](pb.LeaseRequest(max_wait_ms=5000, job_id=job), metadata=md, timeout=10).lease for md in mds]
    n = leases[0].fragments[0].num_floats
    mib = 1 << 20
    half = (24 + 4 * n + 8 + 1) // 2  # each of 2 parts holds at least half the object
    P = (half + mib - 1) // mib * mib
    check(P > 5 << 20 and all(L.delta_put and L.delta_put_part_bytes == P for L in leases),
          f"the leases say delta_put in parts of {P >> 20} MiB, not 5, to fit 2 parts "
          f"({[L.delta_put_part_bytes for L in leases]})")
    theta0 = pull_during_fill(np, pb, X, leases, mds, log)
    rng = np.random.default_rng(6)
    deltas = [(rng.standard_normal(n) * 1e-2).astype(np.float32) for _ in range(2)]
    S = grpc.StatusCode

    def prepare(md, L, md5, crc, part_md5):
        dp = pb.DeltaPut(fragment_id=1, num_floats=n, crc32c=crc, object_bytes=24 + 4 * n + 8, content_md5=md5,
                         part_md5=part_md5)
        return status_of(grpc, X["PrepareDeltaPut"], pb.PrepareDeltaPutRequest(lease_id=L.lease_id, puts=[dp]),
                         metadata=md, timeout=30)

    def commit(md, L, crc, attempt):
        ch = pb.Chunk(lease_id=L.lease_id, fragment_id=1, version=L.fragments[0].version, total=4 * n,
                      codec=pb.CODEC_FP32, crc32c=crc, num_floats=n, inner_steps=2, tokens=16,
                      payload=pb.PAYLOAD_DELTA_OBJECT, step=attempt)
        return status_of(grpc, X["PushDelta"], iter([ch]), metadata=md, timeout=120)

    objs = [blob_object(np, dl) for dl in deltas]
    parts = [[o[0][k:k + P] for k in range(0, len(o[0]), P)] for o in objs]
    check(len(parts[0]) == 2, f"the object is {len(objs[0][0])} bytes, {len(parts[0])} parts")
    pmd5 = [[hashlib.md5(x).digest() for x in ps] for ps in parts]
    c, msg = prepare(mds[0], leases[0], objs[0][2], objs[0][1], pmd5[0][:1])
    check(c == S.INVALID_ARGUMENT and "part_md5" in str(msg), f"a prepare with 1 of 2 part MD5s is refused ({c}: {msg})")
    c, msg = prepare(mds[0], leases[0], objs[0][2], objs[0][1],
                     [hashlib.md5(objs[0][0][k:k + (5 << 20)]).digest() for k in range(0, len(objs[0][0]), 5 << 20)])
    check(c == S.INVALID_ARGUMENT and "part_md5" in str(msg),
          f"a prepare with the MD5s of 5 MiB parts is refused ({c}: {msg})")
    got, answered = while_waiting(pb, X, [lambda: prepare(mds[0], leases[0], objs[0][2], objs[0][1], pmd5[0])])
    check_waited(got, answered, "a prepare in parts (its upload starts on the thread pool)")
    c, r = got[0][0]
    urls = list(r.puts[0].part_urls) if c == S.OK else []
    check(len(urls) == 2 and not r.puts[0].url and all("uploadId=" in u and "partNumber=" in u for u in urls),
          f"a good prepare answers a presigned PUT per part ({c})")
    att = r.puts[0].attempt if c == S.OK else 0
    st, err = http_put(urls[1], parts[0][0], pmd5[0][1]) if urls else (0, "")
    check(st == 400 and "BadDigest" in err, f"another part's bytes under a part's MD5 are refused ({st})")
    if urls:
        http_put(urls[0], parts[0][0], pmd5[0][0])
    c, msg = commit(mds[0], leases[0], objs[0][1], att)
    check(c == S.FAILED_PRECONDITION and "completing its upload" in str(msg),
          f"a commit with a part missing is refused, naming the upload ({c}: {msg})")
    for i in range(2):
        c, r = prepare(mds[i], leases[i], objs[i][2], objs[i][1], pmd5[i])
        st = [http_put(u, parts[i][k], pmd5[i][k])[0] for k, u in enumerate(r.puts[0].part_urls)] if c == S.OK else []
        c, rr = commit(mds[i], leases[i], objs[i][1], r.puts[0].attempt if c == S.OK else 0)
        check(st == [200] * 2 and c == S.OK and rr.acks[0].result == pb.PUSH_ACCEPTED,
              f"worker {i}: every part stored and the commit accepted ({st}, {c}: {rr if c == S.OK else ''})")
    version1(np, pb, X, job, mds[0], theta0, deltas, "deltas put in parts")
    out = subprocess_out(["bash", os.path.join(os.path.dirname(os.path.abspath(__file__)), "s3curl.sh"),
                          f"{endpoint}/dpc-put?uploads="])
    check("<UploadId>" not in out, f"no multipart upload is left unfinished ({out[:200]})")


def run(grpc, np, pb, d, state, restart):
    X = grpc_stubs(grpc, pb, d[0].addr, state)
    mds = []
    for i in range(2):
        w = X["Register"](pb.RegisterRequest(hostname=f"w{i}", backend="cpu", threads=1), timeout=10)
        mds.append([("dipaco-worker-id", str(w.worker_id)), ("dipaco-session", w.session_token)])
    spec = {"name": "put", "model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "n_positions": 8, "vocab_size": 16,
                                     "seed": 3},
            "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 2,
            "rounds": 2, "batch": 1, "seq_len": 8, "outer": {"lr": LR, "momentum": 0, "nesterov": False}}
    job = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec)), timeout=30).summary.job_id
    leases = []
    for md in mds:
        r = X["Lease"](pb.LeaseRequest(max_wait_ms=5000, job_id=job), metadata=md, timeout=10)
        assert r.outcome == pb.LEASE_GRANTED, r
        leases.append(r.lease)
    check(all(L.delta_put for L in leases), "the leases of a job on the S3 store say delta_put")
    L0, L1 = leases
    n = L0.fragments[0].num_floats
    cs = list(X["PullFragment"](pb.PullFragmentRequest(lease_id=L0.lease_id, fragment_id=1), metadata=mds[0],
                                timeout=30))
    theta0 = np.frombuffer(b"".join(c.data for c in cs), dtype="<f4").copy()
    rng = np.random.default_rng(5)
    deltas = [(rng.standard_normal(n) * 1e-2).astype(np.float32) for _ in range(2)]

    def prepare(md, L, num_floats=n, object_bytes=None, md5=b"\0" * 16, crc=0):
        dp = pb.DeltaPut(fragment_id=1, num_floats=num_floats, crc32c=crc,
                         object_bytes=24 + 4 * n + 8 if object_bytes is None else object_bytes, content_md5=md5)
        return status_of(grpc, X["PrepareDeltaPut"], pb.PrepareDeltaPutRequest(lease_id=L.lease_id, puts=[dp]),
                         metadata=md, timeout=10)

    def commit(md, L, crc, attempt=0):
        ch = pb.Chunk(lease_id=L.lease_id, fragment_id=1, version=L.fragments[0].version, total=4 * n,
                      codec=pb.CODEC_FP32, crc32c=crc, num_floats=n, inner_steps=2, tokens=16,
                      payload=pb.PAYLOAD_DELTA_OBJECT, step=attempt)
        return status_of(grpc, X["PushDelta"], iter([ch]), metadata=md, timeout=60)

    def expect(res, code, word, what):
        c, msg = res
        check(c == code and word in str(msg), f"{what} → {code.name} naming '{word}' ({c}: {msg})")

    S = grpc.StatusCode
    obj0, crc0, md50 = blob_object(np, deltas[0])
    expect(commit(mds[0], L0, crc0), S.FAILED_PRECONDITION, "no delta object was prepared", "a commit before a prepare")
    expect(prepare(mds[0], L0, num_floats=n + 1, md5=md50, crc=crc0), S.INVALID_ARGUMENT, "num_floats",
           "a prepare with the wrong num_floats")
    expect(prepare(mds[0], L0, object_bytes=4 * n, md5=md50, crc=crc0), S.INVALID_ARGUMENT, "object_bytes",
           "a prepare with the wrong object size")
    expect(prepare(mds[0], L0, md5=b"\1" * 15, crc=crc0), S.INVALID_ARGUMENT, "content_md5",
           "a prepare with a 15-byte MD5")
    expect(prepare(mds[1], L0, md5=md50, crc=crc0), S.PERMISSION_DENIED, "another worker", "a prepare on another's lease")

    c, r = prepare(mds[0], L0, md5=md50, crc=crc0)
    check(c == S.OK and len(r.puts) == 1 and r.puts[0].url.startswith("http"), f"a good prepare gives a URL ({c})")
    url = r.puts[0].url if c == S.OK else ""
    other = bytearray(obj0)
    other[30] ^= 1
    st, err = http_put(url, bytes(other), md50)
    check(st == 400 and "BadDigest" in err, f"other bytes with the signed MD5: the store refuses them ({st} {err[:80]})")
    sig = re.search(r"X-Amz-Signature=([0-9a-f]{64})", url)
    check(sig is not None, "the URL is signed (X-Amz-Signature)")
    tampered = url.replace(sig.group(1), ("0" if sig.group(1)[0] != "0" else "1") + sig.group(1)[1:]) if sig else url
    st, _ = http_put(tampered, obj0, md50)
    check(st == 403, f"a URL with a tampered signature is refused ({st})")
    st, _ = http_put(re.sub(r"-t(\d+)\.delta", r"-t\g<1>9.delta", url), obj0, md50)
    check(st == 403, f"the URL does not write another object name ({st})")
    st, err = http_put(url, obj0, md50)
    check(st == 200, f"the announced bytes are taken ({st} {err[:80]})")
    expect(commit(mds[0], L0, crc0 ^ 1), S.INVALID_ARGUMENT, "crc32c", "a commit claiming another CRC-32C")
    c, r = commit(mds[0], L0, crc0)
    check(c == S.OK and r.acks[0].result == pb.PUSH_ACCEPTED, f"the commit of the object is accepted ({c}: {r})")
    c, r = commit(mds[0], L0, crc0)
    check(c == S.OK and r.acks[0].result == pb.PUSH_DUPLICATE, f"the same commit again is a duplicate ({c}: {r})")

    # Worker 1: an object never PUT, then one holding a NaN, then the good one.
    obj1, crc1, md51 = blob_object(np, deltas[1])
    c, _ = prepare(mds[1], L1, md5=md51, crc=crc1)
    expect(commit(mds[1], L1, crc1), S.FAILED_PRECONDITION, "fragment 1's object", "a commit of an object never PUT")
    bad = deltas[1].copy()
    bad[7] = np.nan
    objb, crcb, md5b = blob_object(np, bad)
    c, r = prepare(mds[1], L1, md5=md5b, crc=crcb)
    st, _ = http_put(r.puts[0].url if c == S.OK else "", objb, md5b) if c == S.OK else (c, "")
    check(st == 200, f"the NaN object is stored ({st})")
    expect(commit(mds[1], L1, crcb), S.INVALID_ARGUMENT, "non-finite", "a commit of an object holding a NaN")
    c, r = prepare(mds[1], L1, md5=md51, crc=crc1)
    st, _ = http_put(r.puts[0].url, obj1, md51) if c == S.OK else (c, "")
    c, r = commit(mds[1], L1, crc1)
    check(st == 200 and c == S.OK and r.acks[0].result == pb.PUSH_ACCEPTED, f"worker 1's object is accepted ({c})")

    # The round closes; version 1 is the outer step over the objects' deltas.
    r = version1(np, pb, X, job, mds[0], theta0, deltas, "deltas of the objects")
    # Round 2: a coordinator restarted between the prepare and the commit forgets the prepared
    # name; the commit names the object by its attempt number, and the object PUT after the
    # restart is checked and recorded all the same.
    L2 = r.lease
    obj2, crc2, md52 = blob_object(np, deltas[0] * 2)
    c, pr = prepare(mds[0], L2, md5=md52, crc=crc2)
    check(c == S.OK and pr.puts[0].attempt > 0, f"the prepare answers the object's attempt number ({c})")
    att = pr.puts[0].attempt if c == S.OK else 0
    expect(commit(mds[0], L2, crc2, att + 1), S.FAILED_PRECONDITION, "names object attempt",
           "a commit naming another attempt than the one prepared")
    uid = uploads_in_store(grpc, pb, X, state, S)
    d[0].stop()
    d[0] = restart()
    X.clear()
    X.update(grpc_stubs(grpc, pb, d[0].addr, state))
    c, up = upload(grpc, pb, X, b"12345678")
    check(c == S.OK and up.upload_id == uid + 1,
          f"after the restart the next upload's id follows the stored one's ({c}: {up}, stored {uid})")
    st, _ = http_put(pr.puts[0].url, obj2, md52) if c == S.OK else (c, "")
    check(st == 200, f"the object is PUT after the coordinator restarted ({st})")
    c, rr = commit(mds[0], L2, crc2, att)
    check(c == S.OK and rr.acks[0].result == pb.PUSH_ACCEPTED,
          f"its commit, naming the attempt, is accepted by the restarted coordinator ({c}: {rr})")
    g = X["GetJob"](pb.JobRequest(job_id=job), timeout=10)
    check(g.summary.bytes_in == 0, f"the objects' bytes did not come through the coordinator (bytes_in "
                                   f"{g.summary.bytes_in})")
    run_encoded(grpc, np, pb, X, mds, spec, S, expect)


def run_encoded(grpc, np, pb, X, mds, spec, S, expect):
    """An int8 job: each object is the stream as sent (kind 10, padded to whole floats); its
    commit names the stream's CRC-32C, a repeat of it is PUSH_DUPLICATE, and the outer step
    applies the decoded deltas."""
    from codec_push import decode, encode  # noqa: E402 (numpy int8, written from docs/design.md §3)
    spec = dict(spec, name="put-int8", streaming={"codec": "int8", "block_floats": 256})
    job = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec)), timeout=30).summary.job_id
    leases = [X["Lease"](pb.LeaseRequest(max_wait_ms=5000, job_id=job), metadata=md, timeout=10).lease for md in mds]
    check(all(L.delta_put and L.delta_codec == pb.CODEC_INT8 for L in leases),
          "an int8 job's leases on the S3 store say delta_put, codec int8")
    n = leases[0].fragments[0].num_floats
    cs = list(X["PullFragment"](pb.PullFragmentRequest(lease_id=leases[0].lease_id, fragment_id=1),
                                metadata=mds[0], timeout=30))
    theta0 = np.frombuffer(b"".join(c.data for c in cs), dtype="<f4").copy()
    rng = np.random.default_rng(9)
    decoded = []
    for i, (md, L) in enumerate(zip(mds, leases)):
        stream, dec = encode(np, "int8", (rng.standard_normal(n) * 1e-2).astype(np.float32), 256)
        stream = bytes(stream)
        decoded.append(np.asarray(dec, np.float32))
        check(np.array_equal(decode(np, "int8", stream, n, 256), decoded[-1]), "the numpy int8 codec round-trips")
        padded = stream + b"\0" * (-len(stream) % 4)
        header = struct.pack("<IIIIQ", 0x42435044, 1, 10, 0, len(padded) // 4)
        body = header + padded + struct.pack("<II", crc32c(padded), crc32c(header))
        scrc, md5 = crc32c(stream), hashlib.md5(body).digest()
        if i == 0:
            dp = pb.DeltaPut(fragment_id=1, num_floats=n, crc32c=scrc, object_bytes=24 + 4 * n + 8, content_md5=md5)
            expect(status_of(grpc, X["PrepareDeltaPut"], pb.PrepareDeltaPutRequest(lease_id=L.lease_id, puts=[dp]),
                             metadata=md, timeout=10), S.INVALID_ARGUMENT, "object_bytes",
                   "an fp32-sized object in an int8 job")
        dp = pb.DeltaPut(fragment_id=1, num_floats=n, crc32c=scrc, object_bytes=len(body), content_md5=md5)
        c, r = status_of(grpc, X["PrepareDeltaPut"], pb.PrepareDeltaPutRequest(lease_id=L.lease_id, puts=[dp]),
                         metadata=md, timeout=10)
        check(c == S.OK and ".encoded" in r.puts[0].url, f"worker {i}: the object is named as a stream as sent ({c})")
        check(c == S.OK and http_put(r.puts[0].url, body, md5)[0] == 200, f"worker {i}: the stream's object is taken")
        ch = pb.Chunk(lease_id=L.lease_id, fragment_id=1, version=L.fragments[0].version, total=len(stream),
                      codec=pb.CODEC_INT8, block_floats=256, crc32c=scrc, num_floats=n, inner_steps=2, tokens=16,
                      payload=pb.PAYLOAD_DELTA_OBJECT, step=r.puts[0].attempt if c == S.OK else 0)
        if i == 0:
            bad = pb.Chunk()
            bad.CopyFrom(ch)
            bad.codec = pb.CODEC_FP32
            bad.total = 4 * n
            expect(status_of(grpc, X["PushDelta"], iter([bad]), metadata=md, timeout=60), S.INVALID_ARGUMENT,
                   "int8", "an fp32 commit of the int8 object")
        c, rr = status_of(grpc, X["PushDelta"], iter([ch]), metadata=md, timeout=60)
        check(c == S.OK and rr.acks[0].result == pb.PUSH_ACCEPTED, f"worker {i}: its commit is accepted ({c}: {rr})")
        c, rr = status_of(grpc, X["PushDelta"], iter([ch]), metadata=md, timeout=60)
        check(c == S.OK and rr.acks[0].result == pb.PUSH_DUPLICATE, f"worker {i}: the same commit again is a "
                                                                     f"duplicate ({c}: {rr})")
    version1(np, pb, X, job, mds[0], theta0, decoded, "the decoded int8 objects")
    g = X["GetJob"](pb.JobRequest(job_id=job), timeout=10)
    check(g.summary.bytes_in == 0, f"the int8 objects' bytes did not come through the coordinator (bytes_in "
                                   f"{g.summary.bytes_in})")


if __name__ == "__main__":
    sys.exit(main())
