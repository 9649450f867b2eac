package redisstore

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// u64 is the 8-byte big-endian form of a timestamp, as the scripts store
// and compare it.
func u64(x uint64) []byte { return binary.BigEndian.AppendUint64(nil, x) }

func parseU64(s string) (uint64, error) {
	if len(s) != 8 {
		return 0, fmt.Errorf("redisstore: a timestamp of %d bytes", len(s))
	}
	return binary.BigEndian.Uint64([]byte(s)), nil
}

// Entry flags.
const (
	flagPending = 1
	flagSettled = 2 // out of the index sets: no invalidation can change it
)

// encodeEntry is a version's directory entry: lo, hi, flags, size (4
// bytes: v.Size for the key, saturated), then each dependency as
// allColumns(1) tag table nreads(2) reads, every string prefixed with its
// 2-byte length. The value is stored apart.
func encodeEntry(v *store.Version, keyLen int) ([]byte, error) {
	n := 21
	for _, d := range v.Deps {
		n += 7 + len(d.Tag) + len(d.Table)
		for _, r := range d.Reads {
			n += 2 + len(r)
		}
	}
	b := make([]byte, 0, n)
	b = binary.BigEndian.AppendUint64(b, v.Lo)
	b = binary.BigEndian.AppendUint64(b, v.Hi)
	var flags byte
	if v.Pending {
		flags |= flagPending
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint32(b, uint32(min(v.Size(keyLen), math.MaxUint32)))
	for _, d := range v.Deps {
		all := byte(0)
		if d.AllColumns {
			all = 1
		}
		b = append(b, all)
		var err error
		if b, err = appendString(b, d.Tag); err != nil {
			return nil, err
		}
		if b, err = appendString(b, d.Table); err != nil {
			return nil, err
		}
		if len(d.Reads) > math.MaxUint16 {
			return nil, fmt.Errorf("redisstore: %d columns read from %s", len(d.Reads), d.Table)
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(d.Reads)))
		for _, r := range d.Reads {
			if b, err = appendString(b, r); err != nil {
				return nil, err
			}
		}
	}
	return b, nil
}

func appendString(b []byte, s string) ([]byte, error) {
	if len(s) > math.MaxUint16 {
		return nil, fmt.Errorf("redisstore: a name of %d bytes (at most %d)", len(s), math.MaxUint16)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...), nil
}

// Change flags as the invalidate script reads them.
const (
	changeFlush      = 1
	changeRows       = 2
	changeAllColumns = 4
)

// changeArgs appends one change's arguments for the invalidate script.
func changeArgs(args []any, c *invalidation.Change) []any {
	f := 0
	if c.Flush {
		f |= changeFlush
	}
	if c.Rows {
		f |= changeRows
	}
	if c.AllColumns {
		f |= changeAllColumns
	}
	args = append(args, f, c.Tag, len(c.Columns))
	for _, col := range c.Columns {
		args = append(args, col)
	}
	return args
}
