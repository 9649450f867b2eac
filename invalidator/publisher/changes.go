package publisher

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/jackc/pglogrepl"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/tags"
)

// relation is what the decoder knows of a published table: pgoutput's
// Relation message plus the tag column sets to publish.
type relation struct {
	id       uint32
	name     string   // "schema.table"
	columns  []string // in tuple order
	types    []uint32
	identity []bool // column is part of the replica identity
	full     bool   // REPLICA IDENTITY FULL
	sets     [][]int
	setNames [][]string
	// given: the sets as configured, derived ones included (derived sets
	// are published from their indexes: derived.go)
	given [][]string
	// unkeyable: tag column sets that name a column the relation lacks
	// (logged once at load).
	missing []string
	// pk is the position of the table's primary key, a single column
	// (-1: none, or not known): the changes of its rows carry their keys
	// (invalidation.Change.Keys).
	pk int
	// afterDDL: a larder.ddl message named the table since this Relation
	// message and flushed it; the next Relation message's new shape needs
	// no flush of its own.
	afterDDL bool
}

// newRelation builds a relation from pgoutput's message and the tag column
// sets configured for the table (nil: none).
func newRelation(m *pglogrepl.RelationMessage, sets [][]string) *relation {
	r := &relation{
		id:   m.RelationID,
		name: m.Namespace + "." + m.RelationName,
		full: m.ReplicaIdentity == 'f',
		pk:   -1,
	}
	for _, c := range m.Columns {
		r.columns = append(r.columns, c.Name)
		r.types = append(r.types, c.DataType)
		r.identity = append(r.identity, c.Flags&1 != 0 || r.full)
	}
	r.bindSets(sets)
	return r
}

// withSets returns a copy of r publishing the tag column sets given.
func (r *relation) withSets(sets [][]string) *relation {
	c := *r
	c.sets, c.setNames, c.missing, c.given = nil, nil, nil, nil
	c.bindSets(sets)
	return &c
}

// bindSets resolves tag column sets to column positions.
func (r *relation) bindSets(sets [][]string) {
	idx := map[string]int{}
	for i, c := range r.columns {
		idx[c] = i
	}
	r.given = sets
	for _, set := range sets {
		if tags.IsDerivedSet(set) {
			continue
		}
		var is []int
		ok := true
		for _, c := range set {
			i, found := idx[c]
			if !found {
				ok = false
				r.missing = append(r.missing, tags.ColumnSetName(r.name, set))
				break
			}
			is = append(is, i)
		}
		if ok && len(is) > 0 {
			r.sets = append(r.sets, is)
			r.setNames = append(r.setNames, set)
		}
	}
}

// sameShape reports whether two Relation messages describe the same
// columns, types and identity: if not, the table's schema changed.
func (r *relation) sameShape(o *relation) bool {
	if r.name != o.name || r.full != o.full || len(r.columns) != len(o.columns) {
		return false
	}
	for i := range r.columns {
		if r.columns[i] != o.columns[i] || r.types[i] != o.types[i] || r.identity[i] != o.identity[i] {
			return false
		}
	}
	return true
}

// value is one column of a decoded row.
type value struct {
	known bool // false: not sent (not in the replica identity, or unchanged TOAST without an old row)
	null  bool
	text  string
}

// rowValues decodes a tuple. onlyIdentity: a 'K' tuple, whose non-identity
// columns are sent as NULL but are really unknown.
func (r *relation) rowValues(t *pglogrepl.TupleData, onlyIdentity bool) ([]value, error) {
	if t == nil {
		return nil, nil
	}
	if len(t.Columns) != len(r.columns) {
		return nil, fmt.Errorf("publisher: %s: tuple has %d columns, relation %d", r.name, len(t.Columns), len(r.columns))
	}
	vs := make([]value, len(r.columns))
	for i, c := range t.Columns {
		if onlyIdentity && !r.identity[i] {
			continue
		}
		switch c.DataType {
		case pglogrepl.TupleDataTypeNull:
			vs[i] = value{known: true, null: true}
		case pglogrepl.TupleDataTypeToast:
			// unchanged TOASTed value: filled in from the old row by the caller
		case pglogrepl.TupleDataTypeText:
			vs[i] = value{known: true, text: string(c.Data)}
		default:
			return nil, fmt.Errorf("publisher: %s: column %s in format %q; want text", r.name, r.columns[i], c.DataType)
		}
	}
	return vs, nil
}

