#!/bin/sh
# transfer.sh — build (Release, own build dir) and run the loopback transfer benchmark: a
# fragment pulled over gRPC (server-streaming chunks, CRC-32C checked) and pushed back
# (client-streaming), against a raw TCP copy of the same bytes in the same run.
# usage: tests/bench/transfer.sh [MiB=256] [runs=3] [nomallopt]
# env: BUILD_DIR (default build-bench-transfer)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-bench-transfer}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDIPACO_SANITIZE=OFF >/dev/null
cmake --build "$build" --target transfer_bench -j"$(nproc)" >/dev/null
exec "$build/tests/transfer_bench" "${1:-256}" "${2:-3}" ${3:+"$3"}
