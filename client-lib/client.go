package larder

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
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

	"github.com/larderdb/larder/cache-node/node"
	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/qumaana/quma"
)

// Config configures a Client.
type Config struct {
	PostgresURL string
	NATSURL     string
	Prefix      string   // NATS subject prefix (the invalidator's); default "larder"
	Nodes       []string // cache-node addresses; Placement picks a key's
	// Placement picks the node of a key among Nodes (nil: HashPlacement;
	// HomePlacement for nodes in an overlay, the first being this
	// application server's home node).
	Placement Placement
	// NodeTLS, when set, is how the client authenticates itself to the
	// cache-nodes and them to it (mutual TLS: the CA that signed the nodes'
	// certificates, and the client's certificate). Nodes started with
	// client authentication refuse a client without it.
	NodeTLS *tls.Config
	// NATSOptions are added to the client's NATS connection options: its
	// credentials (nats.NkeyOptionFromSeed, nats.UserCredentials) and TLS.
	NATSOptions []nats.Option
	// QUMA is the qumaana solution file (analyze --format json): the schema
	// and the tag column sets the queries key on. Sets the invalidator does
	// not publish are registered with it at run time; results use them once
	// it does (each from its effective LSN on).
	QUMA string
	// NoRegisterTagSets turns that registration off: results that would
	// key on a set the invalidator does not publish use the table tag.
	NoRegisterTagSets bool
	// NoRowSplit keeps every result's dependencies whole. By default a
	// result whose outputs are plain columns with its table's primary key
	// is split by rows (quma.RowSplit): its group tags read only the
	// columns that decide which rows it holds, and each row it holds adds
	// a tag on its key for the columns it only shows, so that an UPDATE of
	// a row it does not show leaves it valid.
	NoRowSplit bool
	// ClockGranularity is the width of clock buckets (0: the default, a
	// minute; < 0: off). A query reading the transaction's start (now(),
	// CURRENT_TIMESTAMP, CURRENT_DATE, CURRENT_TIME, LOCALTIMESTAMP,
	// LOCALTIME, transaction_timestamp()) is cached per bucket: inside a
	// read-only transaction it runs with "now" = the transaction's start
	// rounded down to a multiple of the granularity since the Unix epoch,
	// and the bucket is part of its key. Off, such queries run uncached.
	ClockGranularity time.Duration
	// ClockGranularities overrides ClockGranularity per query template
	// (by its id, the pg_query fingerprint qumaana reports; <= 0: off).
	ClockGranularities map[string]time.Duration
	// Staleness is the default staleness limit of read-only transactions.
	Staleness time.Duration
	// L1Bytes is the in-process cache's byte budget (0: no L1). The L1
	// follows the invalidation stream as a cache-node does (an in-process
	// node.Node over a memory backend): what the client computed itself
	// stays valid, open-ended, until an invalidation of one of its tags,
	// so reads at pins newer than it (a session's read after its write)
	// still hit. A cache-node's hits are kept there as the closed interval
	// the node proved.
	L1Bytes int64
	// L1Broadcast has the L1 receive every invalidation of the prefix on
	// one subscription and drop those of groups it does not hold
	// (node.Config.Broadcast), instead of subscribing to each group it
	// holds: an L1 of many small results otherwise keeps NATS busy with
	// hundreds of thousands of subscriptions, each made and removed as
	// results come and go. What it serves is the same.
	L1Broadcast bool
	// NodeTimeout bounds each cache-node call, connecting included
	// (default DefaultNodeTimeout); a call also leaves at least half of
	// what remains of the caller's deadline for PostgreSQL. A call that
	// runs out of time, or fails on its connection, is a failure; a few in
	// a row open the node's circuit breaker: its reads go straight to
	// PostgreSQL until a probe finds it answering again.
	NodeTimeout time.Duration
	// NodeBackoff is how long a node whose breaker opened is left alone
	// before it is probed (default DefaultNodeBackoff); it doubles after
	// each failed probe, up to 16 times this.
	NodeBackoff time.Duration
	// MissWait is how long a lookup that misses may wait at the key's
	// node while another client loads the same key (the node's load lease,
	// cache-node --load-lease), to be answered from that load instead of
	// loading it again: stampede control across clients (default
	// DefaultMissWait; < 0: none). It is also bounded by half the node
	// call's deadline. An answer after the wait is used only if it fits
	// the transaction's candidates, as any hit.
	MissWait time.Duration
	// PinVerifyTimeout bounds the wait for the pincushion to place a
	// fresh snapshot (default DefaultPinVerifyTimeout); the transaction
	// then runs uncached on it instead.
	PinVerifyTimeout time.Duration
	// FreshReadWait is how long a read in a transaction at a fresh
	// snapshot waits for the pincushion to place it (default
	// DefaultFreshReadWait; < 0: it does not wait). A placed snapshot
	// reads through the caches at its timestamp; until then, and after
	// the wait, reads run on PostgreSQL at it, uncached. Placing waits for
	// the invalidator to decode past the snapshot: well under a
	// millisecond on an idle database, a few to a dozen under load, the
	// verify timeout when it is stuck.
	FreshReadWait time.Duration
	// ParkIdle is how long a read-only transaction of the client's pool
	// that ran at a pin and only read cacheable templates stays open when
	// it ends, for the next one at the same pin to begin on (default
	// DefaultParkIdle; < 0: none parks). See parked.go.
	ParkIdle time.Duration
	// ParkPrefer is how much older than the newest candidate pin a pin
	// may be taken for a transaction to begin at it rather than at the
	// newest, when a transaction is parked there on its connection
	// (default ParkIdle; < 0: a transaction always begins at its newest
	// candidate). Such a transaction reads a snapshot at most that much
	// older than it would have, within its staleness limit and after its
	// session's writes as always, and saves PostgreSQL a BEGIN and a
	// snapshot import. Reads were never monotonic across transactions
	// (only a session's writes bound them from below): a transaction of
	// the pool may read a snapshot older than one the same goroutine read
	// just before, parked by another. See parked.go.
	ParkPrefer time.Duration
	// PinSilence: when the pincushion has announced no pin for this long
	// (default DefaultPinSilence), it is taken not to be placing any (its
	// invalidator is not replicating, NATS is away): a read-only
	// transaction that finds no usable pin runs uncached on a fresh
	// snapshot at once instead of asking it. Keep it several times the
	// pincushion's pin interval.
	PinSilence time.Duration
	// CloseTimeout is how long Close waits for transactions still open
	// to end (default DefaultCloseTimeout); then it closes their
	// connections, so PostgreSQL rolls them back and their next statement
	// fails, and returns without waiting for them.
	CloseTimeout time.Duration
	Log          *slog.Logger
	Metrics      prometheus.Registerer // may be nil
	// UnsafeIgnoreConsistency is for measurements only (the "no
	// consistency" ablation of the benchmarks): hits do not narrow the
	// transaction's snapshot, so results may mix snapshots within the
	// staleness limit. Never set it for an application.
	UnsafeIgnoreConsistency bool
	// Origin, when set, is the host:port of an origin next to PostgreSQL
	// (cache-node/origin): the misses of read-only transactions at a pin
	// run there and travel back as row recipes, over mutual TLS
	// (OriginTLS). Fresh snapshots, fallbacks and database/sql sessions still
	// use the client's own connection, as does a transaction the origin
	// cannot take. An origin that cannot be connected to (refused, or
	// silent until the 10 s dial, handshake or hello timed out) is left
	// alone for NodeBackoff, its transactions beginning on the client's
	// own connection at once; then one transaction tries it again.
	Origin string
	// OriginTLS is the mutual TLS to the origin (nil: NodeTLS; the DSN
	// uses the node's files for both).
	OriginTLS *tls.Config
	// OriginRows is the byte budget of the edge's row store, which
	// resolves the recipes' references (default DefaultOriginRows;
	// OriginRowsNone: no row store, every row comes verbatim).
	OriginRows int64
	// OriginEdgeID names this client to the origin, which models its row
	// store under that name (default: random, per client).
	OriginEdgeID string
	// Loader, when set, runs the misses at a pin instead (Origin is then
	// ignored); see Loader.
	Loader Loader
}

