package pincushion

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/internal/invalidation"
)

// Defaults of Config.
const (
	DefaultSubjectPrefix = "larder"
	DefaultInterval      = 200 * time.Millisecond
	DefaultDemandGap     = 20 * time.Millisecond
	DefaultMaxStaleness  = 60 * time.Second
	DefaultBudget        = 32
	DefaultWaitTimeout   = 5 * time.Second
)

// maxIdleConns bounds the released pins' connections kept for reuse.
const maxIdleConns = 8

// maxConcurrentVerifies bounds the verify requests handled at once; more
// are refused with a reason rather than queued behind a slow log.
const maxConcurrentVerifies = 256

// Config configures a Cushion. Zero fields take the defaults above.
type Config struct {
	// ConnString is the PostgreSQL connection string pins are taken on
	// (one connection per pin).
	ConnString string
	// NATS is where pins are announced and list/verify requests answered;
	// nil runs without NATS.
	NATS *nats.Conn
	// SubjectPrefix is the first token of the subjects (default "larder").
	SubjectPrefix string
	// Interval between two candidate pins; 100–250 ms in production.
	Interval time.Duration
	// DemandGap: a verify request (a client found no pin recent enough,
	// typically right after its session wrote) asks for a candidate pin
	// at once rather than at the next Interval, at most one per DemandGap,
	// so that the session's next transactions find one. Negative: only
	// every Interval.
	DemandGap time.Duration
	// MaxStaleness is how long a pin is kept after it was taken at most.
	// Clients announce the staleness limits they use (PinHorizonSubject):
	// while any did within DemandWindow, pins are kept only as long as
	// the largest of them (plus a second) can use them.
	MaxStaleness time.Duration
	// Budget is the number of pins (each an open connection) held at
	// most; one more connection is open while a candidate is checked,
	// and up to 8 more (released pins' connections kept for the next
	// candidates) stay idle: Budget+9 connections at most.
	Budget int
	// WaitTimeout bounds the wait for the commit log to reach a
	// snapshot's WAL insert LSN.
	WaitTimeout time.Duration
	// Nudge, when set, asks for a heartbeat through the LSN given soon
	// (the publisher's NudgeThrough): a verify request waiting for the
	// commit log to reach a client's position then waits milliseconds, not
	// a heartbeat interval, and so do the client's lookups at the
	// timestamp it is given, which wait for the caches' watermarks to
	// reach it.
	Nudge func(through uint64)
	// Log receives the cushion's logs (nil: discarded). Discarded
	// candidates are logged at debug level.
	Log *slog.Logger
	// Metrics registers the cushion's metrics (nil: not registered).
	Metrics prometheus.Registerer

	// onPin, when set, is called with every kept pin before it is
	// announced or can be dropped.
	onPin func(Pin)
}

// Pin is a pinned snapshot held by the cushion.
type Pin = invalidation.Pin

// Stats counts what a Cushion did.
type Stats struct {
	Taken          uint64 // candidates exported
	Kept           uint64 // candidates verified exact and kept
	Discarded      uint64 // candidates discarded (not exact, or not verifiable)
	VerifyRequests uint64 // verify requests answered
	Held           int    // pins held now
}

// Cushion takes, verifies, holds and announces pins.
type Cushion struct {
	cfg    Config
	log    *CommitLog
	conn   *pgx.ConnConfig
	logger *slog.Logger
	m      metrics

	running atomic.Bool
	taken   atomic.Uint64
	kept    atomic.Uint64
	discard atomic.Uint64
	verifys atomic.Uint64

	mu   sync.Mutex
	held []*heldPin // oldest first
	// idle are connections of released pins, rolled back, kept for the
	// next candidates: a connection costs PostgreSQL a backend's fork and
	// start, more than the pin itself (at most maxIdleConns).
	idle []*pgx.Conn

	demand chan struct{} // a verify request asks for a pin soon
	// horizon: the clients' staleness demands, which bound how long pins
	// are kept.
	horizon horizon
}

type heldPin struct {
	pin  Pin
	conn *pgx.Conn
	tx   pgx.Tx
}

