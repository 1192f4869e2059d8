#!/usr/bin/env python3
"""security_auth.py — authentication and authorization of a real dipaco-coordinator, driven by
python grpcio (independent of the gRPC C core the coordinator uses):

- first start creates STATE/join.token and STATE/admin.token: mode 0600, 64 hex characters,
  different; no file of the state directory other than those holds a token in clear (the
  store keeps hashes of worker session tokens only);
- Register: missing, malformed or wrong join token → UNAUTHENTICATED; the admin token →
  PERMISSION_DENIED; the join token → OK;
- Admin (unary, client-streaming upload, server-streaming export): missing or wrong token →
  UNAUTHENTICATED; the join token or a valid worker session → PERMISSION_DENIED; the admin
  token → OK;
- worker calls: a session token under another worker's id, or a session from another
  coordinator (stale) → UNAUTHENTICATED; Heartbeat/Release/PushDelta/PullFragment on
  another worker's lease → PERMISSION_DENIED, and the lease stays its owner's;
- restart with --admin-token-file/--join-token-file (rotation): the old tokens are stale →
  UNAUTHENTICATED; the new ones work; dipacoctl --token-file works with the new file and
  fails with the old one; the worker session survives the restart;
- token files that others may write, or too short, stop the coordinator with a message;
- dipaco-worker with a wrong --token-file never registers (log says why); with the right one
  it shows up in ListWorkers.

usage: security_auth.py COORDINATOR_BIN DIPACOCTL WORKER_BIN PROTO_DIR"""
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

MISSING = 1  # a missing tool fails the test (deploy/install_deps.sh --test installs them)
FAILS = 0


def check(cond, what):
    global FAILS
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAILS += 1


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Coordinator:
    def __init__(self, binary, state, log, *extra):
        self.addr = f"127.0.0.1:{free_port()}"
        self.logf = open(log, "a")
        self.proc = subprocess.Popen([binary, "--listen", self.addr, "--state-dir", state,
                                      "--heartbeat-ms", "200",
                                      # (leases are held by hand here, with no heartbeat thread)
                                      "--dead-after-heartbeats", "1000", *extra], stdout=self.logf, stderr=self.logf)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        return self.proc.returncode


def main():
    coord_bin, ctl, worker_bin, proto_dir = sys.argv[1:5]
    try:
        import grpc
    except ImportError as e:
        print(f"FAIL: missing: needs python grpcio ({e}); deploy/install_deps.sh --test installs Debian python3-grpcio")
        return MISSING
    protoc = shutil.which("protoc")
    if not protoc:
        print("FAIL: missing: protoc not found; deploy/install_deps.sh --test installs Debian protobuf-compiler")
        return MISSING
    tmp = tempfile.mkdtemp(prefix="dpc_sec_auth_")
    procs = []
    try:
        subprocess.run([protoc, f"--python_out={tmp}", f"-I{proto_dir}", os.path.join(proto_dir, "dipaco.proto")],
                       check=True)
        sys.path.insert(0, tmp)
        import dipaco_pb2 as pb
        body(grpc, pb, coord_bin, ctl, worker_bin, tmp, procs)
    except Exception:
        import traceback
        traceback.print_exc()
        check(False, "no exception")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if FAILS:
            for f in sorted(os.listdir(tmp)):
                if f.endswith(".log"):
                    print(f"---- {f} (tail)")
                    with open(os.path.join(tmp, f), errors="replace") as fh:
                        print("".join(fh.readlines()[-15:]))
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{FAILS} failure(s)")
    return 1 if FAILS else 0


