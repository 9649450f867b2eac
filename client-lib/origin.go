package larder

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/cache-node/origin"
	"github.com/larderdb/larder/internal/recipe"
)

// DefaultOriginRows is the default byte budget of the edge's row store
// (Config.OriginRows): the rows of some thousands of typical pages'
// results, a small part of an application server's memory.
const DefaultOriginRows = 64 << 20

// OriginRowsNone (Config.OriginRows, DSN larder.origin-rows=0) keeps no
// row store: the origin sends every row verbatim, with the whole-result
// hash still checked. The baseline that shows what recipes save.
const OriginRowsNone = -1

// OriginStats are what an edge's misses through an origin cost.
type OriginStats struct {
	// Statements run at the origin.
	Statements int64
	// BytesReceived counts the recipes and fills received; BytesRaw, the
	// bytes the same results take encoded plainly (header and rows).
	BytesReceived, BytesRaw int64
	// Refetches counts refetches sent (rows a recipe named that the row
	// store lacked, or whole results after a hash mismatch).
	Refetches int64
	// Fallbacks counts transactions the origin could not take, which
	// began on the client's own connection.
	Fallbacks int64
	// Store is the edge's row store.
	Store recipe.StoreStats
}

// loaderMetrics count what the client's Loader did.
type loaderMetrics struct {
	fallbacks                                     prometheus.Counter
	fallbackN, statements, received, raw, refetch atomic.Int64
}

func (m *loaderMetrics) noteFallback() {
	m.fallbacks.Inc()
	m.fallbackN.Add(1)
}

// originLoader is the Loader through an origin: a session per
// transaction, results decoded from recipes against the edge's row store.
type originLoader struct {
	c     *Client
	cl    *origin.Client
	store *recipe.RowStore
	lim   recipe.Limits
	// downUntil (Unix nanoseconds; 0: up): an origin that could not be
	// connected to (unreachable, or silent until the dial timed out) is
	// left alone until then, its transactions beginning on the client's
	// own connection at once rather than each waiting for a dial.
	downUntil atomic.Int64
}

// originDialTimeout bounds a dial and TLS handshake to the origin.
var originDialTimeout = 10 * time.Second

// setupLoader makes the client's Loader from its Config: cfg.Loader, or
// an origin's when cfg.Origin is set, or none (the direct path).
func (c *Client) setupLoader() error {
	cfg := c.cfg
	c.lm = &loaderMetrics{fallbacks: prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_client_loader_fallbacks_total",
		Help: "Read-only transactions the loader (an origin) could not take, which began on the client's own PostgreSQL connection at the same pin."})}
	switch {
	case cfg.Loader != nil:
		c.loader = cfg.Loader
	case cfg.Origin != "":
		budget := recipe.DefaultConfig()
		switch budget.MaxBytes = cfg.OriginRows; {
		case budget.MaxBytes < 0:
			budget.MaxBytes = 0 // holds nothing: every row verbatim
		case budget.MaxBytes == 0:
			budget.MaxBytes = DefaultOriginRows
		}
		store, err := recipe.NewRowStore(budget)
		if err != nil {
			return fmt.Errorf("larder: origin row store: %w", err)
		}
		edge := cfg.OriginEdgeID
		if edge == "" {
			var b [8]byte
			_, _ = rand.Read(b[:])
			edge = hex.EncodeToString(b[:])
		}
		tlsCfg := cfg.OriginTLS
		if tlsCfg == nil {
			tlsCfg = cfg.NodeTLS
		}
		l := &originLoader{c: c, store: store, lim: recipe.DefaultLimits(),
			cl: origin.NewClient(origin.ClientConfig{Addr: cfg.Origin, TLS: tlsCfg, EdgeID: edge, Budget: budget, DialTimeout: originDialTimeout})}
		c.loader, c.originL = l, l
	default:
		return nil
	}
	if reg := cfg.Metrics; reg != nil {
		reg.MustRegister(c.lm.fallbacks)
		if c.originL != nil {
			counter := func(name, help string, f func() float64) prometheus.Collector {
				return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f)
			}
			reg.MustRegister(
				counter("larder_client_origin_statements_total", "Statements run at the origin.", func() float64 { return float64(c.lm.statements.Load()) }),
				counter("larder_client_origin_bytes_received_total", "Bytes of recipes and fills received from the origin.", func() float64 { return float64(c.lm.received.Load()) }),
				counter("larder_client_origin_bytes_raw_total", "Bytes the results received from the origin take encoded plainly.", func() float64 { return float64(c.lm.raw.Load()) }),
				counter("larder_client_origin_refetches_total", "Refetches sent to the origin (rows the row store lacked, or whole results after a hash mismatch).", func() float64 { return float64(c.lm.refetch.Load()) }),
			)
		}
	}
	return nil
}

// closeLoader closes the origin's connections.
func (c *Client) closeLoader() {
	if c.originL != nil {
		_ = c.originL.cl.Close()
	}
}

// OriginStats returns what the misses through an origin cost (zero
// without Config.Origin).
func (c *Client) OriginStats() OriginStats {
	s := OriginStats{}
	if c.lm == nil {
		return s
	}
	s.Statements, s.BytesReceived, s.BytesRaw, s.Refetches = c.lm.statements.Load(), c.lm.received.Load(), c.lm.raw.Load(), c.lm.refetch.Load()
	s.Fallbacks = c.lm.fallbackN.Load()
	if c.originL != nil {
		s.Store = c.originL.store.Stats()
	}
	return s
}

