package larder

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/qumaana/quma"
)

func TestMembersEncoding(t *testing.T) {
	fields := []pgconn.FieldDescription{
		{Name: "id", TableOID: 16384, TableAttributeNumber: 1, DataTypeOID: pgtype.Int4OID, DataTypeSize: 4, TypeModifier: -1, Format: pgtype.BinaryFormatCode},
		{Name: "name", DataTypeOID: pgtype.TextOID, DataTypeSize: -1, TypeModifier: -1},
	}
	for _, keys := range [][]int64{nil, {4}, {4, -9, 4, 1 << 40}} {
		m, err := decodeMembers(encodeMembers(fields, keys))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(m.fields, fields) || !slices.Equal(m.keys, keys) {
			t.Errorf("round trip of %v: %+v", keys, m)
		}
	}
	good := encodeMembers(fields, []int64{1, 2, 3})
	for name, b := range map[string][]byte{
		"empty":         nil,
		"version":       append([]byte{9}, good[1:]...),
		"truncated":     good[:len(good)-1],
		"trailing":      append(slices.Clone(good), 0),
		"columns":       {membersVersion, 5, 1, 2},
		"rows in head":  append([]byte{membersVersion}, appendLen((&Result{Fields: fields[:1], Rows: [][][]byte{{nil}}}).encode(nil))...),
		"too many keys": append(append([]byte{membersVersion}, appendLen((&Result{}).encode(nil))...), 200, 1),
	} {
		if _, err := decodeMembers(b); !errors.Is(err, errCorruptResult) {
			t.Errorf("%s: %v, want errCorruptResult", name, err)
		}
	}
}

func appendLen(b []byte) []byte { return append(binary.AppendUvarint(nil, uint64(len(b))), b...) }

// A corrupt membership is refused with errCorruptResult, never a panic.
func FuzzDecodeMembers(f *testing.F) {
	f.Add(encodeMembers([]pgconn.FieldDescription{{Name: "id", DataTypeOID: pgtype.Int8OID, Format: 1}}, []int64{1, 2}))
	f.Add([]byte{membersVersion, 1, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMembers(b)
		if err != nil {
			if !errors.Is(err, errCorruptResult) {
				t.Fatalf("error %v is not errCorruptResult", err)
			}
			return
		}
		if again, err := decodeMembers(encodeMembers(m.fields, m.keys)); err != nil || !slices.Equal(again.keys, m.keys) {
			t.Fatalf("re-encoded: %v %v", again, err)
		}
	})
}

// compose puts the fetched rows in the membership's order under its
// column names, and refuses rows that are not the membership's.
func TestMembersCompose(t *testing.T) {
	s := &quma.RowSplit{Output: 0, OutputName: "item", KeyColumn: "id"}
	int4 := func(n int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }
	fields := []pgconn.FieldDescription{{Name: "item", DataTypeOID: pgtype.Int4OID, Format: 1}, {Name: "name", DataTypeOID: pgtype.TextOID}}
	fetchedFields := []pgconn.FieldDescription{{Name: "id", DataTypeOID: pgtype.Int4OID, Format: 1}, {Name: "name", DataTypeOID: pgtype.TextOID}}
	m := &memberList{fields: fields, keys: []int64{6, 2, 6}}
	fetched := &Result{Fields: fetchedFields, Rows: [][][]byte{{int4(2), []byte("two")}, {int4(6), nil}}}
	got, ok := m.compose(fetched, s)
	if !ok {
		t.Fatal("refused")
	}
	want := &Result{Fields: fields, Rows: [][][]byte{{int4(6), nil}, {int4(2), []byte("two")}, {int4(6), nil}}}
	if string(got.encode(nil)) != string(want.encode(nil)) {
		t.Errorf("composed %+v, want %+v", got, want)
	}
	missing := &Result{Fields: fetchedFields, Rows: fetched.Rows[:1]}
	otherType := &Result{Fields: []pgconn.FieldDescription{fetchedFields[0], {Name: "name", DataTypeOID: pgtype.VarcharOID}}, Rows: fetched.Rows}
	otherFormat := &Result{Fields: []pgconn.FieldDescription{{Name: "id", DataTypeOID: pgtype.Int4OID}, fetchedFields[1]}, Rows: fetched.Rows}
	fewer := &Result{Fields: fetchedFields[:1], Rows: [][][]byte{{int4(2)}, {int4(6)}}}
	for name, r := range map[string]*Result{"a row missing": missing, "another type": otherType, "another format": otherFormat, "fewer columns": fewer} {
		if _, ok := m.compose(r, s); ok {
			t.Errorf("%s: composed", name)
		}
	}
}