type metrics struct {
	held      prometheus.Gauge
	taken     prometheus.Counter
	discarded prometheus.Counter
	demanded  prometheus.Counter
	released  prometheus.Counter
	verify    *prometheus.CounterVec
	conns     *prometheus.CounterVec
	keep      prometheus.Gauge
	oldest    prometheus.Gauge
	demands   *prometheus.CounterVec
	// verifyWait times a client's snapshot verification, from its
	// request to its answer: mostly the wait for the decoder to pass it.
	verifyWait prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "larder_pincushion_pins_held", Help: "Pinned snapshots held open.",
		}),
		taken: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "larder_pincushion_pins_taken_total", Help: "Candidate snapshots exported.",
		}),
		discarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "larder_pincushion_pins_discarded_total", Help: "Candidate snapshots discarded as not exact or not verifiable.",
		}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "larder_pincushion_pins_released_total", Help: "Pins released (expired, thinned, or replaced by a newer one at the same LSN), each announced on the release subject.",
		}),
		demanded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "larder_pincushion_pins_demanded_total", Help: "Candidate pins taken before their interval because a verify request asked (at most one per DemandGap).",
		}),
		verify: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "larder_pincushion_verify_requests_total", Help: "Snapshot verify requests, by result (exact, refused, bad).",
		}, []string{"result"}),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "larder_pincushion_connections_total", Help: "Connections candidates were taken on, by origin (opened: a new PostgreSQL backend; reused: a released pin's).",
		}, []string{"origin"}),
		keep: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "larder_pincushion_pin_keep_seconds", Help: "How long pins are kept now: the largest staleness limit clients announced lately, plus a second, at most --max-staleness (which applies while no client announces one).",
		}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "larder_pincushion_oldest_pin_age_seconds", Help: "Age of the oldest pin held: how far back pins hold PostgreSQL's cleanup of old row versions (0: none held).",
		}),
		demands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "larder_pincushion_staleness_demands_total", Help: "Staleness demands clients announced, by result (ok, bad: not decodable).",
		}, []string{"result"}),
		verifyWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "larder_pincushion_verify_seconds", Help: "Time from a client's verify request to its answer: mostly the wait for the decoder to read past the snapshot (the client's placement wait less the NATS round trip).",
			Buckets: []float64{0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1},
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.held, m.taken, m.discarded, m.demanded, m.released, m.verify, m.conns, m.keep, m.oldest, m.demands, m.verifyWait} {
		if err := reg.Register(c); err != nil {
			return metrics{}, fmt.Errorf("pincushion: register metrics: %w", err)
		}
	}
	return m, nil
}

// New checks cfg, fills in its defaults and returns a Cushion verifying
// against log. It connects to nothing before Run.
func New(cfg Config, log *CommitLog) (*Cushion, error) {
	if log == nil {
		return nil, errors.New("pincushion: a commit log is required")
	}
	if cfg.ConnString == "" {
		return nil, errors.New("pincushion: ConnString is required")
	}
	if cfg.SubjectPrefix == "" {
		cfg.SubjectPrefix = DefaultSubjectPrefix
	}
	if p := cfg.SubjectPrefix; strings.ContainsAny(p, " \t\r\n*>") || strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.Contains(p, "..") {
		return nil, fmt.Errorf("pincushion: %q is not a valid subject prefix", p)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.MaxStaleness == 0 {
		cfg.MaxStaleness = DefaultMaxStaleness
	}
	if cfg.Budget == 0 {
		cfg.Budget = DefaultBudget
	}
	if cfg.WaitTimeout == 0 {
		cfg.WaitTimeout = DefaultWaitTimeout
	}
	if cfg.DemandGap == 0 {
		cfg.DemandGap = DefaultDemandGap
	}
	if cfg.Interval < 0 || cfg.MaxStaleness < 0 || cfg.WaitTimeout < 0 || cfg.Budget < 0 {
		return nil, fmt.Errorf("pincushion: Interval %s, MaxStaleness %s, WaitTimeout %s and Budget %d must be positive",
			cfg.Interval, cfg.MaxStaleness, cfg.WaitTimeout, cfg.Budget)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cc, err := pgx.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("pincushion: connection string: %w", err)
	}
	// One round trip per statement, no prepared statements on a
	// connection that lives for one snapshot.
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		cc.RuntimeParams["application_name"] = "larder-pincushion"
	}
	// A pin is idle in its transaction by design; let the server end one
	// that outlives its expiry by far (a cushion that hung or vanished).
	cc.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt((cfg.MaxStaleness + time.Minute).Milliseconds(), 10)
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	if cfg.Interval < 100*time.Millisecond || cfg.Interval > 250*time.Millisecond {
		cfg.Log.Warn("pincushion: interval outside the 100-250ms range it is meant for", "interval", cfg.Interval)
	}
	return &Cushion{cfg: cfg, log: log, conn: cc, logger: cfg.Log, m: m, demand: make(chan struct{}, 1)}, nil
}

