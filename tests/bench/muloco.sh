#!/usr/bin/env bash
# tests/bench/muloco.sh — MuLoCo (Muon inner optimizer) against AdamW-DiLoCo (docs/benchmarks.md
# §11): the quickstart's GPT-2 (4 layers, 4 heads, C 128, T 128, batch 8) on the quickstart's
# corpus, through real daemons on loopback (a coordinator and WORKERS CPU workers), one job per
# row, each with fp32 deltas, e3m0 (4-bit) deltas and SparseLoCo 2% (2-bit values); eval loss on
# held-out text and the bytes the coordinator counted both ways per trained token. Rows:
#   adamw-fp32 adamw-e3m0 adamw-sl2   AdamW inner (inner.lr), the spec's default outer rule
#                                     (Nesterov 0.6 / 0.7 with the momentum schedule; SparseLoCo:
#                                     its default plain SGD lr 3)
#   muon-fp32 muon-e3m0 muon-sl2      Muon on the block matrices (inner.muon.lr MUON_LR, the rest
#                                     AdamW at inner.lr), outer Nesterov 0.8 / 0.7 as the MuLoCo
#                                     paper uses (SparseLoCo: plain SGD lr 3 as above)
# Environment (defaults): ROWS (all six), H (30), STEPS (inner steps per replica, 1200; H divides
# it), WORKERS (2), INNER_LR (0.003), MUON_LR (0.02), WARMUP (50), FILES (24 corpus files),
# EVAL_BATCHES (20), BUILD (build-rel), KEEP (keep the work directory). Prints a Markdown table.
# Time on 2 cores: at STEPS=600 (the recorded run, tests/bench/muloco_results.txt) about 10
# minutes for the six rows (AdamW rows ~1 minute, Muon rows ~2); the default STEPS 1200 doubles it.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
ROWS=${ROWS:-"adamw-fp32 muon-fp32 adamw-e3m0 muon-e3m0 adamw-sl2 muon-sl2"}
H=${H:-30}; STEPS=${STEPS:-1200}; WORKERS=${WORKERS:-2}
L=4; NH=4; C=128; T=128; B=8; V=256
INNER_LR=${INNER_LR:-0.003}; MUON_LR=${MUON_LR:-0.02}; WARMUP=${WARMUP:-50}; FILES=${FILES:-24}
EVAL_BATCHES=${EVAL_BATCHES:-20}; BUILD=${BUILD:-build-rel}; PY=${DPC_PYTHON:-python3}
work=$(mktemp -d /tmp/muloco_bench.XXXXXX)
PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "${KEEP:-}" ] && echo "muloco.sh: work directory $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
[ $((STEPS % H)) -eq 0 ] || { echo "muloco.sh: H=$H does not divide STEPS=$STEPS" >&2; exit 2; }

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target dipaco-coordinator dipaco-worker dipacoctl >/dev/null
CO=$ROOT/$BUILD/coordinator/dipaco-coordinator
WK=$ROOT/$BUILD/worker/dipaco-worker
CTL=$ROOT/$BUILD/coordinator/dipacoctl

