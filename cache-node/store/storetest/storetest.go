// Package storetest is the conformance suite every store.Backend passes,
// and a randomized differential test that drives two backends with the
// same operations and compares every answer.
package storetest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"sort"
	"testing"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
)

// NewBackend makes an empty backend with a byte budget for one test.
type NewBackend func(t *testing.T, budget int64) store.Backend

const open = store.Open

// Run runs the conformance suite.
func Run(t *testing.T, newBackend NewBackend) {
	t.Run("Intervals", func(t *testing.T) { testIntervals(t, newBackend(t, 1<<30)) })
	t.Run("Invalidate", func(t *testing.T) { testInvalidate(t, newBackend(t, 1<<30)) })
	t.Run("PendingAndConfirm", func(t *testing.T) { testPending(t, newBackend(t, 1<<30)) })
	t.Run("EndOpenAndHolds", func(t *testing.T) { testEndOpen(t, newBackend(t, 1<<30)) })
	t.Run("OutOfOrder", func(t *testing.T) { testOutOfOrder(t, newBackend(t, 1<<30)) })
	t.Run("SettleAndHolds", func(t *testing.T) { testSettle(t, newBackend(t, 1<<30)) })
	t.Run("Budget", func(t *testing.T) { testBudget(t, newBackend) })
}

var ctx = context.Background()

func dep(tag, table string, reads ...string) store.Dep {
	sort.Strings(reads)
	return store.Dep{Tag: tag, Table: table, Reads: reads, AllColumns: len(reads) == 0}
}

func put(t *testing.T, b store.Backend, key string, v store.Version) {
	t.Helper()
	if err := b.Put(ctx, []byte(key), &v); err != nil {
		t.Fatalf("put %s@%d: %v", key, v.Snapshot, err)
	}
}

func lookup(t *testing.T, b store.Backend, key string, tmin, tmax, wm uint64) store.Result {
	t.Helper()
	r, err := b.Lookup(ctx, []byte(key), tmin, tmax, wm)
	if err != nil {
		t.Fatalf("lookup %s: %v", key, err)
	}
	return r
}

func describe(r store.Result) string {
	if r.Miss != store.Hit {
		return "miss:" + r.Miss.String()
	}
	hi := fmt.Sprint(r.Hi)
	if r.Open {
		hi += "(open)"
	}
	return fmt.Sprintf("hit:%s[%d,%s)@%d", r.Value, r.Lo, hi, r.Snapshot)
}

func testIntervals(t *testing.T, b store.Backend) {
	items := dep("public.items(id)=1", "public.items", "name")
	put(t, b, "k", store.Version{Lo: 100, Hi: 200, Snapshot: 150, Deps: []store.Dep{items}, Value: []byte("v1")})
	put(t, b, "k", store.Version{Lo: 200, Hi: 300, Snapshot: 250, Deps: []store.Dep{items}, Value: []byte("v2")})
	put(t, b, "k", store.Version{Lo: 300, Hi: open, Snapshot: 320, Deps: []store.Dep{items}, Value: []byte("v3")})
	cases := []struct {
		tmin, tmax, wm uint64
		want           string
	}{
		{0, 1000, 500, "hit:v3[300,501(open))@320"},                   // newest wins
		{120, 130, 500, "hit:v1[100,200)@150"},                        // inside the first
		{199, 200, 500, "hit:v2[200,300)@250"},                        // Hi is exclusive: 199 is v1's, 200 v2's; the newest wins
		{150, 199, 500, "hit:v1[100,200)@150"},                        //
		{0, 99, 500, "miss:consistency"},                              // every version is newer than the range
		{600, 700, 500, "miss:staleness"},                             // valid only up to the watermark
		{300, 300, 299, "miss:consistency"},                           // v3 is newer than the watermark: not servable yet
		{300, 310, 300, "hit:v3[300,301(open))@320"},                  // the watermark reached it
		{0, 1000, open, "hit:v3[300,18446744073709551615(open))@320"}, // no watermark limit
	}
	for _, c := range cases {
		if got := describe(lookup(t, b, "k", c.tmin, c.tmax, c.wm)); got != c.want {
			t.Errorf("lookup [%d,%d] wm %d: got %s, want %s", c.tmin, c.tmax, c.wm, got, c.want)
		}
	}
	if got := describe(lookup(t, b, "nothing", 0, 10, 10)); got != "miss:compulsory" {
		t.Errorf("unknown key: %s", got)
	}
	// The same snapshot twice is one version.
	put(t, b, "k", store.Version{Lo: 300, Hi: open, Snapshot: 320, Deps: []store.Dep{items}, Value: []byte("other")})
	if got := describe(lookup(t, b, "k", 0, 1000, 500)); got != "hit:v3[300,501(open))@320" {
		t.Errorf("after a duplicate put: %s", got)
	}
	st, err := b.Stats(ctx)
	if err != nil || st.Versions != 3 || st.Keys != 1 {
		t.Errorf("stats %+v, %v; want 3 versions of 1 key", st, err)
	}
}

