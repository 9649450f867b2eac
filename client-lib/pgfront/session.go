package pgfront

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	larder "github.com/larderdb/larder/client-lib"
)

// startupTimeout bounds a client's start-up, authentication included (as
// PostgreSQL's authentication_timeout does).
const startupTimeout = time.Minute

// flushAt is how much output is buffered before it is written without
// waiting for a better moment.
const flushAt = 64 << 10

// session is one client connection and its own PostgreSQL connection.
//
// Two goroutines share it. The session's own (serve) reads the client's
// messages and owns everything but the pump's fields: it forwards
// messages to PostgreSQL, and in a Larder transaction answers them
// through the library on the pgx connection. The pump relays PostgreSQL's
// answers to the client while the session is not in a Larder transaction
// (see pump); it parks while the library uses the connection.
type session struct {
	f   *Front
	id  uint64
	log *slog.Logger

	client *clientConn
	be     *pgproto3.Backend
	cw     *clientWriter
	up     *upstreamConn
	pg     *pgx.Conn
	sc     *larder.SessionConn
	pump   *pump
	key    *cancelKey
	// closing is closed (once) when the session's connections close.
	closing chan struct{}
	closed  sync.Once

	// upBuf holds messages for PostgreSQL not yet written (written when
	// the session is about to wait for the client, or when large).
	upBuf []byte
	// cycle is what was forwarded since the client's last Sync.
	cycle cycleState
	// stmts are the client's prepared statements by name ("" unnamed),
	// as far as the front has seen them.
	stmts map[string]*preparedStmt
	// skipToSync: an error ended an extended-protocol cycle the front
	// answers itself; messages are ignored up to the next Sync.
	skipToSync bool
	// staleness is the session's larder.staleness.
	staleness time.Duration
	// ltx is the Larder transaction in progress (nil outside one), and
	// portals its portals.
	ltx     *larderTx
	portals map[string]*portal
	// pendingBinds are Binds of the Larder transaction not answered yet
	// (settleBinds), in order.
	pendingBinds []*portal
	// notifications arrived while the library used the connection; they
	// go to the client when the Larder transaction ends.
	notifications []*pgproto3.NotificationResponse
	// relayNotices: the library runs a client's statement, whose notices
	// go to the client (those of the library's own statements do not).
	relayNotices bool
	// startStatus and startParams are what PostgreSQL said at start-up:
	// the transaction status and the reported settings (the pump follows
	// both from there).
	startStatus byte
	startParams map[string]string
}

// cycleState tracks an extended-protocol cycle being forwarded.
type cycleState struct {
	forwarded bool // a message went to PostgreSQL since the last Sync
	executed  bool // an Execute or a function call did
	// bound holds the portals bound since the last Sync, by name, with
	// their statements (nil: a statement the front does not know).
	bound map[string]*preparedStmt
}

// preparedStmt is a prepared statement of the client's.
type preparedStmt struct {
	sql  string
	oids []uint32 // the types the Parse declared
	// info classifies the statement (classified: it is set).
	info       stmtInfo
	classified bool
	// wrote, changed: run outside a Larder transaction, it may write or
	// change the session's state.
	wrote, changed bool
	// desc is PostgreSQL's description, once known.
	desc *stmtDesc
	// onUpstream: PostgreSQL holds it under its name. A statement parsed
	// in a Larder transaction from a known description is not sent there
	// until the transaction ends.
	onUpstream bool
}

func newSession(f *Front, conn net.Conn, id uint64) *session {
	s := &session{f: f, id: id, log: f.cfg.Log.With("session", id), stmts: map[string]*preparedStmt{},
		staleness: f.cfg.DefaultStaleness, closing: make(chan struct{})}
	s.client = &clientConn{Conn: conn, beforeRead: s.beforeClientRead}
	s.cw = &clientWriter{w: s.client}
	s.be = pgproto3.NewBackend(s.client, s.client)
	s.be.SetMaxBodyLen(f.cfg.MaxMessageBytes)
	s.cycle.bound = map[string]*preparedStmt{}
	return s
}

