package larder

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Role A's cached rows are never served to role B under row-level
// security: the key carries the role.
func TestRowLevelSecurityKeys(t *testing.T) {
	ddl := `CREATE TABLE docs (id int PRIMARY KEY, owner text NOT NULL, body text NOT NULL);
ALTER TABLE docs REPLICA IDENTITY FULL`
	seed := `DO $$ BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reader_a') THEN CREATE ROLE reader_a LOGIN; END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'reader_b') THEN CREATE ROLE reader_b LOGIN; END IF;
END $$;
ALTER TABLE docs ENABLE ROW LEVEL SECURITY;
CREATE POLICY own ON docs USING (owner = current_user);
GRANT SELECT ON docs TO reader_a, reader_b;
INSERT INTO docs VALUES (1, 'reader_a', 'a-secret'), (2, 'reader_b', 'b-secret'), (3, 'reader_a', 'a-other')`
	const q = "SELECT body FROM docs ORDER BY id"
	s := startStackWith(t, ddl, seed, q)
	s.client(t, 0) // waits for pins
	as := func(role string) string {
		u, err := url.Parse(s.url)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User(role)
		return u.String()
	}
	a := s.clientAs(t, as("reader_a"), 0)
	b := s.clientAs(t, as("reader_b"), 0)
	ctx := context.Background()
	read := func(c *Client) string {
		t.Helper()
		tx, err := c.BeginRO(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit(ctx)
		rows, err := tx.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for rows.Next() {
			var body string
			if err := rows.Scan(&body); err != nil {
				t.Fatal(err)
			}
			got = append(got, body)
		}
		return strings.Join(got, ",")
	}
	// A's result reaches the node first; then B reads the same SQL.
	if got := read(a); got != "a-secret,a-other" {
		t.Fatalf("role a read %q", got)
	}
	for deadline := time.Now().Add(20 * time.Second); a.Stats().NodeHits.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("role a's result never reached the node")
		}
		if got := read(a); got != "a-secret,a-other" {
			t.Fatalf("role a read %q", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 0; i < 20; i++ {
		if got := read(b); got != "b-secret" {
			t.Fatalf("role b read %q: another role's cached rows", got)
		}
	}
	if b.Stats().Misses.Load() == 0 {
		t.Fatal("role b never missed: it was served role a's entry")
	}
}
