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

// clientOf returns the Client behind a DSN opened with the larder driver.
func clientOf(t *testing.T, dsn string) *Client {
	t.Helper()
	c := driverClient(dsn)
	if c == nil {
		t.Fatal("the DSN has no client")
	}
	return c
}

// serverPrepared lists the statements db's one connection holds prepared
// under Larder's names (name: statement), read in a read/write
// transaction (which runs on that connection, uncached).
func serverPrepared(t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	rows, err := tx.Query(`SELECT name, statement FROM pg_prepared_statements WHERE name LIKE 'larder\_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, stmt string
		if err := rows.Scan(&name, &stmt); err != nil {
			t.Fatal(err)
		}
		out[name] = stmt
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// readPipelined reads balances through db (every read a miss: no node, no
// L1) until n more reads went in the round trip of their transaction's
// begin, checking each answer.
func readPipelined(t *testing.T, ctx context.Context, db *sql.DB, c *Client, n int) {
	t.Helper()
	want := testutil.ToFloat64(c.m.pipedReads) + float64(n)
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; testutil.ToFloat64(c.m.pipedReads) < want; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("%v reads pipelined in 30 s, want %v", testutil.ToFloat64(c.m.pipedReads), want)
		}
		if got := readBalanceDB(t, ctx, db, 1+i%accounts); got != 100 {
			t.Fatalf("account %d: balance %d, want 100", 1+i%accounts, got)
		}
	}
}

// TestPipelinedBeginIsPrepared: through database/sql, the statements of a
// read-only transaction's pipelined begin (BEGIN, the tables' lock and
// storage check, the read) are prepared once per connection, not parsed
// and planned by PostgreSQL in every transaction: after 30 pipelined
// transactions on one database/sql connection, the connection holds the few
// statements the first ones prepared, and the client prepared no more.
// When PostgreSQL loses them (DEALLOCATE), the next transaction still
// gets PostgreSQL's answer, and the connection prepares them again under
// new names.
func TestPipelinedBeginIsPrepared(t *testing.T) {
	s := startStack(t)
	dsn := s.dsnNodes() // no node, no L1: every read misses
	db := openDB(t, DriverName, dsn)
	db.SetMaxOpenConns(1) // the connection the transactions run on, and the one asked
	ctx := context.Background()
	readBalanceDB(t, ctx, db, 1)
	c := clientOf(t, dsn)
	prepared := func() float64 { return testutil.ToFloat64(c.m.prepared.WithLabelValues("prepared")) }

	readPipelined(t, ctx, db, c, 5)
	first := prepared()
	readPipelined(t, ctx, db, c, 30)
	if prepared() != first {
		t.Fatalf("%v statements prepared after 5 pipelined transactions, %v after 30 more: prepared again per transaction", first, prepared())
	}
	held := serverPrepared(t, db)
	if len(held) == 0 || float64(len(held)) != first {
		t.Fatalf("the connection holds %d prepared statements %v, the client counted %v", len(held), held, first)
	}
	hasBeginAndRead(t, held)
	for name := range held {
		if _, err := db.ExecContext(ctx, "DEALLOCATE "+name); err != nil {
			t.Fatal(err)
		}
	}
	readPipelined(t, ctx, db, c, 5)
	dropped := testutil.ToFloat64(c.m.prepared.WithLabelValues("dropped"))
	if dropped < first {
		t.Fatalf("%v statements dropped after DEALLOCATE, want at least the %v prepared", dropped, first)
	}
	again := serverPrepared(t, db)
	if float64(len(again)) != prepared()-dropped {
		t.Fatalf("after DEALLOCATE the connection holds %v; the client counted %v prepared and %v dropped", again, prepared(), dropped)
	}
	hasBeginAndRead(t, again)
	for name := range again {
		if _, old := held[name]; old {
			t.Fatalf("statement %s prepared again under its old name", name)
		}
	}
}

// hasBeginAndRead fails unless the prepared statements include the
// begin and the read of the balance.
func hasBeginAndRead(t *testing.T, prepared map[string]string) {
	t.Helper()
	var begin, read bool
	for _, stmt := range prepared {
		begin = begin || stmt == beginReadOnly
		read = read || strings.Contains(stmt, "FROM accounts WHERE id = $1")
	}
	if !begin || !read {
		t.Fatalf("prepared: %v; want BEGIN and the read among them", prepared)
	}
}

// stalePrepared knows PostgreSQL's answers for a prepared statement that is
// gone or whose plan changed its result type, and nothing else.
func TestStalePrepared(t *testing.T) {
	for code, want := range map[string]bool{"26000": true, "0A000": true, "22012": false, "22023": false, "40001": false} {
		err := &Error{Op: "query", Err: &pgconn.PgError{Code: code}}
		if got := stalePrepared(err); got != want {
			t.Errorf("stalePrepared(%s) = %v, want %v", code, got, want)
		}
	}
	if stalePrepared(errors.New("connection reset")) {
		t.Error("stalePrepared of an error without SQLSTATE")
	}
}

// TestLaterHoldIsPrepared: through database/sql, a read-only transaction
// whose second read needs a table its first did not lock and check runs
// that lock and check as statements its connection prepared once. When
// PostgreSQL no longer has them (DEALLOCATE), the transaction begins again
// at its pin (or, at a fresh snapshot, asks to be retried) and both reads
// give PostgreSQL's answers.
func TestLaterHoldIsPrepared(t *testing.T) {
	const (
		ddl      = schemaSQL + "CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL); ALTER TABLE notes REPLICA IDENTITY FULL"
		readNote = "SELECT body FROM notes WHERE id = $1"
	)
	s := startStackWith(t, ddl, "INSERT INTO accounts (id, balance) VALUES (1, 100); INSERT INTO notes VALUES (1, 'n1')",
		readBalance, readNote)
	dsn := s.dsnNodes() // no node, no L1: every read misses
	db := openDB(t, DriverName, dsn)
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	both := func() {
		for try := 0; ; try++ { // a transaction asked to retry starts over, as an application's would
			bal, body, err := readBoth(ctx, db, readBalance, readNote)
			if errors.Is(err, ErrRetry) && try < 3 {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if bal != 100 || body != "n1" {
				t.Fatalf("read %d and %q, want 100 and n1", bal, body)
			}
			return
		}
	}
	both()
	c := clientOf(t, dsn)
	lockNotes := `LOCK TABLE "public"."notes" IN ACCESS SHARE MODE`
	heldLock := func() string {
		for name, stmt := range serverPrepared(t, db) {
			if stmt == lockNotes {
				return name
			}
		}
		return ""
	}
	deadline := time.Now().Add(30 * time.Second)
	for heldLock() == "" { // until a transaction ran at a pin
		if time.Now().After(deadline) {
			t.Fatalf("the connection never prepared %q: %v", lockNotes, serverPrepared(t, db))
		}
		both()
	}
	prepared := testutil.ToFloat64(c.m.prepared.WithLabelValues("prepared"))
	for i := 0; i < 10; i++ {
		both()
	}
	if now := testutil.ToFloat64(c.m.prepared.WithLabelValues("prepared")); now != prepared {
		t.Fatalf("%v statements prepared, then %v after 10 more transactions", prepared, now)
	}

	name := heldLock()
	if _, err := db.ExecContext(ctx, "DEALLOCATE "+name); err != nil {
		t.Fatal(err)
	}
	// The statement counts as the session's write: the next transaction
	// may take a fresh snapshot (and be asked to retry) unless a pin past
	// it is placed first.
	time.Sleep(500 * time.Millisecond)
	dropped := testutil.ToFloat64(c.m.prepared.WithLabelValues("dropped"))
	retries := testutil.ToFloat64(c.m.planRetries)
	for deadline := time.Now().Add(30 * time.Second); testutil.ToFloat64(c.m.prepared.WithLabelValues("dropped")) == dropped; {
		if time.Now().After(deadline) {
			t.Fatal("no transaction found its lock statement deallocated")
		}
		both()
	}
	t.Logf("begun again at the pin: %v", testutil.ToFloat64(c.m.planRetries)-retries)
	for deadline := time.Now().Add(30 * time.Second); heldLock() == ""; {
		if time.Now().After(deadline) {
			t.Fatal("the lock statement was not prepared again")
		}
		both()
	}
}

// readBoth reads an int and a string with two statements of one read-only
// transaction of db.
func readBoth(ctx context.Context, db *sql.DB, first, second string) (int, string, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return 0, "", err
	}
	defer tx.Commit()
	var n int
	var s string
	if err := tx.QueryRowContext(ctx, first, 1).Scan(&n); err != nil {
		return 0, "", err
	}
	if err := tx.QueryRowContext(ctx, second, 1).Scan(&s); err != nil {
		return 0, "", err
	}
	return n, s, nil
}

// TestDiscardThroughDatabaseSQL: an application that resets its session
// with DISCARD ALL or DEALLOCATE ALL (as a pooler's reset query does) goes
// on reading and writing through the driver: the statements the
// connection had prepared (pgx's and the client's) are known to be gone.
func TestDiscardThroughDatabaseSQL(t *testing.T) {
	s := startStack(t)
	db := openDB(t, DriverName, s.dsnNodes()) // no node, no L1: every read misses
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	for i, reset := range []string{"DISCARD ALL", "DEALLOCATE ALL", "deallocate prepare all"} {
		for j := 0; j < 3; j++ { // statements prepared on the connection
			readBalanceDB(t, ctx, db, 1)
			if _, err := db.ExecContext(ctx, "UPDATE accounts SET ver = ver + 1 WHERE id = $1", 2); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.ExecContext(ctx, reset); err != nil {
			t.Fatalf("%s: %v", reset, err)
		}
		if got := readBalanceDB(t, ctx, db, 1); got != 100 {
			t.Fatalf("after %s: balance %d, want 100", reset, got)
		}
		var ver int
		if err := db.QueryRowContext(ctx, "UPDATE accounts SET ver = ver + 1 WHERE id = $1 RETURNING ver", 2).Scan(&ver); err != nil {
			t.Fatalf("after %s: %v", reset, err)
		}
		if want := 4 * (i + 1); ver != want {
			t.Fatalf("after %s: ver %d, want %d", reset, ver, want)
		}
	}
}
