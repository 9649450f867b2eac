package quma

import (
	"errors"
	"slices"
	"sort"
	"strings"

	"github.com/larderdb/larder/internal/tags"
)

// Kind classifies a statement.
type Kind string

// Statement kinds.
const (
	KindQuery Kind = "query" // SELECT (possibly cacheable)
	KindWrite Kind = "write" // INSERT, UPDATE, DELETE, MERGE, TRUNCATE
	KindOther Kind = "other" // DDL, SET, transaction control, ...
)

// Template is the analysis of one SQL text. Immutable once returned.
type Template struct {
	ID        string // pg_query fingerprint: the same for every text of the same template
	SQL       string // normalized text (literals replaced by $n)
	Kind      Kind
	Cacheable bool
	Reason    string // why not cacheable
	Rewrite   string // how to make it cacheable, when known
	NumParams int    // highest $n used
	// ClockSQL is set for a cacheable query that reads the transaction's
	// start (now(), CURRENT_TIMESTAMP, CURRENT_DATE, CURRENT_TIME,
	// LOCALTIMESTAMP, LOCALTIME, transaction_timestamp()): the statement with
	// each such read replaced by $(NumParams+1)::timestamptz (cast to the
	// read's type). A client runs ClockSQL with its clock bucket as that
	// parameter and keys the result on the bucket (see clock.go).
	ClockSQL string
	// SessionNeutral: the statement cannot change the session's roles or
	// settings (a SELECT or DML calling only built-ins that leave the
	// session alone, on tables that run no user code; see session.go).
	SessionNeutral bool
	// Deps lists, for a query, what its result depends on: one per table
	// reference (identical references merged).
	Deps []Dep
	// Writes lists, for a write (or a query with a data-modifying CTE), what it changes.
	Writes []Write
}

// Dep is a query result's dependency on one table.
type Dep struct {
	Table string
	// Reads are the columns of Table the result depends on (select list,
	// predicates, joins, ordering, grouping), sorted; AllColumns when that
	// cannot be narrowed (SELECT *, whole-row use, unknown table).
	Reads      []string
	AllColumns bool
	// KeyColumns is the tag column set the dependency is keyed on; empty for
	// the table tag. KeyValues holds, per key column, the alternative values
	// (parameters or literals); the tags are their combinations.
	KeyColumns []string
	KeyValues  [][]valueSource
	keyTypes   []string
	// Reason says why the dependency is on the whole table, when it is.
	Reason string
	// Rows, when set, narrows the dependency to the rows of a result
	// (Template.SplitRows).
	Rows *RowSplit
	// CoveredBy, when above 0, says that Deps[CoveredBy-1] is keyed on a
	// derived tag column set through this dependency's table reference,
	// and that this reference reads nothing but its primary key and the
	// columns the set's derived columns name: the derived tags (and the
	// set's tag) cover every change of it that
	// can change the result, and Tags holds this dependency's tags only
	// when that one falls back to its table tag.
	CoveredBy int
}

// Write is what a write statement changes in one table.
type Write struct {
	Table string
	// Columns an UPDATE sets; nil with AllColumns for INSERT, DELETE, TRUNCATE
	// (rows appear or disappear: every column changes).
	Columns    []string
	AllColumns bool
	Truncate   bool
}

// Values renders a keyed dependency's values for reports: "$1", "'abc'", "$2[]".
func (d Dep) Values() [][]string {
	out := make([][]string, len(d.KeyValues))
	for i, alts := range d.KeyValues {
		for _, v := range alts {
			out[i] = append(out[i], v.String())
		}
	}
	return out
}

// QueryTag is one tag a result holds, with the columns it reads of the tag's table.
type QueryTag struct {
	tags.Tag
	Reads      []string
	AllColumns bool
}

// ErrNotCacheable is returned by Tags for a template that is not cacheable.
var ErrNotCacheable = errors.New("quma: statement is not cacheable")

// maxTagsPerDep bounds the combinations of IN lists and arrays; past it the
// dependency uses the table tag.
const maxTagsPerDep = 256

