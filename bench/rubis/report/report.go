// Package report turns k6 runs of RUBiS into the benchmark's report: per
// mode and client count the throughput and each interaction's p90, each
// mode's peak throughput under a latency bound, as JSON and Markdown.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// Run is one k6 run: a mode at a number of virtual users, in one repeat.
type Run struct {
	Mode string `json:"mode"`
	VUs  int    `json:"vus"`
	// Repeat counts from 1; the modes take turns in each repeat.
	Repeat   int                `json:"repeat,omitempty"`
	Rate     float64            `json:"requests_per_second"`
	Requests int64              `json:"requests"`
	Failed   float64            `json:"failed_share"`
	P90      map[string]float64 `json:"p90_ms_by_interaction"`
	WorstP90 float64            `json:"worst_p90_ms"`
	Worst    string             `json:"worst_interaction"`
	// CPU is the cores each process group used during the run.
	CPU map[string]float64 `json:"cpu_cores,omitempty"`
	// Reads by where they came from (larder modes): l1, node, database;
	// for a mode on a pooler with a query cache (Pgpool-II), its SHOW
	// POOL_CACHE counters: query-cache-hits and query-cache-selects (the
	// SELECTs it sent to PostgreSQL).
	Reads map[string]int64 `json:"reads,omitempty"`
}

// HitRate is the share of cacheable reads served by the L1 or a node, or
// the share of SELECTs a pooler's query cache served.
func (r *Run) HitRate() float64 {
	hits := r.Reads["l1"] + r.Reads["node"] + r.Reads["query-cache-hits"]
	total := hits + r.Reads["database"] + r.Reads["query-cache-selects"]
	if total == 0 {
		return 0
	}
	return float64(hits) / float64(total)
}

// queryCache reports whether the reads are a pooler's query cache's.
func (r *Run) queryCache() bool {
	_, ok := r.Reads["query-cache-hits"]
	return ok
}

// ParseSummary reads k6's --summary-export file.
func ParseSummary(r io.Reader, mode string, vus int) (Run, error) {
	var s struct {
		Metrics map[string]map[string]any `json:"metrics"`
	}
	if err := json.NewDecoder(r).Decode(&s); err != nil {
		return Run{}, fmt.Errorf("report: k6 summary: %w", err)
	}
	run := Run{Mode: mode, VUs: vus, P90: map[string]float64{}}
	num := func(m map[string]any, k string) float64 {
		v, _ := m[k].(float64)
		return v
	}
	reqs, ok := s.Metrics["http_reqs"]
	if !ok {
		return Run{}, fmt.Errorf("report: k6 summary without http_reqs")
	}
	run.Rate, run.Requests = num(reqs, "rate"), int64(num(reqs, "count"))
	if f, ok := s.Metrics["http_req_failed"]; ok {
		run.Failed = num(f, "value")
	}
	for name, m := range s.Metrics {
		state, ok := strings.CutPrefix(name, "http_req_duration{name:")
		if !ok {
			continue
		}
		state = strings.TrimSuffix(state, "}")
		if num(m, "max") == 0 && num(m, "avg") == 0 {
			continue // not requested in this run
		}
		p := num(m, "p(90)")
		run.P90[state] = p
		if p > run.WorstP90 {
			run.WorstP90, run.Worst = p, state
		}
	}
	return run, nil
}

// Spread is a mode's throughput at one client count over the repeats.
type Spread struct {
	Mode    string `json:"mode"`
	VUs     int    `json:"vus"`
	Repeats int    `json:"repeats"`
	// Requests/s: the median, the lowest and the highest.
	Median float64 `json:"requests_per_second_median"`
	Min    float64 `json:"requests_per_second_min"`
	Max    float64 `json:"requests_per_second_max"`
	// The ratio to direct's requests/s in the same repeat at the same
	// client count: the median, the lowest and the highest (0: no direct
	// run to compare with).
	Ratio    float64 `json:"vs_direct_median,omitempty"`
	RatioMin float64 `json:"vs_direct_min,omitempty"`
	RatioMax float64 `json:"vs_direct_max,omitempty"`
	// WorstP90 is the median of the repeats' worst interaction p90;
	// Failed the highest failed share.
	WorstP90 float64 `json:"worst_p90_ms_median"`
	Failed   float64 `json:"failed_share_max"`
}

// Spreads gathers the runs by mode and client count, in the order they
// first ran.
func Spreads(runs []Run) []Spread {
	type key struct {
		mode string
		vus  int
	}
	direct := map[[2]int]float64{} // by repeat and VUs
	for _, r := range runs {
		if r.Mode == "direct" {
			direct[[2]int{r.Repeat, r.VUs}] = r.Rate
		}
	}
	var order []key
	group := map[key][]Run{}
	for _, r := range runs {
		k := key{r.Mode, r.VUs}
		if _, seen := group[k]; !seen {
			order = append(order, k)
		}
		group[k] = append(group[k], r)
	}
	out := make([]Spread, 0, len(order))
	for _, k := range order {
		var rates, ratios, p90s []float64
		sp := Spread{Mode: k.mode, VUs: k.vus, Repeats: len(group[k])}
		for _, r := range group[k] {
			rates, p90s = append(rates, r.Rate), append(p90s, r.WorstP90)
			if d := direct[[2]int{r.Repeat, r.VUs}]; d > 0 {
				ratios = append(ratios, r.Rate/d)
			}
			sp.Failed = max(sp.Failed, r.Failed)
		}
		sp.Median, sp.Min, sp.Max = spread(rates)
		sp.WorstP90, _, _ = spread(p90s)
		if len(ratios) == len(rates) {
			sp.Ratio, sp.RatioMin, sp.RatioMax = spread(ratios)
		}
		out = append(out, sp)
	}
	return out
}

