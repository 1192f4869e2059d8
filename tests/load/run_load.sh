#!/usr/bin/env bash
# run_load.sh COORDINATOR DIPACOCTL LOADGEN [N=1000] [ROUNDS=3] [THREADS=16] — start a
# coordinator on loopback (state in a temp dir; it creates the join and admin tokens there),
# create a sync DiLoCo job with replicas = N on a tiny model, run N simulated workers
# (dipaco_loadgen) through ROUNDS rounds, print the figures and stop everything by PID.
# Exits non-zero if any delta was lost or doubled (loadgen checks its acks and the
# coordinator's ledger) or the job did not end DONE with version = ROUNDS.
# (LOADGEN_ROUNDS overrides the rounds the loadgen expects: a manual check that the test fails.)
set -euo pipefail
COORDINATOR_BIN=$1; CTL=$2; LOADGEN=$3
N=${4:-1000}; ROUNDS=${5:-3}; THREADS=${6:-16}
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/../integration/lib.sh"

# Every simulated worker shares the loadgen's few channels, but the coordinator still needs a
# descriptor per connection plus its state files: make sure the soft limit is not in the way.
want=$((N + 1024))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$want" ]; then
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  [ "$(ulimit -n)" = unlimited ] || [ "$(ulimit -n)" -ge "$want" ] || ulimit -n "$want" 2>/dev/null || true
fi

cat > "$W/spec.json" <<JSON
{"name": "load-$N", "model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "n_positions": 8, "vocab_size": 16, "seed": 1},
 "data": {"train": ["data/train_*.bin"]},
 "algorithm": "diloco", "replicas": $N, "inner_steps": 1, "rounds": $ROUNDS, "batch": 1, "seq_len": 8,
 "round_timeout_s": 0}
JSON
# 1000 workers on 2 cores: a long lease TTL so that a worker waiting for its thread's turn is
# never taken for gone; heartbeat interval as advertised to workers (the loadgen drives its own).
start_coordinator "$W/state" --lease-ttl-ms 120000 --heartbeat-ms 10000 --log-level "${COORD_LOG_LEVEL:-warn}"
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
echo "coordinator $COORD (pid $COORD_PID), job $job: $N replicas, $ROUNDS rounds, tiny model"
rc=0
"$LOADGEN" --coordinator "$COORD" --job "$job" --workers "$N" --rounds "${LOADGEN_ROUNDS:-$ROUNDS}" --threads "$THREADS" \
  --token-file "$W/state/join.token" --admin-token-file "$W/state/admin.token" || rc=$?
"$CTL" --coordinator "$COORD" job show "$job" | head -20 || true
if [ $rc != 0 ]; then
  echo "load test FAILED (loadgen exit $rc); coordinator log tail:"; tail -20 "$W/coordinator.log"
  exit 1
fi
