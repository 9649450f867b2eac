package larder

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestSessionTokens(t *testing.T) {
	s := NewSession()
	s.sawCommit(0x1A2B3C)
	s.sawCommit(0x10) // never backwards
	r, err := ResumeSession(s.Token())
	if err != nil {
		t.Fatal(err)
	}
	if r.MinLSN() != 0x1A2B3C {
		t.Fatalf("resumed at %X, want 1A2B3C", r.MinLSN())
	}
	for _, bad := range []string{"", "l1.", "l1.xyz", "l2.10", "10", "l1.-1", "l1.10000000000000000"} {
		if _, err := ResumeSession(bad); err == nil {
			t.Errorf("token %q accepted", bad)
		}
	}
}

// Read-your-writes belongs to a session: another session's write does not
// make a session's read-only transactions wait for a snapshot newer than
// it, while the writer's own session (and a session resumed from its
// token, in another client) always reads its write.
func TestReadYourWritesPerSession(t *testing.T) {
	s := startStack(t)
	c := s.client(t, 0)
	other := s.client(t, 0) // another application process
	ctx := context.Background()
	alice, bob := NewSession(), NewSession()

	// Bob writes.
	rw, err := c.BeginRW(WithSession(ctx, bob))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(ctx, "UPDATE accounts SET balance = balance + 5 WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	if err := rw.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wrote := bob.MinLSN()
	if wrote == 0 {
		t.Fatal("the commit did not move its session")
	}
	read := func(c *Client, ctx context.Context) (int, uint64) {
		t.Helper()
		tx, err := c.BeginRO(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit(ctx)
		lo, _ := tx.Range()
		var b int
		if err := tx.QueryRow(ctx, readBalance, []any{2}, &b); err != nil {
			t.Fatal(err)
		}
		return b, lo
	}
	// Bob, in this process and from his token in another one, sees it.
	// (A commit's timestamp is where its record starts, just before the
	// position recorded after it: the value read is what shows it.)
	if b, _ := read(c, WithSession(ctx, bob)); b != 105 {
		t.Fatalf("bob read %d, want 105", b)
	}
	resumed, err := ResumeSession(bob.Token())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := read(other, WithSession(ctx, resumed)); b != 105 {
		t.Fatalf("bob's token in another client read %d, want 105", b)
	}
	// Alice may read older snapshots: her candidates reach back before
	// bob's write.
	if _, lo := read(c, WithSession(ctx, alice)); lo == 0 || lo >= wrote {
		t.Fatalf("alice's candidates start at %X: bob's write at %X raised them", lo, wrote)
	}
	// Without a session, the client's own session counts every write
	// through the client.
	if b, _ := read(c, ctx); b != 105 {
		t.Fatalf("a read without a session read %d, want 105", b)
	}
}

// HTTPSessions keeps a web user's session in a cookie: the user reads
// their own write on the next request, whichever application server takes
// it; another user's reads are not held to it.
func TestHTTPSessions(t *testing.T) {
	s := startStack(t)
	s.client(t, 0) // waits for pins
	dsn := s.dsn("application_name=web")
	db := openDB(t, DriverName, dsn)
	mux := http.NewServeMux()
	mux.HandleFunc("/deposit", func(w http.ResponseWriter, r *http.Request) {
		if _, err := db.ExecContext(r.Context(), "UPDATE accounts SET balance = balance + 1 WHERE id = 3"); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/balance", func(w http.ResponseWriter, r *http.Request) {
		tx, err := db.BeginTx(WithStaleness(r.Context(), 30*time.Second), &sql.TxOptions{ReadOnly: true})
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer tx.Commit()
		var b int
		if err := tx.QueryRowContext(r.Context(), readBalance, 3).Scan(&b); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprint(w, b)
	})
	srv := httptest.NewServer(HTTPSessions(mux))
	defer srv.Close()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	user := &http.Client{Jar: jar}
	get := func(cl *http.Client, path string) string {
		t.Helper()
		resp, err := cl.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 64)
		n, _ := resp.Body.Read(buf)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, buf[:n])
		}
		return string(buf[:n])
	}
	before, err := strconv.Atoi(get(user, "/balance"))
	if err != nil {
		t.Fatal(err)
	}
	if before != 100 {
		t.Fatalf("balance %d, want 100", before)
	}
	for i := 1; i <= 5; i++ {
		get(user, "/deposit")
		got, err := strconv.Atoi(get(user, "/balance"))
		if err != nil {
			t.Fatal(err)
		}
		if got != 100+i {
			t.Fatalf("after deposit %d the user read %d, want %d", i, got, 100+i)
		}
	}
	var cookie *http.Cookie
	for _, c := range jar.Cookies(mustParseURL(t, srv.URL)) {
		if c.Name == SessionCookie {
			cookie = c
		}
	}
	if cookie == nil {
		t.Fatal("no session cookie was set")
	}
	if _, err := ResumeSession(cookie.Value); err != nil {
		t.Fatalf("cookie %q: %v", cookie.Value, err)
	}
}

func mustParseURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// A read/write transaction's COMMIT and the WAL position read after it go
// in one round trip; what pgx's own Commit says is kept: a transaction a
// failed statement aborted reports ErrTxCommitRollback (and moves no
// session), a commit-time failure (a deferred constraint) is returned,
// and a Rollback after Commit reports ErrTxClosed; through the client and
// through database/sql.
func TestCommitReadsTheWALPositionInTheSameRoundTrip(t *testing.T) {
	s := startStackWith(t, schemaSQL+`
CREATE TABLE parents (id int PRIMARY KEY);
CREATE TABLE kids (id int PRIMARY KEY, parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED);`,
		"INSERT INTO accounts (id, balance) VALUES (1, 100)", readBalance)
	c := s.client(t, 0)
	ctx := context.Background()
	// Committed: the session moves past the commit, and sees it.
	sess := NewSession()
	sctx := WithSession(ctx, sess)
	rw, err := c.BeginRW(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(sctx, "UPDATE accounts SET balance = 7 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if err := rw.Commit(sctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.Rollback(sctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Rollback after Commit: %v, want ErrTxClosed", err)
	}
	var walNow string
	if err := s.conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&walNow); err != nil {
		t.Fatal(err)
	}
	now, _ := parseWAL(walNow)
	if m := sess.MinLSN(); m == 0 || m > now {
		t.Fatalf("the session's position %X after the commit (WAL now %X)", m, now)
	}
	if got := readInt(t, sctx, c, time.Minute, readBalance, 1); got != 7 {
		t.Fatalf("the session read %d after its commit, want 7", got)
	}

	// Aborted by a failed statement: COMMIT rolls back.
	before := sess.MinLSN()
	rw, err = c.BeginRW(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(sctx, "UPDATE accounts SET balance = 1 / 0 WHERE id = 1"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if err := rw.Commit(sctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit of an aborted transaction: %v, want ErrTxCommitRollback", err)
	}
	if sess.MinLSN() != before {
		t.Fatal("a rolled back commit moved the session")
	}

	// A deferred constraint fails at COMMIT.
	rw, err = c.BeginRW(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(sctx, "INSERT INTO kids VALUES (1, 42)"); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if err := rw.Commit(sctx); !errors.As(err, &pgErr) || pgErr.Code != "23503" {
		t.Fatalf("Commit breaking a deferred foreign key: %v, want 23503", err)
	}
	if sess.MinLSN() != before {
		t.Fatal("a failed commit moved the session")
	}

	// The same through database/sql.
	db, err := sql.Open(DriverName, s.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.BeginTx(sctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(sctx, "UPDATE accounts SET balance = 8 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if sess.MinLSN() <= before {
		t.Fatal("a commit through database/sql did not move the session")
	}
	var got int
	rtx, err := db.BeginTx(sctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := rtx.QueryRowContext(sctx, readBalance, 1).Scan(&got); err != nil || got != 8 {
		t.Fatalf("database/sql read %d, %v after its commit, want 8", got, err)
	}
	_ = rtx.Commit()
	before = sess.MinLSN()
	tx, err = db.BeginTx(sctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(sctx, "INSERT INTO kids VALUES (2, 43)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); !errors.As(err, &pgErr) || pgErr.Code != "23503" {
		t.Fatalf("database/sql Commit breaking a deferred foreign key: %v, want 23503", err)
	}
	tx, err = db.BeginTx(sctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(sctx, "UPDATE accounts SET balance = 1 / 0 WHERE id = 1"); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if err := tx.Commit(); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("database/sql Commit of an aborted transaction: %v, want ErrTxCommitRollback", err)
	}
	if sess.MinLSN() != before {
		t.Fatal("failed commits through database/sql moved the session")
	}
	// The connection works on.
	if err := db.QueryRowContext(sctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&got); err != nil || got != 8 {
		t.Fatalf("after the failed commits: %d, %v", got, err)
	}
}
