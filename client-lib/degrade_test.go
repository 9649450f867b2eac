package larder

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/larderdb/larder/internal/servers"
)

// What happens when a part of Larder other than PostgreSQL is frozen,
// black-holed, absent or not replicating: read-only transactions go on,
// on PostgreSQL, correctly, without waiting long; the client picks the
// part up again when it answers.

// silentNode is a cache-node address that never answers: connections are
// accepted (as the kernel of a frozen, SIGSTOPped node does) and nothing
// is ever read or written.
type silentNode struct {
	ln      net.Listener
	accepts atomic.Int64
	mu      sync.Mutex
	conns   []net.Conn
}

func startSilentNode(t *testing.T) *silentNode {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &silentNode{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.accepts.Add(1)
			n.mu.Lock()
			n.conns = append(n.conns, c)
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, c := range n.conns {
			c.Close()
		}
	})
	return n
}

// blackHole returns an address whose SYNs are dropped: a socket listening
// with a backlog of 0 whose accept queue is full (and never accepted
// from), so that the kernel drops new connection attempts, as a firewall
// or a vanished host does.
func blackHole(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return addr // the queue is full: SYNs are dropped
			}
			t.Fatalf("black hole: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		if i == 16 {
			t.Skip("the kernel keeps accepting connections into a full backlog: no black hole here")
		}
	}
}

