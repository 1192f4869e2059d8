#!/usr/bin/env python3
"""ops_check.py — the checks of the observability tests (ops_*.sh) that want a real parser:

  prom-wait PROM_URL JOB_ID ROUNDS TIMEOUT
      Queries a real Prometheus's HTTP API until its scrape target is up and the job's
      dipaco_job_rounds reaches ROUNDS and its dipaco_loss appears (exit 1 on timeout).
  dashboard PROM_URL DASHBOARD.json
      Checks the Grafana dashboard's shape (panels with ids, grid positions, targets) and the
      panels the README lists, then runs every PromQL expression of it against Prometheus,
      with Grafana's variables given values ($job = all, $__rate_interval = 1m): each must
      parse and return at least one sample with a finite value.
  page PNG DOM NAME HOSTILE
      The status page as headless Chromium drew it: the screenshot shows the job name (OCR
      with tesseract) and a drawn curve (pixels of the first series colour spanning most of
      the chart's width over several rows); the DOM Chromium built holds the job's name, no
      script element, and the hostile worker name as text.
  plot SVG STATUS_JSON SHOW_JSON
      `dipacoctl job plot`'s SVG against the coordinator's own numbers: two charts, one
      polyline each, one point per round of the job's history in /api/status, x increasing,
      the loss ordering of the points equal to that of the history, and the bytes axis ending
      at the job's bytes in + out from `job show --json`.
"""
import json
import math
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def query(prom, expr):
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # a PromQL error comes back as 400 with a JSON body
        return json.load(e)


def prom_wait(prom, job, rounds, timeout):
    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        try:
            up = query(prom, 'up{job="dipaco"}')["data"]["result"]
            r = query(prom, 'dipaco_job_rounds{job_id="%s"}' % job)["data"]["result"]
            loss = query(prom, 'dipaco_loss{job_id="%s"}' % job)["data"]["result"]
            last = "up=%s rounds=%s loss=%s" % ([x["value"][1] for x in up], [x["value"][1] for x in r],
                                               [x["value"][1] for x in loss])
            if up and up[0]["value"][1] == "1" and r and float(r[0]["value"][1]) >= rounds and loss \
                    and math.isfinite(float(loss[0]["value"][1])):
                print("prometheus sees job %s: %s" % (job, last))
                return
        except (OSError, ValueError, KeyError) as e:
            last = repr(e)
        time.sleep(0.5)
    fail("Prometheus did not see job %s reach %d rounds with a loss within %d s (last: %s)" % (job, rounds, timeout, last))


REQUIRED_PANELS = ["Loss per path", "Rounds", "Bytes in / out", "Staleness", "Workers by state", "Lease waits"]


def dashboard(prom, path):
    d = json.load(open(path))
    panels = d.get("panels") or fail("dashboard: no panels")
    ids = [p.get("id") for p in panels]
    if len(set(ids)) != len(ids) or None in ids:
        fail("dashboard: panel ids missing or repeated: %s" % ids)
    titles = [p.get("title") for p in panels]
    for t in REQUIRED_PANELS:
        if t not in titles:
            fail("dashboard: no panel titled %r (have %s)" % (t, titles))
    subst = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m", "$job": ".*"}
    n = 0
    for p in panels:
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in ("x", "y", "w", "h")):
            fail("dashboard: panel %r has no gridPos" % p.get("title"))
        if not p.get("targets"):
            fail("dashboard: panel %r has no targets" % p.get("title"))
        for t in p["targets"]:
            expr = t.get("expr") or fail("dashboard: panel %r has a target without expr" % p.get("title"))
            for k in sorted(subst, key=len, reverse=True):
                expr = expr.replace(k, subst[k])
            if "$" in expr:
                fail("dashboard: %r uses a variable this test does not know: %s" % (p["title"], expr))
            r = query(prom, expr)
            if r.get("status") != "success":
                fail("dashboard: %r: %s does not run: %s" % (p["title"], expr, r.get("error")))
            res = r["data"]["result"]
            vals = [float(x["value"][1]) for x in res] if r["data"]["resultType"] == "vector" else []
            if not any(math.isfinite(v) for v in vals):
                fail("dashboard: %r: %s returned no finite sample: %s" % (p["title"], expr, res))
            print("ok: %-40s %-90s -> %s" % (p["title"][:40], expr[:90], ", ".join("%.4g" % v for v in vals[:4])))
            n += 1
    print("dashboard: %d panels, %d expressions, every one returned data" % (len(panels), n))


