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
