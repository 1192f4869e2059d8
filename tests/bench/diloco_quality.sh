#!/usr/bin/env bash
# tests/bench/diloco_quality.sh — the DiLoCo quality study (docs/benchmarks.md §3): on the
# quickstart's corpus, GPT-2 model (its ARCH=gpt2) and inner hyperparameters, one worker,
# the data-parallel equivalent (batch × R, same steps) and DiLoCo over a grid of R, H, outer
# learning rate and momentum and inner-state policy, at equal inner steps per replica; eval
# loss on held-out text (20 validation batches) and the bytes each exchanges. Prints a markdown table and
# writes an SVG plot (loss vs. bytes) next to the results.
#
# DiLoCo runs use diloco_local (tests/unit/diloco_local.c): the same trainer and outer-step
# code as the daemons in one process, bit-identical to them (ctest oracle_diloco_local), so
# the grid costs compute only. Baselines use `dipacoctl train`. Results are cached in
# $STUDY_DIR/results.tsv: rerunning with a larger grid only runs what is new.
#
# Environment: STUDY_DIR (default /tmp/diloco_quality), STEPS (inner steps per replica, 1200),
# JOBS (parallel runs, = cores), GRID (space-separated R:H:OUTER_LR:MOMENTUM:STATE entries,
# default the grid below), MODEL ("L:NH:C", default the quickstart's GPT-2, 4:4:128), SVG (output).
# Bytes: DiLoCo moves 2 × 4 bytes × n parameters per replica per round (pull + push); a
# data-parallel all-reduce moves ~2 × the gradient per worker per step, i.e. H × more.
set -euo pipefail
# Each grid point is a constant outer rule (the study behind the constant 0.6 / 0.7); diloco_local
# otherwise applies the job spec's default momentum schedule (docs/design.md §3.4).
export DILOCO_LOCAL_MOMENTUM_SCHEDULE=${DILOCO_LOCAL_MOMENTUM_SCHEDULE:-0,0}
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
STUDY=${STUDY_DIR:-/tmp/diloco_quality}
STEPS=${STEPS:-1200}
JOBS=${JOBS:-$(nproc)}
IFS=: read -r L NH C <<<"${MODEL:-4:4:128}"
T=128; B=8; V=256
INNER=(--lr 0.003 --warmup 20 --lr-min-frac 0.1 --weight-decay 0.1 --grad-clip 1.0)
# The study of record (README): 21 DiLoCo runs + 3 baselines, about an hour on 2 cores.
DEFAULT_GRID="2:20:0.4:0.8:keep 2:20:0.5:0.7:keep 2:20:0.5:0.8:keep 2:20:0.6:0.7:keep 2:20:0.6:0.7:reset
  2:20:0.6:0.8:keep 2:20:0.7:0.9:keep 2:20:0.8:0.6:keep 2:20:0.9:0.7:keep 2:20:1.0:0.0:keep 2:20:1.0:0.3:keep
  2:20:1.0:0.6:keep 2:20:1.3:0.0:keep 2:20:1.6:0.0:keep 2:30:0.8:0.6:keep 2:50:0.6:0.7:keep 2:50:1.0:0.0:keep
  2:100:0.6:0.7:keep 2:100:0.7:0.9:keep 2:100:1.0:0.0:keep 4:20:0.6:0.7:keep"
GRID=${GRID:-$DEFAULT_GRID}
SVG=${SVG:-$STUDY/diloco_quality.svg}

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target dipacoctl diloco_local >/dev/null
CTL=$ROOT/build/coordinator/dipacoctl
LOCAL=$ROOT/build/tests/diloco_local

mkdir -p "$STUDY"
ASSETS=$(bash deploy/fetch_assets.sh "$ROOT/tests/.cache")
[ -s "$STUDY/data/train_000.bin" ] ||
  "$CTL" data prepare --tokenizer byte --out "$STUDY/data" --val-fraction 0.05 "$ASSETS/sotu" >/dev/null
