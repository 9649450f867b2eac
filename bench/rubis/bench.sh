#!/usr/bin/env bash
# Runs the RUBiS benchmark on a local stack of its own (data in .larder-bench,
# ports beside the development stack's), then stops the stack.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=.larder-bench
rm -f "$dir/stack.env"
go build -o "$dir/bin/local" ./deploy/local
go build -o "$dir/bin/rubis-bench" ./bench/rubis/cmd/rubis-bench
"$dir/bin/local" up -dir "$dir" -pg-port 25432 -nats-port 24222 -redis-port 26379 -cache-node-port 27070 -invalidator-metrics "" > "$dir/stack.log" 2>&1 &
stack=$!
trap 'kill -TERM $stack 2>/dev/null; wait $stack 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  [[ -s "$dir/stack.env" ]] && break
  kill -0 $stack 2>/dev/null || { cat "$dir/stack.log"; exit 1; }
  sleep 0.5
done
[[ -s "$dir/stack.env" ]] || { echo "bench-rubis: the stack did not come up" >&2; cat "$dir/stack.log"; exit 1; }
"$dir/bin/rubis-bench" --env "$dir/stack.env" "$@"
