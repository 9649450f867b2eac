package larder

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/larderdb/larder/qumaana/explain"
)

// This file is the library's face towards a PostgreSQL wire-protocol front
// (client-lib/pgfront): a session connection the caller owns and relays a
// client's statements on, and statements exactly as a client sent them.

// SessionConn is a PostgreSQL session that its owner drives (a front relays a
// client's statements on it): its read-only transactions go through the
// cache with the session's own roles and settings, and its writes move its
// Session, as the database/sql driver's connections do. Not safe for
// concurrent use; the owner runs one thing at a time on the connection.
type SessionConn struct {
	c    *Client
	conn *pgx.Conn
	sess *Session
	// scope is the session's key scope, read in epoch; read: it was read
	// once; stale: a statement may have changed it since.
	scope sessionScope
	read  bool
	stale bool
	epoch uint64
	// changed: a statement may have changed a setting since the session's
	// settings were last at their defaults (its start, or a RESET ALL);
	// without one, a RESET ALL changes nothing the key names.
	changed bool
	// wrote: a statement may have written since the WAL position was last
	// read (read your writes).
	wrote bool
	// uncached, when set, says why nothing the session reads is cached.
	uncached string
	// own reads the session's scope when the client's query cannot: it
	// names only the settings the session's role may read (the client's
	// lists those its own user may, a superuser's config_file among
	// them). Made in ownEpoch; nil until needed.
	own      *scopeQuery
	ownEpoch uint64
}

// NewSessionConn makes conn (an idle connection whose session belongs to
// the caller) a session of the client whose writes move sess.
func (c *Client) NewSessionConn(conn *pgx.Conn, sess *Session) *SessionConn {
	return &SessionConn{c: c, conn: conn, sess: sess}
}

// Session is the read-your-writes session the connection's writes move.
func (s *SessionConn) Session() *Session { return s.sess }

// PureRead reports whether sql can neither write nor change the session: a
// single query qumaana finds cacheable. Anything else may have done either.
func (s *SessionConn) PureRead(sql string) bool {
	tpl, err := s.c.keying.Load().analyzer(s.scope.path).Prepare(sql)
	return err == nil && tpl.Cacheable
}

// Touched records that a statement ran on the connection outside its
// read-only transactions: wrote when it may have written (its commit must
// be seen by the session's later read-only transactions), changed when it
// may have changed the session's roles or settings.
func (s *SessionConn) Touched(wrote, changed bool) {
	s.wrote = s.wrote || wrote
	s.stale = s.stale || changed
	s.changed = s.changed || changed
}

// Neutral reports whether sql cannot change the session's roles or
// settings (a pure read, or a SELECT or DML of built-ins on tables that
// run no user code: quma.Template.SessionNeutral).
func (s *SessionConn) Neutral(sql string) bool {
	tpl, err := s.c.keying.Load().analyzer(s.scope.path).Prepare(sql)
	return err == nil && (tpl.Cacheable || tpl.SessionNeutral)
}

// ResetAll records a RESET ALL or DISCARD ALL relayed on the connection.
// When no statement ever changed a setting on it, the settings are still
// the connection's defaults whatever the reset did (it may fail, or be
// rolled back with its transaction): the key scope stands. Otherwise the
// scope is read again before the next read-only transaction; the session
// stays marked changed, since whether the reset took effect is not known
// here.
func (s *SessionConn) ResetAll() {
	if s.changed {
		s.stale = true
	}
}

// SetUncached makes every read of the session's read-only transactions run
// at their snapshot uncached, for reason (a session encoding whose text
// the analyzer cannot read, say); "" caches again.
func (s *SessionConn) SetUncached(reason string) { s.uncached = reason }

// CatchUp reads, on the idle connection, what earlier statements may have
// changed: the WAL position after the session's writes (its Session moves
// there, and so does the client's own) and the session's roles and
// settings. A read-only transaction begun afterwards reads its writes and
// is keyed on its state.
func (s *SessionConn) CatchUp(ctx context.Context) error {
	if s.wrote {
		lsn, err := walAfterCommit(ctx, s.conn)
		if err != nil {
			return err
		}
		s.c.sawCommit(ctx, s.sess, lsn)
		s.wrote = false
	}
	if epoch := s.c.epoch.Load(); !s.read || s.stale || epoch != s.epoch {
		scope, err := s.readScope(ctx)
		if err != nil {
			return err
		}
		s.c.m.scopeReads.Inc()
		s.c.stats.ScopeReads.Add(1)
		s.scope, s.read, s.stale, s.epoch = scope, true, false, epoch
	}
	return nil
}

