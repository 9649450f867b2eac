package larder

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/qumaana/quma"
)

// ErrRetry is returned (errors.Is) when a read-only transaction cannot
// continue at a snapshot consistent with what it already read (every pin
// it could use was released), or a schema change replaced a result type
// under it after it read at its snapshot: retry the transaction.
var ErrRetry = errors.New("larder: no snapshot left consistent with the transaction's reads; retry it")

// errRewritten: a table was truncated or rewritten after the
// transaction's snapshot (holdTables); the pins that old are dropped.
var errRewritten = fmt.Errorf("truncated or rewritten after the transaction's snapshot; retry the transaction: %w", ErrRetry)

// skipNarrowForTest breaks the client on purpose (hits do not narrow the
// candidate snapshots) so that a test can show it notices.
var skipNarrowForTest bool

// ROTx is a read-only transaction: every result it returns, from the L1,
// a cache-node or PostgreSQL, is the result at one snapshot, taken no
// earlier than the staleness limit before it began.
type ROTx struct {
	c     *Client
	cands []invalidation.Pin // usable pins, by LSN
	// Once a query ran on PostgreSQL the transaction is fixed at a pin,
	// in a transaction open on conn.
	conn  dbConn
	fixed bool
	// remote, when set, is the transaction at the pin that the client's
	// Loader began (beginAt) instead of conn.
	remote PinnedTx
	// session is the database/sql connection the transaction runs on (its
	// session's settings count); nil: a connection from the client's pool.
	session *pgx.Conn
	pooled  *pgxpool.Conn
	// scope is the key scope of the session (readScope).
	scope sessionScope
	// sqlFormats: results are fetched in the formats pgx's database/sql
	// driver asks for (text for most types), so that database/sql sees the
	// same values cached or not; such results are keyed apart.
	sqlFormats bool
	ts         uint64
	pin        invalidation.Pin // the pin once fixed at one (no snapshot id at a fresh snapshot)
	// fallback: no pin was usable; the transaction runs on a fresh
	// snapshot, without the cache.
	fallback bool
	// returned: a result was returned (the snapshot can no longer move).
	returned bool
	m        *pgxTypeMap
	done     bool
	now      bool
	held     map[string]bool // tables locked and checked (holdTables)
	// placing is the placement of the fresh snapshot the transaction is
	// open at, while the pincushion works on it (nil once settled);
	// nowTries counts the fresh snapshots tried.
	placing  *placement
	nowTries int
	// begun is when the transaction began: its clock buckets (the "now"
	// of clock-bound queries) are this time rounded down.
	begun time.Time
	// frames are the cacheable functions running (function.go), innermost
	// last: every read is recorded in each.
	frames []*frame
	trace  []string // where each result came from, for diagnostics
	// pipe is the read whose miss fixes the transaction: its begin sends
	// it along (piped.go).
	pipe *pipedRead
	// park is the database/sql connection's parked transaction (session
	// set; nil when parking is off).
	park *sessionPark
	// pgBegun is when the PostgreSQL transaction at the pin began (by
	// this transaction, or by one that parked it): none parks past
	// ParkIdle after it.
	pgBegun time.Time
	// tainted: a statement ran that may leave something behind in the
	// PostgreSQL transaction (not a cacheable template): it cannot park
	// (parked.go).
	tainted bool
	// onlyParked: begin begins at its pin on a parked transaction or not
	// at all (errNotParked), for an older pin chosen for the one parked
	// there (pinToBegin); noOlderPin: that failed, the newest it is.
	onlyParked, noOlderPin bool
}

// BeginRO starts a read-only transaction with a staleness limit (0: the
// client's default).
func (c *Client) BeginRO(ctx context.Context, staleness time.Duration) (*ROTx, error) {
	return c.beginRO(ctx, staleness, nil, *c.poolScope.Load(), nil)
}

// beginRO starts a read-only transaction on session (nil: the pool),
// whose key scope is scope and whose parked transaction is park (nil:
// none parks there).
func (c *Client) beginRO(ctx context.Context, staleness time.Duration, session *pgx.Conn, scope sessionScope, park *sessionPark) (*ROTx, error) {
	if staleness <= 0 {
		staleness = c.cfg.Staleness
	}
	c.noteStaleness(staleness)
	t := &ROTx{c: c, m: c.maps.Get().(*pgxTypeMap), session: session, scope: scope, begun: time.Now(), park: park}
	t.cands = c.pins.candidates(time.Now().Add(-staleness), c.minLSN(ctx))
	if len(t.cands) == 0 {
		// No pin fits: a snapshot taken now, placed by the pincushion
		// while the transaction goes on (settle).
		if err := t.takeNow(ctx); err != nil {
			// The transaction may be open: end it (on a context of its
			// own, the caller's may be over).
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = t.closeConn(cctx)
			cancel()
			t.release()
			return nil, wrap("begin", "", err)
		}
	}
	return t, nil
}

// maxNowAttempts bounds the fresh snapshots a transaction tries.
const maxNowAttempts = 3

// Placed reports whether the transaction reads at an exact commit-LSN
// timestamp; false for a fallback, which reads one PostgreSQL snapshot
// uncached. At a fresh snapshot whose placement is still under way it
// waits for the pincushion's answer (at most Config.PinVerifyTimeout).
func (t *ROTx) Placed() bool {
	if t.placing != nil && !t.done {
		_ = t.settle(context.Background(), t.c.cfg.PinVerifyTimeout, false)
	}
	return !t.fallback && t.placing == nil
}

// placement is the pincushion's work on a fresh snapshot: the
// transaction is open at the snapshot already and reads on PostgreSQL
// while it waits for the answer (settle).
type placement struct {
	done chan struct{} // closed once reply or err is set
	// after is the newest pin's timestamp known before the snapshot was
	// taken: the snapshot's own is no earlier.
	after  uint64
	reply  invalidation.PinVerifyReply
	err    error
	cancel context.CancelFunc
}

