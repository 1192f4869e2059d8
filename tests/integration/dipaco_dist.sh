#!/usr/bin/env bash
# dipaco_dist.sh COORDINATOR WORKER DIPACOCTL — DiPaCo end to end through the real daemons: a
# mixed corpus is routed by `dipacoctl route fit --k 4` / `route assign` into per-path shards
# (checked against a torch router, tests/oracle/route_ref.py, top 1 and top 2),
# a 2 x 2 DiPaCo job (levels of 2 modules each, R = 2) trains with data.paths on 2 CPU workers,
# and every exported path must equal the PyTorch DiPaCo reference (tests/oracle/dipaco_ref.py:
# per-module Nesterov on the mean delta of the slots whose path holds the module, each slot on
# its own path's stream; the outer momentum warmed up over 2 rounds and decayed over the last) to
# 1e-4 relative. Also: a data.paths list of the wrong length is
# refused by `job create` with a clear message and creates nothing; `job export --all-paths`
# writes the DiPaCo model directory and `eval --dipaco` on it equals a PyTorch routed eval.
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
"$CTL" route fit --model init --data data/train_000.bin --seq-len 16 --prefix 4 --k 4 --seed 3 --out router
paths=$("$CTL" route assign --router router --data data/train_000.bin --seq-len 16 --out routed)
echo "data.paths = $paths"
# The sharding round trip, against a torch router: each path's shard is exactly its sequences in
# the original order (top 1: every sequence once; top 2: also in its runner-up path).
$PY "$HERE/../oracle/route_ref.py" --router router --data data/train_000.bin --seq-len 16 --routed routed \
  || fail "route assign shards differ from the oracle"
"$CTL" route assign --router router --data data/train_000.bin --seq-len 16 --top 2 --out routed2 >/dev/null
$PY "$HERE/../oracle/route_ref.py" --router router --data data/train_000.bin --seq-len 16 --routed routed2 --top 2 \
  || fail "route assign --top 2 shards differ from the oracle"
