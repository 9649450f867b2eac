package redisstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/servers"
)

// decodeEntry reads a directory entry (the inverse of encodeEntry).
func decodeEntry(t testing.TB, e string) store.Version {
	t.Helper()
	b := []byte(e)
	if len(b) < 21 {
		t.Fatalf("entry of %d bytes", len(b))
	}
	v := store.Version{Lo: binary.BigEndian.Uint64(b), Hi: binary.BigEndian.Uint64(b[8:]), Pending: b[16]&flagPending != 0}
	b = b[21:]
	str := func() string {
		n := int(binary.BigEndian.Uint16(b))
		s := string(b[2 : 2+n])
		b = b[2+n:]
		return s
	}
	for len(b) > 0 {
		d := store.Dep{AllColumns: b[0] == 1}
		b = b[1:]
		d.Tag, d.Table = str(), str()
		n := int(binary.BigEndian.Uint16(b))
		b = b[2:]
		for range n {
			d.Reads = append(d.Reads, str())
		}
		v.Deps = append(v.Deps, d)
	}
	return v
}

func settled(e string) bool { return len(e) > 16 && e[16]&flagSettled != 0 }

// audit is what a scan of the store's keys finds.
type audit struct {
	dirs, entries   int
	deadEntries     int // entries whose value is gone
	unindexed       int // unsettled entries missing from one of their index sets
	members         int
	deadMembers     int // index members that are not a held unsettled version
	indexSets       int
	volatileIndexes int // index sets with a TTL
	stats           store.Stats
}

