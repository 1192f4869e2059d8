#!/usr/bin/env python3
"""outer_table.py RESULTS.tsv [SIZES RS HS] — the outer-rule study's tables (tests/bench/outer_study.sh),
and with env SVG=FILE a heat map of every rule's gap in every cell.

Per rule: in how many cells it is within 2% of the cell's best rule, its mean and worst gap
(loss / best - 1). Per cell: the best rule and the gaps of averaging and of the default. Only
cells where every rule has finished are counted; SIZES, RS and HS (space-separated) restrict
the cells to a grid."""
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
            g = min(gap[(r, k)] / 0.10, 1.0)
            col = "rgb(255,%d,%d)" % (int(255 * (1 - g)), int(255 * (1 - g)))
            out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="%s" stroke="#ccc"/>' % (left + j * cw, y, cw, ch, col))
            if gap[(r, k)] > 0.02:
                out.append('<text x="%d" y="%d" font-size="9">x</text>' % (left + j * cw + 4, y + 11))
    out.append("</svg>")
    open(path, "w").write("\n".join(out))


def main():
    rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
    keep = [set(a.split()) for a in sys.argv[2:5]] if len(sys.argv) >= 5 else None
    cells = collections.defaultdict(dict)
    for c, z, R, H, rounds, rule, olr, omu, loss, _secs in rows:
        if keep and not (z in keep[0] and R in keep[1] and H in keep[2]):
            continue
        name = rule if rule in ("avg", "default") else "%s %s/%s" % (rule, olr, omu)
        cells[(c, z, int(R), int(H), int(rounds))][name] = float(loss)
    rules = sorted({r for v in cells.values() for r in v})
    full = {k: v for k, v in cells.items() if len(v) == len(rules)}
    if not full:
        print("no finished cell yet")
        return
    gaps = collections.defaultdict(list)
    gap = {}
    for k, v in full.items():
        best = min(v.values())
        for r, loss in v.items():
            gaps[r].append(loss / best - 1)
            gap[(r, k)] = loss / best - 1
    n = len(full)
    print("%d cells (every rule finished)\n" % n)
    print("| rule (outer lr / momentum) | cells within 2% of the best | mean gap | worst gap |")
    print("|---|---|---|---|")
    for r in sorted(rules, key=lambda r: max(gaps[r])):
        g = gaps[r]
        print("| %s | %d / %d | %.2f%% | %.2f%% |" % (r, sum(x <= 0.02 for x in g), n, 100 * sum(g) / n, 100 * max(g)))
    print("\n| corpus | size | R | H | rounds | best rule | best loss | averaging | default |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in sorted(full):
        v = full[k]
        best = min(v, key=v.get)
        print("| %s | %s | %d | %d | %d | %s | %.4f | %+.2f%% | %+.2f%% |" % (
            k + (best, v[best], 100 * (v["avg"] / v[best] - 1), 100 * (v["default"] / v[best] - 1))))
    if os.environ.get("SVG"):
        heatmap(os.environ["SVG"], sorted(rules, key=lambda r: max(gaps[r])), sorted(full), gap)


if __name__ == "__main__":
    main()
