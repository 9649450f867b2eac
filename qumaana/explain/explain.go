package explain

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/larderdb/larder/internal/tags"
	"github.com/larderdb/larder/qumaana/quma"
)

// Options say what the analysis knows besides the statement.
type Options struct {
	// Schema is the catalog the statement is analyzed against: a live
	// database's or a DDL file's. Required.
	Schema *quma.Schema
	// Solution is the QUMA file the clients load, if any: its tag column
	// sets are those a dependency can key on, and its queries say whether
	// the template is in it. Nil: the sets the statement's own analysis
	// proposes.
	Solution *quma.Solution
	// TagSets, when Solution is nil, are the tag column sets a running
	// client keys on (the QUMA file's that the invalidator publishes).
	TagSets map[string][][]string
}

// Tag-set sources, Report.TagSetsFrom.
const (
	SetsFromQUMA      = "quma"      // the QUMA file's tag column sets
	SetsFromStatement = "statement" // the sets the statement's own analysis proposes
	SetsFromClient    = "client"    // the sets a running client keys on (Options.TagSets)
)

// maxTagsShown bounds the tags listed per dependency (IN lists multiply).
const maxTagsShown = 256

// Report is what Larder does with one statement.
type Report struct {
	SQL string `json:"sql"` // as given
	// Template is the template id, the pg_query fingerprint: the same for
	// every text of the template, and the template label of the
	// per-template metrics.
	Template   string `json:"template"`
	Normalized string `json:"normalized"` // literals replaced by $n
	Kind       string `json:"kind"`       // query, write or other
	Cacheable  bool   `json:"cacheable"`
	Reason     string `json:"reason,omitempty"`  // why not cacheable
	Rewrite    string `json:"rewrite,omitempty"` // how to make it cacheable, when known
	// Clock is set for a cacheable query that reads the transaction's
	// start: it is cached per clock bucket.
	Clock *Clock `json:"clock,omitempty"`
	// TagSetsFrom says where the tag column sets came from
	// (SetsFromQUMA, SetsFromStatement).
	TagSetsFrom string `json:"tag_sets_from"`
	// InQUMAFile says whether the QUMA file lists the template (nil
	// without a QUMA file).
	InQUMAFile *bool `json:"in_quma_file,omitempty"`
	// Dependencies are the tags a query's results hold, one entry per
	// table reference.
	Dependencies []Dependency `json:"dependencies"`
	// Reads are the columns a query reads, per table.
	Reads []TableReads `json:"reads"`
	// Writes are what a write changes, per table, and the tags it
	// publishes.
	Writes []Write `json:"writes,omitempty"`
	// TagColumnSets are the tag column sets of every table read or
	// written, as the analysis used them.
	TagColumnSets map[string][][]string `json:"tag_column_sets"`
	// Live holds the figures of metrics endpoints (nil when none were
	// asked).
	Live *Live `json:"live,omitempty"`
}

// Clock says how a clock-bound query is cached.
type Clock struct {
	// SQL is what a client runs instead: every read of the transaction's
	// start replaced by $Param, set to the transaction's clock bucket.
	SQL   string `json:"sql"`
	Param int    `json:"param"`
}

// Dependency is a query's dependency on one table reference.
type Dependency struct {
	Table string `json:"table"`
	// KeyColumns is the tag column set the dependency keys on; empty when
	// it holds the table tag, for TableTagReason.
	KeyColumns     []string `json:"key_columns,omitempty"`
	TableTagReason string   `json:"table_tag_reason,omitempty"`
	// Tags are the tag templates a result holds: "public.items(id)=$1",
	// one per combination of IN-list alternatives, or the table tag.
	Tags []string `json:"tags"`
	// Proposed are the sets the statement's own analysis proposes for
	// the table that the QUMA file lacks: a dependency on the table tag
	// could key on one of them once the template is in the file.
	Proposed   [][]string `json:"proposed,omitempty"`
	Reads      []string   `json:"reads,omitempty"`
	AllColumns bool       `json:"all_columns,omitempty"`
	// RowSplit, when set, narrows the dependency to a result's rows
	// (quma.RowSplit): its tags read only the membership columns, and each
	// row a result holds adds the tag RowTag=<its key> reading the
	// display columns.
	RowSplit *RowSplit `json:"row_split,omitempty"`
	// CoveredBy names the derived tag column set of another dependency
	// that covers this one (quma.Dep.CoveredBy): its Tags are held only
	// when that dependency falls back to its table tag.
	CoveredBy string `json:"covered_by,omitempty"`
}

