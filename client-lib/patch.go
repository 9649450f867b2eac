package larder

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/wire"
	"github.com/larderdb/larder/qumaana/quma"
)

// Patched results. A result split by rows (rowsplit.go) depends on which
// rows it holds and in what order (its membership: the group tags, on
// the membership columns) and on what it shows of each (a tag per row).
// A change to a row it shows ends the result but leaves its membership
// valid: under RUBiS's bidding mix every bid ends the search pages that
// show its item, and each page's next read ran the whole search again.
//
// So beside each split result whose outputs are all columns of its split
// table (quma.RowSplit.Fetch), the L1 keeps its membership: the result's
// columns and its rows' keys, in order, under the group tags only. A read
// that misses the result but finds its membership valid at a snapshot the
// transaction can still choose reads those rows again by key (Fetch) at
// its snapshot, and puts them in the membership's order. Both hold at
// that snapshot, so the patched result is the query's result there (ties
// in the ordering aside, which PostgreSQL breaks arbitrarily at any
// snapshot); it is cached as a miss's result would be.
//
// Repaired memberships. A membership ends when a row enters or leaves
// its group, or changes a column that orders it: in RUBiS every new item
// and every item sold out ends its category's and region's pages, a few
// times a second each, and the search ran again. When the template can
// be repaired (quma.Repair), the L1 keeps the membership open across
// changes that name their rows (invalidation.Change.Keys): the keys of
// those rows are absorbed into it (store.Version.Absorbs). A read that
// finds it with absorbed keys runs the statement on the membership's rows
// and the absorbed ones only, by key (Repair.SQL): every row the query
// holds at the snapshot is among them, but for rows it left out past its
// LIMIT, which sort after the membership's last row (and, unchanged,
// still do). So with a LIMIT the repaired result is taken only when it is
// full and its last row sorts no later than the membership's last;
// otherwise the query runs.

// memberList is a split result's membership: its columns and its rows'
// keys in order.
type memberList struct {
	fields []pgconn.FieldDescription
	keys   []int64
	// bound is the lower bound it was computed for, when it is kept to be
	// carried (quma.Carry); none otherwise.
	bound bound
	// full: the result held as many rows as its LIMIT (quma.Repair), and
	// last is the sort key of its last row (none when not known).
	full bool
	last bound
	// lo, hi: the timestamps it holds at, as the lookup served it.
	lo, hi uint64
	// absorbed are the keys of the rows that changed since it was
	// computed (store.Result.Absorbed): it must be repaired.
	absorbed []int64
}

// bound is the value of a carried lower bound (quma.Carry): an integer,
// or a time as an instant and its zone's offset. Bounds compare only
// when they are of one kind (and, times, of one offset: a timestamp
// without time zone compares their wall clocks).
type bound struct {
	kind boundKind
	v    int64 // the integer, or the time in Unix nanoseconds
	zone int64 // a time's offset from UTC in seconds
}

type boundKind uint8

const (
	boundNone boundKind = iota
	boundInt
	boundTime
)

// boundOf reads a parameter's value as a bound: an integer or a
// time.Time; ok false for anything else.
func boundOf(a any) (bound, bool) {
	switch v := a.(type) {
	case int:
		return bound{kind: boundInt, v: int64(v)}, true
	case int16:
		return bound{kind: boundInt, v: int64(v)}, true
	case int32:
		return bound{kind: boundInt, v: int64(v)}, true
	case int64:
		return bound{kind: boundInt, v: v}, true
	case time.Time:
		_, off := v.Zone()
		if v.Year() < 1800 || v.Year() > 2200 { // UnixNano's range
			return bound{}, false
		}
		return bound{kind: boundTime, v: v.UnixNano(), zone: int64(off)}, true
	}
	return bound{}, false
}

// atMost reports whether b is of c's kind and no higher.
func (b bound) atMost(c bound) bool {
	return b.kind == c.kind && b.kind != boundNone && b.zone == c.zone && b.v <= c.v
}

