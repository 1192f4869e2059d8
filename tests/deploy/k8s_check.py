#!/usr/bin/env python3
"""k8s_check.py RENDERED.yaml gpu|cpu TOKENS_DIR OUT.json — checks that the documents `kubectl
kustomize deploy/k8s[/cpu]` rendered fit together and fit the programs (what a schema cannot
see), and writes the coordinator's and the worker's container args to OUT.json so that the
test can run the real programs with them.

Checked: one Namespace, Secret, Service, StatefulSet, Deployment and PersistentVolumeClaim,
all namespaced objects in the Namespace; the Secret holds exactly the two token files; every
volume mount has its volume, every secret volume names the generated Secret, every claim a PVC
or a volumeClaimTemplate; the Service selects the coordinator's pods and targets its named
ports, and is the StatefulSet's serviceName (one replica: the coordinator locks its state);
the coordinator's --listen port is its grpc port and the port of its startup, readiness and
liveness gRPC probes, --metrics-listen the metrics port, --state-dir the mount of the "state"
claim template, its token files the Secret's keys where the Secret is mounted; the worker's
--coordinator is the Service's name and grpc port, --data-dir the read-only shards mount,
--token-file the join token where it is mounted, --health-listen the port of its gRPC liveness
probe and of its "health" port, terminationGracePeriodSeconds above --grace-s by at most 30 s;
GPU: one nvidia.com/gpu requested and limited and --backend cuda; CPU: no GPU, no --backend
cuda, --threads equal to the CPU request; both pods run as uid 10001 (the images' user),
non-root, without privilege escalation. Prints one "ok:" line per group; exits 1 with every
problem found."""
import base64
import json
import os
import sys

import yaml

problems = []


def check(cond, msg):
    if not cond:
        problems.append(msg)
    return cond


def ok(n0, line):
    """Print an "ok:" line for a group of checks if none of them failed since problems[n0]."""
    if len(problems) == n0:
        print(f"ok: {line}")


def arg(args, flag):
    """The value after `flag` in a container's args (the last one), or None."""
    val = None
    for i, a in enumerate(args[:-1]):
        if a == flag:
            val = args[i + 1]
    return val


def port_of(addr):
    return int(addr.rsplit(":", 1)[1]) if addr and ":" in addr else None


def pod_checks(kind, pod, claims_ok, secret_name):
    c = pod["spec"]["containers"][0]
    vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    for m in c.get("volumeMounts", []):
        check(m["name"] in vols or m["name"] in claims_ok, f"{kind}: volumeMount {m['name']} has no volume")
    for v in vols.values():
        if "secret" in v:
            check(v["secret"]["secretName"] == secret_name,
                  f"{kind}: volume {v['name']} names Secret {v['secret']['secretName']}, rendered is {secret_name}")
        if "persistentVolumeClaim" in v:
            check(v["persistentVolumeClaim"]["claimName"] in claims_ok,
                  f"{kind}: claim {v['persistentVolumeClaim']['claimName']} is not defined")
    sc = pod["spec"].get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser") == 10001,
          f"{kind}: pod must run as non-root uid 10001 (the images' user dipaco)")
    csc = c.get("securityContext", {})
    check(csc.get("allowPrivilegeEscalation") is False, f"{kind}: allowPrivilegeEscalation must be false")
    for a in c.get("args", []):
        if "$(" in a:
            var = a[a.index("$(") + 2:a.index(")")]
            check(any(e["name"] == var for e in c.get("env", [])), f"{kind}: args use $({var}) but env has no {var}")
    return c


def mount_of(c, name):
    for m in c.get("volumeMounts", []):
        if m["name"] == name:
            return m
    return None


def secret_file_mount(c, pod, secret_name, key):
    """Where the file of Secret key `key` appears in container c, or None."""
    for v in pod["spec"].get("volumes", []):
        if v.get("secret", {}).get("secretName") != secret_name:
            continue
        m = mount_of(c, v["name"])
        if not m:
            continue
        items = v["secret"].get("items")
        if items is None:
            return os.path.join(m["mountPath"], key)
        for it in items:
            if it["key"] == key:
                return os.path.join(m["mountPath"], it["path"])
    return None


