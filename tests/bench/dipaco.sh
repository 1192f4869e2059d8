#!/usr/bin/env bash
# tests/bench/dipaco.sh — the DiPaCo result at small scale (docs/benchmarks.md §4): on a
# corpus of three clearly different sources (State of the Union addresses, the King James
# Bible from Debian's bible-kjv-text, C headers from /usr/include), byte tokens, compare at
# equal per-path size and equal inner steps per slot:
#   (a) a dense model of path size, trained STEPS steps from the base model;
#   (b) 2 x 2 DiPaCo (levels: stem + layers [0, L/2) x 2 modules, layers [L/2, L) x 2 modules)
#       with the data routed by k-means (K = 4) on the base model's prefix features;
#   (c) the same with product k-means (a 2 x 2 grid; top-2 overlapping shards, since a grid
#       cell may hold no sequence);
#   (d) (b) after discriminative re-routing: each training sequence (DISC_SEQUENCES of them,
#       spread over the data) labelled with its lowest-loss path under (b), a linear router
#       fitted to predict it, the data routed again, and DiPaCo trained again from the base;
# each DiPaCo slot trains STEPS inner steps (rounds x H) through the real coordinator and
# workers, starting from the same base model (BASE_STEPS steps of dense training on the whole
# corpus; also the routers' feature model). Reported: mean loss per token on held-out text of
# every source (the last 10% of each), the DiPaCo runs routed by prefix (`eval --dipaco`,
# also re-routed every 32 tokens), overall and per source. Prints a markdown table.
#
# Environment: STUDY_DIR (default /tmp/dipaco_bench), STEPS (per slot, 480), BASE_STEPS (200),
# H (inner steps per round, 30), SOURCE_BYTES (bytes of each source, 1000000), MODEL ("L:NH:C",
# default 4:4:64), DISC_SEQUENCES (2048). Results are cached in STUDY_DIR (delete it to rerun). The King James text needs `apt-get install -y bible-kjv-text bible-kjv`
# (the script installs it when missing and it may).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
STUDY=${STUDY_DIR:-/tmp/dipaco_bench}
STEPS=${STEPS:-480}
BASE_STEPS=${BASE_STEPS:-200}
H=${H:-30}
SOURCE_BYTES=${SOURCE_BYTES:-1000000}
IFS=: read -r L NH C <<<"${MODEL:-4:4:64}"
DISC_SEQUENCES=${DISC_SEQUENCES:-2048}
T=128; B=8; V=256; PREFIX=32
INNER=(--lr 0.003 --warmup 20 --lr-min-frac 0.1 --weight-decay 0.1 --grad-clip 1.0)
ROUNDS=$((STEPS / H))
[ $((ROUNDS * H)) = "$STEPS" ] || { echo "STEPS ($STEPS) must be a multiple of H ($H)"; exit 2; }

if ! command -v bible >/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get install -y bible-kjv-text bible-kjv >/dev/null
  else sudo apt-get install -y bible-kjv-text bible-kjv >/dev/null; fi
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target dipacoctl dipaco-coordinator dipaco-worker >/dev/null
CTL=$ROOT/build/coordinator/dipacoctl
COORDINATOR_BIN=$ROOT/build/coordinator/dipaco-coordinator
WORKER_BIN=$ROOT/build/worker/dipaco-worker
ASSETS=$(bash deploy/fetch_assets.sh "$ROOT/tests/.cache")

mkdir -p "$STUDY"
STUDY=$(cd "$STUDY" && pwd)
W=$STUDY/daemons
mkdir -p "$W"
KEEP=1
source "$ROOT/tests/integration/lib.sh"
cd "$STUDY"