// Pins returns the pins held now, oldest first.
func (c *Cushion) Pins() []Pin {
	c.mu.Lock()
	defer c.mu.Unlock()
	pins := make([]Pin, len(c.held))
	for i, h := range c.held {
		pins[i] = h.pin
	}
	return pins
}

// Stats returns the cushion's counters.
func (c *Cushion) Stats() Stats {
	c.mu.Lock()
	n := len(c.held)
	c.mu.Unlock()
	return Stats{Taken: c.taken.Load(), Kept: c.kept.Load(), Discarded: c.discard.Load(),
		VerifyRequests: c.verifys.Load(), Held: n}
}

// VerifySnapshot verifies a snapshot a client took itself, w being
// pg_current_wal_insert_lsn() read after it: it waits (at most
// WaitTimeout) for the commit log to reach w, then applies Verify.
func (c *Cushion) VerifySnapshot(ctx context.Context, snap Snapshot, w uint64) (ts uint64, ok bool, reason string) {
	wctx, cancel := context.WithTimeout(ctx, c.cfg.WaitTimeout)
	defer cancel()
	if c.cfg.Nudge != nil && c.log.ThroughLSN() < w-1 {
		c.cfg.Nudge(w - 1) // a commit after w soon, not at the next heartbeat
	}
	// Every commit the snapshot sees is below w: the log must know those.
	if err := c.log.WaitThrough(wctx, w-1); err != nil {
		return 0, false, fmt.Sprintf("commit log did not reach W %s within %s (it is at %s)",
			fmtLSN(w), c.cfg.WaitTimeout, fmtLSN(c.log.ThroughLSN()))
	}
	return Verify(c.log, snap, w)
}

// Run takes a candidate pin every Interval until ctx ends, then closes
// every pin and returns nil. It answers NATS requests meanwhile. A Cushion
// runs once at a time.
func (c *Cushion) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("pincushion: already running")
	}
	defer c.running.Store(false)
	defer c.closeAll()

	verifies := &verifyGroup{}
	defer verifies.close()
	if nc := c.cfg.NATS; nc != nil {
		subs, err := c.subscribe(ctx, nc, verifies)
		for _, s := range subs {
			defer func() { _ = s.Unsubscribe() }()
		}
		if err != nil {
			return err
		}
	}

	ticker := time.NewTicker(c.cfg.Interval)
	defer ticker.Stop()
	for {
		last := time.Now()
		c.attempt(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-c.demand:
			c.m.demanded.Inc()
			if wait := c.cfg.DemandGap - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(wait):
				}
			}
		}
	}
}

// verifyGroup tracks the verify requests in flight; once closed it
// admits no more, so that Run returns with none running.
type verifyGroup struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func (g *verifyGroup) add() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	return true
}

func (g *verifyGroup) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.wg.Wait()
}

