package protocol

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Client talks to one cache-node over a small pool of connections.
type Client struct {
	addr     string
	maxFrame int
	dial     time.Duration
	tls      *tls.Config // nil: plain TCP

	mu   sync.Mutex
	idle []*clientConn
	max  int
}

type clientConn struct {
	c   net.Conn
	r   *bufio.Reader
	w   *bufio.Writer
	buf []byte
	out []byte

	idleSince time.Time
}

// maxClientIdle: a pooled connection idle longer is closed rather than
// used, well before the node's IdleTimeout (5 minutes by default) closes
// it under a request.
const maxClientIdle = time.Minute

// RemoteError is an error the node reported for a request.
type RemoteError struct{ Message string }

func (e *RemoteError) Error() string { return "cache-node: " + e.Message }

// NewClient returns a client for the node at addr, keeping up to maxIdle
// idle connections.
func NewClient(addr string, maxIdle int) *Client {
	if maxIdle <= 0 {
		maxIdle = 8
	}
	return &Client{addr: addr, maxFrame: DefaultMaxFrame, dial: 5 * time.Second, max: maxIdle}
}

// NewTLSClient is NewClient over TLS: cfg names the CA that signed the
// node's certificate and carries the client's own certificate, which a
// node that authenticates its peers requires.
func NewTLSClient(addr string, maxIdle int, cfg *tls.Config) *Client {
	cl := NewClient(addr, maxIdle)
	cl.tls = cfg
	return cl
}

// Lookup asks the node for a version of a key.
func (cl *Client) Lookup(ctx context.Context, q *LookupRequest) (LookupResponse, error) {
	var res LookupResponse
	err := cl.do(ctx, OpLookup, func(b []byte) []byte { return AppendLookup(b, q) }, func(body []byte) error {
		var err error
		res, err = DecodeLookupResponse(body)
		if err == nil {
			res.Value = append([]byte(nil), res.Value...) // the frame buffer is reused
		}
		return err
	})
	return res, err
}

// Put sends a version to the node.
func (cl *Client) Put(ctx context.Context, p *PutRequest) error {
	return cl.do(ctx, OpPut, func(b []byte) []byte { return AppendPut(b, p) }, func(body []byte) error {
		if len(body) != 0 {
			return fmt.Errorf("%w: put answer with a body", ErrFrame)
		}
		return nil
	})
}

// Stats asks the node about itself.
func (cl *Client) Stats(ctx context.Context) (StatsResponse, error) {
	var st StatsResponse
	err := cl.do(ctx, OpStats, func(b []byte) []byte { return b }, func(body []byte) error {
		var err error
		st, err = DecodeStatsResponse(body)
		return err
	})
	return st, err
}

// Close closes the idle connections.
func (cl *Client) Close() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, c := range cl.idle {
		c.c.Close()
	}
	cl.idle = nil
	return nil
}

func (cl *Client) do(ctx context.Context, op byte, enc func([]byte) []byte, dec func([]byte) error) error {
	c, err := cl.get(ctx)
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.c.SetDeadline(dl)
	} else {
		_ = c.c.SetDeadline(time.Time{})
	}
	c.out = enc(c.out[:0])
	if err := WriteFrame(c.w, op, c.out); err != nil {
		c.c.Close()
		return fmt.Errorf("cache-node %s: %w", cl.addr, err)
	}
	if err := c.w.Flush(); err != nil {
		c.c.Close()
		return fmt.Errorf("cache-node %s: %w", cl.addr, err)
	}
	rop, body, nb, err := ReadFrame(c.r, c.buf, cl.maxFrame)
	c.buf = nb
	if err != nil {
		c.c.Close()
		return fmt.Errorf("cache-node %s: %w", cl.addr, err)
	}
	if rop == OpError {
		msg := string(body) // body is the connection's buffer: copied before it is pooled
		cl.put(c)
		return &RemoteError{Message: msg}
	}
	if rop != op {
		c.c.Close()
		return fmt.Errorf("%w: answer op %d to op %d", ErrFrame, rop, op)
	}
	if err := dec(body); err != nil {
		c.c.Close()
		return err
	}
	cl.put(c)
	return nil
}

func (cl *Client) get(ctx context.Context) (*clientConn, error) {
	cl.mu.Lock()
	var reuse *clientConn
	var stale []*clientConn
	for n := len(cl.idle); n > 0 && reuse == nil; n-- {
		c := cl.idle[n-1]
		cl.idle = cl.idle[:n-1]
		if time.Since(c.idleSince) < maxClientIdle {
			reuse = c
		} else {
			stale = append(stale, c)
		}
	}
	cl.mu.Unlock()
	for _, c := range stale {
		c.c.Close()
	}
	if reuse != nil {
		return reuse, nil
	}
	d := net.Dialer{Timeout: cl.dial}
	var c net.Conn
	var err error
	if cl.tls != nil {
		td := tls.Dialer{NetDialer: &d, Config: cl.tls}
		c, err = td.DialContext(ctx, "tcp", cl.addr) // the handshake included
	} else {
		c, err = d.DialContext(ctx, "tcp", cl.addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cache-node %s: %w", cl.addr, err)
	}
	return &clientConn{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}, nil
}

func (cl *Client) put(c *clientConn) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if len(cl.idle) >= cl.max {
		c.c.Close()
		return
	}
	c.idleSince = time.Now()
	cl.idle = append(cl.idle, c)
}

// IsRemote reports whether err came from the node (the request reached it).
func IsRemote(err error) bool {
	var re *RemoteError
	return errors.As(err, &re)
}
