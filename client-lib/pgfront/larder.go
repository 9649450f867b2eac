package pgfront

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	larder "github.com/larderdb/larder/client-lib"
)

// larderTx is a session's Larder read-only transaction.
type larderTx struct {
	// tx is the library's transaction, begun at the first statement that
	// reads (so that SET LOCAL larder.staleness before it counts).
	tx *larder.WireTx
	// failed: a statement failed; everything but COMMIT and ROLLBACK is
	// refused, as PostgreSQL refuses it in an aborted transaction.
	failed bool
	// local is SET LOCAL larder.staleness (0: none).
	local time.Duration
}

// portal is a bound statement of a Larder transaction, and its result
// once executed (kept for Executes with a row limit).
type portal struct {
	info   stmtInfo
	wire   larder.WireStatement
	fields []pgconn.FieldDescription // the statement's description
	// res is the result once run, or err why it failed (after PostgreSQL
	// bound it: Execute reports it).
	res *larder.WireResult
	err error
	pos int // rows sent
}

// simpleQuery answers a simple query: statements the front owns here,
// everything from the first one it does not own on passed to PostgreSQL
// as one query (outside a Larder transaction), or answered through the
// library (inside one).
func (s *session) simpleQuery(ctx context.Context, sql string) {
	if kw := firstKeyword(sql); (kw == "EXPLAIN" || kw == "SHOW") && s.larderStatement(ctx, sql) {
		return
	}
	if s.ltx == nil && !interceptKeywords[firstKeyword(sql)] {
		s.relayQuery(sql, nil)
		return
	}
	infos, err := s.f.classify.classify(sql)
	if err != nil {
		if s.ltx == nil {
			s.relayQuery(sql, nil) // PostgreSQL reports the syntax error
			return
		}
		s.larderFail(s.parseError(ctx, sql))
		s.readyForQuery()
		return
	}
	if s.ltx == nil && len(infos) == 0 {
		s.relayQuery(sql, infos)
		return
	}
	if len(infos) == 0 {
		s.cw.send(&pgproto3.EmptyQueryResponse{})
		s.readyForQuery()
		return
	}
	status := byte('T')
	if s.ltx == nil {
		if status, err = s.waitQuiet(); err != nil {
			return
		}
	}
	for i, info := range infos {
		if s.ltx != nil {
			if err := s.larderRun(ctx, info, &larder.WireStatement{SQL: info.text}, nil, true, 0); err != nil {
				s.larderFail(positionIn(err, sql, info.start))
				break
			}
			status = s.txStatus()
			continue
		}
		handled, stop := s.relayOwned(ctx, info, status)
		if stop {
			break
		}
		if handled {
			status = s.txStatus()
			continue
		}
		rest := sql
		if i > 0 {
			rest = sql[info.start:]
		}
		s.relayQuery(rest, infos[i:])
		return
	}
	s.readyForQuery()
}

// positionIn makes the position of PostgreSQL's error about a statement
// that starts at byte start of a query string count from the start of the
// string (in characters), as PostgreSQL reports it for a simple query.
func positionIn(err error, sql string, start int) error {
	pe, ok := larder.PgError(err)
	if !ok || pe.Position == 0 || start == 0 {
		return err
	}
	moved := *pe
	moved.Position += int32(utf8.RuneCountInString(sql[:start]))
	return &moved
}

// relayOwned answers, outside a Larder transaction, a statement the front
// owns there: a Larder BEGIN at idle, larder.staleness. handled is false
// for any other statement; stop when an error ends the query.
func (s *session) relayOwned(ctx context.Context, info stmtInfo, status byte) (handled, stop bool) {
	switch info.class {
	case classBeginRO:
		if status != 'I' {
			return false, false
		}
		if err := s.enterLarder(ctx); err != nil {
			s.cw.send(errorResponse(err))
			return true, true
		}
		s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")})
	case classSetStaleness:
		if status == 'E' {
			s.cw.send(errorResponse(inFailedTransaction()))
			return true, true
		}
		if err := s.setStaleness(info, status); err != nil {
			s.cw.send(errorResponse(err))
			return true, true
		}
		s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte("SET")})
	case classShowStaleness:
		if status == 'E' {
			s.cw.send(errorResponse(inFailedTransaction()))
			return true, true
		}
		s.showStaleness(true)
	default:
		return false, false
	}
	return true, false
}

