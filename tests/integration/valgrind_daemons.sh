#!/usr/bin/env bash
# valgrind_daemons.sh [BUILD_DIR] — runs the distributed DiLoCo test of record with the
# coordinator and both workers under valgrind (memcheck, full leak check) and fails on any
# memory error or definite/indirect leak. Not part of ctest (it needs a build without
# sanitizers: BUILD_DIR, default build-vg, is configured RelWithDebInfo here); run by hand.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-vg}
case $B in /*) ;; *) B=$PWD/$B ;; esac
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$B" -j"$(nproc)" --target dipaco-coordinator dipaco-worker dipacoctl >/dev/null
V=$(mktemp -d)
for b in coordinator worker; do
  bin=$B/coordinator/dipaco-coordinator; [ $b = worker ] && bin=$B/worker/dipaco-worker
  printf '#!/bin/sh\nexec valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect --suppressions=%s --log-file=%s/%s.%%p.log %s "$@"\n' \
    "$PWD/tests/integration/valgrind.supp" "$V" "$b" "$bin" > "$V/$b.sh"
  chmod +x "$V/$b.sh"
done
CLEANUP_WAIT_TENTHS=300 bash tests/integration/diloco_dist.sh "$V/coordinator.sh" "$V/worker.sh" "$B/coordinator/dipacoctl"
n=$(ls "$V"/*.log | wc -l)
bad=0
for f in "$V"/*.log; do
  summary=$(grep -h "ERROR SUMMARY" "$f" || echo "no summary (process did not exit cleanly)")
  echo "$(basename "$f"): $summary"
  grep -q "ERROR SUMMARY: 0 errors" "$f" || bad=1
done
[ "$n" -eq 3 ] || { echo "expected 3 valgrind reports, got $n"; bad=1; }
[ $bad = 0 ] && echo "valgrind: coordinator and workers clean" || { echo "valgrind found problems: see $V"; exit 1; }
rm -rf "$V"
