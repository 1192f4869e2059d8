#!/usr/bin/env bash
# dataplane.sh — the coordinator's data plane at a real model size, measured against
# peers in the same run and reported as ratios:
#   RSS/model       the coordinator's peak RSS (VmHWM) over the model's fp32 bytes
#   outer/pass      median outer step (from its log: read R deltas, sum, Nesterov, write and
#                   fsync the new version and momentum) over a plain in-memory pass of the
#                   same math (dataplane_client --memory-pass)
#   pull, push / TCP  aggregate rate of R concurrent workers over loopback TCP with R streams
#                   (iperf3 -P R), medians over the rounds
#   outer/(pass+disk) the same over the memory pass plus writing the new version and momentum
#                   at the durable-write rate of the state's file system (dd conv=fdatasync)
#   push, upload / disk  the same rates over that durable-write rate: a delta is acknowledged,
#                   and an upload stored, only once it is on disk
#   upload / TCP    job create's upload (UploadInitialModel, from its first chunk to the file
#                   stored durably, by the coordinator's log) over loopback TCP with one
#                   stream (iperf3 -P 1); the baseline build logs only the end: its upload is
#                   timed from the job create command's start
#   overhead/bound  round overhead (last push of round t acknowledged -> the last worker has
#                   round t + 1's parameters, measured by the clients) over the physical bound
#                   (R x model bytes / loopback rate + one memory pass), median over rounds
#   sent, received /round/model  the coordinator's traffic per round, over the model's fp32
#                   bytes: tensor bytes to and from workers (dipaco_bytes_out_total,
#                   dipaco_bytes_in_total) plus payload bytes to and from an S3 store
#                   (dipaco_blob_store_bytes_total), from /metrics after the job's upload
#   disk/round      bytes it wrote to block devices per round (/proc/PID/io write_bytes)
#   faults/round    fresh memory the coordinator touched per round (minor page faults x 4 KiB,
#                   /proc/PID/stat): each costs a zeroed page, and a job's first rounds pay them
#   CPU/round       CPU seconds per round of the coordinator, and on S3 of the gateway and its
#                   OSD together (/proc/PID/stat utime + stime): what shares this machine's cores
#   job create      the dipacoctl job create command's time (the upload, then version 0 written)
#                   and what the coordinator wrote to its disk meanwhile (the upload and version 0
#                   on the local store; on S3 both go to the store)
# The workers are dataplane_client's simulated workers (real protocol, no training). With
# STORES="local s3" each build is measured on the local store and on an S3 store (a RADOS
# Gateway started here by tests/s3/rgw.sh on a RAM-backed OSD of RGW_MEMSTORE_BYTES, 12 GiB by
# default): there the workers read the parameters from the store and put their deltas there
# through presigned URLs; "s3push" is the S3 store with --no-delta-puts (deltas pushed to the
# coordinator, which forwards them to the store).
# The RAM-backed OSD holds one 124M job of 3 rounds on a 23 GB machine; more rounds, BASE_BUILD
# with S3 or the 1B case need RGW_BLUESTORE_BYTES (a BlueStore OSD on a sparse file of that size).
#
# usage: tests/bench/dataplane.sh [124m|1b] [R=4] [ROUNDS=3]   (124m: GPT-2 small; 1b: L=18, C=2048: 1.01B)
# env: BUILD_DIR (default build-bench-dataplane): the build measured; STORES (default "local";
#      any of local, s3, s3push);
#      BASE_BUILD: a second build (e.g. of the previous commit) measured first, in the same run;
#      TRAIN_MS (default 0): each simulated worker sleeps that long between its pull and its push,
#      standing for the inner steps (0: every push overlaps the other workers' pulls, a stress
#      case; a real round trains for minutes, and the store's background work runs meanwhile);
#      COORD_FLAGS: more coordinator flags (e.g. "--s3-put-part-mb 64": delta objects put in parts);
#      CODEC (default fp32): the job's delta codec (streaming.codec: bf16, int8, fp8, e3m0); the
#      simulated workers push (or on S3 put) their deltas encoded in it;
#      KEEP=1 keeps the work directory (without it each run's blobs go as soon as it is measured,
#      so that a 1B local run's 23 GB do not share the disk with the S3 run's store);
#      COORD_LINK (a tc rate, e.g. 1gbit; root only): the coordinator runs in a network namespace
#      of its own behind a veth link of that rate each way (an HTB class on both ends), as on a
#      machine whose NIC carries all its traffic; the workers and the store stay on the host, as a
#      scale-out store's own links would. TCP and the bound are then measured over that link.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CASE=${1:-124m}; R=${2:-4}; ROUNDS=${3:-3}
BUILD=${BUILD_DIR:-$ROOT/build-bench-dataplane}
case $CASE in
  124m) SHAPE=(--n-layer 12 --n-head 12 --n-embd 768 --n-positions 1024 --vocab-size 50257) ;;
  1b) SHAPE=(--n-layer 18 --n-head 16 --n-embd 2048 --n-positions 1024 --vocab-size 50257) ;;
  *) echo "usage: $0 [124m|1b] [R] [ROUNDS]" >&2; exit 2 ;;
