#!/usr/bin/env bash
# jobs_s3.sh COORDINATOR WORKER DIPACOCTL — run under tests/s3/with_rgw.sh: a DiLoCo job (outer
# Nesterov, inner state checkpointed), a DiPaCo job (2x2 modules, 4 paths, int8 deltas), a SparseLoCo job, a
# Streaming DiLoCo job (2 fragments, e3m0 deltas, overlapped), an async job (delayed Nesterov) and a
# DiLoCo job whose 12.6 MiB deltas the S3 run puts in 5 MiB parts (--s3-put-part-mb 5) run
# once with blobs under STATE/blobs and once with blobs on the RADOS Gateway, each time on a
# fresh coordinator and two workers; every export of the synchronous jobs must be byte-identical
# between the two stores (the async job's depends on arrival order: it must finish), and the
# S3 run's state directory must hold no blob (and no upload: its models went to the store). Then the coordinator's start-up refusals:
# a bucket that does not exist, wrong credentials, a credentials file others may read, an
# endpoint that is not S3, an https store whose certificate no CA given vouches for, flags that
# contradict each other. Between those two parts, the DiLoCo job again over https. Last, an outage: the gateway is
# killed for a while mid-job; job show, /metrics and the status page say so, leases and outer
# steps wait, and once it is back the job finishes byte-identical to its local run. The S3 runs
# use the coordinator's blob cache (its default), and /metrics shows the outer steps read it.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")/../integration" && pwd)
S3DIR=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
fail() { die_with_logs jobs_s3 40 "$@"; }
: "${S3_ENDPOINT:?run me under tests/s3/with_rgw.sh}"

s3curl() { bash "$S3DIR/s3curl.sh" "$@"; }
s3curl -X PUT "$S3_ENDPOINT/dpc-jobs" >/dev/null || fail "cannot create the test bucket"

cd "$W"
make_corpus "$W/corpus"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out init 2>/dev/null
"$CTL" route fit --model init --data corpus/data/train_000.bin --seq-len 16 --prefix 4 --k 4 --seed 3 --out router \
  >/dev/null 2>&1
paths=$(cd corpus && "$CTL" route assign --router ../router --data data/train_000.bin --seq-len 16 --out routed 2>/dev/null)
INNER='"inner": {"lr": 0.01, "warmup": 2, "lr_min_frac": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
       "eps": 1e-6, "grad_clip": 0.5, "state": "checkpoint"}'
cat > diloco.json <<JSON
{"name": "diloco", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco",
 "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16, $INNER,
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
cat > dipaco.json <<JSON
{"name": "dipaco", "model": {"init": "$W/init"}, "data": {"paths": $paths}, "algorithm": "dipaco",
 "replicas": 1, "inner_steps": 3, "rounds": 2, "batch": 2, "seq_len": 16,
 "levels": [{"stem": true, "layers": [0, 1], "modules": 2}, {"layers": [1, 2], "modules": 2}], $INNER,
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}, "streaming": {"codec": "int8"}}
JSON
sed -e 's/"name": "diloco"/"name": "long"/' -e 's/"rounds": 3/"rounds": 10/' diloco.json > long.json
# A delta object of 12.6 MiB (1 layer, C 512: 3.3M floats): the S3 run puts it in 5 MiB parts.
"$CTL" init --n-layer 1 --n-head 4 --n-embd 512 --n-positions 16 --vocab-size 256 --seed 5 --out init-big 2>/dev/null
cat > big.json <<JSON
{"name": "big", "model": {"init": "$W/init-big"}, "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco",
 "replicas": 2, "inner_steps": 1, "rounds": 2, "batch": 1, "seq_len": 16, "inner": {"lr": 0.01},
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true}}
JSON
cat > sparse.json <<JSON
{"name": "sparse", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco",
 "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16, $INNER,
 "outer": {"lr": 2.0, "momentum": 0, "nesterov": false},
 "sparse": {"density": 0.02, "chunk": 4096, "value_bits": 2, "ef_beta": 0.95}}
