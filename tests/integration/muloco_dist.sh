#!/usr/bin/env bash
# muloco_dist.sh COORDINATOR WORKER DIPACOCTL — MuLoCo (sync DiLoCo with inner.optimizer "muon",
# docs/design.md §3.2) through the real daemons: a coordinator and 2 CPU workers on loopback run
# R=2, H=3, 3 rounds of a tiny GPT-2 with inner.state "checkpoint", so Muon's momentum buffers go
# up with PushInnerState (in the ADAM_M stream) after every round and come back with
# PullInnerState. The export must equal the PyTorch reference (tests/oracle/diloco_ref.py with
# tests/oracle/muon_ref.py's Muon) to 1e-4 relative, and `job show` must name the optimizer. A
# muon block without inner.optimizer "muon" is refused at job create, naming the field. Then,
# with Muon too: Streaming DiLoCo (F = 2, τ = 1, α = 0.5, inner.state keep) against
# tests/oracle/streaming_ref.py, sync DiLoCo with bf16 deltas against the same simulation's
# rounding (to 1e-2), and SparseLoCo (2%, 2-bit, error feedback 0.95, Nesterov-free
# outer SGD) against tests/oracle/sparse_ref.py, and DiPaCo (2 paths sharing a stem module)
# against tests/oracle/dipaco_ref.py, all to 1e-4; a diloco-async job with Muon trains and its
# ledger replays (tests/oracle/async_replay.py).
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs muloco_dist 30 "$@"; }

make_corpus "$W/corpus"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out "$W/init" 2>/dev/null
MULOCO_OUTER='{"lr": 0.8, "momentum": 0.7, "nesterov": true}'
spec() { # $1: the inner block's extra fields, $2 inner.state, $3 outer and the spec's extra members, $4 name
  cat <<JSON
{"name": "${4:-muloco}", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.003, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "${2:-checkpoint}"$1},
 "outer": ${3:-$MULOCO_OUTER}}
JSON
}
MUON=', "optimizer": "muon", "muon": {"lr": 0.02, "momentum": 0.95, "nesterov": true, "ns_steps": 5,
       "weight_decay": 0.05, "adjust_lr": "original"}'
spec "$MUON" > "$W/spec.json"
spec "$MUON" keep '{"lr": 0.7, "momentum": 0.9, "nesterov": true}, "streaming": {"fragments": 2, "overlap_steps": 1, "alpha": 0.5}' \
  streaming > "$W/streaming.json"
spec "$MUON" keep '{"lr": 2.0, "momentum": 0, "nesterov": false}, "sparse": {"density": 0.02, "ef_beta": 0.95}' \
  sparse > "$W/sparse.json"
spec "$MUON" keep "$MULOCO_OUTER"', "streaming": {"codec": "bf16"}' bf16 > "$W/bf16.json"
spec ', "muon": {"lr": 0.02}' > "$W/bad.json"
start_coordinator "$W/state" --lease-ttl-ms 20000
if "$CTL" --coordinator "$COORD" job create "$W/bad.json" 2>"$W/bad.err"; then fail "a muon block under adamw was accepted"; fi
grep -q 'inner.muon.*only with inner.optimizer "muon"' "$W/bad.err" || fail "unclear refusal: $(cat "$W/bad.err")"
echo "a muon block without inner.optimizer muon is refused: $(cat "$W/bad.err")"
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create"
"$CTL" --coordinator "$COORD" job show "$job" | grep -E '^inner.optimizer +muon' || fail "job show does not name Muon"
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 || fail "job did not finish"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export" || fail "export"
$PY "$HERE/../oracle/diloco_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/spec.json" \
  --compare "$W/export" --tol 1e-4 || fail "the export differs from the PyTorch MuLoCo reference"
# run NAME REF [TOL]: one more job on the same workers, against its reference.
run() {
  local job; job=$("$CTL" --coordinator "$COORD" job create "$W/$1.json" 2>"$W/$1.err") ||
    fail "job create $1: $(cat "$W/$1.err")"
  "$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 >/dev/null || fail "job $1 did not finish"
  "$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/$1.out" >/dev/null || fail "export $1"
  $PY "$HERE/../oracle/$2" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/$1.json" \
    --compare "$W/$1.out" --tol "${3:-1e-4}" || fail "$1 with Muon differs from $2"
}
run streaming streaming_ref.py
run sparse sparse_ref.py
# A dense codec: bf16 deltas (streaming_ref.py with one fragment group is plain DiLoCo with the
# codec's rounding). 1e-2: a delta within fp32 noise of a rounding boundary may take the other
# code in PyTorch's arithmetic; measured 1.1e-3. (int8's one-code flips, 1/127 of a 256-float
# block's largest value, land in zero-initialised biases as 1.6e-2 of the tensor after one
# round with Muon's larger deltas; llama_codecs_dist.sh checks int8 with AdamW.)
run bf16 streaming_ref.py 1e-2
# DiPaCo: a shared stem module and a module per path at level 1, each slot's Muon buffers
# covering its path's matrices.
cat > "$W/dipaco.json" <<JSON
{"name": "dipaco", "model": {"init": "$W/init"}, "data": {"paths": [["data/train_*.bin"], ["data/train_*.bin"]]},
 "algorithm": "dipaco", "replicas": 1, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "levels": [{"stem": true, "layers": [0, 1], "modules": 1}, {"layers": [1, 2], "modules": 2}],
 "inner": {"lr": 0.003, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"$MUON},
 "outer": $MULOCO_OUTER}
JSON
job=$("$CTL" --coordinator "$COORD" job create "$W/dipaco.json") || fail "job create dipaco"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 >/dev/null || fail "job dipaco did not finish"
for p in 0 1; do "$CTL" --coordinator "$COORD" job export "$job" --path $p --out "$W/dipaco_$p" >/dev/null; done
$PY "$HERE/../oracle/dipaco_ref.py" --init "$W/init" --spec "$W/dipaco.json" --data-dir "$W/corpus" \
  --compare "$W/dipaco_" --tol 1e-4 || fail "DiPaCo with Muon differs from the PyTorch reference"
# diloco-async: Muon leases run at the job's schedule position (schedule_shift); no PyTorch
# reference replays async inner steps, so the ledger replay of the outer rule must hold and
# the job must train (its loss falls).
spec "$MUON" keep '{"lr": 0.4, "momentum": 0.7, "nesterov": true}' async | sed 's/"algorithm": "diloco"/"algorithm": "diloco-async"/' \
  > "$W/async.json"
job=$("$CTL" --coordinator "$COORD" job create "$W/async.json") || fail "job create async"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 >/dev/null || fail "job async did not finish"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/async.out" >/dev/null || fail "export async"
$PY "$HERE/../oracle/async_replay.py" --state "$W/state" --job "$job" --export "$W/async.out" --tol 1e-5 \
  || fail "the async ledger replay differs"
l0=$("$CTL" eval --model "$W/init" --data "$W/corpus/data/train_000.bin" --batch 2 --seq-len 16 --batches 8 --json)
l1=$("$CTL" eval --model "$W/async.out" --data "$W/corpus/data/train_000.bin" --batch 2 --seq-len 16 --batches 8 --json)
$PY -c 'import json, sys; a, b = (json.loads(x)["loss"] for x in sys.argv[1:]); print("async Muon: loss", a, "->", b); sys.exit(not b < a - 0.1)' \
  "$l0" "$l1" || fail "the async Muon job did not train"
echo "muloco_dist: PASS"
