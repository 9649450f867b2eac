package larder

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
)

// pinTracker keeps the pincushion's pins: announced ones as they come, and
// the list asked for at start and after NATS reconnects. It also tracks
// whether the pincushion is placing pins now: one that is alive but whose
// commit log does not advance (its invalidator is not replicating) answers
// verify requests only after its own wait, and a read-only transaction
// that found no pin must not wait for it (see placing).
type pinTracker struct {
	mu   sync.Mutex
	pins []invalidation.Pin // by LSN
	sub  *nats.Subscription
	rel  *nats.Subscription // released pins
	// lastPin is when the newest pin was announced (Unix ns, local time),
	// or taken for one learnt from a list; stalled when a verify request
	// last went unanswered in time. A pin announced after a stall ends it.
	lastPin, stalled atomic.Int64
	// resumed is signalled when pins are announced again after a silence
	// (the invalidator may have restarted: its tag sets are asked again).
	resumed chan struct{}
	silence time.Duration
	// announced counts the pins announced since the tracker started.
	announced atomic.Int64
}

func newPinTracker(nc *nats.Conn, prefix string, silence time.Duration) (*pinTracker, error) {
	p := &pinTracker{resumed: make(chan struct{}, 1), silence: silence}
	sub, err := nc.Subscribe(invalidation.PinAnnounceSubject(prefix), func(m *nats.Msg) {
		pin, err := invalidation.DecodePin(m.Data)
		if err == nil {
			now := time.Now()
			if !p.placing(now) {
				select {
				case p.resumed <- struct{}{}:
				default:
				}
			}
			raise(&p.lastPin, now.UnixNano())
			p.announced.Add(1)
			p.add(pin)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("larder: subscribe to pins: %w", err)
	}
	p.sub = sub
	// Released pins are forgotten at once: the pincushion holds a few
	// dozen, and a tracker keeping every pin announced until it expires
	// would hold thousands (one per demand) and try released ones.
	rel, err := nc.Subscribe(invalidation.PinReleaseSubject(prefix), func(m *nats.Msg) {
		if pin, err := invalidation.DecodePin(m.Data); err == nil {
			p.remove(pin)
		}
	})
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("larder: subscribe to pin releases: %w", err)
	}
	p.rel = rel
	return p, nil
}

// askList asks the pincushion for the pins it holds (when NATS is
// connected; at most wait).
func (p *pinTracker) askList(ctx context.Context, nc *nats.Conn, prefix string, wait time.Duration) {
	if !nc.IsConnected() {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	reply, err := nc.RequestWithContext(rctx, invalidation.PinListSubject(prefix), nil)
	if err != nil {
		return
	}
	pins, err := invalidation.DecodePinList(reply.Data)
	if err != nil {
		return
	}
	now := time.Now()
	for _, pin := range pins {
		p.add(pin)
		t := pin.TakenAt
		if t.After(now) {
			t = now
		}
		raise(&p.lastPin, t.UnixNano())
	}
}

// placing reports whether the pincushion is placing pins now: one was
// announced within the silence, and no verify request went unanswered
// since.
func (p *pinTracker) placing(now time.Time) bool {
	last := p.lastPin.Load()
	return last != 0 && now.UnixNano()-last <= int64(p.silence) && p.stalled.Load() < last
}

// raise sets v to x unless it holds more already.
func raise(v *atomic.Int64, x int64) {
	for {
		old := v.Load()
		if old >= x || v.CompareAndSwap(old, x) {
			return
		}
	}
}

// stall records a verify request that went unanswered in time: until the
// next pin, transactions do not ask.
func (p *pinTracker) stall(now time.Time) { p.stalled.Store(now.UnixNano()) }

func (p *pinTracker) add(pin invalidation.Pin) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := sort.Search(len(p.pins), func(i int) bool { return p.pins[i].LSN >= pin.LSN })
	if i < len(p.pins) && p.pins[i].LSN == pin.LSN {
		// Two pins see the same commits: keep the one taken later (the
		// pincushion holds that one and releases the older; an older one
		// may also be of a server run that ended).
		if pin.TakenAt.After(p.pins[i].TakenAt) {
			p.pins[i] = pin
		}
		return
	}
	p.pins = append(p.pins, invalidation.Pin{})
	copy(p.pins[i+1:], p.pins[i:])
	p.pins[i] = pin
}

// candidates returns the live pins taken at or after since with an LSN at
// or after minLSN, oldest first; expired pins are dropped.
func (p *pinTracker) candidates(since time.Time, minLSN uint64) []invalidation.Pin {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	live := p.pins[:0]
	for _, pin := range p.pins {
		if pin.ExpiresAt.After(now.Add(time.Second)) {
			live = append(live, pin)
		}
	}
	p.pins = live
	keep := func(pin invalidation.Pin) bool { return !pin.TakenAt.Before(since) && pin.LSN >= minLSN }
	n := 0
	for _, pin := range p.pins {
		if keep(pin) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	// One allocation per transaction, in LSN order (ROTx.narrow relies on
	// it).
	out := make([]invalidation.Pin, 0, n)
	for _, pin := range p.pins {
		if keep(pin) {
			out = append(out, pin)
		}
	}
	return out
}

// newest returns the timestamp of the newest pin known (0: none).
func (p *pinTracker) newest() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pins) == 0 {
		return 0
	}
	return p.pins[len(p.pins)-1].LSN
}

// remove forgets a pin the pincushion released, or PostgreSQL no longer
// knows (released early, or exported by a server run that ended); not
// another pin at its LSN.
func (p *pinTracker) remove(gone invalidation.Pin) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, pin := range p.pins {
		if pin.Same(gone) {
			p.pins = append(p.pins[:i], p.pins[i+1:]...)
			return
		}
	}
}

// dropThrough forgets every pin at or before lsn: a table was truncated
// or rewritten after it, which snapshots that old cannot read.
func (p *pinTracker) dropThrough(lsn uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := sort.Search(len(p.pins), func(i int) bool { return p.pins[i].LSN > lsn })
	p.pins = append(p.pins[:0], p.pins[i:]...)
}

func (p *pinTracker) close() {
	_ = p.sub.Unsubscribe()
	_ = p.rel.Unsubscribe()
}
