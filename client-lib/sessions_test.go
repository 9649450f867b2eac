package larder

import (
	"context"
	"database/sql"
	"math/rand"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// readRO reads one balance in a read-only transaction through database/sql.
func readRO(t *testing.T, db interface {
	BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
}, id int) int {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Commit()
	var b int
	if err := tx.QueryRowContext(context.Background(), readBalance, id).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

// Every write path of database/sql and of the native API records its
// commit: the next read-only transaction sees the write, while other
// writers keep the pins moving.
func TestReadYourWritesEveryWriteAPI(t *testing.T) {
	s := startStack(t)
	c := s.client(t, 4<<20)
	db := openDB(t, DriverName, s.dsn("larder.l1=4194304"))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() { // a concurrent writer on account 4
		defer wg.Done()
		conn, err := pgx.Connect(context.Background(), s.url)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			_, _ = conn.Exec(context.Background(), "UPDATE accounts SET ver = ver + 1 WHERE id = 4")
			time.Sleep(time.Duration(rand.Intn(3)) * time.Millisecond)
		}
	}()
	prepExec, err := db.Prepare("UPDATE accounts SET balance = $1 WHERE id = $2")
	if err != nil {
		t.Fatal(err)
	}
	defer prepExec.Close()
	prepQuery, err := db.Prepare("UPDATE accounts SET balance = $1 WHERE id = $2 RETURNING balance")
	if err != nil {
		t.Fatal(err)
	}
	defer prepQuery.Close()
	apis := map[string]func(v, id int) error{
		"db.Exec": func(v, id int) error {
			_, err := db.ExecContext(ctx, "UPDATE accounts SET balance = $1 WHERE id = $2", v, id)
			return err
		},
		"db.QueryRow RETURNING": func(v, id int) error {
			var got int
			return db.QueryRowContext(ctx, "UPDATE accounts SET balance = $1 WHERE id = $2 RETURNING balance", v, id).Scan(&got)
		},
		"db.Query CTE": func(v, id int) error {
			rows, err := db.QueryContext(ctx, "WITH u AS (UPDATE accounts SET balance = $1 WHERE id = $2 RETURNING id) SELECT id FROM u", v, id)
			if err != nil {
				return err
			}
			return rows.Close()
		},
		"stmt.Exec": func(v, id int) error {
			_, err := prepExec.ExecContext(ctx, v, id)
			return err
		},
		"stmt.QueryRow RETURNING": func(v, id int) error {
			var got int
			return prepQuery.QueryRowContext(ctx, v, id).Scan(&got)
		},
		"tx.Exec + Commit": func(v, id int) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = $1 WHERE id = $2", v, id); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		},
		"tx.Stmt + Commit": func(v, id int) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.StmtContext(ctx, prepExec).ExecContext(ctx, v, id); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		},
		"conn.Exec": func(v, id int) error {
			conn, err := db.Conn(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.ExecContext(ctx, "UPDATE accounts SET balance = $1 WHERE id = $2", v, id)
			return err
		},
	}
	for name, write := range apis {
		for i := 0; i < 15; i++ {
			v := 1000 + rand.Intn(1_000_000)
			id := 1 + rand.Intn(3)
			readRO(t, db, id) // cache the old value
			if err := write(v, id); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got := readRO(t, db, id); got != v {
				t.Fatalf("%s, try %d: read %d after writing %d", name, i, got, v)
			}
		}
	}
	// The native API.
	for i := 0; i < 15; i++ {
		v, id := 1000+rand.Intn(1_000_000), 1+rand.Intn(3)
		rd := func() int {
			tx, err := c.BeginRO(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Commit(ctx)
			var b int
			if err := tx.QueryRow(ctx, readBalance, []any{id}, &b); err != nil {
				t.Fatal(err)
			}
			return b
		}
		rd()
		rw, err := c.BeginRW(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rw.Exec(ctx, "UPDATE accounts SET balance = $1 WHERE id = $2", v, id); err != nil {
			t.Fatal(err)
		}
		if err := rw.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if got := rd(); got != v {
			t.Fatalf("native BeginRW, try %d: read %d after writing %d", i, got, v)
		}
	}
}

// DSN values with spaces reach PostgreSQL intact.
func TestDSNValuesWithSpaces(t *testing.T) {
	s := startStack(t)
	s.client(t, 0)
	db := openDB(t, DriverName, s.dsn("application_name=my%20app", "options=-c%20app.tenant%3Dalpha"))
	var app, tenant string
	if err := db.QueryRowContext(context.Background(), "SELECT current_setting('application_name'), current_setting('app.tenant')").Scan(&app, &tenant); err != nil {
		t.Fatal(err)
	}
	if app != "my app" || tenant != "alpha" {
		t.Fatalf("application_name %q, app.tenant %q", app, tenant)
	}
	cfg, err := ParseDSN("postgres://h/db?application_name=my%20app&larder.nats=n&larder.quma=q&options=-c%20x%3D1")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PostgresURL != "postgres://h/db?application_name=my%20app&options=-c%20x%3D1" {
		t.Fatalf("PostgresURL %q", cfg.PostgresURL)
	}
}

// The consistency ablation cannot be turned on by a DSN alone, and DSN
// mistakes are errors.
func TestDSNRefusals(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://h/db?larder.nats=n&larder.quma=q&" + UnsafeAblationParam + "=true": "EnableUnsafeBenchmarkAblation",
		"postgres://h/db?larder.nats=n&larder.quma=q&larder.ignore-consistency=true":   "unknown DSN parameter",
		"postgres://h/db?larder.nats=n&larder.quma=q&larder.nats=m":                    "twice",
	} {
		if _, err := ParseDSN(dsn); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", dsn, err, want)
		}
	}
}

const tenantDDL = `CREATE TABLE docs (id int PRIMARY KEY, tenant text NOT NULL, body text NOT NULL);
ALTER TABLE docs REPLICA IDENTITY FULL`

const tenantSeed = `DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tenant_reader') THEN CREATE ROLE tenant_reader LOGIN; END IF;
END $$;
ALTER TABLE docs ENABLE ROW LEVEL SECURITY;
CREATE POLICY by_tenant ON docs USING (tenant = current_setting('app.tenant', true));
GRANT SELECT ON docs TO tenant_reader;
INSERT INTO docs VALUES (1, 'a', 'a-secret'), (2, 'b', 'b-secret')`

const readDocs = "SELECT body FROM docs ORDER BY id"

func readDocsRO(t *testing.T, db interface {
	BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
}) string {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Commit()
	rows, err := tx.QueryContext(context.Background(), readDocs)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var b string
		if err := rows.Scan(&b); err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return strings.Join(out, ",")
}

// A row-level-security policy that reads a session setting: every setting
// is in the key, whether it comes from the DSN or from a SET on a
// *sql.Conn, and a read-only transaction begun on a *sql.Conn reads with
// that connection's session.
func TestSessionSettingsAreInTheKey(t *testing.T) {
	s := startStackWith(t, tenantDDL, tenantSeed, readDocs)
	s.client(t, 0)
	u, err := url.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("tenant_reader")
	s.url = u.String()
	dbA := openDB(t, DriverName, s.dsn("options=-c%20app.tenant%3Da", "larder.l1=1048576"))
	dbB := openDB(t, DriverName, s.dsn("options=-c%20app.tenant%3Db", "larder.l1=1048576"))
	for i := 0; i < 10; i++ {
		if got := readDocsRO(t, dbA); got != "a-secret" {
			t.Fatalf("tenant a read %q", got)
		}
		if got := readDocsRO(t, dbB); got != "b-secret" {
			t.Fatalf("tenant b read %q: another tenant's cached rows", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// SET on a *sql.Conn, then a read-only transaction on it.
	ctx := context.Background()
	conn, err := dbA.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for i := 0; i < 5; i++ {
		if got := readDocsRO(t, conn); got != "a-secret" {
			t.Fatalf("conn as tenant a read %q", got)
		}
		if _, err := conn.ExecContext(ctx, "SET app.tenant = 'b'"); err != nil {
			t.Fatal(err)
		}
		if got := readDocsRO(t, conn); got != "b-secret" {
			t.Fatalf("conn after SET app.tenant = 'b' read %q", got)
		}
		if _, err := conn.ExecContext(ctx, "SELECT set_config('app.tenant', 'a', false)"); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := DriverStats(s.dsn("options=-c%20app.tenant%3Da", "larder.l1=1048576"))
	if st.L1Hits.Load()+st.NodeHits.Load() == 0 {
		t.Fatal("nothing was served from the cache: the keys went unchecked")
	}
}

// A role whose search_path puts another schema first reads that schema's
// table: tags and keys follow PostgreSQL's resolution, so a change there
// invalidates the result.
func TestSearchPathResolution(t *testing.T) {
	ddl := `CREATE SCHEMA app;
CREATE TABLE public.items (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE app.items (id int PRIMARY KEY, name text NOT NULL);
ALTER TABLE public.items REPLICA IDENTITY FULL;
ALTER TABLE app.items REPLICA IDENTITY FULL`
	seed := `DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'app_reader') THEN CREATE ROLE app_reader LOGIN; END IF;
END $$;
GRANT USAGE ON SCHEMA app TO app_reader;
GRANT SELECT ON public.items, app.items TO app_reader;
INSERT INTO public.items VALUES (1, 'public-1');
INSERT INTO app.items VALUES (1, 'app-1')`
	const q = "SELECT name FROM items WHERE id = $1"
	s := startStackWith(t, ddl, seed, q)
	s.client(t, 0)
	if _, err := s.conn.Exec(context.Background(), "ALTER ROLE app_reader SET search_path = app, public"); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("app_reader")
	s.url = u.String()
	db := openDB(t, DriverName, s.dsn("larder.l1=1048576"))
	read := func() string {
		tx, err := db.BeginTx(context.Background(), &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit()
		var name string
		if err := tx.QueryRowContext(context.Background(), q, 1).Scan(&name); err != nil {
			t.Fatal(err)
		}
		return name
	}
	for i := 0; i < 5; i++ {
		if got := read(); got != "app-1" {
			t.Fatalf("read %q, want app.items' row", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The owner changes app.items; the result must follow within the
	// staleness limit.
	if _, err := s.conn.Exec(context.Background(), "UPDATE app.items SET name = 'app-2' WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(8 * time.Second) // the DSN's staleness is 5 s
	for {
		got := read()
		if got == "app-2" {
			break
		}
		if got != "app-1" {
			t.Fatalf("read %q", got)
		}
		if time.Now().After(deadline) {
			t.Fatal("app.items' change never reached the cached result: it was tagged with another table")
		}
		time.Sleep(100 * time.Millisecond)
	}
	st, _ := DriverStats(s.dsn("larder.l1=1048576"))
	if st.L1Hits.Load()+st.NodeHits.Load() == 0 {
		t.Fatal("nothing was served from the cache")
	}
}

// Tables the invalidator does not publish (its --tables) are never cached:
// their changes would never end a cached result.
func TestUncoveredTablesAreNotCached(t *testing.T) {
	ddl := schemaSQL + `;
CREATE TABLE notes (id int PRIMARY KEY, body text NOT NULL);
ALTER TABLE notes REPLICA IDENTITY FULL`
	const readNote = "SELECT body FROM notes WHERE id = $1"
	s := startStackWith(t, ddl, "INSERT INTO accounts VALUES (1, 100); INSERT INTO notes VALUES (1, 'v1')", readBalance, readNote)
	// An invalidator that publishes accounts only, on a publication and
	// slot of its own.
	s.stopInvalidator()
	if err := s.dropSlot(s.prefix); err != nil {
		t.Fatal(err)
	}
	s.invOpts.Slot, s.invOpts.Publication, s.invOpts.Tables = s.prefix+"_acc", s.prefix+"_acc", []string{"public.accounts"}
	s.startInvalidator(t)
	c := s.client(t, 4<<20)
	ctx := context.Background()
	read := func(sql string) string {
		t.Helper()
		tx, err := c.BeginRO(ctx, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit(ctx)
		var v string
		if err := tx.QueryRow(ctx, sql, []any{1}, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for i := 0; i < 3; i++ {
		read(readNote)
		read(readBalance)
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := s.conn.Exec(ctx, "UPDATE notes SET body = 'v2' WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // past the 200 ms staleness
	if got := read(readNote); got != "v2" {
		t.Fatalf("notes read %q after the update: a table the invalidator does not cover was cached", got)
	}
	if c.Stats().L1Hits.Load()+c.Stats().NodeHits.Load() == 0 {
		t.Fatal("the covered table was never served from the cache")
	}
}

// A session's temporary table shadows a table of the same name for that
// session only (pg_temp comes first on every path): its reads must not be
// served another session's cached results of the permanent table, nor be
// cached for others.
func TestTemporaryTablesAreNotCached(t *testing.T) {
	s := startStack(t)
	s.client(t, 0) // waits for pins
	dsn := s.dsn("larder.l1=1048576", "application_name=temp")
	db := openDB(t, DriverName, dsn)
	readRO(t, db, 1)
	st, _ := DriverStats(dsn)
	for deadline := time.Now().Add(10 * time.Second); st.L1Hits.Load()+st.NodeHits.Load() == 0; {
		if b := readRO(t, db, 1); b != 100 {
			t.Fatalf("balance %d, want 100", b)
		}
		if time.Now().After(deadline) {
			t.Fatal("the permanent table's row was never served from the cache")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Two sessions, each with a temporary accounts table of its own.
	ctx := context.Background()
	conns := map[int]*sql.Conn{999: nil, 555: nil}
	for balance := range conns {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "CREATE TEMP TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, ver int NOT NULL DEFAULT 0)"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO accounts VALUES (1, $1)", balance); err != nil {
			t.Fatal(err)
		}
		conns[balance] = conn
	}
	for i := 0; i < 5; i++ {
		for balance, conn := range conns {
			if b := readRO(t, conn, 1); b != balance {
				t.Fatalf("a session with a temporary accounts table read balance %d, want its own %d", b, balance)
			}
		}
		time.Sleep(50 * time.Millisecond) // let the puts land
	}
	// Other sessions still read (and hit) the permanent table.
	if b := readRO(t, db, 1); b != 100 {
		t.Fatalf("another session read balance %d, want 100", b)
	}
}
