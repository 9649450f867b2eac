package overlay

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
)

// fakeStream is a stream of fixed input whose output is kept.
type fakeStream struct {
	in  io.Reader
	out bytes.Buffer
}

func (s *fakeStream) Read(b []byte) (int, error)       { return s.in.Read(b) }
func (s *fakeStream) Write(b []byte) (int, error)      { return s.out.Write(b) }
func (s *fakeStream) SetReadDeadline(time.Time) error  { return nil }
func (s *fakeStream) SetWriteDeadline(time.Time) error { return nil }

// fixedHandler answers every request the same way.
type fixedHandler struct{}

func (fixedHandler) Lookup(_ context.Context, q protocol.LookupRequest) (protocol.LookupResponse, error) {
	if len(q.Key) == 0 {
		return store.Result{}, errors.New("empty key")
	}
	return store.Result{Miss: store.Hit, Lo: q.TMin, Hi: q.TMax, Value: q.Key}, nil
}
func (fixedHandler) Put(context.Context, protocol.PutRequest) error { return nil }
func (fixedHandler) Stats(context.Context) (protocol.StatsResponse, error) {
	return protocol.StatsResponse{Watermark: 1}, nil
}

var fuzzLimits = peerLimits{maxFrame: 1 << 16, idle: time.Second, read: time.Second, write: time.Second, handle: time.Second}

func frame(op byte, body []byte) []byte {
	var b bytes.Buffer
	_ = protocol.WriteFrame(&b, op, body)
	return b.Bytes()
}

// FuzzServePeer feeds arbitrary bytes to a member's stream: the server
// never panics and answers only well-formed frames, one per request at
// most (a request is at least 6 bytes).
func FuzzServePeer(f *testing.F) {
	f.Add(frame(protocol.OpLookup, protocol.AppendLookup(nil, &protocol.LookupRequest{Key: []byte("k"), TMin: 1, TMax: 2})))
	f.Add(append(frame(protocol.OpStats, nil), frame(protocol.OpPut, protocol.AppendPut(nil, &protocol.PutRequest{Key: []byte("k"), Snapshot: 3,
		Deps: []store.Dep{{Tag: "public.t", Table: "public.t", Reads: []string{"a", "b"}}}, Value: []byte("v")}))...))
	f.Add(frame(9, []byte{1, 2, 3}))
	f.Add([]byte{0, 0, 0, 1, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		s := &fakeStream{in: bytes.NewReader(in)}
		servePeer(context.Background(), s, fixedHandler{}, fuzzLimits)
		out := s.out.Bytes()
		answers := 0
		for len(out) > 0 {
			_, _, _, err := protocol.ReadFrame(bytes.NewReader(out), nil, 1<<20)
			if err != nil {
				t.Fatalf("answer does not decode: %v (% x)", err, out)
			}
			n := int(uint32(out[0])<<24|uint32(out[1])<<16|uint32(out[2])<<8|uint32(out[3])) + 4
			out = out[n:]
			answers++
		}
		if answers > len(in)/6+1 {
			t.Fatalf("%d answers to %d bytes", answers, len(in))
		}
	})
}
