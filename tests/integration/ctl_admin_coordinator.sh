#!/usr/bin/env bash
# ctl_admin_coordinator.sh — dipacoctl's admin commands against a real dipaco-coordinator on
# loopback (no workers): job create with an uploaded initial model (spec "init" relative to
# the spec file), list/show/pause/resume/cancel/wait, paths/modules/workers/status, export of
# the untrained job equal tensor by tensor to the initial model and byte-identical between two
# exports, NOT_FOUND and timeout exit codes, job wait across a coordinator restart, and a
# clean SIGTERM shutdown.
#
# usage: ctl_admin_coordinator.sh <dipacoctl> <dipaco-coordinator>
set -u
CTL=$(realpath "$1")
COORD=$(realpath "$2")
PY=${DPC_PYTHON:-python3}
TMP=$(mktemp -d /tmp/dpc_ctl_coord.XXXXXX)
FAILS=0
CPID=
cleanup() {
  if [ -n "$CPID" ]; then kill "$CPID" 2>/dev/null; wait "$CPID" 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
expect() { # expect WHAT CMD... : CMD must succeed
  local what=$1; shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}

PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export DIPACO_COORDINATOR=127.0.0.1:$PORT
unset DIPACO_ADMIN_TOKEN
# Leftovers in the uploads directory: an upload nobody claimed for two days and a temp file
# of an interrupted upload go at start-up; a recent unclaimed upload stays (its client may
# still create the job), and upload ids continue after it.
mkdir -p "$TMP/state/uploads"
echo old > "$TMP/state/uploads/7.safetensors"; touch -d '2 days ago' "$TMP/state/uploads/7.safetensors"
echo new > "$TMP/state/uploads/8.safetensors"
echo tmp > "$TMP/state/uploads/9.safetensors.tmp.1.1"
"$COORD" --listen "127.0.0.1:$PORT" --state-dir "$TMP/state" >"$TMP/coord.log" 2>&1 &
CPID=$!
for _ in $(seq 300); do
  # The coordinator creates its admin token at first start; dipacoctl reads $DIPACO_ADMIN_TOKEN.
  [ -s "$TMP/state/admin.token" ] && DIPACO_ADMIN_TOKEN=$(cat "$TMP/state/admin.token") && export DIPACO_ADMIN_TOKEN
  "$CTL" status >/dev/null 2>&1 && break
  kill -0 "$CPID" 2>/dev/null || break
  sleep 0.1
done
if ! "$CTL" status >"$TMP/status.txt" 2>&1; then
  echo "FAIL: coordinator did not come up"; cat "$TMP/status.txt"; tail -30 "$TMP/coord.log"; exit 1
fi
ok "coordinator is up: $(head -1 "$TMP/status.txt")"

# --- job create with an initial model, from another cwd.
mkdir -p "$TMP/spec"
"$CTL" init --n-layer 2 --n-head 2 --n-embd 32 --n-positions 64 --vocab-size 128 --seed 11 \
  --out "$TMP/spec/init0" >/dev/null 2>&1 || { echo "FAIL: dipacoctl init"; exit 1; }
cat >"$TMP/spec/job.json" <<'EOF'
{"name": "ctl-int", "model": {"init": "init0"}, "data": {"train": ["train.bin"]},
 "algorithm": "diloco", "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.002, "warmup": 1}, "outer": {"lr": 0.6, "momentum": 0.85}}
EOF
ID=$(cd / && "$CTL" job create "$TMP/spec/job.json" 2>"$TMP/create.err")
rc=$?
if [ $rc -eq 0 ] && [[ "$ID" =~ ^[0-9]+$ ]]; then ok "job create → id $ID"; else
  bad "job create (rc $rc, out '$ID')"; cat "$TMP/create.err"; tail -30 "$TMP/coord.log"; exit 1
fi

left=$(cd "$TMP/state/uploads" && ls | tr '\n' ' ')
expect "uploads: the job consumed its upload, start-up removed the stale and unfinished ones ($left)" \
  test "$left" = "8.safetensors "
"$CTL" job list --json >"$TMP/list.json" && "$CTL" job show "$ID" --json >"$TMP/show.json"
expect "job list / show --json describe the job" $PY - "$TMP/list.json" "$TMP/show.json" "$ID" <<'EOF'
import json, sys
jobs = json.load(open(sys.argv[1]))["jobs"]
show = json.load(open(sys.argv[2]))
i = int(sys.argv[3])
assert [j["job_id"] for j in jobs] == [i], jobs
j = jobs[0]
assert j["name"] == "ctl-int" and j["algorithm"] == "sync" and j["rounds_total"] == 3, j
assert j["replicas"] == 2 and j["paths"] == 1 and j["state"] in ("PENDING", "RUNNING"), j
sp = show["spec"]
assert show["job_id"] == i and sp is not None, show
assert sp["model"]["n_layer"] == 2 and sp["model"]["n_embd"] == 32 and sp["model"]["vocab_size"] == 128, sp
assert sp["inner"]["lr"] == 0.002 and sp["inner"]["warmup"] == 1, sp
assert sp["outer"]["lr"] == 0.6 and sp["outer"]["momentum"] == 0.85, sp
EOF
"$CTL" job show "$ID" >"$TMP/show.txt"
expect "job show (table) lists inner and outer hyperparameters" \
  grep -Eq '^outer.momentum +0.85$' "$TMP/show.txt"

# --- structure listings of the untrained job.
"$CTL" paths "$ID" --json >"$TMP/paths.json" && "$CTL" modules "$ID" --json >"$TMP/modules.json"
expect "paths / modules --json: one path of one module at version 0, two slots" \
  $PY - "$TMP/paths.json" "$TMP/modules.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["paths"]
m = json.load(open(sys.argv[2]))["modules"]
assert len(p) == 1 and p[0]["path"] == 0 and len(p[0]["modules"]) == 1, p
assert sorted(s["replica"] for s in p[0]["slots"]) == [0, 1], p
assert len(m) == 1 and all(f["version"] == 0 for f in m[0]["fragments"]), m
# n_params of L=2, C=32, maxT=64, V=128
C, L, V, T = 32, 2, 128, 64
n = V * C + T * C + 2 * C + L * (12 * C * C + 13 * C)
assert m[0]["num_floats"] == n, (m[0]["num_floats"], n)
EOF
expect "paths (table)" "$CTL" paths "$ID"
expect "modules (table)" "$CTL" modules "$ID"
expect "workers (table, none registered)" "$CTL" workers
"$CTL" status --json >"$TMP/status.json"
expect "status --json: SERVING, one job, no workers" $PY - "$TMP/status.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["health"] == "SERVING" and s["jobs"]["total"] == 1 and s["workers"]["total"] == 0, s
EOF

# --- export of the untrained job equals the initial model; two exports are byte-identical.
"$CTL" job export "$ID" --path 0 --out "$TMP/exp1" >/dev/null 2>"$TMP/exp.err" &&
  "$CTL" job export "$ID" --path 0 --out "$TMP/exp2" --json >"$TMP/exp2.json" 2>>"$TMP/exp.err"
rc=$?
if [ $rc -eq 0 ]; then ok "job export twice"; else bad "job export"; cat "$TMP/exp.err"; fi
expect "the two exports are byte-identical" \
  cmp -s "$TMP/exp1/model.safetensors" "$TMP/exp2/model.safetensors"
expect "the two config.json are byte-identical" cmp -s "$TMP/exp1/config.json" "$TMP/exp2/config.json"
expect "export equals the initial model tensor by tensor" \
  $PY - "$TMP/spec/init0" "$TMP/exp1" <<'EOF'
import json, struct, sys
def load(d):
    b = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        assert v["dtype"] == "F32", v
        s, e = v["data_offsets"]
        out[k.removeprefix("transformer.")] = (tuple(v["shape"]), b[8 + n + s:8 + n + e])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
for k in a:
    assert a[k] == b[k], k
ca = json.load(open(sys.argv[1] + "/config.json"))
cb = json.load(open(sys.argv[2] + "/config.json"))
for k in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
    assert ca[k] == cb[k], (k, ca[k], cb[k])
EOF

# A shape-only job starts from gpt_init_params(seed): its export (17 MB, several 4 MiB chunks)
# is byte-identical to what the offline `dipacoctl init` writes for the same shape and seed.
cat >"$TMP/spec/big.json" <<'EOF'
{"name": "ctl-big", "model": {"n_layer": 4, "n_head": 4, "n_embd": 256, "n_positions": 256,
 "vocab_size": 4096, "seed": 17}, "data": {"train": ["train.bin"]}, "algorithm": "diloco",
 "replicas": 1, "inner_steps": 1, "rounds": 1, "batch": 1, "seq_len": 8}
EOF
BIG=$("$CTL" job create "$TMP/spec/big.json" --paused)
"$CTL" init --n-layer 4 --n-head 4 --n-embd 256 --n-positions 256 --vocab-size 4096 --seed 17 \
  --out "$TMP/bigref" >/dev/null 2>&1
"$CTL" job export "$BIG" --path 0 --out "$TMP/bigexp" >/dev/null 2>"$TMP/exp.err" ||
  { bad "export of the shape-only job"; cat "$TMP/exp.err"; }
expect "shape-only job export == dipacoctl init (same seed), weights" \
  cmp -s "$TMP/bigexp/model.safetensors" "$TMP/bigref/model.safetensors"
expect "shape-only job export == dipacoctl init (same seed), config.json" \
  cmp -s "$TMP/bigexp/config.json" "$TMP/bigref/config.json"
"$CTL" job cancel "$BIG" >/dev/null

# --- state changes and exit codes.
out=$("$CTL" job pause "$ID")
[ "$out" = "job $ID PAUSED" ] && ok "job pause" || bad "job pause ($out)"
out=$("$CTL" job show "$ID" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["state"])')
[ "$out" = "PAUSED" ] && ok "job show after pause: PAUSED" || bad "job show after pause ($out)"
out=$("$CTL" job resume "$ID")
case "$out" in "job $ID RUNNING" | "job $ID PENDING") ok "job resume ($out)" ;; *) bad "job resume ($out)" ;; esac
"$CTL" job wait "$ID" --timeout 0.5 >/dev/null 2>"$TMP/wait.err"
rc=$?
[ $rc -eq 3 ] && ok "job wait --timeout on a job without workers → 3" || { bad "job wait timeout (rc $rc)"; cat "$TMP/wait.err"; }
# job wait rides out a coordinator restart (UNAVAILABLE is retried, not fatal).
"$CTL" job wait "$ID" --timeout 60 --poll-ms 100 >"$TMP/rwait.out" 2>"$TMP/rwait.err" &
WPID=$!
sleep 0.5
kill -TERM "$CPID"; wait "$CPID"; CPID=
sleep 0.5
"$COORD" --listen "127.0.0.1:$PORT" --state-dir "$TMP/state" >>"$TMP/coord.log" 2>&1 &
CPID=$!
for _ in $(seq 300); do "$CTL" status >/dev/null 2>&1 && break; sleep 0.1; done
out=$("$CTL" job show "$ID" --json | $PY -c 'import json,sys; d=json.load(sys.stdin); print(d["state"], d["spec"]["outer"]["lr"])')
[ "$out" = "RUNNING 0.6" ] && ok "job survives a coordinator restart ($out)" || bad "job after restart ($out)"
kill -0 "$WPID" 2>/dev/null && ok "job wait still waiting across the restart" || bad "job wait ended during the restart"
grep -q "still waiting" "$TMP/rwait.err" && ok "job wait says the coordinator is unreachable" ||
  { bad "job wait restart note"; cat "$TMP/rwait.err"; }
