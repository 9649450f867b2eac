// Command larder-front serves PostgreSQL's wire protocol in front of the
// Larder library (package pgfront): point psql, PHP or any PostgreSQL
// driver at --listen instead of PostgreSQL.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/client-lib/pgfront"
	"github.com/larderdb/larder/internal/secret"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

type options struct {
	listen, postgres, dsn, metrics, logLevel string
	staleness                                time.Duration
	tlsCert, tlsKey                          string
	pgTLS, pgCA                              string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("larder-front", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:6432", "address clients connect to, as they would to PostgreSQL")
	fs.StringVar(&o.postgres, "postgres", "", "PostgreSQL's host:port, which sessions are relayed to with the clients' own credentials (default: the DSN's)")
	fs.StringVar(&o.dsn, "dsn", os.Getenv("LARDER_DSN"), "the Larder DSN: a postgres:// URL the library reads the catalog and pins with, and its larder.* parameters (env LARDER_DSN)")
	fs.StringVar(&o.metrics, "metrics", "127.0.0.1:9190", "address of the Prometheus /metrics endpoint (empty: none)")
	fs.DurationVar(&o.staleness, "staleness", 0, "larder.staleness of sessions that do not set it (default: the DSN's larder.staleness, else 30s)")
	fs.StringVar(&o.tlsCert, "tls-cert", os.Getenv("LARDER_FRONT_TLS_CERT"), "certificate offered to clients that ask for TLS, PEM (env LARDER_FRONT_TLS_CERT; without it the front answers SSLRequest 'N')")
	fs.StringVar(&o.tlsKey, "tls-key", os.Getenv("LARDER_FRONT_TLS_KEY"), "its private key, PEM (env LARDER_FRONT_TLS_KEY)")
	fs.StringVar(&o.pgTLS, "pg-tls", "disable", "TLS towards PostgreSQL: disable, require (unverified), or verify-full (with --pg-ca)")
	fs.StringVar(&o.pgCA, "pg-ca", "", "CA of PostgreSQL's certificate, PEM (--pg-tls verify-full)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.dsn == "" {
		return o, errors.New("--dsn (or LARDER_DSN) is required")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return o, errors.New("--tls-cert and --tls-key go together")
	}
	switch o.pgTLS {
	case "disable", "require":
	case "verify-full":
		if o.pgCA == "" {
			return o, errors.New("--pg-tls verify-full needs --pg-ca")
		}
	default:
		return o, fmt.Errorf("--pg-tls %q: want disable, require or verify-full", o.pgTLS)
	}
	return o, nil
}

// config makes the front's configuration (the library's client is opened
// by the caller from lib).
func (o options) config() (pgfront.Config, larder.Config, error) {
	cfg := pgfront.DefaultConfig()
	lib, err := larder.ParseDSN(o.dsn)
	if err != nil {
		return cfg, lib, err
	}
	cfg.Listen, cfg.Postgres = o.listen, o.postgres
	if cfg.Postgres == "" {
		u, err := url.Parse(lib.PostgresURL)
		if err != nil || u.Host == "" {
			return cfg, lib, errors.New("--postgres is required when the DSN names no host")
		}
		cfg.Postgres = u.Host
		if _, _, err := net.SplitHostPort(u.Host); err != nil {
			cfg.Postgres = net.JoinHostPort(u.Hostname(), "5432")
		}
	}
	switch {
	case o.staleness > 0:
		cfg.DefaultStaleness = o.staleness
	case lib.Staleness > 0:
		cfg.DefaultStaleness = lib.Staleness
	}
	if o.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return cfg, lib, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	switch o.pgTLS {
	case "require":
		cfg.PostgresTLS = &tls.Config{InsecureSkipVerify: true} // libpq's sslmode=require: encrypted, unverified
	case "verify-full":
		pem, err := os.ReadFile(o.pgCA)
		if err != nil {
			return cfg, lib, fmt.Errorf("--pg-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return cfg, lib, fmt.Errorf("--pg-ca %s: no certificate in it", o.pgCA)
		}
		host, _, _ := net.SplitHostPort(cfg.Postgres)
		cfg.PostgresTLS = &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}
	}
	return cfg, lib, nil
}

func run(args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "larder-front:", secret.Redact(err.Error()))
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintln(stderr, "larder-front: --log-level:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg, lib, err := o.config()
	if err != nil {
		fmt.Fprintln(stderr, "larder-front:", secret.Redact(err.Error()))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	lib.Log, lib.Metrics = log, reg
	client, err := larder.Open(ctx, lib)
	if err != nil {
		log.Error("opening the library failed", "err", secret.Redact(err.Error()))
		return 1
	}
	defer client.Close()
	cfg.Client, cfg.Log, cfg.Metrics = client, log, reg
	front, err := pgfront.New(cfg)
	if err != nil {
		log.Error("starting the front failed", "err", err)
		return 1
	}
	if o.metrics != "" {
		srv := &http.Server{Addr: o.metrics, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics endpoint failed", "err", err)
			}
		}()
		defer srv.Close()
	}
	log.Info("serving PostgreSQL's protocol", "listen", front.Addr().String(), "postgres", cfg.Postgres,
		"default_staleness", cfg.DefaultStaleness, "metrics", o.metrics)
	if err := front.Run(ctx); err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}
