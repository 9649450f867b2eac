package main

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	_ "github.com/larderdb/larder/client-lib"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/testenv"
	"github.com/larderdb/larder/qumaana/quma"
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
		// psql through the front: reads are served from the cache (once the
		// node confirmed the entry's groups).
		for attempt := 0; ; attempt++ {
			counts, hits, err := s.PsqlThroughFront(ctx)
			if err != nil || len(counts) != 2 || counts[0] != counts[1] {
				t.Fatalf("round %d: psql through the front: %v, %v", round, counts, err)
			}
			if hits > 0 {
				break
			}
			if attempt == 50 {
				t.Fatalf("round %d: psql through the front: no read served from the cache in 50 attempts", round)
			}
			time.Sleep(50 * time.Millisecond)
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

// A table whose replica identity lacks its tag columns does not stop the
// stack: PostgreSQL stays up, the complaint names the fix, and once the
// fix is run through PostgreSQL the invalidator starts by itself. The
// invalidator and the cache-node log to files and the node serves metrics.
func TestStackWaitsForTheReplicaIdentityFix(t *testing.T) {
	dir, err := testenv.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := Config{Dir: filepath.Join(dir, "stack"), CacheNodeMetrics: "127.0.0.1:0"}
	ctx := context.Background()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(s.URLs()["LARDER_CACHE_NODE_METRICS"])
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "larder_node_") {
		t.Errorf("the cache-node's metrics endpoint serves no larder_node_ metric:\n%.500s", body)
	}
	conn, err := pgx.Connect(ctx, s.PG.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE codes (id int PRIMARY KEY, code text UNIQUE)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"invalidator.log", "cache-node.log"} {
		if b, err := os.ReadFile(filepath.Join(s.LogDir(), name)); err != nil || len(b) == 0 {
			t.Errorf("%s: %d bytes (%v)", name, len(b), err)
		}
	}

	// Restarted: codes(code) is a tag column set its identity (the
	// primary key) lacks.
	s, err = Start(ctx, cfg)
	if err != nil {
		t.Fatalf("the stack did not start with a replica identity problem: %v", err)
	}
	defer s.Close()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(s.IdentityProblem(), "ALTER TABLE public.codes REPLICA IDENTITY FULL"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no complaint naming the fix: %q", s.IdentityProblem())
		}
	}
	conn, err = pgx.Connect(ctx, s.PG.URL("postgres"))
	if err != nil {
		t.Fatalf("PostgreSQL is not up while the invalidator waits: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ALTER TABLE public.codes REPLICA IDENTITY FULL"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); s.IdentityProblem() != ""; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the invalidator did not start after the fix: %q", s.IdentityProblem())
		}
	}
	r, err := s.Smoke(ctx)
	if err != nil {
		t.Fatalf("after the fix: %v", err)
	}
	if r.InvalidationLSN == "" || len(r.Pins) == 0 {
		t.Errorf("after the fix: invalidation %q, %d pins", r.InvalidationLSN, len(r.Pins))
	}

	// A new application's table and QUMA file: its client, with the
	// stack's credentials, registers the set its query keys on, and the
	// invalidator (NATS permissions and all) publishes it.
	if _, err := conn.Exec(ctx, "CREATE TABLE notes (id int PRIMARY KEY, author int); ALTER TABLE notes REPLICA IDENTITY FULL"); err != nil {
		t.Fatal(err)
	}
	schema, err := quma.LoadCatalog(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	sol, err := quma.AnalyzeWorkload(schema, []quma.Statement{{SQL: "SELECT id FROM notes WHERE author = $1", Frequency: 1}})
	if err != nil {
		t.Fatal(err)
	}
	qumaFile := filepath.Join(dir, "app-quma.json")
	f, err := os.Create(qumaFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := sol.WriteJSON(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	u, err := url.Parse(s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("larder.quma", qumaFile)
	u.RawQuery = q.Encode()
	db, err := sql.Open("larder", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	opts, err := s.Creds.natsOptions(invalidation.RoleClient)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.NATS.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m, err := nc.Request(invalidation.TagSetsSubject(invalidation.DefaultPrefix), nil, 2*time.Second)
		if err == nil {
			reply, err := invalidation.DecodeTagSetsReply(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if reply.From["public.notes(author)"] != 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client's tag column set public.notes(author) was not registered in 60 s (last: %v)", err)
		}
	}
}
