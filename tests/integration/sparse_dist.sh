#!/usr/bin/env bash
# sparse_dist.sh COORDINATOR WORKER DIPACOCTL — SparseLoCo through a real coordinator and 2 real
# CPU workers on loopback (R = 2, H = 4, 3 rounds, a 2-layer model, 2% density, 2-bit values,
# chunk 4096, ef_beta 0.95, outer plain SGD lr 2):
#  1. inner.state keep: the exported parameters equal the PyTorch simulation
#     (tests/oracle/sparse_ref.py) to 1e-4 relative; the deltas moved at most 3% of the fp32
#     delta bytes; after round 0 the workers made their fragments from the sparse rounds
#     (sparse pulls) and still matched every version's checksum.
#  2. inner.state checkpoint: the error-feedback buffers go through the coordinator every round;
#     the export again equals the simulation to 1e-4.
#  3. ef_beta 0 (top-k without error feedback) matches the simulation of that rule too.
#  4. a 1 + 2 module DiPaCo job with sparse deltas runs to the end with sparse pulls of shared and
#     per-path modules, every replayed version meeting its checksum, and both exported paths
#     equal the PyTorch DiPaCo reference with SparseLoCo deltas (tests/oracle/dipaco_ref.py:
#     per-module outer steps on the mean sparse stream, error feedback per slot) to 1e-4.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"

make_corpus "$W/corpus"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out "$W/init" 2>/dev/null
# spec NAME STATE EF_BETA
spec() {
  cat > "$W/$1.json" <<JSON
{"name": "$1", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 4, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "$2"},
 "outer": {"lr": 2.0, "momentum": 0, "nesterov": false},
 "sparse": {"density": 0.02, "chunk": 4096, "value_bits": 2, "ef_beta": $3}}
JSON
}
spec keep keep 0.95
spec ckpt checkpoint 0.95
spec noef keep 0

start_coordinator "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"

# run NAME: create, wait, export to $W/NAME.out; sets JOB
run() {
  JOB=$("$CTL" --coordinator "$COORD" job create "$W/$1.json")
  if ! "$CTL" --coordinator "$COORD" job wait "$JOB" --timeout 240 >/dev/null; then
    echo "job $1 did not finish"; tail -30 "$W"/*.log; exit 1
  fi
  "$CTL" --coordinator "$COORD" job export "$JOB" --path 0 --out "$W/$1.out" >/dev/null
  "$CTL" --coordinator "$COORD" job show "$JOB" --json > "$W/$1.show.json"
}
field() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$W/$1.show.json" "$2"; }
n_params=$($PY -c "import json; c=json.load(open('$W/init/config.json')); C=c['n_embd']; print(c['vocab_size']*C + c['n_positions']*C + 2*C + c['n_layer']*(12*C*C + 13*C))")

run keep
"$CTL" --coordinator "$COORD" job show "$JOB" | grep -E "^(traffic|tokens|sparse|delta codec)" || true
$PY "$HERE/../oracle/sparse_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/keep.json" \
  --compare "$W/keep.out" --tol 1e-4
in1=$(field keep bytes_in)
fp32=$((3 * 2 * 4 * n_params))
echo "run 1: delta bytes $in1 = $($PY -c "print(round($in1 / $fp32, 5))")x the fp32 deltas' $fp32"
$PY -c "import sys; sys.exit(0 if $in1 <= 0.03 * $fp32 else 1)" || { echo "FAIL: sparse deltas moved more than 3% of fp32's bytes"; exit 1; }
n_sp=$(cat "$W"/worker-*.log | grep -c "made from their sparse rounds" || true)
echo "leases that made their fragments from sparse rounds: $n_sp"
[ "$n_sp" -ge 2 ] || { echo "FAIL: no sparse pulls"; tail -20 "$W"/worker-*.log; exit 1; }
if grep -q "does not match version" "$W"/worker-*.log; then echo "FAIL: a sparse pull missed the checksum"; exit 1; fi

run ckpt
$PY "$HERE/../oracle/sparse_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/ckpt.json" \
  --compare "$W/ckpt.out" --tol 1e-4
echo "inner.state checkpoint (error feedback through the coordinator) matches the simulation"

run noef
$PY "$HERE/../oracle/sparse_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/noef.json" \
  --compare "$W/noef.out" --tol 1e-4
# 4. DiPaCo: a stem module shared by two paths and a module per path at level 1, each path's
#    slots on the corpus: per-module sparse rounds (the stem's round merges 4 slots' streams,
#    a path module's 2), sparse pulls of shared and own modules, the versions' checksums met.
cat > "$W/dipaco.json" <<JSON
{"name": "dipaco", "model": {"init": "$W/init"}, "data": {"paths": [["data/train_*.bin"], ["data/train_*.bin"]]},
 "algorithm": "dipaco", "replicas": 2, "inner_steps": 4, "rounds": 3, "batch": 2, "seq_len": 16,
 "levels": [{"stem": true, "layers": [0, 1], "modules": 1}, {"layers": [1, 2], "modules": 2}],
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"},
 "outer": {"lr": 2.0, "momentum": 0, "nesterov": false},
 "sparse": {"density": 0.02, "chunk": 4096, "value_bits": 2, "ef_beta": 0.95}}
JSON
before=$(cat "$W"/worker-*.log | grep -c "made from their sparse rounds" || true)
run dipaco
after=$(cat "$W"/worker-*.log | grep -c "made from their sparse rounds" || true)
echo "DiPaCo: leases that made fragments from sparse rounds: $((after - before))"
[ $((after - before)) -ge 2 ] || { echo "FAIL: no DiPaCo sparse pulls"; exit 1; }
if grep -q "does not match version" "$W"/worker-*.log; then echo "FAIL: a DiPaCo sparse pull missed the checksum"; exit 1; fi
for p in 0 1; do "$CTL" --coordinator "$COORD" job export "$JOB" --path $p --out "$W/dipaco_$p" >/dev/null; done
$PY "$HERE/../oracle/dipaco_ref.py" --init "$W/init" --spec "$W/dipaco.json" --data-dir "$W/corpus" \
  --compare "$W/dipaco_" --tol 1e-4 || { echo "FAIL: the DiPaCo + SparseLoCo paths differ from the PyTorch reference"; exit 1; }
echo "DiPaCo with sparse deltas: both paths match the PyTorch reference"
echo "sparse_dist: PASS"
