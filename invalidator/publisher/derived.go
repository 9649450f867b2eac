package publisher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/tags"
)

// Derived tag column sets.
//
// A derived column of table A (tags.DerivedColumn: seller->public.users.region)
// is the value of a column of the row of table B whose single-column primary
// key equals A's foreign key column. A set holding one groups A's rows by it:
// public.items(category,"seller->public.users.region")=(3,7) holds the items
// of category 3 whose seller lives in region 7. The change stream carries
// A's rows without B's columns, so the publisher keeps an index per derived
// set, built from a snapshot and kept current by the very changes it decodes:
//
//   - B's rows: primary key → the referenced columns;
//   - A's rows: foreign key → how many rows hold each combination of the
//     set's plain columns.
//
// A change to an A row publishes the keyed tags of its old and new row, their
// derived values looked up in B's index; a change to a B row that moves its key
// or its referenced columns publishes, for every combination of plain columns
// the A rows referencing it hold, the keyed tags under its old and its new
// values. Both as changes of rows (a row entered or left the group), except an
// A update that leaves the row in its group, which is a column change as for
// plain sets.
//
// The index is exact only for commits decoded after the snapshot it was read
// at: the snapshot was taken, then the WAL insert position read (loadedAt);
// every commit above loadedAt is not in the snapshot, and every commit the
// decoder hands over after the load is applied in order. A commit at or below
// loadedAt may or may not be in the snapshot: for those (and whenever the index
// cannot be trusted: not loaded, an old row unknown, a truncation or schema
// change of A or B) the publisher publishes the set's own tag (tags.SetTag),
// which every result keyed on the set also holds, so they all end. Changes of
// such commits are applied only when the snapshot does not hold their
// transaction (its xmin, xmax and in-progress list), so that after the
// last of them the index holds the database as of loadedAt. Before a load,
// every commit the decoder passed recently must be visible (a commit record
// can be decoded before its transaction leaves the proc array): its changes
// are then in the snapshot, as they will not be decoded again.
type derivedIndex struct {
	name    string // the set's name: public.items(category,"seller->public.users.region")
	table   string // A
	columns []string
	setTag  string

	// per column of the set: its position among the plain columns (>= 0),
	// or -1-i for the i-th referenced column of B.
	slot   []int
	plain  []string // A's plain columns of the set, in set order
	fk     string   // A's foreign key column
	ref    string   // B
	refKey string   // B's primary key column
	refCol []string // B's referenced columns

	loaded   bool
	loadedAt uint64 // commits at or below it publish the set tag
	// the load's snapshot: a commit at or below loadedAt that it holds is
	// not applied again (the multiset of A's rows would count it twice)
	snapXmin, snapXmax uint64
	snapXip            map[uint64]bool
	// broken: a change could not be applied (an old row unknown, a
	// truncation, a schema change): reload after the commit.
	broken    bool
	lastTry   time.Time
	lastError error

	refRows map[string][]value        // B: primary key → referenced columns
	byFK    map[string]map[string]int // A: foreign key → plain values (joined by \x00) → rows

	// positions in the relations last seen
	aRel, bRel *relation
	aFK        int
	aPlain     []int
	bKey       int
	bRefs      []int
	aErr, bErr error
}

// maxDerivedRows bounds the rows of A and B an index reads; past it the set
// is not indexed and every change to its tables publishes its set tag. A
// load after a registration, a truncation or a schema change runs in the
// replication loop, which answers the walsender only after it: at about
// 150 000 rows a second, 2 million rows stay well under the default
// wal_sender_timeout of 60 s.
const maxDerivedRows = 2_000_000

// SkipReferencedChangesForTest breaks the publisher on purpose (a change of
// a referenced row publishes nothing under the derived sets) so that the
// client's consistency check can show it notices. Never set it outside
// tests.
var SkipReferencedChangesForTest atomic.Bool

// derivedRetry spaces the loads of an index that failed.
const derivedRetry = 10 * time.Second

