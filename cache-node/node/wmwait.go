package node

import (
	"context"
	"time"

	"github.com/larderdb/larder/cache-node/store"
)

// DefaultWatermarkWait is how long a lookup whose range begins beyond the
// watermark waits for it, when the key holds a version that would then
// serve it. Heartbeats follow published transactions within milliseconds
// (the publisher's nudges), so a transaction at a pin placed a moment ago
// (typically a read right after its session wrote) finds the node a
// heartbeat behind: waiting for it is a hit; not waiting, a miss that
// runs the query on PostgreSQL again and puts the same result back.
const DefaultWatermarkWait = 20 * time.Millisecond

// setWatermarkLocked publishes the watermark to lookups and wakes those
// waiting for it (n.mu held).
func (n *Node) setWatermarkLocked(wm uint64) {
	n.wmAtomic.Store(wm)
	n.wmMu.Lock()
	if n.wmCh != nil {
		close(n.wmCh)
		n.wmCh = nil
	}
	n.wmMu.Unlock()
}

// watermarkChanged returns a channel closed at the next watermark change.
func (n *Node) watermarkChanged() <-chan struct{} {
	n.wmMu.Lock()
	defer n.wmMu.Unlock()
	if n.wmCh == nil {
		n.wmCh = make(chan struct{})
	}
	return n.wmCh
}

// awaitWatermark decides, for a lookup that missed with tmin beyond the
// watermark wm, whether a version of the key would serve the range once
// the watermark reached tmin (a lookup that ignores the watermark, never
// served), and if so waits up to wait for it (WatermarkWait, or less for
// a protocol lookup: no more than the wait its request carries). It reports whether
// the watermark reached tmin; the caller then looks up again, under the
// usual rules.
func (n *Node) awaitWatermark(ctx context.Context, key []byte, tmin, tmax uint64, miss store.Result, wait time.Duration) bool {
	if wait <= 0 || (miss.Miss != store.MissStaleness && miss.Miss != store.MissConsistency) || n.owedBefore(tmin) {
		return false
	}
	if r, err := n.cfg.Backend.Lookup(ctx, key, tmin, tmax, store.Open); err != nil || r.Miss != store.Hit {
		return false // nothing the watermark would make servable
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		ch := n.watermarkChanged()
		if n.servableThrough() >= tmin {
			n.m.watermarkWaits.WithLabelValues("reached").Inc()
			return true
		}
		if n.owedBefore(tmin) {
			// A gap began meanwhile: nothing is served at tmin until
			// its end is applied, and then the versions end before it.
			n.m.watermarkWaits.WithLabelValues("timed_out").Inc()
			return false
		}
		select {
		case <-ch:
		case <-t.C:
			n.m.watermarkWaits.WithLabelValues("timed_out").Inc()
			return false
		case <-ctx.Done():
			n.m.watermarkWaits.WithLabelValues("timed_out").Inc()
			return false
		}
	}
}

// owedBefore reports whether a gap's end still owed lies at or before ts:
// no version is served at ts then, however far the watermark moves (once
// the end is applied, every version ends before it).
func (n *Node) owedBefore(ts uint64) bool {
	owed := n.owedAtomic.Load()
	return owed != 0 && owed <= ts
}

// servableThrough is the newest timestamp lookups may serve: the
// watermark, or below a gap's end still owed.
func (n *Node) servableThrough() uint64 {
	wm := n.Watermark()
	if owed := n.owedAtomic.Load(); owed != 0 {
		wm = min(wm, owed-1)
	}
	return wm
}
