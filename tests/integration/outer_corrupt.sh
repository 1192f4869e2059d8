#!/usr/bin/env bash
# outer_corrupt.sh COORDINATOR WORKER DIPACOCTL — a job whose outer step cannot succeed stops
# retrying and says why (issue 13, finding 7): the coordinator is held (test hook) right after
# round 0's last delta is acknowledged, one acknowledged delta blob is corrupted on disk, and
# the coordinator resumes. The outer step fails on the blob's checksum, is tried again a few
# times, then the job is PAUSED with a message naming the fragment, the round and the
# checksum failure (`job show`), and no further outer step is attempted while it stays paused.
# Then start-up verification: with a second job past round 1, the coordinator is SIGKILLed,
# that job's current parameter blob is corrupted, and the restarted coordinator pauses the job
# at start-up with a message naming the fragment, the version and the checksum.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"

make_corpus "$W/corpus"
cat > "$W/spec.json" <<JSON
{"name": "corrupt", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 3},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 2, "rounds": 3,
 "batch": 2, "seq_len": 16}
JSON
DIPACO_TEST_STOP_AT=push-ack:2 start_coordinator "$W/state" --lease-ttl-ms 20000
start_worker w1 "$W/corpus"
start_worker w2 "$W/corpus"
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
wait_for_line "$W/coordinator.log" "test hook: stopped at push-ack" 60 || { echo "FAIL: never reached push-ack"; exit 1; }
blob=$(find "$W/state/blobs" -name '*.delta' | head -1)
[ -n "$blob" ] || { echo "FAIL: no delta blob on disk"; exit 1; }
# Flip one byte in the middle of the payload (the header and trailer stay well-formed).
size=$(stat -c %s "$blob")
printf '\xff' | dd of="$blob" bs=1 seek=$((size / 2)) conv=notrunc status=none
echo "corrupted $(basename "$blob") ($size bytes)"
kill -CONT "$COORD_PID"
for _ in $(seq 1 100); do
  "$CTL" --coordinator "$COORD" job show "$job" --json > "$W/show.json" 2>/dev/null || true
  grep -q '"state":"PAUSED"' "$W/show.json" && break
  sleep 0.2
done
"$CTL" --coordinator "$COORD" job show "$job" | sed -n 1,6p
grep -q '"state":"PAUSED"' "$W/show.json" || { echo "FAIL: job not paused"; tail -20 "$W/coordinator.log"; exit 1; }
grep -q 'outer step of fragment 1 round 0 failed repeatedly' "$W/show.json" &&
  grep -q 'checksum' "$W/show.json" || { echo "FAIL: the message does not say why"; cat "$W/show.json"; exit 1; }
tries=$(grep -c "outer step failed" "$W/coordinator.log")
sleep 3
[ "$(grep -c "outer step failed" "$W/coordinator.log")" -eq "$tries" ] ||
  { echo "FAIL: the outer step is still retried while paused"; exit 1; }
echo "the job is PAUSED after $tries failed outer steps, with the reason; no retry while paused"
"$CTL" --coordinator "$COORD" job cancel "$job" >/dev/null

sed -e 's/"name": "corrupt"/"name": "corrupt2"/' -e 's/"rounds": 3/"rounds": 200/' "$W/spec.json" > "$W/spec2.json"
job2=$("$CTL" --coordinator "$COORD" job create "$W/spec2.json")
for _ in $(seq 1 300); do
  "$CTL" --coordinator "$COORD" job show "$job2" --json > "$W/show2.json" 2>/dev/null || true
  r=$(sed -n 's/.*"round":\([0-9]*\).*/\1/p' "$W/show2.json")
  [ "${r:-0}" -ge 2 ] && break
  sleep 0.1
done
kill -9 "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
# The current version's blob, as the database names it (a newer file may be an uncommitted one
# that start-up sweeps away).
cur=$($PY -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT v.param_blob FROM fragments f JOIN fragment_versions v ON v.job = f.job AND v.fragment = f.fragment AND v.version = f.version WHERE f.job = ? AND f.fragment = 0', (int(sys.argv[2]),)).fetchone()[0])" "$W/state/dipaco.db" "$job2")
pblob="$W/state/blobs/$cur"
[ -f "$pblob" ] || { echo "FAIL: no parameter blob for job $job2"; exit 1; }
size=$(stat -c %s "$pblob")
printf '\x7f' | dd of="$pblob" bs=1 seek=$((size / 2)) conv=notrunc status=none
echo "corrupted job $job2's $cur with the coordinator down"
restart_coordinator "$W/state" --lease-ttl-ms 20000
"$CTL" --coordinator "$COORD" job show "$job2" --json > "$W/show2.json"
"$CTL" --coordinator "$COORD" job show "$job2" | sed -n 3,4p
grep -q '"state":"PAUSED"' "$W/show2.json" && grep -q "paused at start-up: fragment 1 version" "$W/show2.json" &&
  grep -q 'checksum' "$W/show2.json" || { echo "FAIL: start-up did not pause the job with the reason"; cat "$W/show2.json"; exit 1; }
echo "start-up verification paused the job with the reason"
"$CTL" --coordinator "$COORD" job cancel "$job2" >/dev/null
echo "outer_corrupt: PASS"