// newDerivedIndex parses a derived set of table; an error when it mixes
// foreign keys or tables (not supported: one foreign key a set).
func newDerivedIndex(table string, columns []string) (*derivedIndex, error) {
	ix := &derivedIndex{
		name:    invalidation.SetName(table, columns),
		table:   table,
		columns: slices.Clone(columns),
		setTag:  tags.SetTag(table, columns).String(),
	}
	for _, c := range columns {
		fk, ref, col, ok := tags.ParseDerivedColumn(c)
		if !ok {
			ix.slot = append(ix.slot, len(ix.plain))
			ix.plain = append(ix.plain, c)
			continue
		}
		if ix.fk == "" {
			ix.fk, ix.ref = fk, ref
		} else if ix.fk != fk || ix.ref != ref {
			return nil, fmt.Errorf("derived columns through different foreign keys (%s->%s, %s->%s): one foreign key a set", ix.fk, ix.ref, fk, ref)
		}
		if slices.Contains(ix.refCol, col) {
			return nil, fmt.Errorf("derived column %s twice", c)
		}
		ix.slot = append(ix.slot, -1-len(ix.refCol))
		ix.refCol = append(ix.refCol, col)
	}
	if ix.fk == "" {
		return nil, errors.New("no derived column")
	}
	return ix, nil
}

// touches reports whether changes of table concern the index.
func (ix *derivedIndex) touches(table string) bool { return table == ix.table || table == ix.ref }

// exact reports whether the keyed tags of a commit at lsn can be computed.
func (ix *derivedIndex) exact(lsn uint64) bool {
	return ix.loaded && !ix.broken && lsn > ix.loadedAt
}

// inSnapshot reports whether the load's snapshot holds transaction xid
// (32 bits, as pgoutput gives it): committed before the snapshot was taken.
func (ix *derivedIndex) inSnapshot(xid uint32) bool {
	x := widenXID(xid, ix.snapXmax)
	return x < ix.snapXmin || x < ix.snapXmax && !ix.snapXip[x]
}

// widenXID returns the 64-bit transaction id of xid within 2^31 of ref.
func widenXID(xid uint32, ref uint64) uint64 {
	x := ref&^0xFFFFFFFF | uint64(xid)
	switch {
	case x > ref && x-ref >= 1<<31 && x >= 1<<32:
		x -= 1 << 32
	case x < ref && ref-x > 1<<31:
		x += 1 << 32
	}
	return x
}

// bindA resolves A's columns in r.
func (ix *derivedIndex) bindA(r *relation) error {
	if r != ix.aRel {
		var ps []int
		ps, ix.aErr = columnPositions(r, append([]string{ix.fk}, ix.plain...))
		if ix.aErr == nil {
			ix.aFK, ix.aPlain = ps[0], ps[1:]
		}
		ix.aRel = r
	}
	return ix.aErr
}

// bindB resolves B's columns in r.
func (ix *derivedIndex) bindB(r *relation) error {
	if r != ix.bRel {
		var ps []int
		ps, ix.bErr = columnPositions(r, append([]string{ix.refKey}, ix.refCol...))
		if ix.bErr == nil {
			ix.bKey, ix.bRefs = ps[0], ps[1:]
		}
		ix.bRel = r
	}
	return ix.bErr
}

// columnPositions returns the positions of columns in r's tuples.
func columnPositions(r *relation, columns []string) ([]int, error) {
	ps := make([]int, len(columns))
	for i, c := range columns {
		if ps[i] = slices.Index(r.columns, c); ps[i] < 0 {
			return nil, fmt.Errorf("%s has no column %q", r.name, c)
		}
	}
	return ps, nil
}

// aKey returns the foreign key and the joined plain values of an A row: ok
// false when one is unknown; in false when the row is in no group through
// its plain columns or foreign key (a NULL).
func (ix *derivedIndex) aKey(vs []value) (fk, plain string, in, ok bool) {
	v := vs[ix.aFK]
	if !v.known {
		return "", "", false, false
	}
	in = !v.null
	fk = v.text
	var b strings.Builder
	for i, p := range ix.aPlain {
		pv := vs[p]
		if !pv.known {
			return "", "", false, false
		}
		if pv.null {
			in = false
		}
		if i > 0 {
			b.WriteByte(0)
		}
		b.WriteString(pv.text)
	}
	return fk, b.String(), in, true
}

