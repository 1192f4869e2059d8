#!/usr/bin/env bash
# quorum_grace.sh COORDINATOR WORKER DIPACOCTL — a sync job with "quorum": 0.5
# and "quorum_grace_s": 1 (round_timeout_s 120: the hard cap, never reached here) closes round
# 0 about 1 s after its first delta while the other worker of two is stalled (SIGSTOP), not
# at the deadline; the stalled worker's lease is revoked for the round (reason grace), and
# once it runs again nothing it pushes for that round is applied (PUSH_LATE / ABORTED); the
# job finishes; job ledger shows the slot round 0 missed, also after a coordinator restart,
# and dipaco_round_wait_seconds counts the rounds. A second job's grace window survives a
# coordinator SIGKILL: the round closes when it would have without the restart. Heartbeat revocation is pushed out of the way (--dead-after-heartbeats 100)
# so that only the grace window can close the round early.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs quorum_grace 30 "$@"; }

make_corpus "$W/corpus"
cat > "$W/spec.json" <<JSON
{"name": "grace", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 3},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 5, "rounds": 3,
 "batch": 2, "seq_len": 16, "inner": {"lr": 0.01, "state": "reset"},
 "quorum": 0.5, "quorum_grace_s": 1, "round_timeout_s": 120}
JSON
FLAGS=(--heartbeat-ms 200 --lease-ttl-ms 60000 --dead-after-heartbeats 100)
start_coordinator_metrics "$W/state" "${FLAGS[@]}" || fail "coordinator"
start_worker fast "$W/corpus" --min-step-ms 200
start_worker stall "$W/corpus" --min-step-ms 200; stall=$LAST_WORKER_PID
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
wait_for_line "$W/worker-stall.log" "lease [0-9]+ granted: job $job round 0" 30 || fail "the stalling worker got no lease"
kill -STOP "$stall"
echo "SIGSTOPped worker 'stall' in round 0"
wait_for_line "$W/coordinator.log" "round 0 closed: job $job .*\(quorum grace\)" 30 \
  || fail "round 0 did not close at the end of its grace window"