// openWith opens a client of the stack with nodes and tweak applied to
// its configuration; waitPins waits for the pincushion's pins.
func (s *stack) openWith(t *testing.T, nodes []string, l1 int64, waitPins bool, tweak func(*Config)) *Client {
	t.Helper()
	cfg := Config{PostgresURL: s.url, NATSURL: s.nats, Prefix: s.prefix, Nodes: nodes, QUMA: s.quma, Staleness: 3 * time.Second, L1Bytes: l1, Log: quiet}
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	for deadline := time.Now().Add(30 * time.Second); waitPins && (len(c.pins.candidates(time.Now().Add(-time.Minute), 0)) == 0 || c.keying.Load().covered == nil); {
		if time.Now().After(deadline) {
			t.Fatal("no pins or no tag sets")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// waitForPlacement makes reads at a fresh snapshot wait for it to be
// placed (Config.FreshReadWait), so that a read right after a write can
// hit.
func waitForPlacement(c *Config) { c.FreshReadWait = time.Second }

// dsnNodes is the database/sql DSN of the stack with nodes.
func (s *stack) dsnNodes(nodes ...string) string {
	q := url.Values{}
	q.Set("larder.nats", s.nats)
	q.Set("larder.nodes", strings.Join(nodes, ","))
	q.Set("larder.quma", s.quma)
	q.Set("larder.prefix", s.prefix)
	q.Set("larder.staleness", "3s")
	sep := "?"
	if strings.Contains(s.url, "?") {
		sep = "&"
	}
	return s.url + sep + q.Encode()
}

// writeThrough runs a write in a read/write transaction of c: c's later
// read-only transactions see it (read your writes).
func writeThrough(t *testing.T, c *Client, sql string) {
	t.Helper()
	ctx := context.Background()
	rw, err := c.BeginRW(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(ctx, sql); err != nil {
		_ = rw.Rollback(ctx)
		t.Fatal(err)
	}
	if err := rw.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// pgBalances reads every balance directly on PostgreSQL.
func (s *stack) pgBalances(t *testing.T) map[int]int {
	t.Helper()
	rows, err := s.conn.Query(context.Background(), "SELECT id, balance FROM accounts")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for rows.Next() {
		var id, b int
		if err := rows.Scan(&id, &b); err != nil {
			t.Fatal(err)
		}
		out[id] = b
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// roBalances reads every balance, each by its own cached query, in one
// read-only transaction of c; ctx bounds it.
func roBalances(ctx context.Context, c *Client, staleness time.Duration) (map[int]int, error) {
	tx, err := c.BeginRO(ctx, staleness)
	if err != nil {
		return nil, err
	}
	defer tx.Commit(context.Background())
	out := map[int]int{}
	for id := 1; id <= accounts; id++ {
		var b int
		if err := tx.QueryRow(ctx, readBalance, []any{id}, &b); err != nil {
			return nil, err
		}
		out[id] = b
	}
	return out, nil
}

// sqlBalances is roBalances through database/sql.
func sqlBalances(ctx context.Context, db *sql.DB) (map[int]int, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Commit()
	out := map[int]int{}
	for id := 1; id <= accounts; id++ {
		var b int
		if err := tx.QueryRowContext(ctx, readBalance, id).Scan(&b); err != nil {
			return nil, err
		}
		out[id] = b
	}
	return out, nil
}

// latencies collects transaction durations for percentiles.
type latencies struct {
	mu    sync.Mutex
	start time.Time
	all   []time.Duration
	late  []time.Duration // of transactions begun a second or more after start
}

func newLatencies() *latencies { return &latencies{start: time.Now()} }

func (l *latencies) add(begin time.Time, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, d)
	if begin.Sub(l.start) >= time.Second {
		l.late = append(l.late, d)
	}
}

func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	p := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	return fmt.Sprintf("n=%d p50=%v p90=%v p99=%v max=%v", len(ds), p(0.50).Round(10*time.Microsecond),
		p(0.90).Round(10*time.Microsecond), p(0.99).Round(10*time.Microsecond), ds[len(ds)-1].Round(10*time.Microsecond))
}

func (l *latencies) log(t *testing.T, what string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("%s: all %s; after the first second %s", what, percentiles(l.all), percentiles(l.late))
}

// runReads runs n read-only transactions on each of workers goroutines
// with read (each under a 5 s deadline: a node that does not answer must
// not use it up), checks each against want and records its duration.
func runReads(t *testing.T, workers, n int, want map[int]int, lat *latencies, read func(ctx context.Context) (map[int]int, error)) {
	t.Helper()
	runReadsFor(t, workers, n, 0, want, lat, read)
}

// runReadsFor is runReads going on for at least d; it returns the number
// of transactions run.
func runReadsFor(t *testing.T, workers, n int, d time.Duration, want map[int]int, lat *latencies, read func(ctx context.Context) (map[int]int, error)) int64 {
	t.Helper()
	var wg sync.WaitGroup
	var failed atomic.Bool
	var ran atomic.Int64
	until := time.Now().Add(d)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; (i < n || time.Now().Before(until)) && !failed.Load(); i++ {
				ran.Add(1)
				begin := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				got, err := read(ctx)
				cancel()
				lat.add(begin, time.Since(begin))
				if err != nil {
					failed.Store(true)
					t.Errorf("read-only transaction failed after %v: %v", time.Since(begin), err)
					return
				}
				for id, b := range want {
					if got[id] != b {
						failed.Store(true)
						t.Errorf("account %d: %d, PostgreSQL has %d", id, got[id], b)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		t.FailNow()
	}
	return ran.Load()
}

// A cache-node that accepts connections and never answers (a frozen
// process), or whose SYNs are dropped, costs read-only transactions at
// most a call's deadline until its breaker opens, then nothing: every
// transaction completes, with PostgreSQL's results, and no call reaches
// the node while the breaker is open.
func TestUnresponsiveNodeFallsBackToDatabase(t *testing.T) {
	for _, kind := range []string{"frozen", "black-holed"} {
		t.Run(kind, func(t *testing.T) {
			s := startStack(t)
			var addr string
			var silent *silentNode
			if kind == "frozen" {
				silent = startSilentNode(t)
				addr = silent.ln.Addr().String()
			} else {
				addr = blackHole(t)
			}
			want := s.pgBalances(t)

			t.Run("client", func(t *testing.T) {
				// No probe during the test: what reaches the node after
				// the breaker opened can be counted.
				c := s.openWith(t, []string{addr}, 0, true, func(cfg *Config) { cfg.NodeBackoff = time.Hour })
				lat := newLatencies()
				runReads(t, 1, 20, want, lat, func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, c, 0) })
				st := c.Stats()
				if st.BreakerOpens.Load() == 0 || c.NodeStates()[addr] != "open" {
					t.Fatalf("breaker opened %d times, state %q; %d node timeouts, %d node errors",
						st.BreakerOpens.Load(), c.NodeStates()[addr], st.NodeTimeouts.Load(), st.NodeErrors.Load())
				}
				// Once open, nothing reaches the node.
				var accepted int64
				if silent != nil {
					accepted = silent.accepts.Load()
				}
				timeouts, bypassed := st.NodeTimeouts.Load(), st.NodeBypassed.Load()
				ran := runReadsFor(t, 4, 20, 2*time.Second, want, lat, func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, c, 0) })
				if silent != nil && silent.accepts.Load() != accepted {
					t.Errorf("the node accepted %d connections after its breaker opened", silent.accepts.Load()-accepted)
				}
				if st.NodeTimeouts.Load() != timeouts || st.NodeBypassed.Load()-bypassed != ran*accounts {
					t.Errorf("after the breaker opened: %d more timeouts, %d lookups bypassed (want %d)",
						st.NodeTimeouts.Load()-timeouts, st.NodeBypassed.Load()-bypassed, ran*accounts)
				}
				t.Logf("%s node: %d timeouts, %d node errors, breaker opened %d times, %d calls bypassed, %d connections accepted",
					kind, st.NodeTimeouts.Load(), st.NodeErrors.Load(), st.BreakerOpens.Load(), st.NodeBypassed.Load(), accepted)
				lat.log(t, kind+" node, read-only transactions of 4 reads")

				// The same transactions without a node, for comparison.
				base := s.openWith(t, nil, 0, true, nil)
				bl := newLatencies()
				runReadsFor(t, 4, 20, 2*time.Second, want, bl, func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, base, 0) })
				bl.log(t, "no node, the same transactions")
			})

			t.Run("database/sql", func(t *testing.T) {
				dsn := s.dsnNodes(addr)
				db, err := sql.Open(DriverName, dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				lat := newLatencies()
				runReadsFor(t, 4, 15, 2*time.Second, want, lat, func(ctx context.Context) (map[int]int, error) { return sqlBalances(ctx, db) })
				lat.log(t, kind+" node, database/sql")
				st, ok := DriverStats(dsn)
				if !ok || st.BreakerOpens.Load() == 0 {
					t.Fatalf("the breaker never opened (stats found: %v)", ok)
				}
				t.Logf("database/sql: %d timeouts, breaker opened %d times, %d calls bypassed", st.NodeTimeouts.Load(), st.BreakerOpens.Load(), st.NodeBypassed.Load())
			})
		})
	}
}

// A node that freezes and thaws: its breaker opens, the reads go to
// PostgreSQL (a write meanwhile is seen), and once the node answers a
// probe the reads hit it again, still correct.
func TestNodeBreakerClosesWhenNodeAnswers(t *testing.T) {
	s := startStack(t)
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(api, "node", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), s.node)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Stop)
	c := s.openWith(t, []string{proxy.Listen}, 0, true, func(cfg *Config) { cfg.NodeBackoff = 200 * time.Millisecond })
	ctx := context.Background()
	read := func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, c, 0) }
	waitHits := func(what string) {
		t.Helper()
		hits := c.Stats().NodeHits.Load()
		for deadline := time.Now().Add(30 * time.Second); c.Stats().NodeHits.Load() == hits; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no node hit in 30 s (breaker %s)", what, c.NodeStates()[proxy.Listen])
			}
			runReads(t, 1, 1, s.pgBalances(t), newLatencies(), read)
		}
	}
	waitHits("before the freeze")

	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"freeze","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)); err != nil {
		t.Fatal(err)
	}
	// A write through the client: its later reads must see it.
	writeThrough(t, c, "UPDATE accounts SET balance = balance + 3 WHERE id = 1")
	want := s.pgBalances(t)
	lat := newLatencies()
	runReads(t, 2, 20, want, lat, read)
	lat.log(t, "frozen node")
	if c.Stats().BreakerOpens.Load() == 0 {
		t.Fatal("the breaker did not open")
	}

	if err := proxy.Toxics.RemoveToxic(ctx, "freeze"); err != nil {
		t.Fatal(err)
	}
	waitHits("after the thaw")
	if st := c.NodeStates()[proxy.Listen]; st != "closed" {
		t.Fatalf("breaker %s after node hits", st)
	}
	runReads(t, 2, 10, want, newLatencies(), read)
	t.Logf("breaker opened %d times; %d node timeouts; %d node hits", c.Stats().BreakerOpens.Load(), c.Stats().NodeTimeouts.Load(), c.Stats().NodeHits.Load())
}

