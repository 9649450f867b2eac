package origin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/larderdb/larder/internal/recipe"
)

// memBackend answers every statement with rows, whatever the pin.
type memBackend struct {
	rows     [][]byte
	beginErr error
}

func (b *memBackend) Begin(ctx context.Context, r *Begin) (Tx, error) {
	if b.beginErr != nil {
		return nil, b.beginErr
	}
	return memTx{b}, nil
}

type memTx struct{ b *memBackend }

func (memTx) Hold(context.Context, []string) error { return nil }
func (t memTx) Query(_ context.Context, sql string, args []any) (recipe.Result, error) {
	return recipe.Result{Header: []byte("hdr:" + sql), Rows: t.b.rows}, nil
}
func (memTx) End(context.Context) error { return nil }

func serve(t *testing.T, cfg Config, b Backend) (*Server, string) {
	t.Helper()
	srv, err := New(cfg, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(context.Background(), ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return srv, ln.Addr().String()
}

func rows(n int, tag string) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte(fmt.Sprintf("%s row %04d %s", tag, i, bytes.Repeat([]byte{'x'}, 80)))
	}
	return out
}

// run runs one statement in its own session and decodes it with store.
func run(t *testing.T, cl *Client, store *recipe.RowStore) (recipe.Result, int) {
	t.Helper()
	ctx := context.Background()
	s, err := cl.Begin(ctx, &Begin{Snapshot: "00000003-00000002-1", TS: 7, Tables: []string{"public.items"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.End(ctx)
	msg, err := s.Query(ctx, &Query{SQL: "SELECT $1", Args: []any{int64(3), "x", nil, []byte("b"), 1.5, true}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Decode(ctx, msg, recipe.OriginFunc(s.Refetch), recipe.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	return res, len(msg)
}

func TestRecipesThroughTheOrigin(t *testing.T) {
	b := &memBackend{rows: rows(200, "a")}
	srv, addr := serve(t, Config{}, b)
	budget := recipe.DefaultConfig()
	cl := NewClient(ClientConfig{Addr: addr, EdgeID: "edge-1", Budget: budget})
	defer cl.Close()
	store, _ := recipe.NewRowStore(budget)

	first, n1 := run(t, cl, store)
	second, n2 := run(t, cl, store)
	raw := int(first.Size())
	if !equal(first, b.rows) || !equal(second, b.rows) {
		t.Fatal("the rebuilt results differ from the backend's")
	}
	if n2*4 > raw {
		t.Fatalf("the repeated result took %d bytes for %d raw", n2, raw)
	}
	t.Logf("raw %d bytes: first %d, repeated %d", raw, n1, n2)

	// Half the rows change: only they travel.
	b.rows = append(rows(100, "b"), b.rows[100:]...)
	third, n3 := run(t, cl, store)
	if !equal(third, b.rows) || n3 > raw*6/10 {
		t.Fatalf("half changed: %d bytes for %d raw", n3, raw)
	}

	// The edge loses its store without telling the origin: one batched
	// refetch heals it, the result is right.
	lost, _ := recipe.NewRowStore(budget)
	again, _ := run(t, cl, lost)
	if !equal(again, b.rows) {
		t.Fatal("wrong result after the edge lost its store")
	}
	if st := lost.Stats(); st.Refetches != 1 {
		t.Fatalf("%d refetches, want 1", st.Refetches)
	}
	if srv.Stats().Refetches.Load() != 1 {
		t.Fatalf("the origin saw %d refetches", srv.Stats().Refetches.Load())
	}
	// A reset on the next hello empties the origin's model.
	cl.Reset()
	fresh, _ := recipe.NewRowStore(budget)
	if _, n := run(t, cl, fresh); n < raw {
		t.Fatalf("after a reset the result took %d bytes for %d raw: references were sent", n, raw)
	}
	if fresh.Stats().Refetches != 0 {
		t.Fatal("a refetch after a reset")
	}
}

func equal(res recipe.Result, want [][]byte) bool {
	if len(res.Rows) != len(want) {
		return false
	}
	for i := range want {
		if !bytes.Equal(res.Rows[i], want[i]) {
			return false
		}
	}
	return true
}

func TestOriginErrorsAndBounds(t *testing.T) {
	ctx := context.Background()
	b := &memBackend{rows: rows(3, "a")}
	_, addr := serve(t, Config{MaxSessions: 1}, b)
	cl := NewClient(ClientConfig{Addr: addr, EdgeID: "e", Budget: recipe.DefaultConfig()})
	defer cl.Close()
	s1, err := cl.Begin(ctx, &Begin{Snapshot: "s", TS: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Begin(ctx, &Begin{Snapshot: "s", TS: 1}); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second session beyond MaxSessions: %v", err)
	}
	if _, err := s1.Query(ctx, &Query{SQL: "x", Args: []any{struct{}{}}}); !errors.Is(err, ErrArgs) {
		t.Fatalf("an argument of an unknown type: %v", err)
	}
	if err := s1.End(ctx); err != nil {
		t.Fatal(err)
	}
	b.beginErr = fmt.Errorf("table gone: %w", ErrRewritten)
	if _, err := cl.Begin(ctx, &Begin{Snapshot: "s", TS: 1}); !errors.Is(err, ErrRewritten) || !errors.Is(err, ErrRetry) {
		t.Fatalf("a rewritten table: %v", err)
	}
}

func TestArgsRoundTrip(t *testing.T) {
	in := []any{nil, true, false, int64(-5), 7, uint32(9), 2.5, float32(1.5), "s", []byte("b"), []int64{1, 2}, []string{"a", "b"}, []int{3}}
	b, err := AppendArgs(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	q, err := DecodeQuery(append([]byte{0}, b...))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprint([]any{nil, true, false, int64(-5), int64(7), uint64(9), 2.5, float32(1.5), "s", []byte("b"), []int64{1, 2}, []string{"a", "b"}, []int64{3}})
	if got := fmt.Sprint(q.Args); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// Serve closes the listener it is given when it returns, also when the
// server was closed before it ran: a listener left open would complete
// edges' TCP handshakes that no one answers (each edge then waits for its
// dial to time out instead of falling back at once).
func TestServeClosesItsListener(t *testing.T) {
	srv, err := New(Config{}, &memBackend{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background(), ln); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Serve on a closed server: %v, want net.ErrClosed", err)
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener given to a closed server still accepts connections")
	}
}
