package invalidation

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/larderdb/larder/internal/wire"
)

// Version is the format version this package writes and reads.
const Version = 1

// Message kinds (the second byte).
const (
	kindTxn       = 1
	kindHeartbeat = 2
)

// Change flag bits.
const (
	flagRows       = 1 << 0
	flagAllColumns = 1 << 1
	flagFlush      = 1 << 2
	flagKeys       = 1 << 3
	knownFlags     = flagRows | flagAllColumns | flagFlush | flagKeys
)

// MaxKeys bounds Change.Keys: a change of more rows of one group carries
// none (a client then treats it as any change).
const MaxKeys = 32

// MaxMessageSize bounds an encoded message; NATS's default payload limit
// is 1 MiB. A message of the invalidator that would exceed it (or the
// server's payload limit) is not sent: the tables it names are flushed at
// its commit instead.
const MaxMessageSize = 1 << 20

// Change is what one committed transaction did to one tag.
type Change struct {
	// Tag is the canonical tag name (internal/tags); for a flush, the
	// schema-qualified table name.
	Tag string
	// Flush: every cached result that depends on the table in any way is
	// invalid (TRUNCATE, a schema change, a row whose old key could not be
	// known).
	Flush bool
	// Rows: a row entered or left the tag's group (INSERT, DELETE, an
	// UPDATE that changed the key). It hits every result holding the tag,
	// even one that reads no column (count(*)).
	Rows bool
	// AllColumns: an UPDATE kept the row in the group but which columns
	// changed is unknown (the table's replica identity is not FULL).
	AllColumns bool
	// Columns lists, sorted, the columns an UPDATE changed while the row
	// stayed in the group.
	Columns []string
	// Keys, when not nil, are the primary keys (as text, sorted and
	// distinct) of every row whose change of the tag's table this is: a
	// client holding which rows a result holds (client-lib's patched
	// results) reads those rows again instead of the query. nil: not
	// known (a change through a referenced table, a flush, more than
	// MaxKeys rows).
	Keys []string
}

// Hits reports whether c invalidates a result that holds c's tag and reads
// the columns reads (allColumns: every column, e.g. SELECT *). A flush is
// matched by table, not by tag: see HitsTable.
func (c *Change) Hits(reads []string, allColumns bool) bool {
	if c.Flush || c.Rows || c.AllColumns {
		return true
	}
	if allColumns {
		return len(c.Columns) > 0
	}
	for _, col := range reads {
		i := sort.SearchStrings(c.Columns, col)
		if i < len(c.Columns) && c.Columns[i] == col {
			return true
		}
	}
	return false
}

// Merge adds o (a change to the same tag) to c.
func (c *Change) Merge(o Change) {
	if c.Keys != nil && o.Keys != nil {
		c.Keys = MergeKeys(c.Keys, o.Keys)
	} else {
		c.Keys = nil
	}
	c.Flush = c.Flush || o.Flush
	c.Rows = c.Rows || o.Rows
	c.AllColumns = c.AllColumns || o.AllColumns
	if len(o.Columns) == 0 {
		return
	}
	seen := make(map[string]bool, len(c.Columns)+len(o.Columns))
	for _, s := range c.Columns {
		seen[s] = true
	}
	for _, s := range o.Columns {
		if !seen[s] {
			seen[s] = true
			c.Columns = append(c.Columns, s)
		}
	}
	sort.Strings(c.Columns)
}

