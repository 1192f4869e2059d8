#!/usr/bin/env bash
# with_rgw.sh CMD [ARGS…] — runs CMD against a real RADOS Gateway started here (tests/s3/rgw.sh):
# S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and RGW_DIR in its environment, plus
# NOT_S3 (a plain HTTP server, for "not an S3 endpoint") and DEAD (a closed port); stops
# everything on exit and returns CMD's status.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=$(mktemp -d /tmp/dpc-s3-XXXXXX)
cleanup() {
  bash "$HERE/rgw.sh" stop "$D/rgw" || true
  [ -n "${HTTP_PID:-}" ] && kill "$HTTP_PID" 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT
bash "$HERE/rgw.sh" start "$D/rgw" >/dev/null
set -a; . "$D/rgw/env"; set +a
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
hp=$(port)
mkdir -p "$D/www"
python3 -m http.server "$hp" --bind 127.0.0.1 --directory "$D/www" >/dev/null 2>&1 &
HTTP_PID=$!
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$hp/" && break; sleep 0.1; done
NOT_S3=http://127.0.0.1:$hp DEAD=http://127.0.0.1:$(port) "$@"
