package mix

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// The walk reproduces the specification's stationary request shares.
func TestStationaryShares(t *testing.T) {
	cases := []struct {
		table     string
		shares    map[string]float64 // percent
		writes    float64            // percent, all writing pages
		perSess   float64
		tolerance float64 // percentage points
	}{
		{"bidding", map[string]float64{"ViewItem": 16.3, "SearchItemsInCategory": 16.9, "SearchItemsInRegion": 6.9, "PutBid": 7.2,
			"StoreBid": 5.3, "Browse": 7.6, "BrowseCategories": 5.4, "ViewUserInfo": 4.2, "AboutMe": 3.1}, 9.2, 51, 0.5},
		{"browsing", map[string]float64{"ViewItem": 35.1, "SearchItemsInCategory": 34.2, "SearchItemsInRegion": 14.0,
			"ViewUserInfo": 9.8, "ViewBidHistory": 4.4}, 0, 0, 0.5},
	}
	for _, c := range cases {
		t.Run(c.table, func(t *testing.T) {
			tab, err := Load(c.table)
			if err != nil {
				t.Fatal(err)
			}
			w := NewWalker(tab, 1)
			const n = 2_000_000
			count := map[string]int{}
			for i := 0; i < n; i++ {
				count[w.Next()]++
			}
			var report []string
			for page, want := range c.shares {
				got := 100 * float64(count[page]) / n
				report = append(report, fmt.Sprintf("%s %.1f%% (spec %.1f%%)", page, got, want))
				if math.Abs(got-want) > c.tolerance {
					t.Errorf("%s: %.1f%% of requests, the specification says %.1f%%", page, got, want)
				}
			}
			writes := 0
			for page := range Writes {
				writes += count[page]
			}
			if got := 100 * float64(writes) / n; math.Abs(got-c.writes) > c.tolerance {
				t.Errorf("writing pages: %.1f%%, the specification says %.1f%%", got, c.writes)
			}
			if c.perSess > 0 {
				if got := float64(n) / float64(w.Sessions()); math.Abs(got-c.perSess)/c.perSess > 0.15 {
					t.Errorf("%.1f requests per session, the specification says about %.0f", got, c.perSess)
				}
			}
			t.Logf("%s: %s; writes %.1f%%; %.1f requests per session", c.table, strings.Join(report, ", "), 100*float64(writes)/n, float64(n)/float64(w.Sessions()))
		})
	}
}

func TestParseRejects(t *testing.T) {
	if _, err := Parse(strings.NewReader("Home\t" + strings.Repeat("x\t", 27) + "3000\n")); err == nil {
		t.Fatal("a bad probability was accepted")
	}
	if _, err := Parse(strings.NewReader("nothing here\n")); err == nil {
		t.Fatal("an empty table was accepted")
	}
}

func TestStatesAreTheTablesColumns(t *testing.T) {
	if len(States) != numStates {
		t.Fatalf("%d states, the tables have %d columns", len(States), numStates)
	}
}
