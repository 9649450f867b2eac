// Command pgpool-check contrasts what Pgpool-II's in-memory query cache and
// Larder return after writes, on the same PostgreSQL (a local stack's, with
// a Pgpool-II in front of it).
//
//	bash bench/rubis/pgpool.sh --check --duration 65s
//
// starts both (bench.sh's stack, a Pgpool-II with memqcache_expire the
// --staleness, 30 s) and runs it; on a running pair:
//
//	go run ./bench/rubis/cmd/pgpool-check --env .larder-bench/stack.env \
//	  --pgpool 'postgres://postgres@127.0.0.1:25999/postgres?sslmode=disable&default_query_exec_mode=cache_describe'
//
// Staleness: a row is read until cached, then changed on PostgreSQL (as
// another application, a migration or psql would) or through Pgpool-II;
// the program polls both caches and reports how long each served the old
// value. Pgpool-II invalidates only on writes that pass through it, so a
// write elsewhere is served stale until the entry expires
// (memqcache_expire; with 0, for ever); Larder follows PostgreSQL's WAL
// and stays within its staleness limit.
//
// Mixed reads: two counters that a writer always changes together in one
// transaction (their sum stays 0) are read by transactions that read
// either one or both, concurrently with the writer. Through Pgpool-II a
// transaction that reads both can combine results cached at different
// times, or one cached and one fresh, into a sum that never existed; the
// program counts those transactions, with the writer on PostgreSQL and
// through Pgpool-II, and the same workload through Larder's database/sql
// driver (read-only transactions), which answers every transaction from
// one snapshot.
//
// The program creates and drops its own tables (pgpool_check_row,
// pgpool_check_pair) in the stack's database.
package main
