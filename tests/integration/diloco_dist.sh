#!/usr/bin/env bash
# diloco_dist.sh COORDINATOR WORKER DIPACOCTL — the distributed test of record: a real
# coordinator and 2 real CPU workers on loopback run a tiny DiLoCo job (R=2, H=3, 3 rounds);
# the exported parameters must equal the PyTorch DiLoCo reference (tests/oracle/diloco_ref.py)
# to 1e-4 relative (the outer momentum on a schedule: warm-up over 2 rounds, decay over the
# last 2, so the rounds run at 0.45, 0.45 and 0), and a second export must be byte-identical. "versions" keeps the last two
# versions and every even one: after 3 rounds version 2 must still export and match the
# reference stopped after round 2, and version 1 must be gone, with a clear error. (AdamW eps 1e-6: see
# diloco_local.sh for why a tiny eps would compare rounding noise, not math.)
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"

make_corpus "$W/corpus"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out "$W/init" 2>/dev/null
cat > "$W/spec.json" <<JSON
{"name": "dist-test", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true, "momentum_warmup": 2, "momentum_decay": 2},
 "versions": {"keep_last": 2, "keep_every": 2}}
JSON
start_coordinator "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
echo "created job $job"
if ! "$CTL" --coordinator "$COORD" job wait "$job" --timeout 240; then
  echo "job did not finish"; tail -30 "$W"/*.log; exit 1
fi
"$CTL" --coordinator "$COORD" job show "$job" | tee "$W/show.txt"
# job show names the rule the job uses and where it comes from
grep -q "^outer.origin .*set by the job spec: lr, momentum (the defaults for diloco at R = 2, H = 3, [0-9.]*M parameters in its layers (derived from R, H < 20 and the model.s size): lr 0.5, momentum 0.6" "$W/show.txt" &&
  grep -q "^outer.schedule .*warm-up over the first 2 rounds, decay to 0 over the last 2" "$W/show.txt" ||
  { echo "job show does not print the outer rule's origin and schedule"; exit 1; }
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export2"
cmp "$W/export/model.safetensors" "$W/export2/model.safetensors"
cmp "$W/export/config.json" "$W/export2/config.json"
echo "export is byte-identical across two exports"
$PY "$HERE/../oracle/diloco_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/spec.json" \
  --compare "$W/export" --tol 1e-4
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export_v2" --version 2
$PY "$HERE/../oracle/diloco_ref.py" --init "$W/init" --data "$W/corpus/data/train_000.bin" --spec "$W/spec.json" \
  --compare "$W/export_v2" --tol 1e-4 --rounds-done 2
if "$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export_v1" --version 1 2>"$W/v1.err"; then
  echo "version 1 should have been garbage-collected"; exit 1
fi
grep -q "not kept" "$W/v1.err" || { echo "export of a collected version: unclear error: $(cat "$W/v1.err")"; exit 1; }
echo "versions: 2 kept and exportable (matches the reference after round 2), 1 collected"