// readScope reads the session's scope with the client's scope query, or,
// for a role that may not read every setting that query names, with one
// made on the session's own connection (which lists what the role may
// read; made again after the client reloads its catalog).
func (s *SessionConn) readScope(ctx context.Context) (sessionScope, error) {
	epoch := s.c.epoch.Load()
	if s.own != nil && s.ownEpoch == epoch {
		return s.own.read(ctx, s.conn)
	}
	scope, err := s.c.readScope(ctx, s.conn)
	var pe *pgconn.PgError
	if err == nil || !errors.As(err, &pe) || pe.Code != insufficientPrivilege || s.conn.PgConn().TxStatus() != 'I' {
		return scope, err
	}
	own, err := loadScopeQuery(ctx, s.conn)
	if err != nil {
		return scope, err
	}
	s.own, s.ownEpoch = own, epoch
	return own.read(ctx, s.conn)
}

// Explain says what the client does with sql in this session (its search
// path): Client.Explain.
func (s *SessionConn) Explain(sql string) (*explain.Report, error) {
	var path []string
	if s.read {
		path = s.scope.path
	}
	return s.c.Explain(sql, path)
}

// insufficientPrivilege is PostgreSQL's SQLSTATE for a setting the role
// may not read.
const insufficientPrivilege = "42501"

// StateKey names what a statement's description depends on in this
// session besides its text: the roles, every setting, the search path and
// the client's schema epoch. Valid after CatchUp; opaque.
func (s *SessionConn) StateKey() string {
	return fmt.Sprintf("%d\n%s", s.epoch, s.scope.key)
}

// BeginRO catches up (CatchUp) and starts a read-only transaction on the
// connection, with the session's staleness limit (0: the client's
// default) and read your writes.
func (s *SessionConn) BeginRO(ctx context.Context, staleness time.Duration) (*WireTx, error) {
	if err := s.CatchUp(ctx); err != nil {
		return nil, err
	}
	ctx = WithSession(ctx, s.sess)
	t, err := s.c.beginRO(ctx, staleness, s.conn, s.effectiveScope(s.scope), nil)
	if err != nil {
		return nil, err
	}
	return &WireTx{ROTx: t, s: s}, nil
}

// effectiveScope is scope, marked uncacheable when the session is.
func (s *SessionConn) effectiveScope(scope sessionScope) sessionScope {
	if s.uncached != "" {
		scope.temp = true // every read runs at the snapshot, uncached
	}
	return scope
}

// WireTx is a read-only transaction of a SessionConn. Not safe for
// concurrent use.
type WireTx struct {
	*ROTx
	s *SessionConn
}

// WireStatement is one statement as a client sent it in PostgreSQL's
// extended query protocol (a simple query's statement has no parameters
// and asks for text results).
type WireStatement struct {
	SQL string
	// ParamOIDs are the parameter types the client's Parse declared (0, or
	// missing: left to PostgreSQL); ParamTypes the types PostgreSQL
	// resolved (its ParameterDescription), by which binary values are read.
	ParamOIDs  []uint32
	ParamTypes []uint32
	// ParamFormats and ResultFormats are the Bind message's format codes:
	// none (all text), one for all, or one per parameter or column.
	ParamFormats  []int16
	Params        [][]byte // nil is NULL
	ResultFormats []int16
}

// WireResult is the answer to a WireStatement.
type WireResult struct {
	*Result
	// Ran: the statement ran on PostgreSQL in this transaction; Tag and
	// Described are then PostgreSQL's command tag and whether it described
	// rows (a RowDescription, not NoData). A result from the cache, or one
	// another transaction loaded, is a query's: "SELECT n", rows described.
	Ran       bool
	Tag       string
	Described bool
	// Source is where the result came from: "l1", "node", "database" (a
	// miss, now cached) or "uncached".
	Source string
}

