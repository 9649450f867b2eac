package report

import (
	"math"
	"strings"
	"testing"
)

// The consistency cost pairs each mode with its ablation repeat by
// repeat, not median against median.
func TestConsistencyCosts(t *testing.T) {
	cpu := func(app float64) map[string]float64 {
		return map[string]float64{"postgres": 0.1, "app": app, "larder": 0.2, "nats": 0.1, "k6": 5}
	}
	runs := []Run{
		{Mode: "direct", VUs: 8, Repeat: 1, Rate: 50},
		{Mode: "larder", VUs: 8, Repeat: 1, Rate: 90, CPU: cpu(0.5)},
		{Mode: "larder-nocons", VUs: 8, Repeat: 1, Rate: 100, CPU: cpu(0.5)},
		{Mode: "larder-nocons", VUs: 8, Repeat: 2, Rate: 200, CPU: cpu(0.5)},
		{Mode: "larder", VUs: 8, Repeat: 2, Rate: 160, CPU: cpu(0.5)},
		{Mode: "larder", VUs: 8, Repeat: 3, Rate: 105, CPU: cpu(0.5)},
		{Mode: "larder-nocons", VUs: 8, Repeat: 3, Rate: 100, CPU: cpu(0.5)},
		// No ablation at 16 VUs, and local-only without its own.
		{Mode: "larder", VUs: 16, Repeat: 1, Rate: 300},
		{Mode: "local-only", VUs: 8, Repeat: 1, Rate: 300},
	}
	costs := ConsistencyCosts(runs)
	if len(costs) != 1 {
		t.Fatalf("%+v", costs)
	}
	c := costs[0]
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	// Per repeat: 1−90/100 = 0.10, 1−160/200 = 0.20, 1−105/100 = −0.05.
	if c.Mode != "larder" || c.Ablation != "larder-nocons" || c.VUs != 8 || c.Repeats != 3 ||
		!near(c.Median, 0.10) || !near(c.Min, -0.05) || !near(c.Max, 0.20) || !near(c.Mean, 0.25/3) {
		t.Errorf("%+v", c)
	}
	// sd of {0.10, 0.20, −0.05} is 0.125830; t(2) = 4.303.
	if math.Abs(c.CI95-4.303*0.1258305739/math.Sqrt(3)) > 1e-6 {
		t.Errorf("CI95 %v", c.CI95)
	}
	// The same CPU at a lower rate costs more per request: 100/90−1 etc.
	if !near(c.CPUMin, 100.0/105-1) || !near(c.CPUMax, 200.0/160-1) || !near(c.CPUMedian, 100.0/90-1) {
		t.Errorf("CPU %+v", c)
	}
	md := (&Report{Mix: "browsing", Runs: runs}).Markdown()
	if !strings.Contains(md, "| larder | larder-nocons | 8 | 3 | 10.0% | -5.0% – 20.0% | 8.3% ± 31.3 points | 11.1% | -4.8% – 25.0% |") {
		t.Errorf("markdown:\n%s", md)
	}
	// Modes run at several stalenesses are labelled mode@staleness.
	at := []Run{
		{Mode: "local-only@1s", VUs: 8, Repeat: 1, Rate: 95},
		{Mode: "local-only-nocons@1s", VUs: 8, Repeat: 1, Rate: 100},
		{Mode: "local-only@30s", VUs: 8, Repeat: 1, Rate: 50},
		{Mode: "local-only-nocons@30s", VUs: 8, Repeat: 1, Rate: 100},
	}
	if c := ConsistencyCosts(at); len(c) != 2 || c[0].Ablation != "local-only-nocons@1s" || !near(c[0].Median, 0.05) || !near(c[1].Median, 0.5) {
		t.Errorf("by staleness: %+v", c)
	}
	if md := (&Report{Runs: runs[:1]}).Markdown(); strings.Contains(md, "Consistency cost") {
		t.Errorf("a report without an ablation shows a consistency cost:\n%s", md)
	}
}

func TestTQuantile(t *testing.T) {
	if tQuantile975(1) != 12.706 || tQuantile975(9) != 2.262 || tQuantile975(35) != 2.042 || tQuantile975(100) != 2.000 || tQuantile975(5000) != 1.96 || !math.IsInf(tQuantile975(0), 1) {
		t.Error("t quantiles")
	}
	if m, h := meanCI95([]float64{0.3}); m != 0.3 || h != 0 {
		t.Errorf("one value: %v ± %v", m, h)
	}
}
