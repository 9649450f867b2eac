package larder

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat's times.
const clockTicks = 100

// pgCPU is the CPU time the test PostgreSQL server's processes have used:
// the postmaster's, its live children's (backends, the walsender, the
// background workers) and its exited children's. Benchmarks report its
// difference a transaction as pg-cpu-us/op: the database's share of a
// request, which the cache is to cut.
func pgCPU(tb testing.TB) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(env.PG.DataDir(), "postmaster.pid"))
	if err != nil {
		tb.Fatalf("pg-cpu: %v", err)
	}
	postmaster, _, _ := strings.Cut(string(b), "\n")
	procs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		tb.Fatalf("pg-cpu: %v", err)
	}
	var ticks int64
	for _, p := range procs {
		stat, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:])) // f[0] is field 3 (state)
		if len(f) < 15 {
			continue
		}
		pid := strings.TrimSuffix(filepath.Base(filepath.Dir(p)), "/")
		self := pid == postmaster
		if !self && f[1] != postmaster {
			continue
		}
		n := 2 // utime, stime
		if self {
			n = 4 // and the exited children's
		}
		for _, s := range f[11 : 11+n] {
			v, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				tb.Fatalf("pg-cpu: %s: %v", p, err)
			}
			ticks += v
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// reportPGCPU reports the server's CPU since start, per operation.
func reportPGCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((pgCPU(b)-start).Microseconds())/float64(b.N), "pg-cpu-us/op")
}