assets=$(bash deploy/fetch_assets.sh tests/.cache)
"$CTL" data prepare --tokenizer byte --out "$work/data" --val-fraction 0.1 $(ls "$assets"/sotu/*.txt | head -n "$FILES") \
  >/dev/null 2>&1
"$CTL" init --n-layer $L --n-head $NH --n-embd $C --n-positions $T --vocab-size $V --seed 1 --out "$work/init" \
  2>"$work/init.log"
NPARAM=$(grep -o '[0-9]* parameters' "$work/init.log" | cut -d' ' -f1)

PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$CO" --listen "127.0.0.1:$PORT" --state-dir "$work/state" --insecure-no-auth >"$work/coordinator.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do "$CTL" --coordinator "127.0.0.1:$PORT" status >/dev/null 2>&1 && break; sleep 0.1; done
for i in $(seq 1 "$WORKERS"); do
  "$WK" --coordinator "127.0.0.1:$PORT" --data-dir "$work" --threads 1 --name "w$i" --log-json \
    >"$work/worker-$i.log" 2>&1 &
  PIDS+=($!)
done

# row_spec ROW: the inner optimizer's fields, then the rest of the spec after "inner".
row_spec() {
  local opt codec
  IFS=- read -r opt codec <<<"$1"
  case $opt in
    adamw) echo -n '|' ;;
    muon) echo -n ", \"optimizer\": \"muon\", \"muon\": {\"lr\": $MUON_LR}|" ;;
    *) echo "muloco.sh: unknown row $1" >&2; exit 2 ;;
  esac
  case $codec in
    fp32) [ "$opt" = muon ] && echo ', "outer": {"lr": 0.8, "momentum": 0.7, "nesterov": true}' || echo '' ;;
    e3m0) [ "$opt" = muon ] && echo ', "outer": {"lr": 0.8, "momentum": 0.7, "nesterov": true}, "streaming": {"codec": "e3m0"}' \
            || echo ', "streaming": {"codec": "e3m0"}' ;;
    sl2) echo ', "sparse": {"density": 0.02}' ;;
    *) echo "muloco.sh: unknown row $1" >&2; exit 2 ;;
  esac
}
echo "muloco.sh: $NPARAM parameters, $WORKERS workers, H $H, $STEPS inner steps per replica, batch $B x $T" >&2
RES=$work/results.tsv
for row in $ROWS; do
  IFS='|' read -r inner_extra spec_extra <<<"$(row_spec "$row" | tr -d '\n')"
  cat >"$work/$row.json" <<JSON
{"name": "$row", "model": {"init": "$work/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": $WORKERS, "inner_steps": $H, "rounds": $((STEPS / H)), "batch": $B, "seq_len": $T,
 "inner": {"lr": $INNER_LR, "warmup": $WARMUP, "lr_min_frac": 0.1, "weight_decay": 0.1, "grad_clip": 1.0$inner_extra}$spec_extra}
JSON
  t0=$(date +%s)
  job=$("$CTL" --coordinator "127.0.0.1:$PORT" job create "$work/$row.json" 2>>"$work/ctl.log")
  "$CTL" --coordinator "127.0.0.1:$PORT" job wait "$job" --timeout 7200 >/dev/null
  "$CTL" --coordinator "127.0.0.1:$PORT" job export "$job" --path 0 --out "$work/$row.out" >/dev/null
  show=$("$CTL" --coordinator "127.0.0.1:$PORT" job show "$job" --json)
  loss=$("$CTL" eval --model "$work/$row.out" --data "$work"/data/val_*.bin --batch "$B" --seq-len "$T" \
         --batches "$EVAL_BATCHES" --json 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
  io=$("$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["bytes_in"], d["bytes_out"], d["tokens"])' "$show")
  printf '%s\t%s\t%s\t%s\n' "$row" "$loss" "$io" "$(( $(date +%s) - t0 ))" | tee -a "$RES" >&2
done

"$PY" - "$RES" "$NPARAM" "$B" "$T" "$STEPS" "$WORKERS" "$H" <<'PY'
import sys
res, n, B, T, steps, R, H = sys.argv[1], *map(int, sys.argv[2:])
names = {"fp32": "fp32 deltas", "e3m0": "e3m0 deltas", "sl2": "SparseLoCo 2%, 2-bit"}
rows = {r[0]: r[1:] for r in (l.rstrip("\n").split("\t") for l in open(res))}
print(f"\n{n/1e6:.2f}M parameters, {R} workers, H {H}, {steps} inner steps per replica, batch {B} x {T} tokens\n")
print("| deltas | AdamW-DiLoCo eval loss | MuLoCo eval loss | MuLoCo / AdamW | bytes per trained token (AdamW / MuLoCo) | seconds (AdamW / MuLoCo) |")
print("|---|---|---|---|---|---|")
for c in ("fp32", "e3m0", "sl2"):
    a, m = rows.get("adamw-" + c), rows.get("muon-" + c)
    if not a and not m:
        continue
    f = lambda r: float(r[0]) if r else float("nan")
    bpt = lambda r: "%.3g" % ((sum(map(int, r[1].split()[:2]))) / int(r[1].split()[2])) if r else "-"
    print(f"| {names[c]} | {f(a):.4f} | {f(m):.4f} | {f(m) / f(a):.4f} | {bpt(a)} / {bpt(m)} | "
          f"{a[2] if a else '-'} / {m[2] if m else '-'} |")
PY
