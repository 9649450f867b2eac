package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/larderdb/larder/internal/proccpu"
)

// writeProc writes a fake /proc/<pid>/stat: utime, stime, cutime and
// cstime in ticks.
func writeProc(t *testing.T, dir string, pid, ppid int, comm string, ut, st, cut, cst int) {
	t.Helper()
	d := filepath.Join(dir, strconv.Itoa(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("%d (%s) S %d %d %d 0 -1 4194560 100 0 0 0 %d %d %d %d 20 0 1 0 100 1000 10\n", pid, comm, ppid, pid, pid, ut, st, cut, cst)
	if err := os.WriteFile(filepath.Join(d, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// Only the stack's processes count, each for its group: a PostgreSQL or
// NATS elsewhere on the machine does not, nor do this process's children
// (k6, measured on its own).
func TestCPUAttributesTheStacksProcessesOnly(t *testing.T) {
	dir := t.TempDir()
	writeProc(t, dir, 1, 0, "init", 5, 5, 900, 900)
	writeProc(t, dir, 100, 1, "bash", 1, 1, 0, 0)
	writeProc(t, dir, 200, 100, "local", 300, 100, 40, 10) // the stack: invalidator, cache-node
	writeProc(t, dir, 210, 200, "postgres", 10, 10, 500, 100)
	writeProc(t, dir, 211, 210, "postgres", 200, 50, 0, 0) // a backend
	writeProc(t, dir, 212, 210, "postgres", 30, 20, 0, 0)
	writeProc(t, dir, 220, 200, "nats-server", 70, 30, 0, 0)
	writeProc(t, dir, 230, 200, "redis-server", 3, 2, 0, 0)
	writeProc(t, dir, 300, 100, "rubis-bench", 400, 100, 777, 111)
	writeProc(t, dir, 310, 300, "k6", 900, 100, 0, 0)
	// Another PostgreSQL and NATS on the machine, and a name with spaces
	// and parentheses.
	writeProc(t, dir, 500, 1, "postgres", 1000, 1000, 1000, 1000)
	writeProc(t, dir, 501, 500, "postgres", 1000, 0, 0, 0)
	writeProc(t, dir, 600, 1, "nats-server", 1000, 0, 0, 0)
	writeProc(t, dir, 700, 200, "odd (name) x", 1, 1, 0, 0)
	if err := os.MkdirAll(filepath.Join(dir, "self"), 0o755); err != nil {
		t.Fatal(err)
	}

	procs := proccpu.Read(dir)
	if len(procs) != 14 || procs[700].Comm != "odd (name) x" || procs[700].PPID != 200 {
		t.Fatalf("read %d processes: %+v", len(procs), procs[700])
	}
	got := proccpu.Attribute(procs, stackRoots(procs, 210, 200, 300))
	want := map[string]float64{
		"postgres": (10 + 10 + 500 + 100 + 200 + 50 + 30 + 20) / 100.0,
		"nats":     (70 + 30) / 100.0,
		"larder":   (300 + 100 + 40 + 10 + 3 + 2 + 1 + 1) / 100.0, // with Redis and the odd one
		"app":      (400 + 100) / 100.0,                           // without k6, running or reaped
	}
	if len(got) != len(want) {
		t.Fatalf("groups %v, want %v", got, want)
	}
	for g, w := range want {
		if !near(got[g], w) {
			t.Errorf("%s: %.2f s, want %.2f s", g, got[g], w)
		}
	}

	// Without the stack's PIDs, nothing of the machine is counted but
	// this process.
	got = proccpu.Attribute(procs, stackRoots(procs, 0, 0, 300))
	if len(got) != 1 || !near(got["app"], 5) {
		t.Fatalf("no stack: %v", got)
	}
}
