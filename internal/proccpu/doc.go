// Package proccpu reads the CPU time of processes from Linux's /proc and
// sums it by process tree: the benchmarks' count of what each of the
// stack's processes (PostgreSQL's postmaster and backends, NATS, the
// application) used, without counting the rest of the machine.
package proccpu
