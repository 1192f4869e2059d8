#!/usr/bin/env bash
# worker_restart.sh DIPACOCTL DIPACO_COORDINATOR DIPACO_WORKER DILOCO_LOCAL — the coordinator
# is killed with SIGKILL in the middle of a DiLoCo job (R=2, H=40, 8 rounds, inner state keep)
# and restarted on the same state directory and port after longer than the lease TTL (3 s down,
# TTL 2 s: the restarted coordinator must give the leases in flight one TTL for their workers
# to reconnect, not expire them at once); the two workers must ride it out
# (retry with backoff on a fresh channel, re-send the delta in flight, keep their slots and
# AdamW state) so that the exported model is bit-identical to the single-process run. Case 2
# makes the harder ending deterministic: a worker gives a lease up mid-push although its delta
# had landed, and must resume the AdamW state it trained (see below).
set -euo pipefail
CTL=$1; CO=$2; WK=$3; LOCAL=$4
W=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
fail() {
  echo "worker_restart: $*" >&2
  for f in "$W"/*.log; do echo "---- $f" >&2; tail -n 25 "$f" >&2; done
  exit 1
}
port_of() { sed -n 's/.*listening on .*(port \([0-9]*\)).*/\1/p' "$1" | head -n 1; }
for i in $(seq 1 300); do echo "Abundant gratitude to the people, $i times over; the union is strong."; done > "$W/t.txt"
"$CTL" data prepare --tokenizer byte --out "$W/data" --val-fraction 0 "$W/t.txt" 2>/dev/null
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 3 --out "$W/init" 2>/dev/null
cat > "$W/spec.json" <<JSON
{"name": "restart", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 40, "rounds": 8, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-8, "grad_clip": 0.5, "state": "keep"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
start_coordinator() { # $1 = listen address, $2 = log
  "$CO" --listen "$1" --state-dir "$W/state" --heartbeat-ms 200 --lease-ttl-ms 2000 --log-json 2> "$2" &
  CP=$!
  PIDS+=($CP)
  for _ in $(seq 1 100); do [ -n "$(port_of "$2")" ] && return 0; sleep 0.1; done
  fail "the coordinator did not start"
}
start_workers() { # two workers on $PORT that leave when the job is done (pids in WP); $@: more flags
  WP=()
  for w in 1 2; do
    "$WK" --coordinator "127.0.0.1:$PORT" --data-dir "$W" --threads 1 --name "w$w" --token-file "$W/state/join.token" \
      --exit-when-done --log-json "$@" 2> "$W/worker$w.log" &
    WP+=($!)
    PIDS+=($!)
  done
}
start_coordinator 127.0.0.1:0 "$W/coord1.log"
PORT=$(port_of "$W/coord1.log")
export DIPACO_COORDINATOR=127.0.0.1:$PORT
DIPACO_ADMIN_TOKEN=$(cat "$W/state/admin.token"); export DIPACO_ADMIN_TOKEN # created by the coordinator
JOB=$("$CTL" job create "$W/spec.json" 2>>"$W/ctl.log")
start_workers
# Kill it once round 2 has closed (mid-job: leases of round 2+ in flight).
for _ in $(seq 1 300); do
  r=$("$CTL" job show "$JOB" --json 2>/dev/null | sed -n 's/.*"round":\([0-9]*\).*/\1/p')
  [ -n "$r" ] && [ "$r" -ge 2 ] && break
  sleep 0.05
done
[ -n "$r" ] && [ "$r" -ge 2 ] && [ "$r" -lt 8 ] || fail "job did not reach round 2 (round '$r')"
kill -9 $CP
wait $CP 2>/dev/null || true
echo "worker_restart: coordinator killed at round $r"
sleep 3
start_coordinator "127.0.0.1:$PORT" "$W/coord2.log"
"$CTL" job wait "$JOB" --timeout 120 >>"$W/ctl.log" 2>&1 || fail "the job did not finish after the restart"
grep -h "keep their slots" "$W/coord2.log" | sed 's/.*"msg":"\(.*\)"}/worker_restart: \1/' || true
if grep -q 'lease [0-9]* expired' "$W/coord2.log"; then
  grep -E 'expired|recovery|granted|released|pushed' "$W/coord2.log" | cut -c1-300 >&2
  fail "a lease expired although its worker came back"
fi
for p in "${WP[@]}"; do
  wait "$p" || fail "a worker exited with status $?"
done
grep -q 'UNAVAILABLE' "$W"/worker*.log || fail "the workers never saw the coordinator go away"
"$CTL" job export "$JOB" --path 0 --out "$W/out" >>"$W/ctl.log" 2>&1 || fail "export"
"$LOCAL" "$W/init" "$W/data/train_000.bin" "$W/local" 2 40 8 2 16 0.01 2 0.1 0.1 0.9 0.95 1e-8 0.5 0.7 0.9 keep \
  2>/dev/null
same_as_local() { # $1: an exported model directory
"${DPC_PYTHON:-python3}" - "$1" "$W/local" <<'PY' || fail "the result differs from diloco_local"
import glob, json, struct, sys
import numpy as np
def read(d):
    raw = open(glob.glob(d + "/*.safetensors")[0], "rb").read()
    (hl,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + hl])
    return {k: np.frombuffer(raw[8 + hl + v["data_offsets"][0]:8 + hl + v["data_offsets"][1]], dtype=np.float32)
            for k, v in hdr.items() if k != "__metadata__"}
a, b = read(sys.argv[1]), read(sys.argv[2])
worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
print(f"worker_restart: max |distributed - diloco_local| = {worst:.3g} over {len(a)} tensors")
sys.exit(0 if worst == 0.0 else 1)
PY
}
same_as_local "$W/out"

# Case 2, deterministic: the coordinator stops (test hook) right after the 5th delta is durable
# and before its answer, is SIGKILLed once the pushing worker has given the lease up (its
# heartbeats unanswered for longer than the TTL), and comes back 1 s later. It finishes that
# lease at start-up (every delta in), so the slot moves on; the worker, whose push got no
# answer, must resume the AdamW state it trained, not the one it started the round from.
kill -TERM $CP; wait $CP 2>/dev/null || true
rm -rf "$W/state" "$W/out"; mv "$W/coord1.log" "$W/coord1-case1.log"; mv "$W/coord2.log" "$W/coord2-case1.log"
for w in 1 2; do mv "$W/worker$w.log" "$W/worker$w-case1.log"; done
DIPACO_TEST_STOP_AT=push-ack:5 start_coordinator "127.0.0.1:$PORT" "$W/coord1.log"
DIPACO_ADMIN_TOKEN=$(cat "$W/state/admin.token"); export DIPACO_ADMIN_TOKEN
JOB=$("$CTL" job create "$W/spec.json" 2>>"$W/ctl.log")
# 10 ms a step at least: a round's 40 steps take 0.4 s, so the worker that finishes round 1
# second has its round-2 lease before the other's round-2 push (the 5th) stops the coordinator
# (unpaced, a round trained in 30 ms and the slower worker could still be asking for its lease).
start_workers --min-step-ms 10
for _ in $(seq 1 300); do grep -q "test hook: stopped at push-ack" "$W/coord1.log" && break; sleep 0.1; done
grep -q "test hook: stopped at push-ack" "$W/coord1.log" || fail "the coordinator never stopped at push-ack"
# Both workers hold a lease of round 2: the one whose push is unanswered gives it up once the
# connection closes, the other (training, or pushing too) when its heartbeats go unanswered
# for longer than the TTL. Restart only after both did, so that neither push is retried.
gave_up() { for w in 1 2; do grep -q "lease expired or revoked" "$W/worker$w.log" || return 1; done; }
for _ in $(seq 1 100); do grep -q "lease expired or revoked" "$W"/worker*.log && break; sleep 0.1; done
kill -9 $CP
wait $CP 2>/dev/null || true
for _ in $(seq 1 300); do gave_up && break; sleep 0.1; done
gave_up || fail "case 2: a worker did not give its lease up while the coordinator was away"
sleep 1
start_coordinator "127.0.0.1:$PORT" "$W/coord2.log"
"$CTL" job wait "$JOB" --timeout 120 >>"$W/ctl.log" 2>&1 || fail "case 2: the job did not finish after the restart"
for p in "${WP[@]}"; do
  wait "$p" || fail "case 2: a worker exited with status $?"
done
grep -q "had all its deltas in; finished it" "$W/coord2.log" || fail "case 2: the restarted coordinator did not finish the lease"
"$CTL" job export "$JOB" --path 0 --out "$W/out" >>"$W/ctl.log" 2>&1 || fail "case 2: export"
same_as_local "$W/out"
grep -q "its last delta was merged although its push got no answer" "$W"/worker*.log ||
  fail "case 2: the worker did not resume the AdamW state it trained"
echo "worker_restart: a lease given up mid-push whose delta had landed resumes the trained AdamW state"
