#!/usr/bin/env bash
# k8s.sh COORDINATOR WORKER DIPACOCTL — deploy/k8s (GPU workers) and deploy/k8s/cpu (CPU
# workers), offline (no API server here):
#  1. `kubectl kustomize` of Debian's kubernetes-client (1.20, kustomize v2.0.3) renders both,
#     with tokens generated the way the kustomization's header says (when another kubectl owns
#     /usr/bin/kubectl, deploy/install_deps.sh --test unpacks the package into
#     tests/.cache/kubernetes-client instead, and that other kubectl must render the same objects);
#  2. every rendered document is validated against the Kubernetes API schemas (npm
#     kubernetes-models 5.1.0 + js-yaml 4.1.0, pinned, which deploy/install_deps.sh --test
#     installs into tests/.cache/k8s-models);
#     control: a port given as a string is rejected;
#  3. tests/deploy/k8s_check.py: the documents fit together and fit the programs (Service,
#     ports and gRPC probes, the Secret and its mounts, the claims, the worker's grace period
#     against terminationGracePeriodSeconds, GPU requests); control: a grace period shorter
#     than --grace-s is reported;
#  4. the real programs accept the rendered container args: the coordinator's and the CPU
#     worker's args (paths and addresses mapped onto this machine: the Secret's files, the
#     state claim, the shards, the Service's name) start them; the coordinator answers the
#     gRPC health check its probes make on the --listen port, the worker the one its liveness
#     probe makes on --health-listen, and the worker, with the Secret's join token, finishes a
#     tiny job.
# `kubectl apply --dry-run=client -f` is not run: it needs an API server for discovery even
# with --validate=false (said in the output). A missing tool (Debian's kubectl, node, the npm
# packages) fails the test, naming it; deploy/install_deps.sh --test installs them all.
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT_SRC=$(cd "$HERE/../.." && pwd)
CACHE=$ROOT_SRC/tests/.cache/k8s-models
missing() { echo "k8s: FAIL: $* (deploy/install_deps.sh --test installs it)"; exit 1; }
# Debian's kubectl (kubernetes-client) renders; when another kubectl owns /usr/bin/kubectl
# (installing the package would clash with it), Debian's is the copy unpacked into tests/.cache
# and the other one renders too, for comparison.
KUBECTLS=()
KC=$ROOT_SRC/tests/.cache/kubernetes-client
if dpkg-query -W -f='${Status}' kubernetes-client 2>/dev/null | grep -q "install ok installed"; then
  KUBECTLS+=(/usr/bin/kubectl)
elif [ -x "$KC/usr/bin/kubectl" ] && command -v kubectl >/dev/null; then
  KUBECTLS+=("$KC/usr/bin/kubectl" "$(command -v kubectl)")
else
  missing "Debian's kubectl is missing: neither the kubernetes-client package nor $KC/usr/bin/kubectl"
fi
command -v node >/dev/null || missing "node is missing (Debian nodejs, with npm)"
[ -f "$CACHE/node_modules/kubernetes-models/package.json" ] && [ -f "$CACHE/node_modules/js-yaml/package.json" ] ||
  missing "npm kubernetes-models 5.1.0 and js-yaml 4.1.0 are missing from $CACHE"
W=$(mktemp -d)
source "$ROOT_SRC/tests/integration/lib.sh"
fail() { die_with_logs k8s 25 "$@"; }

