package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// Config configures a Node.
type Config struct {
	// NATS is the node's connection. All of its groups and the heartbeats
	// arrive on it, in the order the server routed them: the node's
	// reasoning depends on that order, so give it a connection of its own.
	NATS    *nats.Conn
	Prefix  string // subject prefix; default "larder"
	Backend store.Backend
	// HistoryDepth is how many recent invalidations the node keeps per
	// group to place a late put's end exactly (default 8).
	HistoryDepth int
	// EventBuffer is the capacity of the queue between NATS and the node
	// (default 1<<16). A queue half full is treated as a gap.
	EventBuffer int
	// LoadLease is how long a lookup that misses, asking to wait, makes
	// the others that miss the same key wait for its requester's put
	// (lease.go; default DefaultLoadLease, < 0: none).
	LoadLease time.Duration
	// WatermarkWait is how long a lookup whose range begins beyond the
	// watermark waits for it when the key holds a version that would then
	// serve it (wmwait.go; default DefaultWatermarkWait, < 0: never).
	WatermarkWait time.Duration
	// Linger is how long the node stays subscribed to a group, confirmed,
	// after the last version depending on it settled (default
	// DefaultLinger, < 0: not at all). A version put meanwhile is served
	// at once: under writes a hot key's versions end one after another,
	// and each new one would otherwise wait for a new subscription's
	// confirmation (a heartbeat and a JetStream request).
	Linger time.Duration
	// Broadcast subscribes to every invalidation subject of the prefix
	// (one wildcard subscription) instead of the groups of what the node
	// holds, and drops the messages of groups it does not follow: the
	// broadcast ablation of Ferdinand's comparison. What the node serves
	// is the same; it receives every invalidation of every table.
	Broadcast bool
	Log       *slog.Logger
	Metrics   prometheus.Registerer
}

// PutRequest is a result a client computed at Snapshot.
type PutRequest struct {
	Key      []byte
	Snapshot uint64
	Deps     []store.Dep
	Value    []byte
	Template string // for per-template metrics; may be empty
	// Absorbs makes the version absorb changes that name their rows
	// (store.Version.Absorbs).
	Absorbs bool
}

// Node applies the invalidation stream to a backend and decides the
// validity interval of every result put into it.
type Node struct {
	cfg Config
	m   *metrics
	js  jetstream.JetStream

	events chan *nats.Msg
	marker *nats.Msg // a pointer pushed into events after a flush

	mu        sync.Mutex
	watermark uint64
	hbTime    time.Time
	groups    map[string]*group // by name
	// lingering are the groups of groups the sweep found unheld
	// (group.unheldSince set): the sweep's ticks look at them only.
	lingering map[string]*group
	// awaiting are the groups marked awaitingHB (some may since have
	// been dropped): a heartbeat takes them without a pass over groups.
	awaiting   []*group
	bySubject  map[string]*group
	subs       map[string]*nats.Subscription // by subject
	reconnects uint64
	toConfirm  []*group // subscribed, waiting for the marker
	markerSent bool

	replaying      bool // a replay is running: the watermark waits for it
	restorePending bool // restored groups wait for the first heartbeat to replay

	// owedHi, when not 0, is the end a gap's EndOpen must still give
	// every version (the backend refused it): until it does, lookups are
	// served only below it, puts are refused, and nothing is settled.
	owedHi uint64
	legacy bool // store.OrderDependentForTest when made

	confirmCh   chan []*group
	released    chan []string
	wmAtomic    atomic.Uint64
	wmMu        sync.Mutex
	wmCh        chan struct{} // closed at the next watermark change (wmwait.go)
	owedAtomic  atomic.Uint64 // owedHi, for lookups
	backendLost atomic.Bool   // a backend call failed with store.ErrLost

	leases leases // load leases of misses (lease.go)
}

// skipJetStreamCheckForTest breaks the node on purpose (groups are
// confirmed without asking JetStream for what was published before the
// subscription) so that a test can show it notices.
var skipJetStreamCheckForTest bool