// tag returns the keyed tag of plain values (joined) and B's referenced
// values; ok false when a referenced value is NULL (no group).
func (ix *derivedIndex) tag(plain string, refs []value) (string, bool) {
	for _, v := range refs {
		if v.null || !v.known {
			return "", false
		}
	}
	pv := strings.Split(plain, "\x00")
	if len(ix.plain) == 0 {
		pv = nil
	}
	vals := make([]string, len(ix.slot))
	for i, s := range ix.slot {
		if s >= 0 {
			vals[i] = pv[s]
		} else {
			vals[i] = refs[-1-s].text
		}
	}
	return tags.Tag{Table: ix.table, Columns: ix.columns, Values: vals}.String(), true
}

func (ix *derivedIndex) addA(fk, plain string) {
	m := ix.byFK[fk]
	if m == nil {
		m = map[string]int{}
		ix.byFK[fk] = m
	}
	m[plain]++
}

func (ix *derivedIndex) removeA(fk, plain string) {
	m := ix.byFK[fk]
	if m[plain] <= 1 {
		delete(m, plain)
		if len(m) == 0 {
			delete(ix.byFK, fk)
		}
		return
	}
	m[plain]--
}

// admit decides what a change of the open transaction does to the index:
// exact, it publishes keyed tags; else the set tag, and it is applied only
// to a loaded, trusted index whose snapshot does not hold the transaction.
func (ix *derivedIndex) admit(cs *changeSet) (exact, apply bool) {
	if ix.exact(cs.lsn) {
		return true, true
	}
	ix.publishSetTag(cs)
	return false, ix.loaded && !ix.broken && !ix.inSnapshot(cs.xid)
}

// changeA applies a change of an A row (ov, nv: nil when the row did not
// exist before, or after) and publishes its tags when exact. changed lists
// the columns an update changed (nil with allCols when unknown).
func (ix *derivedIndex) changeA(cs *changeSet, r *relation, ov, nv []value, changed []string, allCols bool) {
	exact, apply := ix.admit(cs)
	if !apply {
		return
	}
	if err := ix.bindA(r); err != nil {
		ix.breakOff(cs, err)
		return
	}
	var oFK, oPlain, nFK, nPlain string
	var oIn, nIn bool
	if ov != nil {
		var ok bool
		if oFK, oPlain, oIn, ok = ix.aKey(ov); !ok {
			ix.breakOff(cs, errors.New("an old row of "+ix.table+" lacks a column of the set"))
			return
		}
	}
	if nv != nil {
		var ok bool
		if nFK, nPlain, nIn, ok = ix.aKey(nv); !ok {
			ix.breakOff(cs, errors.New("a new row of "+ix.table+" lacks a column of the set"))
			return
		}
	}
	if exact {
		var oTag, nTag string
		var oOK, nOK bool
		if refs := ix.refRows[oFK]; oIn && refs != nil {
			oTag, oOK = ix.tag(oPlain, refs)
		}
		if refs := ix.refRows[nFK]; nIn && refs != nil {
			nTag, nOK = ix.tag(nPlain, refs)
		}
		oKeys, nKeys := r.rowKey(ov), r.rowKey(nv)
		switch {
		case oOK && nOK && oTag == nTag && ov != nil && nv != nil:
			if allCols || len(changed) > 0 {
				cs.add(ix.table, invalidation.Change{Tag: oTag, AllColumns: allCols, Columns: changed, Keys: bothKeys(oKeys, nKeys)})
			}
		default:
			if oOK {
				cs.add(ix.table, invalidation.Change{Tag: oTag, Rows: true, Keys: oKeys})
			}
			if nOK {
				cs.add(ix.table, invalidation.Change{Tag: nTag, Rows: true, Keys: nKeys})
			}
		}
	}
	if oIn {
		ix.removeA(oFK, oPlain)
	}
	if nIn {
		ix.addA(nFK, nPlain)
	}
}

