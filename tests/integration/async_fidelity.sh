#!/usr/bin/env bash
# async_fidelity.sh DIPACOCTL DIPACO_COORDINATOR DIPACO_WORKER — asynchronous Local-SGD has no
# self-inflicted staleness (docs/design.md §3: a lease includes every acknowledged delta):
#  1. one worker, diloco-async with delayed Nesterov N = 1, c = 0, equals the sync Nesterov
#     DiLoCo job with the same spec (R = 1): exported parameters within 1e-6 (max |a − b| over
#     max |b|, per tensor), and the async ledger shows staleness 0 for every delta;
#  2. two workers at equal speed (--min-step-ms 80 each: every inner step takes 80 ms whatever
#     else the shared CPU runs, so that the load of the test machine does not decide the order): every applied delta has staleness <= 1, and some has 1 (both trained at once);
#  3. the ledger summary of dipacoctl job ledger (text and --json) agrees with the entries.
set -euo pipefail
CTL=$1; COORDINATOR_BIN=$2; WORKER_BIN=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs async_fidelity 25 "$@"; }
make_corpus "$W"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 32 --n-positions 32 --vocab-size 256 --seed 11 --out "$W/init" 2>/dev/null
start_coordinator "$W/state" --heartbeat-ms 100 --lease-ttl-ms 5000 || fail "coordinator"

H=5; ROUNDS=4
spec() { # spec NAME ALGORITHM OUTER REPLICAS
  cat <<JSON
{"name": "$1", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "$2", "replicas": $4, "inner_steps": $H, "rounds": $ROUNDS, "batch": 4, "seq_len": 32,
 "inner": {"lr": 0.003, "warmup": 2, "state": "keep"}, "outer": {$3}}
JSON
}
# The sync job keeps a constant momentum (no schedule), as delayed Nesterov has none.
spec sync diloco '"lr": 0.7, "momentum": 0.9, "nesterov": true, "momentum_warmup": 0, "momentum_decay": 0' 1 \
  > "$W/sync.json"
spec async diloco-async '"rule": "delayed-nesterov", "delay_buffer": 1, "c": 0, "lr": 0.7, "momentum": 0.9' 1 > "$W/async.json"
spec async2 diloco-async '"rule": "delayed-nesterov", "lr": 0.7, "momentum": 0.9' 2 > "$W/async2.json"

run_job() { # run_job SPEC NWORKERS [WORKER FLAGS...] -> prints the job id
  local spec=$1 nw=$2 job i n
  shift 2
  # Paused until every worker is registered, so that they start together.
  job=$("$CTL" --coordinator "$COORD" job create "$spec" --paused 2>>"$W/ctl.log") || fail "job create $spec"
  for i in $(seq 1 "$nw"); do start_worker "$(basename "$spec" .json)-$i" "$W" "$@" --exit-when-done --log-json; done
  for _ in $(seq 1 100); do
    n=$("$CTL" --coordinator "$COORD" workers 2>/dev/null | grep -c "$(basename "$spec" .json)-" || true)
    [ "$n" -ge "$nw" ] && break
    sleep 0.1
  done
  "$CTL" --coordinator "$COORD" job resume "$job" >>"$W/ctl.log" 2>&1 || fail "job resume $job"
  "$CTL" --coordinator "$COORD" job wait "$job" --timeout 120 >>"$W/ctl.log" 2>&1 || fail "job $job ($spec) did not finish"
  echo "$job"
}
JS=$(run_job "$W/sync.json" 1)
"$CTL" --coordinator "$COORD" job export "$JS" --path 0 --out "$W/out_sync" >>"$W/ctl.log" 2>&1 || fail "export sync"
JA=$(run_job "$W/async.json" 1)
"$CTL" --coordinator "$COORD" job export "$JA" --path 0 --out "$W/out_async" >>"$W/ctl.log" 2>&1 || fail "export async"
"$CTL" --coordinator "$COORD" job ledger "$JA" --json > "$W/ledger1.json" 2>>"$W/ctl.log" || fail "ledger 1"
JB=$(run_job "$W/async2.json" 2 --min-step-ms 80)
"$CTL" --coordinator "$COORD" job ledger "$JB" --json > "$W/ledger2.json" 2>>"$W/ctl.log" || fail "ledger 2"
"$CTL" --coordinator "$COORD" job ledger "$JB" > "$W/ledger2.txt" 2>>"$W/ctl.log" || fail "ledger 2 (text)"

$PY - "$HERE/../oracle" "$W" "$ROUNDS" <<'PY' || fail "checks"
import json, sys
sys.path.insert(0, sys.argv[1])
from diloco_ref import read_safetensors
w, rounds = sys.argv[2], int(sys.argv[3])
a = read_safetensors(f"{w}/out_async/model.safetensors")
b = read_safetensors(f"{w}/out_sync/model.safetensors")
assert a.keys() == b.keys()
worst = max(float((a[k] - b[k]).abs().max() / max(float(b[k].abs().max()), 1e-30)) for k in b)
print(f"async_fidelity: one worker, delayed Nesterov N=1 c=0 vs sync Nesterov: max relative difference {worst:.3g}")
assert worst <= 1e-6, "the one-worker async job differs from the sync job"

def check(name, nslots, cap, need_stale):
    led = json.load(open(f"{w}/{name}.json"))
    ent, summ = led["deltas"], led["summary"]
    st = [e["staleness"] for e in ent]
    print(f"async_fidelity: {name}: {len(ent)} deltas, staleness {st}; summary {summ}")
    assert [e["version"] for e in ent] == list(range(1, len(ent) + 1)), "versions are not 1..n in order"
    assert max(st) <= cap, f"a delta had staleness above {cap}"
    assert not need_stale or max(st) == 1, "no two deltas were trained at once: the test exercised nothing"
    assert summ["deltas"] == len(ent) and summ["staleness_max"] == max(st) and summ["dropped"] == 0
    assert abs(summ["staleness_mean"] - sum(st) / len(st)) < 1e-9
    return summ
check("ledger1", 1, 0, False)
s2 = check("ledger2", 2, 1, True)
lines = open(f"{w}/ledger2.txt").read().splitlines()
assert lines[-1].startswith(f"summary: {s2['deltas']} deltas,") and f"max {s2['staleness_max']}" in lines[-1], lines[-1]
PY
echo "async_fidelity: ok"