func testInvalidate(t *testing.T, b store.Backend) {
	byID := dep("public.inv(id)=2", "public.inv", "id", "qty")
	byName := dep("public.inv(name)=pen", "public.inv", "name", "qty")
	whole := dep("public.inv", "public.inv", "entry_date", "name")
	star := dep("public.stock", "public.stock")
	put(t, b, "q-id", store.Version{Lo: 10, Hi: open, Snapshot: 10, Deps: []store.Dep{byID}, Value: []byte("a")})
	put(t, b, "q-name", store.Version{Lo: 10, Hi: open, Snapshot: 10, Deps: []store.Dep{byName}, Value: []byte("b")})
	put(t, b, "q-dates", store.Version{Lo: 10, Hi: open, Snapshot: 10, Deps: []store.Dep{whole}, Value: []byte("c")})
	put(t, b, "q-star", store.Version{Lo: 10, Hi: open, Snapshot: 30, Deps: []store.Dep{star}, Value: []byte("d")})

	// Ferdinand's example: UPDATE inv SET qty WHERE id = 2 (the row's name
	// is pen) hits q-id and q-name but not q-dates.
	mustInvalidate(t, b, 20, invalidation.Change{Tag: "public.inv", Columns: []string{"qty"}},
		invalidation.Change{Tag: "public.inv(id)=2", Columns: []string{"qty"}},
		invalidation.Change{Tag: "public.inv(name)=pen", Columns: []string{"qty"}})
	want := map[string]string{
		"q-id":    "hit:a[10,20)@10",
		"q-name":  "hit:b[10,20)@10",
		"q-dates": "hit:c[10,101(open))@10",
	}
	for k, w := range want {
		if got := describe(lookup(t, b, k, 0, 1000, 100)); got != w {
			t.Errorf("%s: got %s, want %s", k, got, w)
		}
	}
	// A change at or before a version's snapshot does not end it.
	mustInvalidate(t, b, 30, invalidation.Change{Tag: "public.stock", Rows: true})
	if got := describe(lookup(t, b, "q-star", 0, 1000, 100)); got != "hit:d[10,101(open))@30" {
		t.Errorf("change at the snapshot: %s", got)
	}
	// A later, earlier-LSN invalidation never raises Hi; an UPDATE that
	// changed nothing the result reads leaves it.
	mustInvalidate(t, b, 40, invalidation.Change{Tag: "public.stock", Columns: []string{}})
	if got := describe(lookup(t, b, "q-star", 0, 1000, 100)); got != "hit:d[10,101(open))@30" {
		t.Errorf("empty update: %s", got)
	}
	// A flush of the table ends everything that depends on it.
	mustInvalidate(t, b, 50, invalidation.Change{Tag: "public.inv", Flush: true})
	if got := describe(lookup(t, b, "q-dates", 0, 1000, 100)); got != "hit:c[10,50)@10" {
		t.Errorf("flush: %s", got)
	}
	if got := describe(lookup(t, b, "q-id", 0, 1000, 100)); got != "hit:a[10,20)@10" {
		t.Errorf("flush raised an earlier end: %s", got)
	}
	// A row entering a group hits even a result that reads no column.
	put(t, b, "count", store.Version{Lo: 60, Hi: open, Snapshot: 60, Deps: []store.Dep{{Tag: "public.bids(item_id)=7", Table: "public.bids"}}, Value: []byte("n")})
	mustInvalidate(t, b, 70, invalidation.Change{Tag: "public.bids(item_id)=7", Rows: true})
	if got := describe(lookup(t, b, "count", 0, 1000, 100)); got != "hit:n[60,70)@60" {
		t.Errorf("count(*): %s", got)
	}
}

