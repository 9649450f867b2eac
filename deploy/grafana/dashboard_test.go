package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/larderdb/larder/cache-node/node"
	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/internal/testenv"
	"github.com/larderdb/larder/invalidator/pincushion"
	"github.com/larderdb/larder/invalidator/publisher"
	"github.com/larderdb/larder/qumaana/explain"
)

var env *testenv.Env

// The node and the publisher take a NATS connection; nothing is published.
func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{NATS: true}, &env))
}

// Components, by the job variable that selects them in the dashboard.
const (
	cacheNode   = "cache-node"
	invalidator = "invalidator"
	client      = "client"
)

var componentOfJobVar = map[string]string{"node_job": cacheNode, "invalidator_job": invalidator, "client_job": client}

// exported is what one component registers: every metric name, and the
// type of those a registry gathers (vectors without series are not
// gathered: their type is unknown, and none is a histogram here).
type exported struct {
	names map[string]bool
	types map[string]dto.MetricType
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exportedBy lists what reg registers, from its collectors' descriptions.
func exportedBy(t *testing.T, reg *prometheus.Registry) exported {
	t.Helper()
	e := exported{names: map[string]bool{}, types: map[string]dto.MetricType{}}
	ch := make(chan *prometheus.Desc)
	go func() { reg.Describe(ch); close(ch) }()
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		e.names[m[1]] = true
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		e.types[f.GetName()] = f.GetType()
	}
	if len(e.names) == 0 {
		t.Fatal("a registry with no metrics")
	}
	return e
}

// has reports whether name is a metric e exports: itself, or a series of
// one of its histograms (_bucket, _sum, _count) or summaries (_sum,
// _count).
func (e exported) has(name string) bool {
	if e.names[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok || !e.names[base] {
			continue
		}
		switch e.types[base] {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return true
		case dto.MetricType_SUMMARY:
			return suffix != "_bucket"
		}
	}
	return false
}

