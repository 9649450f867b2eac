package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/larderdb/larder/internal/errwriter"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("Statement", oneLine(r.SQL))
	row("Template", r.Template+"  (pg_query fingerprint: the template label of larder_node_template_* and larder_client_template_reads_total)")
	if n := oneLine(r.Normalized); n != oneLine(r.SQL) {
		row("Normalized", n)
	}
	row("Kind", r.Kind)
	if r.Cacheable {
		row("Cacheable", "yes")
	} else {
		row("Cacheable", "no: "+r.Reason)
		if r.Rewrite != "" {
			row("Rewrite", r.Rewrite)
		}
	}
	switch {
	case r.Clock != nil:
		row("Clock-bound", "yes: it reads the transaction's start, so it is cached per clock bucket")
		row("", "(the client's ClockGranularity, a minute by default; per template ClockGranularities or")
		row("", "larder.clock-granularity; off: not cached). Each bucket is a key of its own: a new bucket")
		row("", "misses once (compulsory).")
		row("", fmt.Sprintf("A client runs, with $%d = its bucket:", r.Clock.Param))
		row("", oneLine(r.Clock.SQL))
	case r.Cacheable:
		row("Clock-bound", "no")
	}
	switch {
	case r.TagSetsFrom == SetsFromQUMA && r.InQUMAFile != nil && *r.InQUMAFile:
		row("Tag sets", "the QUMA file's (it lists this template)")
	case r.TagSetsFrom == SetsFromQUMA:
		row("Tag sets", "the QUMA file's (it does not list this template: a client analyzes it at run time with the file's sets)")
	case r.TagSetsFrom == SetsFromClient:
		row("Tag sets", "the client's: its QUMA file's sets that the invalidator publishes")
	default:
		row("Tag sets", "proposed by this statement alone, as `qumaana analyze` would choose them (no QUMA file given)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	ew := errwriter.New(w)
	if len(r.Dependencies) > 0 {
		if r.Cacheable {
			ew.Printf("\nTags a result holds (a write publishing one of them, changing a column read, invalidates it)\n")
		} else {
			ew.Printf("\nTags a result would hold, were it cacheable\n")
		}
		tw = tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, d := range r.Dependencies {
			how := "keyed on (" + strings.Join(d.KeyColumns, ",") + ")"
			if len(d.KeyColumns) == 0 {
				how = "table tag: " + d.TableTagReason
			}
			if d.CoveredBy != "" {
				how = "covered by " + d.CoveredBy + " (held only when its values cannot be keyed), else " + how
			}
			fmt.Fprintf(tw, "  %s\t%s\treads %s\n", strings.Join(d.Tags, " "), how, columns(d.Reads, d.AllColumns))
			if s := d.RowSplit; s != nil {
				fmt.Fprintf(tw, "  \t  split by rows: these tags read only %s; each row of a result adds %s=<column %d> reading %s\t\n",
					columns(s.Membership, false), s.RowTag, s.Output, columns(s.Display, false))
			}
			for _, p := range d.Proposed {
				fmt.Fprintf(tw, "  \t  the statement alone would key on (%s): add it to the QUMA file (qumaana analyze) to use it\t\n", strings.Join(p, ","))
			}
		}
		_ = tw.Flush()
	}
	if len(r.Reads) > 0 {
		ew.Printf("\nColumns read\n")
		tw = tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, tr := range r.Reads {
			fmt.Fprintf(tw, "  %s\t%s\n", tr.Table, columns(tr.Columns, tr.AllColumns))
		}
		_ = tw.Flush()
	}
	if len(r.Writes) > 0 {
		ew.Printf("\nWrites (each changed row publishes its old and new row's tags)\n")
		tw = tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, wr := range r.Writes {
			changes := "rows (every column)"
			switch {
			case wr.Truncate:
				changes = "truncates (a flush of the table)"
			case !wr.AllColumns:
				changes = "columns " + strings.Join(wr.Columns, ", ")
			}
			fmt.Fprintf(tw, "  %s\t%s\tpublishes %s\n", wr.Table, changes, strings.Join(wr.Publishes, " "))
		}
		_ = tw.Flush()
	}
	if len(r.TagColumnSets) > 0 {
		ew.Printf("\nTag column sets of these tables\n")
		tables := make([]string, 0, len(r.TagColumnSets))
		for t := range r.TagColumnSets {
			tables = append(tables, t)
		}
		sort.Strings(tables)
		tw = tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, t := range tables {
			sets := r.TagColumnSets[t]
			if len(sets) == 0 {
				fmt.Fprintf(tw, "  %s\tnone: results hold its table tag, which every change of the table publishes\n", t)
				continue
			}
			var s []string
			for _, set := range sets {
				s = append(s, "("+strings.Join(set, ",")+")")
			}
			fmt.Fprintf(tw, "  %s\t%s\n", t, strings.Join(s, " "))
		}
		_ = tw.Flush()
	}
	if r.Live != nil {
		r.Live.writeText(ew, r.Template)
	}
	return ew.Err()
}

// writeText writes the live figures.
func (l *Live) writeText(ew *errwriter.Writer, template string) {
	ew.Printf("\nLive figures of template %s (counters since each process started, added up over the endpoints)\n", template)
	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	for _, ep := range l.Endpoints {
		what := strings.Join(ep.Exports, ", ")
		if ep.Error != "" {
			what = "not read: " + ep.Error
		} else if what == "" {
			what = "no Larder metrics"
		}
		fmt.Fprintf(tw, "  endpoint\t%s\t%s\n", ep.URL, what)
	}
	_ = tw.Flush()
	tw = tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	if c := l.Client; c != nil {
		fmt.Fprintf(tw, "  client reads\t%s\n", clientText(c))
		if len(c.L1Misses) > 0 {
			var parts []string
			for _, class := range missClasses {
				parts = append(parts, fmt.Sprintf("%s %s", class, count(c.L1Misses[class])))
			}
			fmt.Fprintf(tw, "  client L1 misses\t%s\n", strings.Join(parts, ", "))
		}
	} else {
		fmt.Fprintf(tw, "  client reads\tno endpoint exports client-lib's metrics (give the application's)\n")
	}
	if n := l.Node; n != nil {
		for _, s := range nodeText(n) {
			fmt.Fprintf(tw, "  %s\t%s\n", s[0], s[1])
		}
	} else {
		fmt.Fprintf(tw, "  node lookups\tno endpoint exports a cache-node's metrics\n")
	}
	_ = tw.Flush()
	switch f := l.Failed(); {
	case f == len(l.Endpoints):
		ew.Printf("  Note: no endpoint could be read.\n")
	case f > 0:
		ew.Printf("  Note: %d of %d endpoints could not be read; the figures are those of the others.\n", f, len(l.Endpoints))
	}
}

func clientText(c *ClientFigures) string {
	if c.Calls == 0 {
		s := "none"
		if c.MaybeOther {
			s += " (some client labels templates \"other\": past its first 500 templates, this one may be counted there)"
		}
		return s
	}
	var parts []string
	for _, src := range sortedSources(c.BySource) {
		parts = append(parts, fmt.Sprintf("%s %s", src, count(c.BySource[src])))
	}
	return fmt.Sprintf("%s calls: %s; hit rate %s", count(c.Calls), strings.Join(parts, ", "), percent(*c.HitRate))
}

// sortedSources orders sources as a read tries them, others after.
func sortedSources(m map[string]float64) []string {
	order := []string{"l1", "node", "database", "uncached"}
	var out []string
	for _, s := range order {
		if _, ok := m[s]; ok {
			out = append(out, s)
		}
	}
	var rest []string
	for s := range m {
		if !slices.Contains(order, s) {
			rest = append(rest, s)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}

func nodeText(n *NodeFigures) [][2]string {
	var out [][2]string
	if n.Lookups == 0 {
		s := "none"
		if n.MaybeOther {
			s += " (a node labels templates \"other\": past its first 500 templates, this one may be counted there)"
		}
		out = append(out, [2]string{"node lookups", s})
	} else {
		var misses []string
		for _, c := range missClasses {
			misses = append(misses, fmt.Sprintf("%s %s", c, count(n.Misses[c])))
		}
		out = append(out, [2]string{"node lookups", fmt.Sprintf("%s: hits %s (%s); misses %s", count(n.Lookups), count(n.Hits), percent(*n.HitRate), strings.Join(misses, ", "))})
	}
	puts := fmt.Sprintf("%s (%s)", count(n.Puts), byteCount(n.BytesPut))
	if n.BytesHeldApprox != nil {
		puts += fmt.Sprintf("; bytes held ≈ %s (its share of each node's bytes put × the bytes the node holds)", byteCount(*n.BytesHeldApprox))
	}
	out = append(out, [2]string{"node puts", puts})
	out = append(out, [2]string{"invalidations", count(n.InvalidationsApplied) + " messages applied by the nodes, for all templates (not attributed per template; staleness misses are what they cost this one)"})
	return out
}

func count(v float64) string { return fmt.Sprintf("%.0f", v) }

func percent(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

// byteCount formats a byte count with a binary unit.
func byteCount(v float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", v)
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

func columns(cols []string, all bool) string {
	if all {
		return "all columns"
	}
	if len(cols) == 0 {
		return "no column (rows appearing or disappearing still invalidate)"
	}
	return strings.Join(cols, ", ")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
