package larder

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var m *dto.Metric = mf.GetMetric()[0]
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// An origin the edge cannot use — unreachable, stopped under it, or
// reading in another session scope (another setting here) — leaves every
// transaction on the edge's own PostgreSQL connection, at the pin it chose,
// with the same results; each such transaction is counted as a loader
// fallback (OriginStats, larder_client_loader_fallbacks_total), and none
// becomes an uncached fallback or a fresh snapshot.
func TestOriginFallbacks(t *testing.T) {
	s := startStack(t)
	cases := []struct {
		name   string
		origin func(t *testing.T) (string, *tls.Config)
	}{
		{"unreachable", func(t *testing.T) (string, *tls.Config) {
			_, edgeTLS, _ := startOrigin(t, s.url)
			return closedAddr(t), edgeTLS
		}},
		{"stopped", func(t *testing.T) (string, *tls.Config) {
			addr, edgeTLS, srv := startOrigin(t, s.url)
			_ = srv.Close()
			return addr, edgeTLS
		}},
		{"another-scope", func(t *testing.T) (string, *tls.Config) {
			sep := "?"
			if strings.Contains(s.url, "?") {
				sep = "&"
			}
			// The origin's sessions run with another work_mem: results
			// there could differ from the edge's (a setting is part of the
			// key), so it refuses the edge's transactions.
			addr, edgeTLS, srv := startOrigin(t, s.url+sep+"work_mem=7MB")
			t.Cleanup(func() {
				// The origin was reached (the edge's TLS is this origin's)
				// and refused every begin: no session ran.
				if n := srv.Stats().Sessions.Load(); n != 0 {
					t.Errorf("the origin in another scope ran %d sessions", n)
				}
			})
			return addr, edgeTLS
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr, edgeTLS := tc.origin(t)
			reg := prometheus.NewRegistry()
			// No cache-node and no L1: every read misses, so every
			// transaction asks its Loader.
			c := s.openWith(t, nil, 0, true, func(cfg *Config) {
				cfg.Origin, cfg.OriginTLS, cfg.Metrics = addr, edgeTLS, reg
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The previous case's writes came from another client: a
			// transaction here may read at a pin up to its staleness (3 s)
			// older. Past that, every pin sees them.
			time.Sleep(3500 * time.Millisecond)
			want := s.pgBalances(t)
			for range 5 {
				tx, err := c.BeginRO(ctx, 3*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				got := map[int]int{}
				for id := 1; id <= accounts; id++ {
					var b int
					if err := tx.QueryRow(ctx, readBalance, []any{id}, &b); err != nil {
						t.Fatal(err)
					}
					got[id] = b
				}
				if tx.remote != nil || !tx.fixed || tx.fallback || tx.now || tx.pin.SnapshotID == "" {
					t.Fatalf("the transaction is not on its own connection at a pin: remote %v, fixed %v, fallback %v, fresh %v, snapshot %q",
						tx.remote != nil, tx.fixed, tx.fallback, tx.now, tx.pin.SnapshotID)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				for id, b := range want {
					if got[id] != b {
						t.Fatalf("account %d: %d, want %d", id, got[id], b)
					}
				}
			}
			// Read your writes through the fallback too.
			writeThrough(t, c, "UPDATE accounts SET balance = balance - 1 WHERE id = 1")
			writeThrough(t, c, "UPDATE accounts SET balance = balance + 1 WHERE id = 2")
			got, err := roBalances(ctx, c, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			want = s.pgBalances(t)
			for id, b := range want {
				if got[id] != b {
					t.Fatalf("after a write: account %d: %d, want %d", id, got[id], b)
				}
			}
			st := c.OriginStats()
			if st.Statements != 0 {
				t.Fatalf("%d statements ran at an origin the edge cannot use", st.Statements)
			}
			if st.Fallbacks < 5 {
				t.Fatalf("%d loader fallbacks counted for at least 5 transactions", st.Fallbacks)
			}
			if m := counterValue(t, reg, "larder_client_loader_fallbacks_total"); int64(m) != st.Fallbacks {
				t.Fatalf("metric %v, stats %d", m, st.Fallbacks)
			}
			if f := c.Stats().Fallbacks.Load(); f != 0 {
				t.Fatalf("%d transactions ran uncached", f)
			}
			t.Logf("%d loader fallbacks, %d fresh snapshots (read your writes)", st.Fallbacks, c.Stats().NowSnapshots.Load())
		})
	}
}

// A database/sql connection's read-only transaction (a session with its
// own connection, as the driver begins it) goes through the origin when
// the connection's scope is the origin's; a statement in it that may
// change the session is refused there (it would change the origin's
// session, not the connection's). A connection in another scope stays on
// its own connection.
func TestOriginSessionTransactions(t *testing.T) {
	s := startStack(t)
	addr, edgeTLS, srv := startOrigin(t, s.url)
	c := s.openWith(t, nil, 0, true, func(cfg *Config) { cfg.Origin, cfg.OriginTLS = addr, edgeTLS })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	want := s.pgBalances(t)
	read := func(wantRemote bool) {
		t.Helper()
		scope, err := c.readScope(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := c.beginRO(ctx, 3*time.Second, conn, scope, nil)
		if err != nil {
			t.Fatal(err)
		}
		tx.sqlFormats = true
		defer func() { _ = tx.Commit(ctx) }()
		for id := 1; id <= accounts; id++ {
			var b int
			if err := tx.QueryRow(ctx, readBalance, []any{id}, &b); err != nil {
				t.Fatal(err)
			}
			if b != want[id] {
				t.Fatalf("account %d: %d, want %d", id, b, want[id])
			}
		}
		if (tx.remote != nil) != wantRemote {
			t.Fatalf("through the origin: %v, want %v", tx.remote != nil, wantRemote)
		}
		if wantRemote {
			_, err := tx.Query(ctx, "SELECT set_config('work_mem', '9MB', false)")
			if !errors.Is(err, ErrSessionChangeAtOrigin) {
				t.Fatalf("a session change through the origin: %v, want ErrSessionChangeAtOrigin", err)
			}
		}
	}
	read(true)
	if srv.Stats().Sessions.Load() == 0 {
		t.Fatal("the origin served no session")
	}
	fallbacks := c.OriginStats().Fallbacks
	// The connection changes a setting: its scope is no longer the
	// origin's, which refuses; the transaction runs on the connection.
	if _, err := conn.Exec(ctx, "SET work_mem = '9MB'"); err != nil {
		t.Fatal(err)
	}
	read(false)
	if c.OriginStats().Fallbacks != fallbacks+1 {
		t.Fatalf("loader fallbacks %d, want %d", c.OriginStats().Fallbacks, fallbacks+1)
	}
}

func TestDSNOriginRowsNone(t *testing.T) {
	cfg, err := ParseDSN("postgres://u@h/db?larder.nats=nats://x:4222&larder.quma=q.json&larder.origin=o:7080&larder.origin-rows=0")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OriginRows != OriginRowsNone {
		t.Fatalf("origin-rows=0: %d, want OriginRowsNone", cfg.OriginRows)
	}
}

func TestPoolSized(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u@h:5432/db?sslmode=disable": "postgres://u@h:5432/db?pool_max_conns=64&sslmode=disable",
		"postgres://u@h/db?pool_max_conns=8":     "postgres://u@h/db?pool_max_conns=8",
		"host=h dbname=db":                       "host=h dbname=db pool_max_conns=64",
		"host=h dbname=db pool_max_conns=3":      "host=h dbname=db pool_max_conns=3",
	} {
		if got := PoolSized(in, 64); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

// An origin whose dial or handshake times out while the caller's context
// is live is unavailable: the transaction begins on the client's own
// connection. The end of the caller's own context, PostgreSQL's answers
// and retries stay the transaction's.
func TestOriginTimeoutIsUnavailable(t *testing.T) {
	l := &originLoader{}
	live := context.Background()
	timedOut := fmt.Errorf("origin 127.0.0.1:1: %w", context.DeadlineExceeded)
	if err := l.unavailable(live, timedOut); !errors.Is(err, ErrLoaderUnavailable) {
		t.Fatalf("a dial timeout with the caller's context live: %v, want ErrLoaderUnavailable", err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.unavailable(done, fmt.Errorf("origin: %w", context.Canceled)); errors.Is(err, ErrLoaderUnavailable) {
		t.Fatalf("the caller's own context ended: %v, want the error itself", err)
	}
	if err := l.unavailable(live, fmt.Errorf("origin: %w", ErrRetry)); errors.Is(err, ErrLoaderUnavailable) || !errors.Is(err, ErrRetry) {
		t.Fatalf("a retry: %v, want ErrRetry itself", err)
	}
	if err := l.unavailable(live, errors.New("origin: connection refused")); !errors.Is(err, ErrLoaderUnavailable) {
		t.Fatalf("a refused connection: %v, want ErrLoaderUnavailable", err)
	}
}

// TestSilentOriginIsLeftAlone: an origin that accepts connections and
// never answers (a hung process, a black-holing proxy) costs one dial
// timeout, and then is left alone for NodeBackoff: the next transactions
// begin on the client's own connection without dialing it (before, each
// one waited for its own dial to time out).
func TestSilentOriginIsLeftAlone(t *testing.T) {
	s := startStack(t)
	defer func(d time.Duration) { originDialTimeout = d }(originDialTimeout)
	originDialTimeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	defer func() {
		for {
			select {
			case c := <-accepted:
				c.Close()
			default:
				return
			}
		}
	}()
	c := s.openWith(t, nil, 0, true, func(cfg *Config) {
		cfg.Origin, cfg.NodeBackoff = ln.Addr().String(), time.Hour
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	want := s.pgBalances(t)
	for i := range 5 {
		tx, err := c.BeginRO(ctx, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var b int
		if err := tx.QueryRow(ctx, readBalance, []any{1}, &b); err != nil {
			t.Fatalf("transaction %d: %v", i, err)
		}
		if b != want[1] {
			t.Fatalf("transaction %d read %d, want %d", i, b, want[1])
		}
		if tx.remote != nil || tx.fallback {
			t.Fatalf("transaction %d: remote %v, fallback %v; want its own connection at a pin", i, tx.remote != nil, tx.fallback)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(accepted); n != 1 {
		t.Fatalf("the silent origin was dialed %d times by 5 transactions, want once", n)
	}
	if n := c.OriginStats().Fallbacks; n != 5 {
		t.Fatalf("%d loader fallbacks, want 5", n)
	}
}
