package pincushion

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/testenv"
)

// oracle is the commit stream as the test's own decoder saw it: which ids
// each commit inserted, by commit LSN.
type oracle struct {
	mu   sync.Mutex
	lsns []uint64           // commit LSNs, ascending
	cum  []int              // cum[i]: ids committed at or before lsns[i]
	ids  map[int64]uint64   // id -> commit LSN
	by   map[uint64][]int64 // commit LSN -> ids
}

func newOracle() *oracle {
	return &oracle{ids: map[int64]uint64{}, by: map[uint64][]int64{}}
}

func (o *oracle) add(lsn uint64, ids []int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.lsns); n > 0 && lsn <= o.lsns[n-1] {
		return fmt.Errorf("commit at %s decoded after %s", fmtLSN(lsn), fmtLSN(o.lsns[n-1]))
	}
	total := len(ids)
	if n := len(o.cum); n > 0 {
		total += o.cum[n-1]
	}
	o.lsns = append(o.lsns, lsn)
	o.cum = append(o.cum, total)
	o.by[lsn] = ids
	for _, id := range ids {
		o.ids[id] = lsn
	}
	return nil
}

// check compares the ids a snapshot read with the ids the decoded stream
// committed at or before ts: it says where they differ.
func (o *oracle) check(read []int64, ts uint64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := sort.Search(len(o.lsns), func(i int) bool { return o.lsns[i] > ts })
	want := 0
	if k > 0 {
		want = o.cum[k-1]
	}
	seen := make(map[int64]bool, len(read))
	for _, id := range read {
		lsn, ok := o.ids[id]
		switch {
		case !ok:
			return fmt.Errorf("sees id %d, which the commit stream never inserted (up to %s)", id, fmtLSN(ts))
		case lsn > ts:
			return fmt.Errorf("sees id %d committed at %s, after its timestamp %s", id, fmtLSN(lsn), fmtLSN(ts))
		case seen[id]:
			return fmt.Errorf("sees id %d twice", id)
		}
		seen[id] = true
	}
	if len(read) != want {
		for _, lsn := range o.lsns[:k] {
			for _, id := range o.by[lsn] {
				if !seen[id] {
					return fmt.Errorf("sees %d ids, the commit stream has %d at or before %s: misses id %d committed at %s",
						len(read), want, fmtLSN(ts), id, fmtLSN(lsn))
				}
			}
		}
		return fmt.Errorf("sees %d ids, the commit stream has %d at or before %s", len(read), want, fmtLSN(ts))
	}
	return nil
}

// neighbours returns the LSN of the newest commit at or before ts, of the
// commit before it, and of the first commit after ts (0 when absent).
func (o *oracle) neighbours(ts uint64) (atOrBefore, before, after uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := sort.Search(len(o.lsns), func(i int) bool { return o.lsns[i] > ts })
	if k > 0 {
		atOrBefore = o.lsns[k-1]
	}
	if k > 1 {
		before = o.lsns[k-2]
	}
	if k < len(o.lsns) {
		after = o.lsns[k]
	}
	return atOrBefore, before, after
}

// newest returns the newest commit LSN among the commits of ids.
func (o *oracle) newest(ids []int64) (uint64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var newest uint64
	for _, id := range ids {
		lsn, ok := o.ids[id]
		if !ok {
			return 0, fmt.Errorf("sees id %d, which the commit stream never inserted", id)
		}
		newest = max(newest, lsn)
	}
	return newest, nil
}

func (o *oracle) commits() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.lsns)
}

