#!/usr/bin/env bash
# systemd_unit.sh COORDINATOR WORKER DIPACOCTL — deploy/systemd/dipaco-coordinator.service:
#  1. `systemd-analyze verify` prints nothing for it (ExecStart pointed at this build's binary,
#     since /usr/local/bin holds none here); control: an unknown key in a copy is reported;
#  2. `systemd-analyze security --offline=true`: the overall exposure is printed with every
#     check the unit does not pass, and must stay at or below MAX_EXPOSURE (1.5);
#  3. the unit runs, with all of its hardening, under a real systemd: systemd is PID 1 of its own
#     PID, mount, cgroup, network, UTS and IPC namespaces ("container" mode), in a read-only view
#     of this machine (writable: tmpfs on /run, /tmp, /var/tmp, /var/log, /var/lib, /dev, and
#     its cgroups; /sys and /proc/sys read-only; nothing it writes reaches this machine, and
#     nothing an earlier run left is seen: DynamicUser= + StateDirectory= make
#     /var/lib/private/dipaco and the symlink /var/lib/dipaco in the empty /var/lib, as on a
#     machine that never ran the unit), and loads units only from this test's folder
#     (SYSTEMD_UNIT_PATH, no generators), so nothing of the machine's boot runs. A drop-in only
#     sends stdout to a file and turns LeakSanitizer off (it needs ptrace, which the unit's
#     system call filter refuses). `systemctl start` returns once the coordinator said READY
#     (Type=notify); its process runs as a dynamic user with no capabilities, no_new_privs and
#     a seccomp filter, and takes MemoryMax= as its job memory budget; a worker in the same
#     network namespace finishes a tiny job (R=1, H=4, 3 rounds) with the state in
#     StateDirectory; SIGKILL of the main process is followed by a restart (Restart=on-failure)
#     that still knows the job; `systemctl stop` ends it cleanly.
# Needs root (namespaces, systemd as PID 1) and the Debian systemd package (deploy/install_deps.sh
# --test): fails, saying which, otherwise.
set -euo pipefail
COORDINATOR_BIN=$(realpath "$1"); WORKER_BIN=$(realpath "$2"); CTL=$(realpath "$3")
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT_SRC=$(cd "$HERE/../.." && pwd)
UNIT_SRC=${UNIT_SRC:-$ROOT_SRC/deploy/systemd/dipaco-coordinator.service}
MAX_EXPOSURE=${MAX_EXPOSURE:-1.5}
missing() { echo "systemd_unit: FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || missing "needs root (namespaces, systemd as PID 1); tests/run.sh -LE deploy leaves the deploy tests out"
command -v systemd-analyze >/dev/null || missing "systemd-analyze is missing: install Debian systemd (deploy/install_deps.sh --test)"
W=$(mktemp -d)
source "$ROOT_SRC/tests/integration/lib.sh"
SPID=
fail() {
  [ -n "$SPID" ] && cp "/proc/$SPID/root/run/dipaco-test/coordinator.log" "$W/coordinator.log" 2>/dev/null
  die_with_logs systemd_unit 30 "$@"
}

# ---- 1: verify
mkdir -p "$W/units/dipaco-coordinator.service.d"
UNIT=$W/units/dipaco-coordinator.service
sed "s#^ExecStart=/usr/local/bin/dipaco-coordinator #ExecStart=$COORDINATOR_BIN #" "$UNIT_SRC" >"$UNIT"
grep -q "^ExecStart=$COORDINATOR_BIN " "$UNIT" || fail "the unit has no ExecStart=/usr/local/bin/dipaco-coordinator line"
rc=0; out=$(systemd-analyze verify "$UNIT" 2>&1) || rc=$?
[ $rc = 0 ] && [ -z "$out" ] || fail "systemd-analyze verify (rc $rc): $out"
mkdir -p "$W/broken"
sed 's/^NoNewPrivileges=yes/NoNewPrivileges=yes\nHardenEverything=yes/' "$UNIT" >"$W/broken/dipaco-coordinator.service"
out=$(systemd-analyze verify "$W/broken/dipaco-coordinator.service" 2>&1 || true)
grep -q "Unknown key 'HardenEverything'" <<<"$out" || fail "control: verify did not report an unknown key: $out"
echo "ok: 1: systemd-analyze verify: clean (control: an unknown key is reported)"

# ---- 2: security
sec=$(systemd-analyze security --offline=true --no-pager "$UNIT" 2>&1) || true
score=$(sed -n 's/.*Overall exposure level for dipaco-coordinator.service: \([0-9.]*\) .*/\1/p' <<<"$sec")
[ -n "$score" ] || fail "systemd-analyze security printed no exposure level: $(tail -3 <<<"$sec")"
echo "systemd-analyze security: checks not passed:"
grep '✗' <<<"$sec" | sed -E 's/ {2,}/  /g; s/^/  /'
awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s <= m) }' || fail "exposure $score is above $MAX_EXPOSURE"
echo "ok: 2: systemd-analyze security: overall exposure $score (at most $MAX_EXPOSURE)"