// relayQuery passes a simple query (or what is left of one) to
// PostgreSQL, noting what its statements may have done. infos classifies
// it when it was parsed.
func (s *session) relayQuery(sql string, infos []stmtInfo) {
	for _, info := range infos[min(1, len(infos)):] {
		if info.class == classSetStaleness || info.class == classShowStaleness {
			// A larder.staleness after another statement of the same
			// query would reach PostgreSQL (as a setting of its own) and
			// not the front.
			s.f.refuse(refusedStaleness)
			s.cw.send(errorResponse(&frontError{severity: "ERROR", code: codeFeatureNotSupported,
				message: "larder.staleness must be set or shown in a query of its own, or at the start of one",
				hint:    "Send SET larder.staleness before the other statements."}))
			s.readyForQuery()
			return
		}
	}
	if len(infos) == 1 && infos[0].class == classResetAll && infos[0].all {
		s.sc.ResetAll()
	} else if len(infos) == 1 || infos == nil {
		s.sc.Touched(s.touchedBy(sql))
	} else {
		s.sc.Touched(true, true)
	}
	for _, info := range infos {
		switch {
		case info.class == classDeallocate && info.all, info.class == classResetAll && info.all && info.command == "DiscardStmt":
			clear(s.stmts)
		case info.class == classDeallocate:
			delete(s.stmts, info.name)
		}
		if info.class == classResetAll {
			s.staleness = s.f.cfg.DefaultStaleness
		}
	}
	s.pump.expect(false)
	s.forward(&pgproto3.Query{String: sql})
	s.countRelayed()
}

// parseError is PostgreSQL's error for a query string the front's parser
// refused: asked of PostgreSQL with a Parse, which runs nothing.
func (s *session) parseError(ctx context.Context, sql string) error {
	_, err := s.pg.PgConn().Prepare(ctx, "", sql, nil)
	if err != nil {
		return err
	}
	s.f.refuse(refusedStatement)
	return &frontError{severity: "ERROR", code: codeFeatureNotSupported, message: "the Larder front cannot parse this query"}
}

// enterLarder begins a Larder transaction: the pump parks (the caller
// waited for quiet, and PostgreSQL is idle), the session's writes and
// state are read (read your writes, keys).
func (s *session) enterLarder(ctx context.Context) error {
	if err := s.pump.park(); err != nil {
		return err
	}
	reason := s.uncachedReason()
	s.sc.SetUncached(reason)
	if err := s.sc.CatchUp(ctx); err != nil {
		_ = s.pump.unpark(ctx)
		return err
	}
	if reason != "" {
		s.log.Info("pgfront: the session's Larder transactions run uncached", "reason", reason)
	}
	s.ltx, s.portals = &larderTx{}, map[string]*portal{}
	s.f.stats.Transactions.Add(1)
	s.f.m.transactions.Inc()
	return nil
}

// uncachedReason says why the session's reads cannot be cached, if they
// cannot: the analyzer reads parameters and literals as UTF-8 with
// standard-conforming strings, as the invalidator reports rows.
func (s *session) uncachedReason() string {
	if enc := s.pump.param("client_encoding"); enc != "" && !strings.EqualFold(enc, "UTF8") {
		return "client_encoding is " + enc
	}
	if scs := s.pump.param("standard_conforming_strings"); scs != "" && scs != "on" {
		return "standard_conforming_strings is " + scs
	}
	return ""
}