// decode runs a pgoutput decoder on conn (replication already started)
// feeding o and log, until ctx ends. Logical messages (the heartbeats)
// advance the log: the decoder has passed every commit before them.
func decode(ctx context.Context, conn *pgconn.PgConn, start pglogrepl.LSN, o *oracle, log *CommitLog) error {
	relations := map[uint32]*pglogrepl.RelationMessage{}
	var begin *pglogrepl.BeginMessage
	var ids []int64
	written := start
	nextStatus := time.Now()
	for {
		if !time.Now().Before(nextStatus) {
			err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: written})
			if err != nil {
				return ignoreDone(ctx, fmt.Errorf("standby status: %w", err))
			}
			nextStatus = time.Now().Add(time.Second)
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receive: %w", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			if e, isErr := msg.(*pgproto3.ErrorResponse); isErr {
				return fmt.Errorf("replication: %s", e.Message)
			}
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return err
			}
			if pkm.ReplyRequested {
				nextStatus = time.Time{}
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return err
			}
			m, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				return fmt.Errorf("parse %q: %w", xld.WALData[:1], err)
			}
			switch m := m.(type) {
			case *pglogrepl.RelationMessage:
				relations[m.RelationID] = m
			case *pglogrepl.BeginMessage:
				begin, ids = m, nil
			case *pglogrepl.InsertMessage:
				if begin == nil || relations[m.RelationID] == nil || len(m.Tuple.Columns) == 0 {
					return fmt.Errorf("insert outside a transaction or into an unknown relation %d", m.RelationID)
				}
				id, err := strconv.ParseInt(string(m.Tuple.Columns[0].Data), 10, 64)
				if err != nil {
					return fmt.Errorf("insert: id %q: %w", m.Tuple.Columns[0].Data, err)
				}
				ids = append(ids, id)
			case *pglogrepl.CommitMessage:
				if begin == nil || m.CommitLSN != begin.FinalLSN {
					return fmt.Errorf("commit at %s does not close the open transaction", m.CommitLSN)
				}
				if err := o.add(uint64(m.CommitLSN), ids); err != nil {
					return err
				}
				log.Commit(begin.Xid, uint64(m.CommitLSN))
				begin, ids = nil, nil
			case *pglogrepl.LogicalDecodingMessage:
				// The message's LSN is the end of its record; a commit
				// record may start right there, so only what lies before
				// it is known complete.
				log.Through(uint64(m.LSN) - 1)
			}
			if end := xld.WALStart + pglogrepl.LSN(len(xld.WALData)); end > written {
				written = end
			}
		}
	}
}

