package redisstore

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/servers"
)

// TestNodeUserNeedsNoConfig: the store, with a budget, runs as the
// cache-node's ACL user (servers.RedisCacheNodeACL), which may not run
// CONFIG: every operation works, the server records no command or key the
// user was denied (ACL LOG), and the user's CONFIG SET is refused.
func TestNodeUserNeedsNoConfig(t *testing.T) {
	const maxmemory = 32 << 20
	r := startRedis(t, func(c *servers.RedisConfig) { c.MaxMemory = maxmemory })
	admin := newClient(t, r)
	if err := admin.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	node := nodeClient(t, r)
	var logged bytes.Buffer
	s := open(t, Options{Client: node, MaxMemory: maxmemory, Log: slog.New(slog.NewTextHandler(&logged, nil))})
	srv := s.Server()
	if srv.MaxMemory != maxmemory || srv.Policy != "volatile-lru" || !srv.Notifications || srv.Configured || len(srv.Warnings) != 0 || logged.Len() != 0 {
		t.Fatalf("server settings %+v, logged %q", srv, logged.String())
	}

	d := store.Dep{Tag: "public.a(id)=1", Table: "public.a", Reads: []string{"x"}}
	mustPut(t, s, "k", store.Version{Lo: 10, Hi: store.Open, Snapshot: 10, Deps: []store.Dep{d}, Value: []byte("v")})
	mustPut(t, s, "p", store.Version{Lo: 10, Hi: store.Open, Snapshot: 12, Deps: []store.Dep{d}, Value: []byte("p"), Pending: true})
	if err := s.Confirm(ctx, []byte("p"), 12, 10, store.Open); err != nil {
		t.Fatal(err)
	}
	if r := mustLookup(t, s, "k", 10, 20, 20); r.Miss != store.Hit || string(r.Value) != "v" {
		t.Fatalf("lookup: %+v", r)
	}
	if groups, err := s.OpenGroups(ctx); err != nil || len(groups) != 2 {
		t.Fatalf("open groups %v %v", groups, err)
	}
	if err := s.Invalidate(ctx, 30, []invalidation.Change{{Tag: d.Tag, Columns: []string{"x"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, 30); err != nil {
		t.Fatal(err)
	}
	if held, err := s.Holds(ctx, []string{d.Tag}); err != nil || held[0] {
		t.Fatalf("holds: %v %v", held, err)
	}
	if err := s.SaveWatermark(ctx, 30); err != nil {
		t.Fatal(err)
	}
	if err := s.EndOpen(ctx, 31); err != nil {
		t.Fatal(err)
	}
	// A value that expires: its notification reaches the store.
	mustPut(t, s, "e", store.Version{Lo: 40, Hi: store.Open, Snapshot: 40, Value: []byte("e")})
	if err := admin.PExpire(ctx, s.p+"v:"+string(u64(40))+"e", 1).Err(); err != nil {
		t.Fatal(err)
	}
	for admin.Exists(ctx, s.p+"v:"+string(u64(40))+"e").Val() != 0 {
		// Reading a key past its time expires it; the loop ends once it has.
	}
	// The expiry's notification reaches the store asynchronously.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := mustStats(t, s)
		if st.Keys == 2 && st.Versions == 2 && st.Budget > 0 && st.Budget <= maxmemory && st.Bytes <= st.Budget {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", st)
		}
	}

	entries, err := admin.Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Fatalf("the server denied the store %d times: %v", len(entries), entries)
	}
	for name, err := range map[string]error{
		"CONFIG SET": node.ConfigSet(ctx, "maxmemory", "0").Err(),
		"CONFIG GET": node.ConfigGet(ctx, "notify-keyspace-events").Err(),
	} {
		if err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
			t.Errorf("%s as the cache-node's user: %v, want NOPERM", name, err)
		}
	}
	if n := len(admin.Do(ctx, "ACL", "LOG").Val().([]any)); n != 2 {
		t.Errorf("ACL LOG has %d entries after two denied commands", n)
	}
}

