package publisher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const itemsDDL = `
CREATE TABLE items (id int PRIMARY KEY, category int, seller int, name text, qty int);
ALTER TABLE items REPLICA IDENTITY FULL;
CREATE TABLE bids (id int PRIMARY KEY, item_id int NOT NULL, user_id int NOT NULL, bid int);
ALTER TABLE bids REPLICA IDENTITY FULL;
CREATE TABLE users (id int PRIMARY KEY, nickname text UNIQUE, rating int);
`

func itemsSets() map[string][][]string {
	return map[string][][]string{
		"public.items": {{"id"}, {"category"}},
		"public.bids":  {{"item_id", "user_id"}},
		"public.users": {{"id"}},
	}
}

// Each change of a keyed tag carries the primary keys of its rows in
// brackets (invalidation.Change.Keys); a table tag, none.
func TestTagsPerChange(t *testing.T) {
	h := newHarness(t, itemsDDL)
	cfg := h.config()
	cfg.TagColumns = itemsSets()
	h.start(cfg)

	cases := []struct {
		name  string
		stmts []string
		want  string
	}{
		{"insert", []string{"INSERT INTO items VALUES (1, 5, 9, 'pen', 3)"},
			"public.items(category)=5:rows[1] public.items(id)=1:rows[1] public.items:rows"},
		{"update, keys unchanged", []string{"UPDATE items SET qty = 4 WHERE id = 1"},
			"public.items(category)=5:cols=qty[1] public.items(id)=1:cols=qty[1] public.items:cols=qty"},
		{"update, a key changed: old and new", []string{"UPDATE items SET category = 6, name = 'ink' WHERE id = 1"},
			"public.items(category)=5:rows[1] public.items(category)=6:rows[1] public.items(id)=1:cols=category,name[1] public.items:cols=category,name"},
		{"update of the primary key", []string{"UPDATE items SET id = 2 WHERE id = 1"},
			"public.items(category)=6:cols=id[1,2] public.items(id)=1:rows[1] public.items(id)=2:rows[2] public.items:cols=id"},
		{"update to NULL leaves the group", []string{"UPDATE items SET category = NULL WHERE id = 2"},
			"public.items(category)=6:rows[2] public.items(id)=2:cols=category[2] public.items:cols=category"},
		{"no-op update changes nothing", []string{"UPDATE items SET qty = qty WHERE id = 2"}, ""},
		{"delete", []string{"DELETE FROM items WHERE id = 2"},
			"public.items(id)=2:rows[2] public.items:rows"},
		{"multi-column set: each column its own value", []string{"INSERT INTO bids VALUES (1, 7, 3, 10)"},
			"public.bids(item_id,user_id)=(7,3):rows[1] public.bids:rows"},
		{"two rows, two tables, one transaction", []string{"INSERT INTO items VALUES (3, 1, 1, 'a', 1)", "UPDATE bids SET bid = 11 WHERE id = 1"},
			"public.bids(item_id,user_id)=(7,3):cols=bid[1] public.bids:cols=bid public.items(category)=1:rows[3] public.items(id)=3:rows[3] public.items:rows"},
		{"identity DEFAULT: changed columns unknown", []string{"INSERT INTO users VALUES (1, 'ann', 0)", "UPDATE users SET rating = 5 WHERE id = 1"},
			"public.users(id)=1:rows[1] public.users:rows"},
		{"identity DEFAULT update", []string{"UPDATE users SET rating = 6 WHERE id = 1"},
			"public.users(id)=1:all[1] public.users:all"},
		{"identity DEFAULT delete", []string{"DELETE FROM users WHERE id = 1"},
			"public.users(id)=1:rows[1] public.users:rows"},
		{"truncate flushes", []string{"TRUNCATE bids"},
			"flush:public.bids public.bids:rows"},
	}
	for _, c := range cases {
		got := describeKeys(h.step(c.stmts...))
		if got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

func TestDefaultSetsArePrimaryAndUniqueKeys(t *testing.T) {
	h := newHarness(t, itemsDDL)
	cfg := h.config()             // no QUMA file
	cfg.FixReplicaIdentity = true // users(nickname) is not in the identity
	h.start(cfg)
	got := describe(h.step("INSERT INTO users VALUES (1, 'bob', 0)"))
	want := "public.users(id)=1:rows public.users(nickname)=bob:rows public.users:rows"
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

// An UPDATE that leaves a TOASTed tag column alone sends it as "unchanged":
// its value must come from the old row.
func TestToastedTagColumn(t *testing.T) {
	h := newHarness(t, `CREATE TABLE docs (id int PRIMARY KEY, key text NOT NULL, body text);
ALTER TABLE docs REPLICA IDENTITY FULL;
ALTER TABLE docs ALTER COLUMN key SET STORAGE EXTERNAL;`)
	cfg := h.config()
	cfg.TagColumns = map[string][][]string{"public.docs": {{"key"}}}
	h.start(cfg)
	b := make([]byte, 6000)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	big := hex.EncodeToString(b) // 12000 characters: stored out of line
	h.step("INSERT INTO docs VALUES (1, '" + big + "', 'x')")
	var external bool
	if err := h.conn.QueryRow(context.Background(), `SELECT pg_column_size(key) < octet_length(key) OR pg_relation_size(reltoastrelid) > 0 FROM docs, pg_class WHERE relname = 'docs'`).Scan(&external); err != nil {
		t.Fatal(err)
	}
	if !external {
		t.Fatal("the key was not TOASTed: the test proves nothing")
	}
	got := h.step("UPDATE docs SET body = 'y' WHERE id = 1")
	c, ok := got["public.docs(key)="+big]
	if !ok || strings.Join(c.Columns, ",") != "body" || c.Rows {
		t.Fatalf("the TOASTed key's tag: %v (have %d changes)", c, len(got))
	}
	if len(got) != 2 {
		t.Errorf("changes: %s", describe(got))
	}
}

func TestReplicaIdentityCheck(t *testing.T) {
	h := newHarness(t, `CREATE TABLE inv (id int PRIMARY KEY, name text, qty int);
CREATE TABLE logs (msg text);`)
	cfg := h.config()
	cfg.TagColumns = map[string][][]string{"public.inv": {{"name"}}}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Run(context.Background())
	var ie *IdentityError
	if !errors.As(err, &ie) {
		t.Fatalf("want an IdentityError, got %v", err)
	}
	for _, want := range []string{
		"public.inv: tag columns name are not in its replica identity (id)",
		"public.logs: no replica identity",
		"ALTER TABLE public.inv REPLICA IDENTITY FULL;",
		"ALTER TABLE public.logs REPLICA IDENTITY FULL;",
		"--fix-replica-identity",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}

	cfg.FixReplicaIdentity = true
	h.start(cfg)
	var ident string
	if err := h.conn.QueryRow(context.Background(), `SELECT string_agg(relreplident::text, '' ORDER BY relname) FROM pg_class WHERE relname IN ('inv', 'logs')`).Scan(&ident); err != nil {
		t.Fatal(err)
	}
	if ident != "ff" {
		t.Fatalf("replica identities after the fix: %q", ident)
	}
	h.step("INSERT INTO inv VALUES (1, 'pen', 1)")
	got := describe(h.step("UPDATE inv SET name = 'ink' WHERE id = 1"))
	if want := "public.inv(name)=ink:rows public.inv(name)=pen:rows public.inv:cols=name"; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

func TestSchemaChangeFlushes(t *testing.T) {
	h := newHarness(t, itemsDDL)
	cfg := h.config()
	cfg.TagColumns = itemsSets()
	h.start(cfg)
	h.step("INSERT INTO items VALUES (1, 5, 9, 'pen', 3)")
	// The schema change flushes at its own commit (ddl_test.go has every
	// kind); the next row change, with the new shape, is an ordinary one.
	if got, want := describe(h.step("ALTER TABLE items ADD COLUMN color text")), "flush:public.items public.items:rows"; got != want {
		t.Errorf("ALTER TABLE: got %s\nwant %s", got, want)
	}
	got := describe(h.step("UPDATE items SET color = 'red' WHERE id = 1"))
	want := "public.items(category)=5:cols=color public.items(id)=1:cols=color public.items:cols=color"
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

// Heartbeats follow the writes: with an interval of an hour, a published
// transaction is still followed by a heartbeat past it (nudged), so nodes'
// watermarks and the pincushion's commit log reach a write within
// milliseconds rather than an interval.
func TestHeartbeatFollowsEachWrite(t *testing.T) {
	h := newHarness(t, `CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL);
ALTER TABLE items REPLICA IDENTITY FULL`)
	cfg := h.config()
	cfg.Heartbeat = time.Hour
	h.start(cfg)
	for i := 1; i <= 3; i++ {
		cs := h.step(fmt.Sprintf("INSERT INTO items VALUES (%d, 'x')", i))
		if _, ok := cs[fmt.Sprintf("public.items(id)=%d", i)]; !ok {
			t.Fatalf("insert %d: changes %s", i, describe(cs))
		}
	}
}

// TestKeepaliveHeartbeats: after a published transaction, the walsender's
// next keepalive shows every transaction before it decoded, and the
// publisher publishes a heartbeat through it at once, without committing a
// heartbeat transaction of its own; every heartbeat still comes after the
// transactions it covers.
func TestKeepaliveHeartbeats(t *testing.T) {
	h := newHarness(t, "CREATE TABLE kh (id int PRIMARY KEY, v int)")
	cfg := h.config()
	cfg.Heartbeat = time.Hour // no heartbeat but those writes ask for
	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	h.start(cfg)
	for i := 1; i <= 20; i++ {
		h.exec(fmt.Sprintf("INSERT INTO kh VALUES (%d, %d)", i, i))
		// The transaction, then a heartbeat through its commit.
		tag := fmt.Sprintf("public.kh(id)=%d", i)
		var commit uint64
		timeout := time.After(30 * time.Second)
		for done := false; !done; {
			select {
			case m := <-h.msgs:
				if m.Txn != nil {
					for _, c := range m.Txn.Changes {
						if c.Tag == tag {
							commit = m.Txn.CommitLSN
						}
					}
				} else if commit != 0 && m.Heartbeat.LSN >= commit {
					done = true
				}
			case <-timeout:
				t.Fatalf("insert %d: no heartbeat through its commit (%X) within 30 s", i, commit)
			}
		}
	}
	var ka, nudged float64
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "larder_invalidator_keepalive_heartbeats_total":
			ka = mf.GetMetric()[0].GetCounter().GetValue()
		case "larder_invalidator_nudged_heartbeats_total":
			nudged = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Logf("%.0f keepalive heartbeats, %.0f heartbeat transactions nudged, for 20 writes", ka, nudged)
	if ka == 0 {
		t.Fatal("no heartbeat came from a keepalive: each write waited for a heartbeat transaction")
	}
}
