#!/usr/bin/env bash
# ops_cli.sh COORDINATOR WORKER DIPACOCTL — dipacoctl's live views of a real
# job. `job watch` prints plain lines when stdout is not a terminal (rounds only move forward,
# the last line is DONE 12/12) and redraws one screen on a terminal (a pty from Debian
# bsdutils' `script`): round bar, loss sparkline, tokens/s, bytes, ETA, workers; it exits 3 at
# --timeout. `job wait` draws a progress bar on a terminal and keeps its plain lines
# otherwise. `job plot --out FILE.svg` draws the job's loss against inner steps and against
# bytes exchanged, checked against the coordinator's own history (/api/status) and totals
# (job show) by ops_check.py plot.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
source "$HERE/ops_lib.sh"
fail() { die_with_logs ops_cli 30 "$@"; }

need script bsdutils
ROUNDS=12
ops_setup
ops_spec "$W/spec.json" cli-demo diloco 2 $ROUNDS
ops_spec "$W/held.json" cli-held diloco 1 5
start_coordinator_metrics "$W/state" || fail "coordinator"
C=("$CTL" --coordinator "$COORD")
job=$("${C[@]}" job create "$W/spec.json" 2>>"$W/ctl.log") || fail "job create"
# Three watchers at once, before any worker: plain lines, a terminal screen, a progress bar.
"${C[@]}" job watch "$job" --poll-ms 100 > "$W/watch.txt" 2>"$W/watch.err" & wpid=$!
script -qfec "$(printf '%q ' "${C[@]}" job watch "$job" --poll-ms 100)" /dev/null > "$W/watch-tty.txt" 2>&1 & tpid=$!
script -qfec "$(printf '%q ' "${C[@]}" job wait "$job" --poll-ms 100)" /dev/null > "$W/wait-tty.txt" 2>&1 & bpid=$!
"${C[@]}" job wait "$job" --poll-ms 100 > "$W/wait.txt" 2>"$W/wait.err" & ppid=$!
PIDS+=($wpid $tpid $bpid $ppid)
sleep 0.5
start_worker w1 "$W/corpus" --min-step-ms 40
start_worker w2 "$W/corpus" --min-step-ms 40
for p in $wpid $tpid $bpid $ppid; do wait $p || fail "a watcher (pid $p) exited $?"; done

# job watch, not a terminal: one plain line per change, no escape codes.
! grep -q $'\033' "$W/watch.txt" || fail "job watch wrote escape codes into a pipe"
$PY - "$W/watch.txt" "$job" $ROUNDS <<'PY' || fail "job watch's plain lines: $(cat "$W/watch.txt")"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
job, R = sys.argv[2], int(sys.argv[3])
rx = re.compile(r"job %s (PENDING|RUNNING|DONE) round (\d+)/%d loss (\S+)( trend [-+][0-9.]+/\d+)? tokens/s (\d+) "
                r"bytes_in (.+) bytes_out (.+) eta (\S+) workers (\d+)/(\d+)$" % (job, R))
m = [rx.match(l) for l in lines]
assert lines and all(m), [l for l, x in zip(lines, m) if not x]
rounds = [int(x.group(2)) for x in m]
assert rounds == sorted(rounds) and len(set(rounds)) >= 4, rounds
assert m[-1].group(1) == "DONE" and rounds[-1] == R, lines[-1]
assert any(int(x.group(5)) > 0 for x in m) and any(x.group(4) for x in m), "no tokens/s or loss trend ever shown"
assert any(x.group(1) == "RUNNING" and int(x.group(9)) > 0 for x in m), "never saw a training worker"
print("ok: job watch (pipe): %d lines, rounds %s" % (len(lines), rounds))
PY
# job watch on a terminal: the screen redrawn, the trend as a sparkline.
grep -q $'\033\[H\033\[2J' "$W/watch-tty.txt" || fail "job watch on a terminal does not redraw the screen"
grep -q "round     $ROUNDS/$ROUNDS  \[#" "$W/watch-tty.txt" || fail "job watch on a terminal: no full round bar"
grep -q '[▁▂▃▄▅▆▇█]' "$W/watch-tty.txt" || fail "job watch on a terminal: no loss sparkline"
grep -Eq 'tokens/s  [0-9]+ +rounds/s [0-9.]+ +ETA ' "$W/watch-tty.txt" || fail "job watch on a terminal: no rates/ETA"
grep -Eq 'workers   [0-9]+ training' "$W/watch-tty.txt" || fail "job watch on a terminal: no workers"
echo "ok: job watch (terminal): $(grep -c $'\033\[H' "$W/watch-tty.txt") screens"
# job wait: a bar on a terminal, the plain lines otherwise.
grep -Eq $'\r'"job $job DONE +\[#{30}\] $ROUNDS/$ROUNDS rounds \(100%\)" "$W/wait-tty.txt" || fail "job wait on a terminal: no full progress bar: $(tail -c 400 "$W/wait-tty.txt" | cat -v)"
grep -q "^job $job: DONE round $ROUNDS/$ROUNDS" "$W/wait.err" && grep -qx "job $job DONE" "$W/wait.txt" \
  || fail "job wait off a terminal changed: $(cat "$W/wait.err" "$W/wait.txt")"
! grep -q '\[#' "$W/wait.err" || fail "job wait drew a bar into a pipe"
echo "ok: job wait: a progress bar on a terminal, plain lines in a pipe"

# job plot, checked against the coordinator's history and totals.
"${C[@]}" job plot "$job" --out "$W/loss.svg" > "$W/plot.txt" 2>>"$W/ctl.log" || fail "job plot"
curl -sf "http://127.0.0.1:$MPORT/api/status" > "$W/status.json" || fail "GET /api/status"
"${C[@]}" job show "$job" --json > "$W/show.json" 2>>"$W/ctl.log" || fail "job show"
$PY "$HERE/ops_check.py" plot "$W/loss.svg" "$W/status.json" "$W/show.json" || fail "the plot"
! grep -qiE '<script|href=|src=' "$W/loss.svg" || fail "the SVG refers to something outside it"
set +e
"${C[@]}" job plot "$job" > /dev/null 2>"$W/usage.txt"; rc=$?
set -e
[ $rc = 2 ] && grep -q -- "--out" "$W/usage.txt" || fail "job plot without --out: exit $rc, $(cat "$W/usage.txt")"

# --timeout: a job held paused never ends: watch gives up with exit 3.
held=$("${C[@]}" job create "$W/held.json" --paused 2>>"$W/ctl.log") || fail "job create --paused"
set +e
"${C[@]}" job watch "$held" --timeout 1 --poll-ms 100 > "$W/held.txt" 2>&1; rc=$?
set -e
[ $rc = 3 ] || fail "job watch --timeout 1 on a paused job: exit $rc ($(cat "$W/held.txt"))"
grep -q "job $held PAUSED round 0/5" "$W/held.txt" || fail "job watch of a paused job: $(cat "$W/held.txt")"
"${C[@]}" job cancel "$held" >/dev/null 2>>"$W/ctl.log"
echo "ops_cli: PASS"
