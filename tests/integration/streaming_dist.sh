#!/usr/bin/env bash
# streaming_dist.sh COORDINATOR WORKER DIPACOCTL — Streaming DiLoCo through a real coordinator
# and 2 real CPU workers on loopback (R = 2, H = 4, 3 rounds, a 2-layer model):
#  1. F = 2, τ = 1, α = 0.5, fp32 deltas, inner.state keep, the outer momentum decayed over the
#     last 2 rounds: the exported parameters equal the PyTorch simulation (tests/oracle/streaming_ref.py) to 1e-4 relative; job show reports the
#     bytes and a peak sync below the whole model's fp32 bytes.
#  2. F = 2, τ = 2, α = 0.5, e3m0 deltas, inner.state checkpoint (local parameters and AdamW
#     state go through the coordinator every round): the export matches the simulation with
#     the same quantizer (tolerance 2e-2: a delta that lands within fp32 noise of a rounding
#     boundary may take the other 4-bit code in PyTorch's arithmetic), and the job's delta
#     bytes are at most 0.2x those of run 1.
#  3. eager updates (F = 2, τ = 2, α = 0.5, fp32): the export equals the simulation's eager
#     rule (tests/oracle/EAGER.md) to 1e-4.
#  4. "streaming" with F = 1, τ = 0, α = 0 (fp32) is plain DiLoCo: its export is
#     byte-identical to the same job without the block.
#  5. a diloco-async job with int8 deltas runs to the end, and the coordinator received
#     exactly (number of deltas) × the int8 size of the model (n + 4·⌈n/256⌉ bytes).
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"

make_corpus "$W/corpus"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out "$W/init" 2>/dev/null
# spec NAME STREAMING_JSON STATE
spec() {
  cat > "$W/$1.json" <<JSON
{"name": "$1", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 4, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "$3"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}$2}
JSON
}
spec s1 ', "streaming": {"fragments": 2, "overlap_steps": 1, "alpha": 0.5}' keep
sed -i 's/"nesterov": true}/"nesterov": true, "momentum_warmup": 1, "momentum_decay": 2}/' "$W/s1.json"
spec s2 ', "streaming": {"fragments": 2, "overlap_steps": 2, "alpha": 0.5, "codec": "e3m0"}' checkpoint
spec s3 ', "streaming": {"fragments": 1, "overlap_steps": 0, "alpha": 0}' keep
spec s4 ', "streaming": {"fragments": 2, "overlap_steps": 2, "alpha": 0.5, "eager": true}' keep
spec plain '' keep
sed -e 's/"algorithm": "diloco"/"algorithm": "diloco-async"/' \
    -e 's/"outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}/"outer": {"rule": "delayed-nesterov", "lr": 0.4, "momentum": 0.7}/' \
    "$W/plain.json" | $PY -c 'import json,sys; d=json.load(sys.stdin); d["name"]="async8"; d["streaming"]={"codec":"int8"}; print(json.dumps(d))' > "$W/async8.json"

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

run s1
"$CTL" --coordinator "$COORD" job show "$JOB" | grep -E "^(traffic|tokens|streaming|delta codec)"
$PY "$HERE/../oracle/streaming_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/s1.json" \
  --compare "$W/s1.out" --tol 1e-4
n_params=$($PY -c "import json; c=json.load(open('$W/init/config.json')); C=c['n_embd']; print(c['vocab_size']*C + c['n_positions']*C + 2*C + c['n_layer']*(12*C*C + 13*C))")
peak1=$(field s1 peak_sync_bytes); in1=$(field s1 bytes_in)
echo "run 1: delta bytes $in1, peak sync $peak1 bytes of a $((4 * n_params))-byte fp32 model"
[ "$peak1" -gt 0 ] && [ "$peak1" -lt $((4 * n_params)) ] || { echo "FAIL: peak sync $peak1 not below the model's bytes"; exit 1; }

run s2
$PY "$HERE/../oracle/streaming_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/s2.json" \
  --compare "$W/s2.out" --tol 2e-2
in2=$(field s2 bytes_in)
echo "run 2 (e3m0): delta bytes $in2 = $($PY -c "print(round($in2 / $in1, 4))")x run 1's"
$PY -c "import sys; sys.exit(0 if $in2 <= 0.2 * $in1 else 1)" || { echo "FAIL: e3m0 moved more than 0.2x fp32's delta bytes"; exit 1; }
grep -q "resumed the streaming slot\|streamed" "$W"/worker-*.log

run s4
$PY "$HERE/../oracle/streaming_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/s4.json" \
  --compare "$W/s4.out" --tol 1e-4
echo "eager updates match the simulation"

run s3
run plain
cmp "$W/s3.out/model.safetensors" "$W/plain.out/model.safetensors"
echo "F = 1, tau = 0, alpha = 0 is plain DiLoCo, byte for byte"

run async8
"$CTL" --coordinator "$COORD" job ledger "$JOB" --json > "$W/async8.ledger.json"
n_deltas=$($PY -c "import json; print(len(json.load(open('$W/async8.ledger.json'))['deltas']))")
in8=$(field async8 bytes_in)
want8=$(( n_deltas * (n_params + 4 * ((n_params + 255) / 256)) ))
echo "async with int8 deltas: $n_deltas deltas, $in8 bytes received (want $want8)"
[ "$n_deltas" -eq 6 ] && [ "$in8" -eq "$want8" ] || { echo "FAIL: async int8 traffic"; exit 1; }
echo "streaming_dist: PASS"