func scanKeys(t testing.TB, c *redis.Client, match string) []string {
	t.Helper()
	var out []string
	it := c.Scan(ctx, 0, match, 1000).Iterator()
	for it.Next(ctx) {
		out = append(out, it.Val())
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// audit scans the store's keys through admin, a client with every right
// (the store's may lack CONFIG). Eviction is off meanwhile (the scan's
// replies could push the server over maxmemory), and the notifications
// sent before are applied first.
func (s *Store) audit(t testing.TB, admin *redis.Client) audit {
	t.Helper()
	var a audit
	c := admin
	// The statistics first, while Redis still evicts down to maxmemory:
	// what the audit's own commands allocate once eviction is off below
	// must not count against the budget.
	a.stats = mustStats(t, s)
	mm, err := c.ConfigGet(ctx, "maxmemory").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.ConfigSet(ctx, "maxmemory", mm["maxmemory"]).Err(); err != nil {
			t.Fatal(err)
		}
	}()
	exists := func(k string) bool { return c.Exists(ctx, k).Val() == 1 }
	for _, d := range scanKeys(t, c, s.p+"d:*") {
		a.dirs++
		k := strings.TrimPrefix(d, s.p+"d:")
		for snap, e := range c.HGetAll(ctx, d).Val() {
			a.entries++
			m := snap + k
			if !exists(s.p + "v:" + m) {
				a.deadEntries++
			}
			v := decodeEntry(t, e)
			if settled(e) {
				continue
			}
			sets := []string{s.p + "nodeps"}
			if len(v.Deps) > 0 {
				sets = nil
				for _, dep := range v.Deps {
					sets = append(sets, s.tagSet(dep.Tag), s.tableSet(dep.Table))
				}
			}
			for _, set := range sets {
				if !c.SIsMember(ctx, set, m).Val() {
					a.unindexed++
				}
			}
		}
	}
	sets := append(scanKeys(t, c, s.p+"t:*"), scanKeys(t, c, s.p+"T:*")...)
	sets = append(sets, scanKeys(t, c, s.p+"nodeps")...)
	for _, set := range sets {
		a.indexSets++
		if c.PTTL(ctx, set).Val() >= 0 {
			a.volatileIndexes++
		}
		for _, m := range c.SMembers(ctx, set).Val() {
			a.members++
			snap, k := m[:8], m[8:]
			e, err := c.HGet(ctx, s.p+"d:"+k, snap).Result()
			if err != nil || settled(e) || !exists(s.p+"v:"+m) {
				a.deadMembers++
			}
		}
	}
	return a
}

// infoSlack bounds what INFO allocates before it reads used_memory.
const infoSlack = 1 << 10

// filler puts versions with tags until far over the budget and records
// what it put. c is a client with every right.
type filler struct {
	t       *testing.T
	s       *Store
	c       *redis.Client
	maxmem  int64
	put     []putRecord
	byTag   map[string][]int
	maxUsed int64
}

type putRecord struct {
	key  string
	snap uint64
	v    store.Version
}

func newFiller(t *testing.T, s *Store, admin *redis.Client) *filler {
	mm, err := admin.ConfigGet(ctx, "maxmemory").Result()
	if err != nil {
		t.Fatal(err)
	}
	maxmem, _ := strconv.ParseInt(mm["maxmemory"], 10, 64)
	if maxmem == 0 {
		t.Fatal("no maxmemory")
	}
	return &filler{t: t, s: s, c: admin, maxmem: maxmem, byTag: map[string][]int{}}
}

func (f *filler) usedMemory() int64 {
	txt, err := f.c.Info(ctx, "memory").Result()
	if err != nil {
		f.t.Fatal(err)
	}
	return parseInfo(txt)["used_memory"]
}

// fill puts n versions of 4 KiB over n/2 keys, each with a key tag of 40
// and the table; a third also read a second table whole; every fifth is
// closed, every seventh pending. It checks used_memory against maxmemory
// every 100 puts.
func (f *filler) fill(n int) {
	val := bytes.Repeat([]byte("v"), 4<<10)
	for i := range n {
		tag := fmt.Sprintf("public.items(id)=%d", i%40)
		deps := []store.Dep{{Tag: tag, Table: "public.items", Reads: []string{"name", "qty"}}}
		if i%3 == 0 {
			deps = append(deps, store.Dep{Tag: "public.users", Table: "public.users", AllColumns: true})
		}
		snap := uint64(1000 + i)
		v := store.Version{Lo: snap - 5, Hi: store.Open, Snapshot: snap, Deps: deps, Value: val, Pending: i%7 == 0}
		if i%5 == 0 {
			v.Hi = snap + 3
		}
		key := fmt.Sprintf("key-%d", i%(n/2))
		mustPut(f.t, f.s, key, v)
		f.put = append(f.put, putRecord{key, snap, v})
		f.byTag[tag] = append(f.byTag[tag], i)
		if i%100 == 99 {
			// INFO is a command: Redis evicts down to maxmemory before it
			// runs; what INFO then allocates for its own reply (the
			// sections it was asked for, the text) is above.
			used := f.usedMemory()
			f.maxUsed = max(f.maxUsed, used)
			if used > f.maxmem+infoSlack {
				f.t.Fatalf("after %d puts: used_memory %d over maxmemory %d", i+1, used, f.maxmem)
			}
		}
	}
}

func (f *filler) alive(i int) bool {
	p := f.put[i]
	return f.c.Exists(ctx, f.s.p+"v:"+string(u64(p.snap))+p.key).Val() == 1
}

// invalidatePartlyEvicted invalidates a key tag some of whose versions
// were evicted, and checks that every surviving open version ended.
func (f *filler) invalidatePartlyEvicted(lsn uint64) {
	t := f.t
	var tag string
	var alive, dead []int
	for i := range 40 {
		tag = fmt.Sprintf("public.items(id)=%d", i)
		alive, dead = nil, nil
		for _, j := range f.byTag[tag] {
			if f.alive(j) {
				alive = append(alive, j)
			} else {
				dead = append(dead, j)
			}
		}
		if len(alive) > 0 && len(dead) > 0 {
			break
		}
	}
	if len(alive) == 0 || len(dead) == 0 {
		t.Fatalf("no tag with both evicted and surviving versions")
	}
	if err := f.s.Invalidate(ctx, lsn, []invalidation.Change{{Tag: tag, Columns: []string{"qty"}}}); err != nil {
		t.Fatal(err)
	}
	for _, j := range alive {
		p := f.put[j]
		e, err := f.c.HGet(ctx, f.s.p+"d:"+p.key, string(u64(p.snap))).Result()
		if errors.Is(err, redis.Nil) {
			continue // evicted since (the invalidation's own writes take memory): it can no longer be served
		}
		if err != nil {
			t.Fatalf("surviving version %s@%d: %v", p.key, p.snap, err)
		}
		got := decodeEntry(t, e)
		want := p.v.Hi
		if want == store.Open {
			want = lsn
		}
		if got.Hi != want {
			t.Errorf("%s@%d: Hi %d, want %d", p.key, p.snap, got.Hi, want)
		}
		if !p.v.Pending {
			r := mustLookup(t, f.s, p.key, p.snap, p.snap, lsn+100)
			if r.Miss != store.Hit || r.Snapshot != p.snap || r.Hi != want || r.Open {
				t.Errorf("lookup of %s@%d after the invalidation: %+v", p.key, p.snap, r)
			}
		}
	}
	// Ended, they stay reachable (an older invalidation delivered late
	// would still shorten them) until the watermark passes their end.
	held, err := f.s.Holds(ctx, []string{tag})
	if err != nil || !held[0] {
		t.Errorf("holds %s after its invalidation, before the watermark passed it: %v %v", tag, held, err)
	}
	if err := f.s.Settle(ctx, lsn); err != nil {
		t.Fatal(err)
	}
	held, err = f.s.Holds(ctx, []string{tag})
	if err != nil || held[0] {
		t.Errorf("holds %s once settled: %v %v", tag, held, err)
	}
	if n := f.c.Exists(ctx, f.s.tagSet(tag)).Val(); n != 0 {
		t.Errorf("the index set of %s is still there", tag)
	}
	t.Logf("invalidated %s: %d surviving versions ended, %d evicted", tag, len(alive), len(dead))
}

// TestEviction fills a store far beyond its budget: Redis keeps within
// maxmemory by evicting values only, the notifications keep the
// bookkeeping exact, and invalidations still end every surviving version.
// The server is configured as an operator does (maxmemory, volatile-lru,
// notify-keyspace-events Exe) and the store runs as the cache-node's user.
func TestEviction(t *testing.T) {
	const maxmemory = 5 << 20
	r := startRedis(t, func(c *servers.RedisConfig) { c.MaxMemory = maxmemory })
	admin := newClient(t, r)
	s := open(t, Options{Client: nodeClient(t, r)})
	if srv := s.Server(); !srv.Notifications || srv.MaxMemory != maxmemory || srv.Policy != "volatile-lru" || srv.Configured || len(srv.Warnings) != 0 {
		t.Fatalf("server settings %+v", srv)
	}
	budget := maxmemory - s.baseline + evictionMargin(maxmemory-s.baseline)
	f := newFiller(t, s, admin)
	f.fill(6000)

	// Evictions reach the bookkeeping as keyspace notifications, after
	// the fact: the last few may still be on their way when the filling
	// ends. Exact bookkeeping converges; wrong bookkeeping does not.
	a := s.audit(t, admin)
	for deadline := time.Now().Add(10 * time.Second); (a.stats.Versions != int64(a.entries) || a.stats.Keys != int64(a.dirs)) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		a = s.audit(t, admin)
	}
	st := a.stats
	t.Logf("after %d puts of 4 KiB: %+v; used_memory at most %d of maxmemory %d", len(f.put), st, f.maxUsed, f.maxmem)
	if st.Evictions == 0 || st.Bytes > st.Budget || st.Budget != budget || st.Versions >= int64(len(f.put)) {
		t.Fatalf("stats %+v, want the budget %d", st, budget)
	}
	t.Logf("audit %+v", a)
	if a.volatileIndexes != 0 || a.unindexed != 0 {
		t.Errorf("index sets evicted or incomplete: %+v", a)
	}
	if a.deadEntries != 0 || a.deadMembers != 0 {
		t.Errorf("entries or index members of evicted versions left: %+v", a)
	}
	if st.Versions != int64(a.entries) || st.Keys != int64(a.dirs) {
		t.Errorf("counts %d versions of %d keys; the store holds %d of %d", st.Versions, st.Keys, a.entries, a.dirs)
	}

	f.invalidatePartlyEvicted(100_000)
	// A flush of the table ends everything open that survived.
	if err := s.Invalidate(ctx, 100_001, []invalidation.Change{{Tag: "public.items", Flush: true}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, 100_001); err != nil {
		t.Fatal(err)
	}
	held, err := s.Holds(ctx, []string{store.TableName("public.items"), store.TableName("public.users"), "public.users"})
	if err != nil || held[0] || held[1] || held[2] {
		t.Errorf("holds after the flush: %v %v", held, err)
	}
	mustStats(t, s)
	if a := s.audit(t, admin); a.deadEntries != 0 || a.deadMembers != 0 || a.members != 0 || a.unindexed != 0 {
		t.Errorf("after the flush: %+v", a)
	}
}

// TestLazyCleanup: without notifications (a server whose operator left
// notify-keyspace-events off), entries and index members of evicted
// versions dangle until a script meets them, and every script that meets
// one cleans it.
func TestLazyCleanup(t *testing.T) {
	r := startRedis(t, func(c *servers.RedisConfig) { c.MaxMemory, c.NotifyKeyspaceEvents = 8<<20, "" })
	admin := newClient(t, r)
	s := open(t, Options{Client: nodeClient(t, r)})
	if srv := s.Server(); srv.Notifications || len(srv.Warnings) != 1 || !strings.Contains(srv.Warnings[0], "notify-keyspace-events Exe") {
		t.Fatalf("notifications reported on a server without them: %+v", srv)
	}
	if st := mustStats(t, s); st.Budget <= 0 || st.Budget >= 8<<20 {
		t.Fatalf("budget from the server's maxmemory: %+v", st)
	}
	c := admin
	f := newFiller(t, s, admin)
	f.fill(6000)
	a := s.audit(t, admin)
	t.Logf("after %d puts: %+v (Put's sampling bounds the dead members)", len(f.put), a)
	if a.deadEntries == 0 {
		t.Fatal("no dangling entries: the test does not exercise the lazy cleanup")
	}
	if a.unindexed != 0 || a.volatileIndexes != 0 {
		t.Errorf("index sets evicted or incomplete: %+v", a)
	}

	f.invalidatePartlyEvicted(100_000)

	// A tag whose versions are all gone: delete their values as an
	// eviction nobody reported would.
	const ghostTag = "public.items(id)=ghost"
	d := store.Dep{Tag: ghostTag, Table: "public.items", Reads: []string{"qty"}}
	for i := range 20 {
		mustPut(t, s, fmt.Sprintf("ghost-%d", i), store.Version{Lo: 1, Hi: store.Open, Snapshot: 2, Deps: []store.Dep{d}, Value: []byte("g")})
		c.Del(ctx, s.p+"v:"+string(u64(2))+fmt.Sprintf("ghost-%d", i))
	}
	held, err := s.Holds(ctx, []string{ghostTag})
	if err != nil || held[0] {
		t.Fatalf("holds of a tag whose versions are all gone: %v %v", held, err)
	}
	if c.Exists(ctx, s.tagSet(ghostTag)).Val() != 0 {
		t.Error("its index set is still there")
	}
	for i := range 20 {
		if r := mustLookup(t, s, fmt.Sprintf("ghost-%d", i), 0, 100, 100); r.Miss != store.MissCapacity {
			t.Errorf("ghost-%d: %v, want a capacity miss", i, r.Miss)
		}
	}

	// A lookup's miss path meets every version of its key.
	for i := range len(f.put) / 2 {
		mustLookup(t, s, fmt.Sprintf("key-%d", i), 0, 0, 1)
	}
	if err := s.Invalidate(ctx, 100_001, []invalidation.Change{{Tag: "public.items", Flush: true}, {Tag: "public.users", Flush: true}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, 100_001); err != nil {
		t.Fatal(err)
	}
	a = s.audit(t, admin)
	st := a.stats
	t.Logf("after lookups of every key and a flush: %+v", a)
	if a.deadEntries != 0 || a.members != 0 || a.indexSets != 0 {
		t.Errorf("left: %+v", a)
	}
	if st.Versions != int64(a.entries) || st.Keys != int64(a.dirs) {
		t.Errorf("counts %d versions of %d keys; the store holds %d of %d", st.Versions, st.Keys, a.entries, a.dirs)
	}
}
