package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/larderdb/larder/cache-node/store"
)

// Version is the protocol version carried by every frame.
const Version = 1

// Operations (requests) and their responses.
const (
	OpLookup byte = 1
	OpPut    byte = 2
	OpStats  byte = 3
	OpError  byte = 0x7f // response only: the request failed
)

// DefaultMaxFrame bounds a frame; larger ones are refused and the
// connection closed.
const DefaultMaxFrame = 64 << 20

// ErrFrame marks a malformed frame.
var ErrFrame = errors.New("protocol: malformed frame")

// LookupRequest asks for a version of Key valid somewhere in [TMin, TMax].
type LookupRequest struct {
	Key        []byte
	TMin, TMax uint64
	Template   string
}

// LookupResponse is store.Result on the wire.
type LookupResponse = store.Result

// PutRequest stores a result computed at Snapshot.
type PutRequest struct {
	Key      []byte
	Snapshot uint64
	Deps     []store.Dep
	Template string
	Value    []byte
}

// StatsResponse is what a node reports about itself.
type StatsResponse struct {
	Watermark                                uint64
	Keys, Versions, Bytes, Budget, Evictions int64
}

// Frame layout: uint32 big-endian length of what follows, then a version
// byte, an op byte and the body. Bodies use uvarints, and byte strings
// are a uvarint length and the bytes.

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, op byte, body []byte) error {
	hdr := make([]byte, 6, 6+len(body))
	binary.BigEndian.PutUint32(hdr, uint32(2+len(body)))
	hdr[4], hdr[5] = Version, op
	_, err := w.Write(append(hdr, body...))
	return err
}

// ReadFrame reads one frame of at most max bytes into buf (grown as
// needed) and returns its op and body.
func ReadFrame(r io.Reader, buf []byte, max int) (op byte, body, newBuf []byte, err error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, buf, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if n < 2 || n > max {
		return 0, nil, buf, fmt.Errorf("%w: length %d (limit %d)", ErrFrame, n, max)
	}
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, buf, err
	}
	if buf[0] != Version {
		return 0, nil, buf, fmt.Errorf("%w: version %d (this build speaks %d)", ErrFrame, buf[0], Version)
	}
	return buf[1], buf[2:], buf, nil
}

// AppendLookup encodes a lookup request.
func AppendLookup(dst []byte, q *LookupRequest) []byte {
	dst = appendBytes(dst, q.Key)
	dst = binary.AppendUvarint(dst, q.TMin)
	dst = binary.AppendUvarint(dst, q.TMax)
	return appendBytes(dst, []byte(q.Template))
}

// DecodeLookup decodes a lookup request.
func DecodeLookup(b []byte) (LookupRequest, error) {
	d := decoder{b: b}
	q := LookupRequest{Key: d.bytes("key"), TMin: d.uvarint("tmin"), TMax: d.uvarint("tmax"), Template: d.str("template")}
	if d.err == nil && q.TMin > q.TMax {
		d.fail("tmin %d > tmax %d", q.TMin, q.TMax)
	}
	return q, d.end()
}

// AppendLookupResponse encodes a lookup answer.
func AppendLookupResponse(dst []byte, r *LookupResponse) []byte {
	dst = append(dst, byte(r.Miss))
	if r.Miss != store.Hit {
		return dst
	}
	open := byte(0)
	if r.Open {
		open = 1
	}
	dst = append(dst, open)
	dst = binary.AppendUvarint(dst, r.Lo)
	dst = binary.AppendUvarint(dst, r.Hi)
	dst = binary.AppendUvarint(dst, r.Snapshot)
	return appendBytes(dst, r.Value)
}

// DecodeLookupResponse decodes a lookup answer.
func DecodeLookupResponse(b []byte) (LookupResponse, error) {
	d := decoder{b: b}
	var r LookupResponse
	r.Miss = store.MissClass(d.byte("result"))
	if d.err == nil && r.Miss > store.MissConsistency {
		d.fail("unknown result %d", r.Miss)
	}
	if d.err == nil && r.Miss == store.Hit {
		switch d.byte("open") {
		case 0:
		case 1:
			r.Open = true
		default:
			d.fail("bad open flag")
		}
		r.Lo, r.Hi, r.Snapshot = d.uvarint("lo"), d.uvarint("hi"), d.uvarint("snapshot")
		r.Value = d.bytes("value")
	}
	return r, d.end()
}