// endLarder ends the Larder transaction: the library's ends (its
// PostgreSQL transaction rolls back: it only read), statements parsed
// without PostgreSQL go there, and the pump relays again.
func (s *session) endLarder(ctx context.Context) error {
	err := s.finishLarderTx(ctx)
	s.ltx, s.portals = nil, nil
	s.materialize(ctx)
	for _, n := range s.notifications {
		s.cw.send(n)
	}
	s.notifications = nil
	if uerr := s.pump.unpark(ctx); err == nil {
		err = uerr
	}
	return err
}

// finishLarderTx ends the library's transaction, if it began.
func (s *session) finishLarderTx(ctx context.Context) error {
	if s.ltx == nil || s.ltx.tx == nil {
		return nil
	}
	err := s.ltx.tx.Commit(ctx)
	s.ltx.tx = nil
	return err
}

// larderTxn is the library's transaction, begun now if not yet.
func (s *session) larderTxn(ctx context.Context) (*larder.WireTx, error) {
	if s.ltx.tx == nil {
		tx, err := s.sc.BeginRO(ctx, s.effectiveStaleness())
		if err != nil {
			return nil, err
		}
		s.ltx.tx = tx
	}
	return s.ltx.tx, nil
}

// effectiveStaleness is the staleness limit of the session's Larder
// transaction: SET LOCAL's, else the session's.
func (s *session) effectiveStaleness() time.Duration {
	if s.ltx != nil && s.ltx.local > 0 {
		return s.ltx.local
	}
	return s.staleness
}

// larderFail answers an error in a Larder transaction (which fails).
func (s *session) larderFail(err error) {
	s.cw.send(errorResponse(err))
	if s.ltx != nil {
		s.ltx.failed = true
	}
	if errors.Is(err, larder.ErrRetry) {
		s.f.stats.Retries.Add(1)
		s.f.m.retries.Inc()
	}
}

// handleLarder answers a message inside a Larder transaction.
func (s *session) handleLarder(ctx context.Context, msg pgproto3.FrontendMessage) {
	if len(s.pendingBinds) > 0 && !s.settleBinds(ctx) {
		// A Bind failed: PostgreSQL skips what follows it up to Sync.
		if _, ok := msg.(*pgproto3.Sync); ok {
			s.readyForQuery()
		} else {
			s.skipToSync = true
		}
		return
	}
	var err error
	switch m := msg.(type) {
	case *pgproto3.Query:
		// A simple query replaces the unnamed statement and portal.
		delete(s.stmts, "")
		delete(s.portals, "")
		s.simpleQuery(ctx, m.String)
		return
	case *pgproto3.Parse:
		err = s.larderParse(ctx, m)
	case *pgproto3.Bind:
		err = s.larderBind(ctx, m)
	case *pgproto3.Describe:
		err = s.larderDescribe(ctx, m)
	case *pgproto3.Execute:
		err = s.larderExecute(ctx, m)
	case *pgproto3.Close:
		err = s.larderClose(ctx, m)
	case *pgproto3.Sync:
		s.readyForQuery()
		return
	case *pgproto3.Flush:
		_ = s.cw.flush()
		return
	case *pgproto3.FunctionCall:
		s.f.refuse(refusedStatement)
		s.larderFail(errorf(codeFeatureNotSupported, "function calls are not supported in a Larder read-only transaction"))
		s.readyForQuery()
		return
	case *pgproto3.CopyData, *pgproto3.CopyDone, *pgproto3.CopyFail:
		return // PostgreSQL ignores these outside COPY
	default:
		s.f.refuse(refusedProtocol)
		err = errorf(codeProtocolViolation, "unexpected message %T", msg)
	}
	if err != nil {
		s.larderFail(err)
		s.skipToSync = true
	}
}