JSON
cat > streaming.json <<JSON
{"name": "streaming", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco",
 "replicas": 2, "inner_steps": 4, "rounds": 3, "batch": 2, "seq_len": 16, $INNER,
 "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true},
 "streaming": {"fragments": 2, "overlap_steps": 2, "alpha": 0.5, "codec": "e3m0"}}
JSON
cat > async.json <<JSON
{"name": "async", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco-async",
 "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01, "warmup": 2, "state": "reset"}, "outer": {"rule": "delayed-nesterov", "lr": 0.4, "momentum": 0.7}}
JSON

# run_all STORE [coordinator flags…] — the jobs on a fresh coordinator; exports in $W/STORE.
run_all() {
  local store=$1; shift
  start_coordinator "$W/state-$store" --lease-ttl-ms 20000 "$@"
  start_worker "$store-1" "$W/corpus"; local w1=$LAST_WORKER_PID
  start_worker "$store-2" "$W/corpus"; local w2=$LAST_WORKER_PID
  mkdir -p "$W/$store"
  local jobs=(diloco dipaco sparse streaming async big); [ $store = local ] && jobs+=(long)
  for j in "${jobs[@]}"; do
    local id
    id=$("$CTL" --coordinator "$COORD" job create "$j.json" --data-dir "$W/corpus") || fail "$store: $j refused"
    "$CTL" --coordinator "$COORD" job wait "$id" --timeout 200 >/dev/null || fail "$store: $j did not finish"
    local np=1; [ $j = dipaco ] && np=4
    for p in $(seq 0 $((np - 1))); do
      "$CTL" --coordinator "$COORD" job export "$id" --path $p --out "$W/$store/$j-$p" >/dev/null
    done
    "$CTL" --coordinator "$COORD" job show "$id" --json > "$W/$store/$j.show.json"
  done
  kill -TERM "$w1" "$w2" "$COORD_PID"; wait "$w1" "$w2" "$COORD_PID" 2>/dev/null || true
  echo "$store: ${#jobs[@]} jobs done"
}

S3FLAGS=(--blob-store s3://dpc-jobs/run1 --s3-endpoint "$S3_ENDPOINT")
run_all local
run_all s3 "${S3FLAGS[@]}" --s3-put-part-mb 5
n=0
for f in "$W"/local/{diloco,dipaco,sparse,streaming,big}-*/model.safetensors; do
  g=${f/\/local\//\/s3\/}
  cmp "$f" "$g" || fail "export ${f#$W/local/} differs between the local and the S3 store"
  n=$((n + 1))
done
[ $n = 8 ] || fail "expected 8 exports, compared $n"
[ -s "$W/s3/async-0/model.safetensors" ] || fail "the async job on S3 exported nothing"
echo "8 exports byte-identical between the local and the S3 store; the async job finished on both"
parts=$(cat "$W"/worker-s3-*.log | grep -c "through the object store (3 parts)" || true)
[ "$parts" -ge 4 ] || fail "the big job's deltas were not put in 3 parts each ($parts leases)"
echo "leases that put a delta in 3 parts: $parts"
# On S3 the workers read the parameters from the store through their leases' presigned URLs:
# the coordinator's pull bytes shrink to what replays and fallbacks need.
direct=$(cat "$W"/worker-s3-*.log | grep -c "read from the object store" || true)
[ "$direct" -gt 0 ] || fail "no worker read its parameters from the object store"
out() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['bytes_out'])" "$W/$1/diloco.show.json"; }
echo "leases that read parameters from the store: $direct; the diloco job's bytes through the coordinator: local" \
  "$(out local), S3 $(out s3)"
# 3 rounds x 2 replicas pull 10,944 floats each: all of those bytes must be gone, and so must
# the inner state's (checkpointed: PullInnerState answers where its blobs are, and the workers
# read them from the store), unless a worker fell back to the coordinator's bytes.
[ $(( $(out local) - $(out s3) )) -ge $(( 6 * 10944 * 4 )) ] || fail "the S3 run still pulled parameters through the coordinator"
inner=$(cat "$W"/worker-s3-*.log | grep -c "inner state of fragment [0-9]* read from the object store" || true)
[ "$inner" -gt 0 ] || fail "no worker read a slot's inner state from the object store"
back=$(cat "$W"/worker-s3-*.log | grep -c "reading the inner state from the object store" || true)
# What the coordinator still sends is the answers' URLs (at most 3 x 4 KiB per pull).
[ "$back" -gt 0 ] || [ "$(out s3)" -le $(( inner * 12288 )) ] \
  || fail "the diloco job sent $(out s3) bytes to workers on S3 with no fallback, more than $inner answers of URLs"
echo "inner states read from the store: $inner (fallbacks to the coordinator: $back)"
# Versions other than a lease's own (Streaming DiLoCo's merges, replays' momentum) too.
vers=$(cat "$W"/worker-s3-*.log | grep -c "version [0-9]*'s [a-z]* read from the object store" || true)
[ "$vers" -gt 0 ] || fail "no worker read another version's parameters or momentum from the object store"
echo "other versions' parameters or momentum read from the store: $vers"
# ... and put their fp32 deltas there themselves (PrepareDeltaPut, a presigned PUT, a commit the
# coordinator checks): the bytes it receives shrink by every delta of the DiLoCo job.
put=$(cat "$W"/worker-s3-*.log | grep -c "through the object store" || true)
[ "$put" -gt 0 ] || fail "no worker put its delta in the object store"
bin_() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['bytes_in'])" "$W/$1/diloco.show.json"; }
echo "leases that put their deltas in the store: $put; the diloco job's bytes into the coordinator: local" \
  "$(bin_ local), S3 $(bin_ s3)"
[ $(( $(bin_ local) - $(bin_ s3) )) -ge $(( 6 * 10944 * 4 )) ] || fail "the S3 run still pushed deltas through the coordinator"
# The checkpointed inner state goes the same way (PrepareDeltaPut with its payloads, PUTs, a
# PushInnerState commit the store completes with a copy): with no fallback the DiLoCo job's
# coordinator receives no byte at all, and no put object is left beside the copies.
iput=$(cat "$W"/worker-s3-*.log | grep -c "inner state of [0-9]* fragment(s) put in the object store" || true)
[ "$iput" -gt 0 ] || fail "no worker put its inner state in the object store"
iback=$(cat "$W"/worker-s3-*.log | grep -c "putting the inner state in the object store failed" || true)
[ "$iback" -gt 0 ] || [ "$(bin_ s3)" = 0 ] \
  || fail "the diloco job's coordinator received $(bin_ s3) bytes from workers on S3 with no fallback"
staged=$( (s3curl "$S3_ENDPOINT/dpc-jobs?list-type=2&prefix=run1%2F" || true) | { grep -o -- '-t[0-9]*\.inner[a-z]' || true; } | wc -l)
[ "$staged" = 0 ] || fail "$staged put inner-state object(s) left in the bucket beside their copies"
echo "leases that put their inner state in the store: $iput (fallbacks to the coordinator: $iback)"
# The DiPaCo job's deltas are int8: on S3 each is put as the stream as sent (the coordinator
# decodes and checks it from the store), so with no fallback its coordinator receives nothing.
# So does the Streaming DiLoCo job's, each fragment's e3m0 delta as it syncs, and the SparseLoCo
# job's, each sparse stream as sent.
jbin() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))['bytes_in'])" "$W/$1/$2.show.json"; }
back=$(cat "$W"/worker-s3-*.log | grep -c "putting the .* in the object store failed\|from the object store failed" || true)
for j in dipaco streaming sparse; do
  [ "$(jbin local $j)" -gt 0 ] || fail "the local $j job received no delta bytes"
  [ "$back" -gt 0 ] || [ "$(jbin s3 $j)" = 0 ] || fail "the $j job's coordinator received $(jbin s3 $j) bytes on S3"
