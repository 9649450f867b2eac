package pgfront

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestRelayedSessions: what is not a Larder transaction behaves as on
// PostgreSQL: COPY both ways, LISTEN/NOTIFY to an idle session, a cancel
// request, large results, a pipelined batch, a prepared BEGIN READ ONLY.
func TestRelayedSessions(t *testing.T) {
	s := typesStack(t)
	ctx := context.Background()

	t.Run("copy", func(t *testing.T) {
		conn := connect(t, s.frontURL)
		n, err := conn.CopyFrom(ctx, pgx.Identifier{"accounts"}, []string{"id", "balance"},
			pgx.CopyFromRows([][]any{{100, 1}, {101, 2}, {102, 3}}))
		if err != nil || n != 3 {
			t.Fatalf("COPY FROM: %d rows, %v", n, err)
		}
		var out bytes.Buffer
		tag, err := conn.PgConn().CopyTo(ctx, &out, "COPY (SELECT id, balance FROM accounts WHERE id >= 100 ORDER BY id) TO STDOUT")
		if err != nil || tag.RowsAffected() != 3 || out.String() != "100\t1\n101\t2\n102\t3\n" {
			t.Fatalf("COPY TO: %q, %v", out.String(), err)
		}
		if _, err := conn.Exec(ctx, "DELETE FROM accounts WHERE id >= 100"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("notify", func(t *testing.T) {
		listener := connect(t, s.frontURL)
		if _, err := listener.Exec(ctx, "LISTEN front_channel"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.conn.Exec(ctx, "NOTIFY front_channel, 'hello'"); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil || n.Payload != "hello" {
			t.Fatalf("notification %+v, %v", n, err)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		conn := connect(t, s.frontURL)
		go func() {
			time.Sleep(300 * time.Millisecond)
			_ = conn.PgConn().CancelRequest(context.Background())
		}()
		_, err := conn.Exec(ctx, "SELECT pg_sleep(20)")
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != codeQueryCanceled {
			t.Fatalf("a cancelled statement: %v", err)
		}
		var one int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("large", func(t *testing.T) {
		conn := connect(t, s.frontURL)
		for _, begin := range []string{"", "BEGIN READ ONLY"} {
			if begin != "" {
				if _, err := conn.Exec(ctx, begin); err != nil {
					t.Fatal(err)
				}
			}
			var big string
			if err := conn.QueryRow(ctx, "SELECT repeat('x', 3000000) || $1::text", "!").Scan(&big); err != nil || len(big) != 3000001 {
				t.Fatalf("%q: %d bytes, %v", begin, len(big), err)
			}
			if begin != "" {
				if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
					t.Fatal(err)
				}
			}
		}
	})

	t.Run("batch", func(t *testing.T) {
		conn := connect(t, s.frontURL)
		for _, begin := range []bool{false, true} {
			b := &pgx.Batch{}
			if begin {
				b.Queue("BEGIN READ ONLY")
			}
			const n = 300
			for i := 0; i < n; i++ {
				b.Queue("SELECT repeat('y', 20000) AS pad, $1::int AS i", i)
			}
			if begin {
				b.Queue("COMMIT")
			}
			br := conn.SendBatch(ctx, b)
			if begin {
				if _, err := br.Exec(); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < n; i++ {
				var pad string
				var got int
				if err := br.QueryRow().Scan(&pad, &got); err != nil || got != i || len(pad) != 20000 {
					t.Fatalf("batch (BEGIN %v) row %d: %d, %v", begin, i, got, err)
				}
			}
			if err := br.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("prepared-begin", func(t *testing.T) {
		conn := connect(t, s.frontURL)
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeCacheStatement} {
			served := s.front.Stats().Served.Load()
			rows, err := conn.Query(ctx, "BEGIN READ ONLY", mode)
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := conn.QueryRow(ctx, readBalance, mode, 4).Scan(&n); err != nil || n != 400 {
				t.Fatalf("%v: %d, %v", mode, n, err)
			}
			rows, err = conn.Query(ctx, "COMMIT", mode)
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
			if s.front.Stats().Served.Load() == served {
				t.Fatalf("%v: a prepared BEGIN READ ONLY did not begin a Larder transaction", mode)
			}
		}
	})
}

// TestSessionStateInLarderTransactions: a session's state is its key — an
// encoding the analyzer cannot read runs uncached, and set_config inside
// a Larder transaction is seen by its later statements.
func TestSessionStateInLarderTransactions(t *testing.T) {
	s := typesStack(t)
	ctx := context.Background()
	conn := connect(t, s.frontURL)
	// Made through the front: the session's Larder transactions read at
	// or after it (read your writes).
	if _, err := conn.Exec(ctx, `CREATE SCHEMA other; CREATE TABLE other.accounts (id int PRIMARY KEY, balance int NOT NULL);
INSERT INTO other.accounts VALUES (1, -1)`); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if got := readInTx(t, conn, "", 1); got != 100 {
			t.Fatalf("balance %d", got)
		}
	}
	if _, err := conn.Exec(ctx, "BEGIN READ ONLY"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, readBalance, 1).Scan(&n); err != nil || n != 100 {
		t.Fatalf("%d, %v", n, err)
	}
	if _, err := conn.Exec(ctx, "SELECT set_config('search_path', 'other', false)"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, readBalance, 1).Scan(&n); err != nil || n != -1 {
		t.Fatalf("after set_config the search path resolves accounts to other.accounts: %d, %v", n, err)
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}

	latin := connect(t, s.frontURL)
	if _, err := latin.Exec(ctx, "SET client_encoding = 'LATIN1'"); err != nil {
		t.Fatal(err)
	}
	uncached := s.front.Stats().Uncached.Load()
	if _, err := latin.Exec(ctx, "BEGIN READ ONLY"); err != nil {
		t.Fatal(err)
	}
	var owner string
	if err := latin.QueryRow(ctx, "SELECT owner FROM accounts WHERE id = 1").Scan(&owner); err != nil || owner != "x" {
		t.Fatalf("%q, %v", owner, err)
	}
	if _, err := latin.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if s.front.Stats().Uncached.Load() == uncached {
		t.Fatal("a LATIN1 session's read was cached")
	}
}

// TestLarderStatementsRefused: what a Larder transaction does not run is
// refused with an error, and the transaction then fails as PostgreSQL's
// would; ROLLBACK ends it.
func TestLarderStatementsRefused(t *testing.T) {
	s := typesStack(t)
	ctx := context.Background()
	conn := connect(t, s.frontURL)
	for _, c := range []struct{ sql, code string }{
		{"SAVEPOINT a", codeFeatureNotSupported},
		{"SET search_path = other", codeFeatureNotSupported},
		{"INSERT INTO accounts VALUES (9, 9)", codeReadOnlyTransaction},
		{"SET LOCAL larder.staleness = 'soon'", codeInvalidParameter},
	} {
		if _, err := conn.Exec(ctx, "BEGIN READ ONLY"); err != nil {
			t.Fatal(err)
		}
		_, err := conn.Exec(ctx, c.sql)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != c.code {
			t.Fatalf("%s: %v, want %s", c.sql, err, c.code)
		}
		_, err = conn.Exec(ctx, "SELECT 1")
		if !errors.As(err, &pe) || pe.Code != codeInFailedTransaction {
			t.Fatalf("after a refusal: %v", err)
		}
		if tag, err := conn.Exec(ctx, "COMMIT"); err != nil || tag.String() != "ROLLBACK" {
			t.Fatalf("COMMIT of a failed transaction: %q, %v", tag, err)
		}
	}
	// SET LOCAL after the first query: refused as PostgreSQL refuses SET
	// TRANSACTION ISOLATION LEVEL then.
	if _, err := conn.Exec(ctx, "BEGIN READ ONLY"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, readBalance, 1).Scan(&n); err != nil {
		t.Fatal(err)
	}
	_, err := conn.Exec(ctx, "SET LOCAL larder.staleness = '1s'")
	if err == nil || !strings.Contains(err.Error(), "before any query") {
		t.Fatalf("late SET LOCAL: %v", err)
	}
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if s.front.Stats().Refused.Load() == 0 {
		t.Fatal("refusals not counted")
	}
}

// A RESET ALL (what a pooled or persistent connection sends between
// requests) after nothing changed a setting leaves the session's key scope
// as it was: no re-read. After a SET it puts the scope back (the reads
// follow the default search path again); after SET ROLE, which RESET ALL
// leaves alone, the role stays in the key.
func TestResetAllKeepsTheScope(t *testing.T) {
	s := typesStack(t)
	ctx := context.Background()
	conn := connect(t, s.frontURL)
	// Settled: the client's catalog reloads (tag set registrations at its
	// start) make every session read its scope once more.
	var reads int64
	for i := 0; i < 20; i++ {
		readInTx(t, conn, "", 1)
		if now := s.client.Stats().ScopeReads.Load(); i > 2 && now == reads {
			break
		} else {
			reads = now
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < 5; i++ {
		if _, err := conn.Exec(ctx, "RESET ALL"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "UPDATE accounts SET balance = balance WHERE id = 2"); err != nil {
			t.Fatal(err)
		}
		if got := readInTx(t, conn, "", 1); got != 100 {
			t.Fatalf("balance %d", got)
		}
	}
	if got := s.client.Stats().ScopeReads.Load(); got != reads {
		t.Errorf("RESET ALL and plain updates made the scope be read %d times", got-reads)
	}
	if _, err := conn.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS resetother; CREATE TABLE IF NOT EXISTS resetother.accounts (id int PRIMARY KEY, balance int NOT NULL);
INSERT INTO resetother.accounts VALUES (1, -7) ON CONFLICT DO NOTHING`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SET search_path = resetother"); err != nil {
		t.Fatal(err)
	}
	if got := readInTx(t, conn, "", 1); got != -7 {
		t.Fatalf("with search_path resetother: %d", got)
	}
	if _, err := conn.Exec(ctx, "RESET ALL"); err != nil {
		t.Fatal(err)
	}
	if got := readInTx(t, conn, "", 1); got != 100 {
		t.Fatalf("after RESET ALL the default search path again: %d", got)
	}
}

// TestFrontSessionsKeepTheirStatementNames: the library prepares no
// statement of its own on a session relayed through the front (its
// statement names are the client's), though read-only transactions that
// miss begin there and lock and check a second table later.
func TestFrontSessionsKeepTheirStatementNames(t *testing.T) {
	s := typesStack(t)
	ctx := context.Background()
	conn := connect(t, s.frontURL)
	misses := s.front.Stats().Misses.Load()
	for id := 1; id <= 3; id++ {
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			t.Fatal(err)
		}
		var bal int
		if err := tx.QueryRow(ctx, readBalance, id).Scan(&bal); err != nil {
			t.Fatal(err)
		}
		// A second table: its lock and storage check come later.
		if _, err := tx.Exec(ctx, "SELECT * FROM typed WHERE id = $1", id); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if s.front.Stats().Misses.Load() == misses {
		t.Fatal("no read-only transaction missed: nothing began on the session")
	}
	var names []string
	rows, err := conn.Query(ctx, `SELECT name FROM pg_prepared_statements WHERE name NOT LIKE 'stmtcache\_%'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(names) != 0 {
		t.Fatalf("the session holds prepared statements the client did not make: %v", names)
	}
}
