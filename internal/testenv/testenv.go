package testenv

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/larderdb/larder/internal/servers"
)

// dirPrefix names every directory this package creates under os.TempDir.
const dirPrefix = "larder-testenv-"

// ownerFile records the pid of the process that owns a directory.
const ownerFile = "owner.pid"

// Need says which servers Main starts for a package.
type Need struct {
	Postgres bool
	NATS     bool
	Redis    bool
}

// Env holds the servers Main started. Fields for servers not needed are nil.
type Env struct {
	PG    *servers.Postgres
	NATS  *servers.NATS
	Redis *servers.Redis
}

// Main starts the needed servers, runs the package's tests, stops the servers
// and removes their directories. It returns the exit code for os.Exit; a
// server that cannot start makes it return 1 with the reason on stderr.
func Main(m *testing.M, need Need, env **Env) int {
	logger := log.New(os.Stderr, "testenv: ", 0)
	e, cleanup, err := start(context.Background(), need)
	if err != nil {
		logger.Printf("FAIL: %v", err)
		cleanup()
		return 1
	}
	*env = e
	defer cleanup()
	return m.Run()
}

func start(ctx context.Context, need Need) (*Env, func(), error) {
	var closers []func()
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	dir, err := TempDir()
	if err != nil {
		return nil, cleanup, err
	}
	closers = append(closers, func() { _ = os.RemoveAll(dir) })
	e := &Env{}
	if need.Postgres {
		if e.PG, err = servers.StartPostgres(ctx, servers.DefaultPostgresConfig(filepath.Join(dir, "pg"))); err != nil {
			return nil, cleanup, err
		}
		closers = append(closers, func() { _ = e.PG.Close() })
	}
	if need.NATS {
		if e.NATS, err = servers.StartNATS(ctx, servers.DefaultNATSConfig(filepath.Join(dir, "nats"))); err != nil {
			return nil, cleanup, err
		}
		closers = append(closers, func() { _ = e.NATS.Close() })
	}
	if need.Redis {
		if e.Redis, err = servers.StartRedis(ctx, servers.DefaultRedisConfig(filepath.Join(dir, "redis"))); err != nil {
			return nil, cleanup, err
		}
		closers = append(closers, func() { _ = e.Redis.Close() })
	}
	return e, cleanup, nil
}

// Postgres starts a PostgreSQL cluster for one test and stops it when the test ends.
func Postgres(tb testing.TB) *servers.Postgres {
	tb.Helper()
	dir := testDir(tb)
	pg, err := servers.StartPostgres(context.Background(), servers.DefaultPostgresConfig(filepath.Join(dir, "pg")))
	if err != nil {
		tb.Fatalf("testenv: start PostgreSQL: %v", err)
	}
	tb.Cleanup(func() {
		if err := pg.Close(); err != nil {
			tb.Errorf("testenv: stop PostgreSQL: %v", err)
		}
	})
	return pg
}

// NATS starts an embedded NATS server with JetStream for one test.
func NATS(tb testing.TB) *servers.NATS {
	tb.Helper()
	n, err := servers.StartNATS(context.Background(), servers.DefaultNATSConfig(filepath.Join(testDir(tb), "nats")))
	if err != nil {
		tb.Fatalf("testenv: start NATS: %v", err)
	}
	tb.Cleanup(func() { _ = n.Close() })
	return n
}

// Redis starts a redis-server without persistence for one test.
func Redis(tb testing.TB) *servers.Redis {
	tb.Helper()
	r, err := servers.StartRedis(context.Background(), servers.DefaultRedisConfig(filepath.Join(testDir(tb), "redis")))
	if err != nil {
		tb.Fatalf("testenv: start Redis: %v", err)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return r
}

var dbSeq atomic.Int64

// Database creates a fresh database on pg for one test and returns its URL;
// it is dropped when the test ends.
func Database(tb testing.TB, pg *servers.Postgres) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := fmt.Sprintf("t_%d_%d", os.Getpid(), dbSeq.Add(1))
	u, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := pg.DropDatabase(ctx, name); err != nil {
			tb.Errorf("testenv: %v", err)
		}
	})
	return u
}

// testDir makes a directory for one test's servers, removed when it ends.
func testDir(tb testing.TB) string {
	tb.Helper()
	dir, err := TempDir()
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// TempDir makes a directory under os.TempDir that an unprivileged server user
// can enter (t.TempDir's parents are private to the caller), records this
// process as its owner, and first sweeps directories left by dead processes.
func TempDir() (string, error) {
	sweep()
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return "", fmt.Errorf("testenv: temp dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("testenv: temp dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return "", fmt.Errorf("testenv: temp dir: %w", err)
	}
	return dir, nil
}

// sweep removes directories whose owning process no longer exists: what a
// test binary killed with SIGKILL leaves behind.
func sweep() {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range matches {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being created, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			_ = os.RemoveAll(dir)
		}
	}
}
