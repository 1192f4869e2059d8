#!/usr/bin/env bash
# ops_prometheus.sh COORDINATOR WORKER DIPACOCTL — Prometheus metrics, against the real
# programs (Debian `prometheus`, installed here when missing; skipped with the reason when it
# cannot be): the coordinator's /metrics passes `promtool check metrics` while a sync and a
# diloco-async job train; a real Prometheus scrapes it and its HTTP API shows the sync job's
# rounds and loss; then every PromQL expression of deploy/grafana/dipaco.json parses and
# returns data from that Prometheus (ops_check.py dashboard).
set -euo pipefail
COORDINATOR_BIN=$1; WORKER_BIN=$2; CTL=$3
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=$(mktemp -d)
source "$HERE/lib.sh"
source "$HERE/ops_lib.sh"
fail() { die_with_logs ops_prometheus 30 "$@"; }

need promtool prometheus
need prometheus prometheus
ops_setup
# Long jobs (paced workers), cancelled at the end: per-job series exist while a job is live.
ops_spec "$W/sync.json" ops-sync diloco 2 400
ops_spec "$W/async.json" ops-async diloco-async 1 400
start_coordinator_metrics "$W/state" || fail "coordinator"
for n in w1 w2 w3; do start_worker $n "$W/corpus" --min-step-ms 40; done
sync=$("$CTL" --coordinator "$COORD" job create "$W/sync.json" 2>>"$W/ctl.log") || fail "job create (sync)"
async=$("$CTL" --coordinator "$COORD" job create "$W/async.json" 2>>"$W/ctl.log") || fail "job create (async)"

# 1. The exposition text is clean once every kind of series is there.
for _ in $(seq 1 900); do
  curl -sf "http://127.0.0.1:$MPORT/metrics" > "$W/metrics.txt" || fail "GET /metrics"
  grep -q "^dipaco_job_loss{job_id=\"$sync\"}" "$W/metrics.txt" && grep -q "^dipaco_async_staleness{" "$W/metrics.txt" && break
  sleep 0.1
done
grep -q "^dipaco_job_loss{job_id=\"$sync\"}" "$W/metrics.txt" || fail "no dipaco_job_loss for job $sync: $(grep -v '^#' "$W/metrics.txt" | head -50)"
promtool check metrics < "$W/metrics.txt" > "$W/promtool.txt" 2>&1 || fail "promtool check metrics: $(cat "$W/promtool.txt")"
[ ! -s "$W/promtool.txt" ] || fail "promtool check metrics complained: $(cat "$W/promtool.txt")"
echo "ok: promtool check metrics is clean ($(grep -c '^# TYPE' "$W/metrics.txt") families)"
for h in outer_step push pull lease_wait round_wait; do
  grep -q "^# TYPE dipaco_${h}_seconds histogram" "$W/metrics.txt" || fail "dipaco_${h}_seconds is not a histogram"
  c=$(sed -n "s/^dipaco_${h}_seconds_count //p" "$W/metrics.txt")
  [ "${c:-0}" -gt 0 ] || fail "dipaco_${h}_seconds counted nothing while two jobs trained"
done
echo "ok: duration histograms (outer step, push, pull, lease wait, round wait) are filled"

# 2. A real Prometheus scrapes the coordinator every second.
PPORT=$(free_port)
cat > "$W/prometheus.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: dipaco
    static_configs: [{targets: ["127.0.0.1:$MPORT"]}]
YML
promtool check config "$W/prometheus.yml" >/dev/null || fail "promtool check config"
prometheus --config.file="$W/prometheus.yml" --storage.tsdb.path="$W/tsdb" --web.listen-address=127.0.0.1:$PPORT \
  >>"$W/prometheus.log" 2>&1 &
PIDS+=($!)
$PY "$HERE/ops_check.py" prom-wait "http://127.0.0.1:$PPORT" "$sync" 3 90 || fail "Prometheus did not show the job"
sleep 3 # a few more scrapes, so that rate() over them has two samples of every series
$PY "$HERE/ops_check.py" dashboard "http://127.0.0.1:$PPORT" "$ROOT/deploy/grafana/dipaco.json" || fail "dashboard"

# 3. Per-job series end with the job (bounded labels): cancelled jobs leave /metrics.
"$CTL" --coordinator "$COORD" job cancel "$sync" >/dev/null 2>>"$W/ctl.log" || fail "job cancel"
"$CTL" --coordinator "$COORD" job cancel "$async" >/dev/null 2>>"$W/ctl.log" || fail "job cancel"
curl -sf "http://127.0.0.1:$MPORT/metrics" > "$W/metrics-after.txt" || fail "GET /metrics"
! grep -q "job_id=" "$W/metrics-after.txt" || fail "per-job series outlive their cancelled jobs: $(grep job_id= "$W/metrics-after.txt" | head)"
grep -q '^dipaco_jobs{state="canceled"} 2$' "$W/metrics-after.txt" || fail "dipaco_jobs does not count the 2 cancelled jobs"
echo "ops_prometheus: PASS"
