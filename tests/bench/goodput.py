#!/usr/bin/env python3
"""goodput.py — the driver of tests/bench/goodput.sh: a sync DiLoCo job run as a
user would, on the daemons' default flags, while a seeded schedule stops random live workers
(SIGTERM: a spot notice; SIGKILL: none) and starts a replacement worker a few seconds later;
goodput = fault-free wall clock / faulty wall clock at the same inner steps, and the final
held-out eval loss as a ratio to the fault-free run's.

usage: goodput.py run --co BIN --wk BIN --ctl BIN --work DIR [--rm-work]
       goodput.py table RESULTS

`run` reads its sizes from the environment (documented in goodput.sh), appends one line per
run to $RESULTS (and WORK/results.txt):
    scenario mode kind repeat wall_s loss stops stops_on_holders missed
(kind "none" is a fault-free run; missed = the slot-rounds the ledger says closed without
their delta), prints progress on stderr and the table on stdout. Every daemon it starts is
stopped on exit, also on SIGINT/SIGTERM (and dies with the driver, PR_SET_PDEATHSIG).
"""
import argparse
import collections
import ctypes
import datetime
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

PROCS = []  # every daemon started (subprocess.Popen), stopped by stop_all()
_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def env_num(name, default, kind):
    v = os.environ.get(name, "").strip()
    try:
        return kind(v) if v else default
    except ValueError:
        sys.exit(f"goodput: {name}={v!r}: want {'an integer' if kind is int else 'a number'}")


def env_int(name, default):
    return env_num(name, default, int)


def env_float(name, default):
    return env_num(name, default, float)


def env_list(name, default):
    v = os.environ.get(name)
    return (default if v is None else v).split()  # set but empty: an empty list


def die_with_parent():
    # The daemons die with the driver, whatever kills it (a SIGKILLed driver runs no cleanup).
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(argv, logfile, env):
    with open(logfile, "ab") as f:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f,
                             env=env, preexec_fn=die_with_parent)
    PROCS.append(p)
    return p


