#!/usr/bin/env bash
# security_tls.sh — TLS and mutual TLS between the coordinator, dipacoctl, dipaco-worker and an
# outside client (python grpcio). A CA, a server certificate (SAN 127.0.0.1, localhost), a
# client certificate, and a second "rogue" CA with its own client certificate are generated
# here with the openssl CLI. Checked:
#  - TLS: dipacoctl --tls-ca status / job list work; plain text against the TLS port fails; a
#    client that trusts another CA fails; python grpcio with ssl_channel_credentials works;
#  - mutual TLS (--tls-ca on the coordinator): without a client certificate, or with one from
#    the rogue CA, dipacoctl fails; with the right one it works; python grpcio with a client
#    certificate works and without one fails; a worker over mutual TLS registers;
#  - an unreadable or non-PEM --tls-cert/--tls-key stops the coordinator with a message
#    naming the flag.
#
# usage: security_tls.sh COORDINATOR_BIN DIPACOCTL WORKER_BIN PROTO_DIR
set -u
COORDINATOR_BIN=$1; CTL=$2; WORKER_BIN=$3; PROTO=$4
HERE=$(cd "$(dirname "$0")" && pwd)
command -v openssl >/dev/null || { echo "FAIL: the openssl CLI is missing (Debian openssl; deploy/install_deps.sh --test)"; exit 1; }
command -v protoc >/dev/null || { echo "FAIL: protoc is missing (Debian protobuf-compiler; deploy/install_deps.sh)"; exit 1; }
W=$(mktemp -d /tmp/dpc_sec_tls.XXXXXX)
source "$HERE/lib.sh"
FAILS=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; FAILS=$((FAILS + 1)); }
expect_ok() { local what=$1; shift; if "$@" >"$W/out.txt" 2>&1; then ok "$what"; else bad "$what: $(tail -3 "$W/out.txt")"; fi; }
expect_fail() { local what=$1; shift; if "$@" >"$W/out.txt" 2>&1; then bad "$what (it succeeded)"; else ok "$what ($(tail -1 "$W/out.txt" | cut -c1-100))"; fi; }

# ---- certificates (EC P-256, valid 1 day)
C=$W/pki; mkdir -p "$C"
gen_ca() { # NAME
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj "/CN=$1" \
    -keyout "$C/$1.key" -out "$C/$1.pem" 2>/dev/null
}
gen_cert() { # NAME CA SAN
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
    -keyout "$C/$1.key" -out "$C/$1.csr" 2>/dev/null &&
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" > "$C/$1.ext" &&
  openssl x509 -req -in "$C/$1.csr" -CA "$C/$2.pem" -CAkey "$C/$2.key" -CAcreateserial -days 1 \
    -extfile "$C/$1.ext" -out "$C/$1.pem" 2>/dev/null
}
gen_ca ca && gen_ca rogue && gen_cert server ca "IP:127.0.0.1,DNS:localhost" &&
  gen_cert client ca "DNS:worker" && gen_cert intruder rogue "DNS:intruder" ||
  { echo "FAIL: openssl could not make the test certificates"; exit 1; }