// Client is a connection to PostgreSQL through Larder.
type Client struct {
	cfg  Config
	pool *pgxpool.Pool
	// parked: read-only transactions left open at their pins (parked.go);
	// nil when parking is off.
	parked *parkingLot
	held   heldConns // the pool's connections acquired now
	nc     *nats.Conn
	pins   *pinTracker
	// stalenessUsed is the largest staleness limit (nanoseconds) of the
	// read-only transactions begun since the last staleness demand.
	stalenessUsed atomic.Int64
	nodes         []*nodeClient
	// keying is the live schema and the invalidator's coverage; epoch
	// counts its reloads (sessions read their scope again after one).
	keying atomic.Pointer[keying]
	epoch  atomic.Uint64
	// descs are the descriptions of pipelined reads (piped.go).
	descs      descCache
	fileSchema *quma.Schema
	wantSets   map[string][][]string
	// registered holds the sets asked of the invalidator (SetName), so
	// each is asked once.
	regMu      sync.Mutex
	registered map[string]bool
	stop       chan struct{}
	bg         sync.WaitGroup
	// ctx ends when the client closes (background requests use it).
	ctx    context.Context
	cancel context.CancelFunc
	// wake asks followSchema to ask the pincushion for its pins and the
	// invalidator for its tag sets again (NATS connected).
	wake chan struct{}
	// bgMu guards closed against background work starting (goBackground).
	bgMu   sync.Mutex
	closed bool
	l1     *store.Memory
	// near is the L1's node: it follows the invalidation stream for what
	// the L1 holds and decides its versions' intervals (nil: no L1).
	near *node.Node
	maps sync.Pool
	puts sync.WaitGroup
	// placements are the fresh snapshots' placements under way (takeNow).
	placements sync.WaitGroup

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
	// roleScopes are the scope queries of roles that may not read every
	// setting scope names (readScope), by role.
	roleScopesMu sync.Mutex
	roleScopes   map[string]*roleScope
	// templateSQL holds the normalized text of the templates read, by id
	// (Templates; bounded like the per-template metrics).
	templateSQL   sync.Map
	templateCount atomic.Int64
	// storage is what storage checks proved (see storageFacts).
	storage storageFacts
	// loader runs misses at pins (nil: the direct path); originL is it
	// when it is an origin's; lm counts what it did.
	loader  Loader
	originL *originLoader
	lm      *loaderMetrics
}