// takeNow opens the transaction at a fresh snapshot and asks the
// pincushion for its exact timestamp, without waiting for the answer
// (settle takes it). When the pincushion cannot be asked (NATS is not
// connected) or is placing no pins (its commit log does not advance: it
// would only answer after its own wait), the transaction runs uncached at
// once.
func (t *ROTx) takeNow(ctx context.Context) error {
	t.nowTries++
	if !t.c.nc.IsConnected() || !t.c.pins.placing(time.Now()) {
		// No one to place it: uncached on a fresh snapshot.
		if err := t.begin(ctx, invalidation.Pin{}, nil); err != nil {
			return err
		}
		if !t.c.nc.IsConnected() {
			t.fallBack(fallbackNATS)
		} else {
			t.fallBack(fallbackPins)
		}
		return nil
	}
	// BEGIN and the snapshot's read in one round trip.
	after := t.c.pins.newest()
	began := time.Now()
	req, err := t.beginNow(ctx)
	if err != nil {
		return err
	}
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.c.cfg.PinVerifyTimeout)
	p := &placement{done: make(chan struct{}), after: after, cancel: cancel}
	t.placing, t.fixed, t.now = p, true, true
	c := t.c
	c.placements.Add(1)
	go func() {
		defer c.placements.Done()
		defer close(p.done)
		if d := placementDelayForTest.Load(); d > 0 {
			time.Sleep(time.Duration(d))
		}
		msg, err := c.nc.RequestWithContext(vctx, invalidation.PinVerifySubject(c.cfg.Prefix), invalidation.EncodePinVerifyRequest(req))
		if err == nil {
			p.reply, err = invalidation.DecodePinVerifyReply(msg.Data)
		}
		p.err = err
		switch {
		case err == nil && p.reply.OK:
			c.noteFreshWait("placed", time.Since(began))
			c.stats.NowSnapshots.Add(1)
		default:
			if errors.Is(vctx.Err(), context.DeadlineExceeded) {
				// Unanswered in time: the pincushion is waiting for a
				// commit log that does not advance. Until it places a
				// pin again, transactions do not ask.
				c.pins.stall(time.Now())
			}
			c.noteFreshWait("not_placed", time.Since(began))
		}
	}()
	return nil
}

// placementDelayForTest (nanoseconds) holds every placement that long
// before the pincushion is asked, so that a test can tell reads that wait
// for it from reads that do not.
var placementDelayForTest atomic.Int64

// readUncached runs a read of template tplID at a fresh snapshot that is
// not placed (yet, or at all: a fallback), its tables held (tplID "":
// counted by the caller).
func (t *ROTx) readUncached(ctx context.Context, tplID, sql string, args []any) (*Result, error) {
	if t.fallback {
		t.noteUncacheable("the transaction reads uncached (no usable pin)")
	} else {
		t.c.stats.UnplacedReads.Add(1)
		t.c.m.unplacedReads.Inc()
		t.noteUncacheable("read before its fresh snapshot was placed")
	}
	if tplID != "" {
		t.c.m.templateRead(tplID, "uncached")
	}
	t.trace = append(t.trace, "db(unplaced)")
	return t.onDBUncached(ctx, sql, args)
}

// settle takes the placement's outcome when it has come, waiting for it
// at most wait (and while ctx lasts). Placed, the transaction reads at
// the snapshot's timestamp, through the caches. Not placed (refused as
// not exact, or unanswered in time), a transaction that has returned
// nothing yet tries another fresh snapshot (at most maxNowAttempts) when
// retry; otherwise it runs uncached on the one it has. Still under way,
// it changes nothing: the read runs on PostgreSQL at the snapshot,
// uncached.
func (t *ROTx) settle(ctx context.Context, wait time.Duration, retry bool) error {
	p := t.placing
	if p == nil {
		return nil
	}
	deadline := time.Now().Add(wait)
	select {
	case <-p.done:
	default:
		if wait <= 0 {
			return nil
		}
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-p.done:
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	t.placing = nil
	p.cancel()
	if p.err == nil && p.reply.OK {
		t.ts = p.reply.TS
		t.cands = []invalidation.Pin{{LSN: p.reply.TS}}
		return nil
	}
	if retry && !t.returned && p.err == nil && t.nowTries < maxNowAttempts {
		// Refused (PostgreSQL's own order of concurrent commits can make
		// a snapshot impossible to place: about one in seven under load)
		// before anything was read: another may be placed.
		if err := t.closeConn(ctx); err != nil {
			return err
		}
		t.fixed, t.now, t.held = false, false, nil
		if err := t.takeNow(ctx); err != nil {
			return err
		}
		return t.settle(ctx, time.Until(deadline), retry) // what is left of the wait
	}
	t.fallBack(fallbackVerify)
	return nil
}

// noteFreshWait counts one try at a fresh snapshot whose placement took
// d.
func (c *Client) noteFreshWait(outcome string, d time.Duration) {
	c.m.freshWaits.WithLabelValues(outcome).Observe(d.Seconds())
	c.stats.FreshWaitNanos.Add(int64(d))
}

// fallBack makes the transaction run uncached on the fresh snapshot it
// has begun (counted, by reason).
func (t *ROTx) fallBack(reason string) {
	t.fallback = true
	t.c.stats.Fallbacks.Add(1)
	t.c.m.fallbacks.WithLabelValues(reason).Inc()
}

// beginReadOnly begins a read-only transaction's PostgreSQL part.
const beginReadOnly = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

// begin opens the PostgreSQL transaction, at pin's snapshot when it has
// one (else at a fresh snapshot), and holds tables (holdTables) in the
// same round trip. A pin exported by another run of the PostgreSQL server
// than the connection's is not imported: its snapshot id may name another
// snapshot of this run. It is refused as PostgreSQL refuses a released
// one (snapshotGone), with no transaction begun.
func (t *ROTx) begin(ctx context.Context, pin invalidation.Pin, tables []string) error {
	// One round trip: BEGIN, SET TRANSACTION SNAPSHOT and the tables' locks
	// as one simple query (the snapshot id comes from the pin format, which
	// allows only [0-9A-Za-z_-]).
	snapshot, ts := pin.SnapshotID, pin.LSN
	sql := beginReadOnly
	if snapshot != "" {
		if err := invalidation.PinValidSnapshotID(snapshot); err != nil {
			return err
		}
		sql += "; " + setSnapshot + "'" + snapshot + "'"
	}
	if snapshot != "" {
		// A transaction parked at the pin (same server run) begins it.
		if ok, err := t.beginParked(ctx, pin, tables); ok {
			return err
		}
		if t.onlyParked {
			return errNotParked
		}
	}
	if err := t.acquire(ctx); err != nil {
		return err
	}
	t.pgBegun = time.Now()
	if snapshot != "" && !pin.ServerStart.IsZero() {
		start, err := connServerStart(ctx, t.conn)
		if err != nil {
			_ = t.closeConn(ctx)
			return err
		}
		if pin.OtherServer(start) {
			t.c.m.pinsOtherServer.Inc()
			t.dropConn() // healthy, and in no transaction
			return errOtherServer(pin, start)
		}
	}
	plan := t.planHold(tables, ts)
	if q := t.pipe; q != nil && snapshot != "" {
		// The first read that missed goes in the same round trip (again
		// with the next pin when this one is gone).
		sent, err := t.beginPiped(ctx, snapshot, plan, ts, q)
		if !sent || err == nil || errors.Is(err, errPipeAgain) {
			t.pipe = nil
		}
		if errors.Is(err, errPipeAgain) {
			return t.begin(ctx, pin, tables)
		}
		if sent {
			return err
		}
	}
	if plan == nil {
		if _, err := t.conn.Exec(ctx, sql); err != nil {
			_ = t.closeConn(ctx)
			return err
		}
		return nil
	}
	results, err := pgConnOf(t.conn).Exec(ctx, sql+"; "+plan.sql()).ReadAll()
	if err == nil {
		err = t.checkHeld(ctx, plan, results, ts)
	}
	if err != nil {
		// Whatever failed (a check's second round trip cut short by the
		// caller's deadline, say), the transaction holds locks: it ends
		// here, and a later attempt begins anew.
		_ = t.closeConn(ctx)
		return err
	}
	return nil
}

// acquire takes the connection the transaction runs on: its session's,
// or one from the client's pool.
func (t *ROTx) acquire(ctx context.Context) error {
	if t.session != nil {
		// A transaction parked on the connection ends first (one at the
		// pin this one begins at was taken already: beginParked).
		if err := t.park.unpark(ctx); err != nil {
			return err
		}
		t.conn = t.session
		return nil
	}
	if t.c.parked != nil {
		if st := t.c.pool.Stat(); st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns() {
			// Every connection is taken: a parked transaction gives
			// its back rather than this one wait for it.
			t.c.parked.evictOldest()
		}
	}
	conn, err := t.c.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("larder: %w", err)
	}
	t.pooled, t.conn = conn, conn
	return nil
}