func mustInvalidate(t *testing.T, b store.Backend, lsn uint64, cs ...invalidation.Change) {
	t.Helper()
	if err := b.Invalidate(ctx, lsn, cs); err != nil {
		t.Fatal(err)
	}
}

func testPending(t *testing.T, b store.Backend) {
	d := dep("public.t(id)=1", "public.t", "v")
	put(t, b, "k", store.Version{Lo: 50, Hi: open, Snapshot: 50, Deps: []store.Dep{d}, Value: []byte("p"), Pending: true})
	if got := describe(lookup(t, b, "k", 0, 1000, 100)); got != "miss:compulsory" {
		t.Errorf("pending version served: %s", got)
	}
	// Invalidations reach pending versions.
	mustInvalidate(t, b, 80, invalidation.Change{Tag: "public.t(id)=1", Columns: []string{"v"}})
	if err := b.Confirm(ctx, []byte("k"), 50, 40, open); err != nil {
		t.Fatal(err)
	}
	if got := describe(lookup(t, b, "k", 0, 1000, 100)); got != "hit:p[40,80)@50" {
		t.Errorf("confirmed: %s", got)
	}
	put(t, b, "k2", store.Version{Lo: 50, Hi: open, Snapshot: 50, Deps: []store.Dep{d}, Value: []byte("q"), Pending: true})
	if err := b.Confirm(ctx, []byte("k2"), 50, 50, 51); err != nil {
		t.Fatal(err)
	}
	if got := describe(lookup(t, b, "k2", 0, 1000, 100)); got != "hit:q[50,51)@50" {
		t.Errorf("confirmed with an end: %s", got)
	}
	// Confirming what is not there is not an error.
	if err := b.Confirm(ctx, []byte("gone"), 1, 1, 2); err != nil {
		t.Errorf("confirm of a missing version: %v", err)
	}
}

func testEndOpen(t *testing.T, b store.Backend) {
	a := dep("public.a(id)=1", "public.a", "x")
	put(t, b, "open", store.Version{Lo: 10, Hi: open, Snapshot: 10, Deps: []store.Dep{a}, Value: []byte("o")})
	put(t, b, "closed", store.Version{Lo: 10, Hi: 15, Snapshot: 10, Deps: []store.Dep{a}, Value: []byte("c")})
	put(t, b, "late", store.Version{Lo: 10, Hi: 60, Snapshot: 10, Deps: []store.Dep{a}, Value: []byte("l")})
	put(t, b, "nodeps", store.Version{Lo: 10, Hi: 70, Snapshot: 10, Value: []byte("n")})
	held, err := b.Holds(ctx, []string{"public.a(id)=1", store.TableName("public.a"), "public.b", store.TableName("public.b")})
	if err != nil || !reflect.DeepEqual(held, []bool{true, true, false, false}) {
		t.Fatalf("holds before: %v %v", held, err)
	}
	if err := b.EndOpen(ctx, 41); err != nil {
		t.Fatal(err)
	}
	if got := describe(lookup(t, b, "open", 0, 1000, 100)); got != "hit:o[10,41)@10" {
		t.Errorf("after EndOpen: %s", got)
	}
	if got := describe(lookup(t, b, "closed", 0, 12, 100)); got != "hit:c[10,15)@10" {
		t.Errorf("EndOpen raised the end of a closed version: %s", got)
	}
	// A version closed beyond the gap is no better proved than an open
	// one: it ends there too.
	for k, w := range map[string]string{"late": "hit:l[10,41)@10", "nodeps": "hit:n[10,41)@10"} {
		if got := describe(lookup(t, b, k, 0, 1000, 100)); got != w {
			t.Errorf("%s after EndOpen: %s, want %s", k, got, w)
		}
	}
	held, err = b.Holds(ctx, []string{"public.a(id)=1", store.TableName("public.a")})
	if err != nil || !reflect.DeepEqual(held, []bool{false, false}) {
		t.Errorf("holds after: %v %v", held, err)
	}
}

