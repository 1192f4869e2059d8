#!/usr/bin/env bash
# s3_write.sh — the coordinator's blob writer on S3 (tests/bench/s3_write_bench.c) against curl
# PUTting the same number of bytes in one request, one after the other on one RADOS Gateway
# started here (tests/s3/rgw.sh, RAM-backed OSD): what the coordinator's writes of θ and u get
# from a gateway, as a ratio to a plain client's single stream. Medians over the repeats.
#   tests/bench/s3_write.sh [MiB=256] [REPEATS=5]
# env: BUILD_DIR (default build-bench-dataplane); BASE_BUILD: a second build (e.g. of the
# previous commit) measured first against the same gateway.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MIB=${1:-256}; REPS=${2:-5}
BUILD=${BUILD_DIR:-$ROOT/build-bench-dataplane}
bash "$ROOT/deploy/install_deps.sh" --bench
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDIPACO_SANITIZE=OFF >/dev/null
cmake --build "$BUILD" --target s3_write_bench -j"$(nproc)" >/dev/null
W=$(mktemp -d "${TMPDIR:-/var/tmp}/s3write.XXXXXX")
trap 'bash "$ROOT/tests/s3/rgw.sh" stop "$W/rgw" >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
RGW_MEMSTORE_BYTES=${RGW_MEMSTORE_BYTES:-$(( (MIB * 4 + 1024) << 20 ))} bash "$ROOT/tests/s3/rgw.sh" start "$W/rgw" >/dev/null
set -a; . "$W/rgw/env"; set +a
bash "$ROOT/tests/s3/s3curl.sh" -X PUT "$S3_ENDPOINT/s3write" >/dev/null
export S3_BENCH_URL=s3://s3write/bench
head -c $((MIB << 20)) /dev/urandom >"$W/obj"
median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
curl_put() {
  local i t0 t1
  for i in $(seq 1 "$REPS"); do
    t0=$(date +%s.%N)
    bash "$ROOT/tests/s3/s3curl.sh" -T "$W/obj" "$S3_ENDPOINT/s3write/curl-$i" -o /dev/null
    t1=$(date +%s.%N)
    bash "$ROOT/tests/s3/s3curl.sh" -X DELETE "$S3_ENDPOINT/s3write/curl-$i" >/dev/null
    echo "$t1 - $t0" | bc
  done | median
}
writer() { "$1/tests/s3_write_bench" "$MIB" "$REPS" | awk '{print $3}' | median; }
echo "| build | writer | curl PUT | writer / curl (rate) |"
echo "|---|---|---|---|"
row() {
  local c w; c=$(printf '%.3f' "$(curl_put)"); w=$(writer "$2")
  echo "| $1 | $w s ($(echo "scale=3; $MIB / 1024 / $w" | bc) GiB/s) | $c s | $(echo "scale=2; $c / $w" | bc) |"
}
if [ -n "${BASE_BUILD:-}" ]; then
  cmake --build "$BASE_BUILD" --target s3_write_bench -j"$(nproc)" >/dev/null
  row before "$BASE_BUILD"
fi
row after "$BUILD"
echo "($MIB MiB a write, $REPS repeats, medians; $(nproc) cores)"
