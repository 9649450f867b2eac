package larder

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/internal/invalidation"
)

// A read-only transaction that ran at a pin and did nothing but cacheable
// reads leaves its PostgreSQL transaction open when it ends, parked on its
// connection for Config.ParkIdle. The next transaction that begins at the
// same pin on that connection (the client's pool's, or the database/sql
// connection's, see sessionPark) takes it: its
// snapshot is the pin's already, and the tables it locked and checked stay
// held, so it begins with no BEGIN, snapshot import, lock or storage check
// (and the parked one needs no ROLLBACK). Only reads that leave nothing
// behind in the transaction park it: a statement that is not a cacheable
// template (it may set a setting for the transaction, declare a cursor,
// take a lock) or one that failed ends it as before.
//
// A PostgreSQL transaction parks only within ParkIdle of its BEGIN,
// however many transactions took it since, and ends ParkIdle after it
// parked: it lives at most twice ParkIdle plus the last taker's own
// length. Meanwhile it holds its tables' ACCESS SHARE locks, as it did
// while it ran: a TRUNCATE or ALTER TABLE waits that long at most more
// for it, and now() in a later taker is that much older than its own
// start. It holds no older snapshot than its pin, which the pincushion
// holds anyway. At most a quarter of the pool's connections are parked; each
// database/sql connection parks its own.
//
// A transaction begins at an older candidate pin than its newest, at most
// Config.ParkPrefer older, when a transaction is parked there on its
// connection (pinToBegin): under writes the newest pin changes every few
// milliseconds, and a transaction that insisted on it would rarely find
// anything parked.

// DefaultParkIdle is how long a parked transaction waits for the next one
// at its pin (Config.ParkIdle).
const DefaultParkIdle = 200 * time.Millisecond

// parkAnyPinForTest breaks the client on purpose (a transaction begins on
// one parked at any pin, reading that pin's snapshot while it claims its
// own): the history checker must then find violations.
var parkAnyPinForTest bool

// parkedTx is a pooled connection in a read-only transaction at pin.
type parkedTx struct {
	conn  *pgxpool.Conn
	pin   invalidation.Pin
	scope string          // the pool's session scope key when it parked
	held  map[string]bool // the tables locked and checked (holdTables)
	born  time.Time       // when its PostgreSQL transaction began
	at    time.Time
}

// parkingLot holds the parked transactions, newest last.
type parkingLot struct {
	idle time.Duration
	max  int
	m    *prometheus.CounterVec // outcome: parked, taken, expired, evicted, closed

	mu     sync.Mutex
	txs    []parkedTx
	timer  *time.Timer
	closed bool
}

// newParkingLot returns the lot of a pool of poolMax connections; nil
// (parking off) when idle < 0.
func newParkingLot(idle time.Duration, poolMax int32, m *prometheus.CounterVec) *parkingLot {
	if idle < 0 {
		return nil
	}
	if idle == 0 {
		idle = DefaultParkIdle
	}
	return &parkingLot{idle: idle, max: max(1, int(poolMax)/4), m: m}
}

// park leaves p's transaction open for the next one at its pin. It
// reports false, keeping nothing, when the lot is closed or off, or when
// the transaction began ParkIdle ago or more (however many took it since,
// none lives on past that).
func (l *parkingLot) park(p parkedTx) bool {
	if l == nil || time.Since(p.born) >= l.idle {
		return false
	}
	var evicted *parkedTx
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	if len(l.txs) >= l.max {
		evicted = l.popOldestLocked()
	}
	p.at = time.Now()
	l.txs = append(l.txs, p)
	if l.timer == nil {
		l.timer = time.AfterFunc(l.idle, l.sweep)
	}
	l.mu.Unlock()
	l.m.WithLabelValues("parked").Inc()
	if evicted != nil {
		l.m.WithLabelValues("evicted").Inc()
		go endPooled(evicted.conn)
	}
	return true
}

// evictOldest ends the oldest parked transaction, giving its connection
// back to the pool (for an acquire that finds the pool exhausted).
func (l *parkingLot) evictOldest() {
	if l == nil {
		return
	}
	l.mu.Lock()
	old := l.popOldestLocked()
	l.mu.Unlock()
	if old != nil {
		l.m.WithLabelValues("evicted").Inc()
		endPooled(old.conn)
	}
}

