package pgfront

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgproto3"
)

// pump relays what PostgreSQL sends to the client, byte for byte, while
// the session is not in a Larder transaction. It frames the stream
// (frameReader) and looks only into ReadyForQuery (the cycles the session
// waits for, the transaction status), ErrorResponse (a cycle that
// failed), ParameterStatus (the session's encoding and quoting) and the
// copy responses; every other message passes in pieces as it arrives.
//
// The session parks the pump before the library uses the connection, at a
// point where every forwarded cycle is answered: a read deadline wakes
// it, it finishes any message it has begun, and waits to be resumed. It
// never holds unread bytes while parked, so the pgx connection reads the
// stream from where the pump stopped.
type pump struct {
	s         *session
	fr        *frameReader
	out       []byte
	remaining int // bytes of a message being passed on still to come
	parkReq   atomic.Bool
	parked    chan struct{} // the pump parked (park waits for it)
	resume    chan struct{} // the session lets it go on
	done      chan struct{} // closed when the pump ends

	mu   sync.Mutex // guards the fields below; cond signals their changes
	cond *sync.Cond
	// pending holds one expectation per ReadyForQuery PostgreSQL owes
	// (a forwarded Sync, Query or function call, or a Sync the session
	// added), oldest first.
	pending []*expectation
	status  byte // of the last ReadyForQuery
	copyIn  bool // PostgreSQL waits for the client's COPY data
	params  map[string]string
	err     error // why the pump ended
}

// expectation is a ReadyForQuery PostgreSQL owes. One the session added
// (swallow) is not relayed; done then says whether its cycle failed.
type expectation struct {
	swallow bool
	errSeen bool
	done    chan bool
}

func newPump(s *session) *pump {
	p := &pump{s: s, fr: newFrameReader(s.up), parked: make(chan struct{}), resume: make(chan struct{}),
		done: make(chan struct{}), status: s.startStatus, params: map[string]string{}}
	for k, v := range s.startParams {
		p.params[k] = v
	}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// run relays until the connection ends.
func (p *pump) run() {
	defer close(p.done)
	for {
		if p.fr.buffered() == 0 && p.remaining == 0 {
			if err := p.flush(); err != nil {
				p.stop(err)
				return
			}
			if p.parkReq.Load() {
				select {
				case p.parked <- struct{}{}:
				case <-p.s.closing:
					p.stop(net.ErrClosed)
					return
				}
				select {
				case <-p.resume:
				case <-p.s.closing:
					p.stop(net.ErrClosed)
					return
				}
				continue
			}
		}
		err := p.step()
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if !p.parkReq.Load() || p.fr.buffered() != 0 || p.remaining != 0 {
				p.s.up.resumeRead() // finish the message begun first
			}
			continue
		}
		_ = p.flush()
		p.stop(err)
		return
	}
}

// step relays one message, or the next piece of a long one.
func (p *pump) step() error {
	if p.remaining > 0 {
		if p.fr.buffered() == 0 {
			if err := p.flush(); err != nil {
				return err
			}
		}
		b, err := p.fr.some(p.remaining)
		if err != nil {
			return err
		}
		p.out = append(p.out, b...)
		p.fr.consume(len(b))
		p.remaining -= len(b)
		if len(p.out) >= flushAt {
			return p.flush()
		}
		return nil
	}
	typ, n, err := p.fr.header()
	if err != nil {
		return err
	}
	switch typ {
	case 'Z', 'E', 'S', 'G', 'C':
		msg, err := p.fr.whole(n)
		if err != nil {
			return err
		}
		relay, quiet, err := p.inspect(typ, msg[headerLen:])
		if err != nil {
			return err
		}
		if relay {
			p.out = append(p.out, msg...)
		}
		p.fr.consume(len(msg))
		if quiet {
			// Everything forwarded is answered: the client has it all
			// before the session answers anything itself.
			if err := p.flush(); err != nil {
				return err
			}
			p.cond.Broadcast()
		}
	default:
		h, err := p.fr.whole(0)
		if err != nil {
			return err
		}
		p.out = append(p.out, h[:headerLen]...)
		p.fr.consume(headerLen)
		p.remaining = n
	}
	if len(p.out) >= flushAt {
		return p.flush()
	}
	return nil
}

