#!/usr/bin/env bash
# coord_flags.sh DIPACO_COORDINATOR — flags the coordinator must refuse before it serves
# anything (exit 2, the flag named on stderr, no state directory created): a listen port out
# of range or not a number (gRPC would bind a random port nobody can reach), a heartbeat not
# below the lease TTL (every lease would expire between heartbeats), TLS without a key, and
# --insecure-no-auth with token files. A good set of flags starts and answers --help.
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
refused "TLS needs both --tls-cert and --tls-key" --listen 127.0.0.1:0 --tls-cert x.pem
refused "--insecure-no-auth contradicts" --listen 127.0.0.1:0 --insecure-no-auth --join-token-file x
"$CO" --help >/dev/null || { echo "FAIL: --help"; fails=$((fails + 1)); }
[ $fails = 0 ] && echo "coord_flags: ok"
exit $((fails > 0))
