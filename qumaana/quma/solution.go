package quma

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/larderdb/larder/internal/tags"
)

// SolutionVersion is the version of the QUMA file format this package writes and reads.
const SolutionVersion = 1

// Solution is the QUMA file: what client-lib and the invalidator load.
type Solution struct {
	Version int                    `json:"version"`
	Queries []QueryEntry           `json:"queries"`
	Writes  []WriteEntry           `json:"writes"`
	Tables  map[string]*TableEntry `json:"tables"`
	// Warnings are for people: uncacheable templates, table-level
	// fallbacks, replica identities that cannot supply old key values.
	Warnings []string `json:"warnings,omitempty"`
	// Schema is embedded so that client-lib analyzes new SQL online exactly
	// as this analysis did.
	Schema *Schema `json:"schema"`
}

// QueryEntry is one query template of the workload.
type QueryEntry struct {
	ID        string `json:"id"`
	SQL       string `json:"sql"`
	Cacheable bool   `json:"cacheable"`
	Reason    string `json:"reason"`
	Rewrite   string `json:"rewrite,omitempty"`
	// Clock: the query reads the transaction's start (now(), CURRENT_DATE,
	// …); clients cache it per clock bucket (Template.ClockSQL).
	Clock     bool       `json:"clock,omitempty"`
	Frequency int64      `json:"frequency"`
	Source    string     `json:"source,omitempty"`
	Tags      []TagEntry `json:"tags"`
}

// TagEntry is a tag template: without Columns, the table tag.
type TagEntry struct {
	Table   string   `json:"table"`
	Columns []string `json:"columns,omitempty"`
	// Values has one entry per column: "$n", "$n[]" (each element of an
	// array parameter) or a literal ('text' or a bare number).
	Values []string `json:"values,omitempty"`
	// Reads lists the columns the result reads of Table; AllColumns when
	// it cannot be narrowed (then Reads is empty).
	Reads      []string `json:"reads"`
	AllColumns bool     `json:"all_columns,omitempty"`
	// Fallback says why this is a table tag, when it is.
	Fallback string `json:"fallback,omitempty"`
	// Set marks the tag of a whole derived tag column set (tags.SetTag):
	// Columns without Values.
	Set bool `json:"set,omitempty"`
	// CoveredBy names the derived tag column set whose tags cover this
	// one's table reference (Dep.CoveredBy): the result holds this tag only
	// when those fall back to their table tag.
	CoveredBy string `json:"covered_by,omitempty"`
}

// WriteEntry is one write template and the query templates it may affect.
type WriteEntry struct {
	ID        string   `json:"id"`
	SQL       string   `json:"sql"`
	Frequency int64    `json:"frequency"`
	Source    string   `json:"source,omitempty"`
	Tables    []string `json:"tables"`
	// Publishes names the groups the write publishes at run time, per row
	// changed (old and new row): each table tag and tag column set.
	Publishes []string `json:"publishes"`
	// Affects lists query ids this write may change; Independent those it provably cannot.
	Affects     []string `json:"affects"`
	Independent []string `json:"independent"`
}

// TableEntry is the invalidator's configuration for one table.
type TableEntry struct {
	// TagColumns are the column sets the invalidator publishes keyed tags
	// for, from each changed row's old and new values.
	TagColumns [][]string `json:"tag_columns"`
}

// TagSets returns table → tag column sets, as NewAnalyzer takes them.
func (s *Solution) TagSets() map[string][][]string {
	out := map[string][][]string{}
	for name, t := range s.Tables {
		out[name] = t.TagColumns
	}
	return out
}

// Analyzer returns an analyzer for online use with this solution.
func (s *Solution) Analyzer() *Analyzer { return NewAnalyzer(s.Schema, s.TagSets()) }