// Query answers st in the transaction: a cacheable query from the cache or
// from PostgreSQL at the transaction's snapshot, anything else at the
// snapshot, uncached. Results keep the formats st asks for, byte for byte
// as PostgreSQL sends them; the cache key holds the statement's text, its
// declared parameter types, its parameters with their formats and the
// result formats asked for.
func (t *WireTx) Query(ctx context.Context, st *WireStatement) (*WireResult, error) {
	if t.done {
		return nil, fmt.Errorf("larder: transaction finished")
	}
	w := &wireArgs{st: st, out: &wireOutcome{}}
	args := wireTagValues(t.m.Map, st, t.s.uncached != "")
	args = append(args, w)
	traced := len(t.trace)
	pure := t.s.PureRead(st.SQL)
	res, err := t.query(ctx, st.SQL, args)
	if err != nil {
		return nil, wrap("query", st.SQL, err)
	}
	t.returned = true
	out := &WireResult{Result: res, Ran: w.out.ran, Tag: w.out.tag, Described: w.out.described, Source: "uncached"}
	if len(t.trace) > traced {
		switch last := t.trace[len(t.trace)-1]; {
		case strings.HasPrefix(last, "l1"):
			out.Source = "l1"
		case strings.HasPrefix(last, "node"):
			out.Source = "node"
		default:
			out.Source = "database"
		}
	}
	if !pure {
		// The statement may have changed the session (set_config): later
		// statements of the transaction are keyed on its state now.
		scope, err := t.s.readScope(ctx)
		if err != nil {
			return nil, wrap("query", st.SQL, err)
		}
		t.scope = t.s.effectiveScope(scope)
		t.s.stale = true
	}
	return out, nil
}

// wireArgs carries a WireStatement through ROTx.query as its last
// argument: onDB runs it as sent (wireOf), and the key holds it
// (MarshalText).
type wireArgs struct {
	st  *WireStatement
	out *wireOutcome
}

// wireOutcome is what running a WireStatement on PostgreSQL said besides
// its rows.
type wireOutcome struct {
	ran, described bool
	tag            string
}

// wireOf finds the statement a WireTx passes as the last argument.
func wireOf(args []any) (wireArgs, bool) {
	if len(args) == 0 {
		return wireArgs{}, false
	}
	w, ok := args[len(args)-1].(*wireArgs)
	if !ok {
		return wireArgs{}, false
	}
	return *w, true
}

// MarshalText is the statement's inputs as the key names them: the
// declared parameter types, each parameter's format and value, and the
// result formats (normalized: text results are never served to a binary
// request, nor the reverse).
func (w wireArgs) MarshalText() ([]byte, error) {
	st := w.st
	b := []byte("wire-v1")
	b = binary.AppendUvarint(b, uint64(len(st.ParamOIDs)))
	for _, oid := range st.ParamOIDs {
		b = binary.AppendUvarint(b, uint64(oid))
	}
	b = binary.AppendUvarint(b, uint64(len(st.Params)))
	for i, v := range st.Params {
		b = append(b, byte(formatOf(st.ParamFormats, i)))
		if v == nil {
			b = append(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(v))+1)
		b = append(b, v...)
	}
	rf := normalizedFormats(st.ResultFormats)
	b = binary.AppendUvarint(b, uint64(len(rf)))
	for _, f := range rf {
		b = binary.AppendVarint(b, int64(f))
	}
	return b, nil
}

// run executes the statement on conn exactly as the client sent it
// (Parse with its declared types, Bind with its formats). An error before
// PostgreSQL bound it (a parameter it cannot read, planning) is a
// *BindError, as PostgreSQL reports it in answer to the Bind.
func (w wireArgs) run(ctx context.Context, conn *pgconn.PgConn) (*Result, error) {
	st := w.st
	fe := conn.Frontend()
	fe.SendParse(&pgproto3.Parse{Query: st.SQL, ParameterOIDs: st.ParamOIDs})
	fe.SendBind(&pgproto3.Bind{ParameterFormatCodes: st.ParamFormats, Parameters: st.Params, ResultFormatCodes: st.ResultFormats})
	fe.SendDescribe(&pgproto3.Describe{ObjectType: 'P'})
	fe.SendExecute(&pgproto3.Execute{})
	fe.SendSync(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		return nil, err
	}
	res := &Result{}
	var bound, described bool
	var tag string
	var failed error
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.BindComplete:
			bound = true
		case *pgproto3.RowDescription:
			described = true
			res.Fields = make([]pgconn.FieldDescription, len(m.Fields))
			for i, f := range m.Fields {
				res.Fields[i] = pgconn.FieldDescription{Name: string(f.Name), TableOID: f.TableOID,
					TableAttributeNumber: f.TableAttributeNumber, DataTypeOID: f.DataTypeOID,
					DataTypeSize: f.DataTypeSize, TypeModifier: f.TypeModifier, Format: f.Format}
			}
		case *pgproto3.DataRow:
			row := make([][]byte, len(m.Values))
			for i, v := range m.Values {
				if v != nil {
					row[i] = append([]byte{}, v...)
				}
			}
			res.Rows = append(res.Rows, row)
		case *pgproto3.CommandComplete:
			tag = string(m.CommandTag)
		case *pgproto3.ErrorResponse:
			if failed == nil {
				failed = pgconn.ErrorResponseToPgError(m)
				if !bound {
					failed = &BindError{Err: failed}
				}
			}
		case *pgproto3.ReadyForQuery:
			if failed != nil {
				return nil, failed
			}
			w.out.ran, w.out.described, w.out.tag = true, described, tag
			return res, nil
		}
	}
}