// key returns the values of tag column set s in row vs: ok false when one
// is unknown; null true when one is NULL (a NULL never equals a parameter,
// so such a row is in no keyed group).
func (r *relation) key(s int, vs []value) (vals []string, ok, null bool) {
	for _, i := range r.sets[s] {
		v := vs[i]
		if !v.known {
			return nil, false, false
		}
		if v.null {
			null = true
		}
		vals = append(vals, v.text)
	}
	return vals, true, null
}

// rowKey is the primary key of row vs as Change.Keys gives it: nil when
// the table has none (of one column) or the row's is not known.
func (r *relation) rowKey(vs []value) []string {
	if r.pk < 0 || r.pk >= len(vs) {
		return nil
	}
	if v := vs[r.pk]; v.known && !v.null {
		return []string{v.text}
	}
	return nil
}

// bothKeys is the keys of a row's old and new values (nil when either is
// not known).
func bothKeys(o, n []string) []string {
	if o == nil || n == nil {
		return nil
	}
	return invalidation.MergeKeys(o, n)
}

func (r *relation) keyTag(s int, vals []string) string {
	return tags.Tag{Table: r.name, Columns: r.setNames[s], Values: vals}.String()
}

// changeSet accumulates one transaction's changes by tag.
type changeSet struct {
	lsn     uint64 // the transaction's commit LSN
	xid     uint32
	derived []*derivedIndex
	byTag   map[string]int
	changes []invalidation.Change
	tables  []string // the table ("schema.table") of each change
	rows    int
}

func (cs *changeSet) reset() {
	clear(cs.byTag)
	cs.changes = cs.changes[:0]
	cs.tables = cs.tables[:0]
	cs.rows = 0
}

// add records change c to a tag of table.
func (cs *changeSet) add(table string, c invalidation.Change) {
	key := c.Tag
	if c.Flush {
		key = "\x00flush\x00" + c.Tag // a flush and the table tag are different entries
	}
	if cs.byTag == nil {
		cs.byTag = map[string]int{}
	}
	if i, ok := cs.byTag[key]; ok {
		cs.changes[i].Merge(c)
		return
	}
	cs.byTag[key] = len(cs.changes)
	cs.changes = append(cs.changes, c)
	cs.tables = append(cs.tables, table)
}

func (cs *changeSet) flush(table string) {
	cs.add(table, invalidation.Change{Tag: table, Flush: true})
	cs.add(table, invalidation.Change{Tag: table, Rows: true})
	for _, ix := range cs.derived {
		if ix.touches(table) {
			ix.breakOff(cs, errors.New(table+" flushed"))
		}
	}
}

// derivedChange applies a row change to the derived sets' indexes of its
// table and publishes their tags (ov, nv: nil when the row did not exist
// before, or after).
func (cs *changeSet) derivedChange(r *relation, ov, nv []value, changed []string, allCols bool) {
	for _, ix := range cs.derived {
		if ix.table == r.name {
			ix.changeA(cs, r, ov, nv, changed, allCols)
		}
		if ix.ref == r.name {
			ix.changeB(cs, r, ov, nv)
		}
	}
}

// derivedUnknown marks the derived sets of a table whose old row is unknown.
func (cs *changeSet) derivedUnknown(r *relation) {
	for _, ix := range cs.derived {
		if ix.touches(r.name) {
			ix.breakOff(cs, errors.New("a row of "+r.name+" changed without its old values"))
		}
	}
}

// insert publishes the new row's table tag and keyed tags.
func (cs *changeSet) insert(r *relation, m *pglogrepl.InsertMessage) error {
	cs.rows++
	nv, err := r.rowValues(m.Tuple, false)
	if err != nil {
		return err
	}
	cs.add(r.name, invalidation.Change{Tag: r.name, Rows: true})
	if len(cs.derived) > 0 {
		cs.derivedChange(r, nil, nv, nil, false)
	}
	return cs.rowKeys(r, nv)
}

