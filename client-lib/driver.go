package larder

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/bytesize"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/pki"
)

// MaxStaleness is the largest staleness limit a DSN may give.
const MaxStaleness = 24 * time.Hour

// DriverName is the database/sql driver this package registers.
const DriverName = "larder"

var registered driver.Driver = &Driver{}

func init() { sql.Register(DriverName, registered) }

// Driver is the database/sql driver. Its DSN is a PostgreSQL URL whose
// larder.* query parameters configure the cache: larder.nats (NATS URL),
// larder.nats-nkey (file holding the client's NATS nkey seed),
// larder.nodes (comma-separated cache-node addresses), larder.node-ca,
// larder.node-cert and larder.node-key (PEM files: the CA of the nodes'
// certificates and the client's own certificate and key, for nodes that
// authenticate their peers), larder.quma (the QUMA file),
// larder.staleness (a Go duration, at most 24h), larder.l1 (L1 bytes,
// with an optional KiB, MiB or GiB suffix), larder.prefix (NATS subject
// prefix), and the failure bounds (Go durations, see Config):
// larder.node-timeout, larder.node-backoff, larder.pin-verify-timeout,
// larder.pin-silence, larder.fresh-read-wait (0s: reads at a fresh
// snapshot do not wait for its placement), larder.park-idle (0s: no
// read-only transaction stays open on its connection for the next one
// at its pin; see Config.ParkIdle), larder.park-prefer (0s: a read-only
// transaction never begins at an older pin than its newest for a
// transaction parked there; see Config.ParkPrefer); larder.clock-granularity (a Go duration, the width
// of the clock buckets of queries reading now(); 0s: such queries run
// uncached; see Config.ClockGranularity); larder.register-tag-sets=false keeps the client
// from registering the QUMA file's tag column sets with the invalidator
// (Config.NoRegisterTagSets); larder.split-rows=false keeps every result's
// dependencies whole (Config.NoRowSplit). A read-only transaction
// (sql.TxOptions{ReadOnly: true}) is a cached read-only transaction;
// everything else is plain PostgreSQL through pgx.
type Driver struct {
	mu      sync.Mutex
	clients map[string]*Client
}

// Open implements driver.Driver.
func (d *Driver) Open(dsn string) (driver.Conn, error) {
	c, err := d.OpenConnector(dsn)
	if err != nil {
		return nil, err
	}
	return c.Connect(context.Background())
}

// OpenConnector implements driver.DriverContext.
func (d *Driver) OpenConnector(dsn string) (driver.Connector, error) {
	cfg, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	pgcfg, err := pgx.ParseConfig(cfg.PostgresURL)
	if err != nil {
		return nil, fmt.Errorf("larder: %w", err)
	}
	return &connector{d: d, dsn: dsn, cfg: cfg, pg: stdlib.GetConnector(*pgcfg)}, nil
}

// UnsafeAblationParam is the DSN parameter of the benchmarks' "no
// consistency" ablation. The driver refuses it unless the program called
// EnableUnsafeBenchmarkAblation first: no application turns it on by a
// DSN alone.
const UnsafeAblationParam = "larder.unsafe-ignore-consistency-benchmark-only"

var unsafeAblationEnabled atomic.Bool

// EnableUnsafeBenchmarkAblation lets DSNs carry UnsafeAblationParam. It is
// for measuring what consistency costs, never for serving users: results
// of one transaction may then come from different snapshots.
func EnableUnsafeBenchmarkAblation() { unsafeAblationEnabled.Store(true) }