done
sput=$(cat "$W"/worker-s3-*.log | grep -o "[1-9][0-9]* fragment delta(s) through the object store" | wc -l)
[ "$sput" -gt 0 ] || fail "no Streaming DiLoCo lease put a fragment's delta in the object store"
echo "bytes into the coordinator: the int8 DiPaCo job local $(jbin local dipaco), S3 $(jbin s3 dipaco); the e3m0" \
  "streaming job local $(jbin local streaming), S3 $(jbin s3 streaming) ($sput leases put fragments); the" \
  "SparseLoCo job local $(jbin local sparse), S3 $(jbin s3 sparse)"
# Sparse pulls (the SparseLoCo job) and replay pulls (the streaming job) read the rounds' streams
# from the store too: the coordinator sends their table and URLs only.
rounds=$(cat "$W"/worker-s3-*.log | grep -c "round of version [0-9]* read from the object store" || true)
[ "$rounds" -gt 0 ] || fail "no worker read a sparse or replay round's streams from the object store"
echo "rounds whose streams workers read from the store: $rounds"
blobs=$(find "$W/state-s3" -type f \( -name '*.params' -o -name '*.momentum' -o -name '*.delta' -o -name '*.sparse' \
  -o -name '*.inner*' -o -name '*.dnbuf' \) | wc -l)
