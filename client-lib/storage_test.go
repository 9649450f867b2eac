package larder

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStorageFacts walks the storage check through its cases with
// snapshots exported by hand: the first transaction at a snapshot runs
// the whole check and records a fact; later ones use the quick check; a
// TRUNCATE moves the storage, so a transaction at a snapshot from before
// it is refused (ErrRetry) however it is checked, and one at a snapshot
// after it records a new fact.
func TestStorageFacts(t *testing.T) {
	s := startStackWith(t, `CREATE TABLE pets (id int PRIMARY KEY, name text NOT NULL); ALTER TABLE pets REPLICA IDENTITY FULL`,
		"INSERT INTO pets VALUES (1, 'rex')", "SELECT name FROM pets WHERE id = $1")
	c := s.client(t, 0)
	ctx := context.Background()
	export := func() (string, *pgx.Conn) {
		conn, err := pgx.Connect(ctx, s.url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		var id string
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT pg_export_snapshot()").Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id, conn
	}
	tables := []string{"public.pets"}
	quick, full := c.m.storageChecks.WithLabelValues("quick"), c.m.storageChecks.WithLabelValues("full")
	hold := func(snapshot string, ts uint64) error {
		tx := &ROTx{c: c}
		defer func() { _ = tx.closeConn(ctx) }()
		return tx.begin(ctx, snapshot, ts, tables)
	}
	want := func(step string, err error, wantErr error, q, f float64) {
		t.Helper()
		if !errors.Is(err, wantErr) || (err != nil && wantErr == nil) {
			t.Fatalf("%s: %v, want %v", step, err, wantErr)
		}
		if gq, gf := testutil.ToFloat64(quick), testutil.ToFloat64(full); gq != q || gf != f {
			t.Fatalf("%s: %v quick and %v full checks, want %v and %v", step, gq, gf, q, f)
		}
	}
	before, _ := export()
	want("first at the old snapshot", hold(before, 100), nil, 0, 1)
	want("again", hold(before, 100), nil, 1, 1)
	if _, err := s.conn.Exec(ctx, "TRUNCATE pets"); err != nil {
		t.Fatal(err)
	}
	want("old snapshot after the TRUNCATE", hold(before, 100), errRewritten, 1, 2)
	after, _ := export()
	want("new snapshot", hold(after, 200), nil, 1, 3)
	want("new snapshot again", hold(after, 200), nil, 2, 3)
	want("old snapshot, the fact is newer", hold(before, 100), errRewritten, 2, 4)
	if !errors.Is(errRewritten, ErrRetry) {
		t.Fatal("errRewritten is not an ErrRetry")
	}
}