# ---- corpus: each source's first SOURCE_BYTES bytes; the last 10% of each held out; the
# training text interleaves the sources in 4 KiB blocks so that every prefix of the stream
# mixes them (a dense run reads its stream in order).
if [ ! -s data/mix_train.bin ]; then
  mkdir -p src data
  # (head closes the pipe early: the writers' SIGPIPE is expected; the sizes are checked below)
  { cat "$ASSETS"/sotu/*.txt | head -c "$SOURCE_BYTES" > src/sotu.txt; } || true
  { bible "gen1:1-rev22:21" 2>/dev/null | head -c "$SOURCE_BYTES" > src/kjv.txt; } || true
  { find /usr/include -maxdepth 2 -name '*.h' -type f | LC_ALL=C sort | xargs cat 2>/dev/null |
      head -c "$SOURCE_BYTES" > src/c.txt; } || true
  for f in src/sotu.txt src/kjv.txt src/c.txt; do
    [ "$(wc -c < $f)" = "$SOURCE_BYTES" ] || { echo "$f: only $(wc -c < $f) bytes of $SOURCE_BYTES"; exit 1; }
  done
  "${DPC_PYTHON:-python3}" - "$SOURCE_BYTES" <<'PY'
import struct, sys
def shard(path, data):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(data), *([0] * 253)))
        f.write(struct.pack(f"<{len(data)}H", *data))
srcs = {n: open(f"src/{n}.txt", "rb").read() for n in ("sotu", "kjv", "c")}
train = {}
for n, b in srcs.items():
    cut = len(b) * 9 // 10
    train[n] = b[:cut]
    shard(f"data/val_{n}.bin", b[cut:])
mix, blk, i = bytearray(), 4096, 0
while any(i < len(t) for t in train.values()):
    for n in ("sotu", "kjv", "c"):
        mix += train[n][i:i + blk]
    i += blk
shard("data/mix_train.bin", bytes(mix))
print("corpus:", {n: len(b) for n, b in srcs.items()}, "train", len(mix), "bytes")
PY
fi
VAL=(data/val_sotu.bin data/val_kjv.bin data/val_c.bin)

# ---- base model (also the routers' feature model) and the dense baseline
[ -s init/model.safetensors ] ||
  "$CTL" init --n-layer "$L" --n-head "$NH" --n-embd "$C" --n-positions $T --vocab-size $V --seed 1 --out init 2>/dev/null
[ -s base/model.safetensors ] ||
  "$CTL" train --model init --data data/mix_train.bin --out base --steps "$BASE_STEPS" --batch $B --seq-len $T \
    "${INNER[@]}" --threads 2 >/dev/null 2>base.log
[ -s dense/model.safetensors ] ||
  "$CTL" train --model base --data data/mix_train.bin --out dense --steps "$STEPS" --batch $B --seq-len $T \
    "${INNER[@]}" --threads 2 >/dev/null 2>dense.log

# ---- routers and per-path shards
[ -s router_k4/router.json ] || "$CTL" route fit --model base --data data/mix_train.bin --seq-len $T --prefix $PREFIX \
  --k 4 --seed 1 --threads 2 --out router_k4 2>router_k4.log
[ -s router_pk/router.json ] || "$CTL" route fit --model base --data data/mix_train.bin --seq-len $T --prefix $PREFIX \
  --grid 2x2 --seed 1 --threads 2 --out router_pk 2>router_pk.log
# Product k-means can leave a grid cell empty (then route assign refuses to leave a path without
# data); its shards are top-2 (each sequence also on its runner-up path), the paper's
# overlapping shards. K-means shards are top-1.
[ -s routed_k4/manifest.json ] ||
  "$CTL" route assign --router router_k4 --data data/mix_train.bin --seq-len $T --threads 2 --out routed_k4 \
    >routed_k4.paths 2>routed_k4.log
[ -s routed_pk/manifest.json ] ||
  "$CTL" route assign --router router_pk --data data/mix_train.bin --seq-len $T --top 2 --threads 2 --out routed_pk \
    >routed_pk.paths 2>routed_pk.log

# ---- DiPaCo runs through the real daemons (2 CPU workers, one thread each)
dipaco_run() {
  local r=$1
  [ -s model_$r/dipaco.json ] && return 0
  cat > spec_$r.json <<JSON
{"name": "dipaco-$r", "model": {"init": "$STUDY/base"}, "data": {"paths": $(cat routed_$r.paths)},
 "algorithm": "dipaco", "replicas": 1, "inner_steps": $H, "rounds": $ROUNDS, "batch": $B, "seq_len": $T,
 "levels": [{"stem": true, "layers": [0, $((L / 2))], "modules": 2}, {"layers": [$((L / 2)), $L], "modules": 2}],
 "inner": {"lr": 0.003, "warmup": 20, "lr_min_frac": 0.1, "weight_decay": 0.1, "grad_clip": 1.0, "state": "keep"}}
JSON
  rm -rf "$W/state_$r"
  start_coordinator "$W/state_$r"
  start_worker "w1-$r" "$STUDY"
  start_worker "w2-$r" "$STUDY"
  local job
  job=$("$CTL" --coordinator "$COORD" job create spec_$r.json --data-dir "$STUDY")
  "$CTL" --coordinator "$COORD" job wait "$job" --timeout 7200 >/dev/null
  "$CTL" --coordinator "$COORD" job export "$job" --all-paths --router router_$r --out model_$r >/dev/null
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
t0=$(date +%s); dipaco_run k4; t_k4=$(( $(date +%s) - t0 ))
t0=$(date +%s); dipaco_run pk; t_pk=$(( $(date +%s) - t0 ))
# (d): re-route by (b)'s losses, then train again from the base on the new shards.
[ -s router_disc/router.json ] || "$CTL" route fit --discriminative --dipaco model_k4 --data data/mix_train.bin \
  --seq-len $T --sequences "$DISC_SEQUENCES" --threads 2 --out router_disc 2>router_disc.log
# (top-2 shards if the linear router leaves a path without sequences)
[ -s routed_disc/manifest.json ] ||
  "$CTL" route assign --router router_disc --data data/mix_train.bin --seq-len $T --threads 2 --out routed_disc \
    >routed_disc.paths 2>routed_disc.log ||
  "$CTL" route assign --router router_disc --data data/mix_train.bin --seq-len $T --top 2 --threads 2 \
    --out routed_disc >routed_disc.paths 2>routed_disc.log
t0=$(date +%s); dipaco_run disc; t_disc=$(( $(date +%s) - t0 ))

# ---- held-out loss: per token, overall (the three sources' held-out text in one stream) and per source
dense_loss() { "$CTL" eval --model dense --data "$@" --batch 1 --seq-len $T --threads 2 --json | sed 's/.*"loss":\([0-9.]*\).*/\1/'; }
routed_loss() { local m=$1 w=$2; shift 2
  "$CTL" eval --dipaco "$m" --data "$@" --seq-len $T --reroute-every "$w" --threads 2 --json | sed 's/^{"loss":\([0-9.]*\).*/\1/'; }
row() { printf '| %s | %s | %s | %s | %s |\n' "$@"; }
echo
echo "corpus: $(wc -c < src/sotu.txt) + $(wc -c < src/kjv.txt) + $(wc -c < src/c.txt) bytes (SOTU, KJV, C headers); model L=$L NH=$NH C=$C, T=$T, B=$B;"
echo "base: $BASE_STEPS dense steps; then $STEPS steps per path (DiPaCo: H=$H x $ROUNDS rounds, R=1); routers: prefix $PREFIX"
echo "training sequences per path: k-means $(grep -o 'top 1): .*' routed_k4.log | cut -d' ' -f3-); product k-means, top 2 $(grep -o 'top 2): .*' routed_pk.log | cut -d' ' -f3-);" \
  "discriminative $(grep -o 'top [12]): .*' routed_disc.log)"
grep -h "discriminative:" router_disc.log | sed 's/^route fit --discriminative: /discriminative re-routing: /'
echo "held-out sequences per path (prefix routing), k-means / product / discriminative:" \
  "$(for r in k4 pk disc; do "$CTL" eval --dipaco model_$r --data "${VAL[@]}" --seq-len $T --threads 2 --json |
       "${DPC_PYTHON:-python3}" -c 'import json,sys; print(" ".join(str(p["tokens"] // '$T') for p in json.load(sys.stdin)["paths"]), end=" / ")'; done)"
