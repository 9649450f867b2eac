package pgfront

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// dialPostgres opens a connection to PostgreSQL: TCP, then TLS when
// configured (an SSLRequest first, as libpq does).
func dialPostgres(ctx context.Context, cfg *Config) (net.Conn, error) {
	d := net.Dialer{Timeout: cfg.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", cfg.Postgres)
	if err != nil {
		return nil, fmt.Errorf("pgfront: connect to PostgreSQL: %w", err)
	}
	if cfg.PostgresTLS == nil {
		return conn, nil
	}
	_ = conn.SetDeadline(time.Now().Add(cfg.DialTimeout))
	req, err := (&pgproto3.SSLRequest{}).Encode(nil)
	if err == nil {
		_, err = conn.Write(req)
	}
	answer := make([]byte, 1)
	if err == nil {
		_, err = io.ReadFull(conn, answer)
	}
	if err == nil && answer[0] != 'S' {
		err = errors.New("PostgreSQL refused TLS")
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("pgfront: TLS to PostgreSQL: %w", err)
	}
	tc := tls.Client(conn, cfg.PostgresTLS)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("pgfront: TLS to PostgreSQL: %w", err)
	}
	_ = conn.SetDeadline(time.Time{})
	return tc, nil
}

// upstreamConn is a session's connection to PostgreSQL, shared in turn by
// the relay (which reads it directly) and the session's pgx connection
// (the library's read-only transactions). The start-up the session already
// ran with the client's credentials is replayed to pgx: while script is
// not drained, pgx's reads get it and its StartupMessage is discarded.
type upstreamConn struct {
	net.Conn
	mu sync.Mutex // guards the script fields
	// script is the replayed start-up pgx reads; startup counts the bytes
	// of pgx's StartupMessage still to discard (-1: its length not read).
	script  []byte
	startup int
	head    []byte // the StartupMessage's length bytes read so far
}

func (u *upstreamConn) Read(p []byte) (int, error) {
	u.mu.Lock()
	if len(u.script) > 0 {
		n := copy(p, u.script)
		u.script = u.script[n:]
		u.mu.Unlock()
		return n, nil
	}
	u.mu.Unlock()
	return u.Conn.Read(p)
}

func (u *upstreamConn) Write(p []byte) (int, error) {
	u.mu.Lock()
	if u.startup == 0 {
		u.mu.Unlock()
		return u.Conn.Write(p)
	}
	written := 0
	for u.startup != 0 && len(p) > 0 {
		if u.startup < 0 {
			k := min(4-len(u.head), len(p))
			u.head = append(u.head, p[:k]...)
			p, written = p[k:], written+k
			if len(u.head) == 4 {
				u.startup = int(binary.BigEndian.Uint32(u.head)) - 4
				if u.startup < 0 {
					u.startup = 0
				}
			}
			continue
		}
		k := min(u.startup, len(p))
		u.startup -= k
		p, written = p[k:], written+k
	}
	u.mu.Unlock()
	if len(p) == 0 {
		return written, nil
	}
	n, err := u.Conn.Write(p)
	return written + n, err
}

// interruptRead makes a blocked Read return a timeout (the relay parks).
func (u *upstreamConn) interruptRead() { _ = u.Conn.SetReadDeadline(time.Now()) }

// resumeRead clears the deadline interruptRead set.
func (u *upstreamConn) resumeRead() { _ = u.Conn.SetReadDeadline(time.Time{}) }

// startupState is what PostgreSQL said while the session started: what a
// connection needs to be replayed to pgx.
type startupState struct {
	params    map[string]string
	pid       uint32
	secretKey []byte
}

// connectPgx makes a pgx connection on up, whose session PostgreSQL has
// already authenticated: pgx's start-up is answered from st. Later dials
// (pgx's cancel requests) go to PostgreSQL itself.
func connectPgx(ctx context.Context, cfg *Config, up *upstreamConn, user, database string, st *startupState,
	onNotice pgconn.NoticeHandler, onNotification pgconn.NotificationHandler) (*pgx.Conn, error) {
	script, err := (&pgproto3.AuthenticationOk{}).Encode(nil)
	for name, value := range st.params {
		if err == nil {
			script, err = (&pgproto3.ParameterStatus{Name: name, Value: value}).Encode(script)
		}
	}
	if err == nil {
		script, err = (&pgproto3.BackendKeyData{ProcessID: st.pid, SecretKey: st.secretKey}).Encode(script)
	}
	if err == nil {
		script, err = (&pgproto3.ReadyForQuery{TxStatus: 'I'}).Encode(script)
	}
	if err != nil {
		return nil, fmt.Errorf("pgfront: replay the start-up: %w", err)
	}
	up.mu.Lock()
	up.script, up.startup, up.head = script, -1, nil
	up.mu.Unlock()

	host, port, err := net.SplitHostPort(cfg.Postgres)
	if err != nil {
		return nil, fmt.Errorf("pgfront: PostgreSQL address %q: %w", cfg.Postgres, err)
	}
	pc, err := pgx.ParseConfig("sslmode=disable")
	if err != nil {
		return nil, fmt.Errorf("pgfront: %w", err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("pgfront: PostgreSQL port %q: %w", port, err)
	}
	pc.Host, pc.Port, pc.User, pc.Database = host, uint16(p), user, database
	pc.TLSConfig, pc.Fallbacks = nil, nil
	pc.RuntimeParams = map[string]string{}
	pc.LookupFunc = func(_ context.Context, host string) ([]string, error) { return []string{host}, nil }
	var once sync.Once
	pc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var handed net.Conn
		once.Do(func() { handed = up })
		if handed != nil {
			return handed, nil
		}
		d := net.Dialer{Timeout: cfg.DialTimeout}
		return d.DialContext(ctx, network, addr) // a cancel request
	}
	// Unnamed statements only: the client's statement names stay its own,
	// and a DEALLOCATE ALL of the client's cannot break the library's.
	pc.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	pc.OnNotice, pc.OnNotification = onNotice, onNotification
	// Nothing may run during the hand-over (PGTARGETSESSIONATTRS would
	// make pgx query the session).
	pc.ValidateConnect, pc.AfterConnect, pc.AfterNetConnect = nil, nil, nil
	conn, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgfront: hand the session to the library: %w", err)
	}
	up.mu.Lock()
	scriptLeft, startupLeft := len(up.script), up.startup
	up.mu.Unlock()
	if scriptLeft != 0 || startupLeft != 0 {
		conn.PgConn().Conn().Close()
		return nil, fmt.Errorf("pgfront: hand the session to the library: start-up not consumed (%d bytes to replay, %d to discard)", scriptLeft, startupLeft)
	}
	return conn, nil
}

// sendCancel forwards a cancel request to PostgreSQL.
func sendCancel(ctx context.Context, cfg *Config, pid uint32, key []byte) error {
	d := net.Dialer{Timeout: cfg.DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", cfg.Postgres)
	if err != nil {
		return err
	}
	defer conn.Close()
	buf, err := (&pgproto3.CancelRequest{ProcessID: pid, SecretKey: key}).Encode(nil)
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(cfg.DialTimeout))
	if _, err := conn.Write(buf); err != nil {
		return err
	}
	// PostgreSQL closes the connection once it has read the request.
	_, _ = conn.Read(make([]byte, 1))
	return nil
}
