package larder

import (
	"sync"
)

// afterL1Gate decides whether a read the L1 missed asks a cache-node.
//
// With one application server the node mostly holds what the L1 holds
// (the client put both), so a key the L1 misses the node misses too,
// and each such lookup is a round trip, with its TLS records on both
// sides, for nothing. The gate watches the node's hit rate on the
// lookups that follow L1 misses. When it falls under gateMinHitRate over
// a window of gateWindow lookups, only one L1 miss in gateProbeEvery
// asks the node (a probe); when the probes' hit rate over gateProbeWindow
// probes is at least gateMinHitRate again (other application servers
// put what this one does not hold), every L1 miss asks again. Puts are
// not gated: they are what other servers' lookups hit.
//
// A node lookup skipped costs nothing in correctness: the read is a miss
// and runs at the transaction's snapshot.
type afterL1Gate struct {
	mu       sync.Mutex
	skipping bool
	seen     int // L1 misses while skipping (picks the probes)
	lookups  int // in the current window
	hits     int
}

// The gate's tuning: a lookup after an L1 miss costs a round trip to the
// node; below gateMinHitRate it saves less than it costs.
const (
	gateWindow      = 256
	gateProbeWindow = 64
	gateProbeEvery  = 16
	gateMinHitRate  = 0.05
)

// ask says whether this L1 miss asks the node.
func (g *afterL1Gate) ask() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.skipping {
		return true
	}
	g.seen++
	return g.seen%gateProbeEvery == 0
}

// saw records a lookup's outcome (hit or not; a failed call is not
// recorded: the breaker deals with it) and says whether the gate changed:
// +1 it started skipping, -1 it stopped, 0 neither.
func (g *afterL1Gate) saw(hit bool) (changed int, hits, lookups int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lookups++
	if hit {
		g.hits++
	}
	window := gateWindow
	if g.skipping {
		window = gateProbeWindow
	}
	if g.lookups < window {
		return 0, 0, 0
	}
	hits, lookups = g.hits, g.lookups
	rate := float64(hits) / float64(lookups)
	g.lookups, g.hits = 0, 0
	switch {
	case !g.skipping && rate < gateMinHitRate:
		g.skipping, g.seen = true, 0
		return +1, hits, lookups
	case g.skipping && rate >= gateMinHitRate:
		g.skipping = false
		return -1, hits, lookups
	}
	return 0, hits, lookups
}
