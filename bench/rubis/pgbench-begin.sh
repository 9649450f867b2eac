#!/usr/bin/env bash
# What a read-only transaction's begin costs PostgreSQL, statement by
# statement, with and without prepared statements: pgbench, one client,
# each transaction one pipeline (one round trip), on a throwaway cluster.
#
#   bash bench/rubis/pgbench-begin.sh [transactions per run, 30000] [rounds, 2]
#
# Four scripts, each run with -M extended (every statement parsed and
# planned each time, as an unnamed statement) and -M prepared (parsed once
# per connection):
#   plain      BEGIN REPEATABLE READ READ ONLY; a read by key; COMMIT
#   snapshot   plain with SET TRANSACTION SNAPSHOT of a held exported snapshot
#   hold       snapshot with the table's LOCK and storage check (Larder's miss)
#   check-after snapshot with the storage check after the read, no LOCK
# and prints each run's mean latency. Needs PostgreSQL 15's binaries
# (LARDER_PG_BINDIR, else pg_config --bindir, else /usr/lib/postgresql/15/bin).
set -euo pipefail

tx=${1:-30000}
rounds=${2:-2}
bindir=${LARDER_PG_BINDIR:-$(pg_config --bindir 2> /dev/null || echo /usr/lib/postgresql/15/bin)}
for b in initdb pg_ctl psql pgbench; do
  if [[ ! -x $bindir/$b ]]; then
    echo "pgbench-begin.sh: $bindir/$b not found: apt-get install postgresql-15 (or set LARDER_PG_BINDIR)" >&2
    exit 1
  fi
done

dir=$(mktemp -d /tmp/larder-pgbench.XXXXXX)
port=$((20000 + RANDOM % 10000))
as=()
if [[ $(id -u) -eq 0 ]]; then # PostgreSQL refuses to run as root
  chown nobody "$dir"
  as=(runuser -u nobody --)
fi
holder=
cleanup() {
  [[ -n $holder ]] && kill "$holder" 2> /dev/null || true
  "${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -m immediate stop > /dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

"${as[@]}" "$bindir/initdb" -D "$dir/data" -U postgres -A trust > /dev/null
cat >> "$dir/data/postgresql.conf" << EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_buffers = 256MB
EOF
"${as[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w start > /dev/null
conn=(-h 127.0.0.1 -p "$port" -U postgres)
"$bindir/psql" "${conn[@]}" -qX -v ON_ERROR_STOP=1 postgres << 'EOF'
CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL);
INSERT INTO accounts SELECT g, 100 FROM generate_series(1, 1000) g;
VACUUM ANALYZE accounts;
EOF

# A session that exports a snapshot and holds it, as the pincushion does.
mkfifo "$dir/in"
"$bindir/psql" "${conn[@]}" -AtqX postgres < "$dir/in" > "$dir/snapshot" 2>&1 &
holder=$!
exec 3> "$dir/in"
echo "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT pg_export_snapshot();" >&3
for _ in $(seq 50); do
  [[ -s $dir/snapshot ]] && break
  sleep 0.1
done
snapshot=$(grep -E '^[0-9A-F]+-[0-9A-F]+-[0-9]+$' "$dir/snapshot" | head -1)
if [[ -z $snapshot ]]; then
  echo "pgbench-begin.sh: no exported snapshot: $(cat "$dir/snapshot")" >&2
  exit 1
fi

begin="BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;"
import="SET TRANSACTION SNAPSHOT '$snapshot';"
lock='LOCK TABLE public.accounts IN ACCESS SHARE MODE;'
check="SELECT pg_catalog.pg_relation_filenode('public.accounts'::regclass);"
read='SELECT balance FROM accounts WHERE id = :id;'
script() { # name, statements...
  local name=$1
  shift
  {
    echo '\set id random(1, 1000)'
    echo '\startpipeline'
    printf '%s\n' "$@" COMMIT\;
    echo '\endpipeline'
  } > "$dir/$name.sql"
}
script plain "$begin" "$read"
script snapshot "$begin" "$import" "$read"
script hold "$begin" "$import" "$lock" "$check" "$read"
script check-after "$begin" "$import" "$read" "$check"

printf '%-6s %-12s %-9s %s\n' round script mode 'latency (ms)'
for r in $(seq "$rounds"); do
  for s in plain snapshot hold check-after; do
    for m in extended prepared; do
      lat=$("$bindir/pgbench" "${conn[@]}" -n -M "$m" -c 1 -t "$tx" -f "$dir/$s.sql" postgres 2>&1 |
        sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p')
      printf '%-6s %-12s %-9s %s\n' "$r" "$s" "$m" "$lat"
    done
  done
done
