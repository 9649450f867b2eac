package report

import (
	"strings"
	"testing"
	"time"
)

const summary = `{"metrics": {
  "http_reqs": {"count": 1200, "rate": 120.5},
  "http_req_failed": {"value": 0},
  "http_req_duration{name:ViewItem}": {"avg": 5, "p(90)": 12.5, "max": 40},
  "http_req_duration{name:SearchItemsInCategory}": {"avg": 9, "p(90)": 30.25, "max": 80},
  "http_req_duration{name:StoreBid}": {"avg": 0, "p(90)": 0, "max": 0}
}}`

func TestParseAndPeaks(t *testing.T) {
	run, err := ParseSummary(strings.NewReader(summary), "larder", 8)
	if err != nil {
		t.Fatal(err)
	}
	if run.Rate != 120.5 || run.Requests != 1200 || run.WorstP90 != 30.25 || run.Worst != "SearchItemsInCategory" || len(run.P90) != 2 {
		t.Fatalf("%+v", run)
	}
	runs := []Run{
		{Mode: "direct", VUs: 4, Rate: 100, WorstP90: 20},
		{Mode: "direct", VUs: 8, Rate: 150, WorstP90: 2000}, // over the bound
		{Mode: "larder", VUs: 4, Rate: 180, WorstP90: 10},
		{Mode: "larder", VUs: 8, Rate: 300, WorstP90: 900},
	}
	peaks := Peaks(runs, time.Second)
	if len(peaks) != 2 || peaks[0].Rate != 100 || peaks[1].Rate != 300 || peaks[1].VUs != 8 {
		t.Fatalf("%+v", peaks)
	}
	md := (&Report{Mix: "browsing", Scale: "tiny", Bound: time.Second, Runs: runs, Peaks: peaks}).Markdown()
	if !strings.Contains(md, "| larder | 300 | — | 8 | 3.00× | — |") || !strings.Contains(md, "one run each") {
		t.Fatalf("markdown:\n%s", md)
	}
	if _, err := ParseSummary(strings.NewReader("{}"), "x", 1); err == nil {
		t.Fatal("a summary without http_reqs was accepted")
	}
}

