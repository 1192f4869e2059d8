#!/usr/bin/env python3
"""grpcio_client.py — python grpcio (an implementation independent of the gRPC C core the
coordinator uses) as an outside client of a real dipaco-coordinator: Health/Check answers
SERVING for the server and both services and NOT_FOUND for an unknown one,
dipaco.v1.Admin/ListJobs answers an empty list on a fresh state directory, CreateJob of a
shape-only spec gives a job that ListJobs and GetJob then report with the spec's numbers,
paging with after_job_id, state filtering, and NOT_FOUND for an unknown job; UploadInitialModel
refuses a size over 1 TiB or the state directory's free space at its first chunk, and takes one
of a 7B model's F32 weights (28 GiB) where the space is there. Message classes
are generated at test time with `protoc --python_out`. Admin calls carry the admin token
(STATE/admin.token of the coordinator started here; $DIPACO_ADMIN_TOKEN with --addr).

usage: grpcio_client.py <dipaco-coordinator binary> <proto dir>
       grpcio_client.py --addr HOST:PORT <proto dir>   (a server that is already running;
                                                        only the read-only checks)
Fails, naming it, when grpcio, protobuf or protoc is missing."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

MISSING = 1  # a missing tool fails the test (deploy/install_deps.sh --test installs them)
failures = 0


def check(cond, what, detail=""):
    global failures
    if cond:
        print(f"ok: {what}")
    else:
        failures += 1
        print(f"FAIL: {what}" + (f"\n  {detail}" if detail else ""))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    if len(sys.argv) != 3 and not (len(sys.argv) == 4 and sys.argv[1] == "--addr"):
        print(__doc__)
        return 2
    proto_dir = sys.argv[-1]
    try:
        import grpc
    except ImportError as e:
        print(f"FAIL: missing: python grpcio not importable ({e}); deploy/install_deps.sh --test installs Debian python3-grpcio")
        return MISSING
    protoc = shutil.which("protoc")
    if not protoc:
        print("FAIL: missing: protoc not found; deploy/install_deps.sh --test installs Debian protobuf-compiler")
        return MISSING
    tmp = tempfile.mkdtemp(prefix="dpc_grpcio_client_")
    proc = None
    try:
        gen = os.path.join(tmp, "gen")
        os.makedirs(gen)
        subprocess.run([protoc, f"--python_out={gen}", f"-I{proto_dir}",
                        os.path.join(proto_dir, "dipaco.proto"),
                        os.path.join(proto_dir, "health.proto")], check=True)
        sys.path.insert(0, gen)
        try:
            import dipaco_pb2
            import health_pb2
        except ImportError as e:
            print(f"FAIL: missing: python protobuf not importable ({e}); deploy/install_deps.sh --test installs Debian python3-protobuf")
            return MISSING
        if sys.argv[1] == "--addr":
            addr, fresh = sys.argv[2], False
        else:
            addr, fresh = f"127.0.0.1:{free_port()}", True
            state = os.path.join(tmp, "state")
            log = open(os.path.join(tmp, "coordinator.log"), "w")
            proc = subprocess.Popen([sys.argv[1], "--listen", addr, "--state-dir", state],
                                    stdout=log, stderr=subprocess.STDOUT)
        run(grpc, dipaco_pb2, health_pb2, addr, fresh, proc, None if not fresh else state)
        if proc:
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "hung"
            check(rc == 0, f"coordinator exits 0 on SIGTERM (got {rc})")
            proc = None
        if failures and sys.argv[1] != "--addr":
            with open(os.path.join(tmp, "coordinator.log")) as f:
                print("--- coordinator log (tail) ---\n" + "".join(f.readlines()[-40:]))
    finally:
        if proc:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


def run(grpc, pb, hpb, addr, fresh, proc, state):
    ch = grpc.insecure_channel(addr)
    ach = [ch]  # the channel for Admin calls, with the admin token once the server is up
    health = ch.unary_unary("/grpc.health.v1.Health/Check",
                            request_serializer=hpb.HealthCheckRequest.SerializeToString,
                            response_deserializer=hpb.HealthCheckResponse.FromString)

    def admin(name, req_cls, resp_cls):
        return ach[0].unary_unary(f"/dipaco.v1.Admin/{name}", request_serializer=req_cls.SerializeToString,
                              response_deserializer=resp_cls.FromString)

    # Wait for the server to come up (the coordinator opens its store first).
    deadline, last = time.time() + 30, None
    while time.time() < deadline:
        if proc and proc.poll() is not None:
            check(False, f"coordinator exited early with {proc.returncode}")
            return
        try:
            r = health(hpb.HealthCheckRequest(service=""), timeout=2)
            if r.status == hpb.HealthCheckResponse.SERVING:
                break
        except grpc.RpcError as e:
            last = e
        time.sleep(0.1)
    else:
        check(False, f"coordinator is SERVING within 30 s (last error {last})")
        return
    check(True, "Health '' is SERVING")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from security_md import TokenInterceptor, read_token
    token = read_token(os.path.join(state, "admin.token")) if state else os.environ.get("DIPACO_ADMIN_TOKEN", "")
    if token:
        ach[0] = grpc.intercept_channel(ch, TokenInterceptor("", token))
    for svc in ("dipaco.v1.Admin", "dipaco.v1.Coordinator"):
        try:
            r = health(hpb.HealthCheckRequest(service=svc), timeout=5)
            check(r.status == hpb.HealthCheckResponse.SERVING, f"Health {svc} is SERVING")
        except grpc.RpcError as e:
            check(False, f"Health {svc} is SERVING", f"{e.code()}: {e.details()}")
    try:
        health(hpb.HealthCheckRequest(service="dipaco.v1.Nope"), timeout=5)
        check(False, "Health of an unknown service must fail")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.NOT_FOUND, f"Health unknown service → NOT_FOUND ({e.code()})")

    list_jobs = admin("ListJobs", pb.ListJobsRequest, pb.ListJobsResponse)
    r = list_jobs(pb.ListJobsRequest(), timeout=10)
    if fresh:
        check(len(r.jobs) == 0, f"ListJobs on a fresh state dir is empty ({len(r.jobs)} jobs)")
    else:
        check(all(j.job_id > 0 and j.name for j in r.jobs), "ListJobs answers well-formed jobs")
    get_job = admin("GetJob", pb.JobRequest, pb.Job)
    try:
        get_job(pb.JobRequest(job_id=987654321), timeout=10)
        check(False, "GetJob of an unknown job must fail")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.NOT_FOUND and e.details(),
              f"GetJob unknown → NOT_FOUND with a message ({e.code()}: {e.details()})")
    if not fresh:
        return

    create = admin("CreateJob", pb.CreateJobRequest, pb.Job)
    spec = {"name": "grpcio-1", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16,
                                          "n_positions": 32, "vocab_size": 64, "seed": 3},
            "data": {"train": ["train/*.bin"]}, "algorithm": "diloco", "replicas": 2,
            "inner_steps": 3, "rounds": 4, "batch": 2, "seq_len": 8,
            "inner": {"lr": 0.001}, "outer": {"lr": 0.5, "momentum": 0.8}}
    ids = []
    for k in range(3):
        s = dict(spec, name=f"grpcio-{k + 1}")
        j = create(pb.CreateJobRequest(name=s["name"], spec_json=json.dumps(s),
                                       start_paused=(k == 2)), timeout=10)
        ids.append(j.summary.job_id)
        check(j.summary.job_id > 0 and j.summary.name == s["name"], f"CreateJob {k + 1} answers the job")
    check(len(set(ids)) == 3 and ids == sorted(ids), f"job ids are distinct and increasing ({ids})")
    r = list_jobs(pb.ListJobsRequest(), timeout=10)
    got = [j.job_id for j in r.jobs]
    check(got == ids, f"ListJobs lists the created jobs in id order ({got})")
    j = [x for x in r.jobs if x.job_id == ids[0]][0] if ids[0] in got else None
    check(j is not None and j.name == "grpcio-1" and j.algorithm == pb.ALGORITHM_SYNC and
          j.rounds_total == 4 and j.replicas == 2 and j.paths == 1 and
          j.state in (pb.JOB_PENDING, pb.JOB_RUNNING), "ListJobs summary carries the spec's numbers",
          str(j))
    r = list_jobs(pb.ListJobsRequest(after_job_id=ids[0], limit=1), timeout=10)
    check([x.job_id for x in r.jobs] == [ids[1]], "ListJobs paging: after_job_id + limit")
    r = list_jobs(pb.ListJobsRequest(state=pb.JOB_PAUSED), timeout=10)
    check([x.job_id for x in r.jobs] == [ids[2]], "ListJobs filters by state (start_paused job)")
    g = get_job(pb.JobRequest(job_id=ids[0]), timeout=10)
    stored = json.loads(g.spec_json) if g.spec_json else {}
    check(g.summary.job_id == ids[0] and stored.get("inner", {}).get("lr") == 0.001 and
          stored.get("outer", {}).get("momentum") == 0.8 and stored.get("rounds") == 4,
          "GetJob returns the stored spec", g.spec_json)
    try:
        create(pb.CreateJobRequest(name="bad", spec_json='{"name": "bad", "bogus": 1}'), timeout=10)
        check(False, "CreateJob of an invalid spec must fail")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT,
              f"CreateJob invalid spec → INVALID_ARGUMENT ({e.code()}: {e.details()})")

    # Creations run on the coordinator's threadpool, one at a time in arrival order: six at
    # once (two share a name) get distinct increasing ids and exactly one ALREADY_EXISTS, and
    # a caller that gives up at once (1 ms deadline) leaves the coordinator serving.
    quick = create.future(pb.CreateJobRequest(name="grpcio-quit", spec_json=json.dumps(dict(spec, name="grpcio-quit"))),
                          timeout=0.001)
    names = ["grpcio-c1", "grpcio-c2", "grpcio-dup", "grpcio-dup", "grpcio-c3", "grpcio-c4"]
    futs = [create.future(pb.CreateJobRequest(name=n, spec_json=json.dumps(dict(spec, name=n))), timeout=30)
            for n in names]
    got, dups = {}, 0
    for n, f in zip(names, futs):
        try:
            got.setdefault(n, []).append(f.result().summary.job_id)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.ALREADY_EXISTS and n == "grpcio-dup":
                dups += 1
            else:
                check(False, f"concurrent CreateJob {n}: {e.code()}: {e.details()}")
    cids = [i for v in got.values() for i in v]
    check(dups == 1 and len(cids) == 5 and len(set(cids)) == 5 and min(cids) > max(ids),
          f"concurrent CreateJob: distinct ids {sorted(cids)}, one duplicate name refused ({dups})")
    try:
        quick.result()
    except grpc.RpcError:
        pass
    r = health(hpb.HealthCheckRequest(service=""), timeout=5)
    check(r.status == hpb.HealthCheckResponse.SERVING, "serving after an abandoned CreateJob")
    if state:
        uploads(grpc, pb, ach[0], state)


def uploads(grpc, pb, ch, state):
    """An upload's size is judged by its first chunk: over 1 TiB, or over the free space of the
    state directory, it is refused at once, naming the bound; a model of F32 weights above 16 GiB
    (a 7B Llama) is not refused for its size; nothing is left behind."""
    upload = ch.stream_unary("/dipaco.v1.Admin/UploadInitialModel", request_serializer=pb.Chunk.SerializeToString,
                             response_deserializer=pb.UploadInitialModelResponse.FromString)

    def up(total):
        try:
            upload(iter([pb.Chunk(payload=pb.PAYLOAD_SAFETENSORS, offset=0, total=total, data=b"12345678")]),
                   timeout=10)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""

    X = grpc.StatusCode.RESOURCE_EXHAUSTED
    c, d = up((1 << 40) + 1)
    check(c == X and "1 TiB" in d, f"an upload over 1 TiB is refused at its first chunk ({c}: {d})")
    sv = os.statvfs(state)
    free = sv.f_bavail * sv.f_frsize
    big = free + (1 << 30)
    c, d = up(big)
    want = "does not fit" if big <= 1 << 40 else "1 TiB"
    check(c == X and want in d, f"an upload of {big} bytes, {free} free: refused, \"{want}\" ({c}: {d})")
    seven_b = 28 << 30  # F32 weights of a 7B model
    c, d = up(seven_b)
    if free > seven_b + (1 << 30):
        check(c == grpc.StatusCode.INVALID_ARGUMENT and "ended before its last chunk" in d,
              f"an upload of 28 GiB is taken (the stream here ends early: {c}: {d})")
    else:
        check(c == X and "does not fit" in d, f"an upload of 28 GiB with {free} bytes free: refused ({c}: {d})")
    left = os.listdir(os.path.join(state, "uploads")) if os.path.isdir(os.path.join(state, "uploads")) else []
    check(left == [], f"no upload file left behind ({left})")


if __name__ == "__main__":
    sys.exit(main())
