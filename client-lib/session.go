package larder

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
)

// Session is the unit of read-your-writes: a web user, a worker, any
// sequence of transactions that must see its own writes. It is the commit
// position its read-only transactions must reach: after a write of the
// session commits at LSN L, its later read-only transactions read at a
// snapshot T >= L. Other sessions' writes do not move it, so they cost it
// nothing.
//
// A session travels in a context (WithSession). Its Token carries it
// between requests and processes (a cookie: HTTPSessions does this for a
// web application). A transaction whose context carries no session
// belongs to its client's own session, which every write through the
// client moves — correct for any code, but under writes every read-only
// transaction then needs a snapshot newer than the last write of anyone.
type Session struct {
	minLSN atomic.Uint64
}

// NewSession returns a session that has written nothing.
func NewSession() *Session { return &Session{} }

// tokenPrefix versions the token format: "l1." and the LSN in hex.
const tokenPrefix = "l1."

// Token is the session's state as text, for a cookie or a header.
func (s *Session) Token() string {
	return tokenPrefix + strconv.FormatUint(s.minLSN.Load(), 16)
}

// ResumeSession returns the session a Token names. A token only raises
// the snapshots its own holder reads at; a forged one costs its holder
// speed, never anyone correctness.
func ResumeSession(token string) (*Session, error) {
	hex, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || hex == "" || len(hex) > 16 {
		return nil, errors.New("larder: not a session token")
	}
	lsn, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return nil, errors.New("larder: not a session token")
	}
	s := &Session{}
	s.minLSN.Store(lsn)
	return s, nil
}

// MinLSN is the commit position the session's read-only transactions must
// reach (0: it has written nothing).
func (s *Session) MinLSN() uint64 { return s.minLSN.Load() }

// sawCommit raises the session's minimum to lsn.
func (s *Session) sawCommit(lsn uint64) {
	for {
		old := s.minLSN.Load()
		if lsn <= old || s.minLSN.CompareAndSwap(old, lsn) {
			return
		}
	}
}

type sessionKey struct{}

// WithSession makes the transactions begun with ctx (and the writes made
// with it) the session's.
func WithSession(ctx context.Context, s *Session) context.Context {
	return context.WithValue(ctx, sessionKey{}, s)
}

// SessionFromContext returns the session ctx carries, if any.
func SessionFromContext(ctx context.Context) (*Session, bool) {
	s, ok := ctx.Value(sessionKey{}).(*Session)
	return s, ok && s != nil
}

// SessionCookie is the cookie HTTPSessions keeps a web user's session in.
const SessionCookie = "larder-session"

// HTTPSessions gives each request the session its SessionCookie names (a
// new one without, or with a cookie that is not a token) in its context,
// and sets the cookie when the response starts if the request's writes
// moved the session. A write committed after the response started is in
// the request's session but not in the cookie.
func HTTPSessions(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := NewSession()
		if c, err := r.Cookie(SessionCookie); err == nil {
			if resumed, err := ResumeSession(c.Value); err == nil {
				s = resumed
			}
		}
		sw := &sessionWriter{ResponseWriter: w, s: s, start: s.MinLSN()}
		next.ServeHTTP(sw, r.WithContext(WithSession(r.Context(), s)))
		sw.setCookie()
	})
}

// sessionWriter sets the session cookie before the response's header goes.
type sessionWriter struct {
	http.ResponseWriter
	s       *Session
	start   uint64
	started bool
}

func (w *sessionWriter) setCookie() {
	if w.started {
		return
	}
	w.started = true
	if w.s.MinLSN() != w.start {
		http.SetCookie(w.ResponseWriter, &http.Cookie{Name: SessionCookie, Value: w.s.Token(), Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	}
}

func (w *sessionWriter) WriteHeader(code int) {
	w.setCookie()
	w.ResponseWriter.WriteHeader(code)
}

func (w *sessionWriter) Write(b []byte) (int, error) {
	w.setCookie()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *sessionWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