// Tags instantiates the template's tags for parameter values ($1 is
// params[0]). A keyed dependency whose values cannot be made canonical (a
// NULL, an unsupported Go type, too many combinations) falls back to its
// table tag: never fewer invalidations than needed. A dependency keyed on a
// derived tag column set also holds the set's own tag (tags.SetTag), which
// the invalidator publishes while it cannot compute the set's keyed tags;
// a dependency it covers (Dep.CoveredBy) holds tags only when it falls back.
func (t *Template) Tags(params []any) ([]QueryTag, error) {
	if !t.Cacheable {
		return nil, ErrNotCacheable
	}
	if len(params) < t.NumParams {
		return nil, &ParamError{Param: len(params) + 1, Reason: "missing"}
	}
	out := make([]QueryTag, 0, len(t.Deps))
	for i := range t.Deps {
		d := &t.Deps[i]
		if d.CoveredBy > 0 && t.Deps[d.CoveredBy-1].keyed(params) {
			continue
		}
		if len(d.KeyColumns) > 0 {
			if keyed, ok := d.instantiate(params); ok {
				for _, vals := range keyed {
					out = append(out, QueryTag{Tag: tags.Tag{Table: d.Table, Columns: d.KeyColumns, Values: vals}, Reads: d.Reads, AllColumns: d.AllColumns})
				}
				if tags.IsDerivedSet(d.KeyColumns) {
					out = append(out, QueryTag{Tag: tags.SetTag(d.Table, d.KeyColumns), Reads: d.Reads, AllColumns: d.AllColumns})
				}
				continue
			}
		}
		out = append(out, QueryTag{Tag: tags.TableTag(d.Table), Reads: d.Reads, AllColumns: d.AllColumns})
	}
	return out, nil
}

// maxRowTags bounds the rows a result is split into (SplitRows); a larger
// result keeps its dependencies whole.
const maxRowTags = 256

// SplitsRows reports whether a dependency of the template has a RowSplit.
func (t *Template) SplitsRows() bool {
	for i := range t.Deps {
		if t.Deps[i].Rows != nil {
			return true
		}
	}
	return false
}

// SplitRows narrows qtags (Tags' answer for this template) to a result of
// rows rows: the tags of each dependency with a RowSplit read only its
// membership columns, and each row adds a tag on the table's key reading
// the display columns. keys(s) returns the result's column s.Output, one
// integer per row, or false when it cannot be read (the result's columns
// are not named s.Outputs, the key is not an integer, a NULL); then, or
// when the result has more than maxRowTags rows, qtags are returned as
// they are. The second result reports whether they were narrowed.
func (t *Template) SplitRows(qtags []QueryTag, rows int, keys func(s *RowSplit) ([]int64, bool)) ([]QueryTag, bool) {
	if rows > maxRowTags {
		return qtags, false
	}
	var out []QueryTag
	for i := range t.Deps {
		d := &t.Deps[i]
		if d.Rows == nil {
			continue
		}
		ids, ok := keys(d.Rows)
		if !ok || len(ids) != rows {
			return qtags, false
		}
		if out == nil {
			out = slices.Clone(qtags)
		}
		for j := range qtags {
			if out[j].Table == d.Table {
				out[j].Reads, out[j].AllColumns = d.Rows.Membership, false
			}
		}
		seen := make(map[string]bool, len(ids))
		for _, id := range ids {
			v, ok := canonical(d.Rows.KeyType, id)
			if !ok {
				return qtags, false
			}
			if seen[v] {
				continue
			}
			seen[v] = true
			out = append(out, QueryTag{Tag: tags.Tag{Table: d.Table, Columns: []string{d.Rows.KeyColumn}, Values: []string{v}}, Reads: d.Rows.Display})
		}
	}
	if out == nil {
		return qtags, false
	}
	return out, true
}

// keyed reports whether d holds keyed tags for params (Tags does not fall
// back to its table tag).
func (d *Dep) keyed(params []any) bool {
	if len(d.KeyColumns) == 0 {
		return false
	}
	_, ok := d.instantiate(params)
	return ok
}

