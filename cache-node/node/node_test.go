package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/servers"
	"github.com/larderdb/larder/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{NATS: true}, &env))
}

var seq atomic.Int64

// fakeInvalidator publishes like the invalidator: transactions on their
// tags' subjects through JetStream, and heartbeats after them.
type fakeInvalidator struct {
	t      *testing.T
	js     jetstream.JetStream
	prefix string
	mu     sync.Mutex
	lsn    uint64
	paused atomic.Bool // no heartbeats while set
}

func newFake(t *testing.T, nc *nats.Conn) *fakeInvalidator {
	f := &fakeInvalidator{t: t, prefix: fmt.Sprintf("n%d", seq.Add(1)), lsn: 1000}
	var err error
	if f.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.CreateOrUpdateStream(context.Background(), jetstream.StreamConfig{
		Name: invalidation.StreamName(f.prefix), Subjects: invalidation.StreamSubjects(f.prefix), Storage: jetstream.FileStorage,
		AllowDirect: true, // as the invalidator makes it
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			f.heartbeat()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func (f *fakeInvalidator) heartbeat() {
	if f.paused.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b := invalidation.AppendHeartbeat(nil, invalidation.Heartbeat{LSN: f.lsn, Time: time.Now()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// A heartbeat that does not get through (the server restarting) is
	// simply not sent, as with the invalidator.
	_, _ = f.js.Publish(ctx, invalidation.HeartbeatSubject(f.prefix), b)
}

// commit publishes one transaction and returns its commit LSN.
func (f *fakeInvalidator) commit(changes ...invalidation.Change) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lsn += 10
	by := map[string][]invalidation.Change{}
	for _, c := range changes {
		s := invalidation.TagSubject(f.prefix, c.Tag)
		if c.Flush {
			s = invalidation.FlushSubject(f.prefix, c.Tag)
		}
		by[s] = append(by[s], c)
	}
	for s, cs := range by {
		b := invalidation.AppendTxn(nil, &invalidation.Txn{CommitLSN: f.lsn, EndLSN: f.lsn + 1, XID: uint32(f.lsn), CommitTime: time.Now(), Changes: cs})
		if _, err := f.js.Publish(context.Background(), s, b, jetstream.WithMsgID(invalidation.MsgID(f.lsn, s))); err != nil {
			f.t.Fatal(err)
		}
	}
	return f.lsn
}

func (f *fakeInvalidator) now() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lsn
}

type harness struct {
	t    *testing.T
	f    *fakeInvalidator
	n    *Node
	mem  *store.Memory
	stop func()
}

func newHarness(t *testing.T, opts ...func(*Config)) *harness {
	t.Helper()
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
	return newHarnessOn(t, pubConn, nodeConn, opts...)
}

func newHarnessOn(t *testing.T, pubConn, nodeConn *nats.Conn, opts ...func(*Config)) *harness {
	t.Helper()
	var err error
	h := &harness{t: t, f: newFake(t, pubConn)}
	var n *Node
	h.mem = store.NewMemory(64<<20, func(names []string) { n.OnRelease(names) })
	cfg := Config{NATS: nodeConn, Prefix: h.f.prefix, Backend: h.mem, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
	for _, o := range opts {
		o(&cfg)
	}
	n, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.n = n
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	h.stop = func() { cancel(); <-done }
	t.Cleanup(h.stop)
	h.waitWatermark(h.f.now())
	return h
}

func (h *harness) waitWatermark(lsn uint64) {
	h.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); h.n.Watermark() < lsn; {
		if time.Now().After(deadline) {
			h.t.Fatalf("watermark %d never reached %d", h.n.Watermark(), lsn)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (h *harness) put(key string, snapshot uint64, deps ...store.Dep) {
	h.t.Helper()
	if err := h.n.Put(context.Background(), PutRequest{Key: []byte(key), Snapshot: snapshot, Deps: deps, Value: []byte(key)}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) lookup(key string, tmin, tmax uint64) store.Result {
	h.t.Helper()
	r, err := h.n.Lookup(context.Background(), []byte(key), tmin, tmax, "")
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// served waits until a put version is served at its snapshot (confirmed)
// and returns the answer.
func (h *harness) served(key string, snapshot uint64) store.Result {
	h.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		if r := h.lookup(key, snapshot, snapshot); r.Miss == store.Hit {
			return r
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s@%d never served", key, snapshot)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func itemDep(id int, reads ...string) store.Dep {
	return store.Dep{Tag: fmt.Sprintf("public.items(id)=%d", id), Table: "public.items", Reads: reads}
}

func TestInvalidationEndsAVersion(t *testing.T) {
	h := newHarness(t)
	s := h.f.now()
	h.put("k", s, itemDep(1, "name"))
	r := h.served("k", s)
	if !r.Open || r.Lo > s {
		t.Fatalf("fresh version: %+v", r)
	}
	// An UPDATE of a column the result does not read leaves it valid.
	h.f.commit(invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"qty"}})
	l := h.f.commit(invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"name"}})
	h.waitWatermark(l)
	r = h.lookup("k", s, s)
	if r.Miss != store.Hit || r.Open || r.Hi != l {
		t.Fatalf("after the invalidation at %d: %+v", l, r)
	}
	if r := h.lookup("k", l, l+100); r.Miss != store.MissStaleness {
		t.Fatalf("served at or after the invalidation: %+v", r)
	}
}

// A put computed before an invalidation that the node already applied.
func TestPutAfterItsInvalidation(t *testing.T) {
	h := newHarness(t)
	s0 := h.f.now()
	h.put("follow", s0, itemDep(2, "qty"))
	h.served("follow", s0) // the node follows items(id)=2 (and keeps following: the change below misses it)
	s := h.f.now()
	l := h.f.commit(invalidation.Change{Tag: "public.items(id)=2", Columns: []string{"name"}})
	h.waitWatermark(l)
	h.put("late", s, itemDep(2, "name"))
	r := h.lookup("late", s, s)
	if r.Miss != store.Hit || r.Hi != l || r.Open {
		t.Fatalf("late put: %+v; want it to end at %d", r, l)
	}
	if r := h.lookup("late", l, l+1000); r.Miss == store.Hit {
		t.Fatalf("late put served after its invalidation: %+v", r)
	}
}

// The subscription race: the invalidation was published before the node
// subscribed to the tag, after the put's snapshot.
func TestSubscriptionRace(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			h := newHarness(t)
			skipJetStreamCheckForTest = broken
			defer func() { skipJetStreamCheckForTest = false }()
			s := h.f.now()
			l := h.f.commit(invalidation.Change{Tag: "public.items(id)=3", Columns: []string{"name"}})
			l2 := h.f.commit(invalidation.Change{Tag: "public.items(id)=4", Rows: true})
			h.waitWatermark(l2)
			h.put("exact", l-1, itemDep(3, "name")) // computed just before the invalidation
			h.put("older", s, itemDep(4))           // history back to s is unknown
			stale := 0
			for _, c := range []struct {
				key  string
				snap uint64
				inv  uint64
			}{{"exact", l - 1, l}, {"older", s, l2}} {
				r := h.served(c.key, c.snap)
				if r.Open || r.Hi > c.inv {
					stale++
				}
				if r := h.lookup(c.key, c.inv, c.inv+1000); r.Miss == store.Hit {
					stale++
				}
			}
			if broken && stale == 0 {
				t.Fatal("a node without the JetStream check passed: the test cannot fail")
			}
			if !broken && stale > 0 {
				t.Fatalf("%d stale answers", stale)
			}
			if !broken {
				if r := h.lookup("exact", l-1, l-1); r.Hi != l {
					t.Errorf("exact put ends at %d, want %d", r.Hi, l)
				}
			}
		})
	}
}

func TestLowerBoundAndFlush(t *testing.T) {
	h := newHarness(t)
	s0 := h.f.now()
	h.put("a", s0, itemDep(5, "name"))
	h.served("a", s0)
	l1 := h.f.commit(invalidation.Change{Tag: "public.items(id)=5", Columns: []string{"name"}})
	h.waitWatermark(l1)
	s := h.f.commit(invalidation.Change{Tag: "public.other", Rows: true})
	h.waitWatermark(s)
	h.put("b", s, itemDep(5, "name"))
	r := h.served("b", s)
	if r.Lo != l1 {
		t.Errorf("lower bound %d, want the last invalidation %d", r.Lo, l1)
	}
	// A TRUNCATE (flush) of the table ends it.
	l2 := h.f.commit(invalidation.Change{Tag: "public.items", Flush: true}, invalidation.Change{Tag: "public.items", Rows: true})
	h.waitWatermark(l2)
	if r := h.lookup("b", s, s); r.Hi != l2 || r.Open {
		t.Fatalf("after a flush: %+v", r)
	}
}

// A put computed at a snapshot newer than the node's watermark: an
// invalidation at or before that snapshot may not have arrived yet, so the
// node must not extend the version back before its snapshot.
func TestPutBeyondTheWatermark(t *testing.T) {
	h := newHarness(t)
	s0 := h.f.now()
	h.put("follow", s0, itemDep(8, "qty"))
	h.served("follow", s0)
	l1 := h.f.commit(invalidation.Change{Tag: "public.items(id)=8", Columns: []string{"name"}})
	h.waitWatermark(l1)
	// A commit at l2 whose message is still on its way, and a result
	// computed after it.
	h.f.mu.Lock()
	h.f.lsn += 10
	l2 := h.f.lsn
	h.f.mu.Unlock()
	h.put("fresh", l2, itemDep(8, "name"))
	h.f.mu.Lock()
	b := invalidation.AppendTxn(nil, &invalidation.Txn{CommitLSN: l2, EndLSN: l2 + 1, XID: uint32(l2), CommitTime: time.Now(), Changes: []invalidation.Change{{Tag: "public.items(id)=8", Columns: []string{"name"}}}})
	if _, err := h.f.js.Publish(context.Background(), invalidation.TagSubject(h.f.prefix, "public.items(id)=8"), b); err != nil {
		t.Fatal(err)
	}
	h.f.mu.Unlock()
	h.waitWatermark(l2)
	if r := h.lookup("fresh", l1, l2-1); r.Miss == store.Hit {
		t.Fatalf("served before the change it reflects: %+v (changed at %d)", r, l2)
	}
	if r := h.lookup("fresh", l2, l2); r.Miss != store.Hit {
		t.Fatalf("not served at its snapshot: %+v", r)
	}
}

func TestGapOnUndecodableMessage(t *testing.T) {
	h := newHarness(t)
	s := h.f.now()
	h.put("g", s, itemDep(6))
	h.served("g", s)
	wm := h.n.Watermark()
	if _, err := h.f.js.Publish(context.Background(), invalidation.TagSubject(h.f.prefix, "public.items(id)=6"), []byte{9, 9, 9}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		r := h.lookup("g", s, s)
		if !r.Open {
			if r.Hi > h.n.Watermark()+1 || r.Hi < wm+1 {
				t.Fatalf("ended at %d; watermark was %d", r.Hi, wm)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a corrupt message left versions open")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestUnsubscribeWhenTheLastVersionCloses(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Linger = -1 })
	s := h.f.now()
	h.put("u", s, itemDep(7))
	h.served("u", s)
	if g := h.n.groupCount(); g != 2 { // the tag and the table's flushes
		t.Fatalf("%d groups", g)
	}
	h.waitWatermark(h.f.commit(invalidation.Change{Tag: "public.items(id)=7", Rows: true}))
	for deadline := time.Now().Add(15 * time.Second); h.n.groupCount() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("still %d groups", h.n.groupCount())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReleasedGroupLingers: once the last version of a group has ended
// and settled, the node stays subscribed for Config.Linger, so the next
// version of the key (a hot item, read again right after each write) is
// served at once instead of waiting for a new subscription's
// confirmation.
func TestReleasedGroupLingers(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Linger = time.Hour })
	s := h.f.now()
	h.put("u", s, itemDep(7))
	h.served("u", s)
	h.waitWatermark(h.f.commit(invalidation.Change{Tag: "public.items(id)=7", Rows: true}))
	// Settled (the watermark passed its end) and released: the sweep
	// marks the group unheld.
	unheld := func() bool {
		h.n.mu.Lock()
		defer h.n.mu.Unlock()
		g := h.n.groups["public.items(id)=7"]
		return g != nil && !g.unheldSince.IsZero()
	}
	for deadline := time.Now().Add(15 * time.Second); !unheld(); {
		if time.Now().After(deadline) {
			t.Fatalf("the group was not kept once released (%d groups)", h.n.groupCount())
		}
		time.Sleep(5 * time.Millisecond)
	}
	s2 := h.f.now()
	h.put("u", s2, itemDep(7))
	if r := h.lookup("u", s2, s2); r.Miss != store.Hit {
		t.Fatalf("the next version of a lingering group: %v, want a hit at once", r.Miss)
	}
	if unheld() {
		t.Fatal("a group holding a version again is still marked unheld after a sweep")
	}
}

// TestReplayAfterReconnect: invalidations published while the node was
// disconnected are replayed from JetStream — the version they hit ends
// exactly there, and the versions they miss stay open.
func TestReplayAfterReconnect(t *testing.T) {
	cfg := servers.DefaultNATSConfig(filepath.Join(t.TempDir(), "nats"))
	srv, err := servers.StartNATS(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Port = srv.Port()
	defer func() { _ = srv.Close() }()
	pubConn, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer pubConn.Close()
	// The node's connection dials through a gate, shut while b is
	// published: otherwise its first reconnect attempt, which nats.go
	// makes at once, can come before b and receive it.
	gate := &gatedDialer{}
	nodeConn, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.SetCustomDialer(gate))
	if err != nil {
		t.Fatal(err)
	}
	defer nodeConn.Close()
	h := newHarnessOn(t, pubConn, nodeConn)
	s := h.f.now()
	h.put("hit", s, itemDep(1, "name"))
	h.put("spared", s, itemDep(2, "name"))
	h.served("hit", s)
	h.served("spared", s)

	// The server restarts; the publisher is back first and publishes an
	// invalidation the node, still away, does not receive live.
	gate.shut.Store(true)
	_ = srv.Close()
	waitDisconnected(t, nodeConn)
	if srv, err = servers.StartNATS(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); !pubConn.IsConnected(); {
		if time.Now().After(deadline) {
			t.Fatal("the publisher did not reconnect")
		}
		time.Sleep(5 * time.Millisecond)
	}
	l := h.f.commit(invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"name"}})
	gate.shut.Store(false)
	h.waitWatermark(l)

	if r := h.lookup("hit", s, s); r.Miss != store.Hit || r.Open || r.Hi != l {
		t.Fatalf("the version the invalidation hit: %+v, want it ended at %d", r, l)
	}
	if r := h.lookup("hit", l, l+100); r.Miss == store.Hit {
		t.Fatalf("served past its invalidation: %+v", r)
	}
	if r := h.lookup("spared", s, s); r.Miss != store.Hit || !r.Open {
		t.Fatalf("the version the invalidation missed: %+v, want it still open", r)
	}
	if got := testutil.ToFloat64(h.n.m.replays.WithLabelValues("done")); got < 1 {
		t.Fatalf("%v replays done", got)
	}
}

func (n *Node) groupCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.groups)
}