// testOutOfOrder: invalidations arrive out of LSN order (a live message
// before a replayed older one): the older one still shortens what the
// newer one closed, for every kind of version, and a closed version is
// served only up to the watermark.
func testOutOfOrder(t *testing.T, b store.Backend) {
	d := dep("public.items(id)=1", "public.items", "qty")
	put(t, b, "k", store.Version{Lo: 900, Hi: open, Snapshot: 900, Deps: []store.Dep{d}, Value: []byte("v")})
	mustInvalidate(t, b, 1020, invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"qty"}})
	mustInvalidate(t, b, 1010, invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"qty"}})
	if got := describe(lookup(t, b, "k", 1010, 1010, 2000)); got != "miss:staleness" {
		t.Errorf("lookup at 1010 after the invalidations at 1020 then 1010: %s, want a miss", got)
	}
	if got := describe(lookup(t, b, "k", 900, 2000, 2000)); got != "hit:v[900,1010)@900" {
		t.Errorf("after the invalidations at 1020 then 1010: %s", got)
	}
	// A later message never raises Hi back.
	mustInvalidate(t, b, 1015, invalidation.Change{Tag: "public.items(id)=1", Rows: true})
	if got := describe(lookup(t, b, "k", 900, 2000, 2000)); got != "hit:v[900,1010)@900" {
		t.Errorf("after a third invalidation at 1015: %s", got)
	}

	// A closed version is served only up to the watermark.
	put(t, b, "c", store.Version{Lo: 900, Hi: 1020, Snapshot: 950, Deps: []store.Dep{d}, Value: []byte("c")})
	if got := describe(lookup(t, b, "c", 900, 2000, 1005)); got != "hit:c[900,1006)@950" {
		t.Errorf("closed version beyond the watermark: %s, want it served up to 1006", got)
	}
	if got := describe(lookup(t, b, "c", 1006, 1019, 1005)); got != "miss:staleness" {
		t.Errorf("closed version served beyond the watermark: %s", got)
	}
	// A flush and a put closed version, out of order too.
	mustInvalidate(t, b, 1012, invalidation.Change{Tag: "public.items", Flush: true})
	if got := describe(lookup(t, b, "c", 900, 2000, 2000)); got != "hit:c[900,1012)@950" {
		t.Errorf("closed version after an older flush: %s", got)
	}

	// A pending version: the newer message, then the older, then Confirm.
	put(t, b, "p", store.Version{Lo: 900, Hi: open, Snapshot: 900, Deps: []store.Dep{d}, Value: []byte("p"), Pending: true})
	mustInvalidate(t, b, 1040, invalidation.Change{Tag: "public.items(id)=1", AllColumns: true})
	mustInvalidate(t, b, 1030, invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"qty"}})
	if err := b.Confirm(ctx, []byte("p"), 900, 890, open); err != nil {
		t.Fatal(err)
	}
	if got := describe(lookup(t, b, "p", 0, 2000, 2000)); got != "hit:p[890,1030)@900" {
		t.Errorf("pending version after out-of-order invalidations: %s", got)
	}
	// A change that does not hit it leaves a closed version alone.
	mustInvalidate(t, b, 1025, invalidation.Change{Tag: "public.items(id)=1", Columns: []string{"name"}})
	if got := describe(lookup(t, b, "p", 0, 2000, 2000)); got != "hit:p[890,1030)@900" {
		t.Errorf("a change of another column: %s", got)
	}
}

// testSettle: a closed version stays reachable (its groups held) until the
// watermark passes its Hi; then it is final.
func testSettle(t *testing.T, b store.Backend) {
	d := dep("public.s(id)=1", "public.s", "x")
	names := []string{"public.s(id)=1", store.TableName("public.s")}
	holds := func(want bool, when string) {
		t.Helper()
		held, err := b.Holds(ctx, names)
		if err != nil || !reflect.DeepEqual(held, []bool{want, want}) {
			t.Errorf("holds %s: %v %v, want %v", when, held, err, want)
		}
	}
	put(t, b, "k", store.Version{Lo: 100, Hi: open, Snapshot: 100, Deps: []store.Dep{d}, Value: []byte("v")})
	mustInvalidate(t, b, 200, invalidation.Change{Tag: "public.s(id)=1", Columns: []string{"x"}})
	holds(true, "with a version closed beyond the watermark")
	if err := b.Settle(ctx, 150); err != nil {
		t.Fatal(err)
	}
	holds(true, "after a settle below its end")
	mustInvalidate(t, b, 180, invalidation.Change{Tag: "public.s", Flush: true})
	if got := describe(lookup(t, b, "k", 0, 1000, 1000)); got != "hit:v[100,180)@100" {
		t.Errorf("after a late flush: %s", got)
	}
	if err := b.Settle(ctx, 179); err != nil {
		t.Fatal(err)
	}
	holds(false, "once the watermark reached its end")
	if got := describe(lookup(t, b, "k", 0, 1000, 1000)); got != "hit:v[100,180)@100" {
		t.Errorf("settled: %s", got)
	}
	// A put closed version is unsettled until the next Settle.
	put(t, b, "k2", store.Version{Lo: 150, Hi: 170, Snapshot: 160, Deps: []store.Dep{d}, Value: []byte("w")})
	holds(true, "after a put of a closed version")
	if err := b.Settle(ctx, 179); err != nil {
		t.Fatal(err)
	}
	holds(false, "after settling it")
}