// changeB applies a change of a B row. old values of the referenced columns
// come from the index (B's replica identity need only hold its key).
func (ix *derivedIndex) changeB(cs *changeSet, r *relation, ov, nv []value) {
	exact, apply := ix.admit(cs)
	if !apply {
		return
	}
	if err := ix.bindB(r); err != nil {
		ix.breakOff(cs, err)
		return
	}
	var oKey, nKey string
	var oRefs, nRefs []value
	if ov != nil {
		k := ov[ix.bKey]
		if !k.known {
			ix.breakOff(cs, errors.New("an old row of "+ix.ref+" lacks its key"))
			return
		}
		if !k.null {
			oKey, oRefs = k.text, ix.refRows[k.text]
		}
	}
	if nv != nil {
		k := nv[ix.bKey]
		if !k.known {
			ix.breakOff(cs, errors.New("a new row of "+ix.ref+" lacks its key"))
			return
		}
		if !k.null {
			nKey = k.text
			nRefs = make([]value, len(ix.bRefs))
			for i, p := range ix.bRefs {
				nRefs[i] = nv[p]
				if !nRefs[i].known {
					// an unchanged TOASTed value: the old one
					if oRefs == nil || oKey != nKey {
						ix.breakOff(cs, errors.New("a new row of "+ix.ref+" lacks a referenced column"))
						return
					}
					nRefs[i] = oRefs[i]
				}
			}
		}
	}
	if oRefs != nil && nRefs != nil && oKey == nKey && slices.Equal(oRefs, nRefs) {
		return // nothing the set reads changed
	}
	if exact && !SkipReferencedChangesForTest.Load() {
		ix.publishReferencing(cs, oKey, oRefs)
		ix.publishReferencing(cs, nKey, nRefs)
	}
	if oRefs != nil {
		delete(ix.refRows, oKey)
	}
	if nRefs != nil {
		ix.refRows[nKey] = nRefs
	}
}

// publishReferencing publishes, as changes of rows, the keyed tags of the A
// rows referencing B's key under B's referenced values refs (nil: none).
func (ix *derivedIndex) publishReferencing(cs *changeSet, key string, refs []value) {
	if refs == nil {
		return
	}
	for plain := range ix.byFK[key] {
		if t, ok := ix.tag(plain, refs); ok {
			cs.add(ix.table, invalidation.Change{Tag: t, Rows: true})
		}
	}
}

// breakOff publishes the set tag and schedules a reload.
func (ix *derivedIndex) breakOff(cs *changeSet, err error) {
	ix.publishSetTag(cs)
	if !ix.broken {
		ix.broken, ix.lastError = true, err
	}
}

func (ix *derivedIndex) publishSetTag(cs *changeSet) {
	cs.add(ix.table, invalidation.Change{Tag: ix.setTag, Rows: true})
}