// sortTypes decodes sort keys (boundAt); guarded by sortTypesMu.
var (
	sortTypesMu sync.Mutex
	sortTypes   = pgtype.NewMap()
)

// boundAt reads the value of column col of row as a bound (an integer or
// a time); false for a NULL or another type.
func (r *Result) boundAt(row, col int) (bound, bool) {
	if row < 0 || row >= len(r.Rows) || col < 0 || col >= len(r.Fields) || col >= len(r.Rows[row]) || r.Rows[row][col] == nil {
		return bound{}, false
	}
	f := r.Fields[col]
	sortTypesMu.Lock()
	defer sortTypesMu.Unlock()
	typ, ok := sortTypes.TypeForOID(f.DataTypeOID)
	if !ok {
		return bound{}, false
	}
	v, err := typ.Codec.DecodeValue(sortTypes, f.DataTypeOID, f.Format, r.Rows[row][col])
	if err != nil {
		return bound{}, false
	}
	return boundOf(v)
}

// holds reports whether the membership holds at timestamp ts.
func (m *memberList) holds(ts uint64) bool { return m.lo <= ts && ts < m.hi }

// membersVersion is the first byte of an encoded memberList.
const membersVersion = 2

// encodeMembers encodes a membership: version, the columns (a Result
// without rows, encoded), the number of keys, each key (a varint), then
// the bound: its kind (a byte), and for a kind other than none its value
// and zone (varints); then full (a byte, 0 or 1) and last, as the bound.
func encodeMembers(m *memberList) []byte {
	head := (&Result{Fields: m.fields}).encode(nil)
	dst := make([]byte, 0, 1+binary.MaxVarintLen64*(4+len(m.keys))+len(head))
	dst = append(dst, membersVersion)
	dst = wire.AppendBytes(dst, head)
	dst = binary.AppendUvarint(dst, uint64(len(m.keys)))
	for _, k := range m.keys {
		dst = binary.AppendVarint(dst, k)
	}
	dst = appendBound(dst, m.bound)
	full := byte(0)
	if m.full {
		full = 1
	}
	dst = append(dst, full)
	return appendBound(dst, m.last)
}

func appendBound(dst []byte, b bound) []byte {
	dst = append(dst, byte(b.kind))
	if b.kind != boundNone {
		dst = binary.AppendVarint(dst, b.v)
		dst = binary.AppendVarint(dst, b.zone)
	}
	return dst
}

func decodeBound(d *wire.Decoder) bound {
	switch k := boundKind(d.Byte("bound kind")); {
	case d.Err != nil, k == boundNone:
	case k == boundInt || k == boundTime:
		return bound{kind: k, v: d.Varint("bound"), zone: d.Varint("bound zone")}
	default:
		d.Fail("bound of unknown kind %d", k)
	}
	return bound{}
}

// decodeMembers decodes encodeMembers' encoding.
func decodeMembers(b []byte) (*memberList, error) {
	if len(b) == 0 || b[0] != membersVersion {
		return nil, fmt.Errorf("%w: membership of unknown version", errCorruptResult)
	}
	d := wire.Decoder{B: b[1:], Wrap: errCorruptResult}
	cols := d.Bytes("columns")
	if d.Err != nil {
		return nil, d.Err
	}
	head, err := decodeResult(cols)
	if err != nil {
		return nil, err
	}
	if len(head.Rows) != 0 {
		return nil, fmt.Errorf("%w: membership columns hold rows", errCorruptResult)
	}
	m := &memberList{fields: head.Fields}
	nk := d.Count("keys", 1)
	for i := 0; i < nk && d.Err == nil; i++ {
		m.keys = append(m.keys, d.Varint("key"))
	}
	m.bound = decodeBound(&d)
	switch full := d.Byte("full"); {
	case d.Err != nil:
	case full <= 1:
		m.full = full == 1
	default:
		d.Fail("full %d", full)
	}
	m.last = decodeBound(&d)
	if err := d.End(); err != nil {
		return nil, err
	}
	return m, nil
}