// nowSnapshotSQL reads the snapshot of the transaction it runs in, as
// pg_current_snapshot() gives it, and the WAL insert position after it.
const nowSnapshotSQL = `SELECT pg_catalog.pg_snapshot_xmin(s), pg_catalog.pg_snapshot_xmax(s),
  ARRAY(SELECT x FROM pg_catalog.pg_snapshot_xip(s) x ORDER BY x::text::bigint), pg_catalog.pg_current_wal_insert_lsn()
FROM pg_catalog.pg_current_snapshot() s`

// beginNow opens the transaction at a fresh snapshot and reads it
// (nowSnapshotSQL) in the same round trip.
func (t *ROTx) beginNow(ctx context.Context) (invalidation.PinVerifyRequest, error) {
	if err := t.acquire(ctx); err != nil {
		return invalidation.PinVerifyRequest{}, err
	}
	results, err := runPrepared(ctx, pgxConnOf(t.conn), t.c.epoch.Load(), t.c.m, beginReadOnly, nowSnapshotSQL)
	if stalePrepared(err) { // nothing read yet: once more, prepared anew
		_ = t.closeConn(ctx)
		if err = t.acquire(ctx); err != nil {
			return invalidation.PinVerifyRequest{}, err
		}
		results, err = runPrepared(ctx, pgxConnOf(t.conn), t.c.epoch.Load(), t.c.m, beginReadOnly, nowSnapshotSQL)
	}
	if err != nil {
		_ = t.closeConn(ctx)
		return invalidation.PinVerifyRequest{}, err
	}
	req, err := parseNowSnapshot(results)
	if err != nil {
		_ = t.closeConn(ctx)
		return invalidation.PinVerifyRequest{}, err
	}
	return req, nil
}

// parseNowSnapshot reads nowSnapshotSQL's answer (text: two xids, an
// array of xids, an LSN), the last of results.
func parseNowSnapshot(results []*pgconn.Result) (invalidation.PinVerifyRequest, error) {
	var req invalidation.PinVerifyRequest
	if len(results) == 0 || len(results[len(results)-1].Rows) != 1 || len(results[len(results)-1].Rows[0]) != 4 {
		return req, errors.New("larder: read the snapshot: unexpected answer")
	}
	row := results[len(results)-1].Rows[0]
	var err error
	if req.Xmin, err = strconv.ParseUint(string(row[0]), 10, 64); err != nil {
		return req, fmt.Errorf("larder: read the snapshot: xmin: %w", err)
	}
	if req.Xmax, err = strconv.ParseUint(string(row[1]), 10, 64); err != nil {
		return req, fmt.Errorf("larder: read the snapshot: xmax: %w", err)
	}
	list, open := strings.CutPrefix(string(row[2]), "{")
	list, closed := strings.CutSuffix(list, "}")
	if !open || !closed {
		return req, fmt.Errorf("larder: read the snapshot: in-progress list %q", row[2])
	}
	if list != "" {
		for _, f := range strings.Split(list, ",") {
			x, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return req, fmt.Errorf("larder: read the snapshot: in-progress xid: %w", err)
			}
			req.Xip = append(req.Xip, x)
		}
	}
	lsn, err := pglogrepl.ParseLSN(string(row[3]))
	if err != nil {
		return req, fmt.Errorf("larder: read the snapshot: WAL position: %w", err)
	}
	req.InsertLSN = uint64(lsn)
	return req, nil
}

// dropConn lets go of the connection, which holds no transaction: a
// pooled one goes back to the pool.
func (t *ROTx) dropConn() {
	if t.pooled != nil {
		t.pooled.Release()
		t.pooled = nil
	}
	t.conn = nil
}

// serverStartKey keys a connection's server start in its CustomData.
const serverStartKey = "larder.server-start"

// connServerStart returns when the PostgreSQL server conn is connected to
// started (pg_postmaster_start_time()). A connection does not outlive its
// server: the time is read on the connection's first need and kept in its
// CustomData, one query per connection.
func connServerStart(ctx context.Context, conn dbConn) (time.Time, error) {
	data := pgConnOf(conn).CustomData()
	if start, ok := data[serverStartKey].(time.Time); ok {
		return start, nil
	}
	var start time.Time
	if err := conn.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&start); err != nil {
		return time.Time{}, fmt.Errorf("larder: read the PostgreSQL server's start time: %w", err)
	}
	data[serverStartKey] = start
	return start, nil
}