// instantiate returns every combination of canonical key values.
func (d *Dep) instantiate(params []any) ([][]string, bool) {
	if single := d.singleValues(params); single != nil { // the common case: col = $n
		return [][]string{single}, true
	}
	alts := make([][]string, len(d.KeyColumns))
	total := 1
	for i, srcs := range d.KeyValues {
		for _, src := range srcs {
			vals, ok := resolveValue(src, d.keyTypes[i], params)
			if !ok {
				return nil, false
			}
			alts[i] = append(alts[i], vals...)
		}
		if len(alts[i]) == 0 {
			return nil, false
		}
		total *= len(alts[i])
		if total > maxTagsPerDep {
			return nil, false
		}
	}
	out := make([][]string, 0, total)
	idx := make([]int, len(alts))
	for {
		vals := make([]string, len(alts))
		for i := range alts {
			vals[i] = alts[i][idx[i]]
		}
		out = append(out, vals)
		i := len(idx) - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < len(alts[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return dedupe(out), true
		}
	}
}

// singleValues returns the key values when every column has exactly one
// scalar source, or nil.
func (d *Dep) singleValues(params []any) []string {
	vals := make([]string, len(d.KeyValues))
	for i, srcs := range d.KeyValues {
		if len(srcs) != 1 || srcs[0].Array || srcs[0].IsNull {
			return nil
		}
		var v any = srcs[0].Literal
		if p := srcs[0].Param; p > 0 {
			if p > len(params) {
				return nil
			}
			v = params[p-1]
		}
		c, ok := canonical(d.keyTypes[i], v)
		if !ok {
			return nil
		}
		vals[i] = c
	}
	return vals
}

func dedupe(rows [][]string) [][]string {
	out := rows[:0]
next:
	for _, r := range rows {
		for _, have := range out {
			if slices.Equal(have, r) {
				continue next
			}
		}
		out = append(out, r)
	}
	return out
}

func resolveValue(src valueSource, typ string, params []any) ([]string, bool) {
	switch {
	case src.IsNull:
		return nil, false
	case src.Param > 0:
		if src.Param > len(params) {
			return nil, false
		}
		p := params[src.Param-1]
		if src.Array {
			elems, ok := arrayElems(p)
			if !ok {
				return nil, false
			}
			out := make([]string, 0, len(elems))
			for _, e := range elems {
				c, ok := canonical(typ, e)
				if !ok {
					return nil, false
				}
				out = append(out, c)
			}
			return out, true
		}
		c, ok := canonical(typ, p)
		if !ok {
			return nil, false
		}
		return []string{c}, true
	default:
		c, ok := canonical(typ, src.Literal)
		if !ok {
			return nil, false
		}
		return []string{c}, true
	}
}

// buildDeps turns the analysis' table references into dependencies, keyed on
// the best tag column set available in sets.
func buildDeps(refs []*relRef, sets map[string][][]string) []Dep {
	all := make([]Dep, len(refs))
	for i, r := range refs {
		all[i] = refDep(r, sets)
	}
	coveredBy := coverage(refs, all)
	// Merge identical dependencies (a covered one only with one covered
	// by an identical dependency).
	var deps []Dep
	at := make([]int, len(refs)) // index in deps of each reference's dependency
	seen := map[string]int{}
	for i, d := range all {
		sig := depSignature(d)
		if c := coveredBy[i]; c >= 0 {
			sig += "|covered by " + depSignature(all[c])
		}
		j, dup := seen[sig]
		if !dup {
			j = len(deps)
			seen[sig] = j
			deps = append(deps, d)
		}
		at[i] = j
	}
	for i, c := range coveredBy {
		if c >= 0 {
			deps[at[i]].CoveredBy = at[c] + 1
		}
	}
	return deps
}

// refDep is one table reference's dependency.
func refDep(r *relRef, sets map[string][][]string) Dep {
	d := Dep{Table: r.name, AllColumns: r.all}
	if !r.all {
		for c := range r.reads {
			d.Reads = append(d.Reads, c)
		}
		sort.Strings(d.Reads)
	}
	cols, reason := chooseKey(r, sets[r.name])
	if r.split != nil && !slices.Equal(cols, []string{r.split.KeyColumn}) && slices.ContainsFunc(sets[r.name], func(set []string) bool {
		return len(set) == 1 && set[0] == r.split.KeyColumn
	}) {
		// Split by rows, unless keyed on the row already.
		d.Rows = r.split
	}
	if cols == nil {
		d.Reason = reason
	} else {
		d.KeyColumns = cols
		for _, c := range cols {
			d.KeyValues = append(d.KeyValues, r.bound[c])
			d.keyTypes = append(d.keyTypes, r.columnType(c))
		}
	}
	return d
}

// coverage returns, per reference, the index of the reference whose
// dependency (deps, one per reference) covers it, or -1: the covering one
// is keyed on derived columns through it, and it reads nothing but its
// primary key and those derived columns' own columns. A covering
// reference is itself never covered, so that its tags are always held.
func coverage(refs []*relRef, deps []Dep) []int {
	by := make([]int, len(refs))
	for i := range by {
		by[i] = -1
	}
	for i, r := range refs {
		for _, b := range coveredThrough(r, deps[i].KeyColumns) {
			if j := slices.Index(refs, b); by[j] < 0 {
				by[j] = i
			}
		}
	}
	for i := range by {
		if by[i] >= 0 && slices.Contains(by, i) {
			by[i] = -1
		}
	}
	return by
}

// coveredThrough returns the references that r's key columns cols cover:
// those the derived columns among cols go through, when such a reference
// reads only its primary key and the columns the derived ones name.
func coveredThrough(r *relRef, cols []string) []*relRef {
	var out []*relRef
	for _, c := range cols {
		dv, ok := r.derived[c]
		if !ok || slices.Contains(out, dv.through) {
			continue
		}
		b := dv.through
		allowed := map[string]bool{b.table.PrimaryKey[0]: true}
		for _, c2 := range cols {
			if dv2, ok := r.derived[c2]; ok && dv2.through == b {
				allowed[dv2.col] = true
			}
		}
		covered := !b.all
		for c2 := range b.reads {
			covered = covered && allowed[c2]
		}
		if covered {
			out = append(out, b)
		}
	}
	return out
}

func depSignature(d Dep) string {
	var b strings.Builder
	b.WriteString(d.Table)
	b.WriteString("|")
	b.WriteString(strings.Join(d.Reads, ","))
	if d.AllColumns {
		b.WriteString("|*")
	}
	b.WriteString("|")
	b.WriteString(strings.Join(d.KeyColumns, ","))
	for _, alts := range d.Values() {
		b.WriteString("|")
		b.WriteString(strings.Join(alts, ","))
	}
	return b.String()
}

// usableBound returns the bound columns that can carry keyed tags, in table
// order, then the bound derived columns, by name.
func usableBound(r *relRef) []string {
	if r.table == nil {
		return nil
	}
	var cols []string
	for _, c := range r.table.Columns {
		alts, ok := r.bound[c.Name]
		if !ok || !Keyable(c.Type) {
			continue
		}
		null := false
		for _, v := range alts {
			null = null || v.IsNull
		}
		if !null {
			cols = append(cols, c.Name)
		}
	}
	// deriveThrough binds only keyable columns, never to NULL.
	start := len(cols)
	for c := range r.derived {
		cols = append(cols, c)
	}
	sort.Strings(cols[start:])
	return cols
}

// chooseKey picks, among the table's tag column sets, one whose columns are
// all bound, preferring fewer tag combinations, then more columns.
func chooseKey(r *relRef, sets [][]string) ([]string, string) {
	usable := map[string]bool{}
	for _, c := range usableBound(r) {
		usable[c] = true
	}
	var best []string
	bestScore := 0
	for _, set := range sets {
		score := 1
		ok := len(set) > 0
		for _, c := range set {
			if !usable[c] {
				ok = false
				break
			}
			n := 0
			for _, v := range r.bound[c] {
				if v.Array {
					n += 16 // an array's length is unknown until run time
				} else {
					n++
				}
			}
			score *= n
		}
		if !ok {
			continue
		}
		if best == nil || score < bestScore || score == bestScore && len(set) > len(best) {
			best, bestScore = set, score
		}
	}
	if best != nil {
		return best, ""
	}
	return nil, fallbackReason(r, usable)
}

func fallbackReason(r *relRef, usable map[string]bool) string {
	if r.table == nil {
		return "unknown table"
	}
	var parts []string
	if len(usable) > 0 {
		cols := make([]string, 0, len(usable))
		for c := range usable {
			cols = append(cols, c)
		}
		sort.Strings(cols)
		parts = append(parts, "bound columns ("+strings.Join(cols, ",")+") are not a tag column set")
	}
	var unkeyable []string
	for c := range r.bound {
		if !usable[c] {
			if col := r.table.Column(c); col != nil && !Keyable(col.Type) {
				unkeyable = append(unkeyable, c+" is "+col.Type)
			}
		}
	}
	sort.Strings(unkeyable)
	if len(unkeyable) > 0 {
		parts = append(parts, "equality on a column without a canonical text form ("+strings.Join(unkeyable, ", ")+")")
	}
	parts = append(parts, r.notes...)
	if len(parts) == 0 {
		parts = append(parts, "no equality predicate fixes its columns")
	}
	return strings.Join(parts, "; ")
}

// proposal is the tag column set the offline analysis adds for a table
// reference: the smallest primary or unique key among its bound columns
// (shared with other templates), else all its bound columns, derived ones
// included (items' category and its seller's region for a search of the
// items of a category sold in a region).
func proposal(r *relRef) []string {
	bound := usableBound(r)
	if len(bound) == 0 {
		return nil
	}
	have := map[string]bool{}
	for _, c := range bound {
		have[c] = true
	}
	for _, key := range r.table.Keys() {
		all := true
		for _, c := range key {
			all = all && have[c]
		}
		if all {
			return key
		}
	}
	return bound
}
