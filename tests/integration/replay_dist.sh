#!/usr/bin/env bash
# replay_dist.sh COORDINATOR WORKER DIPACOCTL — replay pulls (docs/design.md §4.3, §4.4) through
# a real coordinator and 3 real CPU workers on loopback (R = 3, H = 4, 5 rounds, a 2-layer
# model, outer Nesterov lr 0.6 momentum 0.7 on a schedule: warm-up over 2 rounds, decay over the
# last 2, which replays apply round by round as the coordinator did):
#  1. e3m0 and fp8 deltas, each job run with pulls.replay true and false: the exports are
#     byte-identical (cmp), the workers replayed rounds (their logs, and
#     dipaco_pulls_total{kind="replay"} on /metrics), no replay missed a checksum, and the
#     replay job pulled fewer bytes than the full-pull one (job show's bytes_out). bf16 deltas
#     at R = 3: two other slots' streams are as large as the fragment, so the lease says no
#     replay (Lease.replay_pull) and the job pulls exactly the full-pull job's bytes.
#  2. a 1 + 2 module DiPaCo job with e3m0 deltas (per-module rounds, one momentum each) and a
#     Streaming DiLoCo job (2 fragments, overlap 1, alpha 0.5, e3m0: the prefetcher replays
#     each fragment's global version): the same, replay on and off byte-identical.
#     And a SparseLoCo job with outer Nesterov momentum (its sparse streams replayed; sparse
#     pulls need momentum 0): the same.
#  3. bad input: the coordinator restarted with DIPACO_TEST_REPLAY_FAULT (testhook.h) serving
#     an undecodable stream, a stream that decodes to other values, or NOT_FOUND for a round:
#     each time the worker logs why and pulls the fragment whole, and the export is still
#     byte-identical to the full-pull run.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs replay_dist 30 "$@"; }

make_corpus "$W/corpus"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 7 --out "$W/init" 2>/dev/null
# spec NAME CODEC REPLAY [ALGO]
spec() {
  local levels='' data='"data": {"train": ["data/train_*.bin"]}'
  local stream='' sparse=''
  [ "${4:-diloco}" = sparse ] && sparse=', "sparse": {"density": 0.05, "chunk": 4096, "value_bits": 2, "ef_beta": 0.95}'
  [ "${4:-diloco}" = streaming ] && stream='"fragments": 2, "overlap_steps": 1, "alpha": 0.5, '
  if [ "${4:-diloco}" = dipaco ]; then
    levels=', "levels": [{"stem": true, "layers": [0, 1], "modules": 1}, {"layers": [1, 2], "modules": 2}]'
    data='"data": {"paths": [["data/train_*.bin"], ["data/train_*.bin"]]}'
  fi
  cat > "$W/$1.json" <<JSON
{"name": "$1", "model": {"init": "$W/init"}, $data,
 "algorithm": "$( [ "${4:-diloco}" = dipaco ] && echo dipaco || echo diloco )", "replicas": 3, "inner_steps": 4, "rounds": 5, "batch": 2, "seq_len": 16$levels,
 "inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
           "eps": 1e-6, "grad_clip": 0.5, "state": "keep"},
 "outer": {"lr": 0.6, "momentum": 0.7, "nesterov": true, "momentum_warmup": 2, "momentum_decay": 2},
 "streaming": {${stream}"codec": "$2"}, "pulls": {"replay": $3}$sparse}
JSON
}

start_coordinator_metrics "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"
start_worker w3 "$W/corpus"

