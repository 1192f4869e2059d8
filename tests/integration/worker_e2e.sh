#!/usr/bin/env bash
# worker_e2e.sh DIPACOCTL DIPACO_COORDINATOR DIPACO_WORKER DILOCO_LOCAL — two real workers
# (--threads 1) against a real coordinator on loopback, serving two tiny DiLoCo jobs at once
# (R=2, H=3, 3 rounds; inner state "keep" and "reset"). Each exported model must be
# bit-identical to the single-process run of the same job (tests/unit/diloco_local.c, which
# composes the same trainer and outer step without a network) and match the PyTorch DiLoCo
# reference (tests/oracle/diloco_ref.py) to 1e-4 (keep) / 1e-3 (reset, as diloco_local.sh).
# Whichever worker gets which slot, per-(job, slot) AdamW state must make the result exact.
set -euo pipefail
CTL=$1; CO=$2; WK=$3; LOCAL=$4
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
fail() {
  echo "worker_e2e: $*" >&2
  for f in "$W"/*.log; do echo "---- $f" >&2; tail -n 30 "$f" >&2; done
  exit 1
}
for i in $(seq 1 300); do echo "Abundant gratitude to the people, $i times over; the union is strong."; done > "$W/t.txt"
"$CTL" data prepare --tokenizer byte --out "$W/data" --val-fraction 0 "$W/t.txt" 2>/dev/null
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 3 --out "$W/init" 2>/dev/null

"$CO" --listen 127.0.0.1:0 --state-dir "$W/state" --heartbeat-ms 200 --lease-ttl-ms 5000 --log-json 2> "$W/coord.log" &
PIDS+=($!)
PORT=
for _ in $(seq 1 100); do
  PORT=$(sed -n 's/.*listening on .*(port \([0-9]*\)).*/\1/p' "$W/coord.log" | head -n 1)
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "$PORT" ] || fail "the coordinator did not start"
export DIPACO_COORDINATOR=127.0.0.1:$PORT
DIPACO_ADMIN_TOKEN=$(cat "$W/state/admin.token"); export DIPACO_ADMIN_TOKEN # created by the coordinator

declare -A JOB
for state in keep reset; do
  cat > "$W/spec_$state.json" <<JSON
{"name": "e2e-$state", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-8, "grad_clip": 0.5, "state": "$state"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
  JOB[$state]=$("$CTL" job create "$W/spec_$state.json" 2>>"$W/ctl.log")
done

WP=()
for w in 1 2; do
  "$WK" --coordinator "127.0.0.1:$PORT" --data-dir "$W" --threads 1 --name "w$w" --token-file "$W/state/join.token" --exit-when-done \
    --log-json 2> "$W/worker$w.log" &
  WP+=($!)
  PIDS+=($!)
done
for state in keep reset; do
  "$CTL" job wait "${JOB[$state]}" --timeout 90 >>"$W/ctl.log" 2>&1 || fail "job $state did not finish"
done
for p in "${WP[@]}"; do
  wait "$p" || fail "a worker exited with status $?"
done
grep -q '"level":"error"' "$W"/worker*.log && fail "a worker logged an error"
# Each worker registered what it computes on (gpt_describe: CPU model, thread count and the
# matrix product it runs).
"$CTL" workers --all --json > "$W/workers.json" 2>>"$W/ctl.log" || fail "dipacoctl workers"
"${DPC_PYTHON:-python3}" - "$W/workers.json" <<'PY' || fail "workers do not report their device: $(cat "$W/workers.json")"
import json, re, sys
ws = json.load(open(sys.argv[1]))
ws = ws.get("workers", ws) if isinstance(ws, dict) else ws
dev = re.compile(r".+ \(1 threads, (dipaco-avx512|openblas) products\)$")
assert len(ws) >= 2 and all(dev.match(w.get("device", "")) for w in ws), ws
PY

for state in keep reset; do
  "$CTL" job export "${JOB[$state]}" --path 0 --out "$W/out_$state" >>"$W/ctl.log" 2>&1 || fail "export $state"
  "$LOCAL" "$W/init" "$W/data/train_000.bin" "$W/local_$state" 2 3 3 2 16 0.01 2 0.1 0.1 0.9 0.95 1e-8 0.5 0.7 0.9 \
    $state 2>/dev/null
  "${DPC_PYTHON:-python3}" - "$W/out_$state" "$W/local_$state" <<'PY' || fail "$state: distributed result differs from diloco_local"
import glob, json, struct, sys
import numpy as np
def read(d):
    raw = open(glob.glob(d + "/*.safetensors")[0], "rb").read()
    (hl,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + hl])
    return {k: np.frombuffer(raw[8 + hl + v["data_offsets"][0]:8 + hl + v["data_offsets"][1]], dtype=np.float32)
            for k, v in hdr.items() if k != "__metadata__"}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a.keys() == b.keys(), "tensor names differ"
worst = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
print(f"worker_e2e: {sys.argv[1]}: max |distributed - diloco_local| = {worst:.3g} over {len(a)} tensors")
sys.exit(0 if worst == 0.0 else 1)
PY
  tol=1e-4; [ $state = reset ] && tol=1e-3
  "${DPC_PYTHON:-python3}" "$HERE/../oracle/diloco_ref.py" --init "$W/init" --data "$W/data/train_000.bin" \
    --spec "$W/spec_$state.json" --compare "$W/out_$state" --tol $tol || fail "$state: PyTorch reference differs"
done
echo "worker_e2e: leases per worker: $(grep -c 'pushed' "$W/worker1.log") / $(grep -c 'pushed' "$W/worker2.log")"
