package origin

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/internal/recipe"
)

// ClientConfig configures an edge's Client.
type ClientConfig struct {
	Addr string // the origin's host:port
	// TLS is the client side of mutual TLS (pki.ClientTLS); nil: plain
	// TCP.
	TLS *tls.Config
	// EdgeID names the edge to the origin, which keeps one model of its
	// row store per id.
	EdgeID string
	// Budget is the edge's row store budget, sent in every hello.
	Budget recipe.Config
	// MaxIdle bounds the idle connections kept (default 16).
	MaxIdle int
	// MaxFrame bounds an answer (default 256 MiB).
	MaxFrame int
	// Timeout bounds a request whose context has no deadline (default 60s).
	Timeout time.Duration
	// DialTimeout bounds a connection's dial, TLS handshake and hello
	// each (default 10s).
	DialTimeout time.Duration
}

// Client is an edge's connection pool to an origin. Each Session holds
// one connection from Begin to End. Safe for concurrent use.
type Client struct {
	cfg ClientConfig
	// reset: the next hello asks the origin to forget the edge's model
	// (the edge's row store is empty: at start, or after Reset).
	reset atomic.Bool
	mu    sync.Mutex // guards idle, closed
	idle  []*conn
	// closed: Close was called; connections are closed, not kept.
	closed bool
}

type conn struct {
	c   net.Conn
	r   *bufio.Reader
	w   *bufio.Writer
	buf []byte
	out []byte
}

// NewClient returns a client of the origin at cfg.Addr. Its first hello
// resets the origin's model of the edge.
func NewClient(cfg ClientConfig) *Client {
	if cfg.MaxIdle <= 0 {
		cfg.MaxIdle = 16
	}
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = 256 << 20
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Minute
	}
	cl := &Client{cfg: cfg}
	cl.reset.Store(true)
	return cl
}

// Reset makes the next hello ask the origin to forget what it believes
// the edge holds (the edge emptied its row store) and drops idle
// connections.
func (cl *Client) Reset() {
	cl.reset.Store(true)
	cl.mu.Lock()
	idle := cl.idle
	cl.idle = nil
	cl.mu.Unlock()
	for _, c := range idle {
		c.c.Close()
	}
}

// Close closes the idle connections; sessions still open close theirs
// when they end.
func (cl *Client) Close() error {
	cl.mu.Lock()
	cl.closed = true
	idle := cl.idle
	cl.idle = nil
	cl.mu.Unlock()
	for _, c := range idle {
		c.c.Close()
	}
	return nil
}

func (cl *Client) get(ctx context.Context) (*conn, error) {
	cl.mu.Lock()
	if n := len(cl.idle); n > 0 {
		c := cl.idle[n-1]
		cl.idle = cl.idle[:n-1]
		cl.mu.Unlock()
		return c, nil
	}
	cl.mu.Unlock()
	d := net.Dialer{Timeout: cl.cfg.DialTimeout}
	if d.Timeout <= 0 {
		d.Timeout = 10 * time.Second
	}
	var nc net.Conn
	var err error
	if cl.cfg.TLS != nil {
		td := tls.Dialer{NetDialer: &d, Config: cl.cfg.TLS}
		nc, err = td.DialContext(ctx, "tcp", cl.cfg.Addr)
	} else {
		nc, err = d.DialContext(ctx, "tcp", cl.cfg.Addr)
	}
	if err != nil {
		return nil, fmt.Errorf("origin %s: %w", cl.cfg.Addr, err)
	}
	c := &conn{c: nc, r: bufio.NewReaderSize(nc, 64<<10), w: bufio.NewWriterSize(nc, 64<<10)}
	reset := cl.reset.Swap(false)
	h := Hello{Version: ProtoVersion, EdgeID: cl.cfg.EdgeID, Reset: reset, Budget: recipe.AppendReset(nil, cl.cfg.Budget)}
	// The hello is part of connecting: a silent origin costs the dial
	// timeout, not a request's.
	hctx, cancel := context.WithTimeout(ctx, d.Timeout)
	body, err := cl.roundTrip(hctx, c, OpHello, AppendHello(nil, &h), OpOK)
	cancel()
	if err == nil {
		var v uint64
		if v, err = DecodeVersion(body); err == nil && v != ProtoVersion {
			err = fmt.Errorf("%w: the origin speaks version %d, this edge %d", ErrProtocol, v, ProtoVersion)
		}
	}
	if err != nil {
		if reset {
			cl.reset.Store(true)
		}
		nc.Close()
		return nil, err
	}
	return c, nil
}

func (cl *Client) put(c *conn) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed || len(cl.idle) >= cl.cfg.MaxIdle {
		c.c.Close()
		return
	}
	cl.idle = append(cl.idle, c)
}