// inspect follows the session's state in a message it looked into:
// relay is false for a ReadyForQuery the session added, quiet true when
// the last ReadyForQuery owed arrived.
func (p *pump) inspect(typ byte, body []byte) (relay, quiet bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch typ {
	case 'Z':
		var rfq pgproto3.ReadyForQuery
		if err := rfq.Decode(body); err != nil {
			return false, false, err
		}
		p.status, p.copyIn = rfq.TxStatus, false
		if len(p.pending) == 0 {
			p.s.log.Warn("pgfront: PostgreSQL sent a ReadyForQuery the front did not expect")
			return true, false, nil
		}
		e := p.pending[0]
		p.pending = p.pending[1:]
		if e.swallow {
			e.done <- e.errSeen
		}
		return !e.swallow, len(p.pending) == 0, nil
	case 'E':
		if len(p.pending) > 0 {
			p.pending[0].errSeen = true
		}
		p.copyIn = false
	case 'S':
		var ps pgproto3.ParameterStatus
		if err := ps.Decode(body); err != nil {
			return false, false, err
		}
		p.params[ps.Name] = ps.Value
	case 'G':
		p.copyIn = true
	case 'C':
		p.copyIn = false
	}
	return true, false, nil
}

// flush writes what the pump holds for the client.
func (p *pump) flush() error {
	if len(p.out) == 0 {
		return nil
	}
	err := p.s.cw.writeRaw(p.out)
	if cap(p.out) > 1<<20 {
		p.out = nil
	} else {
		p.out = p.out[:0]
	}
	return err
}

// stop ends the pump: the session's connections close (a session waiting
// for the pump, or reading the client, wakes).
func (p *pump) stop(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
	p.cond.Broadcast()
	if !isClosed(err) {
		p.s.log.Info("pgfront: relaying from PostgreSQL ended", "err", err)
	}
	p.s.closeConns()
}

// expect records a ReadyForQuery PostgreSQL will owe for a message about
// to be forwarded; swallow for one the session adds itself.
func (p *pump) expect(swallow bool) *expectation {
	e := &expectation{swallow: swallow}
	if swallow {
		e.done = make(chan bool, 1)
	}
	p.mu.Lock()
	p.pending = append(p.pending, e)
	p.mu.Unlock()
	return e
}

// waitQuiet waits until PostgreSQL answered every forwarded cycle and
// returns its transaction status.
func (p *pump) waitQuiet() (byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.pending) > 0 && p.err == nil {
		p.cond.Wait()
	}
	if p.err != nil {
		return 0, p.err
	}
	return p.status, nil
}

// lastStatus is the status of PostgreSQL's last ReadyForQuery.
func (p *pump) lastStatus() byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// inCopy reports whether PostgreSQL waits for COPY data (it ignores Sync
// then, so no ReadyForQuery is owed for one).
func (p *pump) inCopy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.copyIn
}

// param is a setting PostgreSQL reported (ParameterStatus).
func (p *pump) param(name string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.params[name]
}

// park stops the pump at a message boundary; the caller has waited for
// quiet. The connection is the library's until unpark.
func (p *pump) park() error {
	p.parkReq.Store(true)
	p.s.up.interruptRead()
	select {
	case <-p.parked:
	case <-p.done:
		p.parkReq.Store(false)
		return p.error()
	}
	p.s.up.resumeRead()
	p.parkReq.Store(false)
	return nil
}

// unpark lets the pump relay again, once the pgx connection holds no
// unread bytes.
func (p *pump) unpark(ctx context.Context) error {
	err := p.s.pg.PgConn().SyncConn(ctx)
	select {
	case p.resume <- struct{}{}:
	case <-p.done:
	}
	return err
}