[ "$blobs" = 0 ] || fail "the S3 run left $blobs blob file(s) in its state directory"
keys=$( (s3curl "$S3_ENDPOINT/dpc-jobs?list-type=2&prefix=run1%2F" || true) | grep -o '<Key>' | wc -l)
[ "$keys" -gt 0 ] || fail "nothing was written to the bucket"
echo "the S3 run's state directory holds no blob; the bucket holds $keys objects"
# The models dipacoctl uploaded went to the store (nothing under STATE/uploads), and each job
# that took one removed it.
up=$(grep -c 'upload [0-9]* stored: [0-9]* bytes (in the blob store)' "$W/coordinator.log" || true)
[ "$up" = 6 ] || fail "the S3 run stored $up of its 6 uploads in the store"
[ -z "$(find "$W/state-s3" -path '*uploads*' -type f)" ] || fail "the S3 run left an upload under its state directory"
left=$( (s3curl "$S3_ENDPOINT/dpc-jobs?list-type=2&prefix=run1%2Fuploads%2F" || true) | { grep -o '<Key>' || true; } | wc -l)
[ "$left" = 0 ] || fail "$left upload object(s) left in the bucket after their jobs were created"
echo "the S3 run's 6 uploads went to the store and were removed once their jobs held them"

# https: the same gateway over TLS, its certificate signed by a CA of this run (rgw.sh). The
# coordinator and worker tls-1 are given the CA and move the bytes with the store; worker tls-2
# is not, cannot verify the store, says why and moves its bytes through the coordinator. The
# DiLoCo job must still export byte-identical to its local run.
start_coordinator "$W/state-tls" --lease-ttl-ms 20000 --blob-store s3://dpc-jobs/tls --s3-endpoint "$S3_ENDPOINT_TLS" \
  --s3-ca-file "$S3_CA_FILE"