INIT=$STUDY/init-$L-$NH-$C
[ -s "$INIT/model.safetensors" ] ||
  "$CTL" init --n-layer "$L" --n-head "$NH" --n-embd "$C" --n-positions $T --vocab-size $V --seed 1 --out "$INIT" 2>/dev/null
RES=$STUDY/results.tsv
touch "$RES"

# One run: its key, then the command that writes the model to $STUDY/runs/KEY. Skipped when
# the results already hold KEY.
run_one() {
  local key=$1; shift
  grep -q "^$key	" "$RES" && return 0
  local out=$STUDY/runs/$key t0 loss
  rm -rf "$out"; mkdir -p "$STUDY/runs"
  t0=$(date +%s)
  "$@" >"$out.log" 2>&1 || { echo "run $key failed (log: $out.log)" >&2; return 1; }
  loss=$("$CTL" eval --model "$out" --data "$STUDY"/data/val_*.bin --batch $B --seq-len $T --batches 20 --json \
         2>/dev/null | "${DPC_PYTHON:-python3}" -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
  printf '%s\t%s\t%s\n' "$key" "$loss" "$(( $(date +%s) - t0 ))" >>"$RES"
  echo "  $key: eval loss $loss"
}

TAG=m$L-$NH-$C-s$STEPS
runs=()
for R in $(for g in $GRID; do echo "${g%%:*}"; done | sort -u); do
  runs+=("one-$TAG $CTL train --model $INIT --data $STUDY/data/train_000.bin --out $STUDY/runs/one-$TAG --steps $STEPS --batch $B --seq-len $T ${INNER[*]} --threads 1")
  runs+=("dp$R-$TAG $CTL train --model $INIT --data $STUDY/data/train_000.bin --out $STUDY/runs/dp$R-$TAG --steps $STEPS --batch $((B * R)) --seq-len $T ${INNER[*]} --threads 1")
done
for g in $GRID; do
  IFS=: read -r R H OLR OMU ST <<<"$g"
  [ $((STEPS % H)) -eq 0 ] || { echo "H=$H does not divide STEPS=$STEPS" >&2; exit 2; }
  key=diloco-R$R-H$H-lr$OLR-mu$OMU-$ST-$TAG
  runs+=("$key $LOCAL $INIT $STUDY/data/train_000.bin $STUDY/runs/$key $R $H $((STEPS / H)) $B $T 0.003 20 0.1 0.1 0.9 0.95 1e-8 1.0 $OLR $OMU $ST")
done
echo "diloco_quality: ${#runs[@]} runs ($JOBS at a time; cached ones are skipped), results in $RES"
export -f run_one; export RES STUDY CTL B T
printf '%s\n' "${runs[@]}" | sort -u | xargs -P "$JOBS" -I{} bash -c 'run_one {}'

"${DPC_PYTHON:-python3}" - "$RES" "$TAG" "$SVG" "$L" "$C" "$V" "$T" "$STEPS" <<'PY'
import sys
res, tag, svg = sys.argv[1], sys.argv[2], sys.argv[3]
L, C, V, T, steps = map(int, sys.argv[4:9])
n = V * C + T * C + 2 * C + L * (12 * C * C + 13 * C)
rows = {}
for line in open(res):
    k, loss, secs = line.rstrip("\n").split("\t")
    if k.endswith(tag):
        rows[k[: -len(tag) - 1]] = (float(loss), int(secs))
one = rows.get("one")
table, points = [], []
for k, (loss, secs) in sorted(rows.items()):
    if not k.startswith("diloco"):
        continue
    _, R, H, lr, mu, st = k.split("-")
    R, H = int(R[1:]), int(H[1:])
    dp = rows.get(f"dp{R}")
    b = 2 * 4 * n * R * (steps // H)
    table.append((R, H, lr[2:], mu[2:], st, loss, dp, b))
    points.append((b, loss, f"R{R} H{H} {lr[2:]}/{mu[2:]}"))
print(f"\nmodel {n/1e6:.2f}M parameters, {steps} inner steps per replica, batch 8 x 128 tokens\n")
print("| run | eval loss | vs one worker | vs data-parallel | bytes exchanged |")
print("|---|---|---|---|---|")
if one:
    print(f"| one worker, {steps} steps | {one[0]:.4f} | 1.000 | | 0 |")
for R in sorted({t[0] for t in table}):
    dp = rows.get(f"dp{R}")
    if dp:
        b = 2 * 4 * n * R * steps
        print(f"| data-parallel R={R} (batch {8*R}), {steps} steps | {dp[0]:.4f} | {dp[0]/one[0]:.3f} | 1.000 | {b/1e6:.0f} MB |")
        points.append((b, dp[0], f"data-parallel R{R}"))
for R, H, lr, mu, st, loss, dp, b in sorted(table):
    rel_dp = f"{loss/dp[0]:.3f}" if dp else ""
    print(f"| DiLoCo R={R} H={H} outer {lr}/{mu} {st} | {loss:.4f} | {loss/one[0]:.3f} | {rel_dp} | {b/1e6:.1f} MB |")
# Loss vs bytes, log x, as a plain SVG (no plotting library needed).
import math
if points:
    W, Hh, m = 640, 400, 60
    xs = [math.log10(p[0]) for p in points]; ys = [p[1] for p in points] + ([one[0]] if one else [])
    x0, x1 = min(xs) - 0.2, max(xs) + 0.2; y0, y1 = min(ys) - 0.02, max(ys) + 0.02
    X = lambda v: m + (math.log10(v) - x0) / (x1 - x0) * (W - 2 * m)
    Y = lambda v: Hh - m - (v - y0) / (y1 - y0) * (Hh - 2 * m)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{Hh}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{Hh}" fill="white"/>',
           f'<line x1="{m}" y1="{Hh-m}" x2="{W-m}" y2="{Hh-m}" stroke="black"/>',
           f'<line x1="{m}" y1="{m}" x2="{m}" y2="{Hh-m}" stroke="black"/>',
           f'<text x="{W/2}" y="{Hh-15}" text-anchor="middle">bytes exchanged (log scale)</text>',
           f'<text x="15" y="{Hh/2}" transform="rotate(-90 15 {Hh/2})" text-anchor="middle">eval loss (nats/byte)</text>']
    for e in range(math.ceil(x0), math.floor(x1) + 1):
        out.append(f'<text x="{X(10**e)}" y="{Hh-m+15}" text-anchor="middle">1e{e}</text>')
    for i in range(5):
        v = y0 + (y1 - y0) * i / 4
        out.append(f'<text x="{m-5}" y="{Y(v)+4}" text-anchor="end">{v:.2f}</text>')
    if one:
        out.append(f'<line x1="{m}" y1="{Y(one[0])}" x2="{W-m}" y2="{Y(one[0])}" stroke="gray" stroke-dasharray="4"/>'
                   f'<text x="{W-m}" y="{Y(one[0])-4}" text-anchor="end" fill="gray">one worker (no exchange)</text>')
    # Every run is a dot; only the best of each byte count (and the baselines) is labelled,
    # so the labels of a grid at one H do not pile up.
    best = {}
    for b, loss, lab in points:
        if b not in best or loss < best[b][0]:
            best[b] = (loss, lab)
    for b, loss, lab in points:
        col = "crimson" if lab.startswith("data") else "steelblue"
        out.append(f'<circle cx="{X(b)}" cy="{Y(loss)}" r="{4 if best[b][1] == lab else 2.5}" fill="{col}"/>')
        if best[b][1] == lab:
            out.append(f'<text x="{X(b)+6}" y="{Y(loss)+4}">{lab}</text>')
    out.append("</svg>")
    open(svg, "w").write("\n".join(out))
    print(f"\nplot: {svg}")
PY
