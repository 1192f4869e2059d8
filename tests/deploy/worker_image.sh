#!/usr/bin/env bash
# worker_image.sh COORDINATOR WORKER DIPACOCTL — the worker image is complete: the root file
# system deploy/worker_rootfs.sh assembles (what deploy/Containerfile.worker ships, FROM
# scratch) runs a worker that finishes a tiny DiLoCo job.
#  1. the tree holds the two binaries and exactly the libraries ldd lists for them (no shell,
#     nothing else under /usr);
#  2. the worker runs as uid 10001 under `unshare --net --pid --mount --fork chroot`, the way
#     a container runtime starts the image: its own network namespace (loopback only, down),
#     its own PID namespace, /proc, a /dev with null/zero/random/urandom, a tmpfs /tmp, the
#     shards bind-mounted read-only at /data, and the coordinator reachable only through its
#     unix socket bind-mounted at /run/dipaco (the coordinator runs outside, from the build);
#     its --health-listen (a unix socket in the same folder) answers Health/Check SERVING, and
#     the job (R=1, H=4, 3 rounds) ends DONE with every round applied;
#  3. control: the same tree without libopenblas.so.0 cannot start the worker (the check above
#     would notice a missing library).
# Needs root (unshare, mount, chroot): skipped, with the reason, otherwise.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT_SRC=$(cd "$HERE/../.." && pwd)
skip() { echo "worker_image: SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root for unshare --mount/--pid/--net and chroot"
for t in unshare chroot mount ldd; do command -v $t >/dev/null || skip "$t is not installed"; done
unshare --net --pid --mount --fork true 2>/dev/null || skip "unshare --net --pid --mount does not work here"
W=$(mktemp -d)
source "$ROOT_SRC/tests/integration/lib.sh"
fail() { die_with_logs worker_image 25 "$@"; }

# ---- 1: the tree
ROOTFS=$W/rootfs
bash "$ROOT_SRC/deploy/worker_rootfs.sh" "$ROOTFS" "$WORKER_BIN" "$CTL" >"$W/rootfs.log" 2>&1 || fail "worker_rootfs.sh failed"
[ -x "$ROOTFS/opt/dipaco/bin/dipaco-worker" ] && [ -x "$ROOTFS/opt/dipaco/bin/dipacoctl" ] || fail "the binaries are not in /opt/dipaco/bin"
# What ldd says the binaries load, as image paths (/lib/... is /usr/lib/... in the image).
want=$(ldd "$WORKER_BIN" "$CTL" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' |
  sed -E 's#^/(lib|lib64)/#/usr/\1/#' | sort -u)
have=$(cd "$ROOTFS" && find usr -type f | sed 's#^#/#' | sort)
[ "$want" = "$have" ] || fail "libraries in the tree differ from ldd's list: $(diff <(echo "$want") <(echo "$have") | head -20)"
extra=$(cd "$ROOTFS" && find . -type f ! -path './usr/*' | sort | tr '\n' ' ')
[ "$extra" = "./etc/group ./etc/nsswitch.conf ./etc/passwd ./opt/dipaco/bin/dipaco-worker ./opt/dipaco/bin/dipacoctl " ] ||
  fail "unexpected files in the tree: $extra"
[ ! -e "$ROOTFS/bin/sh" ] && [ ! -e "$ROOTFS/usr/bin" ] || fail "the tree has a shell"
echo "ok: 1: the tree holds the 2 binaries and exactly the $(echo "$want" | wc -l) libraries they load ($(du -sh "$ROOTFS" | cut -f1))"

# ---- 2: a job through a worker chrooted into the tree, in its own namespaces
make_corpus "$W/corpus"
chmod -R a+rX "$W/corpus"
mkdir -p "$W/sock"
COORD=unix:$W/sock/coord.sock
launch_coordinator "$W/state" --heartbeat-ms 200 --lease-ttl-ms 5000 || fail "the coordinator did not start"
chmod 0666 "$W/sock/coord.sock" # the worker runs as uid 10001 (and makes its health socket here)
chmod 1777 "$W/sock"
cat >"$W/spec.json" <<JSON
{"name": "image", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 5},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 1, "inner_steps": 4,
 "rounds": 3, "batch": 4, "seq_len": 16, "inner": {"lr": 0.003}}
