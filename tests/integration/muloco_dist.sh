#!/usr/bin/env bash
# muloco_dist.sh COORDINATOR WORKER DIPACOCTL — MuLoCo (sync DiLoCo with inner.optimizer "muon",
# docs/design.md §3.2) through the real daemons: a coordinator and 2 CPU workers on loopback run
# R=2, H=3, 3 rounds of a tiny GPT-2 with inner.state "checkpoint", so Muon's momentum buffers go
# up with PushInnerState (in the ADAM_M stream) after every round and come back with
# PullInnerState. The export must equal the PyTorch reference (tests/oracle/diloco_ref.py with
# tests/oracle/muon_ref.py's Muon) to 1e-4 relative, and `job show` must name the optimizer. A
# muon block without inner.optimizer "muon" is refused at job create, naming the field.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs muloco_dist 30 "$@"; }

make_corpus "$W/corpus"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out "$W/init" 2>/dev/null
spec() { # $1: the inner block's extra fields
  cat <<JSON
{"name": "muloco", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.003, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "checkpoint"$1},
 "outer": {"lr": 0.8, "momentum": 0.7, "nesterov": true}}
JSON
}
spec ', "optimizer": "muon", "muon": {"lr": 0.02, "momentum": 0.95, "nesterov": true, "ns_steps": 5,
       "weight_decay": 0.05, "adjust_lr": "original"}' > "$W/spec.json"
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
echo "muloco_dist: PASS"