// ParseDSN splits a DSN into the client configuration (PostgresURL holds
// the URL without the larder.* parameters, every other parameter exactly
// as written).
func ParseDSN(dsn string) (Config, error) {
	var cfg Config
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return cfg, fmt.Errorf("larder: the DSN must be a postgres:// URL with larder.* parameters")
	}
	// Walk the raw query: parameters that are not Larder's are kept byte
	// for byte (re-encoding them would turn spaces into '+', which
	// PostgreSQL's URL parser does not read back as spaces).
	var keep []string
	seen := map[string]bool{}
	var nodeTLS [3]string // CA, certificate, key
	for _, part := range strings.Split(u.RawQuery, "&") {
		if part == "" {
			continue
		}
		rawKey, rawVal, _ := strings.Cut(part, "=")
		k, err := url.QueryUnescape(rawKey)
		if err != nil {
			return cfg, fmt.Errorf("larder: DSN parameter %q: %w", rawKey, err)
		}
		if !strings.HasPrefix(k, "larder.") {
			keep = append(keep, part)
			continue
		}
		v, err := url.QueryUnescape(rawVal)
		if err != nil {
			return cfg, fmt.Errorf("larder: DSN parameter %s: %w", k, err)
		}
		if seen[k] {
			return cfg, fmt.Errorf("larder: DSN parameter %s is given twice", k)
		}
		seen[k] = true
		switch k {
		case "larder.nats":
			cfg.NATSURL = v
		case "larder.nats-nkey":
			opt, err := nats.NkeyOptionFromSeed(v)
			if err != nil {
				return cfg, fmt.Errorf("larder: larder.nats-nkey: %w", err)
			}
			cfg.NATSOptions = append(cfg.NATSOptions, opt)
		case "larder.node-ca":
			nodeTLS[0] = v
		case "larder.node-cert":
			nodeTLS[1] = v
		case "larder.node-key":
			nodeTLS[2] = v
		case "larder.nodes":
			for _, n := range strings.Split(v, ",") {
				if n = strings.TrimSpace(n); n != "" {
					if host, port, err := net.SplitHostPort(n); err != nil || host == "" || port == "" {
						return cfg, fmt.Errorf("larder: larder.nodes entry %q: want host:port", n)
					}
					cfg.Nodes = append(cfg.Nodes, n)
				}
			}
		case "larder.quma":
			cfg.QUMA = v
		case "larder.prefix":
			if err := invalidation.ValidPrefix(v); err != nil {
				return cfg, fmt.Errorf("larder: larder.prefix: %w", err)
			}
			cfg.Prefix = v
		case UnsafeAblationParam:
			if !unsafeAblationEnabled.Load() {
				return cfg, fmt.Errorf("larder: %s is a benchmark-only ablation that breaks consistency; the program must call larder.EnableUnsafeBenchmarkAblation() to accept it", k)
			}
			if v != "true" && v != "false" {
				return cfg, fmt.Errorf("larder: %s=%q: want true or false", k, v)
			}
			cfg.UnsafeIgnoreConsistency = v == "true"
		case "larder.staleness":
			if cfg.Staleness, err = time.ParseDuration(v); err != nil || cfg.Staleness <= 0 {
				return cfg, fmt.Errorf("larder: larder.staleness=%q: want a positive duration such as 30s", v)
			}
			if cfg.Staleness > MaxStaleness {
				return cfg, fmt.Errorf("larder: larder.staleness=%s: more than %s; pins live only as long as the invalidator's --max-staleness, so a longer limit is never used", v, MaxStaleness)
			}
		case "larder.node-timeout", "larder.node-backoff", "larder.pin-verify-timeout", "larder.pin-silence":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 || d > time.Minute {
				return cfg, fmt.Errorf("larder: %s=%q: want a positive duration of at most a minute, such as 100ms", k, v)
			}
			*map[string]*time.Duration{
				"larder.node-timeout": &cfg.NodeTimeout, "larder.node-backoff": &cfg.NodeBackoff,
				"larder.pin-verify-timeout": &cfg.PinVerifyTimeout, "larder.pin-silence": &cfg.PinSilence,
			}[k] = d
		case "larder.fresh-read-wait", "larder.park-idle", "larder.park-prefer", "larder.clock-granularity":
			o := map[string]struct {
				dst                 *time.Duration
				max                 time.Duration
				limit, example, off string
			}{
				"larder.fresh-read-wait":   {&cfg.FreshReadWait, time.Minute, "a minute", "20ms", "reads do not wait"},
				"larder.park-idle":         {&cfg.ParkIdle, 10 * time.Second, "10s", "200ms", "no transaction parks"},
				"larder.park-prefer":       {&cfg.ParkPrefer, time.Minute, "a minute", "200ms", "a transaction always begins at its newest candidate pin"},
				"larder.clock-granularity": {&cfg.ClockGranularity, 24 * time.Hour, "24h", "1m", "clock-bound queries run uncached"},
			}[k]
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > o.max {
				return cfg, fmt.Errorf("larder: %s=%q: want a duration of at most %s, such as %s (0s: %s)", k, v, o.limit, o.example, o.off)
			}
			// 0s turns it off, which Config spells < 0 (0 is the default).
			*o.dst = d
			if d == 0 {
				*o.dst = -1
			}
		case "larder.register-tag-sets":
			on, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("larder: larder.register-tag-sets=%q: want true or false", v)
			}
			cfg.NoRegisterTagSets = !on
		case "larder.split-rows":
			on, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("larder: larder.split-rows=%q: want true or false", v)
			}
			cfg.NoRowSplit = !on
		case "larder.node-placement":
			if cfg.Placement, err = ParsePlacement(v); err != nil {
				return cfg, fmt.Errorf("larder: larder.node-placement: %w", err)
			}
		case "larder.miss-wait":
			if cfg.MissWait, err = time.ParseDuration(v); err != nil || cfg.MissWait > time.Second {
				return cfg, fmt.Errorf("larder: larder.miss-wait=%q: want a duration of at most 1s such as 20ms (0s: no wait)", v)
			}
			if cfg.MissWait == 0 {
				cfg.MissWait = -1
			}
		case "larder.origin":
			if host, port, err := net.SplitHostPort(v); err != nil || host == "" || port == "" {
				return cfg, fmt.Errorf("larder: larder.origin=%q: want host:port", v)
			}
			cfg.Origin = v
		case "larder.origin-rows":
			if cfg.OriginRows, err = bytesize.Parse(v); err != nil || cfg.OriginRows < 0 {
				return cfg, fmt.Errorf("larder: larder.origin-rows=%q: want a byte count such as 64MiB (0: none)", v)
			} else if cfg.OriginRows == 0 {
				cfg.OriginRows = OriginRowsNone
			}
		case "larder.origin-edge":
			cfg.OriginEdgeID = v
		case "larder.l1-broadcast":
			if cfg.L1Broadcast, err = strconv.ParseBool(v); err != nil {
				return cfg, fmt.Errorf("larder: larder.l1-broadcast=%q: want true or false", v)
			}
		case "larder.l1":
			if cfg.L1Bytes, err = bytesize.Parse(v); err != nil {
				return cfg, fmt.Errorf("larder: larder.l1=%q: want a byte count such as 67108864 or 64MiB", v)
			}
		default:
			return cfg, fmt.Errorf("larder: unknown DSN parameter %s", k)
		}
	}
	if cfg.NATSURL == "" || cfg.QUMA == "" {
		return cfg, errors.New("larder: the DSN needs larder.nats and larder.quma")
	}
	switch {
	case nodeTLS[0] != "":
		if (nodeTLS[1] == "") != (nodeTLS[2] == "") {
			return cfg, errors.New("larder: larder.node-cert and larder.node-key go together")
		}
		if cfg.NodeTLS, err = pki.ClientTLS(nodeTLS[0], nodeTLS[1], nodeTLS[2]); err != nil {
			return cfg, fmt.Errorf("larder: cache-node TLS: %w", err)
		}
	case nodeTLS[1] != "" || nodeTLS[2] != "":
		return cfg, errors.New("larder: larder.node-cert and larder.node-key need larder.node-ca")
	}
	u.RawQuery = strings.Join(keep, "&")
	cfg.PostgresURL = u.String()
	return cfg, nil
}

