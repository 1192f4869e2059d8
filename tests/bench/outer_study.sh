#!/usr/bin/env bash
# outer_study.sh — DiLoCo's outer rule across corpora, model sizes, R and H: each cell trains the
# same init with every rule through diloco_local (tests/unit/diloco_local.c: the daemons'
# trainer and outer step in one process, bit-identical to them by ctest oracle_diloco_local)
# and reports each rule's validation loss against the cell's best rule.
#
# usage: tests/bench/outer_study.sh [quick|r8|full|muloco]
#   quick: 4 corpora x 1 size x R {2, 4} x H {10, 50}              (16 cells)
#   r8:    4 corpora x 1 size x R 8 x H {10, 20}                   (8 cells)
#   full:  4 corpora x 3 sizes x R {2, 4, 8} x H {10, 20, 50, 100} (144 cells)
#   muloco: the cell of tests/bench/muloco.sh (the quickstart's corpus and GPT-2, T 128, R 2,
#          H 30, 600 inner steps, its init) with AdamW ("q") and with Muon at lr 0.02 ("qmuon"),
#          averaging, 0.6/0.7 constant and with the schedule, and 0.8/0.7 (the MuLoCo paper's)
# Rules (outer lr / momentum, Nesterov): averaging (1/0), the current default (0.6/0.7),
# 0.4/0.5, 0.5/0.3, 0.7/0 (SGD), 0.4/0.7, 0.7/0.7, and the momentum schedule (kernels/outer.c
# outer_momentum_at: warm-up over the first 10% of the rounds, decay to 0 over the last 20%) on
# 0.6/0.7 and 0.4/0.5 ("sched"); rule "lrdec" (only through EXTRA_RULES) is the schedule with
# the outer lr decaying linearly to 0 over the same last 20% (diloco_local's
# DILOCO_LOCAL_LR_DECAY, a probe no job spec has); WIDE=1 adds 0.3/0.5, 0.4/0.9, 0.7/0.5,
# 0.7/0.9, 1/0.5, 1/0.7 and 1/0.9; RULESET=core keeps averaging, 0.6/0.7 constant, 0.4/0.5 and the two schedules,
# RULESET=none none; EXTRA_RULES adds "RULE OLR OMU" items separated by ";" (e.g. "sched 0.5
# 0.6;avg 1.0 0.0"). GRID_SIZES, GRID_RS and GRID_HS (space-separated) replace the grid's lists,
# to run one slice of a grid (e.g. GRID_SIZES=m GRID_RS=2 GRID_HS=10 ... full). Every
# cell runs once per init seed of SEEDS (default "7 8"; the size column is
# SIZE@SEED for seeds other than 7): a single run's loss moves by up to 17% with the seed under
# high outer momentum, so rules are compared on the mean over seeds (outer_table.py).
# Rounds: 1000 inner steps per replica at H = 10 (100 rounds), 2000 above (H = 20: 100, 50: 40, 100: 20).
# Corpora, from Debian packages (none is the quickstart's): prose (the packages' Debian
# changelogs), code (C headers under /usr/include), licences (/usr/share/common-licenses and
# the packages' copyright files), tables (dpkg's status database by paragraph, file's magic
# table, the time-zone table, the locales' character maps); 4 MB each, byte tokens: files in a
# fixed shuffled order, then cut into 2 KB blocks in a fixed shuffled order, so that the text a
# run trains on and the validation text (the last 5%) are one distribution.
# Resumable: every finished run is one line of $RESULTS (default $STUDY_DIR/results.tsv, for
# muloco results-muloco.tsv:
# corpus size R H rounds rule olr omu loss seconds) and is skipped when the study runs again.
# env: BUILD_DIR (default build-bench-study), STUDY_DIR (corpora, inits, runs; default
#      /var/tmp/dpc-outer-study2), RESULTS, PAR (runs at once, default nproc).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
GRID=${1:-quick}
BUILD=${BUILD_DIR:-$ROOT/build-bench-study}
PAR=${PAR:-$(nproc)}
PY=${DPC_PYTHON:-python3}
CORPORA=(prose code licences tables)
RULES=("avg 1.0 0.0" "default 0.6 0.7" "nesterov 0.4 0.5" "nesterov 0.5 0.3" "nesterov 0.7 0.0" "nesterov 0.4 0.7"
       "nesterov 0.7 0.7" "sched 0.6 0.7" "sched 0.4 0.5")
if [ -n "${WIDE:-}" ]; then
  RULES+=("nesterov 0.3 0.5" "nesterov 0.4 0.9" "nesterov 0.7 0.5" "nesterov 0.7 0.9" "nesterov 1.0 0.5"
          "nesterov 1.0 0.7" "nesterov 1.0 0.9")
