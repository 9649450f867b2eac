package storetest

import (
	"context"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// Reference is the specification of store.Backend written as plainly as
// possible — linear scans, no indexes, no budget — for differential tests.
type Reference struct {
	versions []refVersion
}

type refVersion struct {
	key string
	v   store.Version
}

var _ store.Backend = (*Reference)(nil)

// Lookup implements store.Backend.
func (r *Reference) Lookup(_ context.Context, key []byte, tmin, tmax, wm uint64) (store.Result, error) {
	var best *store.Version
	miss := store.MissCompulsory
	for i := range r.versions {
		x := &r.versions[i]
		if x.key != string(key) || x.v.Pending {
			continue
		}
		hi := x.v.Hi
		if hi == store.Open && wm != store.Open {
			hi = wm + 1
		}
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
	hi, isOpen := best.Hi, best.Hi == store.Open
	if isOpen && wm != store.Open {
		hi = wm + 1
	}
	return store.Result{Miss: store.Hit, Lo: best.Lo, Hi: hi, Open: isOpen, Snapshot: best.Snapshot, Value: best.Value}, nil
}

// Put implements store.Backend.
func (r *Reference) Put(_ context.Context, key []byte, v *store.Version) error {
	for _, x := range r.versions {
		if x.key == string(key) && x.v.Snapshot == v.Snapshot {
			return nil
		}
	}
	r.versions = append(r.versions, refVersion{string(key), *v})
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

// Invalidate implements store.Backend.
func (r *Reference) Invalidate(_ context.Context, lsn uint64, changes []invalidation.Change) error {
	for i := range r.versions {
		x := &r.versions[i]
		if x.v.Snapshot >= lsn || x.v.Hi != store.Open {
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

// EndOpen implements store.Backend.
func (r *Reference) EndOpen(_ context.Context, hi uint64) error {
	for i := range r.versions {
		if r.versions[i].v.Hi == store.Open {
			r.versions[i].v.Hi = hi
		}
	}
	return nil
}

// Holds implements store.Backend.
func (r *Reference) Holds(_ context.Context, names []string) ([]bool, error) {
	out := make([]bool, len(names))
	for i, n := range names {
		for _, x := range r.versions {
			if x.v.Hi != store.Open {
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
