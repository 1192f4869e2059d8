#!/usr/bin/env bash
# tests/fuzz/run_fuzz.sh FUZZER_BIN NAME SECONDS — one ctest fuzz test: replay every regression
# input kept in tests/fuzz/regress/NAME/ (each must run clean), then fuzz for SECONDS seconds
# from the seeds in tests/fuzz/corpus/NAME/ (read-only; new inputs go to a scratch copy).
# Fails, saying why, when the fuzzers could not be built here (no clang/libFuzzer: the
# configure step left its reason in NOT_BUILT next to them; deploy/install_deps.sh --test
# installs clang and libclang-rt-dev).
# A crash leaves its input in $FUZZ_ARTIFACTS (default: the build's fuzz/artifacts/) and is
# printed in base64, ready to be kept as a regression input once fixed.
set -uo pipefail
bin=$1 name=$2 secs=$3
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$bin" ]; then
  if [ -f "$(dirname "$bin")/NOT_BUILT" ]; then
    echo "FAIL: fuzz targets not built: $(cat "$(dirname "$bin")/NOT_BUILT")"
    echo "      deploy/install_deps.sh --test installs clang and libclang-rt-dev; -DDIPACO_FUZZ=OFF leaves the fuzzers out"
    exit 1
  fi
  echo "FAIL: $bin is missing; build it with: cmake --build <build dir> --target dipaco_fuzz"
  exit 1
fi
export ASAN_OPTIONS=${FUZZ_ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1:quarantine_size_mb=32}
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
art=${FUZZ_ARTIFACTS:-$(dirname "$bin")/artifacts}/$name
mkdir -p "$art"
work=$(mktemp -d "${TMPDIR:-/tmp}/dpc-fuzz-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT

regress=("$here/regress/$name"/*)
if [ -e "${regress[0]}" ]; then
  echo "replaying ${#regress[@]} regression input(s) from tests/fuzz/regress/$name"
  if ! "$bin" -runs=1 "${regress[@]}" >"$work/replay.log" 2>&1; then
    tail -n 60 "$work/replay.log"
    echo "FAIL: a regression input of $name crashes again"
    exit 1
  fi
fi

echo "fuzzing $name for ${secs}s from tests/fuzz/corpus/$name"
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
  -artifact_prefix="$art/" "$work" "$here/corpus/$name" >"$work/fuzz.log" 2>&1
rc=$?
grep -E "INITED|DONE|^stat::number_of_executed_units|^stat::peak_rss" "$work/fuzz.log"
if [ $rc -ne 0 ]; then
  tail -n 80 "$work/fuzz.log"
  for f in "$art"/crash-* "$art"/leak-* "$art"/timeout-* "$art"/oom-*; do
    [ -e "$f" ] || continue
    echo "input $f (base64): $(base64 -w0 "$f")"
  done
  echo "FAIL: $name found a problem (exit $rc); fix it and keep the input under tests/fuzz/regress/$name/"
  exit 1
fi
echo "OK: $name"