esac
bash "$(dirname "$0")/../../deploy/install_deps.sh" --bench
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDIPACO_SANITIZE=OFF >/dev/null
cmake --build "$BUILD" --target dipaco-coordinator dipacoctl dataplane_client -j"$(nproc)" >/dev/null
CLIENT=$BUILD/tests/dataplane_client
W=$(mktemp -d "${TMPDIR:-/var/tmp}/dataplane.XXXXXX")
source "$ROOT/tests/integration/lib.sh"

"$BUILD/coordinator/dipacoctl" init "${SHAPE[@]}" --seed 1 --out "$W/init" >/dev/null
MODEL_BYTES=$("${DPC_PYTHON:-python3}" -c "import json; c=json.load(open('$W/init/config.json')); L,C,V,T=c['n_layer'],c['n_embd'],c['vocab_size'],c['n_positions']; print(4*(V*C+T*C+L*(12*C*C+13*C)+2*C))")
ST_BYTES=$(stat -c %s "$W/init/model.safetensors")
echo "case $CASE: model $((MODEL_BYTES >> 20)) MiB fp32, R = $R, $ROUNDS rounds, training ${TRAIN_MS:-0} ms a lease, $(nproc) cores"

# COORD_LINK: the coordinator's namespace and its link (removed at exit, with the cleanup below).
NSX=() HOST=127.0.0.1 CHOST=127.0.0.1
if [ -n "${COORD_LINK:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "COORD_LINK needs root (a network namespace, veth, tc)" >&2; exit 2; }
  NS=dpb$$ HOST=10.78.0.1 CHOST=10.78.0.2
  ip netns add $NS
  trap 'rc=$?; unlink_ns; (exit $rc); cleanup' EXIT
  ip link add dpbh$$ type veth peer name dpbc$$
  ip link set dpbc$$ netns $NS
  ip addr add $HOST/24 dev dpbh$$; ip link set dpbh$$ up
  ip netns exec $NS ip addr add $CHOST/24 dev dpbc$$
  ip netns exec $NS ip link set dpbc$$ up; ip netns exec $NS ip link set lo up
  tc qdisc add dev dpbh$$ root handle 1: htb default 10; tc class add dev dpbh$$ parent 1: classid 1:10 htb rate "$COORD_LINK"
  ip netns exec $NS tc qdisc add dev dpbc$$ root handle 1: htb default 10
  ip netns exec $NS tc class add dev dpbc$$ parent 1: classid 1:10 htb rate "$COORD_LINK"
  NSX=(ip netns exec $NS)
  export RGW_BIND=0.0.0.0 # the store answers the coordinator's namespace too
fi
unlink_ns() { [ -z "${NS:-}" ] || { ip netns pids $NS 2>/dev/null | xargs -r kill -KILL; ip netns del $NS; }; }

# TCP in this run (loopback, or the coordinator's link): iperf3 with R streams and with one.
iperf() {
  local port; port=$(free_port)
  "${NSX[@]}" iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
  local spid=$!
  sleep 0.3
  iperf3 -c $CHOST -p "$port" -P "$1" -t 4 -J | "${DPC_PYTHON:-python3}" -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)'
  wait $spid 2>/dev/null || true
}
TCP_R=$(iperf "$R"); TCP_1=$(iperf 1)
# The memory pass over min(model, 32M floats), scaled to the model.
N=$((MODEL_BYTES / 4)); M=$((N < 33554432 ? N : 33554432))
PASS=$("$CLIENT" --memory-pass "$R" "$M" | awk -v n="$N" -v m="$M" '{print $2 * n / m}')
# Durable writes on the state directory's file system: what every delta (acknowledged only once
# it is on disk), the upload and each outer step's new version and momentum must go through.
DD_MB=$(( MODEL_BYTES * 2 >> 20 )); [ $DD_MB -gt 2048 ] && DD_MB=2048
DISK=$(dd if=/dev/zero of="$W/ddtest" bs=1M count=$DD_MB conv=fdatasync 2>&1 |
  awk '/copied/ {for (i = 1; i <= NF; i++) if ($i == "copied,") {print $1 / $(i + 1) / 1e9; exit}}')