type connector struct {
	d   *Driver
	dsn string
	cfg Config
	pg  driver.Connector
}

func (c *connector) Driver() driver.Driver { return c.d }

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	cl, err := c.d.client(ctx, c.dsn, c.cfg)
	if err != nil {
		return nil, err
	}
	pc, err := c.pg.Connect(ctx)
	if err != nil {
		return nil, err
	}
	sc := pc.(*stdlib.Conn)
	epoch := cl.epoch.Load()
	scope, err := cl.readScope(ctx, sc.Conn())
	if err != nil {
		_ = sc.Close()
		return nil, err
	}
	return &conn{Conn: sc, c: cl, scope: scope, epoch: epoch, park: newSessionPark(sc.Conn(), cl.cfg.ParkIdle, cl.m.parked)}, nil
}

// client returns the DSN's Client, shared by every connection of it.
func (d *Driver) client(ctx context.Context, dsn string, cfg Config) (*Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cl := d.clients[dsn]; cl != nil {
		return cl, nil
	}
	cl, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if d.clients == nil {
		d.clients = map[string]*Client{}
	}
	d.clients[dsn] = cl
	return cl, nil
}

// DriverStats returns the counters of the Client behind a DSN opened with
// the larder driver, if it was opened in this process.
func DriverStats(dsn string) (*Stats, bool) {
	c := driverClient(dsn)
	if c == nil {
		return nil, false
	}
	return c.Stats(), true
}

