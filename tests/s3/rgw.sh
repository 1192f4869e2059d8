#!/usr/bin/env bash
# rgw.sh — a throwaway single-node Ceph cluster with an S3 endpoint (RADOS Gateway) on loopback,
# for the tests and benches that need a real S3 server (docs/testing.md).
#
#   rgw.sh start DIR     start mon + osd (memstore, RAM-backed) + radosgw under DIR; prints
#                        DIR/env (S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, RGW_DIR,
#                        and S3_ENDPOINT_TLS with S3_CA_FILE: the same gateway over https, its
#                        certificate signed by a throwaway CA made here)
#   rgw.sh stop DIR      stop the three daemons (by pid) and leave DIR for the logs
#   rgw.sh restart-gw DIR  SIGKILL radosgw and start it again on the same port
#   rgw.sh stop-gw DIR / start-gw DIR   SIGKILL radosgw (an outage) / start it again
#
# Every path (config, data, logs, sockets, pid files) lives under DIR, and every port is picked
# free at start, so runs do not collide and leave nothing behind outside DIR. Settings follow
# what a one-OSD cluster needs: pool size 1, no cephx, crc mode for the monitor client (radosgw
# insists on secure mode otherwise and never serves), a small memstore (RGW_MEMSTORE_BYTES), or
# with RGW_BLUESTORE_BYTES > 0 a BlueStore OSD on a sparse file of that size under DIR (benches
# whose objects do not fit in RAM). RGW_CONF_EXTRA: more lines for the [global] section
# (printf %b: "\n" separates them), e.g. the daemons' debug levels for a bench.
set -euo pipefail