// serve runs the session to its end.
func (s *session) serve(ctx context.Context) {
	defer s.finish()
	defer func() {
		// Every input is handled without panicking; should a bug panic
		// here, the session ends and the front goes on.
		if r := recover(); r != nil {
			s.log.Error("pgfront: session failed", "panic", r)
			s.cw.send(fatal(codeInternal, "internal error in the Larder front: %v", r))
			_ = s.cw.flush()
		}
	}()
	if !s.startup(ctx) {
		return
	}
	s.f.stats.Sessions.Add(1)
	s.f.stats.Open.Add(1)
	s.f.m.sessions.Inc()
	s.f.m.open.Inc()
	defer func() {
		s.f.stats.Open.Add(-1)
		s.f.m.open.Dec()
	}()
	s.pump = newPump(s)
	go s.pump.run()
	for {
		msg, err := s.be.Receive()
		if err != nil {
			if !isClosed(err) {
				s.f.refuse(refusedProtocol)
				s.log.Info("pgfront: malformed message from the client; ending the session", "err", err)
				s.cw.send(fatal(codeProtocolViolation, "invalid message from the client: %v", err))
				_ = s.cw.flush()
			}
			return
		}
		if quit := s.handle(ctx, msg); quit {
			return
		}
	}
}

// handle answers or forwards one client message; quit ends the session.
func (s *session) handle(ctx context.Context, msg pgproto3.FrontendMessage) (quit bool) {
	if _, ok := msg.(*pgproto3.Terminate); ok {
		if s.ltx != nil {
			_ = s.endLarder(ctx)
		}
		s.forward(msg)
		_ = s.flushUp()
		return true
	}
	if s.skipToSync {
		if _, ok := msg.(*pgproto3.Sync); ok {
			s.skipToSync = false
			s.readyForQuery()
		}
		return false
	}
	if s.ltx != nil {
		s.handleLarder(ctx, msg)
	} else {
		s.handleRelay(ctx, msg)
	}
	if s.pg.IsClosed() {
		s.log.Info("pgfront: the connection to PostgreSQL broke; ending the session")
		s.cw.send(fatal(codeConnectionFailure, "the Larder front lost its connection to PostgreSQL"))
		_ = s.cw.flush()
		return true
	}
	return false
}

// readyForQuery tells the client the session's transaction status.
func (s *session) readyForQuery() { s.cw.send(&pgproto3.ReadyForQuery{TxStatus: s.txStatus()}) }

// txStatus is the session's transaction status as the client sees it.
func (s *session) txStatus() byte {
	if s.ltx != nil {
		if s.ltx.failed {
			return 'E'
		}
		return 'T'
	}
	return s.pump.lastStatus()
}

// beforeClientRead runs before the session waits for the client: what is
// buffered for PostgreSQL and for the client goes out.
func (s *session) beforeClientRead() {
	if err := s.flushUp(); err != nil {
		s.log.Info("pgfront: writing to PostgreSQL failed", "err", err)
		s.closeConns()
	}
	_ = s.cw.flush()
}

// finish closes the session's connections and waits for its pump.
func (s *session) finish() {
	s.closeConns()
	if s.pump != nil {
		<-s.pump.done
	}
	s.f.forget(s)
}

// closeConns closes both connections (the pump and a blocked read end).
func (s *session) closeConns() {
	s.closed.Do(func() {
		close(s.closing)
		s.client.Close()
		if s.up != nil {
			s.up.Close()
		}
	})
}

// startup answers the client's start-up requests and relays its
// authentication with PostgreSQL; true once the session is ready.
func (s *session) startup(ctx context.Context) bool {
	_ = s.client.SetDeadline(time.Now().Add(startupTimeout))
	defer func() { _ = s.client.SetDeadline(time.Time{}) }()
	for {
		msg, err := s.be.ReceiveStartupMessage()
		if err != nil {
			if !isClosed(err) {
				s.f.refuse(refusedProtocol)
				s.log.Info("pgfront: malformed start-up from the client", "err", err)
				s.cw.send(fatal(codeProtocolViolation, "invalid start-up packet: %v", err))
				_ = s.cw.flush()
			}
			return false
		}
		switch m := msg.(type) {
		case *pgproto3.SSLRequest:
			if s.f.tlsConfig() == nil {
				if s.cw.writeRaw([]byte{'N'}) != nil {
					return false
				}
				continue
			}
			if s.cw.writeRaw([]byte{'S'}) != nil {
				return false
			}
			tc := tls.Server(s.client.Conn, s.f.tlsConfig())
			if err := tc.HandshakeContext(ctx); err != nil {
				s.f.refuse(refusedTLS)
				s.log.Info("pgfront: TLS handshake with the client failed", "err", err)
				return false
			}
			s.client.Conn = tc
			s.be = pgproto3.NewBackend(s.client, s.client)
			s.be.SetMaxBodyLen(s.f.cfg.MaxMessageBytes)
		case *pgproto3.GSSEncRequest:
			if s.cw.writeRaw([]byte{'N'}) != nil {
				return false
			}
		case *pgproto3.CancelRequest:
			s.f.cancel(ctx, cancelKey{pid: m.ProcessID, secret: string(m.SecretKey)})
			return false
		case *pgproto3.StartupMessage:
			return s.authenticate(ctx, m)
		default:
			s.f.refuse(refusedProtocol)
			return false
		}
	}
}