# ---- 3: the unit under systemd
SYSTEMD=$(command -v systemd || echo /lib/systemd/systemd)
[ -x "$SYSTEMD" ] || fail "no systemd binary to run the unit (Debian systemd; deploy/install_deps.sh --test)"
cat >"$W/units/dipaco-coordinator.service.d/test.conf" <<EOF
[Service]
StandardOutput=append:/run/dipaco-test/coordinator.log
StandardError=inherit
Environment=ASAN_OPTIONS=detect_leaks=0
EOF
# The units the service's default dependencies name, empty: nothing of the machine's boot.
for u in sysinit.target basic.target shutdown.target network.target network-online.target multi-user.target \
  dipaco-test.target; do
  printf '[Unit]\nDescription=%s (test stub)\n' "$u" >"$W/units/$u"
done
# Cgroups: this process's own cgroups become the namespace's roots (unshare --cgroup); mount
# them the way this machine has them (unified, or v1/hybrid hierarchies).
CG_SETUP=$W/cgroups.sh
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  echo 'mount -t cgroup2 cgroup2 /sys/fs/cgroup' >"$CG_SETUP"
else
  echo 'mount -t tmpfs -o mode=0755 tmpfs /sys/fs/cgroup' >"$CG_SETUP"
  while IFS=: read -r _ ctrls _; do
    [ -n "$ctrls" ] || continue
    dir=${ctrls#name=}; opts=$ctrls
    case $ctrls in name=*) opts=none,$ctrls ;; esac
    [ -d "/sys/fs/cgroup/$dir" ] || continue
    echo "mkdir -p /sys/fs/cgroup/$dir && mount -t cgroup -o $opts cgroup /sys/fs/cgroup/$dir" >>"$CG_SETUP"
  done </proc/self/cgroup
  [ "$(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null)" = cgroup2fs ] &&
    echo 'mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified' >>"$CG_SETUP"
fi
# Cgroup folders that exist now: those systemd adds are removed at the end.
find /sys/fs/cgroup -mindepth 1 -type d 2>/dev/null | sort >"$W/cgroups.before" || true
systemd_cleanup() {
  local rc=$?
  set +e
  if [ -n "$SPID" ]; then
    kill -KILL "$SPID" 2>/dev/null # the namespace's PID 1: every process in it dies
    for _ in $(seq 1 50); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
  fi
  sleep 0.2
  find /sys/fs/cgroup -mindepth 1 -type d 2>/dev/null | sort >"$W/cgroups.after"
  comm -13 "$W/cgroups.before" "$W/cgroups.after" | grep -E '/(init\.scope|system\.slice|-\.slice)(/|$)' |
    awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2- | while read -r d; do rmdir "$d" 2>/dev/null; done
  (exit $rc); cleanup
}
trap systemd_cleanup EXIT

