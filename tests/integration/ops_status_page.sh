#!/usr/bin/env bash
# ops_status_page.sh COORDINATOR WORKER DIPACOCTL — the coordinator's
# read-only status page at / and /api/status while a job trains. /api/status agrees with
# `dipacoctl job show` and lists the workers with their devices; the page is self-contained
# (no script, no external asset, a refresh) and escapes what workers send (one registers with
# a hostname full of markup); headless Chromium (Debian `chromium`) draws it, and the
# screenshot is checked for content: the job name read back by OCR (Debian `tesseract-ocr`)
# and a drawn, falling loss curve (ops_check.py page; Python Imaging Library from Debian
# `python3-pil`). OPS_SCREENSHOT=FILE keeps a copy of the screenshot (the README's).
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
source "$HERE/ops_lib.sh"
fail() { die_with_logs ops_status_page 30 "$@"; }

need chromium chromium
need tesseract tesseract-ocr
need_py PIL python3-pil
NAME=status-page-demo
HOSTILE='<script>alert(1)</script>&host'
ops_setup
ops_spec "$W/spec.json" $NAME diloco 2 400
start_coordinator_metrics "$W/state" || fail "coordinator"
start_worker gpu-node-1 "$W/corpus" --min-step-ms 40
# (lib.sh's start_worker names the log after the worker: this one gets a plain log name)
"$WORKER_BIN" --coordinator "$COORD" --data-dir "$W/corpus" --name "$HOSTILE" --threads 1 --min-step-ms 40 \
  >>"$W/worker-hostile.log" 2>&1 &
PIDS+=($!)
job=$("$CTL" --coordinator "$COORD" job create "$W/spec.json" 2>>"$W/ctl.log") || fail "job create"

# /api/status: wait for 8 rounds with their losses.
for _ in $(seq 1 600); do
  curl -sf "$URL/api/status" > "$W/status.json" || fail "GET /api/status"
  $PY -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; sys.exit(0 if j["round"] >= 8 and len(j["history"]["paths"][0]["points"]) >= 8 else 1)' "$W/status.json" && break
  sleep 0.1
done
"$CTL" --coordinator "$COORD" job show "$job" --json > "$W/show.json" 2>>"$W/ctl.log" || fail "job show"
$PY - "$W/status.json" "$W/show.json" "$job" "$NAME" "$HOSTILE" <<'PY' || fail "/api/status"
import json, sys
st, show = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
job, name, hostile = int(sys.argv[3]), sys.argv[4], sys.argv[5]
j = st["jobs"][0]
assert j["id"] == job and j["name"] == name and j["state"] == "running", j
assert j["rounds"] == 400 and j["paths"] == 1 and j["replicas"] == 2 and j["algorithm"] == "diloco", j
# job show was asked after the snapshot: the job only moves forward between the two.
assert show["name"] == name and show["round"] >= j["round"] >= 8, (show["round"], j["round"])
assert show["tokens"] >= j["tokens"] > 0 and show["bytes_in"] >= j["bytes_in"] > 0, (show, j)
pts = j["history"]["paths"][0]["points"]
# x = (round + 1) * inner_steps, one point per round that has a loss (a lease that ends
# before its first heartbeat reports none)
xs = [p[0] for p in pts]
assert all(x % 4 == 0 for x in xs) and xs == sorted(set(xs)) and xs[-1] <= 4 * show["round"], pts
assert all(p[1] > 0 for p in pts) and pts[-1][1] < pts[0][1], pts
ws = {w["hostname"]: w for w in st["workers"]}
assert set(ws) == {"gpu-node-1", hostile}, ws
assert all(w["backend"] == "cpu" and w["device"] and w["state"] in ("training", "idle") for w in ws.values()), ws
print("ok: /api/status: job %d round %d/%d, %d loss points, workers %s" % (job, j["round"], j["rounds"], len(pts),
      sorted((w["hostname"], w["device"]) for w in ws.values())))
PY

# The page: HTML, self-contained, escaped.
curl -sf -D "$W/headers.txt" "$URL/" > "$W/page.html" || fail "GET /"
grep -qi '^content-type: text/html' "$W/headers.txt" || fail "/ is not text/html: $(cat "$W/headers.txt")"
grep -qi "^content-security-policy: default-src 'none'" "$W/headers.txt" || fail "/ has no restrictive CSP"
grep -q '<meta http-equiv="refresh" content="[0-9]*">' "$W/page.html" || fail "the page does not refresh itself"
! grep -qiE '<script|src=|href="(https?:)?//|url\(' "$W/page.html" || fail "the page loads something: $(grep -oiE '<script|src=[^ ]*|href="(https?:)?//[^"]*|url\([^)]*' "$W/page.html" | head)"
grep -qF '&lt;script&gt;alert(1)&lt;/script&gt;&amp;host' "$W/page.html" || fail "the worker's hostname is not escaped"
grep -q '<svg' "$W/page.html" && grep -q '<polyline' "$W/page.html" || fail "no inline SVG loss chart"
echo "ok: / is self-contained HTML with an inline SVG chart and escapes worker text"
curl -s -o /dev/null -w '%{http_code}' "$URL/nope" | grep -qx 404 || fail "an unknown path is not 404"

# Headless Chromium: the DOM it builds and a screenshot.
CHROME=(chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars
        --user-data-dir="$W/chrome" --window-size=1000,760)
timeout 120 "${CHROME[@]}" --dump-dom "$URL/" > "$W/dom.html" 2>"$W/chromium.log" || fail "chromium --dump-dom"
timeout 120 "${CHROME[@]}" --screenshot="$W/page.png" "$URL/" >>"$W/chromium.log" 2>&1 || fail "chromium --screenshot"
[ -s "$W/page.png" ] || fail "no screenshot"
[ -z "${OPS_SCREENSHOT:-}" ] || cp "$W/page.png" "$OPS_SCREENSHOT"
$PY "$HERE/ops_check.py" page "$W/page.png" "$W/dom.html" "$NAME" "$HOSTILE" || fail "the screenshot"
"$CTL" --coordinator "$COORD" job cancel "$job" >/dev/null 2>>"$W/ctl.log" || fail "job cancel"
echo "ops_status_page: PASS"
