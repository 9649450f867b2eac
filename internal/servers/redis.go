package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisConfig configures a Redis server started by StartRedis.
type RedisConfig struct {
	// Dir holds the log and, when Persist is set, the append-only file.
	Dir string
	// Port on 127.0.0.1; 0 picks a free one.
	Port int
	// Bin is the redis-server binary; empty searches $PATH and /usr/bin.
	Bin string
	// Persist keeps data in Dir across restarts (append-only file);
	// tests leave it off, the local stack turns it on.
	Persist bool
	// MaxMemory, when non-zero, sets maxmemory in bytes (with allkeys-lru).
	MaxMemory int64
	// StartTimeout bounds start-up.
	StartTimeout time.Duration
}

// DefaultRedisConfig returns a non-persistent server in dir on a free port.
func DefaultRedisConfig(dir string) RedisConfig {
	return RedisConfig{Dir: dir, StartTimeout: 20 * time.Second}
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
	return nil
}

// Redis is a running redis-server. Safe for concurrent use.
type Redis struct {
	port int
	proc *process
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

	r := &Redis{}
	const attempts = 3
	for attempt := 1; ; attempt++ {
		r.port = cfg.Port
		if r.port == 0 {
			if r.port, err = FreePort(); err != nil {
				return nil, err
			}
		}
		args := []string{
			"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--daemonize", "no", "--protected-mode", "yes",
		}
		if cfg.Persist {
			args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
		} else {
			args = append(args, "--appendonly", "no")
		}
		if cfg.MaxMemory > 0 {
			args = append(args, "--maxmemory", strconv.FormatInt(cfg.MaxMemory, 10), "--maxmemory-policy", "allkeys-lru")
		}
		r.proc, err = startProcess("redis-server", bin, args, filepath.Join(dir, "redis.log"), nil, syscall.SIGTERM)
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

func (r *Redis) ping(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	return c.Ping(ctx).Err()
}

// Addr is host:port of the server.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// URL is a redis:// URL for the server, as go-redis's ParseURL accepts.
func (r *Redis) URL() string { return "redis://" + r.Addr() + "/0" }

// Close shuts the server down and waits for it. Idempotent.
func (r *Redis) Close() error { return r.proc.stop() }