// errPinOtherServer marks a pin exported by another run of the PostgreSQL
// server than the connection's (errOtherServer).
var errPinOtherServer = errors.New("larder: the pin was exported by another run of the PostgreSQL server")

// errOtherServer refuses pin on a connection to the server run that
// started at start. Exported snapshot ids (backend id, local xid, counter)
// repeat across server restarts: the id may name a snapshot of this run,
// at another timestamp than the pin's. The error is PostgreSQL's
// "invalid snapshot identifier" (22023) for a released snapshot, so that
// the transaction drops the pin and tries its next one (snapshotGone), on
// the client's own connections as at an origin (whose edge receives the
// SQLSTATE).
func errOtherServer(pin invalidation.Pin, start time.Time) error {
	return fmt.Errorf("%w: %w", errPinOtherServer, &pgconn.PgError{Severity: "ERROR", Code: "22023",
		Message: fmt.Sprintf("snapshot %q was exported by the PostgreSQL server started at %s; this connection's started at %s",
			pin.SnapshotID, pin.ServerStart.UTC().Format(time.RFC3339Nano), start.UTC().Format(time.RFC3339Nano))})
}

// closeConn ends the PostgreSQL transaction (read-only: nothing to keep)
// and gives a pooled connection back.
func (t *ROTx) closeConn(ctx context.Context) error {
	if t.remote != nil {
		err := t.remote.End(ctx)
		t.remote, t.held = nil, nil
		return err
	}
	if t.conn == nil {
		return nil
	}
	_, err := t.conn.Exec(ctx, "ROLLBACK")
	t.held = nil // the locks went with the transaction
	if t.pooled != nil {
		t.pooled.Release()
		t.pooled = nil
	}
	t.conn = nil
	return err
}

// fix runs the transaction's PostgreSQL part at the newest usable pin,
// holding tables, or holds tables in the transaction already fixed.
func (t *ROTx) fix(ctx context.Context, tables []string) error {
	if t.fallback {
		return nil
	}
	if t.fixed {
		return t.holdTables(ctx, tables)
	}
	for len(t.cands) > 0 {
		i := t.pinToBegin()
		pin, older := t.cands[i], i < len(t.cands)-1
		if pinChosenForTest != nil {
			pinChosenForTest(t, i)
		}
		t.onlyParked = older
		err := t.beginAt(ctx, pin, tables)
		t.onlyParked = false
		if older && errors.Is(err, errNotParked) {
			t.noOlderPin = true // nothing was sent: the newest, then
			continue
		}
		if errors.Is(err, errRewritten) {
			t.c.pins.dropThrough(pin.LSN)
			_ = t.closeConn(ctx)
			if older {
				// Newer candidates may follow the rewrite.
				t.cands, t.noOlderPin = t.cands[i+1:], true
				continue
			}
			return err
		}
		if err == nil {
			t.fixed, t.ts, t.pin = true, pin.LSN, pin
			t.cands = []invalidation.Pin{pin}
			if t.remote == nil {
				t.c.stats.PinBegins.Add(1)
			}
			if older {
				t.c.stats.OlderPinBegins.Add(1)
				t.c.m.olderPinBegins.Inc()
			}
			return nil
		}
		if ctx.Err() != nil || !snapshotGone(err) {
			return err
		}
		// The pin was released since (expired, thinned, or the
		// pincushion restarted), or PostgreSQL restarted since it was
		// exported: forget it and try the next one.
		t.c.pins.remove(pin)
		t.cands = slices.Delete(t.cands, i, i+1)
	}
	if t.returned {
		return ErrRetry
	}
	// Every pin is gone (the pincushion or PostgreSQL restarted) and
	// nothing was read yet: a snapshot taken now is one the transaction
	// could have begun at.
	if err := t.takeNow(ctx); err != nil {
		return err
	}
	if t.fixed {
		return t.holdTables(ctx, tables)
	}
	return nil // a fallback: uncached
}

// Query runs a query in the transaction.
func (t *ROTx) Query(ctx context.Context, sql string, args ...any) (*Rows, error) {
	if t.done {
		return nil, errors.New("larder: transaction finished")
	}
	res, err := t.query(ctx, sql, args)
	if err != nil {
		return nil, wrap("query", sql, err)
	}
	t.returned = true
	return newRows(res, t), nil
}

// QueryRow runs a query expected to return one row and scans it.
func (t *ROTx) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	rows, err := t.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		return pgx.ErrNoRows
	}
	return rows.Scan(dest...)
}

// Timestamp is the snapshot the transaction reads at once it is fixed (0
// before, or in a fallback transaction).
func (t *ROTx) Timestamp() uint64 {
	if t.fixed {
		return t.ts
	}
	return 0
}

// Range is the span of timestamps still possible for the transaction.
func (t *ROTx) Range() (lo, hi uint64) {
	if len(t.cands) == 0 {
		return 0, 0
	}
	return t.cands[0].LSN, t.cands[len(t.cands)-1].LSN
}

