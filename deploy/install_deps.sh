#!/usr/bin/env bash
# deploy/install_deps.sh [--test | --bench] — installs, with apt-get, the Debian packages dipaco needs to
# build and run when any is missing. Uses sudo when not root.
# --test adds everything the tests use (tests/run.sh runs it; no test installs anything, and a
# test whose tool is missing fails naming it — docs/testing.md):
#   oracles: python3-torch, numpy, grpcio, protobuf, yaml, pil; npm (the tokenizer oracle and
#            deploy/fetch_assets.sh);
#   fuzzers: clang with its libFuzzer/sanitizer runtimes (libclang-rt-dev);
#   build checks and security tests: binutils (objdump), openssl, procps, util-linux;
#   ops tests: prometheus (promtool), chromium, tesseract-ocr, bsdutils (script);
#   deploy tests: slurm-wlm and munge, systemd, Debian's kubectl (kubernetes-client; when another
#            package owns /usr/bin/kubectl, Debian's is unpacked into tests/.cache/kubernetes-client
#            instead) and the npm packages kubernetes-models 5.1.0 + js-yaml 4.1.0 in
#            tests/.cache/k8s-models for the offline schema check.
# --bench adds, on top of --test, what the benchmarks under tests/bench use: the King James
# text (bible-kjv) for the DiPaCo study and iperf3 for the data-plane peer.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TEST=""; BENCH=""
case "${1:-}" in
  "") ;;
  --test) TEST=1 ;;
  --bench) TEST=1; BENCH=1 ;;
  *) echo "usage: deploy/install_deps.sh [--test | --bench]" >&2; exit 2 ;;
esac
PKGS="build-essential cmake pkg-config libgrpc-dev protobuf-c-compiler libprotobuf-c-dev \
protobuf-compiler libuv1-dev libsqlite3-dev libopenblas-dev libcjson-dev libpcre2-dev \
libsystemd-dev libcurl4-openssl-dev libssl-dev python3"
[ -n "$TEST" ] && PKGS="$PKGS python3-torch python3-numpy python3-grpcio python3-protobuf python3-yaml \
python3-pil clang libclang-rt-dev binutils openssl procps util-linux bsdutils prometheus chromium \
tesseract-ocr slurm-wlm munge systemd ceph-mon ceph-osd radosgw ceph-common uuid-runtime curl"
[ -n "$BENCH" ] && PKGS="$PKGS bible-kjv-text bible-kjv iperf3"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=""
for p in $PKGS; do installed "$p" || missing="$missing $p"; done
# npm may come from Node's own installer rather than Debian: any npm on PATH will do.
command -v npm >/dev/null 2>&1 || missing="$missing npm"
# Debian's kubectl, unless another package already owns /usr/bin/kubectl (they would clash).
KC=$ROOT/tests/.cache/kubernetes-client
unpack_kc=""
if [ -n "$TEST" ] && ! installed kubernetes-client; then
  if command -v kubectl >/dev/null 2>&1; then
    [ -x "$KC/usr/bin/kubectl" ] || unpack_kc=1
  else
    missing="$missing kubernetes-client"
  fi
fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
if [ -n "$missing" ] || [ -n "$unpack_kc" ]; then
  $SUDO apt-get update -qq
fi
if [ -n "$missing" ]; then
  echo "install_deps: installing:$missing" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >&2
fi
[ -n "$TEST" ] || exit 0

if [ -n "$unpack_kc" ]; then
  echo "install_deps: $(command -v kubectl) is not Debian's; unpacking kubernetes-client into $KC" >&2
  d=$(mktemp -d)
  (cd "$d" && chmod 0755 . && apt-get download kubernetes-client >&2 && mkdir -p "$KC" && dpkg -x kubernetes-client_*.deb "$KC")
  rm -rf "$d"
  [ -x "$KC/usr/bin/kubectl" ] || { echo "install_deps: unpacking kubernetes-client failed" >&2; exit 1; }
fi

MODELS=$ROOT/tests/.cache/k8s-models
if [ ! -f "$MODELS/node_modules/kubernetes-models/package.json" ] || [ ! -f "$MODELS/node_modules/js-yaml/package.json" ]; then
  echo "install_deps: npm install kubernetes-models@5.1.0 js-yaml@4.1.0 into $MODELS" >&2
  mkdir -p "$MODELS"
  (cd "$MODELS" && npm install --no-audit --no-fund --silent kubernetes-models@5.1.0 js-yaml@4.1.0 >&2)
fi
