package main

import (
	"log/slog"
	"net/http"
	_ "net/http/pprof" // the profiles of the stack's processes in this one
	"os"
)

// servePprof serves Go's profiles of this process (the invalidator and
// the cache-nodes run in it) at LARDER_LOCAL_PPROF, when it is set (say
// 127.0.0.1:6062).
func servePprof() {
	addr := os.Getenv("LARDER_LOCAL_PPROF")
	if addr == "" {
		return
	}
	go func() {
		if err := http.ListenAndServe(addr, nil); err != nil {
			slog.Warn("local: pprof", "err", err)
		}
	}()
}