// fetchSplit returns tpl's row split when results of tpl can be patched:
// it has exactly one, and that one reads its rows again by key (Fetch).
func fetchSplit(tpl *quma.Template) *quma.RowSplit {
	var out *quma.RowSplit
	for i := range tpl.Deps {
		if s := tpl.Deps[i].Rows; s != nil {
			if out != nil {
				return nil
			}
			out = s
		}
	}
	if out == nil || out.Fetch == "" {
		return nil
	}
	return out
}

// compose puts the rows of fetched (s.Fetch's result for keys, m's keys
// or their first ones) in keys' order, under m's column names. It
// refuses (false) a fetch whose columns are not the membership's (types
// and formats), or that lacks a row of keys, but for rows before the
// first it holds when dropFront (rows a higher bound left out: its
// column orders the membership).
func (m *memberList) compose(fetched *Result, s *quma.RowSplit, keys []int64, dropFront bool) (*Result, bool) {
	if len(fetched.Fields) != len(m.fields) || s.Output >= len(m.fields) {
		return nil, false
	}
	for i, f := range fetched.Fields {
		if f.DataTypeOID != m.fields[i].DataTypeOID || f.Format != m.fields[i].Format {
			return nil, false
		}
	}
	got, ok := fetched.intColumn(s.Output, fetched.Fields[s.Output].Name)
	if !ok {
		return nil, false
	}
	byKey := make(map[int64][][]byte, len(got))
	for i, k := range got {
		byKey[k] = fetched.Rows[i]
	}
	out := &Result{Fields: m.fields, Rows: make([][][]byte, 0, len(keys))}
	for _, k := range keys {
		row, ok := byKey[k]
		switch {
		case ok:
			out.Rows = append(out.Rows, row)
		case !dropFront || len(out.Rows) > 0:
			return nil, false
		}
	}
	return out, true
}

// patchPlan is how a read of a split result may be patched: the split,
// the membership's key and, when it is carried, the read's bound; and
// the membership found.
type patchPlan struct {
	split *quma.RowSplit
	key   []byte
	// bound is the read's bound when the membership is carried (keyed
	// without it, quma.Carry); none otherwise.
	bound    bound
	boundArg any // the bound's parameter as the read has it
	members  *memberList
	// repair: the membership absorbed changes and is repaired (its rows
	// and the changed ones read with Repair.SQL, appended to args as
	// keys) rather than patched.
	repair bool
	args   []any
	// wide is the LIMIT the read's query runs with when its membership
	// is kept wide (quma.Repair.Wide): more rows than the read's LIMIT
	// shows, so that rows leaving it are repaired too; 0 when it is not.
	wide int64
}

// wideRows is the LIMIT a wide read of LIMIT n runs with: twice n, at
// most wideExtra more.
func wideRows(n int64) int64 {
	if n > math.MaxInt64-wideExtra {
		return n // as good as no LIMIT
	}
	return n + min(n, wideExtra)
}

const wideExtra = 100

// carried reports whether the membership is carried (keyed without the
// bound).
func (p *patchPlan) carried() bool { return p.bound.kind != boundNone }

