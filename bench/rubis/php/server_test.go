package php

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The server's workers end with it: when Close closes the watchdog's pipe,
// as when this process dies and the kernel closes it.
func TestServerEndsWithItsWorkers(t *testing.T) {
	requirePHP(t)
	// The Home page reads nothing: no database is needed.
	s, err := Start(context.Background(), Config{DSN: "host=127.0.0.1 port=1 dbname=none", Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	pgid := s.PID()
	if n := len(group(pgid)); n < 4 {
		s.Close()
		t.Fatalf("%d processes in the server's group, want the server and 3 workers", n)
	}
	// What Close does first; the kernel does the same for a killed process.
	_ = s.guard.Close()
	for deadline := time.Now().Add(10 * time.Second); len(group(pgid)) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("processes %v of the server's group are still running", group(pgid))
		}
	}
	s.Close()
	s.Close() // idempotent
}

// group lists the live processes of a process group, from /proc.
func group(pgid int) []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		line := string(b)
		f := strings.Fields(line[strings.LastIndexByte(line, ')')+1:])
		// state ppid pgrp …; a zombie has ended.
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			pids = append(pids, pid)
		}
	}
	return pids
}
