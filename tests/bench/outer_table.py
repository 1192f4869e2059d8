#!/usr/bin/env python3
"""outer_table.py RESULTS.tsv [SIZES RS HS] — the outer-rule study's tables (tests/bench/outer_study.sh),
and with env SVG=FILE a heat map of every rule's gap in every cell.

A run's size column may carry the init seed (SIZE@SEED); a rule's loss in a cell is the mean
over the seeds, and only rules with every seed in every cell are counted. Per rule: in how many
cells it is within 2% of the cell's best rule, its mean and worst gap (loss / best - 1), and
how far its seeds spread. Per cell: the best rule and the gaps of averaging, of the constant
0.6 / 0.7 (rule "default" in the results: the default before the momentum schedule) and of
the default now, 0.6 / 0.7 with the schedule ("sched").
SIZES, RS and HS (space-separated) restrict the cells to a grid.

outer_table.py RESULTS.tsv --defaults: every cell of the results, each against the best of the
rules run in it (rules may differ from cell to cell), with the gap of the job spec's default
for that cell (default_rule; docs/design.md §3.4); where it misses by more than 2%, why no rule the spec could derive holds: the cell's
best rule is itself more than 2% behind in another corpus of the same size, R and H;
with env SVG=FILE a heat map of the default and the common rules over every cell (grey: not
run there)."""
import collections
import os
import sys


def heatmap(path, rules, cells, gap):
    """Rules as rows, cells as columns; white at the cell's best, dark red at 10% or more behind."""
    cw, ch, left, top = 14, 16, 150, 90
    w, h = left + cw * len(cells) + 20, top + ch * len(rules) + 40
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="10">' % (w, h),
           '<text x="10" y="16" font-size="13">outer rule: validation loss behind each cell\'s best rule (white 0%, dark 10%+; '
           'x marks over 2%)</text>']
    for j, k in enumerate(cells):
        x = left + j * cw
        out.append('<text transform="translate(%d,%d) rotate(-70)">%s</text>' % (x + 10, top - 4, " ".join(map(str, k[:4]))))
    for i, r in enumerate(rules):
        y = top + i * ch
        out.append('<text x="%d" y="%d" text-anchor="end">%s</text>' % (left - 6, y + 12, r))
        for j, k in enumerate(cells):
            if (r, k) not in gap:  # not run in this cell
                out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="#ddd" stroke="#ccc"/>' % (left + j * cw, y, cw, ch))
                continue
            g = min(gap[(r, k)] / 0.10, 1.0)
            col = "rgb(255,%d,%d)" % (int(255 * (1 - g)), int(255 * (1 - g)))
            out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="%s" stroke="#ccc"/>' % (left + j * cw, y, cw, ch, col))
            if gap[(r, k)] > 0.02:
                out.append('<text x="%d" y="%d" font-size="9">x</text>' % (left + j * cw + 4, y + 11))
    out.append("</svg>")
    open(path, "w").write("\n".join(out))


def rule_name(rule, olr, omu):
    """A results line's rule as the tables name it: "default" runs are the constant 0.6 / 0.7
    (the default before the momentum schedule)."""
    return "avg" if rule == "avg" else "const 0.6/0.7" if rule == "default" else "%s %s/%s" % (rule, olr, omu)


# Parameters in the transformer layers of the study's GPT-2 sizes (12 C^2 + 13 C a layer).
LAYER_PARAMS = {z: L * (12 * C * C + 13 * C) for z, (L, C) in {"s": (2, 64), "m": (3, 128), "l": (4, 192)}.items()}


def default_rule(size, R, H):
    """The rule the job spec gives a diloco job of that model size, R replicas and H inner steps
    a round (coordinator/jobspec_fields.c jobspec_outer_derived): one notch smaller than the
    schedule on 0.6 / 0.7 at R <= 2 and one more for a model of 250k or more parameters in its
    layers at R <= 4, when H < 20."""
    notch = (R <= 2) + (R <= 4 and LAYER_PARAMS.get(size, 0) >= 250000) if H < 20 else 0
    return ("sched 0.6/0.7", "sched 0.5/0.6", "sched 0.4/0.5")[notch]


