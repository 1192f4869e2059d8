#!/usr/bin/env python3
"""resources_conn.py — connection exhaustion, against a real
dipaco-coordinator and dipacoctl:

 - under an open-file limit of 64, idle TCP connections exhaust the coordinator's
   descriptors (gRPC's listener then stops accepting for good); once they are closed, a new
   client (dipacoctl status) is served again within a few seconds: the listener self-check
   sees that new connections hang and exits with status 70, and the service manager (played
   here by a restart loop, like systemd's Restart=on-failure) starts it again;
 - a connection that sends only the HTTP/2 preface is closed after --handshake-timeout-ms;
 - a connection that completes the HTTP/2 handshake and then stays idle is closed after
   --idle-timeout-ms.

usage: resources_conn.py <dipaco-coordinator> <dipacoctl>"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon_kit import check, failures, free_port  # noqa: E402

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def status(ctl_bin, addr, timeout_ms=2000):
    env = dict(os.environ, DIPACO_CTL_TIMEOUT_MS=str(timeout_ms))
    try:
        return subprocess.run([ctl_bin, "--coordinator", addr, "status"], env=env, capture_output=True, text=True,
                              timeout=30).returncode
    except subprocess.TimeoutExpired:
        return -1


def wait_status(ctl_bin, addr, seconds):
    t0 = time.time()
    while time.time() - t0 < seconds:
        if status(ctl_bin, addr) == 0:
            return time.time() - t0
        time.sleep(0.2)
    return None


def closed_within(sock, seconds):
    """Seconds until the server closed sock (EOF or reset), reading whatever it sends; None
    if it stayed open."""
    sock.settimeout(0.2)
    t0 = time.time()
    while time.time() - t0 < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.time() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.time() - t0
    return None


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    coord_bin, ctl_bin = sys.argv[1:]
    tmp = tempfile.mkdtemp(prefix="dpc_res_conn_")
    port = free_port()
    addr = f"127.0.0.1:{port}"
    log = os.path.join(tmp, "coordinator.log")
    restarts = os.path.join(tmp, "restarts")
    # The restart loop stands in for systemd (Restart=on-failure); the limit is the
    # coordinator's own (ulimit in the shell that runs it).
    sup = subprocess.Popen(
        ["bash", "-c", 'ulimit -n 64; while :; do "$0" --listen "$1" --state-dir "$2" --insecure-no-auth '
         '--self-check-ms 500 --handshake-timeout-ms 1000 --idle-timeout-ms 2000 >>"$3" 2>&1; rc=$?; '
         '[ $rc -eq 0 ] && exit 0; echo "$rc" >>"$4"; sleep 0.2; done',
         coord_bin, addr, os.path.join(tmp, "state"), log, restarts], start_new_session=True)
    try:
        check(wait_status(ctl_bin, addr, 60) is not None, "the coordinator serves dipacoctl status")

        # Exhaust the descriptors with idle connections, then close them.
        conns = []
        for _ in range(200):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
                conns.append(s)
            except OSError:
                break
        time.sleep(1.5)
        for s in conns:
            s.close()
        print(f"opened and closed {len(conns)} idle connections")
        t = wait_status(ctl_bin, addr, 20)
        check(t is not None, f"after the connections closed, a new client is served again "
              f"({'%.1f s' % t if t is not None else 'not within 20 s'})")
        n_restart = len(open(restarts).read().split()) if os.path.exists(restarts) else 0
        print(f"coordinator restarts: {n_restart}")
        if n_restart:
            codes = open(restarts).read().split()
            check(all(c == "70" for c in codes), f"each restart followed the self-check's exit status 70 ({codes})")

        # Only the preface: closed after the handshake timeout (1 s here, 10 s by default).
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(PREFACE)
        t = closed_within(s, 8)
        s.close()
        check(t is not None, f"a connection that sends only the HTTP/2 preface is closed "
              f"({'%.1f s' % t if t is not None else 'still open after 8 s'})")

        # A completed HTTP/2 handshake, then nothing: closed after the idle timeout (2 s).
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        s.sendall(PREFACE + SETTINGS)
        t = closed_within(s, 10)
        s.close()
        check(t is not None, f"an idle HTTP/2 connection is closed ({'%.1f s' % t if t is not None else 'still open after 10 s'})")
        check(status(ctl_bin, addr) == 0, "the coordinator still serves")
    finally:
        try:
            os.killpg(sup.pid, 15)
        except ProcessLookupError:
            pass
        try:
            sup.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(sup.pid, 9)
            sup.wait()
        if failures():
            print("---- coordinator log (tail) ----")
            with open(log) as f:
                print("".join(f.readlines()[-30:]))
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures() else 0


if __name__ == "__main__":
    sys.exit(main())
