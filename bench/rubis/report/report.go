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

// Run is one k6 run: a mode at a number of virtual users.
type Run struct {
	Mode     string             `json:"mode"`
	VUs      int                `json:"vus"`
	Rate     float64            `json:"requests_per_second"`
	Requests int64              `json:"requests"`
	Failed   float64            `json:"failed_share"`
	P90      map[string]float64 `json:"p90_ms_by_interaction"`
	WorstP90 float64            `json:"worst_p90_ms"`
	Worst    string             `json:"worst_interaction"`
	// CPU is the cores each process group used during the run.
	CPU map[string]float64 `json:"cpu_cores,omitempty"`
	// Reads by where they came from (larder modes): l1, node, database.
	Reads map[string]int64 `json:"reads,omitempty"`
}

// HitRate is the share of cacheable reads served by the L1 or a node.
func (r *Run) HitRate() float64 {
	total := r.Reads["l1"] + r.Reads["node"] + r.Reads["database"]
	if total == 0 {
		return 0
	}
	return float64(r.Reads["l1"]+r.Reads["node"]) / float64(total)
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

// Peak is a mode's best throughput with every interaction's p90 under the bound.
type Peak struct {
	Mode string  `json:"mode"`
	VUs  int     `json:"vus"`
	Rate float64 `json:"requests_per_second"`
}

// Peaks finds each mode's peak.
func Peaks(runs []Run, bound time.Duration) []Peak {
	best := map[string]Peak{}
	var modes []string
	for _, r := range runs {
		if _, seen := best[r.Mode]; !seen {
			modes = append(modes, r.Mode)
			best[r.Mode] = Peak{Mode: r.Mode}
		}
		if r.WorstP90 <= float64(bound.Milliseconds()) && r.Failed == 0 && r.Rate > best[r.Mode].Rate {
			best[r.Mode] = Peak{Mode: r.Mode, VUs: r.VUs, Rate: r.Rate}
		}
	}
	out := make([]Peak, 0, len(modes))
	for _, m := range modes {
		out = append(out, best[m])
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
}

// Markdown renders the report's tables.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# RUBiS, %s mix, %s\n\n%s\n\n", r.Mix, r.Scale, r.Machine)
	fmt.Fprintf(&b, "Peak throughput with every interaction's p90 under %s:\n\n| mode | peak requests/s | at VUs | vs direct |\n|---|---|---|---|\n", r.Bound)
	var direct float64
	for _, p := range r.Peaks {
		if p.Mode == "direct" {
			direct = p.Rate
		}
	}
	for _, p := range r.Peaks {
		ratio := "—"
		if direct > 0 {
			ratio = fmt.Sprintf("%.2f×", p.Rate/direct)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %d | %s |\n", p.Mode, p.Rate, p.VUs, ratio)
	}
	fmt.Fprintf(&b, "\nEvery run (node misses: compulsory / staleness / capacity / consistency; CPU in cores used: PostgreSQL / application / invalidator+cache-node / NATS / k6):\n\n| mode | VUs | requests/s | failed | worst p90 (ms) | interaction | hit rate | node misses | CPU |\n|---|---|---|---|---|---|---|---|---|\n")
	runs := append([]Run(nil), r.Runs...)
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].Mode < runs[j].Mode })
	for _, x := range runs {
		hit, misses := "—", "—"
		if len(x.Reads) > 0 {
			hit = fmt.Sprintf("%.0f%%", 100*x.HitRate())
			misses = fmt.Sprintf("%d / %d / %d / %d", x.Reads["miss-compulsory"], x.Reads["miss-staleness"], x.Reads["miss-capacity"], x.Reads["miss-consistency"])
		}
		cpu := "—"
		if len(x.CPU) > 0 {
			cpu = fmt.Sprintf("%.2f / %.2f / %.2f / %.2f / %.2f", x.CPU["postgres"], x.CPU["app"], x.CPU["larder"], x.CPU["nats"], x.CPU["k6"])
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.2f%% | %.1f | %s | %s | %s | %s |\n", x.Mode, x.VUs, x.Rate, 100*x.Failed, x.WorstP90, x.Worst, hit, misses, cpu)
	}
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
