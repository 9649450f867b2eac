package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/wire"
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
	// Wait, when positive, lets the node hold a lookup that misses while
	// another requester loads the key (its load lease), up to Wait, and
	// answer it after that load's put (on the wire in whole microseconds,
	// at most MaxLookupWait; absent when zero, so that a request without
	// it is the same bytes as before).
	Wait time.Duration
}

// MaxLookupWait bounds LookupRequest.Wait: a longer one is read as this.
const MaxLookupWait = 10 * time.Second

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

// WriteFrame writes one frame: the header, then the body, without
// copying it (w is usually a *bufio.Writer).
func WriteFrame(w io.Writer, op byte, body []byte) error {
	var hdr [6]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(2+len(body)))
	hdr[4], hdr[5] = Version, op
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if len(body) == 0 {
		return nil
	}
	_, err := w.Write(body)
	return err
}

// frameChunk is the most a frame reader allocates ahead of the bytes that
// have arrived: a frame's buffer grows (doubling, from frameChunk) as its
// body does, so a peer that declares a large frame and sends little of it
// costs little.
const frameChunk = 64 << 10

// errTooLarge marks a frame longer than the limit.
var errTooLarge = fmt.Errorf("%w: frame too large", ErrFrame)

// ReadFrame reads one frame of at most max bytes into buf (grown as its
// bytes arrive) and returns its op and body. A frame cut short is
// io.ErrUnexpectedEOF; io.EOF means no frame began.
func ReadFrame(r io.Reader, buf []byte, max int) (op byte, body, newBuf []byte, err error) {
	n, err := readLength(r, max)
	if err != nil {
		return 0, nil, buf, err
	}
	return readBody(r, buf, n)
}

// readLength reads a frame header: the length of the rest, checked
// against max.
func readLength(r io.Reader, max int) (int, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 2 {
		return 0, fmt.Errorf("%w: length %d", ErrFrame, n)
	}
	if uint64(n) > uint64(max) {
		return 0, fmt.Errorf("%w: length %d (limit %d)", errTooLarge, n, max)
	}
	return int(n), nil
}

// readBody reads the n bytes after a frame header into buf, growing it
// only as bytes arrive.
func readBody(r io.Reader, buf []byte, n int) (op byte, body, newBuf []byte, err error) {
	if cap(buf) >= n {
		buf = buf[:n]
		if _, err := io.ReadFull(r, buf); err != nil {
			return 0, nil, buf[:0], truncated(err)
		}
	} else {
		buf = buf[:0]
		for len(buf) < n {
			if len(buf) == cap(buf) {
				grown := make([]byte, len(buf), min(n, max(frameChunk, 2*len(buf))))
				copy(grown, buf)
				buf = grown
			}
			m, err := io.ReadFull(r, buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+m]
			if err != nil {
				return 0, nil, buf[:0], truncated(err)
			}
		}
	}
	if buf[0] != Version {
		return 0, nil, buf, fmt.Errorf("%w: version %d (this build speaks %d)", ErrFrame, buf[0], Version)
	}
	return buf[1], buf[2:], buf, nil
}