def defaults(path):
    runs = collections.defaultdict(lambda: collections.defaultdict(dict))  # cell -> rule -> seed -> loss
    for l in open(path):
        if not l.strip():
            continue
        c, z, R, H, rounds, rule, olr, omu, loss, _secs = l.rstrip("\n").split("\t")
        size, _, seed = z.partition("@")
        runs[(c, size, int(R), int(H), int(rounds))][rule_name(rule, olr, omu)][seed or "7"] = float(loss)
    cells, missing = {}, []
    for k, v in runs.items():
        # a rule counts in a cell where every seed run in the cell has finished it
        seeds = {s for r in v.values() for s in r}
        if len(seeds) < 2:  # a cell counts once both init seeds ran (a slice still running)
            continue
        cells[k] = {r: sum(x.values()) / len(x) for r, x in v.items() if set(x) == seeds}
        if default_rule(k[1], k[2], k[3]) not in cells[k]:
            missing.append(k)
    cells = {k: v for k, v in cells.items() if k not in missing}
    held, rows = 0, []
    gap = {}
    for k in sorted(cells, key=lambda k: (k[1], k[2], k[3], k[0])):
        v = cells[k]
        best = min(v, key=v.get)
        d = default_rule(k[1], k[2], k[3])
        g = v[d] / v[best] - 1
        held += g <= 0.02
        for r in v:
            gap[(r, k)] = v[r] / v[best] - 1
        why = ""
        if g > 0.02:
            # the spec sees size, R and H but not the corpus: the best rule here, elsewhere
            sib = [(cells[o][best] / min(cells[o].values()) - 1, o[0]) for o in cells
                   if o[1:] == k[1:] and o != k and best in cells[o]]
            worst = max(sib) if sib else None
            why = ("%s is %+.1f%% in %s" % (best, 100 * worst[0], worst[1]) if worst and worst[0] > 0.02
                   else "no other corpus refuses %s" % best)
        rows.append("| %s | %s | %d | %d | %d | %d | %s | %.4f | %s | %+.2f%% | %s |" % (
            k + (len(v), best, v[best], d, 100 * g, "yes" if g <= 0.02 else "**no**: " + why)))
    print("%d cells; the default within 2%% of the cell's best rule in %d\n" % (len(cells), held))
    print("| corpus | size | R | H | rounds | rules run | best rule | best loss | the default | its gap | within 2% (else why) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if missing:
        print("\ncells without the default's rule (left out): %s" % ", ".join(" ".join(map(str, k)) for k in sorted(missing)))
    if os.environ.get("SVG"):
        ks = sorted(cells, key=lambda k: (k[1], k[2], k[3], k[0]))
        for k in ks:
            gap[("the default", k)] = gap[(default_rule(k[1], k[2], k[3]), k)]
        rules = ["the default", "sched 0.6/0.7", "sched 0.5/0.6", "sched 0.4/0.5", "const 0.6/0.7", "avg"]
        heatmap(os.environ["SVG"], rules, ks, gap)


def main():
    if len(sys.argv) == 3 and sys.argv[2] == "--defaults":
        return defaults(sys.argv[1])
    rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
    keep = [set(a.split()) for a in sys.argv[2:5]] if len(sys.argv) >= 5 else None
    runs = collections.defaultdict(lambda: collections.defaultdict(dict))  # cell -> rule -> seed -> loss
    for c, z, R, H, rounds, rule, olr, omu, loss, _secs in rows:
        size, _, seed = z.partition("@")
        if keep and not (size in keep[0] and R in keep[1] and H in keep[2]):
            continue
        runs[(c, size, int(R), int(H), int(rounds))][rule_name(rule, olr, omu)][seed or "base"] = float(loss)
    if not runs:
        print("no finished cell yet")
        return
    seeds = sorted({s for v in runs.values() for r in v.values() for s in r})
    # A rule counts where it has every seed in every cell; its loss in a cell is the mean.
    rules = sorted(r for r in {r for v in runs.values() for r in v}
                   if all(len(v.get(r, {})) == len(seeds) for v in runs.values()))
    if not rules:
        print("no rule has finished every cell and seed yet")
        return
    cells = {k: {r: sum(v[r].values()) / len(seeds) for r in rules} for k, v in runs.items()}
    gaps = collections.defaultdict(list)
    gap = {}
    for k, v in cells.items():
        best = min(v.values())
        for r, loss in v.items():
            gaps[r].append(loss / best - 1)
            gap[(r, k)] = loss / best - 1
    n = len(cells)
    print("%d cells x %d seeds, %d rules (mean validation loss over the seeds)\n" % (n, len(seeds), len(rules)))
    print("| rule (outer lr / momentum) | cells within 2% of the best | mean gap | worst gap | seed spread |")
    print("|---|---|---|---|---|")
    for r in sorted(rules, key=lambda r: max(gaps[r])):
        g = gaps[r]
        # the seeds' spread: mean over cells of (max - min) / mean of the rule's losses
        spread = sum((max(v[r].values()) - min(v[r].values())) / (sum(v[r].values()) / len(seeds))
                     for v in runs.values()) / n
        print("| %s | %d / %d | %.2f%% | %.2f%% | %.2f%% |" % (r, sum(x <= 0.02 for x in g), n, 100 * sum(g) / n,
                                                         100 * max(g), 100 * spread))
    print("\n| corpus | size | R | H | rounds | best rule | best loss | averaging | const 0.6/0.7 | default (sched 0.6/0.7) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    col = lambda v, r, best: "%+.2f%%" % (100 * (v[r] / v[best] - 1)) if r in v else "-"
    for k in sorted(cells):
        v = cells[k]
        best = min(v, key=v.get)
        print("| %s | %s | %d | %d | %d | %s | %.4f | %s | %s | %s |" % (
            k + (best, v[best], col(v, "avg", best), col(v, "const 0.6/0.7", best), col(v, "sched 0.6/0.7", best))))
    if os.environ.get("SVG"):
        heatmap(os.environ["SVG"], sorted(rules, key=lambda r: max(gaps[r])), sorted(cells), gap)


if __name__ == "__main__":
    main()
