package protocol

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the Server's limits.
const (
	DefaultMaxInFlight  = 256 << 20
	DefaultMaxConns     = 4096
	DefaultIdleTimeout  = 5 * time.Minute
	DefaultReadTimeout  = 30 * time.Second
	DefaultWriteTimeout = 30 * time.Second
)

// inFlightWait is how long a frame waits for room under MaxInFlight (at
// most until its read deadline) before it is refused.
const inFlightWait = time.Second

// Accept back-off after an error such as EMFILE: 5 ms, doubling, up to 1 s
// (as net/http's Server does).
const (
	minAcceptDelay = 5 * time.Millisecond
	maxAcceptDelay = time.Second
)

// ServerCounters is a snapshot of what a Server counts; Collector exports
// the same figures to Prometheus.
type ServerCounters struct {
	OpenConns     int64 // connections being served
	AcceptedConns int64 // connections accepted and served
	RefusedConns  int64 // connections closed at once: MaxConns were open
	AcceptErrors  int64 // failed Accepts (each followed by a back-off)

	HandshakeFailures int64 // TLS handshakes that failed other than by timing out

	IdleTimeouts      int64 // closed after IdleTimeout without a request
	ReadTimeouts      int64 // closed: a frame not received within ReadTimeout
	WriteTimeouts     int64 // closed: an answer not written within WriteTimeout
	HandshakeTimeouts int64 // closed: the TLS handshake not done within ReadTimeout

	FramesTooLarge  int64 // frames longer than MaxFrame (the connection is closed)
	FramesMalformed int64 // malformed frames and requests (the connection is closed)
	FramesBusy      int64 // frames refused because MaxInFlight was reached (answered, skipped)

	InFlightBytes int64 // request bytes admitted and not yet handled
	InFlightLimit int64 // MaxInFlight (0: none)
	ConnLimit     int64 // MaxConns (0: none)
}

// counters are the Server's live figures.
type counters struct {
	open, accepted, refused, acceptErrors                        atomic.Int64
	handshakeFailures                                            atomic.Int64
	idleTimeouts, readTimeouts, writeTimeouts, handshakeTimeouts atomic.Int64
	tooLarge, malformed, busy                                    atomic.Int64
	connLimit                                                    atomic.Int64
}

// inFlight accounts the request bytes held across connections: a frame's
// declared length is reserved when its header arrives and released once
// the request has been handled.
type inFlight struct {
	mu    sync.Mutex
	limit int64 // <= 0: none
	used  int64
	wake  chan struct{} // closed when bytes are released
}

func (b *inFlight) setLimit(limit int64) {
	b.mu.Lock()
	b.limit = limit
	b.mu.Unlock()
}

func (b *inFlight) load() (used, limit int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.limit
}

// smallFrame: frames up to this size (lookups, stats, small puts) may use
// the whole in-flight limit; larger ones only largeShare of it, so that
// large frames under way cannot starve the small ones.
const smallFrame = 64 << 10

// largeShare is the part of a limit large frames may use: 7/8.
func largeShare(limit int64) int64 { return limit - limit/8 }