func (c *Cushion) subscribe(ctx context.Context, nc *nats.Conn, verifies *verifyGroup) ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	list, err := nc.Subscribe(invalidation.PinListSubject(c.cfg.SubjectPrefix), func(m *nats.Msg) {
		if m.Reply != "" {
			if err := m.Respond(invalidation.EncodePinList(c.Pins())); err != nil {
				c.logger.Warn("pincushion: answer pin list request", "err", err)
			}
		}
	})
	if err != nil {
		return subs, fmt.Errorf("pincushion: subscribe: %w", err)
	}
	subs = append(subs, list)
	sem := make(chan struct{}, maxConcurrentVerifies)
	verify, err := nc.Subscribe(invalidation.PinVerifySubject(c.cfg.SubjectPrefix), func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			c.respondVerify(m, invalidation.PinVerifyReply{Reason: "pincushion busy: too many verify requests in flight"}, "refused")
			return
		}
		if !verifies.add() {
			<-sem
			c.respondVerify(m, invalidation.PinVerifyReply{Reason: "pincushion shutting down"}, "refused")
			return
		}
		go func() {
			defer verifies.wg.Done()
			defer func() { <-sem }()
			c.handleVerify(ctx, m)
		}()
	})
	if err != nil {
		return subs, fmt.Errorf("pincushion: subscribe: %w", err)
	}
	subs = append(subs, verify)
	demands, err := nc.Subscribe(invalidation.PinHorizonSubject(c.cfg.SubjectPrefix), func(m *nats.Msg) {
		d, err := invalidation.DecodeStalenessDemand(m.Data)
		if err != nil {
			c.m.demands.WithLabelValues("bad").Inc()
			c.logger.Debug("pincushion: bad staleness demand", "err", err)
			return
		}
		c.m.demands.WithLabelValues("ok").Inc()
		c.horizon.note(time.Now(), d)
	})
	if err != nil {
		return subs, fmt.Errorf("pincushion: subscribe: %w", err)
	}
	subs = append(subs, demands)
	if err := nc.Flush(); err != nil {
		return subs, fmt.Errorf("pincushion: subscribe: %w", err)
	}
	return subs, nil
}

func (c *Cushion) handleVerify(ctx context.Context, m *nats.Msg) {
	req, err := invalidation.DecodePinVerifyRequest(m.Data)
	if err != nil {
		c.respondVerify(m, invalidation.PinVerifyReply{Reason: "bad request: " + err.Error()}, "bad")
		return
	}
	// A client found no pin recent enough: ask for one now (the
	// cushion's own candidates are verified with VerifySnapshot too, and
	// must not ask).
	if c.cfg.DemandGap > 0 {
		select {
		case c.demand <- struct{}{}:
		default: // asked already
		}
	}
	snap := Snapshot{Xmin: req.Xmin, Xmax: req.Xmax, Xip: req.Xip}
	began := time.Now()
	ts, ok, reason := c.VerifySnapshot(ctx, snap, req.InsertLSN)
	c.m.verifyWait.Observe(time.Since(began).Seconds())
	result := "exact"
	if !ok {
		result = "refused"
	} else if c.cfg.Nudge != nil {
		// The client's lookups at ts wait for the caches' watermarks to
		// reach it: a heartbeat through ts soon.
		c.cfg.Nudge(ts)
	}
	c.respondVerify(m, invalidation.PinVerifyReply{TS: ts, OK: ok, Reason: clipReason(reason)}, result)
}

func (c *Cushion) respondVerify(m *nats.Msg, r invalidation.PinVerifyReply, result string) {
	c.verifys.Add(1)
	c.m.verify.WithLabelValues(result).Inc()
	if err := m.Respond(invalidation.EncodePinVerifyReply(r)); err != nil {
		c.logger.Warn("pincushion: answer verify request", "err", err)
	}
}

func clipReason(s string) string {
	if len(s) <= invalidation.PinMaxReason {
		return s
	}
	s = s[:invalidation.PinMaxReason-3]
	for !utf8.ValidString(s) { // do not cut a UTF-8 sequence
		s = s[:len(s)-1]
	}
	return s + "..."
}

// attempt expires and thins the held pins, then takes one candidate.
func (c *Cushion) attempt(ctx context.Context) {
	c.release(c.prune(time.Now(), nil))
	if ctx.Err() != nil {
		return
	}
	h, reason, err := c.take(ctx)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			c.logger.Warn("pincushion: take a pin", "err", err)
		}
		return
	case h == nil:
		c.discard.Add(1)
		c.m.discarded.Inc()
		c.logger.Debug("pincushion: candidate discarded", "reason", reason)
		return
	}
	c.kept.Add(1)
	if c.cfg.onPin != nil {
		c.cfg.onPin(h.pin)
	}
	c.release(c.prune(time.Now(), h))
	if nc := c.cfg.NATS; nc != nil {
		if err := nc.Publish(invalidation.PinAnnounceSubject(c.cfg.SubjectPrefix), invalidation.EncodePin(h.pin)); err != nil {
			c.logger.Warn("pincushion: announce pin", "err", err)
		}
	}
}

