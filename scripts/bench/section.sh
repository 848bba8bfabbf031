#!/usr/bin/env bash
# Runs a benchmark command and writes what it prints as its own section of
# BENCHMARKS.md, stamped with the command, date, commit and machine (issue
# 59: no table written by hand). The other sections stay as they are.
#
#   scripts/bench/section.sh NAME "TITLE" COMMAND [ARG...]
#   scripts/bench/section.sh bench-shuffle "SHUFFLE against the plain query" scripts/bench-shuffle.sh 2000000 96M
#
# NAME is the section's marker (<!-- NAME: begin --> … <!-- NAME: end -->):
# a section already there is replaced, a new one goes at the end.
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n '2,10p' "$0" >&2; exit 2; }
name=$1
title=$2
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" | tee "$out"
{
  printf '## %s\n\n```text\n' "$title"
  cat "$out"
  printf '```\n'
} | python3 "$root/scripts/bench/splice_section.py" --command "$*" "$name" "$root/BENCHMARKS.md"
echo "wrote the section '$name' of BENCHMARKS.md" >&2
