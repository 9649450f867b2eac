package larder

import (
	"context"
	"strings"
	"testing"
	"time"

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
