#!/usr/bin/env python3
"""delta_screen.py — the delta norm screen (job spec outer.delta_norm_screen) on a real
dipaco-coordinator, driven by python grpcio playing four workers of a sync DiLoCo job (R=4,
k = 4):

  * round 0: the first delta of the job has no reference and is accepted; two more normal
    deltas are accepted; a delta scaled up 100x is refused with FAILED_PRECONDITION naming
    its norm and the bound, and the refusal is logged; the worker releases the lease (as
    dipaco-worker does on a refused push), takes the slot again and pushes a normal delta,
    which is accepted. The round closes and the new parameters equal the outer step
    (SGD nesterov, numpy) over the four normal deltas only: the refused delta was never
    applied.
  * round 1: the first delta of the round is screened against the running reference from
    round 0 (refused when scaled up); the coordinator is restarted and a scaled-up delta is
    still refused (the reference is reloaded from the norms recorded in the store), normal
    deltas are accepted and the job ends DONE with version 2.
  * diloco-async: after three applied deltas a scaled-up one is refused against the running
    median; a smaller one (e.g. a preempted worker's partial work) passes;
  * a spec with outer.delta_norm_screen = 1 is refused with INVALID_ARGUMENT naming the field;
  * with no delta_norm_screen in the spec, the AdamW bound still refuses a finite poison
    (3.4e38 everywhere), and the same lease's normal delta is accepted after it;
  * two PushDelta streams of one lease at once with different data: one stream per
    lease writes at a time, so the second gets UNAVAILABLE ("one at a time") while the first
    writes; the first is acknowledged, other data after it gets ALREADY_EXISTS, and the outer
    step applies the acknowledged delta (no other file of the lease is left).

usage: delta_screen.py COORDINATOR_BIN PROTO_DIR"""
import json
import os
import sys
import time

from daemon_kit import Daemon, check, crc32c, grpc_stubs, run_grpc_test, status_of

K = 4.0






def main():
    coord_bin, proto_dir = sys.argv[1], sys.argv[2]
    return run_grpc_test(coord_bin, proto_dir, "dpc_screen_",
                         lambda grpc, np, pb, d, state, log: body(grpc, np, pb, coord_bin, d, state, log))