func (p *pump) error() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		return net.ErrClosed
	}
	return p.err
}

// forward queues a client message for PostgreSQL, unchanged.
func (s *session) forward(msg pgproto3.FrontendMessage) {
	buf, err := msg.Encode(s.upBuf)
	if err != nil {
		// A message pgproto3 decoded always encodes; should one not, the
		// session cannot go on faithfully.
		s.log.Error("pgfront: re-encoding a client message failed", "message", msg, "err", err)
		s.closeConns()
		return
	}
	s.upBuf = buf
	if len(s.upBuf) >= flushAt {
		if err := s.flushUp(); err != nil {
			s.closeConns()
		}
	}
}

// flushUp writes the messages queued for PostgreSQL.
func (s *session) flushUp() error {
	if len(s.upBuf) == 0 || s.up == nil {
		return nil
	}
	_, err := s.up.Write(s.upBuf)
	if cap(s.upBuf) > 1<<20 {
		s.upBuf = nil
	} else {
		s.upBuf = s.upBuf[:0]
	}
	return err
}

// waitQuiet sends what is queued and waits until PostgreSQL answered it
// all; its transaction status.
func (s *session) waitQuiet() (byte, error) {
	if err := s.flushUp(); err != nil {
		return 0, err
	}
	return s.pump.waitQuiet()
}

// handleRelay forwards a message outside a Larder transaction, answering
// the few the front owns (a Larder BEGIN, larder.staleness).
func (s *session) handleRelay(ctx context.Context, msg pgproto3.FrontendMessage) {
	switch m := msg.(type) {
	case *pgproto3.Query:
		delete(s.stmts, "") // a simple query ends the unnamed statement
		s.simpleQuery(ctx, m.String)
	case *pgproto3.Parse:
		st := &preparedStmt{sql: m.Query, oids: append([]uint32(nil), m.ParameterOIDs...), onUpstream: true}
		st.wrote, st.changed = s.touchedBy(m.Query)
		s.stmts[m.Name] = st
		s.cycle.forwarded = true
		s.forward(m)
	case *pgproto3.Bind:
		s.cycle.bound[m.DestinationPortal] = s.stmts[m.PreparedStatement]
		s.cycle.forwarded = true
		s.forward(m)
	case *pgproto3.Execute:
		st, boundNow := s.cycle.bound[m.Portal]
		if boundNow && st != nil {
			if info := s.quickInfo(st); info.class == classBeginRO || info.class == classSetStaleness {
				if !s.cycle.executed {
					s.interceptExecute(ctx, m, info)
					return
				}
				s.f.refuse(refusedPipeline)
				s.log.Info("pgfront: a Larder statement after another statement of one pipeline goes to PostgreSQL as it is", "statement", st.sql)
			}
		}
		if boundNow && st != nil {
			s.sc.Touched(st.wrote, st.changed)
		} else {
			s.sc.Touched(true, true)
		}
		s.cycle.forwarded, s.cycle.executed = true, true
		s.countRelayed()
		s.forward(m)
	case *pgproto3.Sync:
		if !s.pump.inCopy() {
			s.pump.expect(false)
		}
		s.forward(m)
		s.cycle = cycleState{bound: map[string]*preparedStmt{}}
	case *pgproto3.Flush:
		s.forward(m)
		if err := s.flushUp(); err != nil {
			s.closeConns()
		}
	case *pgproto3.FunctionCall:
		s.sc.Touched(true, true)
		s.pump.expect(false)
		s.countRelayed()
		s.forward(m)
	case *pgproto3.Close:
		if m.ObjectType == 'S' {
			delete(s.stmts, m.Name)
		}
		s.cycle.forwarded = true
		s.forward(m)
	default: // Describe, CopyData, CopyDone, CopyFail
		if _, ok := m.(*pgproto3.Describe); ok {
			s.cycle.forwarded = true
		}
		s.forward(m)
	}
}

