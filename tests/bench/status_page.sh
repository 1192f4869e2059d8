#!/usr/bin/env bash
# status_page.sh — what the status page costs the coordinator's loop thread, against its peer
# on the same listener, /metrics (the scrape every Prometheus makes, built the same way: on the
# loop thread from the coordinator's state and store). A Release build (own build dir) runs a
# DiLoCo job (PATHS 1, 4 replicas) for ROUNDS rounds, the job is paused (a still state), then N
# requests of each of /metrics, / and /api/status are timed interleaved (curl time_total);
# prints the medians and the ratios to /metrics, and the page's size.
# usage: tests/bench/status_page.sh [ROUNDS=200] [N=50]   env: BUILD_DIR (default build-bench)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=${1:-200}; N=${2:-50}
build=${BUILD_DIR:-$ROOT/build-bench}
cmake -S "$ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDIPACO_SANITIZE=OFF >/dev/null
cmake --build "$build" --target dipaco-coordinator dipaco-worker dipacoctl -j"$(nproc)" >/dev/null
COORDINATOR_BIN=$build/coordinator/dipaco-coordinator; WORKER_BIN=$build/worker/dipaco-worker
CTL=$build/coordinator/dipacoctl
W=$(mktemp -d)
source "$ROOT/tests/integration/lib.sh"
source "$ROOT/tests/integration/ops_lib.sh"
ops_setup
ops_spec "$W/spec.json" bench-status diloco 4 $((ROUNDS + 1000))
MPORT=$(free_port)
start_coordinator "$W/state" --metrics-listen 127.0.0.1:$MPORT
for i in 1 2 3 4; do start_worker w$i "$W/corpus"; done
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json" 2>/dev/null)
until [ "$(curl -sf "http://127.0.0.1:$MPORT/api/status" | $PY -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["round"])')" -ge "$ROUNDS" ]; do
  sleep 1
done
"$CTL" --coordinator "$COORD" job pause "$job" >/dev/null
sleep 1
for i in $(seq 1 "$N"); do
  for u in /metrics / /api/status; do
    printf '%s %s\n' "$u" "$(curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:$MPORT$u")"
  done
done > "$W/times.txt"
$PY - "$W/times.txt" "$ROUNDS" "$(curl -s "http://127.0.0.1:$MPORT/" | wc -c)" <<'PY'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    u, s = line.split()
    t.setdefault(u, []).append(float(s) * 1000)
m = {u: statistics.median(v) for u, v in t.items()}
print("job of 4 replicas paused at round >= %s; %d requests each, interleaved" % (sys.argv[2], len(t["/"])))
for u in ("/metrics", "/", "/api/status"):
    print("%-12s median %7.2f ms  p90 %7.2f ms  ratio to /metrics %.2f" % (
        u, m[u], sorted(t[u])[int(0.9 * len(t[u])) - 1], m[u] / m["/metrics"]))
print("page size %s bytes" % sys.argv[3])
PY