// New checks the configuration; Run starts the node.
func New(cfg Config) (*Node, error) {
	if cfg.NATS == nil || cfg.Backend == nil {
		return nil, errors.New("node: a NATS connection and a backend are required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = invalidation.DefaultPrefix
	}
	if err := invalidation.ValidPrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.HistoryDepth <= 0 {
		cfg.HistoryDepth = 8
	}
	if cfg.EventBuffer <= 0 {
		cfg.EventBuffer = 1 << 16
	}
	if cfg.WatermarkWait == 0 {
		cfg.WatermarkWait = DefaultWatermarkWait
	}
	if cfg.LoadLease == 0 {
		cfg.LoadLease = DefaultLoadLease
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, err
	}
	n := &Node{
		cfg:       cfg,
		js:        js,
		events:    make(chan *nats.Msg, cfg.EventBuffer),
		marker:    &nats.Msg{},
		groups:    map[string]*group{},
		lingering: map[string]*group{},
		bySubject: map[string]*group{},
		subs:      map[string]*nats.Subscription{},
		confirmCh: make(chan []*group, 1024),
		released:  make(chan []string, 1024),
		legacy:    store.OrderDependentForTest.Load(),
	}
	n.m = newMetrics(cfg.Metrics, n)
	return n, nil
}

// OnRelease is the callback to give a memory backend: it tells the node
// which groups no unsettled version depends on any more.
func (n *Node) OnRelease(names []string) {
	select {
	case n.released <- names:
	default: // the periodic sweep finds them
	}
}

// Watermark is the LSN up to which the node knows every invalidation of
// its groups.
func (n *Node) Watermark() uint64 { return n.wmAtomic.Load() }

// Run subscribes to heartbeats and applies the stream until ctx ends.
func (n *Node) Run(ctx context.Context) error {
	if p, ok := n.cfg.Backend.(store.Persistent); ok {
		wm, saved, err := p.SavedWatermark(ctx)
		if err != nil {
			return fmt.Errorf("node: saved watermark: %w", err)
		}
		switch {
		case !saved:
			// No watermark was saved (the last node stopped before its
			// first settle): whatever the store kept is proved valid
			// nowhere past its snapshot. It is never served.
			if err := n.cfg.Backend.EndOpen(ctx, 0); err != nil {
				return fmt.Errorf("node: end the versions kept without a saved watermark: %w", err)
			}
			n.cfg.Log.Info("started without a saved watermark: versions the store kept are not served")
		case !n.restoreGroups(ctx, wm):
			// What was open when the node stopped is proved only up to there.
			if err := n.cfg.Backend.EndOpen(ctx, wm+1); err != nil {
				return fmt.Errorf("node: end open versions at the saved watermark: %w", err)
			}
			n.cfg.Log.Info("restarted: open versions ended at the saved watermark", "watermark", wm)
		}
	}
	n.reconnects = n.cfg.NATS.Stats().Reconnects
	if n.cfg.Broadcast {
		// Before the heartbeats: every heartbeat is then routed after it.
		all, err := n.cfg.NATS.ChanSubscribe(n.cfg.Prefix+".inv.*", n.events)
		if err != nil {
			return fmt.Errorf("node: subscribe to every invalidation: %w", err)
		}
		defer all.Unsubscribe()
	}
	hb, err := n.cfg.NATS.ChanSubscribe(invalidation.HeartbeatSubject(n.cfg.Prefix), n.events)
	if err != nil {
		return fmt.Errorf("node: subscribe to heartbeats: %w", err)
	}
	defer hb.Unsubscribe()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); n.confirmLoop(ctx) }()
	go func() { defer wg.Done(); n.sweepLoop(ctx) }()
	defer wg.Wait()

	settleTick := time.NewTicker(time.Second)
	defer settleTick.Stop()
	for {
		select {
		case <-ctx.Done():
			n.mu.Lock()
			for s, sub := range n.subs {
				_ = sub.Unsubscribe()
				delete(n.subs, s)
			}
			n.settleLocked(context.Background())
			n.mu.Unlock()
			return nil
		case <-settleTick.C:
			n.mu.Lock()
			n.recoverLocked(ctx)
			n.settleLocked(ctx)
			n.mu.Unlock()
		case msg := <-n.events:
			if err := n.handle(ctx, msg); err != nil {
				return err
			}
		}
	}
}

// settleLocked tells the backend the watermark: versions closed at or
// before it + 1 can no longer be shortened by an invalidation (every one up
// to the watermark is applied), so they leave its indexes and their groups
// may be released; a persistent backend saves the watermark with them.
// Nothing is settled while a gap's EndOpen is owed: the backend has not
// applied everything up to the watermark then.
func (n *Node) settleLocked(ctx context.Context) {
	if n.watermark == 0 || n.owedHi != 0 {
		return
	}
	if err := n.cfg.Backend.Settle(ctx, n.watermark); err != nil {
		n.backendErr(err)
		n.cfg.Log.Warn("settle", "err", err)
	}
}

