package servers

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCacheNodeUser is the name DefaultRedisConfig gives the cache-node's
// ACL user.
const RedisCacheNodeUser = "larder-node"

// RedisCacheNodeCommands are the commands a cache-node's Redis store
// (cache-node/redisstore) sends, those its scripts call included, and no
// other: no CONFIG, no KEYS, FLUSHALL, DEBUG, MONITOR, ACL, SHUTDOWN or
// replication commands. They are
//
//   - the connection: PING (also on the notification subscription),
//     SELECT (a database other than 0 in the URL), CLIENT SETNAME (a
//     client_name in the URL); HELLO and AUTH need no permission;
//   - reading the server: INFO (maxmemory, maxmemory_policy, used_memory,
//     evicted_keys; INFO is in @dangerous, hence the explicit list);
//   - the store's own reads: GET, HGET, HMGET, SCAN (SCAN lists key names
//     outside the key pattern too: the ACL filters keys read or written,
//     not the names a scan returns);
//   - the scripts: SCRIPT LOAD and EVALSHA (never EVAL: the store loads its
//     scripts), and what they call: HSET HGETALL HINCRBY HDEL SADD
//     SRANDMEMBER SMEMBERS SREM SET PEXPIRE EXISTS STRLEN INCR SETRANGE DEL
//     (the server checks a script's calls against the user's permissions);
//   - the eviction notifications: SUBSCRIBE.
//
// The store's tests run it as a user with these rules only, and check that
// the server denied it nothing (ACL LOG). go-redis also sends CLIENT
// SETINFO on every connection to a Redis 7.2 or later, and ignores a
// refusal, which such a server records in its ACL LOG: add
// +client|setinfo there (Redis 7.0 refuses the rule: it has no such
// command), or set DisableIdentity in the client's options.
const RedisCacheNodeCommands = "-@all +ping +select +client|setname +info +get +hget +hmget +scan " +
	"+script|load +evalsha +hset +hgetall +hincrby +hdel +sadd +srandmember +smembers +srem " +
	"+set +pexpire +exists +strlen +incr +setrange +del +subscribe"

// redisCacheNodeChannels are the keyevent channels the store subscribes
// to, in any database.
const redisCacheNodeChannels = "resetchannels &__keyevent@*__:evicted &__keyevent@*__:expired"

// RedisCacheNodeACL is the ACL rule set of a cache-node whose store uses
// the default key prefix "larder": its keys (~larder:*), the eviction and
// expiry notifications, RedisCacheNodeCommands. As a redis.conf line:
//
//	user larder-node on >PASSWORD <RedisCacheNodeACL>
//
// (or #<sha256 of the password> instead of >PASSWORD, to keep the
// password out of the file). The rules grant no CONFIG: maxmemory,
// maxmemory-policy and notify-keyspace-events are the operator's settings,
// which the store reads (INFO) and checks.
const RedisCacheNodeACL = "resetkeys ~larder:* " + redisCacheNodeChannels + " " + RedisCacheNodeCommands

// RedisCacheNodeRules is RedisCacheNodeACL for a store whose key prefix
// matches the glob prefix (its keys are prefix:...).
func RedisCacheNodeRules(prefix string) string {
	return "resetkeys ~" + prefix + ":* " + redisCacheNodeChannels + " " + RedisCacheNodeCommands
}

// RedisUser is an ACL user of a server started by StartRedis.
type RedisUser struct {
	Name     string
	Password string
	// Rules are ACL rules ("~larder:* -@all +get ..."), as ACL SETUSER
	// takes them; RedisCacheNodeACL is a cache-node's.
	Rules string
}

