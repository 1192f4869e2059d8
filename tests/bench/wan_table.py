#!/usr/bin/env python3
"""wan_table.py — the tables of tests/bench/wan.sh from its result lines ("profile row status
wall_s bytes_in bytes_out tokens peak_sync loss link_bytes [after=A R=W rounds=N full=F]
message...", one per row): per link profile, each row's wall clock, tensor bytes (in + out, the
coordinator's counters) per trained token, the largest single sync, the eval loss, wall clock
and bytes as ratios to the profile's dp row, and the bytes the coordinator's veths counted (gRPC
framing included) per trained token; then, for lines with the key=value fields, the bytes per
direction: pushed, pulled, pulled after each worker's first whole pull (A), A ÷ pushed, and a
slot's pull per round after the first (A ÷ (W·(N − 1))) in streams ((pushed ÷ (W·N)) bytes each)
per other slot (÷ (W − 1)) and as a share of one whole pull (F). Rows the coordinator refused
(or that failed) show their message instead.

usage: wan_table.py RESULTS [--markdown]
"""
import argparse


def num(s):
    try:
        return float(s)
    except ValueError:
        return None


def human(b):
    if b is None:
        return "n/a"
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= k:
            return "%.1f %s" % (b / k, unit)
    return "%d B" % b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    profiles = {}
    for line in open(a.results):
        f = line.split()
        if len(f) < 10:
            continue
        prof, row, status, wall, bin_, bout, tokens, peak, loss, link = f[:10]
        kv, rest = {}, f[10:]
        while rest and "=" in rest[0] and rest[0].split("=", 1)[0] in ("after", "R", "rounds", "full"):
            k, v = rest.pop(0).split("=", 1)
            kv[k] = num(v)
        msg = " ".join(rest) if rest else "-"
        r = dict(row=row, status=status, wall=num(wall), tokens=num(tokens), peak=num(peak), loss=num(loss),
                 link=num(link), msg=msg, bin=num(bin_), bout=num(bout), kv=kv)
        r["bytes"] = (num(bin_) or 0) + (num(bout) or 0) if status == "ok" else None
        profiles.setdefault(prof, []).append(r)
    cols = ["row", "link", "wall s", "bytes/token", "bytes total", "peak sync bytes", "eval loss", "wall ÷ dp",
            "bytes ÷ dp", "link bytes/token"]
    first = True
    for prof, rows in profiles.items():
        dp = next((r for r in rows if r["row"] == "dp" and r["status"] == "ok"), None)
        out = []
        for r in rows:
            if r["status"] != "ok":
                out.append([r["row"], prof, r["status"] + ": " + r["msg"]])
                continue
            bpt = r["bytes"] / r["tokens"] if r["tokens"] else None
            wr = "%.3f" % (r["wall"] / dp["wall"]) if dp and dp["wall"] else "-"
            br = "%.4f" % (r["bytes"] / dp["bytes"]) if dp and dp["bytes"] else "-"
            out.append([r["row"], prof, "%.1f" % r["wall"], "%.1f" % bpt if bpt is not None else "-", human(r["bytes"]),
                        human(r["peak"]), "%.4f" % r["loss"] if r["loss"] is not None else "-", wr, br,
                        "%.1f" % (r["link"] / r["tokens"]) if r["link"] is not None and r["tokens"] else "-"])
        if a.markdown:
            if first:
                print("| " + " | ".join(cols) + " |")
                print("|---" * len(cols) + "|")
            for o in out:
                if len(o) == 3:
                    o = o[:2] + [o[2]] + [""] * (len(cols) - 3)
                print("| " + " | ".join(o) + " |")
        else:
            if not first:
                print()
            w = [max([len(c)] + [len(o[i]) for o in out if i < 2 or len(o) > 3]) for i, c in enumerate(cols)]
            print("  ".join(c.ljust(w[i]) for i, c in enumerate(cols)).rstrip())
            for o in out:
                if len(o) == 3:
                    print("  ".join([o[0].ljust(w[0]), o[1].ljust(w[1]), o[2]]))
                else:
                    print("  ".join(x.ljust(w[i]) for i, x in enumerate(o)).rstrip())
        first = False
    directions(profiles, a.markdown)


def directions(profiles, markdown):
    """The bytes per direction of the rows whose lines carry after=/R=/rounds=/full=."""
    cols = ["row", "link", "pushed", "pulled", "pulled after 1st", "after 1st ÷ pushed", "slot pull/round ÷ (R−1) streams",
            "slot pull/round ÷ whole pull"]
    out = []
    for prof, rows in profiles.items():
        for r in rows:
            kv = r["kv"]
            if r["status"] != "ok" or not all(k in kv for k in ("after", "R", "rounds", "full")):
                continue
            R, n, after = kv["R"], kv["rounds"], kv["after"]
            stream = r["bin"] / (R * n) if R and n else None
            per = after / (R * (n - 1)) if R and n > 1 else None
            out.append([r["row"], prof, human(r["bin"]), human(r["bout"]), human(after),
                        "%.3f" % (after / r["bin"]) if r["bin"] else "-",
                        "%.3f" % (per / stream / (R - 1)) if per is not None and stream and R > 1 else "-",
                        "%.3f" % (per / kv["full"]) if per is not None and kv["full"] else "-"])
    if not out:
        return
    print()
    if markdown:
        print("| " + " | ".join(cols) + " |")
        print("|---" * len(cols) + "|")
        for o in out:
            print("| " + " | ".join(o) + " |")
    else:
        w = [max([len(c)] + [len(o[i]) for o in out]) for i, c in enumerate(cols)]
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(cols)).rstrip())
        for o in out:
            print("  ".join(x.ljust(w[i]) for i, x in enumerate(o)).rstrip())


if __name__ == "__main__":
    main()
