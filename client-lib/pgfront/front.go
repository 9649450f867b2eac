package pgfront

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// Front speaks PostgreSQL's wire protocol to clients and relays their
// sessions to PostgreSQL, answering Larder read-only transactions through
// the library. Safe for concurrent use.
type Front struct {
	cfg      Config
	ln       net.Listener
	m        *frontMetrics
	stats    Stats
	classify *classifier
	descs    *descriptions
	ids      atomic.Uint64

	mu sync.Mutex // guards the fields below
	// sessions holds the open sessions by their connection (to close them);
	// keys, PostgreSQL's cancel keys of the open sessions.
	sessions map[*session]struct{}
	keys     map[cancelKey]*session
	closed   bool
	ran      bool
	wg       sync.WaitGroup // the sessions' goroutines
}

// cancelKey is a session's BackendKeyData, which its cancel requests name.
type cancelKey struct {
	pid    uint32
	secret string
}

// New checks cfg and listens on cfg.Listen; Run serves.
func New(cfg Config) (*Front, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, err
	}
	return &Front{cfg: cfg, ln: ln, m: newFrontMetrics(cfg.Metrics), classify: newClassifier(4096),
		descs: newDescriptions(cfg.Descriptions), sessions: map[*session]struct{}{}, keys: map[cancelKey]*session{}}, nil
}

// Addr is the address the front listens on.
func (f *Front) Addr() net.Addr { return f.ln.Addr() }

// Stats returns the front's counters.
func (f *Front) Stats() *Stats { return &f.stats }

// Run serves clients until ctx ends, then closes every session and returns
// once their goroutines have ended.
func (f *Front) Run(ctx context.Context) error {
	f.mu.Lock()
	if f.closed || f.ran {
		f.mu.Unlock()
		return ErrClosed
	}
	f.ran = true
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer stop()
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			f.Close()
			f.wg.Wait()
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		s := f.newSession(conn)
		if s == nil {
			conn.Close()
			continue
		}
		go func() {
			defer f.wg.Done()
			s.serve(ctx)
		}()
	}
}

// newSession registers a session for conn (nil once the front closed).
func (f *Front) newSession(conn net.Conn) *session {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	s := newSession(f, conn, f.ids.Add(1))
	f.sessions[s] = struct{}{}
	f.wg.Add(1)
	return s
}

// Close stops listening and closes every session's connections. Run
// returns once their goroutines end. Idempotent.
func (f *Front) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	sessions := make([]*session, 0, len(f.sessions))
	for s := range f.sessions {
		sessions = append(sessions, s)
	}
	f.mu.Unlock()
	err := f.ln.Close()
	for _, s := range sessions {
		s.closeConns()
	}
	return err
}

// registerKey makes a session's cancel key known (its cancel requests are
// forwarded).
func (f *Front) registerKey(s *session, k cancelKey) {
	f.mu.Lock()
	f.keys[k] = s
	f.mu.Unlock()
}

// forget drops an ended session.
func (f *Front) forget(s *session) {
	f.mu.Lock()
	delete(f.sessions, s)
	if s.key != nil {
		delete(f.keys, *s.key)
	}
	f.mu.Unlock()
}

// cancel forwards a cancel request naming a session of this front to
// PostgreSQL, with the key PostgreSQL gave that session. Others are
// dropped, as PostgreSQL drops a request whose key does not match.
func (f *Front) cancel(ctx context.Context, k cancelKey) {
	f.mu.Lock()
	s := f.keys[k]
	f.mu.Unlock()
	if s == nil {
		f.refuse(refusedCancel)
		f.cfg.Log.Info("pgfront: cancel request for no session of this front", "pid", k.pid)
		return
	}
	if err := sendCancel(ctx, &f.cfg, k.pid, []byte(k.secret)); err != nil {
		f.cfg.Log.Warn("pgfront: forwarding a cancel request failed", "pid", k.pid, "err", err)
	}
}

// refuse counts refused input.
func (f *Front) refuse(reason string) {
	f.stats.Refused.Add(1)
	f.m.refused.WithLabelValues(reason).Inc()
}

// descriptions keeps statement descriptions by session state, text and
// declared parameter types: a Parse inside a Larder transaction that
// finds one is answered without asking PostgreSQL. Safe for concurrent
// use.
type descriptions struct {
	mu  sync.Mutex
	m   map[string]*stmtDesc // cleared when full
	max int
}

// stmtDesc is what PostgreSQL describes a prepared statement as.
type stmtDesc struct {
	params []uint32                  // ParameterDescription
	fields []pgconn.FieldDescription // RowDescription; nil: NoData
}

func newDescriptions(max int) *descriptions {
	return &descriptions{m: map[string]*stmtDesc{}, max: max}
}

func (d *descriptions) get(key string) *stmtDesc {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m[key]
}

func (d *descriptions) put(key string, desc *stmtDesc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.m) >= d.max {
		clear(d.m)
	}
	d.m[key] = desc
}

// tlsConfig is the TLS configuration offered to clients (nil: none).
func (f *Front) tlsConfig() *tls.Config { return f.cfg.TLS }
