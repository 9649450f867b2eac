package larder

import (
	"context"
	"database/sql"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestParseDSN(t *testing.T) {
	cfg, err := ParseDSN("postgres://u@h:5/db?sslmode=disable&larder.nats=nats://n:4222&larder.nodes=a:1,b:2&larder.quma=/q.json&larder.staleness=5s&larder.l1=1024")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PostgresURL != "postgres://u@h:5/db?sslmode=disable" || cfg.NATSURL != "nats://n:4222" || len(cfg.Nodes) != 2 || cfg.QUMA != "/q.json" || cfg.Staleness != 5*time.Second || cfg.L1Bytes != 1024 {
		t.Fatalf("%+v", cfg)
	}
	for dsn, want := range map[string]string{
		"mysql://x":                                  "postgres://",
		"postgres://h/db?larder.nats=n":              "larder.quma",
		"postgres://h/db?larder.bogus=1":             "unknown DSN parameter",
		"postgres://h/db?larder.staleness=soon":      "larder.staleness",
		"postgres://h/db?larder.l1=-4&larder.nats=n": "larder.l1",
	} {
		if _, err := ParseDSN(dsn); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", dsn, err, want)
		}
	}
}

// Existing database/sql code works by changing the driver name and DSN.
func TestDatabaseSQLDriver(t *testing.T) {
	s := startStack(t)
	s.client(t, 0) // waits for pins
	q := url.Values{}
	q.Set("larder.nats", env.NATS.URL())
	q.Set("larder.nodes", s.node)
	q.Set("larder.quma", s.quma)
	q.Set("larder.prefix", s.prefix)
	q.Set("larder.staleness", "5s")
	sep := "?"
	if strings.Contains(s.url, "?") {
		sep = "&"
	}
	db, err := sql.Open(DriverName, s.url+sep+q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	readRO := func() int {
		t.Helper()
		tx, err := db.BeginTx(WithStaleness(ctx, 2*time.Second), &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit()
		var b int
		if err := tx.QueryRowContext(ctx, readBalance, 2).Scan(&b); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = 0"); err == nil {
			t.Fatal("a write in a read-only transaction was accepted")
		}
		return b
	}
	if b := readRO(); b != 100 {
		t.Fatalf("balance %d", b)
	}
	// A read/write transaction through the same driver, then read your writes.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 5 WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if b := readRO(); b != 105 {
		t.Fatalf("after the write: %d", b)
	}
	// Outside transactions it is plain pgx.
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM accounts").Scan(&n); err != nil || n != accounts {
		t.Fatalf("count %d %v", n, err)
	}
}
