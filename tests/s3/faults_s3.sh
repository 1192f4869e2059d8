#!/usr/bin/env bash
# faults_s3.sh COORDINATOR WORKER DIPACOCTL — run under tests/s3/with_rgw.sh: the faults an S3
# store shows in the wild, injected by tests/s3/faultproxy.py between the daemons and the real
# gateway: every 7th request answered 503 SlowDown, every 11th 429, every 13th connection closed
# without an answer, every 5th PUT stored by the gateway but answered 500. A tiny sync DiLoCo job
# (R = 2, 4 rounds, inner state reset, one thread: bit-reproducible) runs once on the local store
# for the reference, then with its blobs on the gateway through the proxy, where the coordinator
# retries (jittered backoff) and the workers fall back to the coordinator when their presigned
# GETs and PUTs fail. It must end DONE with parameters byte-identical to the reference, every
# delta applied exactly once, no object left that no row names, and every kind of fault injected.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")/../integration" && pwd)
S3DIR=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs faults_s3 25 "$@"; }
: "${S3_ENDPOINT:?run me under tests/s3/with_rgw.sh}"
bash "$S3DIR/s3curl.sh" -X PUT "$S3_ENDPOINT/dpc-faults" >/dev/null || fail "cannot create the test bucket"

make_corpus "$W/corpus"
"$CTL" init --n-layer 1 --n-head 2 --n-embd 32 --n-positions 16 --vocab-size 256 --seed 7 --out "$W/init" 2>/dev/null
ROUNDS=4; R=2
cat > "$W/spec.json" <<JSON
{"name": "faults", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": $R, "inner_steps": 3, "rounds": $ROUNDS, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "state": "reset"}, "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
FLAGS=(--heartbeat-ms 200 --lease-ttl-ms 8000)

run_job() { # STATE OUT [coordinator flags…] — the job with two workers; its export in OUT
  local st=$1 out=$2; shift 2
  start_coordinator "$st" "${FLAGS[@]}" "$@"
  start_worker "w$(basename "$st")-a" "$W/corpus" --exit-when-done; local a=$LAST_WORKER_PID
  start_worker "w$(basename "$st")-b" "$W/corpus" --exit-when-done; local b=$LAST_WORKER_PID
  job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create refused"
  "$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 >/dev/null || fail "the job did not finish ($st)"
  "$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$out" >/dev/null
  "$CTL" --coordinator "$COORD" job ledger "$job" --json > "$W/ledger.json"
  for p in "$a" "$b"; do wait "$p" || fail "a worker exited with status $?"; done
}

run_job "$W/ref" "$W/export-ref"
kill_wait "$COORD_PID"
mv "$W/coordinator.log" "$W/coordinator-ref.log"

pport=$(free_port)
"$PY" "$S3DIR/faultproxy.py" "$pport" "${S3_ENDPOINT#http://}" "503:7,429:11,drop:13,late500:5" "$W/faults.log" \
  >"$W/proxy.out" 2>&1 &
PIDS+=("$!")
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$pport/" && break; sleep 0.1; done
run_job "$W/state" "$W/export-faults" --blob-store s3://dpc-faults/run --s3-endpoint "http://127.0.0.1:$pport" \
  --log-level debug
cmp "$W/export-ref/model.safetensors" "$W/export-faults/model.safetensors" \
  || fail "the job through the faulty store differs from the reference"
echo "exported parameters byte-identical to the local store's run"
for k in 503 429 drop late500; do
  n=$(grep -c "^$k " "$W/faults.log" || true)
  echo "faults injected: $k x $n"
  [ "$n" -gt 0 ] || fail "no $k fault was injected"
done
n=$(grep -c "retry [0-9]* in" "$W/coordinator.log" || true)
echo "coordinator requests retried: $n"
[ "$n" -gt 0 ] || fail "the coordinator never retried a request"
fb=$(cat "$W"/worker-wstate-*.log | grep -c "through the coordinator\|pushing them to the coordinator" || true)
echo "worker transfers that fell back to the coordinator: $fb"
# SIGTERM, not SIGKILL: the coordinator finishes its thread-pool work first, among it the last
# round's garbage collection, whose DELETEs the faults slow down. A SIGKILL there leaves objects
# for the next start-up's sweep, which the ledger check below would count as orphans.
kill -TERM "$COORD_PID"
for _ in $(seq 1 600); do kill -0 "$COORD_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$COORD_PID" 2>/dev/null && { kill_wait "$COORD_PID"; fail "the coordinator did not stop within 60 s of SIGTERM"; }
wait "$COORD_PID" 2>/dev/null || true
bash "$S3DIR/mirror.sh" dpc-faults run "$W/state" "$W/mirror" || fail "cannot mirror the bucket"
"$PY" "$HERE/ledger_check.py" "$W/ledger.json" "$W/mirror" "$job" $ROUNDS $R "$W"/worker-wstate-*.log \
  || fail "ledger check"
echo "faults_s3: OK"
