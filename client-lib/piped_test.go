package larder

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/internal/invalidation"
)

// A transaction's first miss is read in the round trip of its begin; a
// later miss of the same transaction is read on its own; a pipelined read
// that fails (here: division by zero) gives the same error as one read on
// its own, and the results are PostgreSQL's.
func TestFirstMissIsPipelined(t *testing.T) {
	s := startStack(t)
	c := s.open(t, s.url, nil, 0) // no node, no L1: every read misses
	ctx := context.Background()
	piped := func() float64 { return testutil.ToFloat64(c.m.pipedReads) }

	tx, err := c.BeginRO(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var a, b int
	if err := tx.QueryRow(ctx, readBalance, []any{1}, &a); err != nil {
		t.Fatal(err)
	}
	if piped() != 1 {
		t.Fatalf("%v reads pipelined after the first miss, want 1", piped())
	}
	if err := tx.QueryRow(ctx, readBalanceVer, []any{2}, &b, new(int)); err != nil {
		t.Fatal(err)
	}
	if piped() != 1 {
		t.Fatalf("%v reads pipelined after the second miss, want still 1", piped())
	}
	_ = tx.Commit(ctx)
	if a != 100 || b != 100 {
		t.Fatalf("read %d and %d, want 100 and 100", a, b)
	}

	const divide = "SELECT balance / $1 FROM accounts WHERE id = $2"
	want := func() string {
		_, err := s.conn.Exec(ctx, divide, 0, 1)
		if err == nil {
			t.Fatal("division by zero succeeded on PostgreSQL")
		}
		return err.Error()
	}()
	for i := 0; i < 2; i++ { // the second with the statement's description cached
		tx, err := c.BeginRO(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var q int
		err = tx.QueryRow(ctx, divide, []any{0, 1}, &q)
		_ = tx.Commit(ctx)
		if err == nil {
			t.Fatal("division by zero succeeded through the client")
		}
		if got := err.Error(); !strings.Contains(got, want) {
			t.Fatalf("error %q, want PostgreSQL's %q", got, want)
		}
	}
	tx, err = c.BeginRO(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var q int
	if err := tx.QueryRow(ctx, divide, []any{4, 1}, &q); err != nil || q != 25 {
		t.Fatalf("100 / 4 = %d, %v", q, err)
	}
	_ = tx.Commit(ctx)
	if piped() != 2 {
		t.Fatalf("%v reads pipelined, want 2 (the failed ones read again on their own)", piped())
	}
}

// TestPipelinedReadFailsAfterStorageMoved: a pipelined read that fails
// (division by zero) in a transaction whose quick storage check finds the
// table's storage moved (VACUUM FULL gave it a new file) gives the read's
// own error, or ErrRetry while pins older than the move are dropped; never
// the "current transaction is aborted" of a check run after the read had
// aborted the transaction. Through database/sql.
func TestPipelinedReadFailsAfterStorageMoved(t *testing.T) {
	s := startStack(t)
	db := openDB(t, DriverName, s.dsnNodes()) // no node, no L1: every read misses
	ctx := context.Background()
	readBalanceDB(t, ctx, db, 1) // the check learns the table's storage
	if _, err := s.conn.Exec(ctx, "VACUUM FULL accounts"); err != nil {
		t.Fatal(err)
	}
	const divide = "SELECT balance / $1 FROM accounts WHERE id = $2"
	var err error
	for i := 0; i < 50; i++ {
		err = func() error {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			var q int
			return tx.QueryRowContext(ctx, divide, 0, 1).Scan(&q)
		}()
		if !errors.Is(err, ErrRetry) {
			break
		}
		time.Sleep(100 * time.Millisecond) // pins newer than the move
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
		t.Fatalf("the failing read gave %v, want PostgreSQL's division by zero (22012)", err)
	}
}

// pipedTwoTables is a schema of two tables a transaction reads one after
// the other, and their templates.
const pipedTwoTables = `CREATE TABLE pets (id int PRIMARY KEY, name text NOT NULL); ALTER TABLE pets REPLICA IDENTITY FULL;
CREATE TABLE cats (id int PRIMARY KEY, name text NOT NULL, age int NOT NULL); ALTER TABLE cats REPLICA IDENTITY FULL`

// TestLaterMissIsPipelinedWithItsHold: through database/sql, a read-only
// transaction's first miss goes with its begin, and a later miss of a
// table it holds not yet goes with that table's lock and storage check,
// in one round trip each; a later miss of a table it holds runs on its
// own. The answers are PostgreSQL's, and a later pipelined read that fails
// gives PostgreSQL's error.
func TestLaterMissIsPipelinedWithItsHold(t *testing.T) {
	s := startStackWith(t, pipedTwoTables, "INSERT INTO pets VALUES (1, 'rex'); INSERT INTO cats VALUES (1, 'tom', 3)",
		"SELECT name FROM pets WHERE id = $1", "SELECT name FROM cats WHERE id = $1", "SELECT age FROM cats WHERE id = $1",
		"SELECT age / $1 FROM cats WHERE id = $2")
	db := openDB(t, DriverName, s.dsnNodes()) // no node, no L1: every read misses
	ctx := context.Background()
	var pet, cat string
	var age int
	if err := db.QueryRowContext(ctx, "SELECT name FROM pets WHERE id = $1", 1).Scan(&pet); err != nil {
		t.Fatal(err)
	}
	c := clientOf(t, s.dsnNodes())
	// At a pin (a transaction at a fresh snapshot cannot begin again if a
	// later pipelined read fails, and pipelines only its first read).
	for deadline := time.Now().Add(30 * time.Second); len(c.pins.candidates(time.Now().Add(-time.Minute), 0)) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no pins")
		}
	}
	base := testutil.ToFloat64(c.m.pipedReads)
	piped := func() float64 { return testutil.ToFloat64(c.m.pipedReads) - base }
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctx, "SELECT name FROM pets WHERE id = $1", 1).Scan(&pet); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRowContext(ctx, "SELECT name FROM cats WHERE id = $1", 1).Scan(&cat); err != nil {
		t.Fatal(err)
	}
	if piped() != 2 {
		t.Fatalf("%v reads pipelined after a miss of each table, want 2", piped())
	}
	if err := tx.QueryRowContext(ctx, "SELECT age FROM cats WHERE id = $1", 1).Scan(&age); err != nil {
		t.Fatal(err)
	}
	if piped() != 2 {
		t.Fatalf("%v reads pipelined after a miss of a table held, want still 2", piped())
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if pet != "rex" || cat != "tom" || age != 3 {
		t.Fatalf("read %q, %q, %d; want rex, tom, 3", pet, cat, age)
	}

	for i := 0; i < 2; i++ { // the second with the statement's description cached
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRowContext(ctx, "SELECT name FROM pets WHERE id = $1", 1).Scan(&pet); err != nil {
			t.Fatal(err)
		}
		var q int
		err = tx.QueryRowContext(ctx, "SELECT age / $1 FROM cats WHERE id = $2", 0, 1).Scan(&q)
		_ = tx.Rollback()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22012" {
			t.Fatalf("the failing later read gave %v, want PostgreSQL's division by zero (22012)", err)
		}
	}
}