func testBudget(t *testing.T, newBackend NewBackend) {
	const budget = 256 << 10
	b := newBackend(t, budget)
	val := bytes.Repeat([]byte("x"), 1000)
	d := dep("public.t(id)=1", "public.t", "v")
	for i := 0; i < 2000; i++ {
		put(t, b, fmt.Sprintf("key-%d", i), store.Version{Lo: 1, Hi: open, Snapshot: uint64(i + 1), Deps: []store.Dep{d}, Value: val})
		if st, err := b.Stats(ctx); err != nil || st.Bytes > budget {
			t.Fatalf("after %d puts: %+v, %v: over the budget", i+1, st, err)
		}
	}
	st, _ := b.Stats(ctx)
	if st.Evictions == 0 || st.Versions >= 2000 {
		t.Fatalf("no evictions: %+v", st)
	}
	t.Logf("budget %d: %d versions held, %d bytes, %d evicted", budget, st.Versions, st.Bytes, st.Evictions)
	if got := describe(lookup(t, b, "key-0", 0, 1000, 100)); got != "miss:capacity" {
		t.Errorf("evicted key: %s", got)
	}
	if got := describe(lookup(t, b, "key-1999", 0, 10000, 10000)); got != "hit:"+string(val)+"[1,10001(open))@2000" {
		t.Errorf("newest key: %.40s", got)
	}
	big := bytes.Repeat([]byte("y"), budget+1)
	if err := b.Put(ctx, []byte("huge"), &store.Version{Lo: 1, Hi: open, Snapshot: 1, Value: big}); err == nil {
		t.Error("a version over the whole budget was accepted")
	}
}