chmod 600 "$C"/*.key

# python grpcio client: python3 tls_client.py ADDR CA [CERT KEY] → ListJobs with the admin token
mkdir -p "$W/py"
protoc --python_out="$W/py" -I"$PROTO" "$PROTO/dipaco.proto" || { echo "FAIL: protoc"; exit 1; }
cat > "$W/py/tls_client.py" <<'PY'
import os, sys
import grpc
import dipaco_pb2 as pb
addr, ca = sys.argv[1], open(sys.argv[2], "rb").read()
cert = open(sys.argv[3], "rb").read() if len(sys.argv) > 3 else None
key = open(sys.argv[4], "rb").read() if len(sys.argv) > 4 else None
ch = grpc.secure_channel(addr, grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                                             certificate_chain=cert))
lj = ch.unary_unary("/dipaco.v1.Admin/ListJobs", request_serializer=pb.ListJobsRequest.SerializeToString,
                    response_deserializer=pb.ListJobsResponse.FromString)
r = lj(pb.ListJobsRequest(), metadata=[("authorization", "Bearer " + os.environ["DIPACO_ADMIN_TOKEN"])], timeout=10)
print("jobs:", len(r.jobs))
PY

# start_tls_coordinator STATE [flags] — like lib.sh start_coordinator, with dipacoctl over TLS
start_tls_coordinator() {
  local state=$1; shift
  COORD=127.0.0.1:$(free_port)
  "$COORDINATOR_BIN" --listen "$COORD" --state-dir "$state" "$@" >>"$W/coordinator.log" 2>&1 &
  COORD_PID=$!
  PIDS+=("$COORD_PID")
  for _ in $(seq 1 100); do
    use_tokens "$state" && "$CTL" --coordinator "$COORD" --tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" \
      --tls-key "$C/client.key" status >/dev/null 2>&1 && return 0
    kill -0 "$COORD_PID" 2>/dev/null || { echo "coordinator exited:"; tail -5 "$W/coordinator.log"; return 1; }
    sleep 0.1
  done
  echo "coordinator did not come up"; tail -5 "$W/coordinator.log"; return 1
}
stop_coordinator() {
  kill -TERM "$COORD_PID"; wait "$COORD_PID"
  local rc=$?
  [ $rc -eq 0 ] && ok "coordinator exits 0 on SIGTERM" || bad "coordinator exit status $rc"
}

# ---- TLS (server certificate only)
start_tls_coordinator "$W/state" --tls-cert "$C/server.pem" --tls-key "$C/server.key" || exit 1
grep -q '"msg":"dipaco-coordinator listening.*, TLS, join/admin tokens required' "$W/coordinator.log" &&
  ok "the coordinator says it serves TLS" || bad "TLS in the start-up line"
expect_ok "TLS: dipacoctl --tls-ca status" "$CTL" --coordinator "$COORD" --tls-ca "$C/ca.pem" status
expect_ok "TLS: dipacoctl job list --tls-ca (flag after the command)" "$CTL" --coordinator "$COORD" job list --tls-ca "$C/ca.pem"
expect_fail "TLS: a plain-text dipacoctl is refused" env DIPACO_CTL_TIMEOUT_MS=3000 "$CTL" --coordinator "$COORD" status
expect_fail "TLS: a client trusting another CA is refused" env DIPACO_CTL_TIMEOUT_MS=3000 \
  "$CTL" --coordinator "$COORD" --tls-ca "$C/rogue.pem" status
expect_ok "TLS: python grpcio ssl_channel_credentials + admin token → ListJobs" $PY "$W/py/tls_client.py" "$COORD" "$C/ca.pem"
expect_fail "TLS: dipacoctl with a missing --tls-ca file" "$CTL" --coordinator "$COORD" --tls-ca "$W/nope.pem" status
grep -q -- "--tls-ca $W/nope.pem: cannot read it (.*No such file" "$W/out.txt" && ok "the message names --tls-ca and the path" ||
  bad "message for a missing --tls-ca: $(cat "$W/out.txt")"
stop_coordinator

# ---- mutual TLS
start_tls_coordinator "$W/state" --tls-cert "$C/server.pem" --tls-key "$C/server.key" --tls-ca "$C/ca.pem" || exit 1
grep -q 'mutual TLS, join/admin tokens required' "$W/coordinator.log" && ok "the coordinator says mutual TLS" ||
  bad "mutual TLS in the start-up line"
expect_ok "mTLS: dipacoctl with a client certificate: status" "$CTL" --coordinator "$COORD" --tls-ca "$C/ca.pem" \
  --tls-cert "$C/client.pem" --tls-key "$C/client.key" status
expect_ok "mTLS: dipacoctl with a client certificate: job list" "$CTL" --coordinator "$COORD" --tls-ca "$C/ca.pem" \
  --tls-cert "$C/client.pem" --tls-key "$C/client.key" job list
expect_fail "mTLS: dipacoctl without a client certificate is refused" env DIPACO_CTL_TIMEOUT_MS=3000 \
  "$CTL" --coordinator "$COORD" --tls-ca "$C/ca.pem" status
expect_fail "mTLS: a client certificate from another CA is refused" env DIPACO_CTL_TIMEOUT_MS=3000 \
  "$CTL" --coordinator "$COORD" --tls-ca "$C/ca.pem" --tls-cert "$C/intruder.pem" --tls-key "$C/intruder.key" status
expect_fail "mTLS: plain text is refused" env DIPACO_CTL_TIMEOUT_MS=3000 "$CTL" --coordinator "$COORD" status
expect_ok "mTLS: python grpcio with a client certificate → ListJobs" \
  $PY "$W/py/tls_client.py" "$COORD" "$C/ca.pem" "$C/client.pem" "$C/client.key"
expect_fail "mTLS: python grpcio without a client certificate is refused" $PY "$W/py/tls_client.py" "$COORD" "$C/ca.pem"
mkdir -p "$W/wdata"
start_worker tlsw "$W/wdata" --tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" --tls-key "$C/client.key"
seen=
for _ in $(seq 1 100); do
  "$CTL" --coordinator "$COORD" --tls-ca "$C/ca.pem" --tls-cert "$C/client.pem" --tls-key "$C/client.key" \
    workers --json 2>/dev/null | grep -q '"tlsw"' && { seen=1; break; }
  sleep 0.1
done
[ -n "$seen" ] && ok "mTLS: a worker with a client certificate registers" ||
  bad "mTLS worker did not register: $(tail -3 "$W/worker-tlsw.log")"
kill -TERM "$LAST_WORKER_PID"; wait "$LAST_WORKER_PID"
rc=$?
[ $rc -eq 0 ] && ok "the mTLS worker exits 0 on SIGTERM" || bad "the mTLS worker exit status $rc"
stop_coordinator

# ---- bad files stop the coordinator with a message that names the flag
run_bad() { # WHAT NEEDLE FLAGS...
  local what=$1 needle=$2; shift 2
  "$COORDINATOR_BIN" --listen "127.0.0.1:$(free_port)" --state-dir "$W/state" "$@" >"$W/bad.txt" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && grep -q -- "$needle" "$W/bad.txt" && ok "$what: exit $rc naming '$needle'" ||
    bad "$what (rc $rc): $(tail -2 "$W/bad.txt")"
}
run_bad "a missing --tls-cert file" "--tls-cert $W/none.pem" --tls-cert "$W/none.pem" --tls-key "$C/server.key"
run_bad "a key given as --tls-cert" "--tls-cert $C/server.key: not a PEM file with a CERTIFICATE" \
  --tls-cert "$C/server.key" --tls-key "$C/server.key"
run_bad "a certificate given as --tls-key" "--tls-key $C/server.pem: not a PEM file with a PRIVATE KEY" \
  --tls-cert "$C/server.pem" --tls-key "$C/server.pem"
run_bad "--tls-cert without --tls-key" "needs both --tls-cert and --tls-key" --tls-cert "$C/server.pem"
echo "$FAILS failure(s)"
[ $FAILS -eq 0 ] || { echo "--- coordinator log (tail)"; tail -15 "$W/coordinator.log"; exit 1; }