// TestPipelinedHoldRefusesAMovedTable: a transaction at a snapshot older
// than a TRUNCATE of a table it has not read yet reads that table with its
// lock and storage check in one round trip (holdPiped). The read's rows,
// from the new empty storage, are not the snapshot's: the check refuses
// them (errRewritten), through the quick check (a fact learnt before) and
// through the whole one (no fact).
func TestPipelinedHoldRefusesAMovedTable(t *testing.T) {
	s := startStackWith(t, pipedTwoTables, "INSERT INTO pets VALUES (1, 'rex'); INSERT INTO cats VALUES (1, 'tom', 3)",
		"SELECT name FROM pets WHERE id = $1", "SELECT name FROM cats WHERE id = $1")
	c := s.client(t, 0)
	ctx := context.Background()
	snapshot := exportSnapshot(t, s.url)
	pin := invalidation.Pin{SnapshotID: snapshot, LSN: 100}
	read := func(quick bool) (*pipedRead, error) {
		t.Helper()
		if !quick {
			c.storage = storageFacts{}
		}
		tx := &ROTx{c: c}
		defer func() { _ = tx.closeConn(ctx) }()
		if err := tx.begin(ctx, pin, []string{"public.pets"}); err != nil {
			t.Fatal(err)
		}
		tx.fixed, tx.ts, tx.pin = true, pin.LSN, pin
		q := &pipedRead{sql: "SELECT name FROM cats WHERE id = $1", args: []any{1}, scope: tx.scope.key}
		tx.pipe = q
		err := tx.holdTables(ctx, []string{"public.cats"})
		tx.pipe = nil
		return q, err
	}
	before := testutil.ToFloat64(c.m.pipedReads)
	q, err := read(true) // learns cats' storage
	if err != nil || !q.ran || len(q.res.Rows) != 1 || string(q.res.Rows[0][0]) != "tom" {
		t.Fatalf("before the TRUNCATE: ran %v, %v", q.ran, err)
	}
	if testutil.ToFloat64(c.m.pipedReads) != before {
		t.Fatal("holdTables counted a pipelined read (the caller counts the reads it uses)")
	}
	if _, err := s.conn.Exec(ctx, "TRUNCATE cats"); err != nil {
		t.Fatal(err)
	}
	for _, quick := range []bool{true, false} {
		q, err := read(quick)
		if !errors.Is(err, errRewritten) || q.ran {
			t.Fatalf("after the TRUNCATE (quick check %v): ran %v, %v; want a refusal", quick, q.ran, err)
		}
	}
}
