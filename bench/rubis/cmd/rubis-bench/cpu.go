package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ticksPerSecond is USER_HZ, the unit of /proc/<pid>/stat's times on Linux.
const ticksPerSecond = 100

// proc is what the benchmark reads of one process in /proc/<pid>/stat.
type proc struct {
	ppid int
	comm string
	// own is the process's CPU seconds (utime + stime); reaped its
	// children's that have exited and been waited for (cutime + cstime):
	// PostgreSQL's backends come and go, and their time moves into the
	// postmaster's reaped time.
	own, reaped float64
}

// parseStat parses one /proc/<pid>/stat line. The command name is in
// parentheses and may itself hold spaces and parentheses.
func parseStat(line string) (proc, bool) {
	open, closing := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || closing < open {
		return proc{}, false
	}
	// After the name: state ppid pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime stime cutime cstime ...
	f := strings.Fields(line[closing+1:])
	if len(f) < 15 {
		return proc{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return proc{}, false
	}
	var t [4]float64
	for i := range t {
		v, err := strconv.ParseFloat(f[11+i], 64)
		if err != nil {
			return proc{}, false
		}
		t[i] = v / ticksPerSecond
	}
	return proc{ppid: ppid, comm: line[open+1 : closing], own: t[0] + t[1], reaped: t[2] + t[3]}, true
}

// readProcs reads every process under procDir (/proc), by PID. Processes
// that exit while it reads are left out.
func readProcs(procDir string) map[int]proc {
	out := map[int]proc{}
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
		if p, ok := parseStat(string(b)); ok {
			out[pid] = p
		}
	}
	return out
}

// root is a process whose tree is counted as one group.
type root struct {
	group string
	// ownOnly counts the process alone: neither its descendants nor its
	// reaped children (this process, whose reaped children are the k6
	// runs, measured on their own).
	ownOnly bool
}

// attribute sums each group's CPU seconds. A process counts for the group
// of its nearest ancestor in roots, itself included, with its own time and
// its reaped children's; processes under no root (the rest of the machine)
// and under an ownOnly root do not count.
func attribute(procs map[int]proc, roots map[int]root) map[string]float64 {
	out := map[string]float64{}
	for _, r := range roots {
		out[r.group] += 0 // every group shows, even at zero
	}
	for pid, p := range procs {
		r, at, ok := nearestRoot(procs, roots, pid)
		switch {
		case !ok:
		case !r.ownOnly:
			out[r.group] += p.own + p.reaped
		case at == pid:
			out[r.group] += p.own
		}
	}
	return out
}

// nearestRoot finds pid's nearest ancestor in roots, pid itself included.
func nearestRoot(procs map[int]proc, roots map[int]root, pid int) (root, int, bool) {
	for depth := 0; depth < 256 && pid > 0; depth++ {
		if r, ok := roots[pid]; ok {
			return r, pid, true
		}
		p, ok := procs[pid]
		if !ok {
			break
		}
		pid = p.ppid
	}
	return root{}, 0, false
}

// stackRoots are the benchmark's processes: PostgreSQL (the postmaster and
// its backends), NATS, the stack's process (the invalidator and the
// cache-node, with its other children: Redis, idle while the node keeps
// its cache in memory) and this process (the application). k6's CPU is
// its own process's, measured when it exits.
func stackRoots(procs map[int]proc, postmaster, stack, self int) map[int]root {
	roots := map[int]root{self: {group: "app", ownOnly: true}}
	if stack > 0 {
		roots[stack] = root{group: "larder"}
		for pid, p := range procs {
			if p.ppid == stack && p.comm == "nats-server" {
				roots[pid] = root{group: "nats"}
			}
		}
	}
	if postmaster > 0 {
		roots[postmaster] = root{group: "postgres"}
	}
	return roots
}

// cpuMeter measures the CPU of the benchmark's own processes.
type cpuMeter struct {
	procDir                 string
	postmaster, stack, self int
	// app, when not 0, is a process tree that is the application too: the
	// PHP server and its workers in the PHP modes.
	app int
}

// sample returns each group's CPU seconds so far.
func (m cpuMeter) sample() map[string]float64 {
	procs := readProcs(m.procDir)
	roots := stackRoots(procs, m.postmaster, m.stack, m.self)
	if m.app > 0 {
		roots[m.app] = root{group: "app"}
	}
	return attribute(procs, roots)
}
