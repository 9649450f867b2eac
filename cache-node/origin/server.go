package origin

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/internal/recipe"
)

// Backend runs an edge transaction's statements at its pin, next to
// PostgreSQL: client-lib's transaction machinery (larder.OriginBackend)
// in production, an in-memory one in tests.
type Backend interface {
	// Begin imports the pin's snapshot, holds b.Tables and checks their
	// storage. It returns an error wrapping ErrScope when the backend
	// would read in another scope than b.Scope, ErrRewritten when a table
	// was rewritten after the pin, or PostgreSQL's error (a released
	// snapshot: SQLSTATE 22023 or 55000).
	Begin(ctx context.Context, b *Begin) (Tx, error)
}

// Tx is a transaction a Backend began. It is used by one goroutine.
type Tx interface {
	Hold(ctx context.Context, tables []string) error
	Query(ctx context.Context, sql string, args []any) (recipe.Result, error)
	End(ctx context.Context) error
}

// Config configures a Server. Zero fields take DefaultConfig's values.
type Config struct {
	// MaxSessions bounds the edge transactions open at once, each holding
	// a PostgreSQL connection and a snapshot (default 64: PostgreSQL's
	// default max_connections is 100). A begin beyond it is answered
	// ErrBusy, and the edge runs that transaction on its own connection.
	MaxSessions int
	// IdleTimeout closes a connection, ending its session, when no request
	// arrives for this long (default 30s: an edge transaction lasts
	// milliseconds to seconds, and an abandoned one must not hold its
	// snapshot and locks).
	IdleTimeout time.Duration
	// StatementTimeout bounds each request's work (default 60s).
	StatementTimeout time.Duration
	// MaxFrame bounds a request or an answer (default 256 MiB, a large
	// result's recipe).
	MaxFrame int
	// MaxEdges bounds the edges modelled at once (default 256); the least
	// recently seen one is forgotten beyond it, which costs it bytes only.
	MaxEdges int
	// Limits bound what the origin parses from an edge.
	Limits recipe.Limits
	Log    *slog.Logger
}

// DefaultConfig returns the defaults described on Config.
func DefaultConfig() Config {
	return Config{MaxSessions: 64, IdleTimeout: 30 * time.Second, StatementTimeout: time.Minute,
		MaxFrame: 256 << 20, MaxEdges: 256, Limits: recipe.DefaultLimits()}
}