// popOldestLocked removes the oldest parked transaction (nil: none) and
// returns it; l.mu is held.
func (l *parkingLot) popOldestLocked() *parkedTx {
	if len(l.txs) == 0 {
		return nil
	}
	old := l.txs[0]
	l.txs = append(l.txs[:0], l.txs[1:]...)
	return &old
}

// take returns the newest transaction parked at pin in scope, if any.
func (l *parkingLot) take(pin invalidation.Pin, scope string) (parkedTx, bool) {
	if l == nil {
		return parkedTx{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.txs) - 1; i >= 0; i-- {
		p := l.txs[i]
		if (!p.pin.Same(pin) && !parkAnyPinForTest) || p.scope != scope {
			continue
		}
		if l.expired(p, time.Now()) {
			break // the sweep ends it
		}
		l.txs = append(l.txs[:i], l.txs[i+1:]...)
		l.m.WithLabelValues("taken").Inc()
		return p, true
	}
	return parkedTx{}, false
}

// newestParkedAmong is the index in pins (in LSN order) of the newest
// with a transaction of scope parked at it, not yet expired; -1 if none
// (take may still find it gone: another transaction can take it first).
func (l *parkingLot) newestParkedAmong(pins []invalidation.Pin, scope string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	best, now := -1, time.Now()
	for _, p := range l.txs {
		if p.scope != scope || l.expired(p, now) {
			continue
		}
		if i := indexOfPin(pins, p.pin); i > best {
			best = i
		}
	}
	return best
}

// expired reports whether p has been parked for the lot's idle time at
// now (the sweep ends it; nothing takes it meanwhile).
func (l *parkingLot) expired(p parkedTx, now time.Time) bool { return now.Sub(p.at) >= l.idle }

// sweep ends the transactions parked for idle, and comes back for the
// others.
func (l *parkingLot) sweep() {
	l.mu.Lock()
	var expired []parkedTx
	now := time.Now()
	keep := l.txs[:0]
	for _, p := range l.txs {
		if l.expired(p, now) {
			expired = append(expired, p)
		} else {
			keep = append(keep, p)
		}
	}
	clear(l.txs[len(keep):])
	l.txs = keep
	l.timer = nil
	if len(l.txs) > 0 && !l.closed {
		l.timer = time.AfterFunc(l.idle-now.Sub(l.txs[0].at), l.sweep)
	}
	l.mu.Unlock()
	for _, p := range expired {
		l.m.WithLabelValues("expired").Inc()
		endPooled(p.conn)
	}
}

// close ends every parked transaction, and parks none from now on: the
// pool can close only once its connections are back.
func (l *parkingLot) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.closed = true
	txs := l.txs
	l.txs = nil
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	l.mu.Unlock()
	for _, p := range txs {
		l.m.WithLabelValues("closed").Inc()
		endPooled(p.conn)
	}
}

// parkable reports whether the transaction, ending, can park on its
// connection (a pooled one, or a database/sql one with parking on): it
// ran at a pin on that connection (not through a Loader), only cacheable
// reads ran in it, and PostgreSQL's transaction is open, not failed, with
// nothing in flight.
func (t *ROTx) parkable() bool {
	if t.remote != nil || t.conn == nil || t.tainted || !t.fixed || t.fallback || !t.atPin() {
		return false
	}
	if t.session != nil {
		if t.park == nil {
			return false
		}
	} else if t.c.parked == nil || t.pooled == nil {
		return false
	}
	pc := pgConnOf(t.conn)
	return pc.TxStatus() == 'T' && !pc.IsBusy() && !pc.IsClosed()
}

