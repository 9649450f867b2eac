package pgfront

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	larder "github.com/larderdb/larder/client-lib"
)

// chunkedReader returns data in pieces whose sizes come from sizes, and a
// timeout before some of them, as a connection under a read deadline does.
type chunkedReader struct {
	data, sizes []byte
	i           int
	timedOut    bool // the last read timed out (the next one progresses)
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

func (r *chunkedReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	size := 1
	if len(r.sizes) > 0 {
		b := r.sizes[r.i%len(r.sizes)]
		r.i++
		if b%7 == 0 && !r.timedOut {
			r.timedOut = true
			return 0, timeoutErr{}
		}
		size = max(int(b), 1)
	}
	r.timedOut = false
	n := copy(p[:min(len(p), size)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// relayAll frames a stream as the pump does: inspected messages whole,
// others in pieces; a timeout is resumed. It returns the bytes passed on
// and the messages' types.
func relayAll(fr *frameReader) ([]byte, []byte, error) {
	var out, types []byte
	remaining := 0
	for {
		var err error
		if remaining > 0 {
			var b []byte
			if b, err = fr.some(remaining); err == nil {
				out = append(out, b...)
				fr.consume(len(b))
				remaining -= len(b)
				continue
			}
		} else {
			var typ byte
			var n int
			if typ, n, err = fr.header(); err == nil {
				types = append(types, typ)
				if strings.IndexByte("ZESGC", typ) >= 0 {
					var msg []byte
					if msg, err = fr.whole(n); err == nil {
						out = append(out, msg...)
						fr.consume(len(msg))
						continue
					}
					types = types[:len(types)-1]
				} else {
					h, _ := fr.whole(0)
					out = append(out, h[:headerLen]...)
					fr.consume(headerLen)
					remaining = n
					continue
				}
			}
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		return out, types, err
	}
}

// FuzzFrameReader: whatever PostgreSQL's side of the stream holds, the
// frame reader never panics, passes on exactly the bytes of the messages
// it framed, resumes after timeouts, and stops on a length below 4.
func FuzzFrameReader(f *testing.F) {
	msg := func(typ byte, body string) []byte {
		b := []byte{typ}
		b = binary.BigEndian.AppendUint32(b, uint32(len(body)+4))
		return append(b, body...)
	}
	var stream []byte
	for _, m := range [][]byte{msg('1', ""), msg('T', "\x00\x01a\x00"), msg('D', strings.Repeat("x", 100)), msg('C', "SELECT 1\x00"), msg('Z', "I")} {
		stream = append(stream, m...)
	}
	f.Add(stream, []byte{1, 3, 200, 7})
	f.Add(msg('E', "SERROR\x00C42P01\x00\x00"), []byte{5})
	f.Add([]byte{'Z', 0, 0, 0, 3}, []byte{})
	f.Add([]byte{'D', 0xff, 0xff, 0xff, 0xff, 1, 2}, []byte{64})
	f.Fuzz(func(t *testing.T, data, sizes []byte) {
		fr := newFrameReader(&chunkedReader{data: append([]byte{}, data...), sizes: sizes})
		out, _, err := relayAll(fr)
		if !bytes.HasPrefix(data, out) {
			t.Fatalf("passed on %q, not a prefix of %q", out, data)
		}
		if err == nil {
			t.Fatal("no error at the end of the stream")
		}
		if errors.Is(err, io.EOF) && len(out)+fr.buffered() != len(data) {
			t.Fatalf("at EOF: %d passed on + %d buffered of %d", len(out), fr.buffered(), len(data))
		}
	})
}

// FuzzParseStaleness: an accepted value is positive, at most the maximum,
// and reads back the same from its printed form.
func FuzzParseStaleness(f *testing.F) {
	for _, s := range []string{"5s", "500ms", "2min", "1h", "1d", "30", "1.5", " 5 s ", "1m30s", "0", "-1s", "25h", "NaN", "1e300", "ms", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseStaleness(s)
		if err != nil {
			return
		}
		if d <= 0 || d > larder.MaxStaleness {
			t.Fatalf("%q accepted as %s", s, d)
		}
		back, err := parseStaleness(formatStaleness(d))
		if err != nil || back != d {
			t.Fatalf("%q is %s, printed %q, read back %s, %v", s, d, formatStaleness(d), back, err)
		}
	})
}

// FuzzClassify: the cheap first-word scan and the parser-based
// classification never panic, and agree on what matters: a statement the
// parser calls a Larder BEGIN or a larder.staleness starts with a word
// the scan sends to the parser.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{"BEGIN READ ONLY", "/* c */ start transaction read only", "-- x\nSET larder.staleness = '5s'",
		"SHOW larder.staleness", "select 1; select 2", "(SELECT 1)", "/* /* nested */ */ reset larder.staleness", "", ";;", "COMMIT AND CHAIN"} {
		f.Add(s)
	}
	c := newClassifier(16)
	f.Fuzz(func(t *testing.T, s string) {
		kw := firstKeyword(s)
		if strings.ToUpper(kw) != kw {
			t.Fatalf("first keyword %q", kw)
		}
		_ = singleStatement(s)
		infos, err := c.classify(s)
		if err != nil || len(infos) == 0 {
			return
		}
		switch infos[0].class {
		case classBeginRO, classSetStaleness, classShowStaleness:
			if !interceptKeywords[kw] {
				t.Fatalf("%q is %v but its first word %q is not looked at", s, infos[0].class, kw)
			}
		}
		for _, in := range infos {
			if in.start < 0 || in.start > len(s) || !strings.Contains(s, in.text) {
				t.Fatalf("%q: statement at %d %q", s, in.start, in.text)
			}
		}
	})
}

// TestFormatStaleness prints settings as PostgreSQL prints time settings.
func TestFormatStaleness(t *testing.T) {
	for d, want := range map[time.Duration]string{5 * time.Second: "5s", 1500 * time.Millisecond: "1500ms",
		2 * time.Minute: "2min", time.Hour: "1h", 48 * time.Hour: "2d", 90 * time.Second: "90s"} {
		if got := formatStaleness(d); got != want {
			t.Errorf("%s: %q, want %q", d, got, want)
		}
	}
}