// searchPageAll is a search page holding every item of its category,
// which it shows.
const searchPageAll = "SELECT id, name, price, category FROM items WHERE category = $1 ORDER BY id LIMIT 50"

// A change to an item a cached search page shows ends the page but not
// which items it holds: the next read of the page reads that page's
// items again by key, not the search (a patch), through database/sql on
// a *sql.Conn whose writes the next read-only transaction must see. A
// change of which items it holds runs the search again.
func TestPatchedSearchPageThroughDatabaseSQL(t *testing.T) {
	// The read by key gives items its tag column set on id, which a
	// split needs.
	s := startStackWith(t, searchDDL, searchSeed, searchPage, "SELECT name FROM items WHERE id = $1")
	s.client(t, 0) // waits for pins
	ctx := context.Background()
	dsn := s.dsn("larder.l1=8MiB")
	db := openDB(t, DriverName, dsn)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	type item struct {
		id, price int
		name      string
	}
	read := func() []item {
		t.Helper()
		tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit()
		rows, err := tx.QueryContext(ctx, searchPage, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []item
		for rows.Next() {
			var it item
			if err := rows.Scan(&it.id, &it.name, &it.price); err != nil {
				t.Fatal(err)
			}
			out = append(out, it)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	write := func(sql string) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what string, want ...item) {
		t.Helper()
		if got := read(); !slices.Equal(got, want) {
			t.Fatalf("%s: page %v, want %v", what, got, want)
		}
	}
	page := []item{{2, 20, "item 2"}, {4, 40, "item 4"}, {6, 60, "item 6"}}
	expect("first read", page...)
	cl := driverClient(dsn)
	if cl == nil {
		t.Fatal("no client behind the DSN")
	}
	patched := func() int64 { return cl.stats.Patches.Load() }
	// untilL1Hit reads until the L1 answers, checking each page.
	untilL1Hit := func(what string, want ...item) {
		t.Helper()
		hits := cl.stats.L1Hits.Load()
		for deadline := time.Now().Add(30 * time.Second); cl.stats.L1Hits.Load() == hits; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no L1 hit in 30 s", what)
			}
			expect(what, want...)
		}
	}
	// untilPatched reads until a read is patched, checking each page.
	untilPatched := func(what string, want ...item) {
		t.Helper()
		before := patched()
		for deadline := time.Now().Add(30 * time.Second); patched() == before; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no read patched in 30 s", what)
			}
			expect(what, want...)
		}
	}
	untilL1Hit("cached", page...)

	// An item the page shows: its new price at once, and a patch.
	write("UPDATE items SET price = 41 WHERE id = 4")
	page[1].price = 41
	untilPatched("after a change to an item the page shows", page...)
	untilL1Hit("after the patch", page...)
	if got := testutil.ToFloat64(cl.m.rowPatches.WithLabelValues("patched")); got == 0 {
		t.Error("no patch counted in larder_client_row_patches_total")
	}
	if got := testutil.ToFloat64(cl.m.rowPatches.WithLabelValues("refused")); got != 0 {
		t.Errorf("%v patches refused", got)
	}

	// Which items it holds: item 2 leaves the category. The membership
	// ends with the page; the search runs again.
	before := patched()
	write("UPDATE items SET category = 2 WHERE id = 2")
	page = []item{{4, 41, "item 4"}, {6, 60, "item 6"}, {8, 80, "item 8"}}
	untilL1Hit("after item 2 left the category", page...)
	if n := patched() - before; n != 0 {
		t.Errorf("%d reads patched after a change of which items the page holds", n)
	}

	// And patched again on the new membership.
	write("UPDATE items SET name = 'renamed' WHERE id = 8")
	page[2].name = "renamed"
	untilPatched("after a rename of an item the page shows", page...)
}

// patchDDL and patchSeed: items 1-12, in categories 1-3, each priced 100.
const (
	patchItems      = 12
	patchCategories = 3
	patchSeed       = `INSERT INTO items SELECT g, 1 + g % 3, 'item ' || g, 100 FROM generate_series(1, 12) g`
)

