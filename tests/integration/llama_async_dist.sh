#!/usr/bin/env bash
# llama_async_dist.sh COORDINATOR WORKER DIPACOCTL — asynchronous DiLoCo (delayed Nesterov) with a
# small Llama-class model (GQA, tied) through a real coordinator and 2 CPU workers (R = 2,
# H = 3, 2 rounds): replaying the coordinator's ledger (version 0 and the applied delta blobs, in
# order) through the reference rule (tests/oracle/async_replay.py) gives the coordinator's
# parameters to 1e-5 relative, and the export holds exactly those parameters.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs llama_async_dist 30 "$@"; }

make_corpus "$W/corpus"
"$CTL" init --arch llama --n-layer 2 --n-head 4 --n-kv-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 \
  --out "$W/init" 2>/dev/null
cat > "$W/spec.json" <<JSON
{"name": "llama-async", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco-async", "replicas": 2, "inner_steps": 3, "rounds": 2, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "state": "keep"},
 "outer": {"rule": "delayed-nesterov", "delay_buffer": 2, "c": 0.25, "lr": 0.7, "momentum": 0.9}}
JSON
start_coordinator "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 >/dev/null || fail "job did not finish"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export" >/dev/null || fail "export"
$PY "$HERE/../oracle/async_replay.py" --state "$W/state" --job "$job" --export "$W/export" --tol 1e-5 \
  || fail "the replayed ledger differs from the coordinator's parameters"
echo "llama_async_dist: PASS"
