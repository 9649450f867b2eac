package larder

import (
	"context"
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
