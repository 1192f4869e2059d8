#!/usr/bin/env bash
# ctl_llama.sh DIPACOCTL PYTHON — dipacoctl's offline tools with a Llama-class model, as a user
# runs them: init --arch llama (GQA, tied; deterministic in the seed), train (loss falls,
# bit-identical reruns), eval, generate; the trained directory loads strictly into the PyTorch
# LlamaForCausalLM of tests/oracle/llama_oracle.py under its HF names, and that module's loss on
# the eval batches equals dipacoctl eval's. Bad init flags fail naming the flag or key.
set -uo pipefail
CTL=${1:?usage: ctl_llama.sh DIPACOCTL [PYTHON]}
PY=${2:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
fail=0; checks=0
ok() { checks=$((checks + 1)); echo "ok: $*"; }
bad() { checks=$((checks + 1)); fail=$((fail + 1)); echo "FAIL: $*"; }
expect_fail() {
  local desc=$1 pat=$2; shift 2
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 0 ] && grep -Eq -- "$pat" <<<"$out"; then ok "$desc"; else bad "$desc (rc=$rc, stderr: $out)"; fi
}

for i in $(seq 1 400); do echo "The quick brown fox jumps over the lazy dog number $((i % 7)). It is a fine day."; done > "$W/a.txt"
"$CTL" data prepare --tokenizer byte --out "$W/data" --val-fraction 0.1 "$W/a.txt" 2>"$W/prep.log" \
  && ok "data prepare" || bad "data prepare: $(cat "$W/prep.log")"

INIT=(init --arch llama --n-layer 2 --n-head 4 --n-kv-head 2 --n-embd 32 --n-positions 32 --vocab-size 256 --seed 7)
"$CTL" "${INIT[@]}" --out "$W/m0" 2>"$W/init.log" && ok "init --arch llama: $(cat "$W/init.log")" || bad "init: $(cat "$W/init.log")"
"$CTL" "${INIT[@]}" --out "$W/m0b" 2>/dev/null
cmp -s "$W/m0/model.safetensors" "$W/m0b/model.safetensors" && ok "init is deterministic in the seed" || bad "init differs"
$PY - "$W/m0/config.json" <<'PY' && ok "config.json is a LlamaConfig" || bad "config.json: $(cat "$W/m0/config.json")"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["model_type"] == "llama" and c["architectures"] == ["LlamaForCausalLM"], c
assert c["num_key_value_heads"] == 2 and c["intermediate_size"] == 96 and c["tie_word_embeddings"] is True, c
assert c["hidden_act"] == "silu" and c["rope_scaling"] is None and c["torch_dtype"] == "float32", c
PY

train() { "$CTL" train --model "$W/m0" --data "$W/data/train_000.bin" --steps 40 --batch 4 --seq-len 32 --lr 3e-3 \
  --warmup 5 --threads 2 "$@"; }
train --out "$W/m1" --json >"$W/train.jsonl" 2>"$W/train.log" && ok "train" || bad "train: $(tail -3 "$W/train.log")"
train --out "$W/m1b" >/dev/null 2>&1
cmp -s "$W/m1/model.safetensors" "$W/m1b/model.safetensors" && ok "training is bit-identical for a fixed thread count" \
  || bad "two identical training runs differ"
$PY - "$W/train.jsonl" <<'PY' && ok "loss falls" || bad "loss does not fall"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first = sum(r["loss"] for r in rows[:5]) / 5; last = sum(r["loss"] for r in rows[-5:]) / 5
print("loss", first, "->", last)
assert len(rows) == 40 and first > 5.0 and last < first - 1.0
PY

e1=$("$CTL" eval --model "$W/m1" --data "$W/data/val_000.bin" --batch 2 --seq-len 32 --batches 3 --json 2>/dev/null)
[ -n "$e1" ] && ok "eval $e1" || bad "eval"
$PY - "$HERE/tests/oracle" "$W/m1" "$W/data/val_000.bin" "$e1" <<'PY' && ok "torch LlamaForCausalLM loads the export strictly and agrees with eval" || bad "torch check"
import json, struct, sys
import numpy as np, torch, torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
from llama_oracle import LlamaForCausalLM
d, shard, ev = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
c = json.load(open(d + "/config.json"))
k = dict(n_layer=c["num_hidden_layers"], n_head=c["num_attention_heads"], n_embd=c["hidden_size"],
         n_positions=c["max_position_embeddings"], vocab_size=c["vocab_size"], n_kv_head=c["num_key_value_heads"],
         intermediate_size=c["intermediate_size"], tie_word_embeddings=int(c["tie_word_embeddings"]),
         attention_bias=0, rope_scaling=0, rope_original_max_position_embeddings=0, rms_norm_eps=c["rms_norm_eps"],
         rope_theta=c["rope_theta"], rope_factor=0.0, rope_low_freq_factor=0.0, rope_high_freq_factor=0.0)
