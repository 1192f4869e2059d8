#!/usr/bin/env bash
# diloco_local.sh DIPACOCTL DILOCO_LOCAL — single-process DiLoCo (trainer + outer optimizer)
# against the PyTorch reference tests/oracle/diloco_ref.py: R=2, H=3, 3 rounds, warmup,
# cosine, weight decay and clipping active; once with inner state kept, once reset.
# AdamW eps is 1e-6, not 1e-8: some gradients are exactly zero in exact arithmetic (the key
# bias of attention: softmax ignores a per-row constant), so both sides hold only fp32
# rounding noise there, and with a tiny eps AdamW turns that noise into lr-sized steps that
# no two implementations share. 1e-6 keeps the comparison about the math.
set -euo pipefail
CTL=$1; LOCAL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
for i in $(seq 1 300); do echo "Abundant gratitude to the people, $i times over; the union is strong."; done > "$W/t.txt"
"$CTL" data prepare --tokenizer byte --out "$W/data" --val-fraction 0 "$W/t.txt" 2>/dev/null
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 3 --out "$W/init" 2>/dev/null
for state in keep reset; do
  cat > "$W/spec.json" <<JSON
{"replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "$state"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
  tol=1e-4
  "$LOCAL" "$W/init" "$W/data/train_000.bin" "$W/out_$state" 2 3 3 2 16 0.01 2 0.1 0.1 0.9 0.95 1e-6 0.5 0.7 0.9 $state 2>"$W/log"
  "${DPC_PYTHON:-python3}" "$HERE/../oracle/diloco_ref.py" --init "$W/init" --data "$W/data/train_000.bin" --spec "$W/spec.json" \
    --compare "$W/out_$state" --tol $tol
done
