#!/usr/bin/env bash
# worker_kill.sh COORDINATOR WORKER DIPACOCTL — a worker SIGKILLed mid-round does not wedge the
# job: its lease expires (missed heartbeats or TTL), another worker takes the slot, the job
# finishes, and the coordinator keeps answering throughout.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"

make_corpus "$W/corpus"
cat > "$W/spec.json" <<JSON
{"name": "kill-test", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 1},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 1500, "rounds": 2,
 "batch": 4, "seq_len": 16, "inner": {"lr": 0.003}}
JSON
start_coordinator "$W/state" --lease-ttl-ms 2000 --heartbeat-ms 300
start_worker w1 "$W/corpus"; victim=$LAST_WORKER_PID
start_worker w2 "$W/corpus"
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
# Wait until the victim holds a lease, then kill it without warning.
for _ in $(seq 1 200); do
  "$CTL" --coordinator "$COORD" workers --json | $PY -c '
import json, sys
ws = json.load(sys.stdin)
ws = ws.get("workers", ws) if isinstance(ws, dict) else ws
sys.exit(0 if any(w.get("hostname") == "w1" and w.get("lease_id") for w in ws) else 1)' && break
  sleep 0.05
done
sleep 0.3
kill -KILL "$victim"
echo "SIGKILLed worker w1 (pid $victim) mid-round"
start_worker w3 "$W/corpus"
t0=$(date +%s)
if ! "$CTL" --coordinator "$COORD" job wait "$job" --timeout 180; then
  echo "job wedged after a worker was killed"; tail -30 "$W"/*.log; exit 1
fi
echo "job finished $(( $(date +%s) - t0 )) s after the kill"
"$CTL" --coordinator "$COORD" workers
grep -Eqi "expire|lease [0-9]+ revoked" "$W/coordinator.log" && echo "coordinator logged the lease expiry (TTL or missed heartbeats)" \
  || { echo "no lease expiry in the coordinator log"; exit 1; }
