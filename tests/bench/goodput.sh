#!/usr/bin/env bash
# tests/bench/goodput.sh — goodput under preemption, tried as a user would, on the
# daemons' default flags: a sync DiLoCo job, R = 4 slots served by 5 workers (scenario
# "spare") or by 4 (scenario "nospare"), a tiny GPT-2, ROUNDS rounds of H inner steps; every
# ~MEAN_STOP_S seconds (exponential, seeded: the same schedule for every mode and stop kind of a
# repeat) a random live worker is stopped with SIGTERM (a spot notice) or SIGKILL (no notice)
# and a replacement worker (a new process, a new name) starts RESTART_S later. Two job specs:
# "exact" (the default spec: every slot's delta each round) and "quorum" ("quorum" (R-1)/R,
# "weighting" "tokens", "round_timeout_s" ROUND_TIMEOUT_S, "quorum_grace_s" GRACE_S when set,
# else the coordinator's default). Goodput = the median fault-free wall clock / the faulty
# wall clock (job create to job done, the same inner steps); loss ratio = the final model's
# held-out eval loss / the fault-free run's. Each worker is a device of fixed speed
# (--min-step-ms STEP_MS, one thread, the model small enough that the real step is well below
# it), so the load of the machine does not decide the result; each run has its own
# coordinator. Not part of CI: 2 scenarios x 2 modes x REPEATS x (fault-free + 2 kinds) = 24
# runs of 1-4 minutes with the defaults (one scenario took 34 minutes on 2 busy cores). Release
# build in build-goodput-rel; the driver is tests/bench/goodput.py (which also prints the table
# of a RESULTS file again: goodput.py table RESULTS).
# Environment (defaults in brackets): ROUNDS (60), H (100), STEP_MS (7), B (4), T (32), C (32),
# L (1), LR (inner AdamW lr, 0.003), REPEATS (2), MEAN_STOP_S (8), RESTART_S (4), SCENARIOS
# ("spare nospare"), MODES ("exact quorum"), KINDS ("TERM KILL"; "" = the fault-free runs only),
# SEED (1: the stop schedule), MODEL_SEED (7: the init), GRACE_S (unset), ROUND_TIMEOUT_S (30),
# FILES (demo-corpus files, 40), EVAL_BATCHES (32), JOB_TIMEOUT_S (1800), RESULTS (a file that
# gets one line per run: scenario mode kind repeat wall_s loss stops stops_on_lease_holders
# missed_slot_rounds; kind "none" = fault-free), KEEP=1 (keep the work directory; it is kept
# anyway when a run fails). The Markdown table goes to stdout, progress to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
FILES=${FILES:-40}
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

cmake -S . -B build-goodput-rel -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-goodput-rel -j"$(nproc)" --target dipaco-coordinator dipaco-worker dipacoctl >/dev/null
CO=build-goodput-rel/coordinator/dipaco-coordinator
WK=build-goodput-rel/worker/dipaco-worker
CTL=build-goodput-rel/coordinator/dipacoctl
assets=$(bash deploy/fetch_assets.sh tests/.cache)
"$CTL" data prepare --tokenizer byte --out "$work/data" --val-fraction 0.1 $(ls "$assets"/sotu/*.txt | head -n "$FILES") 2>/dev/null
echo "goodput: work directory $work; $(uptime)" >&2
# From here the driver owns the work directory (and removes it unless KEEP is set).
trap - EXIT
rm_work=--rm-work; [ -z "${KEEP:-}" ] || rm_work=
exec "${DPC_PYTHON:-python3}" tests/bench/goodput.py run --co "$CO" --wk "$WK" --ctl "$CTL" --work "$work" $rm_work