rm -f "$W/ddtest"
LINKNOTE="loopback"; [ -n "${COORD_LINK:-}" ] && LINKNOTE="the coordinator's $COORD_LINK link"
echo "$LINKNOTE TCP: $TCP_R GB/s with $R streams, $TCP_1 GB/s with one; memory pass $PASS s; durable write $DISK GB/s"

STORE_FLAGS=()
if [[ " ${STORES:-local} " == *" s3"* ]]; then
  export RGW_MEMSTORE_BYTES=${RGW_MEMSTORE_BYTES:-12884901888}
  bash "$ROOT/tests/s3/rgw.sh" start "$W/rgw" >/dev/null
  # cleanup (tests/integration/lib.sh) exits with the status it finds: the script's, not the stop's
  trap 'rc=$?; bash "$ROOT/tests/s3/rgw.sh" stop "$W/rgw" || true; unlink_ns; (exit $rc); cleanup' EXIT
  set -a; . "$W/rgw/env"; set +a
  STORE_URL=${S3_ENDPOINT/127.0.0.1/$HOST} # (where the coordinator reaches it)
  bash "$ROOT/tests/s3/s3curl.sh" -X PUT "$S3_ENDPOINT/dataplane" >/dev/null
fi
io() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/io"; }
# cpu PID… — their CPU seconds so far (utime + stime); 0 for none.
cpu() {
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t $(getconf CLK_TCK)" | awk '{print $1 / $2}'
}
store_pids() { [ -z "${RGW_DIR:-}" ] || cat "$RGW_DIR/radosgw.pid" "$RGW_DIR/osd.pid"; }
# traffic — "SENT RECEIVED": the coordinator's bytes to and from workers and the store so far.
traffic() {
  curl -sf "http://$MADDR/metrics" | awk '/^dipaco_bytes_out_total / {s += $2} /^dipaco_bytes_in_total / {r += $2}
    /^dipaco_blob_store_bytes_total\{direction="sent"\}/ {s += $2} /^dipaco_blob_store_bytes_total\{direction="received"\}/ {r += $2}
    END {printf "%.0f %.0f\n", s, r}'
}

