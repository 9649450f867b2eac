package report

import (
	"fmt"
	"math"
	"strings"
)

// Ablations maps a mode to its ablation that ignores consistency
// (client-lib's UnsafeIgnoreConsistency): the pair the consistency cost
// compares.
var Ablations = map[string]string{
	"larder":     "larder-nocons",
	"local-only": "local-only-nocons",
}

// ConsistencyCost is what consistency costs a mode against its ablation
// at one client count, taken repeat by repeat (each repeat runs both, one
// after the other, so that the machine's drift falls on both alike).
type ConsistencyCost struct {
	Mode     string `json:"mode"`
	Ablation string `json:"ablation"`
	VUs      int    `json:"vus"`
	Repeats  int    `json:"repeats"`
	// Throughput: 1 − the mode's requests/s over the ablation's in the
	// same repeat: the median, the lowest, the highest, the mean and the
	// half-width of the mean's 95% confidence interval (Student's t; 0
	// with one repeat).
	Median float64 `json:"throughput_cost_median"`
	Min    float64 `json:"throughput_cost_min"`
	Max    float64 `json:"throughput_cost_max"`
	Mean   float64 `json:"throughput_cost_mean"`
	CI95   float64 `json:"throughput_cost_ci95"`
	// CPU: the stack's CPU per request (PostgreSQL, the application, the
	// invalidator and node, NATS; not the load generator), the mode's
	// over the ablation's in the same repeat, minus one: the median, the
	// lowest and the highest (all 0 when a run has no CPU figures).
	CPUMedian float64 `json:"cpu_per_request_cost_median,omitempty"`
	CPUMin    float64 `json:"cpu_per_request_cost_min,omitempty"`
	CPUMax    float64 `json:"cpu_per_request_cost_max,omitempty"`
}

// ablationOf is the ablation of a run's mode: Ablations, for a mode run at
// one of several stalenesses (labelled mode@staleness) the same mode's
// ablation at the same staleness.
func ablationOf(label string) (string, bool) {
	mode, staleness, several := strings.Cut(label, "@")
	abl, ok := Ablations[mode]
	if ok && several {
		abl += "@" + staleness
	}
	return abl, ok
}

// stackCPUPerRequest is the CPU-seconds a request took the benchmark's
// stack (0: no CPU figures).
func (r *Run) stackCPUPerRequest() float64 {
	if r.Rate <= 0 || len(r.CPU) == 0 {
		return 0
	}
	return (r.CPU["postgres"] + r.CPU["app"] + r.CPU["larder"] + r.CPU["nats"]) / r.Rate
}

// ConsistencyCosts pairs each mode that has an ablation in Ablations
// with it, repeat by repeat at each client count both ran at.
func ConsistencyCosts(runs []Run) []ConsistencyCost {
	type key struct {
		mode        string
		repeat, vus int
	}
	byKey := map[key]Run{}
	for _, r := range runs {
		byKey[key{r.Mode, r.Repeat, r.VUs}] = r
	}
	type pair struct {
		mode string
		vus  int
	}
	var order []pair
	costs, cpus := map[pair][]float64{}, map[pair][]float64{}
	cpuComplete := map[pair]bool{}
	for _, r := range runs {
		abl, ok := ablationOf(r.Mode)
		if !ok || r.Rate <= 0 {
			continue
		}
		a, ok := byKey[key{abl, r.Repeat, r.VUs}]
		if !ok || a.Rate <= 0 {
			continue
		}
		p := pair{r.Mode, r.VUs}
		if _, seen := costs[p]; !seen {
			order = append(order, p)
			cpuComplete[p] = true
		}
		costs[p] = append(costs[p], 1-r.Rate/a.Rate)
		if m, b := r.stackCPUPerRequest(), a.stackCPUPerRequest(); m > 0 && b > 0 {
			cpus[p] = append(cpus[p], m/b-1)
		} else {
			cpuComplete[p] = false
		}
	}
	out := make([]ConsistencyCost, 0, len(order))
	for _, p := range order {
		vs := costs[p]
		abl, _ := ablationOf(p.mode)
		c := ConsistencyCost{Mode: p.mode, Ablation: abl, VUs: p.vus, Repeats: len(vs)}
		c.Median, c.Min, c.Max = spread(vs)
		c.Mean, c.CI95 = meanCI95(vs)
		if cpuComplete[p] {
			c.CPUMedian, c.CPUMin, c.CPUMax = spread(cpus[p])
		}
		out = append(out, c)
	}
	return out
}

// meanCI95 is the mean of vs and the half-width of its 95% confidence
// interval by Student's t (0 for fewer than two values).
func meanCI95(vs []float64) (mean, half float64) {
	n := len(vs)
	if n == 0 {
		return 0, 0
	}
	for _, v := range vs {
		mean += v
	}
	mean /= float64(n)
	if n < 2 {
		return mean, 0
	}
	var ss float64
	for _, v := range vs {
		ss += (v - mean) * (v - mean)
	}
	sd := math.Sqrt(ss / float64(n-1))
	return mean, tQuantile975(n-1) * sd / math.Sqrt(float64(n))
}

// tQuantile975 is Student's t distribution's 97.5th percentile with df
// degrees of freedom (past 30, that of the table's next lower df: a
// little wide; the normal's 1.96 from 1 000).
func tQuantile975(df int) float64 {
	table := []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
		2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
		2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}
	if df < 1 {
		return math.Inf(1)
	}
	switch {
	case df <= len(table):
		return table[df-1]
	case df < 40:
		return table[len(table)-1]
	case df < 60:
		return 2.021
	case df < 120:
		return 2.000
	case df < 1000:
		return 1.980
	}
	return 1.96
}

// costMarkdown renders the consistency costs, if any mode ran with its
// ablation.
func costMarkdown(runs []Run) string {
	costs := ConsistencyCosts(runs)
	if len(costs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nConsistency cost: 1 − the mode's requests/s over its ablation's (the same client ignoring consistency), " +
		"repeat by repeat at the same client count, with the mean's 95% confidence interval; and the stack's CPU per request " +
		"(PostgreSQL, application, invalidator+cache-node, NATS), the mode's over the ablation's, minus one:\n\n" +
		"| mode | ablation | VUs | repeats | throughput cost (median) | min–max | mean ± 95% CI | CPU per request cost (median) | min–max |\n" +
		"|---|---|---|---|---|---|---|---|---|\n")
	pct := func(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }
	for _, c := range costs {
		ci, cpu, cpuSpan := "—", "—", "—"
		if c.Repeats > 1 {
			ci = fmt.Sprintf("%s ± %.1f points", pct(c.Mean), 100*c.CI95)
		}
		if c.CPUMedian != 0 || c.CPUMin != 0 || c.CPUMax != 0 {
			cpu, cpuSpan = pct(c.CPUMedian), pct(c.CPUMin)+" – "+pct(c.CPUMax)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %s | %s – %s | %s | %s | %s |\n", c.Mode, c.Ablation, c.VUs, c.Repeats, pct(c.Median), pct(c.Min), pct(c.Max), ci, cpu, cpuSpan)
	}
	return b.String()
}
