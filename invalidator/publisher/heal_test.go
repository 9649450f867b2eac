package publisher

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/internal/invalidation"
)

// awaitThrough collects what s's publisher published until a heartbeat
// at or past lsn, failing at once when the session ends.
func (h *harness) awaitThrough(s *session, lsn pglogrepl.LSN) map[string]invalidation.Change {
	h.t.Helper()
	out := map[string]invalidation.Change{}
	timeout := time.After(60 * time.Second)
	for {
		select {
		case m := <-h.msgs:
			if m.Heartbeat != nil {
				if m.Heartbeat.LSN >= uint64(lsn) {
					return out
				}
				continue
			}
			for _, c := range m.Txn.Changes {
				k := c.Tag
				if c.Flush {
					k = "flush:" + c.Tag
				}
				out[k] = c
			}
		case <-s.done:
			h.t.Fatalf("the publisher stopped: %v", s.err)
		case <-timeout:
			h.t.Fatalf("no heartbeat past %s within a minute", lsn)
		}
	}
}

// A tag value too large for a NATS message (2 MB in a tag column) must
// not stop the publisher: the message that cannot be sent becomes a flush
// of its table, counted, and later changes are published as usual.
func TestOversizedTagFlushesItsTable(t *testing.T) {
	h := newHarness(t, `CREATE TABLE notes (id int PRIMARY KEY, title text); ALTER TABLE notes REPLICA IDENTITY FULL;
INSERT INTO notes VALUES (1, 'a'), (2, 'b');`)
	cfg := h.config()
	cfg.TagColumns = map[string][][]string{"public.notes": {{"id"}, {"title"}}}
	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := runSession(t, p)
	h.readStream()
	h.awaitThrough(s, h.walLSN())

	got := h.awaitThrough(s, h.exec("UPDATE notes SET title = repeat('x', 2 << 20) WHERE id = 1"))
	if _, ok := got["flush:public.notes"]; !ok {
		t.Errorf("a 2 MB tag value: published %v; want a flush of public.notes", keys(got))
	}
	if _, ok := got["public.notes(id)=1"]; !ok {
		t.Errorf("a 2 MB tag value: published %v; want also the small tags (public.notes(id)=1)", keys(got))
	}
	got = h.awaitThrough(s, h.exec("DELETE FROM notes WHERE id = 1")) // the old value is 2 MB
	if _, ok := got["flush:public.notes"]; !ok {
		t.Errorf("deleting the row: published %v; want a flush of public.notes", keys(got))
	}
	got = h.awaitThrough(s, h.exec("UPDATE notes SET title = 'c' WHERE id = 2"))
	for _, tag := range []string{"public.notes(title)=b", "public.notes(title)=c", "public.notes(id)=2"} {
		if _, ok := got[tag]; !ok {
			t.Errorf("a later change: published %v; want %s", keys(got), tag)
		}
	}
	if _, ok := got["flush:public.notes"]; ok {
		t.Errorf("a later, ordinary change flushed the table: %v", keys(got))
	}
	if v, _ := metricValue(t, reg, "larder_invalidator_oversized_messages_total", ""); v != 2 {
		t.Errorf("larder_invalidator_oversized_messages_total = %v; want 2", v)
	}
	if v, _ := metricValue(t, reg, "larder_invalidator_flushes_total", "oversized"); v != 2 {
		t.Errorf("larder_invalidator_flushes_total{reason=oversized} = %v; want 2", v)
	}
}

func keys(m map[string]invalidation.Change) []string {
	var out []string
	for k := range m {
		if len(k) > 80 {
			k = k[:80] + "…"
		}
		out = append(out, k)
	}
	return out
}

// logBuffer keeps what a logger wrote, and passes it to the test log.
type logBuffer struct {
	t  *testing.T
	mu sync.Mutex
	b  strings.Builder
}

