#!/usr/bin/env bash
# Runs the RUBiS benchmark on a local stack of its own (data in .larder-bench,
# ports beside the development stack's): loads the data and writes RUBiS's
# QUMA file, runs rubis-bench, then stops the stack. The invalidator learns
# the RUBiS tables as they are created and their tag column sets as the
# application's clients register them: no restart. Arguments go to
# rubis-bench (--repeats, --mode-url, --register-tag-sets=false, …: see
# bench/rubis/README.md), but --pgpool, which adds mode pgpool: Pgpool-II's
# query cache in front of the stack's PostgreSQL (pgpool.sh), and
# --pgpool-check, which runs cmd/pgpool-check (the consistency contrast of
# Pgpool-II and Larder) on that stack and Pgpool-II instead of the benchmark,
# the other arguments going to it.
set -euo pipefail
cd "$(dirname "$0")/../.."
pgpool=
check=
args=()
for a in "$@"; do
  case $a in
    --pgpool) pgpool=1 ;;
    --pgpool-check) pgpool=1 check=1 ;;
    *) args+=("$a") ;;
  esac
done
set -- ${args[@]+"${args[@]}"}
if [[ -n $pgpool ]]; then
  source bench/rubis/pgpool.sh
  pgpool_install
  expire=$(pgpool_expiry "$@")
fi
# The stack's folder and ports (beside the development stack's by default)
# can be moved, to run two benchmarks side by side or avoid a busy port.
dir=${BENCH_DIR:-.larder-bench}
mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
pg_port=${BENCH_PG_PORT:-25432}
nats_port=${BENCH_NATS_PORT:-24222}
redis_port=${BENCH_REDIS_PORT:-26379}
node_port=${BENCH_NODE_PORT:-27070}
go build -o "$dir/bin/local" ./deploy/local
go build -o "$dir/bin/rubis-bench" ./bench/rubis/cmd/rubis-bench
stack=
start_stack() {
  rm -f "$dir/stack.env"
  "$dir/bin/local" up -dir "$dir" -pg-port "$pg_port" -nats-port "$nats_port" -redis-port "$redis_port" -cache-node-port "$node_port" -invalidator-metrics "" -cache-node-metrics "" -front-port -1 -front-metrics "" "$@" > "$dir/stack.log" 2>&1 &
  stack=$!
  for _ in $(seq 1 120); do
    [[ -s "$dir/stack.env" ]] && return 0
    kill -0 $stack 2>/dev/null || { cat "$dir/stack.log"; exit 1; }
    sleep 0.5
  done
  echo "bench-rubis: the stack did not come up" >&2; cat "$dir/stack.log"; exit 1
}
stop_stack() {
  [[ -n "$stack" ]] || return 0
  kill -TERM $stack 2>/dev/null || true
  wait $stack 2>/dev/null || true
  stack=
}
stop_all() {
  [[ -z $pgpool ]] || pgpool_stop
  stop_stack
}
trap stop_all EXIT
# BENCH_STACK_ARGS go to the stack (`local up`): -cache-nodes 3 runs three
# cache-nodes in an overlay, -broadcast-invalidation the broadcast ablation.
# shellcheck disable=SC2086
start_stack ${BENCH_STACK_ARGS:-}
if [[ -n $check ]]; then
  go build -o "$dir/bin/pgpool-check" ./bench/rubis/cmd/pgpool-check
  pgpool_start "$dir" "$(set +u; source "$dir/stack.env"; printf %s "$LARDER_PG_URL")" "$expire"
  "$dir/bin/pgpool-check" --env "$dir/stack.env" --pgpool "$PGPOOL_APP_URL" "$@"
  exit
fi
"$dir/bin/rubis-bench" --env "$dir/stack.env" --load-only "$@"
if [[ -n $pgpool ]]; then
  # After the load: the same database, so no second load through Pgpool.
  pg_url=$(set +u; source "$dir/stack.env"; printf %s "$LARDER_PG_URL")
  pgpool_start "$dir" "$pg_url" "$expire"
  set -- "$@" --mode-url "pgpool=$PGPOOL_APP_URL"
  before=$(pgpool_cache)
  cpu_before=$(pgpool_cpu)
fi
# --stack-pid: the report counts the CPU of this stack's processes only.
"$dir/bin/rubis-bench" --env "$dir/stack.env" --skip-load --stack-pid "$stack" "$@"
if [[ -n $pgpool ]]; then
  after=$(pgpool_cache)
  cpu=$(awk -v a="$cpu_before" -v b="$(pgpool_cpu)" 'BEGIN {printf "%.1f", b - a}')
  out=bench/rubis/results
  prev=
  for a in "$@"; do
    case $a in --out=*) out=${a#*=} ;; esac
    [[ $prev == --out ]] && out=$a
    prev=$a
  done
  summary=$(printf '\n## Pgpool-II query cache (SHOW POOL_CACHE, whole run with warm-ups)\n\nmemqcache_expire %s s, shmem, load balancing off. Pgpool-II'"'"'s own processes (not in the CPU column above) used %s CPU-seconds over the run (its mode'"'"'s warm-ups and measured runs; idle otherwise).\n\n- before: %s\n- after: %s\n' "$expire" "$cpu" "$before" "$after")
  printf '%s\n' "$summary"
  [[ ! -f $out/report.md ]] || printf '%s\n' "$summary" >> "$out/report.md"
fi
