# ops_lib.sh — shared by the observability tests (ops_*.sh; sourced after lib.sh): checking for
# the Debian packages a test runs for real (prometheus, chromium, tesseract-ocr, python3-pil;
# deploy/install_deps.sh --test installs them) and a small job for a coordinator to run while
# they look at it.

# need CMD PKG — CMD must be on PATH: fails, naming Debian package PKG, when it is not.
need() {
  command -v "$1" >/dev/null 2>&1 ||
    { echo "FAIL: $1 is missing: install Debian $2 (deploy/install_deps.sh --test)"; exit 1; }
}

# need_py MODULE PKG — the same for a module of $DPC_PYTHON.
need_py() {
  $PY -c "import $1" 2>/dev/null ||
    { echo "FAIL: python module $1 is missing from $PY: install Debian $2 (deploy/install_deps.sh --test)"; exit 1; }
}

# ops_setup — a corpus and a tiny GPT-2 in $W (make_corpus, dipacoctl init).
ops_setup() {
  make_corpus "$W/corpus"
  "$CTL" init --n-layer 1 --n-head 2 --n-embd 16 --n-positions 16 --vocab-size 256 --seed 5 --out "$W/init" 2>/dev/null
}

# ops_spec FILE NAME ALGORITHM REPLICAS ROUNDS — a small job spec (4 inner steps per round).
ops_spec() {
  cat > "$1" <<JSON
{"name": "$2", "model": {"init": "$W/init"}, "data": {"train": ["data/train_*.bin"]},
 "algorithm": "$3", "replicas": $4, "inner_steps": 4, "rounds": $5, "batch": 2, "seq_len": 16,
 "inner": {"lr": 0.01}}
JSON
}
