#!/usr/bin/env bash
# The cache-size sweep (TxCache's hit rate against cache size): the RUBiS
# benchmark once per cache-node byte budget, each on a stack of its own,
# then one table of every run. SWEEP_SIZES lists the budgets (default
# "4MiB 16MiB 64MiB 256MiB"); the arguments go to bench.sh and rubis-bench
# (--modes larder, --mix, --scale, --duration, …). Reports go to
# $SWEEP_OUT/<size> (default bench/rubis/results/cache-size).
set -euo pipefail
cd "$(dirname "$0")/../.."
sizes=${SWEEP_SIZES:-4MiB 16MiB 64MiB 256MiB}
out=${SWEEP_OUT:-bench/rubis/results/cache-size}
mkdir -p "$out"
for size in $sizes; do
  echo "cache-size sweep: cache-node budget $size"
  BENCH_STACK_ARGS="${BENCH_STACK_ARGS:-} -cache-node-memory $size" bash bench/rubis/bench.sh "$@" --out "$out/$size" > "$out/$size.log" 2>&1 ||
    { cat "$out/$size.log"; exit 1; }
done
{
  echo "# Cache-size sweep"
  echo
  echo "Arguments: $*"
  echo
  echo "| budget | repeat | mode | VUs | requests/s | failed | worst p90 (ms) | interaction | hit rate | node misses (compulsory / staleness / capacity / consistency) |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for size in $sizes; do
    # The report's table of every run: | repeat | mode | VUs | requests/s | failed | p90 | interaction | hit rate | misses | …
    grep -E '^\| [0-9]+ \| [a-z0-9-]+ \| [0-9]+ \|' "$out/$size/report.md" |
      awk -F'|' -v s="$size" '{ printf "| %s |%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", s, $2, $3, $4, $5, $6, $7, $8, $9, $10 }'
  done
} > "$out/REPORT.md"
cat "$out/REPORT.md"