// larderParse prepares a statement in a Larder transaction: from a
// description PostgreSQL gave for the same text and types in the same
// session state, or by preparing it on PostgreSQL (which checks it).
func (s *session) larderParse(ctx context.Context, m *pgproto3.Parse) error {
	if s.ltx.failed {
		return inFailedTransaction()
	}
	if _, ok := s.stmts[m.Name]; ok && m.Name != "" {
		return errorf(codeDuplicateStatement, "prepared statement %s already exists", quoted(m.Name))
	}
	st := &preparedStmt{sql: m.Query, oids: append([]uint32(nil), m.ParameterOIDs...)}
	switch s.fullInfo(st).class {
	case classEmpty, classBegin, classBeginRO, classCommit, classRollback, classSetStaleness, classDeallocate:
		st.desc = &stmtDesc{}
	case classShowStaleness:
		st.desc = &stmtDesc{fields: stalenessFields()}
	default:
		key := s.descKey(st)
		if d := s.f.descs.get(key); d != nil {
			st.desc = d
			break
		}
		sd, err := s.pg.PgConn().Prepare(ctx, m.Name, m.Query, st.oids)
		if err != nil {
			return err
		}
		st.desc, st.onUpstream = &stmtDesc{params: sd.ParamOIDs, fields: sd.Fields}, true
		s.f.descs.put(key, st.desc)
	}
	s.stmts[m.Name] = st
	s.cw.send(&pgproto3.ParseComplete{})
	return nil
}

// descKey names a statement's description: the session's state, its text
// and its declared parameter types.
func (s *session) descKey(st *preparedStmt) string {
	var b strings.Builder
	b.WriteString(s.sc.StateKey())
	b.WriteByte(0)
	b.WriteString(st.sql)
	for _, oid := range st.oids {
		b.WriteByte(0)
		b.WriteString(strconv.FormatUint(uint64(oid), 10))
	}
	return b.String()
}

// descOf is a statement's description, asked of PostgreSQL for one it
// holds and the front has not seen described.
func (s *session) descOf(ctx context.Context, name string, st *preparedStmt) (*stmtDesc, error) {
	if st.desc != nil {
		return st.desc, nil
	}
	key := s.descKey(st)
	if d := s.f.descs.get(key); d != nil {
		st.desc = d
		return d, nil
	}
	d, err := s.describeUpstream(ctx, name)
	if err != nil {
		return nil, err
	}
	st.desc = d
	s.f.descs.put(key, d)
	return d, nil
}

func (s *session) larderBind(ctx context.Context, m *pgproto3.Bind) error {
	if s.ltx.failed {
		return inFailedTransaction()
	}
	st := s.stmts[m.PreparedStatement]
	if st == nil {
		if m.PreparedStatement == "" {
			return errorf(codeUndefinedStatement, "unnamed prepared statement does not exist")
		}
		return errorf(codeUndefinedStatement, "prepared statement %s does not exist", quoted(m.PreparedStatement))
	}
	desc, err := s.descOf(ctx, m.PreparedStatement, st)
	if err != nil {
		return err
	}
	if n := len(m.ParameterFormatCodes); n > 1 && n != len(m.Parameters) {
		return errorf(codeProtocolViolation, "bind message has %d parameter formats but %d parameters", n, len(m.Parameters))
	}
	if len(m.Parameters) != len(desc.params) {
		return errorf(codeProtocolViolation, "bind message supplies %d parameters, but prepared statement %s requires %d",
			len(m.Parameters), quoted(m.PreparedStatement), len(desc.params))
	}
	if n := len(m.ResultFormatCodes); n > 1 && n != len(desc.fields) {
		return errorf(codeProtocolViolation, "bind message has %d result formats but query has %d columns", n, len(desc.fields))
	}
	for _, codes := range [][]int16{m.ParameterFormatCodes, m.ResultFormatCodes} {
		for _, c := range codes {
			if c != 0 && c != 1 {
				return errorf(codeInvalidParameter, "unsupported format code: %d", c)
			}
		}
	}
	if _, ok := s.portals[m.DestinationPortal]; ok && m.DestinationPortal != "" {
		return errorf(codeDuplicatePortal, "portal %s already exists", quoted(m.DestinationPortal))
	}
	params := make([][]byte, len(m.Parameters))
	for i, v := range m.Parameters {
		if v != nil {
			params[i] = append([]byte{}, v...)
		}
	}
	p := &portal{info: s.fullInfo(st), fields: desc.fields, wire: larder.WireStatement{
		SQL: st.sql, ParamOIDs: st.oids, ParamTypes: desc.params, Params: params,
		ParamFormats:  append([]int16(nil), m.ParameterFormatCodes...),
		ResultFormats: append([]int16(nil), m.ResultFormatCodes...),
	}}
	s.portals[m.DestinationPortal] = p
	s.pendingBinds = append(s.pendingBinds, p) // answered by settleBinds
	return nil
}