func (t *ROTx) query(ctx context.Context, sql string, args []any) (*Result, error) {
	if err := t.settle(ctx, t.c.cfg.FreshReadWait, true); err != nil {
		return nil, err
	}
	if t.fallback {
		t.noteUncacheable("the transaction reads uncached (no usable pin)")
		return t.onDBUncached(ctx, sql, args)
	}
	if t.scope.temp || t.scope.uncached != "" {
		t.tainted = true
		reason := t.scope.uncached
		if t.scope.temp {
			reason = "the session has temporary tables"
		}
		t.c.stats.Uncacheable.Add(1)
		t.c.m.uncacheable(reason)
		t.noteUncacheable(reason)
		res, err := t.atSnapshot(ctx, sql, args, nil)
		t.rescopeAfter(ctx, sql)
		return res, err
	}
	k := t.c.keying.Load()
	tpl, err := k.analyzer(t.scope.path).Prepare(sql)
	if err != nil || !tpl.Cacheable {
		t.tainted = true
		t.c.stats.Uncacheable.Add(1)
		reason := "unparsable"
		var tables []string
		if err == nil {
			reason = tpl.Reason
			tables = k.coveredOf(tpl.Deps)
		}
		t.c.m.uncacheable(reason)
		t.noteUncacheable(reason)
		neutral := false
		if err == nil {
			t.c.m.templateRead(tpl.ID, "uncached")
			neutral = tpl.SessionNeutral
		}
		res, err := t.atSnapshot(ctx, sql, args, tables)
		if !neutral {
			// It may have changed the session (set_config, a function):
			// later statements are keyed on what the session is now.
			t.rescope(ctx)
		}
		return res, err
	}
	qtags, err := tpl.Tags(args)
	if err != nil {
		t.c.stats.Uncacheable.Add(1)
		t.c.m.uncacheable("parameters: " + err.Error())
		t.noteUncacheable("parameters: " + err.Error())
		t.c.m.templateRead(tpl.ID, "uncached")
		return t.atSnapshot(ctx, sql, args, k.coveredOf(tpl.Deps))
	}
	// Every table the query reads, also one whose tags another
	// dependency's derived tags stand for (quma.Dep.CoveredBy): its changes
	// must be published too.
	tables := make([]string, 0, len(tpl.Deps))
	for _, d := range tpl.Deps {
		tables = append(tables, d.Table)
	}
	if reason, ok := k.uncovered(tables); ok {
		t.c.stats.Uncacheable.Add(1)
		t.c.m.uncacheable(reason)
		t.noteUncacheable(reason)
		t.c.m.templateRead(tpl.ID, "uncached")
		return t.atSnapshot(ctx, sql, args, k.coveredOf(tpl.Deps))
	}
	// A query reading the transaction's start runs with "now" fixed to
	// the transaction's clock bucket, which its key includes.
	runSQL, runArgs := sql, args
	if tpl.ClockSQL != "" {
		g := t.c.clockGranularity(tpl.ID)
		if g <= 0 || len(args) != tpl.NumParams {
			t.c.stats.Uncacheable.Add(1)
			t.c.m.uncacheable("reads the clock (clock buckets off)")
			t.c.m.templateRead(tpl.ID, "uncached")
			t.noteUncacheable("reads the clock")
			return t.atSnapshot(ctx, sql, args, tables)
		}
		// A function's key does not hold the bucket: a function reading
		// the clock is not cached.
		t.noteUncacheable("reads the clock")
		runSQL, runArgs = tpl.ClockSQL, append(args[:len(args):len(args)], clockBucket(t.begun, g))
	}
	scopeKey := t.scope.key
	if t.sqlFormats {
		scopeKey += "\nformats=database/sql"
	}
	key, err := t.c.key(scopeKey, sql, runArgs)
	if err != nil {
		t.c.stats.Uncacheable.Add(1)
		t.c.m.uncacheable("parameters: cannot be keyed")
		t.noteUncacheable("parameters: cannot be keyed")
		t.c.m.templateRead(tpl.ID, "uncached")
		return t.atSnapshot(ctx, sql, args, tables)
	}
	// A running cacheable function depends on what this read depends on:
	// the result's tags split by rows once it is known (a hit's as a
	// miss's), else, on a failure, the whole ones.
	noted, whole := len(t.frames) == 0, qtags
	defer func() {
		if !noted {
			t.noteRead(whole)
		}
	}()
	noteTags := func(tags []quma.QueryTag) {
		if !noted {
			noted = true
			t.noteRead(tags)
		}
	}
	noteResult := func(res *Result) {
		if !noted {
			split, _ := t.c.splitTags(tpl, whole, res)
			noteTags(split)
		}
	}
	if _, ok := t.c.templateSQL.Load(tpl.ID); !ok && t.c.templateCount.Add(1) <= maxTemplates {
		t.c.templateSQL.Store(tpl.ID, tpl.SQL)
	}
	if t.placing != nil {
		// At a fresh snapshot the pincushion did not place within the
		// read's wait (settle): the read runs on PostgreSQL at it (its
		// tables held, as at a pin), and its result is not cached (its
		// timestamp is not known yet).
		if err := t.holdTables(ctx, tables); err != nil {
			return nil, err
		}
		res, err := t.readUncached(ctx, tpl.ID, runSQL, runArgs)
		if err == nil {
			noteResult(res)
		}
		return res, err
	}
	tmin, tmax := t.Range()

	if t.c.l1 != nil {
		r, err := t.c.l1Lookup(ctx, key, tmin, tmax, tpl.ID)
		switch {
		case err != nil:
		case r.Miss != store.Hit:
			t.c.noteMiss(cacheL1, tpl.ID, r.Miss)
		case !t.narrow(r.Lo, r.Hi):
			t.c.noteMiss(cacheL1, tpl.ID, store.MissConsistency)
		default:
			if res, err := decodeResult(r.Value); err == nil {
				t.trace = append(t.trace, fmt.Sprintf("l1[%X,%X)", r.Lo, r.Hi))
				t.c.stats.L1Hits.Add(1)
				t.c.m.reads.WithLabelValues("l1").Inc()
				t.c.m.templateRead(tpl.ID, "l1")
				noteResult(res)
				return res, nil
			}
		}
	}
	node := t.c.node(key)
	if node != nil {
		// A node that fails costs at most its call's deadline, and once
		// its breaker opens nothing: the read goes to PostgreSQL.
		r, asked, err := node.lookupCounted(ctx, &protocol.LookupRequest{Key: key, TMin: tmin, TMax: tmax, Template: tpl.ID}, t.c.l1 != nil)
		switch {
		case !asked:
			// Skipped after the L1's miss (see afterL1Gate): a miss.
		case err != nil:
			// Failed or bypassed (counted by the node client): the read
			// goes on as a miss, at the transaction's candidates.
		case r.Miss != store.Hit:
			t.c.noteMiss(cacheNode, tpl.ID, r.Miss)
		case !t.narrow(r.Lo, r.Hi):
			t.c.noteMiss(cacheNode, tpl.ID, store.MissConsistency) // a version, but outside the candidates
		default:
			if res, err := decodeResult(r.Value); err == nil {
				t.trace = append(t.trace, fmt.Sprintf("node[%X,%X)@%X", r.Lo, r.Hi, r.Snapshot))
				t.c.stats.NodeHits.Add(1)
				t.c.m.reads.WithLabelValues("node").Inc()
				t.c.m.templateRead(tpl.ID, "node")
				if t.c.l1 != nil {
					split, _ := t.c.splitTags(tpl, qtags, res)
					noteTags(split)
					t.keepNodeHit(ctx, k, key, tpl.ID, split, r)
					return res, nil
				}
				noteResult(res)
				return res, nil
			}
		}
	}

	// A split result whose membership the L1 still holds valid is
	// patched: its rows are read again by key (patch.go).
	var patch *patchPlan
	if t.c.l1 != nil && t.remote == nil && tpl.ClockSQL == "" && t.c.splits(tpl) && pipeable(runArgs) {
		patch = t.planPatch(ctx, tpl, scopeKey, sql, runArgs)
	}
	var members *memberList
	if patch != nil {
		members = patch.members
	}

	t.c.stats.Misses.Add(1)
	t.c.m.reads.WithLabelValues("database").Inc()
	source := "database" // or "patched", once it is
	defer func() { t.c.m.templateRead(tpl.ID, source) }()
	// A miss runs the query, or its wide form (patch.go).
	missSQL, missArgs := patch.missLoad(runSQL, runArgs)
	loadSQL, loadArgs := missSQL, missArgs
	if members != nil {
		loadSQL, loadArgs = patch.load()
	}
	// The read goes in the same round trip as the transaction's begin, or
	// as the lock and check of tables it holds not yet (holdTables) in a
	// transaction begun at a pin (which can begin again there if the read
	// fails).
	var piped *pipedRead
	if t.remote == nil && !t.fallback && pipeable(loadArgs) && (!t.fixed || t.atPin()) {
		piped = &pipedRead{sql: loadSQL, args: loadArgs, scope: t.scope.key}
		t.pipe = piped
	}
	err = t.fix(ctx, tables)
	t.pipe = nil
	if err != nil {
		return nil, err
	}
	if t.fallback || t.placing != nil {
		// No pin left, and nothing read yet: the transaction took a
		// fresh snapshot, uncached until placed (or for good). (The read
		// is counted as a miss already; a membership found is of no use.)
		res, err := t.readUncached(ctx, "", runSQL, runArgs)
		if err == nil {
			noteResult(res)
		}
		return res, err
	}
	if members != nil && !members.holds(t.ts) {
		// Every pin the membership narrowed the transaction to was gone,
		// and it began at a fresh snapshot instead (fix): the query runs.
		members, loadSQL, loadArgs = nil, missSQL, missArgs
		if piped != nil && piped.ran {
			piped.ran = false // it read the rows: of no use
		}
	}
	var v any
	var shared bool
	if piped != nil && piped.ran {
		v = piped.res
		t.c.m.pipedReads.Inc()
	} else {
		// Identical misses at the same snapshot load once. Every
		// transaction holds its tables before it loads or waits (fix), so
		// no load waits for a lock, and no waiter for a load that does.
		flightKey := fmt.Sprintf("%x@%d", key, t.ts)
		if members == nil && patch != nil && patch.wide > 0 {
			flightKey = "wide " + flightKey // more rows than the read's
		}
		if members != nil {
			flightKey = "rows of " + flightKey
			if patch.repair {
				flightKey = "repair of " + flightKey
			}
		}
		v, err, shared = t.c.flight.Do(flightKey, func() (any, error) {
			return t.onDB(ctx, loadSQL, loadArgs)
		})
	}
	if planChanged(err) {
		shared = false
		v, err = t.replan(ctx, loadSQL, loadArgs, tables)
	}
	if err != nil {
		return nil, err
	}
	res := v.(*Result)
	var kept *memberList // the membership to keep
	if members != nil {
		var patched *Result
		var ok bool
		if patch.repair {
			patched, kept, ok = patch.repairedResult(res)
		} else {
			patched, ok = patch.patchedResult(res)
		}
		if ok {
			t.c.m.rowPatches.WithLabelValues(patch.outcome()).Inc()
			t.c.stats.Patches.Add(1)
			res, source = patched, "patched"
		} else {
			// The rows read are not the membership's (a column's type
			// or format changed, a row is missing), or a repair may
			// have missed a row past the LIMIT: the query runs.
			t.c.m.rowPatches.WithLabelValues("refused").Inc()
			if res, err = t.atSnapshot(ctx, missSQL, missArgs, tables); err != nil {
				return nil, err
			}
			members = nil
		}
	}
	if patch != nil && members == nil {
		res, kept = patch.missed(res)
	}
	t.trace = append(t.trace, fmt.Sprintf("db@%X(now=%v,shared=%v,patched=%v)", t.ts, t.now, shared, members != nil))
	if shared {
		t.c.m.collapsed.Inc()
	}
	if node == nil && t.c.l1 == nil {
		noteResult(res)
		return res, nil
	}
	value := res.encode(nil)
	groups := len(qtags)
	qtags, isSplit := t.c.splitRows(tpl, qtags, res) // split once: for the put and for a running function
	noteTags(qtags)
	if !k.publishedAt(qtags, t.ts) {
		// Keyed on a set registered after this snapshot: changes between
		// the two were not published under it. The L1 holds it at t.ts
		// only.
		if node != nil {
			t.c.m.earlyPuts.Inc()
		}
		if t.c.l1 != nil {
			t.c.l1Keep(ctx, key, t.ts, t.ts+1, t.ts, value)
		}
		return res, nil
	}
	deps := depsOf(qtags)
	if t.c.l1 != nil {
		t.c.l1Put(ctx, key, t.ts, deps, value, tpl.ID, false)
		if isSplit && kept != nil {
			// Its group tags come first (quma.Template.SplitRows).
			t.putMembers(ctx, patch, kept, qtags[:groups], tpl.ID)
		}
	}
	if node != nil && node.usable() {
		put := &protocol.PutRequest{Key: key, Snapshot: t.ts, Deps: deps, Template: tpl.ID, Value: value}
		t.c.puts.Add(1)
		go func() {
			defer t.c.puts.Done()
			_ = node.put(context.Background(), put) // failures are counted by the node client
		}()
	}
	return res, nil
}