start_worker tls-1 "$W/corpus" --s3-ca-file "$S3_CA_FILE"; w1=$LAST_WORKER_PID
start_worker tls-2 "$W/corpus"; w2=$LAST_WORKER_PID
id=$("$CTL" --coordinator "$COORD" job create diloco.json --data-dir "$W/corpus") || fail "https: diloco refused"
"$CTL" --coordinator "$COORD" job wait "$id" --timeout 200 >/dev/null || fail "https: diloco did not finish"
"$CTL" --coordinator "$COORD" job export "$id" --path 0 --out "$W/tls-diloco" >/dev/null
kill -TERM "$w1" "$w2" "$COORD_PID"; wait "$w1" "$w2" "$COORD_PID" 2>/dev/null || true
cmp "$W/local/diloco-0/model.safetensors" "$W/tls-diloco/model.safetensors" || fail "https: the export differs from the local run's"
grep -q "blobs are objects under .*https://" "$W/coordinator.log" || fail "https: the coordinator did not use the https endpoint"
grep -q "job $id: [0-9]* blob-cache buffers made ready" "$W/coordinator.log" || fail "no blob-cache buffers made ahead for the job"
grep -q "read from the object store" "$W/worker-tls-1.log" || fail "https: the worker given the CA did not read from the store"
grep -q "through the object store" "$W/worker-tls-1.log" || fail "https: the worker given the CA did not put its deltas in the store"
grep -qi "certificate" "$W/worker-tls-2.log" || fail "https: the worker without the CA did not say why: $(grep -i warn "$W/worker-tls-2.log" | tail -2)"
! grep -q "read from the object store" "$W/worker-tls-2.log" || fail "https: a worker without the CA read from the store"
# ... and after its first failed put it pushes for a minute without trying the store again.
skipped=$(grep -c "failed a put less than a minute ago" "$W/worker-tls-2.log" || true)
[ "$skipped" -gt 0 ] || fail "https: the worker without the CA tried the store for every put"
echo "https: the DiLoCo job byte-identical; the worker with the CA used the store, the one without fell back:" \
  "$(grep -i -m1 "certificate" "$W/worker-tls-2.log" | cut -c1-200)"

# Start-up refusals: each exits non-zero at once with the reason.
refuse() { # WHAT PATTERN FLAGS…
  local what=$1 pat=$2; shift 2
  if timeout 30 "$COORDINATOR_BIN" --listen 127.0.0.1:0 --state-dir "$W/state-bad" "$@" >"$W/bad.log" 2>&1; then
    fail "$what: the coordinator started"
  fi
  grep -q -- "$pat" "$W/bad.log" || fail "$what: unclear message: $(tail -3 "$W/bad.log")"
  echo "refused ($what): $(grep -- "$pat" "$W/bad.log" | head -1 | cut -c1-160)"
}
refuse "missing bucket" "does not exist" --blob-store s3://no-such-bucket --s3-endpoint "$S3_ENDPOINT"
AWS_SECRET_ACCESS_KEY=wrong refuse "wrong secret" "access denied" "${S3FLAGS[@]}"
printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$AWS_ACCESS_KEY_ID" \
  "$AWS_SECRET_ACCESS_KEY" > creds
chmod 644 creds
refuse "credentials readable by others" "chmod 600" "${S3FLAGS[@]}" --s3-credentials creds
refuse "not S3" "S3 endpoint" --blob-store s3://dpc-jobs --s3-endpoint "$NOT_S3"
refuse "https without the store's CA" "certificate" --blob-store s3://dpc-jobs --s3-endpoint "$S3_ENDPOINT_TLS"
refuse "no endpoint" "needs --s3-endpoint" --blob-store s3://dpc-jobs
refuse "endpoint without a store" "need --blob-store" --s3-endpoint "$S3_ENDPOINT"
refuse "a blob cache without a store" "need --blob-store" --blob-cache-mb 64
refuse "parts below S3's 5 MiB" "s3-put-part-mb" "${S3FLAGS[@]}" --s3-put-part-mb 4
refuse "a blob cache as large as the memory budget" "leaves nothing of the memory budget" "${S3FLAGS[@]}" \
  --memory-budget-mb 512 --blob-cache-mb 512
chmod 600 creds
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY "$COORDINATOR_BIN" --listen 127.0.0.1:0 --state-dir "$W/state-creds" \
  "${S3FLAGS[@]}" --s3-credentials creds >"$W/creds.log" 2>&1 &
pid=$!
PIDS+=("$pid")
wait_for_line "$W/creds.log" "blobs are objects under" 20 || fail "a 0600 credentials file was not accepted"
echo "a credentials file of mode 0600 is accepted"

