package larder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/qumaana/quma"
)

// Config configures a Client.
type Config struct {
	PostgresURL string
	NATSURL     string
	Prefix      string   // NATS subject prefix (the invalidator's); default "larder"
	Nodes       []string // cache-node addresses; a key lives on one of them
	// QUMA is the qumaana solution file (analyze --format json): the schema
	// and the tag column sets the invalidator publishes.
	QUMA string
	// Staleness is the default staleness limit of read-only transactions.
	Staleness time.Duration
	// L1Bytes is the in-process cache's byte budget (0: no L1).
	L1Bytes int64
	// KeySettings names settings (besides the role and search_path, which
	// always count) whose values change results — row-level-security
	// variables such as app.tenant_id. Their values at connect time go into
	// every key, so a result is never served to a session that could not
	// have read it.
	KeySettings []string
	Log         *slog.Logger
	Metrics     prometheus.Registerer // may be nil
	// IgnoreConsistency is for measurements only (the "no consistency"
	// ablation of the benchmarks): hits do not narrow the transaction's
	// snapshot, so results may mix snapshots within the staleness limit.
	IgnoreConsistency bool
}

// Client is a connection to PostgreSQL through Larder.
type Client struct {
	cfg      Config
	pool     *pgxpool.Pool
	nc       *nats.Conn
	pins     *pinTracker
	nodes    []*protocol.Client
	analyzer *quma.Analyzer
	l1       *store.Memory
	maps     sync.Pool
	puts     sync.WaitGroup

	// minLSN: read-only transactions of this client use timestamps at or
	// after it (read your writes).
	minLSN atomic.Uint64
	stats  Stats
	flight singleflight.Group
	m      *clientMetrics
	// keyScope identifies what changes results besides the query: the
	// role, search_path and KeySettings, as PostgreSQL reports them.
	keyScope string
}

// Stats counts what the client did.
type Stats struct {
	L1Hits, NodeHits, Misses, Uncacheable, Fallbacks, NodeErrors atomic.Int64
	// NowSnapshots counts read-only transactions that found no pin and
	// ran at a fresh snapshot the pincushion placed.
	NowSnapshots atomic.Int64
	// NodeMisses counts the cache-node's misses by class (compulsory,
	// staleness, capacity, consistency; a hit outside the transaction's
	// candidates counts as consistency).
	NodeMisses [5]atomic.Int64
}

func (s *Stats) noteNodeMiss(c store.MissClass) {
	if int(c) < len(s.NodeMisses) {
		s.NodeMisses[c].Add(1)
	}
}