// take exports a candidate snapshot and verifies it. It returns the held
// pin, or nil and the reason it was discarded, or an error when no
// candidate could be taken at all.
func (c *Cushion) take(ctx context.Context) (h *heldPin, reason string, err error) {
	conn, tx, err := c.begin(ctx)
	if err != nil {
		return nil, "", err
	}
	defer func() {
		if h == nil {
			c.putBack(tx, conn)
		}
	}()
	// The snapshot is taken when this statement starts, so it is no older
	// than takenAt, and the WAL insert LSN is read after it. The server's
	// start time ties the snapshot id to this run of the server: ids repeat
	// after a restart.
	takenAt := time.Now()
	var id, snapText, wText string
	var serverStart time.Time
	err = tx.QueryRow(ctx, "SELECT pg_export_snapshot(), pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text, pg_postmaster_start_time()").
		Scan(&id, &snapText, &wText, &serverStart)
	if err != nil {
		return nil, "", fmt.Errorf("export snapshot: %w", err)
	}
	c.taken.Add(1)
	c.m.taken.Inc()
	if err := invalidation.PinValidSnapshotID(id); err != nil {
		return nil, "unusable exported snapshot: " + err.Error(), nil
	}
	snap, err := ParseSnapshot(snapText)
	if err != nil {
		return nil, err.Error(), nil
	}
	w, err := pglogrepl.ParseLSN(wText)
	if err != nil {
		return nil, fmt.Sprintf("WAL insert LSN %q: %v", wText, err), nil
	}
	ts, ok, reason := c.VerifySnapshot(ctx, snap, uint64(w))
	if !ok {
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		return nil, fmt.Sprintf("snapshot %s, W %s: %s", snapText, wText, reason), nil
	}
	return &heldPin{
		pin:  Pin{SnapshotID: id, LSN: ts, TakenAt: takenAt, ExpiresAt: takenAt.Add(c.cfg.MaxStaleness), ServerStart: serverStart},
		conn: conn,
		tx:   tx,
	}, "", nil
}

// prune adds h (if not nil) as the newest pin, then removes the expired
// pins, an older pin with h's timestamp (h sees the same commits and is
// fresher), and the pins thinning drops. It returns the removed pins.
func (c *Cushion) prune(now time.Time, h *heldPin) []*heldPin {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*heldPin
	keepFor := c.horizon.keep(now, c.cfg.MaxStaleness)
	c.m.keep.Set(keepFor.Seconds())
	keep := c.held[:0]
	for _, p := range c.held {
		if !now.Before(p.pin.ExpiresAt) || now.Sub(p.pin.TakenAt) >= keepFor || (h != nil && p.pin.LSN == h.pin.LSN) {
			out = append(out, p)
			continue
		}
		keep = append(keep, p)
	}
	clear(c.held[len(keep):])
	c.held = keep
	if h != nil {
		c.held = append(c.held, h)
	}
	taken := make([]time.Time, len(c.held))
	for i, p := range c.held {
		taken[i] = p.pin.TakenAt
	}
	if drop := thin(taken, c.cfg.Budget, now); len(drop) > 0 {
		keep := c.held[:0]
		for i, p := range c.held {
			if len(drop) > 0 && drop[0] == i {
				drop = drop[1:]
				out = append(out, p)
				continue
			}
			keep = append(keep, p)
		}
		clear(c.held[len(keep):])
		c.held = keep
	}
	c.m.held.Set(float64(len(c.held)))
	if len(c.held) > 0 {
		c.m.oldest.Set(now.Sub(c.held[0].pin.TakenAt).Seconds())
	} else {
		c.m.oldest.Set(0)
	}
	return out
}

