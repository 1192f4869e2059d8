#!/usr/bin/env bash
# coord_crash.sh COORDINATOR WORKER DIPACOCTL POINT[:NTH] [async] — kill -9 of the coordinator
# at a named point. A tiny sync DiLoCo job (R=2, H=3, 5 rounds, inner.state
# checkpoint, CPU, one thread per worker) runs once fault-free; then again with the
# coordinator's test hook armed (DIPACO_TEST_STOP_AT=POINT[:NTH], coordinator/testhook.h):
# when the daemon reaches the point it logs "test hook: stopped at" and SIGSTOPs itself, the
# test SIGKILLs it there and starts it again on the same state directory and address, and the
# two workers (never restarted) must reconnect and finish the job. Then:
#   - the exported parameters are byte-identical to the fault-free run's (cmp);
#   - tests/integration/ledger_check.py: every (round, replica) delta applied exactly once,
#     every delta a worker saw acknowledged is in the ledger once, every round closed with
#     its version, every blob the database names whole, no temporary blob file left.
# With "async": a diloco-async job (delayed Nesterov) with one slot (R=1, 8 leases of H=3) and
# the same two workers; with no one to be stale against it is deterministic (a lease includes
# every acknowledged delta), so it too must end byte-identical, with staleness 0 throughout
# (ledger_check.py --async).
# Parameters are ~67k floats and workers ask for 64 KiB chunks, so pulls and pushes take
# several chunks and "mid-pull" / "mid-push" really are mid-stream.
# CRASH_STORE=s3 (run under tests/s3/with_rgw.sh): both runs keep their blobs on the RADOS
# Gateway, where workers read parameters and put their deltas themselves (so "pull" and "push",
# points of streamed transfers, are not reached there); the ledger check reads a mirror of the
# bucket (tests/s3/mirror.sh).
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3; STOP=$4; ALGO=${5:-sync}
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
ROUNDS=5; R=2; ALG=diloco; OUTER='"lr": 0.7, "momentum": 0.9, "nesterov": true'; CHECK=()
if [ "$ALGO" = async ]; then
  ROUNDS=8; R=1; ALG=diloco-async; OUTER='"rule": "delayed-nesterov", "lr": 0.7, "momentum": 0.9, "c": 0'; CHECK=(--async)
