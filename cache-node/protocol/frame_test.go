package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// FuzzReadFrame: the frame reader never panics, reads the same frame
// however the bytes arrive and into whatever buffer, re-encodes what it
// read to the bytes it consumed, and allocates no more than twice what
// arrived (at least frameChunk), whatever length a frame declares.
func FuzzReadFrame(f *testing.F) {
	var ok bytes.Buffer
	_ = WriteFrame(&ok, OpLookup, AppendLookup(nil, &LookupRequest{Key: []byte("k"), TMin: 1, TMax: 2}))
	f.Add(ok.Bytes(), uint16(0))
	f.Add([]byte{0, 0, 0, 2, Version, OpStats}, uint16(8))
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff, Version, OpPut, 1, 2, 3}, uint16(0))
	f.Add([]byte{0, 0x10, 0, 0, Version, OpPut, 1, 2, 3}, uint16(100))
	f.Add([]byte{0, 0, 0, 1, 1}, uint16(0))
	f.Add([]byte{0, 0, 0, 3, 9, OpStats, 0}, uint16(0))
	const limit = 16 << 20
	f.Fuzz(func(t *testing.T, b []byte, bufCap uint16) {
		op, body, buf, err := ReadFrame(bytes.NewReader(b), nil, limit)
		if c := cap(buf); c > max(frameChunk, 2*len(b)) {
			t.Fatalf("%d bytes in: a buffer of %d", len(b), c)
		}
		for name, r := range map[string]io.Reader{
			"one byte":   iotest.OneByteReader(bytes.NewReader(b)),
			"half reads": iotest.HalfReader(bytes.NewReader(b)),
		} {
			op2, body2, _, err2 := ReadFrame(r, make([]byte, 0, int(bufCap)), limit)
			if (err == nil) != (err2 == nil) || op2 != op || !bytes.Equal(body, body2) {
				t.Fatalf("%s, buffer of %d: op %d %q %v; at once: op %d %q %v", name, bufCap, op2, body2, err2, op, body, err)
			}
		}
		if err != nil {
			if len(b) >= 4 && errors.Is(err, io.EOF) {
				t.Fatalf("a frame begun: %v", err)
			}
			return
		}
		n := 4 + int(binary.BigEndian.Uint32(b))
		var again bytes.Buffer
		if err := WriteFrame(&again, op, body); err != nil || !bytes.Equal(again.Bytes(), b[:n]) {
			t.Fatalf("re-encoded %x, read %x", again.Bytes(), b[:n])
		}
	})
}