// Validate reports a Config that cannot work.
func (c Config) Validate() error {
	if c.MaxSessions < 0 || c.MaxEdges < 0 || c.MaxFrame < 0 || c.IdleTimeout < 0 || c.StatementTimeout < 0 {
		return errors.New("origin: negative limit")
	}
	return c.Limits.Validate()
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.MaxSessions == 0 {
		c.MaxSessions = d.MaxSessions
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = d.StatementTimeout
	}
	if c.MaxFrame == 0 {
		c.MaxFrame = d.MaxFrame
	}
	if c.MaxEdges == 0 {
		c.MaxEdges = d.MaxEdges
	}
	if c.Limits == (recipe.Limits{}) {
		c.Limits = d.Limits
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Stats are a Server's counters.
type Stats struct {
	Sessions, Statements, Refetches, Busy, Errors atomic.Int64
	// BytesRaw sums the results' header and row bytes; BytesSent, the
	// recipes and fills sent for them.
	BytesRaw, BytesSent atomic.Int64
}

// Server is the origin: it serves edges' transactions at their pins and
// answers with recipes. Safe for concurrent use; Close is idempotent.
type Server struct {
	cfg     Config
	backend Backend
	tls     *tls.Config
	slots   chan struct{} // one per open session
	stats   Stats

	mu     sync.Mutex // guards edges, seen, conns, lns, closed
	edges  map[string]*recipe.Tracker
	seen   map[string]time.Time
	conns  map[net.Conn]struct{}
	lns    []net.Listener
	closed bool
	wg     sync.WaitGroup // connection goroutines
}

// New returns a Server running statements on backend. tlsCfg, when not
// nil, is the server side of mutual TLS (pki.ServerTLS).
func New(cfg Config, backend Backend, tlsCfg *tls.Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Server{cfg: cfg, backend: backend, tls: tlsCfg, slots: make(chan struct{}, cfg.MaxSessions),
		edges: map[string]*recipe.Tracker{}, seen: map[string]time.Time{}, conns: map[net.Conn]struct{}{}}, nil
}

// Stats returns the server's counters.
func (s *Server) Stats() *Stats { return &s.stats }

// Tracker returns the model of edge (nil if none), for tests and metrics.
func (s *Server) Tracker(edge string) *recipe.Tracker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.edges[edge]
}

// Serve accepts connections on ln until ctx ends or Close, and closes ln
// when it returns (at once when the server is closed already).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	// The listener is closed when Serve returns, whatever the reason: one
	// left open would take edges' connections that no one answers.
	defer ln.Close()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		if s.tls != nil {
			c = tls.Server(c, s.tls)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops accepting, closes every connection (ending its session)
// and waits for their goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		for _, ln := range s.lns {
			_ = ln.Close()
		}
		for c := range s.conns {
			_ = c.Close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// tracker returns the model of h's edge, made or reset as asked.
func (s *Server) tracker(h *Hello) (*recipe.Tracker, error) {
	cfg, err := recipe.ParseReset(h.Budget)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.edges[h.EdgeID]
	switch {
	case t == nil:
		if t, err = recipe.NewTracker(cfg); err != nil {
			return nil, err
		}
		if len(s.edges) >= s.cfg.MaxEdges {
			var oldest string
			var at time.Time
			for id, when := range s.seen {
				if oldest == "" || when.Before(at) {
					oldest, at = id, when
				}
			}
			delete(s.edges, oldest)
			delete(s.seen, oldest)
		}
		s.edges[h.EdgeID] = t
	case h.Reset || t.Config() != cfg:
		if err := t.Reset(cfg); err != nil {
			return nil, err
		}
	}
	s.seen[h.EdgeID] = time.Now()
	return t, nil
}

// session is one connection's state: at most one transaction at a time.
type session struct {
	s       *Server
	c       net.Conn
	r       *bufio.Reader
	w       *bufio.Writer
	buf     []byte
	out     []byte
	tracker *recipe.Tracker
	tx      Tx
	last    recipe.Result // the last statement's result, for refetches
	hasLast bool
}

func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	ss := &session{s: s, c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
	defer ss.end()
	_ = c.SetDeadline(time.Now().Add(s.cfg.IdleTimeout))
	op, body, err := ss.read()
	if err != nil {
		return
	}
	if op != OpHello {
		ss.fail(fmt.Errorf("%w: op %q before the hello", ErrProtocol, op))
		return
	}
	h, err := DecodeHello(body)
	if err == nil && h.Version != ProtoVersion {
		err = fmt.Errorf("%w: version %d (this origin speaks %d)", ErrProtocol, h.Version, ProtoVersion)
	}
	if err == nil {
		ss.tracker, err = s.tracker(&h)
	}
	if err != nil {
		ss.fail(err)
		return
	}
	ss.out = binary.AppendUvarint(ss.out[:0], ProtoVersion)
	if !ss.send(OpOK, ss.out) {
		return
	}
	for {
		_ = c.SetDeadline(time.Now().Add(s.cfg.IdleTimeout))
		op, body, err := ss.read()
		if err != nil {
			return
		}
		if !ss.handle(ctx, op, body) {
			return
		}
	}
}

func (ss *session) read() (byte, []byte, error) {
	op, body, nb, err := protocol.ReadFrame(ss.r, ss.buf, ss.s.cfg.MaxFrame)
	ss.buf = nb
	return op, body, err
}

func (ss *session) send(op byte, body []byte) bool {
	_ = ss.c.SetWriteDeadline(time.Now().Add(ss.s.cfg.IdleTimeout))
	if err := protocol.WriteFrame(ss.w, op, body); err != nil {
		return false
	}
	return ss.w.Flush() == nil
}

// fail answers err; the connection goes on unless it is a protocol error.
func (ss *session) fail(err error) bool {
	ss.s.stats.Errors.Add(1)
	e := classify(err)
	if !ss.send(OpError, AppendError(ss.out[:0], &e)) {
		return false
	}
	return !errors.Is(err, ErrProtocol)
}

// end ends the session's transaction, if any.
func (ss *session) end() {
	if ss.tx == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = ss.tx.End(ctx)
	cancel()
	ss.tx, ss.hasLast, ss.last = nil, false, recipe.Result{}
	<-ss.s.slots
}

func (ss *session) handle(ctx context.Context, op byte, body []byte) bool {
	ctx, cancel := context.WithTimeout(ctx, ss.s.cfg.StatementTimeout)
	defer cancel()
	switch op {
	case OpBegin:
		if ss.tx != nil {
			return ss.fail(fmt.Errorf("%w: begin inside a transaction", ErrProtocol))
		}
		b, err := DecodeBegin(body)
		if err != nil {
			return ss.fail(err)
		}
		select {
		case ss.s.slots <- struct{}{}:
		default:
			ss.s.stats.Busy.Add(1)
			return ss.fail(fmt.Errorf("%w (%d)", ErrBusy, ss.s.cfg.MaxSessions))
		}
		tx, err := ss.s.backend.Begin(ctx, &b)
		if err != nil {
			<-ss.s.slots
			return ss.fail(err)
		}
		ss.tx = tx
		ss.s.stats.Sessions.Add(1)
		return ss.send(OpOK, nil)
	case OpHold:
		if ss.tx == nil {
			return ss.fail(fmt.Errorf("%w: hold outside a transaction", ErrProtocol))
		}
		ts, err := DecodeTables(body)
		if err == nil {
			err = ss.tx.Hold(ctx, ts)
		}
		if err != nil {
			return ss.fail(err)
		}
		return ss.send(OpOK, nil)
	case OpQuery:
		if ss.tx == nil {
			return ss.fail(fmt.Errorf("%w: query outside a transaction", ErrProtocol))
		}
		q, err := DecodeQuery(body)
		if err != nil {
			return ss.fail(err)
		}
		ss.hasLast = false
		res, err := ss.tx.Query(ctx, q.SQL, q.Args)
		if err != nil {
			return ss.fail(err)
		}
		ss.last, ss.hasLast = res, true
		ss.out = ss.tracker.AppendRecipe(ss.out[:0], res)
		ss.s.stats.Statements.Add(1)
		ss.s.stats.BytesRaw.Add(res.Size())
		ss.s.stats.BytesSent.Add(int64(len(ss.out)))
		return ss.send(OpRecipe, ss.out)
	case OpRefetch:
		if !ss.hasLast {
			return ss.fail(fmt.Errorf("%w: refetch without a result", ErrProtocol))
		}
		req, err := recipe.ParseRefetch(body, ss.s.cfg.Limits)
		if err != nil {
			return ss.fail(err)
		}
		ss.s.stats.Refetches.Add(1)
		if req.All {
			ss.out = recipe.AppendVerbatim(ss.out[:0], ss.last)
			ss.s.stats.BytesSent.Add(int64(len(ss.out)))
			return ss.send(OpRecipe, ss.out)
		}
		if ss.out, err = recipe.AppendFill(ss.out[:0], ss.last, req); err != nil {
			return ss.fail(err)
		}
		ss.s.stats.BytesSent.Add(int64(len(ss.out)))
		return ss.send(OpFill, ss.out)
	case OpEnd:
		ss.end()
		return ss.send(OpOK, nil)
	}
	return ss.fail(fmt.Errorf("%w: unknown op %q", ErrProtocol, op))
}