// keepNodeHit keeps a cache-node's hit in the L1. The result is what the
// query gave at the version's snapshot, and its tags are the ones its
// putter had (the same template, arguments and rows): put at that
// snapshot with them, the L1 follows its groups and serves it for as long
// as it stays valid, as if the client had computed it then. (Kept only
// for the interval the node proved, closed, a later read past it missed
// the L1 and asked the node again, every time: under RUBiS's bidding mix
// half the L1's misses were such, each a round trip to the node.) A
// result keyed on a tag set registered after its snapshot is kept closed.
func (t *ROTx) keepNodeHit(ctx context.Context, k *keying, key []byte, tplID string, tags []quma.QueryTag, r protocol.LookupResponse) {
	if r.Snapshot == 0 || !k.publishedAt(tags, r.Snapshot) {
		t.c.l1Keep(ctx, key, r.Lo, r.Hi, r.Snapshot, r.Value)
		return
	}
	t.c.l1Put(ctx, key, r.Snapshot, depsOf(tags), r.Value, tplID, false)
}

// depsOf are a result's tags as a store's dependencies.
func depsOf(tags []quma.QueryTag) []store.Dep {
	deps := make([]store.Dep, 0, len(tags))
	for _, q := range tags {
		deps = append(deps, store.Dep{Tag: q.Tag.String(), Table: q.Table, Reads: q.Reads, AllColumns: q.AllColumns})
	}
	return deps
}

