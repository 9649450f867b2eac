package protocol

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/larderdb/larder/cache-node/store"
)

// Handler is what a server serves: package node's Node, adapted.
type Handler interface {
	Lookup(ctx context.Context, q LookupRequest) (LookupResponse, error)
	Put(ctx context.Context, p PutRequest) error
	Stats(ctx context.Context) (StatsResponse, error)
}

// Server answers requests on TCP connections, one at a time per
// connection, in order (clients pipeline on several connections). It
// serves any net.Listener; over TLS (tls.NewListener) the handshake is
// bounded by ReadTimeout.
//
// Limits (zero values take the defaults; a negative value disables a
// limit):
//   - MaxConns connections are served at once; further ones are closed as
//     soon as they are accepted (RefusedConns).
//   - A connection may wait IdleTimeout for its next request; once a
//     frame's first byte (or the TLS handshake) has arrived, the whole of it
//     must within ReadTimeout; an answer must be written within
//     WriteTimeout. Otherwise the connection is closed.
//   - A frame is at most MaxFrame long, else it is answered with an error
//     and the connection closed. Its buffer grows as its bytes arrive.
//   - MaxInFlight bounds the request bytes held across all connections:
//     a frame's declared length is reserved when its header arrives and
//     released once the request has been handled. Frames over 64 KiB may
//     only use 7/8 of it, so that they cannot starve lookups. A frame that
//     does not fit waits for room up to a second (within its ReadTimeout);
//     then its body is read and discarded, it is answered with an error
//     ("node busy") and the connection goes on. MaxInFlight is raised so
//     that a frame of MaxFrame fits.
//
// Accept errors such as EMFILE do not stop the server: it backs off (5 ms,
// doubling up to 1 s), logs and counts them, and accepts again.
type Server struct {
	Handler      Handler
	MaxFrame     int           // default DefaultMaxFrame
	Timeout      time.Duration // per request; default 10s
	MaxInFlight  int64         // default DefaultMaxInFlight
	MaxConns     int           // default DefaultMaxConns
	IdleTimeout  time.Duration // default DefaultIdleTimeout
	ReadTimeout  time.Duration // default DefaultReadTimeout
	WriteTimeout time.Duration // default DefaultWriteTimeout
	Log          *slog.Logger

	counters   counters
	inflight   inFlight
	refusedLog sometimes
	busyLog    sometimes
	tlsLog     sometimes

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Buffers: a connection keeps a small reader and writer; frame and answer
// buffers come from a pool between requests (those up to pooledBuf), so
// an idle connection holds no more.
const (
	connBuf   = 4 << 10
	pooledBuf = 64 << 10
)

var bufPool sync.Pool // of *[]byte

func getBuf() []byte {
	if p, ok := bufPool.Get().(*[]byte); ok {
		return (*p)[:0]
	}
	return nil
}

func putBuf(b []byte) {
	if cap(b) == 0 || cap(b) > pooledBuf {
		return
	}
	b = b[:0]
	bufPool.Put(&b)
}

// orDefault: zero takes the default, a negative value disables.
func orDefault[T int | int64 | time.Duration](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func (s *Server) setDefaults() {
	if s.MaxFrame <= 0 {
		s.MaxFrame = DefaultMaxFrame
	}
	if s.Timeout <= 0 {
		s.Timeout = 10 * time.Second
	}
	s.MaxInFlight = orDefault(s.MaxInFlight, DefaultMaxInFlight)
	if s.MaxInFlight > 0 && largeShare(s.MaxInFlight) < int64(s.MaxFrame) {
		s.MaxInFlight = int64(s.MaxFrame)*8/7 + 8 // a frame of MaxFrame fits
	}
	s.MaxConns = orDefault(s.MaxConns, DefaultMaxConns)
	s.IdleTimeout = orDefault(s.IdleTimeout, DefaultIdleTimeout)
	s.ReadTimeout = orDefault(s.ReadTimeout, DefaultReadTimeout)
	s.WriteTimeout = orDefault(s.WriteTimeout, DefaultWriteTimeout)
	if s.Log == nil {
		s.Log = slog.Default()
	}
	s.inflight.setLimit(s.MaxInFlight)
	s.counters.connLimit.Store(int64(s.MaxConns))
}

// Serve accepts connections until ln is closed or ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.setDefaults()
	s.mu.Lock()
	s.conns = map[net.Conn]struct{}{}
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer func() {
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	}()
	var delay time.Duration // accept back-off
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			if !retryableAccept(err) {
				return err
			}
			delay = min(max(2*delay, minAcceptDelay), maxAcceptDelay)
			n := s.counters.acceptErrors.Add(1)
			s.Log.Warn("accept failed; retrying", "err", err, "in", delay, "errors", n)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
			continue
		}
		delay = 0
		if s.MaxConns > 0 && s.counters.open.Load() >= int64(s.MaxConns) {
			n := s.counters.refused.Add(1)
			c.Close()
			if s.refusedLog.ok(10 * time.Second) {
				s.Log.Warn("refusing connections: the connection limit is reached", "max_conns", s.MaxConns, "refused", n)
			}
			continue
		}
		s.counters.open.Add(1)
		s.counters.accepted.Add(1)
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
			s.counters.open.Add(-1)
		}()
	}
}