// components builds each component's registry the way its daemon does.
func components(t *testing.T) map[string]exported {
	t.Helper()
	out := map[string]exported{}

	// The cache-node: daemon.Run registers the process collectors, the
	// node's metrics and the protocol server's collector.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := node.New(node.Config{NATS: nc, Backend: store.NewMemory(1<<20, nil), Metrics: reg}); err != nil {
		t.Fatal(err)
	}
	reg.MustRegister((&protocol.Server{}).Collector())
	out[cacheNode] = exportedBy(t, reg)

	// The invalidator: service.Run registers the process collectors, the
	// publisher's metrics and the pincushion's. Neither connects before
	// Run.
	reg = prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pnc, err := nats.Connect(env.NATS.URL(), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pnc.Close)
	unused := "postgres://larder@127.0.0.1:1/unused"
	if _, err := publisher.New(publisher.Config{ConnString: unused, NATS: pnc, Metrics: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := pincushion.New(pincushion.Config{ConnString: unused, Metrics: reg}, pincushion.NewCommitLog(pincushion.DefaultRetain)); err != nil {
		t.Fatal(err)
	}
	out[invalidator] = exportedBy(t, reg)

	out[client] = exportedBy(t, larder.MetricsRegistry())
	return out
}

// dashboard is the part of larder.json the test reads.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr       string      `json:"expr"`
		RefID      string      `json:"refId"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("larder.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("larder.json: %v", err)
	}
	return d
}

// labelValues matches a variable query label_values(expr, label).
var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)

// builtinVars are Grafana's own variables.
var builtinVars = []string{"__rate_interval", "__interval", "__range", "__all"}

var varUse = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)

// check lists what is wrong with one expression: a metric nobody exports,
// or one its job variable's component does not export. defaultVar is the
// job variable assumed for selectors without a job matcher ("" to
// require one).
func check(expr, defaultVar string, comps map[string]exported) []string {
	sels, err := selectors(expr)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", expr, err)}
	}
	if len(sels) == 0 {
		return []string{fmt.Sprintf("%s: selects no metric", expr)}
	}
	var problems []string
	for _, s := range sels {
		v := s.JobVar
		if v == "" {
			v = defaultVar
		}
		comp, ok := componentOfJobVar[v]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: %s has no job=~\"$<component>_job\" matcher naming a component (%q)", expr, s.Metric, v))
			continue
		}
		if comps[comp].has(s.Metric) {
			continue
		}
		var by []string
		for name, e := range comps {
			if e.has(s.Metric) {
				by = append(by, name)
			}
		}
		sort.Strings(by)
		if len(by) == 0 {
			problems = append(problems, fmt.Sprintf("%s: no component exports %s", expr, s.Metric))
		} else {
			problems = append(problems, fmt.Sprintf("%s: %s is selected with $%s, but the %s does not export it (%s does)", expr, s.Metric, v, comp, strings.Join(by, ", ")))
		}
	}
	return problems
}

// TestDashboardMetricsExist: every metric the dashboard's queries and
// variables name is registered by the component that should export it.
func TestDashboardMetricsExist(t *testing.T) {
	comps := components(t)
	d := readDashboard(t)
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	checked := map[string]bool{}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				for _, problem := range check(tg.Expr, "", comps) {
					t.Errorf("panel %q: %s", p.Title, problem)
				}
				for _, m := range varUse.FindAllStringSubmatch(tg.Expr, -1) {
					if !vars[m[1]] && !slices.Contains(builtinVars, m[1]) {
						t.Errorf("panel %q: $%s is not a variable of the dashboard", p.Title, m[1])
					}
				}
				sels, _ := selectors(tg.Expr)
				for _, s := range sels {
					checked[s.Metric] = true
				}
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Errorf("variable %s: query %s", v.Name, v.Query)
				continue
			}
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, q.Query)
			continue
		}
		// A job variable's own query selects its component's metric.
		for _, problem := range check(m[1], v.Name, comps) {
			t.Errorf("variable %s: %s", v.Name, problem)
		}
	}
	if len(checked) < 40 {
		t.Errorf("only %d metrics checked: the dashboard or the lexer lost its queries", len(checked))
	}
}

// TestDashboardCheckFails: the check refuses a metric nobody exports, a
// metric selected with another component's job, a histogram suffix on a
// metric that is not a histogram, and a selector without a job matcher.
func TestDashboardCheckFails(t *testing.T) {
	comps := components(t)
	for _, expr := range []string{
		`rate(larder_node_no_such_metric_total{job=~"$node_job"}[5m])`,
		`larder_node_bytes{job=~"$client_job"}`,
		`larder_node_bytes_bucket{job=~"$node_job"}`,
		`larder_node_bytes`,
		`larder_invalidator_publish_latency_seconds_bucket{job=~"$node_job"}`,
	} {
		if len(check(expr, "", comps)) == 0 {
			t.Errorf("%s: accepted", expr)
		}
	}
	for _, expr := range []string{
		`rate(larder_invalidator_publish_latency_seconds_bucket{job=~"$invalidator_job"}[5m])`,
		`larder_invalidator_publish_latency_seconds_count{job=~"$invalidator_job"}`,
		`larder_client_template_reads_total{job=~"$client_job"}`,
		`process_resident_memory_bytes{job=~"$node_job"}`,
	} {
		if p := check(expr, "", comps); len(p) > 0 {
			t.Errorf("%s: refused: %v", expr, p)
		}
	}
}

// TestExplainMetricsExist: the metrics `qumaana explain` reads are
// exported by the components it reads them from.
func TestExplainMetricsExist(t *testing.T) {
	comps := components(t)
	of := map[string]string{explain.ComponentNode: cacheNode, explain.ComponentClient: client}
	for _, m := range explain.Metrics() {
		comp, ok := of[m.Component]
		if !ok {
			t.Errorf("%s: unknown component %q", m.Name, m.Component)
			continue
		}
		if !comps[comp].has(m.Name) {
			t.Errorf("qumaana explain reads %s from the %s, which does not export it", m.Name, comp)
		}
	}
}

// TestDashboardShape: the JSON is a dashboard Grafana imports: a title
// and uid, unique panel ids, a data source variable every query uses,
// panels inside the 24-column grid without overlaps, and the job and
// template variables the queries use.
func TestDashboardShape(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q", d.Title, d.UID)
	}
	var names []string
	for _, v := range d.Templating.List {
		names = append(names, v.Name)
	}
	for _, want := range []string{"datasource", "node_job", "client_job", "invalidator_job", "template"} {
		if !slices.Contains(names, want) {
			t.Errorf("no variable %s", want)
		}
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]string{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: grid position %+v", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := used[cell{x, y}]; ok {
					t.Errorf("panels %q and %q overlap at (%d,%d)", other, p.Title, x, y)
				}
				used[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: data source %+v, %d queries", p.Title, p.Datasource, len(p.Targets))
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] || tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: query %+v", p.Title, tg)
			}
			refs[tg.RefID] = true
		}
	}
}