fi
[ "${RULESET:-}" = core ] && RULES=("avg 1.0 0.0" "default 0.6 0.7" "nesterov 0.4 0.5" "sched 0.6 0.7" "sched 0.4 0.5")
[ "${RULESET:-}" = none ] && RULES=()
if [ -n "${EXTRA_RULES:-}" ]; then
  IFS=';' read -r -a extra <<< "$EXTRA_RULES"
  RULES+=("${extra[@]}")
fi
SEEDS=(${SEEDS:-7 8})
case $GRID in
  quick) SIZES=(s); RS=(2 4); HS=(10 50) ;;
  r8) SIZES=(s); RS=(8); HS=(10 20) ;;
  full) SIZES=(s m l); RS=(2 4 8); HS=(10 20 50 100) ;;
  muloco) SIZES=(q qmuon); RS=(2); HS=(30); CORPORA=(sotu); SEEDS=(1)
          RULES=("avg 1.0 0.0" "default 0.6 0.7" "nesterov 0.8 0.7" "sched 0.6 0.7") ;;
  *) echo "usage: $0 [quick|r8|full|muloco]" >&2; exit 2 ;;
esac
[ -n "${GRID_SIZES:-}" ] && SIZES=($GRID_SIZES)
[ -n "${GRID_RS:-}" ] && RS=($GRID_RS)
[ -n "${GRID_HS:-}" ] && HS=($GRID_HS)

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDIPACO_SANITIZE=OFF -DDIPACO_DISTRIBUTED=OFF >/dev/null
cmake --build "$BUILD" --target dipacoctl diloco_local -j"$(nproc)" >/dev/null
CTL=$BUILD/coordinator/dipacoctl; LOCAL=$BUILD/tests/diloco_local
W=${STUDY_DIR:-/var/tmp/dpc-outer-study2}; mkdir -p "$W"
SUFFIX=; [ "$GRID" = muloco ] && SUFFIX=-muloco
RESULTS=${RESULTS:-$W/results$SUFFIX.tsv}
touch "$RESULTS"