cat > spec.json <<JSON
{"name": "dipaco-test", "model": {"init": "$W/init"}, "data": {"paths": $paths},
 "algorithm": "dipaco", "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "levels": [{"stem": true, "layers": [0, 1], "modules": 2}, {"layers": [1, 2], "modules": 2}],
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true, "momentum_warmup": 2, "momentum_decay": 1}}
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
# --data-dir checks every path's data as a worker would: a shard too small for one batch is
# refused, naming the path.
$PY - spec.json small.json <<'PY'
import json, struct, sys
s = json.load(open(sys.argv[1])); s["data"]["paths"][3] = ["tiny/train_000.bin"]; s["name"] = "small"
json.dump(s, open(sys.argv[2], "w"))
import os; os.makedirs("tiny", exist_ok=True)
with open("tiny/train_000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, 20, *([0] * 253))); f.write(struct.pack("<20H", *range(20)))
PY
if "$CTL" --coordinator "$COORD" job create small.json --data-dir "$W" 2>small.err; then fail "a path with 20 tokens was accepted"; fi
grep -q 'data.paths\[3\]: path 3.s data holds 20 tokens, less than one batch' small.err || fail "unclear error for a small path: $(cat small.err)"
[ "$("$CTL" --coordinator "$COORD" job list --json | $PY -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')" = 0 ] \
  || fail "a refused spec created a job"
start_worker w1 "$W"
start_worker w2 "$W"
job=$("$CTL" --coordinator "$COORD" job create spec.json --data-dir "$W")
echo "created job $job"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 240 || fail "job did not finish"
for p in 0 1 2 3; do "$CTL" --coordinator "$COORD" job export "$job" --path $p --out "export_$p" 2>/dev/null; done
# The admin views: each path's data as the spec gives it, its size under --data-dir (the
# tokens of its routed shards) and recent loss; each module with the paths that share it.
"$CTL" --coordinator "$COORD" paths "$job" --data-dir "$W" --json > paths.json || fail "paths --json"
"$CTL" --coordinator "$COORD" modules "$job" --json > modules.json || fail "modules --json"
"$CTL" --coordinator "$COORD" paths "$job" --data-dir "$W" > paths.txt || fail "paths"
"$CTL" --coordinator "$COORD" modules "$job" > modules.txt || fail "modules"
$PY - spec.json paths.json modules.json paths.txt modules.txt <<'PY' || fail "paths / modules views"
import glob, json, math, sys
import numpy as np
spec, P, M = (json.load(open(f)) for f in sys.argv[1:4])
paths, mods = P["paths"], M["modules"]
assert [p["data"] for p in paths] == spec["data"]["paths"], "paths: data differs from the spec"
for p in paths:
    want = sum(int(np.fromfile(f, dtype=np.int32, count=3)[2]) for g in p["data"] for f in sorted(glob.glob(g)))
    assert p["tokens"] == want, f"path {p['path']}: {p['tokens']} tokens, the shards hold {want}"
    assert p["loss"] is not None and math.isfinite(p["loss"]), f"path {p['path']}: no recent loss"
for m in mods:
    holders = [p["path"] for p in paths if m["module_id"] in p["modules"]]
    assert m["paths"] == holders and len(holders) == 2, f"module {m['module_id']}: paths {m['paths']}, want {holders}"
txt = open(sys.argv[4]).read() + open(sys.argv[5]).read()
assert "TOKENS" in txt and "PATHS" in txt and str(paths[3]["tokens"]) in txt, txt
print("dipaco_dist: paths:", [(p["path"], p["tokens"], round(p["loss"], 3)) for p in paths],
      "modules:", [(m["module_id"], m["paths"]) for m in mods])
PY
if "$CTL" --coordinator "$COORD" paths "$job" --data-dir "$W/nowhere" 2>nowhere.err; then fail "paths --data-dir of a missing directory succeeded"; fi
grep -q "matches no file under --data-dir" nowhere.err || fail "unclear paths --data-dir error: $(cat nowhere.err)"
$PY "$HERE/../oracle/dipaco_ref.py" --init init --spec spec.json --data-dir "$W" --compare "export_" --tol 1e-4 \
  || fail "exported paths differ from the PyTorch DiPaCo reference"
# The DiPaCo model directory: every path plus the router; its paths equal the single exports.
"$CTL" --coordinator "$COORD" job export "$job" --all-paths --router router --out model
for p in 0 1 2 3; do cmp "export_$p/model.safetensors" "model/path_$p/model.safetensors" || fail "--all-paths path $p differs"; done
# Routed eval equals scoring each sequence with its chosen path by hand (a torch oracle that
# reads the directory itself), without and with re-routing every 5 tokens.
for w in 0 5; do
  "$CTL" eval --dipaco model --data data/val_000.bin --seq-len 16 --reroute-every $w --json > "eval_$w.json"
  $PY "$HERE/../oracle/dipaco_eval_ref.py" --dipaco model --data data/val_000.bin --seq-len 16 --reroute-every $w \
    --got "eval_$w.json" || fail "eval --dipaco --reroute-every $w differs from the oracle"
done
"$CTL" eval --dipaco model --data data/val_000.bin --seq-len 16
# Routed generation: greedy text from the DiPaCo directory equals greedy text from the path the
# prompt routes to.
"$CTL" generate --dipaco model --tokenizer byte --prompt "#include <stdio.h> static" --tokens 24 --temperature 0 \
  >gen.out 2>gen.err || fail "generate --dipaco failed: $(cat gen.err)"
gp=$(sed -n 's/.*routed to path \([0-9]*\).*/\1/p' gen.err | head -1)
[ -n "$gp" ] || fail "generate --dipaco did not say which path: $(cat gen.err)"
"$CTL" generate --model "model/path_$gp" --tokenizer byte --prompt "#include <stdio.h> static" --tokens 24 \
  --temperature 0 >gen_path.out 2>/dev/null
cmp gen.out gen_path.out || fail "generate --dipaco differs from generating with its path $gp"
# Discriminative re-routing: a linear router on each sequence's lowest-loss path; its shards
# round-trip against the torch oracle like the k-means router's.
"$CTL" route fit --discriminative --dipaco model --data data/train_000.bin --seq-len 16 --sequences 400 --out router_d
"$CTL" route assign --router router_d --data data/train_000.bin --seq-len 16 --out routed_d >/dev/null
$PY "$HERE/../oracle/route_ref.py" --router router_d --data data/train_000.bin --seq-len 16 --routed routed_d \
  || fail "route assign with the discriminative router differs from the oracle"
# A router fitted on another base model is refused by assign, with both named.
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 6 --out other 2>/dev/null
if "$CTL" route assign --router router --model other --data data/train_000.bin --seq-len 16 --out r2 2>r2.err; then
  fail "route assign accepted a model the router was not fitted on"
fi
grep -q "other weights" r2.err || fail "unclear error for a mismatched feature model: $(cat r2.err)"
[ ! -e r2 ] || fail "a refused route assign wrote $W/r2"
echo "dipaco_dist: OK"
