package main

import (
	"log/slog"
	"net/http"
	_ "net/http/pprof" // the profiles of a run, for finding where requests wait
	"os"
)

// servePprof serves Go's profiles of this process (the application and
// the Larder client under load) at LARDER_BENCH_PPROF, when it is set
// (say 127.0.0.1:6061): `go tool pprof http://…/debug/pprof/profile`,
// `…/debug/pprof/trace?seconds=5`.
func servePprof() {
	addr := os.Getenv("LARDER_BENCH_PPROF")
	if addr == "" {
		return
	}
	go func() {
		if err := http.ListenAndServe(addr, nil); err != nil {
			slog.Warn("rubis-bench: pprof", "err", err)
		}
	}()
}
