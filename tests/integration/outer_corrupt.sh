#!/usr/bin/env bash
# outer_corrupt.sh COORDINATOR WORKER DIPACOCTL — a job whose outer step cannot succeed stops
# retrying and says why: the coordinator is held (test hook) right after
# round 0's last delta is acknowledged, one acknowledged delta blob is corrupted on disk, and
# the coordinator resumes. The outer step fails on the blob's checksum, is tried again a few
# times, then the job is PAUSED with a message naming the fragment, the round and the
# checksum failure (`job show`), and no further outer step is attempted while it stays paused.
# Then start-up verification: with a second job past round 1, the coordinator is SIGKILLed and
# that job's current parameter blob is corrupted and its momentum blob removed (a bad disk, a
# careless hand): the restarted coordinator makes the version again from the version before
# it and the deltas its round applied, bit-identically, and the job goes on. With the version before it corrupt too,
# the restarted coordinator pauses the job at start-up with a message naming the fragment, the
# version and the checksum.
# CORRUPT_STORE=s3 (run under tests/s3/with_rgw.sh): the same with the blobs on the RADOS Gateway,
# corrupted and removed there behind the coordinator's back (GET, flip a byte, PUT back; DELETE),
# with the coordinator's blob cache off (--blob-cache-mb 0): with it on, the outer step would
# read the delta its commit verified from memory and never see the damage (test_blobs_s3.c
# checks that).
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
FLAGS=(--lease-ttl-ms 20000)
S3=""
if [ "${CORRUPT_STORE:-local}" = s3 ]; then
  : "${S3_ENDPOINT:?CORRUPT_STORE=s3 runs under tests/s3/with_rgw.sh}"
  S3="$S3_ENDPOINT/dpc-corrupt/run"
  bash "$HERE/../s3/s3curl.sh" -X PUT "$S3_ENDPOINT/dpc-corrupt" >/dev/null
  FLAGS+=(--blob-store s3://dpc-corrupt/run --s3-endpoint "$S3_ENDPOINT" --blob-cache-mb 0)
fi
s3c() { bash "$HERE/../s3/s3curl.sh" "$@"; }
# Blobs by name, wherever they live: flip one byte in the middle of the payload (the header and
# trailer stay well-formed), remove, checksum, test.
flip() {
  local f=$W/blob.tmp
  if [ -n "$S3" ]; then s3c -o "$f" "$S3/$1"; else f=$W/state/blobs/$1; fi
  $PY -c "import sys; b = bytearray(open(sys.argv[1], 'rb').read()); b[len(b) // 2] ^= 0xff; open(sys.argv[1], 'wb').write(b)" "$f"
  if [ -n "$S3" ]; then s3c -X PUT -T "$f" "$S3/$1" >/dev/null; fi
}
blob_rm() { if [ -n "$S3" ]; then s3c -X DELETE "$S3/$1" >/dev/null; else rm "$W/state/blobs/$1"; fi; }
blob_sum() { if [ -n "$S3" ]; then s3c "$S3/$1" | sha256sum; else sha256sum < "$W/state/blobs/$1"; fi; }
blob_there() { if [ -n "$S3" ]; then s3c -I "$S3/$1" >/dev/null 2>&1; else [ -f "$W/state/blobs/$1" ]; fi; }
first_delta() {
  if [ -n "$S3" ]; then
    s3c "$S3_ENDPOINT/dpc-corrupt?list-type=2&prefix=run%2F" | grep -o '<Key>[^<]*\.delta</Key>' | head -1 |
      sed -e 's/<[^>]*>//g' -e 's|^run/||'
  else
    (cd "$W/state/blobs" && find . -name '*.delta' | head -1 | sed 's|^\./||')
  fi
}

make_corpus "$W/corpus"
cat > "$W/spec.json" <<JSON
{"name": "corrupt", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 3},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 2, "inner_steps": 2, "rounds": 3,
 "batch": 2, "seq_len": 16}
