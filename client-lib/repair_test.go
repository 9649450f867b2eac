package larder

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/qumaana/quma"
)

// The repaired page: items of a category by end date, distinct end dates
// (items 1-6 in category 1, in the order of their ids; 7 and 8 in
// category 2).
const (
	repairDDL = `CREATE TABLE items (id int PRIMARY KEY, category int NOT NULL, name text NOT NULL, end_date timestamptz NOT NULL);
ALTER TABLE items REPLICA IDENTITY FULL`
	repairSeed = `INSERT INTO items SELECT g, CASE WHEN g <= 6 THEN 1 ELSE 2 END, 'item ' || g,
  '2030-01-01 00:00:00+00'::timestamptz + g * interval '1 hour' FROM generate_series(1, 8) g`
	repairPage = "SELECT id, name, end_date FROM items WHERE category = $1 ORDER BY end_date LIMIT 3"
)

// A page whose membership changed through named rows is repaired: an item
// that sorts after its last row enters the category (the page holds the
// same items), an item moves to its front (the page holds it first),
// each read by key with the page's own rows, not by the search. The
// membership holds twice the page's rows (its wide LIMIT): when an item
// the page holds leaves, the next row enters from it, repaired too. When
// so many leave that the rows it holds no longer fill the page, a row it
// left out may enter: the repair is refused and the search runs. Through
// database/sql, on a *sql.Conn whose writes its next read-only
// transaction sees.
func TestRepairedPageThroughDatabaseSQL(t *testing.T) {
	s := startStackWith(t, repairDDL, repairSeed, repairPage, "SELECT name FROM items WHERE id = $1")
	ctx := context.Background()
	dsn, conn, write := l1Session(t, s)
	read := func() []int {
		t.Helper()
		tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit()
		rows, err := tx.QueryContext(ctx, repairPage, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var ids []int
		for rows.Next() {
			var id int
			var name string
			var end time.Time
			if err := rows.Scan(&id, &name, &end); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	expect := func(what string, want ...int) {
		t.Helper()
		if got := read(); !slices.Equal(got, want) {
			t.Fatalf("%s: page %v, want %v", what, got, want)
		}
	}
	expect("first read", 1, 2, 3)
	cl := driverClient(dsn)
	if cl == nil {
		t.Fatal("no client behind the DSN")
	}
	outcome := func(o string) float64 { return testutil.ToFloat64(cl.m.rowPatches.WithLabelValues(o)) }
	// until reads until a read has outcome o (the first read after a
	// write may run before its fresh snapshot is placed, uncached),
	// checking each page; false after wait.
	until := func(what, o string, wait time.Duration, want ...int) bool {
		t.Helper()
		before := outcome(o)
		for deadline := time.Now().Add(wait); outcome(o) == before; {
			if time.Now().After(deadline) {
				return false
			}
			expect(what, want...)
		}
		return true
	}
	// Until the pins pass the registration of items' id set, results are
	// kept at their snapshot only, without a membership: a new item past
	// the page's end is added until a read is repaired.
	for i, deadline := 0, time.Now().Add(30*time.Second); ; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no read repaired in 30 s")
		}
		write(fmt.Sprintf("INSERT INTO items VALUES (%d, 1, 'new', '2030-02-01'::timestamptz + %d * interval '1 minute')", 100+i, i))
		if until("after a new item past the page's end", "repaired", time.Second, 1, 2, 3) {
			break
		}
	}
	// Item 5 moves to the front: repaired, at once right.
	write("UPDATE items SET end_date = '2030-01-01 00:30:00+00' WHERE id = 5")
	if !until("after item 5 moved to the front", "repaired", 30*time.Second, 5, 1, 2) {
		t.Fatal("item 5 moved to the front: no read repaired in 30 s")
	}

	// Item 1 leaves: item 3, past the LIMIT but held by the membership,
	// enters: repaired.
	write("UPDATE items SET category = 2 WHERE id = 1")
	if !until("after item 1 left the category", "repaired", 30*time.Second, 5, 2, 3) {
		t.Fatal("item 1 left the category: no read repaired in 30 s")
	}
	// The membership held 5, 1, 2, 3, 4, 6 (to item 6's end date): with
	// 2, 3 and 4 gone too, 5 and 6 are all it knows of, and item 100, past
	// its last row, should enter. The repair is refused: the search runs.
	refused := outcome("refused")
	write("UPDATE items SET category = 2 WHERE id IN (2, 3, 4)")
	if !until("after items 2-4 left the category", "refused", 30*time.Second, 5, 6, 100) {
		t.Fatal("items 2-4 left the category: no repair refused in 30 s")
	}
	if n := outcome("refused") - refused; n != 1 {
		t.Errorf("%v repairs refused, want 1", n)
	}
	// The search's membership is repaired in turn.
	write("INSERT INTO items VALUES (200, 1, 'front', '2030-01-01 00:10:00+00')")
	if !until("after a new item at the front", "repaired", 30*time.Second, 200, 5, 6) {
		t.Fatal("a new item at the front: no read repaired in 30 s")
	}
}

// The randomized check of repaired memberships. Writers move items between
// categories and give them new end dates (all distinct), directly on
// PostgreSQL; readers read, in one read-only transaction, every
// category's whole list (LIMIT 50: every item it holds) and its first
// two (LIMIT 2, whose membership holds four: full, or near it, as a
// category holds four items on average). Each item must be on exactly
// one list, and each first two must be its list's first two. Two broken
// clients must be noticed: broken=repair-ignores-changes (a repair reads
// the membership's rows only) and broken=repair-ignores-last (a repair
// of a full membership takes its first rows even past the membership's
// last, where a row it left out may belong).
func TestRepairedPagesAddUp(t *testing.T) {
	for _, c := range []struct {
		name string
		hook *bool
	}{{"broken=false", nil}, {"broken=repair-ignores-changes", &repairIgnoresAbsorbedForTest}, {"broken=repair-ignores-last", &repairIgnoresLastForTest}, {"broken=carry-ignores-full", &carryIgnoresFullForTest}} {
		t.Run(c.name, func(t *testing.T) {
			broken := c.hook != nil
			if broken {
				*c.hook = true
				defer func() { *c.hook = false }()
			}
			violations, reads, repaired, carried := repairedPagesRun(t, broken)
			switch {
			case broken && violations == 0:
				t.Fatalf("the broken client passed %d read-only transactions (%d repaired reads, %d carried): the check cannot fail", reads, repaired, carried)
			case !broken && violations > 0:
				t.Fatalf("%d of %d read-only transactions saw lists that do not add up (%d repaired reads, %d carried)", violations, reads, repaired, carried)
			case !broken && (repaired == 0 || carried == 0):
				t.Fatalf("%d repaired and %d carried reads in %d read-only transactions: a path went unchecked", repaired, carried, reads)
			}
			t.Logf("%d violations in %d read-only transactions, %d repaired reads, %d carried", violations, reads, repaired, carried)
		})
	}
}

const (
	repairItems      = 12
	repairCategories = 3
	repairList       = "SELECT id, name, end_date FROM items WHERE category = $1 ORDER BY end_date LIMIT 50"
	repairFirst      = "SELECT id, name, end_date FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date LIMIT 2"
)

// repairedPagesRun runs writers and readers for 4 s and until a read was
// repaired, or, when untilViolation, until the first violation; 30 s at
// most.
func repairedPagesRun(t *testing.T, untilViolation bool) (violations, reads, repaired, carried int64) {
	seed := fmt.Sprintf(`INSERT INTO items SELECT g, 1 + g %% %d, 'item ' || g, '2030-01-01'::timestamptz + g * interval '1 second' FROM generate_series(1, %d) g`, repairCategories, repairItems)
	s := startStackWith(t, repairDDL, seed, repairList, repairFirst, "SELECT name FROM items WHERE id = $1",
		"UPDATE items SET category = $1 WHERE id = $2", "UPDATE items SET end_date = $1 WHERE id = $2")
	c := s.client(t, 8<<20)
	ctx := context.Background()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	count := func() int64 { return int64(testutil.ToFloat64(c.m.rowPatches.WithLabelValues("repaired"))) }
	countCarried := func() int64 { return int64(testutil.ToFloat64(c.m.rowPatches.WithLabelValues("carried"))) }
	var wg sync.WaitGroup
	if !untilViolation {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for began := time.Now(); rctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
				if time.Since(began) >= 4*time.Second && count() > 0 && countCarried() > 0 {
					cancel()
				}
			}
		}()
	}
	var step atomic.Int64
	startWriters(t, rctx, &wg, s.url, 2, func(ctx context.Context, r *rand.Rand, tx pgx.Tx) error {
		id := 1 + r.Intn(repairItems)
		if r.Intn(2) == 0 {
			_, err := tx.Exec(ctx, "UPDATE items SET category = $1 WHERE id = $2", 1+r.Intn(repairCategories), id)
			return err
		}
		// A new end date, distinct from every other: a step of its own
		// in thousands of seconds, the item's id in seconds.
		end := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(step.Add(1)*1000+int64(id)) * time.Second)
		if r.Intn(3) == 0 {
			end = time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(-step.Add(1)*1000+int64(id)) * time.Second) // to the front
		}
		_, err := tx.Exec(ctx, "UPDATE items SET end_date = $1 WHERE id = $2", end, id)
		return err
	})
	var bad, n atomic.Int64
	for i, staleness := range []time.Duration{2 * time.Second, 300 * time.Millisecond, 20 * time.Millisecond} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(i)))
			for rctx.Err() == nil {
				problem, err := readRepairedLists(ctx, c, staleness, repairBounds[r.Intn(len(repairBounds))])
				if err != nil {
					if !errors.Is(err, ErrRetry) {
						t.Error(err)
						return
					}
					continue
				}
				n.Add(1)
				if problem != "" {
					if bad.Add(1) <= 3 {
						t.Logf("reader %d: %s", i, problem)
					}
					if untilViolation {
						cancel()
					}
				}
			}
		}()
	}
	wg.Wait()
	return bad.Load(), n.Load(), count(), countCarried()
}

