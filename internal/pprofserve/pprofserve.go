// Package pprofserve serves a process's Go profiles (net/http/pprof) at
// the address an environment variable names, for finding where a
// benchmark's requests wait or burn CPU; nothing is served when it is
// unset.
package pprofserve

import (
	"log/slog"
	"net/http"
	_ "net/http/pprof" // registers the profiles on http.DefaultServeMux
	"os"
)

// FromEnv serves the profiles at $name (say 127.0.0.1:6061) in the
// background, when it is set: `go tool pprof http://…/debug/pprof/profile`,
// `…/debug/pprof/trace?seconds=5`.
func FromEnv(name string) {
	addr := os.Getenv(name)
	if addr == "" {
		return
	}
	go func() {
		if err := http.ListenAndServe(addr, nil); err != nil {
			slog.Warn("pprof", "env", name, "addr", addr, "err", err)
		}
	}()
}
