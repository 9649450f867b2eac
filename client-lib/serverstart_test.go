package larder

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/internal/invalidation"
)

// TestPinFromAnotherServerRunIsNotImported: exported snapshot ids repeat
// across PostgreSQL restarts, so a pin a client still holds from before
// a restart can name a snapshot of the new server run, newer than the
// pin's timestamp. Imported, the transaction would read the newer
// snapshot believing it is at the pin's timestamp, and cache what it read
// under that timestamp. The test gives the client such a pin: the id of a
// snapshot exported after a write, a timestamp from before the write, and
// another server start. The client must not import it: it drops the pin
// (counted) and reads at the next pin or at a fresh snapshot, what it
// reads matching the timestamp it reads at.
func TestPinFromAnotherServerRunIsNotImported(t *testing.T) {
	s := startStack(t)
	t.Run("direct", func(t *testing.T) {
		c := s.client(t, 8<<20)
		testPinFromAnotherServerRun(t, s, c, 1, c)
	})
	t.Run("origin", func(t *testing.T) {
		var addr string
		var edgeTLS *tls.Config
		var oc *Client
		addr, edgeTLS, _, oc = startOriginPinned(t, s.url)
		c := s.openWith(t, []string{s.node}, 8<<20, true, func(cfg *Config) { cfg.Origin, cfg.OriginTLS = addr, edgeTLS })
		testPinFromAnotherServerRun(t, s, c, 2, oc)
		if n := testutil.ToFloat64(c.m.pinsOtherServer); n != 0 {
			t.Errorf("the edge counted %v pins of another server run: the origin's connection checks them", n)
		}
		if st := c.OriginStats(); st.Fallbacks != 0 || st.Statements == 0 {
			t.Errorf("origin: %d fallbacks, %d statements; want every miss at the origin", st.Fallbacks, st.Statements)
		}
	})
}

// testPinFromAnotherServerRun reads account id in c at a pin of another
// server run; checker is the client whose connections import the pins
// (c, or the origin's).
func testPinFromAnotherServerRun(t *testing.T, s *stack, c *Client, id int, checker *Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A real pin from before the write, held by the pincushion.
	cands := c.pins.candidates(time.Now().Add(-time.Minute), 0)
	if len(cands) == 0 {
		t.Fatal("no pins")
	}
	good := cands[len(cands)-1]
	var start time.Time
	if err := s.conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&start); err != nil {
		t.Fatal(err)
	}
	if !good.ServerStart.Equal(start) {
		t.Fatalf("pin %s carries server start %v, the server started at %v", good.SnapshotID, good.ServerStart, start)
	}

	// The write, then a snapshot exported after it: its id is one a pin
	// of an earlier server run could carry.
	var beforeText string
	if err := s.conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&beforeText); err != nil {
		t.Fatal(err)
	}
	before, err := pglogrepl.ParseLSN(beforeText)
	if err != nil {
		t.Fatal(err)
	}
	if good.LSN >= uint64(before) {
		t.Fatalf("pin at %X is not before the write (WAL at %s)", good.LSN, beforeText)
	}
	if _, err := s.conn.Exec(ctx, "UPDATE accounts SET balance = 50 WHERE id = $1", id); err != nil {
		t.Fatal(err)
	}
	var afterText string
	if err := s.conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&afterText); err != nil {
		t.Fatal(err)
	}
	after, err := pglogrepl.ParseLSN(afterText)
	if err != nil {
		t.Fatal(err)
	}
	reused := exportSnapshot(t, s.url)

	// The pin of the earlier run: newer than good (tried first), older
	// than the write, another server start.
	stale := invalidation.Pin{SnapshotID: reused, LSN: good.LSN + 1, TakenAt: good.TakenAt, ExpiresAt: time.Now().Add(time.Minute),
		ServerStart: start.Add(-time.Hour)}
	_ = c.pins.sub.Unsubscribe() // no newer pins from here on
	c.pins.mu.Lock()
	c.pins.pins = []invalidation.Pin{good, stale}
	c.pins.mu.Unlock()
	counted := testutil.ToFloat64(checker.m.pinsOtherServer)

	tx, err := c.BeginRO(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var balance int
	if err := tx.QueryRow(ctx, readBalance, []any{id}, &balance); err != nil {
		t.Fatal(err)
	}
	ts, placed := tx.Timestamp(), tx.Placed()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("read balance %d at %X (placed %v); good pin at %X, stale pin at %X, write after %s", balance, ts, placed, good.LSN, stale.LSN, beforeText)
	if ts == stale.LSN {
		t.Fatalf("the transaction imported the pin of another server run: it reads at %X what a snapshot after the write sees (balance %d)", ts, balance)
	}
	switch {
	case placed && ts != 0 && ts < uint64(before):
		if balance != 100 {
			t.Fatalf("at %X, before the write, balance %d, want 100", ts, balance)
		}
	case balance != 50:
		t.Fatalf("at %X (placed %v), after the write, balance %d, want 50", ts, placed, balance)
	}
	if n := testutil.ToFloat64(checker.m.pinsOtherServer) - counted; n != 1 {
		t.Errorf("larder_client_pins_other_server_total went up by %v, want 1", n)
	}
	for _, p := range c.pins.candidates(time.Now().Add(-time.Hour), 0) {
		if p.SnapshotID == stale.SnapshotID {
			t.Errorf("the pin of another server run is still a candidate")
		}
	}

	// A pin whose server start is unknown (a version 1 pincushion's) is
	// imported as before.
	unknown := invalidation.Pin{SnapshotID: reused, LSN: uint64(after), TakenAt: time.Now(), ExpiresAt: time.Now().Add(time.Minute)}
	c.pins.mu.Lock()
	c.pins.pins = []invalidation.Pin{unknown}
	c.pins.mu.Unlock()
	counted = testutil.ToFloat64(checker.m.pinsOtherServer)
	tx, err = c.BeginRO(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.QueryRow(ctx, readBalanceVer, []any{id}, &balance, new(int)); err != nil {
		t.Fatal(err)
	}
	if tx.Timestamp() != unknown.LSN || balance != 50 {
		t.Fatalf("at a pin of unknown server start: balance %d at %X, want 50 at the pin's %X", balance, tx.Timestamp(), unknown.LSN)
	}
	if n := testutil.ToFloat64(checker.m.pinsOtherServer) - counted; n != 0 {
		t.Errorf("a pin of unknown server start was counted as another server's")
	}
}