// planPatch makes the plan of a read of tpl (sql with args, in scope),
// the membership looked up; nil when the read cannot be patched.
func (t *ROTx) planPatch(ctx context.Context, tpl *quma.Template, scope, sql string, args []any) *patchPlan {
	s := fetchSplit(tpl)
	if s == nil {
		return nil
	}
	p := &patchPlan{split: s, args: args}
	if c := s.Carry; c != nil && c.Param <= len(args) && (c.Offset == 0 || c.Offset <= len(args) && isZero(args[c.Offset-1])) {
		p.boundArg = args[c.Param-1]
		p.bound, _ = boundOf(p.boundArg) // none when it is not one
	}
	var err error
	if p.carried() {
		rest := append(append([]any(nil), args[:p.split.Carry.Param-1]...), args[p.split.Carry.Param:]...)
		p.key, err = t.c.key(scope+"\nmembership carried", sql, rest)
	} else {
		p.key, err = t.c.key(scope+"\nmembership", sql, args)
	}
	if err != nil {
		return nil // keyed as the result was: not expected
	}
	p.members = t.lookupMembers(ctx, p.key, tpl.ID, func(m *memberList) bool {
		if p.carried() && !m.bound.atMost(p.bound) {
			return false
		}
		// A membership that absorbed changes is of use only repaired.
		return len(m.absorbed) == 0 || p.repairable(m)
	})
	p.repair = p.members != nil && len(p.members.absorbed) > 0
	if r := s.Repair; r != nil && r.Wide != "" && len(args)+1 == r.KeyParam && p.zeroOffset() && !wideOffForTest {
		if n := p.limit(); n > 0 {
			p.wide = wideRows(n)
		}
	}
	return p
}

// zeroOffset reports whether the read's offset (quma.Repair) is 0.
func (p *patchPlan) zeroOffset() bool {
	r := p.split.Repair
	return r.Offset == 0 || r.Offset <= len(p.args) && isZero(p.args[r.Offset-1])
}

// missLoad is the statement a miss runs, and its arguments: the read's
// own (sql with args), or, when the read is wide, the statement with the
// wider LIMIT (quma.Repair.Wide).
func (p *patchPlan) missLoad(sql string, args []any) (string, []any) {
	if p == nil || p.wide == 0 {
		return sql, args
	}
	r := p.split.Repair
	wargs := append(make([]any, 0, len(args)+1), args...)
	if r.WideParam <= len(args) {
		wargs[r.WideParam-1] = p.wide
	} else {
		wargs = append(wargs, p.wide)
	}
	return r.Wide, wargs
}

// missed takes what a miss's load read (missLoad): it returns the read's
// result and the membership to keep (nil when the rows' keys cannot be
// read). A wide read's result is its first n rows; its membership holds
// them all, and is full when they fill the wide LIMIT.
func (p *patchPlan) missed(res *Result) (*Result, *memberList) {
	all := res
	if p.wide > 0 {
		res = firstRows(all, p.limit())
	}
	keys, ok := all.splitKeys(p.split)
	if !ok {
		return res, nil
	}
	m := &memberList{fields: all.Fields, keys: keys, bound: p.bound}
	switch r := p.split.Repair; {
	case p.wide > 0:
		m.full = int64(len(keys)) >= p.wide
	case r != nil && (r.Limit > 0 || r.LimitParam > 0):
		n := p.limit()
		m.full = n <= 0 || int64(len(keys)) >= n
	}
	if m.full && len(keys) > 0 {
		m.last, _ = all.boundAt(len(keys)-1, p.split.Repair.SortOutput)
	}
	return res, m
}

// firstRows is res's first n rows (res itself when it has no more).
func firstRows(res *Result, n int64) *Result {
	if int64(len(res.Rows)) <= n {
		return res
	}
	return &Result{Fields: res.Fields, Rows: res.Rows[:n]}
}

// repairable reports whether membership m, which absorbed changes, can be
// repaired for the read: the template has a Repair, the read's offset is
// 0, and a full result's last sort key is known.
func (p *patchPlan) repairable(m *memberList) bool {
	r := p.split.Repair
	if r == nil || len(p.args)+1 != r.KeyParam {
		return false
	}
	if r.Offset > 0 && (r.Offset > len(p.args) || !isZero(p.args[r.Offset-1])) {
		return false
	}
	return !m.full || m.last.kind != boundNone
}

// limit is the read's LIMIT (quma.Repair): 0 when it has none or it is
// not an integer.
func (p *patchPlan) limit() int64 {
	r := p.split.Repair
	if r == nil {
		return 0
	}
	if r.LimitParam > 0 && r.LimitParam <= len(p.args) {
		b, ok := boundOf(p.args[r.LimitParam-1])
		if !ok || b.kind != boundInt {
			return 0
		}
		return b.v
	}
	return int64(r.Limit)
}