// load reads the index from a snapshot. conn must not be in a transaction;
// decoded are the transactions of the commits decoded lately (recentXIDs).
func (ix *derivedIndex) load(ctx context.Context, conn *pgx.Conn, decoded []uint32) (rows int, err error) {
	ix.lastTry = time.Now()
	ix.loaded, ix.broken = false, false
	ix.refRows, ix.byFK = nil, nil
	ix.aRel, ix.bRel = nil, nil
	defer func() {
		if err != nil {
			ix.refRows, ix.byFK, ix.lastError = nil, nil, err
		}
	}()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	key, err := ix.checkReference(ctx, tx)
	if err != nil {
		return 0, err
	}
	if ix.refKey != "" && key != ix.refKey {
		// Results keyed through the old key may still be cached, and
		// clients may still derive through it: never index this set again
		// in this process.
		return 0, fmt.Errorf("the primary key of %s changed from %s to %s", ix.ref, ix.refKey, key)
	}
	ix.refKey = key
	quote := func(c string) string { return pgx.Identifier{c}.Sanitize() }
	table := func(t string) string { return pgx.Identifier(strings.SplitN(t, ".", 2)).Sanitize() }
	refs := make([]string, len(ix.refCol))
	for i, c := range ix.refCol {
		refs[i] = quote(c)
	}
	refRows := map[string][]value{}
	q := "SELECT " + quote(key) + ", " + strings.Join(refs, ", ") + " FROM ONLY " + table(ix.ref) + " WHERE " + quote(key) + " IS NOT NULL"
	if err := scanText(ctx, tx, q, func(vs []value) error {
		refRows[vs[0].text] = slices.Clone(vs[1:])
		if rows++; rows > maxDerivedRows {
			return fmt.Errorf("more than %d rows", maxDerivedRows)
		}
		return nil
	}); err != nil {
		return rows, err
	}
	sel := []string{quote(ix.fk)}
	for _, c := range ix.plain {
		sel = append(sel, quote(c))
	}
	byFK := map[string]map[string]int{}
	ix.byFK = byFK
	q = "SELECT " + strings.Join(sel, ", ") + " FROM ONLY " + table(ix.table) + " WHERE " + quote(ix.fk) + " IS NOT NULL"
	var b strings.Builder
	if err := scanText(ctx, tx, q, func(vs []value) error {
		b.Reset()
		for i, v := range vs[1:] {
			if v.null {
				return nil // in no group
			}
			if i > 0 {
				b.WriteByte(0)
			}
			b.WriteString(v.text)
		}
		ix.addA(vs[0].text, b.String())
		if rows++; rows > maxDerivedRows {
			return fmt.Errorf("more than %d rows", maxDerivedRows)
		}
		return nil
	}); err != nil {
		return rows, err
	}
	// Every commit visible to the snapshot wrote its commit record before
	// this position: a commit above it is not in the snapshot.
	var at, snap string
	if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text, pg_current_snapshot()::text").Scan(&at, &snap); err != nil {
		return rows, err
	}
	lsn, err := parseLSN(at)
	if err != nil {
		return rows, err
	}
	if ix.snapXmin, ix.snapXmax, ix.snapXip, err = parseSnapshot(snap); err != nil {
		return rows, err
	}
	// The commits decoded before the load are not decoded again: the
	// snapshot must hold them.
	for _, xid := range decoded {
		if !ix.inSnapshot(xid) {
			return rows, fmt.Errorf("%w: transaction %d", errNotYetVisible, xid)
		}
	}
	ix.refRows, ix.loadedAt, ix.loaded, ix.lastError = refRows, lsn, true, nil
	return rows, nil
}

// errNotYetVisible: a decoded commit's transaction was still in progress for
// the load's snapshot; the load is tried again.
var errNotYetVisible = errors.New("a decoded commit is not yet visible")

// parseSnapshot parses pg_snapshot's text form "xmin:xmax:xip,xip".
func parseSnapshot(s string) (xmin, xmax uint64, xip map[uint64]bool, err error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return 0, 0, nil, fmt.Errorf("not a snapshot: %q", s)
	}
	if xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return 0, 0, nil, fmt.Errorf("not a snapshot: %q", s)
	}
	if xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return 0, 0, nil, fmt.Errorf("not a snapshot: %q", s)
	}
	xip = map[uint64]bool{}
	if parts[2] != "" {
		for _, x := range strings.Split(parts[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return 0, 0, nil, fmt.Errorf("not a snapshot: %q", s)
			}
			xip[v] = true
		}
	}
	return xmin, xmax, xip, nil
}