def stop_procs(procs, wait_s=5.0):
    """SIGTERM, up to wait_s for a clean exit, then SIGKILL; reaps them all."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stop_all():
    stop_procs([p for p in PROCS if p.poll() is None], 3.0)
    PROCS.clear()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Bench:
    def __init__(self, a):
        self.co, self.wk, self.ctlbin, self.work = a.co, a.wk, a.ctl, os.path.abspath(a.work)
        self.R = 4
        self.rounds = env_int("ROUNDS", 60)
        self.H = env_int("H", 100)
        self.step_ms = env_int("STEP_MS", 7)
        self.B = env_int("B", 4)
        self.T = env_int("T", 32)
        self.C = env_int("C", 32)
        self.L = env_int("L", 1)
        self.lr = env_float("LR", 0.003)
        self.repeats = env_int("REPEATS", 2)
        self.mean_stop_s = env_float("MEAN_STOP_S", 8.0)
        self.restart_s = env_float("RESTART_S", 4.0)
        self.scenarios = env_list("SCENARIOS", "spare nospare")
        self.modes = env_list("MODES", "exact quorum")
        self.kinds = env_list("KINDS", "TERM KILL")
        self.seed = env_int("SEED", 1)
        self.model_seed = env_int("MODEL_SEED", 7)
        self.eval_batches = env_int("EVAL_BATCHES", 32)
        self.round_timeout_s = env_float("ROUND_TIMEOUT_S", 30.0)
        self.grace_s = env_float("GRACE_S", None)
        self.job_timeout_s = env_int("JOB_TIMEOUT_S", 1800)
        self.results = os.environ.get("RESULTS", "").strip()
        for s in self.scenarios:
            if s not in ("spare", "nospare"):
                sys.exit(f"goodput: SCENARIOS: unknown scenario {s!r} (spare, nospare)")
        for m in self.modes:
            if m not in ("exact", "quorum"):
                sys.exit(f"goodput: MODES: unknown mode {m!r} (exact, quorum)")
        for k in self.kinds:
            if k not in ("TERM", "KILL"):
                sys.exit(f"goodput: KINDS: unknown stop kind {k!r} (TERM, KILL)")
        if self.mean_stop_s <= 0 or self.restart_s < 0 or self.repeats < 1 or self.rounds < 1 or self.H < 1:
            sys.exit("goodput: want MEAN_STOP_S > 0, RESTART_S >= 0, REPEATS >= 1, ROUNDS >= 1, H >= 1")
        self.init = os.path.join(self.work, "init")
        self.val = sorted(f for f in os.listdir(os.path.join(self.work, "data")) if f.startswith("val_"))
        if not self.val:
            sys.exit(f"goodput: no val_*.bin under {self.work}/data")
        self.val = [os.path.join(self.work, "data", f) for f in self.val]
        self.env = dict(os.environ)
        self.env.pop("DIPACO_COORDINATOR", None)

    # ---------------------------------------------------------------- helpers ----
    def ctl(self, *args, timeout=60, check=True):
        r = subprocess.run([self.ctlbin, "--coordinator", self.addr, *args], env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"dipacoctl {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def workers(self):
        """{name: lease_id} of the workers the coordinator does not count as gone; None when the call fails."""
        try:
            r = self.ctl("workers", "--json", timeout=10, check=False)
            if r.returncode != 0:
                return None
            ws = json.loads(r.stdout)["workers"]
        except (subprocess.TimeoutExpired, ValueError, KeyError):
            return None
        return {w["hostname"]: w.get("lease_id", 0) for w in ws if w.get("state") != "GONE"}

    def start_coordinator(self, d):
        self.addr = f"127.0.0.1:{free_port()}"
        state = os.path.join(d, "state")
        self.coord = spawn([self.co, "--listen", self.addr, "--state-dir", state], os.path.join(d, "coordinator.log"),
                           self.env)
        for _ in range(200):
            if self.coord.poll() is not None:
                raise RuntimeError(f"coordinator exited with {self.coord.returncode}: see {d}/coordinator.log")
            try:
                jt = open(os.path.join(state, "join.token")).read().strip()
                at = open(os.path.join(state, "admin.token")).read().strip()
            except OSError:
                jt = at = ""
            if jt and at:
                self.env["DIPACO_JOIN_TOKEN"], self.env["DIPACO_ADMIN_TOKEN"] = jt, at
                if self.ctl("status", timeout=5, check=False).returncode == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"coordinator did not come up on {self.addr}: see {d}/coordinator.log")

    def start_worker(self, d, name):
        # The daemons' defaults except what the scenario needs: a device of fixed speed
        # (--min-step-ms, one thread) and an exit once the job is over.
        return spawn([self.wk, "--coordinator", self.addr, "--data-dir", self.work, "--name", name, "--threads", "1",
                      "--min-step-ms", str(self.step_ms), "--exit-when-done"],
                     os.path.join(d, f"worker-{name}.log"), self.env)

    def spec(self, mode):
        s = {"name": "goodput", "model": {"init": self.init}, "data": {"train": ["data/train_*.bin"]},
             "algorithm": "diloco", "replicas": self.R, "inner_steps": self.H, "rounds": self.rounds,
             "batch": self.B, "seq_len": self.T, "inner": {"lr": self.lr, "warmup": self.H}}
        if mode == "quorum":
            s["quorum"] = (self.R - 1) / self.R
            s["weighting"] = "tokens"
            s["round_timeout_s"] = self.round_timeout_s
            if self.grace_s is not None:
                s["quorum_grace_s"] = self.grace_s
        return s

    def eval_loss(self, model):
        r = subprocess.run([self.ctlbin, "eval", "--model", model, "--data", *self.val, "--batch", str(self.B),
                            "--seq-len", str(self.T), "--batches", str(self.eval_batches), "--threads", "1", "--json"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"dipacoctl eval: exit {r.returncode}: {r.stderr.strip()}")
        return json.loads(r.stdout)["loss"]

    # ------------------------------------------------------------------- a run ----
    def run(self, scenario, mode, kind, rep):
        """One job from a fresh coordinator; kind "none" stops nobody. Returns the RESULTS fields."""
        d = os.path.join(self.work, f"run_{scenario}_{mode}_{kind}_{rep}")
        os.makedirs(d)
        with open(os.path.join(d, "spec.json"), "w") as f:
            json.dump(self.spec(mode), f)
        nw = self.R + (1 if scenario == "spare" else 0)
        self.start_coordinator(d)
        live = {}  # name -> Popen, the workers not stopped by the schedule
        for i in range(1, nw + 1):
            live[f"w{i}"] = self.start_worker(d, f"w{i}")
        for _ in range(300):  # every worker registered before the clock starts
            ws = self.workers()
            if ws is not None and all(n in ws for n in live):
                break
            dead = [n for n, p in live.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"worker {dead[0]} exited at start: see {d}/worker-{dead[0]}.log")
            time.sleep(0.1)
        else:
            raise RuntimeError(f"the workers did not all register: see {d}")

        # The same schedule for every mode and kind of a repeat: inter-stop times from one RNG,
        # the victims (an index into the sorted live names) from another.
        times = random.Random(self.seed * 1000 + rep)
        picks = random.Random(self.seed * 1000 + rep + 500)
        t0 = time.monotonic()
        job = self.ctl("job", "create", os.path.join(d, "spec.json")).stdout.strip().split()[-1]
        with open(os.path.join(d, "wait.log"), "wb") as wl:
            waiter = subprocess.Popen([self.ctlbin, "--coordinator", self.addr, "job", "wait", job, "--timeout",
                                       str(self.job_timeout_s), "--poll-ms", "50"], env=self.env,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=wl,
                                      preexec_fn=die_with_parent)
        PROCS.append(waiter)
        next_stop = t0 + times.expovariate(1.0 / self.mean_stop_s) if kind != "none" else math.inf
        restarts = collections.deque()  # (time, name), in time order
        stopped = []  # (unix time, name) of every stop
        skipped = nrep = 0
        events = open(os.path.join(d, "stops.log"), "w")
        while waiter.poll() is None:
            now = time.monotonic()
            if now >= next_stop:
                names = sorted(n for n, p in live.items() if p.poll() is None)
                if names:
                    victim = names[picks.randrange(len(names))]
                    live[victim].send_signal(signal.SIGTERM if kind == "TERM" else signal.SIGKILL)
                    stopped.append((time.time(), victim))
                    del live[victim]
                    nrep += 1
                    restarts.append((now + self.restart_s, f"r{nrep}"))
                    events.write(f"{now - t0:.3f} SIG{kind} {victim}\n")
                else:
                    skipped += 1
                    events.write(f"{now - t0:.3f} no live worker to stop\n")
                events.flush()
                next_stop += times.expovariate(1.0 / self.mean_stop_s)
            while restarts and restarts[0][0] <= now:
                _, name = restarts.popleft()
                live[name] = self.start_worker(d, name)
                events.write(f"{now - t0:.3f} started {name}\n")
            for p in PROCS:
                p.poll()  # reap the stopped ones
            time.sleep(0.02)
        wall = time.monotonic() - t0
        events.close()
        if waiter.returncode != 0:
            raise RuntimeError(f"job {job} did not finish (job wait exit {waiter.returncode}): see {d}")
        self.ctl("job", "export", job, "--path", "0", "--out", os.path.join(d, "out"))
        missed = 0
        r = self.ctl("job", "ledger", job, "--json", check=False)
        try:
            missed = len(json.loads(r.stdout).get("missed", []))
        except ValueError:
            missed = -1
        stop_procs([p for p in PROCS if p.poll() is None])
        PROCS.clear()
        loss = self.eval_loss(os.path.join(d, "out"))
        held, notes = coordinator_story(os.path.join(d, "coordinator.log"), stopped)
        if skipped:
            notes.append(f"{skipped} scheduled stops found no live worker")
        if kind != "none" and not stopped:
            notes.append("no stop landed before the job ended: raise ROUNDS or lower MEAN_STOP_S")
        return f"{scenario} {mode} {kind} {rep} {wall:.2f} {loss:.4f} {len(stopped)} {held} {missed}", notes

    def main(self):
        subprocess.run([self.ctlbin, "init", "--n-layer", str(self.L), "--n-head", "2", "--n-embd", str(self.C),
                        "--n-positions", str(self.T), "--vocab-size", "256", "--seed", str(self.model_seed), "--out",
                        self.init], check=True, capture_output=True)
        grace = ("quorum_grace_s unset (the coordinator's default)" if self.grace_s is None
                 else f"quorum_grace_s {self.grace_s:g}")
        log(f"goodput: sync DiLoCo, R={self.R}, GPT-2 L={self.L} C={self.C} T={self.T} byte vocab, B={self.B}, "
            f"{self.rounds} rounds x H={self.H}, {self.step_ms} ms per inner step (--min-step-ms, 1 thread); "
            f"a stop every ~{self.mean_stop_s:g} s (exponential, seed {self.seed}), replacement {self.restart_s:g} s "
            f"later; quorum mode: quorum {(self.R - 1) / self.R:g}, tokens, round_timeout_s "
            f"{self.round_timeout_s:g}, {grace}; {self.repeats} repeats")
        all_res = os.path.join(self.work, "results.txt")
        for scenario in self.scenarios:
            for mode in self.modes:
                for rep in range(1, self.repeats + 1):
                    for kind in ["none"] + self.kinds:
                        t = time.monotonic()
                        line, notes = self.run(scenario, mode, kind, rep)
                        log(f"  {line}   ({time.monotonic() - t:.0f} s with set-up and eval; load average "
                            f"{os.getloadavg()[0]:.1f}" + "".join("; " + n for n in notes) + ")")
                        for path in [all_res] + ([self.results] if self.results else []):
                            with open(path, "a") as f:
                                f.write(line + "\n")
        log(f"goodput: done; {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
        print_table(all_res)


# ------------------------------------------------------------- coordinator log ----
GRANT = re.compile(r"^lease (\d+) granted: .* to worker (\d+)$")
END = re.compile(r"^(?:delta received: lease (\d+) |lease (\d+) (?:released|revoked|expired))")
REGISTERED = re.compile(r"^worker (\d+) registered: host (\S+)")
COUNTED = (("heartbeat revocations", re.compile(r"^lease \d+ revoked: worker \d+ sent no heartbeat")),
           ("lease expiries", re.compile(r"^lease \d+ expired")),
           ("workers gone", re.compile(r"^worker \d+ \(\S+\) is gone")),
           ("released", re.compile(r"^lease \d+ released by worker")))


def log_time(ts):
    return datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def coordinator_story(path, stopped):
    """From the coordinator's JSON log: how many of the stops (unix time, worker name) hit a
    worker that held a lease at that moment (granted, and neither pushed, released, revoked nor
    expired yet), and a few counts of what the coordinator did."""
    hosts = collections.defaultdict(set)  # name -> worker ids
    grants, ends = {}, {}
    counts = collections.Counter()
    for line in open(path, errors="replace"):
        try:
            e = json.loads(line)
            msg, t = e["msg"], log_time(e["ts"])
        except (ValueError, KeyError):
            continue
        m = REGISTERED.match(msg)
        if m:
            hosts[m.group(2)].add(m.group(1))
        m = GRANT.match(msg)
        if m:
            grants[m.group(1)] = (m.group(2), t)
        m = END.match(msg)
        if m:
            ends.setdefault(m.group(1) or m.group(2), t)
        for name, rx in COUNTED:
            if rx.match(msg):
                counts[name] += 1
    held = 0
    for t, name in stopped:
        ids = hosts.get(name, set())
        if any(w in ids and g <= t < ends.get(lease, math.inf) for lease, (w, g) in grants.items()):
            held += 1
    notes = ["coordinator: " + ", ".join(f"{counts[n]} {n}" for n, _ in COUNTED)] if stopped else []
    return held, notes


# ------------------------------------------------------------------------ table ----
def mean_range(xs, fmt):
    if not xs:
        return "-"
    m = sum(xs) / len(xs)
    if len(xs) == 1:
        return fmt % m
    return (fmt + " (" + fmt + "-" + fmt + ")") % (m, min(xs), max(xs))


def print_table(path):
    """The Markdown table of a results file: per (scenario, mode), the fault-free walls and, per
    stop kind, goodput and loss ratio as mean (min-max) over the repeats, and the stops."""
    runs = collections.defaultdict(list)  # (scenario, mode, kind) -> [(wall, loss, stops, holders, missed)]
    order = []
    for line in open(path):
        f = line.split()
        if len(f) < 8:
            continue
        sc, mode, kind = f[0], f[1], f[2]
        if (sc, mode) not in order:
            order.append((sc, mode))
        runs[(sc, mode, kind)].append((float(f[4]), float(f[5]), int(f[6]), int(f[7]),
                                       int(f[8]) if len(f) > 8 else 0))
    kinds = [k for k in ("TERM", "KILL") if any(k == key[2] for key in runs)]
    head = ["scenario", "mode", "fault-free wall s: median (runs)"]
    for k in kinds:
        head += [f"SIG{k}: goodput", "loss ratio", "stops (on lease holders) / missed"]
    print("| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for sc, mode in order:
        ff = runs.get((sc, mode, "none"), [])
        ffwall = statistics.median([r[0] for r in ff]) if ff else None
        ffloss = sum(r[1] for r in ff) / len(ff) if ff else None
        row = [sc, mode, "-" if not ff else "%.1f (%s)" % (ffwall, ", ".join("%.1f" % r[0] for r in ff))]
        for k in kinds:
            v = runs.get((sc, mode, k), [])
            if not v or not ff:
                row += ["-", "-", "-"]
                continue
            row.append(mean_range([ffwall / r[0] for r in v], "%.2f"))
            row.append(mean_range([r[1] / ffloss for r in v], "%.3f"))
            row.append("%d (%d) / %d" % (sum(r[2] for r in v), sum(r[3] for r in v), sum(r[4] for r in v)))
        print("| " + " | ".join(row) + " |")
    print("\ngoodput = median fault-free wall / faulty wall; loss ratio = final held-out eval loss / the "
          "fault-free runs' mean; mean (min-max) over repeats; stops summed over repeats, \"on lease holders\": "
          "the stopped worker held a lease at that moment; missed: slot-rounds closed without their delta")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--co", required=True)
    r.add_argument("--wk", required=True)
    r.add_argument("--ctl", required=True)
    r.add_argument("--work", required=True, help="holds data/ (train_*.bin, val_*.bin); the runs go under it")
    r.add_argument("--rm-work", action="store_true", help="remove WORK on exit")
    t = sub.add_parser("table")
    t.add_argument("results")
    a = ap.parse_args()
    if a.cmd == "table":
        print_table(a.results)
        return 0

    def on_signal(signum, _frame):
        log(f"goodput: interrupted by signal {signum}; stopping every daemon it started")
        raise SystemExit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    ok = interrupted = False
    try:
        Bench(a).main()
        ok = True
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        log(f"goodput: FAIL: {e}")
    except SystemExit:
        interrupted = True
        raise
    finally:
        stop_all()
        if a.rm_work and (ok or interrupted):
            shutil.rmtree(a.work, ignore_errors=True)
        else:
            log(f"goodput: work directory kept: {a.work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
