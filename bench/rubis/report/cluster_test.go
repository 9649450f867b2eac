package report

import (
	"strings"
	"testing"
	"time"
)

// Runs with several application servers get their table: node miss rate,
// database work per request, invalidation messages per node, and
// cooperative against local-only in the same repeat.
func TestClusterMarkdown(t *testing.T) {
	runs := []Run{
		{Mode: "direct", VUs: 8, Repeat: 1, Requests: 1000, Reads: map[string]int64{PGXacts: 1000, PGStatements: 5000}},
		{Mode: "local-only", VUs: 8, Repeat: 1, Requests: 1000, Reads: map[string]int64{"node-lookups": 2000, "node": 1000, "database": 1000,
			PGXacts: 800, PGStatements: 4000, InvNodePrefix + "01": 10, InvNodePrefix + "02": 20}},
		{Mode: "cooperative", VUs: 8, Repeat: 1, Requests: 1000, Reads: map[string]int64{"node-lookups": 2000, "node": 1800, "database": 200,
			PGXacts: 400, PGStatements: 1000, InvNodePrefix + "01": 3, InvNodePrefix + "02": 4}},
	}
	md := (&Report{Mix: "bidding", Bound: time.Second, Runs: runs}).Markdown()
	for _, want := range []string{
		"| 1 | direct | 8 | 1000 | 0 | 0 | — | — | 5.00 | 1.00 | — |",
		"| 1 | local-only | 8 | 1000 | 2000 | 0 | 50.0% | 1.00 | 4.00 | 0.80 | 10 / 20 |",
		"| 1 | cooperative | 8 | 1000 | 2000 | 0 | 10.0% | 0.20 | 1.00 | 0.40 | 3 / 4 |",
		"| 1 | 8 | 0.20× | 0.20× | 0.25× |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
	// direct has no cache reads: no hit rate in the main table.
	if strings.Contains(md, "| 1 | direct | 8 | 0 | 0.00% | 0.0 |  | 0%") {
		t.Errorf("direct shows a hit rate:\n%s", md)
	}
	if (&Report{Runs: []Run{{Mode: "larder", Reads: map[string]int64{"l1": 1}}}}).clusterMarkdown() != "" {
		t.Error("a table without runs of several servers")
	}
}
