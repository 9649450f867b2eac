package larder

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"
)

// TestL1ServesReadsAfterLaterWrites: a result the client computed stays in
// its L1, valid until an invalidation of what it read, so a session's read
// right after its own write elsewhere hits the L1 (the L1 follows the
// invalidation stream; a version kept only at its own snapshot could never
// serve a read that must see a later write). A write to what the result
// read is seen at once, by the writer and by another session.
func TestL1ServesReadsAfterLaterWrites(t *testing.T) {
	s := startStack(t)
	c := s.open(t, s.url, nil, 8<<20) // no cache-node: a hit is the L1's
	ctx := context.Background()
	write := func(sql string) { t.Helper(); execRW(t, ctx, c, sql) }
	read := func(ctx context.Context) int { t.Helper(); return readInt(t, ctx, c, 0, readBalance, 1) }
	if b := read(ctx); b != 100 {
		t.Fatalf("balance %d", b)
	}
	hitAfterWrite := 0
	for deadline := time.Now().Add(20 * time.Second); hitAfterWrite < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the reads right after a write to another account hit the L1 in 20 s (%d misses): the L1 serves nothing newer than its own snapshots",
				hitAfterWrite, c.Stats().Misses.Load())
		}
		write("UPDATE accounts SET balance = balance + 1 WHERE id = 2")
		before := c.Stats().L1Hits.Load()
		if b := read(ctx); b != 100 {
			t.Fatalf("balance %d, want 100", b)
		}
		if c.Stats().L1Hits.Load() > before {
			hitAfterWrite++
		}
	}
	// A write to the account itself ends the L1's version.
	write("UPDATE accounts SET balance = balance + 7 WHERE id = 1")
	if b := read(ctx); b != 107 {
		t.Fatalf("after my own write the balance is %d, want 107", b)
	}
	other := WithSession(ctx, NewSession())
	for deadline := time.Now().Add(5 * time.Second); ; {
		b := read(other)
		if b == 107 {
			break
		}
		if b != 100 || time.Now().After(deadline) {
			t.Fatalf("another session reads %d, want 100 (within its staleness) then 107", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestL1KeepsNodeHitsOpen: a result the L1 got from a cache-node's hit
// serves later reads too, past the interval the node proved, for as long
// as nothing it read changes: a session's read right after its own write
// elsewhere hits the L1 instead of asking the node again. (The L1 kept a
// node's hit closed, so every read at a newer timestamp missed it and
// went back to the node: one round trip per read for good.)
func TestL1KeepsNodeHitsOpen(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	// Another application server computes the result and puts it on the
	// node; it has no L1, so its hits are the node's.
	other := s.open(t, s.url, []string{s.node}, 0)
	if b := readInt(t, ctx, other, 0, readBalance, 1); b != 100 {
		t.Fatalf("balance %d", b)
	}
	for deadline := time.Now().Add(20 * time.Second); other.Stats().NodeHits.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the node never served the result put on it")
		}
		time.Sleep(20 * time.Millisecond)
		readInt(t, ctx, other, 0, readBalance, 1)
	}

	c := s.open(t, s.url, []string{s.node}, 8<<20)
	if b := readInt(t, ctx, c, 0, readBalance, 1); b != 100 {
		t.Fatalf("balance %d", b)
	}
	if st := c.Stats(); st.NodeHits.Load() != 1 || st.Misses.Load() != 0 {
		t.Fatalf("the first read: %d node hits, %d misses; want the node's hit", st.NodeHits.Load(), st.Misses.Load())
	}
	write := func(sql string) { t.Helper(); execRW(t, ctx, c, sql) }
	hits := 0
	for deadline := time.Now().Add(20 * time.Second); hits < 3; {
		if time.Now().After(deadline) {
			st := c.Stats()
			t.Fatalf("%d of the reads right after a write to another account hit the L1 in 20 s (%d node lookups, %d node hits, %d misses): the L1 kept the node's hit only for the interval the node proved",
				hits, st.NodeLookups.Load(), st.NodeHits.Load(), st.Misses.Load())
		}
		write("UPDATE accounts SET balance = balance + 1 WHERE id = 2")
		before := c.Stats().L1Hits.Load()
		if b := readInt(t, ctx, c, 0, readBalance, 1); b != 100 {
			t.Fatalf("balance %d, want 100", b)
		}
		if c.Stats().L1Hits.Load() > before {
			hits++
		}
	}
	if m := c.Stats().Misses.Load(); m != 0 {
		t.Fatalf("%d reads of the account went to PostgreSQL: the L1 did not keep the node's hit, and the node could not serve the newer timestamp at once", m)
	}
	// A write to the account itself ends the L1's version: the writer
	// sees it at once.
	write("UPDATE accounts SET balance = balance + 7 WHERE id = 1")
	if b := readInt(t, ctx, c, 0, readBalance, 1); b != 107 {
		t.Fatalf("after my own write the balance is %d, want 107", b)
	}
}

// execRW runs sql in a read/write transaction of c and commits.
func execRW(t *testing.T, ctx context.Context, c *Client, sql string) {
	t.Helper()
	rw, err := c.BeginRW(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
	if err := rw.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestL1KeepsNodeHitsOpenThroughDatabaseSQL: the same through the driver,
// as an application uses it. Another application server (its own DSN, no
// L1) puts the result on the node; this one's first read is the node's
// hit, and its reads right after its own writes elsewhere then hit its L1
// and never reach PostgreSQL.
func TestL1KeepsNodeHitsOpenThroughDatabaseSQL(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	read := func(db *sql.DB) int {
		t.Helper()
		return readBalanceDB(t, ctx, db, 1)
	}
	stats := func(dsn string) *Stats {
		t.Helper()
		st, ok := DriverStats(dsn)
		if !ok {
			t.Fatal("no driver statistics")
		}
		return st
	}
	peerDSN := s.dsn("application_name=peer")
	peer := openDB(t, DriverName, peerDSN)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b := read(peer); b != 100 {
			t.Fatalf("the other server reads balance %d", b)
		}
		if stats(peerDSN).NodeHits.Load() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the node never served the result put on it")
		}
	}
	dsn := s.dsn("larder.l1=1048576")
	db := openDB(t, DriverName, dsn)
	if b := read(db); b != 100 {
		t.Fatalf("balance %d", b)
	}
	if st := stats(dsn); st.NodeHits.Load() != 1 || st.Misses.Load() != 0 {
		t.Fatalf("the first read: %d node hits, %d misses; want the node's hit", st.NodeHits.Load(), st.Misses.Load())
	}
	hits := 0
	for deadline := time.Now().Add(20 * time.Second); hits < 3; {
		if time.Now().After(deadline) {
			st := stats(dsn)
			t.Fatalf("%d of the reads right after a write to another account hit the L1 in 20 s (%d node hits, %d misses)", hits, st.NodeHits.Load(), st.Misses.Load())
		}
		if _, err := db.ExecContext(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 2"); err != nil {
			t.Fatal(err)
		}
		before := stats(dsn).L1Hits.Load()
		if b := read(db); b != 100 {
			t.Fatalf("balance %d, want 100", b)
		}
		if stats(dsn).L1Hits.Load() > before {
			hits++
		}
	}
	if m := stats(dsn).Misses.Load(); m != 0 {
		t.Fatalf("%d reads of the account went to PostgreSQL: the L1 did not keep the node's hit", m)
	}
}

// readBalanceDB reads account id's balance in a read-only transaction of
// db.
func readBalanceDB(t *testing.T, ctx context.Context, db *sql.DB, id int) int {
	t.Helper()
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Commit()
	var bal int
	if err := tx.QueryRowContext(ctx, readBalance, id).Scan(&bal); err != nil {
		t.Fatal(err)
	}
	return bal
}

// TestTemplateMissesThroughDatabaseSQL: an application reading through the
// driver learns why each template's reads missed (DriverTemplates,
// larder_client_template_misses_total): the first read of a key is a
// compulsory miss, a read after its own write to the row is a miss of
// another class (the version it holds ended), and every read that went
// past the L1 is one of its misses.
func TestTemplateMissesThroughDatabaseSQL(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	dsn := s.dsn("larder.l1=1048576", "application_name=misses")
	db := openDB(t, DriverName, dsn)
	want := 100
	read := func() {
		t.Helper()
		if bal := readBalanceDB(t, ctx, db, 1); bal != want {
			t.Fatalf("balance %d, want %d", bal, want)
		}
	}
	// figures are the balance read's (none before its first counted
	// read: a transaction that found no usable pin, as a new client's
	// first may, reads uncached under no template).
	figures := func() TemplateFigures {
		t.Helper()
		fs, ok := DriverTemplates(dsn)
		if !ok {
			t.Fatal("no driver templates")
		}
		for _, f := range fs {
			if f.SQL == readBalance {
				return f
			}
		}
		return TemplateFigures{}
	}
	l1Misses := func(f TemplateFigures) (n int64) {
		for k, v := range f.Misses {
			if strings.HasPrefix(k, "l1 ") {
				n += v
			}
		}
		return n
	}
	// Until the L1 holds the result (the first reads may run at a fresh
	// snapshot, whose results are not kept).
	read()
	for deadline := time.Now().Add(20 * time.Second); figures().Reads["l1"] == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no L1 hit in 20 s: %+v", figures())
		}
		read()
	}
	f := figures()
	if f.SQL != readBalance {
		t.Fatal("the balance read is not among the templates")
	}
	compulsory := f.Misses["l1 compulsory"]
	if compulsory < 1 {
		t.Fatalf("the key's first read was not a compulsory miss: %v", f.Misses)
	}
	// A write to the row ends the L1's version: a read after it misses,
	// and not as compulsory (the L1 holds the key).
	for deadline := time.Now().Add(20 * time.Second); l1Misses(figures()) == l1Misses(f); {
		if time.Now().After(deadline) {
			t.Fatalf("no L1 miss after writes to the row in 20 s: %+v", figures())
		}
		if _, err := db.ExecContext(ctx, "UPDATE accounts SET balance = balance + 5 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		want += 5
		read()
	}
	g := figures()
	if g.Misses["l1 compulsory"] != compulsory || g.Misses["l1 capacity"] != 0 {
		t.Fatalf("misses after the write %v (before %v): the L1 held the key, so none is compulsory or capacity", g.Misses, f.Misses)
	}
	if got := g.Reads["database"] + g.Reads["node"]; got != l1Misses(g) {
		t.Fatalf("%d reads went past the L1 (%v), but it counted %d misses (%v)", got, g.Reads, l1Misses(g), g.Misses)
	}
}
