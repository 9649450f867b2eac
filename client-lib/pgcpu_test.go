package larder

import (
	"testing"
	"time"

	"github.com/larderdb/larder/internal/proccpu"
)

// pgCPU is the CPU time the test PostgreSQL server's processes have used:
// the postmaster's, its live children's (backends, the walsender, the
// background workers) and its exited children's. Benchmarks report its
// difference a transaction as pg-cpu-us/op: the database's share of a
// request, which the cache is to cut.
func pgCPU(tb testing.TB) time.Duration {
	tb.Helper()
	postmaster, err := proccpu.PostmasterPID(env.PG.DataDir())
	if err != nil {
		tb.Fatalf("pg-cpu: %v", err)
	}
	procs := proccpu.Read("/proc")
	if _, ok := procs[postmaster]; !ok {
		tb.Fatalf("pg-cpu: the postmaster (PID %d) is not in /proc", postmaster)
	}
	s := proccpu.Attribute(procs, map[int]proccpu.Root{postmaster: {Group: "postgres"}})["postgres"]
	return time.Duration(s * float64(time.Second))
}

// reportPGCPU reports the server's CPU since start, per operation.
func reportPGCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((pgCPU(b)-start).Microseconds())/float64(b.N), "pg-cpu-us/op")
}