// holdSlot takes the stopped invalidator's replication slot on a
// replication connection of the test's, as another consumer (or a
// second invalidator) does: an invalidator started then is alive, answers
// requests, but does not replicate. The returned func lets go.
func (s *stack) holdSlot(t *testing.T) func() {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var active bool
		if err := s.conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", s.invOpts.Slot).Scan(&active); err != nil {
			t.Fatal(err)
		}
		if !active {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot is still active 30 s after its invalidator stopped")
		}
	}
	rc, err := pgconn.Connect(ctx, s.url+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	err = pglogrepl.StartReplication(ctx, rc, s.invOpts.Slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + s.invOpts.Publication + "'"}})
	if err != nil {
		rc.Close(ctx)
		t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(func() { rc.Close(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// An invalidator that is alive but not replicating (its slot held by
// another consumer) places no pins and answers verify requests only
// after its own wait: read-only transactions that find no usable pin do
// not wait for it, they run uncached on a fresh snapshot at once, and see
// every commit. When it replicates again, fresh snapshots are placed
// again.
func TestPinsNotPlacedFallBackAtOnce(t *testing.T) {
	s := startStack(t)
	c := s.openWith(t, []string{s.node}, 0, true, nil)
	ctx := context.Background()
	if _, err := roBalances(ctx, c, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	s.stopInvalidator()
	release := s.holdSlot(t)
	s.startInvalidator(t)
	stuck := time.Now()
	t.Logf("the invalidator runs again, its slot held elsewhere")
	uncached := c.Stats().UnplacedReads.Load() + c.Stats().Fallbacks.Load()

	lat := newLatencies()
	var first time.Duration
	for i := 0; i < 20; i++ {
		// A write through the client, then a transaction that must see
		// it: no pin can be that fresh.
		writeThrough(t, c, "UPDATE accounts SET balance = balance + 1 WHERE id = 2")
		want := s.pgBalances(t)
		runReads(t, 1, 1, want, lat, func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, c, 0) })
		if i == 0 {
			first = time.Since(stuck)
			// The read did not wait for the pincushion, which answers
			// nothing before the verify timeout: it returned before any
			// verify request went unanswered (which marks the pincushion
			// stalled), and ran on PostgreSQL uncached.
			if c.pins.stalled.Load() >= stuck.UnixNano() {
				t.Fatalf("the first read returned %v after the invalidator was stuck, after a verify request went unanswered: it waited for the pincushion", first)
			}
			if c.Stats().UnplacedReads.Load()+c.Stats().Fallbacks.Load() == uncached {
				t.Fatal("the first read after a write did not run uncached")
			}
		}
	}
	took := time.Since(stuck)
	lat.log(t, "read-only transactions while the invalidator does not replicate")
	t.Logf("first read %v after the invalidator was stuck; 20 write+read rounds in %v; fallbacks %d", first, took, c.Stats().Fallbacks.Load())
	// Each waited the full verify timeout before (20 × 2 s).
	if took > 15*time.Second {
		t.Fatalf("20 rounds took %v: transactions waited for a pincushion that places nothing", took)
	}
	if n := c.Stats().Fallbacks.Load() + c.Stats().UnplacedReads.Load(); n == 0 {
		t.Fatal("no uncached read counted")
	}
	// Once a placement went unanswered for the verify timeout, the
	// transactions stop asking: they fall back at once, counted.
	time.Sleep(DefaultPinVerifyTimeout + 300*time.Millisecond)
	writeThrough(t, c, "UPDATE accounts SET balance = balance + 1 WHERE id = 2")
	runReads(t, 1, 1, s.pgBalances(t), lat, func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, c, 0) })
	if c.Stats().Fallbacks.Load() == 0 {
		t.Fatal("no fallback counted after a placement went unanswered")
	}

	release()
	now := c.Stats().NowSnapshots.Load()
	for deadline := time.Now().Add(60 * time.Second); c.Stats().NowSnapshots.Load() == now; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no fresh snapshot placed within 60 s of the slot's release")
		}
		runReads(t, 1, 1, s.pgBalances(t), lat, func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, c, time.Millisecond) })
	}
}