corpus() { # corpus NAME FILE — 4 MB of the named corpus, its files (or, for one file, its
  # paragraphs) in a fixed pseudo-random order, so that training and validation text (the last
  # 5%) come from the whole corpus rather than from its first and last packages
  "$PY" - "$1" "$2" <<'PY'
import glob, gzip, hashlib, sys
name, out = sys.argv[1], sys.argv[2]
files = {"prose": glob.glob("/usr/share/doc/*/changelog.Debian.gz"),
         "code": glob.glob("/usr/include/**/*.h", recursive=True),
         "licences": glob.glob("/usr/share/common-licenses/*") + glob.glob("/usr/share/doc/*/copyright"),
         "tables": ["/var/lib/dpkg/status", "/usr/share/misc/magic", "/usr/share/zoneinfo/tzdata.zi"] +
                   glob.glob("/usr/share/i18n/charmaps/*.gz")}[name]
pieces = []
for f in files:
    try:
        data = (gzip.open if f.endswith(".gz") else open)(f, "rb").read()
    except OSError:
        continue
    pieces += data.split(b"\n\n") if f == "/var/lib/dpkg/status" else [data]
pieces.sort(key=lambda b: hashlib.md5(b).digest())
text = b"\n\n".join(pieces)
# then 2 KB blocks in a fixed shuffled order: a file can be hundreds of KB (a long copyright
# file, one charmap), and a run reads only its first 0.5-4 MB in order, so without this the
# validation text (the last 5%) is a different distribution from the text a run trained on
blocks = [text[i:i + 2048] for i in range(0, len(text), 2048)]
blocks.sort(key=lambda b: hashlib.md5(b).digest())
text = b"".join(blocks)[:4000000]
if len(text) < 1000000:
    sys.exit("outer_study: corpus %s has under 1 MB on this machine" % name)
open(out, "wb").write(text)
PY
}
shape() {
  case $1 in
    s) echo "--n-layer 2 --n-head 4 --n-embd 64" ;;
    m) echo "--n-layer 3 --n-head 4 --n-embd 128" ;;
    l) echo "--n-layer 4 --n-head 4 --n-embd 192" ;;
    q*) echo "--n-layer 4 --n-head 4 --n-embd 128" ;;
  esac
}
for c in "${CORPORA[@]}"; do
  [ -f "$W/$c/data/val_000.bin" ] && continue
  mkdir -p "$W/$c"
  if [ "$c" = sotu ]; then # the MuLoCo bench's data: its first 24 files, the last 10% held out
    assets=$(bash "$ROOT/deploy/fetch_assets.sh" "$ROOT/tests/.cache")
    "$CTL" data prepare --tokenizer byte --out "$W/$c/data" --val-fraction 0.1 $(ls "$assets"/sotu/*.txt | head -n 24) \
      2>/dev/null
    continue
  fi
  corpus "$c" "$W/$c/text"
  "$CTL" data prepare --tokenizer byte --out "$W/$c/data" --val-fraction 0.05 "$W/$c/text" 2>/dev/null
done
# label SIZE SEED — a run's size column: the size for the grid's first seed (7; the MuLoCo
# bench's 1), SIZE@SEED for another init seed.
label() { case $2 in 7|1) echo "$1" ;; *) echo "$1@$2" ;; esac; }
for z in "${SIZES[@]}"; do for s in "${SEEDS[@]}"; do
  case $z in q*) [ -d "$W/init-q" ] || "$CTL" init $(shape q) --n-positions 128 --vocab-size 256 --seed 1 --out "$W/init-q" \
                   >/dev/null 2>&1 ;; # the MuLoCo bench's init
             *) [ -d "$W/init-$(label "$z" "$s")" ] || "$CTL" init $(shape "$z") --n-positions 64 --vocab-size 256 \
                   --seed "$s" --out "$W/init-$(label "$z" "$s")" >/dev/null 2>&1 ;;
  esac
done; done

# run CORPUS SIZE R H RULE OLR OMU — one DiLoCo run, appended to $RESULTS (SIZE may carry @SEED).
run() {
  local c=$1 z=$2 R=$3 H=$4 rule=$5 olr=$6 omu=$7 rounds out t0 loss T=64 init=$W/init-$2 batches=200
  local env=(DILOCO_LOCAL_MOMENTUM_SCHEDULE=0,0 DILOCO_LOCAL_MUON=)
  rounds=$(( H == 10 ? 100 : (2000 / H < 100 ? 2000 / H : 100) ))
  case $z in q*) T=128; init=$W/init-q; batches=32; rounds=$(( 600 / H )) ;; esac # 32: all the held-out text
  [ "${z%@*}" = qmuon ] && env+=(DILOCO_LOCAL_MUON=0.02)
  [ "$rule" = sched ] && env+=(DILOCO_LOCAL_MOMENTUM_SCHEDULE=$(( (rounds + 9) / 10 )),$(( (rounds + 4) / 5 )))
  [ "$rule" = lrdec ] && env+=(DILOCO_LOCAL_MOMENTUM_SCHEDULE=$(( (rounds + 9) / 10 )),$(( (rounds + 4) / 5 )) \
                               DILOCO_LOCAL_LR_DECAY=$(( (rounds + 4) / 5 )),0)
  out=$W/run-$c-$z-$R-$H-$rule-$olr-$omu
  t0=$(date +%s.%N)
  env "${env[@]}" "$LOCAL" "$init" "$W/$c/data/train_000.bin" "$out" "$R" "$H" "$rounds" 8 "$T" 3e-3 50 0.1 0.1 0.9 0.95 \
    1e-8 1.0 "$olr" "$omu" keep 2>"$out.log" || { echo "outer_study: $out failed: $(tail -1 "$out.log")" >&2; return 1; }
  loss=$("$CTL" eval --model "$out" --data "$W/$c/data/val_000.bin" --batch 8 --seq-len "$T" --batches "$batches" --json 2>/dev/null |
         "$PY" -c 'import json, sys; print(json.load(sys.stdin)["loss"])')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\n' "$c" "$z" "$R" "$H" "$rounds" "$rule" "$olr" "$omu" "$loss" \
    "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN {print a - b}')" >> "$RESULTS"
  rm -rf "$out" "$out.log"
}
todo=()
for s in "${SEEDS[@]}"; do for c in "${CORPORA[@]}"; do for z0 in "${SIZES[@]}"; do for R in "${RS[@]}"; do
  for H in "${HS[@]}"; do for r in "${RULES[@]}"; do
    set -- $r
    z=$(label "$z0" "$s")
    grep -q "^$c	$z	$R	$H	[0-9]*	$1	$2	$3	" "$RESULTS" || todo+=("$c $z $R $H $1 $2 $3")
  done; done
done; done; done; done
echo "outer_study ($GRID): ${#todo[@]} runs to do, $PAR at once; results in $RESULTS" >&2
i=0
for t in "${todo[@]}"; do
  i=$((i + 1))
  echo "[$i/${#todo[@]}] $t" >&2
  run $t &
  while [ "$(jobs -rp | wc -l)" -ge "$PAR" ]; do wait -n || true; done
done
wait
"$PY" "$ROOT/tests/bench/outer_table.py" "$RESULTS" "${SIZES[*]}" "${RS[*]}" "${HS[*]}"