// RedisConfig configures a Redis server started by StartRedis. StartRedis
// writes it to Dir/redis.conf (mode 0600, passwords as SHA-256 hashes)
// and starts redis-server on that file.
type RedisConfig struct {
	// Dir holds the configuration file, the log and, when Persist is set,
	// the append-only file.
	Dir string
	// Port on 127.0.0.1; 0 picks a free one.
	Port int
	// Bin is the redis-server binary; empty searches $PATH and /usr/bin.
	Bin string
	// Persist keeps data in Dir across restarts (append-only file);
	// tests leave it off, the local stack turns it on.
	Persist bool
	// MaxMemory, when non-zero, sets maxmemory in bytes.
	MaxMemory int64
	// MaxMemoryPolicy sets maxmemory-policy ("" keeps Redis's default,
	// noeviction). A cache-node's store needs volatile-lru.
	MaxMemoryPolicy string
	// NotifyKeyspaceEvents sets notify-keyspace-events ("" sends none). A
	// cache-node's store uses "Exe": keyevent notifications of evicted
	// and expired keys.
	NotifyKeyspaceEvents string
	// Password, when set, is the default user's: a client must
	// authenticate (URL carries it), as this user or one of Users.
	// Required when Users is set (an open default user would bypass
	// them); empty with no Users leaves the server open to local clients.
	Password string
	// Users are ACL users besides the default one.
	Users []RedisUser
	// StartTimeout bounds start-up.
	StartTimeout time.Duration
}

// DefaultRedisConfig returns a non-persistent server in dir on a free
// port, configured as an operator configures a cache-node's Redis:
// clients authenticate (random passwords: URL is the default user's, with
// every right; URLFor(RedisCacheNodeUser) the cache-node's, with
// RedisCacheNodeACL), maxmemory-policy volatile-lru and the keyevent
// notifications of evicted and expired keys. MaxMemory is left 0 (no
// limit): set it for a server that must evict.
func DefaultRedisConfig(dir string) RedisConfig {
	return RedisConfig{
		Dir: dir, StartTimeout: 20 * time.Second,
		MaxMemoryPolicy: "volatile-lru", NotifyKeyspaceEvents: "Exe",
		Password: rand.Text(),
		Users:    []RedisUser{{Name: RedisCacheNodeUser, Password: rand.Text(), Rules: RedisCacheNodeACL}},
	}
}

// Validate reports a config that cannot work.
func (c RedisConfig) Validate() error {
	if c.Dir == "" {
		return errors.New("larder/servers: redis: Dir is required")
	}
	if c.Port < 0 || c.Port > 65535 || c.MaxMemory < 0 {
		return fmt.Errorf("larder/servers: redis: bad port %d or maxmemory %d", c.Port, c.MaxMemory)
	}
	if c.StartTimeout <= 0 {
		return errors.New("larder/servers: redis: StartTimeout must be positive")
	}
	if len(c.Users) > 0 && c.Password == "" {
		return errors.New("larder/servers: redis: Users need a Password for the default user, which would otherwise bypass them")
	}
	for _, s := range []string{c.MaxMemoryPolicy, c.NotifyKeyspaceEvents} {
		if strings.ContainsAny(s, " \t\r\n\"'") {
			return fmt.Errorf("larder/servers: redis: bad setting %q", s)
		}
	}
	seen := map[string]bool{"default": true}
	for _, u := range c.Users {
		switch {
		case u.Name == "" || strings.ContainsAny(u.Name, " \t\r\n\"'") || seen[u.Name]:
			return fmt.Errorf("larder/servers: redis: bad or repeated user name %q", u.Name)
		case u.Password == "":
			return fmt.Errorf("larder/servers: redis: user %s has no password", u.Name)
		case strings.ContainsAny(u.Rules, "\r\n\"'"):
			return fmt.Errorf("larder/servers: redis: user %s: rules on one line, unquoted", u.Name)
		}
		seen[u.Name] = true
	}
	return nil
}

