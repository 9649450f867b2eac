package larder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/larderdb/larder/cache-node/daemon"
	"github.com/larderdb/larder/internal/history"
	"github.com/larderdb/larder/internal/servers"
	"github.com/larderdb/larder/internal/testenv"
	"github.com/larderdb/larder/invalidator/service"
	"github.com/larderdb/larder/qumaana/quma"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true, Redis: true}, &env))
}

const accounts = 4
const total = 100 * accounts

const schemaSQL = `CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, ver int NOT NULL DEFAULT 0);
ALTER TABLE accounts REPLICA IDENTITY FULL;`

const readBalance = "SELECT balance FROM accounts WHERE id = $1"
const readBalanceVer = "SELECT balance, ver FROM accounts WHERE id = $1"

// readRange reads accounts 1 to $1 in one result, which splits by rows.
const readRange = "SELECT id, balance, ver FROM accounts WHERE id <= $1 ORDER BY id"

// readRangeStar is readRange through a star (accounts' columns are id,
// balance, ver).
const readRangeStar = "SELECT * FROM accounts WHERE id <= $1 ORDER BY id"

var stackSeq atomic.Int64

// natsOverride, when set, is the NATS server the next stack uses;
// nodeOverride, when set, is how its cache-node runs.
var (
	natsOverride string
	nodeOverride *nodeSetup
)

// nodeSetup is how a stack runs its cache-node: through another NATS URL
// than the stack's (a proxy), on another store than memory, or in the
// test's process where a fault can stop it without a graceful shutdown.
type nodeSetup struct {
	nats      string // "" for the stack's
	store     string // "" for memory, or a redis:// URL
	killable  bool   // run in the test (startRawNode), with a kill
	reconnect time.Duration
}

// stack is PostgreSQL, the invalidator with its pincushion and a
// cache-node, all real, and a QUMA file for the accounts schema.
type stack struct {
	url, prefix, quma, node string
	nats                    string // NATS URL
	conn                    *pgx.Conn
	invOpts                 service.Options
	stopInvalidator         func()
	stopNode                func()
	killNode                func() // a killable node's stop without shutdown
	setup                   nodeSetup
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func (s *stack) startInvalidator(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, s.invOpts, quiet) }()
	var once sync.Once
	s.stopInvalidator = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("invalidator: %v", err)
			}
		})
	}
}

// dropSlot drops a replication slot once the walsender of a stopped
// invalidator has let go of it.
func (s *stack) dropSlot(slot string) error {
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var active bool
		err := s.conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // stopped before it made its slot
		}
		if err != nil {
			return fmt.Errorf("slot %s: %w", slot, err)
		}
		if !active {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slot %s is still active 30 s after its invalidator stopped", slot)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := s.conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
		return fmt.Errorf("drop slot %s: %w", slot, err)
	}
	return nil
}

// startNode runs the cache-node on addr ("127.0.0.1:0" picks a port).
func (s *stack) startNode(t testing.TB, addr string) {
	if s.setup.killable {
		s.startRawNode(t, addr)
		return
	}
	natsURL, storeURL := s.nats, "memory"
	if s.setup.nats != "" {
		natsURL = s.setup.nats
	}
	if s.setup.store != "" {
		storeURL = s.setup.store
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, daemon.Options{Listen: addr, NATS: natsURL, Prefix: s.prefix, Store: storeURL, Memory: 64 << 20}, quiet, ready)
	}()
	select {
	case s.node = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("cache-node: %v", err)
	}
	s.stopNode = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("cache-node: %v", err)
		}
	}
}

func startStack(t testing.TB) *stack {
	t.Helper()
	values := make([]string, accounts)
	for i := range values {
		values[i] = fmt.Sprintf("(%d, 100)", i+1)
	}
	return startStackWith(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES "+strings.Join(values, ","),
		readBalance, readBalanceVer, "UPDATE accounts SET balance = balance - $1, ver = ver + 1 WHERE id = $2")
}

// startStackWith starts a stack on a database made by ddl and seed, with
// a QUMA file analyzed from ddl and the templates.
func startStackWith(t testing.TB, ddl, seed string, templates ...string) *stack {
	t.Helper()
	s := prepareStack(t, ddl, seed, templates...)
	s.startInvalidator(t)
	s.startNode(t, "127.0.0.1:0")
	return s
}

