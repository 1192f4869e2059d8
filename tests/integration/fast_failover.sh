#!/usr/bin/env bash
# fast_failover.sh COORDINATOR WORKER DIPACOCTL — a worker SIGKILLed while it
# holds a lease loses it as soon as its connection closes (its Watch call ends without an
# answer; revoked after --reconnect-grace-ms, 1 s by default), not after the lease TTL (30 s
# here), and the idle spare worker gets the slot at once; a worker that stops answering with
# its connection open (SIGSTOP) loses it after --dead-after-heartbeats missed heartbeats; a
# slow worker whose every
# inner step takes longer than that window keeps its lease (its heartbeats run beside
# training); a worker declared dead that comes back (SIGSTOP, SIGCONT) is told its lease is
# gone and nothing it trained under it is stored; the job ends with exactly the parameters of
# a fault-free run (sync DiLoCo, inner_state checkpoint), and
# dipaco_lease_revocations_total counts the two revocations ({reason="disconnect"} and
# {reason="heartbeat"}). FAILOVER_RECONNECT_MS=0 turns the connection watch off: then the
# SIGKILL is caught by the missed heartbeats too.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs fast_failover 30 "$@"; }

# Heartbeat interval (FAILOVER_HB_MS, e.g. 2000 for the daemons' default); 3 missed
# heartbeats = 1.2 s at the default 400 ms, against a lease TTL of 30 s.
HB=${FAILOVER_HB_MS:-400}
WINDOW=$(( 3 * HB > 1000 ? 3 * HB : 1000 ))
# A reconnect grace well below the heartbeat window, so that the closed connection decides.
RECONNECT=${FAILOVER_RECONNECT_MS:-300}
FLAGS=(--lease-ttl-ms 30000 --heartbeat-ms $HB --dead-after-heartbeats 3 --reconnect-grace-ms $RECONNECT)
if [ "$RECONNECT" = 0 ]; then KILL_WHY="sent no heartbeat"; KILL_REASON=heartbeat
else KILL_WHY="closed its connection"; KILL_REASON=disconnect; WINDOW=$RECONNECT; fi
make_corpus "$W/corpus"
"$CTL" init --n-layer 1 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out "$W/init" 2>/dev/null
cat > "$W/spec.json" <<JSON
{"name": "failover", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 6, "rounds": 3, "batch": 2, "seq_len": 16,
 "round_timeout_s": 0, "inner": {"lr": 0.01, "eps": 1e-6, "state": "checkpoint"}}
JSON

# holder NAME — the lease id worker NAME holds now (empty when none).
holder() {
  "$CTL" --coordinator "$COORD" workers --json 2>/dev/null | $PY -c '
import json, sys
ws = json.load(sys.stdin)
ws = ws.get("workers", ws) if isinstance(ws, dict) else ws
print(next((str(w["lease_id"]) for w in ws if w.get("hostname") == sys.argv[1] and w.get("lease_id")), ""))' "$1"
}

# 1. Fault-free reference.
start_coordinator "$W/ref" "${FLAGS[@]}" || fail "coordinator (reference)"
start_worker ref1 "$W/corpus" --exit-when-done; r1=$LAST_WORKER_PID
start_worker ref2 "$W/corpus" --exit-when-done; r2=$LAST_WORKER_PID
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 120 >/dev/null || fail "the fault-free job did not finish"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export-ref" >/dev/null
kill_wait "$r1" "$r2" "$COORD_PID"
mv "$W/coordinator.log" "$W/coordinator-ref.log"

# 2. Victim (3 s steps: the spare must start and register before its round ends, on a loaded machine too), slow worker (1.5 s steps: longer than the window at 400 ms), and a
#    spare (300 ms steps) that starts once both slots are leased.
start_coordinator_metrics "$W/state" "${FLAGS[@]}" || fail "coordinator"
start_worker victim "$W/corpus" --min-step-ms 3000; victim=$LAST_WORKER_PID
start_worker slow "$W/corpus" --min-step-ms 1500
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
for _ in $(seq 1 400); do
  [ -n "$(holder victim)" ] && [ -n "$(holder slow)" ] && break
  sleep 0.05
done
lease=$(holder victim)
[ -n "$lease" ] && [ -n "$(holder slow)" ] || fail "the two workers did not both get a lease"
start_worker spare "$W/corpus" --min-step-ms 300; sparepid=$LAST_WORKER_PID
wait_for_line "$W/coordinator.log" "worker [0-9]+ registered: host spare" 20 || fail "the spare worker did not register"
sleep 0.3 # the victim is mid-round (6 steps of 3 s); the spare long-polls Lease
kill_wait "$victim"
! grep -Eq "delta received: lease $lease " "$W/coordinator.log" || fail "the victim pushed before the kill (a slow machine?)"
t_kill=$(date +%s%N)
echo "SIGKILLed the victim holding lease $lease"
spare=$(sed -n 's/.*worker \([0-9]*\) registered: host spare .*/\1/p' "$W/coordinator.log" | head -1)
wait_for_line "$W/coordinator.log" "lease $lease revoked: worker [0-9]+ $KILL_WHY" 25 \
  || fail "lease $lease was not revoked ($KILL_WHY)"
