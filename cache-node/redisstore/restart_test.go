package redisstore

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/servers"
	"github.com/larderdb/larder/internal/testenv"
)

// restartVersions are what a node held when it stopped, with the watermark
// it saved: open versions (with and without dependencies, one pending),
// one ended by an invalidation, one put closed.
const (
	savedWM = 50
	bulk    = 256
)

func putRestartVersions(t *testing.T, s *Store) {
	a := store.Dep{Tag: "public.a(id)=1", Table: "public.a", Reads: []string{"x"}}
	b := store.Dep{Tag: "public.b", Table: "public.b", AllColumns: true}
	mustPut(t, s, "open", store.Version{Lo: 10, Hi: store.Open, Snapshot: 10, Deps: []store.Dep{a}, Value: []byte("o")})
	mustPut(t, s, "open2", store.Version{Lo: 20, Hi: store.Open, Snapshot: 25, Deps: []store.Dep{a, b}, Value: []byte("o2")})
	mustPut(t, s, "nodeps", store.Version{Lo: 5, Hi: store.Open, Snapshot: 5, Value: []byte("n")})
	mustPut(t, s, "pending", store.Version{Lo: 40, Hi: store.Open, Snapshot: 40, Deps: []store.Dep{b}, Value: []byte("p"), Pending: true})
	mustPut(t, s, "ended", store.Version{Lo: 12, Hi: store.Open, Snapshot: 12, Deps: []store.Dep{b}, Value: []byte("e")})
	mustPut(t, s, "closed", store.Version{Lo: 10, Hi: 30, Snapshot: 15, Deps: []store.Dep{a}, Value: []byte("c")})
	if err := s.Invalidate(ctx, 33, []invalidation.Change{{Tag: "public.b", Rows: true}}); err != nil {
		t.Fatal(err)
	}
	// 2 MB more, so that a restart on a warm Redis would show in the
	// baseline if the store's own data were counted in it (8000 bytes: a
	// value that fills its allocation).
	for i := range bulk {
		mustPut(t, s, fmt.Sprintf("bulk-%d", i), store.Version{Lo: 8, Hi: store.Open, Snapshot: 8, Deps: []store.Dep{a}, Value: bytes.Repeat([]byte("b"), 8000)})
	}
	if err := s.SaveWatermark(ctx, savedWM); err != nil {
		t.Fatal(err)
	}
}

// checkAfterRestart does what a node does on start-up (end every open
// version at the saved watermark + 1) and checks that nothing is served as
// valid beyond the watermark.
func checkAfterRestart(t *testing.T, s *Store) {
	wm, ok, err := s.SavedWatermark(ctx)
	if err != nil || !ok || wm != savedWM {
		t.Fatalf("saved watermark: %d %v %v", wm, ok, err)
	}
	if err := s.EndOpen(ctx, wm+1); err != nil {
		t.Fatal(err)
	}
	if err := s.Confirm(ctx, []byte("pending"), 40, 40, store.Open); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"open":    "o[10,51)",
		"open2":   "o2[20,33)",
		"nodeps":  "n[5,51)",
		"pending": "p[40,51)",
		"ended":   "e[12,33)",
		"closed":  "c[10,30)",
	}
	for k, w := range want {
		// The node's watermark is far ahead now: nothing may be open.
		r := mustLookup(t, s, k, 0, 1000, 1000)
		if r.Miss != store.Hit || r.Open || r.Hi > wm+1 {
			t.Errorf("%s after the restart: %+v", k, r)
			continue
		}
		if got := fmt.Sprintf("%s[%d,%d)", r.Value, r.Lo, r.Hi); got != w {
			t.Errorf("%s: %s, want %s", k, got, w)
		}
		if r := mustLookup(t, s, k, wm+1, 1000, 1000); r.Miss != store.MissStaleness {
			t.Errorf("%s beyond the watermark: %v, want a staleness miss", k, r.Miss)
		}
	}
	for i := range bulk {
		if r := mustLookup(t, s, fmt.Sprintf("bulk-%d", i), 0, 1000, 1000); r.Miss != store.Hit || len(r.Value) != 8000 || r.Hi != wm+1 {
			t.Fatalf("bulk-%d: %v %d bytes [%d,%d)", i, r.Miss, len(r.Value), r.Lo, r.Hi)
		}
	}
	held, err := s.Holds(ctx, []string{"public.a(id)=1", "public.b", store.TableName("public.a"), store.TableName("public.b")})
	if err != nil || held[0] || held[1] || held[2] || held[3] {
		t.Errorf("holds after EndOpen: %v %v", held, err)
	}
	if st := mustStats(t, s); st.Keys != 6+bulk || st.Versions != 6+bulk {
		t.Errorf("stats after the restart: %+v", st)
	}
}

// TestRestart: a new Store on the same Redis and prefix finds the
// versions and the watermark the previous one left.
func TestRestart(t *testing.T) {
	prefix := fmt.Sprintf("larder:restart%d", prefixSeq.Add(1))
	c1 := nodeClient(t, env.Redis)
	s1 := open(t, Options{Client: c1, Prefix: prefix})
	base1 := s1.baseline
	putRestartVersions(t, s1)
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c1.Close() // the node's process ends: its connections and their buffers go

	s2 := open(t, Options{Client: nodeClient(t, env.Redis), Prefix: prefix})
	// The 2 MB already there is the store's data, not the server's.
	t.Logf("baseline %d before, %d after the restart", base1, s2.baseline)
	if d := s2.baseline - base1; d > 256<<10 || d < -256<<10 {
		t.Errorf("baseline %d after the restart, %d before", s2.baseline, base1)
	}
	checkAfterRestart(t, s2)

	other := open(t, Options{Client: nodeClient(t, env.Redis), Prefix: prefix + "-other"})
	if _, ok, err := other.SavedWatermark(ctx); ok || err != nil {
		t.Errorf("a prefix that saved nothing: %v %v", ok, err)
	}
}

// TestServerRestart: the redis-server itself restarts, with its
// append-only file; New (ConfigureServer) configures it again.
func TestServerRestart(t *testing.T) {
	dir, err := testenv.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := servers.DefaultRedisConfig(filepath.Join(dir, "redis"))
	cfg.Persist = true
	r1, err := servers.StartRedis(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r1.Close() })
	const budget = 64 << 20
	s1 := open(t, Options{Client: newClient(t, r1), MaxMemory: budget, ConfigureServer: true})
	putRestartVersions(t, s1)
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r1.Close(); err != nil { // SIGTERM: Redis writes the append-only file out
		t.Fatal(err)
	}

	_, port, _ := net.SplitHostPort(r1.Addr())
	if cfg.Port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	r2, err := servers.StartRedis(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r2.Close() })
	c2 := newClient(t, r2)
	s2 := open(t, Options{Client: c2, MaxMemory: budget, ConfigureServer: true})
	if srv := s2.Server(); !srv.Notifications || !srv.Configured {
		t.Errorf("eviction notifications not turned on again: %+v", srv)
	}
	if mm := c2.ConfigGet(ctx, "maxmemory-policy").Val()["maxmemory-policy"]; mm != "volatile-lru" {
		t.Errorf("maxmemory-policy %q", mm)
	}
	checkAfterRestart(t, s2)
	if st := mustStats(t, s2); st.Bytes > st.Budget || st.Budget != budget || st.Bytes < 2e6 {
		t.Errorf("stats %+v", st)
	}
}
