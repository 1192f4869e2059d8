#!/usr/bin/env bash
# chaos.sh COORDINATOR WORKER DIPACOCTL [--long] — the reliability test of record (docs/design.md
# §5). A tiny sync DiLoCo job (R=3 replicas, 4 workers, inner.state
# "checkpoint", CPU backend, one thread per worker) runs fault-free and is exported; then the
# same job runs again while a driver SIGKILLs random workers (>= 20 times) and the coordinator
# (>= 5 times) at random moments, restarting each at once (workers under the same name, a new
# identity; the coordinator on the same state directory and address). The exported
# parameters must be byte-identical (cmp) and the job's delta ledger must show every
# (round, replica) delta applied exactly once and every acknowledged delta applied
# (tests/integration/ledger_check.py, which also checks that no half-written blob or round
# is left).
#
# The driver's RNG is seeded and the seed printed: CHAOS_SEED=N reruns the same kill schedule
# (the moments still depend on timing). CI mode: 60 rounds, 20 + 5 kills, well under a minute
# on 2 cores. --long (or CHAOS_LONG=1): 150 rounds, 100 worker and 25 coordinator kills, for
# manual runs. CHAOS_ROUNDS / CHAOS_WORKER_KILLS / CHAOS_COORD_KILLS override the numbers;
# CHAOS_INNER_STATE=keep runs both jobs with inner.state "keep", a manual check that the test
# fails when killed workers lose their AdamW state (keep reserves slots, so the idle spare
# worker's kills cost nothing: give it CHAOS_ROUNDS=80). CHAOS_ALGO=async runs a diloco-async
# job (delayed Nesterov) with one slot and two workers instead: with no one to be stale against
# it is deterministic, so it too must end byte-identical, staleness 0 throughout
# (ledger_check.py --async). CHAOS_ALGO=streaming runs a Streaming DiLoCo job (2 layers in two
# sync groups, overlap_steps 1, alpha 0.5, e3m0 deltas) under the same kills, CHAOS_ALGO=sparse
# a SparseLoCo job (error-feedback buffers through the checkpoint, sparse pulls), CHAOS_ALGO=replay
# a sync job with e3m0 deltas and a momentum schedule whose workers catch up by replay pulls,
# against a fault-free run that pulls whole (pulls.replay false).
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
LONG=${CHAOS_LONG:-0}
[ "${4:-}" = --long ] && LONG=1
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/../integration/lib.sh"

if [ "$LONG" = 1 ]; then ROUNDS=150; WK=100; CK=25; else ROUNDS=60; WK=20; CK=5; fi
ROUNDS=${CHAOS_ROUNDS:-$ROUNDS}; WK=${CHAOS_WORKER_KILLS:-$WK}; CK=${CHAOS_COORD_KILLS:-$CK}
R=3; NW=4; ALG=diloco; OUTER='"lr": 0.7, "momentum": 0.9, "nesterov": true'; CHECK=(); NL=1; STREAMING=''
if [ "${CHAOS_ALGO:-sync}" = streaming ]; then
  # Streaming DiLoCo: two sync groups (one layer each), overlap 1, e3m0 deltas; the checkpoint
  # carries each slot's local parameters too.
  NL=2; STREAMING=', "streaming": {"fragments": 2, "overlap_steps": 1, "alpha": 0.5, "codec": "e3m0"}'
fi
if [ "${CHAOS_ALGO:-sync}" = sparse ]; then
  # SparseLoCo: 5% top-k deltas with 2-bit values, plain SGD outer steps (sparse pulls), the
  # error-feedback buffers in the checkpoint.
  OUTER='"lr": 2.0, "momentum": 0, "nesterov": false'
  STREAMING=', "sparse": {"density": 0.05, "chunk": 4096, "value_bits": 2, "ef_beta": 0.95}'
fi
if [ "${CHAOS_ALGO:-sync}" = replay ]; then
  # Replay pulls: e3m0 deltas with outer Nesterov momentum, so that workers catch up by
  # replaying rounds (docs/design.md §4.4); the fault-free reference pulls whole
  # (pulls.replay false), so the kills run replay against full pulls, byte for byte.
  STREAMING=', "streaming": {"codec": "e3m0"}'
  # ... and the outer momentum on a schedule (warm-up over the first sixth of the rounds, decay
  # over the last third), which the coordinator's steps after a restart and the workers'
  # replays follow.
  OUTER="$OUTER, \"momentum_warmup\": $(( ROUNDS / 6 )), \"momentum_decay\": $(( ROUNDS / 3 ))"
fi
if [ "${CHAOS_ALGO:-sync}" = async ]; then
  R=1; NW=2; ALG=diloco-async; OUTER='"rule": "delayed-nesterov", "lr": 0.7, "momentum": 0.9, "c": 0'; CHECK=(--async)
  # One slot trains a third of the sync job's steps per round: more rounds, so that the kills
  # land before the job ends.
  ROUNDS=${CHAOS_ROUNDS:-$(( ROUNDS * 3 ))}