JSON
DIPACO_TEST_STOP_AT=push-ack:2 start_coordinator "$W/state" "${FLAGS[@]}"
start_worker w1 "$W/corpus"; W1=$LAST_WORKER_PID
start_worker w2 "$W/corpus"; W2=$LAST_WORKER_PID
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json")
wait_for_line "$W/coordinator.log" "test hook: stopped at push-ack" 60 || { echo "FAIL: never reached push-ack"; exit 1; }
blob=$(first_delta)
[ -n "$blob" ] || { echo "FAIL: no delta blob in the store"; exit 1; }
flip "$blob"
echo "corrupted $blob"
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
# blob_of JOB K KIND: the blob (params or momentum) of fragment 1's current version minus K,
# as the database names it (a newer file may be an uncommitted one that start-up sweeps away).
blob_of() {
  $PY -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT v.' + sys.argv[4] + '_blob FROM fragments f JOIN fragment_versions v ON v.job = f.job AND v.fragment = f.fragment AND v.version = f.version - ? WHERE f.job = ? AND f.fragment = 0', (int(sys.argv[3]), int(sys.argv[2]))).fetchone()[0])" "$W/state/dipaco.db" "$1" "$2" "$3"
}
kill -9 "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
# A corrupt parameter blob and a missing momentum blob: start-up makes the version again from
# the one before it and its deltas, with the checksums its row recorded, and the job goes on.
cur=$(blob_of "$job2" 0 param); mom=$(blob_of "$job2" 0 momentum)
blob_there "$cur" && blob_there "$mom" || { echo "FAIL: no current blobs for job $job2"; exit 1; }
sum_before=$(blob_sum "$cur")
flip "$cur"; blob_rm "$mom"
echo "corrupted job $job2's $cur and removed $mom with the coordinator down"
# The workers are held while the version made again is compared: a round closed in between
# would supersede it and its blobs could be collected before the comparison.
kill -STOP "$W1" "$W2"
restart_coordinator "$W/state" "${FLAGS[@]}"
grep -q "recovery: job $job2 fragment 1 version [0-9]* made again from version" "$W/coordinator.log" ||
  { echo "FAIL: start-up did not make the version again"; tail -20 "$W/coordinator.log"; exit 1; }
[ "$(blob_sum "$cur")" = "$sum_before" ] && blob_there "$mom" ||
  { echo "FAIL: the version made again differs from the one written before"; exit 1; }
kill -CONT "$W1" "$W2"
r0=$("$CTL" --coordinator "$COORD" job show "$job2" --json | sed -n 's/.*"round":\([0-9]*\).*/\1/p')
for _ in $(seq 1 300); do
  "$CTL" --coordinator "$COORD" job show "$job2" --json > "$W/show2.json" 2>/dev/null || true
  r=$(sed -n 's/.*"round":\([0-9]*\).*/\1/p' "$W/show2.json")
  [ "${r:-0}" -ge $((r0 + 2)) ] && break
  sleep 0.1
done
grep -q '"state":"RUNNING"' "$W/show2.json" && [ "${r:-0}" -ge $((r0 + 2)) ] ||
  { echo "FAIL: the job did not go on after the version was made again"; cat "$W/show2.json"; exit 1; }
echo "start-up made the corrupt version again bit-identically (round $r0) and the job went on (round $r)"

# When the version before it is corrupt too, it cannot be made again: start-up pauses the job
# with a message naming the fragment, the version and the checksum.
kill -9 "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
cur=$(blob_of "$job2" 0 param); prev=$(blob_of "$job2" 1 param)
flip "$cur"; flip "$prev"
echo "corrupted job $job2's $cur and $prev with the coordinator down"
restart_coordinator "$W/state" "${FLAGS[@]}"
"$CTL" --coordinator "$COORD" job show "$job2" --json > "$W/show2.json"
"$CTL" --coordinator "$COORD" job show "$job2" | sed -n 3,4p
grep -q '"state":"PAUSED"' "$W/show2.json" && grep -q "paused at start-up: fragment 1 version" "$W/show2.json" &&
  grep -q 'checksum' "$W/show2.json" || { echo "FAIL: start-up did not pause the job with the reason"; cat "$W/show2.json"; exit 1; }
echo "start-up verification paused the job with the reason"
"$CTL" --coordinator "$COORD" job cancel "$job2" >/dev/null
echo "outer_corrupt: PASS"
