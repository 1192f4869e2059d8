#!/usr/bin/env bash
# llama_codecs_dist.sh COORDINATOR WORKER DIPACOCTL — compressed deltas with a small Llama-class
# model (GQA, tied) through a real coordinator and 2 CPU workers (R = 2, H = 3, 2 rounds):
#  1. SparseLoCo (2% density, 2-bit values, ef_beta 0.9, outer SGD lr 2): the export equals the
#     PyTorch simulation (tests/oracle/sparse_ref.py) to 1e-4 relative, the sparse stream chunked
#     tensor by tensor in the Llama layout's order;
#  2. sync DiLoCo with int8 deltas: the export equals the simulation with the same quantizer
#     (tests/oracle/streaming_ref.py with one fragment group, which is plain DiLoCo) to 1e-2: a
#     delta within fp32 noise of a rounding boundary may take the next code in PyTorch, and
#     outer momentum carries that on (a GPT-2 of the same size lands at about 6e-3 here too).
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs llama_codecs_dist 30 "$@"; }

make_corpus "$W/corpus"
"$CTL" init --arch llama --n-layer 2 --n-head 4 --n-kv-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 \
  --out "$W/init" 2>/dev/null
spec() {
  cat > "$W/$1.json" <<JSON
{"name": "$1", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 3, "rounds": 2, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"}, $2}
JSON
}
spec sparse '"outer": {"lr": 2.0, "momentum": 0, "nesterov": false},
 "sparse": {"density": 0.02, "chunk": 4096, "value_bits": 2, "ef_beta": 0.9}'
spec int8 '"outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}, "streaming": {"codec": "int8"}'
start_coordinator "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"
for s in sparse int8; do
  job=$("$CTL" --coordinator "$COORD" job create "$W/$s.json") || fail "job create $s"
  "$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 >/dev/null || fail "job $s did not finish"
  "$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/$s.out" >/dev/null || fail "export $s"
done
$PY "$HERE/../oracle/sparse_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/sparse.json" \
  --compare "$W/sparse.out" --tol 1e-4 || fail "SparseLoCo differs from the PyTorch simulation"
$PY "$HERE/../oracle/streaming_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/int8.json" \
  --compare "$W/int8.out" --tol 1e-2 || fail "int8 deltas differ from the PyTorch simulation"
echo "llama_codecs_dist: PASS"
