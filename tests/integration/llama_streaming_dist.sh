#!/usr/bin/env bash
# llama_streaming_dist.sh COORDINATOR WORKER DIPACOCTL — Streaming DiLoCo with a small Llama-class
# model (GQA, untied head: lm_head in the stem) through a real coordinator and 2 CPU workers:
# F = 2 fragments (layer l with group l mod 2, the stem with group 0), τ = 1, α = 0.5, R = 2,
# H = 4, 2 rounds; the export must equal the PyTorch simulation (tests/oracle/streaming_ref.py,
# running tests/oracle/llama_oracle.py's module) to 1e-4 relative.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs llama_streaming_dist 30 "$@"; }

make_corpus "$W/corpus"
"$CTL" init --arch llama --untied --n-layer 2 --n-head 4 --n-kv-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 \
  --seed 5 --out "$W/init" 2>/dev/null
cat > "$W/spec.json" <<JSON
{"name": "llama-streaming", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 4, "rounds": 2, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true},
 "streaming": {"fragments": 2, "overlap_steps": 1, "alpha": 0.5}}
JSON
start_coordinator "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 || fail "job did not finish"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export" >/dev/null || fail "export"
$PY "$HERE/../oracle/streaming_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/spec.json" \
  --compare "$W/export" --tol 1e-4 || fail "the export differs from the PyTorch Streaming DiLoCo simulation"
echo "llama_streaming_dist: PASS"
