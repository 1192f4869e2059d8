#!/usr/bin/env bash
# ctl_offline.sh DIPACOCTL — the offline tools end to end, as a user runs them: data prepare,
# init, train (loss must fall, --json well formed, bit-identical reruns), eval, generate, and
# clear failures (non-zero exit, message naming the file and the problem) on bad input.
set -uo pipefail
CTL=${1:?usage: ctl_offline.sh DIPACOCTL}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PY=${DPC_PYTHON:-python3}
fail=0; checks=0
ok() { checks=$((checks + 1)); echo "ok: $*"; }
bad() { checks=$((checks + 1)); fail=$((fail + 1)); echo "FAIL: $*"; }
# expect_fail DESC PATTERN CMD... : CMD must exit non-zero and print PATTERN (regex) on stderr.
expect_fail() {
  local desc=$1 pat=$2; shift 2
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 0 ] && grep -Eq -- "$pat" <<<"$out"; then ok "$desc"; else bad "$desc (rc=$rc, stderr: $out)"; fi
}

# A small corpus made here: repetitive English so a tiny model learns quickly.
for i in $(seq 1 400); do echo "The quick brown fox jumps over the lazy dog number $((i % 7)). It is a fine day."; done > "$W/a.txt"
mkdir -p "$W/docs"; for i in 1 2 3; do sed -n "$((i * 50)),$((i * 50 + 60))p" "$W/a.txt" > "$W/docs/d$i.txt"; done

"$CTL" data prepare --tokenizer byte --out "$W/data" --val-fraction 0.1 "$W/a.txt" "$W/docs" 2>"$W/prep.log" \
  && ok "data prepare" || { bad "data prepare: $(cat "$W/prep.log")"; }
[ -s "$W/data/train_000.bin" ] && [ -s "$W/data/val_000.bin" ] && ok "train and val shards written" || bad "shards missing"
ntok=$($PY -c "import numpy as np,sys; h=np.fromfile(sys.argv[1],dtype=np.int32,count=256); print(h[0],h[1],h[2])" "$W/data/train_000.bin")
[ "$(cut -d' ' -f1,2 <<<"$ntok")" = "20240520 1" ] && ok "llm.c header ($ntok)" || bad "header: $ntok"

"$CTL" init --n-layer 2 --n-head 2 --n-embd 32 --n-positions 32 --vocab-size 256 --seed 7 --out "$W/m0" 2>/dev/null \
  && ok "init" || bad "init"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 32 --n-positions 32 --vocab-size 256 --seed 7 --out "$W/m0b" 2>/dev/null
cmp -s "$W/m0/model.safetensors" "$W/m0b/model.safetensors" && ok "init is deterministic in the seed" || bad "init differs for one seed"

train() { "$CTL" train --model "$W/m0" --data "$W/data/train_000.bin" --steps 40 --batch 4 --seq-len 32 --lr 3e-3 \
  --warmup 5 --threads 2 "$@"; }
train --out "$W/m1" --json >"$W/train.jsonl" 2>"$W/train.log" && ok "train" || bad "train: $(tail -3 "$W/train.log")"
train --out "$W/m1b" >/dev/null 2>&1
cmp -s "$W/m1/model.safetensors" "$W/m1b/model.safetensors" && ok "training is bit-identical for a fixed thread count" \
  || bad "two identical training runs differ"
$PY - "$W/train.jsonl" <<'PY' && ok "--json lines well formed, loss falls" || bad "--json lines / loss"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 40, len(rows)
assert [r["step"] for r in rows] == list(range(40))
for r in rows:
    assert set(r) >= {"step", "loss", "lr", "tokens_per_s"}, r
assert abs(rows[0]["lr"] - 3e-3 / 5) < 1e-9 and abs(rows[4]["lr"] - 3e-3) < 1e-9, (rows[0]["lr"], rows[4]["lr"])
first = sum(r["loss"] for r in rows[:5]) / 5; last = sum(r["loss"] for r in rows[-5:]) / 5
print("loss", first, "->", last)
assert first > 5.0 and last < first - 1.0
PY

e0=$("$CTL" eval --model "$W/m0" --data "$W/data/val_000.bin" --batch 2 --seq-len 32 --json 2>/dev/null)
e1=$("$CTL" eval --model "$W/m1" --data "$W/data/val_000.bin" --batch 2 --seq-len 32 --batches 3 --json 2>/dev/null)
$PY -c "
import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2])
assert b['batches']==3 and b['tokens']==3*2*32, b
assert abs(a['loss']-5.545)<0.1 and b['loss']<a['loss']-1, (a,b)" "$e0" "$e1" && ok "eval ($e0 -> $e1)" || bad "eval: $e0 / $e1"