// Writers move money between items (a change to rows the pages show)
// and move items between categories (a change of which items a page
// holds), directly on PostgreSQL; readers read every category's page in
// one read-only transaction. At every snapshot every item is on exactly
// one page, the page of its category, and the prices add up, so a patch
// that mixed a membership with rows of another snapshot is seen. broken keeps memberships for
// ever (never ended by a change of which items a page holds): the check
// must see it.
func TestPatchedPagesAddUp(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("broken=%v", broken), func(t *testing.T) {
			membersForeverForTest = broken
			defer func() { membersForeverForTest = false }()
			violations, reads, patches := patchedPagesRun(t, broken)
			switch {
			case broken && violations == 0:
				t.Fatalf("memberships kept for ever passed %d read-only transactions (%d patched reads): the check cannot fail", reads, patches)
			case !broken && violations > 0:
				t.Fatalf("%d of %d read-only transactions saw pages that do not add up (%d patched reads)", violations, reads, patches)
			case patches == 0:
				t.Fatalf("no read patched in %d read-only transactions: the patch went unchecked", reads)
			}
			t.Logf("%d violations in %d read-only transactions, %d patched reads", violations, reads, patches)
		})
	}
}

// patchedPagesRun runs writers and readers for 4 s (30 s, ending at the
// first violation, when untilViolation).
func patchedPagesRun(t *testing.T, untilViolation bool) (violations, reads, patches int64) {
	s := startStackWith(t, searchDDL, patchSeed, searchPageAll, "SELECT name FROM items WHERE id = $1",
		"UPDATE items SET price = price + $1 WHERE id = $2", "UPDATE items SET category = $1 WHERE id = $2")
	c := s.client(t, 8<<20)
	ctx := context.Background()
	run := 4 * time.Second
	if untilViolation {
		run = 30 * time.Second
	}
	rctx, cancel := context.WithTimeout(ctx, run)
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed))
			conn, err := pgx.Connect(ctx, s.url)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close(ctx)
			for rctx.Err() == nil {
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if r.Intn(5) > 0 { // money between two items, locked in id order
						a, b, amt := 1+r.Intn(patchItems), 1+r.Intn(patchItems), 1+r.Intn(10)
						if a > b {
							a, b, amt = b, a, -amt
						}
						if _, err := tx.Exec(ctx, "UPDATE items SET price = price - $1 WHERE id = $2", amt, a); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, "UPDATE items SET price = price + $1 WHERE id = $2", amt, b)
						return err
					}
					_, err := tx.Exec(ctx, "UPDATE items SET category = $1 WHERE id = $2", 1+r.Intn(patchCategories), 1+r.Intn(patchItems))
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(5+r.Intn(20)) * time.Millisecond)
			}
		}(int64(w) + 1)
	}
	var everyItem []int
	for id := 1; id <= patchItems; id++ {
		everyItem = append(everyItem, id)
	}
	var bad, n atomic.Int64
	// One reader reads up to 2 s back, one up to 300 ms, one up to 20 ms:
	// pins newer than most writes, where pages are ended and patched.
	for _, staleness := range []time.Duration{2 * time.Second, 300 * time.Millisecond, 20 * time.Millisecond} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil {
				ids, sum, err := readPages(ctx, c, staleness)
				if err != nil {
					if !errors.Is(err, ErrRetry) {
						t.Error(err)
						return
					}
					continue
				}
				n.Add(1)
				sort.Ints(ids)
				if sum != 100*patchItems || !slices.Equal(ids, everyItem) {
					if bad.Add(1) <= 3 {
						t.Logf("the pages hold items %v priced %d in all, want items 1-%d priced %d", ids, sum, patchItems, 100*patchItems)
					}
					if untilViolation {
						cancel()
					}
				}
			}
		}()
	}
	wg.Wait()
	return bad.Load(), n.Load(), c.Stats().Patches.Load()
}

// readPages reads every category's page in one read-only transaction:
// the items' ids and the sum of their prices.
func readPages(ctx context.Context, c *Client, staleness time.Duration) ([]int, int, error) {
	tx, err := c.BeginRO(ctx, staleness)
	if err != nil {
		return nil, 0, err
	}
	defer tx.Commit(ctx)
	var ids []int
	sum := 0
	for cat := 1; cat <= patchCategories; cat++ {
		rows, err := tx.Query(ctx, searchPageAll, cat)
		if err != nil {
			return nil, 0, err
		}
		for rows.Next() {
			var id, price, category int
			var name string
			if err := rows.Scan(&id, &name, &price, &category); err != nil {
				return nil, 0, err
			}
			if category != cat || name != fmt.Sprintf("item %d", id) {
				// Counted as a violation: an item twice.
				ids = append(ids, id)
			}
			ids = append(ids, id)
			sum += price
		}
		if err := rows.Err(); err != nil {
			return nil, 0, err
		}
	}
	return ids, sum, nil
}
