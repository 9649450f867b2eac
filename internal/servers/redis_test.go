package servers

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func redisClient(t *testing.T, rawURL string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRedisAuthentication: DefaultRedisConfig's server refuses clients
// without credentials; the default user (URL) may do anything, the
// cache-node's user (URLFor) only what RedisCacheNodeACL allows, on its
// keys; the configuration file is private and holds no password.
func TestRedisAuthentication(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := DefaultRedisConfig(t.TempDir())
	cfg.MaxMemory = 64 << 20
	r, err := StartRedis(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()

	conf := filepath.Join(cfg.Dir, "redis.conf")
	st, err := os.Stat(conf)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("redis.conf mode %v", st.Mode().Perm())
	}
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{cfg.Password, cfg.Users[0].Password} {
		if strings.Contains(string(b), p) {
			t.Errorf("redis.conf holds a password:\n%s", b)
		}
	}

	stranger := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer stranger.Close()
	if err := stranger.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("PING without credentials: %v, want NOAUTH", err)
	}
	wrong := redis.NewClient(&redis.Options{Addr: r.Addr(), Username: RedisCacheNodeUser, Password: "wrong", MaxRetries: -1})
	defer wrong.Close()
	if err := wrong.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Errorf("PING with a wrong password: %v, want WRONGPASS", err)
	}

	admin := redisClient(t, r.URL())
	got, err := admin.ConfigGet(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"maxmemory": "67108864", "maxmemory-policy": "volatile-lru", "notify-keyspace-events": "xeE", "protected-mode": "yes", "save": ""} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}

	if _, err := r.URLFor("nobody"); err == nil {
		t.Error("URLFor an unknown user")
	}
	u, err := r.URLFor(RedisCacheNodeUser)
	if err != nil {
		t.Fatal(err)
	}
	node := redisClient(t, u)
	if err := node.Set(ctx, "larder:x", "1", 0).Err(); err != nil {
		t.Errorf("SET on the node's keys: %v", err)
	}
	if _, err := node.Info(ctx, "memory").Result(); err != nil {
		t.Errorf("INFO: %v", err)
	}
	for name, err := range map[string]error{
		"CONFIG SET":     node.ConfigSet(ctx, "maxmemory", "0").Err(),
		"CONFIG GET":     node.ConfigGet(ctx, "maxmemory").Err(),
		"FLUSHALL":       node.FlushAll(ctx).Err(),
		"KEYS":           node.Keys(ctx, "*").Err(),
		"EVAL":           node.Eval(ctx, "return 1", nil).Err(),
		"SET other keys": node.Set(ctx, "other:x", "1", 0).Err(),
		"SUBSCRIBE":      subscribeErr(ctx, node, "news"),
	} {
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%s as the cache-node: %v, want NOPERM", name, err)
		}
	}
	if err := subscribeErr(ctx, node, "__keyevent@0__:evicted"); err != nil {
		t.Errorf("SUBSCRIBE to the eviction notifications: %v", err)
	}
}

func subscribeErr(ctx context.Context, c *redis.Client, channel string) error {
	ps := c.Subscribe(ctx, channel)
	defer ps.Close()
	_, err := ps.Receive(ctx)
	return err
}

func TestRedisConfigValidate(t *testing.T) {
	ok := DefaultRedisConfig("d")
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*RedisConfig){
		"users without a default password": func(c *RedisConfig) { c.Password = "" },
		"user without a password":          func(c *RedisConfig) { c.Users[0].Password = "" },
		"user named default":               func(c *RedisConfig) { c.Users[0].Name = "default" },
		"rules over two lines":             func(c *RedisConfig) { c.Users[0].Rules += "\nuser x on nopass +@all" },
		"setting with a space":             func(c *RedisConfig) { c.MaxMemoryPolicy = "volatile-lru x" },
	} {
		c := DefaultRedisConfig("d")
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