// pinToBegin is the index in t.cands of the pin the transaction begins
// at: the newest candidate, unless a transaction is parked on its
// connection (a database/sql session's) or in the pool's lot at an older
// candidate taken at most Config.ParkPrefer before the newest: then the
// newest such one, whose transaction it takes (and begins nowhere else:
// errNotParked if that one was taken or expired since). The candidates
// are the pins its reads so far allow, each within its staleness limit
// and after its session's writes, so any of them keeps the contract.
func (t *ROTx) pinToBegin() int {
	newest := len(t.cands) - 1
	prefer := t.c.cfg.ParkPrefer
	if newest <= 0 || prefer < 0 || t.noOlderPin || t.c.loader != nil {
		return newest
	}
	top := t.cands[newest]
	if top.TakenAt.IsZero() {
		return newest
	}
	// The oldest candidate taken within prefer of the newest (pins are
	// taken in LSN order, bar a placed snapshot verified late: it only
	// ends the scan early).
	from := newest
	for from > 0 {
		p := t.cands[from-1]
		if p.SnapshotID == "" || p.TakenAt.IsZero() || top.TakenAt.Sub(p.TakenAt) > prefer {
			break
		}
		from--
	}
	if from == newest {
		return newest
	}
	if t.session != nil {
		pin, ok := t.park.parkedPin()
		if !ok {
			return newest
		}
		if i := indexOfPin(t.cands[from:], pin); i >= 0 {
			return from + i
		}
		return newest
	}
	if t.c.parked == nil {
		return newest
	}
	if i := t.c.parked.newestParkedAmong(t.cands[from:], t.scope.key); i >= 0 {
		return from + i
	}
	return newest
}

// indexOfPin is the index of pin in pins (in LSN order), -1 if absent.
func indexOfPin(pins []invalidation.Pin, pin invalidation.Pin) int {
	i := sort.Search(len(pins), func(i int) bool { return pins[i].LSN >= pin.LSN })
	for ; i < len(pins) && pins[i].LSN == pin.LSN; i++ {
		if pins[i].Same(pin) {
			return i
		}
	}
	return -1
}

// pinChosenForTest, when set, runs after pinToBegin chose a pin and
// before the transaction begins there (a test takes the parked
// transaction away meanwhile).
var pinChosenForTest func(*ROTx, int)

// errNotParked: a transaction that chose an older pin for the one parked
// there found it taken or expired; it begins at its newest instead.
var errNotParked = errors.New("larder: no transaction parked at the older pin")

// beginParked begins the transaction at pin on a transaction parked there,
// holding tables not held yet (and running the pipelined read, t.pipe,
// with their lock and check). It reports false when none was parked, or
// when the parked one failed (its connection is given back, the
// transaction begins the usual way).
func (t *ROTx) beginParked(ctx context.Context, pin invalidation.Pin, tables []string) (bool, error) {
	if pin.SnapshotID == "" {
		return false, nil
	}
	if t.session != nil {
		held, born, ok := t.park.take(pin)
		if !ok {
			return false, nil
		}
		t.conn, t.held, t.pgBegun = t.session, held, born
	} else {
		p, ok := t.c.parked.take(pin, t.scope.key)
		if !ok {
			return false, nil
		}
		t.pooled, t.conn, t.held, t.pgBegun = p.conn, p.conn, p.held, p.born
	}
	ts := pin.LSN
	plan := t.planHold(tables, ts)
	var err error
	if q := t.pipe; q != nil {
		var stmts []string
		if plan != nil {
			stmts = plan.statements()
		}
		if r := t.pipeRead(ctx, stmts, q); r.sent {
			if err = t.pipedOutcome(ctx, r, plan, ts, q); err == nil {
				t.pipe = nil
				t.c.stats.ParkedBegins.Add(1)
				return true, nil
			}
			return t.unpark(ctx, err)
		}
		if pgConnOf(t.conn).TxStatus() != 'T' {
			// Not sent, but a statement's description, read inside
			// the transaction, failed and aborted it.
			return t.unpark(ctx, errors.New("larder: the parked transaction was aborted"))
		}
	}
	if plan != nil {
		results, err := runPrepared(ctx, pgxConnOf(t.conn), t.c.epoch.Load(), t.c.m, plan.statements()...)
		if err == nil {
			err = t.checkHeld(ctx, plan, results, ts)
		}
		if err != nil {
			return t.unpark(ctx, err)
		}
	}
	t.c.stats.ParkedBegins.Add(1)
	return true, nil
}

// unpark ends a taken parked transaction that failed to begin the new
// one. A table rewritten since the pin is the transaction's answer
// (errRewritten); anything else (the connection died while parked, a
// prepared statement is gone, the read failed) lets it begin the usual
// way, where the failure, if it is the read's, shows again.
func (t *ROTx) unpark(ctx context.Context, err error) (bool, error) {
	// On a context of its own: a ROLLBACK that the caller's deadline kept
	// from being sent would leave the connection in the transaction.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if t.session != nil {
		if _, rerr := t.session.Exec(cctx, "ROLLBACK"); rerr != nil {
			_ = t.session.Close(cctx) // database/sql drops it (IsValid)
		}
		t.conn, t.held = nil, nil
	} else {
		_ = t.closeConn(cctx) // pgxpool destroys a connection left in a transaction
	}
	t.c.m.parked.WithLabelValues("failed").Inc()
	if errors.Is(err, errRewritten) || ctx.Err() != nil {
		return true, err
	}
	return false, nil
}

