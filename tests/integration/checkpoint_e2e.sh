#!/usr/bin/env bash
# checkpoint_e2e.sh COORDINATOR WORKER DIPACOCTL [INNER_FIELDS] — inner.state "checkpoint":
# a tiny sync DiLoCo job (R=2, H=3, 6 rounds) whose workers are BOTH swapped after round 0
# (SIGTERM w1, w2: they release their leases and exit 0; fresh w3, w4 take the slots and pull
# the slots' AdamW state with PullInnerState) must export parameters byte-identical to the same
# job run with inner.state "keep" and no swaps. The same job with inner.state "reset" must
# differ (so the comparison can fail: AdamW state matters here). INNER_FIELDS, JSON members
# added to the spec's inner block, runs the same with another inner optimizer (tests/cmake/
# muon.cmake: Muon, whose momentum buffers ride in the AdamW state, docs/design.md §3.2).
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3; INNER_FIELDS=${4:-}
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"

make_corpus "$W/corpus"
"$CTL" init --n-layer 1 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 7 --out "$W/init" 2>/dev/null
spec() { # NAME STATE
  cat > "$W/$1.json" <<JSON
{"name": "$1", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 3, "rounds": 6, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "$2"$INNER_FIELDS},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
}
run_job() { # NAME STATE → exports into $W/export-NAME
  spec "$1" "$2"
  local job; job=$("$CTL" --coordinator "$COORD" job create "$W/$1.json")
  "$CTL" --coordinator "$COORD" job wait "$job" --timeout 120 || { echo "job $1 did not finish"; tail -30 "$W"/*.log; exit 1; }
  "$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export-$1" >/dev/null
}

start_coordinator "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W/corpus"; w1=$LAST_WORKER_PID
start_worker w2 "$W/corpus"; w2=$LAST_WORKER_PID
run_job keep keep
run_job reset reset

# The checkpoint job: swap both workers once round 0 is closed (both slots' round-0 deltas in).
spec ckpt checkpoint
job=$("$CTL" --coordinator "$COORD" job create "$W/ckpt.json")
for _ in $(seq 1 600); do
  [ "$(grep -c "job $job slot .* round 0 fragment" "$W/coordinator.log" || true)" -ge 2 ] && break
  sleep 0.05
done
[ "$(grep -c "job $job slot .* round 0 fragment" "$W/coordinator.log" || true)" -ge 2 ] \
  || { echo "round 0 of the checkpoint job never completed"; tail -30 "$W"/*.log; exit 1; }
kill -TERM "$w1" "$w2"
rc1=0; wait "$w1" || rc1=$?
rc2=0; wait "$w2" || rc2=$?
[ $rc1 = 0 ] && [ $rc2 = 0 ] || { echo "SIGTERMed workers exited $rc1/$rc2, expected 0"; tail -20 "$W"/worker-w*.log; exit 1; }
echo "round 0 done: w1 and w2 SIGTERMed (exit 0); starting w3 and w4"
start_worker w3 "$W/corpus"
start_worker w4 "$W/corpus"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 120 || { echo "checkpoint job did not finish"; tail -30 "$W"/*.log; exit 1; }
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export-ckpt" >/dev/null

# The new workers resumed the slots' state from the coordinator (not a fresh AdamW).
n=$(cat "$W/worker-w3.log" "$W/worker-w4.log" | grep -c "resumed the slot's AdamW state from its checkpoint" || true)
# The old workers may get a round or two further before SIGTERM lands (the machine may be
# loaded), so count at least one resume; the cmp against "keep" below is what proves exactness.
[ "$n" -ge 1 ] || { echo "w3/w4 resumed inner state $n times, expected >= 1"; tail -20 "$W"/worker-w3.log "$W"/worker-w4.log; exit 1; }
echo "w3/w4 resumed the slots' AdamW state from their checkpoints $n times"

cmp "$W/export-keep/model.safetensors" "$W/export-ckpt/model.safetensors" \
  || { echo "FAIL: checkpoint job with swapped workers differs from the keep job"; exit 1; }
echo "checkpoint (workers swapped) == keep (no swaps): byte-identical model.safetensors"
if cmp -s "$W/export-keep/model.safetensors" "$W/export-reset/model.safetensors"; then
  echo "FAIL: the reset job equals the keep job: this test cannot tell AdamW state apart"; exit 1
fi
echo "reset job differs from keep, as it must"
