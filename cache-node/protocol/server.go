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
// connection, in order (clients pipeline on several connections).
type Server struct {
	Handler  Handler
	MaxFrame int           // default DefaultMaxFrame
	Timeout  time.Duration // per request; default 10s
	Log      *slog.Logger

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// Serve accepts connections until ln is closed or ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.MaxFrame <= 0 {
		s.MaxFrame = DefaultMaxFrame
	}
	if s.Timeout <= 0 {
		s.Timeout = 10 * time.Second
	}
	if s.Log == nil {
		s.Log = slog.Default()
	}
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
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
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
		}()
	}
}

func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	r := bufio.NewReaderSize(c, 64<<10)
	w := bufio.NewWriterSize(c, 64<<10)
	var buf, out []byte
	for {
		op, body, nb, err := ReadFrame(r, buf, s.MaxFrame)
		buf = nb
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.Log.Warn("closing a connection after a bad frame", "remote", c.RemoteAddr().String(), "err", err)
				_ = WriteFrame(w, OpError, []byte(err.Error()))
				_ = w.Flush()
			}
			return
		}
		rctx, cancel := context.WithTimeout(ctx, s.Timeout)
		respOp, resp, err := s.dispatch(rctx, op, body, out[:0])
		cancel()
		if err != nil {
			if errors.Is(err, ErrFrame) {
				s.Log.Warn("closing a connection after a malformed request", "remote", c.RemoteAddr().String(), "err", err)
				_ = WriteFrame(w, OpError, []byte(err.Error()))
				_ = w.Flush()
				return
			}
			respOp, resp = OpError, []byte(err.Error())
		}
		out = resp
		if err := WriteFrame(w, respOp, resp); err != nil {
			return
		}
		// Flush when no further request is already waiting.
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
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
