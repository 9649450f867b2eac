package larder

import (
	"context"
	"database/sql"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A write that runs no user code leaves the session's key scope as it
// was (no re-read); one whose table runs a trigger that changes a setting
// the keys depend on makes the next read-only transaction read the scope
// again and key on the new setting.
func TestSessionScopeAfterWrites(t *testing.T) {
	ddl := tenantDDL + `;
CREATE TABLE log (id serial PRIMARY KEY, note text);
CREATE TABLE switches (tenant text NOT NULL);
ALTER TABLE switches REPLICA IDENTITY FULL;`
	seed := tenantSeed + `;
CREATE FUNCTION switch_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM set_config('app.tenant', NEW.tenant, false); RETURN NULL; END $$;
CREATE TRIGGER switch BEFORE INSERT ON switches FOR EACH ROW EXECUTE FUNCTION switch_tenant();
GRANT INSERT ON log, switches TO tenant_reader;
GRANT USAGE ON SEQUENCE log_id_seq TO tenant_reader;`
	s := startStackWith(t, ddl, seed, readDocs)
	s.client(t, 0)
	u, err := url.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("tenant_reader")
	s.url = u.String()
	dsn := s.dsn("options=-c%20app.tenant%3Da", "larder.l1=1048576")
	db := openDB(t, DriverName, dsn)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := readDocsRO(t, conn); got != "a-secret" {
		t.Fatalf("tenant a read %q", got)
	}
	d := registered.(*Driver)
	d.mu.Lock()
	cl := d.clients[dsn]
	d.mu.Unlock()
	if cl == nil {
		t.Fatal("no client behind the DSN")
	}
	reads := testutil.ToFloat64(cl.m.scopeReads)
	for i := 0; i < 3; i++ {
		if _, err := conn.ExecContext(ctx, "INSERT INTO log (note) VALUES ($1)", "x"); err != nil {
			t.Fatal(err)
		}
		if got := readDocsRO(t, conn); got != "a-secret" {
			t.Fatalf("after a plain insert, tenant a read %q", got)
		}
	}
	// The same in read/write transactions.
	for i := 0; i < 3; i++ {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO log (note) VALUES ($1)", "y"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if got := readDocsRO(t, conn); got != "a-secret" {
			t.Fatalf("after a read/write transaction, tenant a read %q", got)
		}
	}
	if got := testutil.ToFloat64(cl.m.scopeReads); got != reads {
		t.Errorf("plain inserts made the session's scope be read again %v times", got-reads)
	}
	// A SET inside a read/write transaction persists past its commit.
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "SET app.tenant = 'b'"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := readDocsRO(t, conn); got != "b-secret" {
		t.Fatalf("after SET app.tenant = 'b' in a committed transaction, read %q", got)
	}
	if _, err := conn.ExecContext(ctx, "SET app.tenant = 'a'"); err != nil {
		t.Fatal(err)
	}
	// The trigger switches the session to tenant b.
	if _, err := conn.ExecContext(ctx, "INSERT INTO switches VALUES ('b')"); err != nil {
		t.Fatal(err)
	}
	if got := readDocsRO(t, conn); got != "b-secret" {
		t.Fatalf("after a trigger set app.tenant = 'b', read %q: a result keyed on the old setting", got)
	}
}

// Inside a read-only transaction, a statement that changes the session
// (set_config of search_path) makes the next statements key on the new
// state; the transaction ends with a rollback, which undoes it (it acts as
// a SET LOCAL). A role that may not read
// the server-wide settings (after SET ROLE) reads through the cache; a
// session whose client encoding is not UTF8 reads uncached.
func TestSessionChangesInsideReadOnlyTransactions(t *testing.T) {
	ddl := `CREATE SCHEMA app;
CREATE TABLE public.items (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE app.items (id int PRIMARY KEY, name text NOT NULL);
ALTER TABLE public.items REPLICA IDENTITY FULL;
ALTER TABLE app.items REPLICA IDENTITY FULL`
	seed := `DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'plain_reader') THEN CREATE ROLE plain_reader; END IF;
END $$;
GRANT USAGE ON SCHEMA app TO plain_reader;
GRANT SELECT ON public.items, app.items TO plain_reader;
INSERT INTO public.items VALUES (1, 'public-1');
INSERT INTO app.items VALUES (1, 'app-1')`
	const q = "SELECT name FROM items WHERE id = $1"
	s := startStackWith(t, ddl, seed, q)
	s.client(t, 0)
	db := openDB(t, DriverName, s.dsn("larder.l1=1048576"))
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	name := func(tx *sql.Tx) string {
		t.Helper()
		var n string
		if err := tx.QueryRowContext(ctx, q, 1).Scan(&n); err != nil {
			_ = tx.Rollback()
			t.Fatal(err)
		}
		return n
	}
	for i := 0; i < 3; i++ { // public.items' row, cached
		tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		got := name(tx)
		_ = tx.Commit()
		if got != "public-1" {
			t.Fatalf("read %q", got)
		}
	}
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := name(tx); got != "public-1" {
		_ = tx.Rollback()
		t.Fatalf("read %q", got)
	}
	rows, err := tx.QueryContext(ctx, "SELECT set_config('search_path', 'app', false)")
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	rows.Close()
	got := name(tx)
	_ = tx.Commit()
	if got != "app-1" {
		t.Fatalf("after set_config(search_path, app) in the transaction, read %q: keyed on the old path", got)
	}
	tx, err = conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	got = name(tx)
	_ = tx.Commit()
	if got != "public-1" {
		t.Fatalf("in the next transaction (the set_config rolled back with the read-only transaction), read %q", got)
	}

	// A role without pg_read_all_settings.
	if _, err := conn.ExecContext(ctx, "SET search_path = public; SET ROLE plain_reader"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatalf("a read-only transaction as a plain role: %v", err)
		}
		got := name(tx)
		_ = tx.Commit()
		if got != "public-1" {
			t.Fatalf("as plain_reader, read %q", got)
		}
	}
	if _, err := conn.ExecContext(ctx, "RESET ROLE; SET client_encoding = 'LATIN1'"); err != nil {
		t.Fatal(err)
	}
	d := registered.(*Driver)
	d.mu.Lock()
	cl := d.clients[s.dsn("larder.l1=1048576")]
	d.mu.Unlock()
	before := cl.stats.Uncacheable.Load()
	tx, err = conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	got = name(tx)
	_ = tx.Commit()
	if got != "public-1" {
		t.Fatalf("in LATIN1, read %q", got)
	}
	if cl.stats.Uncacheable.Load() != before+1 {
		t.Error("a read in a LATIN1 session was not run uncached")
	}
}
