#!/usr/bin/env bash
# Pgpool-II's in-memory query cache as a RUBiS mode: what a PostgreSQL user
# would put in front of the database instead of Larder.
#
#   bash bench/rubis/pgpool.sh --modes direct,larder --vus 8 --duration 15s --scale 0.05 --mix bidding
#
# Runs bench.sh (its stack, its ports, its state folder: BENCH_DIR, …) with
# one more mode, pgpool: the application directly on a Pgpool-II in front of
# the stack's PostgreSQL, its query cache in shared memory, entries expiring
# after the staleness limit (--staleness, 30 s; only the first of a sweep),
# load balancing off. Pgpool-II (Debian's pgpool2) is installed with apt-get
# when missing. It runs in the background from the state folder (pgpool/:
# pgpool.conf, its sockets, pid file, query-cache oid folder and log) on
# BENCH_PGPOOL_PORT (25999) and stops with the stack. SHOW POOL_CACHE is
# printed before and after the runs and appended to report.md; the report's
# hit-rate column gives pgpool's per measured run. Other arguments go to
# rubis-bench.
#
#   bash bench/rubis/pgpool.sh --check [--staleness 30s] [--duration 65s]
#
# runs cmd/pgpool-check instead, on the same stack and Pgpool-II: how long
# each cache serves a changed row, and how many transactions read a
# combination of values that never existed (arguments go to it).
#
# Sourced (by bench.sh --pgpool), it only defines the functions.
set -euo pipefail

# pgpool_install installs Debian's pgpool2 unless pgpool is on the PATH.
pgpool_install() {
  # Debian installs it in /usr/sbin, which a user's PATH may lack.
  [[ ":$PATH:" == *:/usr/sbin:* ]] || PATH=$PATH:/usr/sbin
  command -v pgpool > /dev/null && return 0
  if ! command -v apt-get > /dev/null; then
    echo "pgpool.sh: pgpool is not installed and there is no apt-get: install Pgpool-II 4.x (pgpool on the PATH)" >&2
    return 1
  fi
  echo "pgpool.sh: installing pgpool2 (apt-get)" >&2
  local sudo=
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  if ! apt-cache show pgpool2 > /dev/null 2>&1; then
    $sudo apt-get update -qq || true
  fi
  # The package's service is not wanted: pgpool runs from the state folder.
  if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends pgpool2 >&2; then
    echo "pgpool.sh: apt-get install pgpool2 failed; run: sudo apt-get update && sudo apt-get install pgpool2" >&2
    return 1
  fi
  command -v pgpool > /dev/null || { echo "pgpool.sh: pgpool2 installed but no pgpool on the PATH" >&2; return 1; }
}