def body(grpc, np, pb, coord_bin, d, state, log):

    def connect():
        return grpc_stubs(grpc, pb, d[0].addr, state)

    def code_of(fn, *a, **kw):
        return status_of(grpc, fn, *a, **kw)

    X = connect()
    spec = {"name": "screen", "model": {"n_layer": 1, "n_head": 2, "n_embd": 8, "n_positions": 8,
                                         "vocab_size": 16, "seed": 5},
            "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 4,
            "inner_steps": 2, "rounds": 2, "batch": 1, "seq_len": 8,
            "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True, "delta_norm_screen": K}}
    bad = json.loads(json.dumps(spec))
    bad["outer"]["delta_norm_screen"] = 1
    c, msg = code_of(X["CreateJob"], pb.CreateJobRequest(spec_json=json.dumps(bad)), timeout=10)
    check(c == grpc.StatusCode.INVALID_ARGUMENT and "outer.delta_norm_screen" in msg,
          f"delta_norm_screen 1 → INVALID_ARGUMENT naming the field ({c}: {msg})")
    jid = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(spec)), timeout=30).summary.job_id
    mds = []
    for i in range(4):
        w = X["Register"](pb.RegisterRequest(hostname=f"w{i}", backend="cpu", threads=1), timeout=10)
        mds.append([("dipaco-worker-id", str(w.worker_id)), ("dipaco-session", w.session_token)])

    def lease(md):
        # Long-poll as a worker does: an async lease waits until the acknowledged deltas are applied.
        r = X["Lease"](pb.LeaseRequest(max_wait_ms=5000), metadata=md, timeout=10)
        assert r.outcome == pb.LEASE_GRANTED, r
        return r.lease

    def pull(md, L):
        cs = list(X["PullFragment"](pb.PullFragmentRequest(lease_id=L.lease_id, fragment_id=1), metadata=md,
                                    timeout=30))
        return np.frombuffer(b"".join(c.data for c in cs), dtype="<f4").copy()

    def chunks_of(L, delta):
        b = delta.astype("<f4").tobytes()
        cuts = list(range(0, len(b), 1000)) + [len(b)]
        return [pb.Chunk(lease_id=L.lease_id, fragment_id=1, version=L.fragments[0].version, offset=a,
                         total=len(b), codec=pb.CODEC_FP32, crc32c=crc32c(b) if e == len(b) else 0,
                         num_floats=len(delta), inner_steps=2, tokens=16, payload=pb.PAYLOAD_DELTA,
                         data=b[a:e]) for a, e in zip(cuts[:-1], cuts[1:])]

    def push(md, L, delta):
        return code_of(X["PushDelta"], iter(chunks_of(L, delta)), metadata=md, timeout=30)

    def accepted(res):
        c, r = res
        return c == grpc.StatusCode.OK and r.acks[0].result == pb.PUSH_ACCEPTED

    def refused(res):
        c, msg = res
        return c == grpc.StatusCode.FAILED_PRECONDITION and "norm" in msg and "bound" in msg, f"{c}: {msg}"

    def wait_version(v, timeout=20, job=None):
        t0 = time.time()
        while time.time() - t0 < timeout:
            ms = X["ListModules"](pb.ListModulesRequest(job_id=job or jid), timeout=10)
            if ms.modules[0].fragments[0].version >= v:
                return True
            time.sleep(0.05)
        return False

    rng = np.random.default_rng(1)
    Ls = [lease(md) for md in mds]
    n = Ls[0].fragments[0].num_floats
    theta0 = pull(mds[0], Ls[0])
    good = {}
    for i in range(3):
        delta = (rng.standard_normal(n) * 1e-2).astype(np.float32)
        good[Ls[i].slot.replica] = delta
        check(accepted(push(mds[i], Ls[i], delta)), f"round 0: normal delta {i} accepted"
              + (" (the job's first: no reference yet)" if i == 0 else ""))
    big = (rng.standard_normal(n) * 1e-2 * 100).astype(np.float32)
    ok, detail = refused(push(mds[3], Ls[3], big))
    check(ok, f"round 0: a delta 100x the others → FAILED_PRECONDITION naming norm and bound ({detail})")
    with open(log) as f:
        check("delta norm screen" in f.read(), "the refusal is logged")
    X["Release"](pb.ReleaseRequest(lease_id=Ls[3].lease_id, reason=pb.RELEASE_ERROR, step=0,
                                   message="push refused"), metadata=mds[3], timeout=10)
    L3 = lease(mds[3])
    check(L3.round == 0 and L3.slot.replica == Ls[3].slot.replica and L3.lease_id != Ls[3].lease_id,
          "after Release the slot is leased again for round 0")
    delta = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    good[L3.slot.replica] = delta
    check(accepted(push(mds[3], L3, delta)), "round 0: the retrained normal delta is accepted")
    check(wait_version(1), "round 0 closed (version 1)")
    # Oracle: SGD nesterov (u ← Δ̄ on a fresh buffer; θ ← θ − η(Δ̄ + μu)) over the 4 normal deltas.
    avg = sum(good[r].astype(np.float64) for r in range(4)) / 4
    avg32 = avg.astype(np.float32)
    u = avg32.copy()
    want = theta0 - np.float32(0.7) * (avg32 + np.float32(0.9) * u)
    Ls = [lease(md) for md in mds]
    got = pull(mds[0], Ls[0])
    check(all(L.round == 1 for L in Ls), "round 1 leases granted")
    check(np.allclose(got, want, rtol=1e-5, atol=1e-6),
          f"version 1 = outer step over the normal deltas only (max err {np.max(np.abs(got - want)):.2e})")

    ok, detail = refused(push(mds[0], Ls[0], (rng.standard_normal(n) * 1e-2 * 50).astype(np.float32)))
    check(ok, f"round 1: the round's first delta is screened against the running reference ({detail})")
    # Restart: the reference comes back from the store.
    d[0].stop()
    d[0] = Daemon(coord_bin, state, log)
    X = connect()
    ok, detail = refused(push(mds[1], Ls[1], (rng.standard_normal(n) * 1e-2 * 50).astype(np.float32)))
    check(ok, f"after a coordinator restart a scaled-up delta is still refused ({detail})")
    for i in range(4):
        check(accepted(push(mds[i], Ls[i], (rng.standard_normal(n) * 1.5e-2).astype(np.float32))),
              f"round 1: normal delta {i} (1.5x) accepted")
    check(wait_version(2), "round 1 closed (version 2)")
    t0 = time.time()
    while time.time() - t0 < 10:
        j = X["GetJob"](pb.JobRequest(job_id=jid), timeout=10)
        if j.summary.state == pb.JOB_DONE:
            break
        time.sleep(0.05)
    check(j.summary.state == pb.JOB_DONE, "job DONE after 2 rounds")

    # diloco-async: no rounds; the same running reference over the applied deltas.
    aspec = json.loads(json.dumps(spec))
    aspec.update(name="screen-async", algorithm="diloco-async", replicas=2, rounds=3)
    ajid = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(aspec)), timeout=30).summary.job_id
    for i in range(3):
        L = lease(mds[0])
        check(L.job_id == ajid and accepted(push(mds[0], L, (rng.standard_normal(n) * 1e-2).astype(np.float32))),
              f"async: normal delta {i} accepted")
    L = lease(mds[1])
    ok, detail = refused(push(mds[1], L, (rng.standard_normal(n) * 1e-2 * 100).astype(np.float32)))
    check(ok, f"async: a delta 100x the running median → FAILED_PRECONDITION ({detail})")
    half = (rng.standard_normal(n) * 0.5e-2).astype(np.float32)  # partial work: smaller, never screened
    check(accepted(push(mds[1], L, half)), "async: a smaller delta on the same lease is accepted")

    # Two PushDelta streams of one lease at once, with different data: both are past their
    # first chunk (both writing) before either commits; A commits first, then B.
    import threading
    rspec = json.loads(json.dumps(spec))
    rspec.update(name="race", replicas=2, rounds=2)
    del rspec["outer"]["delta_norm_screen"]
    rjid = X["CreateJob"](pb.CreateJobRequest(spec_json=json.dumps(rspec)), timeout=30).summary.job_id

    def lease_in(md, job):
        r = X["Lease"](pb.LeaseRequest(max_wait_ms=5000, job_id=job), metadata=md, timeout=10)
        assert r.outcome == pb.LEASE_GRANTED, r
        return r.lease

    def gated(chunks, gate):
        for c in chunks[:-1]:
            yield c
        gate.wait(20)
        yield chunks[-1]

    La, Lc = lease_in(mds[2], rjid), lease_in(mds[3], rjid)
    theta_r = pull(mds[2], La)
    A = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    B = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    C = (rng.standard_normal(n) * 1e-2).astype(np.float32)
    ga, gb = threading.Event(), threading.Event()
    fa = X["PushDelta"].future(gated(chunks_of(La, A), ga), metadata=mds[2], timeout=30)
    fb = X["PushDelta"].future(gated(chunks_of(La, B), gb), metadata=mds[2], timeout=30)
    time.sleep(0.5)
    ga.set()
    ra = fa.result()
    gb.set()
    try:
        fb.result()
        cb, mb = grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        cb, mb = e.code(), e.details()
    check(ra.acks[0].result == pb.PUSH_ACCEPTED, "race: the first stream to commit is acknowledged")
    check(cb == grpc.StatusCode.UNAVAILABLE and "one at a time" in mb,
          f"race: the second stream of the lease, while the first writes → UNAVAILABLE, one at a time ({cb}: {mb})")
    # After the first is answered, another stream with other data gets ALREADY_EXISTS.
    c2, m2 = push(mds[2], La, B)
    check(c2 == grpc.StatusCode.ALREADY_EXISTS, f"race: other data after the ack → ALREADY_EXISTS ({c2}: {m2})")
    # The AdamW bound is on without outer.delta_norm_screen: a finite poison
    # (3.4e38 everywhere) is refused before it is stored; the same lease then pushes normally.
    poison = np.full(n, 3.4e38, dtype=np.float32)
    ok, detail = refused(push(mds[3], Lc, poison))
    check(ok and "AdamW" in detail, f"no screen configured: a 3.4e38 delta → FAILED_PRECONDITION, AdamW bound ({detail})")
    check(accepted(push(mds[3], Lc, C)), "race: the other slot's delta accepted")
    check(wait_version(1, job=rjid), "race: round 0 closed")
    avg32 = ((A.astype(np.float64) + C.astype(np.float64)) / 2).astype(np.float32)
    want = theta_r - np.float32(0.7) * (avg32 + np.float32(0.9) * avg32)
    got = pull(mds[2], lease_in(mds[2], rjid))
    check(np.allclose(got, want, rtol=1e-5, atol=1e-6),
          f"race: the outer step applied the acknowledged delta (max err {np.max(np.abs(got - want)):.2e})")
    files = [f for _, _, fs in os.walk(os.path.join(state, "blobs")) for f in fs if f"-a{La.lease_id}-" in f]
    check(len(files) == 1, f"race: one delta file for the lease, the refused stream's removed ({files})")
    check(d[0].stop() == 0, "SIGTERM → exit 0")


if __name__ == "__main__":
    sys.exit(main())