// countRelayed counts a statement passed to PostgreSQL.
func (s *session) countRelayed() {
	s.f.stats.Relayed.Add(1)
	s.f.m.statements.WithLabelValues("relayed").Inc()
}

// quickInfo classifies a statement as far as forwarding needs: fully when
// its first word says it may be one the front answers, else by that word.
func (s *session) quickInfo(st *preparedStmt) stmtInfo {
	if st.classified {
		return st.info
	}
	if !interceptKeywords[firstKeyword(st.sql)] {
		return stmtInfo{class: classOther}
	}
	return s.fullInfo(st)
}

// fullInfo classifies a statement with the parser (several statements,
// or one the parser refuses, are classOther: PostgreSQL answers them).
func (s *session) fullInfo(st *preparedStmt) stmtInfo {
	if st.classified {
		return st.info
	}
	st.classified = true
	st.info = stmtInfo{class: classOther, command: "statement", text: st.sql}
	infos, err := s.f.classify.classify(st.sql)
	switch {
	case err != nil:
	case len(infos) == 0:
		st.info = stmtInfo{class: classEmpty, text: st.sql}
	case len(infos) == 1:
		st.info = infos[0]
		st.info.text, st.info.start = st.sql, 0
	}
	return st.info
}

// touchedBy says whether a statement run outside a Larder transaction may
// write (its commit must be seen by the session's later Larder
// transactions) and may change the session's roles or settings.
func (s *session) touchedBy(sql string) (wrote, changed bool) {
	switch firstKeyword(sql) {
	case "SELECT", "WITH", "VALUES", "TABLE", "(":
		if s.sc.PureRead(sql) {
			return false, false
		}
		if singleStatement(sql) {
			return true, !s.sc.Neutral(sql)
		}
	case "", "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE", "SHOW", "FETCH", "MOVE",
		"CLOSE", "LISTEN", "UNLISTEN", "DEALLOCATE", "PREPARE":
		if singleStatement(sql) {
			return false, false
		}
	case "SET", "RESET", "DISCARD":
		if singleStatement(sql) {
			return false, true
		}
	case "INSERT", "UPDATE", "DELETE":
		if singleStatement(sql) {
			return true, !s.sc.Neutral(sql)
		}
	}
	return true, true
}

// interceptExecute answers, outside a Larder transaction, an Execute of a
// BEGIN READ ONLY or of a SET larder.staleness bound in this cycle, with
// no statement executed before it in the cycle. What was forwarded of the
// cycle (its Parse and Bind) is closed with a Sync of the front's own, so
// that PostgreSQL's answers come first and its status is known; should
// that part have failed, PostgreSQL would have skipped the Execute, and so
// does the front, up to the client's Sync.
func (s *session) interceptExecute(ctx context.Context, m *pgproto3.Execute, info stmtInfo) {
	var status byte
	var err error
	if s.cycle.forwarded {
		e := s.pump.expect(true)
		s.forward(&pgproto3.Sync{})
		if status, err = s.waitQuiet(); err != nil {
			return
		}
		if <-e.done {
			s.skipToSync = true
			s.cycle = cycleState{bound: map[string]*preparedStmt{}}
			return
		}
	} else if status, err = s.waitQuiet(); err != nil {
		return
	}
	s.cycle = cycleState{bound: map[string]*preparedStmt{}}
	switch info.class {
	case classBeginRO:
		if status != 'I' {
			// In a transaction block already: PostgreSQL's warning, as
			// it would give it (its portal survives the added Sync).
			s.cycle.forwarded, s.cycle.executed = true, true
			s.countRelayed()
			s.forward(m)
			return
		}
		if err := s.enterLarder(ctx); err != nil {
			s.cw.send(errorResponse(err))
			s.skipToSync = true
			return
		}
		s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")})
	case classSetStaleness:
		if err := s.setStaleness(info, status); err != nil {
			s.cw.send(errorResponse(err))
			s.skipToSync = true
			return
		}
		s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte("SET")})
	}
}