// backendErr notes a backend whose server restarted under the node: the
// next event handles it as a gap.
func (n *Node) backendErr(err error) {
	if !n.legacy && errors.Is(err, store.ErrLost) {
		n.backendLost.Store(true)
	}
}

// recoverLocked handles a backend that lost data (a gap: the backend ends
// every version at the watermark it saved at the latest), and retries an
// EndOpen the backend refused.
func (n *Node) recoverLocked(ctx context.Context) {
	if n.backendLost.Swap(false) {
		n.gapLocked(ctx, "backend restarted")
		return
	}
	if n.owedHi != 0 {
		n.endOwedLocked(ctx)
	}
}

// handle processes one event in arrival order.
func (n *Node) handle(ctx context.Context, msg *nats.Msg) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.recoverLocked(ctx)
	if len(n.events) >= cap(n.events)/2 {
		// The queue may overflow (NATS then drops messages): whatever
		// follows cannot be proved gapless.
		n.gapLocked(ctx, "event queue half full")
	}
	if msg == n.marker {
		n.markerSent = false
		for _, g := range n.toConfirm {
			n.awaitLocked(g)
		}
		n.toConfirm = n.toConfirm[:0]
		return nil
	}
	d, err := invalidation.Decode(msg.Data)
	if err != nil {
		n.m.corrupt.Inc()
		n.cfg.Log.Warn("undecodable invalidation message", "subject", msg.Subject, "err", err)
		// A message we cannot read may have invalidated anything.
		n.gapLocked(ctx, "undecodable message")
		return nil
	}
	if d.Heartbeat != nil {
		if n.restorePending {
			// The first heartbeat after the restored subscriptions: replay
			// everything since the saved watermark up to it.
			n.restorePending = false
			if !n.startReplayLocked(d.Heartbeat.LSN) {
				n.gapLocked(ctx, "restart replay not possible")
			}
		}
		if r := n.cfg.NATS.Stats().Reconnects; r != n.reconnects {
			n.reconnects = r
			// Messages may have been lost while disconnected: replay them
			// from JetStream, or else end open versions.
			if !n.startReplayLocked(d.Heartbeat.LSN) {
				n.gapLocked(ctx, "NATS reconnected")
			}
		}
		if d.Heartbeat.LSN > n.watermark && !n.replaying {
			first := n.watermark == 0
			n.watermark = d.Heartbeat.LSN
			n.setWatermarkLocked(n.watermark)
			n.hbTime = d.Heartbeat.Time
			if first {
				// Saved at once: a restart finds it (without one, what
				// the store kept is not served).
				n.settleLocked(ctx)
			}
		}
		var ready []*group
		for _, g := range n.awaiting {
			if g.awaitingHB && n.groups[g.name] == g {
				g.awaitingHB = false
				ready = append(ready, g)
			}
		}
		clear(n.awaiting)
		n.awaiting = n.awaiting[:0]
		if len(ready) > 0 {
			select {
			case n.confirmCh <- ready:
			default:
				n.cfg.Log.Warn("confirmation queue full; groups stay unconfirmed until their next put")
				for _, g := range ready {
					n.awaitLocked(g)
				}
			}
		}
		return nil
	}
	if err := n.applyLocked(ctx, msg.Subject, d.Txn); err != nil {
		n.cfg.Log.Error("apply invalidation", "err", err)
		n.gapLocked(ctx, "backend refused an invalidation")
	}
	return nil
}

// applyLocked applies a transaction's message on one group's subject.
func (n *Node) applyLocked(ctx context.Context, subject string, txn *invalidation.Txn) error {
	g := n.bySubject[subject]
	if g == nil {
		n.m.received.WithLabelValues("ignored").Inc()
		return nil // unsubscribed since, or not followed (broadcast)
	}
	var mine []invalidation.Change
	for _, c := range txn.Changes {
		if c.Flush == g.flush && (c.Tag == g.name || (g.flush && c.Tag == g.table)) {
			mine = append(mine, c)
		}
	}
	if len(mine) == 0 {
		n.m.received.WithLabelValues("ignored").Inc()
		return nil // a hash collision: not ours
	}
	n.m.received.WithLabelValues("applied").Inc()
	g.record(txn.CommitLSN, mine, n.cfg.HistoryDepth)
	if err := n.cfg.Backend.Invalidate(ctx, txn.CommitLSN, mine); err != nil {
		n.backendErr(err)
		return err
	}
	n.m.invalidations.Inc()
	return nil
}