def body(grpc, pb, coord_bin, ctl, worker_bin, tmp, procs):
    state, log = os.path.join(tmp, "state"), os.path.join(tmp, "coordinator.log")
    co = Coordinator(coord_bin, state, log)
    procs.append(co.proc)
    ch = grpc.insecure_channel(co.addr)
    grpc.channel_ready_future(ch).result(timeout=30)

    # ---- token files
    jpath, apath = os.path.join(state, "join.token"), os.path.join(state, "admin.token")
    join, admin = open(jpath).read().strip(), open(apath).read().strip()
    modes = [stat.S_IMODE(os.stat(p).st_mode) for p in (jpath, apath)]
    hexd = set("0123456789abcdef")
    check(modes == [0o600, 0o600], f"token files are 0600 ({[oct(m) for m in modes]})")
    check(len(join) == 64 and len(admin) == 64 and set(join) <= hexd and set(admin) <= hexd and join != admin,
          "join and admin tokens are 32 random bytes in hex, different")

    S = pb.DESCRIPTOR.services_by_name

    def stub(svc, name):
        m = S[svc].methods_by_name[name]
        req, resp = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
        mk = {(False, False): ch.unary_unary, (False, True): ch.unary_stream,
              (True, False): ch.stream_unary}[(m.client_streaming, m.server_streaming)]
        return mk(f"/dipaco.v1.{svc}/{name}", request_serializer=req.SerializeToString,
                  response_deserializer=resp.FromString)

    def code_of(fn, *a, **kw):
        try:
            r = fn(*a, **kw)
            if hasattr(r, "__iter__") and not hasattr(r, "ListFields"):
                r = list(r)
            return grpc.StatusCode.OK, r
        except grpc.RpcError as e:
            return e.code(), e.details()

    bearer = lambda t: [("authorization", "Bearer " + t)]  # noqa: E731
    U = grpc.StatusCode.UNAUTHENTICATED
    P = grpc.StatusCode.PERMISSION_DENIED
    register, list_jobs = stub("Coordinator", "Register"), stub("Admin", "ListJobs")

    # ---- Register needs the join token
    for what, md, want in [("no token", [], U), ("a Basic scheme", [("authorization", "Basic " + join)], U),
                           ("a wrong token", bearer("0" * 64), U), ("a truncated join token", bearer(join[:-1]), U),
                           ("the admin token", bearer(admin), P)]:
        c, msg = code_of(register, pb.RegisterRequest(hostname="x"), metadata=md, timeout=10)
        check(c == want, f"Register with {what} → {want.name} ({c.name}: {msg})")
    r1 = register(pb.RegisterRequest(hostname="w1"), metadata=bearer(join), timeout=10)
    r2 = register(pb.RegisterRequest(hostname="w2"), metadata=bearer(join), timeout=10)
    check(r1.worker_id > 0 and r2.worker_id > 0 and r1.session_token != r2.session_token,
          "Register with the join token → worker ids and distinct session tokens")
    md1 = [("dipaco-worker-id", str(r1.worker_id)), ("dipaco-session", r1.session_token)]
    md2 = [("dipaco-worker-id", str(r2.worker_id)), ("dipaco-session", r2.session_token)]

    # ---- Admin needs the admin token
    for what, md, want in [("no token", [], U), ("a wrong token", bearer("f" * 64), U),
                           ("the join token", bearer(join), P), ("a worker session", md1, P)]:
        c, msg = code_of(list_jobs, pb.ListJobsRequest(), metadata=md, timeout=10)
        check(c == want, f"Admin/ListJobs with {what} → {want.name} ({c.name}: {msg})")
    c, msg = code_of(stub("Admin", "UploadInitialModel"), iter([pb.Chunk(payload=pb.PAYLOAD_SAFETENSORS, total=8,
                                                                          data=b"12345678")]), timeout=10)
    check(c == U, f"Admin/UploadInitialModel (client stream) without a token → UNAUTHENTICATED ({c.name})")
    c, msg = code_of(stub("Admin", "ExportPath"), pb.ExportPathRequest(job_id=1), metadata=bearer(join), timeout=10)
    check(c == P, f"Admin/ExportPath (server stream) with the join token → PERMISSION_DENIED ({c.name})")
    c, r = code_of(list_jobs, pb.ListJobsRequest(), metadata=bearer(admin), timeout=10)
    check(c == grpc.StatusCode.OK, f"Admin/ListJobs with the admin token → OK ({c.name})")

    # ---- a job with two slots; each worker gets one lease
    spec = {"name": "sec", "model": {"n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 8, "vocab_size": 16,
                                      "seed": 3},
            "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 2,
            "rounds": 2, "batch": 1, "seq_len": 8}
    stub("Admin", "CreateJob")(pb.CreateJobRequest(spec_json=json.dumps(spec)), metadata=bearer(admin), timeout=30)
    lease = stub("Coordinator", "Lease")
    L1 = lease(pb.LeaseRequest(), metadata=md1, timeout=10).lease
    L2 = lease(pb.LeaseRequest(), metadata=md2, timeout=10).lease
    check(L1.lease_id > 0 and L2.lease_id > 0 and L1.lease_id != L2.lease_id, "each worker holds its own lease")

    # ---- identity: a session under another id; a worker acting on another's lease
    c, msg = code_of(lease, pb.LeaseRequest(), metadata=[("dipaco-worker-id", str(r2.worker_id)),
                                                          ("dipaco-session", r1.session_token)], timeout=10)
    check(c == U, f"w1's session token under w2's id → UNAUTHENTICATED ({c.name})")
    hb = stub("Coordinator", "Heartbeat")
    c, msg = code_of(hb, pb.HeartbeatRequest(lease_id=L1.lease_id, step=1), metadata=md2, timeout=10)
    check(c == P, f"Heartbeat of w1's lease by w2 → PERMISSION_DENIED ({c.name}: {msg})")
    c, msg = code_of(stub("Coordinator", "PullFragment"), pb.PullFragmentRequest(lease_id=L1.lease_id, fragment_id=1),
                     metadata=md2, timeout=10)
    check(c == P, f"PullFragment of w1's lease by w2 → PERMISSION_DENIED ({c.name})")
    n = L1.fragments[0].num_floats
    data = b"\0" * (4 * n)
    chunk = pb.Chunk(lease_id=L1.lease_id, fragment_id=1, version=L1.round, offset=0, total=len(data),
                     codec=pb.CODEC_FP32, num_floats=n, inner_steps=2, tokens=16, payload=pb.PAYLOAD_DELTA,
                     data=data)
    c, msg = code_of(stub("Coordinator", "PushDelta"), iter([chunk]), metadata=md2, timeout=10)
    check(c == P, f"PushDelta to w1's lease by w2 → PERMISSION_DENIED ({c.name}: {msg})")
    c, msg = code_of(stub("Coordinator", "Release"), pb.ReleaseRequest(lease_id=L1.lease_id), metadata=md2, timeout=10)
    check(c == P, f"Release of w1's lease by w2 → PERMISSION_DENIED ({c.name})")
    again = lease(pb.LeaseRequest(), metadata=md1, timeout=10)
    h = hb(pb.HeartbeatRequest(lease_id=L1.lease_id, step=1), metadata=md1, timeout=10)
    check(again.lease.lease_id == L1.lease_id and h.command == pb.COMMAND_CONTINUE,
          "w1's lease is untouched: still its own and active")

    # ---- no token in clear in the state directory (besides the token files)
    secrets = [join, admin, r1.session_token, r2.session_token]
    leaked = []
    for root, _, files in os.walk(state):
        for f in files:
            if f.endswith(".token"):
                continue
            with open(os.path.join(root, f), "rb") as fh:
                blob = fh.read()
            leaked += [f for s in secrets if s.encode() in blob]
    check(not leaked, f"no token or session token in clear in the state directory ({leaked})")

    # ---- worker binary: wrong token never registers; right one does
    data_dir = os.path.join(tmp, "wdata")
    os.makedirs(data_dir)
    bad_tok = os.path.join(tmp, "bad.token")
    with open(bad_tok, "w") as f:
        f.write("e" * 64 + "\n")
    os.chmod(bad_tok, 0o600)
    wlog = os.path.join(tmp, "worker-bad.log")
    wb = subprocess.Popen([worker_bin, "--coordinator", co.addr, "--data-dir", data_dir, "--name", "intruder",
                           "--threads", "1", "--token-file", bad_tok], stdout=subprocess.DEVNULL,
                          stderr=open(wlog, "w"))
    procs.append(wb)
    wg = subprocess.Popen([worker_bin, "--coordinator", co.addr, "--data-dir", data_dir, "--name", "member",
                           "--threads", "1", "--token-file", jpath], stdout=subprocess.DEVNULL,
                          stderr=open(os.path.join(tmp, "worker-good.log"), "w"))
    procs.append(wg)
    names, t0 = set(), time.time()
    while "member" not in names and time.time() - t0 < 20:
        ws = stub("Admin", "ListWorkers")(pb.ListWorkersRequest(include_gone=True), metadata=bearer(admin), timeout=10)
        names = {w.hostname for w in ws.workers}
        time.sleep(0.2)
    time.sleep(0.5)
    ws = stub("Admin", "ListWorkers")(pb.ListWorkersRequest(include_gone=True), metadata=bearer(admin), timeout=10)
    names = {w.hostname for w in ws.workers}
    check("member" in names and "intruder" not in names,
          f"dipaco-worker --token-file: the right token registers, a wrong one does not ({sorted(names)})")
    check("wrong join token" in open(wlog).read(), "the refused worker logs 'wrong join token'")
    try:
        wb_rc = wb.wait(timeout=15)
    except subprocess.TimeoutExpired:
        wb_rc = None
    check(wb_rc == 1, f"the refused worker gives up and exits 1 instead of retrying forever (exit {wb_rc})")
    for p in (wb, wg):
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)

    # ---- rotation: restart with new token files; the old tokens are stale
    ch.close()
    check(co.stop() == 0, "coordinator exits 0 on SIGTERM")
    nj, na = os.path.join(tmp, "new-join.token"), os.path.join(tmp, "new-admin.token")
    for p, t in ((nj, "j" * 40), (na, "a" * 40)):
        with open(p, "w") as f:
            f.write(t + "\n")
        os.chmod(p, 0o600)
    co = Coordinator(coord_bin, state, log, "--join-token-file", nj, "--admin-token-file", na)
    procs.append(co.proc)
    ch = grpc.insecure_channel(co.addr)
    grpc.channel_ready_future(ch).result(timeout=30)
    register, list_jobs, hb = stub("Coordinator", "Register"), stub("Admin", "ListJobs"), stub("Coordinator", "Heartbeat")
    c, _ = code_of(list_jobs, pb.ListJobsRequest(), metadata=bearer(admin), timeout=10)
    check(c == U, f"after rotation the old admin token → UNAUTHENTICATED ({c.name})")
    c, _ = code_of(register, pb.RegisterRequest(hostname="x"), metadata=bearer(join), timeout=10)
    check(c == U, f"after rotation the old join token → UNAUTHENTICATED ({c.name})")
    c, r = code_of(list_jobs, pb.ListJobsRequest(), metadata=bearer("a" * 40), timeout=10)
    check(c == grpc.StatusCode.OK and len(r.jobs) == 1, f"the new admin token works ({c.name})")
    c, _ = code_of(register, pb.RegisterRequest(hostname="x"), metadata=bearer("j" * 40), timeout=10)
    check(c == grpc.StatusCode.OK, f"the new join token works ({c.name})")
    h = hb(pb.HeartbeatRequest(lease_id=L1.lease_id, step=1), metadata=md1, timeout=10)
    check(h.command == pb.COMMAND_CONTINUE, "a worker session survives the restart")
    env = dict(os.environ, DIPACO_ADMIN_TOKEN="")
    good = subprocess.run([ctl, "--coordinator", co.addr, "--token-file", na, "job", "list"], env=env,
                          capture_output=True, text=True, timeout=30)
    stale = subprocess.run([ctl, "--coordinator", co.addr, "job", "list", "--token-file", apath], env=env,
                           capture_output=True, text=True, timeout=30)
    check(good.returncode == 0 and "sec" in good.stdout, f"dipacoctl --token-file NEW job list works ({good.stderr})")
    check(stale.returncode == 1 and "UNAUTHENTICATED" in stale.stderr,
          f"dipacoctl --token-file with the stale admin token → UNAUTHENTICATED ({stale.stderr.strip()})")
    ch.close()
    check(co.stop() == 0, "coordinator exits 0 on SIGTERM")

    # ---- a stale session: another coordinator (fresh state) does not know it
    co = Coordinator(coord_bin, os.path.join(tmp, "state2"), log)
    procs.append(co.proc)
    ch = grpc.insecure_channel(co.addr)
    grpc.channel_ready_future(ch).result(timeout=30)
    c, msg = code_of(stub("Coordinator", "Lease"), pb.LeaseRequest(), metadata=md1, timeout=10)
    check(c == U, f"a session from another coordinator → UNAUTHENTICATED ({c.name})")
    ch.close()
    co.stop()

    # ---- --insecure-no-auth: the explicit opt-out accepts calls without tokens
    co = Coordinator(coord_bin, os.path.join(tmp, "state4"), log, "--insecure-no-auth")
    procs.append(co.proc)
    ch = grpc.insecure_channel(co.addr)
    grpc.channel_ready_future(ch).result(timeout=30)
    c, _ = code_of(stub("Coordinator", "Register"), pb.RegisterRequest(hostname="x"), timeout=10)
    c2, _ = code_of(stub("Admin", "ListJobs"), pb.ListJobsRequest(), timeout=10)
    check(c == grpc.StatusCode.OK and c2 == grpc.StatusCode.OK and
          not os.path.exists(os.path.join(tmp, "state4", "admin.token")),
          f"--insecure-no-auth: Register and Admin without tokens → OK, no token files ({c.name}, {c2.name})")
    ch.close()
    check(co.stop() == 0, "coordinator exits 0 on SIGTERM")

    # ---- bad token files stop the coordinator with a message
    os.chmod(na, 0o622)
    short = os.path.join(tmp, "short.token")
    with open(short, "w") as f:
        f.write("abc\n")
    os.chmod(short, 0o600)
    for what, flags, needle in [("a group/world-writable admin token file", ["--admin-token-file", na], "chmod 600"),
                                ("a 3-byte join token", ["--join-token-file", short], "expected 16..256"),
                                ("a missing token file", ["--join-token-file", os.path.join(tmp, "nope")],
                                 "No such file")]:
        r = subprocess.run([coord_bin, "--listen", f"127.0.0.1:{free_port()}", "--state-dir",
                            os.path.join(tmp, "state3"), *flags], capture_output=True, text=True, timeout=30)
        check(r.returncode == 1 and needle in r.stderr, f"{what}: exit 1 saying '{needle}' ({r.stderr.strip()[-160:]})")


if __name__ == "__main__":
    sys.exit(main())