// settleBinds answers the Binds not yet answered, in order. PostgreSQL
// answers a Bind once it has read the parameters and planned the
// statement, and refuses it then for errors of either; so a reading
// statement runs before its Bind is answered (its result waits in the
// portal for Execute), when the next message needs the answer. false: a
// Bind failed (its error is sent).
func (s *session) settleBinds(ctx context.Context) bool {
	pending := s.pendingBinds
	s.pendingBinds = nil
	for _, p := range pending {
		if p.info.class == classSelect || p.info.class == classAtSnapshot {
			p.res, p.err = s.query(ctx, &p.wire)
			var be *larder.BindError
			if errors.As(p.err, &be) {
				s.larderFail(p.err)
				return false
			}
		}
		s.cw.send(&pgproto3.BindComplete{})
	}
	return true
}

func (s *session) larderDescribe(ctx context.Context, m *pgproto3.Describe) error {
	if s.ltx.failed {
		return inFailedTransaction()
	}
	if m.ObjectType == 'P' {
		p := s.portals[m.Name]
		if p == nil {
			return errorf(codeUndefinedPortal, "portal %s does not exist", quoted(m.Name))
		}
		s.sendRowDescription(p.fields, p.wire.ResultFormats)
		return nil
	}
	st := s.stmts[m.Name]
	if st == nil {
		if m.Name == "" {
			return errorf(codeUndefinedStatement, "unnamed prepared statement does not exist")
		}
		return errorf(codeUndefinedStatement, "prepared statement %s does not exist", quoted(m.Name))
	}
	desc, err := s.descOf(ctx, m.Name, st)
	if err != nil {
		return err
	}
	s.cw.send(&pgproto3.ParameterDescription{ParameterOIDs: desc.params})
	s.sendRowDescription(desc.fields, nil)
	return nil
}

// sendRowDescription describes rows in the formats asked for (nil: as
// the fields say), or sends NoData for a statement without rows.
func (s *session) sendRowDescription(fields []pgconn.FieldDescription, formats []int16) {
	if fields == nil {
		s.cw.send(&pgproto3.NoData{})
		return
	}
	s.cw.send(rowDescription(fields, formats))
}

// rowDescription is the RowDescription of fields, in formats (Bind's
// codes) when given.
func rowDescription(fields []pgconn.FieldDescription, formats []int16) *pgproto3.RowDescription {
	rd := &pgproto3.RowDescription{Fields: make([]pgproto3.FieldDescription, len(fields))}
	for i, f := range fields {
		format := f.Format
		if formats != nil {
			format = larderFormat(formats, i)
		}
		rd.Fields[i] = pgproto3.FieldDescription{Name: []byte(f.Name), TableOID: f.TableOID,
			TableAttributeNumber: f.TableAttributeNumber, DataTypeOID: f.DataTypeOID, DataTypeSize: f.DataTypeSize,
			TypeModifier: f.TypeModifier, Format: format}
	}
	return rd
}

