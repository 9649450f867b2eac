package larder

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/qumaana/quma"
)

const searchDDL = `CREATE TABLE items (id int PRIMARY KEY, category int NOT NULL, name text NOT NULL, price int NOT NULL);
ALTER TABLE items REPLICA IDENTITY FULL`

// Items 1-12; the even ones are in category 1.
const searchSeed = `INSERT INTO items SELECT g, 1 + g % 2, 'item ' || g, 10 * g FROM generate_series(1, 12) g`

// searchPage is a search page: category 1's first three items (2, 4, 6).
const searchPage = "SELECT id, name, price FROM items WHERE category = $1 ORDER BY id LIMIT 3"

// searchItem is a row of searchPage.
type searchItem struct {
	id, price int
	name      string
}

// readSearchPage reads searchPage for category 1 in a read-only
// transaction on conn.
func readSearchPage(t *testing.T, ctx context.Context, conn *sql.Conn) []searchItem {
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
	var out []searchItem
	for rows.Next() {
		var it searchItem
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

// A search page is split by rows: a change to an item of its category that
// it does not show leaves it valid (no staleness miss; with the split off,
// the same change ends it), a change to an item it shows ends it, and so
// does a change of which items it holds. Through database/sql, on a
// *sql.Conn whose writes the next read-only transaction must see.
func TestRowSplitThroughDatabaseSQL(t *testing.T) {
	s := startStackWith(t, searchDDL, searchSeed, searchPage, "SELECT name FROM items WHERE id = $1")
	s.client(t, 0) // waits for pins
	for _, split := range []bool{true, false} {
		t.Run(fmt.Sprintf("split=%v", split), func(t *testing.T) {
			ctx := context.Background()
			dsn := s.dsn(fmt.Sprintf("larder.split-rows=%v", split))
			db := openDB(t, DriverName, dsn)
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			type item = searchItem
			read := func() []item { t.Helper(); return readSearchPage(t, ctx, conn) }
			d := registered.(*Driver)
			expect := func(what string, want ...item) {
				t.Helper()
				if got := read(); !slices.Equal(got, want) {
					t.Fatalf("%s: page %v, want %v", what, got, want)
				}
			}
			write := func(sql string) {
				t.Helper()
				if _, err := conn.ExecContext(ctx, sql); err != nil {
					t.Fatal(err)
				}
			}
			// From the seed again (the other subtest changed the items),
			// written in the session.
			write("DELETE FROM items")
			write(searchSeed)
			page := []item{{2, 20, "item 2"}, {4, 40, "item 4"}, {6, 60, "item 6"}}
			expect("first read", page...)
			d.mu.Lock()
			cl := d.clients[dsn]
			d.mu.Unlock()
			if cl == nil {
				t.Fatal("no client behind the DSN")
			}
			// untilHit reads until the node answers, checking each page;
			// it returns the staleness misses meanwhile.
			untilHit := func(what string, want ...item) int64 {
				t.Helper()
				cl.puts.Wait()
				stale, hits := cl.stats.NodeMisses[store.MissStaleness].Load(), cl.stats.NodeHits.Load()
				for deadline := time.Now().Add(30 * time.Second); cl.stats.NodeHits.Load() == hits; cl.puts.Wait() {
					if time.Now().After(deadline) {
						t.Fatalf("%s: no node hit in 30 s", what)
					}
					expect(what, want...)
				}
				return cl.stats.NodeMisses[store.MissStaleness].Load() - stale
			}
			untilHit("cached", page...)

			// An item of the category the page does not show.
			write("UPDATE items SET price = price + 1 WHERE id = 10")
			stale := untilHit("after a change to an item the page does not show", page...)
			switch {
			case split && stale != 0:
				t.Errorf("split: %d staleness misses after a change to an item the page does not show, want 0", stale)
			case !split && stale == 0:
				t.Errorf("whole: no staleness miss after a change to an item of the page's category: the test cannot tell split from whole")
			}
			if split {
				if got := testutil.ToFloat64(cl.m.rowSplits.WithLabelValues("split")); got == 0 {
					t.Error("no result counted as split")
				}
			} else if got := testutil.ToFloat64(cl.m.rowSplits.WithLabelValues("split")); got != 0 {
				t.Errorf("%v results split with larder.split-rows=false", got)
			}

			// An item the page shows: its new price, at once.
			write("UPDATE items SET price = 41 WHERE id = 4")
			page[1].price = 41
			expect("after a change to an item the page shows", page...)
			untilHit("after a change to an item the page shows", page...)

			// Which items it holds: one leaves the category, one enters it.
			write("UPDATE items SET category = 2 WHERE id = 2")
			page = []item{{4, 41, "item 4"}, {6, 60, "item 6"}, {8, 80, "item 8"}}
			expect("after item 2 left the category", page...)
			untilHit("after item 2 left the category", page...)
			write("INSERT INTO items VALUES (0, 1, 'item 0', 5)")
			page = []item{{0, 5, "item 0"}, {4, 41, "item 4"}, {6, 60, "item 6"}}
			expect("after item 0 entered the category", page...)
			untilHit("after item 0 entered the category", page...)
			write("UPDATE items SET name = 'renamed' WHERE id = 6")
			page[2].name = "renamed"
			expect("after a rename of an item the page shows", page...)
		})
	}
}

// intColumn reads a result's integer key column in either format, and
// refuses a NULL, another type or another name.
func TestResultIntColumn(t *testing.T) {
	field := func(name string, oid uint32, format int16) pgconn.FieldDescription {
		return pgconn.FieldDescription{Name: name, DataTypeOID: oid, Format: format}
	}
	be := func(n int64, size int) []byte {
		b := make([]byte, 8)
		binary.BigEndian.PutUint64(b, uint64(n))
		return b[8-size:]
	}
	for _, c := range []struct {
		name string
		f    pgconn.FieldDescription
		vals [][]byte
		want []int64
		ok   bool
	}{
		{"text int4", field("id", pgtype.Int4OID, pgtype.TextFormatCode), [][]byte{[]byte("7"), []byte("-3")}, []int64{7, -3}, true},
		{"binary int2", field("id", pgtype.Int2OID, pgtype.BinaryFormatCode), [][]byte{be(-2, 2)}, []int64{-2}, true},
		{"binary int4", field("id", pgtype.Int4OID, pgtype.BinaryFormatCode), [][]byte{be(-70000, 4)}, []int64{-70000}, true},
		{"binary int8", field("id", pgtype.Int8OID, pgtype.BinaryFormatCode), [][]byte{be(1<<40, 8)}, []int64{1 << 40}, true},
		{"no rows", field("id", pgtype.Int8OID, pgtype.BinaryFormatCode), nil, []int64{}, true},
		{"NULL", field("id", pgtype.Int4OID, pgtype.TextFormatCode), [][]byte{[]byte("1"), nil}, nil, false},
		{"another name", field("other", pgtype.Int4OID, pgtype.TextFormatCode), [][]byte{[]byte("1")}, nil, false},
		{"text type", field("id", pgtype.TextOID, pgtype.TextFormatCode), [][]byte{[]byte("1")}, nil, false},
		{"short binary", field("id", pgtype.Int8OID, pgtype.BinaryFormatCode), [][]byte{be(1, 4)}, nil, false},
		{"not a number", field("id", pgtype.Int4OID, pgtype.TextFormatCode), [][]byte{[]byte("x")}, nil, false},
	} {
		r := &Result{Fields: []pgconn.FieldDescription{field("name", pgtype.TextOID, 0), c.f}}
		for _, v := range c.vals {
			r.Rows = append(r.Rows, [][]byte{[]byte("n"), v})
		}
		got, ok := r.intColumn(1, "id")
		if ok != c.ok || (ok && !slices.Equal(got, c.want)) {
			t.Errorf("%s: %v %v, want %v %v", c.name, got, ok, c.want, c.ok)
		}
	}
	if _, ok := (&Result{}).intColumn(0, "id"); ok {
		t.Error("read a column of a result without columns")
	}
	// splitKeys wants the result's columns named as the split expects: a
	// column added to a table since a star was expanded is noticed.
	r := &Result{Fields: []pgconn.FieldDescription{field("id", pgtype.Int4OID, 0), field("name", pgtype.TextOID, 0)},
		Rows: [][][]byte{{[]byte("5"), []byte("x")}}}
	for _, c := range []struct {
		outputs []string
		ok      bool
	}{{[]string{"id", "name"}, true}, {[]string{"id", "name", "added"}, false}, {[]string{"id"}, false}, {[]string{"id", "other"}, false}} {
		got, ok := r.splitKeys(&quma.RowSplit{Output: 0, OutputName: "id", Outputs: c.outputs})
		if ok != c.ok || ok && !slices.Equal(got, []int64{5}) {
			t.Errorf("outputs %v: %v %v, want ok %v", c.outputs, got, ok, c.ok)
		}
	}
}

// A cacheable function reading a search page holds the page's split tags:
// a change to an item the page does not show leaves the function's entry
// valid, and a read right after it is answered from the cache (whole, no
// call after such a change would hit).
func TestFunctionHoldsSplitTags(t *testing.T) {
	s := startStackWith(t, searchDDL, searchSeed, searchPage, "SELECT name FROM items WHERE id = $1")
	c := s.openWith(t, []string{s.node}, 0, true, waitForPlacement) // reads right after writes hit
	ctx := context.Background()
	page := NewFunction("search-page", func(ctx context.Context, tx *ROTx, category int) ([]int, error) {
		rows, err := tx.Query(ctx, searchPage, category)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []int
		for rows.Next() {
			var id, price int
			var name string
			if err := rows.Scan(&id, &name, &price); err != nil {
				return nil, err
			}
			out = append(out, id, price)
		}
		return out, rows.Err()
	})
	call := func() []int {
		t.Helper()
		tx, err := c.BeginRO(ctx, time.Nanosecond) // a fresh snapshot: after the change
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit(ctx)
		got, err := page.Call(ctx, tx, 1)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	want := []int{2, 20, 4, 40, 6, 60}
	for run := 0; ; run++ {
		if _, err := s.conn.Exec(ctx, "UPDATE items SET price = price + 1 WHERE id = 10"); err != nil {
			t.Fatal(err)
		}
		hits := c.stats.FunctionHits.Load()
		if got := call(); !slices.Equal(got, want) {
			t.Fatalf("page %v, want %v", got, want)
		}
		c.puts.Wait()
		if run > 0 && c.stats.FunctionHits.Load() > hits {
			break
		}
		if run == 30 {
			t.Fatalf("no function hit in %d calls, each right after a change to an item the page does not show (runs %d; calls: uncacheable %v, l1 %v, node %v)", run, c.stats.FunctionRuns.Load(),
				testutil.ToFloat64(c.m.functionCalls.WithLabelValues("uncacheable")), testutil.ToFloat64(c.m.functionCalls.WithLabelValues("l1")), testutil.ToFloat64(c.m.functionCalls.WithLabelValues("node")))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A change to an item it shows is read at once.
	if _, err := s.conn.Exec(ctx, "UPDATE items SET price = 41 WHERE id = 4"); err != nil {
		t.Fatal(err)
	}
	if got := call(); !slices.Equal(got, []int{2, 20, 4, 41, 6, 60}) {
		t.Fatalf("after a change to item 4: page %v", got)
	}
}