// openPool opens the client's PostgreSQL pool and reads its sessions'
// scope; on error the client is closed.
func (c *Client) openPool(ctx context.Context, postgresURL string) error {
	var err error
	pcfg, err := pgxpool.ParseConfig(postgresURL)
	if err != nil {
		c.cancel()
		return fmt.Errorf("larder: %w", err)
	}
	pcfg.PrepareConn = func(_ context.Context, conn *pgx.Conn) (bool, error) {
		c.held.add(conn)
		return true, nil
	}
	pcfg.AfterRelease = func(conn *pgx.Conn) bool {
		c.held.remove(conn)
		return true
	}
	pcfg.BeforeClose = c.held.remove
	if c.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		c.cancel()
		return fmt.Errorf("larder: %w", err)
	}
	c.parked = newParkingLot(c.cfg.ParkIdle, pcfg.MaxConns, c.m.parked)
	sq, err := loadScopeQuery(ctx, c.pool)
	if err != nil {
		c.Close()
		return err
	}
	c.scope.Store(sq)
	scope, err := c.readScope(ctx, c.pool)
	if err != nil {
		c.Close()
		return err
	}
	c.poolScope.Store(&scope)
	return nil
}

// Stats counts what the client did.
type Stats struct {
	// Fallbacks counts read-only transactions that ran uncached on a
	// fresh PostgreSQL snapshot (no usable pin, and the pincushion could
	// not place one); NodeErrors, cache-node calls that failed (the read
	// went to PostgreSQL).
	L1Hits, NodeHits, Misses, Uncacheable, Fallbacks, NodeErrors atomic.Int64
	// NodeTimeouts counts cache-node calls that ran out of time (of the
	// NodeErrors); BreakerOpens, node circuit breakers opened;
	// NodeBypassed, cache-node calls not made because the node's breaker
	// was open.
	NodeTimeouts, BreakerOpens, NodeBypassed atomic.Int64
	// NowSnapshots counts read-only transactions that found no pin and
	// ran at a fresh snapshot the pincushion placed.
	NowSnapshots atomic.Int64
	// FreshWaitNanos sums the time the pincushion took to place fresh
	// snapshots (every try, placed or not;
	// larder_client_fresh_snapshot_seconds); UnplacedReads counts the
	// reads that ran on PostgreSQL, uncached, before their transaction's
	// fresh snapshot was placed (Config.FreshReadWait).
	FreshWaitNanos, UnplacedReads atomic.Int64
	// NodeMisses counts the cache-node's misses by class (compulsory,
	// staleness, capacity, consistency; a hit outside the transaction's
	// candidates counts as consistency).
	NodeMisses [5]atomic.Int64
	// L1Misses counts the L1's misses by class, as NodeMisses does the
	// cache-nodes' (a hit outside the transaction's candidates counts as
	// consistency).
	L1Misses [5]atomic.Int64
	// NodeLookups counts lookups sent to cache-nodes (queries' and
	// functions'); FunctionHits, cacheable function calls served from the
	// L1 or a node; FunctionRuns, calls that ran the function.
	NodeLookups, FunctionHits, FunctionRuns atomic.Int64
	// NodeSkips counts reads the L1 missed that did not ask a cache-node
	// because the node's hit rate after L1 misses was too low (see
	// afterL1Gate).
	NodeSkips atomic.Int64
	// PinBegins counts read-only transactions begun at a pin on the
	// client's own connections (not through a Loader); ParkedBegins, those
	// of them that began on a transaction parked at the pin (parked.go)
	// instead of importing its snapshot; OlderPinBegins, those that began
	// at an older candidate than their newest because a transaction was
	// parked there (Config.ParkPrefer).
	PinBegins, ParkedBegins, OlderPinBegins atomic.Int64
	// ScopeReads counts reads of a session's roles and settings (the key
	// scope) after a statement that may have changed them.
	ScopeReads atomic.Int64
	// Patches counts the misses (of Misses) that read only the rows of a
	// split result again, by key, because the L1 held its membership
	// valid (patch.go).
	Patches atomic.Int64
}

