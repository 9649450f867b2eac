package larder

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/internal/tags"
	"github.com/larderdb/larder/qumaana/quma"
)

// A cacheable function reading several rows is one entry: a second call
// is a hit; a change to a row it read ends it, a change to another row
// does not; a function calling it composes (its entry holds the inner
// one's tags, also when the inner call was a hit); a function reading
// something uncacheable runs every time.
func TestCacheableFunction(t *testing.T) {
	s := startStackWith(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES (1, 10), (2, 20), (3, 30), (4, 40)", readBalance)
	c := s.openWith(t, []string{s.node}, 0, true, waitForPlacement) // reads right after writes hit
	ctx := context.Background()
	runs := map[string]int{}
	balances := NewFunction("balances", func(ctx context.Context, tx *ROTx, ids []int) (map[int]int, error) {
		runs["balances"]++
		out := map[int]int{}
		for _, id := range ids {
			var b int
			if err := tx.QueryRow(ctx, readBalance, []any{id}, &b); err != nil {
				return nil, err
			}
			out[id] = b
		}
		return out, nil
	})
	total := NewFunction("total", func(ctx context.Context, tx *ROTx, ids []int) (int, error) {
		runs["total"]++
		m, err := balances.Call(ctx, tx, ids)
		if err != nil {
			return 0, err
		}
		sum := 0
		for _, b := range m {
			sum += b
		}
		return sum, nil
	})
	lucky := NewFunction("lucky", func(ctx context.Context, tx *ROTx, _ struct{}) (float64, error) {
		runs["lucky"]++
		var f float64
		err := tx.QueryRow(ctx, "SELECT random()", nil, &f)
		return f, err
	})
	ids := []int{1, 2, 3}
	withTotal := false
	call := func(fresh bool) (map[int]int, int) {
		t.Helper()
		staleness := time.Duration(0)
		if fresh {
			staleness = time.Nanosecond
		}
		tx, err := c.BeginRO(ctx, staleness)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit(ctx)
		m, err := balances.Call(ctx, tx, ids)
		if err != nil {
			t.Fatal(err)
		}
		sum := 0
		if withTotal {
			if sum, err = total.Call(ctx, tx, ids); err != nil {
				t.Fatal(err)
			}
		} else {
			for _, b := range m {
				sum += b
			}
		}
		if _, err := lucky.Call(ctx, tx, struct{}{}); err != nil {
			t.Fatal(err)
		}
		return m, sum
	}
	// waitHit calls until the function's node entry is confirmed and hit.
	waitHit := func(want map[int]int, wantSum int) {
		t.Helper()
		before, beforeTotal := runs["balances"], runs["total"]
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			m, sum := call(true)
			if m[1] != want[1] || m[2] != want[2] || m[3] != want[3] || sum != wantSum {
				t.Fatalf("balances %v, total %d; want %v, %d", m, sum, want, wantSum)
			}
			if runs["balances"] == before && runs["total"] == beforeTotal {
				return // both served from the cache
			}
			before, beforeTotal = runs["balances"], runs["total"]
			if time.Now().After(deadline) {
				t.Fatal("the function's entry was never served from the cache-node")
			}
		}
	}
	if m, sum := call(false); m[1] != 10 || m[2] != 20 || m[3] != 30 || sum != 60 {
		t.Fatalf("first call: %v, %d", m, sum)
	}
	c.puts.Wait()
	waitHit(map[int]int{1: 10, 2: 20, 3: 30}, 60)
	// total's first call finds balances cached: its entry must take the
	// inner entry's tags from the hit.
	withTotal = true
	if _, sum := call(true); sum != 60 || runs["total"] != 1 {
		t.Fatalf("total's first call: %d (runs %v)", sum, runs)
	}
	c.puts.Wait()
	waitHit(map[int]int{1: 10, 2: 20, 3: 30}, 60)
	if got := testutil.ToFloat64(c.m.functionCalls.WithLabelValues("node")); got == 0 {
		t.Error("no function call counted as a node hit")
	}

	// A row it did not read: still a hit.
	if _, err := s.conn.Exec(ctx, "UPDATE accounts SET balance = 41 WHERE id = 4"); err != nil {
		t.Fatal(err)
	}
	waitHit(map[int]int{1: 10, 2: 20, 3: 30}, 60)
	// A row it read: both functions see the change at once (fresh
	// snapshots), through the tags the outer entry took from the inner.
	if _, err := s.conn.Exec(ctx, "UPDATE accounts SET balance = 25 WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	if m, sum := call(true); m[2] != 25 || sum != 65 {
		t.Fatalf("after the update of account 2: balances %v, total %d", m, sum)
	}
	waitHit(map[int]int{1: 10, 2: 25, 3: 30}, 65)

	// random() is not cacheable: the function runs on every call.
	if runs["lucky"] < 3 {
		t.Errorf("a function reading random() ran %d times in as many calls", runs["lucky"])
	}
	if got := testutil.ToFloat64(c.m.functionCalls.WithLabelValues("uncacheable")); got < 3 {
		t.Errorf("uncacheable function calls counted: %v", got)
	}
}

// mergeTags merges by tag name: the union of the columns read.
func TestMergeTags(t *testing.T) {
	a := quma.QueryTag{Tag: tags.Tag{Table: "public.items", Columns: []string{"id"}, Values: []string{"1"}}, Reads: []string{"name"}}
	b := quma.QueryTag{Tag: tags.Tag{Table: "public.items", Columns: []string{"id"}, Values: []string{"1"}}, Reads: []string{"id", "name"}}
	c := quma.QueryTag{Tag: tags.TableTag("public.bids"), AllColumns: true}
	got := mergeTags([]quma.QueryTag{a, c, b})
	if len(got) != 2 || got[0].Tag.String() != "public.bids" || !got[0].AllColumns ||
		len(got[1].Reads) != 2 || got[1].Reads[0] != "id" || got[1].Reads[1] != "name" {
		t.Fatalf("mergeTags: %+v", got)
	}
}

// Through database/sql: a function whose body queries a *sql.Tx begun on a
// *sql.Conn is cached like a Function; outside a read-only transaction it
// runs uncached.
func TestSQLFunction(t *testing.T) {
	s := startStackWith(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES (1, 10), (2, 20)", readBalance)
	s.client(t, 0)
	db := openDB(t, DriverName, s.dsn("larder.l1=1048576"))
	ctx := context.Background()
	runs := 0
	sum := NewSQLFunction("sum", func(ctx context.Context, tx *sql.Tx, ids []int) (int, error) {
		runs++
		total := 0
		for _, id := range ids {
			var b int
			if err := tx.QueryRowContext(ctx, readBalance, id).Scan(&b); err != nil {
				return 0, err
			}
			total += b
		}
		return total, nil
	})
	call := func() int {
		t.Helper()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Commit()
		got, err := sum.Call(ctx, conn, tx, []int{1, 2})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for i := 0; i < 5; i++ {
		if got := call(); got != 30 {
			t.Fatalf("sum = %d", got)
		}
	}
	if runs >= 5 {
		t.Errorf("the function ran on each of 5 calls: never cached")
	}
	// A read/write transaction: the body runs, uncached.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := runs
	if got, err := sum.Call(ctx, conn, tx, []int{1, 2}); err != nil || got != 30 || runs != before+1 {
		t.Errorf("in a read/write transaction: %d, %v, runs %d → %d", got, err, before, runs)
	}
	_ = tx.Rollback()
}
