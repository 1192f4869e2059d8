#!/usr/bin/env bash
# check_adamw_simd.sh — build check that the CPU backend's AdamW is vector code: in the given
# program (which links dpc_kernels) or object file, the AVX-512 clone of cpuk_adamw must use 512-bit square
# roots (vsqrtps on zmm) and call no libm sqrtf, and the AVX2 clone 256-bit ones. A
# `#pragma GCC optimize` that does not reach the target_clones copies fails this.
# Usage: check_adamw_simd.sh PROGRAM|OBJECT   (exit 77 = skipped on a CPU other than x86-64;
# objdump missing or a compiler without target_clones is a failure)
set -uo pipefail
prog=${1:?usage: check_adamw_simd.sh PROGRAM}
command -v objdump >/dev/null || { echo "FAIL: objdump is missing (Debian binutils; deploy/install_deps.sh --test)"; exit 1; }
[ "$(uname -m)" = x86_64 ] || { echo "SKIP: the clones are x86-64 only (this is $(uname -m))"; exit 77; }
dis() { objdump -dr --no-show-raw-insn --disassemble="$1" "$prog" 2>/dev/null | sed -n '/>:$/,$p'; }
v4=$(dis cpuk_adamw.arch_x86_64_v4)
if [ -z "$v4" ]; then
  if objdump -t "$prog" | grep -q 'cpuk_adamw$'; then
    echo "FAIL: cpuk_adamw has no target_clones copies in $prog (compiler without target_clones)"; exit 1
  fi
  echo "FAIL: no cpuk_adamw in $prog"; exit 1
fi
v3=$(dis cpuk_adamw.arch_x86_64_v3)
fail=0
check() { # name text pattern expect(1 present / 0 absent) what
  local n; n=$(grep -cE "$3" <<<"$2")
  if { [ "$4" = 1 ] && [ "$n" -eq 0 ]; } || { [ "$4" = 0 ] && [ "$n" -ne 0 ]; }; then
    echo "FAIL: $1: $5 ($n matching instructions)"; fail=1
  else
    echo "ok: $1: $5 ($n matching instructions)"
  fi
}
check "x86-64-v4 clone" "$v4" 'vsqrtps[^#]*%zmm' 1 "512-bit vector square root"
check "x86-64-v4 clone" "$v4" 'call.*sqrt|R_X86_64_PLT32[[:space:]]+sqrtf' 0 "no call to sqrtf"
check "x86-64-v3 clone" "$v3" 'vsqrtps[^#]*%ymm' 1 "256-bit vector square root"
check "x86-64-v3 clone" "$v3" 'call.*sqrt|R_X86_64_PLT32[[:space:]]+sqrtf' 0 "no call to sqrtf"
exit $fail
