"""security_md.py — helper for python grpcio tests of a real dipaco-coordinator: wraps a channel
so that every call carries the cluster token it needs, as an outside client would send it:
"authorization: Bearer <admin token>" on dipaco.v1.Admin calls and "Bearer <join token>" on
Coordinator/Register (tokens read from the coordinator's STATE/admin.token and
STATE/join.token). A call that already passes its own "authorization" metadata keeps it
(tests of wrong tokens)."""
import collections
import os

import grpc

_Details = collections.namedtuple(
    "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"))


def read_token(path):
    with open(path) as f:
        return f.read().strip()


class TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                       grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, join_token, admin_token):
        self.join, self.admin = join_token, admin_token

    def _add(self, d):
        if d.method.startswith("/dipaco.v1.Admin/"):
            tok = self.admin
        elif d.method == "/dipaco.v1.Coordinator/Register":
            tok = self.join
        else:
            tok = None
        md = list(d.metadata or [])
        if tok is None or any(k == "authorization" for k, _ in md):
            return d
        md.append(("authorization", "Bearer " + tok))
        return _Details(d.method, d.timeout, md, d.credentials, d.wait_for_ready, d.compression)

    def intercept_unary_unary(self, cont, d, req):
        return cont(self._add(d), req)

    def intercept_unary_stream(self, cont, d, req):
        return cont(self._add(d), req)

    def intercept_stream_unary(self, cont, d, it):
        return cont(self._add(d), it)

    def intercept_stream_stream(self, cont, d, it):
        return cont(self._add(d), it)


def with_tokens(channel, state_dir):
    """The channel with the tokens of the coordinator whose state directory is state_dir."""
    join = read_token(os.path.join(state_dir, "join.token"))
    admin = read_token(os.path.join(state_dir, "admin.token"))
    return grpc.intercept_channel(channel, TokenInterceptor(join, admin))
