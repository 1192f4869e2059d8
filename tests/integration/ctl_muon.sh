#!/usr/bin/env bash
# ctl_muon.sh DIPACOCTL PYTHON — `dipacoctl train --optimizer muon` (MuLoCo's inner optimizer,
# docs/design.md §3.2) against tests/oracle/muon_ref.py (torch.optim.Muon's math in fp32 with
# torch.optim.AdamW and clip_grad_norm_): 5 clipped steps on a tiny GPT-2 and a tiny Llama equal
# the reference within 5e-5 relative (worst tensor), parameters and the optimizer state that
# --opt-state-out writes (Muon's momentum buffer in m, v zero there); a Llama run with
# nesterov 0 and adjust_lr match_rms_adamw likewise. Bad Muon flags fail naming the flag. With a
# GPU, the CUDA backend's Muon run matches the reference too (1e-4).
set -uo pipefail
CTL=${1:?usage: ctl_muon.sh DIPACOCTL [PYTHON]}
PY=${2:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
fail=0; checks=0
ok() { checks=$((checks + 1)); echo "ok: $*"; }
bad() { checks=$((checks + 1)); fail=$((fail + 1)); echo "FAIL: $*"; }

for i in $(seq 1 300); do echo "The quick brown fox jumps over the lazy dog number $((i % 7)). It is a fine day."; done > "$W/a.txt"
"$CTL" data prepare --tokenizer byte --out "$W/data" --val-fraction 0.1 "$W/a.txt" 2>/dev/null || bad "data prepare"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 32 --n-positions 16 --vocab-size 256 --seed 3 --out "$W/g0" 2>/dev/null \
  || bad "init gpt2"
"$CTL" init --arch llama --n-layer 2 --n-head 4 --n-kv-head 2 --n-embd 32 --n-positions 16 --vocab-size 256 --seed 3 \
  --out "$W/l0" 2>/dev/null || bad "init llama"

# case NAME MODEL NESTEROV ADJUST: train 5 steps, then the reference on the same spec.
case_() {
  local name=$1 m=$2 nest=$3 adj=$4 pynest=true
  [ "$nest" = 0 ] && pynest=false
  cat > "$W/$name.json" <<JSON
{"steps": 5, "batch": 2, "seq_len": 16,
 "inner": {"optimizer": "muon", "lr": 0.001, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9,
           "beta2": 0.95, "eps": 1e-6, "grad_clip": 1.0,
           "muon": {"lr": 0.02, "momentum": 0.95, "nesterov": $pynest, "ns_steps": 5, "weight_decay": 0.05,
                    "adjust_lr": "$adj"}}}
JSON
  if ! "$CTL" train --model "$W/$m" --data "$W/data/train_000.bin" --out "$W/$name" --steps 5 --batch 2 --seq-len 16 \
      --lr 0.001 --warmup 2 --lr-min-frac 0.1 --weight-decay 0.1 --eps 1e-6 --grad-clip 1.0 --threads 2 --optimizer muon \
      --muon-lr 0.02 --muon-momentum 0.95 --muon-nesterov "$nest" --muon-ns-steps 5 --muon-weight-decay 0.05 \
      --muon-adjust-lr "$adj" --opt-state-out "$W/$name.state" 2>"$W/$name.log"; then
    bad "$name: train: $(tail -2 "$W/$name.log")"; return
  fi
  local out
  out=$("$PY" "$HERE/tests/oracle/muon_ref.py" --init "$W/$m" --data "$W/data/train_000.bin" --spec "$W/$name.json" \
        --compare "$W/$name" --state "$W/$name.state" --tol 5e-5 2>&1) && ok "$name: $out" || bad "$name: $out"
}
case_ gpt2 g0 1 original
case_ llama l0 1 original
case_ llama_plain l0 0 match_rms_adamw

expect_fail() {
  local desc=$1 pat=$2; shift 2
  local err rc
  err=$("$CTL" train --model "$W/g0" --data "$W/data/train_000.bin" --out "$W/z" --steps 1 --batch 2 --seq-len 16 \
        "$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 0 ] && grep -Eq -- "$pat" <<<"$err"; then ok "$desc"; else bad "$desc (rc=$rc: $err)"; fi
}
expect_fail "unknown optimizer" "--optimizer must be adamw or muon" --optimizer sgd
expect_fail "momentum 1" "--muon-momentum must be in" --optimizer muon --muon-momentum 1
expect_fail "ns_steps 0" "--muon-ns-steps must be in" --optimizer muon --muon-ns-steps 0
expect_fail "unknown adjust" "--muon-adjust-lr must be" --optimizer muon --muon-adjust-lr rms
# The CUDA backend: with a GPU, its Muon run matches the same reference (fp32, 1e-4); without one
# (or without the plugin) it fails saying which.
if "$CTL" train --model "$W/g0" --data "$W/data/train_000.bin" --out "$W/gcuda" --steps 5 --batch 2 --seq-len 16 \
    --lr 0.001 --warmup 2 --lr-min-frac 0.1 --weight-decay 0.1 --eps 1e-6 --grad-clip 1.0 --optimizer muon \
    --muon-lr 0.02 --muon-weight-decay 0.05 --backend cuda 2>"$W/cuda.err" >/dev/null; then
  out=$("$PY" "$HERE/tests/oracle/muon_ref.py" --init "$W/g0" --data "$W/data/train_000.bin" --spec "$W/gpt2.json" \
        --compare "$W/gcuda" --tol 1e-4 2>&1) && ok "muon on cuda: $out" || bad "muon on cuda: $out"
else
  grep -Eq "no CUDA device is visible|no CUDA backend|cannot load the CUDA" "$W/cuda.err" \
    && ok "muon on cuda without a GPU: $(head -c 160 "$W/cuda.err")" || bad "muon on cuda: $(cat "$W/cuda.err")"
fi
[ ! -e "$W/z" ] && ok "failed runs wrote nothing" || bad "a failed run wrote $W/z"

echo "ctl_muon: $checks checks, $fail failed"
[ $fail -eq 0 ]