def main():
    if len(sys.argv) != 5 or sys.argv[2] not in ("gpu", "cpu"):
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    path, variant, tokens_dir, out = sys.argv[1:]
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    for k in ("Namespace", "Secret", "Service", "StatefulSet", "Deployment", "PersistentVolumeClaim"):
        check(len(by_kind.get(k, [])) == 1, f"expected one {k}, found {len(by_kind.get(k, []))}")
    if problems:
        return report()
    ns = by_kind["Namespace"][0]["metadata"]["name"]
    for d in docs:
        if d["kind"] != "Namespace":
            check(d["metadata"].get("namespace") == ns, f"{d['kind']} {d['metadata']['name']} is not in namespace {ns}")
    ok(0, f"one Namespace, Secret, Service, StatefulSet, Deployment, PVC; all in namespace {ns}")

    n0 = len(problems)
    sec = by_kind["Secret"][0]
    sname = sec["metadata"]["name"]
    check(set(sec.get("data", {})) == {"join.token", "admin.token"}, f"Secret keys {sorted(sec.get('data', {}))}")
    for key in ("join.token", "admin.token"):
        with open(os.path.join(tokens_dir, key), "rb") as f:
            want = f.read()
        got = base64.b64decode("".join(str(sec["data"].get(key, "")).split()))
        check(got == want, f"Secret {key} is not the content of {tokens_dir}/{key}")
    ok(n0, f"Secret {sname} holds join.token and admin.token")

    svc = by_kind["Service"][0]
    sts = by_kind["StatefulSet"][0]
    dep = by_kind["Deployment"][0]
    pvc = by_kind["PersistentVolumeClaim"][0]
    templates = {t["metadata"]["name"]: t for t in sts["spec"].get("volumeClaimTemplates", [])}
    claims = {pvc["metadata"]["name"]} | set(templates)

    # ---- coordinator
    n0 = len(problems)
    cpod = sts["spec"]["template"]
    cc = pod_checks("StatefulSet", cpod, claims, sname)
    check(sts["spec"].get("replicas") == 1, "StatefulSet replicas must be 1 (the coordinator locks its state directory)")
    check(sts["spec"].get("serviceName") == svc["metadata"]["name"], "StatefulSet serviceName is not the Service")
    labels = cpod["metadata"].get("labels", {})
    check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), "the Service does not select the coordinator's pods")
    cports = {p["name"]: p["containerPort"] for p in cc.get("ports", [])}
    sports = {p["name"]: p for p in svc["spec"]["ports"]}
    for p in svc["spec"]["ports"]:
        check(p.get("targetPort") in cports, f"Service port {p['name']} targets {p.get('targetPort')}, not a container port")
    cargs = cc["args"]
    lport = port_of(arg(cargs, "--listen"))
    check(lport == cports.get("grpc"), f"--listen port {lport} is not the container's grpc port {cports.get('grpc')}")
    check(port_of(arg(cargs, "--metrics-listen")) == cports.get("metrics"), "--metrics-listen is not the metrics port")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check(cc.get(probe, {}).get("grpc", {}).get("port") == lport, f"coordinator {probe} is not a gRPC probe of port {lport}")
    st = templates.get("state")
    if check(st is not None, "no volumeClaimTemplate 'state'"):
        check(st["spec"]["accessModes"] == ["ReadWriteOnce"], "state claim must be ReadWriteOnce")
        check("storage" in st["spec"]["resources"]["requests"], "state claim requests no storage")
        m = mount_of(cc, "state")
        check(m is not None and m["mountPath"] == arg(cargs, "--state-dir"), "--state-dir is not where the state claim is mounted")
    for flag, key in (("--join-token-file", "join.token"), ("--admin-token-file", "admin.token")):
        check(arg(cargs, flag) == secret_file_mount(cc, cpod, sname, key), f"coordinator {flag} is not the mounted Secret key {key}")
    ok(n0, f"coordinator: Service {svc['metadata']['name']} -> ports {sorted(cports)}, gRPC probes on {lport}, "
       f"state claim at {arg(cargs, '--state-dir')}, tokens from the Secret")

    # ---- worker
    n0 = len(problems)
    wpod = dep["spec"]["template"]
    wc = pod_checks("Deployment", wpod, claims, sname)
    wargs = wc["args"]
    check(arg(wargs, "--coordinator") == f"{svc['metadata']['name']}:{sports['grpc']['port']}",
          f"--coordinator {arg(wargs, '--coordinator')} is not the Service {svc['metadata']['name']}:{sports['grpc']['port']}")
    grace = int(arg(wargs, "--grace-s") or 30)
    tgps = wpod["spec"].get("terminationGracePeriodSeconds", 30)
    check(grace < tgps <= grace + 30, f"terminationGracePeriodSeconds {tgps} does not leave --grace-s {grace} (+ at most 30 s)")
    hport = port_of(arg(wargs, "--health-listen"))
    wports = {p["name"]: p["containerPort"] for p in wc.get("ports", [])}
    check(hport is not None and hport == wports.get("health"), f"--health-listen port {hport} is not the health port")
    check(wc.get("livenessProbe", {}).get("grpc", {}).get("port") == hport, f"worker liveness is not a gRPC probe of {hport}")
    dm = next((m for m in wc.get("volumeMounts", []) if m["mountPath"] == arg(wargs, "--data-dir")), None)
    check(dm is not None and dm.get("readOnly") is True, "--data-dir is not a read-only mount")
    check(arg(wargs, "--token-file") == secret_file_mount(wc, wpod, sname, "join.token"), "--token-file is not the mounted join token")
    res = wc.get("resources", {})
    gpu_req = res.get("requests", {}).get("nvidia.com/gpu")
    gpu_lim = res.get("limits", {}).get("nvidia.com/gpu")
    if variant == "gpu":
        check(str(gpu_req) == "1" and str(gpu_lim) == "1", f"GPU worker: nvidia.com/gpu request {gpu_req}, limit {gpu_lim}; want 1")
        check(arg(wargs, "--backend") == "cuda", "GPU worker without --backend cuda")
    else:
        check(gpu_req is None and gpu_lim is None, "CPU worker requests a GPU")
        check(arg(wargs, "--backend") in (None, "cpu"), "CPU worker with --backend cuda")
        check(arg(wargs, "--threads") == str(res.get("requests", {}).get("cpu")), "CPU worker: --threads is not the CPU request")
    ok(n0, f"{variant} worker: --coordinator {arg(wargs, '--coordinator')}, grace {grace} s < "
       f"terminationGracePeriodSeconds {tgps}, gRPC liveness on --health-listen port {hport}, "
       + ("1 nvidia.com/gpu, --backend cuda" if variant == "gpu" else f"no GPU, --threads {arg(wargs, '--threads')}"))

    with open(out, "w") as f:
        json.dump({"coordinator": cargs, "worker": wargs}, f)
    return report()


def report():
    for p in problems:
        print(f"k8s_check: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
