package pgfront

import (
	"encoding/binary"
	"fmt"
	"io"
)

// headerLen is a protocol message's header: its type byte and its length
// (which counts itself, not the type byte).
const headerLen = 5

// maxInspected bounds the messages the relay reads whole to look into
// (ReadyForQuery, ErrorResponse, ParameterStatus, the copy responses);
// others of any size are passed on in pieces.
const maxInspected = 64 << 20

// frameReader splits the byte stream PostgreSQL sends into messages
// without decoding them, so that the relay passes each on byte for byte.
// Data it has read stays buffered across errors: a read interrupted by a
// deadline is resumed where it stopped. Not safe for concurrent use.
type frameReader struct {
	r      io.Reader
	buf    []byte
	rp, wp int // unread data is buf[rp:wp]
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{r: r, buf: make([]byte, 32<<10)}
}

// buffered is how many bytes are read and not yet consumed.
func (f *frameReader) buffered() int { return f.wp - f.rp }

// fill reads until at least n bytes are buffered.
func (f *frameReader) fill(n int) error {
	if f.buffered() >= n {
		return nil
	}
	if f.rp > 0 && f.rp+n > len(f.buf) {
		copy(f.buf, f.buf[f.rp:f.wp])
		f.wp -= f.rp
		f.rp = 0
	}
	if n > len(f.buf) {
		grown := make([]byte, max(n, 2*len(f.buf)))
		copy(grown, f.buf[f.rp:f.wp])
		f.wp -= f.rp
		f.rp = 0
		f.buf = grown
	}
	for f.buffered() < n {
		m, err := f.r.Read(f.buf[f.wp:])
		f.wp += m
		if err != nil {
			if f.buffered() >= n {
				return nil
			}
			return err
		}
	}
	return nil
}

// header reads the next message's header without consuming it: its type
// and body length.
func (f *frameReader) header() (byte, int, error) {
	if err := f.fill(headerLen); err != nil {
		return 0, 0, err
	}
	h := f.buf[f.rp : f.rp+headerLen]
	n := int(int32(binary.BigEndian.Uint32(h[1:])))
	if n < 4 {
		return 0, 0, fmt.Errorf("pgfront: PostgreSQL sent a message %q of length %d", h[0], n)
	}
	return h[0], n - 4, nil
}

// whole returns the next message, header included, of body length n; it
// stays valid until the next call. The caller consumes it.
func (f *frameReader) whole(n int) ([]byte, error) {
	if n > maxInspected {
		return nil, fmt.Errorf("pgfront: PostgreSQL sent a control message of %d bytes", n)
	}
	if err := f.fill(headerLen + n); err != nil {
		return nil, err
	}
	return f.buf[f.rp : f.rp+headerLen+n], nil
}

// some returns up to n buffered bytes, reading when none are; the caller
// consumes what it used.
func (f *frameReader) some(n int) ([]byte, error) {
	if err := f.fill(1); err != nil {
		return nil, err
	}
	return f.buf[f.rp : f.rp+min(n, f.buffered())], nil
}

// consume drops n bytes.
func (f *frameReader) consume(n int) { f.rp += n }
