#!/usr/bin/env bash
# tokenizer_hf_ctl.sh DIPACOCTL CACHE — `dipacoctl data prepare` and `generate` with a Hugging
# Face tokenizer.json, as a user runs them: Llama 3's file (128,256 tokens) gives version 2
# shards of 32-bit ids equal to the tokenizer's own ids, GPT-2's file keeps 16-bit shards,
# a small model trains on the 32-bit shards and generates through the same file; bad input
# fails clearly with nothing written: a tokenizer.json of an unsupported kind, a shard token
# >= the model's vocabulary. CACHE is tests/.cache (deploy/fetch_assets.sh); fails without it.
set -uo pipefail
CTL=${1:?usage: tokenizer_hf_ctl.sh DIPACOCTL CACHE}
CACHE=${2:?usage: tokenizer_hf_ctl.sh DIPACOCTL CACHE}
L3=$CACHE/hf-llama3/tokenizer.json G2=$CACHE/hf-gpt2/tokenizer.json
for f in "$L3" "$G2"; do
  [ -s "$f" ] || { echo "FAIL: $f missing; run deploy/fetch_assets.sh tests/.cache (tests/run.sh does)"; exit 1; }
done
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PY=/usr/bin/python3
fail=0; checks=0
ok() { checks=$((checks + 1)); echo "ok: $*"; }
bad() { checks=$((checks + 1)); fail=$((fail + 1)); echo "FAIL: $*"; }
expect_fail() {
  local desc=$1 pat=$2; shift 2
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 0 ] && grep -Eq -- "$pat" <<<"$out"; then ok "$desc"; else bad "$desc (rc=$rc, stderr: $out)"; fi
}

for i in $(seq 1 300); do echo "The quick brown fox jumps over the lazy dog number $((i % 7)). It's a fine day."; done > "$W/a.txt"

# Llama 3: version 2 shards; the ids are <|end_of_text|> then the tokenizer's ids of the file.
"$CTL" data prepare --tokenizer "$L3" --out "$W/l3" --val-fraction 0 "$W/a.txt" 2>"$W/l3.log" \
  && ok "data prepare with Llama 3's tokenizer.json" || bad "data prepare (llama3): $(tail -3 "$W/l3.log")"
"$PY" - "$W/l3/train_000.bin" <<'PYEOF' && ok "32-bit shard: version 2 header, ids as expected" || bad "32-bit shard layout"
import struct, sys
b = open(sys.argv[1], "rb").read()
h = struct.unpack("<256i", b[:1024])
assert h[0] == 20240520 and h[1] == 2 and h[3] == 4 and not any(h[4:]), h[:5]
ids = struct.unpack(f"<{h[2]}I", b[1024:])
assert len(b) == 1024 + 4 * h[2]
# <|end_of_text|> (128001), then "The"(791) " quick"(4062) " brown"(14198) " fox"(39935) ...
assert ids[:5] == (128001, 791, 4062, 14198, 39935), ids[:5]
PYEOF

# GPT-2's tokenizer.json: 16-bit shards, the same ids as the built-in GPT-2 tokenizer.
"$CTL" data prepare --tokenizer "$G2" --out "$W/g2" --val-fraction 0 "$W/a.txt" 2>/dev/null \
  && "$CTL" data prepare --tokenizer gpt2 --vocab-dir "$CACHE/gpt2" --out "$W/g2b" --val-fraction 0 "$W/a.txt" 2>/dev/null \
  && cmp -s "$W/g2/train_000.bin" "$W/g2b/train_000.bin" \
  && ok "GPT-2 tokenizer.json: 16-bit shard identical to the built-in GPT-2 tokenizer's" || bad "GPT-2 tokenizer.json shard differs"

# Train a tiny model with Llama 3's vocabulary on the 32-bit shard, then generate through the file.
"$CTL" init --n-layer 1 --n-head 2 --n-embd 16 --n-positions 32 --vocab-size 128256 --seed 7 --out "$W/m0" 2>/dev/null \
  && "$CTL" train --model "$W/m0" --data "$W/l3/train_000.bin" --steps 3 --batch 2 --seq-len 16 --lr 3e-3 \
       --out "$W/m1" >/dev/null 2>"$W/train.log" \
  && ok "train on 32-bit shards" || bad "train on 32-bit shards: $(tail -3 "$W/train.log")"
out=$("$CTL" generate --model "$W/m1" --tokenizer "$(dirname "$L3")" --prompt "The quick" --tokens 5 --seed 3 2>"$W/gen.log")
[ "${out#The quick}" != "$out" ] && ok "generate --tokenizer DIR (holding tokenizer.json)" || bad "generate: $(tail -3 "$W/gen.log")"

# Bad input: an unsupported tokenizer.json, named with the key; no shard written.
sed 's/"type": *"BPE"/"type": "WordPiece"/' "$G2" > "$W/wp.json"
expect_fail "WordPiece tokenizer.json refused" 'wp\.json: model\.type: "WordPiece" is not supported' \
  "$CTL" data prepare --tokenizer "$W/wp.json" --out "$W/wp" "$W/a.txt"
[ ! -e "$W/wp/train_000.bin" ] && ok "nothing written for the refused tokenizer" || bad "a shard was written"
expect_fail "missing tokenizer.json" "unknown tokenizer $W/none.json" \
  "$CTL" data prepare --tokenizer "$W/none.json" --out "$W/none" "$W/a.txt"

# A shard token >= the model's vocabulary: train names the problem (the GPT-2-sized model).
"$CTL" init --n-layer 1 --n-head 2 --n-embd 16 --n-positions 32 --vocab-size 50257 --seed 7 --out "$W/g0" 2>/dev/null
expect_fail "Llama 3 ids on a 50257-token model refused, naming shard and position" "shard .*l3/train_000.bin: token 128001 at position 0 is >= vocab_size 50257" \
  "$CTL" train --model "$W/g0" --data "$W/l3/train_000.bin" --steps 1 --batch 2 --seq-len 16 --out "$W/g1"

echo "$checks checks, $fail failed"
[ $fail -eq 0 ]
