package wire

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// Decoder reads from B; the first failure is kept in Err (wrapping Wrap)
// and makes every later read return a zero value.
type Decoder struct {
	B    []byte
	Err  error
	Wrap error // the sentinel every error wraps
}

// Fail records an error unless one is recorded already.
func (d *Decoder) Fail(format string, args ...any) {
	if d.Err == nil {
		d.Err = fmt.Errorf("%w: %s", d.Wrap, fmt.Sprintf(format, args...))
	}
}

// End fails when bytes are left and returns the error.
func (d *Decoder) End() error {
	if d.Err == nil && len(d.B) > 0 {
		d.Fail("%d trailing bytes", len(d.B))
	}
	return d.Err
}

// Uvarint reads an unsigned varint.
func (d *Decoder) Uvarint(what string) uint64 {
	if d.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.B)
	if n <= 0 {
		d.Fail("bad %s", what)
		return 0
	}
	d.B = d.B[n:]
	return v
}

// Varint reads a signed (zigzag) varint.
func (d *Decoder) Varint(what string) int64 {
	if d.Err != nil {
		return 0
	}
	v, n := binary.Varint(d.B)
	if n <= 0 {
		d.Fail("bad %s", what)
		return 0
	}
	d.B = d.B[n:]
	return v
}

// Byte reads one byte.
func (d *Decoder) Byte(what string) byte {
	if d.Err != nil {
		return 0
	}
	if len(d.B) == 0 {
		d.Fail("missing %s", what)
		return 0
	}
	c := d.B[0]
	d.B = d.B[1:]
	return c
}

// Count reads a count of items each at least min bytes long and fails
// when they cannot fit in what is left.
func (d *Decoder) Count(what string, min int) int {
	n := d.Uvarint(what)
	if d.Err == nil && n > uint64(len(d.B)/min) {
		d.Fail("%d %s cannot fit in %d bytes", n, what, len(d.B))
		return 0
	}
	return int(n)
}

// Bytes reads a varint length and that many bytes (aliasing B).
func (d *Decoder) Bytes(what string) []byte {
	n := d.Uvarint(what + " length")
	if d.Err != nil {
		return nil
	}
	if n > uint64(len(d.B)) {
		d.Fail("%s of %d bytes in %d", what, n, len(d.B))
		return nil
	}
	b := d.B[:n:n]
	d.B = d.B[n:]
	return b
}

// String reads a varint length and that many bytes of UTF-8.
func (d *Decoder) String(what string) string {
	b := d.Bytes(what)
	if d.Err == nil && !utf8.Valid(b) {
		d.Fail("%s is not UTF-8", what)
		return ""
	}
	return string(b)
}

// AppendBytes appends a varint length and b.
func AppendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// AppendString appends a varint length and s.
func AppendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}
