package larder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/internal/invalidation"
)

// TestStorageFacts walks the storage check through its cases with
// snapshots exported by hand: the first transaction at a snapshot runs
// the whole check and records a fact; later ones use the quick check; a
// TRUNCATE moves the storage, so a transaction at a snapshot from before
// it is refused (ErrRetry) however it is checked, and one at a snapshot
// after it records a new fact.
func TestStorageFacts(t *testing.T) {
	s := startStackWith(t, `CREATE TABLE pets (id int PRIMARY KEY, name text NOT NULL); ALTER TABLE pets REPLICA IDENTITY FULL`,
		"INSERT INTO pets VALUES (1, 'rex')", "SELECT name FROM pets WHERE id = $1")
	c := s.client(t, 0)
	ctx := context.Background()
	tables := []string{"public.pets"}
	quick, full := c.m.storageChecks.WithLabelValues("quick"), c.m.storageChecks.WithLabelValues("full")
	hold := func(snapshot string, ts uint64) error {
		tx := &ROTx{c: c}
		defer func() { _ = tx.closeConn(ctx) }()
		return tx.begin(ctx, invalidation.Pin{SnapshotID: snapshot, LSN: ts}, tables)
	}
	want := func(step string, err error, wantErr error, q, f float64) {
		t.Helper()
		if !errors.Is(err, wantErr) || (err != nil && wantErr == nil) {
			t.Fatalf("%s: %v, want %v", step, err, wantErr)
		}
		if gq, gf := testutil.ToFloat64(quick), testutil.ToFloat64(full); gq != q || gf != f {
			t.Fatalf("%s: %v quick and %v full checks, want %v and %v", step, gq, gf, q, f)
		}
	}
	before := exportSnapshot(t, s.url)
	want("first at the old snapshot", hold(before, 100), nil, 0, 1)
	want("again", hold(before, 100), nil, 1, 1)
	if _, err := s.conn.Exec(ctx, "TRUNCATE pets"); err != nil {
		t.Fatal(err)
	}
	want("old snapshot after the TRUNCATE", hold(before, 100), errRewritten, 1, 2)
	after := exportSnapshot(t, s.url)
	want("new snapshot", hold(after, 200), nil, 1, 3)
	want("new snapshot again", hold(after, 200), nil, 2, 3)
	want("old snapshot, the fact is newer", hold(before, 100), errRewritten, 2, 4)
	if !errors.Is(errRewritten, ErrRetry) {
		t.Fatal("errRewritten is not an ErrRetry")
	}
}

// A transaction whose storage check fails after its locks were taken (the
// whole check, after the quick one found the storage moved, cut short by
// the caller's deadline) ends there: its connection goes back to the pool
// and its locks with it, so that a later TRUNCATE does not wait for ever.
func TestFailedStorageCheckReleasesTheConnection(t *testing.T) {
	s := startStackWith(t, `CREATE TABLE pets (id int PRIMARY KEY, name text NOT NULL); ALTER TABLE pets REPLICA IDENTITY FULL`,
		"INSERT INTO pets VALUES (1, 'rex')", "SELECT name FROM pets WHERE id = $1")
	c := s.client(t, 0)
	ctx := context.Background()
	snapshot := exportSnapshot(t, s.url)
	tables := []string{"public.pets"}
	first := &ROTx{c: c}
	if err := first.begin(ctx, invalidation.Pin{SnapshotID: snapshot, LSN: 100}, tables); err != nil {
		t.Fatal(err)
	}
	_ = first.closeConn(ctx)
	// The storage moves (the fact is now out of date); the whole check
	// that follows is cut short.
	if _, err := s.conn.Exec(ctx, "TRUNCATE pets"); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	beforeFullCheckForTest = cancel
	defer func() { beforeFullCheckForTest = nil }()
	tx := &ROTx{c: c}
	if err := tx.begin(cctx, invalidation.Pin{SnapshotID: snapshot, LSN: 100}, tables); err == nil {
		t.Fatal("the cut-short check passed")
	}
	if tx.conn != nil || tx.pooled != nil {
		t.Fatal("the transaction kept its connection after its check failed")
	}
	// (A connection released mid-transaction is closed, in the
	// background.)
	for deadline := time.Now().Add(10 * time.Second); c.pool.Stat().AcquiredConns() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d pooled connections still acquired", c.pool.Stat().AcquiredConns())
		}
	}
	// Nothing holds the table: a TRUNCATE goes through at once.
	tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
	defer tcancel()
	if _, err := s.conn.Exec(tctx, "TRUNCATE pets"); err != nil {
		t.Fatalf("TRUNCATE after the failed check: %v", err)
	}
}

