package publisher

import (
	"context"
	"encoding/json"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
)

// txnStep runs statements in one transaction and returns its xid, the
// WAL position after its commit, and the messages published for it
// (every transaction message before the heartbeat that covers it; the
// test fails if they belong to another transaction).
func (h *harness) txnStep(stmts ...string) (xid uint32, after pglogrepl.LSN, txns []*invalidation.Txn) {
	h.t.Helper()
	ctx := context.Background()
	tx, err := h.conn.Begin(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	var x int64
	if err := tx.QueryRow(ctx, "SELECT txid_current()").Scan(&x); err != nil {
		h.t.Fatal(err)
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			h.t.Fatalf("%s: %v", s, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		h.t.Fatal(err)
	}
	after = h.walLSN()
	txns = h.until(after)
	xid = uint32(x)
	for _, t := range txns {
		if t.XID != xid || t.CommitLSN >= uint64(after) {
			h.t.Fatalf("%v: a message of another transaction (xid %d at %X; want xid %d before %s)", stmts, t.XID, t.CommitLSN, xid, after)
		}
	}
	return xid, after, txns
}

// flushed returns the tables a transaction's messages flush, sorted, and
// its commit LSN (0 without messages).
func flushed(txns []*invalidation.Txn) (tables []string, lsn uint64) {
	for _, t := range txns {
		lsn = t.CommitLSN
		for _, c := range t.Changes {
			if c.Flush {
				tables = append(tables, c.Tag)
			}
		}
	}
	sort.Strings(tables)
	return tables, lsn
}

// schemaNotice is the JSON of a notice on p.schema.changed.
type schemaNotice struct {
	CommitLSN uint64   `json:"commit_lsn"`
	Flushed   []string `json:"flushed"`
}

// schemaNotices subscribes to the schema change notices of h's prefix.
func (h *harness) schemaNotices() chan schemaNotice {
	h.t.Helper()
	ch := make(chan schemaNotice, 64)
	sub, err := h.nc.Subscribe(h.prefix+".schema.changed", func(m *nats.Msg) {
		var s schemaNotice
		if err := json.Unmarshal(m.Data, &s); err != nil {
			h.t.Errorf("schema notice %q: %v", m.Data, err)
		}
		ch <- s
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := h.nc.Flush(); err != nil {
		h.t.Fatal(err)
	}
	return ch
}

// Every kind of schema change flushes, by itself and at its own commit,
// the tables whose results it can change; a change to anything but a
// table (functions, views, privileges) flushes every covered table.
func TestDDLFlushesWithoutRowChanges(t *testing.T) {
	h := newHarness(t, itemsDDL+`
CREATE UNIQUE INDEX users_nick ON users (nickname);
INSERT INTO items VALUES (1, 5, 9, 'pen', 3);
CREATE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 42';
CREATE VIEW sellers AS SELECT id, seller FROM items WHERE seller > 0;
CREATE TABLE meas (k int PRIMARY KEY, v int) PARTITION BY RANGE (k);
CREATE TABLE meas1 PARTITION OF meas FOR VALUES FROM (0) TO (10);`)
	cfg := h.config()
	cfg.TagColumns = itemsSets()
	h.start(cfg)
	notices := h.schemaNotices()

	all := "public.bids public.items public.meas1 public.users"
	cases := []struct {
		stmt string
		want string // tables flushed
	}{
		{"ALTER TABLE items ADD COLUMN z int DEFAULT 5", "public.items"},
		{"ALTER TABLE items ALTER COLUMN qty TYPE bigint USING qty * 2", "public.items"},
		{"ALTER TABLE items RENAME COLUMN name TO title", "public.items"},
		{"ALTER TABLE items DROP COLUMN z", "public.items"},
		{"CREATE INDEX items_seller ON items (seller)", "public.items"},
		{"DROP INDEX users_nick", "public.users"}, // a key index: the default tag sets change
		{"CREATE OR REPLACE VIEW sellers AS SELECT id, seller FROM items WHERE seller > 1", all},
		{"CREATE OR REPLACE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 43'", all},
		{"GRANT SELECT ON items TO PUBLIC", all},
		{"REVOKE SELECT ON items FROM PUBLIC", all},
		{"CREATE POLICY mine ON items USING (seller = 9)", "public.items"},
		{"ALTER TABLE items ENABLE ROW LEVEL SECURITY", "public.items"},
		{"DROP POLICY mine ON items", "public.items"},
		{"ALTER TABLE bids RENAME TO offers", "public.bids public.offers"},
		{"CREATE SCHEMA s2", "public.items public.meas1 public.offers public.users"},
		{"ALTER TABLE offers SET SCHEMA s2", "public.offers s2.offers"},
		{"DROP TABLE s2.offers", "s2.offers"},
		// A partitioned table's partitions are what is published.
		{"ALTER TABLE meas ADD COLUMN w int", "public.meas1"},
		// Temporary relations are no one else's: nothing.
		{"CREATE TEMP TABLE scratch (a int PRIMARY KEY)", ""},
		{"CREATE TEMP VIEW scratch_v AS SELECT * FROM scratch", ""},
		{"DROP TABLE scratch CASCADE", ""},
	}
	var last uint64
	for _, c := range cases {
		xid, _, txns := h.txnStep(c.stmt)
		got, lsn := flushed(txns)
		if strings.Join(got, " ") != c.want {
			t.Errorf("%s (xid %d): flushed %q, want %q", c.stmt, xid, strings.Join(got, " "), c.want)
		}
		if c.want == "" {
			continue
		}
		if lsn <= last {
			t.Errorf("%s: flushed at %X, not after the previous change (%X)", c.stmt, lsn, last)
		}
		last = lsn
		select {
		case n := <-notices:
			if n.CommitLSN != lsn || strings.Join(n.Flushed, " ") != c.want {
				t.Errorf("%s: notice %+v; want commit LSN %X, flushed %s", c.stmt, n, lsn, c.want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no notice on %s.schema.changed", c.stmt, h.prefix)
		}
	}
	select {
	case n := <-notices:
		t.Errorf("a notice for temporary relations: %+v", n)
	default:
	}
	// The catalog is the new one: a change to the renamed, retyped table
	// publishes with the new names, and no flush of its own.
	if got, want := describe(h.step("UPDATE items SET title = 'ink' WHERE id = 1")), "public.items(category)=5:cols=title public.items(id)=1:cols=title public.items:cols=title"; got != want {
		t.Errorf("after the schema changes:\n got %s\nwant %s", got, want)
	}
}

// A DROP COLUMN made right after the invalidator restarted flushes the
// table at its own commit, with no row change after it.
func TestDropColumnRightAfterRestart(t *testing.T) {
	h := newHarness(t, itemsDDL)
	cfg := h.config()
	cfg.TagColumns = itemsSets()
	h.start(cfg)
	h.step("INSERT INTO items VALUES (1, 5, 9, 'pen', 3)")
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	rep := newReplicating()
	cfg.Commits = rep
	s := h.startPublisher(cfg)
	rep.wait(t, s)
	_, _, txns := h.txnStep("ALTER TABLE items DROP COLUMN name")
	if got, _ := flushed(txns); strings.Join(got, " ") != "public.items" {
		t.Fatalf("DROP COLUMN after a restart flushed %v; want public.items", got)
	}
}

// The reload pattern: a copy of the table replaces it in one transaction.
// Results of the old table are flushed at that commit, and the new table
// is learned (its keys and changes published).
func TestDropAndRecreateFlushes(t *testing.T) {
	h := newHarness(t, `CREATE TABLE customer (id int PRIMARY KEY, name text);
INSERT INTO customer VALUES (1, 'ann'), (2, 'bob');`)
	cfg := h.config()
	h.start(cfg)
	xid, _, txns := h.txnStep(
		"CREATE TABLE customer_new (LIKE customer INCLUDING ALL)",
		"INSERT INTO customer_new VALUES (1, 'ann'), (2, 'bo')",
		"DROP TABLE customer",
		"ALTER TABLE customer_new RENAME TO customer")
	got, _ := flushed(txns)
	if !contains(got, "public.customer") {
		t.Fatalf("xid %d: the replaced table was not flushed at the commit replacing it: flushed %v", xid, got)
	}
	if got, want := describe(h.step("UPDATE customer SET name = 'bob' WHERE id = 2")), "public.customer(id)=2:all public.customer:all"; got != want {
		t.Errorf("a change to the new table:\n got %s\nwant %s", got, want)
	}
}

// A table created while the invalidator runs is learned: its first
// changes are published with its tag column sets, without a flush.
func TestNewTableIsLearned(t *testing.T) {
	h := newHarness(t, `CREATE TABLE old (id int PRIMARY KEY)`)
	cfg := h.config()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.startWith(p)
	h.step("CREATE TABLE fresh (id int PRIMARY KEY, name text)")
	if sets := p.TagSets(); !reflect.DeepEqual(sets["public.fresh"], [][]string{{"id"}}) {
		t.Errorf("tag sets after CREATE TABLE: %v", sets)
	}
	if got, want := describe(h.step("INSERT INTO fresh VALUES (1, 'a')")), "public.fresh(id)=1:rows public.fresh:rows"; got != want {
		t.Errorf("first insert into a new table:\n got %s\nwant %s", got, want)
	}
	if got, want := describe(h.step("UPDATE fresh SET name = 'b' WHERE id = 1")), "public.fresh(id)=1:all public.fresh:all"; got != want {
		t.Errorf("update of a new table:\n got %s\nwant %s", got, want)
	}
}

// startWith is start for a publisher made by the test.
func (h *harness) startWith(p *Publisher) {
	h.t.Helper()
	rep := newReplicating()
	p.cfg.Commits = rep
	s := runSession(h.t, p)
	h.stop = s.stop
	h.readStream()
	rep.wait(h.t, s)
	h.until(h.walLSN()) // the new slot's flush of every table
}

// The tag sets reply lists exactly the covered tables, each with its
// sets or none, and follows CREATE and DROP TABLE.
func TestTagSetsListExactlyTheCoveredTables(t *testing.T) {
	h := newHarness(t, itemsDDL+`CREATE TABLE notes (id int PRIMARY KEY, body text);`)
	cfg := h.config()
	cfg.TagColumns = map[string][][]string{"public.items": {{"id"}}, "public.bids": {{"item_id", "user_id"}}}
	cfg.Tables = []string{"public.items", "public.users"}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.startWith(p)
	want := map[string][][]string{"public.items": {{"id"}}, "public.users": {}}
	if got := p.TagSets(); !reflect.DeepEqual(got, want) {
		t.Errorf("with --tables items,users:\n got %v\nwant %v", got, want)
	}
	if b, _ := json.Marshal(p.TagSets()); string(b) != `{"public.items":[["id"]],"public.users":[]}` {
		t.Errorf("JSON reply %s", b)
	}
	h.step("ALTER PUBLICATION " + h.slot + " ADD TABLE notes")
	h.step("DROP TABLE users")
	want = map[string][][]string{"public.items": {{"id"}}, "public.notes": {}}
	if got := p.TagSets(); !reflect.DeepEqual(got, want) {
		t.Errorf("after ADD TABLE notes and DROP TABLE users:\n got %v\nwant %v", got, want)
	}
}
