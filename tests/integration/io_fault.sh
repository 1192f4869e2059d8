#!/usr/bin/env bash
# io_fault.sh COORDINATOR WORKER DIPACOCTL — I/O fault injection on the coordinator's durable
# state (DIPACO_TEST_IO_FAULT, common/fsutil.h; SQLite's own I/O through the test VFS of
# coordinator/store_fault.c). A tiny sync DiLoCo job (R=2, 3 rounds, inner state reset, one
# thread: bit-reproducible) runs once fault-free for the reference export, then under:
#  1. a full disk for blobs (every blob fsync from the first on fails with ENOSPC): pushes are
#     answered with an error naming the failed fsync, the coordinator stays up; restarted
#     without the fault, the job completes;
#  2. one failed rename of an outer step's parameter blob (a version write): the outer step
#     fails, is tried again a second later from the durable deltas, and the job completes;
#     then one failed rename of a momentum blob, whose version is committed before it is
#     stored: the momentum is made again from the version before it, and the job completes;
#  3. SQLite's own writes failing with a full disk (SQLITE_FULL): Register/Lease calls are
#     answered with an error, the coordinator stays up; restarted without it, the job completes;
#  4. one failed SQLite fsync (a commit that does not reach the disk): the call fails, the
#     client retries, the job completes.
# Every faulty run must end DONE with parameters byte-identical to the reference, and the
# delta ledger must hold each slot's delta exactly once per round.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs io_fault 15 "$@"; }

make_corpus "$W/corpus"
"$CTL" init --n-layer 1 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 7 --out "$W/init" 2>/dev/null
cat > "$W/spec.json" <<JSON
{"name": "iofault", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 4, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "state": "reset"}, "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
FLAGS=(--heartbeat-ms 200 --lease-ttl-ms 4000)

WPIDS=()
workers() { # start two workers that leave when the job is done
  for n in a b; do
    start_worker "$1$n" "$W/corpus" --exit-when-done
    WPIDS+=("$LAST_WORKER_PID")
  done
}
stop_workers() { # a worker that did not see the job end before its coordinator stopped would
  # retry forever: SIGTERM (they exit within their grace period) and reap
  for p in "${WPIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${WPIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  WPIDS=()
}
stop_coordinator() { # SIGTERM; it must exit 0
  kill -TERM "$COORD_PID"
  local rc=0
  wait "$COORD_PID" || rc=$?
  [ $rc = 0 ] || fail "coordinator exited $rc on SIGTERM ($1)"
}
wait_done() { # JOB → DONE with round 3, within $2 s
  for _ in $(seq 1 $(( $2 * 10 ))); do
    "$CTL" --coordinator "$COORD" job show "$1" 2>/dev/null | grep -Eq '^state +DONE' && return 0
    kill -0 "$COORD_PID" 2>/dev/null || fail "coordinator died ($3)"
    sleep 0.1
  done
  fail "job $1 not DONE within $2 s ($3)"
}
export_cmp() { # export and compare with the reference; the ledger: each slot once per round
  "$CTL" --coordinator "$COORD" job export "$1" --path 0 --out "$W/out-$2" >/dev/null 2>&1 || fail "export ($2)"
  cmp -s "$W/ref/model.safetensors" "$W/out-$2/model.safetensors" || fail "parameters differ from the fault-free run ($2)"
  "$CTL" --coordinator "$COORD" job ledger "$1" --json > "$W/ledger-$2.json" 2>/dev/null || fail "job ledger ($2)"
  "$PY" -c '
import json, sys
rows = json.load(open(sys.argv[1]))["deltas"]
got = sorted((r["version"], r["replica"]) for r in rows)
sys.exit(0 if got == [(v, r) for v in (1, 2, 3) for r in (0, 1)] else 1)' "$W/ledger-$2.json" ||
    fail "delta ledger ($2): $(cat "$W/ledger-$2.json")"
  echo "ok: $2: job DONE, parameters identical to the fault-free run, each delta applied once"
}

# ---- reference
start_coordinator "$W/s0" "${FLAGS[@]}"
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
workers ref
wait_done "$JOB" 120 reference
"$CTL" --coordinator "$COORD" job export "$JOB" --path 0 --out "$W/ref" >/dev/null
stop_workers
stop_coordinator reference