// gapLocked handles a possible gap in the stream: every version, open or
// closed, ends at the watermark + 1 at the latest (it stays usable for
// older snapshots), and every group is forgotten and unsubscribed; new
// puts subscribe and confirm again.
func (n *Node) gapLocked(ctx context.Context, why string) {
	n.endOpenLocked(ctx, why)
}

// endOpenLocked ends every version at the watermark + 1 at the latest and
// forgets every group. When the backend refuses, the end is owed: retried
// on every heartbeat, and meanwhile nothing is served at or beyond it.
func (n *Node) endOpenLocked(ctx context.Context, why string) {
	n.m.gaps.WithLabelValues(why).Inc()
	n.cfg.Log.Warn("gap in the invalidation stream: versions end at the watermark", "why", why, "watermark", n.watermark)
	hi := n.watermark + 1
	if n.owedHi != 0 {
		hi = min(hi, n.owedHi)
	}
	if n.legacy {
		if err := n.cfg.Backend.EndOpen(ctx, hi); err != nil {
			n.cfg.Log.Error("end open versions", "err", err)
		}
	} else {
		n.owedHi = hi
		n.owedAtomic.Store(hi)
		n.endOwedLocked(ctx)
	}
	for s, sub := range n.subs {
		_ = sub.Unsubscribe()
		delete(n.subs, s)
	}
	for _, g := range n.groups {
		for _, p := range g.waiting {
			p.left = -1 // never confirmed: it stays pending and unserved
		}
	}
	clear(n.groups)
	clear(n.bySubject)
	n.toConfirm = n.toConfirm[:0]
	n.m.groups.Set(0)
}

// endOwedLocked tries the owed EndOpen again.
func (n *Node) endOwedLocked(ctx context.Context) {
	if err := n.cfg.Backend.EndOpen(ctx, n.owedHi); err != nil {
		n.m.errors.WithLabelValues("end").Inc()
		n.cfg.Log.Error("end versions at a gap; retried on the next heartbeat, nothing served past it meanwhile", "hi", n.owedHi, "err", err)
		return
	}
	n.owedHi = 0
	n.owedAtomic.Store(0)
}

