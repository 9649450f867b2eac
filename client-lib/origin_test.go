package larder

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/larderdb/larder/cache-node/origin"
	"github.com/larderdb/larder/internal/pki"
)

// startOrigin serves an origin on pgURL in the test's process, over mutual
// TLS on a loopback port; it returns its address and the edge's TLS.
func startOrigin(t testing.TB, pgURL string) (string, *tls.Config, *origin.Server) {
	t.Helper()
	addr, edgeTLS, srv, _ := startOriginPinned(t, pgURL)
	return addr, edgeTLS, srv
}

// startOriginPinned is startOrigin, also returning the origin's client.
func startOriginPinned(t testing.TB, pgURL string) (string, *tls.Config, *origin.Server, *Client) {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("origin-test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	files := map[string][2]string{}
	for _, who := range []string{"origin", "edge"} {
		var is pki.Issued
		if who == "origin" {
			is, err = ca.IssueServer(who, []string{"127.0.0.1"}, time.Hour)
		} else {
			is, err = ca.IssueClient(who, time.Hour)
		}
		if err != nil {
			t.Fatal(err)
		}
		cert, key, err := is.Write(dir, who)
		if err != nil {
			t.Fatal(err)
		}
		files[who] = [2]string{cert, key}
	}
	serverTLS, err := pki.ServerTLS(files["origin"][0], files["origin"][1], caFile)
	if err != nil {
		t.Fatal(err)
	}
	edgeTLS, err := pki.ClientTLS(caFile, files["edge"][0], files["edge"][1])
	if err != nil {
		t.Fatal(err)
	}
	oc, err := OpenPinned(context.Background(), pgURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := origin.New(origin.Config{}, oc.OriginBackend(), serverTLS)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(context.Background(), ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
		oc.Close()
	})
	return ln.Addr().String(), edgeTLS, srv, oc
}

// The history checker with the readers' misses going through an origin:
// every miss at a pin is run by the origin at that pin and comes back as
// a recipe. The broken client (hits do not narrow) must still be caught.
func TestSnapshotConsistencyThroughOrigin(t *testing.T) {
	for _, c := range []struct {
		broken bool
		l1     int64
	}{{false, 0}, {true, 8 << 20}} {
		broken := c.broken
		t.Run(fmt.Sprintf("broken=%v,L1=%d", broken, c.l1), func(t *testing.T) {
			skipNarrowForTest = broken
			defer func() { skipNarrowForTest = false }()
			var client *Client
			var srv *origin.Server
			violations, reads := transfersAndReadsWith(t, c.l1, historyRun{client: func(t *testing.T, s *stack, l1 int64) *Client {
				var addr string
				var edgeTLS *tls.Config
				addr, edgeTLS, srv = startOrigin(t, s.url)
				client = s.openWith(t, []string{s.node}, l1, true, func(c *Config) { c.Origin, c.OriginTLS = addr, edgeTLS })
				return client
			}})
			st := client.OriginStats()
			t.Logf("origin: %d statements, %d bytes received for %d raw, %d refetches, %d fallbacks; server: %d sessions",
				st.Statements, st.BytesReceived, st.BytesRaw, st.Refetches, st.Fallbacks, srv.Stats().Sessions.Load())
			if st.Statements == 0 || srv.Stats().Sessions.Load() == 0 {
				t.Fatal("no miss went through the origin")
			}
			if broken && len(violations) == 0 {
				t.Fatalf("a client that ignores validity intervals passed %d transactions: the checker cannot fail", reads)
			}
			if !broken {
				noViolations(t, violations, reads)
			}
			t.Logf("%d violations reported in %d read-only transactions", len(violations), reads)
		})
	}
}

func TestDSNOrigin(t *testing.T) {
	cfg, err := ParseDSN("postgres://u@h/db?larder.nats=nats://x:4222&larder.quma=q.json&larder.origin=origin.example:7080&larder.origin-rows=8MiB&larder.origin-edge=edge-a")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Origin != "origin.example:7080" || cfg.OriginRows != 8<<20 || cfg.OriginEdgeID != "edge-a" {
		t.Fatalf("got origin %q, rows %d, edge %q", cfg.Origin, cfg.OriginRows, cfg.OriginEdgeID)
	}
	for _, bad := range []string{"larder.origin=nohost", "larder.origin-rows=lots"} {
		if _, err := ParseDSN("postgres://u@h/db?larder.nats=nats://x:4222&larder.quma=q.json&" + bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
