package store

import (
	"context"
	"errors"
	"math"
	"sync/atomic"

	"github.com/larderdb/larder/internal/invalidation"
)

// Open is the Hi of a version that is still valid as far as the store knows.
const Open = math.MaxUint64

// Dep is one tag a version depends on, with the columns of its table the
// result reads (AllColumns: every column, e.g. SELECT *).
type Dep struct {
	Tag        string   // canonical tag name
	Table      string   // schema.table of the tag
	Reads      []string // sorted
	AllColumns bool
}

// Version is one cached result of a key, valid for the commit-LSN
// timestamps in [Lo, Hi).
type Version struct {
	Lo, Hi   uint64
	Snapshot uint64 // the timestamp it was computed at; Lo <= Snapshot < Hi
	Deps     []Dep
	Value    []byte
	// Pending versions are not served: the node has not yet proved it
	// knows every invalidation of their tags since Snapshot.
	Pending bool
	// Absorbs: a change of a dependency that names its rows
	// (invalidation.Change.Keys) does not end the version; its keys are
	// added to Absorbed instead (a client's membership of a result, which
	// reads those rows again: client-lib's repaired memberships). Any
	// other change ends it, as does a key past invalidation.MaxKeys. Only
	// the memory backend absorbs; the others end the version.
	Absorbs  bool
	Absorbed []string // sorted, distinct
}

// Size is what a version costs the byte budget: its value, its tags and a
// fixed overhead for the bookkeeping around it.
func (v *Version) Size(keyLen int) int64 {
	n := int64(len(v.Value) + keyLen + versionOverhead)
	for _, d := range v.Deps {
		n += int64(len(d.Tag) + len(d.Table) + depOverhead)
		for _, r := range d.Reads {
			n += int64(len(r) + 16)
		}
	}
	return n
}

// Bookkeeping bytes per version and per dependency, measured with
// BenchmarkMemoryOverhead (struct, slice and map-entry costs). Since the
// memory backend's bookkeeping became intrusive its heap is about 0.75 of
// what they account (value 100 B) — a margin left for what the budget does
// not count: a cache-node's groups and subscriptions per tag.
const (
	versionOverhead = 416
	depOverhead     = 160
)

// MissClass says why a lookup missed (TxCache's classification).
type MissClass uint8

const (
	Hit MissClass = iota
	// MissCompulsory: the key holds nothing.
	MissCompulsory
	// MissStaleness: only versions too old for the acceptable range.
	MissStaleness
	// MissCapacity: the key's versions were evicted.
	MissCapacity
	// MissConsistency: a fresh-enough version exists, but not inside the range.
	MissConsistency
)

func (m MissClass) String() string {
	switch m {
	case Hit:
		return "hit"
	case MissCompulsory:
		return "compulsory"
	case MissStaleness:
		return "staleness"
	case MissCapacity:
		return "capacity"
	case MissConsistency:
		return "consistency"
	}
	return "unknown"
}

// Result is the answer to a lookup.
type Result struct {
	Miss MissClass // Hit on a hit
	// On a hit: the version's interval as served, never beyond the
	// watermark: Hi = min(its Hi, watermark+1). Open says the version is
	// still valid as far as the node knows (its own Hi is open).
	Lo, Hi   uint64
	Open     bool
	Snapshot uint64
	Value    []byte
	// Absorbed are the keys of the rows whose changes an absorbing
	// version took in (Version.Absorbs) up to now.
	Absorbed []string
}

// Stats are a backend's counters.
type Stats struct {
	Keys, Versions, Bytes, Budget int64
	Evictions                     int64 // versions evicted for space
}

// ErrTooLarge is returned by Put for a version larger than the budget.
var ErrTooLarge = errors.New("store: version larger than the whole budget")