def page(png, dom, name, hostile):
    from PIL import Image
    text = open(dom, encoding="utf-8", errors="replace").read()
    if name not in text:
        fail("page: the DOM lacks the job name %r" % name)
    if re.search(r"<script", text, re.I):
        fail("page: the DOM holds a script element (the hostile worker name was not escaped?)")
    esc = hostile.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if esc not in text:
        fail("page: the hostile worker name is not shown as text (%r not in the DOM)" % esc)
    img = Image.open(png).convert("RGB")
    W, H = img.size
    px = img.load()
    # The first series colour, #1f77b4, with a little tolerance for anti-aliasing.
    hits = [(x, y) for y in range(H) for x in range(W)
            if abs(px[x, y][0] - 0x1f) < 24 and abs(px[x, y][1] - 0x77) < 24 and abs(px[x, y][2] - 0xb4) < 24]
    if len(hits) < 300:
        fail("page: the screenshot has %d pixels of the curve colour: no curve drawn" % len(hits))
    xs = sorted(set(x for x, _ in hits))
    ys = sorted(set(y for _, y in hits))
    # The progress bar shares nothing with the curve colour, so a wide run of it across many
    # rows is the loss line: it spans most of the 640-pixel chart and falls as the loss does.
    if xs[-1] - xs[0] < 400 or ys[-1] - ys[0] < 40:
        fail("page: the curve pixels span %d x %d px: no curve" % (xs[-1] - xs[0], ys[-1] - ys[0]))
    left = [y for x, y in hits if x < xs[0] + 40]
    right = [y for x, y in hits if x > xs[-1] - 40]
    print("page: curve of %d px spanning x %d..%d, y %d..%d" % (len(hits), xs[0], xs[-1], ys[0], ys[-1]))
    if not (sum(left) / len(left) < sum(right) / len(right)):
        fail("page: the curve does not fall from left to right (the loss of a training job should)")
    ocr = subprocess.run(["tesseract", png, "-", "--psm", "3"], capture_output=True, text=True).stdout
    if name not in ocr.replace(" ", ""):
        fail("page: OCR of the screenshot does not show the job name %r; it read:\n%s" % (name, ocr[:800]))
    print("page: OCR found %r in the screenshot" % name)


def plot(svg, status_json, show_json):
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.parse(svg).getroot()
    lines = root.findall(".//s:polyline", ns)
    if len(lines) != 2:
        fail("plot: %d polylines; want 2 (loss against steps, against bytes) for the one path" % len(lines))
    st = json.load(open(status_json))
    job = st["jobs"][0]
    hist = job["history"]["paths"][0]["points"]
    show = json.load(open(show_json))
    pts = [[tuple(map(float, p.split(","))) for p in l.get("points").split()] for l in lines]
    if len(pts[0]) != len(hist) or len(pts[1]) != len(hist):
        fail("plot: %d and %d points; the job's history has %d rounds" % (len(pts[0]), len(pts[1]), len(hist)))
    for k in (0, 1):
        xs = [p[0] for p in pts[k]]
        if any(b <= a for a, b in zip(xs, xs[1:])):
            fail("plot: chart %d: x does not increase: %s" % (k, xs))
    # SVG y grows downwards: a higher loss is a smaller y. The plotted order must be the
    # history's order (both computed apart: the CLI from GetMetrics, the page in the daemon).
    want = sorted(range(len(hist)), key=lambda i: (hist[i][1], i))
    for k in (0, 1):
        got = sorted(range(len(hist)), key=lambda i: (-pts[k][i][1], i))
        if [hist[i][1] for i in got] != [hist[i][1] for i in want]:
            fail("plot: chart %d: the loss ordering differs from the coordinator's history" % k)
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    total = float(show["bytes_in"]) + float(show["bytes_out"])
    nums = [float(t) for t in texts if re.fullmatch(r"[0-9.e+]+", t)]
    if not any(abs(v - total) <= 1e-3 * total for v in nums):
        fail("plot: no bytes tick at the job's total %d bytes (ticks %s)" % (total, nums))
    steps = (job["round"]) * job["inner_steps"]
    if not any(abs(v - steps) < 0.5 for v in nums):
        fail("plot: no inner-step tick at %d (ticks %s)" % (steps, nums))
    print("plot: 2 charts x %d points, ordering as the coordinator's history, bytes up to %d" % (len(hist), total))


def main(a):
    if a[0] == "prom-wait":
        prom_wait(a[1], a[2], int(a[3]), int(a[4]))
    elif a[0] == "dashboard":
        dashboard(a[1], a[2])
    elif a[0] == "page":
        page(a[1], a[2], a[3], a[4])
    elif a[0] == "plot":
        plot(a[1], a[2], a[3])
    else:
        fail("unknown check %s" % a[0])


if __name__ == "__main__":
    main(sys.argv[1:])