// RowSplit is how a dependency narrows to a result's rows.
type RowSplit struct {
	RowTag     string   `json:"row_tag"` // "public.items(id)"
	Output     int      `json:"output"`  // the result column holding the key, from 1
	Membership []string `json:"membership"`
	Display    []string `json:"display"`
}

// TableReads are the columns a query reads of one table.
type TableReads struct {
	Table      string   `json:"table"`
	Columns    []string `json:"columns,omitempty"`
	AllColumns bool     `json:"all_columns,omitempty"`
}

// Write is what a write changes in one table.
type Write struct {
	Table      string   `json:"table"`
	Columns    []string `json:"columns,omitempty"` // an UPDATE's
	AllColumns bool     `json:"all_columns,omitempty"`
	Truncate   bool     `json:"truncate,omitempty"`
	// Publishes are the tags each changed row publishes (old and new
	// row): the table tag, then one keyed tag per tag column set.
	Publishes []string `json:"publishes"`
}

// Statement analyzes sql as a client would, with o's schema and tag
// column sets. A statement PostgreSQL's parser rejects is an error
// wrapping *quma.SyntaxError; so is an empty one (quma.ErrEmpty).
func Statement(sql string, o Options) (*Report, error) {
	if o.Schema == nil {
		return nil, ErrNoSchema
	}
	if strings.TrimSpace(sql) == "" {
		return nil, fmt.Errorf("explain: %w", quma.ErrEmpty)
	}
	// The statement's own proposals: the sets without a QUMA file, and
	// what to suggest where the file's sets leave a table tag.
	own, err := quma.AnalyzeWorkload(o.Schema, []quma.Statement{{SQL: sql, Frequency: 1}})
	if own == nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	proposed := own.TagSets()
	sets, from := proposed, SetsFromStatement
	if o.Solution != nil {
		sets, from = o.Solution.TagSets(), SetsFromQUMA
	} else if o.TagSets != nil {
		sets, from = o.TagSets, SetsFromClient
	}
	t, err := quma.NewAnalyzer(o.Schema, sets).Prepare(sql)
	if err != nil {
		return nil, fmt.Errorf("explain: %w", err)
	}
	r := &Report{
		SQL: sql, Template: t.ID, Normalized: t.SQL, Kind: string(t.Kind),
		Cacheable: t.Cacheable, Reason: t.Reason, Rewrite: t.Rewrite,
		TagSetsFrom: from, Dependencies: []Dependency{}, Reads: []TableReads{},
		TagColumnSets: map[string][][]string{},
	}
	if t.ClockSQL != "" {
		r.Clock = &Clock{SQL: t.ClockSQL, Param: t.NumParams + 1}
	}
	if o.Solution != nil {
		in := slices.ContainsFunc(o.Solution.Queries, func(q quma.QueryEntry) bool { return q.ID == t.ID }) ||
			slices.ContainsFunc(o.Solution.Writes, func(w quma.WriteEntry) bool { return w.ID == t.ID })
		r.InQUMAFile = &in
	}
	tables := map[string]bool{}
	reads := map[string]*TableReads{}
	for _, d := range t.Deps {
		tables[d.Table] = true
		dep := dependency(d, sets, proposed, o.Solution != nil || o.TagSets != nil)
		if d.CoveredBy > 0 {
			cov := t.Deps[d.CoveredBy-1]
			dep.CoveredBy = tags.ColumnSetName(cov.Table, cov.KeyColumns)
		}
		r.Dependencies = append(r.Dependencies, dep)
		tr := reads[d.Table]
		if tr == nil {
			tr = &TableReads{Table: d.Table}
			reads[d.Table] = tr
		}
		tr.AllColumns = tr.AllColumns || d.AllColumns
		for _, c := range d.Reads {
			if !slices.Contains(tr.Columns, c) {
				tr.Columns = append(tr.Columns, c)
			}
		}
	}
	for _, tr := range reads {
		if tr.AllColumns {
			tr.Columns = nil
		}
		sort.Strings(tr.Columns)
		r.Reads = append(r.Reads, *tr)
	}
	sort.Slice(r.Reads, func(i, j int) bool { return r.Reads[i].Table < r.Reads[j].Table })
	for _, w := range t.Writes {
		tables[w.Table] = true
		pub := []string{w.Table}
		for _, set := range sets[w.Table] {
			pub = append(pub, tags.ColumnSetName(w.Table, set))
		}
		// derived sets through this table: a change of a row they
		// reference publishes their groups
		for _, name := range quma.DerivedSetsThrough(sets, w.Table) {
			if !slices.Contains(pub, name) {
				pub = append(pub, name)
			}
		}
		r.Writes = append(r.Writes, Write{Table: w.Table, Columns: w.Columns, AllColumns: w.AllColumns, Truncate: w.Truncate, Publishes: pub})
	}
	for table := range tables {
		r.TagColumnSets[table] = append([][]string{}, sets[table]...)
	}
	return r, nil
}

