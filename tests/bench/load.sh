#!/bin/sh
# load.sh — build (Release, own build dir) and run the load test: N (default 1000) simulated
# workers speaking the real protocol against one coordinator on 127.0.0.1 (see
# tests/load/run_load.sh and tests/load/dipaco_loadgen.c). Prints heartbeat latency p50/p99,
# deltas/s and wall time; exits non-zero if any delta was lost or doubled.
# usage: tests/bench/load.sh [N=1000] [ROUNDS=3] [THREADS=16]
# env: BUILD_DIR (default build-load)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-load}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDIPACO_SANITIZE=OFF >/dev/null
cmake --build "$build" --target dipaco-coordinator dipacoctl dipaco_loadgen -j"$(nproc)" >/dev/null
exec bash "$root/tests/load/run_load.sh" "$build/coordinator/dipaco-coordinator" "$build/coordinator/dipacoctl" \
  "$build/tests/dipaco_loadgen" "${1:-1000}" "${2:-3}" "${3:-16}"