// ReadSolution loads and validates a QUMA file.
func ReadSolution(r io.Reader) (*Solution, error) {
	dec := json.NewDecoder(r)
	var s Solution
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("quma: read QUMA file: %w", err)
	}
	if s.Version != SolutionVersion {
		return nil, fmt.Errorf("quma: QUMA file version %d, this build reads version %d", s.Version, SolutionVersion)
	}
	if s.Schema == nil {
		return nil, errors.New("quma: QUMA file has no schema")
	}
	if err := s.Schema.Validate(); err != nil {
		return nil, err
	}
	for name, t := range s.Tables {
		table := s.Schema.Tables[name]
		if table == nil {
			return nil, fmt.Errorf("quma: QUMA file: tag columns for unknown table %s", name)
		}
		for _, set := range t.TagColumns {
			if len(set) == 0 {
				return nil, fmt.Errorf("quma: QUMA file: table %s: empty tag column set", name)
			}
			for _, c := range set {
				if _, _, _, derived := tags.ParseDerivedColumn(c); derived {
					if err := s.Schema.checkDerived(table, c); err != nil {
						return nil, fmt.Errorf("quma: QUMA file: table %s: %w", name, err)
					}
					continue
				}
				col := table.Column(c)
				if col == nil {
					return nil, fmt.Errorf("quma: QUMA file: table %s: tag column %q does not exist", name, c)
				}
				if !Keyable(col.Type) {
					return nil, fmt.Errorf("quma: QUMA file: table %s: tag column %s has type %s, which cannot carry keyed tags", name, c, col.Type)
				}
			}
		}
	}
	return &s, nil
}

// checkDerived checks that the derived tag column c of table t is one the
// invalidator can publish: its foreign key column is a column of t of the
// type of the referenced table's single-column primary key, and the column
// it names exists there with a keyable type.
func (s *Schema) checkDerived(t *Table, c string) error {
	fk, refTable, refCol, _ := tags.ParseDerivedColumn(c)
	fkCol := t.Column(fk)
	if fkCol == nil {
		return fmt.Errorf("derived tag column %q: foreign key column %q does not exist", c, fk)
	}
	ref := s.Tables[refTable]
	if ref == nil {
		return fmt.Errorf("derived tag column %q: referenced table %s is not in the schema", c, refTable)
	}
	if len(ref.PrimaryKey) != 1 {
		return fmt.Errorf("derived tag column %q: referenced table %s has no single-column primary key", c, refTable)
	}
	pk := ref.Column(ref.PrimaryKey[0])
	if pk == nil {
		return fmt.Errorf("derived tag column %q: the primary key column %q of %s is not among its columns", c, ref.PrimaryKey[0], refTable)
	}
	if pk.Type != fkCol.Type {
		return fmt.Errorf("derived tag column %q: foreign key %s has type %s, the primary key %s of %s has type %s", c, fk, fkCol.Type, pk.Name, refTable, pk.Type)
	}
	col := ref.Column(refCol)
	if col == nil {
		return fmt.Errorf("derived tag column %q: column %q of %s does not exist", c, refCol, refTable)
	}
	if !Keyable(col.Type) {
		return fmt.Errorf("derived tag column %q: column %s of %s has type %s, which cannot carry keyed tags", c, refCol, refTable, col.Type)
	}
	return nil
}

// DerivedSetsThrough names the derived tag column sets, among sets (per
// table), whose derived columns read table: a change to it publishes their
// tags (of the rows it joins to) too. In table order, then the table's.
func DerivedSetsThrough(sets map[string][][]string, table string) []string {
	names := make([]string, 0, len(sets))
	for n := range sets {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		for _, set := range sets[n] {
			if slices.ContainsFunc(set, func(c string) bool {
				_, ref, _, ok := tags.ParseDerivedColumn(c)
				return ok && ref == table
			}) {
				out = append(out, tags.ColumnSetName(n, set))
			}
		}
	}
	return out
}