// repairedResult takes the result of a repair (Repair.SQL on the
// membership's rows and the absorbed ones, every row it matches, in
// order): it returns the read's result and the membership to keep, or
// false when the query must run. When the membership held every row the
// query matched (not full), so does the repair. When it was full, a row
// it left out sorts no earlier than its last row, and still does,
// unchanged: only the repair's rows that sort no later than that one
// are known to be the query's first (a tie is broken arbitrarily by
// PostgreSQL too), and they must fill the read's LIMIT.
func (p *patchPlan) repairedResult(res *Result) (*Result, *memberList, bool) {
	m := p.members
	rows := res.Rows
	last := m.last
	if m.full {
		if !repairIgnoresLastForTest {
			rows = rows[:res.rowsAtMost(m.last, p.split.Repair.SortOutput)]
		}
		if n := p.limit(); n <= 0 || int64(len(rows)) < n {
			return nil, nil, false
		}
	}
	known := &Result{Fields: res.Fields, Rows: rows}
	full := m.full
	if p.wide > 0 && int64(len(rows)) > p.wide {
		// Kept to the wide LIMIT: what it leaves out sorts no earlier
		// than its last row.
		known.Rows, full = rows[:p.wide], true
		var ok bool
		if last, ok = known.boundAt(len(known.Rows)-1, p.split.Repair.SortOutput); !ok {
			return nil, nil, false
		}
	}
	keys, ok := known.splitKeys(p.split)
	if !ok {
		return nil, nil, false
	}
	out := known
	if n := p.limit(); n > 0 {
		out = firstRows(known, n)
	}
	return out, &memberList{fields: known.Fields, keys: keys, bound: p.bound, full: full, last: last}, true
}

// rowsAtMost counts r's first rows whose column col sorts no later than
// last (r sorted on it; a NULL or another type ends them).
func (r *Result) rowsAtMost(last bound, col int) int {
	k := 0
	for ; k < len(r.Rows); k++ {
		if b, ok := r.boundAt(k, col); !ok || !b.atMost(last) {
			break
		}
	}
	return k
}

// patchedResult takes the rows a patch read again by key (load): the
// read's result, in the membership's order, or false when the query
// must run. A carried membership may have lost rows at its front to the
// read's higher bound; when it was full (Repair), the rows left must
// still fill the read's LIMIT.
func (p *patchPlan) patchedResult(fetched *Result) (*Result, bool) {
	m := p.members
	dropFront := p.carried() && p.split.Repair != nil
	out, ok := m.compose(fetched, p.split, p.fetchKeys(), dropFront)
	if !ok {
		return nil, false
	}
	if n := p.limit(); n > 0 {
		if m.full && int64(len(out.Rows)) < n && !carryIgnoresFullForTest {
			return nil, false
		}
		out = firstRows(out, n)
	}
	return out, true
}

// fetchKeys are the keys a patch reads again: the membership's, or, for a
// wide read that is not carried, as many as its LIMIT (the rows it
// shows).
func (p *patchPlan) fetchKeys() []int64 {
	if n := p.limit(); p.wide > 0 && !p.carried() && int64(len(p.members.keys)) > n {
		return p.members.keys[:n]
	}
	return p.members.keys
}

// isZero reports whether an offset parameter is the integer 0.
func isZero(a any) bool {
	b, ok := boundOf(a)
	return ok && b.kind == boundInt && b.v == 0
}

