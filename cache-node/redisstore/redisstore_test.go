package redisstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/cache-node/store/storetest"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/servers"
	"github.com/larderdb/larder/internal/testenv"
)

// env.Redis is shared by the tests that need no server configuration;
// each of them uses a prefix of its own. Tests that set maxmemory start a
// server of their own. The servers are configured as an operator
// configures a cache-node's Redis (servers.DefaultRedisConfig): the store
// runs as the cache-node's ACL user, without CONFIG rights, unless a test
// has it configure the server (Options.ConfigureServer).
var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Redis: true}, &env))
}

var ctx = context.Background()

var prefixSeq atomic.Int64

func newClient(tb testing.TB, r *servers.Redis) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(r.URL())
	if err != nil {
		tb.Fatal(err)
	}
	c := redis.NewClient(opt)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// nodeClient connects as the cache-node's user (servers.RedisCacheNodeACL:
// no CONFIG, only keys under "larder:").
func nodeClient(tb testing.TB, r *servers.Redis) *redis.Client {
	tb.Helper()
	u, err := r.URLFor(servers.RedisCacheNodeUser)
	if err != nil {
		tb.Fatal(err)
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		tb.Fatal(err)
	}
	c := redis.NewClient(opt)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// startRedis starts a server of the test's own, configured as
// servers.DefaultRedisConfig and then by mod.
func startRedis(tb testing.TB, mod func(*servers.RedisConfig)) *servers.Redis {
	tb.Helper()
	dir, err := testenv.TempDir()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := servers.DefaultRedisConfig(dir)
	if mod != nil {
		mod(&cfg)
	}
	r, err := servers.StartRedis(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return r
}

func open(tb testing.TB, opts Options) *Store {
	tb.Helper()
	s, err := New(ctx, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// sharedStore is an empty store without a budget on the shared server,
// as the cache-node's user.
func sharedStore(tb testing.TB) *Store {
	tb.Helper()
	return open(tb, Options{Client: nodeClient(tb, env.Redis), Prefix: fmt.Sprintf("larder:test%d", prefixSeq.Add(1))})
}

// TestConformance runs the shared suite. A budgeted store gets a server of
// its own, since maxmemory is the whole server's, and sets it: the suite
// holds the store to the exact budget it asked for.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, budget int64) store.Backend {
		if budget >= 1<<30 {
			return sharedStore(t)
		}
		return open(t, Options{Client: newClient(t, testenv.Redis(t)), MaxMemory: budget, ConfigureServer: true})
	})
}

// TestDifferential drives the Redis store and the memory backend, then the
// Redis store and the reference model, with the same random operations.
func TestDifferential(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprintf("memory/%d", seed), func(t *testing.T) {
			storetest.Differential(t, sharedStore(t), store.NewMemory(1<<30, nil), seed, 2000)
		})
		t.Run(fmt.Sprintf("reference/%d", seed), func(t *testing.T) {
			storetest.Differential(t, sharedStore(t), &storetest.Reference{}, seed, 2000)
		})
	}
}

// TestLegacyDifferential: the order-dependent scripts of
// store.OrderDependentForTest follow the old specification.
func TestLegacyDifferential(t *testing.T) {
	store.OrderDependentForTest.Store(true)
	s := sharedStore(t)
	store.OrderDependentForTest.Store(false)
	storetest.Differential(t, s, &storetest.Reference{Legacy: true}, 1, 2000)
}

// TestServerRestartUnderTheStore: a Redis that restarts under the store (here keeping
// its data in an append-only file) may have lost writes, invalidations
// among them. The store notices (the server lost its scripts), refuses
// every operation with store.ErrLost until EndOpen, which ends every
// version at the watermark the server kept + 1 at the latest.
func TestServerRestartUnderTheStore(t *testing.T) {
	cfg := servers.DefaultRedisConfig(t.TempDir())
	cfg.Persist = true
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Port = port
	r, err := servers.StartRedis(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	s := open(t, Options{Client: nodeClient(t, r)})
	d := store.Dep{Tag: "public.a(id)=1", Table: "public.a", Reads: []string{"x"}}
	mustPut(t, s, "k", store.Version{Lo: 10, Hi: store.Open, Snapshot: 10, Deps: []store.Dep{d}, Value: []byte("v")})
	mustPut(t, s, "c", store.Version{Lo: 10, Hi: 90, Snapshot: 10, Deps: []store.Dep{d}, Value: []byte("c")})
	if err := s.Settle(ctx, 40); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if r, err = servers.StartRedis(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, []byte("k"), 0, 100, 100); !errors.Is(err, store.ErrLost) {
		t.Fatalf("lookup on the restarted server: %v, want ErrLost", err)
	}
	for name, err := range map[string]error{
		"put":        s.Put(ctx, []byte("n"), &store.Version{Lo: 1, Hi: store.Open, Snapshot: 1}),
		"invalidate": s.Invalidate(ctx, 50, []invalidation.Change{{Tag: d.Tag, Rows: true}}),
		"settle":     s.Settle(ctx, 60),
		"save":       s.SaveWatermark(ctx, 60),
	} {
		if !errors.Is(err, store.ErrLost) {
			t.Errorf("%s on a lost store: %v", name, err)
		}
	}
	if err := s.EndOpen(ctx, 70); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]uint64{"k": 41, "c": 41} {
		r := mustLookup(t, s, k, 0, 100, 100)
		if r.Miss != store.Hit || r.Hi != want {
			t.Errorf("%s after EndOpen on the restarted server: %+v, want it ended at %d", k, r, want)
		}
	}
	if err := s.Settle(ctx, 80); err != nil {
		t.Errorf("settle once recovered: %v", err)
	}
}

