package larder

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	Log     *slog.Logger
	Metrics prometheus.Registerer // may be nil
	// UnsafeIgnoreConsistency is for measurements only (the "no
	// consistency" ablation of the benchmarks): hits do not narrow the
	// transaction's snapshot, so results may mix snapshots within the
	// staleness limit. Never set it for an application.
	UnsafeIgnoreConsistency bool
}

// Client is a connection to PostgreSQL through Larder.
type Client struct {
	cfg   Config
	pool  *pgxpool.Pool
	nc    *nats.Conn
	pins  *pinTracker
	nodes []*protocol.Client
	// keying is the live schema and the invalidator's coverage; epoch
	// counts its reloads (sessions read their scope again after one).
	keying     atomic.Pointer[keying]
	epoch      atomic.Uint64
	fileSchema *quma.Schema
	wantSets   map[string][][]string
	stop       chan struct{}
	bg         sync.WaitGroup
	l1         *store.Memory
	maps       sync.Pool
	puts       sync.WaitGroup

	// own is the client's own session: every write through the client
	// moves it; read-only transactions whose context carries no session
	// belong to it (read your writes).
	own    Session
	stats  Stats
	flight singleflight.Group
	m      *clientMetrics
	// scope reads sessions' scopes (loaded with the catalog); poolScope
	// identifies what changes results besides the query, for the pool's
	// sessions: the roles and every setting (readScope).
	scope     atomic.Pointer[scopeQuery]
	poolScope atomic.Pointer[sessionScope]
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
	sq, err := loadScopeQuery(ctx, c.pool)
	if err != nil {
		c.pool.Close()
		return nil, err
	}
	c.scope.Store(sq)
	scope, err := c.readScope(ctx, c.pool)
	if err != nil {
		c.pool.Close()
		return nil, err
	}
	c.poolScope.Store(&scope)
	if c.nc, err = nats.Connect(cfg.NATSURL, nats.Name("larder-client"), nats.MaxReconnects(-1)); err != nil {
		c.pool.Close()
		return nil, fmt.Errorf("larder: NATS: %w", err)
	}
	if c.pins, err = newPinTracker(ctx, c.nc, cfg.Prefix); err != nil {
		c.Close()
		return nil, err
	}
	c.fileSchema, c.wantSets = sol.Schema, sol.TagSets()
	k, err := c.loadKeying(ctx, 10*time.Second)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.keying.Store(k)
	for _, addr := range cfg.Nodes {
		c.nodes = append(c.nodes, protocol.NewClient(addr, 8))
	}
	c.stop = make(chan struct{})
	c.bg.Add(1)
	go c.followSchema()
	return c, nil
}

// followSchema reloads the schema and the invalidator's coverage when the
// invalidator announces a schema change, and keeps asking while it has
// not said what it covers.
func (c *Client) followSchema() {
	defer c.bg.Done()
	changed := make(chan *nats.Msg, 16)
	sub, err := c.nc.ChanSubscribe(schemaChangedSubject(c.cfg.Prefix), changed)
	if err != nil {
		c.cfg.Log.Warn("larder: cannot follow schema changes; nothing is cached", "err", err)
		c.keying.Store(&keying{schema: quma.NewSchema(), byPath: map[string]*quma.Analyzer{}})
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-changed:
			for len(changed) > 0 { // one reload for a burst of DDL
				<-changed
			}
			c.refreshKeying(context.Background(), "schema change")
		case <-tick.C:
			if c.keying.Load().covered == nil {
				c.refreshKeying(context.Background(), "coverage unknown")
			}
		}
	}
}

// dbConn is what a read-only transaction needs of a PostgreSQL session:
// a pooled connection (native API) or a database/sql connection's own.
type dbConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Close waits for pending puts and closes every connection.
func (c *Client) Close() {
	if c.stop != nil {
		close(c.stop)
		c.bg.Wait()
	}
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
// commit moves its session (read your writes).
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
	sess, _ := SessionFromContext(ctx)
	return &RWTx{Tx: tx, conn: conn, c: c, sess: sess}, nil
}

// RWTx is a read/write transaction (a pgx.Tx).
type RWTx struct {
	pgx.Tx
	conn *pgxpool.Conn
	c    *Client
	sess *Session // the session BeginRW's context carried, if any
}

// Commit commits and records the commit's WAL position: later read-only
// transactions of its session (the one BeginRW's or Commit's context
// carries, and the client's own) see this transaction.
func (t *RWTx) Commit(ctx context.Context) error {
	defer t.release(ctx)
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	lsn, err := walAfterCommit(ctx, t.conn)
	if err != nil {
		return err
	}
	t.c.sawCommit(ctx, t.sess, lsn)
	return nil
}

// walAfterCommit reads the WAL insert position after a commit: the
// commit's record is before it.
func walAfterCommit(ctx context.Context, conn dbConn) (uint64, error) {
	var s string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("larder: committed, but reading the WAL position failed: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, fmt.Errorf("larder: committed, but the WAL position %q: %w", s, err)
	}
	return uint64(lsn), nil
}

// release gives the connection back to the pool, unless the transaction
// changed the session (a SET, SET ROLE, a temporary table): pooled
// read-only transactions are keyed on the pool's session state, so such
// a connection is closed.
func (t *RWTx) release(ctx context.Context) {
	if t.conn.Conn().PgConn().TxStatus() == 'I' {
		if scope, err := t.c.readScope(ctx, t.conn); err == nil && !scope.temp && scope.key == t.c.poolScope.Load().key {
			t.conn.Release()
			return
		}
	}
	t.c.m.sessionsDropped.Inc()
	pc := t.conn.Hijack()
	_ = pc.Close(ctx)
}

// sawCommit records a commit at lsn: the client's own session, the
// session ctx carries and sess (when not nil) all move to it.
func (c *Client) sawCommit(ctx context.Context, sess *Session, lsn uint64) {
	c.own.sawCommit(lsn)
	if s, ok := SessionFromContext(ctx); ok {
		s.sawCommit(lsn)
	}
	if sess != nil {
		sess.sawCommit(lsn)
	}
}

// minLSN is where the read-only transactions begun with ctx must read:
// at or after the last commit of their session (the client's own when
// ctx carries none).
func (c *Client) minLSN(ctx context.Context) uint64 {
	if s, ok := SessionFromContext(ctx); ok {
		return s.MinLSN()
	}
	return c.own.MinLSN()
}

// Rollback rolls back.
func (t *RWTx) Rollback(ctx context.Context) error {
	defer t.release(ctx)
	return t.Tx.Rollback(ctx)
}

type pgxTypeMap struct{ *pgtype.Map }