echo
echo "| run | held-out loss | SOTU | KJV | C headers |"
echo "|---|---|---|---|---|"
row "base ($BASE_STEPS steps)" "$("$CTL" eval --model base --data "${VAL[@]}" --batch 1 --seq-len $T --threads 2 --json | sed 's/.*"loss":\([0-9.]*\).*/\1/')" \
  "$("$CTL" eval --model base --data "${VAL[0]}" --batch 1 --seq-len $T --threads 2 --json | sed 's/.*"loss":\([0-9.]*\).*/\1/')" \
  "$("$CTL" eval --model base --data "${VAL[1]}" --batch 1 --seq-len $T --threads 2 --json | sed 's/.*"loss":\([0-9.]*\).*/\1/')" \
  "$("$CTL" eval --model base --data "${VAL[2]}" --batch 1 --seq-len $T --threads 2 --json | sed 's/.*"loss":\([0-9.]*\).*/\1/')"
row "(a) dense, path size, +$STEPS steps" "$(dense_loss "${VAL[@]}")" "$(dense_loss "${VAL[0]}")" "$(dense_loss "${VAL[1]}")" "$(dense_loss "${VAL[2]}")"
for r in k4 pk disc; do
  name="(b) DiPaCo 2x2, k-means"; [ $r = pk ] && name="(c) DiPaCo 2x2, product k-means (top-2 shards)"
  [ $r = disc ] && name="(d) DiPaCo 2x2, discriminative re-routing"
  for w in 0 32; do
    label="$name"; [ $w = 0 ] || label="$name, re-routed every $w"
    row "$label" "$(routed_loss model_$r $w "${VAL[@]}")" "$(routed_loss model_$r $w "${VAL[0]}")" \
      "$(routed_loss model_$r $w "${VAL[1]}")" "$(routed_loss model_$r $w "${VAL[2]}")"
  done
done
echo
echo "DiPaCo wall clock on $(nproc) cores: k-means ${t_k4}s, product k-means ${t_pk}s, discriminative ${t_disc}s (0 = cached)"
