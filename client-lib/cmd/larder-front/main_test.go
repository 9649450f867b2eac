package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

const testDSN = "postgres://app@db.local:5433/app?sslmode=disable&larder.nats=nats://127.0.0.1:4222&larder.quma=/tmp/q.json&larder.staleness=7s"

// TestFlags: the DSN gives PostgreSQL's address and the default
// staleness unless flags say otherwise; contradictions are refused.
func TestFlags(t *testing.T) {
	t.Setenv("LARDER_DSN", "")
	o, err := parseFlags([]string{"--dsn", testDSN}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, lib, err := o.config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres != "db.local:5433" || cfg.DefaultStaleness != 7*time.Second || cfg.Listen != "127.0.0.1:6432" || lib.NATSURL == "" {
		t.Fatalf("%+v", cfg)
	}
	o, err = parseFlags([]string{"--dsn", testDSN, "--postgres", "10.0.0.1:5432", "--staleness", "2s", "--pg-tls", "require"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, _, err = o.config(); err != nil || cfg.Postgres != "10.0.0.1:5432" || cfg.DefaultStaleness != 2*time.Second || cfg.PostgresTLS == nil {
		t.Fatalf("%+v, %v", cfg, err)
	}
	for _, args := range [][]string{
		{},
		{"--dsn", testDSN, "--tls-cert", "c.pem"},
		{"--dsn", testDSN, "--pg-tls", "verify-full"},
		{"--dsn", testDSN, "--pg-tls", "maybe"},
		{"--dsn", testDSN, "extra"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%s: accepted", strings.Join(args, " "))
		}
	}
	o, _ = parseFlags([]string{"--dsn", "postgres://app@db/app?larder.nats=x"}, io.Discard)
	if _, _, err := o.config(); err == nil {
		t.Error("a DSN without larder.quma accepted")
	}
}