// larderFormat is the format code of column i under Bind's rules.
func larderFormat(codes []int16, i int) int16 {
	switch {
	case len(codes) == 0:
		return 0
	case len(codes) == 1:
		return codes[0]
	case i < len(codes):
		return codes[i]
	}
	return 0
}

func (s *session) larderExecute(ctx context.Context, m *pgproto3.Execute) error {
	p := s.portals[m.Portal]
	if p == nil {
		return errorf(codeUndefinedPortal, "portal %s does not exist", quoted(m.Portal))
	}
	return s.larderRun(ctx, p.info, &p.wire, p, false, int(m.MaxRows))
}

func (s *session) larderClose(ctx context.Context, m *pgproto3.Close) error {
	if m.ObjectType == 'P' {
		delete(s.portals, m.Name)
	} else if st := s.stmts[m.Name]; st != nil {
		if st.onUpstream && m.Name != "" {
			if err := s.closeUpstream(ctx, m.Name); err != nil {
				return err
			}
		}
		delete(s.stmts, m.Name)
	}
	s.cw.send(&pgproto3.CloseComplete{})
	return nil
}

// larderRun runs one statement of a Larder transaction and sends its
// answer: with a RowDescription first when describe (a simple query),
// and after limit rows (an Execute's, 0: all) a PortalSuspended.
func (s *session) larderRun(ctx context.Context, info stmtInfo, wire *larder.WireStatement, p *portal, describe bool, limit int) error {
	if s.ltx.failed && info.class != classCommit && info.class != classRollback {
		return inFailedTransaction()
	}
	switch info.class {
	case classEmpty:
		s.cw.send(&pgproto3.EmptyQueryResponse{})
	case classBegin, classBeginRO:
		s.cw.send(&pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: codeActiveTransaction,
			Message: "there is already a transaction in progress"})
		s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")})
	case classCommit, classRollback:
		tag := "COMMIT"
		if info.class == classRollback || s.ltx.failed {
			tag = "ROLLBACK"
		}
		if info.chain {
			if err := s.finishLarderTx(ctx); err != nil {
				s.log.Info("pgfront: ending a Larder transaction failed", "err", err)
			}
			s.ltx, s.portals = &larderTx{}, map[string]*portal{}
			s.f.stats.Transactions.Add(1)
			s.f.m.transactions.Inc()
		} else if err := s.endLarder(ctx); err != nil {
			s.log.Info("pgfront: ending a Larder transaction failed", "err", err)
		}
		s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte(tag)})
	case classSetStaleness:
		if err := s.setStaleness(info, 'T'); err != nil {
			return err
		}
		s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte("SET")})
	case classShowStaleness:
		s.showStaleness(describe)
	case classDeallocate:
		return s.deallocate(ctx, info)
	case classWrite:
		return errorf(codeReadOnlyTransaction, "cannot execute %s in a read-only transaction", info.command)
	case classSelect, classAtSnapshot:
		return s.larderRead(ctx, info, wire, p, describe, limit)
	default:
		s.f.refuse(refusedStatement)
		s.log.Info("pgfront: statement refused in a Larder read-only transaction", "statement", info.command)
		return &frontError{severity: "ERROR", code: codeFeatureNotSupported,
			message: fmt.Sprintf("%s is not supported in a Larder read-only transaction", info.command),
			hint:    "End the transaction first, or begin it without READ ONLY: PostgreSQL then runs it as it is."}
	}
	return nil
}