fi
COORD_FLAGS=(--lease-ttl-ms 4000 --heartbeat-ms 200)
REF_FLAGS=("${COORD_FLAGS[@]}")
if [ "${CRASH_STORE:-local}" = s3 ]; then
  : "${S3_ENDPOINT:?CRASH_STORE=s3 runs under tests/s3/with_rgw.sh}"
  bash "$HERE/../s3/s3curl.sh" -X PUT "$S3_ENDPOINT/dpc-crash" >/dev/null
  REF_FLAGS+=(--blob-store s3://dpc-crash/ref --s3-endpoint "$S3_ENDPOINT")
  COORD_FLAGS+=(--blob-store s3://dpc-crash/run --s3-endpoint "$S3_ENDPOINT")
fi
WORKER_FLAGS=(--max-chunk-bytes 65536 --exit-when-done)

make_corpus "$W/corpus"
"$CTL" init --n-layer 1 --n-head 2 --n-embd 64 --n-positions 16 --vocab-size 256 --seed 11 --out "$W/init" 2>/dev/null
cat > "$W/spec.json" <<JSON
{"name": "crash", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "$ALG", "replicas": $R, "inner_steps": 3, "rounds": $ROUNDS, "batch": 2, "seq_len": 16,
 "round_timeout_s": 0,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "checkpoint"},
 "outer": {$OUTER}}
JSON
fail() { die_with_logs "coord_crash ($STOP $ALGO)" 25 "$@"; }

# 1. Fault-free reference.
start_coordinator "$W/ref" "${REF_FLAGS[@]}"
start_worker r1 "$W/corpus" "${WORKER_FLAGS[@]}"; r1=$LAST_WORKER_PID
start_worker r2 "$W/corpus" "${WORKER_FLAGS[@]}"; r2=$LAST_WORKER_PID
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 120 >/dev/null || fail "the fault-free job did not finish"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export-ref" >/dev/null
kill_wait "$r1" "$r2" "$COORD_PID"
mv "$W/coordinator.log" "$W/coordinator-ref.log"

# 2. The same job; the coordinator stops itself at the point and is SIGKILLed there.
DIPACO_TEST_STOP_AT=$STOP start_coordinator "$W/state" "${COORD_FLAGS[@]}"
start_worker w1 "$W/corpus" "${WORKER_FLAGS[@]}"; w1=$LAST_WORKER_PID
start_worker w2 "$W/corpus" "${WORKER_FLAGS[@]}"; w2=$LAST_WORKER_PID
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
wait_for_line "$W/coordinator.log" "test hook: stopped at" 90 || fail "the coordinator never reached point $STOP"
for _ in $(seq 1 100); do
  [ "$(ps -o stat= -p "$COORD_PID" | cut -c1)" = T ] && break
  sleep 0.02
done
[ "$(ps -o stat= -p "$COORD_PID" | cut -c1)" = T ] || fail "the coordinator logged the stop but is not stopped"
kill_wait "$COORD_PID"
at=$(grep -o "test hook: stopped at [a-z-]* (hit [0-9]*)" "$W/coordinator.log" | head -1)
echo "coordinator SIGKILLed: $at"
sleep 0.3
n0=$(wc -l < "$W/coordinator.log")
restart_coordinator "$W/state" "${COORD_FLAGS[@]}" || fail "restart"
# What the restart must have found and repaired at this point (its first log lines).
recovery=$(tail -n +"$((n0 + 1))" "$W/coordinator.log" | grep -o "recovery: [^\"]*" || true)
echo "${recovery:-restart: nothing to repair}"
case ${STOP%%:*} in
  push) [[ $recovery == *"removed "[1-9]*" unfinished blob temp"* ]] || fail "the half-received delta's spool file was not removed" ;;
  push-commit|outer|gc) [[ $recovery == *" and "[1-9]*" blob(s) no row references"* ]] || fail "no orphaned blob was removed" ;;
  push-ack) [[ $recovery == *"had all its deltas in"* ]] || fail "the lease whose delta was durable was not finished" ;;
  outer-momentum) [[ $recovery == *"version "[1-9]*" made again from version"* ]] \
    || fail "the version committed before its momentum was stored was not made again" ;;
esac
# On S3 the start-up check keeps the versions it verified for the first outer step.
if [ "${CRASH_STORE:-local}" = s3 ] && ! [[ $recovery =~ \ [1-9][0-9]*\ bytes\ of\ it\ kept\ in\ the\ blob\ cache ]]; then
  fail "the start-up check kept nothing in the blob cache"
fi
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 150 >/dev/null || fail "the job did not finish after the restart"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export-crash" >/dev/null
"$CTL" --coordinator "$COORD" job ledger "$job" --json > "$W/ledger.json"
for p in "$w1" "$w2"; do
  rc=0; wait "$p" || rc=$?
  [ $rc = 0 ] || fail "a worker exited with status $rc"
done
grep -Eq "UNAVAILABLE|retrying|reconnect" "$W"/worker-w*.log || fail "the workers never noticed the coordinator die"
cmp "$W/export-ref/model.safetensors" "$W/export-crash/model.safetensors" \
  || fail "the parameters after the crash differ from the fault-free run"
echo "exported parameters byte-identical to the fault-free run"
CHECK_STATE=$W/state
if [ "${CRASH_STORE:-local}" = s3 ]; then
  CHECK_STATE=$W/state-mirror
  bash "$HERE/../s3/mirror.sh" dpc-crash run "$W/state" "$CHECK_STATE" || fail "cannot mirror the bucket"
  n_put=$(cat "$W"/worker-w*.log | grep -c "through the object store" || true)
  echo "leases that put their deltas in the store: $n_put"
  [ "$n_put" -gt 0 ] || fail "no worker put its delta in the store"
  if [ "${STOP%%:*}" = push-commit ]; then # the restarted coordinator never prepared the object
    grep -q "pushing them to the coordinator" "$W"/worker-w*.log || fail "no worker fell back to pushing its delta"
    echo "a worker whose object the restarted coordinator did not know pushed its delta instead"
  fi
fi
"${DPC_PYTHON:-python3}" "$HERE/ledger_check.py" "${CHECK[@]}" "$W/ledger.json" "$CHECK_STATE" "$job" $ROUNDS $R "$W"/worker-w*.log \
  || fail "ledger check"
echo "coord_crash $STOP $ALGO: OK"