// deadline is now + d, or none for d <= 0.
func deadline(d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return time.Now().Add(d)
}

func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	raw := c
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok {
		raw = nc.NetConn()
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if h, ok := c.(interface {
		HandshakeContext(context.Context) error
	}); ok {
		// Otherwise the handshake would run inside the first read, under
		// the idle deadline.
		_ = c.SetDeadline(deadline(s.ReadTimeout))
		if err := h.HandshakeContext(ctx); err != nil {
			switch {
			case ctx.Err() != nil, peerGone(err):
			case isTimeout(err):
				s.counters.handshakeTimeouts.Add(1)
			default:
				n := s.counters.handshakeFailures.Add(1)
				if s.tlsLog.ok(10 * time.Second) {
					s.Log.Warn("TLS handshake failed", "remote", c.RemoteAddr().String(), "err", err, "failures", n)
				}
			}
			return
		}
		_ = c.SetWriteDeadline(time.Time{})
	}
	r := bufio.NewReaderSize(c, connBuf)
	w := bufio.NewWriterSize(c, connBuf)
	for {
		if r.Buffered() == 0 {
			// Idle until a request begins.
			_ = c.SetReadDeadline(deadline(s.IdleTimeout))
			if _, err := r.Peek(1); err != nil {
				if isTimeout(err) {
					s.counters.idleTimeouts.Add(1)
					s.Log.Debug("closing an idle connection", "remote", c.RemoteAddr().String())
				}
				return
			}
		}
		if !s.serveRequest(ctx, c, r, w) {
			return
		}
	}
}

// serveRequest reads, handles and answers one request; false closes the
// connection.
func (s *Server) serveRequest(ctx context.Context, c net.Conn, r *bufio.Reader, w *bufio.Writer) bool {
	dl := deadline(s.ReadTimeout)
	_ = c.SetReadDeadline(dl)
	n, err := readLength(r, s.MaxFrame)
	if err != nil {
		return s.readFailed(c, w, err)
	}
	until := time.Now().Add(inFlightWait)
	if !dl.IsZero() && dl.Before(until) {
		until = dl
	}
	if !s.inflight.acquire(ctx, int64(n), until) {
		busy := s.counters.busy.Add(1)
		if s.busyLog.ok(10 * time.Second) {
			s.Log.Warn("refusing requests: in-flight request bytes at the limit", "max_in_flight", s.MaxInFlight, "refused", busy)
		}
		if _, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
			return s.readFailed(c, w, truncated(err))
		}
		return s.answer(c, r, w, OpError, []byte(fmt.Sprintf("node busy: %d request bytes in flight at most", s.MaxInFlight)))
	}
	op, body, buf, err := readBody(r, getBuf(), n)
	if err != nil {
		s.inflight.release(int64(n))
		putBuf(buf)
		return s.readFailed(c, w, err)
	}
	rctx, cancel := context.WithTimeout(ctx, s.Timeout)
	respOp, resp, err := s.dispatch(rctx, op, body, getBuf())
	cancel()
	putBuf(buf) // handlers do not keep the request's bytes
	s.inflight.release(int64(n))
	if err != nil {
		if errors.Is(err, ErrFrame) {
			s.counters.malformed.Add(1)
			s.Log.Warn("closing a connection after a malformed request", "remote", c.RemoteAddr().String(), "err", err)
			s.writeError(c, w, err)
			return false
		}
		respOp, resp = OpError, []byte(err.Error())
	}
	ok := s.answer(c, r, w, respOp, resp)
	putBuf(resp)
	return ok
}