JSON
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create failed"

# run_in_image ROOTFS CMD... — what a container runtime does for the image, by hand.
run_in_image() {
  local rootfs=$1; shift
  unshare --net --pid --mount --fork --kill-child bash -c '
    set -e
    R=$1; S=$2; D=$3; shift 3
    mount -t proc proc "$R/proc"
    mount -t tmpfs -o mode=0755,nosuid tmpfs "$R/dev"
    for d in null zero random urandom; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"
    mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$R/run"
    mkdir "$R/run/dipaco"; mount --bind "$S" "$R/run/dipaco"
    mount --bind "$D" "$R/data"; mount -o remount,bind,ro "$R/data"
    exec chroot --userspec=10001:10001 "$R" "$@"' run_in_image "$rootfs" "$W/sock" "$W/corpus" "$@"
}
DIPACO_JOIN_TOKEN=$DIPACO_JOIN_TOKEN run_in_image "$ROOTFS" /opt/dipaco/bin/dipaco-worker --coordinator unix:/run/dipaco/coord.sock \
  --data-dir /data --name boxed --threads 1 --exit-when-done --min-step-ms 250 \
  --health-listen unix:/run/dipaco/health.sock >"$W/worker.log" 2>&1 &
boxed=$!
PIDS+=("$boxed")
# Its liveness endpoint (what a gRPC probe calls), reached through the same bind-mounted folder.
health=
for _ in $(seq 1 100); do
  health=$($PY "$HERE/health_check.py" "unix:$W/sock/health.sock" 2>/dev/null) && break
  kill -0 "$boxed" 2>/dev/null || break
  sleep 0.1
done
[ "$health" = SERVING ] || fail "the worker's --health-listen did not answer SERVING ('$health')"
rc=0; wait "$boxed" || rc=$?
[ $rc = 0 ] || fail "the worker in the image exited $rc"
"$CTL" --coordinator "$COORD" job show "$JOB" | grep -Eq '^state +DONE' || fail "job $JOB is not DONE"
versions=$("$CTL" --coordinator "$COORD" job ledger "$JOB" | grep -Ec '^[1-9][0-9]* ' || true)
[ "$versions" = 3 ] || fail "the ledger has $versions outer steps, expected 3"
n_push=$(grep -Ec 'pushed [0-9]+ bytes in [0-9]+ ms: accepted' "$W/worker.log" || true)
[ "$n_push" -ge 3 ] || fail "the worker pushed $n_push accepted deltas, expected 3"
"$CTL" --coordinator "$COORD" workers | grep -q boxed || fail "the coordinator does not list worker 'boxed'"
echo "ok: 2: the worker in the image (uid 10001, own net/pid/mount namespaces, coordinator over a unix socket) answered Health/Check SERVING and finished job $JOB: DONE, 3 outer steps"

# ---- 3: control: a library less and the worker cannot start
cp -a "$ROOTFS" "$W/broken"
rm -f "$W/broken/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
rc=0
run_in_image "$W/broken" /opt/dipaco/bin/dipaco-worker --help >"$W/broken.out" 2>&1 || rc=$?
[ $rc != 0 ] && grep -q "libopenblas.so.0" "$W/broken.out" || fail "the worker started without libopenblas.so.0 (rc $rc): $(head -3 "$W/broken.out")"
echo "ok: 3: control: without libopenblas.so.0 the worker does not start (rc $rc: $(head -1 "$W/broken.out" | cut -c1-100))"
echo "worker_image: OK"
