#!/usr/bin/env bash
# llama_diloco_dist.sh COORDINATOR WORKER DIPACOCTL — sync DiLoCo with a small Llama-class model
# (grouped-query attention, tied embeddings) through the real daemons: a coordinator and 2 CPU
# workers on loopback run R=2, H=3, 3 rounds of a job whose spec gives the Llama shape and a
# seed (version 0 made by the coordinator). Version 0 must equal `dipacoctl init --arch llama`
# with the same shape and seed, the export's config.json must be that command's, and the
# exported parameters must equal the PyTorch DiLoCo reference (tests/oracle/diloco_ref.py, which
# runs tests/oracle/llama_oracle.py's LlamaForCausalLM) to 1e-4 relative.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs llama_diloco_dist 30 "$@"; }

make_corpus "$W/corpus"
"$CTL" init --arch llama --n-layer 2 --n-head 4 --n-kv-head 2 --n-embd 32 --n-positions 16 --vocab-size 256 --seed 5 \
  --out "$W/init" 2>/dev/null
cat > "$W/spec.json" <<JSON
{"name": "llama-dist", "model": {"n_layer": 2, "n_head": 4, "n_embd": 32, "n_positions": 16, "vocab_size": 256,
                                 "arch": "llama", "n_kv_head": 2, "intermediate_size": 96, "seed": 5},
 "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}, "versions": {"keep_last": 2, "keep_every": 1}}
JSON
start_coordinator "$W/state" --lease-ttl-ms 20000
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create"
"$CTL" --coordinator "$COORD" job show "$job" --json | grep -q '"arch":"llama"' || fail "the stored spec lacks arch llama"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --version 0 --out "$W/v0" >/dev/null || fail "export of version 0"
cmp "$W/v0/model.safetensors" "$W/init/model.safetensors" || fail "version 0 differs from dipacoctl init's weights"
cmp "$W/v0/config.json" "$W/init/config.json" || fail "version 0's config.json differs from dipacoctl init's"
echo "version 0 (shape + seed) is dipacoctl init --arch llama's model, byte for byte"
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 || fail "job did not finish"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export" || fail "export"
$PY "$HERE/../oracle/diloco_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/spec.json" \
  --compare "$W/export" --tol 1e-4 || fail "the export differs from the PyTorch reference"
echo "llama_diloco_dist: PASS"