// prepareStack is startStackWith without starting the invalidator and the
// cache-node.
func prepareStack(t testing.TB, ddl, seed string, templates ...string) *stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &stack{url: testenv.Database(t, env.PG), prefix: fmt.Sprintf("cl%d", stackSeq.Add(1)), nats: env.NATS.URL(),
		stopInvalidator: func() {}, stopNode: func() {}}
	if natsOverride != "" {
		s.nats = natsOverride
	}
	if nodeOverride != nil {
		s.setup = *nodeOverride
	}
	var err error
	if s.conn, err = pgx.Connect(ctx, s.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.conn.Close(context.Background()) })
	if _, err := s.conn.Exec(ctx, ddl+";"+seed); err != nil {
		t.Fatal(err)
	}
	s.quma = filepath.Join(t.TempDir(), "quma.json")
	writeQUMA(t, s.quma, ddl, templates...)

	s.invOpts = service.Defaults()
	o := &s.invOpts
	o.PG, o.NATS, o.Prefix, o.Slot, o.Publication, o.Metrics = s.url, s.nats, s.prefix, s.prefix, s.prefix, ""
	o.Heartbeat, o.PinInterval, o.MaxStaleness = 20*time.Millisecond, 100*time.Millisecond, 10*time.Second
	t.Cleanup(func() {
		cancel()
		s.stopInvalidator()
		s.stopNode()
	})
	return s
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

func (s *stack) client(t *testing.T, l1 int64) *Client {
	return s.clientAs(t, s.url, l1)
}

func (s *stack) clientAs(t *testing.T, pgURL string, l1 int64) *Client {
	return s.open(t, pgURL, []string{s.node}, l1)
}

func startStackB(b *testing.B) *stack { return startStack(b) }

func (s *stack) clientB(b *testing.B, nodes []string, l1 int64) *Client {
	return s.open(b, s.url, nodes, l1)
}

func (s *stack) open(t testing.TB, pgURL string, nodes []string, l1 int64) *Client {
	t.Helper()
	return s.openConfig(t, pgURL, nodes, l1, nil)
}