func (w *logBuffer) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.b.Write(b)
	w.mu.Unlock()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func (w *logBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// WatchSlot exports the WAL the slot retains and its wal_status while no
// replication session runs, and logs the slot's invalidation.
func TestWatchSlotWithoutASession(t *testing.T) {
	h := newHarness(t, itemsDDL)
	cfg := h.config()
	cfg.TagColumns = itemsSets()
	h.start(cfg)
	h.step("INSERT INTO items VALUES (1, 5, 9, 'pen', 3)")
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	logs := &logBuffer{t: t}
	cfg.Metrics, cfg.SlotWatch = reg, 50*time.Millisecond
	cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { p.WatchSlot(ctx); close(watched) }()
	defer func() { cancel(); <-watched }()
	await := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s", what)
			}
		}
	}
	metric := func(name, label string) float64 {
		v, _ := metricValue(t, reg, name, label)
		return v
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := h.conn.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	await("wal_status reserved", func() bool { return metric("larder_invalidator_slot_wal_status", "reserved") == 1 })
	before := metric("larder_invalidator_slot_retained_wal_bytes", "")
	h.exec("UPDATE items SET qty = 4 WHERE id = 1")
	exec("SELECT pg_switch_wal()")
	await("retained WAL grows", func() bool { return metric("larder_invalidator_slot_retained_wal_bytes", "") > before })
	t.Logf("retained WAL: %.0f bytes, then %.0f", before, metric("larder_invalidator_slot_retained_wal_bytes", ""))
	if v := metric("larder_invalidator_slot_safe_wal_bytes", ""); v != -1 {
		t.Errorf("larder_invalidator_slot_safe_wal_bytes = %v without max_slot_wal_keep_size; want -1", v)
	}

	exec("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
	t.Cleanup(func() {
		_, _ = h.conn.Exec(context.Background(), "ALTER SYSTEM RESET max_slot_wal_keep_size")
		_, _ = h.conn.Exec(context.Background(), "SELECT pg_reload_conf()")
	})
	exec("SELECT pg_reload_conf()")
	for i := 0; i < 10 && metric("larder_invalidator_slot_wal_status", "lost") != 1; i++ {
		h.exec("UPDATE items SET qty = qty + 1 WHERE id = 1")
		exec("SELECT pg_switch_wal()")
		exec("CHECKPOINT")
		time.Sleep(200 * time.Millisecond)
	}
	await("wal_status lost", func() bool { return metric("larder_invalidator_slot_wal_status", "lost") == 1 })
	if metric("larder_invalidator_slot_wal_status", "reserved") != 0 {
		t.Error("wal_status reserved is still 1 once lost")
	}
	if !strings.Contains(logs.String(), "the replication slot was invalidated") {
		t.Error("the slot's invalidation was not logged")
	}
}

// A table created without a primary key while the invalidator runs is
// published (FOR ALL TABLES) and PostgreSQL refuses its UPDATEs: the
// invalidator names the table and the fix, exports it, and with
// FixReplicaIdentity runs the fix.
func TestTableWithoutIdentityCreatedWhileRunning(t *testing.T) {
	for _, fix := range []bool{false, true} {
		t.Run(fmt.Sprintf("fix=%v", fix), func(t *testing.T) {
			h := newHarness(t, itemsDDL)
			cfg := h.config()
			reg := prometheus.NewRegistry()
			logs := &logBuffer{t: t}
			cfg.TagColumns = itemsSets()
			cfg.Metrics, cfg.FixReplicaIdentity = reg, fix
			cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
			h.start(cfg)
			h.until(h.exec("CREATE TABLE nokey (v int)", "INSERT INTO nokey VALUES (1)"))
			if v, _ := metricValue(t, reg, "larder_invalidator_replica_identity_problems", "no_identity"); v != 1 && !fix {
				t.Errorf("larder_invalidator_replica_identity_problems{problem=no_identity} = %v; want 1", v)
			}
			if l := logs.String(); !strings.Contains(l, "public.nokey") || !strings.Contains(l, `ALTER TABLE public.nokey REPLICA IDENTITY FULL;`) {
				t.Errorf("no log names the table and the fix")
			}
			_, err := h.conn.Exec(context.Background(), "UPDATE nokey SET v = 2")
			if !fix {
				if err == nil {
					t.Fatal("PostgreSQL accepted an UPDATE of a published table without replica identity")
				}
				t.Logf("as expected: %v", err)
				return
			}
			for deadline := time.Now().Add(30 * time.Second); err != nil; _, err = h.conn.Exec(context.Background(), "UPDATE nokey SET v = 2") {
				if time.Now().After(deadline) {
					t.Fatalf("UPDATE still refused 30 s after the table's creation: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			h.until(h.walLSN())
			if v, _ := metricValue(t, reg, "larder_invalidator_replica_identity_problems", "no_identity"); v != 0 {
				t.Errorf("larder_invalidator_replica_identity_problems{problem=no_identity} = %v once fixed; want 0", v)
			}
		})
	}
}
