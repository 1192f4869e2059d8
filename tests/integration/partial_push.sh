#!/usr/bin/env bash
# partial_push.sh COORDINATOR WORKER DIPACOCTL — in a sync DiLoCo job whose
# deltas are weighted by tokens ("weighting": "tokens", "quorum": 0.5), a worker that gets
# SIGTERM mid-round pushes the delta of the K inner steps it trained (0 < K < H) and exits 0;
# round 0 merges it beside the other slot's whole round (two deltas, nothing missed), and
# `job show` counts it in the goodput: of the rounds x R x H inner steps leased, exactly
# H - K are not merged. The same SIGTERM in an exact job (uniform weighting, the default)
# releases the lease instead: no partial delta, and the slot's round is trained again. (Both
# with --drain-finish-s 0.) With the worker's default --drain-finish-s (the rest of the round
# takes ~1 s here), the SIGTERMed worker of an exact job finishes its round and pushes it
# instead: every inner step leased is merged and no round is trained twice.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs partial_push 20 "$@"; }

H=100; ROUNDS=2; R=2
make_corpus "$W/corpus"
spec() { # NAME EXTRA_FIELDS
  cat <<JSON
{"name": "$1", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 4},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": $R, "inner_steps": $H,
 "rounds": $ROUNDS, "batch": 2, "seq_len": 16, "inner": {"lr": 0.003}$2}
JSON
}
spec tokens ', "weighting": "tokens", "quorum": 0.5, "quorum_grace_s": 60' > "$W/tokens.json"
spec exact '' > "$W/exact.json"
spec finish '' > "$W/finish.json"
start_coordinator "$W/state" --heartbeat-ms 200 || fail "coordinator"

# preempt JOB TAG [FLAGS...] — start two workers on JOB (20 ms steps: a round takes 2 s),
# SIGTERM the second (started with FLAGS) mid-round 0; it must exit 0. Then a third worker
# takes over; wait for the job.
preempt() {
  local job=$1 tag=$2; shift 2
  start_worker "${tag}a" "$W/corpus" --min-step-ms 20 --exit-when-done; local a=$LAST_WORKER_PID
  start_worker "${tag}b" "$W/corpus" --min-step-ms 20 --grace-s 20 "$@"; local b=$LAST_WORKER_PID
  wait_for_line "$W/worker-${tag}b.log" "lease [0-9]+ pulled" 60 || fail "$tag: worker b never started training"
  sleep 0.6
  kill -TERM "$b"
  local rc=0; wait "$b" || rc=$?
  [ $rc = 0 ] || fail "$tag: worker b exited $rc after SIGTERM, expected 0"
  start_worker "${tag}c" "$W/corpus" --min-step-ms 20 --exit-when-done
  "$CTL" --coordinator "$COORD" job wait "$job" --timeout 120 >/dev/null || fail "$tag: job $job did not finish"
}

# ---- 1: token-weighted quorum job: the partial delta merges
JOB=$("$CTL" --coordinator "$COORD" job create "$W/tokens.json")
preempt "$JOB" t --drain-finish-s 0
K=$(sed -n "s/.*pushing the partial delta of \([0-9]*\) of $H inner steps.*/\1/p" "$W/worker-tb.log" | head -n 1)
[ -n "$K" ] && [ "$K" -gt 0 ] && [ "$K" -lt $H ] || fail "the SIGTERMed worker pushed no partial delta (K='$K')"
grep -Eq "pushed [0-9]+ bytes in [0-9]+ ms: accepted" "$W/worker-tb.log" || fail "the partial delta was not accepted"
echo "ok: SIGTERM mid-round: partial delta of $K/$H steps pushed and accepted"
ledger=$("$CTL" --coordinator "$COORD" job ledger "$JOB")
n1=$(grep -Ec '^1 ' <<<"$ledger" || true)
[ "$n1" = 2 ] || { echo "$ledger"; fail "round 0 merged $n1 deltas; want 2 (the partial one too)"; }
grep -q " 0 missed" <<<"$ledger" && ! grep -q "^missed" <<<"$ledger" || { echo "$ledger"; fail "a slot missed a round"; }
show=$("$CTL" --coordinator "$COORD" job show "$JOB" --json)
read -r leased merged <<<"$($PY -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["steps_leased"], j["steps_merged"])' "$show")"
want_leased=$(( ROUNDS * R * H )); want_merged=$(( ROUNDS * R * H - (H - K) ))
[ "$leased" = "$want_leased" ] && [ "$merged" = "$want_merged" ] \
  || fail "goodput: steps leased $leased (want $want_leased), merged $merged (want $want_merged)"
"$CTL" --coordinator "$COORD" job show "$JOB" | grep -E '^goodput' || fail "job show prints no goodput line"
echo "ok: round 0 merged both slots; goodput $merged / $leased inner steps"

# ---- 2: exact job: the SIGTERM releases the lease; the slot's round is trained again
JOB2=$("$CTL" --coordinator "$COORD" job create "$W/exact.json")
preempt "$JOB2" e --drain-finish-s 0
! grep -q "pushing the partial delta" "$W/worker-eb.log" || fail "the exact job's worker pushed a partial delta"
grep -Eq "stopping: releasing it at step" "$W/worker-eb.log" || fail "the exact job's worker did not release its lease"
ledger=$("$CTL" --coordinator "$COORD" job ledger "$JOB2")
[ "$(grep -Ec '^1 ' <<<"$ledger" || true)" = 2 ] || { echo "$ledger"; fail "the exact job's round 0 lacks a slot"; }
show=$("$CTL" --coordinator "$COORD" job show "$JOB2" --json)
read -r leased merged <<<"$($PY -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["steps_leased"], j["steps_merged"])' "$show")"
[ "$merged" = $(( ROUNDS * R * H )) ] && [ "$leased" = $(( ROUNDS * R * H + H )) ] \
  || fail "exact goodput: steps leased $leased (want $(( ROUNDS * R * H + H ))), merged $merged (want $(( ROUNDS * R * H )))"
echo "ok: exact job: lease released, round trained again; goodput $merged / $leased inner steps"

# ---- 3: exact job, default --drain-finish-s: the SIGTERMed worker finishes its round
JOB3=$("$CTL" --coordinator "$COORD" job create "$W/finish.json")
preempt "$JOB3" f
grep -Eq "stopping after this lease: finishing its [0-9]+ inner steps left" "$W/worker-fb.log" \
  || fail "the SIGTERMed worker did not finish its lease"
! grep -q "stopping: releasing it at step" "$W/worker-fb.log" || fail "the SIGTERMed worker released its lease"
grep -Eq "pushed [0-9]+ bytes in [0-9]+ ms: accepted" "$W/worker-fb.log" || fail "the finished round was not accepted"
[ "$(grep -c "granted" "$W/worker-fb.log")" = 1 ] || fail "the SIGTERMed worker took another lease"
show=$("$CTL" --coordinator "$COORD" job show "$JOB3" --json)
read -r leased merged <<<"$($PY -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["steps_leased"], j["steps_merged"])' "$show")"
[ "$merged" = $(( ROUNDS * R * H )) ] && [ "$leased" = "$merged" ] \
  || fail "finish on SIGTERM: steps leased $leased, merged $merged (want both $(( ROUNDS * R * H )))"
echo "ok: exact job, SIGTERM mid-round: the worker finished its round, pushed it and exited 0; goodput $merged / $leased"
echo "partial_push: OK"