// Two tables that swap names after a snapshot: a statement names tables
// as the catalog does now, so at the old snapshot it would read the
// other table's rows. The check refuses (ErrRetry), by the full check
// and through the quick one.
func TestTablesSwappedByName(t *testing.T) {
	s := startStackWith(t, `CREATE TABLE cats (id int PRIMARY KEY, name text NOT NULL); ALTER TABLE cats REPLICA IDENTITY FULL;
CREATE TABLE dogs (id int PRIMARY KEY, name text NOT NULL); ALTER TABLE dogs REPLICA IDENTITY FULL`,
		"INSERT INTO cats VALUES (1, 'tom'); INSERT INTO dogs VALUES (1, 'rex')", "SELECT name FROM cats WHERE id = $1")
	c := s.client(t, 0)
	ctx := context.Background()
	snapshot := exportSnapshot(t, s.url)
	hold := func() error {
		tx := &ROTx{c: c}
		defer func() { _ = tx.closeConn(ctx) }()
		return tx.begin(ctx, invalidation.Pin{SnapshotID: snapshot, LSN: 100}, []string{"public.cats"})
	}
	if err := hold(); err != nil { // records a fact for public.cats
		t.Fatal(err)
	}
	if _, err := s.conn.Exec(ctx, "ALTER TABLE cats RENAME TO tmp; ALTER TABLE dogs RENAME TO cats; ALTER TABLE tmp RENAME TO dogs"); err != nil {
		t.Fatal(err)
	}
	if err := hold(); !errors.Is(err, errRewritten) {
		t.Fatalf("after the swap, at the old snapshot: %v, want a refusal", err)
	}
	c.storage = storageFacts{} // and by the full check alone
	if err := hold(); !errors.Is(err, errRewritten) {
		t.Fatalf("after the swap, at the old snapshot, no facts: %v, want a refusal", err)
	}
}

// exportSnapshot exports a snapshot from a transaction of its own, held
// open until the test ends.
func exportSnapshot(t *testing.T, url string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	var id string
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT pg_export_snapshot()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestQuickCheckHoldsTheTables: a transaction whose tables pass the quick
// storage check holds ACCESS SHARE on every table (an inheritance child
// included), so a TRUNCATE waits for the transaction to end.
func TestQuickCheckHoldsTheTables(t *testing.T) {
	s := startStackWith(t, `CREATE TABLE pets (id int PRIMARY KEY, name text NOT NULL); ALTER TABLE pets REPLICA IDENTITY FULL;
CREATE TABLE animals (id int PRIMARY KEY); ALTER TABLE animals REPLICA IDENTITY FULL;
CREATE TABLE dogs (id int PRIMARY KEY) INHERITS (animals); ALTER TABLE dogs REPLICA IDENTITY FULL`,
		"INSERT INTO pets VALUES (1, 'rex')", "SELECT name FROM pets WHERE id = $1")
	c := s.client(t, 0)
	ctx := context.Background()
	tables := []string{"public.pets", "public.animals"}
	quick := c.m.storageChecks.WithLabelValues("quick")
	snapshot := exportSnapshot(t, s.url)
	first := &ROTx{c: c}
	if err := first.begin(ctx, invalidation.Pin{SnapshotID: snapshot, LSN: 100}, tables); err != nil {
		t.Fatal(err)
	}
	_ = first.closeConn(ctx)
	tx := &ROTx{c: c}
	if err := tx.begin(ctx, invalidation.Pin{SnapshotID: snapshot, LSN: 100}, tables); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.closeConn(ctx) }()
	if q := testutil.ToFloat64(quick); q != 1 {
		t.Fatalf("%v quick checks, want 1 (the second transaction's)", q)
	}
	var held []string
	rows, err := s.conn.Query(ctx, `SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = $1 AND l.mode = 'AccessShareLock' AND l.granted AND c.relname IN ('pets', 'animals', 'dogs') ORDER BY 1`, pgConnOf(tx.conn).PID())
	if err != nil {
		t.Fatal(err)
	}
	held, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(held) != "[animals dogs pets]" {
		t.Fatalf("the transaction holds ACCESS SHARE on %v, want animals, dogs and pets", held)
	}
	for _, table := range []string{"pets", "dogs"} {
		_, err := s.conn.Exec(ctx, "SET lock_timeout = '200ms'; TRUNCATE "+table+"; RESET lock_timeout")
		if err == nil || !strings.Contains(err.Error(), "lock timeout") {
			t.Fatalf("TRUNCATE %s while the transaction holds it: %v, want a lock timeout", table, err)
		}
		if _, err := s.conn.Exec(ctx, "RESET lock_timeout"); err != nil {
			t.Fatal(err)
		}
	}
}
