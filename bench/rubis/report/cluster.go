package report

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Counters of runs with several application servers (rubis-bench
// --app-servers), besides the client's reads.
const (
	// PGStatements are the statements PostgreSQL ran (pg_stat_statements'
	// calls, the invalidator's own left out); PGXacts its transactions.
	PGStatements = "pg-statements"
	PGXacts      = "pg-xacts"
	// InvNodePrefix + "NN" are the invalidation messages node NN of the
	// mode received.
	InvNodePrefix = "inv-node-"
)

// NodeMissRate is the share of node lookups that did not give a usable
// hit (0 without lookups).
func (r *Run) NodeMissRate() float64 {
	l := r.Reads["node-lookups"]
	if l == 0 {
		return 0
	}
	return float64(l-r.Reads["node"]) / float64(l)
}

// PerRequest is a counter divided by the run's requests.
func (r *Run) PerRequest(key string) float64 {
	if r.Requests == 0 {
		return 0
	}
	return float64(r.Reads[key]) / float64(r.Requests)
}

// InvalidationsPerNode are the invalidation messages each of the mode's
// nodes received, in node order.
func (r *Run) InvalidationsPerNode() []int64 {
	var keys []string
	for k := range r.Reads {
		if strings.HasPrefix(k, InvNodePrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	out := make([]int64, len(keys))
	for i, k := range keys {
		out[i] = r.Reads[k]
	}
	return out
}

// clusterMarkdown is the table of runs with several application servers
// ("" when there is none): node miss rate, database work per request and
// invalidation messages per node, and cooperative against local-only.
func (r *Report) clusterMarkdown() string {
	var runs []Run
	for _, x := range r.Runs {
		if _, ok := x.Reads[PGXacts]; ok {
			runs = append(runs, x)
		}
	}
	if len(runs) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nSeveral application servers (node miss rate: node lookups without a usable hit / node lookups; "+
		"database reads: the clients' reads that went to PostgreSQL; statements: pg_stat_statements' calls, the invalidator's left out; "+
		"invalidation messages received by each node of the mode):\n\n"+
		"| repeat | mode | VUs | requests | node lookups | node errors | node miss rate | database reads / request | statements / request | transactions / request | invalidation messages per node |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range runs {
		miss, reads, stmts := "—", "—", "—"
		if x.Reads["node-lookups"] > 0 {
			miss = fmt.Sprintf("%.1f%%", 100*x.NodeMissRate())
			reads = fmt.Sprintf("%.2f", x.PerRequest("database"))
		}
		if _, ok := x.Reads[PGStatements]; ok {
			stmts = fmt.Sprintf("%.2f", x.PerRequest(PGStatements))
		}
		inv := "—"
		if per := x.InvalidationsPerNode(); len(per) > 0 {
			s := make([]string, len(per))
			for i, v := range per {
				s[i] = fmt.Sprint(v)
			}
			inv = strings.Join(s, " / ")
		}
		fmt.Fprintf(&b, "| %d | %s | %d | %d | %d | %d | %s | %s | %s | %.2f | %s |\n", max(x.Repeat, 1), x.Mode, x.VUs, x.Requests,
			x.Reads["node-lookups"], x.Reads["node-errors"], miss, reads, stmts, x.PerRequest(PGXacts), inv)
	}
	// Cooperative against local-only, run by run in each repeat.
	var lines []string
	for _, c := range runs {
		if c.Mode != "cooperative" {
			continue
		}
		i := slices.IndexFunc(runs, func(l Run) bool { return l.Mode == "local-only" && l.VUs == c.VUs && l.Repeat == c.Repeat })
		if i < 0 || runs[i].NodeMissRate() == 0 {
			continue
		}
		l := runs[i]
		line := fmt.Sprintf("| %d | %d | %.2f× | %.2f× |", max(c.Repeat, 1), c.VUs, c.NodeMissRate()/l.NodeMissRate(), ratioOf(c.PerRequest("database"), l.PerRequest("database")))
		if l.PerRequest(PGStatements) > 0 {
			line += fmt.Sprintf(" %.2f× |", c.PerRequest(PGStatements)/l.PerRequest(PGStatements))
		} else {
			line += " — |"
		}
		lines = append(lines, line)
	}
	if len(lines) > 0 {
		fmt.Fprintf(&b, "\nCooperative against local-only:\n\n| repeat | VUs | node miss rate | database reads / request | statements / request |\n|---|---|---|---|---|\n%s\n", strings.Join(lines, "\n"))
	}
	return b.String()
}

func ratioOf(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
