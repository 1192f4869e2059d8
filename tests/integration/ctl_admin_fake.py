#!/usr/bin/env python3
"""ctl_admin_fake.py — dipacoctl's admin commands against the fake Admin server
(tests/unit/test_ctl_admin_fake.c): human tables, --json documents (parsed here with the
json module), exit codes (0 ok, 1 server/runtime error, 2 usage, 3 wait timeout), gRPC error
messages, paging, job wait progress, export byte-identity and failure cleanup, job create
with an uploaded initial model, the admin token, and an unreachable coordinator.

usage: ctl_admin_fake.py <dipacoctl> <test_ctl_admin_fake>"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

failures = 0


def check(cond, what, detail=""):
    global failures
    if cond:
        print(f"ok: {what}")
    else:
        failures += 1
        print(f"FAIL: {what}" + (f"\n  {detail}" if detail else ""))


class Server:
    def __init__(self, binary, d, token=None):
        os.makedirs(d, exist_ok=True)
        args = [binary, d] + (["--token", token] if token else [])
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            raise RuntimeError(f"fake server did not report its port: {line}")
        self.addr = f"127.0.0.1:{line[1]}"

    def stop(self):
        self.p.stdin.close()
        rc = self.p.wait(timeout=30)
        check(rc == 0, f"fake server exits cleanly (rc {rc})")


def run(ctl, args, addr, env_extra=None, cwd=None, timeout=60):
    env = dict(os.environ)
    env.pop("DIPACO_ADMIN_TOKEN", None)
    env["DIPACO_COORDINATOR"] = addr
    env.update(env_extra or {})
    r = subprocess.run([ctl] + args, capture_output=True, text=True, env=env, cwd=cwd,
                       timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    ctl, fake = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    tmp = tempfile.mkdtemp(prefix="dpc_ctl_admin_")
    try:
        srv = Server(fake, os.path.join(tmp, "srv"))
        try:
            tests(ctl, fake, srv.addr, tmp)
        finally:
            srv.stop()
        token_tests(ctl, fake, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


def tests(ctl, fake, addr, tmp):
    srvdir = os.path.join(tmp, "srv")

    # --- job list: table, JSON, paging (the fake serves 2 jobs a page), state filter.
    rc, out, err = run(ctl, ["job", "list"], addr)
    lines = out.splitlines()
    check(rc == 0 and lines[0].split()[:3] == ["ID", "NAME", "STATE"], "job list header", out + err)
    rows = [l.split() for l in lines[1:]]
    check([r[0] for r in rows] == ["1", "2", "7", "8", "9"], "job list shows all 5 jobs across pages", out)
    check(rows[0][1:4] == ["alpha", "RUNNING", "sync"] and rows[0][4] == "1/3" and rows[0][8] == "3.2500",
          "job list row 1", out)
    rc, out, err = run(ctl, ["job", "list", "--json"], addr)
    doc = json.loads(out)
    check(rc == 0 and [j["job_id"] for j in doc["jobs"]] == [1, 2, 7, 8, 9], "job list --json ids", out)
    j1 = doc["jobs"][0]
    check(j1["name"] == "alpha" and j1["state"] == "RUNNING" and j1["algorithm"] == "sync" and
          j1["round"] == 1 and j1["rounds_total"] == 3 and j1["replicas"] == 2 and
          j1["active_leases"] == 2 and abs(j1["last_loss"] - 3.25) < 1e-6 and
          j1["created_unix_ms"] == 1700000000001, "job list --json fields", out)
    check(doc["jobs"][2]["last_loss"] is None, "NaN loss is null in JSON", out)
    rc, out, err = run(ctl, ["job", "list", "--json", "--state", "done"], addr)
    check(rc == 0 and [j["job_id"] for j in json.loads(out)["jobs"]] == [2], "job list --state done", out)
    rc, out, err = run(ctl, ["job", "list", "--state", "sleeping"], addr)
    check(rc == 2 and "unknown state" in err, "job list --state bad is a usage error", err)

    # --- job show: every hyperparameter of the spec, JSON spec object.
    rc, out, err = run(ctl, ["job", "show", "1"], addr)
    kv = {}
    for line in out.splitlines():
        k, _, v = line.partition(" ")
        kv[k] = v.strip()
    check(rc == 0 and kv.get("job") == "1" and kv.get("state") == "RUNNING" and
          kv.get("algorithm") == "sync" and kv.get("spec.algorithm") == "diloco", "job show header", out)
    want = {"inner.lr": "0.00125", "inner.warmup": "2", "inner.weight_decay": "0.05",
            "inner.lr_min_frac": "0.1", "inner.beta1": "0.9", "inner.beta2": "0.95",
            "inner.eps": "1e-08", "inner.grad_clip": "1", "inner.state": "keep",
            "outer.lr": "0.65", "outer.momentum": "0.85", "outer.nesterov": "true",
            "replicas": "2", "inner_steps": "3", "rounds": "3", "batch": "4", "seq_len": "16",
            "quorum": "1", "weighting": "uniform"}
    bad = {k: (kv.get(k), v) for k, v in want.items() if kv.get(k) != v}
    check(not bad, "job show lists every inner/outer hyperparameter", str(bad))
    rc, out, err = run(ctl, ["job", "show", "1", "--json"], addr)
    d = json.loads(out)
    check(rc == 0 and d["job_id"] == 1 and d["spec"]["inner"]["lr"] == 0.00125 and
          d["spec"]["outer"]["momentum"] == 0.85 and d["spec"]["algorithm"] == "diloco" and
          json.loads(d["spec_json"]) == d["spec"], "job show --json spec", out)

    # --- errors.
    rc, out, err = run(ctl, ["job", "show", "42"], addr)
    check(rc == 1 and err == "dipacoctl job show: NOT_FOUND: job 42 does not exist\n" and out == "",
          "job show 42 → NOT_FOUND message, exit 1", repr(err))
    for args, what in [(["job", "show", "x"], "non-numeric id"), (["job", "show"], "missing id"),
                       (["job", "show", "0"], "id 0"), (["job", "frob"], "unknown subcommand"),
                       (["job", "list", "--bogus"], "unknown flag"), (["frobnicate"], "unknown command"),
                       (["job", "list", "--path", "1"], "flag of another command"),
                       (["job", "export", "1", "--out", tmp], "export without --path")]:
        rc, out, err = run(ctl, args, addr)
        check(rc == 2 and err.startswith("dipacoctl") and out == "", f"usage error: {what}", err)

    # --- pause / resume / cancel.
    rc, out, err = run(ctl, ["job", "pause", "1", "--reason", "maintenance"], addr)
    check(rc == 0 and out == "job 1 PAUSED\n", "job pause", out + err)
    rc, out, err = run(ctl, ["job", "resume", "1", "--json"], addr)
    check(rc == 0 and json.loads(out)["state"] == "RUNNING", "job resume --json", out + err)
    rc, out, err = run(ctl, ["job", "cancel", "2"], addr)
    check(rc == 1 and err.startswith("dipacoctl job cancel: FAILED_PRECONDITION: job 2 is finished"),
          "job cancel of a finished job", err)

    # --- job wait.
    rc, out, err = run(ctl, ["job", "wait", "7", "--poll-ms", "50"], addr)
    prog = [l for l in err.splitlines() if l.startswith("job 7:")]
    check(rc == 0 and out == "job 7 DONE\n", "job wait 7 → DONE, exit 0", out + err)
    check(len(prog) == 3 and "RUNNING round 0/3" in prog[0] and "RUNNING round 1/3" in prog[1] and
          "DONE round 3/3" in prog[2], "job wait progress lines on change", err)
    rc, out, err = run(ctl, ["job", "wait", "8", "--json"], addr)
    check(rc == 1 and json.loads(out)["state"] == "FAILED" and "worker exploded" in err,
          "job wait of a FAILED job → exit 1", out + err)
    t0 = time.time()
    rc, out, err = run(ctl, ["job", "wait", "9", "--timeout", "0.5", "--poll-ms", "100"], addr)
    dt = time.time() - t0
    check(rc == 3 and "timed out" in err and dt < 10, f"job wait --timeout → exit 3 ({dt:.1f} s)", err)
    rc, out, err = run(ctl, ["job", "wait", "42"], addr)
    check(rc == 1 and "NOT_FOUND" in err, "job wait of an unknown job", err)

    # --- workers / paths / modules / status.
    rc, out, err = run(ctl, ["workers"], addr)
    rows = [l.split() for l in out.splitlines()[1:]]
    check(rc == 0 and len(rows) == 1 and rows[0][:6] == ["11", "node-a", "cpu", "TRAINING", "1", "p0/r1"],
          "workers table (gone hidden)", out + err)
    rc, out, err = run(ctl, ["workers", "--all", "--json"], addr)
    ws = json.loads(out)["workers"]
    check(rc == 0 and [w["worker_id"] for w in ws] == [11, 12] and ws[1]["state"] == "GONE" and
          ws[0]["device"] == 'x86 "test" cpu' and ws[0]["slot"] == {"path": 0, "replica": 1} and
          ws[1]["slot"] is None and ws[0]["steps_per_sec"] == 1.5, "workers --all --json", out)
    rc, out, err = run(ctl, ["paths", "1", "--json"], addr)
    p = json.loads(out)
    check(rc == 0 and p["paths"][0]["modules"] == [0] and
          [(s["replica"], s["worker_id"], s["step"]) for s in p["paths"][0]["slots"]] == [(0, 0, 3), (1, 11, 4)] and
          p["paths"][0]["slots"][0]["last_loss"] is None, "paths --json", out)
    rc, out, err = run(ctl, ["paths", "1"], addr)
    slots_t, _, data_t = out.partition("\n\n")
    rows = [l.split() for l in slots_t.splitlines()[1:]]
    check(rc == 0 and rows == [["0", "0", "0", "-", "-", "3", "-"], ["0", "0", "1", "11", "21", "4", "3.5000"]] and
          [l.split() for l in data_t.splitlines()[1:]] == [["0", "-", "3.5000", "-"]], "paths table", out)
    rc, out, err = run(ctl, ["modules", "1", "--json"], addr)
    m = json.loads(out)["modules"]
    check(rc == 0 and m[0]["num_floats"] == 12345 and m[0]["fragments"][0]["crc32c"] == "deadbeef" and
          m[0]["fragments"][0]["version"] == 1, "modules --json", out)
    rc, out, err = run(ctl, ["modules", "42"], addr)
    check(rc == 1 and err == "dipacoctl modules: NOT_FOUND: job 42 does not exist\n", "modules of unknown job", err)
    rc, out, err = run(ctl, ["status", "--json"], addr)
    s = json.loads(out)
    check(rc == 0 and s["health"] == "SERVING" and s["jobs"]["total"] == 5 and s["jobs"]["running"] >= 2 and
          s["jobs"]["done"] == 1 and s["jobs"]["failed"] == 1 and s["workers"]["total"] == 2 and
          s["workers"]["gone"] == 1 and s["coordinator"] == addr, "status --json", out)
    rc, out, err = run(ctl, ["status"], addr)
    check(rc == 0 and out.splitlines()[0].split() == ["coordinator", addr, "SERVING"], "status table", out)

    # --- export: byte-identical to what the server holds, twice; failures leave nothing.
    served = os.path.join(srvdir, "served")
    for k in (1, 2):
        outdir = os.path.join(tmp, f"exp{k}")
        rc, out, err = run(ctl, ["job", "export", "1", "--path", "0", "--out", outdir] +
                           (["--json"] if k == 2 else []), addr)
        same = rc == 0 and all(read(os.path.join(outdir, f)) == read(os.path.join(served, f))
                               for f in ("config.json", "model.safetensors"))
        check(same, f"export #{k} is byte-identical to the served model", out + err)
        check(sorted(os.listdir(outdir)) == ["config.json", "model.safetensors"],
              f"export #{k} leaves no temporary files", str(os.listdir(outdir)))
    d = json.loads(out)
    check(d["version"] == 3 and d["n_layer"] == 2 and d["n_embd"] == 64 and
          d["safetensors_bytes"] == os.path.getsize(os.path.join(served, "model.safetensors")),
          "export --json summary", out)
    rc, out, err = run(ctl, ["job", "export", "1", "--path", "0", "--version", "5", "--out",
                             os.path.join(tmp, "exp5"), "--json"], addr)
    check(rc == 0 and json.loads(out)["version"] == 5, "export --version is sent", out + err)
    for path, what, msg in [("1", "corrupted CRC-32C", "CRC-32C"), ("2", "truncated stream", "ended before"),
                            ("7", "unknown path", "NOT_FOUND: job 1 has no path 7")]:
        outdir = os.path.join(tmp, f"bad{path}")
        rc, out, err = run(ctl, ["job", "export", "1", "--path", path, "--out", outdir], addr)
        left = os.listdir(outdir) if os.path.isdir(outdir) else []
        check(rc == 1 and msg in err and left == [], f"export with {what} fails and writes nothing",
              err + str(left))

    # --- job create: spec with a relative init dir, run from another cwd.
    specdir = os.path.join(tmp, "spec")
    initdir = os.path.join(specdir, "init")
    os.makedirs(specdir)
    rc, out, err = run(ctl, ["init", "--n-layer", "2", "--n-head", "2", "--n-embd", "32",
                             "--n-positions", "64", "--vocab-size", "256", "--seed", "3",
                             "--out", initdir], addr)
    check(rc == 0, "dipacoctl init makes the initial model", err)
    spec = {"name": "fromctl", "model": {"init": "init"}, "data": {"train": ["train.bin"]},
            "algorithm": "diloco", "replicas": 2, "inner_steps": 3, "rounds": 3, "batch": 2,
            "seq_len": 16, "outer": {"lr": 0.7, "momentum": 0.9}}
    with open(os.path.join(specdir, "job.json"), "w") as f:
        json.dump(spec, f)
    rc, out, err = run(ctl, ["job", "create", os.path.join(specdir, "job.json")], addr, cwd="/")
    check(rc == 0 and out == "100\n", "job create prints the job id", out + err)
    check(read(os.path.join(srvdir, "uploaded.safetensors")) == read(os.path.join(initdir, "model.safetensors")),
          "uploaded bytes equal the init model's safetensors")
    sent = json.loads(read(os.path.join(srvdir, "created_spec.json")))
    check(sent["model"]["init"] == os.path.realpath(initdir) and sent["model"]["n_layer"] == 2 and
          sent["model"]["n_embd"] == 32 and sent["model"]["n_positions"] == 64 and
          sent["model"]["vocab_size"] == 256 and sent["name"] == "fromctl" and
          sent["inner"]["lr"] == 3e-4, "CreateJob spec: canonical, absolute init, shape merged", json.dumps(sent))
    check(read(os.path.join(srvdir, "created_upload_id")) == b"55\n", "CreateJob carries the upload id")
    spec2 = dict(spec, name="shaped", model={"n_layer": 1, "n_head": 1, "n_embd": 8,
                                             "n_positions": 16, "vocab_size": 32, "seed": 9})
    with open(os.path.join(specdir, "job2.json"), "w") as f:
        json.dump(spec2, f)
    rc, out, err = run(ctl, ["job", "create", os.path.join(specdir, "job2.json"), "--paused", "--json"], addr)
    d = json.loads(out) if rc == 0 else {}
    check(rc == 0 and d.get("state") == "PAUSED" and d.get("job_id") == 101 and
          read(os.path.join(srvdir, "created_upload_id")) == b"0\n", "job create --paused, no init", out + err)
    bad = dict(spec, inner={"lrr": 1})
    with open(os.path.join(specdir, "bad.json"), "w") as f:
        json.dump(bad, f)
    rc, out, err = run(ctl, ["job", "create", os.path.join(specdir, "bad.json")], addr)
    check(rc == 1 and "inner.lrr" in err and out == "", "job create rejects a bad spec locally", err)
    rc, out, err = run(ctl, ["job", "create", os.path.join(specdir, "missing.json")], addr)
    check(rc == 1 and "missing.json" in err, "job create of a missing file", err)

    # --- unreachable coordinator.
    rc, out, err = run(ctl, ["status"], "127.0.0.1:1", {"DIPACO_CTL_TIMEOUT_MS": "3000"})
    check(rc == 1 and err.startswith("dipacoctl status: UNAVAILABLE") and "127.0.0.1:1" in err,
          "unreachable coordinator → UNAVAILABLE, exit 1", err)
    rc, out, err = run(ctl, ["--coordinator", addr, "job", "list", "--json"], "127.0.0.1:1")
    check(rc == 0 and len(json.loads(out)["jobs"]) == 5, "--coordinator overrides $DIPACO_COORDINATOR", err)


def token_tests(ctl, fake, tmp):
    srv = Server(fake, os.path.join(tmp, "srv_tok"), token="s3cret")
    try:
        rc, out, err = run(ctl, ["job", "list"], srv.addr)
        check(rc == 1 and "PERMISSION_DENIED: admin token required" in err, "no token → PERMISSION_DENIED", err)
        rc, out, err = run(ctl, ["job", "list", "--json"], srv.addr, {"DIPACO_ADMIN_TOKEN": "s3cret\n"})
        check(rc == 0 and len(json.loads(out)["jobs"]) == 5, "$DIPACO_ADMIN_TOKEN is sent as Bearer", err)
        outdir = os.path.join(tmp, "tokexp")
        rc, out, err = run(ctl, ["job", "export", "1", "--path", "0", "--out", outdir], srv.addr,
                           {"DIPACO_ADMIN_TOKEN": "s3cret"})
        check(rc == 0, "token on streaming calls", err)
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())