// remove publishes the old row's tags.
func (cs *changeSet) remove(r *relation, m *pglogrepl.DeleteMessage) error {
	cs.rows++
	cs.add(r.name, invalidation.Change{Tag: r.name, Rows: true})
	if m.OldTuple == nil {
		if len(cs.derived) > 0 {
			cs.derivedUnknown(r)
		}
		if len(r.sets) > 0 {
			cs.flush(r.name) // no identity: the old keys are unknown
		}
		return nil
	}
	ov, err := r.rowValues(m.OldTuple, m.OldTupleType == 'K')
	if err != nil {
		return err
	}
	if len(cs.derived) > 0 {
		cs.derivedChange(r, ov, nil, nil, false)
	}
	return cs.rowKeys(r, ov)
}

// rowKeys adds a Rows change for every keyed tag of a row that entered or
// left its groups; an unknown key flushes the table.
func (cs *changeSet) rowKeys(r *relation, vs []value) error {
	keys := r.rowKey(vs)
	for s := range r.sets {
		vals, ok, null := r.key(s, vs)
		if !ok {
			cs.flush(r.name)
			return nil
		}
		if !null {
			cs.add(r.name, invalidation.Change{Tag: r.keyTag(s, vals), Rows: true, Keys: keys})
		}
	}
	return nil
}

// update publishes the table tag with the changed columns, and for every
// tag column set the old and the new key: one Rows change each when the key
// changed, a column change when it did not.
func (cs *changeSet) update(r *relation, m *pglogrepl.UpdateMessage) error {
	cs.rows++
	nv, err := r.rowValues(m.NewTuple, false)
	if err != nil {
		return err
	}
	var ov []value
	fullOld := false
	switch m.OldTupleType {
	case 'O':
		if ov, err = r.rowValues(m.OldTuple, false); err != nil {
			return err
		}
		fullOld = true
	case 'K':
		if ov, err = r.rowValues(m.OldTuple, true); err != nil {
			return err
		}
	default:
		// The identity did not change: its old values are the new ones.
		ov = make([]value, len(nv))
		for i := range nv {
			if r.identity[i] {
				ov[i] = nv[i]
			}
		}
	}
	// Unchanged TOASTed values come from the old row.
	for i := range nv {
		if !nv[i].known && ov[i].known {
			nv[i] = ov[i]
		}
	}
	var changed []string
	if fullOld {
		for i := range nv {
			if m.NewTuple.Columns[i].DataType == pglogrepl.TupleDataTypeToast {
				continue // unchanged
			}
			if nv[i] != ov[i] {
				changed = append(changed, r.columns[i])
			}
		}
		sort.Strings(changed)
	}
	oKeys, nKeys := r.rowKey(ov), r.rowKey(nv)
	colChange := func(tag string, keys []string) invalidation.Change {
		return invalidation.Change{Tag: tag, AllColumns: !fullOld, Columns: changed, Keys: keys}
	}
	if !fullOld || len(changed) > 0 {
		cs.add(r.name, colChange(r.name, nil))
	}
	if len(cs.derived) > 0 {
		cs.derivedChange(r, ov, nv, changed, !fullOld)
	}
	for s := range r.sets {
		oldVals, okOld, nullOld := r.key(s, ov)
		newVals, okNew, nullNew := r.key(s, nv)
		if !okOld || !okNew {
			cs.flush(r.name)
			return nil
		}
		if !nullOld && !nullNew && slices.Equal(oldVals, newVals) {
			if !fullOld || len(changed) > 0 {
				cs.add(r.name, colChange(r.keyTag(s, oldVals), bothKeys(oKeys, nKeys)))
			}
			continue
		}
		if !nullOld {
			cs.add(r.name, invalidation.Change{Tag: r.keyTag(s, oldVals), Rows: true, Keys: oKeys})
		}
		if !nullNew {
			cs.add(r.name, invalidation.Change{Tag: r.keyTag(s, newVals), Rows: true, Keys: nKeys})
		}
	}
	return nil
}