// AppendPut encodes a put request.
func AppendPut(dst []byte, p *PutRequest) []byte {
	dst = appendBytes(dst, p.Key)
	dst = binary.AppendUvarint(dst, p.Snapshot)
	dst = binary.AppendUvarint(dst, uint64(len(p.Deps)))
	for _, dep := range p.Deps {
		dst = appendBytes(dst, []byte(dep.Tag))
		dst = appendBytes(dst, []byte(dep.Table))
		all := byte(0)
		if dep.AllColumns {
			all = 1
		}
		dst = append(dst, all)
		dst = binary.AppendUvarint(dst, uint64(len(dep.Reads)))
		for _, r := range dep.Reads {
			dst = appendBytes(dst, []byte(r))
		}
	}
	dst = appendBytes(dst, []byte(p.Template))
	return appendBytes(dst, p.Value)
}

// DecodePut decodes a put request.
func DecodePut(b []byte) (PutRequest, error) {
	d := decoder{b: b}
	var p PutRequest
	p.Key = d.bytes("key")
	p.Snapshot = d.uvarint("snapshot")
	n := d.count("deps", 4)
	for i := 0; i < n && d.err == nil; i++ {
		var dep store.Dep
		dep.Tag, dep.Table = d.str("tag"), d.str("table")
		switch d.byte("all columns") {
		case 0:
		case 1:
			dep.AllColumns = true
		default:
			d.fail("bad all-columns flag")
		}
		m := d.count("reads", 1)
		for j := 0; j < m && d.err == nil; j++ {
			col := d.str("read column")
			if j > 0 && col <= dep.Reads[j-1] {
				d.fail("read columns not sorted and distinct")
			}
			dep.Reads = append(dep.Reads, col)
		}
		if d.err == nil && (dep.Tag == "" || dep.Table == "") {
			d.fail("dependency %d without a tag or table", i)
		}
		p.Deps = append(p.Deps, dep)
	}
	p.Template = d.str("template")
	p.Value = d.bytes("value")
	if d.err == nil && p.Snapshot == 0 {
		d.fail("snapshot 0")
	}
	return p, d.end()
}

// AppendStatsResponse encodes a stats answer.
func AppendStatsResponse(dst []byte, s *StatsResponse) []byte {
	dst = binary.AppendUvarint(dst, s.Watermark)
	for _, v := range []int64{s.Keys, s.Versions, s.Bytes, s.Budget, s.Evictions} {
		dst = binary.AppendVarint(dst, v)
	}
	return dst
}

// DecodeStatsResponse decodes a stats answer.
func DecodeStatsResponse(b []byte) (StatsResponse, error) {
	d := decoder{b: b}
	s := StatsResponse{Watermark: d.uvarint("watermark")}
	for _, p := range []*int64{&s.Keys, &s.Versions, &s.Bytes, &s.Budget, &s.Evictions} {
		*p = d.varint("counter")
	}
	return s, d.end()
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrFrame, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) end() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return d.err
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad %s", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte(what string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("missing %s", what)
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) count(what string, min int) int {
	n := d.uvarint(what)
	if d.err == nil && n > uint64(len(d.b)/min) {
		d.fail("%d %s cannot fit in %d bytes", n, what, len(d.b))
		return 0
	}
	return int(n)
}

func (d *decoder) bytes(what string) []byte {
	n := d.uvarint(what + " length")
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("%s of %d bytes in %d", what, n, len(d.b))
		return nil
	}
	b := d.b[:n:n]
	d.b = d.b[n:]
	return b
}

func (d *decoder) str(what string) string {
	b := d.bytes(what)
	if d.err == nil && !utf8.Valid(b) {
		d.fail("%s is not UTF-8", what)
	}
	return string(b)
}
