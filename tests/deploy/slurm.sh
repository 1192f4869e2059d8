#!/usr/bin/env bash
# slurm.sh COORDINATOR WORKER DIPACOCTL — deploy/slurm/ on a real Slurm (Debian slurm-wlm +
# munge, installed when missing): a private munged, slurmctld and slurmd on localhost (own
# ports, key, sockets and spool in a scratch folder), then
#  1. the scripts' preemption settings agree: worker.sbatch's `--signal=B:TERM@N` lead time and
#     this cluster's KillWait both exceed its default --grace-s;
#  2. coordinator.sbatch runs the coordinator as a Slurm job (it writes its address; dipacoctl
#     reaches it); a DiLoCo job (R=2, H=8, 4 rounds) is created;
#  3. worker.sbatch runs as an array of 3 tasks (sbatch --array=0-2; each worker paced at
#     600 ms a step; two hold the two slots, one waits); once task V trains, `scancel JOB_V`:
#     Slurm's SIGTERM makes that worker release its lease ("stopping: releasing it"; the
#     coordinator logs the release with the slot free) within its grace, the task leaves the
#     queue, and the waiting task gets that slot and round at once (the lease TTL is 60 s);
#  4. the two other tasks (the waiting one takes the released slot) push deltas and finish
#     the job (DONE, 4 outer steps, --exit-when-done), leaving the queue;
#  5. scancel of the coordinator job stops it.
# Needs root (the Slurm daemons run as root here) and Debian slurm-wlm + munge
# (deploy/install_deps.sh --test): fails, saying which, otherwise.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT_SRC=$(cd "$HERE/../.." && pwd)
missing() { echo "slurm: FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || missing "needs root to run slurmctld, slurmd and munged; tests/run.sh -LE deploy leaves the deploy tests out"
for t in slurmctld slurmd munged mungekey sbatch squeue scancel scontrol sinfo; do
  command -v $t >/dev/null || missing "$t is missing: install Debian slurm-wlm and munge (deploy/install_deps.sh --test)"
done
W=$(mktemp -d)
source "$ROOT_SRC/tests/integration/lib.sh"
fail() { die_with_logs slurm 25 "$@"; }
JOBS=()
# Cancel our Slurm jobs before lib.sh stops the daemons (their steps run under slurmd).
slurm_cleanup() {
  local rc=$? j
  set +e
  if [ ${#JOBS[@]} -gt 0 ]; then
    scancel "${JOBS[@]}" 2>/dev/null
    for _ in $(seq 1 100); do [ -z "$(squeue -h -j "$(IFS=,; echo "${JOBS[*]}")" 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  (exit $rc); cleanup
}
trap slurm_cleanup EXIT

# ---- the cluster: munge, slurmctld, slurmd
NODE=$(hostname -s)
mkdir -p "$W/munge" "$W/munge-key" "$W/spool/ctld" "$W/spool/d" "$W/run"
chmod 0755 "$W" "$W/munge" # munged wants its socket's folder searchable by all
chmod 0700 "$W/munge-key"
mungekey --create --keyfile="$W/munge-key/munge.key" >/dev/null 2>&1 || dd if=/dev/urandom of="$W/munge-key/munge.key" bs=1024 count=1 2>/dev/null
chmod 0600 "$W/munge-key/munge.key"
munged -F --socket="$W/munge/munge.sock" --key-file="$W/munge-key/munge.key" --pid-file="$W/munge-key/munged.pid" \
  --log-file="$W/munged.log" --seed-file="$W/munge-key/munge.seed" >>"$W/munged.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 50); do [ -S "$W/munge/munge.sock" ] && break; sleep 0.1; done
munge -S "$W/munge/munge.sock" -n | unmunge -S "$W/munge/munge.sock" | grep -q 'STATUS: *Success' || fail "munge does not work"
KILLWAIT=40
# The node claims 8 CPUs (config_overrides): the coordinator (2) and the 3 workers (1 each) at once.
cat >"$W/slurm.conf" <<CONF
ClusterName=dipacotest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$W/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$W/spool/ctld
SlurmdSpoolDir=$W/spool/d
SlurmctldPidFile=$W/run/slurmctld.pid
SlurmdPidFile=$W/run/slurmd.pid
SlurmctldLogFile=$W/slurmctld.log
SlurmdLogFile=$W/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=$KILLWAIT
MinJobAge=600
SchedulerParameters=sched_interval=2
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=8 RealMemory=2000 State=UNKNOWN
PartitionName=test Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$W/slurm.conf
slurmctld -D -f "$SLURM_CONF" >>"$W/slurmctld.log" 2>&1 &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" -N "$NODE" >>"$W/slurmd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 150); do
  [ "$(sinfo -h -n "$NODE" -o %t 2>/dev/null)" = idle ] && break
  sleep 0.2
done
[ "$(sinfo -h -n "$NODE" -o %t 2>/dev/null)" = idle ] || fail "the node did not come up idle: $(sinfo 2>&1 | tail -2)"
echo "ok: slurmctld and slurmd up on $NODE ($(slurmctld -V))"

# ---- 1: the scripts' preemption settings
lead=$(sed -n 's/^#SBATCH --signal=B:TERM@\([0-9]*\)$/\1/p' "$ROOT_SRC/deploy/slurm/worker.sbatch")
grace=$(sed -n 's/^grace=\${DIPACO_GRACE_S:-\([0-9]*\)}$/\1/p' "$ROOT_SRC/deploy/slurm/worker.sbatch")
[ -n "$lead" ] && [ -n "$grace" ] || fail "worker.sbatch: no --signal=B:TERM@N or no default grace"
[ "$grace" -lt "$lead" ] || fail "worker.sbatch: --grace-s $grace is not below the --signal lead time $lead"
[ "$grace" -lt "$KILLWAIT" ] || fail "--grace-s $grace is not below KillWait $KILLWAIT"
echo "ok: 1: worker.sbatch: SIGTERM $lead s before the time limit, --grace-s $grace (< KillWait $KILLWAIT)"

# ---- 2: the coordinator as a Slurm job
BIN_DIRS=$(dirname "$COORDINATOR_BIN"):$(dirname "$WORKER_BIN"):$(dirname "$CTL")
export PATH=$BIN_DIRS:$PATH
export DIPACO_STATE_DIR=$W/shared/state DIPACO_RUN_DIR=$W/shared DIPACO_PORT=$(free_port) DIPACO_METRICS_PORT=$(free_port)
export DIPACO_ADVERTISE=127.0.0.1
CJOB=$(sbatch --parsable -o "$W/coordinator.log" "$ROOT_SRC/deploy/slurm/coordinator.sbatch" --heartbeat-ms 250 --lease-ttl-ms 60000)
JOBS+=("$CJOB")
for _ in $(seq 1 150); do [ -s "$W/shared/coordinator.addr" ] && [ -s "$DIPACO_STATE_DIR/admin.token" ] && break; sleep 0.2; done
[ -s "$W/shared/coordinator.addr" ] || fail "coordinator.sbatch wrote no address (job $CJOB: $(squeue -h -j "$CJOB" -o '%T %r'))"
COORD=$(cat "$W/shared/coordinator.addr")
for _ in $(seq 1 100); do use_tokens "$DIPACO_STATE_DIR" && "$CTL" --coordinator "$COORD" status >/dev/null 2>&1 && break; sleep 0.2; done
"$CTL" --coordinator "$COORD" status >/dev/null || fail "the coordinator job $CJOB does not answer at $COORD"
[ "$(squeue -h -j "$CJOB" -o %T)" = RUNNING ] || fail "coordinator job $CJOB is not RUNNING"
make_corpus "$W/shared/corpus"
cat >"$W/spec.json" <<JSON
{"name": "slurm", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 7},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 8,
 "rounds": 4, "batch": 4, "seq_len": 16, "inner": {"lr": 0.003}}
JSON
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create failed"
echo "ok: 2: coordinator.sbatch: Slurm job $CJOB serves $COORD; dipaco job $JOB created"

# ---- 3: the worker array; scancel of one task releases its lease
# (--drain-finish-s 0: otherwise a SIGTERM that lands after the first steps were timed finishes
# the round's few remaining steps and pushes them instead, as the partial_push test checks.)
export DIPACO_DATA_DIR=$W/shared/corpus DIPACO_TOKEN_FILE=$DIPACO_STATE_DIR/join.token
unset DIPACO_COORDINATOR
AJOB=$(sbatch --parsable --array=0-2 -c 1 -o "$W/worker-%a.log" "$ROOT_SRC/deploy/slurm/worker.sbatch" \
  --exit-when-done --min-step-ms 600 --poll-ms 500 --drain-finish-s 0)
JOBS+=("$AJOB")
# The victim: the first task that trains (two of the three hold the two slots, one waits).
V=
for _ in $(seq 1 600); do
  for t in 0 1 2; do grep -Eq "lease [0-9]+ pulled" "$W/worker-$t.log" 2>/dev/null && { V=$t; break; }; done
  [ -n "$V" ] && break
  sleep 0.1
done
[ -n "$V" ] || fail "no array task started training"
sleep 0.3
t0=$(date +%s%3N)
scancel "${AJOB}_$V"
wait_for_line "$W/worker-$V.log" "lease [0-9]+: stopping: releasing it at step" 20 || fail "task $V did not release its lease after scancel"
lease=$(sed -n 's/.*lease \([0-9]*\): stopping: releasing it at step.*/\1/p' "$W/worker-$V.log" | head -n 1)
for _ in $(seq 1 100); do [ -z "$(squeue -h -j "${AJOB}_$V" 2>/dev/null)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -j "${AJOB}_$V" 2>/dev/null)" ] || fail "task $V still in the queue after scancel"
grep -q "received SIGTERM" "$W/worker-$V.log" || fail "task $V's worker saw no SIGTERM"
grep -q "grace period of .* over\|second signal" "$W/worker-$V.log" && fail "task $V did not finish within its grace period"
wait_for_line "$W/coordinator.log" "lease $lease released by worker [0-9]+ \(reason 2: worker shutting down\).*slot \(path 0, replica [01]\) round [0-9]+ is free" 10 ||
  fail "the coordinator did not log the release of lease $lease"
slot=$(sed -n "s/.*lease $lease released by worker [0-9]* (reason 2: worker shutting down): slot (path 0, replica \([01]\)) round \([0-9]*\) is free.*/\1 \2/p" "$W/coordinator.log" | head -n 1)
set -- $slot
# The waiting task gets that slot and round at once; without the release it would wait for the
# lease TTL (60 s from the cancelled worker's last call, the release itself).
wait_for_line "$W/coordinator.log" "lease [0-9]+ granted: job $JOB slot \(path 0, replica $1\) round $2 " 55 ||
  fail "slot (0,$1) round $2 was not leased again before the lease TTL"
dt=$(( $(date +%s%3N) - t0 ))
ec=$(scontrol show job "${AJOB}_$V" | sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' | head -n 1)
echo "ok: 3: scancel ${AJOB}_$V: the worker released lease $lease on SIGTERM (Slurm ExitCode $ec); slot (0,$1) round $2 leased again $dt ms after the scancel"

# ---- 4: the other tasks finish the job and leave the queue
for _ in $(seq 1 600); do [ -z "$(squeue -h -j "$AJOB" 2>/dev/null)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -j "$AJOB" 2>/dev/null)" ] || fail "the worker array $AJOB is still queued: $(squeue -h -j "$AJOB")"
"$CTL" --coordinator "$COORD" job show "$JOB" | grep -Eq '^state +DONE' || fail "job $JOB is not DONE"
ledger=$("$CTL" --coordinator "$COORD" job ledger "$JOB")
deltas=$(grep -Ec '^[1-9][0-9]* ' <<<"$ledger" || true)
versions=$(awk '$1 ~ /^[1-9][0-9]*$/ {print $1}' <<<"$ledger" | sort -u | wc -l)
[ "$deltas" = 8 ] && [ "$versions" = 4 ] || fail "the ledger has $deltas deltas in $versions versions, expected 8 in 4"
OTHERS=()
for t in 0 1 2; do [ "$t" = "$V" ] || OTHERS+=("$t"); done
for t in "${OTHERS[@]}"; do
  grep -Eq "pushed [0-9]+ bytes in [0-9]+ ms: accepted" "$W/worker-$t.log" || fail "array task $t pushed no delta"
done
echo "ok: 4: tasks ${OTHERS[*]} (one of them idle until the release) finished job $JOB (DONE, 4 outer steps of 2 deltas each) and left the queue"
# (The time limit's --signal=B:TERM@60 is not checked here: a --time=1 submission of the array
# script ran as an array in a clean-clone CI run and was cancelled before the signal came; the
# scancel path above delivers the same SIGTERM.)
scancel "$CJOB"
for _ in $(seq 1 150); do [ -z "$(squeue -h -j "$CJOB" 2>/dev/null)" ] && break; sleep 0.2; done
[ -z "$(squeue -h -j "$CJOB" 2>/dev/null)" ] || fail "the coordinator job did not end after scancel"
echo "ok: scancel of the coordinator job $CJOB: it stopped"
echo "slurm: OK"