# From the round's first delta to its close: the grace (1 s) plus at most a tick or two.
# grace_gap JOB — ms from round 0's first delta of JOB to its close by the grace window.
grace_gap() {
  $PY - "$W/coordinator.log" "$1" <<'PY'
import datetime, json, re, sys
def ts(e):
    return datetime.datetime.strptime(e["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
first = closed = None
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    m = e.get("msg", "")
    if first is None and re.search(r"delta received: lease \d+ job %s .* round 0 " % sys.argv[2], m):
        first = ts(e)
    if closed is None and re.search(r"round 0 closed: job %s .*\(quorum grace\)" % sys.argv[2], m):
        closed = ts(e)
print(int((closed - first) * 1000) if first and closed else -1)
PY
}
gap=$(grace_gap "$job")
echo "round 0 closed $gap ms after its first delta (quorum_grace_s 1)"
[ "$gap" -ge 950 ] && [ "$gap" -le 2500 ] || fail "round 0 closed $gap ms after its first delta; want about 1000"
grep -Eq "round 0 closed: job $job fragment 1 -> version 1, 1 deltas" "$W/coordinator.log" \
  || fail "round 0 did not merge exactly the one delta in"
grep -Eq "lease [0-9]+ revoked: round 0 of job $job closed at the end of its quorum grace window" "$W/coordinator.log" \
  || fail "the stalled worker's lease was not revoked at the end of the grace window"
kill -CONT "$stall"
echo "SIGCONTed worker 'stall'"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 120 >/dev/null || fail "the job did not finish"

# The ledger: round 0 applied exactly one delta; nothing the stalled worker sent for it.
"$CTL" --coordinator "$COORD" job ledger "$job" --json > "$W/ledger.json"
$PY - "$W/ledger.json" <<'PY' || fail "ledger"
import json, sys
L = json.load(open(sys.argv[1]))
r0 = [d for d in L["deltas"] if d["version"] == 1]  # the version round 0 produced
assert len(r0) == 1, "round 0 applied %d deltas: %r" % (len(r0), r0)
m0 = [m for m in L["missed"] if m["version"] == 1]
assert len(m0) == 1 and m0[0]["replica"] != r0[0]["replica"] and m0[0]["path"] == 0, "round 0 missed %r" % m0
assert L["summary"]["missed"] == len(L["missed"]), L["summary"]
for v in (2, 3):  # every closed round merged or missed each of the two slots, once
    slots = sorted([d["replica"] for d in L["deltas"] if d["version"] == v] + [m["replica"] for m in L["missed"] if m["version"] == v])
    assert slots == [0, 1], "version %d: slots %r" % (v, slots)
print("ledger: round 0 merged replica %s and missed replica %s" % (r0[0]["replica"], m0[0]["replica"]))
PY
"$CTL" --coordinator "$COORD" job ledger "$job" | grep -q "^missed: version 1 path 0 replica" || fail "job ledger (text) shows no missed slot"
metrics=$($PY -c 'import sys, urllib.request; print(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode())' "$MPORT")
grep -E '^dipaco_lease_revocations_total' <<<"$metrics"
grep -Eq '^dipaco_lease_revocations_total\{reason="grace"\} [1-9]' <<<"$metrics" || fail "no grace revocation counted"
grep -E '^dipaco_round_wait_seconds_(count|sum)' <<<"$metrics"
grep -q '^dipaco_round_wait_seconds_count 3$' <<<"$metrics" || fail "dipaco_round_wait_seconds counts no 3 rounds"

# The ledger (merged and missed slots) is derived from durable rows: the same after a SIGKILL
# and restart of the coordinator.
kill_wait "$COORD_PID"
restart_coordinator "$W/state" "${FLAGS[@]}" || fail "restart"
"$CTL" --coordinator "$COORD" job ledger "$job" --json > "$W/ledger2.json"
cmp "$W/ledger.json" "$W/ledger2.json" || fail "the ledger changed across a coordinator restart"

# A coordinator SIGKILLed in the middle of a grace window (3 s) closes the round when the
# first one would have: the window runs from the durable arrival time of the quorum's delta,
# not from the restart (which would close it 1.5 s + the restart + 3 s after that delta).
sed 's/"quorum_grace_s": 1/"quorum_grace_s": 3/; s/"rounds": 3/"rounds": 1/; s/"name": "grace"/"name": "grace-restart"/' "$W/spec.json" > "$W/spec2.json"
job2=$("$CTL" --coordinator "$COORD" job create "$W/spec2.json")
wait_for_line "$W/worker-stall.log" "lease [0-9]+ granted: job $job2 round 0" 30 || fail "the stalling worker got no lease in job $job2"
kill -STOP "$stall"
wait_for_line "$W/coordinator.log" "delta received: lease [0-9]+ job $job2 " 30 || fail "no delta of job $job2"
sleep 1.5
kill_wait "$COORD_PID"
echo "SIGKILLed the coordinator 1.5 s into the 3 s grace window of job $job2"
restart_coordinator "$W/state" "${FLAGS[@]}" || fail "restart 2"
wait_for_line "$W/coordinator.log" "round 0 closed: job $job2 .*\(quorum grace\)" 30 \
  || fail "job $job2's round 0 did not close at the end of its grace window after the restart"
gap=$(grace_gap "$job2")
echo "job $job2: round 0 closed $gap ms after its first delta across a restart (quorum_grace_s 3)"
[ "$gap" -ge 2950 ] && [ "$gap" -le 5200 ] || fail "job $job2's round 0 closed $gap ms after its first delta; want about 3000"
grep -Eq "round 0 closed: job $job2 fragment 1 -> version 1, 1 deltas" "$W/coordinator.log" \
  || fail "job $job2's round 0 did not merge exactly the one delta in"
kill -CONT "$stall"
"$CTL" --coordinator "$COORD" job wait "$job2" --timeout 60 >/dev/null || fail "job $job2 did not finish"
echo "quorum_grace: OK"