// Interleaved repeats: the median and spread of each mode's requests/s,
// and its ratio to direct taken repeat by repeat.
func TestSpreadsOverRepeats(t *testing.T) {
	runs := []Run{
		{Mode: "direct", Repeat: 1, VUs: 8, Rate: 100, WorstP90: 10},
		{Mode: "larder", Repeat: 1, VUs: 8, Rate: 150, WorstP90: 30},
		{Mode: "direct", Repeat: 2, VUs: 8, Rate: 200, WorstP90: 20},
		{Mode: "larder", Repeat: 2, VUs: 8, Rate: 200, WorstP90: 10},
		{Mode: "direct", Repeat: 3, VUs: 8, Rate: 120, WorstP90: 30},
		{Mode: "larder", Repeat: 3, VUs: 8, Rate: 240, WorstP90: 20, Failed: 0.01},
		{Mode: "larder", Repeat: 1, VUs: 16, Rate: 500, WorstP90: 5000},
	}
	sp := Spreads(runs)
	if len(sp) != 3 {
		t.Fatalf("%+v", sp)
	}
	d, l, l16 := sp[0], sp[1], sp[2]
	if d.Mode != "direct" || d.Repeats != 3 || d.Median != 120 || d.Min != 100 || d.Max != 200 || d.Ratio != 1 || d.RatioMin != 1 || d.RatioMax != 1 || d.WorstP90 != 20 {
		t.Errorf("direct: %+v", d)
	}
	// Ratios per repeat: 1.5, 1.0, 2.0 (not the ratio of the medians, 200/120).
	if l.Mode != "larder" || l.Median != 200 || l.Min != 150 || l.Max != 240 || l.Ratio != 1.5 || l.RatioMin != 1 || l.RatioMax != 2 || l.Failed != 0.01 {
		t.Errorf("larder: %+v", l)
	}
	// No direct run at 16 VUs: no ratio.
	if l16.VUs != 16 || l16.Ratio != 0 || l16.Median != 500 {
		t.Errorf("larder at 16: %+v", l16)
	}
	if m, lo, hi := spread([]float64{4, 1, 3, 2}); m != 2.5 || lo != 1 || hi != 4 {
		t.Errorf("spread of an even count: %v %v %v", m, lo, hi)
	}

	// A failed request in one repeat keeps larder at 8 VUs out of the
	// peaks; 16 VUs is over the bound.
	runs[5].Failed = 0
	peaks := Peaks(runs, time.Second)
	if len(peaks) != 2 || peaks[1].Rate != 200 || peaks[1].VUs != 8 || peaks[1].Min != 150 || peaks[1].Max != 240 || peaks[1].Ratio != 1.5 || peaks[1].RatioMax != 2 {
		t.Fatalf("%+v", peaks)
	}
	md := (&Report{Mix: "bidding", Scale: "tiny", Bound: time.Second, Runs: runs, Peaks: peaks}).Markdown()
	for _, want := range []string{
		"the median of 3 repeats",
		"| larder | 200 | 150–240 | 8 | 1.50× | 1.00–2.00 |",
		"| larder | 8 | 3 | 200 | 150–240 | 1.50× | 1.00–2.00 | 20.0 |",
		"| 3 | larder | 8 | 240 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	runs[5].Failed = 0.01
	if p := Peaks(runs, time.Second); p[1].Rate != 0 {
		t.Errorf("a mode with failed requests has a peak: %+v", p[1])
	}
}

// A pooler's query-cache counters give its hit rate, and its runs show no
// node misses.
func TestQueryCacheHitRate(t *testing.T) {
	runs := []Run{
		{Mode: "larder", VUs: 8, Rate: 100, Reads: map[string]int64{"l1": 1, "node": 2, "database": 1, "miss-compulsory": 7}},
		{Mode: "pgpool", VUs: 8, Rate: 100, Reads: map[string]int64{"query-cache-hits": 30, "query-cache-selects": 10}},
	}
	if h := runs[0].HitRate(); h != 0.75 {
		t.Errorf("larder hit rate %v, want 0.75", h)
	}
	if h := runs[1].HitRate(); h != 0.75 {
		t.Errorf("pgpool hit rate %v, want 0.75", h)
	}
	md := (&Report{Mix: "bidding", Runs: runs, Peaks: Peaks(runs, time.Second)}).Markdown()
	if !strings.Contains(md, "| 75% | 7 / 0 / 0 / 0 |") || !strings.Contains(md, "| 75% | — |") {
		t.Errorf("report:\n%s", md)
	}
}

// The fresh column gives the mean time a fresh snapshot took to place,
// when the run measured it, the reads that did not wait for it, and the
// begins at a pin that took a parked transaction.
func TestFreshSnapshotWait(t *testing.T) {
	runs := []Run{
		{Mode: "larder", VUs: 8, Rate: 100, Reads: map[string]int64{"l1": 1, "tx-fresh-snapshot": 30, "tx-fallback": 10, "tx-fresh-wait-us": 100_000, "unplaced-reads": 12}},
		{Mode: "local-only", VUs: 8, Rate: 100, Reads: map[string]int64{"l1": 1, "tx-fresh-snapshot": 3}},
		{Mode: "larder-nocons", VUs: 8, Rate: 100, Reads: map[string]int64{"l1": 1, "tx-fresh-snapshot": 2, "tx-pin-begins": 50, "tx-parked-begins": 35}},
	}
	md := (&Report{Mix: "bidding", Runs: runs, Peaks: Peaks(runs, time.Second)}).Markdown()
	if !strings.Contains(md, "| 30 / 10 (2.5 ms each); 12 reads before placed |") || !strings.Contains(md, "| 3 / 0 |") ||
		!strings.Contains(md, "| 2 / 0; 35 of 50 begins at a pin on a parked transaction |") {
		t.Errorf("report:\n%s", md)
	}
}
