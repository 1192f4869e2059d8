# ops_lib.sh — shared by the observability tests (ops_*.sh; sourced after lib.sh): getting the
# Debian packages a test runs for real (prometheus, chromium, tesseract-ocr, python3-pil) and
# a small job for a coordinator to run while they look at it.

# need CMD PKG — make sure CMD is on PATH, installing Debian package PKG with apt-get when it
# is not; exits 77 (ctest: skipped) with the reason when it cannot be had.
need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  apt_install "$2"
  command -v "$1" >/dev/null 2>&1 || { echo "SKIP: $1 is missing and apt-get install $2 failed: $(tail -2 "$W/apt-$2.log" | tr '\n' ' ')"; exit 77; }
}

# need_py MODULE PKG — the same for a module of /usr/bin/python3.
need_py() {
  $PY -c "import $1" 2>/dev/null && return 0
  apt_install "$2"
  $PY -c "import $1" 2>/dev/null || { echo "SKIP: python3 module $1 is missing and apt-get install $2 failed: $(tail -2 "$W/apt-$2.log" | tr '\n' ' ')"; exit 77; }
}

apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  echo "installing the Debian package $1"
  if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      -o DPkg::Lock::Timeout=600 "$1" >"$W/apt-$1.log" 2>&1; then
    $sudo apt-get update -qq >>"$W/apt-$1.log" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      -o DPkg::Lock::Timeout=600 "$1" >>"$W/apt-$1.log" 2>&1 || true
  fi
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