// load is the statement that reads the membership's rows again, and its
// arguments: the keys, and a carried membership's bound.
func (p *patchPlan) load() (string, []any) {
	if p.repair {
		keys := p.members.keys
		if !repairIgnoresAbsorbedForTest {
			keys = mergeInts(keys, p.members.absorbed)
		}
		args := append(append(make([]any, 0, len(p.args)+1), p.args...), keys)
		if r := p.split.Repair; r.LimitParam > 0 {
			// LIMIT NULL: every row it matches (a key may match several
			// rows of a join).
			args[r.LimitParam-1] = nil
		}
		return p.split.Repair.SQL, args
	}
	if p.carried() && !carryIgnoresBoundForTest {
		return p.split.Carry.Fetch, []any{p.members.keys, p.boundArg}
	}
	return p.split.Fetch, []any{p.fetchKeys()}
}

// outcome is larder_client_row_patches_total's outcome of a patch made:
// carried (from a lower bound) or patched.
func (p *patchPlan) outcome() string {
	if p.repair {
		return "repaired"
	}
	if p.carried() && p.members.bound.v < p.bound.v {
		return "carried"
	}
	return "patched"
}

// lookupMembers looks for the membership under mkey in the L1, valid at a
// snapshot the transaction can still choose, that usable accepts; found,
// the transaction's candidates are narrowed to it.
func (t *ROTx) lookupMembers(ctx context.Context, mkey []byte, tplID string, usable func(*memberList) bool) *memberList {
	tmin, tmax := t.Range()
	r, err := t.c.l1Lookup(ctx, mkey, tmin, tmax, tplID)
	if err != nil || r.Miss != store.Hit {
		return nil
	}
	m, err := decodeMembers(r.Value)
	if err != nil {
		return nil
	}
	for _, k := range r.Absorbed {
		n, err := strconv.ParseInt(k, 10, 64)
		if err != nil {
			return nil // not an integer key: of no use
		}
		m.absorbed = append(m.absorbed, n)
	}
	if !usable(m) {
		return nil
	}
	if !t.narrow(r.Lo, r.Hi) {
		return nil
	}
	t.trace = append(t.trace, fmt.Sprintf("members[%X,%X)", r.Lo, r.Hi))
	m.lo, m.hi = r.Lo, r.Hi
	return m
}

// putMembers keeps membership m, split with groups (the result's group
// tags, narrowed to the membership columns), in the L1 at the
// transaction's snapshot; a membership of a template that can be repaired
// is kept open across changes that name their rows (absorbs).
func (t *ROTx) putMembers(ctx context.Context, p *patchPlan, m *memberList, groups []quma.QueryTag, tplID string) {
	deps := depsOf(groups)
	if membersForeverForTest {
		deps = nil
	}
	t.c.l1Put(ctx, p.key, t.ts, deps, encodeMembers(m), tplID, p.split.Repair != nil)
}

// mergeInts returns the sorted union of a and b.
func mergeInts(a, b []int64) []int64 {
	out := append(append([]int64(nil), a...), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

// carryIgnoresBoundForTest breaks the client on purpose (a membership
// carried to a higher bound has its rows read again without it) so that
// a test can show that its check notices.
var carryIgnoresBoundForTest bool

// repairIgnoresAbsorbedForTest breaks the client on purpose (a repair
// reads the membership's rows only, not those that changed) so that a
// test can show that its check notices.
var repairIgnoresAbsorbedForTest bool

// repairIgnoresLastForTest breaks the client on purpose (a repair of a
// full membership takes the repair's first rows, even those sorting
// after the membership's last, before which a row it left out may come)
// so that a test can show that its check notices.
var repairIgnoresLastForTest bool

// carryIgnoresFullForTest breaks the client on purpose (a full
// membership carried to a bound that left out rows at its front gives
// the rows left, even too few to fill the read's LIMIT) so that a test
// can show that its check notices.
var carryIgnoresFullForTest bool

// wideOffForTest keeps memberships to the rows a read shows (no wide
// LIMIT), for a test that needs the repair refused when a row leaves.
var wideOffForTest bool

// membersForeverForTest breaks the client on purpose (memberships are
// kept with no tags: nothing ends them) so that a test can show that its
// check notices.
var membersForeverForTest bool
