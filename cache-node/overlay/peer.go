package overlay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	libp2pprotocol "github.com/libp2p/go-libp2p/core/protocol"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
)

// PeerProtocol is the protocol ID of requests between members. A stream
// carries the cache-node protocol's frames (package protocol): requests
// and answers, one at a time, in order. The version in the ID moves with
// protocol.Version.
const PeerProtocol libp2pprotocol.ID = "/larder/peer/1.0.0"

// PeerError is a request to another member that failed. Remote says the
// member answered with an error (its message is Err's); otherwise the
// request did not complete (no stream, a deadline, a broken stream, an
// answer that did not decode).
type PeerError struct {
	Peer   peer.ID
	Op     string // lookup, put or stats
	Remote bool
	Err    error
}

func (e *PeerError) Error() string {
	if e.Remote {
		return fmt.Sprintf("overlay: member %s refused the %s: %v", e.Peer, e.Op, e.Err)
	}
	return fmt.Sprintf("overlay: %s on member %s: %v", e.Op, e.Peer, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// errMalformedAnswer marks an answer from a member that does not decode.
// It does not wrap protocol.ErrFrame: a protocol server would read that as
// its own client's malformed request.
var errMalformedAnswer = errors.New("malformed answer")

func opName(op byte) string {
	switch op {
	case protocol.OpLookup:
		return "lookup"
	case protocol.OpPut:
		return "put"
	case protocol.OpStats:
		return "stats"
	}
	return fmt.Sprintf("op %d", op)
}

// Lookup asks member p's own store (never forwarded further).
func (o *Overlay) Lookup(ctx context.Context, p peer.ID, q protocol.LookupRequest) (protocol.LookupResponse, error) {
	var res protocol.LookupResponse
	err := o.request(ctx, p, protocol.OpLookup, protocol.AppendLookup(nil, &q), func(body []byte) error {
		var err error
		res, err = protocol.DecodeLookupResponse(body)
		return err
	})
	return res, err
}

// Put stores a version at member p (never forwarded further).
func (o *Overlay) Put(ctx context.Context, p peer.ID, req protocol.PutRequest) error {
	return o.request(ctx, p, protocol.OpPut, protocol.AppendPut(nil, &req), func(body []byte) error {
		if len(body) != 0 {
			return errors.New("put answer with a body")
		}
		return nil
	})
}

// Stats asks member p about itself.
func (o *Overlay) Stats(ctx context.Context, p peer.ID) (protocol.StatsResponse, error) {
	var st protocol.StatsResponse
	err := o.request(ctx, p, protocol.OpStats, nil, func(body []byte) error {
		var err error
		st, err = protocol.DecodeStatsResponse(body)
		return err
	})
	return st, err
}

// peerStream is a stream to a member, kept between requests: one request
// at a time, like a pooled connection of the TCP protocol. Opening a
// stream per request costs about as much again as the request.
type peerStream struct {
	s         network.Stream
	r         *bufio.Reader
	idleSince time.Time
}

// maxIdleStreams bounds the idle streams kept per member.
const maxIdleStreams = 16

// maxStreamIdle is how long an idle stream is kept: well within the
// member's PeerIdleTimeout (the same as this node's, in one overlay), so
// that a pooled stream is not closed under a request.
func (o *Overlay) maxStreamIdle() time.Duration { return o.cfg.PeerIdleTimeout / 2 }

// stream returns an idle stream to p, or a new one.
func (o *Overlay) stream(ctx context.Context, p peer.ID) (*peerStream, error) {
	var stale []*peerStream
	var ps *peerStream
	o.mu.Lock()
	pool := o.streams[p]
	for len(pool) > 0 && ps == nil {
		last := pool[len(pool)-1]
		pool = pool[:len(pool)-1]
		if time.Since(last.idleSince) < o.maxStreamIdle() {
			ps = last
		} else {
			stale = append(stale, last)
		}
	}
	o.streams[p] = pool
	o.mu.Unlock()
	for _, st := range stale {
		_ = st.s.Close()
	}
	if ps != nil {
		return ps, nil
	}
	s, err := o.host.NewStream(ctx, p, PeerProtocol)
	if err != nil {
		return nil, err
	}
	return &peerStream{s: s, r: bufio.NewReaderSize(s, 4<<10)}, nil
}

// release keeps a stream whose request completed for the next request.
func (o *Overlay) release(p peer.ID, ps *peerStream) {
	_ = ps.s.SetDeadline(time.Time{})
	ps.idleSince = time.Now()
	o.mu.Lock()
	if o.ctx.Err() == nil && len(o.streams[p]) < maxIdleStreams {
		o.streams[p] = append(o.streams[p], ps)
		ps = nil
	}
	o.mu.Unlock()
	if ps != nil {
		_ = ps.s.Close()
	}
}

// dropStreams closes the idle streams to the members not in live.
func (o *Overlay) dropStreams(live []peer.ID) {
	var drop []*peerStream
	o.mu.Lock()
	for p, pool := range o.streams {
		if _, ok := slices.BinarySearch(live, p); !ok {
			drop = append(drop, pool...)
			delete(o.streams, p)
		}
	}
	o.mu.Unlock()
	for _, ps := range drop {
		_ = ps.s.Close()
	}
}

// request sends one request to p on a stream and decodes its answer,
// within Config.RequestTimeout (or ctx's earlier deadline).
func (o *Overlay) request(ctx context.Context, p peer.ID, op byte, body []byte, decode func([]byte) error) (err error) {
	name := opName(op)
	start := time.Now()
	defer func() {
		o.m.forwardSeconds.WithLabelValues(name).Observe(time.Since(start).Seconds())
		if err != nil {
			o.m.peerErrors.WithLabelValues(name, errorKind(err)).Inc()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, o.cfg.RequestTimeout)
	defer cancel()
	fail := func(err error) error {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		} else if isTimeout(err) {
			err = fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
		}
		return &PeerError{Peer: p, Op: name, Err: err}
	}
	if d := o.cfg.AddedLatency; d > 0 {
		// Emulation of a slower link (Config.AddedLatency).
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fail(ctx.Err())
		}
	}
	ps, err := o.stream(ctx, p)
	if err != nil {
		return fail(err)
	}
	s := ps.s
	// A deadline bounds every read and write; cancelling ctx resets the
	// stream, which ends a blocked one.
	stop := context.AfterFunc(ctx, func() { _ = s.Reset() })
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	reset := func() {
		stop()
		_ = s.Reset()
	}
	var frame bytes.Buffer
	frame.Grow(6 + len(body))
	_ = protocol.WriteFrame(&frame, op, body)
	if _, err := s.Write(frame.Bytes()); err != nil {
		reset()
		return fail(err)
	}
	rop, rbody, _, err := protocol.ReadFrame(ps.r, nil, o.cfg.MaxFrame)
	if err != nil {
		reset()
		if errors.Is(err, protocol.ErrFrame) {
			return fail(fmt.Errorf("%w: %v", errMalformedAnswer, err))
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // the member closed the stream without answering
		}
		return fail(err)
	}
	switch {
	case rop == protocol.OpError:
		// The member may have closed the stream after it (a frame it
		// refused): not kept.
		stop()
		_ = s.Close()
		return &PeerError{Peer: p, Op: name, Remote: true, Err: errors.New(string(rbody))}
	case rop != op:
		reset()
		return fail(fmt.Errorf("%w: answer op %d to op %d", errMalformedAnswer, rop, op))
	}
	if err := decode(rbody); err != nil {
		reset()
		return fail(fmt.Errorf("%w: %v", errMalformedAnswer, err))
	}
	if stop() { // not reset by the end of ctx
		o.release(p, ps)
	} else {
		_ = s.Reset()
	}
	return nil
}

// isTimeout: a stream's deadline passed (yamux's error says Timeout, and
// is not os.ErrDeadlineExceeded).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// errorKind is the kind label of larder_overlay_peer_errors_total.
func errorKind(err error) string {
	var pe *PeerError
	switch {
	case errors.As(err, &pe) && pe.Remote:
		return "remote"
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return "timeout"
	case errors.Is(err, errMalformedAnswer):
		return "malformed"
	}
	return "stream"
}

// handleStream serves a member's requests on one stream.
func (o *Overlay) handleStream(s network.Stream) {
	defer s.Close()
	if !o.gater.allowed(s.Conn().RemotePeer()) { // the gater already refused the connection
		_ = s.Reset()
		return
	}
	ok := servePeer(o.ctx, s, o.cfg.Handler, peerLimits{
		maxFrame:     o.cfg.MaxFrame,
		idle:         o.cfg.PeerIdleTimeout,
		read:         o.cfg.PeerReadTimeout,
		handle:       o.cfg.ServeTimeout,
		write:        o.cfg.PeerReadTimeout,
		countRequest: func(op byte) { o.m.requests.WithLabelValues(opName(op), routeFromPeer).Inc() },
	})
	if !ok {
		_ = s.Reset()
	}
}

// deadlineStream is what servePeer needs of a stream.
type deadlineStream interface {
	io.ReadWriter
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// peerLimits bound the serving of one stream.
type peerLimits struct {
	maxFrame          int
	idle, read, write time.Duration // before a frame begins; a whole frame; an answer
	handle            time.Duration // the handler's deadline
	countRequest      func(op byte) // called for every well-formed request, if set
}

// servePeer answers the requests on a stream, one at a time, until the
// other side closes its end or a request is malformed (true: the stream
// should be closed) or something fails (false: the stream should be
// reset). A frame larger than maxFrame or malformed is answered with an
// error and ends the stream; an error of the handler is answered and the
// stream goes on.
func servePeer(ctx context.Context, s deadlineStream, h protocol.Handler, lim peerLimits) bool {
	r := bufio.NewReaderSize(s, 4<<10)
	var buf []byte
	for {
		if r.Buffered() == 0 {
			// Idle until a request begins.
			_ = s.SetReadDeadline(time.Now().Add(lim.idle))
			if _, err := r.Peek(1); err != nil {
				return err == io.EOF
			}
		}
		_ = s.SetReadDeadline(time.Now().Add(lim.read))
		op, body, nb, err := protocol.ReadFrame(r, buf, lim.maxFrame)
		buf = nb
		if err != nil {
			if errors.Is(err, protocol.ErrFrame) {
				// Answered, then closed rather than reset, so that the
				// answer arrives.
				return writeAnswer(s, lim.write, protocol.OpError, []byte(err.Error()))
			}
			return false
		}
		hctx, cancel := context.WithTimeout(ctx, lim.handle)
		rop, answer, err := dispatch(hctx, h, op, body)
		cancel()
		if err != nil {
			ok := writeAnswer(s, lim.write, protocol.OpError, []byte(err.Error()))
			if !ok || errors.Is(err, protocol.ErrFrame) {
				return ok
			}
			continue
		}
		if lim.countRequest != nil {
			lim.countRequest(op)
		}
		if !writeAnswer(s, lim.write, rop, answer) {
			return false
		}
	}
}

// writeAnswer writes one frame, in one write, within d.
func writeAnswer(s deadlineStream, d time.Duration, op byte, body []byte) bool {
	_ = s.SetWriteDeadline(time.Now().Add(d))
	var frame bytes.Buffer
	frame.Grow(6 + len(body))
	_ = protocol.WriteFrame(&frame, op, body)
	_, err := s.Write(frame.Bytes())
	return err == nil
}

// dispatch decodes a request, has h handle it and encodes the answer, as
// the protocol server does. A request that does not decode is an error
// wrapping protocol.ErrFrame.
func dispatch(ctx context.Context, h protocol.Handler, op byte, body []byte) (byte, []byte, error) {
	switch op {
	case protocol.OpLookup:
		q, err := protocol.DecodeLookup(body)
		if err != nil {
			return 0, nil, err
		}
		res, err := h.Lookup(ctx, q)
		if err != nil {
			return 0, nil, err
		}
		return op, protocol.AppendLookupResponse(nil, &res), nil
	case protocol.OpPut:
		p, err := protocol.DecodePut(body)
		if err != nil {
			return 0, nil, err
		}
		// As with protocol.Server, the handler does not keep the request's
		// bytes (the stream's buffer, reused for the next frame).
		if err := h.Put(ctx, p); err != nil {
			return 0, nil, err
		}
		return op, nil, nil
	case protocol.OpStats:
		if len(body) != 0 {
			return 0, nil, fmt.Errorf("%w: stats request with a body", protocol.ErrFrame)
		}
		st, err := h.Stats(ctx)
		if err != nil {
			return 0, nil, err
		}
		return op, protocol.AppendStatsResponse(nil, &st), nil
	}
	return 0, nil, fmt.Errorf("%w: unknown op %d", protocol.ErrFrame, op)
}

// forwarder is the node's protocol.Handler with the overlay: a lookup or
// put whose key another member masters goes to that member; the rest,
// and stats, are answered by the local node.
type forwarder struct{ o *Overlay }

func (f forwarder) Lookup(ctx context.Context, q protocol.LookupRequest) (protocol.LookupResponse, error) {
	m := f.o.Master(q.Key)
	if m == f.o.self {
		f.o.m.requests.WithLabelValues("lookup", routeLocal).Inc()
		return f.o.cfg.Handler.Lookup(ctx, q)
	}
	f.o.m.requests.WithLabelValues("lookup", routeForwarded).Inc()
	res, err := f.o.Lookup(ctx, m, q)
	if err != nil {
		return store.Result{}, err
	}
	return res, nil
}

func (f forwarder) Put(ctx context.Context, p protocol.PutRequest) error {
	m := f.o.Master(p.Key)
	if m == f.o.self {
		f.o.m.requests.WithLabelValues("put", routeLocal).Inc()
		return f.o.cfg.Handler.Put(ctx, p)
	}
	f.o.m.requests.WithLabelValues("put", routeForwarded).Inc()
	return f.o.Put(ctx, m, p)
}

func (f forwarder) Stats(ctx context.Context) (protocol.StatsResponse, error) {
	return f.o.cfg.Handler.Stats(ctx)
}