wait_for_line "$W/coordinator.log" "lease [0-9]+ granted: .* round 0 .* to worker $spare\"" 10 \
  || fail "the spare worker (worker $spare) never got the victim's slot"
# The failover time: from the SIGKILL to the grant line (the coordinator's log clock).
ms=$($PY - "$W/coordinator.log" "$spare" "$t_kill" <<'PY'
import datetime, json, re, sys
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if re.search(r"granted: .* round 0 .* to worker %s$" % sys.argv[2], e.get("msg", "")):
        t = datetime.datetime.strptime(e["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
        print(int(t.timestamp() * 1000 - int(sys.argv[3]) / 1e6))
        break
PY
)
echo "slot re-leased to the spare $ms ms after the SIGKILL (heartbeat $HB ms, reconnect grace $RECONNECT ms, revoked after $WINDOW ms, lease TTL 30000 ms)"
[ -n "$ms" ] && [ "$ms" -lt $(( WINDOW + 2800 )) ] || fail "failover took $ms ms: want a few heartbeat intervals, well under the 30 s TTL"

# 3. A worker declared dead that comes back: SIGSTOP the spare mid-lease in round 1, let a
#    second spare take the slot, then SIGCONT it: its Watch call was answered with
#    lease_ended (or its heartbeat hears STOP, or its push is refused), and nothing it trained under the revoked lease is stored.
wait_for_line "$W/coordinator.log" "lease [0-9]+ granted: .* round 1 .* to worker $spare\"" 60 \
  || fail "the spare got no lease in round 1"
lease2=$(sed -n "s/.*lease \([0-9]*\) granted: .* round 1 .* to worker $spare\".*/\1/p" "$W/coordinator.log" | head -1)
sleep 0.5
kill -STOP "$sparepid"
echo "SIGSTOPped the spare holding lease $lease2"
start_worker spare2 "$W/corpus"
wait_for_line "$W/coordinator.log" "lease $lease2 revoked: worker [0-9]+ sent no heartbeat" 25 \
  || fail "lease $lease2 of the stopped spare was not revoked"
wait_for_line "$W/coordinator.log" "worker [0-9]+ registered: host spare2" 20 || fail "spare2 did not register"
spare2=$(sed -n 's/.*worker \([0-9]*\) registered: host spare2 .*/\1/p' "$W/coordinator.log" | head -1)
wait_for_line "$W/coordinator.log" "lease [0-9]+ granted: .* round 1 .* to worker $spare2\"" 20 \
  || fail "spare2 did not get the stopped spare's slot"
kill -CONT "$sparepid"
echo "SIGCONTed the spare"
wait_for_line "$W/worker-spare.log" "lease $lease2: (the coordinator ended it|coordinator says STOP|lease expired or revoked|heartbeat refused)" 20 \
  || fail "the spare was not told that lease $lease2 is gone"
"$CTL" --coordinator "$COORD" job wait "$job" --timeout 180 >/dev/null || fail "the job did not finish after the kill"
! grep -Eq "delta received: lease $lease2 " "$W/coordinator.log" || fail "a delta of the revoked lease $lease2 was stored"
"$CTL" --coordinator "$COORD" job export "$job" --path 0 --out "$W/export-kill" >/dev/null
cmp "$W/export-ref/model.safetensors" "$W/export-kill/model.safetensors" \
  || fail "the parameters after the failover differ from the fault-free run"
echo "exported parameters byte-identical to the fault-free run"

# Exactly two revocations: the SIGKILLed victim's and the stopped spare's; the slow worker
# kept its leases.
metrics=$($PY -c 'import sys, urllib.request; print(urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode())' "$MPORT")
grep -E '^dipaco_lease_revocations_total' <<<"$metrics"
want_hb=1; [ "$KILL_REASON" = heartbeat ] && want_hb=2
grep -q "^dipaco_lease_revocations_total{reason=\"heartbeat\"} $want_hb\$" <<<"$metrics" \
  || fail "want $want_hb heartbeat revocation(s) (the slow worker must keep its leases)"
if [ "$KILL_REASON" = disconnect ]; then
  grep -q '^dipaco_lease_revocations_total{reason="disconnect"} 1$' <<<"$metrics" \
    || fail "want one disconnect revocation (the SIGKILLed victim)"
fi
n=$(grep -Ec "lease [0-9]+ revoked" "$W/coordinator.log" || true)
[ "$n" = 2 ] || fail "the coordinator revoked $n leases; want 2 (the victim's and the stopped spare's)"
echo "fast_failover: OK"