// spread is the median, lowest and highest of vs (the mean of the middle
// two for an even count).
func spread(vs []float64) (median, lo, hi float64) {
	if len(vs) == 0 {
		return 0, 0, 0
	}
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	n := len(s)
	median = s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return median, s[0], s[n-1]
}

// Peak is a mode's best throughput with every interaction's p90 under the
// bound: the client count with the highest median requests/s.
type Peak struct {
	Mode    string  `json:"mode"`
	VUs     int     `json:"vus"`
	Rate    float64 `json:"requests_per_second"`
	Repeats int     `json:"repeats,omitempty"`
	// The lowest and highest requests/s over the repeats at that count.
	Min float64 `json:"requests_per_second_min,omitempty"`
	Max float64 `json:"requests_per_second_max,omitempty"`
	// The ratio to direct's peak in each repeat (each at its own peak's
	// client count): the median, the lowest and the highest (0: no
	// direct peak to compare with).
	Ratio    float64 `json:"vs_direct_median,omitempty"`
	RatioMin float64 `json:"vs_direct_min,omitempty"`
	RatioMax float64 `json:"vs_direct_max,omitempty"`
}

// Peaks finds each mode's peak: among its client counts whose median
// worst p90 is under the bound and with no failed request in any repeat,
// the one with the highest median requests/s.
func Peaks(runs []Run, bound time.Duration) []Peak {
	best := map[string]Peak{}
	var modes []string
	for _, sp := range Spreads(runs) {
		if _, seen := best[sp.Mode]; !seen {
			modes = append(modes, sp.Mode)
			best[sp.Mode] = Peak{Mode: sp.Mode}
		}
		if sp.WorstP90 <= float64(bound.Milliseconds()) && sp.Failed == 0 && sp.Median > best[sp.Mode].Rate {
			best[sp.Mode] = Peak{Mode: sp.Mode, VUs: sp.VUs, Rate: sp.Median, Repeats: sp.Repeats, Min: sp.Min, Max: sp.Max}
		}
	}
	// Each repeat's rate at each mode's peak client count.
	at := map[string]map[int]float64{} // mode → repeat → requests/s
	for _, r := range runs {
		if p := best[r.Mode]; p.VUs == r.VUs && p.VUs > 0 {
			if at[r.Mode] == nil {
				at[r.Mode] = map[int]float64{}
			}
			at[r.Mode][r.Repeat] = r.Rate
		}
	}
	out := make([]Peak, 0, len(modes))
	for _, m := range modes {
		p := best[m]
		var ratios []float64
		for rep, rate := range at[m] {
			if d := at["direct"][rep]; d > 0 {
				ratios = append(ratios, rate/d)
			}
		}
		if len(ratios) > 0 && len(ratios) == len(at[m]) {
			p.Ratio, p.RatioMin, p.RatioMax = spread(ratios)
		}
		out = append(out, p)
	}
	return out
}

// Report is what a benchmark run writes.
type Report struct {
	Mix     string        `json:"mix"`
	Scale   string        `json:"data"`
	Bound   time.Duration `json:"p90_bound_ns"`
	Machine string        `json:"machine"`
	Runs    []Run         `json:"runs"`
	Peaks   []Peak        `json:"peaks"`
	// ConsistencyCosts: each mode against its ablation (ConsistencyCosts).
	ConsistencyCosts []ConsistencyCost `json:"consistency_costs,omitempty"`
}