// Open needs PostgreSQL only. With NATS down (and so no invalidator, no
// node), it succeeds; read/write work, through the client and
// database/sql; read-only transactions run uncached (counted). When NATS,
// the invalidator and the node start, the client picks them up: pins,
// tag sets, and hits on the node, with correct results.
func TestOpenWithoutNATS(t *testing.T) {
	natsCfg := servers.DefaultNATSConfig(filepath.Join(t.TempDir(), "nats"))
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	natsCfg.Port = port
	natsOverride = fmt.Sprintf("nats://127.0.0.1:%d", port)
	s := prepareStack(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES (1, 100), (2, 100), (3, 100), (4, 100)",
		readBalance, readBalanceVer)
	natsOverride = ""
	nodePort, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	nodeAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(nodePort))

	begin := time.Now()
	c := s.openWith(t, []string{nodeAddr}, 0, false, nil)
	t.Logf("Open with NATS down took %v", time.Since(begin))
	ctx := context.Background()
	writeThrough(t, c, "UPDATE accounts SET balance = balance + 5 WHERE id = 1")
	read := func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, c, 0) }
	runReads(t, 1, 3, s.pgBalances(t), newLatencies(), read)
	if c.Stats().Fallbacks.Load() < 3 {
		t.Fatalf("%d fallbacks counted for 3 uncached transactions", c.Stats().Fallbacks.Load())
	}

	// database/sql, as an application opens it.
	db, err := sql.Open(DriverName, s.dsnNodes(nodeAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "UPDATE accounts SET balance = balance - 5 WHERE id = 2"); err != nil {
		t.Fatalf("a plain Exec with NATS down: %v", err)
	}
	runReads(t, 1, 3, s.pgBalances(t), newLatencies(), func(ctx context.Context) (map[int]int, error) { return sqlBalances(ctx, db) })

	// NATS, the invalidator and the node arrive.
	ns, err := servers.StartNATS(ctx, natsCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	s.startInvalidator(t)
	s.startNode(t, nodeAddr)
	arrived := time.Now()
	for deadline := time.Now().Add(60 * time.Second); c.Stats().NodeHits.Load() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			st := c.Stats()
			t.Fatalf("no node hit 60 s after NATS came: covered %v, %d misses, %d uncacheable, %d fallbacks, breaker %s",
				c.keying.Load().covered != nil, st.Misses.Load(), st.Uncacheable.Load(), st.Fallbacks.Load(), c.NodeStates()[nodeAddr])
		}
		// Written through the client: the reads after must see it.
		writeThrough(t, c, "UPDATE accounts SET balance = balance + 1 WHERE id = 3")
		runReads(t, 1, 2, s.pgBalances(t), newLatencies(), read)
	}
	t.Logf("first node hit %v after NATS, the invalidator and the node started", time.Since(arrived))
	runReads(t, 2, 10, s.pgBalances(t), newLatencies(), read)
}

