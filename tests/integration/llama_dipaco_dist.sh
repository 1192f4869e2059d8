#!/usr/bin/env bash
# llama_dipaco_dist.sh COORDINATOR WORKER DIPACOCTL — DiPaCo with a small Llama-class model (GQA,
# tied) through the real daemons: `dipacoctl route fit --k 4` on the Llama base (features from
# model.norm's output, router.json carrying the whole Llama config) and `route assign` against
# the torch router of tests/oracle/route_ref.py; then a job with levels over the Llama layers
# (level 0 = embeddings, final norm and layer 0, K=2; level 1 = layer 1, K=2: 4 paths) trained
# by 2 workers, every exported path equal to the PyTorch DiPaCo reference
# (tests/oracle/dipaco_ref.py) to 1e-4 relative. A router fitted on the Llama base refuses a
# GPT-2 model of the same sizes.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs llama_dipaco_dist 30 "$@"; }
cd "$W"
mkdir -p corpus
for i in $(seq 1 60); do echo "We hold these truths to be self-evident, number $i; the union is strong and free."; done > corpus/a.txt
for i in $(seq 1 60); do echo "#include <stdio.h> static int f$i(void) { return $i * 2; } /* $i */"; done > corpus/b.txt
cat corpus/a.txt corpus/b.txt > corpus/mix.txt
"$CTL" data prepare --tokenizer byte --out data --val-fraction 0.1 corpus/mix.txt 2>/dev/null
"$CTL" init --arch llama --n-layer 2 --n-head 4 --n-kv-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 \
  --out init 2>/dev/null
"$CTL" route fit --model init --data data/train_000.bin --seq-len 16 --prefix 4 --k 4 --seed 3 --out router >/dev/null \
  || fail "route fit on the Llama base"
grep -Eq '"arch":[[:space:]]*"llama"' router/router.json || fail "router.json lacks the Llama config: $(cat router/router.json)"
paths=$("$CTL" route assign --router router --data data/train_000.bin --seq-len 16 --out routed) || fail "route assign"
$PY "$HERE/../oracle/route_ref.py" --router router --data data/train_000.bin --seq-len 16 --routed routed \
  || fail "route assign shards differ from the oracle"
"$CTL" init --n-layer 2 --n-head 4 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out gpt2 2>/dev/null
if "$CTL" route assign --router router --model gpt2 --data data/train_000.bin --seq-len 16 --out r2 2>r2.err; then
  fail "route assign accepted a GPT-2 model with a router fitted on a Llama"
fi
grep -q "feature model is llama" r2.err || fail "unclear error for the wrong family: $(cat r2.err)"
cat > spec.json <<JSON
{"name": "llama-dipaco", "model": {"init": "$W/init"}, "data": {"paths": $paths},
 "algorithm": "dipaco", "replicas": 2, "inner_steps": 3, "rounds": 2, "batch": 2, "seq_len": 16,
 "levels": [{"stem": true, "layers": [0, 1], "modules": 2}, {"layers": [1, 2], "modules": 2}],
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
start_coordinator "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W"
start_worker w2 "$W"
job=$("$CTL" --coordinator "$COORD" job create spec.json --data-dir "$W") || fail "job create"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 || fail "job did not finish"
for p in 0 1 2 3; do "$CTL" --coordinator "$COORD" job export "$job" --path $p --out "export_$p" >/dev/null; done
$PY "$HERE/../oracle/dipaco_ref.py" --init init --spec spec.json --data-dir "$W" --compare "export_" --tol 1e-4 \
  || fail "exported paths differ from the PyTorch DiPaCo reference"
echo "llama_dipaco_dist: PASS"