// TestBinaryNames: keys, tags, tables and columns are bytes, not text.
func TestBinaryNames(t *testing.T) {
	s := sharedStore(t)
	var key []byte
	for i := 255; i >= 0; i-- {
		key = append(key, byte(i))
	}
	tag := "public.t(k)=\x00:\xff*?[]"
	d := store.Dep{Tag: tag, Table: "public.t", Reads: []string{"c\x00l"}}
	mustPut(t, s, string(key), store.Version{Lo: 5, Hi: store.Open, Snapshot: 5, Deps: []store.Dep{d}, Value: key})
	mustPut(t, s, string(key[:3]), store.Version{Lo: 5, Hi: store.Open, Snapshot: 5, Deps: []store.Dep{d}, Value: []byte{0}})
	r := mustLookup(t, s, string(key), 0, 100, 100)
	if r.Miss != store.Hit || string(r.Value) != string(key) || r.Hi != 101 || !r.Open {
		t.Fatalf("binary key: %+v", r)
	}
	if err := s.Invalidate(ctx, 7, []invalidation.Change{{Tag: tag, Columns: []string{"c\x00l"}}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{string(key), string(key[:3])} {
		if r := mustLookup(t, s, k, 0, 100, 100); r.Miss != store.Hit || r.Hi != 7 || r.Open {
			t.Errorf("after the invalidation: %+v", r)
		}
	}
	if r := mustLookup(t, s, string(key[:2]), 0, 100, 100); r.Miss != store.MissCompulsory {
		t.Errorf("a prefix of a key: %+v", r)
	}
}

func mustPut(tb testing.TB, s store.Backend, key string, v store.Version) {
	tb.Helper()
	if err := s.Put(ctx, []byte(key), &v); err != nil {
		tb.Fatalf("put %q@%d: %v", key, v.Snapshot, err)
	}
}

func mustLookup(tb testing.TB, s store.Backend, key string, tmin, tmax, wm uint64) store.Result {
	tb.Helper()
	r, err := s.Lookup(ctx, []byte(key), tmin, tmax, wm)
	if err != nil {
		tb.Fatalf("lookup %q: %v", key, err)
	}
	return r
}

func mustStats(tb testing.TB, s store.Backend) store.Stats {
	tb.Helper()
	st, err := s.Stats(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return st
}

func TestNotifyFlags(t *testing.T) {
	cases := []struct {
		flags            string
		evicted, expired bool
		with             string
	}{
		{"", false, false, "Eex"},
		{"Kx", false, false, "KxEe"},
		{"Ex", false, true, "Exe"},
		{"AE", true, true, "AE"},
		{"KEA", true, true, "KEA"},
		{"xeE", true, true, "xeE"},
		{"Ae", false, false, "AeE"},
	}
	for _, c := range cases {
		ev, ex := eventsOn(c.flags)
		if ev != c.evicted || ex != c.expired {
			t.Errorf("eventsOn(%q) = %v, %v", c.flags, ev, ex)
		}
		if got := withEvictionEvents(c.flags); got != c.with {
			t.Errorf("withEvictionEvents(%q) = %q, want %q", c.flags, got, c.with)
		}
		if ev, ex := eventsOn(withEvictionEvents(c.flags)); !ev || !ex {
			t.Errorf("%q: not both after adding them", c.flags)
		}
	}
}

// TestOptions: what New refuses.
func TestOptions(t *testing.T) {
	c := newClient(t, env.Redis)
	for _, o := range []Options{
		{},
		{Client: redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{env.Redis.Addr()}})},
		{Client: c, MaxMemory: -1},
		{Client: c, ConfigureServer: true},
		{Client: c, TTL: time.Microsecond},
	} {
		if s, err := New(ctx, o); err == nil {
			s.Close()
			t.Errorf("New(%+v) accepted", o)
		}
	}
}