// Open with NATS up but the invalidator down returns at once (nothing is
// cached: no tag sets yet); the client picks up the tag sets when the
// invalidator starts.
func TestOpenWithoutInvalidator(t *testing.T) {
	s := prepareStack(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES (1, 100), (2, 100), (3, 100), (4, 100)", readBalance)
	s.startNode(t, "127.0.0.1:0")
	begin := time.Now()
	c := s.openWith(t, []string{s.node}, 0, false, nil)
	opened := time.Since(begin)
	t.Logf("Open with the invalidator down took %v", opened)
	if opened > 5*time.Second {
		t.Fatalf("Open took %v with the invalidator down", opened)
	}
	read := func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, c, 0) }
	runReads(t, 1, 3, s.pgBalances(t), newLatencies(), read)

	s.startInvalidator(t)
	started := time.Now()
	for deadline := time.Now().Add(60 * time.Second); c.Stats().NodeHits.Load() == 0 || !keyedOn(t, c, readBalance); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("60 s after the invalidator started: covered %v, %d node hits", c.keying.Load().covered != nil, c.Stats().NodeHits.Load())
		}
		runReads(t, 1, 1, s.pgBalances(t), newLatencies(), read)
	}
	t.Logf("tag sets and a node hit %v after the invalidator started", time.Since(started))
}

