#!/usr/bin/env bash
# tests/gpu/hetero_diloco.sh BUILD_DIR — a heterogeneous fleet on one GPU machine: DiLoCo with
# one replica on the CUDA backend beside one on the CPU backend (tests/unit/diloco_local.c, the
# daemons' trainer and outer step in one process), against the same job with both replicas on
# the CPU. Passes when the two models' validation losses agree within 1%. Env: CORPUS (a text
# file; default: the Python sources of the installed torch package), ROUNDS (10), H (20).
set -euo pipefail
B=${1:?usage: hetero_diloco.sh BUILD_DIR}
CTL=$B/coordinator/dipacoctl; LOCAL=$B/tests/diloco_local
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
if [ -n "${CORPUS:-}" ]; then cp "$CORPUS" "$W/t.txt"
else
  src=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  { find "$src" -name '*.py' | sort | head -400 | xargs cat; } 2>/dev/null | head -c 4000000 > "$W/t.txt" || true
fi
"$CTL" data prepare --tokenizer byte --out "$W/data" --val-fraction 0.05 "$W/t.txt" 2>/dev/null
"$CTL" init --n-layer 2 --n-head 4 --n-embd 128 --n-positions 64 --vocab-size 256 --seed 5 --out "$W/init" 2>/dev/null
R=2; H=${H:-20}; ROUNDS=${ROUNDS:-10}
for fleet in cpu,cpu cuda,cpu; do
  t0=$(date +%s.%N)
  DILOCO_LOCAL_BACKENDS=$fleet "$LOCAL" "$W/init" "$W/data/train_000.bin" "$W/out_$fleet" $R "$H" "$ROUNDS" 8 64 \
    3e-3 10 0.1 0.1 0.9 0.95 1e-8 1.0 0.7 0.9 keep 2>"$W/log_$fleet" || { tail -5 "$W/log_$fleet"; exit 1; }
  t1=$(date +%s.%N)
  loss=$("$CTL" eval --model "$W/out_$fleet" --data "$W/data/val_000.bin" --batch 8 --seq-len 64 --json 2>/dev/null |
         python3 -c 'import json, sys; print(json.load(sys.stdin)["loss"])')
  echo "$fleet: $(grep -c '^round' "$W/log_$fleet") replica rounds in $(python3 -c "print(round($t1 - $t0, 1))") s, val loss $loss"
  echo "$loss" > "$W/loss_$fleet"
done
python3 - "$(cat "$W/loss_cpu,cpu")" "$(cat "$W/loss_cuda,cpu")" <<'PY'
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
rel = abs(b - a) / a
print("heterogeneous (cuda + cpu) vs cpu-only: val loss %.4f vs %.4f, rel diff %.2e (limit 1e-2)" % (b, a, rel))
sys.exit(0 if rel <= 1e-2 else 1)
PY
