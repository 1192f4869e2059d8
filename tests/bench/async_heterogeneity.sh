#!/usr/bin/env bash
# tests/bench/async_heterogeneity.sh — sync DiLoCo vs async Nesterov vs async delayed Nesterov
# (DN) vs DN + DyLU (Liu et al. 2024, Table 1 shape) under four levels of worker heterogeneity,
# at equal total inner steps (rounds × H × R). Each run: a fresh coordinator, one job, 4 real
# workers (--threads 1), each a device of fixed speed (--min-step-ms STEP_MS × its slowdown
# factor, so that the load of the 2-core machine does not decide who is fast); then the final
# model's eval loss on the held-out split (dipacoctl eval), the job's wall-clock time and, for
# async runs, the ledger's staleness mean. Every cell is repeated for SEEDS (model init seeds)
# and shown as mean ± half the range, with the loss as a ratio to sync's (tests/bench/
# async_table.py; Markdown with MD=1). Not part of CI (~15 minutes on 2 cores). Release build
# in build-async-rel.
# Environment: H (default 10), ROUNDS (20), B (8), T (64), C (128), L (2), EVAL_BATCHES (16),
# FILES (number of demo-corpus files, 12), OUTER_LR / OUTER_MU (sync: 0.4 / 0.7), ASYNC_LR /
# ASYNC_MU (the async rules': OUTER_LR / OUTER_MU), DN_N (delay buffer, 0 = the number of
# slots), DN_C (0), H_MIN (DyLU min_steps, H/5), STEP_MS (50: the fastest worker's step time;
# SPEED=slowdown: --slowdown factors of the measured step time instead), LR_MIN_FRAC (0.1),
# SEEDS ("1 2 3"), LEVELS (all four, e.g. "none very"), ALGOS (all four), RESULTS (a file that
# gets one line per run: level algo seed loss wall staleness_mean staleness_max).
set -euo pipefail
cd "$(dirname "$0")/../.."
H=${H:-10}; ROUNDS=${ROUNDS:-20}; B=${B:-8}; T=${T:-64}; C=${C:-128}; L=${L:-2}; NH=2; V=256; R=4
EVAL_BATCHES=${EVAL_BATCHES:-16}; FILES=${FILES:-12}; OUTER_LR=${OUTER_LR:-0.4}; OUTER_MU=${OUTER_MU:-0.7}
ASYNC_LR=${ASYNC_LR:-$OUTER_LR}; ASYNC_MU=${ASYNC_MU:-$OUTER_MU}; DN_N=${DN_N:-0}; DN_C=${DN_C:-0}
H_MIN=${H_MIN:-$(( H / 5 > 0 ? H / 5 : 1 ))}; SEEDS=${SEEDS:-"1 2 3"}
LEVELS=${LEVELS:-"none slight moderate very"}; ALGOS=${ALGOS:-"sync async-nesterov async-dn async-dn-dylu"}
RESULTS=${RESULTS:-}; LR_MIN_FRAC=${LR_MIN_FRAC:-0.1}; STEP_MS=${STEP_MS:-50}
declare -A SLOW=([none]="1 1 1 1" [slight]="1 1.2 1.4 1.6" [moderate]="1 1.5 2 3" [very]="1 1.3 2.6 5.7")
work=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