// Caches a lookup misses in (noteMiss; the cache label of
// larder_client_template_misses_total).
const (
	cacheL1   = "l1"
	cacheNode = "node"
)

// noteMiss counts a lookup of template's result that missed in cache
// (cacheL1 or cacheNode), by class: in Stats (L1Misses, NodeMisses) and in
// larder_client_template_misses_total.
func (c *Client) noteMiss(cache, template string, class store.MissClass) {
	misses := &c.stats.NodeMisses
	if cache == cacheL1 {
		misses = &c.stats.L1Misses
	}
	if int(class) < len(misses) {
		misses[class].Add(1)
	}
	c.m.templateMiss(template, cache, class)
}

// Defaults of the pincushion waits (see Config).
const (
	DefaultPinVerifyTimeout = time.Second
	DefaultFreshReadWait    = 50 * time.Millisecond
	DefaultPinSilence       = time.Second
	DefaultCloseTimeout     = 5 * time.Second
)

// Open connects to PostgreSQL and loads the QUMA file. It needs
// PostgreSQL only: NATS, the invalidator (its pins and the tag sets it
// publishes) and the cache-nodes are picked up when they answer; until
// then read-only transactions run on PostgreSQL uncached (counted).
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
	if cfg.NodeTimeout <= 0 {
		cfg.NodeTimeout = DefaultNodeTimeout
	}
	if cfg.NodeBackoff <= 0 {
		cfg.NodeBackoff = DefaultNodeBackoff
	}
	if cfg.MissWait == 0 {
		cfg.MissWait = DefaultMissWait
	}
	if cfg.PinVerifyTimeout <= 0 {
		cfg.PinVerifyTimeout = DefaultPinVerifyTimeout
	}
	if cfg.PinSilence <= 0 {
		cfg.PinSilence = DefaultPinSilence
	}
	if cfg.FreshReadWait == 0 {
		cfg.FreshReadWait = DefaultFreshReadWait
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = DefaultCloseTimeout
	}
	if cfg.ParkPrefer == 0 {
		cfg.ParkPrefer = cfg.ParkIdle
		if cfg.ParkPrefer == 0 {
			cfg.ParkPrefer = DefaultParkIdle
		}
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
	c := &Client{cfg: cfg, m: newClientMetrics(cfg.Metrics), wake: make(chan struct{}, 1), registered: map[string]bool{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.maps.New = func() any { return &pgxTypeMap{pgtype.NewMap()} }
	if err := c.openPool(ctx, cfg.PostgresURL); err != nil {
		return nil, err
	}
	if c.nc, err = nats.Connect(cfg.NATSURL, c.natsOptions()...); err != nil {
		c.Close()
		return nil, fmt.Errorf("larder: NATS: %w", err)
	}
	if cfg.L1Bytes > 0 {
		if err := c.openL1(); err != nil {
			c.Close()
			return nil, err
		}
	}
	if c.pins, err = newPinTracker(c.nc, cfg.Prefix, cfg.PinSilence); err != nil {
		c.Close()
		return nil, err
	}
	c.pins.askList(ctx, c.nc, cfg.Prefix, 2*time.Second)
	c.fileSchema, c.wantSets = sol.Schema, sol.TagSets()
	k, err := c.loadKeying(ctx, askTagSets(ctx, c.nc, cfg, 2*time.Second))
	if err != nil {
		c.Close()
		return nil, err
	}
	c.keying.Store(k)
	for _, addr := range cfg.Nodes {
		c.nodes = append(c.nodes, newNodeClient(c, addr))
	}
	if err := c.setupLoader(); err != nil {
		c.Close()
		return nil, err
	}
	c.stop = make(chan struct{})
	c.bg.Add(1)
	go c.followSchema()
	return c, nil
}

// natsOptions are the client's NATS options: the configured ones, then
// connecting in the background when NATS is not there yet (Open does not
// need it) and a word to followSchema on every (re)connection, after the
// configured handlers.
func (c *Client) natsOptions() []nats.Option {
	var user nats.Options
	for _, o := range c.cfg.NATSOptions {
		_ = o(&user)
	}
	connected := func(nc *nats.Conn) {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	// The L1's node confirms on this connection (node.SyncQueueLen).
	opts := append([]nats.Option{nats.Name("larder-client"), nats.MaxReconnects(-1), node.SyncQueueLen()}, c.cfg.NATSOptions...)
	return append(opts, nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(func(nc *nats.Conn) {
			connected(nc)
			if user.ConnectedCB != nil {
				user.ConnectedCB(nc)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			connected(nc)
			if user.ReconnectedCB != nil {
				user.ReconnectedCB(nc)
			}
		}))
}

// goBackground runs f in a goroutine Close waits for, unless the client
// is closing.
func (c *Client) goBackground(f func()) bool {
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	if c.closed {
		return false
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		f()
	}()
	return true
}

// NodeStates returns each cache-node's circuit breaker state by address:
// "closed" (in use), "open" (bypassed: its reads go to PostgreSQL) or
// "probing" (bypassed while a probe asks it).
func (c *Client) NodeStates() map[string]string {
	out := make(map[string]string, len(c.nodes))
	for _, n := range c.nodes {
		out[n.addr] = n.State()
	}
	return out
}

// followSchema reloads the schema and the invalidator's coverage when the
// invalidator announces a schema change; asks for its coverage while it
// has not said, when NATS (re)connects, when pins come again after a
// silence (it may have restarted) and every tagSetsRecheck; and asks the
// pincushion for its pins when NATS (re)connects.
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
	lastCheck, lastDemand := time.Now(), time.Time{}
	for {
		select {
		case <-c.stop:
			return
		case <-changed:
			for len(changed) > 0 { // one reload for a burst of DDL
				<-changed
			}
			c.refreshKeying(c.ctx, "schema change")
		case <-c.wake:
			c.announceStaleness()
			lastDemand = time.Now()
			c.pins.askList(c.ctx, c.nc, c.cfg.Prefix, 2*time.Second)
			c.recheckTagSets(c.ctx, "NATS connected")
			lastCheck = time.Now()
		case <-c.pins.resumed:
			c.recheckTagSets(c.ctx, "pins resumed")
			lastCheck = time.Now()
		case <-tick.C:
			if time.Since(lastDemand) >= invalidation.PinDemandInterval {
				c.announceStaleness()
				lastDemand = time.Now()
			}
			if c.keying.Load().covered == nil || time.Since(lastCheck) >= tagSetsRecheck {
				c.recheckTagSets(c.ctx, "coverage check")
				lastCheck = time.Now()
			}
		}
	}
}

// noteStaleness records the staleness limit of a read-only transaction
// for the next staleness demand.
func (c *Client) noteStaleness(d time.Duration) {
	for {
		used := c.stalenessUsed.Load()
		if int64(d) <= used || c.stalenessUsed.CompareAndSwap(used, int64(d)) {
			return
		}
	}
}

// announceStaleness tells the pincushion how long pins are of use to this
// client: the largest staleness limit its read-only transactions used
// since the last announcement, or its default limit when none began. The
// pincushion keeps pins no longer than the largest limit announced, so
// that they hold PostgreSQL's cleanup of old row versions back no further
// than a transaction can read.
func (c *Client) announceStaleness() {
	d := time.Duration(c.stalenessUsed.Swap(0))
	if d <= 0 {
		d = c.cfg.Staleness
	}
	if err := c.nc.Publish(invalidation.PinHorizonSubject(c.cfg.Prefix), invalidation.EncodeStalenessDemand(d)); err != nil {
		c.cfg.Log.Debug("larder: announce the staleness demand", "err", err)
	}
}

// tagSetsRecheck is how often the invalidator is asked for its coverage
// again, in case it restarted with other tag column sets unnoticed.
const tagSetsRecheck = 5 * time.Second

// dbConn is what a read-only transaction needs of a PostgreSQL session:
// a pooled connection (native API) or a database/sql connection's own.
type dbConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Close waits for pending puts and closes every connection.
func (c *Client) Close() {
	c.bgMu.Lock()
	c.closed = true
	c.bgMu.Unlock()
	if c.cancel != nil {
		c.cancel()
	}
	if c.stop != nil {
		close(c.stop)
	}
	c.bg.Wait()
	c.puts.Wait()
	for _, n := range c.nodes {
		n.close()
	}
	c.closeLoader()
	if c.pins != nil {
		c.pins.close()
	}
	if c.nc != nil {
		c.nc.Close()
	}
	c.placements.Wait() // their requests fail once NATS is closed
	if c.pool != nil {
		c.parked.close()
		c.closePool()
	}
}

// closePool closes the pool, waiting CloseTimeout for the transactions
// still holding its connections. Past it, their connections are closed
// under them (PostgreSQL rolls them back and lets their locks and
// snapshots go; their next statement fails) and the pool finishes
// closing when they end, without Close waiting.
func (c *Client) closePool() {
	done := make(chan struct{})
	go func() {
		c.pool.Close()
		close(done)
	}()
	timeout := c.cfg.CloseTimeout
	if timeout <= 0 { // a client not made by Open (OpenPinned)
		timeout = DefaultCloseTimeout
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-done:
		return
	case <-timer.C:
	}
	n := c.held.closeAll()
	c.m.closeAbandoned.Add(float64(n))
	c.cfg.Log.Warn("larder: Close: transactions still open after the close timeout; their connections are closed (PostgreSQL rolls them back)",
		"transactions", n, "close_timeout", timeout)
}

// heldConns are the pool's connections acquired now.
type heldConns struct {
	mu sync.Mutex
	m  map[*pgx.Conn]struct{}
}

func (h *heldConns) add(conn *pgx.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[*pgx.Conn]struct{}{}
	}
	h.m[conn] = struct{}{}
}

func (h *heldConns) remove(conn *pgx.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, conn)
}

// closeAll closes the network connection under each held connection (a
// net.Conn may be closed while another goroutine uses it) and says how
// many there were.
func (h *heldConns) closeAll() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for conn := range h.m {
		_ = conn.PgConn().Conn().Close()
	}
	return len(h.m)
}

