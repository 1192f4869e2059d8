#!/usr/bin/env bash
# jobspec_doc_check.sh GENERATOR CHECKED_IN SCRATCH — the test jobspec_doc: regenerates
# docs/jobspec.md from the job spec's field table (coordinator/jobspec_fields.c) into SCRATCH
# and fails, printing the diff, when the checked-in copy differs.
set -euo pipefail
[ $# = 3 ] || { echo "usage: jobspec_doc_check.sh GENERATOR CHECKED_IN SCRATCH" >&2; exit 2; }
"$1" "$3"
if ! diff -u "$2" "$3"; then
  echo "docs/jobspec.md is stale: regenerate it with 'cmake --build <build dir> --target jobspec-doc' and commit it"
  exit 1
fi
echo "docs/jobspec.md matches the field table"
