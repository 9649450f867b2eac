package main

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/larderdb/larder/internal/testenv"
)

// With -cache-nodes 3 the nodes form an overlay, LARDER_DSN lists them
// with the home placement, and a client's reads of many keys through the
// first node reach their masters on the others.
func TestStackWithThreeCacheNodes(t *testing.T) {
	dir, err := testenv.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := Config{Dir: filepath.Join(dir, "stack"), CacheNodes: 3, StandaloneCacheNodes: 1, CacheNodeMetrics: "127.0.0.1:0", NATSBin: "nats-server"}
	ctx := context.Background()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := len(s.CacheNodeAddrs()); n != 3 {
		t.Fatalf("%d cache-nodes", n)
	}
	// The standalone node is listed apart, outside the overlay and LARDER_DSN.
	if sa := s.StandaloneNodeAddrs(); len(sa) != 1 || s.URLs()["LARDER_STANDALONE_NODES"] != sa[0] ||
		strings.Contains(s.DSN(), url.QueryEscape(sa[0])) || len(strings.Split(s.URLs()["LARDER_STANDALONE_NODES_METRICS"], ",")) != 1 {
		t.Fatalf("standalone nodes %v, URLs %v", sa, s.URLs())
	}
	u, err := url.Parse(s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if q.Get("larder.node-placement") != "home" || q.Get("larder.nodes") != strings.Join(s.CacheNodeAddrs(), ",") {
		t.Fatalf("LARDER_DSN: placement %q, nodes %q", q.Get("larder.node-placement"), q.Get("larder.nodes"))
	}
	for _, f := range []string{"overlay-swarm.key", "overlay-members.txt", "cache-node-3.p2p.key"} {
		if _, err := os.Stat(filepath.Join(s.Creds.Dir, f)); err != nil {
			t.Errorf("overlay credentials: %v", err)
		}
	}
	r, err := s.Smoke(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The demo's overlay step: a key the second node masters, put and read
	// through the first, is held by its master only.
	if o := r.Overlay; o == nil || !o.ServedByMaster || o.MasterKeys[1] != o.MasterKeys[0]+1 || o.HomeKeys[1] != o.HomeKeys[0] {
		t.Fatalf("overlay demo: %+v", r.Overlay)
	}
	db, err := sql.Open("larder", s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Twenty keys: the first node masters about a third of them.
	for i := range 20 {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM larder_demo WHERE id > $1", i).Scan(&n); err != nil {
			t.Fatal(err)
		}
		_ = tx.Commit()
	}
	metrics := strings.Split(s.URLs()["LARDER_CACHE_NODES_METRICS"], ",")
	if len(metrics) != 3 {
		t.Fatalf("LARDER_CACHE_NODES_METRICS: %v", metrics)
	}
	// Puts are asynchronous: wait for them to be forwarded too.
	var forwarded, fromPeer float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		forwarded = overlayRequests(t, metrics[0], "forwarded")
		fromPeer = overlayRequests(t, metrics[1], "from_peer") + overlayRequests(t, metrics[2], "from_peer")
		if forwarded >= 20 && fromPeer == forwarded || time.Now().After(deadline) {
			break
		}
	}
	if forwarded < 20 || fromPeer != forwarded {
		t.Fatalf("the home node forwarded %v requests, the others served %v for a member; want the same, at least 20", forwarded, fromPeer)
	}
	t.Logf("the home node forwarded %v lookups and puts to the masters", forwarded)
}

// overlayRequests sums larder_overlay_requests_total of a route at a
// node's metrics endpoint.
func overlayRequests(t *testing.T, endpoint, route string) float64 {
	t.Helper()
	resp, err := http.Get(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "larder_overlay_requests_total{") || !strings.Contains(line, `route="`+route+`"`) {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", endpoint, line, err)
		}
		sum += v
	}
	return sum
}
