#!/usr/bin/env bash
# tests/gpu/device_run.sh — build the training core with CUDA on a GPU machine that lacks the
# Debian -dev packages, then run the CUDA tests and (optionally) the GPU benchmark. Libraries
# come from .deb files in DEBS (default .gpu-debs, fetched on a Debian machine with
# `apt-get download libopenblas-dev libopenblas0-pthread libopenblas-pthread-dev libopenblas0
# libcjson-dev libcjson1 libpcre2-dev libpcre2-8-0 pkgconf pkgconf-bin libpkgconf3`) unpacked
# into a private sysroot, never into /. Output: logs under OUT (default ./gpu-out).
# Usage: tests/gpu/device_run.sh [tests|bench|hetero|all]   (hetero: tests/gpu/hetero_diloco.sh,
#        a DiLoCo fleet of one CUDA and one CPU replica against a CPU-only one; env TARGETS
#        limits the build to those CMake targets)
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
DEBS=${DEBS:-$PWD/.gpu-debs}
SYS=${SYSROOT:-$HOME/dpc-sysroot}
# The sysroot is used unless pkg-config finds every library the build needs (a GPU image can
# carry cblas.h without libcjson, say).
use_sys=0
if [ -n "${FORCE_SYSROOT:-}" ] || ! command -v pkg-config >/dev/null || ! pkg-config --exists libcjson libpcre2-8 openblas; then
  use_sys=1
fi
if [ $use_sys = 1 ] && ! [ -d "$SYS/usr" ]; then
  mkdir -p "$SYS"
  for d in "$DEBS"/*.deb; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$d" "$SYS"
    else (t=$(mktemp -d); cd "$t" && ar x "$d" && tar -xf data.tar.* -C "$SYS"; rm -rf "$t"); fi
  done
fi
extra=()
if [ $use_sys = 1 ]; then
  ml=$SYS/usr/lib/x86_64-linux-gnu
  export PKG_CONFIG_LIBDIR=$ml/pkgconfig:$ml/openblas-pthread/pkgconfig:$SYS/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$SYS
  export LD_LIBRARY_PATH=$ml:$ml/openblas-pthread:${LD_LIBRARY_PATH:-}
  if ! command -v pkg-config >/dev/null; then extra+=(-DPKG_CONFIG_EXECUTABLE="$SYS/usr/bin/pkgconf"); fi
fi
py=$(command -v python3); extra+=(-DDPC_PYTHON="$py")
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
BUILD=${BUILD:-build-gpu}
mkdir -p tests/.cache # test assets are fetched by tests/run.sh; the CUDA tests need none, but CMake names the folder
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ". ")
arch=${CUDA_ARCH:-${cc:-90}}
{ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDIPACO_DISTRIBUTED=OFF -DDIPACO_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" "${extra[@]}" &&
  cmake --build "$BUILD" -j"$(nproc)" ${TARGETS:+--target $TARGETS}; } >"$OUT/build.log" 2>&1
rc=$?
tail -30 "$OUT/build.log"
[ $rc = 0 ] || { echo "BUILD FAILED"; exit 1; }
if [ "$what" = tests ] || [ "$what" = all ]; then
  (cd "$BUILD" && ctest --output-on-failure -R "${TESTS:-cuda|cpu_oracle|llama_oracle|ctl_llama|ctl_muon|cpu_determinism|base|ctl_offline}" -j4) 2>&1 | tee "$OUT/ctest.log" | tail -80
  for t in test_cuda_kernels test_cuda_llama test_cuda_llama_wiring test_cuda_backend; do "$BUILD/tests/$t" >"$OUT/$t.log" 2>&1; done
  DPC_ORACLE_DEVICE=auto "$BUILD/tests/test_cuda_oracle" tests/oracle/gpt_oracle.py "$py" cuda >"$OUT/cuda_oracle.log" 2>&1
  "$BUILD/tests/test_cuda_llama_oracle" tests/oracle/llama_oracle.py "$py" cuda >"$OUT/cuda_llama_oracle.log" 2>&1
fi
if [ "$what" = hetero ] || [ "$what" = all ]; then
  bash tests/gpu/hetero_diloco.sh "$BUILD" 2>&1 | tee "$OUT/hetero.log" | tail -5
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  bash tests/bench/gpu_train.sh "$BUILD" 2>&1 | tee "$OUT/gpu_train.log" | tail -40
fi
