package store_test

import (
	"testing"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/cache-node/store/storetest"
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
