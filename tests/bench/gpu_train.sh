#!/usr/bin/env bash
# tests/bench/gpu_train.sh — GPT-2 124M training throughput on the GPU: dipaco's CUDA backend
# (tests/bench/gpu_train.c) and PyTorch (gpu_train_torch.py: same model, bf16 autocast, flash
# attention, fused AdamW, torch.compile when it works) side by side in one run, same B, T and
# precision; prints tokens/s, MFU and the dipaco/torch ratio per configuration.
# Usage: tests/bench/gpu_train.sh [BUILD_DIR]   (env: BS="16 32", T=1024, PRECS="bf16", STEPS=10,
#        PYTHON=python3). Needs a CUDA build (-DDIPACO_CUDA=ON) and a GPU; exits 77 without one.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
bin=$build/tests/gpu_train
[ -x "$bin" ] || { echo "gpu_train.sh: $bin missing: configure with -DDIPACO_CUDA=ON and build" >&2; exit 2; }
py=${PYTHON:-python3}
T=${T:-1024}; STEPS=${STEPS:-10}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for prec in ${PRECS:-bf16}; do
  for B in ${BS:-16 32}; do
    echo "== B=$B T=$T $prec" >&2
    d=$("$bin" "$B" "$T" "$prec" "$STEPS") || { rc=$?; [ $rc = 77 ] && { echo "SKIP: no GPU" >&2; exit 77; }; echo "dipaco failed ($rc)" >&2; d=""; }
    t=$("$py" "$here/gpu_train_torch.py" "$B" "$T" "$prec" "$STEPS" 2> >(grep -v "^W" >&2)) || { echo "torch failed" >&2; t=""; }
    echo "$d" >&2; echo "$t" >&2
    printf '%s\t%s\n' "$d" "$t" >>"$results"
  done
done
"$py" - "$results" <<'PY'
import json, sys
print("| precision | B | T | dipaco tok/s | dipaco MFU | torch tok/s | torch MFU | torch mode | ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    d, t = (json.loads(x) if x.strip() else None for x in line.rstrip("\n").split("\t"))
    if not d or not t:
        print("| ? | | | %s | | %s | | | |" % (d and d["tokens_per_s"], t and t["tokens_per_s"])); continue
    print("| %s | %d | %d | %.0f | %.1f%% | %.0f | %.1f%% | %s | %.2fx |" % (d["precision"], d["B"], d["T"],
          d["tokens_per_s"], 100 * d["mfu"], t["tokens_per_s"], 100 * t["mfu"], t["impl"], d["tokens_per_s"] / t["tokens_per_s"]))
PY