// keyedOn reports whether c keys sql (given 1) on a tag column set rather
// than its table.
func keyedOn(t *testing.T, c *Client, sql string) bool {
	t.Helper()
	k := c.keying.Load()
	tpl, err := k.analyzer(c.poolScope.Load().path).Prepare(sql)
	if err != nil {
		t.Fatal(err)
	}
	tags, err := tpl.Tags([]any{1})
	if err != nil {
		t.Fatal(err)
	}
	return k.covered != nil && len(tags) == 1 && !tags[0].IsTable()
}

// The client asks for the tag sets again when the invalidator restarts:
// here with more of them.
func TestTagSetsFollowInvalidatorRestart(t *testing.T) {
	const byVer = "SELECT id FROM accounts WHERE ver = $1"
	s := startStackWith(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES (1, 100), (2, 100), (3, 100), (4, 100)", readBalance, byVer)
	c := s.openWith(t, []string{s.node}, 0, true, func(c *Config) { c.NoRegisterTagSets = true })
	ctx := context.Background()
	read := func(ctx context.Context) (map[int]int, error) { return roBalances(ctx, c, 0) }
	for deadline := time.Now().Add(30 * time.Second); !keyedOn(t, c, readBalance); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no tag sets 30 s after the start")
		}
	}
	if keyedOn(t, c, byVer) {
		t.Fatal("keyed on accounts(ver), which the invalidator does not publish")
	}

	// It restarts publishing the QUMA file's sets, accounts(ver) among them.
	s.stopInvalidator()
	s.invOpts.QUMA = s.quma
	s.startInvalidator(t)
	restarted := time.Now()
	for deadline := time.Now().Add(60 * time.Second); !keyedOn(t, c, byVer); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the client did not pick up the restarted invalidator's tag sets in 60 s")
		}
	}
	t.Logf("the restarted invalidator's tag sets picked up after %v", time.Since(restarted))
	runReads(t, 1, 5, s.pgBalances(t), newLatencies(), read)
	var id int
	tx, err := c.BeginRO(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Commit(ctx)
	if err := tx.QueryRow(ctx, byVer, []any{0}, &id); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
}