// tableColumns returns the columns of table a set needs in the table's
// replica identity: its plain columns and the foreign keys of its derived
// ones.
func tableColumns(set []string) []string {
	var out []string
	for _, c := range set {
		if fk, _, _, ok := tags.ParseDerivedColumn(c); ok {
			c = fk
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// checkDerived says why a derived set of table cannot be published (""
// when it can): its referenced table must be covered (checkReference).
func checkDerived(ctx context.Context, q querier, table string, set []string, covered map[string][][]string) string {
	ix, err := newDerivedIndex(table, set)
	if err != nil {
		return err.Error()
	}
	if _, ok := covered[ix.ref]; !ok {
		return "table " + ix.ref + " is not covered by the invalidator: its changes would not be decoded"
	}
	if _, err := ix.checkReference(ctx, q); err != nil {
		return err.Error()
	}
	return ""
}

// checkReference returns the referenced table's primary key, or why the set
// cannot be indexed: that key must be a single, immediately checked column
// of the foreign key's type, and the referenced columns must exist.
func (ix *derivedIndex) checkReference(ctx context.Context, q querier) (string, error) {
	key, err := primaryKeyOf(ctx, q, ix.ref)
	if err != nil {
		return "", err
	}
	// Types are compared without their modifiers: varchar(10) and
	// varchar(20) print a value alike.
	var fkType, keyType *string
	var missing []string
	var aKind, bKind, bIdentity string
	err = q.QueryRow(ctx, `
SELECT (SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped),
       (SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = to_regclass($3) AND attname = $4 AND NOT attisdropped),
       coalesce((SELECT array_agg(c) FROM unnest($5::text[]) c WHERE NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($3) AND attname = c AND NOT attisdropped)), '{}'),
       (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)),
       (SELECT relkind::text FROM pg_class WHERE oid = to_regclass($3)),
       (SELECT relreplident::text FROM pg_class WHERE oid = to_regclass($3))`,
		pgx.Identifier(strings.SplitN(ix.table, ".", 2)).Sanitize(), ix.fk, pgx.Identifier(strings.SplitN(ix.ref, ".", 2)).Sanitize(), key, ix.refCol).Scan(&fkType, &keyType, &missing, &aKind, &bKind, &bIdentity)
	switch {
	case err != nil:
		return "", fmt.Errorf("read the columns of %s and %s: %w", ix.table, ix.ref, err)
	case aKind != "r" || bKind != "r":
		return "", fmt.Errorf("%s and %s must be plain tables (not partitioned, views or foreign tables) for a derived column", ix.table, ix.ref)
	case bIdentity != "d" && bIdentity != "f":
		return "", fmt.Errorf("the replica identity of %s must be DEFAULT (its primary key) or FULL for a derived column: a change must give the old key", ix.ref)
	case fkType == nil:
		return "", fmt.Errorf("table %s has no column %s", ix.table, ix.fk)
	case len(missing) > 0:
		return "", fmt.Errorf("table %s has no column %s", ix.ref, missing[0])
	case keyType == nil || *fkType != *keyType:
		return "", fmt.Errorf("%s.%s is %s and the primary key %s.%s is not: a derived column needs the same type on both sides", ix.table, ix.fk, *fkType, ix.ref, key)
	}
	return key, nil
}

// querier is a connection or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// primaryKeyOf returns the single-column primary key of table.
func primaryKeyOf(ctx context.Context, tx querier, table string) (string, error) {
	var cols []string
	err := tx.QueryRow(ctx, `
SELECT coalesce(array_agg(a.attname::text), '{}')
FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = to_regclass($1) AND i.indisprimary AND i.indimmediate`, pgx.Identifier(strings.SplitN(table, ".", 2)).Sanitize()).Scan(&cols)
	if err != nil {
		return "", fmt.Errorf("read the primary key of %s: %w", table, err)
	}
	if len(cols) != 1 {
		return "", fmt.Errorf("%s has no single-column, immediately checked primary key", table)
	}
	return cols[0], nil
}

// scanText runs q in the simple protocol, so that every value comes in
// PostgreSQL's text output, as pgoutput sends it, and hands each row over.
func scanText(ctx context.Context, tx pgx.Tx, q string, fn func([]value) error) error {
	rows, err := tx.Query(ctx, q, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return err
	}
	defer rows.Close()
	var vs []value
	for rows.Next() {
		raw := rows.RawValues()
		vs = vs[:0]
		for _, r := range raw {
			if r == nil {
				vs = append(vs, value{known: true, null: true})
			} else {
				vs = append(vs, value{known: true, text: string(r)})
			}
		}
		if err := fn(vs); err != nil {
			return err
		}
	}
	return rows.Err()
}

func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("not an LSN: %q", s)
	}
	var h, l uint64
	if _, err := fmt.Sscanf(hi+" "+lo, "%x %x", &h, &l); err != nil {
		return 0, fmt.Errorf("not an LSN: %q", s)
	}
	return h<<32 | l, nil
}

// syncDerived makes one index per derived set of the tables' sets, keeping
// the indexes of sets still published. A set the publisher cannot index (it
// names two foreign keys) is removed from its table's sets: never listed,
// never keyed on.
func (p *Publisher) syncDerived() {
	keep := map[string]*derivedIndex{}
	for name, t := range p.tables {
		sets := t.sets[:0:0]
		for _, set := range t.sets {
			if !tags.IsDerivedSet(set) {
				sets = append(sets, set)
				continue
			}
			setName := invalidation.SetName(name, set)
			if ix := p.derived[setName]; ix != nil && p.tables[ix.ref] != nil {
				keep[setName] = ix
				sets = append(sets, set)
				continue
			}
			ix, err := newDerivedIndex(name, set)
			if err == nil && p.tables[ix.ref] == nil {
				err = errors.New("table " + ix.ref + " is not covered: its changes are not decoded")
			}
			if err != nil {
				p.cfg.Log.Warn("derived tag column set not published", "set", setName, "err", err)
				continue
			}
			keep[setName] = ix
			sets = append(sets, set)
		}
		t.sets = sets
	}
	p.derived = keep
	p.cs.derived = p.cs.derived[:0]
	for _, ix := range keep {
		p.cs.derived = append(p.cs.derived, ix)
	}
	slices.SortFunc(p.cs.derived, func(a, b *derivedIndex) int { return strings.Compare(a.name, b.name) })
	p.m.derivedSets.Set(float64(len(keep)))
}

// loadDerived loads the indexes not loaded or broken by a change, on the
// session's connection: at once for reason now ("start", "registration"),
// else every derivedRetry after a failure.
func (p *Publisher) loadDerived(ctx context.Context, now string) {
	for _, ix := range p.cs.derived {
		if ix.loaded && !ix.broken {
			continue
		}
		if now == "" && !ix.broken && time.Since(ix.lastTry) < derivedRetry {
			continue
		}
		why := now
		switch {
		case ix.broken:
			why = ix.lastError.Error()
		case why == "":
			why = "retry"
		}
		began := time.Now()
		var rows int
		var err error
		for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
			p.connMu.Lock()
			if p.conn == nil {
				err = errors.New("not connected")
			} else {
				rows, err = ix.load(ctx, p.conn, p.recent.xids())
			}
			p.connMu.Unlock()
			if !errors.Is(err, errNotYetVisible) || time.Since(began) > ackTimeout || ctx.Err() != nil {
				break
			}
			time.Sleep(wait)
		}
		if err != nil {
			p.m.derivedLoads.WithLabelValues("failed").Inc()
			p.cfg.Log.Error("could not index a derived tag column set: every change of its tables ends every result keyed on it", "set", ix.name, "err", err, "retry_in", derivedRetry)
			continue
		}
		p.m.derivedLoads.WithLabelValues("loaded").Inc()
		p.cfg.Log.Info("derived tag column set indexed", "set", ix.name, "rows", rows, "exact_after", fmt.Sprintf("%X", ix.loadedAt), "seconds", time.Since(began).Seconds(), "why", why)
	}
}

// countSetTags counts the commit's set tags (published while an index was
// not exact).
func (p *Publisher) countSetTags() {
	for _, ix := range p.cs.derived {
		if _, ok := p.cs.byTag[ix.setTag]; ok {
			p.m.derivedSetTags.Inc()
		}
	}
}

// recentXIDs remembers the transactions of the last commits decoded: a load
// checks that its snapshot holds them all. Commits decoded more than
// recentXIDAge ago are left out: visible long since (a commit's transaction
// leaves the proc array right after its commit record, or once a
// synchronous standby confirmed it), and their 32-bit ids could no longer
// be placed in an epoch.
type recentXIDs struct {
	ring [1024]decodedXID
	n    int
}

type decodedXID struct {
	xid uint32
	at  time.Time
}

const recentXIDAge = 10 * time.Minute

func (r *recentXIDs) add(xid uint32) {
	r.ring[r.n%len(r.ring)] = decodedXID{xid, time.Now()}
	r.n++
}

func (r *recentXIDs) xids() []uint32 {
	var out []uint32
	for _, d := range r.ring[:min(r.n, len(r.ring))] {
		if time.Since(d.at) < recentXIDAge {
			out = append(out, d.xid)
		}
	}
	return out
}