// Backend holds versions. Every method is safe for concurrent use. The
// node (package node) decides intervals; a backend stores them, answers
// lookups, and applies invalidations exactly as specified here, so that
// every backend gives the same answers (storetest checks it).
//
// Invalidation is order-independent: "tag X changed at LSN c" sets
// Hi = min(Hi, c) on a version computed before c whether it is open or
// already closed, so that an older message replayed after a newer one
// (a reconnect, a restart) still shortens what the newer one closed. A
// version therefore stays reachable by invalidations (in the tag and table
// indexes, and its groups followed) until it is settled: until the node's
// watermark w, up to which it has applied every invalidation of its
// groups, reaches Hi - 1 (nothing still on its way can end it earlier), or
// until a gap ends it (EndOpen). Settling is what keeps the indexes, and
// the node's subscriptions, as small as the open versions plus those that
// closed in the last moments.
type Backend interface {
	// Lookup returns the version of key with the highest Snapshot whose
	// interval, served as [Lo, min(Hi, watermark+1)), intersects
	// [tmin, tmax]. Every version, open or closed, is served only up to
	// the watermark: a closed one whose Hi is beyond it may still be
	// shortened by a message not yet delivered. Pending versions are
	// skipped. A miss is classified.
	Lookup(ctx context.Context, key []byte, tmin, tmax, watermark uint64) (Result, error)
	// Put stores v under key unless a version with the same Snapshot is
	// there already (then it is a no-op). It may evict other versions. A
	// new version is unsettled, whatever its Hi.
	Put(ctx context.Context, key []byte, v *Version) error
	// Confirm makes a pending version servable with the interval the node
	// computed: Lo = lo, Hi = min(Hi, hi).
	Confirm(ctx context.Context, key []byte, snapshot, lo, hi uint64) error
	// Invalidate applies one transaction's changes at commit LSN lsn to
	// every unsettled version (open or closed, pending or not) with
	// Snapshot < lsn: a change hits a version holding its tag when
	// Change.Hits(dep.Reads, dep.AllColumns); a flush hits every version
	// with a dep on the table. A hit version gets Hi = min(Hi, lsn).
	// (Settled versions are left alone: their Hi is at most the watermark
	// + 1 that settled them, and the node has applied every invalidation
	// up to that watermark already.)
	Invalidate(ctx context.Context, lsn uint64, changes []invalidation.Change) error
	// EndOpen sets Hi = min(Hi, hi) on every version, open or closed,
	// pending or not, and settles every version: what a node does when it
	// cannot prove its stream has no gap (hi - 1 is then the last
	// watermark it can vouch for). hi is never below the watermark + 1 of
	// an earlier Settle, so settled versions need no visit.
	EndOpen(ctx context.Context, hi uint64) error
	// Settle tells the backend that the node has applied every
	// invalidation of its groups up to watermark: every closed version
	// with Hi <= watermark + 1 is settled (it leaves the indexes; its
	// groups may be released). A persistent backend also saves the
	// watermark, in the same atomic step (see Persistent).
	Settle(ctx context.Context, watermark uint64) error
	// Holds reports, for each tag or table, whether an unsettled version
	// still depends on it (tags by name; tables as "table:" + name): the
	// node follows a group as long as an invalidation of it can still
	// change something.
	Holds(ctx context.Context, names []string) ([]bool, error)
	Stats(ctx context.Context) (Stats, error)
	Close() error
}

// ErrLost is returned (wrapped) by a backend that may have lost or
// reverted writes since the node last used it: its server restarted (or a
// replica took over) under the node, and an invalidation it had applied
// may be undone. Every method but SavedWatermark and EndOpen then fails
// with ErrLost until the node handles it as a gap: EndOpen(hi) on a lost
// backend ends every version at min(hi, its saved watermark + 1) (at 0 when
// it kept none) — what the server kept is proved only up to the watermark
// it kept, which was saved after every invalidation up to it.
var ErrLost = errors.New("store: the backend's server restarted and may have lost writes")

// OrderDependentForTest, when set, restores on purpose the old,
// order-dependent behaviour, so that tests can show that their checks
// catch it: a closed version is final (Invalidate and EndOpen skip it, and
// a lookup serves its Hi even beyond the watermark), and the node does not
// notice a backend that restarted under it. Backends read it when they are
// made; never set it outside tests.
var OrderDependentForTest atomic.Bool

// Persistent is implemented by backends whose data outlives the node
// (Redis). The node saves its watermark as it advances (Settle saves it
// together with the versions it settles, so that a copy of the data never
// holds a version settled beyond its saved watermark); after a restart it
// replays what it missed or else ends every version at the saved watermark
// + 1 before serving, since it cannot prove what happened while it was
// away.
type Persistent interface {
	SaveWatermark(ctx context.Context, wm uint64) error
	SavedWatermark(ctx context.Context) (wm uint64, ok bool, err error)
}

// GroupLister is implemented by persistent backends that can list the
// groups their unsettled versions depend on: tags by name and tables as
// TableName(table). A restarted node subscribes to them and replays the
// invalidations it missed instead of ending those versions.
type GroupLister interface {
	OpenGroups(ctx context.Context) ([]string, error)
}
