#!/usr/bin/env bash
# dipaco_dist.sh COORDINATOR WORKER DIPACOCTL — DiPaCo end to end through the real daemons: a
# mixed corpus is routed by `dipacoctl route fit --k 4` / `route assign` into per-path shards,
# a 2 x 2 DiPaCo job (levels of 2 modules each, R = 2) trains with data.paths on 2 CPU workers,
# and every exported path must equal the PyTorch DiPaCo reference (tests/oracle/dipaco_ref.py:
# per-module Nesterov on the mean delta of the slots whose path holds the module, each slot on
# its own path's stream) to 1e-4 relative. Also: a data.paths list of the wrong length is
# refused by `job create` with a clear message and creates nothing.
set -euo pipefail
COORDINATOR_BIN=$(realpath "$1"); WORKER_BIN=$(realpath "$2"); CTL=$(realpath "$3")
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs dipaco_dist 30 "$@"; }

cd "$W"
mkdir -p corpus
for i in $(seq 1 150); do echo "We hold these truths to be self-evident, number $i; the union is strong and free."; done > corpus/a.txt
for i in $(seq 1 150); do echo "#include <stdio.h> static int f$i(void) { return $i * 2; } /* $i */"; done > corpus/b.txt
cat corpus/a.txt corpus/b.txt > corpus/mix.txt
"$CTL" data prepare --tokenizer byte --out data --val-fraction 0.1 corpus/mix.txt 2>/dev/null
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out init 2>/dev/null
"$CTL" route fit --model init --data data/train_000.bin --seq-len 16 --prefix 8 --k 4 --seed 3 --out router
paths=$("$CTL" route assign --router router --data data/train_000.bin --seq-len 16 --out routed)
echo "data.paths = $paths"
cat > spec.json <<JSON
{"name": "dipaco-test", "model": {"init": "$W/init"}, "data": {"paths": $paths},
 "algorithm": "dipaco", "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "levels": [{"stem": true, "layers": [0, 1], "modules": 2}, {"layers": [1, 2], "modules": 2}],
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
start_coordinator "$W/state" --lease-ttl-ms 20000
# A list per path or nothing: three lists for four paths is refused before anything is created.
$PY - spec.json bad3.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); s["data"]["paths"] = s["data"]["paths"][:3]; s["name"] = "bad"
json.dump(s, open(sys.argv[2], "w"))
PY
if "$CTL" --coordinator "$COORD" job create bad3.json 2>bad3.err; then fail "a spec with 3 data.paths lists for 4 paths was accepted"; fi
grep -q '3 lists for 4 paths' bad3.err || fail "unclear error for a short data.paths: $(cat bad3.err)"
[ "$("$CTL" --coordinator "$COORD" job list --json | $PY -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')" = 0 ] \
  || fail "a refused spec created a job"
start_worker w1 "$W"
start_worker w2 "$W"
job=$("$CTL" --coordinator "$COORD" job create spec.json)
echo "created job $job"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 || fail "job did not finish"
for p in 0 1 2 3; do "$CTL" --coordinator "$COORD" job export "$job" --path $p --out "export_$p" 2>/dev/null; done
$PY "$HERE/../oracle/dipaco_ref.py" --init init --spec spec.json --data-dir "$W" --compare "export_" --tol 1e-4 \
  || fail "exported paths differ from the PyTorch DiPaCo reference"
echo "dipaco_dist: OK"
