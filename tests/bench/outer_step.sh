#!/bin/sh
# outer_step.sh — Release build of the outer-optimizer benchmark, then one run: the Nesterov
# update's bytes/s over MiB of parameters (default 256) against memcpy of the same bytes.
#   tests/bench/outer_step.sh [MiB] [repetitions]      (BUILD=dir to choose the build dir)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench-outer}
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDIPACO_SANITIZE=OFF >/dev/null
cmake --build "$BUILD" --target outer_bench -j"$(nproc)" >/dev/null
exec "$BUILD/tests/outer_bench" "${1:-256}" "${2:-5}"
