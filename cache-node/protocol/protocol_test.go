package protocol

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/larderdb/larder/cache-node/store"
)

// memHandler serves from a memory backend with a fixed watermark.
type memHandler struct {
	mem *store.Memory
	wm  uint64
}

func (h *memHandler) Lookup(ctx context.Context, q LookupRequest) (LookupResponse, error) {
	return h.mem.Lookup(ctx, q.Key, q.TMin, q.TMax, h.wm)
}

func (h *memHandler) Put(ctx context.Context, p PutRequest) error {
	return h.mem.Put(ctx, p.Key, &store.Version{Lo: p.Snapshot, Hi: store.Open, Snapshot: p.Snapshot, Deps: p.Deps, Value: p.Value})
}

func (h *memHandler) Stats(ctx context.Context) (StatsResponse, error) {
	st, err := h.mem.Stats(ctx)
	return StatsResponse{Watermark: h.wm, Keys: st.Keys, Versions: st.Versions, Bytes: st.Bytes, Budget: st.Budget, Evictions: st.Evictions}, err
}

func serve(t testing.TB) (string, *memHandler) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &memHandler{mem: store.NewMemory(1<<26, nil), wm: 1000}
	s := &Server{Handler: h, MaxFrame: 1 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String(), h
}

func TestClientServer(t *testing.T) {
	addr, _ := serve(t)
	cl := NewClient(addr, 4)
	defer cl.Close()
	ctx := context.Background()
	put := &PutRequest{Key: []byte{0, 1, 2}, Snapshot: 500, Deps: []store.Dep{{Tag: "public.items(id)=1", Table: "public.items", Reads: []string{"id", "name"}}}, Template: "t1", Value: []byte("rows")}
	if err := cl.Put(ctx, put); err != nil {
		t.Fatal(err)
	}
	r, err := cl.Lookup(ctx, &LookupRequest{Key: []byte{0, 1, 2}, TMin: 400, TMax: 900, Template: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	want := LookupResponse{Miss: store.Hit, Lo: 500, Hi: 1001, Open: true, Snapshot: 500, Value: []byte("rows")}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("lookup: %+v, want %+v", r, want)
	}
	r, err = cl.Lookup(ctx, &LookupRequest{Key: []byte("nope"), TMin: 1, TMax: 2})
	if err != nil || r.Miss != store.MissCompulsory {
		t.Fatalf("miss: %+v %v", r, err)
	}
	st, err := cl.Stats(ctx)
	if err != nil || st.Versions != 1 || st.Watermark != 1000 {
		t.Fatalf("stats %+v %v", st, err)
	}
	// Many concurrent requests over the pool.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				if r, err := cl.Lookup(ctx, &LookupRequest{Key: []byte{0, 1, 2}, TMin: 500, TMax: 500}); err != nil || r.Miss != store.Hit {
					t.Errorf("concurrent lookup: %+v %v", r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// Malformed frames get an error answer and the connection closes; the
// server keeps serving others.
func TestMalformedFrames(t *testing.T) {
	addr, _ := serve(t)
	frame := func(version, op byte, body []byte) []byte {
		b := make([]byte, 4, 6+len(body))
		binary.BigEndian.PutUint32(b, uint32(2+len(body)))
		return append(append(b, version, op), body...)
	}
	cases := map[string][]byte{
		"huge length":   {0x7f, 0xff, 0xff, 0xff},
		"short length":  {0, 0, 0, 1, 1},
		"bad version":   frame(9, OpStats, nil),
		"unknown op":    frame(Version, 42, nil),
		"bad lookup":    frame(Version, OpLookup, []byte{200}),
		"tmin > tmax":   frame(Version, OpLookup, AppendLookup(nil, &LookupRequest{Key: []byte("k"), TMin: 9, TMax: 1})),
		"put trailing":  frame(Version, OpPut, append(AppendPut(nil, &PutRequest{Key: []byte("k"), Snapshot: 1}), 0)),
		"stats w/ body": frame(Version, OpStats, []byte{1}),
	}
	for name, b := range cases {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		op, body, _, err := ReadFrame(c, nil, 1<<20)
		if err != nil || op != OpError || len(body) == 0 {
			t.Errorf("%s: answer op %d %q, %v; want an error answer", name, op, body, err)
		}
		// Then the server closes the connection.
		if _, _, _, err := ReadFrame(c, nil, 1<<20); !errors.Is(err, io.EOF) {
			t.Errorf("%s: connection still open (%v)", name, err)
		}
		c.Close()
	}
	cl := NewClient(addr, 1)
	defer cl.Close()
	if _, err := cl.Stats(context.Background()); err != nil {
		t.Fatalf("the server stopped serving: %v", err)
	}
}

func TestRoundTrips(t *testing.T) {
	p := PutRequest{Key: []byte("k"), Snapshot: 7, Deps: []store.Dep{{Tag: "a", Table: "t", AllColumns: true}, {Tag: "b", Table: "t", Reads: []string{"x", "y"}}}, Template: "tpl", Value: []byte{1, 2}}
	got, err := DecodePut(AppendPut(nil, &p))
	if err != nil || !reflect.DeepEqual(got, p) {
		t.Fatalf("put: %+v %v", got, err)
	}
	st := StatsResponse{Watermark: 1, Keys: 2, Versions: 3, Bytes: 4, Budget: 5, Evictions: 6}
	if s, err := DecodeStatsResponse(AppendStatsResponse(nil, &st)); err != nil || s != st {
		t.Fatalf("stats: %+v %v", s, err)
	}
	if _, err := DecodePut(AppendPut(nil, &PutRequest{Key: []byte("k"), Snapshot: 1, Deps: []store.Dep{{Tag: "a", Table: "t", Reads: []string{"y", "x"}}}})); err == nil || !strings.Contains(err.Error(), "sorted") {
		t.Errorf("unsorted reads: %v", err)
	}
}

// FuzzDecodeRequests: the decoders never panic, and what decodes
// re-encodes to something that decodes the same.
func FuzzDecodeRequests(f *testing.F) {
	f.Add(byte(OpLookup), AppendLookup(nil, &LookupRequest{Key: []byte("k"), TMin: 1, TMax: 2, Template: "t"}))
	f.Add(byte(OpLookup), AppendLookup(nil, &LookupRequest{Key: []byte("k"), TMin: 1, TMax: 2, Template: "t", Wait: 30 * time.Millisecond}))
	f.Add(byte(OpPut), AppendPut(nil, &PutRequest{Key: []byte("k"), Snapshot: 3, Deps: []store.Dep{{Tag: "a", Table: "t", Reads: []string{"x"}}}, Value: []byte("v")}))
	f.Add(byte(OpLookup), AppendLookupResponse(nil, &LookupResponse{Miss: store.Hit, Lo: 1, Hi: 2, Snapshot: 1, Value: []byte("v")}))
	f.Fuzz(func(t *testing.T, op byte, b []byte) {
		switch op % 3 {
		case 0:
			if q, err := DecodeLookup(b); err == nil {
				if q2, err := DecodeLookup(AppendLookup(nil, &q)); err != nil || !reflect.DeepEqual(q, q2) {
					t.Fatalf("lookup re-encoding: %v", err)
				}
			}
		case 1:
			if p, err := DecodePut(b); err == nil {
				if _, err := DecodePut(AppendPut(nil, &p)); err != nil {
					t.Fatalf("put re-encoding: %v", err)
				}
			}
		case 2:
			if r, err := DecodeLookupResponse(b); err == nil {
				if !bytes.Equal(AppendLookupResponse(nil, &r), b) {
					if _, err := DecodeLookupResponse(AppendLookupResponse(nil, &r)); err != nil {
						t.Fatalf("answer re-encoding: %v", err)
					}
				}
			}
		}
		_, _, _, _ = ReadFrame(bytes.NewReader(b), nil, 1<<16)
	})
}
