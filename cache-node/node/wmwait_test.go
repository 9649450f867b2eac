package node

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// TestLookupWaitsForTheWatermark: a lookup at a snapshot newer than the
// node's watermark (a pin placed a moment ago) waits for the next
// heartbeat when the key holds a version that would then serve it, and
// hits; a version already ended before the snapshot is a miss at once.
func TestLookupWaitsForTheWatermark(t *testing.T) {
	h := newHarness(t)
	h.n.cfg.WatermarkWait = 10 * time.Second // the heartbeat comes when the test lets it
	s := h.f.now()
	h.put("k", s, itemDep(1, "name"))
	h.put("gone", s, itemDep(2, "name"))
	h.served("k", s)
	h.served("gone", s)

	h.f.paused.Store(true) // the watermark stays where it is
	wm := h.n.Watermark()
	h.f.commit(invalidation.Change{Tag: "public.items(id)=3", Columns: []string{"name"}})
	ended := h.f.commit(invalidation.Change{Tag: "public.items(id)=2", Columns: []string{"name"}})
	// The node applies the change to "gone" (its end is known), though
	// its watermark has not moved.
	for deadline := time.Now().Add(20 * time.Second); ; {
		r, err := h.mem.Lookup(context.Background(), []byte("gone"), s, s, store.Open)
		if err != nil {
			t.Fatal(err)
		}
		if r.Miss == store.Hit && r.Hi == ended {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the change at %d never reached the node: %+v", ended, r)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if h.n.Watermark() != wm {
		t.Fatalf("watermark moved from %d to %d with heartbeats paused", wm, h.n.Watermark())
	}

	// Ended before the snapshot: nothing to wait for.
	if r := h.lookup("gone", ended, ended); r.Miss == store.Hit {
		t.Fatalf("an ended version served after its end: %+v", r)
	}
	if n := testutil.ToFloat64(h.n.m.watermarkWaits.WithLabelValues("reached")) + testutil.ToFloat64(h.n.m.watermarkWaits.WithLabelValues("timed_out")); n != 0 {
		t.Fatalf("%v waits for a key with nothing to serve", n)
	}

	// Still valid: the lookup at "ended" (beyond the watermark) waits.
	got := make(chan store.Result, 1)
	go func() {
		r, err := h.n.Lookup(context.Background(), []byte("k"), ended, ended, "")
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	select {
	case r := <-got:
		t.Fatalf("answered before the watermark reached the snapshot: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	h.f.paused.Store(false)
	r := <-got
	if r.Miss != store.Hit || !r.Open || r.Lo > s {
		t.Fatalf("after the heartbeat: %+v, want the open version", r)
	}
	if n := testutil.ToFloat64(h.n.m.watermarkWaits.WithLabelValues("reached")); n != 1 {
		t.Fatalf("watermark waits reached: %v, want 1", n)
	}

	// No heartbeat within the wait: the miss is answered.
	h.n.cfg.WatermarkWait = 20 * time.Millisecond
	h.f.paused.Store(true)
	late := h.f.commit(invalidation.Change{Tag: "public.items(id)=3", Columns: []string{"name"}})
	if r := h.lookup("k", late, late); r.Miss == store.Hit {
		t.Fatalf("served beyond the watermark: %+v", r)
	}
	if n := testutil.ToFloat64(h.n.m.watermarkWaits.WithLabelValues("timed_out")); n != 1 {
		t.Fatalf("watermark waits timed out: %v, want 1", n)
	}
	h.f.paused.Store(false)
}

// TestNoWatermarkWaitPastAnOwedGap: while a gap's end is owed (the
// backend refused to end the versions there), a lookup at or beyond that
// end cannot be served however far the watermark moves, so it does not
// wait for it.
func TestNoWatermarkWaitPastAnOwedGap(t *testing.T) {
	h := newHarness(t)
	h.n.cfg.WatermarkWait = time.Hour
	s := h.f.now()
	h.put("k", s, itemDep(1, "name"))
	h.served("k", s)
	h.f.paused.Store(true) // the watermark stays where it is
	wm := h.n.Watermark()
	h.n.owedAtomic.Store(wm + 1) // as endOpenLocked leaves it when EndOpen fails
	defer h.n.owedAtomic.Store(0)
	if r := h.lookup("k", wm+5, wm+5); r.Miss == store.Hit {
		t.Fatalf("served past an owed gap: %+v", r)
	}
	if n := testutil.ToFloat64(h.n.m.watermarkWaits.WithLabelValues("reached")) + testutil.ToFloat64(h.n.m.watermarkWaits.WithLabelValues("timed_out")); n != 0 {
		t.Fatalf("%v watermark waits past an owed gap's end, want none", n)
	}
}
