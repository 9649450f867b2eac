package pgfront

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/larderdb/larder/internal/pki"
)

// psqlPath finds psql (Debian's postgresql-client-15 puts it under
// /usr/lib/postgresql/15/bin); a missing one fails the test.
func psqlPath(t *testing.T) string {
	t.Helper()
	for _, v := range []string{"17", "16", "15"} {
		p := filepath.Join("/usr/lib/postgresql", v, "bin", "psql")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not found: apt-get install postgresql-client-15 (or run `make deps`)")
	}
	return p
}

// psql runs psql's -c commands against connString (sslmode left to psql:
// it asks for TLS first, the front answers 'N').
func psql(t *testing.T, connString string, env []string, commands ...string) (string, error) {
	t.Helper()
	args := []string{"-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-d", connString}
	for _, c := range commands {
		args = append(args, "-c", c)
	}
	cmd := exec.Command(psqlPath(t), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestPsqlThroughFront: psql runs a read-only transaction through the
// front twice; it prints what it prints against PostgreSQL, and the
// second time the answer comes from the cache.
func TestPsqlThroughFront(t *testing.T) {
	s := typesStack(t)
	host, port, _ := net.SplitHostPort(s.front.Addr().String())
	viaFront := fmt.Sprintf("host=%s port=%s user=postgres dbname=%s", host, port, s.db)
	direct := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=%s", env.PG.Port(), s.db)
	commands := []string{"BEGIN READ ONLY", "SELECT id, balance FROM accounts WHERE id = 3",
		"SELECT id, t, ia, ts, b FROM typed WHERE id = 1", "COMMIT"}
	want, err := psql(t, direct, nil, commands...)
	if err != nil {
		t.Fatalf("psql against PostgreSQL: %v\n%s", err, want)
	}
	st := s.front.Stats()
	for run := 0; ; run++ {
		hits := st.Hits.Load()
		got, err := psql(t, viaFront, nil, commands...)
		if err != nil {
			t.Fatalf("psql through the front: %v\n%s", err, got)
		}
		if got != want {
			t.Fatalf("psql through the front printed\n%s\nPostgreSQL's\n%s", got, want)
		}
		if run > 0 && st.Hits.Load() > hits {
			t.Logf("run %d: %d hits; served %d, relayed %d", run, st.Hits.Load()-hits, st.Served.Load(), st.Relayed.Load())
			break
		}
		if run == 20 {
			t.Fatalf("no answer from the cache in %d runs", run)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A script: psql sends each statement on its own; a write, then a
	// read-only transaction that must see it.
	script := filepath.Join(t.TempDir(), "s.sql")
	if err := os.WriteFile(script, []byte("UPDATE accounts SET balance = 301 WHERE id = 3;\nBEGIN READ ONLY;\nSET LOCAL larder.staleness = '1h';\nSHOW larder.staleness;\nSELECT balance FROM accounts WHERE id = 3;\nCOMMIT;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(psqlPath(t), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-d", viaFront, "-f", script).CombinedOutput()
	if err != nil || string(out) != "1h\n301\n" {
		t.Fatalf("psql -f through the front: %v\n%s", err, out)
	}
}

// hbaLines puts lines at the top of pg_hba.conf and reloads; the file is
// restored when the test ends.
func hbaLines(t *testing.T, conn *pgx.Conn, lines string) {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(env.PG.DataDir(), "pg_hba.conf")
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	reload := func() {
		if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, old, 0o600); err != nil {
			t.Error(err)
		}
		reload()
	})
	if err := os.WriteFile(path, append([]byte(lines), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	reload()
}

// TestAuthenticationThroughFront: MD5 and SCRAM-SHA-256 users log in
// through the front with their own passwords (the exchange is relayed),
// read in a Larder transaction, and a wrong password fails with
// PostgreSQL's own error.
func TestAuthenticationThroughFront(t *testing.T) {
	s := typesStack(t)
	ctx := context.Background()
	if _, err := s.conn.Exec(ctx, `DROP ROLE IF EXISTS front_md5; DROP ROLE IF EXISTS front_scram;
SET password_encryption = 'md5'; CREATE ROLE front_md5 LOGIN PASSWORD 'md5-secret';
SET password_encryption = 'scram-sha-256'; CREATE ROLE front_scram LOGIN PASSWORD 'scram-secret';
GRANT SELECT ON accounts TO front_md5, front_scram`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = s.conn.Exec(context.Background(), `REVOKE ALL ON accounts FROM front_md5, front_scram`)
	})
	hbaLines(t, s.conn, "host all front_md5 127.0.0.1/32 md5\nhost all front_scram 127.0.0.1/32 scram-sha-256\n")
	direct := "127.0.0.1:" + fmt.Sprint(env.PG.Port())
	// The reload is asynchronous: wait until PostgreSQL asks for passwords.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := pgx.Connect(ctx, s.urlVia(direct, "front_md5", "wrong"))
		if err != nil {
			break
		}
		c.Close(ctx)
		if time.Now().After(deadline) {
			t.Fatal("pg_hba.conf never took effect")
		}
	}
	for _, u := range []struct{ user, password string }{{"front_md5", "md5-secret"}, {"front_scram", "scram-secret"}} {
		t.Run(u.user, func(t *testing.T) {
			conn := connect(t, s.urlVia(s.front.Addr().String(), u.user, u.password))
			var who string
			if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&who); err != nil || who != u.user {
				t.Fatalf("current_user %q, %v", who, err)
			}
			if got := readInTx(t, conn, "", 4); got != 400 {
				t.Fatalf("balance %d", got)
			}
			// psql (libpq) through the front with the same credentials.
			host, port, _ := net.SplitHostPort(s.front.Addr().String())
			out, err := psql(t, fmt.Sprintf("host=%s port=%s user=%s dbname=%s", host, port, u.user, s.db), []string{"PGPASSWORD=" + u.password},
				"BEGIN READ ONLY", "SELECT balance FROM accounts WHERE id = 4", "COMMIT")
			if err != nil || out != "400\n" {
				t.Fatalf("psql: %v\n%s", err, out)
			}

			_, wantErr := pgx.Connect(ctx, s.urlVia(direct, u.user, "wrong"))
			_, gotErr := pgx.Connect(ctx, s.urlVia(s.front.Addr().String(), u.user, "wrong"))
			var wp, gp *pgconn.PgError
			if !errors.As(wantErr, &wp) || !errors.As(gotErr, &gp) || wp.Code != gp.Code || wp.Message != gp.Message || gp.Code != "28P01" {
				t.Fatalf("wrong password through the front: %v; PostgreSQL: %v", gotErr, wantErr)
			}
		})
	}
}

// TestMalformedInput: garbage at start-up or after it gets a FATAL error
// or a closed connection, and the front serves the next client.
func TestMalformedInput(t *testing.T) {
	s := typesStack(t)
	addr := s.front.Addr().String()
	send := func(t *testing.T, startup bool, raw []byte) []byte {
		t.Helper()
		var conn net.Conn
		if startup {
			w := dialWire(t, addr, "postgres", s.db)
			conn = w.conn
		} else {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			conn = c
		}
		if _, err := conn.Write(raw); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		out, err := io.ReadAll(conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the front neither answered nor closed: read %q", out)
		}
		return out
	}
	for _, c := range []struct {
		name    string
		startup bool
		raw     []byte
	}{
		{"unknown start-up code", false, []byte{0, 0, 0, 8, 1, 2, 3, 4}},
		{"start-up length too small", false, []byte{0, 0, 0, 2}},
		{"start-up length too large", false, []byte{0x7f, 0, 0, 0, 0, 3, 0, 0}},
		{"start-up parameters cut", false, []byte{0, 0, 0, 12, 0, 3, 0, 0, 'u', 's', 'e', 'r'}},
		{"unknown message type", true, []byte{'z', 0, 0, 0, 4}},
		{"message length below 4", true, []byte{'Q', 0, 0, 0, 3}},
		{"message over the limit", true, []byte{'Q', 0x7f, 0, 0, 0}},
		{"query without its terminator", true, []byte{'Q', 0, 0, 0, 6, 'a', 'b'}},
		{"bind cut short", true, []byte{'B', 0, 0, 0, 6, 0, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := send(t, c.startup, c.raw)
			if len(out) > 0 && !strings.Contains(string(out), "FATAL") {
				t.Fatalf("answered %q", out)
			}
		})
	}
	// A Larder transaction answers protocol mistakes with an error.
	w := dialWire(t, addr, "postgres", s.db)
	w.exchange(t, &pgproto3.Query{String: "BEGIN READ ONLY"})
	got := w.exchange(t, &pgproto3.Parse{Query: readBalance}, &pgproto3.Bind{Parameters: [][]byte{[]byte("1"), []byte("2")}},
		&pgproto3.Execute{}, &pgproto3.Sync{})
	if len(got) != 3 || got[1][0] != 'E' || !strings.Contains(string(got[1]), codeProtocolViolation) || string(got[2]) != "Z\x00\x00\x00\x05E" {
		t.Fatalf("bind with too many parameters: %q", got)
	}
	w.exchange(t, &pgproto3.Query{String: "ROLLBACK"})
	// The front still serves.
	conn := connect(t, s.frontURL)
	if got := readInTx(t, conn, "", 1); got != 100 {
		t.Fatalf("balance %d", got)
	}
}

// TestTLS: a client that asks for TLS gets it when the front has a
// certificate (psql and pgx verify it), and the front refuses to go on in
// clear towards a PostgreSQL that does not speak TLS when told to use it.
func TestTLS(t *testing.T) {
	s := typesStack(t)
	ca, err := pki.NewCA("front-test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issued, err := ca.IssueServer("front", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile, err := issued.Write(dir, "front")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	s.startFront(t, func(c *Config) { c.TLS = &tls.Config{Certificates: []tls.Certificate{cert}} })
	host, port, _ := net.SplitHostPort(s.front.Addr().String())
	out, err := psql(t, fmt.Sprintf("host=%s port=%s user=postgres dbname=%s sslmode=verify-full sslrootcert=%s", host, port, s.db, caFile), nil,
		"SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", "BEGIN READ ONLY", "SELECT balance FROM accounts WHERE id = 2", "COMMIT")
	// PostgreSQL's own connection is in clear: the TLS is the client's
	// with the front.
	if err != nil || out != "f\n200\n" {
		t.Fatalf("psql over TLS: %v\n%s", err, out)
	}
	conn := connect(t, s.frontURL[:strings.Index(s.frontURL, "?")]+"?sslmode=verify-full&sslrootcert="+caFile)
	if !conn.PgConn().Conn().(*tls.Conn).ConnectionState().HandshakeComplete {
		t.Fatal("pgx is not on TLS")
	}
	if got := readInTx(t, conn, "", 3); got != 300 {
		t.Fatalf("balance %d", got)
	}

	s.startFront(t, func(c *Config) { c.PostgresTLS = &tls.Config{InsecureSkipVerify: true} })
	_, err = pgx.Connect(context.Background(), s.frontURL)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != codeConnectionFailure || !strings.Contains(pe.Message, "TLS") {
		t.Fatalf("PostgreSQL without TLS behind a front told to use it: %v", err)
	}

	// PostgreSQL with TLS: the front's connection to it is encrypted and
	// verified, and Larder transactions run on it.
	pgCert, err := ca.IssueServer("postgres", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	enableServerTLS(t, s, pgCert)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.PEM)
	s.startFront(t, func(c *Config) { c.PostgresTLS = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"} })
	conn = connect(t, s.frontURL)
	var encrypted bool
	if err := conn.QueryRow(context.Background(), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&encrypted); err != nil || !encrypted {
		t.Fatalf("the front's connection to PostgreSQL is not encrypted: %v", err)
	}
	served := s.front.Stats().Served.Load()
	if got := readInTx(t, conn, "", 3); got != 300 || s.front.Stats().Served.Load() == served {
		t.Fatalf("balance %d through a TLS connection to PostgreSQL, served %d", got, s.front.Stats().Served.Load()-served)
	}
}

// enableServerTLS turns on TLS in the test PostgreSQL (clear connections
// still work) until the test ends.
func enableServerTLS(t *testing.T, s *stack, cert pki.Issued) {
	t.Helper()
	ctx := context.Background()
	certFile, keyFile, err := cert.Write(env.PG.DataDir(), "front-test-server")
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 { // PostgreSQL runs as "postgres" and wants its key to itself
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, f := range []string{certFile, keyFile} {
			if err := os.Chown(f, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	set := func(stmts ...string) {
		for _, q := range stmts {
			if _, err := s.conn.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	t.Cleanup(func() {
		set("ALTER SYSTEM RESET ssl", "ALTER SYSTEM RESET ssl_cert_file", "ALTER SYSTEM RESET ssl_key_file", "SELECT pg_reload_conf()")
		os.Remove(certFile)
		os.Remove(keyFile)
	})
	set("ALTER SYSTEM SET ssl_cert_file = '"+certFile+"'", "ALTER SYSTEM SET ssl_key_file = '"+keyFile+"'",
		"ALTER SYSTEM SET ssl = on", "SELECT pg_reload_conf()")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := pgx.Connect(ctx, s.url[:strings.Index(s.url, "?")]+"?sslmode=require")
		if err == nil {
			c.Close(ctx)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("PostgreSQL did not turn TLS on: %v", err)
		}
	}
}

// EXPLAIN LARDER and SHOW LARDER QUERIES through psql: what Larder does
// with a statement, and the templates the front read with their hits.
func TestExplainLarderThroughFront(t *testing.T) {
	s := typesStack(t)
	host, port, _ := net.SplitHostPort(s.front.Addr().String())
	viaFront := fmt.Sprintf("host=%s port=%s user=postgres dbname=%s", host, port, s.db)
	for run := 0; run < 3; run++ {
		if out, err := psql(t, viaFront, nil, "BEGIN READ ONLY", "SELECT balance FROM accounts WHERE id = 2", "COMMIT"); err != nil {
			t.Fatalf("psql: %v\n%s", err, out)
		}
	}
	out, err := psql(t, viaFront, nil, "EXPLAIN LARDER SELECT balance FROM accounts WHERE id = 2")
	if err != nil {
		t.Fatalf("EXPLAIN LARDER: %v\n%s", err, out)
	}
	for _, want := range []string{"Cacheable", "yes", "public.accounts(id)", "Reads through this front"} {
		if !strings.Contains(out, want) {
			t.Errorf("EXPLAIN LARDER lacks %q:\n%s", want, out)
		}
	}
	out, err = psql(t, viaFront, nil, "EXPLAIN LARDER SELECT random() FROM accounts")
	if err != nil || !strings.Contains(out, "no: calls volatile function random()") {
		t.Errorf("EXPLAIN LARDER of an uncacheable statement: %v\n%s", err, out)
	}
	if out, err := psql(t, viaFront, nil, "EXPLAIN LARDER SELEC 1"); err == nil || !strings.Contains(out, "syntax error") {
		t.Errorf("EXPLAIN LARDER of malformed SQL: %v\n%s", err, out)
	}
	out, err = psql(t, viaFront, nil, "SHOW LARDER QUERIES")
	if err != nil || !strings.Contains(out, "SELECT balance FROM accounts WHERE id = $1") {
		t.Errorf("SHOW LARDER QUERIES: %v\n%s", err, out)
	}
	// Inside a Larder transaction too.
	out, err = psql(t, viaFront, nil, "BEGIN READ ONLY", "SHOW LARDER QUERIES", "COMMIT")
	if err != nil || !strings.Contains(out, "accounts") {
		t.Errorf("SHOW LARDER QUERIES in a read-only transaction: %v\n%s", err, out)
	}
}

// TestRowSplitThroughPsql: a range of accounts read through the front with
// psql is split by rows, so a change to an account it does not show
// leaves it valid: a read at a fresh snapshot right after such a change
// is answered by the cache (whole, every such change would end it, and
// no read after one would hit).
func TestRowSplitThroughPsql(t *testing.T) {
	s := typesStack(t)
	host, port, _ := net.SplitHostPort(s.front.Addr().String())
	viaFront := fmt.Sprintf("host=%s port=%s user=postgres dbname=%s", host, port, s.db)
	direct := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=%s", env.PG.Port(), s.db)
	read := []string{"BEGIN READ ONLY", "SET LOCAL larder.staleness = '1ms'", "SELECT id, balance FROM accounts WHERE id <= 2 ORDER BY id", "COMMIT"}
	want, err := psql(t, direct, nil, read[2])
	if err != nil {
		t.Fatalf("psql against PostgreSQL: %v\n%s", err, want)
	}
	st := s.front.Stats()
	ctx := context.Background()
	for run := 0; ; run++ {
		// An account the range does not show changes; then a read at a
		// snapshot taken after the change.
		if _, err := s.conn.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 4"); err != nil {
			t.Fatal(err)
		}
		hits := st.Hits.Load()
		got, err := psql(t, viaFront, nil, read...)
		if err != nil {
			t.Fatalf("psql through the front: %v\n%s", err, got)
		}
		if got != want {
			t.Fatalf("psql through the front printed\n%s\nPostgreSQL's\n%s", got, want)
		}
		if run > 0 && st.Hits.Load() > hits {
			t.Logf("run %d: a hit right after a change to an account the range does not show", run)
			break
		}
		if run == 30 {
			t.Fatalf("no answer from the cache in %d reads, each right after a change to an account the range does not show: the result is not split by rows", run)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A change to an account it shows is read at once.
	if _, err := s.conn.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	want, err = psql(t, direct, nil, read[2])
	if err != nil {
		t.Fatalf("psql against PostgreSQL: %v\n%s", err, want)
	}
	if got, err := psql(t, viaFront, nil, read...); err != nil || got != want {
		t.Fatalf("after a change to account 2, psql through the front printed (%v)\n%s\nPostgreSQL's\n%s", err, got, want)
	}
}