// rescope reads the session's scope again, inside the transaction, after a
// statement that may have changed it; when it cannot be read, nothing more
// the transaction reads is cached.
func (t *ROTx) rescope(ctx context.Context) {
	if t.remote != nil {
		// The statement ran in the Loader's session, whose state the
		// client cannot read: nothing more the transaction reads is cached.
		t.scope.uncached = "a statement that may have changed the session ran through the loader"
		return
	}
	if t.conn == nil {
		return
	}
	sc, err := t.c.readScope(ctx, t.conn)
	if err != nil {
		t.scope.uncached = "the session's state could not be read again after a statement that may have changed it"
		return
	}
	t.scope = sc
	t.c.m.scopeReads.Inc()
	t.c.stats.ScopeReads.Add(1)
}

// rescopeAfter reads the scope again after sql unless the analyzer says
// it cannot have changed the session.
func (t *ROTx) rescopeAfter(ctx context.Context, sql string) {
	if tpl, err := t.c.keying.Load().analyzer(t.scope.path).Prepare(sql); err == nil && (tpl.Cacheable || tpl.SessionNeutral) {
		return
	}
	t.rescope(ctx)
}

// narrow keeps the candidate pins inside [lo, hi); a hit that leaves
// none is not used. The candidates are in LSN order (pinTracker), so
// those kept are a run of them: narrowing reslices, allocating nothing
// (it runs on every hit).
func (t *ROTx) narrow(lo, hi uint64) bool {
	if skipNarrowForTest || t.c.cfg.UnsafeIgnoreConsistency {
		return true
	}
	i := sort.Search(len(t.cands), func(i int) bool { return t.cands[i].LSN >= lo })
	j := i + sort.Search(len(t.cands)-i, func(k int) bool { return t.cands[i+k].LSN >= hi })
	if i == j {
		return false
	}
	t.cands = t.cands[i:j]
	return true
}

// atSnapshot runs a query on PostgreSQL at the transaction's pin.
func (t *ROTx) atSnapshot(ctx context.Context, sql string, args []any, tables []string) (*Result, error) {
	if err := t.fix(ctx, tables); err != nil {
		return nil, err
	}
	res, err := t.onDB(ctx, sql, args)
	if planChanged(err) {
		return t.replan(ctx, sql, args, tables)
	}
	return res, err
}

// onDB runs a query in the PostgreSQL transaction.
func (t *ROTx) onDB(ctx context.Context, sql string, args []any) (*Result, error) {
	if t.remote != nil {
		return t.remote.Query(ctx, sql, args)
	}
	if w, ok := wireOf(args); ok { // a statement as a client sent it (raw.go)
		t.tainted = true
		return w.run(ctx, pgConnOf(t.conn))
	}
	if t.sqlFormats {
		args = append([]any{databaseSQLResultFormats}, args...)
	}
	rows, err := t.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return readResult(rows)
}

// onDBUncached runs a query in a transaction that fell back to its own
// fresh snapshot: one a schema change aborted cannot be taken again, so
// "cached plan must not change result type" asks the caller to retry.
func (t *ROTx) onDBUncached(ctx context.Context, sql string, args []any) (*Result, error) {
	res, err := t.onDB(ctx, sql, args)
	if planChanged(err) {
		return nil, fmt.Errorf("larder: a schema change replaced the statement's result type; retry the transaction: %w", ErrRetry)
	}
	return res, err
}

// replan answers PostgreSQL's "cached plan must not change result type":
// a schema change replaced a result type under pgx's cached statement
// (pgx has dropped it since) and PostgreSQL aborted the transaction. One
// that reads at a pin is opened again at the same pin (the same snapshot)
// and the statement runs once more; one at a fresh snapshot cannot take
// it again: the caller must retry the transaction (ErrRetry).
func (t *ROTx) replan(ctx context.Context, sql string, args []any, tables []string) (*Result, error) {
	if again, err := t.beginAgainAtPin(ctx, tables); again {
		if err != nil {
			return nil, err
		}
		if res, err := t.onDB(ctx, sql, args); !planChanged(err) {
			return res, err
		}
	}
	return nil, fmt.Errorf("larder: a schema change replaced the statement's result type; retry the transaction: %w", ErrRetry)
}

// atPin reports whether the transaction runs at a pin, which it can begin
// again at (beginAgainAtPin), rather than at a fresh snapshot.
func (t *ROTx) atPin() bool { return t.placing == nil && t.pin.SnapshotID != "" }

// beginAgainAtPin begins the transaction, which PostgreSQL aborted over a
// statement cached on its connection, again at its pin (the same
// snapshot), holding tables (counted in larder_client_plan_retries_total).
// It reports false, doing nothing, for a transaction at a fresh snapshot,
// which cannot be taken again.
func (t *ROTx) beginAgainAtPin(ctx context.Context, tables []string) (bool, error) {
	if t.pin.SnapshotID == "" {
		return false, nil
	}
	t.c.m.planRetries.Inc()
	_ = t.closeConn(ctx)
	return true, t.beginAt(ctx, t.pin, tables)
}