// dependency describes one of a template's dependencies.
func dependency(d quma.Dep, sets, proposed map[string][][]string, fromFile bool) Dependency {
	out := Dependency{Table: d.Table, Reads: d.Reads, AllColumns: d.AllColumns}
	if s := d.Rows; s != nil {
		out.RowSplit = &RowSplit{RowTag: tags.ColumnSetName(d.Table, []string{s.KeyColumn}), Output: s.Output + 1, Membership: s.Membership, Display: s.Display}
	}
	if len(d.KeyColumns) == 0 {
		out.TableTagReason = d.Reason
		out.Tags = []string{d.Table}
		if fromFile {
			for _, p := range proposed[d.Table] {
				if !slices.ContainsFunc(sets[d.Table], func(s []string) bool { return slices.Equal(s, p) }) {
					out.Proposed = append(out.Proposed, p)
				}
			}
		}
		return out
	}
	out.KeyColumns = d.KeyColumns
	out.Tags = keyedTags(d.Table, d.KeyColumns, d.Values())
	if tags.IsDerivedSet(d.KeyColumns) {
		out.Tags = append(out.Tags, tags.SetTag(d.Table, d.KeyColumns).String())
	}
	return out
}

// keyedTags renders the tag templates of a keyed dependency: one per
// combination of each column's alternatives, at most maxTagsShown.
func keyedTags(table string, cols []string, alts [][]string) []string {
	prefix := tags.ColumnSetName(table, cols) + "="
	for _, a := range alts {
		if len(a) == 0 { // never made by the analyzer; say what is known
			return []string{prefix + "?"}
		}
	}
	var out []string
	idx := make([]int, len(alts))
	for {
		vals := make([]string, len(alts))
		for i := range alts {
			vals[i] = alts[i][idx[i]]
		}
		if len(vals) == 1 {
			out = append(out, prefix+vals[0])
		} else {
			out = append(out, prefix+"("+strings.Join(vals, ",")+")")
		}
		i := len(idx) - 1
		for ; i >= 0; i-- {
			if idx[i]++; idx[i] < len(alts[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 || len(out) >= maxTagsShown {
			return out
		}
	}
}