// sessionPark is a database/sql connection's parked transaction: a
// read-only transaction of the connection that ran at a pin and only read
// cacheable templates leaves it open when it ends, for the connection's
// next read-only transaction at the same pin. Every other use of the
// connection (a statement outside a read-only transaction, a read/write
// transaction, a read-only one at another pin, Ping, Close) ends it
// first, as its expiry after ParkIdle does: the connection is idle in
// database/sql's pool meanwhile, so the expiry and the connection's next
// user take mu.
type sessionPark struct {
	conn *pgx.Conn
	idle time.Duration
	m    *prometheus.CounterVec

	mu     sync.Mutex
	parked bool
	pin    invalidation.Pin
	held   map[string]bool
	born   time.Time // when the parked PostgreSQL transaction began
	gen    uint64    // which parking the timer is for
	timer  *time.Timer
}

// newSessionPark returns conn's; nil (parking off) when idle < 0.
func newSessionPark(conn *pgx.Conn, idle time.Duration, m *prometheus.CounterVec) *sessionPark {
	if idle < 0 {
		return nil
	}
	if idle == 0 {
		idle = DefaultParkIdle
	}
	return &sessionPark{conn: conn, idle: idle, m: m}
}

// park leaves the connection's transaction at pin, begun at born, open.
// It reports false, parking nothing, when the transaction began ParkIdle
// ago or more.
func (s *sessionPark) park(pin invalidation.Pin, held map[string]bool, born time.Time) bool {
	if time.Since(born) >= s.idle {
		return false
	}
	s.mu.Lock()
	s.parked, s.pin, s.held, s.born = true, pin, held, born
	s.gen++
	gen := s.gen
	s.timer = time.AfterFunc(s.idle, func() { s.expire(gen) })
	s.mu.Unlock()
	s.m.WithLabelValues("parked").Inc()
	return true
}

// expire ends the parked transaction gen if it is still parked.
func (s *sessionPark) expire(gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.parked || s.gen != gen {
		return
	}
	s.m.WithLabelValues("expired").Inc()
	s.endLocked(context.Background())
}

// endLocked rolls the parked transaction back (closing the connection
// when that fails: database/sql then drops it).
func (s *sessionPark) endLocked(ctx context.Context) error {
	s.parked, s.held = false, nil
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := s.conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = s.conn.Close(ctx)
		return fmt.Errorf("larder: end the connection's parked read-only transaction: %w", err)
	}
	return nil
}

// unpark ends the parked transaction, if any, before another use of the
// connection.
func (s *sessionPark) unpark(ctx context.Context) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.parked {
		return nil
	}
	return s.endLocked(ctx)
}

// locked runs f with no expiry running on the connection.
func (s *sessionPark) locked(f func()) {
	if s != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
	}
	f()
}

// take hands the transaction parked at pin over to the caller (the
// tables it holds, when it began); false when none is parked there.
func (s *sessionPark) take(pin invalidation.Pin) (map[string]bool, time.Time, bool) {
	if s == nil {
		return nil, time.Time{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.parked || (!s.pin.Same(pin) && !parkAnyPinForTest) {
		return nil, time.Time{}, false
	}
	held := s.held
	s.parked, s.held = false, nil
	s.timer.Stop()
	s.timer = nil
	s.m.WithLabelValues("taken").Inc()
	return held, s.born, true
}

// parkedPin is the pin of the transaction parked on the connection, if
// one is.
func (s *sessionPark) parkedPin() (invalidation.Pin, bool) {
	if s == nil {
		return invalidation.Pin{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pin, s.parked
}

// close forgets the parked transaction: the connection is closing, and
// PostgreSQL ends it.
func (s *sessionPark) close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.parked {
		s.m.WithLabelValues("closed").Inc()
	}
	s.parked, s.held = false, nil
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
}
