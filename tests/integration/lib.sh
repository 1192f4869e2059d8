# lib.sh — shared helpers for the daemon integration tests (sourced): free ports, starting
# the coordinator and workers as real processes on loopback, waiting, and cleaning up every
# process the test started (also on failure).
PY=${DPC_PYTHON:-python3}
PIDS=()
cleanup() {
  local rc=$?
  set +e
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  # Give them the chance to exit cleanly (the daemons finish on SIGTERM; valgrind runs need
  # the time to write their reports), then make sure nothing is left behind.
  for _ in $(seq 1 ${CLEANUP_WAIT_TENTHS:-50}); do
    alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  if [ -n "${W:-}" ] && [ -z "${KEEP:-}" ]; then rm -rf "$W"; fi
  exit $rc
}
trap cleanup EXIT

# die_with_logs WHAT LINES MSG... — print "WHAT: FAIL: MSG" and the last LINES lines of every
# log of the test ($W/*.log), then exit 1. Tests define their fail() on top of it.
die_with_logs() {
  local what=$1 lines=$2 f
  shift 2
  echo "$what: FAIL: $*"
  for f in "$W"/*.log; do [ -f "$f" ] && { echo "---- $f"; tail -n "$lines" "$f"; }; done
  exit 1
}

free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# use_tokens STATE_DIR — export the cluster tokens the coordinator created there
# (STATE/join.token, STATE/admin.token): dipaco-worker reads $DIPACO_JOIN_TOKEN and dipacoctl
# $DIPACO_ADMIN_TOKEN, so every later worker and dipacoctl call of the test authenticates.
use_tokens() {
  [ -s "$1/join.token" ] && [ -s "$1/admin.token" ] || return 1
  DIPACO_JOIN_TOKEN=$(cat "$1/join.token"); DIPACO_ADMIN_TOKEN=$(cat "$1/admin.token")
  export DIPACO_JOIN_TOKEN DIPACO_ADMIN_TOKEN
}

# start_coordinator STATE_DIR [extra flags...] — sets COORD (host:port) and COORD_PID, and
# exports the coordinator's tokens (use_tokens).
start_coordinator() {
  local port; port=$(free_port)
  COORD=127.0.0.1:$port
  launch_coordinator "$@"
}

# start_coordinator_metrics STATE_DIR [extra flags...] — start_coordinator with /metrics on a
# free loopback port, MPORT (and URL=http://127.0.0.1:MPORT). A port free_port found can be taken
# by a test running beside this one before the coordinator binds it: a start that finds either
# of its ports in use is tried again on fresh ones.
start_coordinator_metrics() {
  local i n
  for i in 1 2 3 4 5; do
    MPORT=$(free_port); URL=http://127.0.0.1:$MPORT
    n=0; if [ -f "$W/coordinator.log" ]; then n=$(wc -l < "$W/coordinator.log"); fi
    start_coordinator "$@" --metrics-listen "127.0.0.1:$MPORT" >"$W/start.out" 2>&1 && return 0
    tail -n +$((n + 1)) "$W/coordinator.log" | grep -q "address already in use" || break
  done
  cat "$W/start.out"; return 1
}

# restart_coordinator STATE_DIR [extra flags...] — start it again on the same address ($COORD),
# e.g. after a SIGKILL, so that running workers find it where they left it. The port can stay
# busy for a moment after the old process died: a start that fails is tried again.
restart_coordinator() {
  for _ in $(seq 1 20); do
    launch_coordinator "$@" 2>/dev/null && return 0
    kill -0 "$COORD_PID" 2>/dev/null && break
    sleep 0.25
  done
  echo "coordinator did not come back on $COORD"; tail -20 "$W/coordinator.log"; return 1
}

# launch_coordinator STATE_DIR [extra flags...] — start it on $COORD and wait until it answers.
launch_coordinator() {
  local state=$1; shift
  "$COORDINATOR_BIN" --listen "$COORD" --state-dir "$state" "$@" >>"$W/coordinator.log" 2>&1 &
  COORD_PID=$!
  PIDS+=("$COORD_PID")
  for _ in $(seq 1 100); do
    use_tokens "$state" && "$CTL" --coordinator "$COORD" status >/dev/null 2>&1 && return 0
    kill -0 "$COORD_PID" 2>/dev/null || { echo "coordinator exited:"; tail -20 "$W/coordinator.log"; return 1; }
    sleep 0.1
  done
  echo "coordinator did not come up on $COORD"; tail -20 "$W/coordinator.log"; return 1
}

# wait_for_line FILE REGEX SECONDS — wait until FILE has a line matching REGEX (grep -E).
wait_for_line() {
  local i
  for i in $(seq 1 $(( $3 * 20 ))); do
    grep -Eq "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# kill_wait PID... — SIGKILL and reap (no-op for processes already gone).
kill_wait() {
  local p
  for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}

# start_worker NAME DATA_DIR [extra flags...] — appends to PIDS, sets LAST_WORKER_PID.
start_worker() {
  local name=$1 data=$2; shift 2
  "$WORKER_BIN" --coordinator "$COORD" --data-dir "$data" --name "$name" --threads 1 "$@" >>"$W/worker-$name.log" 2>&1 &
  LAST_WORKER_PID=$!
  PIDS+=("$LAST_WORKER_PID")
}

# make_corpus DIR — a small English corpus tokenized with the byte tokenizer into DIR/data.
make_corpus() {
  local d=$1
  mkdir -p "$d"
  for i in $(seq 1 300); do echo "We hold these truths to be self-evident, number $i; the union is strong and free."; done > "$d/text.txt"
  "$CTL" data prepare --tokenizer byte --out "$d/data" --val-fraction 0.1 "$d/text.txt" 2>/dev/null
}
