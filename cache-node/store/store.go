package store

import (
	"context"
	"errors"
	"math"

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
// BenchmarkMemoryOverhead (struct, slice and map-entry costs, index sets).
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
	// On a hit: the version's interval as served. A still-valid version
	// is reported valid up to the watermark: Hi = watermark+1, Open true.
	Lo, Hi   uint64
	Open     bool
	Snapshot uint64
	Value    []byte
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
type Backend interface {
	// Lookup returns the version of key with the highest Snapshot whose
	// interval, with an open Hi read as watermark+1, intersects
	// [tmin, tmax]. Pending versions are skipped. A miss is classified.
	Lookup(ctx context.Context, key []byte, tmin, tmax, watermark uint64) (Result, error)
	// Put stores v under key unless a version with the same Snapshot is
	// there already (then it is a no-op). It may evict other versions.
	Put(ctx context.Context, key []byte, v *Version) error
	// Confirm makes a pending version servable with the interval the node
	// computed: Lo = lo, Hi = min(Hi, hi).
	Confirm(ctx context.Context, key []byte, snapshot, lo, hi uint64) error
	// Invalidate applies one transaction's changes at commit LSN lsn to
	// every open version (Hi == Open, pending or not) with Snapshot < lsn:
	// a change hits a version holding its tag when Change.Hits(dep.Reads,
	// dep.AllColumns); a flush hits every version with a dep on the table.
	// A hit version gets Hi = lsn. A closed version is final.
	Invalidate(ctx context.Context, lsn uint64, changes []invalidation.Change) error
	// EndOpen ends every open version at hi: what a node does when it
	// cannot prove its stream has no gap.
	EndOpen(ctx context.Context, hi uint64) error
	// Holds reports, for each tag or table, whether an open version still
	// depends on it (tags by name; tables as "table:" + name).
	Holds(ctx context.Context, names []string) ([]bool, error)
	Stats(ctx context.Context) (Stats, error)
	Close() error
}

// Persistent is implemented by backends whose data outlives the node
// (Redis). The node saves its watermark as it advances; after a restart it
// ends every open version at the saved watermark + 1 before serving, since
// it cannot prove what happened while it was away.
type Persistent interface {
	SaveWatermark(ctx context.Context, wm uint64) error
	SavedWatermark(ctx context.Context) (wm uint64, ok bool, err error)
}

// GroupLister is implemented by persistent backends that can list the
// groups their open versions depend on: tags by name and tables as
// TableName(table). A restarted node subscribes to them and replays the
// invalidations it missed instead of ending those versions.
type GroupLister interface {
	OpenGroups(ctx context.Context) ([]string, error)
}