# measure NAME BUILD STORE — one coordinator, one job, R simulated workers; appends a table row.
ROWS=()
measure() {
  local name=$1-$3 b=$2 store=$3 st=$W/state-$1-$3 flags=()
  case $store in
    s3) flags=(--blob-store "s3://dataplane/$name" --s3-endpoint "$STORE_URL") ;;
    s3push) flags=(--blob-store "s3://dataplane/$name" --s3-endpoint "$STORE_URL" --no-delta-puts) ;;
  esac
  COORDINATOR_BIN=$b/coordinator/dipaco-coordinator CTL=$b/coordinator/dipacoctl
  rm -f "$W/coordinator.log"
  MADDR=$CHOST:$(free_port)
  if [ -n "${COORD_LINK:-}" ]; then
    printf '#!/bin/sh\nexec ip netns exec %s %s "$@"\n' "$NS" "$COORDINATOR_BIN" > "$W/coordinator-in-ns.sh"
    chmod +x "$W/coordinator-in-ns.sh"
    COORDINATOR_BIN=$W/coordinator-in-ns.sh COORD=$CHOST:$(free_port)
    launch_coordinator "$st" --lease-ttl-ms 600000 --heartbeat-ms 10000 --dead-after-heartbeats 1000 --log-level info \
      --metrics-listen "$MADDR" "${flags[@]}" ${COORD_FLAGS:-}
  else
    start_coordinator "$st" --lease-ttl-ms 600000 --heartbeat-ms 10000 --dead-after-heartbeats 1000 --log-level info \
      --metrics-listen "$MADDR" "${flags[@]}" ${COORD_FLAGS:-}
  fi
  local codec_spec=""
  [ -n "${CODEC:-}" ] && codec_spec=", \"streaming\": {\"codec\": \"$CODEC\"}"
  cat > "$W/spec.json" <<JSON
{"name": "dataplane-$name", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": $R, "inner_steps": 1, "rounds": $ROUNDS, "batch": 1, "seq_len": 8,
 "round_timeout_s": 0$codec_spec}
