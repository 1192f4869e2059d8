#!/usr/bin/env python3
"""rpc_grpcio.py — python grpcio (an independent gRPC implementation's client) against the C
call layer: Health/Check says SERVING, an unknown service fails with NOT_FOUND (per the
health-checking spec), an unknown method with UNIMPLEMENTED, and dipaco.v1.Admin/ListJobs
round-trips with message classes generated at test time by `protoc --python_out`.

usage: rpc_grpcio.py <test_rpc_pyserver binary> <proto dir>
Fails, naming it, when grpcio, protobuf or protoc is missing."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile

MISSING = 1  # a missing tool fails the test (deploy/install_deps.sh --test installs them)


def main():
    server_bin, proto_dir = sys.argv[1], sys.argv[2]
    try:
        import grpc
    except ImportError as e:
        print(f"FAIL: missing: python grpcio not importable ({e}); deploy/install_deps.sh --test installs Debian python3-grpcio")
        return MISSING
    protoc = shutil.which("protoc")
    if not protoc:
        print("FAIL: missing: protoc not found; deploy/install_deps.sh --test installs Debian protobuf-compiler")
        return MISSING
    tmp = tempfile.mkdtemp(prefix="dpc_rpc_py_")
    try:
        subprocess.run([protoc, f"--python_out={tmp}", f"-I{proto_dir}",
                        os.path.join(proto_dir, "dipaco.proto"),
                        os.path.join(proto_dir, "health.proto")], check=True)
        sys.path.insert(0, tmp)
        try:
            import dipaco_pb2
            import health_pb2
        except ImportError as e:
            print(f"FAIL: missing: python protobuf not importable ({e}); deploy/install_deps.sh --test installs Debian python3-protobuf")
            return MISSING
        return run(grpc, dipaco_pb2, health_pb2, server_bin)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(grpc, dipaco_pb2, health_pb2, server_bin):
    proc = subprocess.Popen([server_bin], stdout=subprocess.PIPE, text=True)
    failures = 0

    def check(cond, what):
        nonlocal failures
        if not cond:
            failures += 1
            print(f"FAIL: {what}")
        else:
            print(f"ok: {what}")

    try:
        line = proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            print(f"FAIL: server did not report its port: {line}")
            return 1
        port = int(line[1])
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(ch).result(timeout=10)

        check_rpc = ch.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        r = check_rpc(health_pb2.HealthCheckRequest(service=""), timeout=5)
        check(r.status == health_pb2.HealthCheckResponse.SERVING, "Health '' is SERVING")
        r = check_rpc(health_pb2.HealthCheckRequest(service="dipaco.v1.Admin"), timeout=5)
        check(r.status == health_pb2.HealthCheckResponse.SERVING,
              "Health dipaco.v1.Admin is SERVING")
        try:
            check_rpc(health_pb2.HealthCheckRequest(service="dipaco.v1.Nope"), timeout=5)
            check(False, "unknown service must fail")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.NOT_FOUND,
                  f"unknown service -> NOT_FOUND (got {e.code()})")

        list_jobs = ch.unary_unary(
            "/dipaco.v1.Admin/ListJobs",
            request_serializer=dipaco_pb2.ListJobsRequest.SerializeToString,
            response_deserializer=dipaco_pb2.ListJobsResponse.FromString)
        md = [("authorization", "Bearer t0ken")]
        r = list_jobs(dipaco_pb2.ListJobsRequest(limit=3, after_job_id=100), timeout=5,
                      metadata=md)
        check([j.job_id for j in r.jobs] == [101, 102, 103], f"ListJobs ids {[j.job_id for j in r.jobs]}")
        check([j.name for j in r.jobs] == ["job-101", "job-102", "job-103"], "ListJobs names")
        check(all(j.state == dipaco_pb2.JOB_RUNNING for j in r.jobs), "ListJobs state")
        check(all(abs(j.last_loss - 2.5) < 1e-6 for j in r.jobs), "ListJobs float field")
        r = list_jobs(dipaco_pb2.ListJobsRequest(limit=0), timeout=5, metadata=md)
        check(len(r.jobs) == 0, "ListJobs empty reply")
        try:
            list_jobs(dipaco_pb2.ListJobsRequest(limit=99), timeout=5, metadata=md)
            check(False, "limit 99 must fail")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "exceeds 16" in e.details(),
                  f"validation error carries code and message ({e.code()}: {e.details()})")
        try:
            list_jobs(dipaco_pb2.ListJobsRequest(limit=1), timeout=5)
            check(False, "missing token must fail")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.PERMISSION_DENIED, "missing admin token")
        get_job = ch.unary_unary(
            "/dipaco.v1.Admin/GetJob",
            request_serializer=dipaco_pb2.JobRequest.SerializeToString,
            response_deserializer=dipaco_pb2.Job.FromString)
        try:
            get_job(dipaco_pb2.JobRequest(job_id=1), timeout=5)
            check(False, "unserved method must fail")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNIMPLEMENTED, "unknown method -> UNIMPLEMENTED")
        ch.close()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
        check(rc == 0, f"server exits 0 after SIGTERM (got {rc})")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