// WriteJSON writes the solution as indented JSON.
func (s *Solution) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// AnalyzeWorkload analyzes a workload against a schema: it chooses the tag
// column sets (pass one), then analyzes every template with them (pass two)
// and computes the write/query dependency matrix. Statements that do not
// parse are reported in the returned error, after the others are analyzed.
func AnalyzeWorkload(schema *Schema, workload []Statement) (*Solution, error) {
	if schema == nil {
		return nil, errors.New("quma: a schema is required")
	}
	if err := schema.Validate(); err != nil {
		return nil, err
	}
	var errs []error
	sets := map[string][][]string{}
	for _, st := range workload {
		_, props, err := analyzeSQL(schema, st.SQL, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", sourceOf(st), err))
			continue
		}
		for table, ps := range props {
			for _, p := range ps {
				sets[table] = addSet(sets[table], p)
			}
		}
	}
	sol := &Solution{Version: SolutionVersion, Tables: map[string]*TableEntry{}, Schema: schema}
	for table, ss := range sets {
		sortSets(ss)
		sol.Tables[table] = &TableEntry{TagColumns: ss}
	}

	type queryT struct {
		t  *Template
		st Statement
	}
	var queries []queryT
	var writes []queryT
	seen := map[string]int{}
	for _, st := range workload {
		t, _, err := analyzeSQL(schema, st.SQL, sets)
		if err != nil {
			continue // reported in pass one
		}
		if i, dup := seen[t.ID]; dup { // the same template twice: add up
			if i >= 0 {
				queries[i].st.Frequency += st.Frequency
			} else {
				writes[-i-1].st.Frequency += st.Frequency
			}
			continue
		}
		switch t.Kind {
		case KindQuery:
			seen[t.ID] = len(queries)
			queries = append(queries, queryT{t, st})
		case KindWrite:
			seen[t.ID] = -len(writes) - 1
			writes = append(writes, queryT{t, st})
		default:
			sol.Warnings = append(sol.Warnings, fmt.Sprintf("%s: ignored: %s", sourceOf(st), t.Reason))
		}
	}

	for _, q := range queries {
		e := QueryEntry{ID: q.t.ID, SQL: q.t.SQL, Cacheable: q.t.Cacheable, Reason: q.t.Reason, Rewrite: q.t.Rewrite, Clock: q.t.ClockSQL != "",
			Frequency: q.st.Frequency, Source: q.st.Source, Tags: []TagEntry{}}
		e.Tags = append(e.Tags, queryTagEntries(q.t.Deps)...)
		if !q.t.Cacheable {
			w := fmt.Sprintf("query %s (%s) is not cacheable: %s", short(q.t.ID), sourceOf(q.st), q.t.Reason)
			if q.t.Rewrite != "" {
				w += "; rewrite: " + q.t.Rewrite
			}
			sol.Warnings = append(sol.Warnings, w)
		} else {
			for _, d := range q.t.Deps {
				if len(d.KeyColumns) == 0 && d.CoveredBy == 0 {
					sol.Warnings = append(sol.Warnings, fmt.Sprintf("query %s (%s): table tag on %s: %s", short(q.t.ID), sourceOf(q.st), d.Table, d.Reason))
				}
			}
		}
		sol.Queries = append(sol.Queries, e)
	}
	for _, w := range writes {
		e := WriteEntry{ID: w.t.ID, SQL: w.t.SQL, Frequency: w.st.Frequency, Source: w.st.Source,
			Tables: []string{}, Publishes: []string{}, Affects: []string{}, Independent: []string{}}
		for _, wr := range w.t.Writes {
			e.Tables = appendUnique(e.Tables, wr.Table)
			e.Publishes = appendUnique(e.Publishes, wr.Table)
			if te := sol.Tables[wr.Table]; te != nil {
				for _, set := range te.TagColumns {
					e.Publishes = appendUnique(e.Publishes, tags.ColumnSetName(wr.Table, set))
				}
			}
			for _, name := range DerivedSetsThrough(sol.TagSets(), wr.Table) {
				e.Publishes = appendUnique(e.Publishes, name)
			}
		}
		for _, q := range queries {
			if MayAffect(w.t, q.t) {
				e.Affects = append(e.Affects, q.t.ID)
			} else {
				e.Independent = append(e.Independent, q.t.ID)
			}
		}
		sol.Writes = append(sol.Writes, e)
	}
	sol.Warnings = append(sol.Warnings, identityWarnings(schema, sol.Tables)...)
	return sol, errors.Join(errs...)
}

// MayAffect is the pairwise analysis: can some instantiation of write w
// change some instantiation of query q's result? It answers false only
// when w changes no column q reads of any table they share. A dependency
// covered by a derived one (Dep.CoveredBy) still counts with its reads,
// and a write to a table a derived key column reads, of that column, too.
func MayAffect(w, q *Template) bool {
	for _, wr := range w.Writes {
		for _, d := range q.Deps {
			if writesDerived(wr, d) {
				return true
			}
			if d.Table != wr.Table {
				continue
			}
			if wr.AllColumns || d.AllColumns {
				return true
			}
			for _, c := range wr.Columns {
				for _, r := range d.Reads {
					if c == r {
						return true
					}
				}
			}
		}
	}
	return false
}

