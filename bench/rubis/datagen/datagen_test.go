package datagen

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true}, &env))
}

var tiny = Size{Users: 300, ActiveItems: 120, OldItems: 200, Categories: 20, Regions: 62, MaxDescription: 200, MaxComment: 100}

func load(t *testing.T, seed int64, now time.Time) (*pgx.Conn, Counts) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), testenv.Database(t, env.PG))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	counts, err := Load(context.Background(), conn, Config{Size: tiny, Seed: seed, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return conn, counts
}

func TestLoadTiny(t *testing.T) {
	now := time.Now()
	conn, counts := load(t, 1, now)
	ctx := context.Background()
	for table, want := range map[string]int64{"categories": 20, "regions": 62, "users": 300, "items": 120, "old_items": 200, "comments": 120} {
		var n int64
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want || counts[table] != want {
			t.Errorf("%s: %d rows (reported %d), want %d", table, n, counts[table], want)
		}
	}
	// Every active item is open now; every old one has ended; counters
	// match the bids.
	var open, ended, mismatched int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM items WHERE end_date >= $1 AND start_date <= $1", now.UTC()).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM old_items WHERE end_date < $1", now.UTC()).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM items i LEFT JOIN (SELECT item_id, count(*) n, max(bid) m FROM bids GROUP BY item_id) b ON b.item_id = i.id
WHERE i.nb_of_bids <> coalesce(b.n, 0) OR (b.n > 0 AND i.max_bid <> b.m)`).Scan(&mismatched); err != nil {
		t.Fatal(err)
	}
	if open != 120 || ended != 200 || mismatched != 0 {
		t.Fatalf("open %d/120, ended %d/200, items whose counters disagree with their bids %d", open, ended, mismatched)
	}
	// Authentication as the spec has it, and sequences past the data.
	var id int
	if err := conn.QueryRow(ctx, "SELECT id FROM users WHERE nickname = $1 AND password = $2", "user7", "password7").Scan(&id); err != nil || id != 7 {
		t.Fatalf("auth: %d %v", id, err)
	}
	if err := conn.QueryRow(ctx, "INSERT INTO items (name, initial_price, quantity, seller, category) VALUES ('x', 1, 1, 1, 1) RETURNING id").Scan(&id); err != nil || id != 121 {
		t.Fatalf("next item id %d %v", id, err)
	}
}

func TestLoadIsDeterministic(t *testing.T) {
	now := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	digest := func(conn *pgx.Conn) string {
		var d string
		err := conn.QueryRow(context.Background(), `SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM (
  SELECT row(i.*)::text t FROM items i UNION ALL SELECT row(b.*)::text FROM bids b UNION ALL SELECT row(c.*)::text FROM comments c
  UNION ALL SELECT row(u.*)::text FROM users u) x`).Scan(&d)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, _ := load(t, 42, now)
	b, _ := load(t, 42, now)
	c, _ := load(t, 43, now)
	if digest(a) != digest(b) {
		t.Fatal("the same seed gave different data")
	}
	if digest(a) == digest(c) {
		t.Fatal("different seeds gave the same data")
	}
}

func TestSizes(t *testing.T) {
	s := TxCacheInMemory.Scaled(0.01)
	if s.Users != 1600 || s.ActiveItems != 350 || s.OldItems != 500 {
		t.Fatalf("%+v", s)
	}
	if _, err := Load(context.Background(), nil, Config{Size: Size{}}); err == nil {
		t.Fatal("an empty size was accepted")
	}
}