// MergeKeys returns the sorted union of two sorted key lists; nil when it
// holds more than MaxKeys.
func MergeKeys(a, b []string) []string {
	out := make([]string, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || i < len(a) && a[i] < b[j]:
			out = append(out, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	if len(out) > MaxKeys {
		return nil
	}
	return out
}

// Txn is the invalidation message of one committed transaction, or of the
// part of it that travels on one subject.
type Txn struct {
	CommitLSN  uint64    // the commit record's LSN: the transaction's timestamp
	EndLSN     uint64    // the end of the commit record
	XID        uint32    // the transaction id
	CommitTime time.Time // as PostgreSQL recorded it (microseconds)
	Changes    []Change
}

// Heartbeat says that every transaction with a commit LSN <= LSN has been
// published (and acknowledged by JetStream) before it.
type Heartbeat struct {
	LSN  uint64
	Time time.Time // the invalidator's clock when it was published
}

// AppendTxn appends the encoding of t to dst.
func AppendTxn(dst []byte, t *Txn) []byte {
	dst = append(dst, Version, kindTxn)
	dst = binary.AppendUvarint(dst, t.CommitLSN)
	dst = binary.AppendUvarint(dst, t.EndLSN)
	dst = binary.AppendUvarint(dst, uint64(t.XID))
	dst = binary.AppendVarint(dst, t.CommitTime.UnixMicro())
	dst = binary.AppendUvarint(dst, uint64(len(t.Changes)))
	for i := range t.Changes {
		c := &t.Changes[i]
		var f byte
		if c.Rows {
			f |= flagRows
		}
		if c.AllColumns {
			f |= flagAllColumns
		}
		if c.Flush {
			f |= flagFlush
		}
		if len(c.Keys) > 0 {
			f |= flagKeys
		}
		dst = append(dst, f)
		dst = wire.AppendString(dst, c.Tag)
		dst = binary.AppendUvarint(dst, uint64(len(c.Columns)))
		for _, col := range c.Columns {
			dst = wire.AppendString(dst, col)
		}
		if len(c.Keys) > 0 {
			dst = binary.AppendUvarint(dst, uint64(len(c.Keys)))
			for _, k := range c.Keys {
				dst = wire.AppendString(dst, k)
			}
		}
	}
	return dst
}

// AppendHeartbeat appends the encoding of h to dst.
func AppendHeartbeat(dst []byte, h Heartbeat) []byte {
	dst = append(dst, Version, kindHeartbeat)
	dst = binary.AppendUvarint(dst, h.LSN)
	return binary.AppendVarint(dst, h.Time.UnixMicro())
}

// Errors of the decoders.
var (
	ErrVersion = errors.New("invalidation: unknown message format version")
	ErrKind    = errors.New("invalidation: unexpected message kind")
	ErrCorrupt = errors.New("invalidation: corrupt message")
)

// Message is a decoded message: exactly one of Txn and Heartbeat is set.
type Message struct {
	Txn       *Txn
	Heartbeat *Heartbeat
}

// LSN is the message's position in time: the commit LSN of a transaction
// or the LSN of a heartbeat.
func (m Message) LSN() uint64 {
	if m.Txn != nil {
		return m.Txn.CommitLSN
	}
	if m.Heartbeat != nil {
		return m.Heartbeat.LSN
	}
	return 0
}

// Decode decodes a transaction or heartbeat message.
func Decode(b []byte) (Message, error) {
	if len(b) < 2 {
		return Message{}, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(b))
	}
	if len(b) > MaxMessageSize {
		return Message{}, fmt.Errorf("%w: %d bytes is over the %d limit", ErrCorrupt, len(b), MaxMessageSize)
	}
	if b[0] != Version {
		return Message{}, fmt.Errorf("%w %d (this build reads %d)", ErrVersion, b[0], Version)
	}
	d := wire.Decoder{B: b[2:], Wrap: ErrCorrupt}
	switch b[1] {
	case kindTxn:
		t := &Txn{}
		t.CommitLSN = d.Uvarint("commit LSN")
		t.EndLSN = d.Uvarint("end LSN")
		xid := d.Uvarint("xid")
		if xid > 1<<32-1 {
			d.Fail("xid %d out of range", xid)
		}
		t.XID = uint32(xid)
		t.CommitTime = time.UnixMicro(d.Varint("commit time"))
		n := d.Count("changes", 3)
		if d.Err == nil && n > 0 {
			t.Changes = make([]Change, 0, n)
		}
		for i := 0; i < n && d.Err == nil; i++ {
			var c Change
			f := d.Byte("flags")
			if f&^knownFlags != 0 {
				d.Fail("change %d: unknown flags %#x", i, f)
			}
			c.Rows, c.AllColumns, c.Flush = f&flagRows != 0, f&flagAllColumns != 0, f&flagFlush != 0
			c.Tag = d.String("tag")
			if d.Err == nil && c.Tag == "" {
				d.Fail("change %d: empty tag", i)
			}
			nc := d.Count("columns", 1)
			for j := 0; j < nc && d.Err == nil; j++ {
				col := d.String("column")
				if d.Err == nil && j > 0 && col <= c.Columns[j-1] {
					d.Fail("change %d: columns not sorted and distinct", i)
				}
				c.Columns = append(c.Columns, col)
			}
			if f&flagKeys != 0 && d.Err == nil {
				nk := d.Count("keys", 1)
				if d.Err == nil && (nk == 0 || nk > MaxKeys) {
					d.Fail("change %d: %d keys", i, nk)
				}
				for j := 0; j < nk && d.Err == nil; j++ {
					k := d.String("key")
					if d.Err == nil && j > 0 && k <= c.Keys[j-1] {
						d.Fail("change %d: keys not sorted and distinct", i)
					}
					c.Keys = append(c.Keys, k)
				}
			}
			t.Changes = append(t.Changes, c)
		}
		if d.Err == nil && len(d.B) != 0 {
			d.Fail("%d trailing bytes", len(d.B))
		}
		if d.Err != nil {
			return Message{}, d.Err
		}
		return Message{Txn: t}, nil
	case kindHeartbeat:
		h := &Heartbeat{LSN: d.Uvarint("LSN"), Time: time.UnixMicro(d.Varint("time"))}
		if d.Err == nil && len(d.B) != 0 {
			d.Fail("%d trailing bytes", len(d.B))
		}
		if d.Err != nil {
			return Message{}, d.Err
		}
		return Message{Heartbeat: h}, nil
	}
	return Message{}, fmt.Errorf("%w %d", ErrKind, b[1])
}
