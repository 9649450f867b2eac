package larder

import (
	"slices"
	"testing"

	"github.com/larderdb/larder/internal/invalidation"
)

// TestNarrow: a hit keeps the candidates inside its validity, a run of
// them in LSN order; one that leaves none changes nothing; and narrowing
// allocates nothing (it runs on every hit).
func TestNarrow(t *testing.T) {
	pins := func(lsns ...uint64) []invalidation.Pin {
		out := make([]invalidation.Pin, len(lsns))
		for i, l := range lsns {
			out[i] = invalidation.Pin{LSN: l, SnapshotID: "s"}
		}
		return out
	}
	lsns := func(ps []invalidation.Pin) []uint64 {
		var out []uint64
		for _, p := range ps {
			out = append(out, p.LSN)
		}
		return out
	}
	tx := &ROTx{c: &Client{}, cands: pins(10, 20, 30, 40, 50)}
	for _, step := range []struct {
		lo, hi uint64
		ok     bool
		want   []uint64
	}{
		{0, 1 << 62, true, []uint64{10, 20, 30, 40, 50}},
		{15, 45, true, []uint64{20, 30, 40}},
		{31, 40, false, []uint64{20, 30, 40}}, // none inside: unchanged
		{30, 41, true, []uint64{30, 40}},
		{40, 41, true, []uint64{40}},
		{41, 100, false, []uint64{40}},
	} {
		if ok := tx.narrow(step.lo, step.hi); ok != step.ok || !slices.Equal(lsns(tx.cands), step.want) {
			t.Fatalf("narrow [%d, %d): %v, candidates %v; want %v, %v", step.lo, step.hi, ok, lsns(tx.cands), step.ok, step.want)
		}
	}
	tx.cands = pins(10, 20, 30, 40, 50)
	if n := testing.AllocsPerRun(100, func() { tx.narrow(5, 1<<62) }); n != 0 {
		t.Fatalf("narrow allocates %v times a hit", n)
	}
}