// authenticate opens the session's PostgreSQL connection as the client's
// user and database and relays the authentication exchange, message by
// message, until PostgreSQL is ready or refuses.
func (s *session) authenticate(ctx context.Context, m *pgproto3.StartupMessage) bool {
	if r := strings.ToLower(m.Parameters["replication"]); r != "" && r != "false" && r != "off" && r != "no" && r != "0" {
		s.f.refuse(refusedReplication)
		s.f.m.startups.WithLabelValues("refused").Inc()
		s.cw.send(fatal(codeFeatureNotSupported, "the Larder front does not relay replication connections; connect to PostgreSQL directly"))
		_ = s.cw.flush()
		return false
	}
	user, database := m.Parameters["user"], m.Parameters["database"]
	if database == "" {
		database = user
	}
	conn, err := dialPostgres(ctx, &s.f.cfg)
	if err != nil {
		s.f.m.startups.WithLabelValues("error").Inc()
		s.log.Warn("pgfront: cannot reach PostgreSQL", "err", err)
		s.cw.send(fatal(codeConnectionFailure, "the Larder front cannot reach PostgreSQL: %v", err))
		_ = s.cw.flush()
		return false
	}
	s.up = &upstreamConn{Conn: conn}
	_ = conn.SetDeadline(time.Now().Add(startupTimeout))
	fe := pgproto3.NewFrontend(s.up, s.up)
	fe.Send(m)
	if err := fe.Flush(); err != nil {
		return s.startupFailed("error", err)
	}
	st := &startupState{params: map[string]string{}}
	for {
		msg, err := fe.Receive()
		if err != nil {
			return s.startupFailed("error", err)
		}
		switch m := msg.(type) {
		case *pgproto3.AuthenticationOk, *pgproto3.AuthenticationSASLFinal, *pgproto3.NoticeResponse, *pgproto3.NegotiateProtocolVersion:
			s.cw.send(m)
		case *pgproto3.AuthenticationCleartextPassword:
			s.cw.send(m)
			if !s.relayAuthResponse(fe, pgproto3.AuthTypeCleartextPassword) {
				return false
			}
		case *pgproto3.AuthenticationMD5Password:
			s.cw.send(m)
			if !s.relayAuthResponse(fe, pgproto3.AuthTypeMD5Password) {
				return false
			}
		case *pgproto3.AuthenticationSASL:
			s.cw.send(m)
			if !s.relayAuthResponse(fe, pgproto3.AuthTypeSASL) {
				return false
			}
		case *pgproto3.AuthenticationSASLContinue:
			s.cw.send(m)
			if !s.relayAuthResponse(fe, pgproto3.AuthTypeSASLContinue) {
				return false
			}
		case *pgproto3.ParameterStatus:
			st.params[m.Name] = m.Value
			s.cw.send(m)
		case *pgproto3.BackendKeyData:
			st.pid, st.secretKey = m.ProcessID, append([]byte(nil), m.SecretKey...)
			s.cw.send(m)
		case *pgproto3.ErrorResponse:
			s.cw.send(m)
			_ = s.cw.flush()
			s.f.m.startups.WithLabelValues("auth").Inc()
			return false
		case *pgproto3.ReadyForQuery:
			if fe.ReadBufferLen() != 0 {
				return s.startupFailed("error", fmt.Errorf("PostgreSQL sent %d bytes after ReadyForQuery", fe.ReadBufferLen()))
			}
			_ = conn.SetDeadline(time.Time{})
			pgc, err := connectPgx(ctx, &s.f.cfg, s.up, user, database, st, s.onNotice, s.onNotification)
			if err != nil {
				return s.startupFailed("error", err)
			}
			s.pg = pgc
			s.sc = s.f.cfg.Client.NewSessionConn(pgc, larder.NewSession())
			s.startStatus = m.TxStatus
			s.startParams = st.params
			k := cancelKey{pid: st.pid, secret: string(st.secretKey)}
			s.key = &k
			s.f.registerKey(s, k)
			s.f.m.startups.WithLabelValues("ok").Inc()
			s.cw.send(m)
			return true
		default:
			s.f.refuse(refusedUnsupported)
			s.f.m.startups.WithLabelValues("refused").Inc()
			s.log.Info("pgfront: PostgreSQL asked for an authentication the front does not relay", "message", fmt.Sprintf("%T", msg))
			s.cw.send(fatal(codeFeatureNotSupported, "the Larder front does not relay this authentication method (%T)", msg))
			_ = s.cw.flush()
			return false
		}
	}
}