// larderRead answers a reading statement through the library: a
// portal's result (run when its Bind was answered), or a simple query's
// statement now.
func (s *session) larderRead(ctx context.Context, info stmtInfo, wire *larder.WireStatement, p *portal, describe bool, limit int) error {
	res := (*larder.WireResult)(nil)
	if p != nil {
		if p.res == nil && p.err == nil {
			p.res, p.err = s.query(ctx, wire)
		}
		if p.err != nil {
			return p.err
		}
		res = p.res
	} else {
		var err error
		if res, err = s.query(ctx, wire); err != nil {
			return err
		}
	}
	if describe && (!res.Ran || res.Described) {
		s.cw.send(rowDescription(res.Fields, nil))
	}
	from := 0
	if p != nil {
		from = p.pos
	}
	end := len(res.Rows)
	if limit > 0 && from+limit < end {
		end = from + limit
	}
	for _, row := range res.Rows[from:end] {
		s.cw.send(&pgproto3.DataRow{Values: row})
	}
	if p != nil {
		p.pos = end
	}
	if end < len(res.Rows) {
		s.cw.send(&pgproto3.PortalSuspended{})
		return nil
	}
	tag := res.Tag
	if !res.Ran || info.class == classSelect {
		tag = "SELECT " + strconv.Itoa(end-from)
	}
	s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte(tag)})
	return nil
}

// query runs a reading statement through the library, in the Larder
// transaction (begun now if not yet).
func (s *session) query(ctx context.Context, wire *larder.WireStatement) (*larder.WireResult, error) {
	tx, err := s.larderTxn(ctx)
	if err != nil {
		return nil, err
	}
	s.relayNotices = true
	res, err := tx.Query(ctx, wire)
	s.relayNotices = false
	if err != nil {
		return nil, err
	}
	s.countServed(res.Source)
	return res, nil
}

// countServed counts a statement the front answered through the library.
func (s *session) countServed(source string) {
	s.f.stats.Served.Add(1)
	s.f.m.statements.WithLabelValues("larder").Inc()
	s.f.m.reads.WithLabelValues(source).Inc()
	switch source {
	case "l1", "node":
		s.f.stats.Hits.Add(1)
	case "database":
		s.f.stats.Misses.Add(1)
	default:
		s.f.stats.Uncached.Add(1)
	}
}

// setStaleness applies SET / RESET larder.staleness. The session's value
// changes at once and is not undone by a rollback; SET LOCAL counts only
// in a Larder transaction, before its first read.
func (s *session) setStaleness(info stmtInfo, status byte) error {
	d := s.f.cfg.DefaultStaleness
	if !info.reset {
		v, err := parseStaleness(info.value)
		if err != nil {
			s.f.refuse(refusedStaleness)
			return &frontError{severity: "ERROR", code: codeInvalidParameter,
				message: fmt.Sprintf("invalid value for parameter %s: %s", quoted(stalenessParam), quoted(info.value)),
				detail:  err.Error(), hint: "A duration such as 5s, 500ms or 2min, at most 24h."}
		}
		d = v
	}
	if info.local {
		switch {
		case s.ltx == nil:
			if status == 'I' {
				s.cw.send(&pgproto3.NoticeResponse{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "25P01",
					Message: "SET LOCAL can only be used in transaction blocks"})
			}
		case s.ltx.tx != nil:
			return errorf(codeActiveTransaction, "SET LOCAL larder.staleness must be called before any query")
		default:
			s.ltx.local = d
		}
		return nil
	}
	s.staleness = d
	if s.ltx != nil {
		s.ltx.local = 0
	}
	return nil
}

// showStaleness answers SHOW larder.staleness.
func (s *session) showStaleness(describe bool) {
	if describe {
		s.cw.send(rowDescription(stalenessFields(), nil))
	}
	s.cw.send(&pgproto3.DataRow{Values: [][]byte{[]byte(formatStaleness(s.effectiveStaleness()))}})
	s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte("SHOW")})
}

// stalenessFields describe SHOW larder.staleness's column as PostgreSQL
// describes a SHOW's.
func stalenessFields() []pgconn.FieldDescription {
	return []pgconn.FieldDescription{{Name: stalenessParam, DataTypeOID: pgtype.TextOID, DataTypeSize: -1, TypeModifier: -1}}
}

