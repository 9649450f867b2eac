package main

import (
	"net/url"
	"strings"
	"testing"
)

// With several application servers, each server's DSN names its own
// client, its own L1 and its home node: the i-th standalone node alone in
// local-only, the overlay's nodes from the i-th on with the home placement
// in cooperative; direct runs on PostgreSQL.
func TestClusterDSNs(t *testing.T) {
	defer func(n int) { appServers = n }(appServers)
	appServers = 3
	env := map[string]string{
		"LARDER_DSN":              "postgres://u@127.0.0.1:1/postgres?sslmode=disable&larder.nodes=a%2Cb%2Cc&larder.node-placement=home",
		"LARDER_CACHE_NODES":      "a,b,c,d",
		"LARDER_STANDALONE_NODES": "x,y,z",
	}
	coop, err := clusterDSNs("cooperative", "cooperative", env)
	if err != nil {
		t.Fatal(err)
	}
	local, err := clusterDSNs("local-only", "local-only", env)
	if err != nil {
		t.Fatal(err)
	}
	wantCoop := []string{"a,b,c", "b,c,a", "c,a,b"}
	wantLocal := []string{"x", "y", "z"}
	names := map[string]bool{}
	for i := range 3 {
		c, _ := url.Parse(coop[i])
		l, _ := url.Parse(local[i])
		if got := c.Query().Get("larder.nodes"); got != wantCoop[i] || c.Query().Get("larder.node-placement") != "home" {
			t.Errorf("cooperative server %d: nodes %q, placement %q", i, got, c.Query().Get("larder.node-placement"))
		}
		if got := l.Query().Get("larder.nodes"); got != wantLocal[i] || l.Query().Get("larder.node-placement") != "" {
			t.Errorf("local-only server %d: nodes %q, placement %q", i, got, l.Query().Get("larder.node-placement"))
		}
		for _, u := range []*url.URL{c, l} {
			if u.Query().Get("larder.l1") == "" || u.Query().Get("larder.node-timeout") == "" {
				t.Errorf("%s: no L1 or node timeout", u)
			}
			names[u.Query().Get("application_name")] = true
		}
	}
	if len(names) != 6 {
		t.Errorf("application names %v: want one client per server and mode", names)
	}
	if d, err := clusterDSNs("direct", "direct", env); err != nil || len(d) != 3 || d[0] != "" {
		t.Errorf("direct: %q %v", d, err)
	}
	appServers = 4
	if _, err := clusterDSNs("local-only", "local-only", env); err == nil || !strings.Contains(err.Error(), "-standalone-cache-nodes 4") {
		t.Errorf("too few standalone nodes: %v", err)
	}
	if _, err := checkCluster([]string{"cooperative", "larder"}); err == nil {
		t.Error("mode larder accepted with several application servers")
	}
}

func TestSumCounter(t *testing.T) {
	text := `# HELP larder_node_invalidation_messages_received_total x
# TYPE larder_node_invalidation_messages_received_total counter
larder_node_invalidation_messages_received_total{kind="applied"} 12
larder_node_invalidation_messages_received_total{kind="ignored"} 30
larder_node_invalidation_messages_received_totally 5
`
	if v, err := sumCounter(text, "larder_node_invalidation_messages_received_total"); err != nil || v != 42 {
		t.Fatalf("%v %v", v, err)
	}
	if v, err := sumCounter("", "larder_node_invalidation_messages_received_total"); err != nil || v != 0 {
		t.Fatalf("no series: %v %v", v, err)
	}
}
