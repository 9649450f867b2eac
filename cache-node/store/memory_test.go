package store_test

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/cache-node/store/storetest"
	"github.com/larderdb/larder/internal/invalidation"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, budget int64) store.Backend { return store.NewMemory(budget, nil) })
}

func TestMemoryAgainstReference(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		storetest.Differential(t, store.NewMemory(1<<30, nil), &storetest.Reference{}, seed, 3000)
	}
}

func TestReleaseCallback(t *testing.T) {
	var released []string
	storetest.Run(t, func(t *testing.T, budget int64) store.Backend {
		return store.NewMemory(budget, func(names []string) { released = append(released, names...) })
	})
	if len(released) == 0 {
		t.Fatal("no release callbacks")
	}
}

// TestLegacyAgainstReference: the order-dependent behaviour that
// store.OrderDependentForTest restores is the old specification's.
func TestLegacyAgainstReference(t *testing.T) {
	store.OrderDependentForTest.Store(true)
	m := store.NewMemory(1<<30, nil)
	store.OrderDependentForTest.Store(false)
	storetest.Differential(t, m, &storetest.Reference{Legacy: true}, 1, 3000)
}

// An absorbing version takes in the changes that name their rows, and
// serves their keys; a change that names none, a flush or keys past
// invalidation.MaxKeys end it. A version that does not absorb ends at
// the first.
func TestMemoryAbsorbs(t *testing.T) {
	ctx := context.Background()
	m := store.NewMemory(1<<20, nil)
	dep := store.Dep{Tag: "public.items(category)=1", Table: "public.items", Reads: []string{"category", "end_date", "id"}}
	put := func(key string, absorbs bool) {
		t.Helper()
		if err := m.Put(ctx, []byte(key), &store.Version{Lo: 10, Hi: store.Open, Snapshot: 10, Deps: []store.Dep{dep}, Value: []byte(key), Absorbs: absorbs}); err != nil {
			t.Fatal(err)
		}
	}
	at := func(key string, ts uint64) store.Result {
		t.Helper()
		r, err := m.Lookup(ctx, []byte(key), ts, ts, store.Open)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	change := func(lsn uint64, c invalidation.Change) {
		t.Helper()
		c.Tag = dep.Tag
		if err := m.Invalidate(ctx, lsn, []invalidation.Change{c}); err != nil {
			t.Fatal(err)
		}
	}
	put("members", true)
	put("plain", false)
	change(20, invalidation.Change{Rows: true, Keys: []string{"7"}})
	change(30, invalidation.Change{Columns: []string{"end_date"}, Keys: []string{"3", "7"}})
	change(35, invalidation.Change{Columns: []string{"name"}}) // a column it does not read
	if r := at("members", 40); r.Miss != store.Hit || !r.Open || !slices.Equal(r.Absorbed, []string{"3", "7"}) {
		t.Fatalf("absorbing version after two keyed changes: %+v", r)
	}
	if r := at("plain", 40); r.Miss == store.Hit {
		t.Fatalf("a version that does not absorb served after a keyed change: %+v", r)
	}
	if r := at("plain", 15); r.Miss != store.Hit || r.Hi != 20 {
		t.Fatalf("a version that does not absorb ends at the first change: %+v", r)
	}
	change(50, invalidation.Change{Rows: true}) // rows not named
	if r := at("members", 60); r.Miss == store.Hit {
		t.Fatalf("absorbing version served after a change naming no rows: %+v", r)
	}
	if r := at("members", 45); r.Miss != store.Hit || r.Hi != 50 {
		t.Fatalf("absorbing version before the change naming no rows: %+v", r)
	}

	put("flushed", true)
	if err := m.Invalidate(ctx, 70, []invalidation.Change{{Tag: "public.items", Flush: true}}); err != nil {
		t.Fatal(err)
	}
	if r := at("flushed", 80); r.Miss == store.Hit {
		t.Fatalf("absorbing version served after a flush: %+v", r)
	}

	put("many", true)
	var keys []string
	for i := 0; i < invalidation.MaxKeys; i++ {
		keys = append(keys, fmt.Sprintf("%03d", i))
	}
	change(90, invalidation.Change{Rows: true, Keys: keys})
	if r := at("many", 95); r.Miss != store.Hit || len(r.Absorbed) != invalidation.MaxKeys {
		t.Fatalf("absorbing version after %d keys: %+v", len(keys), r)
	}
	change(100, invalidation.Change{Rows: true, Keys: []string{"999"}})
	if r := at("many", 105); r.Miss == store.Hit {
		t.Fatalf("absorbing version served past %d keys: %+v", invalidation.MaxKeys, r)
	}
}

// TestMemoryEvictsLeastRecentlyUsed checks eviction against a model: a
// small budget, keys with several versions each (an evicted version may
// be any of a key's: the newest, the oldest or one between), lookups that
// make a version the most recently used, and the tag index (Holds) after
// every operation. Each version is valid at its own snapshot only, so a
// lookup there hits exactly when the model holds it.
func TestMemoryEvictsLeastRecentlyUsed(t *testing.T) {
	ctx := context.Background()
	type held struct {
		key  string
		snap uint64
		tag  string
		size int64
	}
	for seed := int64(1); seed <= 10; seed++ {
		r := rand.New(rand.NewSource(seed))
		const budget = 8 << 10
		m := store.NewMemory(budget, nil)
		var lru []held // least recently used first
		var used int64
		tags := []string{"public.t(id)=1", "public.t(id)=2", "public.t(id)=3"}
		for op := 0; op < 3000; op++ {
			if r.Intn(3) > 0 || len(lru) == 0 {
				key, snap := fmt.Sprintf("k%d", r.Intn(8)), uint64(10+r.Intn(200))
				known := false
				for _, h := range lru {
					known = known || h.key == key && h.snap == snap
				}
				v := store.Version{Lo: snap, Hi: snap + 1, Snapshot: snap, Value: make([]byte, r.Intn(600)),
					Deps: []store.Dep{{Tag: tags[r.Intn(len(tags))], Table: "public.t", AllColumns: true}}}
				if err := m.Put(ctx, []byte(key), &v); err != nil {
					t.Fatal(err)
				}
				if !known {
					lru = append(lru, held{key, snap, v.Deps[0].Tag, v.Size(len(key))})
					used += lru[len(lru)-1].size
					for used > budget {
						used -= lru[0].size
						lru = lru[1:]
					}
				}
			} else {
				i := r.Intn(len(lru))
				h := lru[i]
				res, err := m.Lookup(ctx, []byte(h.key), h.snap, h.snap, store.Open)
				if err != nil || res.Miss != store.Hit || res.Snapshot != h.snap {
					t.Fatalf("seed %d op %d: %s@%d held by the model, looked up: %+v, %v", seed, op, h.key, h.snap, res, err)
				}
				lru = append(append(lru[:i:i], lru[i+1:]...), h)
			}
			st, _ := m.Stats(ctx)
			if st.Versions != int64(len(lru)) || st.Bytes != used {
				t.Fatalf("seed %d op %d: store holds %d versions in %d bytes, the model %d in %d", seed, op, st.Versions, st.Bytes, len(lru), used)
			}
			hs, _ := m.Holds(ctx, tags)
			for i, tag := range tags {
				want := false
				for _, h := range lru {
					want = want || h.tag == tag
				}
				if hs[i] != want {
					t.Fatalf("seed %d op %d: Holds(%s) = %v, the model %v", seed, op, tag, hs[i], want)
				}
			}
		}
		for _, h := range lru { // every version the model holds, in the model's order
			if res, _ := m.Lookup(ctx, []byte(h.key), h.snap, h.snap, store.Open); res.Miss != store.Hit {
				t.Fatalf("seed %d: %s@%d held by the model, missed: %+v", seed, h.key, h.snap, res)
			}
		}
	}
}