func (l *originLoader) BeginAt(ctx context.Context, req LoadRequest) (PinnedTx, error) {
	if until := l.downUntil.Load(); until != 0 {
		// Left alone until then; after that, one transaction tries it.
		now := time.Now()
		if now.UnixNano() < until || !l.downUntil.CompareAndSwap(until, now.Add(l.c.cfg.NodeBackoff).UnixNano()) {
			return nil, fmt.Errorf("%w: the origin could not be connected to; left alone for %s", ErrLoaderUnavailable, l.c.cfg.NodeBackoff)
		}
	}
	s, err := l.cl.Begin(ctx, &origin.Begin{Snapshot: req.Pin.SnapshotID, TS: req.Pin.LSN, ServerStart: req.Pin.ServerStart, SQLFormats: req.SQLFormats, Scope: req.Scope, Tables: req.Tables})
	if err != nil {
		err = l.unavailable(ctx, originError(err))
		var re *origin.RemoteError
		if errors.Is(err, ErrLoaderUnavailable) && !errors.As(err, &re) {
			// Not an answer of the origin's: it could not be reached.
			if l.downUntil.Swap(time.Now().Add(l.c.cfg.NodeBackoff).UnixNano()) == 0 {
				l.c.cfg.Log.Warn("larder: origin unreachable; transactions begin on their own connections until it is tried again", "origin", l.c.cfg.Origin, "retry_in", l.c.cfg.NodeBackoff, "err", err)
			}
		}
		return nil, err
	}
	if l.downUntil.Swap(0) != 0 {
		l.c.cfg.Log.Info("larder: origin reachable again", "origin", l.c.cfg.Origin)
	}
	return &originTx{l: l, s: s, session: req.Session, path: req.SearchPath}, nil
}

// unavailable marks the begin errors after which the transaction can
// begin on the client's own connection: the origin busy, in another
// scope, unreachable, not answering in time (its dial or handshake timed
// out while the caller's context is live) or failing for its own
// reasons. PostgreSQL's answers (a released snapshot), retries and the
// end of the caller's own context are the transaction's.
func (l *originLoader) unavailable(ctx context.Context, err error) error {
	var re *origin.RemoteError
	if errors.Is(err, ErrRetry) || (errors.As(err, &re) && re.Postgres()) || ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("%w: %w", ErrLoaderUnavailable, err)
}

// originError maps the origin's retries to the client's own errors, so
// that the transaction treats them as it treats its own.
func originError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, origin.ErrRewritten):
		return fmt.Errorf("%v: %w", err, errRewritten)
	case errors.Is(err, origin.ErrRetry):
		return fmt.Errorf("%v: %w", err, ErrRetry)
	}
	return err
}

// originTx is a transaction's session at the origin.
type originTx struct {
	l *originLoader
	s *origin.Session
	// session: a database/sql connection's transaction, whose session
	// state the origin cannot carry back (path: its search path).
	session bool
	path    []string
}

// ErrSessionChangeAtOrigin: inside a database/sql read-only transaction
// run through an origin, a statement that may change the session's state
// (set_config, a function not known to leave it alone). It would change
// the origin's session, not the connection's: it is refused, and runs as
// it should outside the read-only transaction.
var ErrSessionChangeAtOrigin = errors.New("larder: a statement that may change the session's settings cannot run inside a read-only transaction through the origin")

func (t *originTx) Hold(ctx context.Context, tables []string) error {
	return originError(t.s.Hold(ctx, tables))
}

func (t *originTx) Query(ctx context.Context, sql string, args []any) (*Result, error) {
	l := t.l
	if t.session {
		tpl, err := l.c.keying.Load().analyzer(t.path).Prepare(sql)
		if err != nil || !(tpl.Cacheable || tpl.SessionNeutral) {
			return nil, ErrSessionChangeAtOrigin
		}
	}
	msg, err := t.s.Query(ctx, &origin.Query{SQL: sql, Args: args})
	if err != nil {
		return nil, originError(err)
	}
	l.c.lm.statements.Add(1)
	l.c.lm.received.Add(int64(len(msg)))
	rr, err := l.store.Decode(ctx, msg, recipe.OriginFunc(func(ctx context.Context, req recipe.Refetch) ([]byte, error) {
		l.c.lm.refetch.Add(1)
		b, err := t.s.Refetch(ctx, req)
		l.c.lm.received.Add(int64(len(b)))
		return b, err
	}), l.lim)
	if err != nil {
		// Never a wrong result: what cannot be rebuilt and verified is an
		// error of the statement.
		return nil, fmt.Errorf("larder: the origin's result: %w", err)
	}
	l.c.lm.raw.Add(rr.Size())
	return resultFromRecipe(rr)
}

func (t *originTx) End(ctx context.Context) error { return t.s.End(ctx) }

// DriverOriginStats returns OriginStats of the Client behind a DSN opened
// with the larder driver, if it was opened in this process.
func DriverOriginStats(dsn string) (OriginStats, bool) {
	d, ok := registered.(*Driver)
	if !ok {
		return OriginStats{}, false
	}
	d.mu.Lock()
	cl := d.clients[dsn]
	d.mu.Unlock()
	if cl == nil {
		return OriginStats{}, false
	}
	return cl.OriginStats(), true
}