raw = open(d + "/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8]); hdr = json.loads(raw[8:8 + n]); data = raw[8 + n:]
sd = {}
for name, v in hdr.items():
    if name == "__metadata__": continue
    a, b = v["data_offsets"]; assert v["dtype"] == "F32"
    sd[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=np.float32).copy()).view(v["shape"])
m = LlamaForCausalLM(k)
m.load_state_dict(sd, strict=True)  # exactly HF's names and shapes, nothing more or less
tok = np.fromfile(shard, dtype=np.uint16, offset=1024).astype(np.int64)
B, T, losses = 2, 32, []
with torch.no_grad():
    for b in range(3):
        o = b * B * T
        x = torch.from_numpy(np.stack([tok[o + j * T:o + j * T + T] for j in range(B)]))
        y = torch.from_numpy(np.stack([tok[o + j * T + 1:o + j * T + T + 1] for j in range(B)]))
        losses.append(F.cross_entropy(m(x).view(-1, k["vocab_size"]), y.view(-1)).item())
torch_loss = sum(losses) / len(losses)
print("torch loss", torch_loss, "dipacoctl eval", ev["loss"])
assert abs(torch_loss - ev["loss"]) <= 1e-5 * ev["loss"]
PY

g1=$("$CTL" generate --model "$W/m1" --tokenizer byte --prompt "The quick" --tokens 30 --seed 3 2>/dev/null)
g2=$("$CTL" generate --model "$W/m1" --tokenizer byte --prompt "The quick" --tokens 30 --seed 3 2>/dev/null)
[ "$g1" = "$g2" ] && [ "${g1:0:9}" = "The quick" ] && [ ${#g1} -ge 30 ] && ok "generate: '$g1'" || bad "generate: '$g1' / '$g2'"

"$CTL" init --arch llama --n-layer 1 --n-head 2 --n-embd 16 --n-positions 64 --vocab-size 256 --untied --attention-bias \
  --rope-scaling llama3 --rope-factor 8 --rope-original-max-positions 16 --out "$W/q" 2>/dev/null \
  && grep -q '"model_type": "qwen2"' "$W/q/config.json" && grep -q '"rope_type": "llama3"' "$W/q/config.json" \
  && ok "init --untied --attention-bias --rope-scaling llama3 (a Qwen2 config)" || bad "init qwen2: $(cat "$W/q/config.json")"
expect_fail "llama flag with gpt2" "--n-kv-head is for --arch llama" "$CTL" init --n-layer 1 --n-head 2 --n-embd 16 \
  --n-positions 16 --vocab-size 50 --n-kv-head 1 --out "$W/z"
expect_fail "NKV not dividing NH" "num_key_value_heads 3" "$CTL" init --arch llama --n-layer 1 --n-head 4 --n-embd 16 \
  --n-positions 16 --vocab-size 50 --n-kv-head 3 --out "$W/z"
expect_fail "unknown arch" "--arch mamba unknown" "$CTL" init --arch mamba --n-layer 1 --n-head 2 --n-embd 16 \
  --n-positions 16 --vocab-size 50 --out "$W/z"
[ ! -e "$W/z" ] && ok "failed inits wrote nothing" || bad "a failed init wrote $W/z"
# The CUDA backend: with a GPU its eval agrees with the CPU's above (fp32, 1e-4); without one (or
# without the plugin) it fails saying which.
if ec=$("$CTL" eval --model "$W/m1" --data "$W/data/val_000.bin" --batch 2 --seq-len 32 --batches 3 --json \
          --backend cuda 2>"$W/cuda.err"); then
  $PY -c 'import json, sys; a, b = json.loads(sys.argv[1])["loss"], json.loads(sys.argv[2])["loss"]; \
sys.exit(abs(a - b) > 1e-4 * b)' "$ec" "$e1" && ok "eval on cuda $ec agrees with the cpu's" || bad "eval cuda $ec vs $e1"
else
  grep -Eq "no CUDA device is visible|no CUDA backend|cannot load the CUDA" "$W/cuda.err" \
    && ok "llama on cuda without a GPU: $(head -c 160 "$W/cuda.err")" || bad "llama on cuda: $(cat "$W/cuda.err")"
fi

echo "ctl_llama: $checks checks, $fail failed"
[ $fail -eq 0 ]
