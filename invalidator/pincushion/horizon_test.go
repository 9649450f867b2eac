package pincushion

import (
	"testing"
	"time"
)

// TestHorizonKeep: pins are kept as long as the largest staleness demand
// of the window allows, plus the margin, within [minKeep, the limit]; the
// limit itself when no client announced one, or when the last
// announcement left the window.
func TestHorizonKeep(t *testing.T) {
	const limit = time.Minute
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	var h horizon
	if got := h.keep(t0, limit); got != limit {
		t.Fatalf("no demand: keep %s, want the limit %s", got, limit)
	}
	h.note(t0, 5*time.Second)
	h.note(t0.Add(time.Second), 2*time.Second)
	if got := h.keep(t0.Add(2*time.Second), limit); got != 6*time.Second {
		t.Fatalf("demands 5s and 2s: keep %s, want 6s", got)
	}
	// The 5 s demand leaves the window first.
	if got := h.keep(t0.Add(DemandWindow+500*time.Millisecond), limit); got != 3*time.Second {
		t.Fatalf("after the 5s demand left the window: keep %s, want 3s", got)
	}
	if got := h.keep(t0.Add(DemandWindow+2*time.Second), limit); got != limit {
		t.Fatalf("every demand left the window: keep %s, want the limit", got)
	}
	h.note(t0.Add(time.Hour), time.Millisecond)
	if want := max(time.Millisecond+demandMargin, minKeep); h.keep(t0.Add(time.Hour), limit) != want {
		t.Fatalf("a 1ms demand: keep %s, want %s", h.keep(t0.Add(time.Hour), limit), want)
	}
	h.note(t0.Add(time.Hour), 2*time.Hour)
	if got := h.keep(t0.Add(time.Hour), limit); got != limit {
		t.Fatalf("a demand over the limit: keep %s, want the limit", got)
	}
}

// TestHorizonBounded: past maxDemands the smallest demand is forgotten,
// never the largest.
func TestHorizonBounded(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	var h horizon
	h.note(t0, 40*time.Second)
	for i := 0; i < 2*maxDemands; i++ {
		h.note(t0, time.Second)
	}
	if len(h.demands) > maxDemands {
		t.Fatalf("%d demands remembered, at most %d", len(h.demands), maxDemands)
	}
	if got := h.keep(t0, time.Minute); got != 41*time.Second {
		t.Fatalf("keep %s, want 41s (the largest demand survives)", got)
	}
}
