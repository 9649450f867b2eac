package larder

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
)

// pinTracker keeps the pincushion's pins: announced ones as they come, and
// the list asked for at start.
type pinTracker struct {
	mu   sync.Mutex
	pins []invalidation.Pin // by LSN
	sub  *nats.Subscription
}

func newPinTracker(ctx context.Context, nc *nats.Conn, prefix string) (*pinTracker, error) {
	p := &pinTracker{}
	sub, err := nc.Subscribe(invalidation.PinAnnounceSubject(prefix), func(m *nats.Msg) {
		pin, err := invalidation.DecodePin(m.Data)
		if err == nil {
			p.add(pin)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("larder: subscribe to pins: %w", err)
	}
	p.sub = sub
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if reply, err := nc.RequestWithContext(rctx, invalidation.PinListSubject(prefix), nil); err == nil {
		if pins, err := invalidation.DecodePinList(reply.Data); err == nil {
			for _, pin := range pins {
				p.add(pin)
			}
		}
	}
	return p, nil
}

func (p *pinTracker) add(pin invalidation.Pin) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := sort.Search(len(p.pins), func(i int) bool { return p.pins[i].LSN >= pin.LSN })
	if i < len(p.pins) && p.pins[i].LSN == pin.LSN {
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
	var out []invalidation.Pin
	for _, pin := range p.pins {
		if !pin.TakenAt.Before(since) && pin.LSN >= minLSN {
			out = append(out, pin)
		}
	}
	return out
}

// remove forgets a pin PostgreSQL no longer knows (released early).
func (p *pinTracker) remove(lsn uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, pin := range p.pins {
		if pin.LSN == lsn {
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

func (p *pinTracker) close() { _ = p.sub.Unsubscribe() }
