package pincushion

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Snapshot is a PostgreSQL MVCC snapshot with 64-bit ("full") transaction
// ids, as pg_current_snapshot()::text prints it: "xmin:xmax:xip1,xip2".
// A committed transaction is visible to it iff its xid is below Xmin, or
// below Xmax and not in Xip. Xip is ascending.
type Snapshot struct {
	Xmin, Xmax uint64
	Xip        []uint64
}

// maxSnapshotText bounds the text ParseSnapshot accepts (PostgreSQL's own
// limit on in-progress transactions is far below what this allows).
const maxSnapshotText = 1 << 22

// ParseSnapshot parses pg_current_snapshot()'s text form.
func ParseSnapshot(s string) (Snapshot, error) {
	if len(s) > maxSnapshotText {
		return Snapshot{}, fmt.Errorf("pincushion: snapshot text is %d bytes, over the %d limit", len(s), maxSnapshotText)
	}
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return Snapshot{}, fmt.Errorf("pincushion: snapshot %q: want xmin:xmax:xip-list", clip(s))
	}
	var snap Snapshot
	var err error
	if snap.Xmin, err = parseXID(parts[0]); err != nil {
		return Snapshot{}, fmt.Errorf("pincushion: snapshot %q: xmin: %w", clip(s), err)
	}
	if snap.Xmax, err = parseXID(parts[1]); err != nil {
		return Snapshot{}, fmt.Errorf("pincushion: snapshot %q: xmax: %w", clip(s), err)
	}
	if parts[2] != "" {
		fields := strings.Split(parts[2], ",")
		snap.Xip = make([]uint64, len(fields))
		for i, f := range fields {
			if snap.Xip[i], err = parseXID(f); err != nil {
				return Snapshot{}, fmt.Errorf("pincushion: snapshot %q: in-progress xid %d: %w", clip(s), i+1, err)
			}
		}
		sort.Slice(snap.Xip, func(i, j int) bool { return snap.Xip[i] < snap.Xip[j] })
	}
	if err := snap.Validate(); err != nil {
		return Snapshot{}, fmt.Errorf("pincushion: snapshot %q: %w", clip(s), err)
	}
	return snap, nil
}

func parseXID(s string) (uint64, error) {
	if s == "" {
		return 0, errors.New("empty")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a decimal transaction id", clip(s))
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is out of range", clip(s))
	}
	return v, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Validate checks Xmin <= Xmax and that Xip is strictly ascending within
// [Xmin, Xmax).
func (s Snapshot) Validate() error {
	if s.Xmin > s.Xmax {
		return fmt.Errorf("xmin %d is past xmax %d", s.Xmin, s.Xmax)
	}
	for i, x := range s.Xip {
		if x < s.Xmin || x >= s.Xmax {
			return fmt.Errorf("in-progress xid %d is outside [xmin %d, xmax %d)", x, s.Xmin, s.Xmax)
		}
		if i > 0 && x <= s.Xip[i-1] {
			return fmt.Errorf("in-progress xid %d is listed twice", x)
		}
	}
	return nil
}

// String returns the snapshot in pg_current_snapshot()'s text form.
func (s Snapshot) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatUint(s.Xmin, 10))
	b.WriteByte(':')
	b.WriteString(strconv.FormatUint(s.Xmax, 10))
	b.WriteByte(':')
	for i, x := range s.Xip {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(x, 10))
	}
	return b.String()
}

// Widen returns the full (epoch-qualified) id of a 32-bit xid as decoded
// from the WAL. The server keeps every xid still of interest within 2^31
// of the next one, so the xid is read as the one within 2^31 of Xmax:
// below it for an older transaction, at or above it for one that started
// after the snapshot. (Taking Xmax's epoch and stepping back one epoch
// when the result exceeds Xmax would turn a transaction that started after
// the snapshot into an ancient, visible one.)
func (s Snapshot) Widen(xid uint32) uint64 {
	d := int32(xid - uint32(s.Xmax))
	if d >= 0 {
		full := s.Xmax + uint64(d)
		if full < s.Xmax {
			return math.MaxUint64 // past the last epoch; cannot happen on a real server
		}
		return full
	}
	back := uint64(-int64(d))
	if back > s.Xmax {
		return uint64(xid) // before the first epoch; cannot happen on a real server
	}
	return s.Xmax - back
}

// VisibleFull reports whether a committed transaction with full id x is
// visible to the snapshot.
func (s Snapshot) VisibleFull(x uint64) bool {
	if x < s.Xmin {
		return true
	}
	if x >= s.Xmax {
		return false
	}
	i := sort.Search(len(s.Xip), func(i int) bool { return s.Xip[i] >= x })
	return i == len(s.Xip) || s.Xip[i] != x
}

// Visible reports whether a committed transaction with 32-bit xid xid is
// visible to the snapshot.
func (s Snapshot) Visible(xid uint32) bool { return s.VisibleFull(s.Widen(xid)) }