// A read-only transaction running uncached on a fresh snapshot (here: NATS
// is down, so no pin) whose statement's result type a schema change
// replaced gets ErrRetry, not PostgreSQL's "cached plan must not change
// result type": its snapshot cannot be taken again, and the retry reads
// the new type.
func TestFallbackSchemaChangeAsksForRetry(t *testing.T) {
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	natsOverride = fmt.Sprintf("nats://127.0.0.1:%d", port) // nothing listens
	s := prepareStack(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES (1, 100), (2, 100)", readBalance)
	natsOverride = ""
	c := s.openWith(t, nil, 0, false, nil)
	ctx := context.Background()
	read := func() (int64, error) {
		tx, err := c.BeginRO(ctx, 0)
		if err != nil {
			return 0, err
		}
		defer tx.Commit(ctx)
		var b int64
		err = tx.QueryRow(ctx, readBalance, []any{1}, &b)
		return b, err
	}
	// Every pooled connection prepares the statement (as int).
	for range 20 {
		if b, err := read(); err != nil || b != 100 {
			t.Fatalf("before the change: %d, %v", b, err)
		}
	}
	if c.Stats().Fallbacks.Load() < 20 {
		t.Fatalf("%d fallbacks for 20 transactions without NATS", c.Stats().Fallbacks.Load())
	}
	if _, err := s.conn.Exec(ctx, "ALTER TABLE accounts ALTER COLUMN balance TYPE bigint USING balance * 10"); err != nil {
		t.Fatal(err)
	}
	retries := 0
	for i := 0; i < 20; i++ {
		b, err := read()
		switch {
		case errors.Is(err, ErrRetry):
			retries++
		case err != nil:
			t.Fatalf("after the change, read %d: %v (want ErrRetry or the new value)", i, err)
		case b != 1000:
			t.Fatalf("after the change, read %d: %d, want 1000", i, b)
		}
	}
	if retries == 0 {
		t.Fatal("no transaction met the replaced result type: the test did not exercise the case")
	}
	t.Logf("%d of 20 transactions asked for a retry", retries)
}

// A transaction whose every pin is gone before it read anything takes a
// fresh snapshot at its first read; until the pincushion places it, that
// read runs on PostgreSQL uncached (not put at a timestamp it does not
// have), and later reads go through the caches at the timestamp it gets.
func TestFreshSnapshotAfterEveryPinIsGone(t *testing.T) {
	s := startStack(t)
	c := s.openWith(t, []string{s.node}, 8<<20, true, nil)
	ctx := context.Background()
	want := s.pgBalances(t)
	tx, err := c.BeginRO(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(tx.cands) == 0 || tx.placing != nil {
		t.Fatal("the transaction did not begin at pins")
	}
	for i := range tx.cands {
		tx.cands[i].SnapshotID = "7FFFFFFF-7FFFFFFF-1" // a snapshot PostgreSQL does not know
	}
	unplaced := c.Stats().UnplacedReads.Load()
	var bal int
	if err := tx.QueryRow(ctx, readBalance, []any{1}, &bal); err != nil {
		t.Fatal(err)
	}
	if bal != want[1] {
		t.Fatalf("balance %d, PostgreSQL has %d", bal, want[1])
	}
	if c.Stats().UnplacedReads.Load() == unplaced {
		t.Fatalf("the read after every pin was gone is not counted as a read before placement: %v", tx.trace)
	}
	if !tx.Placed() || tx.Timestamp() == 0 {
		t.Fatalf("the fresh snapshot was not placed (timestamp %d)", tx.Timestamp())
	}
	if err := tx.QueryRow(ctx, readBalance, []any{2}, &bal); err != nil {
		t.Fatal(err)
	}
	if bal != want[2] {
		t.Fatalf("balance %d, PostgreSQL has %d", bal, want[2])
	}
	if last := tx.trace[len(tx.trace)-1]; !strings.HasPrefix(last, "l1[") && !strings.HasPrefix(last, "node[") && !strings.HasPrefix(last, "db@") {
		t.Fatalf("the read after placement did not go through the caches at its timestamp: %v", tx.trace)
	}
	_ = tx.Commit(ctx)
}

// Through database/sql, with larder.fresh-read-wait=0s: each read-only
// transaction right after a write reads before its fresh snapshot is
// placed, and still sees the write; with the default wait, the reads wait
// for the placement instead.
func TestFreshReadWaitThroughDatabaseSQL(t *testing.T) {
	s := startStack(t)
	ctx := context.Background()
	// Each placement takes at least 100 ms: a read that does not wait for
	// it always runs before it, whatever the machine's speed.
	placementDelayForTest.Store(int64(100 * time.Millisecond))
	defer placementDelayForTest.Store(0)
	for _, c := range []struct {
		param    string
		unplaced bool // reads before placement expected
	}{{"larder.fresh-read-wait=0s", true}, {"larder.fresh-read-wait=1s", false}} {
		dsn := s.dsn("larder.l1=1048576", c.param)
		db := openDB(t, DriverName, dsn)
		if err := db.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		// Until the driver's client has seen a pin lately (a loaded
		// machine may take a while), a transaction after a write finds
		// no one placing and reads uncached: nothing this test is about.
		cl := driverClient(dsn)
		for deadline := time.Now().Add(30 * time.Second); cl == nil || !cl.pins.placing(time.Now()); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the driver's client saw no pin placed in 30 s", c.param)
			}
			cl = driverClient(dsn)
		}
		for i := 1; i <= 20; i++ {
			if _, err := db.ExecContext(ctx, "UPDATE accounts SET balance = $1 WHERE id = 3", 1000+i); err != nil {
				t.Fatal(err)
			}
			tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			var bal int
			if err := tx.QueryRowContext(ctx, readBalance, 3).Scan(&bal); err != nil {
				t.Fatal(err)
			}
			_ = tx.Commit()
			if bal != 1000+i {
				t.Fatalf("%s: read %d right after writing %d", c.param, bal, 1000+i)
			}
		}
		st, ok := DriverStats(dsn)
		if !ok {
			t.Fatalf("%s: no driver statistics", c.param)
		}
		if n := st.UnplacedReads.Load(); (n > 0) != c.unplaced {
			t.Fatalf("%s: %d reads before placement in 20 reads right after writes", c.param, n)
		}
		t.Logf("%s: %d reads before placement, %d fresh snapshots placed", c.param, st.UnplacedReads.Load(), st.NowSnapshots.Load())
	}
}