// holdTables locks the tables a query reads (ACCESS SHARE, which every
// read takes anyway) for the rest of the transaction and checks that
// each still has the storage its snapshot sees. TRUNCATE and the ALTER
// TABLE forms that rewrite a table are not MVCC-safe: a snapshot taken
// before them reads the new, empty storage. An old pin would then read
// (and cache) an empty table; the lock keeps them out from here on, and
// the check finds one that came between the snapshot and the lock: the
// pins that old are dropped and the transaction is retried (ErrRetry).
func (t *ROTx) holdTables(ctx context.Context, tables []string) error {
	if t.remote != nil {
		err := t.remote.Hold(ctx, tables)
		if errors.Is(err, errRewritten) {
			t.c.pins.dropThrough(t.ts)
		}
		return err
	}
	ts := t.ts
	if t.placing != nil {
		// A fresh snapshot not placed yet: its timestamp is at least that
		// of every pin announced before it was taken (it sees what they
		// see). Storage facts that old hold for it; none is learnt from
		// it.
		ts = t.placing.after
	}
	plan := t.planHold(tables, ts)
	if plan == nil {
		return nil
	}
	plan.unplaced = t.placing != nil
	if q := t.pipe; q != nil && t.atPin() {
		// The miss that needs these tables goes in the same round trip.
		t.pipe = nil
		sent, err := t.holdPiped(ctx, plan, ts, q)
		if errors.Is(err, errPipeAgain) {
			// The read failed and aborted the transaction: it begins
			// again at its pin (the same snapshot), and the read runs
			// the usual way.
			_, err = t.beginAgainAtPin(ctx, tables)
			return err
		}
		if sent {
			if errors.Is(err, errRewritten) {
				t.c.pins.dropThrough(ts)
			}
			return err
		}
	}
	results, err := runPrepared(ctx, pgxConnOf(t.conn), t.c.epoch.Load(), t.c.m, plan.statements()...)
	if stalePrepared(err) {
		// PostgreSQL no longer had a statement the connection prepared,
		// and the transaction is aborted: as for a replaced result type
		// (replan), it begins again at its pin, or asks for a retry.
		if again, err := t.beginAgainAtPin(ctx, tables); again {
			return err
		}
		return fmt.Errorf("larder: the connection's prepared statements were dropped; retry the transaction: %w", ErrRetry)
	}
	if err != nil {
		return err
	}
	err = t.checkHeld(ctx, plan, results, ts)
	if errors.Is(err, errRewritten) {
		t.c.pins.dropThrough(ts)
	}
	return err
}

// checkHeld reads the storage check (the quick one, then, if it found a
// table's storage moved, the whole one in a second round trip; the locks
// are held already) and marks the tables held.
func (t *ROTx) checkHeld(ctx context.Context, plan *holdPlan, results []*pgconn.Result, ts uint64) error {
	err := plan.check(t.c, results, ts)
	if errors.Is(err, errStorageMoved) {
		plan.facts = nil
		if beforeFullCheckForTest != nil {
			beforeFullCheckForTest()
		}
		if results, err = pgConnOf(t.conn).Exec(ctx, plan.fullSQL()).ReadAll(); err != nil {
			return err
		}
		err = plan.check(t.c, results, ts)
	}
	if err != nil {
		return err
	}
	if t.held == nil {
		t.held = map[string]bool{}
	}
	for _, name := range plan.tables {
		t.held[name] = true
	}
	return nil
}

// pgxConnOf is the pgx connection under a pooled or a database/sql
// connection.
func pgxConnOf(c dbConn) *pgx.Conn {
	switch c := c.(type) {
	case *pgxpool.Conn:
		return c.Conn()
	case *pgx.Conn:
		return c
	}
	panic(fmt.Sprintf("larder: no protocol connection under %T", c))
}

// pgConnOf is the protocol connection under a pooled or a database/sql
// connection.
func pgConnOf(c dbConn) *pgconn.PgConn { return pgxConnOf(c).PgConn() }

// snapshotGone reports PostgreSQL's refusal of SET TRANSACTION SNAPSHOT
// for a snapshot whose exporting transaction has ended: "invalid snapshot
// identifier" (22023), or "could not import the requested snapshot"
// (55000); also the client's own refusal of a pin exported by another run
// of the server (errOtherServer, 22023).
func snapshotGone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "22023" || pgErr.Code == "55000")
}

// planChanged reports PostgreSQL's "cached plan must not change result
// type": a prepared statement outlived a schema change.
func planChanged(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "0A000" && strings.Contains(pgErr.Message, "cached plan must not change result type")
}

// Commit ends the transaction.
func (t *ROTx) Commit(ctx context.Context) error { return t.end(ctx) }

// Rollback ends the transaction.
func (t *ROTx) Rollback(ctx context.Context) error { return t.end(ctx) }

func (t *ROTx) end(ctx context.Context) error {
	return wrap("commit", "", t.finish(ctx))
}

func (t *ROTx) finish(ctx context.Context) error {
	if t.done {
		return nil
	}
	t.done = true
	// A placement under way goes on: its answer, or its lack of one in
	// time, tells later transactions whether the pincushion is placing.
	t.placing = nil
	if t.session != nil && t.parkable() && t.park.park(t.pin, t.held, t.pgBegun) {
		// Left open on the database/sql connection (parked.go).
		t.conn, t.held = nil, nil
		t.release()
		return nil
	}
	if t.session == nil && t.parkable() && t.c.parked.park(parkedTx{conn: t.pooled, pin: t.pin, scope: t.scope.key, held: t.held, born: t.pgBegun}) {
		// Left open for the next transaction at the pin (parked.go).
		t.pooled, t.conn, t.held = nil, nil, nil
		t.release()
		return nil
	}
	if t.pooled != nil && t.remote == nil {
		// A pooled connection's ROLLBACK is off the caller's path: the
		// transaction only read, so nothing waits on its outcome; the
		// connection goes back to the pool once it is over (or is closed
		// when it fails).
		conn := t.pooled
		t.pooled, t.conn, t.held = nil, nil, nil
		go endPooled(conn)
		t.release()
		return nil
	}
	err := t.closeConn(ctx)
	t.release()
	return err
}

// endPooled rolls a pooled connection's read-only transaction back and
// releases the connection, closing it when the rollback fails.
func endPooled(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Conn().Close(ctx)
	}
	conn.Release()
}

func (t *ROTx) release() {
	if t.m != nil {
		t.c.maps.Put(t.m)
		t.m = nil
	}
}
