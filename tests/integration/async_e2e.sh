#!/usr/bin/env bash
# async_e2e.sh DIPACOCTL DIPACO_COORDINATOR DIPACO_WORKER — asynchronous Local-SGD end to end:
# three real workers with --slowdown 1, 2 and 4 train one tiny diloco-async job (delayed
# Nesterov, DyLU on) against a real coordinator. Checks:
#  - the job ends with exactly rounds × H × R inner steps trained (finished leases, slots);
#  - DyLU: the slowest worker got shorter leases than H once it was measured;
#  - the inner LR schedule follows the job's progress (every lease starts at the steps trained
#    or leased by all slots / slots; the workers' logged rates match that schedule);
#  - the ledger (applied order, base version, staleness) seen through dipacoctl job ledger
#    equals the store's, and some delta was applied stale (staleness > 0);
#  - replaying the ledger (version 0 + the applied delta blobs, in order) through the
#    reference rule (tests/oracle/async_replay.py) gives the coordinator's parameters to
#    1e-5 relative, and the exported model holds exactly those parameters.
# Then a second job (plain async "nesterov", max_staleness 1, no DyLU) on fresh workers:
# deltas staler than 1 are dropped (PUSH_STALE, state 'dropped'), every applied one has
# staleness <= 1, the step budget is still exact, and its ledger replays to 1e-5.
set -euo pipefail
CTL=$1; COORDINATOR_BIN=$2; WORKER_BIN=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs async_e2e 25 "$@"; }
make_corpus "$W"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 32 --n-positions 32 --vocab-size 256 --seed 5 --out "$W/init" 2>/dev/null
start_coordinator "$W/state" --heartbeat-ms 100 --lease-ttl-ms 5000 || fail "coordinator"
H=6; R=3; ROUNDS=5
cat > "$W/spec.json" <<JSON
{"name": "async-e2e", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco-async", "replicas": $R, "inner_steps": $H, "rounds": $ROUNDS, "batch": 4, "seq_len": 32,
 "inner": {"lr": 0.003, "warmup": 2, "state": "reset"},
 "outer": {"rule": "delayed-nesterov", "lr": 0.7, "momentum": 0.9, "c": 0},
 "dylu": {"enabled": true, "min_steps": 1}}
JSON
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json" 2>>"$W/ctl.log") || fail "job create"
"$CTL" --coordinator "$COORD" job show "$JOB" > "$W/show.txt" 2>>"$W/ctl.log" || fail "job show"
grep -q "diloco-async" "$W/show.txt" && grep -q "delayed-nesterov" "$W/show.txt" || fail "job show lacks the async settings: $(cat "$W/show.txt")"
i=0
for x in 1 2 4; do
  i=$((i + 1))
  start_worker "w$i" "$W" --slowdown "$x" --exit-when-done --log-json
done
"$CTL" --coordinator "$COORD" job wait "$JOB" --timeout 120 >>"$W/ctl.log" 2>&1 || fail "the job did not finish"
"$CTL" --coordinator "$COORD" job ledger "$JOB" > "$W/ledger_ctl.txt" 2>>"$W/ctl.log" || fail "job ledger"
"$CTL" --coordinator "$COORD" job export "$JOB" --path 0 --out "$W/out" >>"$W/ctl.log" 2>&1 || fail "export"
kill -TERM "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true

$PY - "$W/state/dipaco.db" "$JOB" "$H" "$R" "$ROUNDS" "$W/ledger_ctl.txt" <<'PY' || fail "ledger/budget checks"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1]); job = int(sys.argv[2]); H, R, ROUNDS = map(int, sys.argv[3:6])
fin = db.execute("SELECT worker, inner_steps FROM leases WHERE job=? AND state='finished' ORDER BY id", (job,)).fetchall()
total = sum(s for _, s in fin)
slots = db.execute("SELECT SUM(inner_steps) FROM slots WHERE job=?", (job,)).fetchone()[0]
print(f"async_e2e: {len(fin)} leases, {total} inner steps (budget {ROUNDS * H * R}), slots {slots}")
assert total == ROUNDS * H * R == slots, "the budget is not exact"
names = dict(db.execute("SELECT id, name FROM workers").fetchall())
per = {}
for w, s in fin:
    per.setdefault(names[w], []).append(s)
for n in sorted(per):
    print(f"async_e2e: {n}: lease steps {per[n]}")
slow = per.get("w3", [])
assert len(slow) >= 2 and min(slow[1:]) < H, "DyLU did not shorten the slowest worker's leases"
rows = db.execute("SELECT applied_version, lease, path, replica, base_version FROM deltas WHERE job=? "
                  "AND state='applied' ORDER BY applied_version", (job,)).fetchall()
