#!/usr/bin/env bash
# lease_errors.sh COORDINATOR WORKER DIPACOCTL — a job its workers cannot run stops being handed
# out and says why: a job whose data.train matches no file on the workers
# made them take a lease and give it back (RELEASE_ERROR) every few seconds, forever, with the
# job RUNNING. Now, after 6 such leases in a row, the job is PAUSED with the worker's reason in
# `job show`; once the data is there, `job resume` runs it to the end.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"

make_corpus "$W/corpus"
mkdir -p "$W/empty/data"
cat > "$W/spec.json" <<JSON
{"name": "nodata", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 3},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 2, "rounds": 2,
 "batch": 2, "seq_len": 16}
JSON
start_coordinator "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W/empty"   # no shards under this data directory
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
for _ in $(seq 1 300); do
  "$CTL" --coordinator "$COORD" job show "$job" --json > "$W/show.json" 2>/dev/null || true
  grep -q '"state":"PAUSED"' "$W/show.json" && break
  sleep 0.2
done
"$CTL" --coordinator "$COORD" job show "$job" | sed -n 1,6p
grep -q '"state":"PAUSED"' "$W/show.json" || { echo "FAIL: the job was not paused"; tail -20 "$W"/*.log; exit 1; }
grep -q 'leases in a row failed on the workers' "$W/show.json" && grep -q 'data.train\|no file\|match' "$W/show.json" ||
  { echo "FAIL: the message does not give the worker's reason"; cat "$W/show.json"; exit 1; }
released=$(grep -c "released by worker" "$W/coordinator.log")
sleep 3
[ "$(grep -c "released by worker" "$W/coordinator.log")" -eq "$released" ] ||
  { echo "FAIL: leases still handed out while paused"; exit 1; }
echo "paused after $released failed leases, with the worker's reason; none handed out while paused"
# The data arrives: resume runs the job to the end.
start_worker w2 "$W/corpus"
kill "${PIDS[1]}" 2>/dev/null || true   # w1 (no data) goes away
"$CTL" --coordinator "$COORD" job resume "$job" >/dev/null
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 120 >/dev/null || { echo "FAIL: the resumed job did not finish"; exit 1; }
echo "lease_errors: PASS"