// writesDerived reports whether wr changes a column a derived key column of
// d names (rows of its table appear or disappear, or the column changes).
func writesDerived(wr Write, d Dep) bool {
	for _, c := range d.KeyColumns {
		if _, ref, col, ok := tags.ParseDerivedColumn(c); ok && ref == wr.Table && (wr.AllColumns || slices.Contains(wr.Columns, col)) {
			return true
		}
	}
	return false
}

// queryTagEntries returns the tag entries of a query's dependencies.
func queryTagEntries(deps []Dep) []TagEntry {
	var out []TagEntry
	for _, d := range deps {
		es := tagEntries(d)
		if d.CoveredBy > 0 {
			by := deps[d.CoveredBy-1]
			for i := range es {
				es[i].CoveredBy = tags.ColumnSetName(by.Table, by.KeyColumns)
			}
		}
		out = append(out, es...)
	}
	return out
}

// tagEntries returns a dependency's tag entries: its table tag, or one per
// combination of its key values (and the set tag of a derived set).
func tagEntries(d Dep) []TagEntry {
	reads := d.Reads
	if reads == nil {
		reads = []string{}
	}
	if len(d.KeyColumns) == 0 {
		return []TagEntry{{Table: d.Table, Reads: reads, AllColumns: d.AllColumns, Fallback: d.Reason}}
	}
	// One entry per combination of the alternatives (IN lists).
	vals := d.Values()
	var out []TagEntry
	idx := make([]int, len(vals))
	for {
		e := TagEntry{Table: d.Table, Columns: d.KeyColumns, Reads: reads, AllColumns: d.AllColumns}
		for i := range vals {
			e.Values = append(e.Values, vals[i][idx[i]])
		}
		out = append(out, e)
		i := len(idx) - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < len(vals[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 || len(out) >= maxTagsPerDep {
			if tags.IsDerivedSet(d.KeyColumns) {
				out = append(out, TagEntry{Table: d.Table, Columns: d.KeyColumns, Reads: reads, AllColumns: d.AllColumns, Set: true})
			}
			return out
		}
	}
}

// identityWarnings names tables whose replica identity cannot supply the
// old values of a tag column set: an UPDATE that moves a row out of a group
// could not invalidate the group it left.
func identityWarnings(schema *Schema, tables map[string]*TableEntry) []string {
	var out []string
	names := make([]string, 0, len(tables))
	for n := range tables {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := schema.Tables[n]
		if t == nil {
			continue
		}
		var missing []string
		for _, set := range tables[n].TagColumns {
			if !t.IdentityCovers(identityColumns(set)) {
				missing = append(missing, "("+strings.Join(set, ",")+")")
			}
		}
		if len(missing) > 0 {
			out = append(out, fmt.Sprintf("table %s: replica identity %s cannot supply old values of tag columns %s; run: ALTER TABLE %s REPLICA IDENTITY FULL",
				n, strings.ToUpper(t.ReplicaIdentity), strings.Join(missing, " "), tags.TableTag(n).String()))
		}
	}
	return out
}

// identityColumns are the columns of its own table a tag column set needs
// in a change's old row: a derived column needs its foreign key.
func identityColumns(set []string) []string {
	out := make([]string, len(set))
	for i, c := range set {
		out[i] = c
		if fk, _, _, ok := tags.ParseDerivedColumn(c); ok {
			out[i] = fk
		}
	}
	return out
}

func addSet(sets [][]string, s []string) [][]string {
	key := strings.Join(s, ",")
	for _, have := range sets {
		if strings.Join(have, ",") == key {
			return sets
		}
	}
	return append(sets, append([]string(nil), s...))
}

func sortSets(sets [][]string) {
	sort.Slice(sets, func(i, j int) bool {
		if len(sets[i]) != len(sets[j]) {
			return len(sets[i]) < len(sets[j])
		}
		return strings.Join(sets[i], ",") < strings.Join(sets[j], ",")
	})
}

func appendUnique(list []string, s string) []string {
	for _, have := range list {
		if have == s {
			return list
		}
	}
	return append(list, s)
}

func sourceOf(st Statement) string {
	if st.Source != "" {
		return st.Source
	}
	return "statement"
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