// DriverTemplates returns Templates of the Client behind a DSN opened with
// the larder driver, if it was opened in this process.
func DriverTemplates(dsn string) ([]TemplateFigures, bool) {
	c := driverClient(dsn)
	if c == nil {
		return nil, false
	}
	return c.Templates(), true
}

// driverClient is the Client behind a DSN opened with the larder driver
// in this process, or nil.
func driverClient(dsn string) *Client {
	d, ok := registered.(*Driver)
	if !ok {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.clients[dsn]
}

type stalenessKey struct{}

// WithStaleness sets the staleness limit of the read-only transaction
// begun with ctx (database/sql's BeginTx).
func WithStaleness(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, stalenessKey{}, d)
}

// conn is a pgx database/sql connection whose read-only transactions go
// through the cache, on this very connection: its session (role,
// settings) is what they read with, and what their keys name.
type conn struct {
	*stdlib.Conn
	c    *Client
	ro   *ROTx
	inRW bool // a read/write transaction is open
	// scope is the session's key scope (readScope); stale after a
	// statement that may have changed it (SET, SET ROLE, a function).
	scope      sessionScope
	scopeStale bool
	epoch      uint64 // the client's keying epoch scope was read in
	// park is the read-only transaction left open on the connection for
	// the next one at its pin (parked.go); every other use ends it first
	// (unpark). nil when parking is off.
	park *sessionPark
}

// unpark ends the transaction parked on the connection, if any.
func (c *conn) unpark(ctx context.Context) error {
	if err := c.park.unpark(ctx); err != nil {
		return driver.ErrBadConn
	}
	return nil
}

// Ping checks the connection (ending a parked transaction first).
func (c *conn) Ping(ctx context.Context) error {
	if err := c.unpark(ctx); err != nil {
		return err
	}
	return c.Conn.Ping(ctx)
}

// ResetSession readies the connection for its next user: a parked
// transaction stays for it (pgx's own check refuses a connection in a
// transaction), and ends on its first use that is not a read-only
// transaction at the same pin.
func (c *conn) ResetSession(ctx context.Context) error {
	parked, closed := false, false
	c.park.locked(func() { parked, closed = c.park != nil && c.park.parked, c.Conn.Conn().IsClosed() })
	if parked {
		if closed {
			return driver.ErrBadConn
		}
		return nil
	}
	return c.Conn.ResetSession(ctx)
}