lines = [l for l in open(sys.argv[6]) if l.strip()]
assert lines[-1].startswith(f"summary: {len(rows)} deltas,"), f"ledger summary: {lines[-1]}"
ctl = [l.split() for l in lines[:-1] if not l.startswith("version")]
want = [[str(v), str(le), str(p), str(r), str(b), str(v - 1 - b)] for v, le, p, r, b in rows]
got = [c[:6] for c in ctl]
assert got == want, f"dipacoctl job ledger differs from the store:\n{got[:5]}\n{want[:5]}"
st = [int(x[5]) for x in want]
print(f"async_e2e: {len(rows)} deltas applied, staleness {st}")
assert max(st) > 0, "no delta was stale: the async path was not exercised"
PY
$PY - "$W/state/dipaco.db" "$JOB" "$H" "$ROUNDS" "$W"/worker-w*.log <<'PY' || fail "inner LR schedule checks"
# The inner LR schedule follows the job's progress: lease l starts at position step_begin +
# sched_shift = (steps trained or leased by all slots at grant) / slots, which never decreases
# and stays within [0, rounds·H); the workers trained at exactly that schedule's rates.
import json, math, re, sqlite3, sys
db = sqlite3.connect(sys.argv[1]); job = int(sys.argv[2]); H, ROUNDS = int(sys.argv[3]), int(sys.argv[4])
inner = json.loads(db.execute("SELECT spec_json FROM jobs WHERE id=?", (job,)).fetchone()[0])["inner"]
lr, warm, fmin, total = inner["lr"], inner["warmup"], inner["lr_min_frac"], ROUNDS * H
def lr_at(s):
    if s < warm:
        return lr * (s + 1) / warm
    p = min(1.0, (s - warm) / (total - warm)) if total > warm else 1.0
    return lr * (fmin + (1 - fmin) * 0.5 * (1 + math.cos(math.pi * p)))
rows = db.execute("SELECT id, step_begin, sched_shift FROM leases WHERE job=? AND state='finished' ORDER BY id", (job,)).fetchall()
pos = {i: b + sh for i, b, sh in rows}
seq = [pos[i] for i, _, _ in rows]
assert seq == sorted(seq) and 0 <= seq[0] and seq[-1] < total, f"schedule positions {seq}"
assert any(sh != 0 for _, _, sh in rows), "no lease started off its slot's own step: the schedule shift was not exercised"
seen = 0
for log in sys.argv[5:]:
    for line in open(log):
        m = re.search(r"lease (\d+) trained (\d+) steps .* lr ([0-9.e+-]+) -> ([0-9.e+-]+)", line)
        if not m or int(m.group(1)) not in pos:
            continue
        l, k, a, b = int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4))
        want = (lr_at(pos[l]), lr_at(pos[l] + k - 1))
        assert abs(a - want[0]) <= 1e-5 * lr and abs(b - want[1]) <= 1e-5 * lr, f"lease {l}: lr {a} -> {b}, want {want}"
        seen += 1
assert seen >= len(rows) // 2, f"only {seen} of {len(rows)} leases logged their learning rates"
print(f"async_e2e: inner LR schedule positions {seq}; {seen} leases trained at the job-progress rates")
PY
$PY "$HERE/../oracle/async_replay.py" --state "$W/state" --job "$JOB" --export "$W/out" --tol 1e-5 || fail "replay differs"
grep -q '"level":"error"' "$W"/worker-*.log && fail "a worker logged an error"

# ---- second job: plain async Nesterov with max_staleness 1 ----
start_coordinator "$W/state" --heartbeat-ms 100 --lease-ttl-ms 5000 || fail "coordinator (2)"
H2=4; R2=3; ROUNDS2=4
cat > "$W/spec2.json" <<JSON
{"name": "async-stale", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco-async", "replicas": $R2, "inner_steps": $H2, "rounds": $ROUNDS2, "batch": 4, "seq_len": 32,
 "inner": {"lr": 0.003, "state": "reset"}, "outer": {"rule": "nesterov", "lr": 0.5, "momentum": 0.9},
 "max_staleness": 1}
JSON
JOB2=$("$CTL" --coordinator "$COORD" job create "$W/spec2.json" 2>>"$W/ctl.log") || fail "job create (2)"
"$CTL" --coordinator "$COORD" job show "$JOB2" 2>>"$W/ctl.log" | grep -q "max_staleness *1" || fail "job show lacks max_staleness"
i=0
for x in 1 2 4; do
  i=$((i + 1))
  start_worker "v$i" "$W" --slowdown "$x" --exit-when-done --log-json
done
"$CTL" --coordinator "$COORD" job wait "$JOB2" --timeout 120 >>"$W/ctl.log" 2>&1 || fail "job 2 did not finish"
kill -TERM "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
$PY - "$W/state/dipaco.db" "$JOB2" "$H2" "$R2" "$ROUNDS2" <<'PY' || fail "max_staleness checks"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1]); job = int(sys.argv[2]); H, R, ROUNDS = map(int, sys.argv[3:6])
total = db.execute("SELECT SUM(inner_steps) FROM leases WHERE job=? AND state='finished'", (job,)).fetchone()[0]
assert total == ROUNDS * H * R, f"budget {total} != {ROUNDS * H * R}"
st = [v - 1 - b for v, b in db.execute("SELECT applied_version, base_version FROM deltas WHERE job=? AND state='applied' "
                                       "ORDER BY applied_version", (job,))]
dropped = db.execute("SELECT COUNT(*) FROM deltas WHERE job=? AND state='dropped'", (job,)).fetchone()[0]
stale_acks = db.execute("SELECT COUNT(*) FROM leases l WHERE job=? AND state='finished' AND NOT EXISTS "
                        "(SELECT 1 FROM deltas d WHERE d.lease = l.id)", (job,)).fetchone()[0]
print(f"async_e2e: max_staleness 1: applied staleness {st}, {dropped} dropped at apply, {stale_acks} refused at push")
assert st and max(st) <= 1, "a delta staler than max_staleness was applied"
assert dropped + stale_acks > 0, "no delta was refused as stale: the max_staleness path was not exercised"
PY
$PY "$HERE/../oracle/async_replay.py" --state "$W/state" --job "$JOB2" --tol 1e-5 || fail "replay (2) differs"
echo "async_e2e: ok"