// deallocate runs DEALLOCATE in a Larder transaction: a statement only the
// front holds is dropped here, others on PostgreSQL.
func (s *session) deallocate(ctx context.Context, info stmtInfo) error {
	if st := s.stmts[info.name]; !info.all && st != nil && !st.onUpstream {
		delete(s.stmts, info.name)
		s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte("DEALLOCATE")})
		return nil
	}
	results, err := s.pg.PgConn().Exec(ctx, info.text).ReadAll()
	if err != nil {
		return err
	}
	if info.all {
		clear(s.stmts)
	} else {
		delete(s.stmts, info.name)
	}
	tag := "DEALLOCATE"
	if len(results) > 0 {
		tag = results[len(results)-1].CommandTag.String()
	}
	s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte(tag)})
	return nil
}

// describeUpstream asks PostgreSQL to describe a statement it holds.
func (s *session) describeUpstream(ctx context.Context, name string) (*stmtDesc, error) {
	pc := s.pg.PgConn()
	fe := pc.Frontend()
	fe.SendDescribe(&pgproto3.Describe{ObjectType: 'S', Name: name})
	fe.SendSync(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		return nil, err
	}
	d := &stmtDesc{}
	var failed error
	for {
		msg, err := pc.ReceiveMessage(ctx)
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.ParameterDescription:
			d.params = append([]uint32{}, m.ParameterOIDs...)
		case *pgproto3.RowDescription:
			d.fields = make([]pgconn.FieldDescription, len(m.Fields))
			for i, f := range m.Fields {
				d.fields[i] = pgconn.FieldDescription{Name: string(f.Name), TableOID: f.TableOID,
					TableAttributeNumber: f.TableAttributeNumber, DataTypeOID: f.DataTypeOID, DataTypeSize: f.DataTypeSize,
					TypeModifier: f.TypeModifier, Format: f.Format}
			}
		case *pgproto3.ErrorResponse:
			failed = pgconn.ErrorResponseToPgError(m)
		case *pgproto3.ReadyForQuery:
			if failed != nil {
				s.f.refuse(refusedDescription)
				return nil, failed
			}
			return d, nil
		}
	}
}

// closeUpstream closes a statement PostgreSQL holds.
func (s *session) closeUpstream(ctx context.Context, name string) error {
	return s.roundTrip(ctx, &pgproto3.Close{ObjectType: 'S', Name: name})
}

// roundTrip sends messages and a Sync and reads up to ReadyForQuery; the
// first error PostgreSQL reported is returned.
func (s *session) roundTrip(ctx context.Context, msgs ...pgproto3.FrontendMessage) error {
	pc := s.pg.PgConn()
	fe := pc.Frontend()
	for _, m := range msgs {
		fe.Send(m)
	}
	fe.SendSync(&pgproto3.Sync{})
	if err := fe.Flush(); err != nil {
		return err
	}
	var failed error
	for {
		msg, err := pc.ReceiveMessage(ctx)
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			if failed == nil {
				failed = pgconn.ErrorResponseToPgError(m)
			}
		case *pgproto3.ReadyForQuery:
			return failed
		}
	}
}

// materialize prepares on PostgreSQL, under the client's names, the
// statements of the client's the front answered a Parse for without
// asking PostgreSQL, and the unnamed statement (the library's own
// statements replaced it): after the Larder transaction the session's
// statements are PostgreSQL's again. One that PostgreSQL now refuses (a
// table dropped since) is forgotten.
func (s *session) materialize(ctx context.Context) {
	for name, st := range s.stmts {
		if st.onUpstream && name != "" {
			continue
		}
		if err := s.roundTrip(ctx, &pgproto3.Parse{Name: name, Query: st.sql, ParameterOIDs: st.oids}); err != nil {
			s.log.Info("pgfront: PostgreSQL refused a statement prepared in a Larder transaction", "statement", name, "err", err)
			delete(s.stmts, name)
			continue
		}
		st.onUpstream = true
	}
}
