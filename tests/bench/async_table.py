#!/usr/bin/env python3
"""async_table.py — the table of tests/bench/async_heterogeneity.sh from its result lines
("level algo seed loss wall staleness_mean staleness_max", one per run): per heterogeneity
level and algorithm, eval loss and wall clock as mean ± half the range over the seeds, the
loss as a ratio to sync DiLoCo's mean, and the async ledger's mean staleness.

usage: async_table.py RESULTS [--algos "sync async-nesterov async-dn async-dn-dylu"] [--markdown]
"""
import argparse
import collections

SLOW = {"none": "1,1,1,1", "slight": "1,1.2,1.4,1.6", "moderate": "1,1.5,2,3", "very": "1,1.3,2.6,5.7"}
NAMES = {"sync": "sync DiLoCo", "async-nesterov": "async Nesterov", "async-dn": "async DN",
         "async-dn-dylu": "async DN+DyLU"}


def mean_spread(xs, fmt):
    m = sum(xs) / len(xs)
    return (fmt + " ± " + fmt) % (m, (max(xs) - min(xs)) / 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--algos", default="sync async-nesterov async-dn async-dn-dylu")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    algos = a.algos.split()
    cell = collections.defaultdict(list)
    levels = []
    for line in open(a.results):
        f = line.split()
        if len(f) != 7:
            continue
        level, algo, _seed, loss, wall, smean, _smax = f
        if level not in levels:
            levels.append(level)
        cell[(level, algo)].append((float(loss), float(wall), None if smean == "-" else float(smean)))
    if a.markdown:
        print("| level (slowdowns) | " + " | ".join(NAMES.get(x, x) for x in algos) + " |")
        print("|---" * (len(algos) + 1) + "|")
    else:
        print("loss mean ± half range over seeds / wall s (loss ÷ sync's; mean staleness)")
    for level in levels:
        sync = cell.get((level, "sync"))
        sync_loss = sum(x[0] for x in sync) / len(sync) if sync else None
        out = []
        for algo in algos:
            v = cell.get((level, algo))
            if not v:
                out.append("-")
                continue
            s = mean_spread([x[0] for x in v], "%.4f") + " / " + mean_spread([x[1] for x in v], "%.1f") + " s"
            extra = []
            if algo != "sync" and sync_loss:
                extra.append("%.3f×" % (sum(x[0] for x in v) / len(v) / sync_loss))
            st = [x[2] for x in v if x[2] is not None]
            if st:
                extra.append("stale %.2f" % (sum(st) / len(st)))
            if extra:
                s += " (" + ", ".join(extra) + ")"
            out.append(s)
        if a.markdown:
            print(f"| {level} ({SLOW.get(level, '?')}) | " + " | ".join(out) + " |")
        else:
            print(f"{level:9s}")
            for algo, o in zip(algos, out):
                print(f"    {NAMES.get(algo, algo):15s} {o}")


if __name__ == "__main__":
    main()
