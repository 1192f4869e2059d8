#!/usr/bin/env bash
# worker_sigterm.sh COORDINATOR WORKER DIPACOCTL — preemption of dipaco-worker in an async job
# (diloco-async, R=1, H=1000, 2 rounds):
#  1. SIGTERM mid-round: the worker pushes the partial delta of the K inner steps it completed
#     (0 < K < H), exits 0 within its grace period; the coordinator applies it (version 1 in
#     the ledger) and counts K steps for the slot: the slot's next lease starts at step K;
#  2. SIGTERM while a worker waits in a Lease long-poll (--poll-ms 20000; the only slot is
#     leased to another worker): it exits 0 at once (under 2 s), not when the poll ends, and
#     tells the coordinator it is leaving (Release with lease 0: counted gone at once);
# (1 and 3 with --drain-finish-s 0: the worker stops instead of finishing its lease.)
#  3. a second preempted worker, then a fresh one: the job ends DONE after exactly
#     rounds x H x R = 2000 inner steps in all.
# (Sync mode, where a SIGTERM releases the lease and pushes nothing, is checked by
# tests/unit/test_worker.c against a fake coordinator and by checkpoint_e2e.)
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs worker_sigterm 12 "$@"; }
now_ms() { date +%s%3N; }

make_corpus "$W/corpus"
cat > "$W/spec.json" <<JSON
{"name": "sigterm", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 2},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco-async", "replicas": 1, "inner_steps": 1000,
 "rounds": 2, "batch": 4, "seq_len": 16, "inner": {"lr": 0.003}}
JSON
start_coordinator "$W/state" --lease-ttl-ms 5000 --heartbeat-ms 200
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")

# ---- 1: SIGTERM mid-round
start_worker w1 "$W/corpus" --slowdown 10 --grace-s 20 --drain-finish-s 0; w1=$LAST_WORKER_PID
wait_for_line "$W/worker-w1.log" "lease [0-9]+ pulled" 60 || fail "w1 never started training"
sleep 0.5
t0=$(now_ms)
kill -TERM "$w1"
rc=0; wait "$w1" || rc=$?
dt=$(( $(now_ms) - t0 ))
[ $rc = 0 ] || fail "w1 exited $rc after SIGTERM, expected 0"
K=$(sed -n 's/.*pushing the partial delta of \([0-9]*\) of 1000 inner steps.*/\1/p' "$W/worker-w1.log" | head -n 1)
[ -n "$K" ] && [ "$K" -gt 0 ] && [ "$K" -lt 1000 ] || fail "w1 did not push a partial delta (K='$K')"
grep -Eq "pushed [0-9]+ bytes in [0-9]+ ms: accepted" "$W/worker-w1.log" || fail "the partial delta was not accepted"
echo "ok: 1: SIGTERM mid-round: partial delta of $K/1000 steps pushed and accepted, exit 0 after $dt ms"
for _ in $(seq 1 100); do
  "$CTL" --coordinator "$COORD" job ledger "$JOB" | grep -Eq '^1 ' && break
  sleep 0.1
done
"$CTL" --coordinator "$COORD" job ledger "$JOB" | grep -Eq '^1 ' || fail "the partial delta was not applied (no version 1 in the ledger)"

# ---- 2: SIGTERM during a Lease long-poll
start_worker w2 "$W/corpus" --slowdown 8 --drain-finish-s 0; w2=$LAST_WORKER_PID # holds the only slot meanwhile
wait_for_line "$W/worker-w2.log" "lease [0-9]+ granted" 60 || fail "w2 got no lease"
grep -Eq "lease [0-9]+ granted: job $JOB round 1 slot \(0,0\) steps $K\.\." "$W/worker-w2.log" ||
  fail "the slot's next lease does not start at step $K: $(grep granted "$W/worker-w2.log")"
echo "ok: 1: the slot's next lease starts at step $K (the coordinator counted the partial work)"
start_worker w3 "$W/corpus" --poll-ms 20000; w3=$LAST_WORKER_PID
wait_for_line "$W/worker-w3.log" "registered with" 30 || fail "w3 did not register"
sleep 1
grep -Eq "lease [0-9]+ granted" "$W/worker-w3.log" && fail "w3 got a lease: the long-poll case did not happen"
t0=$(now_ms)
kill -TERM "$w3"
rc=0; wait "$w3" || rc=$?
dt=$(( $(now_ms) - t0 ))
[ $rc = 0 ] || fail "w3 exited $rc after SIGTERM in a long-poll, expected 0"
[ $dt -lt 2000 ] || fail "w3 took $dt ms to exit from a Lease long-poll"
w3id=$(sed -n 's/.*registered with .* as worker \([0-9]*\) .*/\1/p' "$W/worker-w3.log" | head -1)
grep -Eq "worker $w3id is shutting down \(no lease\)" "$W/coordinator.log" \
  || fail "w3 did not tell the coordinator it was leaving (Release with lease 0)"
echo "ok: 2: SIGTERM during a Lease long-poll: exit 0 after $dt ms; the coordinator counts the worker gone"

# ---- 3: w2 is preempted too; w4 finishes the job with the right amount of compute
kill -TERM "$w2"
rc=0; wait "$w2" || rc=$?
[ $rc = 0 ] || fail "w2 exited $rc after SIGTERM"
grep -q "pushing the partial delta" "$W/worker-w2.log" || fail "w2 did not push its partial delta"
start_worker w4 "$W/corpus" --exit-when-done; w4=$LAST_WORKER_PID
rc=0; wait "$w4" || rc=$?
[ $rc = 0 ] || fail "w4 exited $rc"
"$CTL" --coordinator "$COORD" job show "$JOB" | grep -Eq '^state +DONE' || fail "job not DONE"
steps=$("$CTL" --coordinator "$COORD" paths "$JOB" --json | "$PY" -c 'import json,sys; print(sum(s["step"] for p in json.load(sys.stdin)["paths"] for s in p["slots"]))')
[ "$steps" = 2000 ] || fail "the slot trained $steps inner steps, expected 2000"
echo "ok: 3: job DONE after 2000 inner steps"
echo "worker_sigterm: OK"
