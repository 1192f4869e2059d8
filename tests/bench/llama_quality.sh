#!/usr/bin/env bash
# tests/bench/llama_quality.sh — Llama-class against GPT-2 at equal parameter count and equal
# steps on the quickstart's corpus (docs/benchmarks.md §3.1): deploy/quickstart.sh's two
# models (L4 C128 4 heads, byte vocab; GPT-2 0.842M parameters, the Llama with 2 KV heads,
# SwiGLU 400 and tied embeddings 0.845M), each trained by `dipacoctl train` from a fresh init
# per seed on the same shard with the same batches and the quickstart's inner hyperparameters
# (AdamW lr 0.003, warmup 20, cosine to 0.1, weight decay 0.1, clip 1.0, batch 8 x 128), then
# `dipacoctl eval` on 20 held-out batches. Prints a markdown table (one row per arch and seed,
# then the mean per arch). Single process, 1 thread per run, JOBS runs at a time.
# Environment: STEPS (1200), SEEDS ("1 2"), JOBS (2), QDIR (default /tmp/llama_quality; the
#   demo corpus is prepared there unless DATA names a directory with train_000.bin/val_000.bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-1200}; SEEDS=${SEEDS:-"1 2"}; JOBS=${JOBS:-2}; QDIR=${QDIR:-/tmp/llama_quality}
L=4; NH=4; C=128; T=128; B=8; NKV=2; I=400
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DDIPACO_DISTRIBUTED=OFF >/dev/null
cmake --build build-bench -j"$(nproc)" --target dipacoctl >/dev/null
ctl=build-bench/coordinator/dipacoctl
mkdir -p "$QDIR"
DATA=${DATA:-$QDIR/data}
if [ ! -s "$DATA/train_000.bin" ]; then
  assets=$(bash deploy/fetch_assets.sh tests/.cache)
  "$ctl" data prepare --tokenizer byte --out "$DATA" --val-fraction 0.05 "$assets/sotu" >/dev/null
fi

run() { # ARCH SEED: init, train, eval; writes $QDIR/ARCH-SEED.json
  local arch=$1 seed=$2 d=$QDIR/$1-$2 extra=()
  [ "$arch" = llama ] && extra=(--arch llama --n-kv-head $NKV --intermediate-size $I)
  rm -rf "$d"; mkdir -p "$d"
  "$ctl" init "${extra[@]}" --n-layer $L --n-head $NH --n-embd $C --n-positions $T --vocab-size 256 --seed "$seed" \
    --out "$d/init" 2>"$d/init.log"
  "$ctl" train --model "$d/init" --data "$DATA/train_000.bin" --out "$d/final" --steps "$STEPS" --batch $B --seq-len $T \
    --lr 0.003 --warmup 20 --lr-min-frac 0.1 --weight-decay 0.1 --grad-clip 1.0 --threads 1 --json >"$d/train.jsonl" 2>"$d/train.log"
  "$ctl" eval --model "$d/final" --data "$DATA/val_000.bin" --batch $B --seq-len $T --batches 20 --json >"$d/eval.json" 2>/dev/null
  echo "llama_quality: $arch seed $seed done: $(cat "$d/eval.json")" >&2
}
pids=()
for seed in $SEEDS; do
  for arch in llama gpt2; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 1; done
    run "$arch" "$seed" & pids+=($!)
  done
done
for p in "${pids[@]}"; do wait "$p"; done

python3 - "$QDIR" "$STEPS" $SEEDS <<'PY'
import json, re, statistics, sys
q, steps, seeds = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("| model | parameters | seed | train loss, last 50 steps | eval loss (val, 20 batches) |")
print("|---|---|---|---|---|")
means = {}
for arch in ("llama", "gpt2"):
    for s in seeds:
        d = f"{q}/{arch}-{s}"
        rows = [json.loads(l) for l in open(d + "/train.jsonl")]
        ev = json.load(open(d + "/eval.json"))["loss"]
        n = int(re.search(r"(\d+) parameters", open(d + "/init.log").read()).group(1))
        tl = statistics.mean(r["loss"] for r in rows[-50:])
        name = "Llama-class (GQA 4/2, SwiGLU 400, tied)" if arch == "llama" else "GPT-2"
        print(f"| {name} | {n/1e6:.3f}M | {s} | {tl:.4f} | {ev:.4f} |")
        means.setdefault(arch, []).append(ev)
m = {a: statistics.mean(v) for a, v in means.items()}
print(f"\nmean eval loss over seeds {', '.join(seeds)}, {steps} steps: Llama-class {m['llama']:.4f}, GPT-2 {m['gpt2']:.4f} "
      f"(Llama / GPT-2 = {m['llama']/m['gpt2']:.3f})")
PY