# pgpool_start DIR PG_URL EXPIRE_SECONDS starts Pgpool-II in front of the
# PostgreSQL at PG_URL, its files in DIR/pgpool, and sets PGPOOL_URL (for
# psql), PGPOOL_APP_URL (for the Go programs) and PGPOOL_PID.
pgpool_start() {
  local dir=$1 pg_url=$2 expire=$3
  local port=${BENCH_PGPOOL_PORT:-25999}
  local hostport=${pg_url#*@}
  hostport=${hostport%%/*}
  local pg_host=${hostport%:*} pg_port=${hostport##*:}
  local user=${pg_url#postgres*://}
  user=${user%%@*}
  user=${user%%:*}
  local db=${pg_url##*/}
  db=${db%%\?*}
  if (echo > "/dev/tcp/127.0.0.1/$port") 2> /dev/null; then
    echo "pgpool.sh: port $port is taken; set BENCH_PGPOOL_PORT" >&2
    return 1
  fi
  local p=$dir/pgpool
  rm -rf "$p" && mkdir -p "$p/run" "$p/log" "$p/oiddir"
  # The stack's PostgreSQL trusts local connections (initdb --auth=trust):
  # pgpool passes authentication through (no pool_hba, no pool_passwd).
  # num_init_children: one child per client connection; rubis-bench keeps
  # up to 64 open, and SHOW POOL_CACHE needs one more.
  cat > "$p/pgpool.conf" << EOF
backend_clustering_mode = 'raw'
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$p/run'
pcp_listen_addresses = ''
pcp_port = $((port + 1))
pcp_socket_dir = '$p/run'
wd_ipc_socket_dir = '$p/run'
pid_file_name = '$p/run/pgpool.pid'
logdir = '$p/log'
log_destination = 'stderr'
backend_hostname0 = '$pg_host'
backend_port0 = $pg_port
backend_weight0 = 1
backend_flag0 = 'DISALLOW_TO_FAILOVER'
enable_pool_hba = off
pool_passwd = ''
num_init_children = 72
max_pool = 1
reserved_connections = 0
child_life_time = 0
connection_life_time = 0
client_idle_limit = 0
load_balance_mode = off
health_check_period = 0
sr_check_period = 0
failover_on_backend_error = off
memory_cache_enabled = on
# pgpool's own catalog look-ups are not counted in SHOW POOL_CACHE's hits.
enable_shared_relcache = off
memqcache_method = 'shmem'
memqcache_total_size = 268435456
memqcache_max_num_cache = 1000000
memqcache_cache_block_size = 1048576
memqcache_maxcache = 409600
memqcache_expire = $expire
memqcache_auto_cache_invalidation = on
memqcache_oiddir = '$p/oiddir'
EOF
  : > "$p/pcp.conf"
  : > "$p/pool_hba.conf"
  # -n: not a daemon (this script stops it); -D: forget a backend's down
  # status from an earlier run.
  pgpool -n -D -f "$p/pgpool.conf" -F "$p/pcp.conf" -a "$p/pool_hba.conf" > "$p/log/pgpool.log" 2>&1 &
  PGPOOL_PID=$!
  PGPOOL_URL="postgres://$user@127.0.0.1:$port/$db?sslmode=disable"
  # pgx's default runs each query as a named prepared statement, parsed once
  # per connection: Pgpool-II 4.3 then registers almost no results (a
  # statement re-executed by Bind and Execute alone is not cached), so the
  # Go programs parse each query anew (unnamed statements, descriptions
  # cached in the client), as Pgpool-II's cache expects.
  PGPOOL_APP_URL="$PGPOOL_URL&default_query_exec_mode=cache_describe"
  for _ in $(seq 1 60); do
    if psql -X -q -A -t "$PGPOOL_URL" -c 'SELECT 1' > /dev/null 2>&1; then
      echo "pgpool.sh: Pgpool-II $(pgpool --version 2>&1 | awk '{print $3}') on 127.0.0.1:$port (query cache: shmem, expiry ${expire} s; log $p/log/pgpool.log)" >&2
      return 0
    fi
    kill -0 "$PGPOOL_PID" 2> /dev/null || break
    sleep 0.5
  done
  echo "pgpool.sh: Pgpool-II did not come up:" >&2
  tail -20 "$p/log/pgpool.log" >&2
  pgpool_stop
  return 1
}

# pgpool_stop stops the Pgpool-II pgpool_start started (fast shutdown).
pgpool_stop() {
  [[ -n "${PGPOOL_PID:-}" ]] || return 0
  kill -INT "$PGPOOL_PID" 2> /dev/null || true
  wait "$PGPOOL_PID" 2> /dev/null || true
  PGPOOL_PID=
}

# pgpool_cache prints SHOW POOL_CACHE's counters on one line.
pgpool_cache() {
  psql -X -q -A -F ' ' -t "$PGPOOL_URL" -c 'SHOW POOL_CACHE' 2> /dev/null |
    awk '{printf "num_cache_hits %s, num_selects %s, cache_hit_ratio %s, used_cache_entries %s (%s bytes)\n", $1, $2, $3, $6, $7}'
}

# pgpool_cpu prints the CPU seconds Pgpool-II's processes (the main one and
# its children, which live as long as it does here) have used.
pgpool_cpu() {
  local tck pids
  tck=$(getconf CLK_TCK)
  pids=$(ps -o pid= --ppid "$PGPOOL_PID" 2> /dev/null | tr -d ' ')
  for p in $PGPOOL_PID $pids; do
    cat "/proc/$p/stat" 2> /dev/null
  done | sed 's/^.*) //' | awk -v t="$tck" '{s += $12 + $13} END {printf "%.1f\n", s / t}'
}

# pgpool_expiry is the --staleness of rubis-bench's arguments (the first of
# a sweep; 30 s by default), in whole seconds.
pgpool_expiry() {
  local st=30s prev=
  for a in "$@"; do
    case $a in
      --staleness=*) st=${a#*=} ;;
    esac
    [[ $prev == --staleness ]] && st=$a
    prev=$a
  done
  st=${st%%,*}
  case $st in
    *ms) echo 1 ;;
    *m) echo $((${st%m} * 60)) ;;
    *s) echo "${st%s}" | awk '{printf "%d\n", ($1 < 1 ? 1 : $1)}' ;;
    *) echo "pgpool.sh: --staleness $st: want seconds or minutes (30s, 2m)" >&2; return 1 ;;
  esac
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  if [[ ${1:-} == --check ]]; then
    shift
    exec bash "$(dirname "$0")/bench.sh" --pgpool-check "$@"
  fi
  exec bash "$(dirname "$0")/bench.sh" --pgpool "$@"
fi
