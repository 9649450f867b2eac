package larder

import (
	"context"
	"testing"
	"time"
)

// Close with transactions left open returns: after CloseTimeout it
// closes their connections, so PostgreSQL ends them (their locks and
// snapshots go), and their next statement fails rather than hangs.
func TestCloseWithOpenTransactions(t *testing.T) {
	s := startStack(t)
	c, err := Open(context.Background(), Config{PostgresURL: s.url, NATSURL: s.nats, Prefix: s.prefix, Nodes: []string{s.node}, QUMA: s.quma,
		Staleness: 3 * time.Second, CloseTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ro, err := c.BeginRO(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b int
	if err := ro.QueryRow(ctx, readBalance, []any{1}, &b); err != nil {
		t.Fatal(err)
	}
	rw, err := c.BeginRW(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(ctx, "UPDATE accounts SET balance = balance WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	if ro.pooled == nil {
		t.Fatal("the read-only transaction holds no pooled connection")
	}
	pids := []uint32{ro.pooled.Conn().PgConn().PID(), rw.Conn().PgConn().PID()}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(2 * time.Minute):
		t.Fatal("Close did not return with two transactions open")
	}
	// PostgreSQL ends both.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := s.conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the two transactions' sessions still there 30 s after Close", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := rw.Exec(ctx, "UPDATE accounts SET balance = balance WHERE id = 2"); err == nil {
		t.Fatal("a statement of a transaction Close ended succeeded")
	}
	_ = rw.Rollback(ctx)
	_ = ro.Commit(ctx)
}
