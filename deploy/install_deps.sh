#!/usr/bin/env bash
# deploy/install_deps.sh [--test] — installs, with apt-get, the Debian packages dipaco needs to
# build and run (and, with --test, the ones its tests use: PyTorch and grpcio as oracles, npm
# for the packaged assets, clang with its libFuzzer/sanitizer runtimes for tests/fuzz) when any
# is missing. Uses sudo when not root.
set -euo pipefail
PKGS="build-essential cmake pkg-config libgrpc-dev protobuf-c-compiler libprotobuf-c-dev \
protobuf-compiler libuv1-dev libsqlite3-dev libopenblas-dev libcjson-dev libpcre2-dev \
libsystemd-dev python3"
[ "${1:-}" = "--test" ] && PKGS="$PKGS python3-torch python3-numpy python3-grpcio python3-protobuf clang libclang-rt-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# npm may come from Node's own installer rather than Debian: any npm on PATH will do.
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -z "$missing" ] && exit 0
echo "install_deps: installing:$missing" >&2
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >&2
