package pgfront

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/larderdb/larder/cache-node/daemon"
	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/internal/testenv"
	"github.com/larderdb/larder/invalidator/service"
	"github.com/larderdb/larder/qumaana/quma"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true}, &env))
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var stackSeq atomic.Int64

// stack is a database with the invalidator, a cache-node, the library
// and a front in front of it, all real.
type stack struct {
	url      string // the database, directly
	db       string
	prefix   string
	quma     string
	node     string
	client   *larder.Client
	front    *Front
	frontURL string // the same database through the front
	conn     *pgx.Conn
}

// startStack makes a database from ddl and seed, a QUMA file from ddl
// and the templates, and runs the invalidator, a cache-node, the library
// and a front over it.
func startStack(t testing.TB, ddl, seed string, templates ...string) *stack {
	t.Helper()
	ctx := context.Background()
	s := &stack{url: testenv.Database(t, env.PG), prefix: fmt.Sprintf("pf%d", stackSeq.Add(1))}
	u, err := url.Parse(s.url)
	if err != nil {
		t.Fatal(err)
	}
	s.db = u.Path[1:]
	if s.conn, err = pgx.Connect(ctx, s.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.conn.Close(context.Background()) })
	if _, err := s.conn.Exec(ctx, ddl+";"+seed); err != nil {
		t.Fatal(err)
	}
	s.quma = filepath.Join(t.TempDir(), "quma.json")
	writeQUMA(t, s.quma, ddl, templates...)

	bg, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	o := service.Defaults()
	o.PG, o.NATS, o.Prefix, o.Slot, o.Publication, o.Metrics = s.url, env.NATS.URL(), s.prefix, s.prefix, s.prefix, ""
	o.Heartbeat, o.PinInterval, o.MaxStaleness = 20*time.Millisecond, 100*time.Millisecond, 10*time.Second
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := service.Run(bg, o, quiet); err != nil {
			t.Errorf("invalidator: %v", err)
		}
	}()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		done <- daemon.Run(bg, daemon.Options{Listen: "127.0.0.1:0", NATS: env.NATS.URL(), Prefix: s.prefix, Store: "memory", Memory: 64 << 20}, quiet, ready)
	}()
	select {
	case s.node = <-ready:
	case err := <-done:
		t.Fatalf("cache-node: %v", err)
	}

	s.client, err = larder.Open(ctx, larder.Config{PostgresURL: s.url, NATSURL: env.NATS.URL(), Prefix: s.prefix,
		Nodes: []string{s.node}, QUMA: s.quma, Staleness: 3 * time.Second, L1Bytes: 8 << 20, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.client.Close)
	s.startFront(t, func(*Config) {})
	return s
}

// startFront runs a front over the stack's library; adjust changes its
// configuration first.
func (s *stack) startFront(t testing.TB, adjust func(*Config)) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen, cfg.Postgres, cfg.Client, cfg.Log = "127.0.0.1:0", "127.0.0.1:"+strconv.Itoa(env.PG.Port()), s.client, quiet
	cfg.DefaultStaleness = 3 * time.Second
	adjust(&cfg)
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("front: %v", err)
		}
	})
	s.front = f
	s.frontURL = s.urlVia(f.Addr().String(), "postgres", "")
}

// urlVia is a URL of the stack's database at addr as user (and password).
func (s *stack) urlVia(addr, user, password string) string {
	u := url.URL{Scheme: "postgres", User: url.User(user), Host: addr, Path: "/" + s.db, RawQuery: "sslmode=disable"}
	if password != "" {
		u.User = url.UserPassword(user, password)
	}
	return u.String()
}

// waitReady waits until the library places its transactions at pins and
// caches (the invalidator said what it covers): probe is a cacheable
// query of the stack's schema.
func (s *stack) waitReady(t testing.TB, probe string, args ...any) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the library never placed a transaction at a pin and cached")
		}
		tx, err := s.client.BeginRO(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		before := s.client.Stats().Uncacheable.Load()
		rows, err := tx.Query(ctx, probe, args...)
		if err == nil {
			rows.Close()
		}
		placed := tx.Placed()
		_ = tx.Commit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if placed && s.client.Stats().Uncacheable.Load() == before {
			return
		}
	}
}

// writeQUMA writes to path the QUMA file analyzed from ddl and templates.
func writeQUMA(t testing.TB, path, ddl string, templates ...string) {
	t.Helper()
	schema, err := quma.LoadDDL(ddl)
	if err != nil {
		t.Fatal(err)
	}
	var work []quma.Statement
	for _, tpl := range templates {
		work = append(work, quma.Statement{SQL: tpl, Frequency: 1})
	}
	sol, err := quma.AnalyzeWorkload(schema, work)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := sol.WriteJSON(f); err != nil {
		t.Fatal(err)
	}
}

// connect opens a pgx connection.
func connect(t testing.TB, connString string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), connString)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
