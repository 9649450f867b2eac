package publisher

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/internal/invalidation"
)

// metricValue reads the value of a metric with the given label value
// (any labels when label is "").
func metricValue(t *testing.T, reg *prometheus.Registry, name, label string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					match = true
				}
			}
			if !match {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// resumeAfterGap restarts the publisher on h's slot (after the test made
// a gap) and returns what it published until a heartbeat past the
// current WAL position, skipping what the earlier session published
// before from.
func (h *harness) resumeAfterGap(cfg Config, from pglogrepl.LSN) []invalidation.Message {
	h.t.Helper()
	rep := newReplicating()
	cfg.Commits = rep
	s := h.startPublisher(cfg)
	rep.wait(h.t, s)
	var out []invalidation.Message
	for _, m := range h.collectThrough(h.walLSN()) {
		if m.Heartbeat != nil && m.Heartbeat.LSN < uint64(from) {
			continue // the earlier session's
		}
		out = append(out, m)
	}
	return out
}

// dropSlot drops h's slot once the stopped publisher's walsender has
// released it.
func (h *harness) dropSlot() {
	h.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var active bool
		if err := h.conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", h.slot).Scan(&active); err != nil {
			h.t.Fatal(err)
		}
		if !active {
			break
		}
		if time.Now().After(deadline) {
			h.t.Fatal("the slot is still active a minute after the publisher stopped")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := h.conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", h.slot); err != nil {
		h.t.Fatal(err)
	}
}

// checkSlotFlush requires, first among msgs, a flush of every table at
// one LSN at or after gapEnd (the WAL position after the last commit of
// the gap), before any other message.
func checkSlotFlush(t *testing.T, msgs []invalidation.Message, gapEnd pglogrepl.LSN, tables ...string) {
	t.Helper()
	if len(msgs) == 0 {
		t.Fatal("nothing published after the gap")
	}
	if msgs[0].Txn == nil {
		t.Fatalf("the first message after the gap is not a flush but a heartbeat at %X (%d messages)", msgs[0].Heartbeat.LSN, len(msgs))
	}
	lsn := msgs[0].Txn.CommitLSN
	var got []string
	for _, m := range msgs {
		if m.Txn == nil || m.Txn.CommitLSN != lsn {
			break
		}
		for _, c := range m.Txn.Changes {
			if c.Flush {
				got = append(got, c.Tag)
			}
		}
	}
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(tables, " ") {
		t.Fatalf("flushed first after the gap (at %X): %v; want every table: %v", lsn, got, tables)
	}
	if lsn < uint64(gapEnd) {
		t.Fatalf("flushed at %X, before the end of the gap %s", lsn, gapEnd)
	}
}

// The slot was dropped while the invalidator was stopped, and a row
// changed meanwhile: the invalidator creates a new slot and flushes every
// table at its consistent point, after the gap, before anything else.
func TestRecreatedSlotFlushesEveryTable(t *testing.T) {
	h := newHarness(t, itemsDDL)
	cfg := h.config()
	cfg.TagColumns = itemsSets()
	h.start(cfg)
	h.step("INSERT INTO items VALUES (1, 5, 9, 'pen', 3)")
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	from := h.walLSN()
	h.dropSlot()
	gapEnd := h.exec("UPDATE items SET qty = 7 WHERE id = 1")

	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	msgs := h.resumeAfterGap(cfg, from)
	checkSlotFlush(t, msgs, gapEnd, "public.bids", "public.items", "public.users")
	if v, ok := metricValue(t, reg, "larder_invalidator_slots_created_total", "missing"); !ok || v != 1 {
		t.Errorf("larder_invalidator_slots_created_total{reason=missing} = %v (%v); want 1", v, ok)
	}
	if v, ok := metricValue(t, reg, "larder_invalidator_slot_wal_status", "reserved"); !ok || v != 1 {
		t.Errorf("larder_invalidator_slot_wal_status{status=reserved} = %v (%v); want 1", v, ok)
	}
	if _, ok := metricValue(t, reg, "larder_invalidator_slot_retained_wal_bytes", ""); !ok {
		t.Error("no larder_invalidator_slot_retained_wal_bytes")
	}
}

// A slot PostgreSQL invalidated (max_slot_wal_keep_size exceeded while
// the invalidator was stopped) is dropped and created again, with a flush
// of every table after the gap.
func TestLostSlotIsRecreatedAndFlushes(t *testing.T) {
	h := newHarness(t, itemsDDL)
	cfg := h.config()
	cfg.TagColumns = itemsSets()
	h.start(cfg)
	h.step("INSERT INTO items VALUES (1, 5, 9, 'pen', 3)")
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	from := h.walLSN()
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := h.conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
	t.Cleanup(func() {
		_, _ = h.conn.Exec(context.Background(), "ALTER SYSTEM RESET max_slot_wal_keep_size")
		_, _ = h.conn.Exec(context.Background(), "SELECT pg_reload_conf()")
	})
	exec("SELECT pg_reload_conf()")
	var status string
	for i := 0; i < 10 && status != "lost"; i++ {
		h.exec("UPDATE items SET qty = qty + 1 WHERE id = 1")
		exec("SELECT pg_switch_wal()")
		exec("CHECKPOINT")
		if err := h.conn.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", h.slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
	}
	if status != "lost" {
		t.Fatalf("the slot's wal_status is %s after 10 WAL switches", status)
	}
	gapEnd := h.exec("UPDATE items SET qty = 7 WHERE id = 1")
	exec("ALTER SYSTEM RESET max_slot_wal_keep_size")
	exec("SELECT pg_reload_conf()")

	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	msgs := h.resumeAfterGap(cfg, from)
	checkSlotFlush(t, msgs, gapEnd, "public.bids", "public.items", "public.users")
	if v, ok := metricValue(t, reg, "larder_invalidator_slots_created_total", "lost"); !ok || v != 1 {
		t.Errorf("larder_invalidator_slots_created_total{reason=lost} = %v (%v); want 1", v, ok)
	}
}
