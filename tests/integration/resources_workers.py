#!/usr/bin/env python3
"""resources_workers.py — no unbounded growth with many workers, against a real
dipaco-coordinator over python grpcio, and dipacoctl:

 - 5000 workers registered through Register: ListWorkers answers in pages (500 by default,
   never more than 1000, a next_page_token until the last page, INVALID_ARGUMENT for a token
   the server never gave), and `dipacoctl workers --all` and `dipacoctl status` follow the
   pages and count every worker;
 - Register with a worker's previous identity (previous_worker_id + previous_session), as a
   worker does after a restart or a lost connection, adds no row;
 - --worker-retention-s shorter than the gone-worker time is refused at start;
 - restarted with an 8 s retention, the silent workers are deleted (a Heartbeat from one then
   answers COMMAND_REREGISTER), the one that keeps calling stays.

usage: resources_workers.py <dipaco-coordinator> <dipacoctl> <proto dir>"""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_kit import Daemon, check, grpc_stubs, run_grpc_test, status_of  # noqa: E402

N = 5000


def ctl(ctl_bin, addr, state, *args):
    env = dict(os.environ, DIPACO_ADMIN_TOKEN=open(os.path.join(state, "admin.token")).read().strip())
    return subprocess.run([ctl_bin, "--coordinator", addr, *args], env=env, capture_output=True, text=True,
                          timeout=120)


def count_workers(u, pb):
    n, token, pages = 0, "", 0
    while True:
        r = u["ListWorkers"](pb.ListWorkersRequest(include_gone=True, page_size=1000, page_token=token), timeout=30)
        n += len(r.workers)
        pages += 1
        if not r.next_page_token or pages > 100:
            return n
        token = r.next_page_token


def body(coord_bin, ctl_bin):
    def run(grpc, np, pb, d, state, log):
        u = grpc_stubs(grpc, pb, d[0].addr, state)
        t0 = time.time()
        futs, ids = [], []
        for i in range(N):
            futs.append(u["Register"].future(pb.RegisterRequest(hostname=f"h{i}", backend="cpu", device="x"),
                                             timeout=60))
            if len(futs) == 64 or i == N - 1:
                ids += [f.result() for f in futs]
                futs = []
        print(f"registered {N} workers in {time.time() - t0:.1f} s")
        check(len({r.worker_id for r in ids}) == N, f"{N} distinct worker ids")

        # Pages: default size, the server's cap, tokens.
        r = u["ListWorkers"](pb.ListWorkersRequest(include_gone=True), timeout=30)
        check(len(r.workers) == 500 and r.next_page_token != "", "page_size 0: 500 workers and a next_page_token")
        r = u["ListWorkers"](pb.ListWorkersRequest(include_gone=True, page_size=100000), timeout=30)
        check(len(r.workers) == 1000, f"page_size 100000 is capped at 1000 (got {len(r.workers)})")
        seen = []
        token = ""
        while True:
            r = u["ListWorkers"](pb.ListWorkersRequest(include_gone=True, page_size=700, page_token=token),
                                 timeout=30)
            seen += [w.worker_id for w in r.workers]
            if not r.next_page_token:
                break
            token = r.next_page_token
        check(sorted(seen) == sorted(x.worker_id for x in ids) and seen == sorted(seen),
              "following next_page_token lists every worker once, in id order")
        code, _ = status_of(grpc, u["ListWorkers"], pb.ListWorkersRequest(page_token="x1"), timeout=30)
        check(code == grpc.StatusCode.INVALID_ARGUMENT, f"a foreign page_token: INVALID_ARGUMENT ({code})")

        # dipacoctl follows the pages.
        p = ctl(ctl_bin, d[0].addr, state, "workers", "--all")
        lines = [ln for ln in p.stdout.splitlines()[1:] if ln.strip()]
        check(p.returncode == 0 and len(lines) == N, f"dipacoctl workers --all lists {N} workers "
              f"(rc {p.returncode}, {len(lines)} lines) {p.stderr.strip()[:200]}")
        p = ctl(ctl_bin, d[0].addr, state, "status", "--json")
        try:
            total = json.loads(p.stdout)["workers"]["total"]
        except Exception:
            total = None
        check(p.returncode == 0 and total == N, f"dipacoctl status counts {N} workers (got {total}, rc {p.returncode}) "
              f"{p.stderr.strip()[:200]}")

        # The same identity registering again adds no row.
        w = ids[0]
        for _ in range(50):
            again = u["Register"](pb.RegisterRequest(hostname="h0", backend="cpu", device="x",
                                                     previous_worker_id=w.worker_id,
                                                     previous_session=w.session_token), timeout=30)
        check(again.worker_id == w.worker_id, "Register with the previous identity keeps the worker id")
        check(count_workers(u, pb) == N, "50 Register calls with the previous identity add no row")

        # Retention shorter than the time a silent worker needs to be gone: refused.
        p = subprocess.run([coord_bin, "--listen", "127.0.0.1:0", "--state-dir", state + "-x",
                            "--worker-retention-s", "5"], capture_output=True, text=True, timeout=30)
        check(p.returncode == 2 and "--worker-retention-s 5" in p.stderr,
              f"--worker-retention-s 5 with a 15 s lease TTL is refused (rc {p.returncode}: {p.stderr.strip()[:200]})")

        # An 8 s retention: silent workers go, the one that keeps calling stays.
        check(d[0].stop() == 0, "coordinator stopped")
        d[0] = Daemon(coord_bin, state, log,
                      args=("--lease-ttl-ms", "1000", "--heartbeat-ms", "200", "--worker-retention-s", "8"))
        u = grpc_stubs(grpc, pb, d[0].addr, state)
        keep = ids[1]
        md_keep = [("dipaco-worker-id", str(keep.worker_id)), ("dipaco-session", keep.session_token)]
        # The calling worker heartbeats from its own thread, as a worker does, whatever the
        # listing below costs on a loaded machine.
        stop, rereg = threading.Event(), []

        def beat():
            while not stop.is_set():
                try:
                    r = u["Heartbeat"](pb.HeartbeatRequest(), metadata=md_keep, timeout=10)
                    if r.command == pb.COMMAND_REREGISTER:
                        rereg.append(time.time())
                except grpc.RpcError:
                    pass
                stop.wait(0.2)
        t = threading.Thread(target=beat, daemon=True)
        t.start()
        deadline = time.time() + 90
        n = N
        while time.time() < deadline:
            n = count_workers(u, pb)
            if n == 1:
                break
            time.sleep(0.5)
        stop.set()
        t.join()
        check(not rereg, "the calling worker was never told to register again")
        check(n == 1, f"with an 8 s retention the {N - 1} silent workers are deleted, the calling one stays (left {n})")
        gone = ids[2]
        hb = u["Heartbeat"](pb.HeartbeatRequest(), metadata=[("dipaco-worker-id", str(gone.worker_id)),
                                                             ("dipaco-session", gone.session_token)], timeout=10)
        check(hb.command == pb.COMMAND_REREGISTER, "a deleted worker's Heartbeat answers COMMAND_REREGISTER")
        p = ctl(ctl_bin, d[0].addr, state, "status", "--json")
        check(p.returncode == 0 and json.loads(p.stdout)["workers"]["total"] == 1, "dipacoctl status counts 1 worker")
        check(d[0].proc.poll() is None, "the coordinator is still up")
    return run


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    coord_bin, ctl_bin, proto = sys.argv[1:]
    return run_grpc_test(coord_bin, proto, "dpc_res_workers_", body(coord_bin, ctl_bin))


if __name__ == "__main__":
    sys.exit(main())
