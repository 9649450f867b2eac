package larder

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestSchemaChangesReachCachedResults: the reported schema changes with
// no row change after them, made on PostgreSQL directly (another
// application: no read-your-writes) or through the larder driver itself,
// while a result of the table is cached. Once the staleness limit has
// passed (or at once, for the driver's own statement) a read-only
// transaction through database/sql returns exactly what pgx's stdlib
// driver returns: the new shape and the new values.
func TestSchemaChangesReachCachedResults(t *testing.T) {
	ddl := `CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, qty int NOT NULL);
ALTER TABLE items REPLICA IDENTITY FULL`
	seed := `INSERT INTO items SELECT g, 'item-' || g, g FROM generate_series(1, 5) g`
	const q = "SELECT * FROM items WHERE id = $1"
	const all = "SELECT * FROM items ORDER BY id"
	s := startStackWith(t, ddl, seed, q, all)
	s.client(t, 0) // waits for pins
	dsn := s.dsn("larder.l1=1048576", "application_name=schema")
	db := openDB(t, DriverName, dsn)
	const staleness = 300 * time.Millisecond
	ctx := WithStaleness(context.Background(), staleness)

	// read reads in a read-only transaction through Larder, retrying it
	// once when it says so (ErrRetry: a schema change replaced the result
	// type under pgx's cached statement, as it does for pgx itself).
	read := func(c argCase) string {
		t.Helper()
		for attempt := 0; ; attempt++ {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			desc, rows, err := tryRowsOf(tx, c)
			_ = tx.Commit()
			if errors.Is(err, ErrRetry) && attempt == 0 {
				continue
			}
			if err != nil {
				t.Fatalf("%s %v: %v", c.sql, c.args, err)
			}
			return fmt.Sprint(desc, show(rows))
		}
	}
	want := func(c argCase) string {
		// pgx's own statement cache fails once after a change of result
		// type ("cached plan must not change result type"): the reference
		// reads on a new connection each time.
		direct, err := sql.Open("pgx", s.url)
		if err != nil {
			t.Fatal(err)
		}
		defer direct.Close()
		desc, rows := rowsOf(t, direct, c)
		return fmt.Sprint(desc, show(rows))
	}
	reads := []argCase{{q, []any{3}}, {all, nil}}
	read(reads[0]) // opens the driver's client
	st, _ := DriverStats(dsn)
	// warm caches the results until they are served from the cache.
	warm := func() {
		t.Helper()
		before := st.L1Hits.Load() + st.NodeHits.Load()
		for deadline := time.Now().Add(10 * time.Second); ; {
			for _, c := range reads {
				if got, w := read(c), want(c); got != w {
					t.Fatalf("before the change, %s: got %s, want %s", c.sql, got, w)
				}
			}
			if st.L1Hits.Load()+st.NodeHits.Load() >= before+int64(len(reads)) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the results were never served from the cache: the test proves nothing")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	steps := []struct {
		name, sql string
		viaLarder bool
	}{
		{"add column with a default", "ALTER TABLE items ADD COLUMN z int DEFAULT 5", false},
		{"change a type, rewriting values", "ALTER TABLE items ALTER COLUMN qty TYPE bigint USING qty * 10", false},
		{"drop a column", "ALTER TABLE items DROP COLUMN z", false},
		{"rename a column", "ALTER TABLE items RENAME COLUMN name TO title", false},
		{"drop and re-create by rename", `CREATE TABLE items_new (LIKE items INCLUDING ALL);
INSERT INTO items_new SELECT id, title || '-reloaded', qty + 1 FROM items;
DROP TABLE items;
ALTER TABLE items_new RENAME TO items;
ALTER TABLE items REPLICA IDENTITY FULL`, false},
		{"add column through the driver", "ALTER TABLE items ADD COLUMN w text DEFAULT 'w'", true},
		{"change a type through the driver", "ALTER TABLE items ALTER COLUMN qty TYPE int USING qty - 1", true},
	}
	for _, step := range steps {
		warm()
		if step.viaLarder {
			if _, err := db.ExecContext(context.Background(), step.sql); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
		} else {
			if _, err := s.conn.Exec(context.Background(), step.sql); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
			time.Sleep(staleness + 200*time.Millisecond)
		}
		for _, c := range reads {
			if got, w := read(c), want(c); got != w {
				t.Errorf("after %s, %s:\n got  %s\n want %s", step.name, c.sql, got, w)
			}
		}
	}
}

// A QUMA file written before a column was added: its schema does not know
// the column the application now reads. The client analyzes with the live
// catalog, so the result is tagged on the right table and column and a
// change of that column ends it.
func TestQUMAFileOlderThanTheSchema(t *testing.T) {
	oldDDL := `CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL);
ALTER TABLE items REPLICA IDENTITY FULL`
	const q = "SELECT z FROM items WHERE id = $1"
	s := startStackWith(t, oldDDL+";\nALTER TABLE items ADD COLUMN z int NOT NULL DEFAULT 1", "INSERT INTO items VALUES (1, 'a', 1)", q)
	// The file the application ships with: analyzed before z existed.
	writeQUMA(t, s.quma, oldDDL, "SELECT name FROM items WHERE id = $1")
	c := s.client(t, 1<<20)
	ctx := context.Background()
	read := func() int { t.Helper(); return readInt(t, ctx, c, 200*time.Millisecond, q, 1) }
	for deadline := time.Now().Add(10 * time.Second); c.Stats().L1Hits.Load()+c.Stats().NodeHits.Load() == 0; {
		if z := read(); z != 1 {
			t.Fatalf("z = %d, want 1", z)
		}
		if time.Now().After(deadline) {
			t.Fatal("the result was never served from the cache")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := s.conn.Exec(ctx, "UPDATE items SET z = 2 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // past the 200 ms staleness
	if z := read(); z != 2 {
		t.Fatalf("z = %d after the update: a result keyed by the file's older analysis stayed cached", z)
	}
}

// A read of several tables holds them all (the lock and the storage check
// name each), and a TRUNCATE of one of them after an old pin's snapshot
// makes that pin unusable instead of answering from the empty storage.
func TestJoinsHoldEveryTableAndTruncateRetires(t *testing.T) {
	ddl := `CREATE TABLE owners (id int PRIMARY KEY, name text NOT NULL);
CREATE TABLE pets (id int PRIMARY KEY, owner int NOT NULL, name text NOT NULL);
ALTER TABLE owners REPLICA IDENTITY FULL; ALTER TABLE pets REPLICA IDENTITY FULL`
	const q = "SELECT o.name, p.name FROM owners o JOIN pets p ON p.owner = o.id WHERE o.id = $1"
	s := startStackWith(t, ddl, "INSERT INTO owners VALUES (1, 'ann'); INSERT INTO pets VALUES (1, 1, 'rex')", q)
	c := s.client(t, 0)
	ctx := context.Background()
	read := func() (string, error) {
		tx, err := c.BeginRO(ctx, 10*time.Second)
		if err != nil {
			return "", err
		}
		defer tx.Commit(ctx)
		var o, p string
		err = tx.QueryRow(ctx, q, []any{1}, &o, &p)
		return o + "/" + p, err
	}
	if got, err := read(); err != nil || got != "ann/rex" {
		t.Fatalf("read %q, %v", got, err)
	}
	// Pins older than the TRUNCATE stay in the client's list (10 s
	// staleness); none of them may answer from the truncated table.
	if _, err := s.conn.Exec(ctx, "TRUNCATE pets; INSERT INTO pets VALUES (2, 1, 'max')"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		got, err := read()
		if errors.Is(err, ErrRetry) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		// Before the TRUNCATE the pet was rex; after it, max. An old pin
		// reading the new storage would see no row at all.
		if got != "ann/rex" && got != "ann/max" {
			t.Fatalf("read %q", got)
		}
	}
}