mkdir -p "$W/bin" && cp "$COORDINATOR_BIN" "$W/bin/dipaco-coordinator"
unshare --pid --fork --mount --cgroup --net --uts --ipc --propagation private \
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin container=dipaco-test SYSTEMD_UNIT_PATH=/run/dipaco-test/units \
  SYSTEMD_GENERATOR_PATH=/run/dipaco-test/empty SYSTEMD_ENVIRONMENT_GENERATOR_PATH=/run/dipaco-test/empty \
  bash -c '
    set -e
    SYSTEMD=$1; W=$2
    mount -t proc proc /proc
    mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys
    # The test folder ($W, under /tmp) is hidden below, and so may be the build tree (a checkout
    # under /tmp): the units and the coordinator binary move to /run first, and the unit runs it
    # from there.
    mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
    mkdir -p /run/dipaco-test/empty && cp -r "$W/units" "$W/cgroups.sh" "$W/bin" /run/dipaco-test/
    sed -i "s#^ExecStart=[^ ]* #ExecStart=/run/dipaco-test/bin/dipaco-coordinator #" \
      /run/dipaco-test/units/dipaco-coordinator.service
    # Existing folders only: a mkdir here would land on this machine, whose / is still writable.
    for d in /tmp /var/tmp /var/log /var/lib; do
      [ -d "$d" ] || { echo "systemd_unit: $d is missing on this machine" >&2; exit 1; }
      mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$d"
    done
    chmod 1777 /tmp /var/tmp
    mkdir -m 0700 /var/lib/private && mkdir /var/lib/systemd
    mkdir /run/.host-dev && mount --rbind /dev /run/.host-dev
    mount -t tmpfs -o mode=0755,nosuid tmpfs /dev
    for n in null zero full random urandom tty; do touch /dev/$n; mount --bind /run/.host-dev/$n /dev/$n; done
    mkdir /dev/shm /dev/pts && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
    mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts && ln -s pts/ptmx /dev/ptmx
    umount -l /run/.host-dev && rmdir /run/.host-dev
    mount --bind /sys /sys && mount -o remount,bind,ro /sys
    bash /run/dipaco-test/cgroups.sh
    mount -o remount,bind,ro /
    exec "$SYSTEMD" --system --unit=dipaco-test.target --log-target=console --log-level=info' \
  run "$SYSTEMD" "$W" >"$W/systemd.log" 2>&1 &
UPID=$!
PIDS+=("$UPID")
for _ in $(seq 1 50); do SPID=$(pgrep -P "$UPID" || true); [ -n "$SPID" ] && break; sleep 0.1; done
[ -n "$SPID" ] || fail "systemd did not start in its namespaces: $(tail -3 "$W/systemd.log")"
IN="nsenter -t $SPID -m -p"
state=
for _ in $(seq 1 300); do
  state=$($IN systemctl is-system-running 2>/dev/null || true)
  case $state in running | degraded) break ;; esac
  sleep 0.2
done
case $state in running | degraded) ;; *) fail "systemd as PID 1 in namespaces did not come up ($state): $(tail -3 "$W/systemd.log")" ;; esac
echo "ok: 3: systemd $($IN systemctl --version | head -1 | cut -d' ' -f2) runs as PID 1 in its own namespaces ($state)"

rc=0; timeout 60 $IN systemctl start dipaco-coordinator || rc=$?
ROOTV=/proc/$SPID/root
LOG=$ROOTV/run/dipaco-test/coordinator.log
[ $rc = 0 ] || { $IN systemctl status dipaco-coordinator --no-pager >"$W/status.log" 2>&1 || true; fail "systemctl start failed (rc $rc)"; }
main=$($IN systemctl show -p MainPID --value dipaco-coordinator)
st=$($IN cat /proc/"$main"/status)
uid=$(awk '/^Uid:/ {print $2}' <<<"$st")
[ "$uid" -ne 0 ] && [ "$(awk '/^NoNewPrivs:/ {print $2}' <<<"$st")" = 1 ] && [ "$(awk '/^Seccomp:/ {print $2}' <<<"$st")" = 2 ] &&
  [ "$(awk '/^CapEff:/ {print $2}' <<<"$st")" = 0000000000000000 ] && [ "$(awk '/^CapBnd:/ {print $2}' <<<"$st")" = 0000000000000000 ] ||
  fail "the coordinator is not confined: $(grep -E '^(Uid|NoNewPrivs|Seccomp|Cap)' <<<"$st" | tr '\n' ' ')"