// truncated: after a frame's header, the end of the stream is unexpected.
func truncated(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// AppendLookup encodes a lookup request.
func AppendLookup(dst []byte, q *LookupRequest) []byte {
	dst = wire.AppendBytes(dst, q.Key)
	dst = binary.AppendUvarint(dst, q.TMin)
	dst = binary.AppendUvarint(dst, q.TMax)
	dst = wire.AppendBytes(dst, []byte(q.Template))
	if us := min(q.Wait, MaxLookupWait) / time.Microsecond; us > 0 {
		dst = binary.AppendUvarint(dst, uint64(us))
	}
	return dst
}

// DecodeLookup decodes a lookup request.
func DecodeLookup(b []byte) (LookupRequest, error) {
	d := wire.Decoder{B: b, Wrap: ErrFrame}
	q := LookupRequest{Key: d.Bytes("key"), TMin: d.Uvarint("tmin"), TMax: d.Uvarint("tmax"), Template: d.String("template")}
	if d.Err == nil && len(d.B) > 0 {
		us := min(d.Uvarint("wait"), uint64(MaxLookupWait/time.Microsecond))
		q.Wait = time.Duration(us) * time.Microsecond
	}
	if d.Err == nil && q.TMin > q.TMax {
		d.Fail("tmin %d > tmax %d", q.TMin, q.TMax)
	}
	return q, d.End()
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
	return wire.AppendBytes(dst, r.Value)
}

// DecodeLookupResponse decodes a lookup answer.
func DecodeLookupResponse(b []byte) (LookupResponse, error) {
	d := wire.Decoder{B: b, Wrap: ErrFrame}
	var r LookupResponse
	r.Miss = store.MissClass(d.Byte("result"))
	if d.Err == nil && r.Miss > store.MissConsistency {
		d.Fail("unknown result %d", r.Miss)
	}
	if d.Err == nil && r.Miss == store.Hit {
		switch d.Byte("open") {
		case 0:
		case 1:
			r.Open = true
		default:
			d.Fail("bad open flag")
		}
		r.Lo, r.Hi, r.Snapshot = d.Uvarint("lo"), d.Uvarint("hi"), d.Uvarint("snapshot")
		r.Value = d.Bytes("value")
	}
	return r, d.End()
}

// AppendPut encodes a put request.
func AppendPut(dst []byte, p *PutRequest) []byte {
	dst = wire.AppendBytes(dst, p.Key)
	dst = binary.AppendUvarint(dst, p.Snapshot)
	dst = binary.AppendUvarint(dst, uint64(len(p.Deps)))
	for _, dep := range p.Deps {
		dst = wire.AppendBytes(dst, []byte(dep.Tag))
		dst = wire.AppendBytes(dst, []byte(dep.Table))
		all := byte(0)
		if dep.AllColumns {
			all = 1
		}
		dst = append(dst, all)
		dst = binary.AppendUvarint(dst, uint64(len(dep.Reads)))
		for _, r := range dep.Reads {
			dst = wire.AppendBytes(dst, []byte(r))
		}
	}
	dst = wire.AppendBytes(dst, []byte(p.Template))
	return wire.AppendBytes(dst, p.Value)
}

// DecodePut decodes a put request.
func DecodePut(b []byte) (PutRequest, error) {
	d := wire.Decoder{B: b, Wrap: ErrFrame}
	var p PutRequest
	p.Key = d.Bytes("key")
	p.Snapshot = d.Uvarint("snapshot")
	n := d.Count("deps", 4)
	for i := 0; i < n && d.Err == nil; i++ {
		var dep store.Dep
		dep.Tag, dep.Table = d.String("tag"), d.String("table")
		switch d.Byte("all columns") {
		case 0:
		case 1:
			dep.AllColumns = true
		default:
			d.Fail("bad all-columns flag")
		}
		m := d.Count("reads", 1)
		for j := 0; j < m && d.Err == nil; j++ {
			col := d.String("read column")
			if j > 0 && col <= dep.Reads[j-1] {
				d.Fail("read columns not sorted and distinct")
			}
			dep.Reads = append(dep.Reads, col)
		}
		if d.Err == nil && (dep.Tag == "" || dep.Table == "") {
			d.Fail("dependency %d without a tag or table", i)
		}
		p.Deps = append(p.Deps, dep)
	}
	p.Template = d.String("template")
	p.Value = d.Bytes("value")
	if d.Err == nil && p.Snapshot == 0 {
		d.Fail("snapshot 0")
	}
	return p, d.End()
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
	d := wire.Decoder{B: b, Wrap: ErrFrame}
	s := StatsResponse{Watermark: d.Uvarint("watermark")}
	for _, p := range []*int64{&s.Keys, &s.Versions, &s.Bytes, &s.Budget, &s.Evictions} {
		*p = d.Varint("counter")
	}
	return s, d.End()
}