// IsValid reports whether database/sql may keep the connection (after a
// parked transaction's expiry under way, which may close it).
func (c *conn) IsValid() bool {
	valid := true
	c.park.locked(func() { valid = !c.Conn.Conn().IsClosed() })
	return valid
}

// Begin begins a transaction with the default options (database/sql
// calls BeginTx; this is for callers of the driver's connection itself).
func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// Prepare prepares a statement, as PrepareContext does.
func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// Close closes the connection (PostgreSQL ends a parked transaction).
func (c *conn) Close() error {
	c.park.close()
	return c.Conn.Close()
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.ro != nil {
		return nil, errors.New("larder: a transaction is already open on this connection")
	}
	if !opts.ReadOnly {
		if err := c.unpark(ctx); err != nil {
			return nil, err
		}
		tx, err := c.Conn.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		c.inRW = true
		sess, _ := SessionFromContext(ctx)
		return &rwTx{Tx: tx, c: c, sess: sess}, nil
	}
	if epoch := c.c.epoch.Load(); c.scopeStale || epoch != c.epoch {
		if err := c.unpark(ctx); err != nil {
			return nil, err
		}
		scope, err := c.c.readScope(ctx, c.Conn.Conn())
		if err != nil {
			return nil, err
		}
		c.scope, c.scopeStale, c.epoch = scope, false, epoch
		c.c.m.scopeReads.Inc()
		c.c.stats.ScopeReads.Add(1)
	}
	staleness, _ := ctx.Value(stalenessKey{}).(time.Duration)
	ro, err := c.c.beginRO(ctx, staleness, c.Conn.Conn(), c.scope, c.park)
	if err != nil {
		return nil, err
	}
	ro.sqlFormats = true
	c.ro = ro
	return roDriverTx{c: c}, nil
}

// pureRead reports whether a statement can neither write nor change the
// session: a query qumaana finds cacheable (no writes, no volatile or
// unknown functions). Anything else may have written. neutral reports
// whether it cannot have changed the session's roles or settings (a pure
// read, or a SELECT or DML of built-ins on tables that run no user code:
// quma.Template.SessionNeutral); after any other statement the session's
// key scope is read again.
func (c *conn) pureRead(query string) (pure, neutral bool) {
	tpl, err := c.c.keying.Load().analyzer(c.scope.path).Prepare(query)
	if err != nil {
		return false, false
	}
	return tpl.Cacheable, tpl.Cacheable || tpl.SessionNeutral
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.ro != nil {
		if _, neutral := c.pureRead(query); !neutral {
			c.scopeStale = true // a setting changed in it outlives the transaction
		}
		vals := make([]any, len(args))
		for i, a := range args {
			vals[i] = a.Value
		}
		rows, err := c.ro.Query(ctx, query, vals...)
		if err != nil {
			return nil, err
		}
		return newCachedRows(rows, c.Conn.Conn().TypeMap()), nil
	}
	if err := c.unpark(ctx); err != nil {
		return nil, err
	}
	pure, neutral := c.pureRead(query)
	if !neutral {
		c.scopeStale = true
	}
	rows, err := c.Conn.QueryContext(ctx, query, args)
	if err != nil || pure || c.inRW {
		return rows, err
	}
	// An autocommitted statement that may write (UPDATE … RETURNING, a
	// function): it has committed once its rows are read; later
	// read-only transactions must see it.
	return &writingRows{Rows: rows.(*stdlib.Rows), c: c, ctx: ctx}, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.ro != nil {
		return nil, errors.New("larder: a read-only transaction cannot execute statements that write")
	}
	if err := c.unpark(ctx); err != nil {
		return nil, err
	}
	pure, neutral := c.pureRead(query)
	if !neutral {
		c.scopeStale = true
	}
	res, err := c.Conn.ExecContext(ctx, query, args)
	if err == nil && discardsPrepared.MatchString(query) {
		if err := forgetPrepared(ctx, c.Conn.Conn()); err != nil {
			return nil, err
		}
	}
	if err == nil && !c.inRW && !pure {
		// An autocommitted statement: later read-only transactions see it.
		if err := c.noteWritten(ctx, nil); err != nil {
			return nil, err
		}
	}
	return res, err
}

