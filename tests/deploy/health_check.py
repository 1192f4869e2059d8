#!/usr/bin/env python3
"""health_check.py TARGET [SERVICE] — what a Kubernetes gRPC probe does: one
grpc.health.v1.Health/Check call to TARGET (HOST:PORT or unix:PATH) without credentials.
Prints the status (SERVING, NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN) and exits 0 only for
SERVING; 1 for another status, 2 when the call fails. The messages are encoded by hand
(HealthCheckRequest{service = 1}, HealthCheckResponse{status = 1}), so only grpcio is needed."""
import sys

import grpc

STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_request(service: str) -> bytes:
    raw = service.encode()
    if not raw:
        return b""
    if len(raw) > 127:
        raise ValueError("service name too long for this probe")
    return b"\x0a" + bytes([len(raw)]) + raw


def decode_status(msg: bytes) -> int:
    if msg == b"":
        return 0  # proto3 default
    if len(msg) >= 2 and msg[0] == 0x08 and msg[1] < 0x80:
        return msg[1]
    raise ValueError(f"unexpected HealthCheckResponse bytes {msg!r}")


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    target, service = sys.argv[1], (sys.argv[2] if len(sys.argv) == 3 else "")
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary("/grpc.health.v1.Health/Check",
                              request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            resp = call(encode_request(service), timeout=5)
        except grpc.RpcError as e:
            print(f"{target}: Health/Check failed: {e.code().name}: {e.details()}")
            return 2
    st = decode_status(resp)
    print(STATUS.get(st, f"status {st}"))
    return 0 if st == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