// TestOutOfOrderAfterReconnect: an invalidation at b is published while
// the node is disconnected; after the reconnect a live one at c > b
// reaches the node before the replay brings b back. The version c closed
// must still end at b, and must not be served past the watermark
// meanwhile.
func TestOutOfOrderAfterReconnect(t *testing.T) {
	cfg := servers.DefaultNATSConfig(filepath.Join(t.TempDir(), "nats"))
	srv, err := servers.StartNATS(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Port = srv.Port()
	defer func() { _ = srv.Close() }()
	pubConn, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer pubConn.Close()
	gate := &gatedDialer{} // shut while b is published (see TestReplayAfterReconnect)
	nodeConn, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.SetCustomDialer(gate))
	if err != nil {
		t.Fatal(err)
	}
	defer nodeConn.Close()
	h := newHarnessOn(t, pubConn, nodeConn)
	s := h.f.now()
	h.put("k", s, itemDep(1, "qty"))
	h.served("k", s)
	wm := h.n.Watermark()

	// No heartbeat until the end: the node notices its reconnect only then.
	h.f.paused.Store(true)
	gate.shut.Store(true)
	_ = srv.Close()
	waitDisconnected(t, nodeConn)
	if srv, err = servers.StartNATS(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); !pubConn.IsConnected(); {
		if time.Now().After(deadline) {
			t.Fatal("the publisher did not reconnect")
		}
		time.Sleep(5 * time.Millisecond)
	}
	b := h.f.commit(invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"qty"}}) // lost by the node
	gate.shut.Store(false)
	for deadline := time.Now().Add(20 * time.Second); !nodeConn.IsConnected(); {
		if time.Now().After(deadline) {
			t.Fatal("the node did not reconnect")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The server has the node's subscriptions again once a round trip on
	// the node's connection is answered; only then is c a live message
	// (published earlier, another connection's message may pass them).
	if err := nodeConn.Flush(); err != nil {
		t.Fatal(err)
	}
	c := h.f.commit(invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"qty"}}) // live
	for deadline := time.Now().Add(20 * time.Second); ; {
		r, err := h.mem.Lookup(context.Background(), []byte("k"), s, s, store.Open)
		if err != nil {
			t.Fatal(err)
		}
		if r.Miss == store.Hit && !r.Open {
			if r.Hi != c {
				t.Fatalf("the live message at %d ended the version at %d", c, r.Hi)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the live message at %d never reached the node: %+v", c, r)
		}
		time.Sleep(2 * time.Millisecond)
	}
	// Closed at c by a live message, it is still served only up to the
	// watermark, which has not moved.
	if r := h.lookup("k", s, s); r.Miss != store.Hit || r.Hi > wm+1 {
		t.Errorf("before the replay: %+v, served beyond the watermark %d", r, wm)
	}
	if r := h.lookup("k", b, b); r.Miss == store.Hit {
		t.Errorf("before the replay, served at %d, which invalidated it: %+v", b, r)
	}

	h.f.paused.Store(false)
	h.waitWatermark(c)
	if r := h.lookup("k", b, b); r.Miss == store.Hit {
		t.Errorf("served at %d, which invalidated it (the live message at %d came first): %+v", b, c, r)
	}
	if r := h.lookup("k", s, s); r.Miss != store.Hit || r.Hi != b {
		t.Errorf("after the replay: %+v, want it ended at %d", r, b)
	}
	if got := testutil.ToFloat64(h.n.m.replays.WithLabelValues("done")); got < 1 {
		t.Errorf("%v replays done", got)
	}
}