// openConfig opens a client as open does, with the config changed by
// adjust (when not nil) first.
func (s *stack) openConfig(t testing.TB, pgURL string, nodes []string, l1 int64, adjust func(*Config)) *Client {
	t.Helper()
	cfg := Config{PostgresURL: pgURL, NATSURL: s.nats, Prefix: s.prefix, Nodes: nodes, QUMA: s.quma, Staleness: 3 * time.Second, L1Bytes: l1}
	if adjust != nil {
		adjust(&cfg)
	}
	c, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// Wait for pins and for the invalidator's tag sets.
	for deadline := time.Now().Add(30 * time.Second); len(c.pins.candidates(time.Now().Add(-time.Minute), 0)) == 0 || c.keying.Load().covered == nil; {
		if time.Now().After(deadline) {
			t.Fatal("no pins or no tag sets")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// readInt reads one integer in a read-only transaction of c.
func readInt(t *testing.T, ctx context.Context, c *Client, staleness time.Duration, sql string, args ...any) int {
	t.Helper()
	tx, err := c.BeginRO(ctx, staleness)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Commit(ctx)
	var n int
	if err := tx.QueryRow(ctx, sql, args, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestReadsHitTheCacheAndSeeTheirWrites(t *testing.T) {
	s := startStack(t)
	c := s.client(t, 8<<20)
	ctx := context.Background()
	read := func() int { t.Helper(); return readInt(t, ctx, c, 0, readBalance, 1) }
	if b := read(); b != 100 {
		t.Fatalf("balance %d", b)
	}
	// Later transactions find it in the L1 or on the node.
	for deadline := time.Now().Add(20 * time.Second); c.Stats().NodeHits.Load()+c.Stats().L1Hits.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("never a hit: %d misses", c.Stats().Misses.Load())
		}
		if b := read(); b != 100 {
			t.Fatalf("balance %d", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Read your writes.
	rw, err := c.BeginRW(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(ctx, "UPDATE accounts SET balance = balance + 7 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	if err := rw.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if b := read(); b != 107 {
		t.Fatalf("after my own write the balance is %d, want 107", b)
	}
}

// TestSnapshotConsistencyUnderConcurrentTransfers: writers move money
// between accounts directly on PostgreSQL (not through Larder); readers
// read every balance in one read-only transaction, each balance by its own
// cached query, and the sum must always be the total — it would not be if
// any two results came from different snapshots.
func TestSnapshotConsistencyUnderConcurrentTransfers(t *testing.T) {
	for _, c := range []struct {
		name   string
		broken bool // a client that ignores validity intervals
		rows   bool // one whose split results hold no row tags
		l1     int64
	}{{"broken=false,L1=8388608", false, false, 8 << 20}, {"broken=false,L1=0", false, false, 0},
		{"broken=true,L1=8388608", true, false, 8 << 20}, {"broken=rows,L1=0", false, true, 0}} {
		broken := c.broken || c.rows
		t.Run(c.name, func(t *testing.T) {
			skipNarrowForTest, dropRowTagsForTest = c.broken, c.rows
			defer func() { skipNarrowForTest, dropRowTagsForTest = false, false }()
			violations, reads := transfersAndReads(t, c.l1)
			if broken && len(violations) == 0 {
				t.Fatalf("a client that ignores validity intervals passed %d transactions: the checker cannot fail", reads)
			}
			if !broken {
				noViolations(t, violations, reads)
			}
			t.Logf("%d violations reported", len(violations))
		})
	}
}

// With reads that never wait for a fresh snapshot's placement, the
// transactions right after their session's writes read on PostgreSQL
// before placement and through the caches after: the history must hold
// as well.
func TestSnapshotConsistencyReadsBeforePlacement(t *testing.T) {
	c, reads := historyWithConfig(t, func(cfg *Config) { cfg.FreshReadWait = -1 })
	if n := c.Stats().UnplacedReads.Load(); n == 0 {
		t.Fatal("no read ran before its fresh snapshot was placed: that path went unchecked")
	} else {
		t.Logf("0 violations in %d read-only transactions, %d reads before placement", reads, n)
	}
}

// With its L1 on one broadcast subscription (larder.l1-broadcast), the
// L1 receives every invalidation and drops those of groups it does not
// hold: the history must hold as with a subscription per group, under
// the same faults (the cache-node, the invalidator and NATS restart).
func TestSnapshotConsistencyL1Broadcast(t *testing.T) {
	c, reads := historyWithConfig(t, func(cfg *Config) { cfg.L1Broadcast = true })
	if n := c.Stats().L1Hits.Load(); n == 0 {
		t.Fatal("no L1 hit: the broadcast L1 went unchecked")
	} else {
		t.Logf("0 violations in %d read-only transactions, %d L1 hits", reads, n)
	}
}

// historyWithConfig runs the history check (transfers under faults, an L1
// of 8 MiB before the cache-node) with a client whose configuration
// configure changes, fails on any violation, and returns the client and
// the number of read-only transactions checked.
func historyWithConfig(t *testing.T, configure func(*Config)) (*Client, int64) {
	var c *Client
	violations, reads := transfersAndReadsWith(t, 8<<20, historyRun{client: func(t *testing.T, s *stack, l1 int64) *Client {
		c = s.openWith(t, []string{s.node}, l1, true, configure)
		return c
	}})
	noViolations(t, violations, reads)
	return c, reads
}

// TestSnapshotConsistencyL1WithAPeer: another application server's
// results reach the client's L1 as the cache-node's hits, which the L1
// then follows and serves at later timestamps (keepNodeHit): the history
// must hold for both servers' reads.
func TestSnapshotConsistencyL1WithAPeer(t *testing.T) {
	var c *Client
	violations, reads := transfersAndReadsWith(t, 8<<20, historyRun{
		client: func(t *testing.T, s *stack, l1 int64) *Client {
			c = s.client(t, l1)
			return c
		},
		peer: func(t *testing.T, s *stack) *Client { return s.client(t, 0) },
	})
	noViolations(t, violations, reads)
	st := c.Stats()
	if st.NodeHits.Load() == 0 || st.L1Hits.Load() == 0 {
		t.Fatalf("%d node hits and %d L1 hits: the L1 fed by the node went unchecked", st.NodeHits.Load(), st.L1Hits.Load())
	}
	t.Logf("0 violations in %d read-only transactions; the L1 client: %d node hits, %d L1 hits", reads, st.NodeHits.Load(), st.L1Hits.Load())
}

// noViolations fails the test, logging the first five, when the history
// check found violations in reads read-only transactions.
func noViolations(t *testing.T, violations []history.Violation, reads int64) {
	t.Helper()
	for i, v := range violations {
		if i < 5 {
			t.Log(v)
		}
	}
	if len(violations) > 0 {
		t.Fatalf("%d violations in %d read-only transactions", len(violations), reads)
	}
}

func transfersAndReads(t *testing.T, l1 int64) ([]history.Violation, int64) {
	return transfersAndReadsWith(t, l1, historyRun{})
}

// historyRun varies transfersAndReads: how the cache-node runs (node, given
// the URL of the test's NATS server) and the faults injected while the
// test runs (faults; by default the cache-node, the invalidator and NATS
// restart in turn).
type historyRun struct {
	node   func(t *testing.T, natsURL string) nodeSetup
	faults func(ctx context.Context, t *testing.T, s *stack, run time.Duration)
	run    time.Duration // default 3s, or LARDER_HISTORY_SECONDS
	// client, when set, opens the readers' client (by default s.client,
	// on the stack's cache-node).
	client func(t *testing.T, s *stack, l1 int64) *Client
	// peer, when set, opens a second application server's client on the
	// same cache-node: one of the three readers reads through it (its
	// results reach the first client's L1 as the node's hits).
	peer func(t *testing.T, s *stack) *Client
}

// transferUntil moves random amounts between random accounts on
// PostgreSQL, one transfer at a time with pauses of up to 4 ms, until ctx
// ends, counting them in transfers.
func transferUntil(ctx context.Context, t *testing.T, pgURL string, seed int64, transfers *atomic.Int64) {
	r := rand.New(rand.NewSource(seed))
	bg := context.Background()
	conn, err := pgx.Connect(bg, pgURL)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close(bg)
	for ctx.Err() == nil {
		a, b, amt := 1+r.Intn(accounts), 1+r.Intn(accounts), 1+r.Intn(10)
		if a > b {
			a, b, amt = b, a, -amt // lock rows in id order: no deadlocks
		}
		err := pgx.BeginFunc(bg, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(bg, "UPDATE accounts SET balance = balance - $1, ver = ver + 1 WHERE id = $2", amt, a); err != nil {
				return err
			}
			_, err := tx.Exec(bg, "UPDATE accounts SET balance = balance + $1, ver = ver + 1 WHERE id = $2", amt, b)
			return err
		})
		if err != nil {
			t.Error(err)
			return
		}
		transfers.Add(1)
		time.Sleep(time.Duration(r.Intn(5)) * time.Millisecond)
	}
}

// pause waits d, or less if ctx ends first (then it reports false).
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func transfersAndReadsWith(t *testing.T, l1 int64, hr historyRun) ([]history.Violation, int64) {
	// A NATS server of the test's own, so that it can restart.
	natsCfg := servers.DefaultNATSConfig(filepath.Join(t.TempDir(), "nats"))
	ns, err := servers.StartNATS(context.Background(), natsCfg)
	if err != nil {
		t.Fatal(err)
	}
	natsCfg.Port = ns.Port()
	var nsMu sync.Mutex
	defer func() { nsMu.Lock(); _ = ns.Close(); nsMu.Unlock() }()
	natsOverride = ns.URL()
	if hr.node != nil {
		setup := hr.node(t, ns.URL())
		nodeOverride = &setup
	}
	s := startStack(t)
	natsOverride, nodeOverride = "", nil
	var c *Client
	if hr.client != nil {
		c = hr.client(t, s, l1)
	} else {
		c = s.client(t, l1)
	}
	readerClient := func(int) *Client { return c }
	if hr.peer != nil {
		peer := hr.peer(t, s)
		readerClient = func(rd int) *Client {
			if rd == 2 {
				return peer
			}
			return c
		}
	}
	rec, err := history.StartRecorder(context.Background(), s.url, "accounts")
	if err != nil {
		t.Fatal(err)
	}
	run := 3 * time.Second
	if hr.run > 0 {
		run = hr.run
	}
	if v := os.Getenv("LARDER_HISTORY_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("LARDER_HISTORY_SECONDS=%q: want seconds", v)
		}
		run = time.Duration(n) * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	var wg sync.WaitGroup
	var transfers atomic.Int64
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			transferUntil(ctx, t, s.url, seed, &transfers)
		}(int64(w))
	}
	// Faults: the cache-node restarts (losing everything) and the
	// invalidator restarts (dropping every pin) while the test runs.
	wg.Add(1)
	go func() {
		defer wg.Done()
		if hr.faults != nil {
			hr.faults(ctx, t, s, run)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(run / 4):
		}
		t.Logf("fault: cache-node restarts at WAL %s", walNow(t, s))
		s.stopNode()
		s.startNode(t, s.node)
		select {
		case <-ctx.Done():
			return
		case <-time.After(run / 4):
		}
		t.Logf("fault: invalidator restarts at WAL %s", walNow(t, s))
		s.stopInvalidator()
		s.startInvalidator(t)
		select {
		case <-ctx.Done():
			return
		case <-time.After(run / 4):
		}
		t.Logf("fault: NATS restarts at WAL %s", walNow(t, s))
		nsMu.Lock()
		_ = ns.Close()
		ns, err = servers.StartNATS(context.Background(), natsCfg)
		nsMu.Unlock()
		if err != nil {
			t.Errorf("restart NATS: %v", err)
		}
	}()
	var reads, retries, functionReads atomic.Int64
	var txMu sync.Mutex
	var txs []history.ReadTx
	// A cacheable function reading several rows (and one calling it):
	// their entries must equal one snapshot as the queries' do.
	rowsOf := NewFunction("history-rows", func(ctx context.Context, tx *ROTx, ids []int) (map[int]history.Row, error) {
		out := map[int]history.Row{}
		for _, id := range ids {
			var row history.Row
			if err := tx.QueryRow(ctx, readBalanceVer, []any{id}, &row.Balance, &row.Ver); err != nil {
				return nil, err
			}
			out[id] = row
		}
		return out, nil
	})
	pairOf := NewFunction("history-pair", func(ctx context.Context, tx *ROTx, ids [2]int) (map[int]history.Row, error) {
		return rowsOf.Call(ctx, tx, ids[:])
	})
	// One reading a range in one result, split by rows: the function's
	// entry holds the split tags.
	rangeOf := NewFunction("history-range", func(ctx context.Context, tx *ROTx, n int) (map[int]history.Row, error) {
		rows, err := tx.Query(ctx, readRange, n)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[int]history.Row{}
		for rows.Next() {
			var id int
			var row history.Row
			if err := rows.Scan(&id, &row.Balance, &row.Ver); err != nil {
				return nil, err
			}
			out[id] = row
		}
		return out, rows.Err()
	})
	subsets := [][]int{{1, 2}, {2, 3, 4}, {1, 2, 3, 4}, {4, 1}}
	for rd := 0; rd < 3; rd++ {
		wg.Add(1)
		c := readerClient(rd)
		go func(seed int64) {
			defer wg.Done()
			r := rand.New(rand.NewSource(seed))
			for ctx.Err() == nil {
				staleness := time.Duration(200+r.Intn(2000)) * time.Millisecond
				if r.Intn(10) == 0 {
					staleness = time.Millisecond // no pin is that fresh: a snapshot taken now
				}
				begin := time.Now()
				tx, err := c.BeginRO(context.Background(), staleness)
				if err != nil {
					t.Error(err)
					return
				}
				rt := history.ReadTx{Begin: begin, Staleness: staleness, Reads: map[int]history.Row{}}
				var order0 []int
				// All accounts or a random subset, in random order.
				order := r.Perm(accounts)
				if r.Intn(2) == 0 {
					order = order[:1+r.Intn(accounts)]
				}
				var rerr error
				if r.Intn(4) == 0 {
					// A range of accounts in one result, split by rows
					// (quma.RowSplit): transfers change the rows it
					// shows, never which rows it holds.
					n := 1 + r.Intn(accounts)
					// Then the accounts past the range, one by one: a
					// transaction mixing a range and rows shows both a
					// range out of step with the rows and hits that do
					// not narrow (broken=true).
					order = slices.DeleteFunc(order, func(i int) bool { return i+1 <= n })
					var rows *Rows
					sql := readRange
					if r.Intn(2) == 0 {
						sql = readRangeStar
					}
					if rows, rerr = tx.Query(context.Background(), sql, n); rerr == nil {
						for rows.Next() {
							var id int
							var row history.Row
							dest := []any{&id, &row.Balance, &row.Ver}
							for range len(rows.FieldDescriptions()) - len(dest) {
								dest = append(dest, new(any)) // a column added mid-run (ddl-mid-run)
							}
							if rerr = rows.Scan(dest...); rerr != nil {
								break
							}
							rt.Reads[id] = row
							order0 = append(order0, 100+id)
						}
						if rerr == nil {
							rerr = rows.Err()
						}
						rows.Close()
					}
					if rerr == nil && len(rt.Reads) != n {
						t.Errorf("%s with $1 = %d: %d rows", sql, n, len(rt.Reads))
					}
				} else if r.Intn(3) == 0 {
					// Through the cacheable functions, then maybe a row.
					var m map[int]history.Row
					switch r.Intn(3) {
					case 0:
						m, rerr = rowsOf.Call(context.Background(), tx, subsets[r.Intn(len(subsets))])
					case 1:
						m, rerr = pairOf.Call(context.Background(), tx, [2]int{1 + r.Intn(2), 3 + r.Intn(2)})
					default:
						m, rerr = rangeOf.Call(context.Background(), tx, 1+r.Intn(accounts))
					}
					for id, row := range m {
						rt.Reads[id] = row
						order0 = append(order0, -id)
					}
					if rerr == nil {
						functionReads.Add(1)
					}
					order = order[:r.Intn(2)]
				}
				for _, i := range order {
					if rerr != nil {
						break
					}
					var row history.Row
					if rerr = tx.QueryRow(context.Background(), readBalanceVer, []any{i + 1}, &row.Balance, &row.Ver); rerr != nil {
						break
					}
					rt.Reads[i+1] = row
					order0 = append(order0, i+1)
				}
				rt.Note = fmt.Sprintf("rows %v: %v", order0, tx.trace)
				rt.Unplaced = !tx.Placed()
				_ = tx.Commit(context.Background())
				if errors.Is(rerr, ErrRetry) {
					retries.Add(1)
					continue
				}
				if rerr != nil {
					t.Error(rerr)
					return
				}
				reads.Add(1)
				txMu.Lock()
				txs = append(txs, rt)
				txMu.Unlock()
			}
		}(int64(10 + rd))
	}
	wg.Wait()
	st := c.Stats()
	fnHits := testutil.ToFloat64(c.m.functionCalls.WithLabelValues("l1")) + testutil.ToFloat64(c.m.functionCalls.WithLabelValues("node"))
	t.Logf("%d transfers, %d read-only transactions (%d retried, %d at fresh snapshots, %d through cacheable functions, %.0f function hits): %d L1 hits, %d node hits, %d misses, %d fallbacks",
		transfers.Load(), reads.Load(), retries.Load(), st.NowSnapshots.Load(), functionReads.Load(), fnHits, st.L1Hits.Load(), st.NodeHits.Load(), st.Misses.Load(), st.Fallbacks.Load())
	if functionReads.Load() > 100 && fnHits == 0 {
		t.Error("the cacheable functions were never served from the cache: that path went unchecked")
	}
	if st.NowSnapshots.Load() == 0 {
		t.Error("no transaction ran at a fresh snapshot: that path went unchecked")
	}
	c.placements.Wait() // placements whose transactions ended first
	var placed dto.Metric
	if err := c.m.freshWaits.WithLabelValues("placed").(prometheus.Metric).Write(&placed); err != nil {
		t.Fatal(err)
	}
	if got := placed.GetHistogram().GetSampleCount(); got != uint64(st.NowSnapshots.Load()) || st.FreshWaitNanos.Load() <= 0 {
		t.Errorf("larder_client_fresh_snapshot_seconds{outcome=placed} counts %d tries (%s in all), for %d transactions at fresh snapshots",
			got, time.Duration(st.FreshWaitNanos.Load()), st.NowSnapshots.Load())
	}
	if st.L1Hits.Load()+st.NodeHits.Load() == 0 || transfers.Load() == 0 {
		t.Fatal("the cache was never hit or nothing was written: the test proves nothing")
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer fcancel()
	log, err := rec.Finish(fctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("history: %d commits decoded, %d read-only transactions checked", len(log.Commits), len(txs))
	return history.Check(log, txs, total, 50*time.Millisecond), reads.Load()
}

// A dead cache-node costs speed, never correctness or an error.
func TestDeadNodeDegradesToDatabase(t *testing.T) {
	s := startStack(t)
	s.client(t, 0)         // waits for pins
	s.node = "127.0.0.1:1" // nothing listens there
	c := s.client(t, 0)
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		tx, err := c.BeginRO(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		var b int
		if err := tx.QueryRow(ctx, readBalance, []any{3}, &b); err != nil {
			t.Fatalf("a dead node made the read fail: %v", err)
		}
		_ = tx.Commit(ctx)
		if b != 100 {
			t.Fatalf("balance %d", b)
		}
	}
	if c.Stats().NodeErrors.Load() == 0 || c.Stats().Misses.Load() != 5 {
		t.Fatalf("node errors %d, misses %d", c.Stats().NodeErrors.Load(), c.Stats().Misses.Load())
	}
}

func walNow(t *testing.T, s *stack) string {
	conn, err := pgx.Connect(context.Background(), s.url)
	if err != nil {
		return err.Error()
	}
	defer conn.Close(context.Background())
	var lsn string
	if err := conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return err.Error()
	}
	return lsn
}

// NATS going away costs the cache, never correctness or an error: pins
// stop, fresh snapshots cannot be placed, transactions fall back to
// PostgreSQL snapshots.
func TestNATSGoneDegradesToDatabase(t *testing.T) {
	n := testenv.NATS(t)
	natsOverride = n.URL()
	s := startStack(t)
	natsOverride = ""
	c := s.client(t, 0)
	ctx := context.Background()
	read := func(id int) int {
		t.Helper()
		tx, err := c.BeginRO(ctx, time.Millisecond) // no pin is this fresh
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		defer tx.Commit(ctx)
		var b int
		if err := tx.QueryRow(ctx, readBalance, []any{id}, &b); err != nil {
			t.Fatalf("read: %v", err)
		}
		return b
	}
	if b := read(1); b != 100 {
		t.Fatalf("balance %d", b)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	before := c.Stats().Fallbacks.Load()
	rw, err := c.BeginRW(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	if err := rw.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if b := read(2); b != 101 {
			t.Fatalf("with NATS gone, balance %d, want 101", b)
		}
	}
	if c.Stats().Fallbacks.Load() == before {
		t.Fatal("no fallback counted with NATS gone")
	}
}

// Errors are typed and wrap PostgreSQL's.
func TestErrorsWrapPostgres(t *testing.T) {
	s := startStack(t)
	c := s.client(t, 0)
	ctx := context.Background()
	tx, err := c.BeginRO(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Commit(ctx)
	_, err = tx.Query(ctx, "SELECT nosuchcolumn FROM accounts")
	var le *Error
	if !errors.As(err, &le) || le.Op != "query" {
		t.Fatalf("want a *larder.Error, got %T %v", err, err)
	}
	if pe, ok := PgError(err); !ok || pe.Code != "42703" {
		t.Fatalf("want PostgreSQL's undefined_column behind it, got %v", err)
	}
}

// A tag column set the invalidator does not publish is never keyed on:
// the client asks the invalidator which sets it publishes (see
// tagsets_test.go for sets registered at run time).
func TestOnlyPublishedTagSetsAreUsed(t *testing.T) {
	const byVer = "SELECT id FROM accounts WHERE ver = $1"
	s := startStackWith(t, schemaSQL, "INSERT INTO accounts (id, balance) VALUES (1, 100)", readBalance, byVer)
	// The QUMA file keys byVer on accounts(ver); the invalidator, started
	// without it, publishes the primary key only, and the client does not
	// register the set.
	c := s.openWith(t, []string{s.node}, 0, true, func(c *Config) { c.NoRegisterTagSets = true })
	for _, c2 := range []struct {
		sql   string
		keyed bool
	}{{readBalance, true}, {byVer, false}} {
		tpl, err := c.keying.Load().analyzer(c.poolScope.Load().path).Prepare(c2.sql)
		if err != nil {
			t.Fatal(err)
		}
		tags, err := tpl.Tags([]any{1})
		if err != nil {
			t.Fatal(err)
		}
		if keyed := len(tags) == 1 && !tags[0].IsTable(); keyed != c2.keyed {
			t.Errorf("%s: tags %v; keyed %v, want %v", c2.sql, tags, keyed, c2.keyed)
		}
	}
}