// Differential drives a and b with the same random operations (without
// eviction: both budgets must be large) and fails at the first answer that
// differs. Invalidations are delivered out of LSN order, as after a
// reconnect or a restart (a live message before a replayed older one): the
// watermark covers only what was delivered, and Settle follows it.
func Differential(t *testing.T, a, b store.Backend, seed int64, ops int) {
	r := rand.New(rand.NewSource(seed))
	tables := []string{"public.t", "public.u"}
	cols := []string{"a", "b", "c"}
	tagOf := func() (string, string) {
		tb := tables[r.Intn(len(tables))]
		if r.Intn(3) == 0 {
			return tb, tb
		}
		return fmt.Sprintf("%s(id)=%d", tb, r.Intn(5)), tb
	}
	type message struct {
		lsn     uint64
		changes []invalidation.Change
	}
	var inflight []message // published, not yet delivered
	deliver := func(i int, m message) {
		ea, eb := a.Invalidate(ctx, m.lsn, m.changes), b.Invalidate(ctx, m.lsn, m.changes)
		if ea != nil || eb != nil {
			t.Fatalf("op %d invalidate at %d: %v, %v", i, m.lsn, ea, eb)
		}
	}
	var lsn uint64 = 100
	wm := lsn
	type pv struct {
		key  string
		snap uint64
	}
	var pendings []pv
	for i := 0; i < ops; i++ {
		switch op := r.Intn(100); {
		case op < 30: // put
			key := fmt.Sprintf("k%d", r.Intn(20))
			snap := lsn - uint64(r.Intn(50))
			var deps []store.Dep
			for n := 1 + r.Intn(3); n > 0; n-- {
				tag, tb := tagOf()
				d := store.Dep{Tag: tag, Table: tb}
				if r.Intn(4) == 0 {
					d.AllColumns = true
				} else {
					d.Reads = []string{cols[r.Intn(3)]}
				}
				deps = append(deps, d)
			}
			v := store.Version{Lo: snap - uint64(r.Intn(10)), Hi: open, Snapshot: snap, Deps: deps, Value: []byte(fmt.Sprintf("v%d", i)), Pending: r.Intn(3) == 0}
			if r.Intn(5) == 0 {
				v.Hi = snap + 1 + uint64(r.Intn(20))
			}
			if v.Pending {
				pendings = append(pendings, pv{key, snap})
			}
			ea, eb := a.Put(ctx, []byte(key), &v), b.Put(ctx, []byte(key), &v)
			if (ea == nil) != (eb == nil) {
				t.Fatalf("op %d put: %v vs %v", i, ea, eb)
			}
		case op < 45: // a commit: delivered now, or later and out of order
			lsn += 1 + uint64(r.Intn(5))
			var cs []invalidation.Change
			for n := 1 + r.Intn(3); n > 0; n-- {
				tag, tb := tagOf()
				c := invalidation.Change{Tag: tag}
				switch r.Intn(5) {
				case 0:
					c.Rows = true
				case 1:
					c.AllColumns = true
				case 2:
					c.Tag, c.Flush = tb, true
				default:
					c.Columns = []string{cols[r.Intn(3)]}
				}
				cs = append(cs, c)
			}
			if r.Intn(2) == 0 {
				deliver(i, message{lsn, cs})
			} else {
				inflight = append(inflight, message{lsn, cs})
			}
		case op < 57 && len(inflight) > 0: // a late message, in any order
			j := r.Intn(len(inflight))
			m := inflight[j]
			inflight = append(inflight[:j], inflight[j+1:]...)
			deliver(i, m)
		case op < 62: // heartbeat: everything delivered up to there
			wm = lsn
			for _, m := range inflight {
				wm = min(wm, m.lsn-1)
			}
			ea, eb := a.Settle(ctx, wm), b.Settle(ctx, wm)
			if ea != nil || eb != nil {
				t.Fatalf("op %d settle: %v, %v", i, ea, eb)
			}
		case op < 67 && len(pendings) > 0: // confirm
			p := pendings[0]
			pendings = pendings[1:]
			lo, hi := p.snap-uint64(r.Intn(5)), uint64(open)
			if r.Intn(2) == 0 {
				hi = p.snap + 1
			}
			ea, eb := a.Confirm(ctx, []byte(p.key), p.snap, lo, hi), b.Confirm(ctx, []byte(p.key), p.snap, lo, hi)
			if ea != nil || eb != nil {
				t.Fatalf("op %d confirm: %v, %v", i, ea, eb)
			}
		case op < 68: // gap
			ea, eb := a.EndOpen(ctx, wm+1), b.EndOpen(ctx, wm+1)
			if ea != nil || eb != nil {
				t.Fatalf("op %d end open: %v, %v", i, ea, eb)
			}
		default: // lookup
			key := fmt.Sprintf("k%d", r.Intn(22))
			tmin := lsn - uint64(r.Intn(80))
			tmax := tmin + uint64(r.Intn(40))
			ra, ea := a.Lookup(ctx, []byte(key), tmin, tmax, wm)
			rb, eb := b.Lookup(ctx, []byte(key), tmin, tmax, wm)
			if ea != nil || eb != nil {
				t.Fatalf("op %d lookup: %v, %v", i, ea, eb)
			}
			if describe(ra) != describe(rb) {
				t.Fatalf("op %d lookup %s [%d,%d] wm %d: %s vs %s", i, key, tmin, tmax, wm, describe(ra), describe(rb))
			}
		}
	}
	names := []string{store.TableName("public.t"), store.TableName("public.u"), "public.t", "public.u"}
	for i := 0; i < 5; i++ {
		names = append(names, fmt.Sprintf("public.t(id)=%d", i), fmt.Sprintf("public.u(id)=%d", i))
	}
	ha, ea := a.Holds(ctx, names)
	hb, eb := b.Holds(ctx, names)
	if ea != nil || eb != nil || !reflect.DeepEqual(ha, hb) {
		t.Fatalf("holds: %v vs %v (%v, %v)", ha, hb, ea, eb)
	}
}