// roundTrip sends a request and reads its answer, which must be one of
// want (or an error frame, returned as *RemoteError). A transport error
// leaves the connection unusable: the caller closes it.
func (cl *Client) roundTrip(ctx context.Context, c *conn, op byte, body []byte, want ...byte) ([]byte, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(cl.cfg.Timeout)
	}
	_ = c.c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := protocol.WriteFrame(c.w, op, body); err != nil {
		return nil, cl.transport(ctx, err)
	}
	if err := c.w.Flush(); err != nil {
		return nil, cl.transport(ctx, err)
	}
	rop, rbody, nb, err := protocol.ReadFrame(c.r, c.buf, cl.cfg.MaxFrame)
	c.buf = nb
	if err != nil {
		return nil, cl.transport(ctx, err)
	}
	if rop == OpError {
		e, err := DecodeError(rbody)
		if err != nil {
			return nil, err
		}
		return nil, e
	}
	for _, w := range want {
		if rop == w {
			return rbody, nil
		}
	}
	return nil, fmt.Errorf("%w: answer %q to %q", ErrProtocol, rop, op)
}

func (cl *Client) transport(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("origin %s: %w", cl.cfg.Addr, err)
}

// Session is one edge transaction at the origin, from Begin to End. It is
// used by one goroutine at a time.
type Session struct {
	cl *Client
	c  *conn // nil once ended
}

// Begin opens a session: the origin begins at b's pin. An error leaves no
// session open.
func (cl *Client) Begin(ctx context.Context, b *Begin) (*Session, error) {
	c, err := cl.get(ctx)
	if err != nil {
		return nil, err
	}
	s := &Session{cl: cl, c: c}
	if _, err := s.do(ctx, OpBegin, AppendBegin(c.out[:0], b), OpOK); err != nil {
		s.close(err)
		return nil, err
	}
	return s, nil
}

// do runs a request. On a transport or protocol error the connection is
// closed (the origin then ends the session); an error the origin answered
// leaves it usable.
func (s *Session) do(ctx context.Context, op byte, body []byte, want ...byte) ([]byte, error) {
	if s.c == nil {
		return nil, fmt.Errorf("%w: the session has ended", ErrProtocol)
	}
	rb, err := s.cl.roundTrip(ctx, s.c, op, body, want...)
	if err != nil {
		if _, remote := err.(*RemoteError); !remote {
			s.c.c.Close()
			s.c = nil
		}
	}
	return rb, err
}

// close gives the connection back after an error the origin answered
// (its transaction is over or was never begun), or drops it.
func (s *Session) close(err error) {
	if s.c == nil {
		return
	}
	if _, remote := err.(*RemoteError); remote && err.(*RemoteError).Kind != kindOther {
		// The origin answered and kept the connection; a failed begin
		// left no transaction.
		s.cl.put(s.c)
	} else {
		s.c.c.Close()
	}
	s.c = nil
}

// Hold holds more tables in the session's transaction.
func (s *Session) Hold(ctx context.Context, tables []string) error {
	if s.c == nil {
		return fmt.Errorf("%w: the session has ended", ErrProtocol)
	}
	_, err := s.do(ctx, OpHold, AppendTables(s.c.out[:0], tables), OpOK)
	return err
}

// Query runs a statement and returns its recipe message (the caller's:
// results rebuilt from it alias it).
func (s *Session) Query(ctx context.Context, q *Query) ([]byte, error) {
	if s.c == nil {
		return nil, fmt.Errorf("%w: the session has ended", ErrProtocol)
	}
	body, err := AppendQuery(s.c.out[:0], q)
	if err != nil {
		return nil, err
	}
	s.c.out = body
	return owned(s.do(ctx, OpQuery, body, OpRecipe))
}

// owned copies an answer out of the connection's read buffer.
func owned(b []byte, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), b...), nil
}

// Refetch asks for rows of the last result (a recipe.Refetch): a fill,
// or the whole result as a verbatim recipe. It is a recipe.Origin.
func (s *Session) Refetch(ctx context.Context, req recipe.Refetch) ([]byte, error) {
	if s.c == nil {
		return nil, fmt.Errorf("%w: the session has ended", ErrProtocol)
	}
	return owned(s.do(ctx, OpRefetch, req.Append(s.c.out[:0]), OpFill, OpRecipe))
}

// End ends the session's transaction and gives the connection back.
func (s *Session) End(ctx context.Context) error {
	if s.c == nil {
		return nil
	}
	_, err := s.do(ctx, OpEnd, nil, OpOK)
	if s.c != nil {
		if err == nil {
			s.cl.put(s.c)
		} else {
			s.c.c.Close()
		}
		s.c = nil
	}
	return err
}
