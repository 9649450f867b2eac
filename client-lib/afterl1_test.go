package larder

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The gate pauses lookups after L1 misses when the node's hit rate over a
// window is under 5%, lets one in gateProbeEvery through while paused,
// and resumes when the probes hit again.
func TestAfterL1GatePausesAndResumes(t *testing.T) {
	var g afterL1Gate
	// 10% hits: never paused.
	for i := range 4 * gateWindow {
		if !g.ask() {
			t.Fatalf("paused at lookup %d with a 10%% hit rate", i)
		}
		if c, _, _ := g.saw(i%10 == 0); c != 0 {
			t.Fatalf("changed (%d) at lookup %d with a 10%% hit rate", c, i)
		}
	}
	// No hits for a window: paused.
	paused := false
	for i := range gateWindow {
		if !g.ask() {
			t.Fatalf("paused before the window ended (lookup %d)", i)
		}
		if c, _, _ := g.saw(false); c == +1 {
			paused = i == gateWindow-1
		}
	}
	if !paused {
		t.Fatal("not paused after a window without hits")
	}
	// Paused: one in gateProbeEvery asks; probes that miss keep it paused.
	asked := 0
	for range gateProbeEvery * gateProbeWindow {
		if g.ask() {
			asked++
			if c, _, _ := g.saw(false); c != 0 {
				t.Fatalf("changed (%d) on probes without hits", c)
			}
		}
	}
	if asked != gateProbeWindow {
		t.Fatalf("%d of %d misses asked while paused, want %d", asked, gateProbeEvery*gateProbeWindow, gateProbeWindow)
	}
	// Probes that hit: resumed after a probe window.
	resumed := false
	for i := 0; !resumed && i < gateProbeEvery*gateProbeWindow; i++ {
		if g.ask() {
			c, _, _ := g.saw(true)
			resumed = c == -1
		}
	}
	if !resumed || !g.ask() || !g.ask() {
		t.Fatal("not resumed after a window of probes that hit")
	}
}

// A client with an L1 whose cache-node holds only what the L1 holds stops
// asking the node after the L1's misses, and asks again once the node
// holds what another client put there.
func TestNodeLookupsAfterL1MissesPauseAndResume(t *testing.T) {
	s := startStack(t)
	a := s.client(t, 64<<20)
	b := s.client(t, 64<<20)
	ctx := context.Background()
	readAll := func(c *Client, from, n int) {
		t.Helper()
		tx, err := c.BeginRO(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit(ctx)
		for id := from; id < from+n; id++ {
			var bal int
			if err := tx.QueryRow(ctx, readBalance, []any{id}, &bal); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
		}
	}
	// Keys neither the L1 nor the node holds: the node misses every one.
	readAll(a, 1000, 2*gateWindow)
	lookups, skips := a.stats.NodeLookups.Load(), a.stats.NodeSkips.Load()
	if skips == 0 || lookups >= 2*gateWindow-int64(gateWindow)/2 {
		t.Fatalf("after %d L1 misses the node never hit: %d lookups, %d skipped", 2*gateWindow, lookups, skips)
	}
	// Another client puts keys a has never read.
	const n = gateProbeEvery*gateProbeWindow + 2*gateWindow
	readAll(b, 100000, n)
	b.puts.Wait()
	hits := a.stats.NodeHits.Load()
	readAll(a, 100000, n)
	if got := a.stats.NodeHits.Load() - hits; got < int64(gateWindow) {
		t.Fatalf("a read %d keys the node held after its L1 missed them: %d node hits", n, got)
	}
	if !a.nodes[0].afterL1.ask() {
		t.Fatal("lookups after L1 misses still paused")
	}
}