// Stats returns the client's counters.
func (c *Client) Stats() *Stats { return &c.stats }

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
	done bool     // committed or rolled back: the connection is released
}

// Commit commits and records the commit's WAL position: later read-only
// transactions of its session (the one BeginRW's or Commit's context
// carries, and the client's own) see this transaction.
func (t *RWTx) Commit(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	defer t.release(ctx)
	lsn, err := commitReadingWAL(ctx, t.conn.Conn(), func() error { return t.Tx.Commit(ctx) })
	if err != nil {
		return err
	}
	t.c.sawCommit(ctx, t.sess, lsn)
	return nil
}

// commitReadingWAL commits the transaction open on conn and reads the WAL
// insert position after it in the same round trip (the commit's record is
// before it). A COMMIT of a transaction a failed statement aborted rolls
// back: pgx.ErrTxCommitRollback, as pgx's own Commit says, and no
// position. When the commit fails otherwise and the connection is still
// inside the transaction, it is closed, as pgx does. A connection not
// inside a transaction is left to commit, the transaction's own Commit
// (which says why), and the position read after it.
func commitReadingWAL(ctx context.Context, conn *pgx.Conn, commit func() error) (uint64, error) {
	if st := conn.PgConn().TxStatus(); st != 'T' && st != 'E' {
		if err := commit(); err != nil {
			return 0, err
		}
		return walAfterCommit(ctx, conn)
	}
	return commitWAL(ctx, conn)
}