// noteWritten records the WAL position after a commit (read your writes)
// in the session ctx carries and in sess, when not nil.
func (c *conn) noteWritten(ctx context.Context, sess *Session) error {
	lsn, err := walAfterCommit(ctx, c.Conn.Conn())
	if err != nil {
		return err
	}
	c.c.sawCommit(ctx, sess, lsn)
	return nil
}

// PrepareContext prepares a statement whose executions take the same
// paths as the connection's: cached in a read-only transaction, recorded
// for read-your-writes outside one.
func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.ro != nil {
		return &stmt{c: c, query: query, numInput: -1}, nil
	}
	if err := c.unpark(ctx); err != nil {
		return nil, err
	}
	ps, err := c.Conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &stmt{c: c, query: query, ps: ps, numInput: ps.NumInput()}, nil
}

// stmt is a prepared statement of a conn.
type stmt struct {
	c        *conn
	query    string
	ps       driver.Stmt // PostgreSQL's, when prepared outside a read-only transaction
	numInput int
}

func (s *stmt) Close() error {
	if s.ps != nil {
		// Not after a parked transaction's expiry under way (DEALLOCATE
		// runs in a parked transaction as well as out of one).
		var err error
		s.c.park.locked(func() { err = s.ps.Close() })
		return err
	}
	return nil
}

func (s *stmt) NumInput() int { return s.numInput }

func (s *stmt) Exec([]driver.Value) (driver.Result, error) {
	return nil, errors.New("larder: Stmt.Exec without a context is not supported; database/sql uses ExecContext")
}

func (s *stmt) Query([]driver.Value) (driver.Rows, error) {
	return nil, errors.New("larder: Stmt.Query without a context is not supported; database/sql uses QueryContext")
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.c.ExecContext(ctx, s.query, args)
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.c.QueryContext(ctx, s.query, args)
}

// writingRows records the commit of an autocommitted statement that
// returns rows once they are closed (the connection is busy until then).
type writingRows struct {
	*stdlib.Rows
	c      *conn
	ctx    context.Context
	closed bool
}

func (r *writingRows) Close() error {
	err := r.Rows.Close()
	if r.closed {
		return err
	}
	r.closed = true
	if err != nil {
		return err
	}
	// The statement's own context may be over (database/sql closes rows
	// when it is cancelled): the position is read on a fresh one.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 10*time.Second)
	defer cancel()
	return r.c.noteWritten(ctx, nil)
}

type roDriverTx struct{ c *conn }

func (t roDriverTx) Commit() error   { return t.end() }
func (t roDriverTx) Rollback() error { return t.end() }

func (t roDriverTx) end() error {
	ro := t.c.ro
	t.c.ro = nil
	if ro == nil {
		return nil
	}
	return ro.Commit(context.Background())
}

// rwTx records the commit's WAL position for read-your-writes.
type rwTx struct {
	driver.Tx
	c    *conn
	sess *Session // the session BeginTx's context carried, if any
}

func (t *rwTx) Commit() error {
	// A statement inside that may have changed the session (a SET
	// persists past the commit) marked the scope stale as it ran.
	t.c.inRW = false
	ctx := context.Background()
	lsn, err := commitReadingWAL(ctx, t.c.Conn.Conn(), t.Tx.Commit)
	if err != nil {
		return err
	}
	t.c.c.sawCommit(ctx, t.sess, lsn)
	return nil
}

func (t *rwTx) Rollback() error {
	t.c.inRW = false
	return t.Tx.Rollback()
}
