package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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

	procs := readProcs(dir)
	if len(procs) != 14 || procs[700].comm != "odd (name) x" || procs[700].ppid != 200 {
		t.Fatalf("read %d processes: %+v", len(procs), procs[700])
	}
	got := attribute(procs, stackRoots(procs, 210, 200, 300))
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
	got = attribute(procs, stackRoots(procs, 0, 0, 300))
	if len(got) != 1 || !near(got["app"], 5) {
		t.Fatalf("no stack: %v", got)
	}
}

// TestHelperBurn is not a test: run as a child process, it uses
// RUBIS_BENCH_BURN seconds of CPU, then says "burnt" and, with
// RUBIS_BENCH_HOLD set, stays alive until its standard input closes.
func TestHelperBurn(t *testing.T) {
	s := os.Getenv("RUBIS_BENCH_BURN")
	if s == "" {
		t.Skip("a helper process")
	}
	want, _ := strconv.ParseFloat(s, 64)
	x := 1.0
	for {
		for i := 0; i < 1e6; i++ {
			x = x*1.0000001 + 1e-9
		}
		b, err := os.ReadFile("/proc/self/stat")
		if err != nil {
			os.Exit(2)
		}
		if p, ok := parseStat(string(b)); ok && p.own >= want {
			break
		}
	}
	fmt.Println("burnt", x > 0)
	if os.Getenv("RUBIS_BENCH_HOLD") != "" {
		_, _ = io.Copy(io.Discard, os.Stdin)
	}
	os.Exit(0)
}

// startHelper starts cmd and waits for its line saying "burnt" or
// "reaped"; closing the returned writer lets it end.
func startHelper(t *testing.T, cmd *exec.Cmd, word string) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), word) {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return cmd, in
		}
	}
	t.Fatalf("%s never said %q", cmd.Path, word)
	return nil, nil
}

// On the real /proc: a group's process that reaped a child which burnt
// CPU (as the postmaster reaps its backends) counts that child's CPU; a
// sibling process that burnt as much, outside the group, does not.
func TestCPURealProcessTree(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	const burn = 0.3
	env := append(os.Environ(), fmt.Sprintf("RUBIS_BENCH_BURN=%g", burn))
	// The group's root: a shell that runs a burning child, reaps it, says
	// so, then stays alive (its child cat waits for standard input).
	grp := exec.Command("sh", "-c", `"$0" -test.run='^TestHelperBurn$' >/dev/null && echo reaped && cat`, os.Args[0])
	grp.Env = env
	startHelper(t, grp, "reaped")
	sibling := exec.Command(os.Args[0], "-test.run=^TestHelperBurn$")
	sibling.Env = append(env, "RUBIS_BENCH_HOLD=1")
	startHelper(t, sibling, "burnt")

	procs := readProcs("/proc")
	me := procs[os.Getpid()]
	if me.ppid != os.Getppid() || procs[sibling.Process.Pid].ppid != os.Getpid() || procs[grp.Process.Pid].ppid != os.Getpid() {
		t.Fatalf("the tree as read: me %+v, sibling %+v, root %+v", me, procs[sibling.Process.Pid], procs[grp.Process.Pid])
	}
	if own := procs[sibling.Process.Pid].own; own < burn {
		t.Fatalf("the sibling used %.2f s of CPU, want at least %.2f", own, burn)
	}
	got := attribute(procs, map[int]root{grp.Process.Pid: {group: "postgres"}, os.Getpid(): {group: "app", ownOnly: true}})
	// The burner's CPU, and the shell's and cat's little; the sibling's
	// would add as much again.
	if got["postgres"] < burn || got["postgres"] >= 1.8*burn {
		t.Errorf("the group used %.2f s of CPU, want the burner's %.2f and not the sibling's", got["postgres"], burn)
	}
	if !near(got["app"], me.own) {
		t.Errorf("app %.2f s, want this process's own %.2f", got["app"], me.own)
	}
}