// Open connects to PostgreSQL, NATS and the cache-nodes and loads the
// QUMA file.
func Open(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.PostgresURL == "" || cfg.NATSURL == "" || cfg.QUMA == "" {
		return nil, errors.New("larder: PostgresURL, NATSURL and QUMA are required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = invalidation.DefaultPrefix
	}
	if cfg.Staleness <= 0 {
		cfg.Staleness = 30 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	f, err := os.Open(cfg.QUMA)
	if err != nil {
		return nil, fmt.Errorf("larder: %w", err)
	}
	sol, err := quma.ReadSolution(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("larder: %s: %w", cfg.QUMA, err)
	}
	c := &Client{cfg: cfg, m: newClientMetrics(cfg.Metrics)}
	c.maps.New = func() any { return &pgxTypeMap{pgtype.NewMap()} }
	if cfg.L1Bytes > 0 {
		c.l1 = store.NewMemory(cfg.L1Bytes, nil)
	}
	if c.pool, err = pgxpool.New(ctx, cfg.PostgresURL); err != nil {
		return nil, fmt.Errorf("larder: %w", err)
	}
	if c.keyScope, err = readKeyScope(ctx, c.pool, cfg.KeySettings); err != nil {
		c.pool.Close()
		return nil, err
	}
	if c.nc, err = nats.Connect(cfg.NATSURL, nats.Name("larder-client"), nats.MaxReconnects(-1)); err != nil {
		c.pool.Close()
		return nil, fmt.Errorf("larder: NATS: %w", err)
	}
	if c.pins, err = newPinTracker(ctx, c.nc, cfg.Prefix); err != nil {
		c.Close()
		return nil, err
	}
	c.analyzer = quma.NewAnalyzer(sol.Schema, publishedSets(ctx, c.nc, cfg, sol.TagSets()))
	for _, addr := range cfg.Nodes {
		c.nodes = append(c.nodes, protocol.NewClient(addr, 8))
	}
	return c, nil
}

// publishedSets keeps, of the QUMA file's tag column sets, those the
// invalidator says it publishes: a result keyed on a set it does not
// publish would never be invalidated. When the invalidator cannot be asked,
// no set is kept: every result then depends on table tags, which every
// write publishes.
func publishedSets(ctx context.Context, nc *nats.Conn, cfg Config, want map[string][][]string) map[string][][]string {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var have map[string][][]string
	for rctx.Err() == nil {
		// The invalidator answers once it has read the catalogs: ask again
		// until then.
		actx, acancel := context.WithTimeout(rctx, 250*time.Millisecond)
		msg, err := nc.RequestWithContext(actx, invalidation.TagSetsSubject(cfg.Prefix), nil)
		acancel()
		if err == nil && json.Unmarshal(msg.Data, &have) == nil {
			break
		}
		have = nil
		cfg.Log.Debug("larder: asking the invalidator for its tag column sets", "err", err)
		time.Sleep(50 * time.Millisecond)
	}
	if have == nil {
		cfg.Log.Warn("larder: the invalidator did not say which tag column sets it publishes: caching with table tags only")
		return nil
	}
	out := map[string][][]string{}
	for table, sets := range want {
		for _, set := range sets {
			if containsSet(have[table], set) {
				out[table] = append(out[table], set)
			} else {
				cfg.Log.Warn("larder: the invalidator does not publish this tag column set; results use the table tag instead", "table", table, "columns", strings.Join(set, ","))
			}
		}
	}
	return out
}

func containsSet(sets [][]string, set []string) bool {
	for _, s := range sets {
		if slices.Equal(s, set) {
			return true
		}
	}
	return false
}

// readKeyScope reads the session state that changes results.
func readKeyScope(ctx context.Context, pool *pgxpool.Pool, settings []string) (string, error) {
	var role, path string
	if err := pool.QueryRow(ctx, "SELECT current_user, current_setting('search_path')").Scan(&role, &path); err != nil {
		return "", fmt.Errorf("larder: read the session's role: %w", err)
	}
	scope := "role=" + role + "\x00search_path=" + path
	for _, name := range settings {
		var v *string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1, true)", name).Scan(&v); err != nil {
			return "", fmt.Errorf("larder: read setting %s: %w", name, err)
		}
		val := "<unset>"
		if v != nil {
			val = "=" + *v
		}
		scope += "\x00" + name + val
	}
	return scope, nil
}

// Close waits for pending puts and closes every connection.
func (c *Client) Close() {
	c.puts.Wait()
	for _, n := range c.nodes {
		n.Close()
	}
	if c.pins != nil {
		c.pins.close()
	}
	if c.nc != nil {
		c.nc.Close()
	}
	if c.pool != nil {
		c.pool.Close()
	}
}

// Stats returns the client's counters.
func (c *Client) Stats() *Stats { return &c.stats }

func (c *Client) node(key []byte) *protocol.Client {
	if len(c.nodes) == 0 {
		return nil
	}
	h := fnv.New32a()
	h.Write(key)
	return c.nodes[int(h.Sum32()%uint32(len(c.nodes)))]
}

// BeginRW starts a read/write transaction: straight PostgreSQL. Its
// commit raises this client's minimum timestamp (read your writes).
func (c *Client) BeginRW(ctx context.Context) (*RWTx, error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("larder: %w", err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("larder: %w", err)
	}
	return &RWTx{Tx: tx, conn: conn, c: c}, nil
}

// RWTx is a read/write transaction (a pgx.Tx).
type RWTx struct {
	pgx.Tx
	conn *pgxpool.Conn
	c    *Client
}

// Commit commits and records the commit's WAL position: later read-only
// transactions of the client see this transaction.
func (t *RWTx) Commit(ctx context.Context) error {
	defer t.conn.Release()
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	var s string
	if err := t.conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return fmt.Errorf("larder: committed, but reading the WAL position failed: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return err
	}
	t.c.sawCommit(uint64(lsn))
	return nil
}

// sawCommit raises the minimum timestamp of later read-only transactions.
func (c *Client) sawCommit(lsn uint64) {
	for {
		old := c.minLSN.Load()
		if lsn <= old || c.minLSN.CompareAndSwap(old, lsn) {
			return
		}
	}
}

// Rollback rolls back.
func (t *RWTx) Rollback(ctx context.Context) error {
	defer t.conn.Release()
	return t.Tx.Rollback(ctx)
}

type pgxTypeMap struct{ *pgtype.Map }
