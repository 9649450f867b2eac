package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"

	"github.com/larderdb/larder/bench/rubis/php"
	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/client-lib/pgfront"
)

// The PHP modes run RUBiS's PHP application (bench/rubis/php) under PHP's
// built-in server with --php-workers workers, driven by the same k6
// script: php-direct on PostgreSQL, php-larder through a Larder front
// (pgfront, in this process: the application server's sidecar) over the
// stack's cache-node, as the Go application's larder mode uses it;
// php-larder-l1 with a 256 MiB L1 in the front, as larder-l1.

// phpWorkers is PHP_CLI_SERVER_WORKERS of the PHP modes (--php-workers).
var phpWorkers = 8

// isPHPMode reports whether a mode serves the PHP application.
func isPHPMode(mode string) bool {
	return mode == "php-direct" || mode == "php-larder" || mode == "php-larder-l1"
}

// servePHP starts the PHP application for a PHP mode (and, for
// the others, its front); stop ends both. reads returns the front's
// library's reads by source (nil for php-direct).
func (b *bench) servePHP(ctx context.Context, vr variant) (base string, stop func(), reads func() map[string]int64, err error) {
	cfg := php.Config{DSN: b.env["LARDER_PG_URL"], Direct: true, Workers: phpWorkers, Staleness: vr.staleness, SQLNow: sqlNow,
		Log: prefixWriter{os.Stderr}}
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if vr.mode != "php-direct" {
		dsn, client, front, err := startFront(ctx, vr, b.env)
		if err != nil {
			return "", nil, nil, err
		}
		fctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- front.Run(fctx) }()
		stops = append(stops, client.Close, func() {
			cancel()
			if err := <-done; err != nil {
				fmt.Fprintln(os.Stderr, "rubis-bench: front:", err)
			}
		})
		cfg.DSN, cfg.Direct = dsn, false
		reads = func() map[string]int64 { return statsOf(client.Stats()) }
	}
	srv, err := php.Start(ctx, cfg)
	if err != nil {
		stop()
		return "", nil, nil, err
	}
	// The PHP server and its workers are the application's CPU.
	b.meter.app = srv.PID()
	stops = append(stops, srv.Close, func() { b.meter.app = 0 })
	return srv.URL(), stop, reads, nil
}

// startFront opens a library client on the stack (as the larder or
// larder-l1 mode's DSN configures it) and a front over it; dsn is the
// stack's database through the front.
func startFront(ctx context.Context, vr variant, env map[string]string) (dsn string, client *larder.Client, front *pgfront.Front, err error) {
	mode := "larder"
	if vr.mode == "php-larder-l1" {
		mode = "larder-l1"
	}
	lib, err := larder.ParseDSN(modeDSN(mode, vr.label, env))
	if err != nil {
		return "", nil, nil, err
	}
	lib.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	client, err = larder.Open(ctx, lib)
	if err != nil {
		return "", nil, nil, err
	}
	pg, err := url.Parse(env["LARDER_PG_URL"])
	if err != nil {
		client.Close()
		return "", nil, nil, err
	}
	cfg := pgfront.DefaultConfig()
	cfg.Listen, cfg.Postgres, cfg.Client, cfg.Log = "127.0.0.1:0", pg.Host, client, lib.Log
	cfg.DefaultStaleness = vr.staleness
	if _, _, err := net.SplitHostPort(cfg.Postgres); err != nil {
		cfg.Postgres = net.JoinHostPort(pg.Hostname(), "5432")
	}
	front, err = pgfront.New(cfg)
	if err != nil {
		client.Close()
		return "", nil, nil, err
	}
	pg.Host = front.Addr().String()
	return pg.String(), client, front, nil
}

// prefixWriter passes PHP's log (failed interactions) to standard error.
type prefixWriter struct{ w *os.File }

func (p prefixWriter) Write(b []byte) (int, error) {
	if _, err := fmt.Fprintf(p.w, "rubis-bench: php: %s", b); err != nil {
		return 0, err
	}
	return len(b), nil
}
