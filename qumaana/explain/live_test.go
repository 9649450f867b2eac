package explain

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

const tpl = "a9016ab64423ac2a" // SELECT * FROM items WHERE id = $1, in testdata/*.prom

// serveFile serves a Prometheus text file as client_golang's promhttp does.
func serveFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8; escaping=underscores")
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// refusedAddr is a loopback address nothing listens on.
func refusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestScrape(t *testing.T) {
	node1 := serveFile(t, "testdata/node1.prom")
	node2 := serveFile(t, "testdata/node2.prom")
	client := serveFile(t, "testdata/client.prom")
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("this is { not metrics\n"))
	}))
	defer garbage.Close()
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<html></html>"))
	}))
	defer html.Close()
	refused := refusedAddr(t)

	urls := []string{node1 + "/metrics", strings.TrimPrefix(node2, "http://"), client, refused, node1 + "/nothing", garbage.URL, html.URL}
	live := Scrape(context.Background(), &http.Client{Timeout: 5 * time.Second}, urls, tpl)

	if got := live.Failed(); got != 4 {
		t.Errorf("failed endpoints = %d, want 4: %+v", got, live.Endpoints)
	}
	wantErr := []string{"", "", "", "unreachable", "404", "not the Prometheus text format", "text/html"}
	for i, ep := range live.Endpoints {
		if (wantErr[i] == "") != (ep.Error == "") || !strings.Contains(ep.Error, wantErr[i]) {
			t.Errorf("endpoint %s: error %q, want one with %q", ep.URL, ep.Error, wantErr[i])
		}
	}
	if e := live.Endpoints[1]; e.URL != node2+"/metrics" || len(e.Exports) != 1 || e.Exports[0] != ComponentNode {
		t.Errorf("node2 endpoint %+v", e)
	}
	if e := live.Endpoints[2]; len(e.Exports) != 1 || e.Exports[0] != ComponentClient {
		t.Errorf("client endpoint %+v", e)
	}

	c := live.Client
	if c == nil || c.Calls != 500 || c.BySource["l1"] != 300 || c.BySource["uncached"] != 76 || c.HitRate == nil || *c.HitRate != 0.8 || c.MaybeOther {
		t.Errorf("client figures %+v", c)
	}
	if c != nil && (c.L1Misses["compulsory"] != 90 || c.L1Misses["staleness"] != 33 || c.L1Misses["consistency"] != 1 || len(c.L1Misses) != 3) {
		t.Errorf("client L1 misses %v (the node's and \"other\"'s counted?)", c.L1Misses)
	}
	n := live.Node
	if n == nil {
		t.Fatal("no node figures")
	}
	if n.Lookups != 124 || n.Hits != 100 || n.Misses["compulsory"] != 14 || n.Misses["staleness"] != 6 || n.Misses["capacity"] != 1 || n.Misses["consistency"] != 3 {
		t.Errorf("node lookups %+v", n)
	}
	if n.Puts != 24 || n.BytesPut != 150000 || n.InvalidationsApplied != 200 || n.MaybeOther {
		t.Errorf("node puts %+v", n)
	}
	// node1: 100000 of 400000 bytes put, 1 MiB held; node2: all of it, 2 MiB.
	if n.BytesHeldApprox == nil || *n.BytesHeldApprox != 262144+2097152 {
		t.Errorf("bytes held ≈ %v", n.BytesHeldApprox)
	}
}

// TestScrapeOther: a template with no series of its own, where the
// endpoints label some templates "other", may be counted there.
func TestScrapeOther(t *testing.T) {
	urls := []string{serveFile(t, "testdata/node2.prom"), serveFile(t, "testdata/client.prom")}
	live := Scrape(context.Background(), http.DefaultClient, urls, "ffffffffffffffff")
	if live.Client == nil || !live.Client.MaybeOther || live.Client.Calls != 0 || live.Client.HitRate != nil {
		t.Errorf("client %+v", live.Client)
	}
	if live.Node == nil || !live.Node.MaybeOther || live.Node.Lookups != 0 {
		t.Errorf("node %+v", live.Node)
	}
}

func TestReportText(t *testing.T) {
	schema, sol := rubisSchema(t), rubisSolution(t)
	r, err := Statement("SELECT * FROM items WHERE id = $1", Options{Schema: schema, Solution: sol})
	if err != nil {
		t.Fatal(err)
	}
	r.Live = Scrape(context.Background(), http.DefaultClient, []string{serveFile(t, "testdata/node1.prom"), serveFile(t, "testdata/client.prom"), refusedAddr(t)}, r.Template)
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"Template     a9016ab64423ac2a",
		"Cacheable    yes",
		"Clock-bound  no",
		"the QUMA file's (it lists this template)",
		"public.items(id)=$1  keyed on (id)  reads all columns",
		"public.items  (category) (id) (seller)",
		"client reads      500 calls: l1 300, node 100, database 24, uncached 76; hit rate 80.0%",
		"client L1 misses  compulsory 90, staleness 33, capacity 0, consistency 1",
		"node lookups      97: hits 80 (82.5%); misses compulsory 10, staleness 6, capacity 1, consistency 0",
		"node puts         17 (97.7 KiB); bytes held ≈ 256.0 KiB",
		"not read: unreachable",
		"Note: 1 of 3 endpoints could not be read",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}

	b.Reset()
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Template != tpl || back.Live == nil || back.Live.Node == nil || back.Live.Node.Puts != 17 || len(back.Live.Endpoints) != 3 {
		t.Errorf("JSON round trip: %+v", back)
	}
}

func TestEndpointURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:19189":                     "http://127.0.0.1:19189/metrics",
		"http://127.0.0.1:19189":              "http://127.0.0.1:19189/metrics",
		"http://127.0.0.1:19189/":             "http://127.0.0.1:19189/metrics",
		"https://node.example:9189/custom":    "https://node.example:9189/custom",
		" http://127.0.0.1:9188/metrics?x=1 ": "http://127.0.0.1:9188/metrics?x=1",
	} {
		if got := EndpointURL(in); got != want {
			t.Errorf("EndpointURL(%q) = %q, want %q", in, got, want)
		}
	}
}
