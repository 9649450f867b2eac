package proccpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// TicksPerSecond is USER_HZ, the unit of /proc/<pid>/stat's times on Linux.
const TicksPerSecond = 100

// Proc is what is read of one process in /proc/<pid>/stat.
type Proc struct {
	PPID int
	Comm string
	// Own is the process's CPU seconds (utime + stime); Reaped its
	// children's that have exited and been waited for (cutime + cstime):
	// PostgreSQL's backends come and go, and their time moves into the
	// postmaster's reaped time.
	Own, Reaped float64
}

// ParseStat parses one /proc/<pid>/stat line. The command name is in
// parentheses and may itself hold spaces and parentheses.
func ParseStat(line string) (Proc, bool) {
	open, closing := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || closing < open {
		return Proc{}, false
	}
	// After the name: state ppid pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime stime cutime cstime ...
	f := strings.Fields(line[closing+1:])
	if len(f) < 15 {
		return Proc{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return Proc{}, false
	}
	var t [4]float64
	for i := range t {
		v, err := strconv.ParseFloat(f[11+i], 64)
		if err != nil {
			return Proc{}, false
		}
		t[i] = v / TicksPerSecond
	}
	return Proc{PPID: ppid, Comm: line[open+1 : closing], Own: t[0] + t[1], Reaped: t[2] + t[3]}, true
}

// Read reads every process under procDir (/proc), by PID. Processes that
// exit while it reads are left out.
func Read(procDir string) map[int]Proc {
	out := map[int]Proc{}
	entries, _ := os.ReadDir(procDir)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "stat"))
		if err != nil {
			continue
		}
		if p, ok := ParseStat(string(b)); ok {
			out[pid] = p
		}
	}
	return out
}

// Root is a process whose tree is counted as one group.
type Root struct {
	Group string
	// OwnOnly counts the process alone: neither its descendants nor its
	// reaped children (a benchmark's own process, whose reaped children
	// are load generators measured on their own).
	OwnOnly bool
}

// Attribute sums each group's CPU seconds. A process counts for the group
// of its nearest ancestor in roots, itself included, with its own time and
// its reaped children's; processes under no root (the rest of the machine)
// and under an OwnOnly root do not count.
func Attribute(procs map[int]Proc, roots map[int]Root) map[string]float64 {
	out := map[string]float64{}
	for _, r := range roots {
		out[r.Group] += 0 // every group shows, even at zero
	}
	for pid, p := range procs {
		r, at, ok := nearestRoot(procs, roots, pid)
		switch {
		case !ok:
		case !r.OwnOnly:
			out[r.Group] += p.Own + p.Reaped
		case at == pid:
			out[r.Group] += p.Own
		}
	}
	return out
}

// nearestRoot finds pid's nearest ancestor in roots, pid itself included.
func nearestRoot(procs map[int]Proc, roots map[int]Root, pid int) (Root, int, bool) {
	for depth := 0; depth < 256 && pid > 0; depth++ {
		if r, ok := roots[pid]; ok {
			return r, pid, true
		}
		p, ok := procs[pid]
		if !ok {
			break
		}
		pid = p.PPID
	}
	return Root{}, 0, false
}

// PostmasterPID reads the PID of the PostgreSQL server whose data
// directory is dataDir (the first line of its postmaster.pid).
func PostmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid < 1 {
		return 0, fmt.Errorf("%s/postmaster.pid: no PID", dataDir)
	}
	return pid, nil
}
