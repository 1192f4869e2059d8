#!/usr/bin/env bash
# tests/bench/sparse.sh — SparseLoCo against DiLoCo (docs/benchmarks.md §7): the same data, model,
# inner steps and workers through real daemons on loopback, per row one job; eval loss on
# held-out text and the bytes the coordinator counted as sent both ways (deltas in,
# parameters / sparse rounds out), per trained token, and the ratio to data-parallel (a ring
# all-reduce of fp32 gradients: 2 x 4 bytes x parameters per inner step per worker, over
# batch x seq_len tokens). Rows, each at every H in HS:
#   diloco     DiLoCo, fp32 deltas, outer Nesterov OUTER_LR / OUTER_MU (the job spec's defaults)
#   e3m0       the same with e3m0 (4-bit) deltas
#   sl1 sl2 sl3  SparseLoCo at density 1%, 2%, 3% (2-bit values, chunk 4096, the spec's defaults:
#              ef_beta 0.9, outer plain SGD lr 3, sparse pulls)
#   topk2      top-k at 2% without error feedback (ef_beta 0)
#   sl:D:B:LR  SparseLoCo at density D, ef_beta B, outer plain SGD lr LR (for studies)
# Environment (defaults): HS ("20 100"), ROWS ("diloco e3m0 sl1 sl2 sl3 topk2"), STEPS (inner
# steps per replica, 1200; every H divides it), WORKERS (2 = replicas), L NH C T B V (2 2 128 64
# 8 256: 0.42M parameters), INNER_LR (0.003), WARMUP (50), FILES (24 demo-corpus files),
# EVAL_BATCHES (20), BUILD (build-rel), KEEP (keep the work directory). Prints a Markdown table.
# Time on 2 cores: about 15 minutes for the default table.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
HS=${HS:-"20 100"}; ROWS=${ROWS:-"diloco e3m0 sl1 sl2 sl3 topk2"}; STEPS=${STEPS:-1200}; WORKERS=${WORKERS:-2}
L=${L:-2}; NH=${NH:-2}; C=${C:-128}; T=${T:-64}; B=${B:-8}; V=${V:-256}
INNER_LR=${INNER_LR:-0.003}; WARMUP=${WARMUP:-50}; FILES=${FILES:-24}; EVAL_BATCHES=${EVAL_BATCHES:-20}
BUILD=${BUILD:-build-rel}
work=$(mktemp -d /tmp/sparse_bench.XXXXXX)
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "${KEEP:-}" ] && echo "sparse.sh: work directory $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target dipaco-coordinator dipaco-worker dipacoctl >/dev/null
CO=$ROOT/$BUILD/coordinator/dipaco-coordinator
WK=$ROOT/$BUILD/worker/dipaco-worker
CTL=$ROOT/$BUILD/coordinator/dipacoctl

assets=$(bash deploy/fetch_assets.sh tests/.cache)
"$CTL" data prepare --tokenizer byte --out "$work/data" --val-fraction 0.1 $(ls "$assets"/sotu/*.txt | head -n "$FILES") \
  >/dev/null 2>&1
"$CTL" init --n-layer "$L" --n-head "$NH" --n-embd "$C" --n-positions "$T" --vocab-size "$V" --seed 1 \
  --out "$work/init" 2>"$work/init.log"
NPARAM=$(grep -o '[0-9]* parameters' "$work/init.log" | cut -d' ' -f1)

PORT=$("${DPC_PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$CO" --listen "127.0.0.1:$PORT" --state-dir "$work/state" --insecure-no-auth >"$work/coordinator.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do "$CTL" --coordinator "127.0.0.1:$PORT" status >/dev/null 2>&1 && break; sleep 0.1; done
for i in $(seq 1 "$WORKERS"); do
  "$WK" --coordinator "127.0.0.1:$PORT" --data-dir "$work" --threads 1 --name "w$i" --log-json \
    >"$work/worker-$i.log" 2>&1 &
  PIDS+=($!)
done

# row_spec ROW H: the job spec's algorithm-specific part.
row_spec() {
  case $1 in
    diloco) echo '' ;;
    e3m0) echo ', "streaming": {"codec": "e3m0"}' ;;
    sl1) echo ', "sparse": {"density": 0.01}' ;;
    sl2) echo ', "sparse": {"density": 0.02}' ;;
    sl3) echo ', "sparse": {"density": 0.03}' ;;
    topk2) echo ', "sparse": {"density": 0.02, "ef_beta": 0}' ;;
    sl:*) # sl:DENSITY:EF_BETA:OUTER_LR — a SparseLoCo variant
      IFS=: read -r _ d b lr <<<"$1"
      echo ", \"sparse\": {\"density\": $d, \"ef_beta\": $b}, \"outer\": {\"lr\": $lr, \"momentum\": 0, \"nesterov\": false}" ;;
    *) echo "sparse.sh: unknown row $1" >&2; exit 2 ;;
  esac
}
echo "sparse.sh: $NPARAM parameters, $WORKERS workers, $STEPS inner steps per replica, batch $B x $T tokens" >&2
RES=$work/results.tsv
for H in $HS; do
  [ $((STEPS % H)) -eq 0 ] || { echo "H=$H does not divide STEPS=$STEPS" >&2; exit 2; }
  for row in $ROWS; do
    spec_extra=$(row_spec "$row" "$H")
    cat >"$work/$row-$H.json" <<JSON
{"name": "${row//:/_}-H$H", "model": {"init": "$work/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": $WORKERS, "inner_steps": $H, "rounds": $((STEPS / H)), "batch": $B, "seq_len": $T,
 "inner": {"lr": $INNER_LR, "warmup": $WARMUP, "lr_min_frac": 0.1, "weight_decay": 0.1, "grad_clip": 1.0}$spec_extra}
JSON
    t0=$(date +%s)
    job=$("$CTL" --coordinator "127.0.0.1:$PORT" job create "$work/$row-$H.json" 2>>"$work/ctl.log")
    "$CTL" --coordinator "127.0.0.1:$PORT" job wait "$job" --timeout 3600 >/dev/null
    "$CTL" --coordinator "127.0.0.1:$PORT" job export "$job" --path 0 --out "$work/$row-$H.out" >/dev/null
    show=$("$CTL" --coordinator "127.0.0.1:$PORT" job show "$job" --json)
    loss=$("$CTL" eval --model "$work/$row-$H.out" --data "$work"/data/val_*.bin --batch "$B" --seq-len "$T" \
           --batches "$EVAL_BATCHES" --json 2>/dev/null | "${DPC_PYTHON:-python3}" -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
    io=$("${DPC_PYTHON:-python3}" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["bytes_in"], d["bytes_out"], d["tokens"])' "$show")
    printf '%s\t%s\t%s\t%s\t%s\n' "$H" "$row" "$loss" "$io" "$(( $(date +%s) - t0 ))" | tee -a "$RES" >&2
  done
done

"${DPC_PYTHON:-python3}" tests/bench/sparse_table.py "$RES" "$NPARAM" "$B" "$T" "$STEPS" "$WORKERS"
