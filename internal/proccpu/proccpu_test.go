package proccpu

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestHelperBurn is not a test: run as a child process, it uses
// PROCCPU_BURN seconds of CPU, then says "burnt" and, with
// PROCCPU_HOLD set, stays alive until its standard input closes.
func TestHelperBurn(t *testing.T) {
	s := os.Getenv("PROCCPU_BURN")
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
		if p, ok := ParseStat(string(b)); ok && p.Own >= want {
			break
		}
	}
	fmt.Println("burnt", x > 0)
	if os.Getenv("PROCCPU_HOLD") != "" {
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
	env := append(os.Environ(), fmt.Sprintf("PROCCPU_BURN=%g", burn))
	// The group's root: a shell that runs a burning child, reaps it, says
	// so, then stays alive (its child cat waits for standard input).
	grp := exec.Command("sh", "-c", `"$0" -test.run='^TestHelperBurn$' >/dev/null && echo reaped && cat`, os.Args[0])
	grp.Env = env
	startHelper(t, grp, "reaped")
	sibling := exec.Command(os.Args[0], "-test.run=^TestHelperBurn$")
	sibling.Env = append(env, "PROCCPU_HOLD=1")
	startHelper(t, sibling, "burnt")

	procs := Read("/proc")
	me := procs[os.Getpid()]
	if me.PPID != os.Getppid() || procs[sibling.Process.Pid].PPID != os.Getpid() || procs[grp.Process.Pid].PPID != os.Getpid() {
		t.Fatalf("the tree as read: me %+v, sibling %+v, root %+v", me, procs[sibling.Process.Pid], procs[grp.Process.Pid])
	}
	if own := procs[sibling.Process.Pid].Own; own < burn {
		t.Fatalf("the sibling used %.2f s of CPU, want at least %.2f", own, burn)
	}
	got := Attribute(procs, map[int]Root{grp.Process.Pid: {Group: "postgres"}, os.Getpid(): {Group: "app", OwnOnly: true}})
	// The burner's CPU, and the shell's and cat's little; the sibling's
	// would add as much again.
	if got["postgres"] < burn || got["postgres"] >= 1.8*burn {
		t.Errorf("the group used %.2f s of CPU, want the burner's %.2f and not the sibling's", got["postgres"], burn)
	}
	if math.Abs(got["app"]-me.Own) > 1e-9 {
		t.Errorf("app %.2f s, want this process's own %.2f", got["app"], me.Own)
	}
}