// restoreGroups, on a restart with a saved watermark, follows again the
// groups of the unsettled versions the backend kept, serving them up to the
// saved watermark until the replay of what happened since completes. It
// reports false when that cannot be done (the caller then ends them).
func (n *Node) restoreGroups(ctx context.Context, wm uint64) bool {
	lister, ok := n.cfg.Backend.(store.GroupLister)
	if !ok {
		return false
	}
	names, err := lister.OpenGroups(ctx)
	if err != nil || len(names) == 0 || len(names) > maxReplayGroups {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range names {
		d := store.Dep{Tag: name, Table: name}
		flush := false
		if t, isTable := cutTableName(name); isTable {
			d, flush = store.Dep{Tag: t, Table: t}, true
		}
		if _, err := n.groupLocked(d, flush); err != nil {
			n.endOpenLocked(ctx, "restore failed")
			return false
		}
	}
	// Subscriptions first, heartbeats after (Run subscribes to them next):
	// every heartbeat then arrives after the groups' subscriptions.
	if err := n.cfg.NATS.FlushTimeout(10 * time.Second); err != nil {
		n.endOpenLocked(ctx, "restore failed")
		return false
	}
	n.watermark = wm
	n.setWatermarkLocked(wm)
	n.restorePending = true
	n.cfg.Log.Info("restarted: following the open versions' groups again; replaying from the saved watermark", "groups", len(names), "watermark", wm)
	return true
}

func cutTableName(name string) (string, bool) {
	t, ok := strings.CutPrefix(name, "table:")
	return t, ok && t != ""
}

// Lookup answers a lookup for timestamps in [tmin, tmax]. Nothing is
// served beyond the watermark (nor, while a gap's end is owed, at or
// beyond that end).
func (n *Node) Lookup(ctx context.Context, key []byte, tmin, tmax uint64, template string) (store.Result, error) {
	r, err := n.lookup(ctx, key, tmin, tmax, n.cfg.WatermarkWait)
	if err == nil {
		n.m.lookup(r.Miss, template)
	}
	return r, err
}

// lookup is Lookup without the lookup metrics.
// wait bounds the wait for the watermark (wmwait.go); 0: none.
func (n *Node) lookup(ctx context.Context, key []byte, tmin, tmax uint64, wait time.Duration) (store.Result, error) {
	wm := n.servableThrough()
	r, err := n.cfg.Backend.Lookup(ctx, key, tmin, tmax, wm)
	if err == nil && r.Miss != store.Hit && tmin > wm && n.awaitWatermark(ctx, key, tmin, tmax, r, wait) {
		r, err = n.cfg.Backend.Lookup(ctx, key, tmin, tmax, n.servableThrough())
	}
	if err != nil {
		n.backendErr(err)
		n.m.errors.WithLabelValues("lookup").Inc()
		return r, err
	}
	return r, nil
}

// Put stores a result computed at req.Snapshot. The node decides its
// interval from what it knows of its groups; when it does not yet follow a
// group, it subscribes, and the version waits (unserved) until the group
// is confirmed: a heartbeat routed after the subscription, then the
// group's last message in JetStream.
func (n *Node) Put(ctx context.Context, req PutRequest) (err error) {
	// Stored and served, or refused, the load is over: its waiters look
	// up again. A pending version wakes them once confirmed (confirmLoop).
	pending := false
	defer func() {
		if err != nil || !pending {
			n.leases.release(req.Key)
		}
	}()
	if req.Snapshot == 0 {
		return errors.New("node: put without a snapshot")
	}
	for _, d := range req.Deps {
		if d.Tag == "" || d.Table == "" {
			return errors.New("node: a dependency without a tag or table")
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.owedHi != 0 {
		return errors.New("node: a gap is not yet applied to the backend")
	}
	var gs []*group
	var deps []store.Dep // aligned with gs
	unconfirmed := 0
	for _, d := range req.Deps {
		for _, flush := range []bool{false, true} {
			g, err := n.groupLocked(d, flush)
			if err != nil {
				return err
			}
			gs, deps = append(gs, g), append(deps, d)
			if !g.confirmed {
				unconfirmed++
			}
		}
	}
	// The version names its tags with its groups' strings: one string a
	// tag for all its versions, not one each (fewer objects on the heap
	// for every collection to mark, in an L1 of millions of versions).
	vdeps := make([]store.Dep, len(req.Deps))
	for i, d := range req.Deps {
		d.Tag = gs[2*i].name
		vdeps[i] = d
	}
	v := store.Version{Lo: req.Snapshot, Hi: store.Open, Snapshot: req.Snapshot, Deps: vdeps, Value: req.Value, Absorbs: req.Absorbs}
	if unconfirmed == 0 {
		v.Lo, v.Hi = n.intervalLocked(req.Snapshot, gs, deps)
	} else {
		v.Pending = true
	}
	if err := n.cfg.Backend.Put(ctx, req.Key, &v); err != nil {
		n.backendErr(err)
		n.m.errors.WithLabelValues("put").Inc()
		return err
	}
	n.m.put(req.Template, v.Size(len(req.Key)))
	pending = v.Pending
	if v.Pending {
		p := &pendingPut{key: append([]byte(nil), req.Key...), snapshot: req.Snapshot, deps: deps, groups: gs, left: unconfirmed}
		for _, g := range gs {
			if !g.confirmed {
				g.waiting = append(g.waiting, p)
			}
		}
	}
	return nil
}

// intervalLocked intersects what every group proves. Histories are
// complete only up to the watermark: for a snapshot beyond it, an
// invalidation at or before the snapshot may still be on its way, so the
// version cannot be extended back before its snapshot.
func (n *Node) intervalLocked(s uint64, gs []*group, deps []store.Dep) (lo, hi uint64) {
	lo, hi = 0, store.Open
	for i, g := range gs {
		l, h := g.interval(s, deps[i])
		lo, hi = max(lo, l), min(hi, h)
	}
	if s > n.watermark {
		lo = s
	}
	return min(lo, s), hi
}

// groupLocked returns the group of a dependency's tag (or its table's
// flushes), subscribing when the node does not follow it yet.
func (n *Node) groupLocked(d store.Dep, flush bool) (*group, error) {
	name, subject := d.Tag, invalidation.TagSubject(n.cfg.Prefix, d.Tag)
	if flush {
		name, subject = store.TableName(d.Table), invalidation.FlushSubject(n.cfg.Prefix, d.Table)
	}
	if g := n.groups[name]; g != nil {
		if !g.unheldSince.IsZero() {
			g.unheldSince = time.Time{} // held again: it lingers no more
			delete(n.lingering, name)
		}
		return g, nil
	}
	g := &group{name: name, subject: subject, flush: flush, table: d.Table}
	if n.bySubject[subject] == nil {
		// Broadcast: the wildcard subscription delivers it already.
		if !n.cfg.Broadcast {
			sub, err := n.cfg.NATS.ChanSubscribe(subject, n.events)
			if err != nil {
				return nil, fmt.Errorf("node: subscribe: %w", err)
			}
			n.subs[subject] = sub
		}
		n.bySubject[subject] = g
	} else {
		// Two names on one subject (a hash collision): share the
		// subscription; messages are matched by name.
		return nil, fmt.Errorf("node: groups %s and %s share subject %s", n.bySubject[subject].name, name, subject)
	}
	n.groups[name] = g
	n.toConfirm = append(n.toConfirm, g)
	n.m.groups.Set(float64(len(n.groups)))
	if !n.markerSent {
		n.markerSent = true
		go n.sendMarker()
	}
	return g, nil
}

// sendMarker flushes the connection (the server has then processed every
// subscription made before) and queues the marker behind whatever NATS
// delivered until then: the first heartbeat after the marker was routed
// after the subscriptions took effect.
func (n *Node) sendMarker() {
	if err := n.cfg.NATS.FlushTimeout(10 * time.Second); err != nil {
		n.cfg.Log.Warn("flush after subscribing", "err", err)
	}
	n.events <- n.marker
}

// maxConfirmBatch bounds the groups one confirmation asks JetStream about
// when queued batches are merged.
const maxConfirmBatch = 256

// mergeQueued adds the batches already queued behind batch to it (each
// group once), up to maxConfirmBatch groups: one JetStream round trip
// then confirms them all. Each batch's groups were proved subscribed
// before it was queued, so reading their last messages later is what
// waiting in the queue did anyway. A node far from the JetStream server
// (a leaf node across a WAN) would otherwise spend a round trip per
// heartbeat's batch and fall behind the heartbeats, leaving new versions
// unserved.
func (n *Node) mergeQueued(batch []*group) []*group {
	seen := make(map[*group]bool, len(batch))
	out := batch[:0:0]
	add := func(gs []*group) {
		for _, g := range gs {
			if !seen[g] {
				seen[g] = true
				out = append(out, g)
			}
		}
	}
	add(batch)
	for len(out) < maxConfirmBatch {
		select {
		case more := <-n.confirmCh:
			add(more)
			continue
		default:
		}
		break
	}
	return out
}

// confirmLoop asks JetStream, for each group whose subscription is proved
// effective, for its last invalidation, then confirms the versions that
// waited for it.
func (n *Node) confirmLoop(ctx context.Context) {
	name := invalidation.StreamName(n.cfg.Prefix)
	var (
		stream jetstream.Stream // kept across batches
		floors floorCache
		err    error
	)
	for {
		var batch []*group
		select {
		case <-ctx.Done():
			return
		case batch = <-n.confirmCh:
		}
		batch = n.mergeQueued(batch)
		if stream == nil {
			if stream, err = n.js.Stream(ctx, name); err != nil {
				n.retryLater(batch, err)
				continue
			}
		}

		type last struct {
			lsn     uint64
			changes []invalidation.Change
			found   bool
		}
		lasts := make([]last, len(batch))
		failed := false
		var found map[string]*jetstream.RawStreamMsg
		epochSubject := invalidation.EpochSubject(n.cfg.Prefix)
		if !skipJetStreamCheckForTest {
			// The groups' subjects and the invalidator's last epoch.
			if found, err = n.lastMessages(ctx, stream, append(batch[:len(batch):len(batch)], &group{subject: epochSubject})); err != nil {
				n.retryLater(batch, err)
				continue
			}
		}
		// The floor is read after the last messages: one that aged out
		// in between only raises it (a floor read first could claim
		// completeness from before a message it then did not see).
		floor, err := floors.of(ctx, stream)
		if err != nil {
			stream = nil // looked up again next time
			n.retryLater(batch, err)
			continue
		}
		if ctx.Err() != nil {
			return // answers cut short by the end of the node prove nothing
		}
		if skipJetStreamCheckForTest {
			floor = 0
		}
		// Nothing is known complete from before the invalidator's last
		// session began: it may have published other tag sets then.
		var epoch uint64
		if raw := found[epochSubject]; raw != nil {
			d, err := invalidation.Decode(raw.Data)
			if err != nil || d.Txn == nil {
				n.retryLater(batch, fmt.Errorf("epoch message: %v", err))
				continue
			}
			epoch = d.Txn.CommitLSN
		}
		floor = max(floor, epoch)
		for i, g := range batch {
			if skipJetStreamCheckForTest {
				continue
			}
			raw := found[g.subject]
			if raw == nil {
				continue
			}
			d, err := invalidation.Decode(raw.Data)
			if err != nil || d.Txn == nil {
				n.retryLater(batch, fmt.Errorf("last message of %s: %v", g.subject, err))
				failed = true
				break
			}
			lasts[i] = last{lsn: d.Txn.CommitLSN, changes: d.Txn.Changes, found: true}
		}
		if failed {
			continue
		}
		n.mu.Lock()
		for i, g := range batch {
			if n.groups[g.name] != g {
				continue // forgotten since (a gap)
			}
			g.confirmed = true
			since := floor
			if lasts[i].found {
				since = max(lasts[i].lsn-1, epoch)
			}
			g.completeSince = max(g.completeSince, since)
			if lasts[i].found {
				g.record(lasts[i].lsn, lasts[i].changes, n.cfg.HistoryDepth)
			}
			// Live entries older than what is proved complete stay: they
			// are true, just not known to be all.
			for _, p := range g.waiting {
				if p.left < 0 {
					continue
				}
				p.left--
				if p.left == 0 {
					lo, hi := n.intervalLocked(p.snapshot, p.groups, p.deps)
					if err := n.cfg.Backend.Confirm(ctx, p.key, p.snapshot, lo, hi); err != nil {
						n.backendErr(err)
						n.cfg.Log.Warn("confirm version", "err", err)
					}
					n.leases.release(p.key)
				}
			}
			g.waiting = nil
		}
		n.mu.Unlock()
	}
}

// lastMultiMax bounds the subjects of one multi_last direct get (the
// server answers at most 1 024 messages a request).
const lastMultiMax = 512

// SyncQueueLen is an option for a node's NATS connection. A multi_last
// direct get (jetstreamext.GetLastMsgsFor, the confirmations) reads its
// answer through a synchronous subscription whose channel is made at the
// connection's SubChanLen: 64 Ki messages (512 KiB) by default, for an
// answer of at most lastMultiMax+1 messages. Made for every confirmation,
// those channels were half of what an application with an L1 allocated,
// and drove its garbage collector.
func SyncQueueLen() nats.Option { return nats.SyncQueueLen(2 * lastMultiMax) }

// lastMultiTimeout bounds the wait for a multi_last answer; one that
// does not come whole in time is completed one subject at a time.
var lastMultiTimeout = 5 * time.Second

// lastMessages returns the last message JetStream holds on each group's
// subject (absent: none). It asks for many subjects at once (a direct get
// with multi_last) when the stream allows direct gets, and one at a time
// otherwise, or for the subjects a batch answer did not reach (its
// byte limit).
func (n *Node) lastMessages(ctx context.Context, stream jetstream.Stream, batch []*group) (map[string]*jetstream.RawStreamMsg, error) {
	found := make(map[string]*jetstream.RawStreamMsg, len(batch))
	var subjects []string
	seen := make(map[string]bool, len(batch))
	for _, g := range batch {
		if !seen[g.subject] {
			seen[g.subject] = true
			subjects = append(subjects, g.subject)
		}
	}
	var rest []string // subjects to ask one at a time
	if info := stream.CachedInfo(); info == nil || !info.Config.AllowDirect {
		rest = subjects
	} else {
		for len(subjects) > 0 {
			chunk := subjects[:min(len(subjects), lastMultiMax)]
			subjects = subjects[len(chunk):]
			// An answer is complete only when it says so: the server's
			// "no messages", or a last message with nothing pending after
			// it. An answer that stops short (the server's byte limit, a
			// late reply: the request gives up without an error, a
			// subscription closed under it) leaves the chunk's other
			// subjects to be asked one at a time, which reports errors.
			rctx, cancel := context.WithTimeout(ctx, lastMultiTimeout)
			msgs, err := jetstreamext.GetLastMsgsFor(rctx, n.js, info.Config.Name, chunk)
			if err != nil {
				cancel()
				return nil, err
			}
			complete := false
			for m, err := range msgs {
				if errors.Is(err, jetstreamext.ErrNoMessages) {
					complete = true // none of the chunk's subjects has a message
					break
				}
				if err != nil {
					cancel()
					return nil, err
				}
				found[m.Subject] = m
				complete = m.Header.Get("Nats-Num-Pending") == "0"
			}
			cancel()
			if !complete {
				for _, s := range chunk {
					if found[s] == nil {
						rest = append(rest, s)
					}
				}
			}
		}
	}
	for _, s := range rest {
		raw, err := stream.GetLastMsgForSubject(ctx, s)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		found[s] = raw
	}
	return found, nil
}

// floorCache finds the LSN of the oldest message JetStream still holds
// (invalidations after it are all in the stream) for a loop that asks
// often: the stream's state is read each time (the floor only rises as
// messages age out), but the LSN of its first message only when that
// message is another (a sequence number of the same stream, made at the
// same time, always names the same message).
type floorCache struct {
	created  time.Time
	firstSeq uint64
	lsn      uint64
}

func (fc *floorCache) of(ctx context.Context, s jetstream.Stream) (uint64, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	if info.State.Msgs == 0 {
		return 0, errors.New("the invalidation stream is empty")
	}
	if fc.lsn != 0 && info.State.FirstSeq == fc.firstSeq && info.Created.Equal(fc.created) {
		return fc.lsn, nil
	}
	lsn, err := lsnAt(ctx, s, info.State.FirstSeq)
	if err != nil {
		return 0, err
	}
	fc.created, fc.firstSeq, fc.lsn = info.Created, info.State.FirstSeq, lsn
	return lsn, nil
}

// awaitLocked marks g to be confirmed after the next heartbeat.
func (n *Node) awaitLocked(g *group) {
	if !g.awaitingHB {
		g.awaitingHB = true
		n.awaiting = append(n.awaiting, g)
	}
}

func (n *Node) retryLater(batch []*group, err error) {
	n.m.errors.WithLabelValues("confirm").Inc()
	n.cfg.Log.Warn("cannot confirm groups yet", "groups", len(batch), "err", err)
	n.mu.Lock()
	for _, g := range batch {
		if n.groups[g.name] == g {
			n.awaitLocked(g) // the next heartbeat tries again
		}
	}
	n.mu.Unlock()
}

// DefaultLinger is how long a group no version depends on stays
// subscribed (Config.Linger).
const DefaultLinger = 10 * time.Second

// sweepLoop unsubscribes from groups no unsettled version depends on
// (Ferdinand's rule, with closed versions counted until they settle: a
// late or replayed message of the group may still shorten them) once they
// have been so for Config.Linger.
func (n *Node) sweepLoop(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for tick := 1; ; {
		var names []string
		select {
		case <-ctx.Done():
			return
		case names = <-n.released:
		case <-t.C:
			// Each tick looks at the lingering groups again; every
			// sweepAllTicks-th, at every group (a release notice lost to
			// a full queue, a group never held).
			all := tick%sweepAllTicks == 0
			tick++
			n.mu.Lock()
			from := n.lingering
			if all {
				from = n.groups
			}
			for name, g := range from {
				if g.confirmed {
					names = append(names, name)
				}
			}
			n.mu.Unlock()
		}
		n.unsubscribeUnheld(ctx, names)
	}
}

// sweepAllTicks: every how many sweeps (of 5 s) every group is looked at.
const sweepAllTicks = 12

// sweepChunk bounds the groups one sweep step looks at while it holds the
// node's lock (and the backend's, for a memory backend): lookups and the
// stream wait meanwhile.
const sweepChunk = 512

// unsubscribeUnheld unsubscribes from the groups of names no version
// depends on, a chunk at a time (in any order: a full sweep names every
// group, and sorting them cost more than looking).
func (n *Node) unsubscribeUnheld(ctx context.Context, names []string) {
	for len(names) > 0 {
		chunk := names[:min(len(names), sweepChunk)]
		names = names[len(chunk):]
		if !n.unsubscribeUnheldChunk(ctx, chunk) {
			return
		}
	}
}

// unsubscribeUnheldChunk unsubscribes from the groups of names no version
// depends on (once they have lingered); false when the backend failed.
func (n *Node) unsubscribeUnheldChunk(ctx context.Context, names []string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	held, err := n.cfg.Backend.Holds(ctx, names)
	if err != nil {
		n.backendErr(err)
		return false
	}
	now := time.Now()
	for i, name := range names {
		g := n.groups[name]
		if g == nil {
			continue
		}
		if held[i] || len(g.waiting) > 0 || !g.confirmed {
			g.unheldSince = time.Time{}
			delete(n.lingering, name)
			continue
		}
		if n.cfg.Linger > 0 {
			if g.unheldSince.IsZero() {
				g.unheldSince = now
				n.lingering[name] = g
			}
			if now.Sub(g.unheldSince) < n.cfg.Linger {
				continue // the sweep looks again
			}
		}
		if sub := n.subs[g.subject]; sub != nil {
			_ = sub.Unsubscribe()
			delete(n.subs, g.subject)
		}
		delete(n.bySubject, g.subject)
		delete(n.groups, name)
		delete(n.lingering, name)
	}
	n.m.groups.Set(float64(len(n.groups)))
	return true
}
