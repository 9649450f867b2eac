package node

import (
	"sort"
	"time"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// group is the node's knowledge of one NATS group: a tag, or a table's
// flushes.
type group struct {
	name    string // tag name, or store.TableName(table)
	subject string
	flush   bool // a table's flush group
	table   string

	confirmed bool
	// complete: every invalidation of the group with LSN > completeSince
	// is in hist (valid once confirmed).
	completeSince uint64
	hist          []histEntry // by LSN, ascending, at most historyDepth
	waiting       []*pendingPut

	awaitingHB bool // marker seen; the next heartbeat starts the JetStream check
	// unheldSince is when the sweep first found no version depending on
	// the group (zero: held, or not looked at since); it lingers.
	unheldSince time.Time
}

type histEntry struct {
	lsn     uint64
	changes []invalidation.Change // the changes of the group in that transaction
}

// pendingPut is a version waiting for its groups to be confirmed.
type pendingPut struct {
	key      []byte
	snapshot uint64
	deps     []store.Dep
	groups   []*group
	left     int // groups not yet confirmed
}

// record adds a transaction's changes to the group's history.
func (g *group) record(lsn uint64, changes []invalidation.Change, depth int) {
	i := sort.Search(len(g.hist), func(i int) bool { return g.hist[i].lsn >= lsn })
	if i < len(g.hist) && g.hist[i].lsn == lsn {
		return // seen (a republished message, or JetStream's copy of a live one)
	}
	g.hist = append(g.hist, histEntry{})
	copy(g.hist[i+1:], g.hist[i:])
	g.hist[i] = histEntry{lsn: lsn, changes: changes}
	for len(g.hist) > depth {
		// Forgetting the oldest entry: knowledge now starts after it.
		if g.hist[0].lsn > g.completeSince {
			g.completeSince = g.hist[0].lsn
		}
		g.hist = g.hist[1:]
	}
}

// hits reports whether a transaction's changes to this group hit dep.
func (g *group) hits(e histEntry, d store.Dep) bool {
	for i := range e.changes {
		c := &e.changes[i]
		if g.flush {
			if c.Flush && c.Tag == d.Table {
				return true
			}
			continue
		}
		if !c.Flush && c.Tag == d.Tag && c.Hits(d.Reads, d.AllColumns) {
			return true
		}
	}
	return false
}

// interval returns what the group proves about a result computed at
// snapshot s that depends on it through d: valid on [lo, hi). It needs
// the group confirmed.
//
// History is complete only after completeSince, and (while a replay runs)
// only up to the watermark; the caller keeps lo at s for a snapshot beyond
// the watermark. An entry at or before completeSince (a replayed message
// older than what JetStream's last message proved) says nothing about what
// followed it, so lo never drops below completeSince. hi may come from an
// entry beyond the watermark while an older message is still to be
// replayed: that is safe, since the backend shortens a closed version when
// the older message arrives and never serves beyond the watermark.
func (g *group) interval(s uint64, d store.Dep) (lo, hi uint64) {
	lo, hi = 0, store.Open
	if g.completeSince > s {
		// Invalidations in (s, completeSince] are unknown: valid at s only.
		return s, s + 1
	}
	lo = g.completeSince
	for _, e := range g.hist {
		if !g.hits(e, d) {
			continue
		}
		if e.lsn <= s {
			lo = max(lo, e.lsn)
		} else {
			return lo, e.lsn
		}
	}
	return lo, hi
}