// answer writes an answer, flushing it unless a further request is
// already waiting.
func (s *Server) answer(c net.Conn, r *bufio.Reader, w *bufio.Writer, op byte, body []byte) bool {
	_ = c.SetWriteDeadline(deadline(s.WriteTimeout))
	err := WriteFrame(w, op, body)
	if err == nil && r.Buffered() == 0 {
		err = w.Flush()
	}
	if err != nil {
		if isTimeout(err) {
			s.counters.writeTimeouts.Add(1)
			s.Log.Debug("closing a connection: answer not written in time", "remote", c.RemoteAddr().String())
		}
		return false
	}
	return true
}

// readFailed handles a failed frame read; the connection is closed.
func (s *Server) readFailed(c net.Conn, w *bufio.Writer, err error) bool {
	switch {
	case isTimeout(err):
		s.counters.readTimeouts.Add(1)
		s.Log.Debug("closing a connection: frame not received in time", "remote", c.RemoteAddr().String())
	case errors.Is(err, ErrFrame):
		if errors.Is(err, errTooLarge) {
			s.counters.tooLarge.Add(1)
		} else {
			s.counters.malformed.Add(1)
		}
		s.Log.Warn("closing a connection after a bad frame", "remote", c.RemoteAddr().String(), "err", err)
		s.writeError(c, w, err)
	case peerGone(err):
	default:
		s.Log.Debug("closing a connection after a read error", "remote", c.RemoteAddr().String(), "err", err)
	}
	return false
}

func (s *Server) writeError(c net.Conn, w *bufio.Writer, err error) {
	_ = c.SetWriteDeadline(deadline(s.WriteTimeout))
	if WriteFrame(w, OpError, []byte(err.Error())) == nil {
		_ = w.Flush()
	}
}

func (s *Server) dispatch(ctx context.Context, op byte, body, out []byte) (byte, []byte, error) {
	switch op {
	case OpLookup:
		q, err := DecodeLookup(body)
		if err != nil {
			return 0, nil, err
		}
		res, err := s.Handler.Lookup(ctx, q)
		if err != nil {
			return 0, nil, err
		}
		return OpLookup, AppendLookupResponse(out, &res), nil
	case OpPut:
		p, err := DecodePut(body)
		if err != nil {
			return 0, nil, err
		}
		if err := s.Handler.Put(ctx, p); err != nil {
			if errors.Is(err, store.ErrTooLarge) {
				return OpError, []byte(err.Error()), nil
			}
			return 0, nil, err
		}
		return OpPut, out, nil
	case OpStats:
		if len(body) != 0 {
			return 0, nil, fmt.Errorf("%w: stats request with a body", ErrFrame)
		}
		st, err := s.Handler.Stats(ctx)
		if err != nil {
			return 0, nil, err
		}
		return OpStats, AppendStatsResponse(out, &st), nil
	}
	return 0, nil, fmt.Errorf("%w: unknown op %d", ErrFrame, op)
}
