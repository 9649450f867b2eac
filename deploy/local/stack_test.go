package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/internal/testenv"
)

// checkAuthentication tries the stack's servers without credentials:
// NATS and the cache-node refuse, and the node serves the clients'
// certificate.
func checkAuthentication(t *testing.T, s *Stack) {
	t.Helper()
	if nc, err := nats.Connect(s.NATS.URL(), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("NATS admitted a connection without credentials")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("NATS without credentials: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	plain := protocol.NewClient(s.CacheNodeAddr(), 1)
	defer plain.Close()
	if _, err := plain.Stats(ctx); err == nil {
		t.Error("the cache-node served a plain TCP connection")
	}
	cfg, err := s.Creds.clientTLS()
	if err != nil {
		t.Fatal(err)
	}
	cl := protocol.NewTLSClient(s.CacheNodeAddr(), 1, cfg)
	defer cl.Close()
	if _, err := cl.Stats(ctx); err != nil {
		t.Errorf("the cache-node refused the clients' certificate: %v", err)
	}
}

// TestStackKeepsDataAcrossRestarts runs the stack twice on one folder, with
// the standalone nats-server binary as the local stack uses it, and checks
// that PostgreSQL, JetStream and Redis all kept their data.
func TestStackKeepsDataAcrossRestarts(t *testing.T) {
	dir, err := testenv.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := Config{Dir: filepath.Join(dir, "stack"), NATSBin: "nats-server"}
	ctx := context.Background()

	var first SmokeReport
	for round := 0; round < 2; round++ {
		s, err := Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// The env file is a shell file: sourcing it gives the DSN whole.
		out, err := exec.Command("bash", "-c", `set -eu; source "$1"; printf %s "$LARDER_DSN"`, "bash", s.EnvFile()).CombinedOutput()
		if err != nil || string(out) != s.DSN() {
			t.Errorf("source %s: LARDER_DSN=%q (%v), want %q", s.EnvFile(), out, err, s.DSN())
		}
		if round == 0 {
			checkAuthentication(t, s)
		}
		r, err := s.Smoke(ctx)
		if err != nil {
			_ = s.Close()
			t.Fatal(err)
		}
		if r.DriverCounts[1] < r.DemoRows+2 {
			t.Errorf("round %d: read-your-writes through the driver: %v, %d rows before", round, r.DriverCounts, r.DemoRows)
		}
		if r.CachedCount == "" || r.CachedHi > r.EndedBy || r.NewerMiss == "" {
			t.Errorf("round %d: cache round trip %+v", round, r)
		}
		if r.InvalidationLSN == "" || len(r.Pins) == 0 {
			t.Errorf("round %d: invalidation %q, %d pins", round, r.InvalidationLSN, len(r.Pins))
		}
		if r.WALLevel != "logical" {
			t.Errorf("wal_level = %q", r.WALLevel)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second close: %v", err)
		}
		if round == 0 {
			first = r
			continue
		}
		if r.DemoRows != first.DemoRows+3 || r.JetStreamSeq != first.JetStreamSeq+1 || r.RedisRuns != first.RedisRuns+1 {
			t.Fatalf("after restart %+v, before %+v: the demo table should have grown by three rows (the check, the cache round trip, the driver's insert), the other counters by one", r, first)
		}
	}
}
