#!/usr/bin/env bash
# images.sh COORDINATOR WORKER DIPACOCTL — the container images are complete: the root file
# systems deploy/image_rootfs.sh assembles (what deploy/Containerfile.worker and
# deploy/Containerfile.coordinator ship, FROM scratch) run a coordinator and a worker that
# finish a tiny DiLoCo job.
#  1. each tree holds its two binaries and exactly the libraries ldd lists for them (no
#     shell; besides /usr only /etc/passwd, /etc/group, /etc/nsswitch.conf and the binaries);
#  2. both run as uid 10001 under `unshare --net --pid --mount --fork chroot`, the way a
#     container runtime starts an image: each in its own network namespace (loopback only,
#     down) and PID namespace, with /proc, a /dev of null/zero/random/urandom, a tmpfs /tmp and
#     /run; the coordinator's state is a bind-mounted folder at /var/lib/dipaco, the shards are
#     bind-mounted read-only at /data for the worker, and the two reach each other only
#     through a folder bind-mounted at /run/dipaco in both (the coordinator listens on
#     unix:/run/dipaco/coord.sock; dipacoctl on the host uses the same socket). The worker's
#     --health-listen (a unix socket there) answers Health/Check SERVING, and the job (R=1,
#     H=4, 3 rounds) ends DONE with every round applied;
#  3. control: the worker tree without libopenblas.so.0 cannot start the worker (the check in
#     2 would notice a missing library).
# Needs root (unshare, mount, chroot): fails, saying so, otherwise.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT_SRC=$(cd "$HERE/../.." && pwd)
missing() { echo "images: FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || missing "needs root for unshare --mount/--pid/--net and chroot; tests/run.sh -LE deploy leaves the deploy tests out"
for t in unshare chroot mount ldd; do command -v $t >/dev/null || missing "$t is missing (deploy/install_deps.sh --test)"; done
unshare --net --pid --mount --fork true 2>/dev/null || missing "unshare --net --pid --mount does not work here"
W=$(mktemp -d)
source "$ROOT_SRC/tests/integration/lib.sh"
fail() { die_with_logs images 25 "$@"; }

# ---- 1: the trees
# check_tree NAME ROOTFS BINARY... — ROOTFS holds the binaries and exactly their libraries.
check_tree() {
  local name=$1 rootfs=$2 want have extra expect b
  shift 2
  bash "$ROOT_SRC/deploy/image_rootfs.sh" "$rootfs" "$@" >>"$W/rootfs.log" 2>&1 || fail "image_rootfs.sh ($name) failed"
  expect="./etc/group ./etc/nsswitch.conf ./etc/passwd"
  for b in "$@"; do
    [ -x "$rootfs/opt/dipaco/bin/$(basename "$b")" ] || fail "$name: $(basename "$b") is not in /opt/dipaco/bin"
    expect="$expect ./opt/dipaco/bin/$(basename "$b")"
  done
  # What ldd says the binaries load, as image paths (/lib/... is /usr/lib/... in the image).
  want=$(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' |
    sed -E 's#^/(lib|lib64)/#/usr/\1/#' | sort -u)
  have=$(cd "$rootfs" && find usr -type f | sed 's#^#/#' | sort)
  [ "$want" = "$have" ] || fail "$name: libraries in the tree differ from ldd's list: $(diff <(echo "$want") <(echo "$have") | head -20)"
  extra=$(cd "$rootfs" && find . -type f ! -path './usr/*' | sort | tr '\n' ' ')
  [ "$extra" = "$(tr ' ' '\n' <<<"$expect" | sort | tr '\n' ' ')" ] || fail "$name: unexpected files in the tree: $extra"
  [ ! -e "$rootfs/bin/sh" ] && [ ! -e "$rootfs/usr/bin" ] || fail "$name: the tree has a shell"
  echo "ok: 1: $name image: $# binaries and exactly the $(echo "$want" | wc -l) libraries they load ($(du -sh "$rootfs" | cut -f1))"
}
check_tree worker "$W/worker-rootfs" "$WORKER_BIN" "$CTL"
check_tree coordinator "$W/coordinator-rootfs" "$COORDINATOR_BIN" "$CTL"

# run_in_image ROOTFS STATE CMD... — what a container runtime does for an image, by hand:
# STATE (or "-") is bind-mounted at /var/lib/dipaco, $W/sock at /run/dipaco, the corpus
# read-only at /data.
run_in_image() {
  local rootfs=$1 state=$2; shift 2
  unshare --net --pid --mount --fork --kill-child bash -c '
    set -e
    R=$1; S=$2; D=$3; ST=$4; shift 4
    mount -t proc proc "$R/proc"
    mount -t tmpfs -o mode=0755,nosuid tmpfs "$R/dev"
    for d in null zero random urandom; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"
    mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$R/run"
    mkdir "$R/run/dipaco"; mount --bind "$S" "$R/run/dipaco"
    mount --bind "$D" "$R/data"; mount -o remount,bind,ro "$R/data"
    [ "$ST" = - ] || mount --bind "$ST" "$R/var/lib/dipaco"
    exec chroot --userspec=10001:10001 "$R" "$@"' run_in_image "$rootfs" "$W/sock" "$W/corpus" "$state" "$@"
}

# ---- 2: a job through both images, each in its own namespaces
make_corpus "$W/corpus"
chmod -R a+rX "$W/corpus"
mkdir -p "$W/sock" "$W/state"
chmod 1777 "$W/sock" # both images run as uid 10001 and make their sockets here
chown 10001:10001 "$W/state" && chmod 0700 "$W/state"
run_in_image "$W/coordinator-rootfs" "$W/state" /opt/dipaco/bin/dipaco-coordinator --listen unix:/run/dipaco/coord.sock \
  --state-dir /var/lib/dipaco --heartbeat-ms 200 --lease-ttl-ms 5000 >"$W/coordinator.log" 2>&1 &
boxed_coord=$!
PIDS+=("$boxed_coord")
COORD=unix:$W/sock/coord.sock
for _ in $(seq 1 100); do
  use_tokens "$W/state" && "$CTL" --coordinator "$COORD" status >/dev/null 2>&1 && break
  kill -0 "$boxed_coord" 2>/dev/null || fail "the coordinator in its image exited"
  sleep 0.1
done
"$CTL" --coordinator "$COORD" status >/dev/null || fail "the coordinator in its image does not answer on its socket"
DIPACO_JOIN_TOKEN=$DIPACO_JOIN_TOKEN run_in_image "$W/worker-rootfs" - /opt/dipaco/bin/dipaco-worker \
  --coordinator unix:/run/dipaco/coord.sock --data-dir /data --name boxed --threads 1 --exit-when-done \
  --health-listen unix:/run/dipaco/health.sock >"$W/worker.log" 2>&1 &
boxed=$!
PIDS+=("$boxed")
# Its liveness endpoint (what a gRPC probe calls), reached through the same bind-mounted folder,
# asked before there is a job (the worker waits for one).
health=
for _ in $(seq 1 300); do
  health=$($PY "$HERE/health_check.py" "unix:$W/sock/health.sock" 2>/dev/null) && break
  kill -0 "$boxed" 2>/dev/null || break
  sleep 0.1
done
[ "$health" = SERVING ] || fail "the worker's --health-listen did not answer SERVING ('$health')"
cat >"$W/spec.json" <<JSON
{"name": "image", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 5},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 1, "inner_steps": 4,
 "rounds": 3, "batch": 4, "seq_len": 16, "inner": {"lr": 0.003}}
