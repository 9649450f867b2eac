package storetest

import (
	"context"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// Reference is the specification of store.Backend written as plainly as
// possible — linear scans, no indexes, no budget — for differential tests.
// Its zero value follows the rules; Legacy makes it follow the old,
// order-dependent ones (store.OrderDependentForTest).
type Reference struct {
	Legacy   bool
	versions []refVersion
}

type refVersion struct {
	key     string
	v       store.Version
	settled bool // no invalidation can change it any more
}

var _ store.Backend = (*Reference)(nil)

// served is the Hi a lookup reports: never beyond the watermark.
func (r *Reference) served(hi, wm uint64) uint64 {
	if r.Legacy && hi != store.Open {
		return hi
	}
	if wm != store.Open && hi > wm+1 {
		return wm + 1
	}
	return hi
}

// Lookup implements store.Backend.
func (r *Reference) Lookup(_ context.Context, key []byte, tmin, tmax, wm uint64) (store.Result, error) {
	var best *store.Version
	miss := store.MissCompulsory
	for i := range r.versions {
		x := &r.versions[i]
		if x.key != string(key) || x.v.Pending {
			continue
		}
		hi := r.served(x.v.Hi, wm)
		if x.v.Lo <= tmax && hi > tmin && x.v.Lo < hi {
			if best == nil || x.v.Snapshot > best.Snapshot {
				best = &x.v
			}
			continue
		}
		if x.v.Lo > tmax || x.v.Lo >= hi {
			miss = store.MissConsistency
		} else if miss != store.MissConsistency {
			miss = store.MissStaleness
		}
	}
	if best == nil {
		return store.Result{Miss: miss}, nil
	}
	return store.Result{Miss: store.Hit, Lo: best.Lo, Hi: r.served(best.Hi, wm), Open: best.Hi == store.Open, Snapshot: best.Snapshot, Value: best.Value}, nil
}

// Put implements store.Backend.
func (r *Reference) Put(_ context.Context, key []byte, v *store.Version) error {
	for _, x := range r.versions {
		if x.key == string(key) && x.v.Snapshot == v.Snapshot {
			return nil
		}
	}
	r.versions = append(r.versions, refVersion{key: string(key), v: *v})
	return nil
}

// Confirm implements store.Backend.
func (r *Reference) Confirm(_ context.Context, key []byte, snapshot, lo, hi uint64) error {
	for i := range r.versions {
		x := &r.versions[i]
		if x.key == string(key) && x.v.Snapshot == snapshot {
			x.v.Lo, x.v.Pending = lo, false
			x.v.Hi = min(x.v.Hi, hi)
		}
	}
	return nil
}

// Invalidate implements store.Backend: open or closed, every unsettled
// version computed before lsn that the change hits ends at lsn at the
// latest, whatever the order the messages come in.
func (r *Reference) Invalidate(_ context.Context, lsn uint64, changes []invalidation.Change) error {
	for i := range r.versions {
		x := &r.versions[i]
		if x.v.Snapshot >= lsn || x.settled || (r.Legacy && x.v.Hi != store.Open) {
			continue
		}
		for _, c := range changes {
			for _, d := range x.v.Deps {
				if (c.Flush && d.Table == c.Tag) || (!c.Flush && d.Tag == c.Tag && c.Hits(d.Reads, d.AllColumns)) {
					x.v.Hi = min(x.v.Hi, lsn)
				}
			}
		}
	}
	return nil
}

// EndOpen implements store.Backend: every version, open or closed, ends at
// hi at the latest, and is settled.
func (r *Reference) EndOpen(_ context.Context, hi uint64) error {
	for i := range r.versions {
		x := &r.versions[i]
		if !r.Legacy || x.v.Hi == store.Open {
			x.v.Hi = min(x.v.Hi, hi)
		}
		x.settled = true
	}
	return nil
}

// Settle implements store.Backend.
func (r *Reference) Settle(_ context.Context, wm uint64) error {
	for i := range r.versions {
		x := &r.versions[i]
		if x.v.Hi != store.Open && (wm == store.Open || x.v.Hi <= wm+1) {
			x.settled = true
		}
	}
	return nil
}

// Holds implements store.Backend.
func (r *Reference) Holds(_ context.Context, names []string) ([]bool, error) {
	out := make([]bool, len(names))
	for i, n := range names {
		for _, x := range r.versions {
			if x.settled {
				continue
			}
			for _, d := range x.v.Deps {
				if d.Tag == n || store.TableName(d.Table) == n {
					out[i] = true
				}
			}
		}
	}
	return out, nil
}

// Stats implements store.Backend.
func (r *Reference) Stats(context.Context) (store.Stats, error) {
	keys := map[string]bool{}
	for _, x := range r.versions {
		keys[x.key] = true
	}
	return store.Stats{Keys: int64(len(keys)), Versions: int64(len(r.versions))}, nil
}

// Close implements store.Backend.
func (r *Reference) Close() error { return nil }