// relayAuthResponse passes the client's answer to an authentication
// request (a password, a SASL message) to PostgreSQL as it came.
func (s *session) relayAuthResponse(fe *pgproto3.Frontend, authType uint32) bool {
	if err := s.cw.flush(); err != nil {
		return false
	}
	if err := s.be.SetAuthType(authType); err != nil {
		return s.startupFailed("error", err)
	}
	msg, err := s.be.Receive()
	if err != nil {
		return false // the client gave up (no password, say)
	}
	switch msg.(type) {
	case *pgproto3.PasswordMessage, *pgproto3.SASLInitialResponse, *pgproto3.SASLResponse:
	default:
		s.f.refuse(refusedProtocol)
		s.cw.send(fatal(codeProtocolViolation, "expected an authentication response, got %T", msg))
		_ = s.cw.flush()
		return false
	}
	fe.Send(msg)
	if err := fe.Flush(); err != nil {
		return s.startupFailed("error", err)
	}
	return true
}

// startupFailed ends a start-up the front could not complete.
func (s *session) startupFailed(outcome string, err error) bool {
	s.f.m.startups.WithLabelValues(outcome).Inc()
	s.log.Warn("pgfront: session start-up failed", "err", err)
	s.cw.send(fatal(codeConnectionFailure, "the Larder front could not start the session: %v", err))
	_ = s.cw.flush()
	return false
}

// onNotice passes PostgreSQL's notices about a client's statement the
// library runs to the client; those about the library's own statements
// are not the client's.
func (s *session) onNotice(_ *pgconn.PgConn, n *pgconn.Notice) {
	if !s.relayNotices {
		return
	}
	s.cw.send(&pgproto3.NoticeResponse{
		Severity: n.Severity, SeverityUnlocalized: n.SeverityUnlocalized, Code: n.Code, Message: n.Message,
		Detail: n.Detail, Hint: n.Hint, Position: n.Position, InternalPosition: n.InternalPosition,
		InternalQuery: n.InternalQuery, Where: n.Where, SchemaName: n.SchemaName, TableName: n.TableName,
		ColumnName: n.ColumnName, DataTypeName: n.DataTypeName, ConstraintName: n.ConstraintName,
		File: n.File, Line: n.Line, Routine: n.Routine,
	})
}

// onNotification keeps a notification that arrived while the library used
// the connection for the end of the Larder transaction.
func (s *session) onNotification(_ *pgconn.PgConn, n *pgconn.Notification) {
	s.notifications = append(s.notifications, &pgproto3.NotificationResponse{PID: n.PID, Channel: n.Channel, Payload: n.Payload})
}

// clientConn is the client's connection; before the session waits for
// the client, what it has buffered goes out (beforeRead).
type clientConn struct {
	net.Conn
	beforeRead func()
}

func (c *clientConn) Read(p []byte) (int, error) {
	if c.beforeRead != nil {
		c.beforeRead()
	}
	return c.Conn.Read(p)
}

// clientWriter buffers messages for the client. The session encodes its
// own answers into it; the pump writes PostgreSQL's bytes through it,
// after what the session buffered. Safe for concurrent use.
type clientWriter struct {
	mu  sync.Mutex // guards buf and err, and orders writes
	w   io.Writer
	buf []byte
	err error
}

// send encodes msg for the client.
func (w *clientWriter) send(msg pgproto3.BackendMessage) {
	w.mu.Lock()
	defer w.mu.Unlock()
	buf, err := msg.Encode(w.buf)
	if err != nil {
		if w.err == nil {
			w.err = fmt.Errorf("pgfront: encoding %T: %w", msg, err)
		}
		return
	}
	w.buf = buf
	if len(w.buf) >= flushAt {
		w.flushLocked()
	}
}

// flush writes what is buffered.
func (w *clientWriter) flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
	return w.err
}

func (w *clientWriter) flushLocked() {
	if len(w.buf) == 0 || w.err != nil {
		w.buf = w.buf[:0]
		return
	}
	_, w.err = w.w.Write(w.buf)
	w.buf = w.buf[:0]
}

// writeRaw writes bytes that are already messages, after what is
// buffered.
func (w *clientWriter) writeRaw(b []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
	if w.err == nil {
		_, w.err = w.w.Write(b)
	}
	return w.err
}

// isClosed reports the errors of a connection the other end (or the
// front) closed.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET)
}
