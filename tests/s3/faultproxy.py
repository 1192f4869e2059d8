#!/usr/bin/env python3
"""faultproxy.py PORT UPSTREAM SPEC LOG — an HTTP proxy in front of the test RADOS Gateway that
injects the faults an S3 store shows in the wild, for tests/s3/faults_s3.sh. It forwards every
request unchanged (the Host header too, so SigV4 signatures, header and query, stay valid) to
UPSTREAM (host:port) and relays the answer, except where SPEC says otherwise. SPEC is a
comma-separated list of KIND:N, each applied to every Nth request it counts:

  503:N      answer 503 SlowDown without forwarding (counts every request)
  429:N      answer 429 Too Many Requests without forwarding (counts every request)
  drop:N     read the request, then close the connection without an answer (every request)
  late500:N  forward a PUT, then answer 500 although the gateway stored it (counts PUTs)
  nopartcopy:N  answer 501 NotImplemented to an UploadPartCopy (a PUT with
             x-amz-copy-source-range), as a store without it does (counts those requests)

One line per injected fault goes to LOG ("KIND METHOD PATH"). Nothing here is a mock: every
request that is answered successfully was answered by the real gateway."""
import http.client
import http.server
import sys
import threading

PORT, UPSTREAM, SPEC, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
RULES = [(k, int(n)) for k, n in (r.split(":") for r in SPEC.split(",") if r)]
lock = threading.Lock()
counts = {"all": 0, "put": 0, "partcopy": 0}
HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade", "trailer"}


def decide(method, headers):
    """The fault for this request, or None."""
    partcopy = method == "PUT" and headers.get("x-amz-copy-source-range") is not None
    with lock:
        counts["all"] += 1
        if method == "PUT":
            counts["put"] += 1
        if partcopy:
            counts["partcopy"] += 1
        a, p, pc = counts["all"], counts["put"], counts["partcopy"]
    for kind, n in RULES:
        if kind == "nopartcopy" and partcopy and pc % n == 0:
            return kind
        if kind in ("503", "429", "drop") and a % n == 0:
            return kind
        if kind == "late500" and method == "PUT" and p % n == 0:
            return kind
    return None


def note(kind, method, path):
    with lock, open(LOG, "a") as f:
        f.write(f"{kind} {method} {path.split('?')[0]}\n")


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def error_answer(self, status, code):
        body = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code></Error>'.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def forward(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        fault = decide(self.command, self.headers)
        if fault == "nopartcopy":
            note(fault, self.command, self.path)
            self.error_answer(501, "NotImplemented")
            return
        if fault in ("503", "429", "drop"):
            note(fault, self.command, self.path)
            if fault == "drop":
                self.close_connection = True
                return
            self.error_answer(int(fault), "SlowDown" if fault == "503" else "TooManyRequests")
            return
        host, port = UPSTREAM.rsplit(":", 1)
        up = http.client.HTTPConnection(host, int(port), timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        try:
            up.request(self.command, self.path, body=body, headers=headers)
            r = up.getresponse()
            data = r.read()
        except OSError:
            self.close_connection = True
            return
        finally:
            up.close()
        if fault == "late500":
            note(fault, self.command, self.path)
            self.error_answer(500, "InternalError")
            return
        self.send_response(r.status, r.reason)
        for k, v in r.getheaders():
            if k.lower() not in HOP and k.lower() != "content-length":
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data) if self.command != "HEAD" else r.getheader("Content-Length")
                                               or 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward


if __name__ == "__main__":
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Proxy)
    srv.daemon_threads = True
    srv.serve_forever()