// Verify decides whether snap is exact against the commit log and returns
// its timestamp.
//
// w must be pg_current_wal_insert_lsn() read after the snapshot was taken
// (in the same statement that exported it, say): every commit the
// snapshot sees then has a commit LSN below w, and every commit at or past
// w is invisible to it. The log must be complete through w-1, i.e. know
// every commit below w (WaitThrough); otherwise Verify says so and ok is
// false.
//
// With L the largest commit LSN below w among the logged commits the
// snapshot sees, the snapshot is exact iff no commit at or below L is
// invisible to it; its timestamp is then the largest T such that every
// commit at or below T is visible and every commit in (T, w) invisible:
// the LSN of the first commit after L, minus one, or w-1 if no commit lies
// between L and w.
//
// The log only knows commits above its boundary (its start, or the newest
// commit dropped by retention). Verify needs a visible commit above the
// boundary: a snapshot that sees none could be older than the log, so it
// is reported as not verifiable rather than guessed at. Commits at or
// below the boundary are taken as visible when the snapshot sees a later
// logged commit, with one check that survives retention: the log keeps
// the newest xid it ever recorded up to each commit, so a commit at or
// below L whose xid is at or past Xmax is found even after it was dropped.
// What cannot be checked is an in-progress xid of the snapshot that
// committed before the boundary; that would need a transaction whose
// commit record precedes every retained commit (a million commits by
// default) yet which was still in the proc array when a later retained
// commit became visible.
//
// reason explains a refusal; it is empty when ok.
func Verify(log *CommitLog, snap Snapshot, w uint64) (ts uint64, ok bool, reason string) {
	if err := snap.Validate(); err != nil {
		return 0, false, "invalid snapshot: " + err.Error()
	}
	if w == 0 {
		return 0, false, "invalid WAL insert LSN 0"
	}
	log.mu.RLock()
	defer log.mu.RUnlock()
	if !log.started {
		return 0, false, "commit log has received nothing yet"
	}
	if log.through < w-1 {
		return 0, false, fmt.Sprintf("commit log is complete through %s only, not up to W %s", fmtLSN(log.through), fmtLSN(w))
	}
	if log.boundary >= w-1 {
		return 0, false, fmt.Sprintf("commit log starts at %s, not before W %s", fmtLSN(log.boundary), fmtLSN(w))
	}

	// Sanity: nothing at or past w may be visible, else w was not read
	// after the snapshot and nothing below can be trusted.
	for i := len(log.entries) - 1; i >= log.head && log.entries[i].lsn >= w; i-- {
		e := log.entries[i]
		if snap.Visible(e.xid) {
			return 0, false, fmt.Sprintf("xid %d committed at %s, at or past W %s, is visible: W was not read after the snapshot",
				snap.Widen(e.xid), fmtLSN(e.lsn), fmtLSN(w))
		}
	}

	// L: the newest visible commit below w; next: the oldest commit above it.
	idxL := -1
	var next uint64
	hasNext := false
	for i := log.indexAtOrBelowLocked(w - 1); i >= log.head; i-- {
		e := log.entries[i]
		if snap.Visible(e.xid) {
			idxL = i
			break
		}
		next, hasNext = e.lsn, true
	}
	if idxL < 0 {
		return 0, false, fmt.Sprintf("no commit the snapshot sees is in the commit log (boundary %s, %d commits below W %s): cannot place it",
			fmtLSN(log.boundary), log.indexAtOrBelowLocked(w-1)-log.head+1, fmtLSN(w))
	}
	l := log.entries[idxL].lsn

	// Invisible commits at or below L: in-progress xids that committed...
	for _, x := range snap.Xip {
		lsn, found := log.byXID[uint32(x)]
		if found && lsn <= l {
			return 0, false, fmt.Sprintf("xid %d is in progress in the snapshot but committed at %s, before visible commit at %s: not a prefix of the commit stream",
				x, fmtLSN(lsn), fmtLSN(l))
		}
	}
	// ...and xids at or past xmax.
	if newest := snap.Widen(log.entries[idxL].newest); newest >= snap.Xmax {
		for i := idxL; i >= log.head; i-- {
			e := log.entries[i]
			if snap.Widen(e.xid) >= snap.Xmax {
				return 0, false, fmt.Sprintf("xid %d started after the snapshot (xmax %d) but committed at %s, before visible commit at %s: not a prefix of the commit stream",
					snap.Widen(e.xid), snap.Xmax, fmtLSN(e.lsn), fmtLSN(l))
			}
		}
		return 0, false, fmt.Sprintf("xid %d started after the snapshot (xmax %d) but committed before %s (at or below the log's boundary %s)",
			newest, snap.Xmax, fmtLSN(l), fmtLSN(log.boundary))
	}

	if hasNext {
		return next - 1, true, ""
	}
	return w - 1, true, ""
}

// fmtLSN prints an LSN the way PostgreSQL does.
func fmtLSN(lsn uint64) string { return fmt.Sprintf("%X/%X", uint32(lsn>>32), uint32(lsn)) }
