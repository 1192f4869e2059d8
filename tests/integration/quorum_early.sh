#!/usr/bin/env bash
# quorum_early.sh COORDINATOR WORKER DIPACOCTL — what a quorum round does about the
# slots it closes without, and about slots that cannot deliver.
#  1. A worker cut off by the grace window stops at once: job "cut" (R = 2, quorum 0.5,
#     quorum_grace_s 1) has a fast worker (50 ms steps) and a slow one (1500 ms steps, H = 5:
#     7.5 s a round). Round 0 closes 1 s after the fast delta; the slow worker's lease is
#     revoked, and its held Watch call is answered with lease_ended: it drops the lease at its
#     next step (logged "the coordinator ended it"), before any heartbeat could tell it
#     (--heartbeat-ms 3000) and long before its round would end. Nothing of it is stored.
#  2. A round need not wait for slots nobody can deliver: job "early" (quorum_grace_s 60,
#     round_timeout_s 120): the slow worker is SIGKILLed holding its round-1 lease; its Watch
#     call ends with its connection, so the round closes as soon as the fast delta is in
#     ("(quorum; the rest had no connected worker)"), not 60 s later; later rounds, whose second
#     slot no worker holds, close the same way. The ledger lists the missed slots.
# (Exact rounds never close short: chaos, fast_failover.)
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs quorum_early 30 "$@"; }

make_corpus "$W/corpus"
spec() { # NAME GRACE ROUNDS
  cat <<JSON
{"name": "$1", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 3},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 5, "rounds": $3,
 "batch": 2, "seq_len": 16, "inner": {"lr": 0.01, "state": "reset"},
 "quorum": 0.5, "quorum_grace_s": $2, "round_timeout_s": 120}
JSON
}
spec cut 1 1 > "$W/cut.json"
spec early 60 4 > "$W/early.json"
start_coordinator "$W/state" --heartbeat-ms 3000 --lease-ttl-ms 60000 || fail "coordinator"

# ---- 1: the cut-off worker hears it from its Watch call
job=$("$CTL" --coordinator "$COORD" job create "$W/cut.json")
start_worker fast "$W/corpus" --min-step-ms 50
start_worker slow "$W/corpus" --min-step-ms 1500; slow=$LAST_WORKER_PID
wait_for_line "$W/worker-slow.log" "lease [0-9]+ granted: job $job round 0" 30 || fail "the slow worker got no lease"
lease=$(sed -n "s/.*lease \([0-9]*\) granted: job $job round 0.*/\1/p" "$W/worker-slow.log" | head -1)
wait_for_line "$W/coordinator.log" "round 0 closed: job $job .*\(quorum grace\)" 30 || fail "round 0 did not close at its grace window"
wait_for_line "$W/worker-slow.log" "lease $lease: the coordinator ended it" 10 \
  || fail "the slow worker was not told that lease $lease ended"
$PY - "$W/worker-slow.log" "$lease" <<'PY' || fail "the slow worker did not stop at once"
import json, re, sys
lease = sys.argv[2]
ended = step = None
for line in open(sys.argv[1]):
    try:
        m = json.loads(line).get("msg", "")
    except ValueError:
        continue
    if ended is None and re.match(r"lease %s: the coordinator ended it" % lease, m):
        ended = True
    assert not re.match(r"lease %s: heartbeat refused" % lease, m) or ended, "a heartbeat told it first: " + m
    assert not re.match(r"lease %s (trained|pushed)" % lease, m), "it went on with the lease: " + m
print("the slow worker dropped lease %s when its Watch call said so" % lease)
PY
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 60 >/dev/null || fail "job $job did not finish"
! grep -Eq "delta received: lease $lease " "$W/coordinator.log" || fail "a delta of the cut-off lease $lease was stored"
echo "ok: 1: the worker cut off by the grace window dropped its lease at once (Watch lease_ended)"

# ---- 2: a SIGKILLed worker's slot does not hold its round for the grace window
job2=$("$CTL" --coordinator "$COORD" job create "$W/early.json")
wait_for_line "$W/worker-slow.log" "lease [0-9]+ granted: job $job2 round 1" 60 || fail "the slow worker got no round-1 lease"
lease2=$(sed -n "s/.*lease \([0-9]*\) granted: job $job2 round 1.*/\1/p" "$W/worker-slow.log" | head -1)
wait_for_line "$W/worker-slow.log" "lease $lease2 pulled" 30 || fail "the slow worker did not start lease $lease2"
sleep 0.5 # its Watch call is open: the coordinator sees the connection close
t0=$(date +%s%3N)
kill_wait "$slow"
echo "SIGKILLed the slow worker holding its round-1 lease"
wait_for_line "$W/coordinator.log" "round 1 closed: job $job2 .*\(quorum; the rest had no connected worker\)" 30 \
  || fail "round 1 did not close at its quorum once the slow worker's connection closed"
"$CTL" --coordinator "$COORD" job wait "$job2" --timeout 40 >/dev/null || fail "job $job2 did not finish well before one 60 s window"
dt=$(( $(date +%s%3N) - t0 ))
echo "job $job2 finished $dt ms after the SIGKILL (grace window 60 s)"
grep -Eq "lease [0-9]+ revoked: round 1 of job $job2 closed at its quorum" "$W/coordinator.log" \
  || fail "the dead worker's round-1 lease was not revoked at the close"
"$CTL" --coordinator "$COORD" job ledger "$job2" --json > "$W/ledger.json"
$PY - "$W/ledger.json" <<'PY' || fail "ledger"
import json, sys
L = json.load(open(sys.argv[1]))
for v in (2, 3, 4):  # rounds 1..3: one slot merged, one missed
    got = [d["replica"] for d in L["deltas"] if d["version"] == v]
    missed = [m["replica"] for m in L["missed"] if m["version"] == v]
    assert len(got) == 1 and len(missed) == 1 and got != missed, "version %d: merged %r missed %r" % (v, got, missed)
print("ledger: rounds 1-3 each merged one slot and missed the other")
PY
echo "ok: 2: rounds closed at their quorum when no connected worker could deliver the rest"
echo "quorum_early: OK"