g1=$("$CTL" generate --model "$W/m1" --tokenizer byte --prompt "The quick" --tokens 30 --seed 3 2>/dev/null)
g2=$("$CTL" generate --model "$W/m1" --tokenizer byte --prompt "The quick" --tokens 30 --seed 3 2>/dev/null)
g0=$("$CTL" generate --model "$W/m1" --tokenizer byte --prompt "The quick" --tokens 30 --temperature 0 2>/dev/null)
[ "$g1" = "$g2" ] && [ "${g1:0:9}" = "The quick" ] && [ ${#g1} -ge 30 ] && ok "generate: '$g1'" || bad "generate: '$g1' / '$g2'"
[ -n "$g0" ] && ok "greedy generate: '$g0'" || bad "greedy generate"

# Bad input: each must fail with a message naming the file and the problem.
head -c 1000 "$W/data/train_000.bin" > "$W/trunc.bin"
expect_fail "truncated shard" "trunc.bin.*(truncat|short|size)" "$CTL" eval --model "$W/m1" --data "$W/trunc.bin" --batch 1 --seq-len 8
$PY -c "import sys; b=bytearray(open(sys.argv[1],'rb').read()); b[0]^=1; open(sys.argv[2],'wb').write(b)" "$W/data/train_000.bin" "$W/magic.bin"
expect_fail "wrong-magic shard" "magic.bin.*magic" "$CTL" eval --model "$W/m1" --data "$W/magic.bin" --batch 1 --seq-len 8
expect_fail "missing shard" "nope.bin" "$CTL" eval --model "$W/m1" --data "$W/nope.bin" --batch 1 --seq-len 8
cp -r "$W/m1" "$W/lie"; $PY - "$W/lie/model.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
struct.pack_into("<Q", b, 0, len(b) * 4)   # header length larger than the file
open(p, "wb").write(b)
PY
expect_fail "safetensors with a lying header" "model.safetensors" "$CTL" eval --model "$W/lie" --data "$W/data/val_000.bin" --batch 1 --seq-len 8
cp -r "$W/m1" "$W/shape"; sed -i 's/"n_embd": *32/"n_embd": 64/' "$W/shape/config.json"
grep -q '"n_embd": *64' "$W/shape/config.json" || bad "could not edit config.json for the shape test"
expect_fail "shape mismatch with config.json" "(shape|expected)" "$CTL" eval --model "$W/shape" --data "$W/data/val_000.bin" --batch 1 --seq-len 8
cp -r "$W/m1" "$W/miss"; $PY - "$W/miss/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; raw = open(p, "rb").read()
(n,) = struct.unpack("<Q", raw[:8]); hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
keep = {k: v for k, v in hdr.items() if k != "h.1.mlp.c_fc.bias"}
out, off, new = b"", 0, {}
for k, v in keep.items():
    if k == "__metadata__": new[k] = v; continue
    a, b = v["data_offsets"]; new[k] = dict(v, data_offsets=[off, off + b - a]); out += data[a:b]; off += b - a
h = json.dumps(new).encode(); h += b" " * (-len(h) % 8)
open(p, "wb").write(struct.pack("<Q", len(h)) + h + out)
PY
expect_fail "missing tensor" "h.1.mlp.c_fc.bias" "$CTL" eval --model "$W/miss" --data "$W/data/val_000.bin" --batch 1 --seq-len 8
expect_fail "seq-len > n_positions" "n_positions" "$CTL" train --model "$W/m1" --data "$W/data/train_000.bin" --out "$W/x" --steps 1 --batch 1 --seq-len 64
expect_fail "unknown flag" "unknown flag '--lr-typo'" "$CTL" train --model "$W/m1" --data "$W/data/train_000.bin" --out "$W/x" --steps 1 --batch 1 --seq-len 8 --lr-typo 1
expect_fail "bad number" "--steps expects an integer" "$CTL" train --model "$W/m1" --data "$W/data/train_000.bin" --out "$W/x" --steps ten --batch 1 --seq-len 8
expect_fail "missing required flag" "missing required flag --out" "$CTL" train --model "$W/m1" --data "$W/data/train_000.bin" --steps 1 --batch 1 --seq-len 8
"$CTL" init --n-layer 1 --n-head 1 --n-embd 8 --n-positions 16 --vocab-size 50 --out "$W/small" 2>/dev/null
expect_fail "vocab too small for the data" "vocab_size" "$CTL" eval --model "$W/small" --data "$W/data/val_000.bin" --batch 1 --seq-len 8
expect_fail "unknown tokenizer" "unknown tokenizer" "$CTL" data prepare --tokenizer wordpiece --out "$W/y" "$W/a.txt"
expect_fail "bad init config" "divisible" "$CTL" init --n-layer 1 --n-head 3 --n-embd 8 --n-positions 16 --vocab-size 50 --out "$W/z"
"$CTL" --help | grep -q "data prepare" && ok "--help" || bad "--help"
expect_fail "unknown precision" "unknown precision 'fp16'" "$CTL" eval --model "$W/m1" --data "$W/data/val_000.bin" --batch 1 --seq-len 8 --precision fp16

# The CUDA backend is a plugin loaded on demand: the program itself needs no CUDA library, and a
# missing or broken plugin is reported, not a crash.
if command -v readelf >/dev/null; then
  readelf -d "$CTL" | grep -Eq "cublas|cudart" && bad "dipacoctl links CUDA libraries directly" || ok "dipacoctl needs no CUDA library"
fi
DIPACO_CUDA_PLUGIN=$W/none.so expect_fail "missing CUDA plugin" "no CUDA backend.*none.so" "$CTL" eval --model "$W/m1" --data "$W/data/val_000.bin" --batch 1 --seq-len 8 --backend cuda
echo junk > "$W/junk.so"
DIPACO_CUDA_PLUGIN=$W/junk.so expect_fail "broken CUDA plugin" "cannot load the CUDA backend.*junk.so" "$CTL" eval --model "$W/m1" --data "$W/data/val_000.bin" --batch 1 --seq-len 8 --backend cuda
# --backend cuda: the same eval as the CPU's on a GPU machine; elsewhere a clear refusal.
if ec=$("$CTL" eval --model "$W/m1" --data "$W/data/val_000.bin" --batch 2 --seq-len 32 --batches 3 --json --backend cuda 2>"$W/cuda.err"); then
  python3 -c "import json,sys; a,b=json.loads(sys.argv[1]),json.loads(sys.argv[2]); assert abs(a['loss']-b['loss'])<=1e-4*b['loss'], (a,b)" "$ec" "$e1" \
    && ok "eval --backend cuda matches the CPU ($ec)" || bad "eval --backend cuda: $ec vs $e1"
  # 40 training steps on the GPU (fp32) against the CPU run m1: every loss within 1e-3, the
  # trained parameters within 1e-3 of the largest (rounding differences grow over 40 steps).
  if train --out "$W/mg" --json --backend cuda >"$W/train_gpu.jsonl" 2>"$W/train_gpu.log"; then
    $PY - "$W/train.jsonl" "$W/train_gpu.jsonl" "$W/m1/model.safetensors" "$W/mg/model.safetensors" <<'PY' \
      && ok "train --backend cuda tracks the CPU run" || bad "train --backend cuda differs from the CPU run"
import json, struct, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]; b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 40 and max(abs(x - y) / x for x, y in zip(a, b)) <= 1e-3, (a, b)
def floats(p):
    raw = open(p, "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); body = raw[8 + n:]
    return struct.unpack("<%df" % (len(body) // 4), body)
pa, pb = floats(sys.argv[3]), floats(sys.argv[4])
scale = max(abs(x) for x in pa)
err = max(abs(x - y) for x, y in zip(pa, pb)) / scale
print("train cuda vs cpu: worst loss rel err %.2e, params rel err %.2e" % (max(abs(x - y) / x for x, y in zip(a, b)), err))
assert len(pa) == len(pb) and err <= 1e-3, err
PY
  else
    bad "train --backend cuda: $(tail -3 "$W/train_gpu.log")"
  fi
elif grep -Eq "no CUDA device|built without the CUDA backend" "$W/cuda.err"; then
  ok "eval --backend cuda without a GPU refused: $(head -1 "$W/cuda.err")"
else
  bad "eval --backend cuda: unexpected failure: $(cat "$W/cuda.err")"
fi

echo "$((checks - fail)) passed, $fail failed"
[ $fail -eq 0 ]
