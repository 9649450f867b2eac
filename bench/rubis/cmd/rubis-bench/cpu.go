package main

import "github.com/larderdb/larder/internal/proccpu"

// stackRoots are the benchmark's processes: PostgreSQL (the postmaster and
// its backends), NATS, the stack's process (the invalidator and the
// cache-node, with its other children: Redis, idle while the node keeps
// its cache in memory) and this process (the application). k6's CPU is
// its own process's, measured when it exits.
func stackRoots(procs map[int]proccpu.Proc, postmaster, stack, self int) map[int]proccpu.Root {
	roots := map[int]proccpu.Root{self: {Group: "app", OwnOnly: true}}
	if stack > 0 {
		roots[stack] = proccpu.Root{Group: "larder"}
		for pid, p := range procs {
			if p.PPID == stack && p.Comm == "nats-server" {
				roots[pid] = proccpu.Root{Group: "nats"}
			}
		}
	}
	if postmaster > 0 {
		roots[postmaster] = proccpu.Root{Group: "postgres"}
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
	procs := proccpu.Read(m.procDir)
	roots := stackRoots(procs, m.postmaster, m.stack, m.self)
	if m.app > 0 {
		roots[m.app] = proccpu.Root{Group: "app"}
	}
	return proccpu.Attribute(procs, roots)
}