JSON
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create failed"
rc=0; wait "$boxed" || rc=$?
[ $rc = 0 ] || fail "the worker in its image exited $rc"
"$CTL" --coordinator "$COORD" job show "$JOB" | grep -Eq '^state +DONE' || fail "job $JOB is not DONE"
versions=$("$CTL" --coordinator "$COORD" job ledger "$JOB" | grep -Ec '^[1-9][0-9]* ' || true)
[ "$versions" = 3 ] || fail "the ledger has $versions outer steps, expected 3"
n_push=$(grep -Ec 'pushed [0-9]+ bytes in [0-9]+ ms: accepted' "$W/worker.log" || true)
[ "$n_push" -ge 3 ] || fail "the worker pushed $n_push accepted deltas, expected 3"
grep -q 'worker [0-9]* registered: host boxed ' "$W/coordinator.log" || fail "the coordinator did not register worker 'boxed'"
[ "$(stat -c %u "$W/state/dipaco.db")" = 10001 ] || fail "the state was not written by uid 10001"
echo "ok: 2: coordinator and worker images (uid 10001, own net/pid/mount namespaces, one unix socket between them): worker Health/Check SERVING, job $JOB DONE, 3 outer steps"

# ---- 3: control: a library less and the worker cannot start
cp -a "$W/worker-rootfs" "$W/broken"
find "$W/broken/usr" -name libopenblas.so.0 -delete
rc=0
run_in_image "$W/broken" - /opt/dipaco/bin/dipaco-worker --help >"$W/broken.out" 2>&1 || rc=$?
[ $rc != 0 ] && grep -q "libopenblas.so.0" "$W/broken.out" || fail "the worker started without libopenblas.so.0 (rc $rc): $(head -3 "$W/broken.out")"
echo "ok: 3: control: without libopenblas.so.0 the worker does not start (rc $rc: $(head -1 "$W/broken.out" | cut -c1-100))"
echo "images: OK"
