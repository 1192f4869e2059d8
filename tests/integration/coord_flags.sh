#!/usr/bin/env bash
# coord_flags.sh DIPACO_COORDINATOR — flags the coordinator must refuse before it serves
# anything (exit 2, the flag named on stderr, no state directory created): a listen port out
# of range or not a number (gRPC would bind a random port nobody can reach), a heartbeat not
# below the lease TTL (every lease would expire between heartbeats), TLS without a key, and
# --insecure-no-auth with token files. A good set of flags starts and answers --help. And
# one coordinator per state directory: a second one on it is refused while the first runs.
set -euo pipefail
CO=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
refused() { # refused WANT ARGS...: exit 2 with WANT on stderr, nothing created
  local want=$1; shift
  local rc=0
  timeout 10 "$CO" --state-dir "$W/state" "$@" >"$W/out" 2>"$W/err" || rc=$?  # a coordinator that serves: 124
  if [ "$rc" = 2 ] && grep -qF -- "$want" "$W/err" && [ ! -e "$W/state" ]; then
    echo "ok: refused $* ($want)"
  else
    echo "FAIL: $* → exit $rc, stderr: $(head -c 300 "$W/err")"; fails=$((fails + 1))
  fi
  rm -rf "$W/state"
}
refused "--listen 127.0.0.1:99999: give HOST:PORT" --listen 127.0.0.1:99999
refused "--listen 127.0.0.1:70x: give HOST:PORT" --listen 127.0.0.1:70x
refused "--listen localhost: give HOST:PORT" --listen localhost
refused "--metrics-listen 127.0.0.1:65536" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:65536
refused "--heartbeat-ms 15000 must be below --lease-ttl-ms 15000" --listen 127.0.0.1:0 --heartbeat-ms 15000
refused "--heartbeat-ms 2000 must be below --lease-ttl-ms 1000" --listen 127.0.0.1:0 --lease-ttl-ms 1000
refused "--dead-after-heartbeats 1: expected an integer in [2, 1000]" --listen 127.0.0.1:0 --dead-after-heartbeats 1
refused "TLS needs both --tls-cert and --tls-key" --listen 127.0.0.1:0 --tls-cert x.pem
refused "--insecure-no-auth contradicts" --listen 127.0.0.1:0 --insecure-no-auth --join-token-file x
"$CO" --help >/dev/null || { echo "FAIL: --help"; fails=$((fails + 1)); }

# One coordinator per state directory, locked on the directory itself: a second one is refused
# while the first runs, also after every file that could have served as a lock is deleted.
"$CO" --listen 127.0.0.1:0 --state-dir "$W/s1" --insecure-no-auth 2>"$W/first.log" &
first=$!
for _ in $(seq 1 100); do grep -q "listening on" "$W/first.log" 2>/dev/null && break; sleep 0.05; done
rm -f "$W/s1/coordinator.lock"
rc=0
timeout 10 "$CO" --listen 127.0.0.1:0 --state-dir "$W/s1" --insecure-no-auth 2>"$W/second.log" >/dev/null || rc=$?
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "in use by another dipaco-coordinator" "$W/second.log"; then
  echo "ok: a second coordinator on the same state directory is refused (exit $rc)"
else
  echo "FAIL: second coordinator → exit $rc: $(tail -c 300 "$W/second.log")"; fails=$((fails + 1))
fi
kill -TERM "$first"; wait "$first" 2>/dev/null || true
[ $fails = 0 ] && echo "coord_flags: ok"
exit $((fails > 0))
