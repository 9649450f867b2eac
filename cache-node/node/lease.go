package node

import (
	"context"
	"sync"
	"time"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
)

// Load leases: a key missing at once for several clients is loaded from
// PostgreSQL once, not once per client. Each client collapses its own
// identical misses (singleflight); across application servers, the key's
// node (its master, in an overlay) is the one place that sees them all.
//
// The race, step by step (a lookup "with a wait" carries
// protocol.LookupRequest.Wait > 0):
//
//  1. A lookup with a wait misses and the key has no live lease: the node
//     records one, ending LoadLease from now, and answers the miss. Its
//     requester loads the key at its own pin and puts the result.
//  2. Another lookup with a wait misses while the lease lives: the node
//     holds it until the lease is released (the loader's put was refused,
//     or stored and servable: at once, or for a version that waited for
//     its new groups, once they are confirmed), the lease ends, the
//     request's wait runs out or its context ends, whichever is first;
//     then it looks the key up again and answers that.
//  3. That answer is an ordinary lookup of the waiter's own [tmin, tmax],
//     served by the same rules as any (nothing past the watermark, a
//     pending version not at all), and the client uses a hit only if it
//     fits its transaction's candidates. A load at a snapshot the waiter
//     cannot use leaves it a miss, and it loads at its own pin: no answer
//     depends on the loader's snapshot, so consistency is that of any
//     lookup, and the waiter's pin is honoured.
//  4. A loader that never puts (its read failed, its result was not
//     cacheable, went to its L1 only, or its node call failed) costs each
//     waiter at most its wait; the lease then ends by itself.
//  5. The first put of a key often subscribes to new groups (a keyed tag
//     nobody followed): its version is served only once they are
//     confirmed, a heartbeat later and more. Waiters whose wait ends
//     before that miss again and load — hit rate, never correctness.
//
// Only lookups with a wait take or honour leases: a client that does not
// ask to wait is answered at once, as before.

// DefaultLoadLease is how long a lease lasts when no put releases it:
// a load at a pin on PostgreSQL and the put after it take a few
// milliseconds; a lease that outlives a failed loader only delays the
// waiters, each by at most its own wait.
const DefaultLoadLease = 100 * time.Millisecond

// maxLeases bounds the live leases; beyond it a miss takes none (its
// requester loads, and so do the others).
const maxLeases = 1 << 16

type lease struct {
	done    chan struct{} // closed when the loader's put was handled
	expires time.Time
}

// leases are the node's live load leases.
type leases struct {
	mu        sync.Mutex
	m         map[string]*lease // by key; guarded by mu
	lastSweep time.Time         // guarded by mu
}

// acquire returns the key's live lease, or records a new one ending d
// from now and reports that the caller loads (then the lease may be nil,
// when there are too many).
func (ls *leases) acquire(key []byte, now time.Time, d time.Duration) (*lease, bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.m[string(key)]; l != nil && now.Before(l.expires) {
		return l, false
	}
	if now.Sub(ls.lastSweep) > time.Second || len(ls.m) >= maxLeases {
		ls.lastSweep = now
		for k, l := range ls.m {
			if !now.Before(l.expires) {
				delete(ls.m, k)
			}
		}
	}
	if len(ls.m) >= maxLeases {
		return nil, true
	}
	if ls.m == nil {
		ls.m = map[string]*lease{}
	}
	l := &lease{done: make(chan struct{}), expires: now.Add(d)}
	ls.m[string(key)] = l
	return l, true
}

// release wakes the waiters of the key's lease and ends it.
func (ls *leases) release(key []byte) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if l := ls.m[string(key)]; l != nil {
		close(l.done)
		delete(ls.m, string(key))
	}
}

// lookupWait answers a lookup of the protocol: Lookup, with the load
// lease of a miss when the request carries a wait.
func (n *Node) lookupWait(ctx context.Context, q protocol.LookupRequest) (store.Result, error) {
	// The watermark wait counts against the request's own wait: a
	// client's call deadline leaves room for that much only.
	r, err := n.lookup(ctx, q.Key, q.TMin, q.TMax, min(n.cfg.WatermarkWait, q.Wait))
	if err == nil && r.Miss != store.Hit && q.Wait > 0 && n.cfg.LoadLease > 0 {
		r, err = n.awaitLoad(ctx, q, r)
	}
	if err == nil {
		n.m.lookup(r.Miss, q.Template)
	}
	return r, err
}

// awaitLoad takes the key's lease for the requester of a miss, or waits
// for the load under way (see the steps above) and looks up again.
func (n *Node) awaitLoad(ctx context.Context, q protocol.LookupRequest, miss store.Result) (store.Result, error) {
	now := time.Now()
	l, loads := n.leases.acquire(q.Key, now, n.cfg.LoadLease)
	if loads {
		n.m.leases.WithLabelValues("granted").Inc()
		return miss, nil
	}
	t := time.NewTimer(min(q.Wait, l.expires.Sub(now)))
	defer t.Stop()
	select {
	case <-l.done:
	case <-t.C:
	case <-ctx.Done():
		n.m.leases.WithLabelValues("miss_after_wait").Inc()
		return miss, nil
	}
	r, err := n.lookup(ctx, q.Key, q.TMin, q.TMax, 0)
	if err == nil {
		if r.Miss == store.Hit {
			n.m.leases.WithLabelValues("hit_after_wait").Inc()
		} else {
			n.m.leases.WithLabelValues("miss_after_wait").Inc()
		}
	}
	return r, err
}