// persistentMemory is a memory backend that says whether a watermark was
// saved, as a Redis-backed store does for a node restarting on its data.
type persistentMemory struct {
	*store.Memory
	mu    sync.Mutex
	wm    uint64
	saved bool
}

func (p *persistentMemory) SaveWatermark(_ context.Context, wm uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wm, p.saved = wm, true
	return nil
}

func (p *persistentMemory) SavedWatermark(context.Context) (uint64, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.wm, p.saved, nil
}

func (p *persistentMemory) Settle(ctx context.Context, wm uint64) error {
	if err := p.Memory.Settle(ctx, wm); err != nil {
		return err
	}
	return p.SaveWatermark(ctx, wm)
}

// A node killed before it saved any watermark left an open version in its
// store; an invalidation of it came while no node ran. The next node,
// finding no saved watermark, must not serve that version past its
// snapshot (it has no way to replay what it missed).
func TestRestartWithoutASavedWatermark(t *testing.T) {
	pubConn, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pubConn.Close)
	f := newFake(t, pubConn)
	s := f.now()
	back := &persistentMemory{Memory: store.NewMemory(1<<20, nil)}
	if err := back.Put(context.Background(), []byte("k"), &store.Version{Lo: s, Hi: store.Open, Snapshot: s, Deps: []store.Dep{itemDep(1, "name")}, Value: []byte("old")}); err != nil {
		t.Fatal(err)
	}
	changed := f.commit(invalidation.Change{Tag: itemDep(1).Tag, AllColumns: true})

	nodeConn, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nodeConn.Close)
	n, err := New(Config{NATS: nodeConn, Prefix: f.prefix, Backend: back, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(20 * time.Second); n.Watermark() < changed; {
		if time.Now().After(deadline) {
			t.Fatalf("watermark %d never reached %d", n.Watermark(), changed)
		}
		time.Sleep(2 * time.Millisecond)
	}
	r, err := n.Lookup(context.Background(), []byte("k"), changed, changed, "")
	if err != nil {
		t.Fatal(err)
	}
	if r.Miss == store.Hit {
		t.Fatalf("a version kept without a saved watermark was served at %d, after its invalidation at %d: [%d, %d)", changed, changed, r.Lo, r.Hi)
	}
	// The first heartbeat saved a watermark: a restart from here replays.
	if wm, ok, _ := back.SavedWatermark(context.Background()); !ok || wm == 0 {
		t.Fatal("the node saved no watermark on its first heartbeat")
	}
}

// gatedDialer dials TCP, except while shut.
type gatedDialer struct{ shut atomic.Bool }

func (g *gatedDialer) Dial(network, address string) (net.Conn, error) {
	if g.shut.Load() {
		return nil, errors.New("gatedDialer: shut")
	}
	return (&net.Dialer{Timeout: 2 * time.Second}).Dial(network, address)
}

// waitDisconnected waits until nc has noticed its server go.
func waitDisconnected(t *testing.T, nc *nats.Conn) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); nc.IsConnected(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the node's connection did not notice the server go")
		}
	}
}