func ignoreDone(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// imported is a pin's snapshot imported into a transaction of the test's
// own, while the cushion still held the pin.
type imported struct {
	pin  Pin
	conn *pgx.Conn
}

// pinResult is what one checked snapshot read.
type pinResult struct {
	pin Pin
	ids []int64
	err error
}

// lineBuffer is a concurrency-safe log sink.
type lineBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lineBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lineBuffer) lines(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range strings.Split(l.b.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// readIDs reads every id in the transaction open on conn, ends it and
// closes conn.
func readIDs(ctx context.Context, conn *pgx.Conn) ([]int64, error) {
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, "SELECT id FROM items")
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	_, err = conn.Exec(ctx, "COMMIT")
	return ids, err
}

// TestStressPinsAreExact takes pins while concurrent committers insert as
// fast as they can, and checks every kept pin against the commit stream
// decoded by the test's own logical replication client: a pin with
// timestamp T must see exactly the ids whose commit LSN is <= T. Client
// "now" snapshots verified over NATS are checked the same way. Finally the
// checker is shown to catch a timestamp off by one commit.
func TestStressPinsAreExact(t *testing.T) {
	const (
		committers = 6
		runFor     = 4 * time.Second
		checkers   = 3
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dbURL := testenv.Database(t, env.PG)

	setup, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close(context.Background())
	for _, q := range []string{
		"CREATE TABLE items (id bigint PRIMARY KEY)",
		"CREATE PUBLICATION larder_pins FOR TABLE items",
	} {
		if _, err := setup.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	// Every pin must carry the start time of this server.
	var serverStart time.Time
	if err := setup.QueryRow(ctx, "SELECT pg_postmaster_start_time()").Scan(&serverStart); err != nil {
		t.Fatal(err)
	}
	var wrongStart atomic.Int64
	checkStart := func(p Pin) {
		if !p.ServerStart.Equal(serverStart) {
			wrongStart.Add(1)
			t.Errorf("pin %s carries server start %v, the server started at %v", p.SnapshotID, p.ServerStart, serverStart)
		}
	}

	// The oracle: our own decoder of the commit stream.
	o := newOracle()
	log := NewCommitLog(0)
	repl, err := pgconn.Connect(ctx, dbURL+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close(context.Background())
	slot, err := pglogrepl.CreateReplicationSlot(ctx, repl, "larder_pins_slot", "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Temporary: true})
	if err != nil {
		t.Fatalf("create slot: %v", err)
	}
	start, err := pglogrepl.ParseLSN(slot.ConsistentPoint)
	if err != nil {
		t.Fatal(err)
	}
	err = pglogrepl.StartReplication(ctx, repl, slot.SlotName, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'larder_pins'", "messages 'true'"},
	})
	if err != nil {
		t.Fatalf("start replication: %v", err)
	}

	var bg sync.WaitGroup
	bgErrs := make(chan error, 16)
	run := func(name string, stop context.Context, fn func(context.Context) error) {
		bg.Add(1)
		go func() {
			defer bg.Done()
			if err := fn(stop); err != nil && stop.Err() == nil {
				bgErrs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	decodeCtx, stopDecoder := context.WithCancel(ctx)
	defer stopDecoder()
	run("decoder", decodeCtx, func(ctx context.Context) error { return decode(ctx, repl, start, o, log) })

	// Heartbeats: a logical message every 20 ms advances the log.
	run("heartbeat", decodeCtx, func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(false, 'larder-test', '')"); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
	})

	// Committers: unique ids, one transaction each, as fast as they go.
	commitCtx, stopCommitters := context.WithCancel(ctx)
	defer stopCommitters()
	var inserted atomic.Int64
	for w := range committers {
		run(fmt.Sprintf("committer %d", w), commitCtx, func(ctx context.Context) error {
			conn, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			for seq := int64(1); ctx.Err() == nil; seq++ {
				if _, err := conn.Exec(ctx, "INSERT INTO items (id) VALUES ($1)", int64(w)*1_000_000_000+seq); err != nil {
					return err
				}
				inserted.Add(1)
			}
			return nil
		})
	}
	if err := log.WaitThrough(ctx, 1); err != nil {
		t.Fatalf("decoder: %v", err)
	}
	for o.commits() == 0 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}

	// Every kept pin is imported at once, while the cushion holds it, on a
	// spare connection; checkers then read what it sees.
	spare := make(chan *pgx.Conn, 4)
	run("spare connections", decodeCtx, func(ctx context.Context) error {
		for {
			conn, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				return err
			}
			select {
			case spare <- conn:
			case <-ctx.Done():
				conn.Close(context.Background())
				return nil
			}
		}
	})
	toCheck := make(chan imported, 512)
	var importErrs []error
	var importMu sync.Mutex
	onPin := func(p Pin) {
		checkStart(p)
		var conn *pgx.Conn
		select {
		case conn = <-spare:
		case <-ctx.Done():
			return
		}
		_, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '"+p.SnapshotID+"'")
		if err != nil {
			conn.Close(context.Background())
			importMu.Lock()
			importErrs = append(importErrs, fmt.Errorf("import pin %s: %w", p.SnapshotID, err))
			importMu.Unlock()
			return
		}
		toCheck <- imported{pin: p, conn: conn}
	}
	results := make(chan pinResult, 512)
	var checking sync.WaitGroup
	for range checkers {
		checking.Add(1)
		go func() {
			defer checking.Done()
			for im := range toCheck {
				ids, err := readIDs(ctx, im.conn)
				results <- pinResult{pin: im.pin, ids: ids, err: err}
			}
		}()
	}

	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const prefix = "larder-stress"
	var announced sync.Map
	var announceErrs atomic.Int64
	sub, err := nc.Subscribe(invalidation.PinAnnounceSubject(prefix), func(m *nats.Msg) {
		p, err := invalidation.DecodePin(m.Data)
		if err != nil {
			announceErrs.Add(1)
			return
		}
		checkStart(p)
		announced.Store(p.SnapshotID, p)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	logs := &lineBuffer{}
	reg := prometheus.NewRegistry()
	c, err := New(Config{
		ConnString:    dbURL,
		NATS:          nc,
		SubjectPrefix: prefix,
		Interval:      20 * time.Millisecond,
		MaxStaleness:  time.Second,
		Budget:        8,
		Log:           slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics:       reg,
		onPin:         onPin,
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	cushionCtx, stopCushion := context.WithCancel(ctx)
	defer stopCushion()
	cushionDone := make(chan error, 1)
	go func() { cushionDone <- c.Run(cushionCtx) }()

	// Meanwhile, a client verifies "now" snapshots of its own over NATS
	// and checks the ones found exact the same way.
	type nowResult struct {
		ok        bool
		confirmed bool // refused as not a prefix, and the oracle agrees
		err       error
	}
	var nowResults []nowResult
	var listed int
	nowClient := func() error {
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		for end := time.Now().Add(runFor); time.Now().Before(end); time.Sleep(30 * time.Millisecond) {
			tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
			if err != nil {
				return err
			}
			var snapText, wText string
			if err := tx.QueryRow(ctx, "SELECT pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text").Scan(&snapText, &wText); err != nil {
				return err
			}
			snap, err := ParseSnapshot(snapText)
			if err != nil {
				return err
			}
			w, err := pglogrepl.ParseLSN(wText)
			if err != nil {
				return err
			}
			req := invalidation.EncodePinVerifyRequest(invalidation.PinVerifyRequest{Xmin: snap.Xmin, Xmax: snap.Xmax, Xip: snap.Xip, InsertLSN: uint64(w)})
			msg, err := nc.RequestWithContext(ctx, invalidation.PinVerifySubject(prefix), req)
			if err != nil {
				return fmt.Errorf("verify request: %w", err)
			}
			reply, err := invalidation.DecodePinVerifyReply(msg.Data)
			if err != nil {
				return err
			}
			r := nowResult{ok: reply.OK}
			notPrefix := strings.Contains(reply.Reason, "not a prefix")
			if reply.OK || notPrefix {
				rows, err := tx.Query(ctx, "SELECT id FROM items")
				if err != nil {
					return err
				}
				ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				if err != nil {
					return err
				}
				if reply.OK {
					if err := o.check(ids, reply.TS); err != nil {
						r.err = fmt.Errorf("now snapshot %s (W %s) verified at %s: %w", snapText, wText, fmtLSN(reply.TS), err)
					}
				} else {
					// A refusal as "not a prefix" must be real: no
					// timestamp fits what the snapshot sees, in
					// particular not the newest commit it sees.
					newest, err := o.newest(ids)
					if err == nil && o.check(ids, newest) == nil {
						err = fmt.Errorf("it sees exactly the commits up to %s", fmtLSN(newest))
					}
					if err != nil {
						r.err = fmt.Errorf("now snapshot %s (W %s) refused (%s), but %w", snapText, wText, reply.Reason, err)
					}
					r.confirmed = r.err == nil
				}
			}
			nowResults = append(nowResults, r)
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			msg, err = nc.RequestWithContext(ctx, invalidation.PinListSubject(prefix), nil)
			if err != nil {
				return fmt.Errorf("list request: %w", err)
			}
			pins, err := invalidation.DecodePinList(msg.Data)
			if err != nil {
				return err
			}
			if len(pins) > 8 {
				return fmt.Errorf("list of %d pins, over the budget of 8", len(pins))
			}
			for _, p := range pins {
				checkStart(p)
			}
			for i := 1; i < len(pins); i++ {
				if pins[i].TakenAt.Before(pins[i-1].TakenAt) || pins[i].LSN < pins[i-1].LSN {
					return fmt.Errorf("pin list out of order: %+v before %+v", pins[i-1], pins[i])
				}
			}
			listed += len(pins)
		}
		return nil
	}
	nowErr := nowClient()

	// Stop the cushion first (it closes its pins), then the writers and
	// the decoder.
	stopCushion()
	if err := <-cushionDone; err != nil {
		t.Errorf("Run: %v", err)
	}
	if n := len(c.Pins()); n != 0 {
		t.Errorf("%d pins still held after Run returned", n)
	}
	stopCommitters()
	stopDecoder()
	bg.Wait()
	for len(spare) > 0 {
		(<-spare).Close(context.Background())
	}
	close(toCheck)
	checking.Wait()
	close(results)
	close(bgErrs)
	for err := range bgErrs {
		t.Error(err)
	}
	if nowErr != nil {
		t.Errorf("now client: %v", nowErr)
	}
	for _, err := range importErrs {
		t.Error(err)
	}

	st := c.Stats()
	var checked []pinResult
	for r := range results {
		if r.err != nil {
			t.Errorf("pin %s: read: %v", r.pin.SnapshotID, r.err)
			continue
		}
		if err := o.check(r.ids, r.pin.LSN); err != nil {
			t.Errorf("pin %s at %s taken %s: %v", r.pin.SnapshotID, fmtLSN(r.pin.LSN), r.pin.TakenAt.Format(time.TimeOnly), err)
		}
		checked = append(checked, r)
	}
	nowOK, nowRefused, nowConfirmed := 0, 0, 0
	for _, r := range nowResults {
		if r.err != nil {
			t.Error(r.err)
		}
		switch {
		case r.ok:
			nowOK++
		case r.confirmed:
			nowConfirmed++
		default:
			nowRefused++
		}
	}
	nAnnounced := 0
	announced.Range(func(any, any) bool { nAnnounced++; return true })
	t.Logf("%d commits decoded (%d rows inserted); pins taken %d, kept %d, discarded %d; %d kept pins checked exact against the stream",
		o.commits(), inserted.Load(), st.Taken, st.Kept, st.Discarded, len(checked))
	t.Logf("%d pins announced; now snapshots verified over NATS: %d exact (checked), %d refused as not a prefix (the oracle agrees), %d refused otherwise; %d pins seen in list replies",
		nAnnounced, nowOK, nowConfirmed, nowRefused, listed)
	for i, line := range logs.lines("candidate discarded") {
		if i == 5 {
			break
		}
		t.Logf("discard: %s", line)
	}
	if uint64(len(checked)) != st.Kept || st.Kept == 0 {
		t.Errorf("%d pins checked, %d kept: every kept pin must be checked, and some must be kept", len(checked), st.Kept)
	}
	// A candidate still being verified when Run was stopped is neither.
	if st.Taken < st.Kept+st.Discarded || st.Taken > st.Kept+st.Discarded+1 {
		t.Errorf("taken %d, kept %d, discarded %d: they do not add up", st.Taken, st.Kept, st.Discarded)
	}
	t.Logf("server started at %v; pins announced, listed or kept with another server start: %d", serverStart, wrongStart.Load())
	if uint64(nAnnounced) != st.Kept || announceErrs.Load() != 0 {
		t.Errorf("%d pins announced (%d undecodable), %d kept", nAnnounced, announceErrs.Load(), st.Kept)
	}
	if got := metricValue(t, reg, "larder_pincushion_pins_discarded_total"); got != float64(st.Discarded) {
		t.Errorf("discarded metric %v, counted %d", got, st.Discarded)
	}
	if got := metricValue(t, reg, "larder_pincushion_pins_taken_total"); got != float64(st.Taken) {
		t.Errorf("taken metric %v, counted %d", got, st.Taken)
	}
	if got := metricValue(t, reg, "larder_pincushion_pins_held"); got != 0 {
		t.Errorf("held metric %v after Run returned", got)
	}
	// Released pins' connections are taken again: at most the budget
	// held, the idle ones and the candidate being checked are ever open,
	// however many candidates the run took.
	if o := testutil.ToFloat64(c.m.conns.WithLabelValues("opened")); o > float64(8+maxIdleConns+1) {
		t.Errorf("%v connections opened with a budget of 8: more than the pins, the idle ones and a candidate", o)
	}
	t.Logf("%v connections opened for %d candidates", testutil.ToFloat64(c.m.conns.WithLabelValues("opened")), st.Taken)
	if got := metricValue(t, reg, "larder_pincushion_verify_requests_total"); got != float64(len(nowResults)) {
		t.Errorf("verify requests metric %v, %d sent", got, len(nowResults))
	}

	// The checker must be able to fail: move a kept pin's timestamp by
	// one commit either way and it must report the difference.
	t.Run("checker catches a timestamp off by one commit", func(t *testing.T) {
		tried := 0
		for _, r := range checked {
			at, before, after := o.neighbours(r.pin.LSN)
			if at == 0 || before == 0 || after == 0 {
				continue
			}
			tried++
			if err := o.check(r.ids, before); err == nil {
				t.Fatalf("pin %s at %s: moving its timestamp back to the previous commit %s went unnoticed",
					r.pin.SnapshotID, fmtLSN(r.pin.LSN), fmtLSN(before))
			}
			if err := o.check(r.ids, after); err == nil {
				t.Fatalf("pin %s at %s: moving its timestamp to the next commit %s went unnoticed",
					r.pin.SnapshotID, fmtLSN(r.pin.LSN), fmtLSN(after))
			}
		}
		if tried == 0 {
			t.Fatal("no kept pin has commits on both sides to perturb")
		}
		t.Logf("%d pins perturbed both ways, every change caught", tried)
	})
}

// metricValue sums the samples of a counter or gauge family.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// TestNewRejects checks New's refusals.
func TestNewRejects(t *testing.T) {
	log := NewCommitLog(0)
	for _, c := range []struct {
		cfg     Config
		log     *CommitLog
		because string
	}{
		{Config{ConnString: "postgres://x"}, nil, "commit log is required"},
		{Config{}, log, "ConnString is required"},
		{Config{ConnString: "postgres://x", SubjectPrefix: "a.*"}, log, "not a valid subject prefix"},
		{Config{ConnString: "postgres://x", Budget: -1}, log, "must be positive"},
		{Config{ConnString: "::nonsense"}, log, "connection string"},
	} {
		_, err := New(c.cfg, c.log)
		if err == nil || !strings.Contains(err.Error(), c.because) {
			t.Errorf("New(%+v) = %v, want an error mentioning %q", c.cfg, err, c.because)
		}
	}
	reg := prometheus.NewRegistry()
	if _, err := New(Config{ConnString: "postgres://x", Metrics: reg}, log); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{ConnString: "postgres://x", Metrics: reg}, log); !errors.As(err, &prometheus.AlreadyRegisteredError{}) {
		t.Errorf("second cushion on one registry: %v, want a registration error", err)
	}
}
