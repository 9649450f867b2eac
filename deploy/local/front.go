package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/client-lib/pgfront"
)

// stackFront is the PostgreSQL wire front of the local stack: psql, PHP
// and any PostgreSQL driver read through Larder at LARDER_PROXY_URL.
type stackFront struct {
	client      *larder.Client
	front       *pgfront.Front
	cancel      context.CancelFunc
	done        chan error
	metrics     *http.Server
	metricsAddr string
}

// startFront runs the front in this process, in front of the stack's
// PostgreSQL, reading through a client of the stack's DSN.
func (s *Stack) startFront(ctx context.Context, cfg Config) error {
	if cfg.FrontPort < 0 {
		return nil // no front
	}
	log, err := s.logger(cfg, "front.log")
	if err != nil {
		return err
	}
	lib, err := larder.ParseDSN(s.DSN())
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	lib.Log, lib.Metrics = log, reg
	client, err := larder.Open(ctx, lib)
	if err != nil {
		return err
	}
	fc := pgfront.DefaultConfig()
	fc.Listen = "127.0.0.1:" + strconv.Itoa(cfg.FrontPort)
	fc.Postgres = "127.0.0.1:" + strconv.Itoa(s.PG.Port())
	fc.Client, fc.Log, fc.Metrics = client, log, reg
	front, err := pgfront.New(fc)
	if err != nil {
		client.Close()
		return err
	}
	f := &stackFront{client: client, front: front, done: make(chan error, 1)}
	fctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() { f.done <- front.Run(fctx) }()
	if cfg.FrontMetrics != "" {
		ln, err := net.Listen("tcp", cfg.FrontMetrics)
		if err != nil {
			f.stop()
			return fmt.Errorf("front metrics: %w", err)
		}
		f.metricsAddr = ln.Addr().String()
		f.metrics = &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = f.metrics.Serve(ln) }()
	}
	s.front = f
	return nil
}

// stop stops the front, then its client.
func (f *stackFront) stop() error {
	if f == nil {
		return nil
	}
	f.cancel()
	err := <-f.done
	if f.metrics != nil {
		_ = f.metrics.Close()
	}
	f.client.Close()
	return err
}

// ProxyURL is the front's URL (same user and database as LARDER_PG_URL),
// "" without a front.
func (s *Stack) ProxyURL() string {
	if s.front == nil {
		return ""
	}
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", s.front.front.Addr())
}

// FrontStats are the front's counters (nil without a front).
func (s *Stack) FrontStats() *pgfront.Stats {
	if s.front == nil {
		return nil
	}
	return s.front.front.Stats()
}

// PsqlThroughFront runs, twice, `psql "$LARDER_PROXY_URL"` with a read-only
// transaction counting larder_demo's rows, and returns what psql printed
// each time and how many of the front's reads were cache hits in all.
func (s *Stack) PsqlThroughFront(ctx context.Context) (counts []string, hits int64, err error) {
	if s.front == nil {
		return nil, 0, fmt.Errorf("the stack runs no front")
	}
	psql, err := findPsql()
	if err != nil {
		return nil, 0, err
	}
	before := s.front.front.Stats().Hits.Load()
	for i := 0; i < 2; i++ {
		// A read-only transaction may be asked to run again (SQLSTATE
		// 40001: say, a table created after the pins it could use), as an
		// application would.
		for attempt := 1; ; attempt++ {
			out, err := exec.CommandContext(ctx, psql, s.ProxyURL(), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
				"-c", "BEGIN READ ONLY", "-c", "SELECT count(*) FROM larder_demo", "-c", "COMMIT").CombinedOutput()
			if err != nil && attempt < 5 && strings.Contains(string(out), "could not serialize access") {
				continue
			}
			if err != nil {
				return nil, 0, fmt.Errorf("psql through the front: %v: %s", err, out)
			}
			counts = append(counts, strings.TrimSpace(string(out)))
			break
		}
	}
	return counts, s.front.front.Stats().Hits.Load() - before, nil
}

// findPsql finds psql beside PostgreSQL's binaries, then on the PATH.
func findPsql() (string, error) {
	var dirs []string
	if d := os.Getenv("LARDER_PG_BINDIR"); d != "" {
		dirs = append(dirs, d)
	}
	dirs = append(dirs, "/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")
	for _, d := range dirs {
		if p := filepath.Join(d, "psql"); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("psql"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("psql not found (apt-get install postgresql-client-15, or set LARDER_PG_BINDIR)")
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}