// commitWAL sends COMMIT and the WAL position read as one simple query on
// conn, inside a transaction.
func commitWAL(ctx context.Context, conn *pgx.Conn) (uint64, error) {
	results, err := conn.PgConn().Exec(ctx, "COMMIT; SELECT pg_catalog.pg_current_wal_insert_lsn()::text").ReadAll()
	if err != nil {
		if conn.PgConn().TxStatus() != 'I' {
			_ = conn.Close(ctx)
		}
		return 0, err
	}
	if len(results) != 2 || len(results[1].Rows) != 1 || len(results[1].Rows[0]) != 1 {
		return 0, fmt.Errorf("larder: committed, but the WAL position read after it gave %d results", len(results))
	}
	if results[0].CommandTag.String() == "ROLLBACK" {
		return 0, pgx.ErrTxCommitRollback
	}
	return parseWAL(string(results[1].Rows[0][0]))
}

// walAfterCommit reads the WAL insert position after a commit: the
// commit's record is before it.
func walAfterCommit(ctx context.Context, conn dbConn) (uint64, error) {
	var s string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("larder: committed, but reading the WAL position failed: %w", err)
	}
	return parseWAL(s)
}

func parseWAL(s string) (uint64, error) {
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
	t.c.held.remove(pc)
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
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	defer t.release(ctx)
	return t.Tx.Rollback(ctx)
}

type pgxTypeMap struct{ *pgtype.Map }
