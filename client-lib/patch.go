package larder

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

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

// memberList is a split result's membership: its columns and its rows'
// keys in order.
type memberList struct {
	fields []pgconn.FieldDescription
	keys   []int64
	// lo, hi: the timestamps it holds at, as the lookup served it.
	lo, hi uint64
}

// holds reports whether the membership holds at timestamp ts.
func (m *memberList) holds(ts uint64) bool { return m.lo <= ts && ts < m.hi }

// membersVersion is the first byte of an encoded memberList.
const membersVersion = 1

// encodeMembers encodes a membership: version, the columns (a Result
// without rows, encoded), the number of keys, then each key (a varint).
func encodeMembers(fields []pgconn.FieldDescription, keys []int64) []byte {
	head := (&Result{Fields: fields}).encode(nil)
	dst := make([]byte, 0, 1+binary.MaxVarintLen64+len(head)+binary.MaxVarintLen64*(1+len(keys)))
	dst = append(dst, membersVersion)
	dst = wire.AppendBytes(dst, head)
	dst = binary.AppendUvarint(dst, uint64(len(keys)))
	for _, k := range keys {
		dst = binary.AppendVarint(dst, k)
	}
	return dst
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

// compose puts the rows of fetched (s.Fetch's result) in m's order, under
// m's column names. It refuses (false) a fetch whose columns are not the
// membership's (types and formats), or that lacks a row m holds.
func (m *memberList) compose(fetched *Result, s *quma.RowSplit) (*Result, bool) {
	if len(fetched.Fields) != len(m.fields) || s.Output >= len(m.fields) {
		return nil, false
	}
	for i, f := range fetched.Fields {
		if f.DataTypeOID != m.fields[i].DataTypeOID || f.Format != m.fields[i].Format {
			return nil, false
		}
	}
	keys, ok := fetched.intColumn(s.Output, fetched.Fields[s.Output].Name)
	if !ok {
		return nil, false
	}
	byKey := make(map[int64][][]byte, len(keys))
	for i, k := range keys {
		byKey[k] = fetched.Rows[i]
	}
	out := &Result{Fields: m.fields, Rows: make([][][]byte, len(m.keys))}
	for i, k := range m.keys {
		row, ok := byKey[k]
		if !ok {
			return nil, false
		}
		out.Rows[i] = row
	}
	return out, true
}

// membersKey keys the membership of the result keyed key (scope, sql and
// args as for Client.key); it cannot collide with a result's key.
func (c *Client) membersKey(scope, sql string, args []any) ([]byte, error) {
	return c.key(scope+"\nmembership", sql, args)
}

// lookupMembers looks for the membership under mkey in the L1, valid at a
// snapshot the transaction can still choose; found, the transaction's
// candidates are narrowed to it.
func (t *ROTx) lookupMembers(ctx context.Context, mkey []byte, tplID string) *memberList {
	tmin, tmax := t.Range()
	r, err := t.c.l1Lookup(ctx, mkey, tmin, tmax, tplID)
	if err != nil || r.Miss != store.Hit {
		return nil
	}
	m, err := decodeMembers(r.Value)
	if err != nil {
		return nil
	}
	if !t.narrow(r.Lo, r.Hi) {
		return nil
	}
	t.trace = append(t.trace, fmt.Sprintf("members[%X,%X)", r.Lo, r.Hi))
	m.lo, m.hi = r.Lo, r.Hi
	return m
}

// putMembers keeps the membership of res, split with groups (the result's
// group tags, narrowed to the membership columns), in the L1 at snapshot.
func (t *ROTx) putMembers(ctx context.Context, mkey []byte, s *quma.RowSplit, res *Result, groups []quma.QueryTag, tplID string) {
	keys, ok := res.splitKeys(s)
	if !ok {
		return
	}
	deps := depsOf(groups)
	if membersForeverForTest {
		deps = nil
	}
	t.c.l1Put(ctx, mkey, t.ts, deps, encodeMembers(res.Fields, keys), tplID)
}

// membersForeverForTest breaks the client on purpose (memberships are
// kept with no tags: nothing ends them) so that a test can show that its
// check notices.
var membersForeverForTest bool
