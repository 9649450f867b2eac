package quma

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/larderdb/larder/internal/errwriter"
)

// WriteText writes the human report: query templates and their groups (in
// the manner of Ferdinand's Figure 3), write templates with the queries they
// may affect, the invalidator's tag column sets, and the warnings.
func (s *Solution) WriteText(w io.Writer) error {
	ew := errwriter.New(w)
	names := map[string]string{}
	for i, q := range s.Queries {
		names[q.ID] = fmt.Sprintf("Q%d", i+1)
	}
	ew.Printf("QUMA solution (format version %d): %d query templates, %d write templates, %d tables with tag columns\n\n",
		s.Version, len(s.Queries), len(s.Writes), len(s.Tables))

	ew.Printf("Query templates\n")
	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  #\tfreq\tcacheable\tgroups\tsql\n")
	for i, q := range s.Queries {
		cache := "yes"
		if !q.Cacheable {
			cache = "no"
		}
		var groups []string
		for _, t := range q.Tags {
			groups = append(groups, tagText(t))
		}
		fmt.Fprintf(tw, "  Q%d\t%d\t%s\t%s\t%s\n", i+1, q.Frequency, cache, strings.Join(groups, " "), oneLine(q.SQL, 90))
	}
	_ = tw.Flush()

	ew.Printf("\nWrite templates\n")
	tw = tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  #\tfreq\tpublishes (old and new rows)\taffects\tindependent of\tsql\n")
	for i, wr := range s.Writes {
		fmt.Fprintf(tw, "  W%d\t%d\t%s\t%s\t%s\t%s\n", i+1, wr.Frequency, strings.Join(wr.Publishes, " "),
			listNames(wr.Affects, names), listNames(wr.Independent, names), oneLine(wr.SQL, 70))
	}
	_ = tw.Flush()

	ew.Printf("\nTag column sets (invalidator configuration)\n")
	tables := make([]string, 0, len(s.Tables))
	for t := range s.Tables {
		tables = append(tables, t)
	}
	sort.Strings(tables)
	for _, t := range tables {
		var sets []string
		for _, set := range s.Tables[t].TagColumns {
			sets = append(sets, "("+strings.Join(set, ",")+")")
		}
		ew.Printf("  %s: %s\n", t, strings.Join(sets, " "))
	}
	if len(s.Warnings) > 0 {
		ew.Printf("\nWarnings\n")
		for _, wn := range s.Warnings {
			ew.Printf("  - %s\n", wn)
		}
	}
	return ew.Err()
}

func tagText(t TagEntry) string {
	var b strings.Builder
	b.WriteString(t.Table)
	if len(t.Columns) > 0 {
		b.WriteString("(" + strings.Join(t.Columns, ",") + ")=" + strings.Join(t.Values, ","))
	}
	if t.AllColumns {
		b.WriteString("[*]")
	} else {
		b.WriteString("[" + strings.Join(t.Reads, ",") + "]")
	}
	if t.CoveredBy != "" {
		// Held only when the derived set's tags fall back.
		b.WriteString("{covered}")
	}
	return b.String()
}

func listNames(ids []string, names map[string]string) string {
	if len(ids) == 0 {
		return "-"
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = names[id]
	}
	return strings.Join(out, ",")
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		return s[:max-3] + "..."
	}
	return s
}