# The outage.
start_coordinator_metrics "$W/state-outage" --lease-ttl-ms 20000 \
  --blob-store s3://dpc-jobs/outage --s3-endpoint "$S3_ENDPOINT"; mport=$MPORT
start_worker o1 "$W/corpus"; start_worker o2 "$W/corpus"
id=$("$CTL" --coordinator "$COORD" job create long.json --data-dir "$W/corpus")
for _ in $(seq 200); do
  r=$("$CTL" --coordinator "$COORD" job show "$id" --json | sed -n 's/.*"round":\([0-9]*\).*/\1/p')
  [ "${r:-0}" -ge 3 ] && break; sleep 0.1
done
bash "$S3DIR/rgw.sh" stop-gw "$RGW_DIR"
t0=$(date +%s)
held=""
for _ in $(seq 300); do
  held=$("$CTL" --coordinator "$COORD" job show "$id" 2>/dev/null | grep -o "waiting for the blob store.*" || true)
  [ -n "$held" ] && break; sleep 0.1
done
[ -n "$held" ] || fail "job show does not say that the blob store is down"
echo "job show during the outage: $held" | cut -c1-200
# (each page read whole first: grep -q ending early would fail the pipeline under pipefail)
page() { curl -sf "http://127.0.0.1:$mport/${1:-}" || true; }
grep -q "^dipaco_blob_store_up 0" <<<"$(page metrics)" || fail "/metrics: dipaco_blob_store_up is not 0"
grep -q '"up":false' <<<"$(page api/status)" || fail "status page: the store is not shown down"
grep -q "blob store is unavailable" <<<"$(page)" || fail "status page: no outage banner"
r_down=$("$CTL" --coordinator "$COORD" job show "$id" --json | sed -n 's/.*"round":\([0-9]*\).*/\1/p')
sleep 4
r_later=$("$CTL" --coordinator "$COORD" job show "$id" --json | sed -n 's/.*"round":\([0-9]*\).*/\1/p')
[ "$r_down" = "$r_later" ] || fail "rounds went on while the store was down ($r_down -> $r_later)"
bash "$S3DIR/rgw.sh" start-gw "$RGW_DIR"
echo "gateway back after $(( $(date +%s) - t0 )) s; the job stood at round $r_down"
"$CTL" --coordinator "$COORD" job wait "$id" --timeout 200 >/dev/null || fail "the job did not finish after the outage"
"$CTL" --coordinator "$COORD" job export "$id" --path 0 --out "$W/outage" >/dev/null
cmp "$W/local/long-0/model.safetensors" "$W/outage/model.safetensors" \
  || fail "the job that lived through the outage differs from its local run"
grep -q "^dipaco_blob_store_up 1" <<<"$(page metrics)" || fail "/metrics: the store is not up again"
grep -q "^dipaco_blob_store_outages_total [1-9]" <<<"$(page metrics)" || fail "no outage counted"
grep -q '^dipaco_blob_store_bytes_total{direction="sent"} [1-9]' <<<"$(page metrics)" || fail "no bytes sent to the store counted"
# The outer steps read θ, u and the checked deltas from the blob cache, not the gateway.
grep -q '^dipaco_blob_cache_hit_bytes_total [1-9]' <<<"$(page metrics)" || fail "the outer steps never read the blob cache"
grep -q '^dipaco_blob_cache_bytes{state="resident"} [1-9]' <<<"$(page metrics)" || fail "the blob cache holds nothing"
# Round after round the same lengths come back: fills take freed buffers, not fresh memory.
grep -q '^dipaco_blob_cache_reuses_total [1-9]' <<<"$(page metrics)" || fail "no cache fill reused a freed buffer"
grep -q "blob store available again" "$W/coordinator.log" || fail "the end of the outage was not logged"
echo "outage: the job waited, resumed and finished byte-identical to its local run"