JSON
  local t0 t1 job dpre; dpre=$(io "$COORD_PID" write_bytes)
  t0=$(date +%s.%N)
  job=$(DIPACO_CTL_TIMEOUT_MS=3600000 "$b/coordinator/dipacoctl" --coordinator "$COORD" job create "$W/spec.json")
  t1=$(date +%s.%N)
  local t0b d0 c0 s0; t0b=$(traffic); d0=$(io "$COORD_PID" write_bytes)
  c0=$(cpu "$COORD_PID"); s0=$(cpu $(store_pids)); f0=$(awk '{print $10}' "/proc/$COORD_PID/stat")
  "$CLIENT" --coordinator "$COORD" --job "$job" --workers "$R" --token-file "$st/join.token" \
    --train-ms "${TRAIN_MS:-0}" > "$W/client-$name.txt" &
  local cpid=$! chwm=0
  while kill -0 $cpid 2>/dev/null; do
    h=$(awk '/VmHWM/ {print $2}' /proc/$cpid/status 2>/dev/null || true); [ -n "$h" ] && chwm=$h; sleep 0.5
  done
  wait $cpid || { cat "$W/client-$name.txt"; tail -30 "$W/coordinator.log"; exit 1; }
  # The last round's outer step may still run: its traffic counts too.
  DIPACO_CTL_TIMEOUT_MS=3600000 "$b/coordinator/dipacoctl" --coordinator "$COORD" job wait "$job" --timeout 1200 >/dev/null || true
  local hwm h t1b d1; hwm=$(awk '/VmHWM/ {print $2}' /proc/$COORD_PID/status)
  t1b=$(traffic); d1=$(io "$COORD_PID" write_bytes)
  local c1 s1 f1; c1=$(cpu "$COORD_PID"); s1=$(cpu $(store_pids)); f1=$(awk '{print $10}' "/proc/$COORD_PID/stat")
  kill -TERM "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
  cp "$W/coordinator.log" "$W/coordinator-$name.log"
  [ -n "${KEEP:-}" ] || rm -rf "$st/blobs"
  ROWS+=("$(T0="$t0" "${DPC_PYTHON:-python3}" - "$W/client-$name.txt" "$W/coordinator-$name.log" <<PY
import os, re, statistics, sys
client = open(sys.argv[1]).read().splitlines()
rounds = [l.split() for l in client if l.startswith("round ")]
pull = statistics.median(float(r[5]) for r in rounds)
push = statistics.median(float(r[7]) for r in rounds)
ov = [float(r[9]) for r in rounds if float(r[9]) >= 0]
outer = [float(m) for m in re.findall(r"outer step ([0-9.]+) s", open(sys.argv[2]).read())]
model, R, tcp_r, tcp_1, mpass, disk = $MODEL_BYTES, $R, $TCP_R, $TCP_1, $PASS, $DISK
import datetime
def ts(pat):  # the time of the first log line matching pat
    for l in open(sys.argv[2]):
        if re.search(pat, l):
            t = datetime.datetime.fromisoformat(re.search(r'"ts":"([^"]+)Z"', l).group(1))
            return t.replace(tzinfo=datetime.timezone.utc).timestamp()
started = ts(r"upload [0-9]+ started") or float(os.environ["T0"])
up = $ST_BYTES / (ts(r"upload [0-9]+ stored") - started) / 1e9
bound = R * model / (tcp_r * 1e9) + mpass
om = statistics.median(outer)
ovm = statistics.median(ov) if ov else float("nan")
dbound = mpass + 2 * model / (disk * 1e9)  # the pass, plus writing θ and u durably
print(f"| $name | {$hwm * 1024 / model:.2f} | {om:.2f} s / {mpass:.2f} s = {om / mpass:.2f} | "
      f"{om / dbound:.2f} | "
      f"{pull:.2f} GB/s = {pull / tcp_r:.2f} | {push:.2f} GB/s = {push / tcp_r:.2f} ({push / disk:.2f}) | "
      f"{up:.2f} GB/s = {up / tcp_1:.2f} ({up / disk:.2f}) | {ovm:.2f} s / {bound:.2f} s = {ovm / bound:.2f} | "
      f"{$chwm / 1024:.0f} MiB | {($(echo $t1b | cut -d' ' -f1) - $(echo $t0b | cut -d' ' -f1)) / $ROUNDS / model:.2f} | "
      f"{($(echo $t1b | cut -d' ' -f2) - $(echo $t0b | cut -d' ' -f2)) / $ROUNDS / model:.2f} | "
      f"{($d1 - $d0) / $ROUNDS / 2**20:.1f} MiB | {($f1 - $f0) * 4 / 1024 / $ROUNDS:.0f} MiB | {($c1 - $c0) / $ROUNDS:.1f} s | "
      + ("-" if "$store" == "local" else f"{($s1 - $s0) / $ROUNDS:.1f} s")
      + f" | {$t1 - $t0:.2f} s, {($d0 - $dpre) / 2**20:.0f} MiB |")
PY
)")
  echo "${ROWS[-1]}"
}

for store in ${STORES:-local}; do
  [ -n "${BASE_BUILD:-}" ] && measure before "$BASE_BUILD" "$store"
  measure after "$BUILD" "$store"
done
echo
echo "case $CASE, R = $R, $ROUNDS rounds, training ${TRAIN_MS:-0} ms a lease, model $((MODEL_BYTES >> 20)) MiB; $LINKNOTE TCP $TCP_R GB/s ($R streams), $TCP_1 GB/s (1); memory pass $PASS s; durable write $DISK GB/s"
echo "| build | coordinator RSS / model | outer step / memory pass | outer step / (pass + durable write of θ, u) | pull / TCP | push / TCP (/ disk) | upload / TCP (/ disk) | round overhead / bound | client RSS | sent/round/model | received/round/model | disk/round | coordinator faults/round | coordinator CPU/round | store CPU/round | job create (time, coordinator disk) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
