package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/larderdb/larder/internal/testenv"
)

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
		if _, err := os.Stat(s.EnvFile()); err != nil {
			t.Errorf("env file: %v", err)
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