// configFile is the redis.conf of a server on port with its data in dir.
func (c RedisConfig) configFile(port int, dir string) string {
	var b strings.Builder
	line := func(args ...string) { b.WriteString(strings.Join(args, " ") + "\n") }
	line("port", strconv.Itoa(port))
	line("bind", "127.0.0.1")
	line("protected-mode", "yes")
	line("daemonize", "no")
	line("dir", strconv.Quote(dir))
	line("save", `""`)
	if c.Persist {
		line("appendonly", "yes")
		line("appendfsync", "everysec")
	} else {
		line("appendonly", "no")
	}
	if c.MaxMemory > 0 {
		line("maxmemory", strconv.FormatInt(c.MaxMemory, 10))
	}
	if c.MaxMemoryPolicy != "" {
		line("maxmemory-policy", c.MaxMemoryPolicy)
	}
	line("notify-keyspace-events", strconv.Quote(c.NotifyKeyspaceEvents))
	if c.Password != "" {
		line("user", "default", "reset", "on", passwordHash(c.Password), "~*", "&*", "+@all")
	}
	for _, u := range c.Users {
		line("user", u.Name, "reset", "on", passwordHash(u.Password), u.Rules)
	}
	return b.String()
}

// passwordHash is the ACL rule that adds password p by its SHA-256.
func passwordHash(p string) string {
	h := sha256.Sum256([]byte(p))
	return "#" + hex.EncodeToString(h[:])
}

// Redis is a running redis-server. Safe for concurrent use.
type Redis struct {
	port     int
	password string            // the default user's
	users    map[string]string // name -> password
	proc     *process
}

const redisInstallHint = "apt-get install redis-server (or run `make deps`)"

// StartRedis starts redis-server and returns once it answers PING.
func StartRedis(ctx context.Context, cfg RedisConfig) (*Redis, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bin, err := findBinary(cfg.Bin, "redis-server", []string{"/usr/bin"}, redisInstallHint)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("larder/servers: redis dir: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()

	r := &Redis{password: cfg.Password, users: map[string]string{}}
	for _, u := range cfg.Users {
		r.users[u.Name] = u.Password
	}
	conf := filepath.Join(dir, "redis.conf")
	const attempts = 3
	for attempt := 1; ; attempt++ {
		r.port = cfg.Port
		if r.port == 0 {
			if r.port, err = FreePort(); err != nil {
				return nil, err
			}
		}
		if err := writePrivate(conf, cfg.configFile(r.port, dir)); err != nil {
			return nil, fmt.Errorf("larder/servers: redis config: %w", err)
		}
		r.proc, err = startProcess("redis-server", bin, []string{conf}, filepath.Join(dir, "redis.log"), nil, syscall.SIGTERM)
		if err != nil {
			return nil, err
		}
		err = waitReady(ctx, r.proc, r.ping)
		if err == nil {
			return r, nil
		}
		_ = r.proc.stop()
		if cfg.Port != 0 || attempt == attempts || ctx.Err() != nil {
			return nil, err
		}
	}
}

// writePrivate writes a file only its owner may read, whatever was there.
func writePrivate(path, content string) error {
	_ = os.Remove(path)
	return os.WriteFile(path, []byte(content), 0o600)
}

func (r *Redis) ping(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), Password: r.password, MaxRetries: -1})
	defer c.Close()
	return c.Ping(ctx).Err()
}

// Addr is host:port of the server.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// URL is a redis:// URL for the server as the default user (with its
// password, if it has one), as go-redis's ParseURL accepts. It carries a
// secret: redact it (internal/secret) before logging it.
func (r *Redis) URL() string {
	u := url.URL{Scheme: "redis", Host: r.Addr(), Path: "/0"}
	if r.password != "" {
		u.User = url.UserPassword("", r.password)
	}
	return u.String()
}

// URLFor is the URL for the server as one of its Users, with the user's
// password.
func (r *Redis) URLFor(name string) (string, error) {
	p, ok := r.users[name]
	if !ok {
		return "", fmt.Errorf("larder/servers: redis: no user %q", name)
	}
	u := url.URL{Scheme: "redis", User: url.UserPassword(name, p), Host: r.Addr(), Path: "/0"}
	return u.String(), nil
}

// Close shuts the server down and waits for it. Idempotent.
func (r *Redis) Close() error { return r.proc.stop() }