die() { echo "rgw.sh: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: rgw.sh start|stop|restart-gw|stop-gw|start-gw DIR"
cmd=$1
D=$(mkdir -p "$2" && cd "$2" && pwd)
CONF=$D/ceph.conf

free_port() { python3 - <<'PY'
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

wait_for() { # seconds, what, command...
  local t=$1 what=$2; shift 2
  for _ in $(seq 1 $((t * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "$what did not come up within ${t}s (logs under $D/log)"
}

start_gw() {
  # Debian builds Ceph on glibc's malloc, which hands radosgw's 4 MiB buffers back to the
  # kernel after each request: every GET then page-faults its buffers in again (half of a
  # GET's CPU here). Fixed thresholds keep them in the heap.
  MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864 \
    radosgw -c "$CONF" -f -n client.rgw.a >"$D/log/radosgw.out" 2>&1 &
  echo $! >"$D/radosgw.pid"
  wait_for 60 radosgw curl -sf -o /dev/null "http://127.0.0.1:$(cat "$D/rgw.port")/"
}

case "$cmd" in
start)
  for b in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph uuidgen curl openssl; do
    command -v "$b" >/dev/null || die "$b not found: deploy/install_deps.sh --test installs Ceph"
  done
  [ -e "$D/ceph.conf" ] && die "$D already holds a cluster: stop it and use a fresh folder"
  mkdir -p "$D"/{mon,osd,rgw,run,log,crash}
  p1=$(free_port); p2=$(free_port); pmin=$(free_port); rgw=$(free_port); rgws=$(free_port)
  echo "$rgw" >"$D/rgw.port"
  # https beside http: a CA of this run only, and a certificate for 127.0.0.1 it signs.
  mkdir -p "$D/tls"
  ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  openssl req -x509 "${ec[@]}" -keyout "$D/tls/ca.key" -out "$D/tls/ca.pem" -days 7 \
    -subj "/CN=dipaco test CA" >"$D/log/tls.out" 2>&1 || die "openssl: no test CA (see $D/log/tls.out)"
  openssl req "${ec[@]}" -keyout "$D/tls/server.key" -out "$D/tls/server.csr" -subj "/CN=127.0.0.1" \
    >>"$D/log/tls.out" 2>&1 || die "openssl: no server key (see $D/log/tls.out)"
  printf 'subjectAltName=IP:127.0.0.1\n' >"$D/tls/san.ext"
  openssl x509 -req -in "$D/tls/server.csr" -CA "$D/tls/ca.pem" -CAkey "$D/tls/ca.key" -CAcreateserial \
    -out "$D/tls/server.pem" -days 7 -extfile "$D/tls/san.ext" >>"$D/log/tls.out" 2>&1 ||
    die "openssl: no server certificate (see $D/log/tls.out)"
  fsid=$(uuidgen)
  cat >"$CONF" <<CONF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$p2,v1:127.0.0.1:$p1]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind port min = $pmin
ms bind port max = $((pmin + 40))
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
run dir = $D/run
admin socket = $D/run/\$cluster-\$name.asok
pid file = $D/run/\$name.pid
log file = $D/log/\$name.log
keyring = $D/keyring
crash dir = $D/crash
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon max pg per osd = 1000
$(printf '%b' "${RGW_CONF_EXTRA:-}")
[mon]
mon data = $D/mon/\$cluster-\$id
[osd]
osd data = $D/osd/\$cluster-\$id
$(if [ "${RGW_BLUESTORE_BYTES:-0}" -gt 0 ]; then
  printf 'osd objectstore = bluestore\nbluestore block create = true\nbluestore block size = %s\n' "$RGW_BLUESTORE_BYTES"
  printf 'bluestore fsck on mkfs = false\nosd memory target = 2147483648\n'
else
  printf 'osd objectstore = memstore\nmemstore device bytes = %s\n' "${RGW_MEMSTORE_BYTES:-2147483648}"
fi)
[client.rgw.a]
rgw data = $D/rgw
rgw frontends = beast endpoint=${RGW_BIND:-127.0.0.1}:$rgw ssl_endpoint=${RGW_BIND:-127.0.0.1}:$rgws ssl_certificate=$D/tls/server.pem ssl_private_key=$D/tls/server.key
rgw thread pool size = 64
# Deleted objects give their RAM back within seconds, not after RGW's default 2 h: a job
# deletes every round's deltas and old versions, and the OSD is RAM-backed.
rgw gc obj min wait = 0
rgw gc processor period = 5
rgw gc processor max time = 5
CONF
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$p2,v1:127.0.0.1:$p1]" "$D/monmap" >/dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$D/monmap" >"$D/log/mkfs.out" 2>&1
  ceph-mon -c "$CONF" -f -i a >"$D/log/mon.out" 2>&1 &
  echo $! >"$D/mon.pid"
  wait_for 30 ceph-mon timeout 5 ceph -c "$CONF" mon stat
  osd_uuid=$(uuidgen) # the OSD's mkfs must name the uuid the monitor registered
  id=$(timeout 20 ceph -c "$CONF" osd new "$osd_uuid")
  mkdir -p "$D/osd/ceph-$id"
  ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$osd_uuid" >"$D/log/osd-mkfs.out" 2>&1
  # The same malloc thresholds as radosgw's (start_gw): a RAM-backed OSD allocates every
  # object's buffers afresh and, without them, faults and zeroes each page again.
  MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=67108864 \
    ceph-osd -c "$CONF" -f -i "$id" >"$D/log/osd.out" 2>&1 &
  echo $! >"$D/osd.pid"
  wait_for 60 ceph-osd sh -c "timeout 5 ceph -c '$CONF' osd stat | grep -q '1 up'"
  start_gw
  ak=DPCTEST$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
  sk=$(head -c 24 /dev/urandom | base64 | tr -d '/+=' | head -c 32)
  radosgw-admin -c "$CONF" user create --uid=dipaco --display-name=dipaco --access-key="$ak" \
    --secret-key="$sk" >"$D/log/user.out" 2>&1 || die "radosgw-admin user create failed (see $D/log/user.out)"
  cat >"$D/env" <<ENV
S3_ENDPOINT=http://127.0.0.1:$rgw
S3_ENDPOINT_TLS=https://127.0.0.1:$rgws
S3_CA_FILE=$D/tls/ca.pem
AWS_ACCESS_KEY_ID=$ak
AWS_SECRET_ACCESS_KEY=$sk
RGW_DIR=$D
ENV
  cat "$D/env"
  ;;
stop)
  for p in radosgw osd mon; do
    [ -f "$D/$p.pid" ] || continue
    pid=$(cat "$D/$p.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$D/$p.pid"
  done
  ;;
restart-gw | stop-gw)
  [ -f "$D/radosgw.pid" ] && { kill -9 "$(cat "$D/radosgw.pid")" 2>/dev/null || true; sleep 0.2; }
  if [ "$cmd" = restart-gw ]; then start_gw; fi
  ;;
start-gw) start_gw ;;
*) die "unknown command $cmd (start, stop, restart-gw, stop-gw, start-gw)" ;;
esac
