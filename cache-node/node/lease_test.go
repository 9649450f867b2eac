package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// A miss of a lookup asking to wait takes the key's lease; the next such
// lookup waits for the loader's put and is answered from it, by its own
// range; lookups that do not ask to wait are answered at once.
func TestLoadLease(t *testing.T) {
	h := newHarness(t)
	s := h.f.now()
	// The item's group is followed and confirmed: a put is served at once.
	h.put("warm", s, itemDep(7, "name"))
	h.served("warm", s)

	ctx := context.Background()
	q := protocol.LookupRequest{Key: []byte("k"), TMin: s, TMax: s, Wait: 2 * time.Second}
	r, err := h.n.lookupWait(ctx, q)
	if err != nil || r.Miss != store.MissCompulsory {
		t.Fatalf("first lookup: %+v, %v", r, err)
	}
	if got := testutil.ToFloat64(h.n.m.leases.WithLabelValues("granted")); got != 1 {
		t.Fatalf("granted %v leases, want 1", got)
	}
	// Without a wait: answered at once.
	start := time.Now()
	if r, err := h.n.lookupWait(ctx, protocol.LookupRequest{Key: []byte("k"), TMin: s, TMax: s}); err != nil || r.Miss == store.Hit || time.Since(start) > time.Second {
		t.Fatalf("lookup without a wait: %+v, %v after %v", r, err, time.Since(start))
	}
	answer := make(chan store.Result, 1)
	go func() {
		r, err := h.n.lookupWait(ctx, q)
		if err != nil {
			t.Error(err)
		}
		answer <- r
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case r := <-answer:
		t.Fatalf("the waiter did not wait: %+v", r)
	default:
	}
	h.put("k", s, itemDep(7, "name"))
	select {
	case r := <-answer:
		if r.Miss != store.Hit || string(r.Value) != "k" {
			t.Fatalf("after the put: %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken by the put")
	}
	if got := testutil.ToFloat64(h.n.m.leases.WithLabelValues("hit_after_wait")); got != 1 {
		t.Fatalf("hit_after_wait %v, want 1", got)
	}

	// The first put of a key on a group nobody follows waits for the
	// group's confirmation: so does the waiter, and it then hits.
	s2 := h.f.now()
	q4 := protocol.LookupRequest{Key: []byte("new-group"), TMin: s2, TMax: s2, Wait: 5 * time.Second}
	_, _ = h.n.lookupWait(ctx, q4)
	go func() {
		time.Sleep(20 * time.Millisecond)
		putAsync(t, h, "new-group", s2, itemDep(8, "name"))
	}()
	if r, err := h.n.lookupWait(ctx, q4); err != nil || r.Miss != store.Hit {
		t.Fatalf("a waiter for a version on a new group: %+v, %v", r, err)
	}

	// A loader that never puts costs a waiter its wait, no more.
	q2 := protocol.LookupRequest{Key: []byte("never"), TMin: s, TMax: s, Wait: 30 * time.Millisecond}
	if r, _ := h.n.lookupWait(ctx, q2); r.Miss == store.Hit {
		t.Fatal("hit of a key never put")
	}
	start = time.Now()
	if r, _ := h.n.lookupWait(ctx, q2); r.Miss == store.Hit {
		t.Fatal("hit of a key never put")
	}
	if d := time.Since(start); d < 25*time.Millisecond || d > time.Second {
		t.Fatalf("waited %v for a loader that never put; want its 30 ms wait", d)
	}
	// A waiter whose range the load does not meet misses after it.
	q3 := protocol.LookupRequest{Key: []byte("other-range"), TMin: s, TMax: s, Wait: 2 * time.Second}
	_, _ = h.n.lookupWait(ctx, q3)
	l := h.f.commit(invalidation.Change{Tag: "public.items(id)=7", Columns: []string{"name"}})
	h.waitWatermark(l)
	go func() {
		time.Sleep(20 * time.Millisecond)
		putAsync(t, h, "other-range", l, itemDep(7, "name"))
	}()
	if r, err := h.n.lookupWait(ctx, q3); err != nil || r.Miss == store.Hit {
		t.Fatalf("a load at %d answered a lookup of [%d, %d]: %+v, %v", l, s, s, r, err)
	}
}

// putAsync is h.put for another goroutine than the test's.
func putAsync(t *testing.T, h *harness, key string, snapshot uint64, deps ...store.Dep) {
	if err := h.n.Put(context.Background(), PutRequest{Key: []byte(key), Snapshot: snapshot, Deps: deps, Value: []byte(key)}); err != nil {
		t.Error(err)
	}
}

// With Broadcast the node receives every table's invalidations on one
// wildcard subscription, applies those of its groups, drops the rest, and
// serves the same answers.
func TestBroadcastInvalidation(t *testing.T) {
	pubConn, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pubConn.Close)
	nodeConn, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nodeConn.Close)
	h := &harness{t: t, f: newFake(t, pubConn)}
	var n *Node
	h.mem = store.NewMemory(64<<20, func(names []string) { n.OnRelease(names) })
	n, err = New(Config{NATS: nodeConn, Prefix: h.f.prefix, Backend: h.mem, Broadcast: true,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	h.n = n
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	h.waitWatermark(h.f.now())

	s := h.f.now()
	h.put("k", s, itemDep(1, "name"))
	h.served("k", s)
	if len(n.subs) != 0 {
		t.Fatalf("%d per-group subscriptions in broadcast mode", len(n.subs))
	}
	for i := 2; i < 12; i++ {
		h.f.commit(invalidation.Change{Tag: fmt.Sprintf("public.items(id)=%d", i), Columns: []string{"name"}})
	}
	l := h.f.commit(invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"name"}})
	h.waitWatermark(l)
	if r := h.lookup("k", s, s); r.Miss != store.Hit || r.Open || r.Hi != l {
		t.Fatalf("after the invalidation at %d: %+v", l, r)
	}
	ignored := testutil.ToFloat64(n.m.received.WithLabelValues("ignored"))
	applied := testutil.ToFloat64(n.m.received.WithLabelValues("applied"))
	if ignored < 10 || applied < 1 {
		t.Fatalf("received %v ignored and %v applied invalidations; want the 10 of other items ignored and the item's applied", ignored, applied)
	}
}
