"""daemon_kit.py — what the python daemon tests (coord_daemon.py, delta_screen.py) share: the
ok/FAIL check counter, a free loopback port, an independent CRC-32C, and dipaco-coordinator as
a child process (plain listen address and metrics port, 30 s lease TTL, 200 ms heartbeats)."""
import signal
import socket
import subprocess

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
    """dipaco-coordinator on fresh loopback ports, logging (appending) to `log`."""

    def __init__(self, binary, state, log):
        self.port = free_port()
        self.mport = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.logf = open(log, "a")
        self.proc = subprocess.Popen(
            [binary, "--listen", self.addr, "--state-dir", state, "--metrics-listen",
             f"127.0.0.1:{self.mport}", "--lease-ttl-ms", "30000", "--heartbeat-ms", "200"],
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
