package pincushion

import (
	"sync"
	"time"

	"github.com/larderdb/larder/internal/invalidation"
)

// How long pins are kept follows the clients: each announces the largest
// staleness limit its read-only transactions used (EncodeStalenessDemand
// on PinHorizonSubject) every few seconds. A pin older than every
// client's limit is of use to no transaction, and each pin holds back
// PostgreSQL's horizon: row versions a held snapshot may still see are not
// cleaned up, so a hot table bloats and every read and write of it slows
// down.
const (
	// DemandWindow is how long a client's staleness demand counts: clients
	// announce theirs every invalidation.PinDemandInterval, so a live
	// client always has one in the window.
	DemandWindow = 3 * invalidation.PinDemandInterval
	// demandMargin is added to the largest demand: clocks of the client
	// and the invalidator's hosts differ a little, and a transaction
	// imports its pin a moment after choosing it.
	demandMargin = time.Second
	// minKeep is the least a pin is kept however small the demands.
	minKeep = time.Second
	// maxDemands bounds the demands remembered (clients × announcements
	// in the window); past it the smallest is forgotten first.
	maxDemands = 4096
)

// demand is one client's announcement.
type demand struct {
	at        time.Time
	staleness time.Duration
}

// horizon remembers the staleness demands of the last DemandWindow.
type horizon struct {
	mu      sync.Mutex
	demands []demand // oldest first
}

// note records a demand heard at now.
func (h *horizon) note(now time.Time, staleness time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.forget(now)
	if len(h.demands) >= maxDemands {
		smallest := 0
		for i, d := range h.demands {
			if d.staleness < h.demands[smallest].staleness {
				smallest = i
			}
		}
		h.demands = append(h.demands[:smallest], h.demands[smallest+1:]...)
	}
	h.demands = append(h.demands, demand{at: now, staleness: staleness})
}

// forget drops the demands older than DemandWindow.
func (h *horizon) forget(now time.Time) {
	n := 0
	for n < len(h.demands) && now.Sub(h.demands[n].at) > DemandWindow {
		n++
	}
	if n > 0 {
		h.demands = append(h.demands[:0], h.demands[n:]...)
	}
}

// keep is how long a pin is kept at now: the largest demand of the window
// plus the margin, within [minKeep, limit]; limit itself when no client
// announced any (clients of an earlier version, or none yet).
func (h *horizon) keep(now time.Time, limit time.Duration) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.forget(now)
	if len(h.demands) == 0 {
		return limit
	}
	var largest time.Duration
	for _, d := range h.demands {
		largest = max(largest, d.staleness)
	}
	return min(max(largest+demandMargin, minKeep), limit)
}
