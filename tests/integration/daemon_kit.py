"""daemon_kit.py — what the python daemon tests (coord_daemon.py, delta_screen.py,
codec_push.py) share: the ok/FAIL check counter, a free loopback port, an independent CRC-32C,
dipaco-coordinator as a child process (plain listen address and metrics port, 30 s lease TTL,
200 ms heartbeats), and the grpcio harness around one test body (failing, naming what is
missing, without grpcio, numpy or protoc; the generated dipaco_pb2; one stub per RPC of both services; status codes)."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

MISSING = 1  # a missing tool fails the test (deploy/install_deps.sh --test installs them)

_fails = 0


def check(cond, what):
    """Print ok/FAIL for one assertion and count the failures (see failures())."""
    global _fails
    if cond:
        print(f"ok: {what}")
    else:
        _fails += 1
        print(f"FAIL: {what}")


def failures():
    return _fails


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def crc32c(b):
    """Bitwise CRC-32C (Castagnoli), table-driven, independent of the C implementation."""
    if not hasattr(crc32c, "table"):
        t = []
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            t.append(c)
        crc32c.table = t
    t = crc32c.table
    c = 0xFFFFFFFF
    for x in b:
        c = t[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


class Daemon:
    """dipaco-coordinator on fresh loopback ports, logging (appending) to `log`; `args` are its
    other flags (default: 30 s lease TTL, 200 ms heartbeats, and a lease revoked only after
    150 missed heartbeats, i.e. at the TTL too: these protocol tests hold leases without
    heartbeating between their calls)."""

    def __init__(self, binary, state, log,
                 args=("--lease-ttl-ms", "30000", "--heartbeat-ms", "200", "--dead-after-heartbeats", "150")):
        self.port = free_port()
        self.mport = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.logf = open(log, "a")
        self.proc = subprocess.Popen(
            [binary, "--listen", self.addr, "--state-dir", state, "--metrics-listen",
             f"127.0.0.1:{self.mport}", *args],
            stdout=self.logf, stderr=self.logf)

    def stop(self, sig=signal.SIGTERM, timeout=30):
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.logf.close()
        return rc


def run_grpc_test(coord_bin, proto_dir, prefix, body, log_tail=40, args=None):
    """Start a coordinator in a fresh directory (with flags args, default Daemon's) and run
    body(grpc, np, pb, d, state, log) with d = [Daemon] (a body may replace d[0] to restart it);
    0 when every check passed, 1 with the coordinator log's tail otherwise and, with the reason
    printed, without the tools."""
    try:
        import grpc
        import numpy as np
    except ImportError as e:
        print(f"FAIL: missing: needs python grpcio and numpy ({e})")
        return MISSING
    protoc = shutil.which("protoc")
    if not protoc:
        print("FAIL: missing: protoc not found; deploy/install_deps.sh --test installs Debian protobuf-compiler")
        return MISSING
    tmp = tempfile.mkdtemp(prefix=prefix)
    d = None
    log = os.path.join(tmp, "coordinator.log")
    try:
        subprocess.run([protoc, f"--python_out={tmp}", f"-I{proto_dir}", os.path.join(proto_dir, "dipaco.proto")],
                       check=True)
        sys.path.insert(0, tmp)
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
        import dipaco_pb2 as pb
        state = os.path.join(tmp, "state")
        d = [Daemon(coord_bin, state, log, *([args] if args else []))]
        try:
            body(grpc, np, pb, d, state, log)
        except Exception:
            import traceback
            traceback.print_exc()
            check(False, "the test ran to the end")
        if failures():
            print("---- coordinator log (tail) ----")
            with open(log) as f:
                print("".join(f.readlines()[-log_tail:]))
        return 1 if failures() else 0
    finally:
        if d and d[0].proc.poll() is None:
            d[0].proc.kill()
            d[0].proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def grpc_stubs(grpc, pb, addr, state):
    """A channel to addr with the state directory's tokens, and a callable per RPC name of the
    Coordinator and Admin services."""
    from security_md import with_tokens
    ch = grpc.insecure_channel(addr)
    grpc.channel_ready_future(ch).result(timeout=20)
    ch = with_tokens(ch, state)
    u = {}
    S = pb.DESCRIPTOR.services_by_name
    for svc in ("Coordinator", "Admin"):
        for m in S[svc].methods:
            req, resp = getattr(pb, m.input_type.name), getattr(pb, m.output_type.name)
            mk = {(False, False): ch.unary_unary, (False, True): ch.unary_stream,
                  (True, False): ch.stream_unary}[(m.client_streaming, m.server_streaming)]
            u[m.name] = mk(f"/dipaco.v1.{svc}/{m.name}", request_serializer=req.SerializeToString,
                           response_deserializer=resp.FromString)
    return u


def status_of(grpc, fn, *a, **kw):
    """(StatusCode.OK, reply) or (the error's code, its details)."""
    try:
        return grpc.StatusCode.OK, fn(*a, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details()


class PushKit:
    """What the PushDelta tests (codec_push.py, sparse_push.py) do to one coordinator through the
    stubs X: cut a fragment's stream into chunks, push them, read the ack, follow a job's version,
    its received bytes, and a lease's delta files under STATE/blobs."""

    def __init__(self, grpc, pb, X, state):
        self.grpc, self.pb, self.X, self.state = grpc, pb, X, state

    def chunks(self, L, data, codec, num_floats, block=0, total=None, crc=None, step=100, inner_steps=2,
               tokens=16):
        """The chunks of lease L's fragment-1 stream `data` (header fields overridable)."""
        total = len(data) if total is None else total
        crc = crc32c(data) if crc is None else crc
        cuts = list(range(0, len(data), step)) + [len(data)]
        return [self.pb.Chunk(lease_id=L.lease_id, fragment_id=1, version=L.fragments[0].version, offset=a,
                              total=total, codec=codec, crc32c=crc if e == len(data) else 0, num_floats=num_floats,
                              block_floats=block, inner_steps=inner_steps, tokens=tokens,
                              payload=self.pb.PAYLOAD_DELTA, data=data[a:e]) for a, e in zip(cuts[:-1], cuts[1:])]

    def push(self, md, cs):
        return status_of(self.grpc, self.X["PushDelta"], iter(cs), metadata=md, timeout=30)

    def result(self, res):
        """The single ack's PushResult, or (code, reply/details) when there is none."""
        c, r = res
        return r.acks[0].result if c == self.grpc.StatusCode.OK and len(r.acks) == 1 else (c, r)

    def version(self, job):
        return self.X["ListModules"](self.pb.ListModulesRequest(job_id=job), timeout=10).modules[0].fragments[0].version

    def wait_version(self, job, v, timeout=30):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.version(job) >= v:
                return True
            time.sleep(0.05)
        return False

    def lease_files(self, L):
        return [f for _, _, fs in os.walk(os.path.join(self.state, "blobs")) for f in fs if f"-a{L.lease_id}-" in f]
