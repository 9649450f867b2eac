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
	if !strings.Contains(md, "| larder | 300 | 8 | 3.00× |") {
		t.Fatalf("markdown:\n%s", md)
	}
	if _, err := ParseSummary(strings.NewReader("{}"), "x", 1); err == nil {
		t.Fatal("a summary without http_reqs was accepted")
	}
}
