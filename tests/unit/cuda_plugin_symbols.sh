#!/usr/bin/env bash
# cuda_plugin_symbols.sh PLUGIN LIB... -- PROGRAM... — the CUDA plugin (libdipaco-cuda.so)
# resolves the project's own functions (dpc_err, layout helpers) from the program that loads
# it (kernels/CMakeLists.txt): every symbol the plugin leaves undefined and a project library
# defines must be exported by each program, or `--backend cuda` fails at load time with
# "undefined symbol" on the GPU machine only.
set -euo pipefail
plugin=$1; shift
libs=(); while [ "$1" != -- ]; do libs+=("$1"); shift; done; shift
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
nm -D --undefined-only "$plugin" | awk '{print $2}' | sed 's/@.*//' | sort -u > "$W/undef"
nm --defined-only "${libs[@]}" 2>/dev/null | awk '$2 ~ /^[TDBR]$/ {print $3}' | sort -u > "$W/ours"
comm -12 "$W/undef" "$W/ours" > "$W/need"
[ -s "$W/need" ] || { echo "FAIL: found none of the project's symbols among the plugin's undefined ones"; exit 1; }
echo "the plugin takes $(wc -l < "$W/need") symbols from its program: $(tr '\n' ' ' < "$W/need")"
fail=0
for p in "$@"; do
  nm -D --defined-only "$p" | awk '{print $3}' | sort -u > "$W/has"
  miss=$(comm -23 "$W/need" "$W/has" | tr '\n' ' ')
  if [ -n "$miss" ]; then echo "FAIL: $(basename "$p") does not export: $miss"; fail=1
  else echo "ok   $(basename "$p") exports all of them"; fi
done
exit $fail
