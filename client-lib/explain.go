package larder

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/larderdb/larder/qumaana/explain"
)

// Explain says what the client does with a statement in a session whose
// search path is path (nil: the pool's): whether it is cached and why not,
// its template, tags and tag column sets as the client keys them now (the
// live catalog, the sets the invalidator publishes), as qumaana explain
// reports them.
func (c *Client) Explain(sql string, path []string) (*explain.Report, error) {
	k := c.keying.Load()
	s := *k.schema
	if path == nil {
		if ps := c.poolScope.Load(); ps != nil {
			path = ps.path
		}
	}
	if len(path) > 0 {
		s.SearchPath = path
	}
	sets := k.sets
	if sets == nil {
		sets = map[string][][]string{}
	}
	return explain.Statement(sql, explain.Options{Schema: &s, TagSets: sets})
}

// TemplateFigures are a query template's reads through this client, by
// source (l1, node: hits; database: misses; uncached), and its cache
// lookups that missed, by cache and class ("l1 staleness", "node
// compulsory", …; larder_client_template_misses_total).
type TemplateFigures struct {
	Template, SQL string
	Reads         map[string]int64
	Misses        map[string]int64
}

// Templates lists the query templates this client has read (at most the
// first 500), with their reads by source, most read first.
func (c *Client) Templates() []TemplateFigures {
	c.m.mu.Lock()
	ids := make([]string, 0, len(c.m.seenTemplates))
	for id := range c.m.seenTemplates {
		ids = append(ids, id)
	}
	c.m.mu.Unlock()
	misses := c.m.templateMissCounts()
	out := make([]TemplateFigures, 0, len(ids))
	for _, id := range ids {
		f := TemplateFigures{Template: id, Reads: map[string]int64{}, Misses: misses[id]}
		if f.Misses == nil {
			f.Misses = map[string]int64{}
		}
		if v, ok := c.templateSQL.Load(id); ok {
			f.SQL = v.(string)
		}
		for _, src := range []string{"l1", "node", "database", "patched", "uncached"} {
			var m dto.Metric
			if err := c.m.templateReads.WithLabelValues(id, src).Write(&m); err == nil {
				f.Reads[src] = int64(m.GetCounter().GetValue())
			}
		}
		out = append(out, f)
	}
	total := func(f TemplateFigures) int64 {
		return f.Reads["l1"] + f.Reads["node"] + f.Reads["database"] + f.Reads["patched"] + f.Reads["uncached"]
	}
	sort.Slice(out, func(i, j int) bool {
		if ti, tj := total(out[i]), total(out[j]); ti != tj {
			return ti > tj
		}
		return out[i].Template < out[j].Template
	})
	return out
}

// templateMissCounts reads larder_client_template_misses_total: per
// template, its misses by "cache class".
func (m *clientMetrics) templateMissCounts() map[string]map[string]int64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { m.templateMisses.Collect(ch); close(ch) }()
	out := map[string]map[string]int64{}
	for metric := range ch {
		var d dto.Metric
		if metric.Write(&d) != nil {
			continue
		}
		var template, cache, class string
		for _, l := range d.GetLabel() {
			switch l.GetName() {
			case "template":
				template = l.GetValue()
			case "cache":
				cache = l.GetValue()
			case "class":
				class = l.GetValue()
			}
		}
		if out[template] == nil {
			out[template] = map[string]int64{}
		}
		out[template][cache+" "+class] = int64(d.GetCounter().GetValue())
	}
	return out
}