// repairBounds are the lower bounds the first two are read from: every
// item, none moved to the front, none of the seed's first six unmoved,
// none moved before about the 2000th step.
var repairBounds = []time.Time{
	time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC),
	time.Date(2030, 1, 1, 0, 0, 7, 0, time.UTC),
	time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Add(2_000_000 * time.Second),
}

// readRepairedLists reads every category's list and first two (from a
// lower bound, one of repairBounds for all) in one read-only
// transaction; it returns what does not add up ("" when all does).
func readRepairedLists(ctx context.Context, c *Client, staleness time.Duration, bound time.Time) (string, error) {
	tx, err := c.BeginRO(ctx, staleness)
	if err != nil {
		return "", err
	}
	defer tx.Commit(ctx)
	read := func(sql string, args ...any) (ids []int, ends []time.Time, err error) {
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return nil, nil, err
		}
		for rows.Next() {
			var id int
			var name string
			var end time.Time
			if err := rows.Scan(&id, &name, &end); err != nil {
				return nil, nil, err
			}
			ids, ends = append(ids, id), append(ends, end)
		}
		return ids, ends, rows.Err()
	}
	seen := map[int]int{}
	for cat := 1; cat <= repairCategories; cat++ {
		list, ends, err := read(repairList, cat)
		if err != nil {
			return "", err
		}
		first, _, err := read(repairFirst, cat, bound)
		if err != nil {
			return "", err
		}
		var want []int
		for i, id := range list {
			if !ends[i].Before(bound) && len(want) < 2 {
				want = append(want, id)
			}
		}
		if !slices.Equal(first, want) {
			return fmt.Sprintf("category %d: first two from %s %v, list %v", cat, bound.Format(time.RFC3339), first, list), nil
		}
		for _, id := range list {
			seen[id]++
		}
	}
	for id := 1; id <= repairItems; id++ {
		if seen[id] != 1 {
			return fmt.Sprintf("item %d on %d lists", id, seen[id]), nil
		}
	}
	return "", nil
}

// A repair reads every row its keys match: a LIMIT parameter is given
// NULL (a key of a join may match several rows), the rest as the read's,
// the keys (the membership's and the absorbed ones, once each) last.
func TestRepairLoadArguments(t *testing.T) {
	p := &patchPlan{
		split:   &quma.RowSplit{Repair: &quma.Repair{SQL: "repair", KeyParam: 3, LimitParam: 2, SortOutput: 1}},
		members: &memberList{keys: []int64{5, 5, 7}, absorbed: []int64{9, 5}},
		repair:  true,
		args:    []any{1, 10},
	}
	sql, args := p.load()
	if sql != "repair" || len(args) != 3 || args[0] != 1 || args[1] != nil || !slices.Equal(args[2].([]int64), []int64{5, 7, 9}) {
		t.Errorf("load: %q %v, want repair [1 <nil> [5 7 9]]", sql, args)
	}
	if p.args[1] != 10 {
		t.Errorf("the read's arguments changed: %v", p.args)
	}
}