cmake -S . -B build-async-rel -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-async-rel -j"$(nproc)" --target dipaco-coordinator dipaco-worker dipacoctl >/dev/null
CO=build-async-rel/coordinator/dipaco-coordinator
WK=build-async-rel/worker/dipaco-worker
CTL=build-async-rel/coordinator/dipacoctl
assets=$(bash deploy/fetch_assets.sh tests/.cache)
"$CTL" data prepare --tokenizer byte --out "$work/data" --val-fraction 0.1 $(ls "$assets"/sotu/*.txt | head -n "$FILES") 2>/dev/null
VAL=$(ls "$work"/data/val_*.bin)

# run ALGO LEVEL SEED -> prints "loss wall_s staleness_mean staleness_max"
run() {
  local algo=$1 level=$2 seed=$3 d="$work/run_$1_$2_$3"
  mkdir -p "$d"
  local outer dy="" alg=diloco-async
  local dn="\"rule\": \"delayed-nesterov\", \"lr\": $ASYNC_LR, \"momentum\": $ASYNC_MU, \"delay_buffer\": $DN_N, \"c\": $DN_C"
  case $algo in
    sync) alg=diloco; outer="\"lr\": $OUTER_LR, \"momentum\": $OUTER_MU, \"nesterov\": true" ;;
    async-nesterov) outer="\"rule\": \"nesterov\", \"lr\": $ASYNC_LR, \"momentum\": $ASYNC_MU" ;;
    async-dn) outer=$dn ;;
    async-dn-dylu) outer=$dn; dy=", \"dylu\": {\"enabled\": true, \"min_steps\": $H_MIN}" ;;
  esac
  cat > "$d/spec.json" <<JSON
{"name": "bench", "model": {"init": "$work/init_$seed"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "$alg", "replicas": $R, "inner_steps": $H, "rounds": $ROUNDS, "batch": $B, "seq_len": $T,
 "inner": {"lr": 0.003, "warmup": $H, "lr_min_frac": $LR_MIN_FRAC, "state": "keep"},
 "outer": {$outer}$dy}
JSON
  local port
  port=$("${DPC_PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$CO" --listen "127.0.0.1:$port" --state-dir "$d/state" --heartbeat-ms 200 --insecure-no-auth \
    2>"$d/coord.log" >/dev/null &
  local cpid=$!
  PIDS+=("$cpid")
  export DIPACO_COORDINATOR=127.0.0.1:$port
  for _ in $(seq 1 100); do "$CTL" status >/dev/null 2>&1 && break; sleep 0.1; done
  local job
  job=$("$CTL" job create "$d/spec.json" --paused 2>>"$d/ctl.log") || { echo "create failed" >&2; cat "$d/ctl.log" >&2; exit 1; }
  local i=0 wp=()
  for x in ${SLOW[$level]}; do
    i=$((i + 1))
    # A device of fixed speed: every inner step takes STEP_MS × the worker's slowdown factor
    # (sleeping what the computation leaves), whatever else the machine runs.
    # (SPEED=slowdown: --slowdown factor × the measured step time instead.)
    local speed=(--min-step-ms "$("${DPC_PYTHON:-python3}" -c "print($STEP_MS * $x)")")
    [ "${SPEED:-}" != slowdown ] || speed=(--slowdown "$x")
    "$WK" --coordinator "127.0.0.1:$port" --data-dir "$work" --threads 1 --name "w$i" "${speed[@]}" \
      --exit-when-done --poll-ms 200 --log-json 2>"$d/worker$i.log" &
    wp+=($!); PIDS+=($!)
  done
  sleep 1 # all workers registered before the clock starts
  local t0 t1
  t0=$(date +%s.%N)
  "$CTL" job resume "$job" >>"$d/ctl.log" 2>&1
  "$CTL" job wait "$job" --timeout 1800 --poll-ms 50 >>"$d/ctl.log" 2>&1 || { echo "job failed: $d" >&2; tail "$d"/*.log >&2; exit 1; }
  t1=$(date +%s.%N)
  "$CTL" job export "$job" --path 0 --out "$d/out" >>"$d/ctl.log" 2>&1
  local stale="- -"
  if [ "$algo" != sync ]; then
    stale=$("$CTL" job ledger "$job" --json 2>/dev/null |
            "${DPC_PYTHON:-python3}" -c 'import json,sys; s=json.load(sys.stdin)["summary"]; print("%.2f %d" % (s["staleness_mean"], s["staleness_max"]))')
  fi
  for p in "${wp[@]}"; do wait "$p" || true; done
  kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null || true
  local loss
  loss=$("$CTL" eval --model "$d/out" --data $VAL --batch $B --seq-len $T --batches "$EVAL_BATCHES" --threads 2 --json 2>/dev/null |
         "${DPC_PYTHON:-python3}" -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["loss"])')
  echo "$loss $("${DPC_PYTHON:-python3}" -c "print('%.1f' % ($t1 - $t0))") $stale"
}

for seed in $SEEDS; do
  "$CTL" init --n-layer $L --n-head $NH --n-embd $C --n-positions $T --vocab-size $V --seed "$seed" \
    --out "$work/init_$seed" 2>/dev/null
done
echo "async_heterogeneity: GPT-2 L=$L C=$C T=$T byte vocab, B=$B, R=$R workers, H=$H, rounds=$ROUNDS" \
     "($((ROUNDS * H * R)) inner steps per run); sync outer lr $OUTER_LR momentum $OUTER_MU;" \
     "async outer lr $ASYNC_LR momentum $ASYNC_MU, DN N=$DN_N (0 = slots) c=$DN_C, DyLU min_steps $H_MIN;" \
     "seeds $SEEDS" >&2
all="$work/results.txt"
: > "$all"
for level in $LEVELS; do
  for seed in $SEEDS; do
    for algo in $ALGOS; do
      read -r loss wall smean smax < <(run "$algo" "$level" "$seed")
      line="$level $algo $seed $loss $wall $smean $smax"
      echo "  $line" >&2
      echo "$line" >> "$all"
      [ -z "$RESULTS" ] || echo "$line" >> "$RESULTS"
    done
  done
done
"${DPC_PYTHON:-python3}" "$(dirname "$0")/async_table.py" "$all" --algos "$ALGOS" ${MD:+--markdown}