echo "ok: 3: systemctl start: ready (Type=notify); runs as dynamic uid $uid, no capabilities, no_new_privs, seccomp filter"
# MemoryMax= is the coordinator's default job memory budget (read from its own cgroup).
mm=$(sed -n 's/^MemoryMax=\([0-9]*\)G$/\1/p' "$UNIT")
[ -n "$mm" ] || fail "the unit has no MemoryMax=NG"
grep -q "memory budget for jobs: $((mm * 1024)) MiB (the cgroup's memory" "$LOG" ||
  fail "the memory budget is not MemoryMax=${mm}G: $(grep -o 'memory budget for jobs: [^"]*' "$LOG")"
echo "ok: 3: the coordinator's job memory budget is the unit's MemoryMax=${mm}G ($(grep -o 'memory budget for jobs: [^"]*' "$LOG"))"

NET="nsenter -t $SPID -n"
STATE=$ROOTV/var/lib/private/dipaco
for _ in $(seq 1 50); do use_tokens "$STATE" && break; sleep 0.1; done
use_tokens "$STATE" || fail "no tokens in the StateDirectory"
COORD=127.0.0.1:7070 # the unit's default listen address, in the namespace's network
$NET "$CTL" --coordinator "$COORD" status >/dev/null || fail "dipacoctl status failed"
make_corpus "$W/corpus"
cat >"$W/spec.json" <<JSON
{"name": "unit", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 9},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 1, "inner_steps": 4,
 "rounds": 3, "batch": 4, "seq_len": 16, "inner": {"lr": 0.003}}
JSON
JOB=$($NET "$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create failed"
$NET "$WORKER_BIN" --coordinator "$COORD" --data-dir "$W/corpus" --name unit-w --threads 1 --exit-when-done \
  >>"$W/worker.log" 2>&1 || fail "the worker exited $?"
$NET "$CTL" --coordinator "$COORD" job show "$JOB" | grep -Eq '^state +DONE' || fail "job $JOB is not DONE"
[ -s "$STATE/dipaco.db" ] && [ -d "$STATE/blobs" ] || fail "no SQLite store or blobs in the StateDirectory"
echo "ok: 3: a worker finished job $JOB through the hardened coordinator (state in StateDirectory /var/lib/dipaco)"

$IN systemctl kill -s KILL --kill-whom=main dipaco-coordinator 2>/dev/null || $IN kill -KILL "$main"
for _ in $(seq 1 100); do
  n=$($IN systemctl show -p NRestarts --value dipaco-coordinator)
  [ "${n:-0}" -ge 1 ] && [ "$($IN systemctl is-active dipaco-coordinator)" = active ] && break
  sleep 0.1
done
[ "${n:-0}" -ge 1 ] || fail "no restart after SIGKILL (NRestarts ${n:-?})"
for _ in $(seq 1 50); do $NET "$CTL" --coordinator "$COORD" status >/dev/null 2>&1 && break; sleep 0.2; done
$NET "$CTL" --coordinator "$COORD" job show "$JOB" | grep -Eq '^state +DONE' || fail "after the restart job $JOB is not DONE"
echo "ok: 3: SIGKILL of the main process: restarted (Restart=on-failure, NRestarts $n), job $JOB still DONE"

timeout 60 $IN systemctl stop dipaco-coordinator || fail "systemctl stop failed"
result=$($IN systemctl show -p Result --value dipaco-coordinator)
[ "$result" = success ] || fail "stop ended with Result=$result"
grep -q "coordinator stopped cleanly" "$LOG" || fail "the coordinator did not stop cleanly"
echo "ok: 3: systemctl stop: clean (Result=success)"
echo "systemd_unit: OK (exposure $score)"