// BindError is PostgreSQL's refusal of a statement's Bind (a parameter
// it cannot read, an error while planning): a client hears it in answer
// to its Bind, not to its Execute.
type BindError struct{ Err error }

func (e *BindError) Error() string { return e.Err.Error() }

func (e *BindError) Unwrap() error { return e.Err }

// formatOf is the format code of value i under Bind's rules.
func formatOf(codes []int16, i int) int16 {
	switch len(codes) {
	case 0:
		return 0
	case 1:
		return codes[0]
	}
	if i < len(codes) {
		return codes[i]
	}
	return 0
}

// normalizedFormats gives equal answers equal codes: none for all text,
// one code when every code is the same.
func normalizedFormats(codes []int16) []int16 {
	if len(codes) == 0 {
		return nil
	}
	for _, c := range codes[1:] {
		if c != codes[0] {
			return codes
		}
	}
	if codes[0] == 0 {
		return nil
	}
	return codes[:1]
}

// Parameter types whose values the analyzer may bind keyed tags with: a
// parameter declared with another type (bpchar, numeric, a domain) may
// compare otherwise than the column's text form, so its value is not
// used and its dependency falls back to the table tag.
var keyableParamOIDs = map[uint32]bool{
	0: true, pgtype.UnknownOID: true,
	pgtype.Int2OID: true, pgtype.Int4OID: true, pgtype.Int8OID: true, pgtype.OIDOID: true,
	pgtype.TextOID: true, pgtype.VarcharOID: true, pgtype.NameOID: true,
	pgtype.BoolOID: true, pgtype.UUIDOID: true,
	pgtype.Int2ArrayOID: true, pgtype.Int4ArrayOID: true, pgtype.Int8ArrayOID: true, pgtype.OIDArrayOID: true,
	pgtype.TextArrayOID: true, pgtype.VarcharArrayOID: true, pgtype.NameArrayOID: true,
	pgtype.BoolArrayOID: true, pgtype.UUIDArrayOID: true,
}

// wireTagValues gives the analyzer the parameters as values it can make
// canonical: text as written (string), binary decoded by PostgreSQL's
// type, arrays as slices. A value it must not use is nil (its tag falls
// back to the table's): NULL, a declared type outside keyableParamOIDs, a
// value that does not decode, or any value when noValues.
func wireTagValues(m *pgtype.Map, st *WireStatement, noValues bool) []any {
	out := make([]any, len(st.Params))
	if noValues {
		return out
	}
	for i, v := range st.Params {
		var declared, typ uint32
		if i < len(st.ParamOIDs) {
			declared = st.ParamOIDs[i]
		}
		if i < len(st.ParamTypes) {
			typ = st.ParamTypes[i]
		}
		if v == nil || !keyableParamOIDs[declared] || !keyableParamOIDs[typ] {
			continue
		}
		format := formatOf(st.ParamFormats, i)
		if format == 0 && !isArrayOID(typ) {
			out[i] = string(v)
			continue
		}
		if typ == 0 || typ == pgtype.UnknownOID {
			continue
		}
		dt, ok := m.TypeForOID(typ)
		if !ok {
			continue
		}
		if val, err := dt.Codec.DecodeValue(m, typ, format, v); err == nil {
			out[i] = val
		}
	}
	return out
}

func isArrayOID(oid uint32) bool {
	switch oid {
	case pgtype.Int2ArrayOID, pgtype.Int4ArrayOID, pgtype.Int8ArrayOID, pgtype.OIDArrayOID,
		pgtype.TextArrayOID, pgtype.VarcharArrayOID, pgtype.NameArrayOID, pgtype.BoolArrayOID, pgtype.UUIDArrayOID:
		return true
	}
	return false
}