fi
# CHAOS_OPTIMIZER=muon: the inner optimizer is Muon (MuLoCo); its momentum buffers travel in the
# checkpointed inner state like AdamW's moments.
INNER_OPT=''
[ "${CHAOS_OPTIMIZER:-adamw}" = muon ] && INNER_OPT=', "optimizer": "muon", "muon": {"lr": 0.02}'
SEED=${CHAOS_SEED:-$(( $(od -An -N2 -tu2 /dev/urandom) ))}
RANDOM=$SEED
echo "chaos: seed $SEED (rerun with CHAOS_SEED=$SEED), $ROUNDS rounds, >= $WK worker and >= $CK coordinator kills"
COORD_FLAGS=(--lease-ttl-ms 1500 --heartbeat-ms 150)
# CHAOS_STORE=s3 (run under tests/s3/with_rgw.sh): the blobs live on the RADOS Gateway, and
# CHAOS_GW_KILLS (default 3) of the kills SIGKILL the gateway itself, restarted at once.
GK=0; REF_FLAGS=("${COORD_FLAGS[@]}")
if [ "${CHAOS_STORE:-local}" = s3 ]; then
  : "${S3_ENDPOINT:?CHAOS_STORE=s3 runs under tests/s3/with_rgw.sh}"
  bash "$HERE/../s3/s3curl.sh" -X PUT "$S3_ENDPOINT/dpc-chaos" >/dev/null
  REF_FLAGS+=(--blob-store s3://dpc-chaos/ref --s3-endpoint "$S3_ENDPOINT")
  COORD_FLAGS+=(--blob-store s3://dpc-chaos/run --s3-endpoint "$S3_ENDPOINT")
  GK=${CHAOS_GW_KILLS:-3}
  # Every blob is a round trip to the gateway: fewer rounds and kills keep the test short.
  ROUNDS=${CHAOS_ROUNDS:-30}; WK=${CHAOS_WORKER_KILLS:-10}; CK=${CHAOS_COORD_KILLS:-3}
  echo "chaos on S3: $ROUNDS rounds, >= $WK worker, >= $CK coordinator and >= $GK gateway kills"
fi

make_corpus "$W/corpus"
"$CTL" init --n-layer $NL --n-head 2 --n-embd 32 --n-positions 16 --vocab-size 256 --seed 13 --out "$W/init" 2>/dev/null
# spec FILE PULLS — the job spec, with PULLS (', "pulls": {...}' or nothing) at its end.
spec() {
  cat > "$1" <<JSON
{"name": "chaos", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "$ALG", "replicas": $R, "inner_steps": 4, "rounds": $ROUNDS, "batch": 2, "seq_len": 16,
 "round_timeout_s": 0,
 "inner": {"lr": 0.01, "warmup": 3, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "${CHAOS_INNER_STATE:-checkpoint}"$INNER_OPT},
 "outer": {$OUTER}$STREAMING$2}
JSON
}
spec "$W/spec.json" ''
spec "$W/spec-ref.json" ''
if [ "${CHAOS_ALGO:-sync}" = replay ]; then spec "$W/spec-ref.json" ', "pulls": {"replay": false}'; fi
fail() { die_with_logs "chaos (seed $SEED)" 20 "$@"; }
# job_status JOB — "ROUND STATE" from one job show call ("0 ?" while the coordinator is away).
job_status() {
  local j; j=$("$CTL" --coordinator "$COORD" job show "$1" --json 2>/dev/null || true)
  local r; r=$(sed -n 's/.*"round":\([0-9]*\).*/\1/p' <<<"$j")
  local st; st=$(sed -n 's/.*"state":"\([A-Z_]*\)".*/\1/p' <<<"$j")
  echo "${r:-0} ${st:-?}"
}

# 1. Fault-free.
t0=$(date +%s%N)
start_coordinator "$W/ref" "${REF_FLAGS[@]}"
REF=()
for i in $(seq 1 $NW); do start_worker "ref$i" "$W/corpus" --exit-when-done; REF+=("$LAST_WORKER_PID"); done
job=$("$CTL" --coordinator "$COORD" job create "$W/spec-ref.json")
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 300 >/dev/null || fail "the fault-free job did not finish"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export-ref" >/dev/null
kill_wait "${REF[@]}" "$COORD_PID"
mv "$W/coordinator.log" "$W/coordinator-ref.log"
ff_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "fault-free run: $ff_ms ms"
# Kill pacing from this machine's speed, re-planned before every kill: the job has about
# (rounds left) x (the fault-free run's ms per round) to go; the kills left are spread over the
# first two thirds of that, less what the kills themselves take (a running mean of each kill's own
# time: SIGKILL, restart, status call). A fast or a slow machine delivers them all before the
# job ends; when the time is short the kills come back to back.
ms_round=$(( ff_ms / ROUNDS )); [ $ms_round -lt 1 ] && ms_round=1
cost=200

# 2. The same job under fire.
t0=$(date +%s%N)
start_coordinator "$W/state" "${COORD_FLAGS[@]}"
WP=()
for i in $(seq 1 $NW); do start_worker "w$i" "$W/corpus"; WP+=("$LAST_WORKER_PID"); done
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
wk=0; ck=0; gk=0; last_r=0
while [ $wk -lt "$WK" ] || [ $ck -lt "$CK" ] || [ $gk -lt "$GK" ]; do
  left_w=$(( WK - wk )); left_c=$(( CK - ck )); left_g=$(( GK - gk )); left=$(( left_w + left_c + left_g ))
  read -r r st <<<"$(job_status "$job")"
  [ "$st" = "?" ] && r=$last_r # the coordinator is restarting: the last round seen
  last_r=$r
  if [ "$st" = DONE ]; then
    fail "the job finished after only $wk worker and $ck coordinator kills (want $WK and $CK): raise CHAOS_ROUNDS"
  fi
  # A random moment: 0..2 x the mean gap the plan leaves (at most 350 ms).
  budget=$(( (ROUNDS - r) * ms_round * 2 / 3 - left * cost ))
  gap_mean=0; [ $budget -gt 0 ] && gap_mean=$(( budget / left )); [ $gap_mean -gt 350 ] && gap_mean=350
  sleep "0.$(printf '%03d' $(( RANDOM % (2 * gap_mean + 1) )))"
  k0=$(date +%s%N)
  pick=$(( RANDOM % left ))
  if [ $pick -lt $left_g ]; then
    gk=$((gk + 1))
    echo "kill $((wk + ck + gk)): the S3 gateway (#$gk) at round $(grep -c 'round [0-9]* closed' "$W/coordinator.log" || true)"
    bash "$HERE/../s3/rgw.sh" restart-gw "$RGW_DIR" >/dev/null || fail "the S3 gateway did not come back"
  elif [ $left_c -gt 0 ] && [ $(( pick - left_g )) -lt $left_c ]; then
    kill_wait "$COORD_PID"
    ck=$((ck + 1))
    echo "kill $((wk + ck + gk)): coordinator (#$ck) at round $(grep -c 'round [0-9]* closed' "$W/coordinator.log" || true)"
    sleep "0.$(printf '%03d' $(( RANDOM % (gap_mean + 1) )))"
    restart_coordinator "$W/state" "${COORD_FLAGS[@]}" || fail "the coordinator did not come back"
  else
    i=$(( RANDOM % NW ))
    kill_wait "${WP[$i]}"
    wk=$((wk + 1))
    echo "kill $((wk + ck + gk)): worker w$((i + 1)) (#$wk)"
    start_worker "w$((i + 1))" "$W/corpus"; WP[$i]=$LAST_WORKER_PID
  fi
  cost=$(( (3 * cost + ($(date +%s%N) - k0) / 1000000) / 4 ))
done
echo "chaos: $wk worker, $ck coordinator and $gk gateway SIGKILLs delivered; letting the job finish"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 300 >/dev/null || fail "the job did not finish after the kills"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export-chaos" >/dev/null
"$CTL" --coordinator "$COORD" job ledger "$job" --json > "$W/ledger.json"
echo "chaos run: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
resumed=$(cat "$W"/worker-w*.log | grep -c "resumed the slot's AdamW state" || true)
echo "workers resumed a slot's AdamW state from its checkpoint $resumed times"
if [ "${CHAOS_STORE:-local}" = s3 ]; then # ... reading it from the store, not through the coordinator
  fromstore=$(cat "$W"/worker-w*.log | grep -c "inner state of fragment [0-9]* read from the object store" || true)
  echo "of which the inner state was read from the object store: $fromstore fragment(s)"
  [ "$resumed" = 0 ] || [ "$fromstore" -gt 0 ] || fail "no worker read a checkpoint from the object store"
fi
cmp "$W/export-ref/model.safetensors" "$W/export-chaos/model.safetensors" \
  || fail "the parameters after the chaos run differ from the fault-free run"
echo "exported parameters byte-identical to the fault-free run"
if [ "${CHAOS_ALGO:-sync}" = replay ]; then
  n_rp=$(cat "$W"/worker-w*.log | grep -c "replayed from their rounds" || true)
  echo "leases that replayed their rounds under the kills: $n_rp"
  [ "$n_rp" -ge 5 ] || fail "only $n_rp leases replayed rounds"
fi
CHECK_STATE=$W/state
if [ "${CHAOS_STORE:-local}" = s3 ]; then
  # The ledger check reads blobs from a state directory: mirror the bucket's objects into one.
  CHECK_STATE=$W/state-mirror
  bash "$HERE/../s3/mirror.sh" dpc-chaos run "$W/state" "$CHECK_STATE" || fail "cannot mirror the bucket"
fi
"${DPC_PYTHON:-python3}" "$HERE/../integration/ledger_check.py" "${CHECK[@]}" "$W/ledger.json" "$CHECK_STATE" "$job" "$ROUNDS" $R "$W"/worker-w*.log \
  || fail "ledger check"
echo "chaos: OK (seed $SEED)"