out=$("$CTL" job cancel "$ID")
[ "$out" = "job $ID CANCELLED" ] && ok "job cancel" || bad "job cancel ($out)"
wait "$WPID"
rc=$?
[ $rc -eq 1 ] && grep -q "job $ID CANCELLED" "$TMP/rwait.out" && ok "the waiting job wait sees CANCELLED → 1" ||
  { bad "job wait across restart (rc $rc)"; cat "$TMP/rwait.out" "$TMP/rwait.err"; }
"$CTL" job wait "$ID" --timeout 10 >"$TMP/wait.out" 2>"$TMP/wait.err"
rc=$?
[ $rc -eq 1 ] && grep -q CANCELLED "$TMP/wait.out" && ok "job wait of a cancelled job → 1" ||
  { bad "job wait cancelled (rc $rc)"; cat "$TMP/wait.out" "$TMP/wait.err"; }
err=$("$CTL" job show 99999 2>&1 >/dev/null)
rc=$?
[ $rc -eq 1 ] && [[ "$err" == "dipacoctl job show: NOT_FOUND: "* ]] && ok "job show unknown → NOT_FOUND ($err)" ||
  bad "job show unknown (rc $rc: $err)"

# --- shutdown.
kill -TERM "$CPID"
wait "$CPID"
rc=$?
CPID=
[ $rc -eq 0 ] && ok "coordinator exits 0 on SIGTERM" || bad "coordinator exit status $rc"

if [ $FAILS -ne 0 ]; then
  echo "--- coordinator log (tail) ---"; tail -40 "$TMP/coord.log"
  echo "$FAILS failure(s)"; exit 1
fi
echo "all passed"