# run NAME: create, wait, export path 0 (and 1 for DiPaCo) to $W/NAME.out[1]; sets JOB
run() {
  JOB=$("$CTL" --coordinator "$COORD" job create "$W/$1.json")
  "$CTL" --coordinator "$COORD" job wait "$JOB" --timeout 240 >/dev/null || fail "job $1 did not finish"
  "$CTL" --coordinator "$COORD" job export "$JOB" --path 0 --out "$W/$1.out" >/dev/null
  if grep -q '"paths"' "$W/$1.json"; then
    "$CTL" --coordinator "$COORD" job export "$JOB" --path 1 --out "$W/$1.out1" >/dev/null
  fi
  "$CTL" --coordinator "$COORD" job show "$JOB" --json > "$W/$1.show.json"
}
field() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$W/$1.show.json" "$2"; }
replays() { cat "$W"/worker-*.log | grep -cE "replayed from their rounds|replayed from its round" || true; }
metric() {
  $PY -c "import sys,urllib.request; t=urllib.request.urlopen('http://127.0.0.1:$MPORT/metrics').read().decode()
print(sum(int(l.split()[-1]) for l in t.splitlines() if l.startswith(sys.argv[1])))" "$1"
}
same() { # A B: the exports byte-identical
  cmp -s "$W/$1.out/model.safetensors" "$W/$2.out/model.safetensors" || fail "$1 and $2 exports differ"
  if [ -f "$W/$1.out1/model.safetensors" ]; then
    cmp -s "$W/$1.out1/model.safetensors" "$W/$2.out1/model.safetensors" || fail "$1 and $2 path-1 exports differ"
  fi
}
no_mismatch() { if grep -q "does not match version" "$W"/worker-*.log; then fail "$1: a replay missed the checksum"; fi; }

# 1 and 2: replay on and off, byte-identical, fewer bytes with replay.
for c in e3m0:diloco fp8:diloco bf16:diloco e3m0:dipaco e3m0:streaming fp32:sparse; do
  codec=${c%%:*}; algo=${c##*:}; name=${codec}_$algo
  spec "${name}_on" "$codec" true "$algo"
  spec "${name}_off" "$codec" false "$algo"
  before=$(replays)
  run "${name}_on"
  n_on=$(( $(replays) - before ))
  no_mismatch "${name}_on"
  run "${name}_off"
  [ $(( $(replays) - before - n_on )) -eq 0 ] || fail "${name}_off: replayed with pulls.replay false"
  same "${name}_on" "${name}_off"
  on=$(field "${name}_on" bytes_out); off=$(field "${name}_off" bytes_out)
  echo "$name: $n_on replays; pulled $on bytes with replay, $off without; exports identical"
  if [ "$codec" = bf16 ]; then # 2 other slots' bf16 streams are the fragment's size: never replayed
    [ "$n_on" -eq 0 ] && [ "$on" -eq "$off" ] || fail "$name: $n_on replays, $on bytes vs $off: bf16 at R = 3 pulls whole"
    continue
  fi
  [ "$n_on" -ge 3 ] || fail "$name: only $n_on replays"
  [ "$on" -lt "$off" ] || fail "$name: replay pulled $on bytes, not fewer than the full pulls' $off"
done
r=$(metric 'dipaco_pulls_total{kind="replay"}')
echo "dipaco_pulls_total{kind=\"replay\"} = $r, bytes $(metric 'dipaco_pull_bytes_total{kind="replay"}')"
[ "$r" -ge 9 ] || fail "dipaco_pulls_total{kind=\"replay\"} is $r"

# 3. bad input: each fault makes one replay fall back to a whole pull, the export unchanged.
for fault in undecodable:"is unusable" mismatch:"does not match version" gone:"no replay of the round"; do
  f=${fault%%:*}; why=${fault#*:}
  kill -TERM "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
  DIPACO_TEST_REPLAY_FAULT=$f restart_coordinator "$W/state" --lease-ttl-ms 20000 || fail "restart"
  marks=$(cat "$W"/worker-*.log | grep -c "$why" || true)
  spec "fault_$f" e3m0 true
  run "fault_$f"
  got=$(( $(cat "$W"/worker-*.log | grep -c "$why" || true) - marks ))
  [ "$got" -ge 1 ] || fail "fault $f: no worker logged \"$why\""
  same "fault_$f" e3m0_diloco_off
  echo "fault $f: the worker logged \"$why\", pulled whole; export identical"
done
echo "replay_dist: PASS"
