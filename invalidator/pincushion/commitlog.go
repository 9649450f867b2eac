package pincushion

import (
	"context"
	"sort"
	"sync"
)

// DefaultRetain is a sensible retention for NewCommitLog: a million
// commits, some tens of MiB.
const DefaultRetain = 1 << 20

// maxRetain keeps the retained xids well within one half of the 32-bit
// xid circle, where they are unambiguous.
const maxRetain = 1 << 30

// commit is one decoded commit. newest is the newest xid (in PostgreSQL's
// circular xid order) among this commit and every commit before it,
// including the ones already dropped: it answers "did any commit at or
// before this LSN have an xid at or past a snapshot's xmax?" in O(1).
type commit struct {
	lsn    uint64
	xid    uint32
	newest uint32
}

// CommitLog is a record of recently decoded commits, in commit-LSN order.
// The replication decoder feeds it (Commit, Through); Verify reads it. It
// is safe for concurrent use.
//
// The log knows the commits in the LSN range (Boundary, ThroughLSN]:
// commits at or below the boundary were committed before the decoder's
// first event, or have been dropped to respect the retention.
type CommitLog struct {
	retain int

	mu       sync.RWMutex
	entries  []commit // entries[head:] are retained, ascending LSN
	head     int
	byXID    map[uint32]uint64
	started  bool
	boundary uint64
	through  uint64
	newest   uint32 // newest xid ever committed (valid when anyXID)
	anyXID   bool
	advanced chan struct{} // closed and replaced whenever through advances
}

// NewCommitLog returns an empty log keeping at most retain commits (the
// oldest are dropped first). retain < 1 means DefaultRetain; it is capped
// at 2^30.
func NewCommitLog(retain int) *CommitLog {
	if retain < 1 {
		retain = DefaultRetain
	}
	retain = min(retain, maxRetain)
	return &CommitLog{
		retain:   retain,
		byXID:    make(map[uint32]uint64),
		advanced: make(chan struct{}),
	}
}

// xidNewer reports whether a follows b in PostgreSQL's circular 32-bit xid
// order (valid for xids less than 2^31 apart, which the server guarantees
// for every xid still of interest).
func xidNewer(a, b uint32) bool { return int32(a-b) > 0 }

// Commit records a committed transaction: its top-level xid and commit
// LSN (pgoutput BEGIN's xid and final LSN). Calls come in commit-LSN
// order; a call whose LSN is not past the last recorded one is a replay
// and is ignored. Since commits arrive in order, Commit(x, lsn) also
// implies Through(lsn).
func (l *CommitLog) Commit(xid uint32, commitLSN uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started {
		l.started = true
		l.boundary = commitLSN - 1 // commits before the first one are unknown
		if commitLSN == 0 {
			l.boundary = 0
		}
	}
	if n := len(l.entries); n > l.head && commitLSN <= l.entries[n-1].lsn {
		return
	}
	if commitLSN <= l.boundary {
		return
	}
	if !l.anyXID || xidNewer(xid, l.newest) {
		l.newest = xid
		l.anyXID = true
	}
	l.entries = append(l.entries, commit{lsn: commitLSN, xid: xid, newest: l.newest})
	l.byXID[xid] = commitLSN
	for len(l.entries)-l.head > l.retain {
		old := l.entries[l.head]
		l.head++
		l.boundary = old.lsn
		if l.byXID[old.xid] == old.lsn {
			delete(l.byXID, old.xid)
		}
	}
	if l.head > 0 && l.head >= len(l.entries)/2 {
		n := copy(l.entries, l.entries[l.head:])
		clear(l.entries[n:])
		l.entries = l.entries[:n]
		l.head = 0
	}
	l.advanceLocked(commitLSN)
}

// Through records that every commit with commit LSN <= lsn has been passed
// to Commit. Regressions are ignored. The first call, if it precedes any
// Commit, also sets the boundary: commits at or below lsn are unknown.
func (l *CommitLog) Through(lsn uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started {
		l.started = true
		l.boundary = lsn
	}
	l.advanceLocked(lsn)
}

func (l *CommitLog) advanceLocked(lsn uint64) {
	if lsn <= l.through {
		return
	}
	l.through = lsn
	close(l.advanced)
	l.advanced = make(chan struct{})
}

// ThroughLSN returns the LSN up to which the log is complete (0 before the
// first event).
func (l *CommitLog) ThroughLSN() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.through
}

// Boundary returns the LSN at or below which commits are unknown to the
// log, and whether the log has received any event.
func (l *CommitLog) Boundary() (lsn uint64, started bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.boundary, l.started
}

// Len returns the number of commits retained.
func (l *CommitLog) Len() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.entries) - l.head
}

// WaitThrough blocks until the log is complete through lsn (a Through or
// Commit at or past it), or ctx ends.
func (l *CommitLog) WaitThrough(ctx context.Context, lsn uint64) error {
	for {
		l.mu.RLock()
		done, ch := l.through >= lsn, l.advanced
		l.mu.RUnlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Lookup returns the commit LSN of a retained commit of top-level xid xid.
func (l *CommitLog) Lookup(xid uint32) (lsn uint64, ok bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	lsn, ok = l.byXID[xid]
	return lsn, ok
}

// Descend calls fn for every retained commit with from >= LSN > to, newest
// first, until fn returns false.
func (l *CommitLog) Descend(from, to uint64, fn func(xid uint32, lsn uint64) bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for i := l.indexAtOrBelowLocked(from); i >= l.head && l.entries[i].lsn > to; i-- {
		if !fn(l.entries[i].xid, l.entries[i].lsn) {
			return
		}
	}
}

// indexAtOrBelowLocked returns the index of the newest retained commit
// with LSN <= lsn, or head-1 if there is none.
func (l *CommitLog) indexAtOrBelowLocked(lsn uint64) int {
	live := l.entries[l.head:]
	k := sort.Search(len(live), func(i int) bool { return live[i].lsn > lsn })
	return l.head + k - 1
}