// TestServerSettings: what New makes of the operator's settings. A policy
// that may evict the index sets, or a maxmemory that leaves the store no
// room, is an error; a setting that costs efficiency is a warning, logged
// and in Server().Warnings.
func TestServerSettings(t *testing.T) {
	for _, c := range []struct {
		name      string
		mod       func(*servers.RedisConfig)
		maxMemory int64 // Options.MaxMemory
		err, warn string
	}{
		{name: "allkeys-lru", mod: func(c *servers.RedisConfig) { c.MaxMemory, c.MaxMemoryPolicy = 64<<20, "allkeys-lru" },
			err: "maxmemory-policy is allkeys-lru: it may evict the store's index sets"},
		{name: "allkeys-random without maxmemory", mod: func(c *servers.RedisConfig) { c.MaxMemoryPolicy = "allkeys-random" },
			err: "maxmemory-policy is allkeys-random"},
		{name: "maxmemory below the baseline", mod: func(c *servers.RedisConfig) { c.MaxMemory = 256 << 10 },
			err: "maxmemory 262144 leaves no room for the store's data"},
		{name: "no maxmemory", maxMemory: 64 << 20,
			warn: "the server has no maxmemory: Redis never evicts"},
		{name: "no notifications", mod: func(c *servers.RedisConfig) { c.MaxMemory, c.NotifyKeyspaceEvents = 64<<20, "" },
			warn: "set notify-keyspace-events Exe"},
		{name: "keyspace notifications only", mod: func(c *servers.RedisConfig) { c.MaxMemory, c.NotifyKeyspaceEvents = 64<<20, "Kx" },
			warn: "set notify-keyspace-events Exe"},
		{name: "no rights to the notifications", mod: func(c *servers.RedisConfig) {
			c.MaxMemory, c.Users[0].Rules = 64<<20, "resetkeys ~larder:* resetchannels "+servers.RedisCacheNodeCommands
		}, warn: "may not subscribe to the keyevent notifications"},
		{name: "noeviction", mod: func(c *servers.RedisConfig) { c.MaxMemory, c.MaxMemoryPolicy = 64<<20, "noeviction" },
			warn: "maxmemory-policy noeviction: once maxmemory is reached every put fails"},
		{name: "volatile-ttl", mod: func(c *servers.RedisConfig) { c.MaxMemory, c.MaxMemoryPolicy = 64<<20, "volatile-ttl" },
			warn: "maxmemory-policy volatile-ttl evicts values only"},
		{name: "another budget", mod: func(c *servers.RedisConfig) { c.MaxMemory = 64 << 20 }, maxMemory: 8 << 20,
			warn: "not its budget of 8388608"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startRedis(t, c.mod)
			var logged bytes.Buffer
			s, err := New(ctx, Options{Client: nodeClient(t, r), MaxMemory: c.maxMemory, Log: slog.New(slog.NewTextHandler(&logged, nil))})
			if c.err != "" {
				if err == nil {
					s.Close()
					t.Fatalf("accepted; want the error %q", c.err)
				}
				if !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %q, want %q", err, c.err)
				}
				t.Log(err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			w := s.Server().Warnings
			if len(w) != 1 || !strings.Contains(w[0], c.warn) {
				t.Fatalf("warnings %q, want one with %q", w, c.warn)
			}
			if !strings.Contains(logged.String(), "level=WARN") || !strings.Contains(logged.String(), c.warn) {
				t.Errorf("logged %q", logged.String())
			}
			t.Log(w[0])
			// The store works all the same.
			mustPut(t, s, "k", store.Version{Lo: 1, Hi: store.Open, Snapshot: 1, Value: []byte("v")})
			if r := mustLookup(t, s, "k", 1, 1, 1); r.Miss != store.Hit {
				t.Errorf("lookup: %+v", r)
			}
		})
	}
}

// TestWrongPassword: a wrong password is a clear error that does not
// carry the password.
func TestWrongPassword(t *testing.T) {
	const password = "not-the-password-8c1f"
	c := redis.NewClient(&redis.Options{Addr: env.Redis.Addr(), Username: servers.RedisCacheNodeUser, Password: password})
	defer c.Close()
	s, err := New(ctx, Options{Client: c})
	if err == nil {
		s.Close()
		t.Fatal("accepted")
	}
	t.Log(err)
	msg := err.Error()
	if strings.Contains(msg, password) {
		t.Errorf("the error carries the password: %s", msg)
	}
	for _, want := range []string{"connect to Redis at " + env.Redis.Addr(), "as user " + servers.RedisCacheNodeUser, "WRONGPASS"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q without %q", msg, want)
		}
	}
}