# ---- 1: full disk for blobs (fsync from the first on), then restart without it
start_coordinator "$W/s1" "${FLAGS[@]}"
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
stop_coordinator "job created"
DIPACO_TEST_IO_FAULT=fsync:1+:ENOSPC restart_coordinator "$W/s1" "${FLAGS[@]}" || fail "restart with the fault"
workers full
wait_for_line "$W/coordinator.log" "could not store the delta durably: fsync .*No space left on device" 60 ||
  fail "no push was refused for the full disk"
# The worker logs the refusal once its PushDelta call returns, just after the coordinator's line.
told=
for _ in $(seq 1 200); do
  grep -Eq "No space left on device" "$W"/worker-full*.log && { told=1; break; }
  sleep 0.05
done
[ -n "$told" ] || fail "the workers were not told why their push failed"
sleep 1
kill -0 "$COORD_PID" 2>/dev/null || fail "the coordinator died on the full disk"
[ "$(find "$W/s1/blobs" -name '*.tmp.*' | wc -l)" = 0 ] || fail "temporary blob files left behind"
echo "ok: 1: pushes refused with the fsync error, coordinator up, no temporary left"
stop_coordinator "full disk"
restart_coordinator "$W/s1" "${FLAGS[@]}" || fail "restart without the fault"
wait_done "$JOB" 120 "after the full disk"
export_cmp "$JOB" blobs-full
stop_workers
stop_coordinator "after the full disk"

# ---- 2: one failed rename: the one of version 1's parameter blob (an outer step's write)
DIPACO_TEST_IO_FAULT=rename:1@-v1.params start_coordinator "$W/s2" "${FLAGS[@]}"
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
workers ren
wait_done "$JOB" 120 "rename fault"
grep -Eq "outer step failed: .*rename" "$W/coordinator.log" || fail "the injected rename did not hit an outer step"
echo "ok: 2: a failed version write was retried"
export_cmp "$JOB" version-rename
stop_workers
stop_coordinator "rename fault"
DIPACO_TEST_IO_FAULT=rename:1@-v1.momentum start_coordinator "$W/s2m" "${FLAGS[@]}"
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
workers mom
wait_done "$JOB" 120 "momentum rename fault"
grep -Eq "momentum .*-v1.momentum could not be stored: .*rename" "$W/coordinator.log" \
  || fail "the injected rename did not hit the momentum's store"
grep -Eq "version 1 made again from version 0" "$W/coordinator.log" || fail "the momentum was not made again"
echo "ok: 2: a failed momentum write was made again"
export_cmp "$JOB" momentum-rename
stop_workers
stop_coordinator "momentum rename fault"

# ---- 3: SQLite disk full from the job's first write on, then restart without it
start_coordinator "$W/s3" "${FLAGS[@]}"
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
stop_coordinator "job created"
DIPACO_TEST_IO_FAULT=sqlite-write:1+:ENOSPC restart_coordinator "$W/s3" "${FLAGS[@]}" || fail "restart with the sqlite fault"
workers sq
wait_for_line "$W/worker-sqa.log" "Register: INTERNAL: .*database or disk is full" 60 ||
  fail "Register was not answered with the database error"
sleep 1
kill -0 "$COORD_PID" 2>/dev/null || fail "the coordinator died on the full database"
echo "ok: 3: calls answered with an error on a full database, coordinator up"
stop_coordinator "sqlite full"
restart_coordinator "$W/s3" "${FLAGS[@]}" || fail "restart without the sqlite fault"
wait_done "$JOB" 120 "after the sqlite fault"
export_cmp "$JOB" sqlite-full
stop_workers
stop_coordinator "after the sqlite fault"

# ---- 4: one failed SQLite fsync in the middle of the job
DIPACO_TEST_IO_FAULT=sqlite-sync:12 start_coordinator "$W/s4" "${FLAGS[@]}"
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
workers sync
wait_done "$JOB" 120 "sqlite fsync fault"
grep -Eq "DIPACO_TEST_IO_FAULT: injecting" "$W/coordinator.log" || fail "the sqlite fsync fault was not injected"
export_cmp "$JOB" sqlite-sync
stop_workers
stop_coordinator "sqlite fsync fault"
echo "io_fault: OK"