// Markdown renders the report's tables.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# RUBiS, %s mix, %s\n\n%s\n\n", r.Mix, r.Scale, r.Machine)
	repeats := 1
	for _, x := range r.Runs {
		repeats = max(repeats, x.Repeat)
	}
	// The spreads show with more than one repeat.
	span := func(n int, format string, lo, hi float64) string {
		if n < 2 || lo == 0 && hi == 0 {
			return "—"
		}
		return fmt.Sprintf(format+"–"+format, lo, hi)
	}
	ratio := func(x float64) string {
		if x == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f×", x)
	}
	of := "one run each"
	if repeats > 1 {
		of = fmt.Sprintf("the median of %d repeats, with the lowest and highest", repeats)
	}
	fmt.Fprintf(&b, "Peak throughput with every interaction's p90 under %s (%s; vs direct: the ratio to direct's peak in the same repeat):\n\n"+
		"| mode | peak requests/s | min–max | at VUs | vs direct | min–max |\n|---|---|---|---|---|---|\n", r.Bound, of)
	for _, p := range r.Peaks {
		fmt.Fprintf(&b, "| %s | %.0f | %s | %d | %s | %s |\n", p.Mode, p.Rate, span(p.Repeats, "%.0f", p.Min, p.Max), p.VUs, ratio(p.Ratio), span(p.Repeats, "%.2f", p.RatioMin, p.RatioMax))
	}
	fmt.Fprintf(&b, "\nEach mode at each client count over the repeats (vs direct: the ratio to direct's requests/s in the same repeat at the same count):\n\n"+
		"| mode | VUs | repeats | requests/s (median) | min–max | vs direct (median) | min–max | worst p90 (ms, median) |\n|---|---|---|---|---|---|---|---|\n")
	for _, sp := range Spreads(r.Runs) {
		fmt.Fprintf(&b, "| %s | %d | %d | %.0f | %s | %s | %s | %.1f |\n", sp.Mode, sp.VUs, sp.Repeats, sp.Median, span(sp.Repeats, "%.0f", sp.Min, sp.Max),
			ratio(sp.Ratio), span(sp.Repeats, "%.2f", sp.RatioMin, sp.RatioMax), sp.WorstP90)
	}
	b.WriteString(costMarkdown(r.Runs))
	fmt.Fprintf(&b, "\nEvery run, in the order they ran (node misses: compulsory / staleness / capacity / consistency; "+
		"fresh / uncached: read-only transactions that found no pin recent enough and had the pincushion place a snapshot of their own, "+
		"and those that ran uncached because it could not (and the mean time the pincushion took to place each), "+
		"then the reads that ran on PostgreSQL before their transaction's fresh snapshot was placed, "+
		"and how many of the transactions begun at a pin began on one parked on their connection instead of importing its snapshot "+
		"(of them, at an older candidate pin than their newest because one was parked there); "+
		"node lookups per request, and cacheable function calls served from the cache / run (mode larder-functions); "+
		"hit rate: Larder's reads served by an L1 or a node, or the SELECTs a pooler's query cache served (SHOW POOL_CACHE); "+
		"CPU in cores used by this benchmark's own processes: PostgreSQL / application / invalidator+cache-node / NATS / k6):\n\n"+
		"| repeat | mode | VUs | requests/s | failed | worst p90 (ms) | interaction | hit rate | node misses | fresh / uncached | lookups/request | functions hit / run | CPU |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.Runs {
		hit, misses, fresh, lookups, fns := "—", "—", "—", "—", "—"
		if x.Reads["l1"]+x.Reads["node"]+x.Reads["database"] > 0 || x.queryCache() {
			hit = fmt.Sprintf("%.0f%%", 100*x.HitRate())
		}
		if len(x.Reads) > 0 && !x.queryCache() {
			misses = fmt.Sprintf("%d / %d / %d / %d", x.Reads["miss-compulsory"], x.Reads["miss-staleness"], x.Reads["miss-capacity"], x.Reads["miss-consistency"])
			fresh = fmt.Sprintf("%d / %d", x.Reads["tx-fresh-snapshot"], x.Reads["tx-fallback"])
			if n := x.Reads["tx-fresh-snapshot"] + x.Reads["tx-fallback"]; n > 0 && x.Reads["tx-fresh-wait-us"] > 0 {
				fresh += fmt.Sprintf(" (%.1f ms each)", float64(x.Reads["tx-fresh-wait-us"])/1000/float64(n))
			}
			if u := x.Reads["unplaced-reads"]; u > 0 {
				fresh += fmt.Sprintf("; %d reads before placed", u)
			}
			if n := x.Reads["tx-pin-begins"]; n > 0 {
				fresh += fmt.Sprintf("; %d of %d begins at a pin on a parked transaction", x.Reads["tx-parked-begins"], n)
				if o := x.Reads["tx-older-pin-begins"]; o > 0 {
					fresh += fmt.Sprintf(" (%d at an older pin than the newest)", o)
				}
			}
			if x.Requests > 0 {
				lookups = fmt.Sprintf("%.2f", float64(x.Reads["node-lookups"])/float64(x.Requests))
			}
			if x.Reads["function-hits"]+x.Reads["function-runs"] > 0 {
				fns = fmt.Sprintf("%d / %d", x.Reads["function-hits"], x.Reads["function-runs"])
			}
		}
		cpu := "—"
		if len(x.CPU) > 0 {
			cpu = fmt.Sprintf("%.2f / %.2f / %.2f / %.2f / %.2f", x.CPU["postgres"], x.CPU["app"], x.CPU["larder"], x.CPU["nats"], x.CPU["k6"])
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %.0f | %.2f%% | %.1f | %s | %s | %s | %s | %s | %s | %s |\n", max(x.Repeat, 1), x.Mode, x.VUs, x.Rate, 100*x.Failed, x.WorstP90, x.Worst, hit, misses, fresh, lookups, fns, cpu)
	}
	b.WriteString(r.clusterMarkdown())
	return b.String()
}

// Write writes report.json and report.md into dir.
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(dir+"/report.json", j, 0o644); err != nil {
		return err
	}
	return os.WriteFile(dir+"/report.md", []byte(r.Markdown()), 0o644)
}