# ---- 1: render
cp -r "$ROOT_SRC/deploy/k8s" "$W/k8s"
rm -f "$W/k8s/base/tokens/"*.token
for t in join admin; do $PY -c 'import secrets; print(secrets.token_hex(32))' >"$W/k8s/base/tokens/$t.token"; done
# render KUBECTL TAG — deploy/k8s and deploy/k8s/cpu into $W/gpu.TAG.yaml, $W/cpu.TAG.yaml; only
# the deprecation notes of newer kustomize for `bases`/`patchesJson6902` may be printed.
render() {
  local k=$1 tag=$2 v
  for v in gpu cpu; do
    local dir=$W/k8s; [ $v = cpu ] && dir=$W/k8s/cpu
    "$k" kustomize "$dir" >"$W/$v.$tag.yaml" 2>"$W/kustomize.err" || fail "$k kustomize deploy/k8s${dir#$W/k8s} failed: $(cat "$W/kustomize.err")"
    ! grep -v "^# Warning: '\(bases\|patchesJson6902\)' is deprecated" "$W/kustomize.err" | grep -q . ||
      fail "$k kustomize deploy/k8s${dir#$W/k8s} warned: $(cat "$W/kustomize.err")"
  done
}
render "${KUBECTLS[0]}" 0
cp "$W/gpu.0.yaml" "$W/gpu.yaml"; cp "$W/cpu.0.yaml" "$W/cpu.yaml"
kv() { "$1" version --client -o json 2>/dev/null | $PY -c 'import json, sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])' || echo "?"; }
echo "ok: 1: ${KUBECTLS[0]} kustomize ($(kv "${KUBECTLS[0]}")): deploy/k8s $(grep -c '^kind:' "$W/gpu.yaml") documents, deploy/k8s/cpu $(grep -c '^kind:' "$W/cpu.yaml")"
if [ ${#KUBECTLS[@]} = 2 ]; then
  render "${KUBECTLS[1]}" 1
  for v in gpu cpu; do
    # Same objects, in any order; Secret data base64 unwrapped, and the generated Secret's name
    # suffix (a content hash, computed differently by each kustomize) replaced.
    $PY - "$W/$v.0.yaml" "$W/$v.1.yaml" <<'PY' || fail "the two kubectl versions render deploy/k8s ($v) differently"
import json, sys, yaml
def load(p):
    docs = [d for d in yaml.safe_load_all(open(p)) if d]
    for d in docs:
        if d["kind"] == "Secret":
            d["data"] = {k: "".join(str(v).split()) for k, v in d.get("data", {}).items()}
    text = json.dumps(sorted(docs, key=lambda d: (d["kind"], d["metadata"]["name"])), sort_keys=True)
    for d in docs:
        if d["kind"] == "Secret":
            text = text.replace(f'"{d["metadata"]["name"]}"', '"SECRET"')
    return text
sys.exit(0 if load(sys.argv[1]) == load(sys.argv[2]) else 1)
PY
  done
  echo "ok: 1: ${KUBECTLS[1]} ($(kv "${KUBECTLS[1]}")) renders the same objects"
fi
echo "k8s: not run: kubectl apply --dry-run=client (needs an API server for discovery, none here); schemas checked offline instead"

# ---- 2: schemas
node "$HERE/k8s_schema.mjs" "$CACHE" "$W/gpu.yaml" "$W/cpu.yaml" >"$W/schema.out" 2>&1 || fail "schema validation: $(grep -v ': valid$' "$W/schema.out")"
sed 's/containerPort: 8081/containerPort: "8081"/' "$W/cpu.yaml" >"$W/bad.yaml"
node "$HERE/k8s_schema.mjs" "$CACHE" "$W/bad.yaml" >"$W/bad.out" 2>&1 && fail "control: a string port passed schema validation"
grep -q "containerPort must be integer" "$W/bad.out" || fail "control: unexpected validation output: $(cat "$W/bad.out")"
echo "ok: 2: $(grep -c ': valid$' "$W/schema.out") documents valid against kubernetes-models 5.1.0 (control: a string port is rejected)"

# ---- 3: the documents fit together and fit the programs
$PY "$HERE/k8s_check.py" "$W/gpu.yaml" gpu "$W/k8s/base/tokens" "$W/gpu.json" || fail "deploy/k8s: see above"
$PY "$HERE/k8s_check.py" "$W/cpu.yaml" cpu "$W/k8s/base/tokens" "$W/cpu.json" || fail "deploy/k8s/cpu: see above"
sed 's/terminationGracePeriodSeconds: 40/terminationGracePeriodSeconds: 25/' "$W/cpu.yaml" >"$W/bad.yaml"
$PY "$HERE/k8s_check.py" "$W/bad.yaml" cpu "$W/k8s/base/tokens" /dev/null >"$W/bad.out" 2>&1 && fail "control: a grace period below --grace-s passed"
grep -q "terminationGracePeriodSeconds 25 does not leave --grace-s 30" "$W/bad.out" || fail "control: $(cat "$W/bad.out")"
echo "ok: 3: the rendered objects fit together and the programs' flags (control: terminationGracePeriodSeconds 25 < --grace-s 30 is reported)"

# ---- 4: the real programs with the rendered args
# The pod's view mapped onto this machine: the Secret's files, the state claim, the shards.
mkdir -p "$W/secret" "$W/state"
cp "$W/k8s/base/tokens/join.token" "$W/k8s/base/tokens/admin.token" "$W/secret/"
chmod 0400 "$W/secret/"*.token # the Secret's defaultMode
make_corpus "$W/shards"
CPORT=$(free_port); MPORT=$(free_port); HPORT=$(free_port)
# map JSON_FILE WHO — the container's args, one per line, with the pod's paths and addresses
# replaced by this machine's.
map() {
  $PY - "$1" "$2" "$W" "$CPORT" "$MPORT" "$HPORT" <<'PY'
import json, sys
f, who, w, cport, mport, hport = sys.argv[1:]
sub = {"/etc/dipaco/tokens/": f"{w}/secret/", "/var/lib/dipaco": f"{w}/state", "/data": f"{w}/shards",
       "0.0.0.0:7070": f"127.0.0.1:{cport}", "0.0.0.0:9464": f"127.0.0.1:{mport}", "0.0.0.0:8081": f"127.0.0.1:{hport}",
       "dipaco-coordinator:7070": f"127.0.0.1:{cport}", "$(POD_NAME)": "dipaco-worker-7d9f-abcde"}
args = json.load(open(f))[who]
for a in args:
    for k, v in sub.items():
        if a == k or (k.endswith("/") and a.startswith(k)):
            a = v + a[len(k):] if k.endswith("/") else v
    if who == "worker" and a == "8":  # --threads: the pod's CPU request; 1 here
        a = "1"
    print(a)
PY
}
mapfile -t CARGS < <(map "$W/cpu.json" coordinator)
mapfile -t WARGS < <(map "$W/cpu.json" worker)
"$COORDINATOR_BIN" "${CARGS[@]}" >"$W/coordinator.log" 2>&1 &
PIDS+=($!)
COORD=127.0.0.1:$CPORT
export DIPACO_ADMIN_TOKEN; DIPACO_ADMIN_TOKEN=$(cat "$W/secret/admin.token")
for _ in $(seq 1 100); do "$CTL" --coordinator "$COORD" status >/dev/null 2>&1 && break; sleep 0.1; done
"$CTL" --coordinator "$COORD" status >/dev/null || fail "the coordinator with the StatefulSet's args does not answer with the Secret's admin token"
[ "$($PY "$HERE/health_check.py" "$COORD")" = SERVING ] || fail "the coordinator's gRPC health (its probes) is not SERVING"
unset DIPACO_JOIN_TOKEN
"$WORKER_BIN" "${WARGS[@]}" --exit-when-done >"$W/worker.log" 2>&1 &
wpid=$!
PIDS+=("$wpid")
# The liveness probe's call, before there is a job (the worker waits for one).
health=
for _ in $(seq 1 300); do
  health=$($PY "$HERE/health_check.py" "127.0.0.1:$HPORT" 2>/dev/null) && break
  kill -0 "$wpid" 2>/dev/null || break
  sleep 0.1
done
[ "$health" = SERVING ] || fail "the worker's gRPC health on its --health-listen port (its liveness probe) is not SERVING ('$health')"
cat >"$W/spec.json" <<JSON
{"name": "k8s", "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 256, "seed": 11},
 "data": {"train": ["data/train_*.bin"]}, "algorithm": "diloco", "replicas": 1, "inner_steps": 4,
 "rounds": 2, "batch": 4, "seq_len": 16, "inner": {"lr": 0.003}}
JSON
JOB=$("$CTL" --coordinator "$COORD" job create "$W/spec.json") || fail "job create failed"
rc=0; wait "$wpid" || rc=$?
[ $rc = 0 ] || fail "the worker with the Deployment's args exited $rc"
"$CTL" --coordinator "$COORD" job show "$JOB" | grep -Eq '^state +DONE' || fail "job $JOB is not DONE"
grep -q 'worker [0-9]* registered: host dipaco-worker-7d9f-abcde ' "$W/coordinator.log" || fail "the worker did not register under its pod name"
echo "ok: 4: the coordinator and the CPU worker run with the rendered args (tokens from the Secret's files): both gRPC probes SERVING, job $JOB DONE"
echo "k8s: OK"