// release ends the pins' transactions and announces their release, so
// that clients forget them (an announcement lost costs a client one
// refused import, after which it forgets the pin too).
func (c *Cushion) release(pins []*heldPin) {
	for _, p := range pins {
		c.putBack(p.tx, p.conn)
		c.m.released.Inc()
		if nc := c.cfg.NATS; nc != nil {
			if err := nc.Publish(invalidation.PinReleaseSubject(c.cfg.SubjectPrefix), invalidation.EncodePin(p.pin)); err != nil {
				c.logger.Warn("pincushion: announce a pin's release", "err", err)
			}
		}
	}
}

func (c *Cushion) closeAll() {
	c.mu.Lock()
	pins, idle := c.held, c.idle
	c.held, c.idle = nil, nil
	c.m.held.Set(0)
	c.mu.Unlock()
	for _, p := range pins {
		closePin(p.tx, p.conn)
	}
	for _, conn := range idle {
		closePin(nil, conn)
	}
}

// begin opens a candidate's REPEATABLE READ transaction, on an idle
// connection when there is one (one that fails to begin is closed and a
// new one opened).
func (c *Cushion) begin(ctx context.Context) (*pgx.Conn, pgx.Tx, error) {
	opts := pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	c.mu.Lock()
	var conn *pgx.Conn
	if n := len(c.idle); n > 0 {
		conn = c.idle[n-1]
		c.idle[n-1] = nil
		c.idle = c.idle[:n-1]
	}
	c.mu.Unlock()
	if conn != nil {
		if tx, err := conn.BeginTx(ctx, opts); err == nil {
			c.m.conns.WithLabelValues("reused").Inc()
			return conn, tx, nil
		}
		closePin(nil, conn) // the server ended it (a restart, a timeout)
	}
	conn, err := pgx.ConnectConfig(ctx, c.conn)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	c.m.conns.WithLabelValues("opened").Inc()
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		closePin(nil, conn)
		return nil, nil, fmt.Errorf("begin: %w", err)
	}
	return conn, tx, nil
}

// putBack ends a pin's (or a discarded candidate's) transaction and keeps
// its connection for the next candidate, or closes it (when the rollback
// failed, the cushion is not running, or maxIdleConns are kept).
func (c *Cushion) putBack(tx pgx.Tx, conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if tx.Rollback(ctx) != nil || conn.IsClosed() || conn.PgConn().TxStatus() != 'I' {
		closePin(nil, conn)
		return
	}
	c.mu.Lock()
	if c.running.Load() && len(c.idle) < maxIdleConns {
		c.idle = append(c.idle, conn)
		conn = nil
	}
	c.mu.Unlock()
	if conn != nil {
		closePin(nil, conn)
	}
}

// closePin rolls a pin's transaction back (tx may be nil) and closes its
// connection.
func closePin(tx pgx.Tx, conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if tx != nil {
		_ = tx.Rollback(ctx)
	}
	_ = conn.Close(ctx)
}

// thin chooses the pins to drop so that at most budget remain: dense
// recent, sparse old. taken lists the pins' wall times, oldest first; the
// result lists indices into it, ascending.
//
// While over budget it drops the interior pin whose removal opens the
// smallest hole relative to its age: the span between its neighbours
// divided by its age. Pins then thin out geometrically with age. The
// newest pin is never dropped, nor the oldest while a third pin remains
// (it keeps the oldest staleness covered until it expires).
func thin(taken []time.Time, budget int, now time.Time) []int {
	if budget < 1 {
		budget = 1
	}
	if len(taken) <= budget {
		return nil
	}
	alive := make([]int, len(taken))
	for i := range alive {
		alive[i] = i
	}
	dropped := make([]bool, len(taken))
	for len(alive) > budget {
		victim := 0 // only newest and oldest left: drop the oldest
		if len(alive) > 2 {
			best := -1.0
			for j := 1; j < len(alive)-1; j++ {
				span := taken[alive[j+1]].Sub(taken[alive[j-1]])
				age := now.Sub(taken[alive[j]])
				if age < time.Nanosecond {
					age = time.Nanosecond
				}
				score := float64(span) / float64(age)
				if best < 0 || score < best {
					best, victim = score, j
				}
			}
		}
		dropped[alive[victim]] = true
		alive = append(alive[:victim], alive[victim+1:]...)
	}
	var out []int
	for i, d := range dropped {
		if d {
			out = append(out, i)
		}
	}
	return out
}