// acquire reserves n bytes, waiting until until (or ctx's end) for room.
// A frame larger than its share of the limit never fits and is refused at
// once.
func (b *inFlight) acquire(ctx context.Context, n int64, until time.Time) bool {
	var timer *time.Timer
	for {
		b.mu.Lock()
		limit := b.limit
		if n > smallFrame {
			limit = largeShare(limit)
		}
		if b.limit <= 0 || b.used+n <= limit {
			b.used += n
			b.mu.Unlock()
			return true
		}
		if n > limit {
			b.mu.Unlock()
			return false
		}
		if b.wake == nil {
			b.wake = make(chan struct{})
		}
		wake := b.wake
		b.mu.Unlock()
		if timer == nil {
			d := time.Until(until)
			if d <= 0 {
				return false
			}
			timer = time.NewTimer(d)
			defer timer.Stop()
		}
		select {
		case <-wake:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func (b *inFlight) release(n int64) {
	b.mu.Lock()
	b.used -= n
	if b.wake != nil {
		close(b.wake)
		b.wake = nil
	}
	b.mu.Unlock()
}

// Counters returns a snapshot of the server's counters.
func (s *Server) Counters() ServerCounters {
	c := &s.counters
	used, limit := s.inflight.load()
	return ServerCounters{
		OpenConns: c.open.Load(), AcceptedConns: c.accepted.Load(), RefusedConns: c.refused.Load(), AcceptErrors: c.acceptErrors.Load(),
		HandshakeFailures: c.handshakeFailures.Load(),
		IdleTimeouts:      c.idleTimeouts.Load(), ReadTimeouts: c.readTimeouts.Load(), WriteTimeouts: c.writeTimeouts.Load(), HandshakeTimeouts: c.handshakeTimeouts.Load(),
		FramesTooLarge: c.tooLarge.Load(), FramesMalformed: c.malformed.Load(), FramesBusy: c.busy.Load(),
		InFlightBytes: used, InFlightLimit: max(limit, 0), ConnLimit: c.connLimit.Load(),
	}
}

// Collector exports the server's counters (see ServerCounters) to
// Prometheus; register it once, before or after Serve starts:
//
//	reg.MustRegister(srv.Collector())
func (s *Server) Collector() prometheus.Collector { return serverCollector{s} }

var (
	descOpen         = prometheus.NewDesc("larder_node_conns_open", "Protocol connections being served.", nil, nil)
	descConnLimit    = prometheus.NewDesc("larder_node_conns_limit", "Most protocol connections served at once (MaxConns; 0: none).", nil, nil)
	descAccepted     = prometheus.NewDesc("larder_node_conns_accepted_total", "Protocol connections accepted and served.", nil, nil)
	descRefused      = prometheus.NewDesc("larder_node_conns_refused_total", "Protocol connections closed at once because MaxConns were open.", nil, nil)
	descAcceptErrors = prometheus.NewDesc("larder_node_accept_errors_total", "Failed accepts (e.g. EMFILE), each followed by a back-off of 5 ms doubling to 1 s.", nil, nil)
	descHandshake    = prometheus.NewDesc("larder_node_tls_handshake_failures_total", "TLS handshakes that failed (a bad or missing client certificate, a peer that is not TLS), timeouts aside.", nil, nil)
	descTimeouts     = prometheus.NewDesc("larder_node_conn_timeouts_total", "Connections closed by a timeout, by phase: idle (no request within IdleTimeout), read (a frame or TLS handshake not completed within ReadTimeout), write (an answer not written within WriteTimeout).", []string{"phase"}, nil)
	descRefusedFrame = prometheus.NewDesc("larder_node_frames_refused_total", "Request frames refused, by reason: too_large (over MaxFrame; connection closed), malformed (connection closed), in_flight (MaxInFlight reached; answered with an error, connection kept).", []string{"reason"}, nil)
	descInFlight     = prometheus.NewDesc("larder_node_in_flight_bytes", "Request bytes admitted and not yet handled (declared frame lengths).", nil, nil)
	descInFlightMax  = prometheus.NewDesc("larder_node_in_flight_limit_bytes", "MaxInFlight: most request bytes admitted at once (0: none).", nil, nil)
)

type serverCollector struct{ s *Server }

func (c serverCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOpen, descConnLimit, descAccepted, descRefused, descAcceptErrors, descHandshake, descTimeouts, descRefusedFrame, descInFlight, descInFlightMax} {
		ch <- d
	}
}

func (c serverCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Counters()
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descOpen, st.OpenConns)
	gauge(descConnLimit, st.ConnLimit)
	counter(descAccepted, st.AcceptedConns)
	counter(descRefused, st.RefusedConns)
	counter(descAcceptErrors, st.AcceptErrors)
	counter(descHandshake, st.HandshakeFailures)
	counter(descTimeouts, st.IdleTimeouts, "idle")
	counter(descTimeouts, st.ReadTimeouts+st.HandshakeTimeouts, "read")
	counter(descTimeouts, st.WriteTimeouts, "write")
	counter(descRefusedFrame, st.FramesTooLarge, "too_large")
	counter(descRefusedFrame, st.FramesMalformed, "malformed")
	counter(descRefusedFrame, st.FramesBusy, "in_flight")
	gauge(descInFlight, st.InFlightBytes)
	gauge(descInFlightMax, st.InFlightLimit)
}

// retryableAccept reports whether an Accept error is worth waiting out
// (descriptors or buffers exhausted, an aborted handshake) rather than
// the listener being broken.
func retryableAccept(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EPERM, syscall.EINTR, syscall.EAGAIN} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// peerGone: the peer closed or reset the connection (nothing to log).
func peerGone(err error) bool {
	for _, e := range []error{io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, syscall.ECONNRESET, syscall.EPIPE} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// sometimes lets a repeated event be logged at most once per interval.
type sometimes struct{ last atomic.Int64 }

func (l *sometimes) ok(every time.Duration) bool {
	now := time.Now().UnixNano()
	last := l.last.Load()
	if last != 0 && now-last < int64(every) {
		return false
	}
	return l.last.CompareAndSwap(last, now)
}
