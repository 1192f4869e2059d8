#!/usr/bin/env python3
"""coord_daemon.py — dipaco-coordinator as a real process on loopback, driven by python grpcio
(an independent gRPC/protobuf implementation) playing two workers and an admin:

  * Health/Check SERVING; bad CreateJob spec → INVALID_ARGUMENT naming the field; unknown job
    → NOT_FOUND; worker calls without / with a wrong session → UNAUTHENTICATED; unknown
    worker heartbeat → COMMAND_REREGISTER; Lease with no job → LEASE_NO_WORK.
  * A sync DiLoCo job (R=2, 2 rounds): leases per slot, PullFragment (full and resumed, CRC
    checked), PushDelta in odd-sized chunks; NaN / bad CRC / wrong fragment / wrong base
    version rejected; a retry is PUSH_DUPLICATE; an early Lease waits for the round; the new
    parameters equal torch.optim.SGD(nesterov=True) applied to the average delta (the oracle).
  * The coordinator is SIGKILLed after one of two deltas of a round was acknowledged and
    restarted on the same state dir: the worker sessions, the lease and the acknowledged
    delta survive and the round closes when the other delta arrives.
  * Admin listings, metrics history, /metrics (200) and /nope (404), ExportPath twice
    byte-identical and equal to the pulled parameters, SIGTERM → exit 0.

usage: coord_daemon.py COORDINATOR_BIN PROTO_DIR"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from daemon_kit import Daemon, check, crc32c, failures, free_port

MISSING = 1  # a missing tool fails the test (deploy/install_deps.sh --test installs them)




def main():
    coord_bin, proto_dir = sys.argv[1], sys.argv[2]
    try:
        import grpc
        import numpy as np
        import torch
    except ImportError as e:
        print(f"FAIL: missing: needs python grpcio, numpy and torch ({e})")
        return MISSING
    protoc = shutil.which("protoc")
    if not protoc:
        print("FAIL: missing: protoc not found; deploy/install_deps.sh --test installs Debian protobuf-compiler")
        return MISSING
    tmp = tempfile.mkdtemp(prefix="dpc_coord_")
    try:
        subprocess.run([protoc, f"--python_out={tmp}", f"-I{proto_dir}",
                        os.path.join(proto_dir, "dipaco.proto"),
                        os.path.join(proto_dir, "health.proto")], check=True)
        sys.path.insert(0, tmp)
        import dipaco_pb2 as pb
        import health_pb2
        return run(grpc, np, torch, pb, health_pb2, coord_bin, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)



def run(grpc, np, torch, pb, health_pb2, coord_bin, tmp):
    state = os.path.join(tmp, "state")
    log = os.path.join(tmp, "coordinator.log")
    d = Daemon(coord_bin, state, log)
    try:
        ok = body(grpc, np, torch, pb, health_pb2, coord_bin, d, state, log)
    except Exception as e:  # report, then clean up below
        import traceback
        traceback.print_exc()
        ok = False
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
    if failures() or not ok:
        print("---- coordinator log (tail) ----")
        with open(log) as f:
            print("".join(f.readlines()[-40:]))
        return 1
    return 0


def body(grpc, np, torch, pb, health_pb2, coord_bin, d, state, log):
    S = pb.DESCRIPTOR.services_by_name

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
    from security_md import with_tokens

    def channel(dm, st=state):  # Register and Admin calls carry the tokens from st (security_md.py)
        ch = grpc.insecure_channel(dm.addr)
        grpc.channel_ready_future(ch).result(timeout=20)
        return with_tokens(ch, st)

    def stubs(ch):
        u = {}
        for svc in ("Coordinator", "Admin"):
            for m in S[svc].methods:
                path = f"/dipaco.v1.{svc}/{m.name}"
                req = getattr(pb, m.input_type.name)
                resp = getattr(pb, m.output_type.name)
                kind = (m.client_streaming, m.server_streaming)
                mk = {(False, False): ch.unary_unary, (False, True): ch.unary_stream,
                      (True, False): ch.stream_unary}[kind]
                u[m.name] = mk(path, request_serializer=req.SerializeToString,
                               response_deserializer=resp.FromString)
        u["Health"] = ch.unary_unary("/grpc.health.v1.Health/Check",
                                     request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                                     response_deserializer=health_pb2.HealthCheckResponse.FromString)
        return u

    def code_of(fn, *a, **kw):
        try:
            r = fn(*a, **kw)
            if hasattr(r, "__iter__") and not hasattr(r, "ListFields"):
                r = list(r)
            return grpc.StatusCode.OK, r
        except grpc.RpcError as e:
            return e.code(), e.details()

    ch = channel(d)
    X = stubs(ch)
    r = X["Health"](health_pb2.HealthCheckRequest(service=""), timeout=5)
    check(r.status == health_pb2.HealthCheckResponse.SERVING, "Health '' SERVING")
    r = X["Health"](health_pb2.HealthCheckRequest(service="dipaco.v1.Coordinator"), timeout=5)
    check(r.status == health_pb2.HealthCheckResponse.SERVING, "Health dipaco.v1.Coordinator SERVING")

    # ---- validation / auth errors
    spec = {"name": "t1", "model": {"n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 8,
                                     "vocab_size": 16, "seed": 3},
            "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2,
            "inner_steps": 2, "rounds": 2, "batch": 1, "seq_len": 8,
            "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True}}
    bad = json.loads(json.dumps(spec))
    bad["inner"] = {"lrr": 1}
    c, msg = code_of(X["CreateJob"], pb.CreateJobRequest(spec_json=json.dumps(bad)), timeout=10)
    check(c == grpc.StatusCode.INVALID_ARGUMENT and "inner.lrr" in msg,
          f"bad spec → INVALID_ARGUMENT naming inner.lrr ({c}: {msg})")
    c, msg = code_of(X["CreateJob"], pb.CreateJobRequest(spec_json="{not json"), timeout=10)
    check(c == grpc.StatusCode.INVALID_ARGUMENT, f"non-JSON spec → INVALID_ARGUMENT ({msg})")
    c, msg = code_of(X["GetJob"], pb.JobRequest(job_id=999), timeout=10)
    check(c == grpc.StatusCode.NOT_FOUND, f"unknown job → NOT_FOUND ({msg})")
    c, msg = code_of(X["Lease"], pb.LeaseRequest(), timeout=10)
    check(c == grpc.StatusCode.UNAUTHENTICATED, f"Lease without metadata → UNAUTHENTICATED ({msg})")

    w1 = X["Register"](pb.RegisterRequest(hostname="w1", backend="cpu", threads=1), timeout=10)
    w2 = X["Register"](pb.RegisterRequest(hostname="w2", backend="cpu", threads=1), timeout=10)
    check(w1.worker_id > 0 and w2.worker_id != w1.worker_id and len(w1.session_token) >= 32,
          "Register gives distinct worker ids and a session token")
    md1 = [("dipaco-worker-id", str(w1.worker_id)), ("dipaco-session", w1.session_token)]
    md2 = [("dipaco-worker-id", str(w2.worker_id)), ("dipaco-session", w2.session_token)]
    wrong = [("dipaco-worker-id", str(w1.worker_id)), ("dipaco-session", "0" * 64)]
    c, msg = code_of(X["Lease"], pb.LeaseRequest(), metadata=wrong, timeout=10)
    check(c == grpc.StatusCode.UNAUTHENTICATED, f"Lease with a wrong session → UNAUTHENTICATED ({msg})")
    c, msg = code_of(X["PushDelta"], iter([]), metadata=wrong, timeout=10)
    check(c == grpc.StatusCode.UNAUTHENTICATED, f"PushDelta with a wrong session → UNAUTHENTICATED ({msg})")
    hb = X["Heartbeat"](pb.HeartbeatRequest(), metadata=[("dipaco-worker-id", "424242"),
                                                          ("dipaco-session", "x")], timeout=10)
    check(hb.command == pb.COMMAND_REREGISTER, "Heartbeat from an unknown worker → COMMAND_REREGISTER")
    r = X["Lease"](pb.LeaseRequest(), metadata=md1, timeout=10)
    check(r.outcome == pb.LEASE_NO_WORK, "Lease with no job → LEASE_NO_WORK")

    # ---- a job
    job = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec)), timeout=30)
    jid = job.summary.job_id
    check(jid > 0 and job.summary.state == pb.JOB_RUNNING and job.summary.rounds_total == 2,
          f"CreateJob → job {jid} RUNNING with 2 rounds")
    c, msg = code_of(X["CreateJob"], pb.CreateJobRequest(spec_json=json.dumps(spec)), timeout=10)
    check(c == grpc.StatusCode.ALREADY_EXISTS, f"duplicate job name → ALREADY_EXISTS ({msg})")

    l1 = X["Lease"](pb.LeaseRequest(), metadata=md1, timeout=10)
    l2 = X["Lease"](pb.LeaseRequest(), metadata=md2, timeout=10)
    check(l1.outcome == pb.LEASE_GRANTED and l2.outcome == pb.LEASE_GRANTED, "both workers get leases")
    L1, L2 = l1.lease, l2.lease
    check({L1.slot.replica, L2.slot.replica} == {0, 1} and L1.round == 0 and L1.first_step == 0
          and L1.inner_steps == 2 and L1.hyper.total_steps == 4 and L1.data.replicas == 2,
          "leases cover replicas 0 and 1 of round 0 with H=2, total_steps=4")
    again = X["Lease"](pb.LeaseRequest(), metadata=md1, timeout=10)
    check(again.outcome == pb.LEASE_GRANTED and again.lease.lease_id == L1.lease_id,
          "asking again returns the same lease")
    frag = L1.fragments[0]
    n = frag.num_floats
    check(len(L1.fragments) == 1 and frag.fragment_id == 1 and frag.offset_floats == 0 and n > 1000,
          f"plain DiLoCo: one fragment with the whole model ({n} floats)")

    def pull(md, lease, version=0, latest=False, offset=0):
        chunks = list(X["PullFragment"](pb.PullFragmentRequest(
            lease_id=lease.lease_id, fragment_id=frag.fragment_id, version=version, latest=latest,
            offset=offset), metadata=md, timeout=30))
        data = b"".join(c.data for c in chunks)
        return chunks, data

    chunks, raw = pull(md1, L1)
    import zlib  # noqa: F401  (crc32c is not in zlib; checked via the server's own CRC below)
    theta0 = np.frombuffer(raw, dtype="<f4").copy()
    check(len(raw) == 4 * n and chunks[-1].crc32c == frag.crc32c and chunks[-1].total == 4 * n,
          "PullFragment gives the whole fragment with the lease's CRC")
    check(crc32c(raw) == frag.crc32c, "CRC-32C of the pulled bytes matches (python CRC-32C)")
    _, tail = pull(md1, L1, offset=100)
    check(tail == raw[100:], "PullFragment resumes from an offset")
    c, msg = code_of(X["PullFragment"], pb.PullFragmentRequest(lease_id=L1.lease_id, fragment_id=1),
                     metadata=md2, timeout=10)
    check(c == grpc.StatusCode.PERMISSION_DENIED, f"pulling another worker's lease → PERMISSION_DENIED ({msg})")

    rng = np.random.default_rng(0)

    def chunks_of(lease, delta, fragment_id=1, version=None, crc=None, sizes=(333, 1001)):
        b = delta.astype("<f4").tobytes()
        c = crc32c(b) if crc is None else crc
        out, off = [], 0
        cuts = [s for s in sizes if s < len(b)] + [len(b)]
        prev = 0
        for cut in cuts:
            piece = b[prev:cut]
            last = cut == len(b)
            out.append(pb.Chunk(lease_id=lease.lease_id, fragment_id=fragment_id,
                                version=lease.round if version is None else version, offset=prev,
                                total=len(b), codec=pb.CODEC_FP32, crc32c=c if last else 0,
                                num_floats=len(delta), inner_steps=2, tokens=16,
                                payload=pb.PAYLOAD_DELTA, data=piece))
            prev = cut
        return out

    def push(md, chunks):
        return code_of(X["PushDelta"], iter(chunks), metadata=md, timeout=30)

    d1 = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    d2 = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    nan = d1.copy()
    nan[n // 2] = np.nan
    c, msg = push(md1, chunks_of(L1, nan))
    check(c == grpc.StatusCode.INVALID_ARGUMENT and "non-finite" in msg, f"NaN delta → INVALID_ARGUMENT ({msg})")
    c, msg = push(md1, chunks_of(L1, d1, crc=12345))
    check(c == grpc.StatusCode.DATA_LOSS, f"bad CRC → DATA_LOSS ({msg})")
    c, msg = push(md1, chunks_of(L1, d1, fragment_id=7))
    check(c == grpc.StatusCode.INVALID_ARGUMENT and "fragment_id" in msg, f"foreign fragment → INVALID_ARGUMENT ({msg})")
    c, msg = push(md1, chunks_of(L1, d1, version=5))
    check(c == grpc.StatusCode.INVALID_ARGUMENT and "version" in msg, f"wrong base version → INVALID_ARGUMENT ({msg})")
    c, msg = push(md1, chunks_of(L1, d1[:-3]))
    check(c == grpc.StatusCode.INVALID_ARGUMENT, f"short delta → INVALID_ARGUMENT ({msg})")
    c, msg = push(md2, chunks_of(L1, d1))
    check(c == grpc.StatusCode.PERMISSION_DENIED, f"pushing on another worker's lease → PERMISSION_DENIED ({msg})")

    hb = X["Heartbeat"](pb.HeartbeatRequest(lease_id=L1.lease_id, step=1, loss=2.5, tokens=8),
                        metadata=md1, timeout=10)
    check(hb.command == pb.COMMAND_CONTINUE and hb.lease_expires_unix_ms > time.time() * 1000,
          "Heartbeat renews the lease (CONTINUE)")
    X["Heartbeat"](pb.HeartbeatRequest(lease_id=L2.lease_id, step=1, loss=3.5, tokens=8), metadata=md2, timeout=10)
    deltas = {L1.slot.replica: d1, L2.slot.replica: d2}
    c, r = push(md1, chunks_of(L1, d1))
    check(c == grpc.StatusCode.OK and r.acks[0].result == pb.PUSH_ACCEPTED and r.acks[0].version == 1,
          f"PushDelta accepted in odd-sized chunks ({c})")
    c, r = push(md1, chunks_of(L1, d1))
    check(c == grpc.StatusCode.OK and r.acks[0].result == pb.PUSH_DUPLICATE, "a retried push → PUSH_DUPLICATE")
    c, msg = push(md1, chunks_of(L1, d2))
    check(c == grpc.StatusCode.ALREADY_EXISTS, f"a different delta for the same lease → ALREADY_EXISTS ({msg})")
    r = X["Lease"](pb.LeaseRequest(), metadata=md1, timeout=10)
    check(r.outcome == pb.LEASE_WAIT and r.wait_ms > 0, "early Lease for the next round → LEASE_WAIT")

    # ---- crash after one acknowledged delta; restart on the same state
    rc = d.stop(signal.SIGKILL)
    ch.close()
    d2m = Daemon(coord_bin, state, log)
    d.proc, d.addr, d.mport = d2m.proc, d2m.addr, d2m.mport
    d.logf = d2m.logf
    ch = channel(d)
    X = stubs(ch)
    hb = X["Heartbeat"](pb.HeartbeatRequest(lease_id=L2.lease_id, step=2, loss=3.0, tokens=16),
                        metadata=md2, timeout=10)
    check(hb.command == pb.COMMAND_CONTINUE, "after a SIGKILL + restart the session and the lease are still valid")
    c, r = push(md2, chunks_of(L2, d2))
    check(c == grpc.StatusCode.OK and r.acks[0].result == pb.PUSH_ACCEPTED, "second delta accepted after restart")

    # Oracle: torch SGD(nesterov) on the mean delta, in (path, replica) order, under the momentum
    # schedule the coordinator derives for a spec without one (docs/design.md §3.4): 2 rounds give
    # warm-up ceil(2/10) = 1 (no ramp) and decay ceil(2/5) = 1, so round 1, the last, has none.
    p = torch.tensor(theta0.copy(), dtype=torch.float32, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    steps = [0]

    def oracle_step(ds):
        avg = (ds[0].astype(np.float64) + ds[1].astype(np.float64)) / 2
        p.grad = torch.tensor(avg.astype(np.float32))
        opt.param_groups[0]["momentum"] = 0.9 if steps[0] == 0 else 0.0
        steps[0] += 1
        opt.step()
        return p.detach().numpy().copy()

    want1 = oracle_step([deltas[0], deltas[1]])

    def wait_version(v, timeout=20):
        t0 = time.time()
        while time.time() - t0 < timeout:
            ms = X["ListModules"](pb.ListModulesRequest(job_id=jid), timeout=10)
            if ms.modules[0].fragments[0].version >= v:
                return True
            time.sleep(0.05)
        return False

    check(wait_version(1), "round 0 closed after restart (version 1)")
    r1 = X["Lease"](pb.LeaseRequest(), metadata=md1, timeout=10)
    r2 = X["Lease"](pb.LeaseRequest(), metadata=md2, timeout=10)
    check(r1.outcome == pb.LEASE_GRANTED and r1.lease.slot.replica == L1.slot.replica and r1.lease.round == 1
          and r1.lease.first_step == 2, "round 1: each worker gets its own slot back (sticky), first_step 2")
    L1b, L2b = r1.lease, r2.lease
    _, raw1 = pull(md1, L1b)
    got1 = np.frombuffer(raw1, dtype="<f4")
    err = np.max(np.abs(got1 - want1) / (np.abs(want1) + 1e-6))
    check(np.allclose(got1, want1, rtol=1e-6, atol=1e-7), f"version 1 = torch SGD nesterov oracle (max rel err {err:.2e})")
    e1 = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    e2 = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    X["Heartbeat"](pb.HeartbeatRequest(lease_id=L1b.lease_id, step=3, loss=2.0), metadata=md1, timeout=10)
    X["Heartbeat"](pb.HeartbeatRequest(lease_id=L2b.lease_id, step=3, loss=2.2), metadata=md2, timeout=10)
    c, r = push(md2, chunks_of(L2b, e2, sizes=(4, 8, 4000)))
    check(c == grpc.StatusCode.OK and r.acks[0].result == pb.PUSH_ACCEPTED, "round 1 delta 1 accepted")
    fut = X["Lease"].future(pb.LeaseRequest(max_wait_ms=10000), metadata=md2, timeout=20)
    time.sleep(0.2)
    c, r = push(md1, chunks_of(L1b, e1, sizes=()))
    check(c == grpc.StatusCode.OK and r.acks[0].result == pb.PUSH_ACCEPTED, "round 1 delta 2 accepted")
    t0 = time.time()
    lp = fut.result()
    check(lp.outcome == pb.LEASE_NO_WORK and time.time() - t0 < 5,
          "a long-polled Lease gets LEASE_NO_WORK as soon as the job is done")
    rd = {L1b.slot.replica: e1, L2b.slot.replica: e2}
    want2 = oracle_step([rd[0], rd[1]])
    check(wait_version(2), "round 1 closed (version 2)")
    t0 = time.time()
    while time.time() - t0 < 10:
        j = X["GetJob"](pb.JobRequest(job_id=jid), timeout=10)
        if j.summary.state == pb.JOB_DONE:
            break
        time.sleep(0.05)
    check(j.summary.state == pb.JOB_DONE and j.summary.round == 2, "job DONE after 2 rounds")
    r = X["Lease"](pb.LeaseRequest(), metadata=md1, timeout=10)
    check(r.outcome == pb.LEASE_NO_WORK, "Lease after the job is done → LEASE_NO_WORK")
    c, msg = push(md1, chunks_of(L1b, e1, sizes=()))
    check(c == grpc.StatusCode.OK and msg.acks[0].result == pb.PUSH_DUPLICATE, "retry after the round closed → DUPLICATE")

    # ---- admin views
    jl = X["ListJobs"](pb.ListJobsRequest(), timeout=10)
    check(len(jl.jobs) == 1 and jl.jobs[0].job_id == jid, "ListJobs lists the job")
    jl = X["ListJobs"](pb.ListJobsRequest(state=pb.JOB_RUNNING), timeout=10)
    check(len(jl.jobs) == 0, "ListJobs filters by state")
    wl = X["ListWorkers"](pb.ListWorkersRequest(include_gone=True), timeout=10)
    check({w.hostname for w in wl.workers} == {"w1", "w2"}, "ListWorkers lists both workers")
    pl = X["ListPaths"](pb.ListPathsRequest(job_id=jid), timeout=10)
    check(len(pl.paths) == 1 and len(pl.paths[0].slots) == 2 and pl.paths[0].slots[0].step == 4,
          "ListPaths: one path, two slots at step 4")
    mt = X["GetMetrics"](pb.GetMetricsRequest(job_id=jid, names=["loss"]), timeout=10)
    slot_losses = sorted(round(p_.value, 3) for p_ in mt.points if p_.path == 0 and p_.round == 0)
    mean0 = [p_.value for p_ in mt.points if p_.path == -1 and p_.round == 0]
    check(slot_losses == [2.5, 3.0] and len(mean0) == 1 and abs(mean0[0] - 2.75) < 1e-6,
          f"GetMetrics: slot losses of round 0 {slot_losses} and their mean {mean0}")
    mt = X["GetMetrics"](pb.GetMetricsRequest(job_id=jid, names=["bytes_in", "bytes_out", "outer_seconds"]),
                         timeout=10)
    bi = [p_.value for p_ in mt.points if p_.name == "bytes_in" and p_.round == 1]
    bo = [p_.value for p_ in mt.points if p_.name == "bytes_out" and p_.round == 1]
    osec = [p_.value for p_ in mt.points if p_.name == "outer_seconds"]
    check(bi == [4.0 * n, 4.0 * n] and sorted(bo) == [0.0, 4.0 * n] and len(osec) == 2 and all(v > 0 for v in osec),
          f"GetMetrics: bytes in/out per slot of round 1 ({bi}, {bo}) and outer-step seconds")
    c, msg = code_of(X["PauseJob"], pb.JobRequest(job_id=jid), timeout=10)
    check(c == grpc.StatusCode.FAILED_PRECONDITION, f"pausing a finished job → FAILED_PRECONDITION ({msg})")

    # ---- export
    def export():
        cs = list(X["ExportPath"](pb.ExportPathRequest(job_id=jid, path=0), timeout=30))
        cfg = b"".join(c.data for c in cs if c.payload == pb.PAYLOAD_CONFIG_JSON)
        st = b"".join(c.data for c in cs if c.payload == pb.PAYLOAD_SAFETENSORS)
        return cfg, st
    cfg_a, st_a = export()
    cfg_b, st_b = export()
    check(cfg_a == cfg_b and st_a == st_b and len(st_a) > 4 * n, "ExportPath twice gives identical bytes")
    conf = json.loads(cfg_a)
    check(conf.get("n_layer") == 1 and conf.get("n_embd") == 8, "exported config.json has the model shape")
    hl = struct.unpack("<Q", st_a[:8])[0]
    hdr = json.loads(st_a[8:8 + hl])
    b0, b1 = hdr["wte.weight"]["data_offsets"]
    wte = np.frombuffer(st_a[8 + hl + b0:8 + hl + b1], dtype="<f4")
    check(np.allclose(wte, want2[:16 * 8], rtol=1e-6, atol=1e-7), "exported wte.weight = oracle after 2 rounds")
    c, msg = code_of(X["ExportPath"], pb.ExportPathRequest(job_id=jid, path=3), timeout=10)
    check(c == grpc.StatusCode.INVALID_ARGUMENT, f"export of a missing path → INVALID_ARGUMENT ({msg})")

    # ---- a second job: pause/resume, a round closed at its deadline with quorum, drain, cancel
    spec2 = json.loads(json.dumps(spec))
    spec2.update(name="t2", quorum=0.5, round_timeout_s=1.0, rounds=3)
    job2 = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec2), start_paused=True), timeout=30)
    j2 = job2.summary.job_id
    check(job2.summary.state == pb.JOB_PAUSED, "start_paused → JOB_PAUSED")
    r = X["Lease"](pb.LeaseRequest(), metadata=md1, timeout=10)
    check(r.outcome == pb.LEASE_NO_WORK, "paused job → LEASE_NO_WORK")
    j = X["ResumeJob"](pb.JobRequest(job_id=j2), timeout=10)
    check(j.summary.state == pb.JOB_RUNNING, "ResumeJob → RUNNING")
    a = X["Lease"](pb.LeaseRequest(), metadata=md1, timeout=10).lease
    b = X["Lease"](pb.LeaseRequest(), metadata=md2, timeout=10).lease
    check(a.job_id == j2 and b.job_id == j2 and a.deadline_unix_ms > 0, "job 2 leases carry a round deadline")
    _, rawb = pull(md1, a)
    theta_b = np.frombuffer(rawb, dtype="<f4").copy()
    f1 = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    c, r = push(md1, chunks_of(a, f1))
    check(c == grpc.StatusCode.OK and r.acks[0].result == pb.PUSH_ACCEPTED, "job 2: one delta of two pushed")
    fut = X["Lease"].future(pb.LeaseRequest(max_wait_ms=8000), metadata=md1, timeout=20)
    t0 = time.time()
    while time.time() - t0 < 10:
        ms = X["ListModules"](pb.ListModulesRequest(job_id=j2), timeout=10)
        if ms.modules[0].fragments[0].version >= 1:
            break
        time.sleep(0.05)
    check(ms.modules[0].fragments[0].version == 1 and time.time() - t0 > 0.3,
          f"job 2 round 0 closed at its deadline with quorum 1/2 after {time.time() - t0:.1f} s")
    lp = fut.result()
    check(lp.outcome == pb.LEASE_GRANTED and lp.lease.round == 1 and lp.lease.slot.replica == a.slot.replica
          and time.time() - t0 < 5, "a long-polled Lease is answered with the next round's lease when the round closes")
    hb = X["Heartbeat"](pb.HeartbeatRequest(lease_id=b.lease_id, step=1), metadata=md2, timeout=10)
    check(hb.command == pb.COMMAND_STOP, "the slot left out gets COMMAND_STOP")
    c, r = push(md2, chunks_of(b, f1))
    check(c == grpc.StatusCode.OK and r.acks[0].result == pb.PUSH_LATE, "its late push → PUSH_LATE")
    p3 = torch.tensor(theta_b.copy(), requires_grad=True)
    o3 = torch.optim.SGD([p3], lr=0.7, momentum=0.9, nesterov=True)
    p3.grad = torch.tensor(f1)
    o3.step()
    b1 = X["Lease"](pb.LeaseRequest(), metadata=md2, timeout=10)
    check(b1.outcome == pb.LEASE_GRANTED and b1.lease.round == 1 and b1.lease.first_step == 2
          and b1.lease.slot.replica == b.slot.replica, "the skipped slot moves on to round 1 (first_step 2)")
    _, raw2 = pull(md2, b1.lease)
    check(np.allclose(np.frombuffer(raw2, dtype="<f4"), p3.detach().numpy(), rtol=1e-6, atol=1e-7),
          "deadline round applied the single delta (torch oracle)")
    j = X["PauseJob"](pb.JobRequest(job_id=j2, reason="test"), timeout=10)
    check(j.summary.state == pb.JOB_PAUSED, "PauseJob → PAUSED")
    hb = X["Heartbeat"](pb.HeartbeatRequest(lease_id=b1.lease.lease_id, step=3), metadata=md2, timeout=10)
    check(hb.command == pb.COMMAND_CONTINUE, "a lease in flight continues while paused")
    X["ResumeJob"](pb.JobRequest(job_id=j2), timeout=10)
    wi = X["DrainWorker"](pb.DrainWorkerRequest(worker_id=w2.worker_id), timeout=10)
    check(wi.state == pb.WORKER_DRAINING, "DrainWorker → DRAINING")
    hb = X["Heartbeat"](pb.HeartbeatRequest(lease_id=b1.lease.lease_id, step=3), metadata=md2, timeout=10)
    check(hb.command == pb.COMMAND_DRAIN, "a draining worker's heartbeat says DRAIN")
    c, msg = code_of(X["DrainWorker"], pb.DrainWorkerRequest(worker_id=999), timeout=10)
    check(c == grpc.StatusCode.NOT_FOUND, "DrainWorker of an unknown worker → NOT_FOUND")
    j = X["CancelJob"](pb.JobRequest(job_id=j2), timeout=10)
    check(j.summary.state == pb.JOB_CANCELLED and j.summary.active_leases == 0, "CancelJob → CANCELLED, leases released")
    hb = X["Heartbeat"](pb.HeartbeatRequest(lease_id=b1.lease.lease_id, step=3), metadata=md2, timeout=10)
    check(hb.command == pb.COMMAND_STOP, "after cancel the lease's heartbeat says STOP")
    c, msg = push(md2, chunks_of(b1.lease, f1))
    check(c == grpc.StatusCode.ABORTED, f"push on a cancelled job's lease → ABORTED ({msg})")
    c, msg = code_of(X["ResumeJob"], pb.JobRequest(job_id=j2), timeout=10)
    check(c == grpc.StatusCode.FAILED_PRECONDITION, "ResumeJob of a cancelled job → FAILED_PRECONDITION")

    # ---- a DiPaCo job: 2 paths sharing the stem, one module each at level 1, R = 1
    spec3 = json.loads(json.dumps(spec))
    spec3.update(name="t3", algorithm="dipaco", replicas=1, rounds=1,
                 levels=[{"stem": True, "layers": [0, 0], "modules": 1},
                         {"layers": [0, 1], "modules": 2}])
    job3 = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec3)), timeout=30)
    j3 = job3.summary.job_id
    check(job3.summary.paths == 2, "DiPaCo job has 2 paths")
    w3 = X["Register"](pb.RegisterRequest(hostname="w3"), timeout=10)
    md3 = [("dipaco-worker-id", str(w3.worker_id)), ("dipaco-session", w3.session_token)]
    leases = [X["Lease"](pb.LeaseRequest(job_id=j3), metadata=m, timeout=10).lease for m in (md1, md3)]
    mods = X["ListModules"](pb.ListModulesRequest(job_id=j3), timeout=10)
    check(len(mods.modules) == 3 and sorted(len(L.fragments) for L in leases) == [2, 2]
          and {L.slot.path for L in leases} == {0, 1},
          "DiPaCo: 3 modules; each path's lease lists the stem and its own module")
    before, pushes = {}, {}
    for L, m in zip(leases, (md1, md3)):
        stream = []
        for fi in L.fragments:
            raw = b"".join(c.data for c in X["PullFragment"](pb.PullFragmentRequest(
                lease_id=L.lease_id, fragment_id=fi.fragment_id), metadata=m, timeout=30))
            before[fi.fragment_id] = np.frombuffer(raw, dtype="<f4").copy()
            dl = (rng.standard_normal(fi.num_floats) * 1e-2).astype(np.float32)
            pushes.setdefault(fi.fragment_id, []).append((L.slot.path, dl))
            stream += chunks_of(L, dl, fragment_id=fi.fragment_id, version=0)
        c, r = push(m, stream)
        check(c == grpc.StatusCode.OK and [a.result for a in r.acks] == [pb.PUSH_ACCEPTED] * 2,
              f"DiPaCo: one PushDelta stream carries both fragments of path {L.slot.path}")
    t0 = time.time()
    while time.time() - t0 < 10:
        if X["GetJob"](pb.JobRequest(job_id=j3), timeout=10).summary.state == pb.JOB_DONE:
            break
        time.sleep(0.05)
    mods = X["ListModules"](pb.ListModulesRequest(job_id=j3), timeout=10)
    check(all(m_.fragments[0].version == 1 for m_ in mods.modules), "DiPaCo: every fragment reached version 1")
    ok_all = True
    for fid, lst in pushes.items():
        lst.sort(key=lambda t: t[0])
        pt = torch.tensor(before[fid].copy(), requires_grad=True)
        # one round: its only step is the last of the derived momentum decay, at momentum 0
        o = torch.optim.SGD([pt], lr=0.7, momentum=0.9, nesterov=True)
        o.param_groups[0]["momentum"] = 0.0
        avg = sum(d_.astype(np.float64) for _, d_ in lst) / len(lst)
        pt.grad = torch.tensor(avg.astype(np.float32))
        o.step()
        cs = list(X["ExportPath"](pb.ExportPathRequest(job_id=j3, path=lst[0][0]), timeout=30))
        st = b"".join(c.data for c in cs if c.payload == pb.PAYLOAD_SAFETENSORS)
        hl = struct.unpack("<Q", st[:8])[0]
        hdr = json.loads(st[8:8 + hl])
        flat = b"".join(st[8 + hl + hdr[k]["data_offsets"][0]:8 + hl + hdr[k]["data_offsets"][1]]
                        for k in sorted((k for k in hdr if k != "__metadata__"),
                                        key=lambda k: hdr[k]["data_offsets"][0]))
        fi = [f_ for m_ in mods.modules for f_ in m_.fragments if f_.fragment_id == fid][0]
        got = np.frombuffer(flat, dtype="<f4")[fi.offset_floats:fi.offset_floats + fi.num_floats]
        ok_all &= np.allclose(got, pt.detach().numpy(), rtol=1e-6, atol=1e-7)
    check(ok_all, "DiPaCo: shared stem averaged over both paths, each module updated by its path (torch oracle, via export)")

    # ---- garbage and unimplemented
    raw_call = ch.unary_unary("/dipaco.v1.Admin/GetJob", request_serializer=lambda b: b,
                              response_deserializer=lambda b: b)
    c, msg = code_of(raw_call, b"\xff\xff\xff", timeout=10)
    check(c == grpc.StatusCode.INVALID_ARGUMENT, f"garbage request bytes → INVALID_ARGUMENT ({msg})")
    raw_push = ch.stream_unary("/dipaco.v1.Coordinator/PushDelta", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    c, msg = code_of(raw_push, iter([b"\x7a\xff\xff\xff\xff\x0f"]), metadata=md1, timeout=10)
    check(c == grpc.StatusCode.INVALID_ARGUMENT, f"garbage chunk → INVALID_ARGUMENT ({msg})")
    c, msg = code_of(X["PushInnerState"], iter([pb.Chunk(lease_id=1, data=b"abcd")]), metadata=md1, timeout=10)
    refused = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ABORTED,
               grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT)
    check(c in refused, f"PushInnerState on a lease that is not an active checkpoint lease of the caller → refused ({c}: {msg})")
    c, msg = code_of(X["PullInnerState"], pb.PullInnerStateRequest(lease_id=1), metadata=md1, timeout=10)
    check(c in refused, f"PullInnerState on a lease that is not an active checkpoint lease of the caller → refused ({c}: {msg})")

    # ---- metrics endpoint
    body_ = urllib.request.urlopen(f"http://127.0.0.1:{d.mport}/metrics", timeout=5).read().decode()
    mvals = dict(l.rsplit(" ", 1) for l in body_.splitlines() if l and not l.startswith("#"))
    rounds_, finished_ = mvals.get("dipaco_rounds_total", "0"), mvals.get('dipaco_jobs{state="finished"}', "0")
    check(float(rounds_) >= 2 and float(finished_) >= 1,
          f"GET /metrics counts the rounds and the finished job ({rounds_} rounds, {finished_} finished)")
    # Per-job series exist only for live jobs (bounded labels): the finished job has none.
    check(f'job_id="{jid}"' not in body_ and "# TYPE dipaco_fragment_version gauge" in body_,
          "GET /metrics has no per-job series for the finished job")
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{d.mport}/nope", timeout=5)
        check(False, "GET /nope → 404")
    except urllib.error.HTTPError as e:
        check(e.code == 404, "GET /nope → 404")
    r = X["Health"](health_pb2.HealthCheckRequest(service=""), timeout=5)
    check(r.status == health_pb2.HealthCheckResponse.SERVING, "still serving after all the bad requests")
    second = subprocess.run([coord_bin, "--listen", f"127.0.0.1:{free_port()}", "--state-dir", state],
                            capture_output=True, text=True, timeout=30)
    check(second.returncode == 1 and "in use" in second.stderr,
          "a second coordinator on the same state dir refuses to start")
    ch.close()
    rc = d.stop(signal.SIGTERM)
    check(rc == 0, f"SIGTERM → clean exit 0 (got {rc})")
    # ---- lease expiry on a daemon with a short TTL
    state2 = state + "-ttl"
    proc = subprocess.Popen([coord_bin, "--listen", f"127.0.0.1:{free_port()}", "--state-dir", state2,
                             "--lease-ttl-ms", "400", "--heartbeat-ms", "100"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        addr = None
        t0 = time.time()
        while addr is None and time.time() - t0 < 20:
            line = proc.stderr.readline()
            if "listening on" in line:
                addr = line.split("listening on ")[1].split(" ")[0]
        e = type("D", (), {"addr": addr})
        ch2 = channel(e, state2)
        Y = stubs(ch2)
        Y["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(dict(spec, name="ttl", replicas=1))), timeout=30)
        va = Y["Register"](pb.RegisterRequest(hostname="victim"), timeout=10)
        vb = Y["Register"](pb.RegisterRequest(hostname="heir"), timeout=10)
        mda = [("dipaco-worker-id", str(va.worker_id)), ("dipaco-session", va.session_token)]
        mdb = [("dipaco-worker-id", str(vb.worker_id)), ("dipaco-session", vb.session_token)]
        la = Y["Lease"](pb.LeaseRequest(), metadata=mda, timeout=10).lease
        r = Y["Lease"](pb.LeaseRequest(), metadata=mdb, timeout=10)
        check(r.outcome == pb.LEASE_WAIT, "the only slot is leased: the other worker waits")
        time.sleep(1.0)  # no heartbeat: the lease expires
        r = Y["Lease"](pb.LeaseRequest(), metadata=mdb, timeout=10)
        check(r.outcome == pb.LEASE_GRANTED and r.lease.slot.replica == la.slot.replica and r.lease.round == 0
              and r.lease.lease_id != la.lease_id, "after the TTL the slot goes to another worker, same round")
        hb = Y["Heartbeat"](pb.HeartbeatRequest(lease_id=la.lease_id), metadata=mda, timeout=10)
        check(hb.command == pb.COMMAND_STOP, "the expired lease's holder is told to STOP")
        c, msg = code_of(Y["PushDelta"], iter(chunks_of(la, d1)), metadata=mda, timeout=10)
        check(c == grpc.StatusCode.ABORTED, f"push on an expired lease → ABORTED ({msg})")
        wl = Y["ListWorkers"](pb.ListWorkersRequest(include_gone=True), timeout=10)
        check(any(w.hostname == "heir" and w.state == pb.WORKER_TRAINING for w in wl.workers),
              "ListWorkers shows the new holder TRAINING")
        ch2.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rest = proc.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            rest = proc.communicate()[1]
    check(proc.returncode == 0 and "expired" in rest, f"expiry logged; clean exit ({proc.returncode})")

    with open(log) as f:
        text = f.read()
    check("lease" in text and "granted" in text and "delta received" in text and "round 1 closed" in text,
          "log has lease grants, deltas and round closes")
    return True



if __name__ == "__main__":
    sys.exit(main())
